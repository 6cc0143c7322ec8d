"""A worker whose backend keeps two batches in flight (``runtime/in_flight.py``): batch n+1 is
submitted while batch n computes, by the batching rule of a process that is not idle; the batches
finish in order with their items' records; the batch record names both batches' requests; a batch
that fails loses none of the next; a stop or a re-plan waits for neither. Real rings and stats
block, in this process (the worker's turn as in ``test_worker_turn``), a fake backend whose
batches complete when the test says."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_worker_turn import _push, _wiring, make_worker  # noqa: F401 (the fixture)

from jigsaw.backends.base import ItemResult
from jigsaw.runtime import worker as worker_module
from jigsaw.runtime.records import TOTAL_CREDIT
from jigsaw.runtime.rings import SegmentRegistry, Status
from jigsaw.runtime.stats import BATCH_STARTED_NS, BATCHES, ITEMS, QUEUED, READY, STATE
from jigsaw.tensors import Tensor

CONSUMER_SLOT = 1
POISON = 2  # the request id the fake backend fails on


class Device:
    """A backend with two batches in flight: ``submit`` returns at once (the batch launched),
    ``collect`` waits until the test opens the batch's gate (``done(k)``: the k-th batch
    submitted has computed). ``fail`` is where request ``POISON``'s batch raises: "submit" or
    "collect"; run alone (``execute_async``), ``POISON`` fails by itself; "lost": every collect,
    item and warm-up fails (a lost device)."""

    kind = "fake"
    max_in_flight = 2

    def __init__(self, stats: Any, fail: str = "") -> None:
        self.stats = stats
        self.fail = fail
        self.events: list[tuple[str, list[int]]] = []
        self.records: dict[tuple[str, int], list[int]] = {}  # (event, first id) -> the batch record then
        self.gates: list[asyncio.Event] = []

    def done(self, k: int) -> None:
        while len(self.gates) <= k:
            self.gates.append(asyncio.Event())
        self.gates[k].set()

    def _note(self, event: str, ids: Sequence[int]) -> None:
        self.events.append((event, list(ids)))
        self.records[(event, ids[0])] = sorted(self.stats.batch_record(0))

    @staticmethod
    def _results(ids: Sequence[int]) -> list[ItemResult]:
        return [ItemResult([Tensor("value", "FP32", (1,), bytes(4))], {"c": [rid.to_bytes(8, "little")]})
                for rid in ids]

    async def submit(self, request_ids: Sequence[int], inputs: Sequence[bytes]) -> Any:
        self._note("submit", request_ids)
        await asyncio.sleep(0)  # (the helper thread's hop)
        if self.fail == "submit" and POISON in request_ids:
            raise ZeroDivisionError("division by zero")
        return len([e for e in self.events if e[0] == "submit"]) - 1, list(request_ids)

    async def collect(self, handle: Any) -> list[ItemResult]:
        k, ids = handle
        while len(self.gates) <= k:
            self.gates.append(asyncio.Event())
        await self.gates[k].wait()
        self._note("collected", ids)
        if self.fail == "lost" or (self.fail == "collect" and POISON in ids):
            raise RuntimeError("device lost the batch")
        return self._results(ids)

    async def execute_async(self, request_ids: Sequence[int], inputs: Sequence[bytes]) -> list[ItemResult]:
        self._note("alone", request_ids)
        if POISON in request_ids or self.fail == "lost":
            raise ZeroDivisionError("division by zero")
        return self._results(request_ids)

    def warm_up(self, batch_sizes: Sequence[int]) -> None:
        self._note("warm_up", [0])
        if self.fail == "lost":
            raise RuntimeError("device lost")

    def close(self) -> None:
        pass


def _device(t: Any, fail: str = "") -> Device:
    t.stats.set(CONSUMER_SLOT, STATE, READY)
    w = t.worker
    w.backend.close()
    w.backend = Device(t.stats, fail)
    w._init_in_flight()
    assert w.in_flight_max == 2
    return w.backend  # type: ignore[no-any-return]


async def _settle() -> None:
    for _ in range(20):  # the tasks' steps (a submit, a finish, the turn it starts)
        await asyncio.sleep(0)


def _start(t: Any, ids: Sequence[int]) -> None:
    w = t.worker
    w._loop = asyncio.get_running_loop()
    w._done = w._loop.create_future()
    for rid in ids:
        _push(t, rid)
    w._turn()


def test_batch_n_plus_1_is_submitted_before_batch_n_is_collected_and_they_finish_in_order(make_worker):  # noqa: F811
    """Eight items, batches of four: the second (full) batch is submitted while the first is in
    flight, the record names all eight, each batch finishes in submit order with its items'
    records and children; then the record names the one still in flight, then none."""
    t = make_worker()
    dev = _device(t)
    w = t.worker

    async def run() -> tuple[list[int], int, list[int]]:
        _start(t, range(1, 9))
        await _settle()
        both = sorted(t.stats.batch_record(0))
        queued = t.stats.get(0, QUEUED)
        assert w._busy and len(w._flights) == 2  # the turn takes no third batch
        dev.done(0)
        await _settle()
        after_first = sorted(t.stats.batch_record(0))
        dev.done(1)
        await w._batch_task
        return both, queued, after_first

    both, queued, after_first = asyncio.run(run())
    assert [e for e, _ in dev.events] == ["submit", "submit", "collected", "collected"]
    assert dev.events[0][1] == [1, 2, 3, 4] and dev.events[1][1] == [5, 6, 7, 8]
    assert both == list(range(1, 9)) and queued == 8
    assert dev.records[("submit", 5)] == list(range(1, 9))
    assert after_first == [5, 6, 7, 8]
    assert t.stats.batch_record(0) == [] and t.stats.get(0, BATCH_STARTED_NS) == 0
    assert (t.stats.get(0, BATCHES), t.stats.get(0, ITEMS), t.stats.get(0, QUEUED)) == (2, 8, 0)
    records = t.done.pop_completions(16)
    assert [(r[0], r[2]) for r in records] == [(i, int(Status.OK)) for i in range(1, 9)]
    children = t.out.pop_many_framed(16)
    assert [(h.request_id, int.from_bytes(body, "little")) for h, _, body in children] == [
        (i, i) for i in range(1, 9)]
    assert all(r[5] + c[1] == TOTAL_CREDIT for r, c in zip(records, children))
    assert not w._flights and not w._busy and w.bell._flag.armed


def test_a_partial_batch_waits_while_one_computes_and_goes_when_the_process_is_idle(make_worker):  # noqa: F811
    """A free slot releases no partial batch early: two items that came while batch 1 computes
    wait (the planned wait is 1 s) and go as batch 2 once batch 1 finished."""
    t = make_worker()
    dev = _device(t)
    w = t.worker

    async def run() -> tuple[int, int]:
        _start(t, range(1, 5))
        await _settle()
        for rid in (5, 6):
            _push(t, rid)
        w._turn()  # what their doorbell does
        await _settle()
        held = len(w.queue)
        submitted = len(dev.events)
        dev.done(0)
        await _settle()
        dev.done(1)
        await w._batch_task
        return held, submitted

    held, submitted = asyncio.run(run())
    assert (held, submitted) == (2, 1)
    assert [ids for e, ids in dev.events if e == "submit"] == [[1, 2, 3, 4], [5, 6]]
    assert [r[0] for r in t.done.pop_completions(16)] == [1, 2, 3, 4, 5, 6]


def test_a_partial_batch_goes_at_its_planned_wait_while_one_computes(make_worker):  # noqa: F811
    """The other release rule still holds while a batch computes: the oldest item waited the
    planned wait (20 ms here), so the partial batch is submitted beside the one in flight."""
    from jigsaw.runtime.batching import BatchQueue
    t = make_worker()
    dev = _device(t)
    w = t.worker
    q = w.queue
    w.queue = BatchQueue(q.max_batch, 20 * 10**6, q.capacity, q.staleness_ns, q.remaining_min_ns,
                         list(q.exec_estimate_ns))

    async def run() -> list[list[int]]:
        _start(t, range(1, 5))
        await _settle()
        for rid in (5, 6):
            _push(t, rid)
        w._turn()
        await asyncio.sleep(0.1)  # the turn's timer, due at the planned wait
        submitted = [ids for e, ids in dev.events if e == "submit"]
        dev.done(0)
        dev.done(1)
        await w._batch_task
        return submitted

    assert asyncio.run(run()) == [[1, 2, 3, 4], [5, 6]]  # both before batch 1 came back
    assert [r[0] for r in t.done.pop_completions(16)] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("fail", ["submit", "collect"])
def test_a_failing_batch_loses_nothing_of_the_next(make_worker, fail):  # noqa: F811
    """Batch 1 holds the poison: its items run again alone (only the poison answered 500, naming
    the task), batch 2 is served, and the records come in order."""
    t = make_worker()
    dev = _device(t, fail)
    w = t.worker

    async def run() -> None:
        _start(t, range(1, 9))
        await _settle()
        dev.done(0)
        dev.done(1)
        for _ in range(200):
            await _settle()
            if not w._flights:
                break

    asyncio.run(run())
    records = t.done.pop_completions(16)
    order = [r[0] for r in records]  # (within a batch, an error's record goes after the others)
    assert sorted(order[:4]) == [1, 2, 3, 4] and order[4:] == [5, 6, 7, 8]
    assert [r[0] for r in records if r[2] != int(Status.OK)] == [POISON]
    assert b"task 'b'" in bytes(records[order.index(POISON)][6])
    alone = [ids for e, ids in dev.events if e == "alone"]
    assert alone == [[1], [2], [3], [4]]
    second = [ids for e, ids in dev.events if e == "submit"][1]
    assert second == [5, 6, 7, 8]
    if fail == "submit":  # a failed submit holds the next batch back until its items ran alone
        assert dev.events.index(("submit", [5, 6, 7, 8])) > dev.events.index(("alone", [4]))
    else:  # the next batch was in flight while the failed one's items ran alone
        assert dev.events.index(("submit", [5, 6, 7, 8])) < dev.events.index(("collected", [1, 2, 3, 4]))
    assert len(t.out.pop_many_framed(16)) == 7 and not w._flights


def test_a_stop_finishes_the_batches_in_flight_first(make_worker, monkeypatch):  # noqa: F811
    """SIGTERM with two batches in flight: no new batch, both answered, then ``run`` may end."""
    t = make_worker()
    dev = _device(t)
    w = t.worker

    async def run() -> tuple[bool, bool, int]:
        _start(t, range(1, 9))
        await _settle()
        monkeypatch.setattr(worker_module, "_running", False)
        _push(t, 9)
        w._turn()
        ended_early = w._done.done()
        dev.done(0)
        dev.done(1)
        await w._batch_task
        await _settle()
        return ended_early, w._done.done(), len(t.producer)

    ended_early, ended, left = asyncio.run(run())
    assert (ended_early, ended, left) == (False, True, 1)  # item 9 stays in its ring for the next process
    assert [r[0] for r in t.done.pop_completions(16)] == list(range(1, 9))


def test_a_sighup_with_two_batches_in_flight_moves_both_to_the_new_slot(make_worker, tmp_path):  # noqa: F811
    """A re-plan mid-flight: ready in the new slot at once, the record (both batches) and the
    start stamp move there, each item is answered once through the rings it came in on, and the
    old wiring is unmapped once both batches finished."""
    t = make_worker()
    dev = _device(t)
    w = t.worker
    old = w.wiring
    with SegmentRegistry(None) as reg:
        new = _wiring(reg, 1.0, t.spec.doorbell, tag="-2")
        new.stats.set(CONSUMER_SLOT, STATE, READY)
        spec_path = tmp_path / "new.json"
        spec_path.write_text(new.spec.to_json())
        w.control = tmp_path / "control.json"
        w.control.write_text(json.dumps({"specs": [str(spec_path)]}))

        async def run() -> tuple[int, list[int], bool]:
            _start(t, range(1, 9))
            await _settle()
            w._rewire = True  # what the SIGHUP handler does
            w._turn()
            moved = sorted(new.stats.batch_record(0))
            mapped = old in w._unmapped
            dev.done(0)
            dev.done(1)
            await w._batch_task
            return new.stats.get(0, STATE), moved, mapped

        try:
            state, moved, mapped = asyncio.run(run())
            assert state == READY and mapped and moved == list(range(1, 9))
            assert t.stats.batch_record(0) == [] and new.stats.batch_record(0) == []
            assert new.stats.get(0, BATCH_STARTED_NS) == 0 and w._unmapped == []
            assert [r[0] for r in t.done.pop_completions(16)] == list(range(1, 9))
            assert new.done.pop_completions(16) == []
        finally:
            for ring in (new.producer, new.out, new.done):
                ring.close()
            for seg in new.closing:
                seg.close()


def test_a_lost_device_is_probed_once_no_batch_is_in_flight_and_the_process_exits(make_worker):  # noqa: F811
    """Three batches in a row whose every item failed make the probe due; it waits for the fourth
    batch, in flight then, to finish (every request answered 500 first); the warm-up batch then
    fails too and the process ends (to be restarted)."""
    t = make_worker()
    dev = _device(t, "lost")
    w = t.worker

    async def run() -> BaseException | None:
        _start(t, range(1, 17))
        for k in range(4):
            dev.done(k)
        for _ in range(200):
            await _settle()
            if w._done.done():
                break
        return w._done.exception() if w._done.done() else None

    ended = asyncio.run(run())
    assert isinstance(ended, SystemExit) and "warm-up batch" in str(ended)
    records = t.done.pop_completions(32)
    assert sorted(r[0] for r in records) == list(range(1, 17))
    assert {r[2] for r in records} == {int(Status.ERROR)}
    probe = [e for e, _ in dev.events].index("warm_up")
    assert probe == len(dev.events) - 1  # after the last batch, with none in flight
