"""A middle task's worker turn on real rings, in this process: where its child goes by the one
consumer's state, and the queue length it publishes for its producers (compiled core, or the pure
one with ``JIGSAW_NO_EXTENSIONS=1``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from jigsaw.runtime import worker as worker_module
from jigsaw.runtime.records import HOP_SENT, TOTAL_CREDIT
from jigsaw.runtime.rings import RecordHeader, SegmentRegistry, ShmRing, Status
from jigsaw.runtime.stats import (
    BATCH_STARTED_NS,
    DEAD,
    FAILED,
    ITEMS,
    QUEUED,
    READY,
    RING_QUEUED,
    STATE,
    StatsBlock,
)
from jigsaw.runtime.topology import OutputRing, ProcessSpec

CONSUMER_SLOT = 1  # the child task's process


def _wiring(reg: SegmentRegistry, batch_ms: float, own: str, tag: str = "") -> SimpleNamespace:
    """One generation's segments of the worker (``tag`` names a second generation's) and its spec."""
    ring_in, ring_out, done = (reg.create_ring(p + tag, 1 << 16) for p in ("in", "out", "done"))
    out_bell, done_bell = (reg.create_doorbell(p + tag) for p in ("out-bell", "done-bell"))
    stats_name = reg.name("stats" + tag)
    reg.add_shm(stats_name)
    stats = StatsBlock.create(stats_name, 2)
    ms = {b: batch_ms for b in (1, 2, 4)}
    spec = ProcessSpec(
        slot=0, name="t.b.v.1g.0", app="t", app_index=0, task="b", task_index=1, task_kind="generic",
        variant="v", mig_profile="1g.10gb", mps=1, max_batch=4, latency_ms_by_batch=ms, time_scale=1.0,
        max_wait_ns=10**9, staleness_ns=5 * 10**9, remaining_min_ns=0, exec_estimate_ns=[1000] * 4,
        downstream=[{"task": "c", "task_index": 2, "factor": 1.0}], doorbell=own, inputs=[ring_in.name],
        outputs=[OutputRing(ring_out.name, out_bell.name, CONSUMER_SLOT, "c")], routes=[{"c": [0]}],
        completion_ring=done.name, completion_doorbell=done_bell.name, stats=stats_name, mean_ms_by_batch=ms)
    return SimpleNamespace(
        spec=spec, stats=stats, closing=[stats, ring_in, ring_out, done, out_bell, done_bell],
        producer=ShmRing.attach(ring_in.name, role="producer"),
        out=ShmRing.attach(ring_out.name, role="consumer"), done=ShmRing.attach(done.name, role="consumer"))


def _worker(reg: SegmentRegistry, batch_ms: float) -> SimpleNamespace:
    own = reg.create_doorbell("own")
    t = _wiring(reg, batch_ms, own.name)
    t.worker = worker_module.Worker(t.spec)
    t.closing.append(own)
    return t


@pytest.fixture
def make_worker() -> Iterator:
    made: list[SimpleNamespace] = []
    with SegmentRegistry(None) as reg:
        def make(batch_ms: float = 0.001) -> SimpleNamespace:
            made.append(_worker(reg, batch_ms))
            return made[-1]
        yield make
        for t in made:
            if t.worker._timer is not None:
                t.worker._timer.cancel()
            t.worker.close()
            for ring in (t.producer, t.out, t.done):
                ring.close()
            for seg in t.closing:
                seg.close()


def _push(t: SimpleNamespace, request_id: int) -> None:
    now = time.monotonic_ns()
    h = RecordHeader(request_id=request_id, deadline_ns=now + 10**10, created_ns=now)
    h.stamp(HOP_SENT, now)
    assert t.producer.push_framed(h, TOTAL_CREDIT, bytes(16))


async def _turns(t: SimpleNamespace, items: int, wait_s: float = 0.0) -> None:
    """Push ``items`` and run the worker's turn as its doorbell would, then wait ``wait_s``."""
    w = t.worker
    w._loop = asyncio.get_running_loop()
    w._done = w._loop.create_future()
    for i in range(items):
        _push(t, i + 1)
    w._turn()
    if wait_s:
        await asyncio.sleep(wait_s)


@pytest.mark.parametrize("state", [READY, DEAD])
def test_the_lone_child_consumer_gets_the_child_unless_it_failed_for_good(make_worker, state):
    """READY takes it; DEAD is being restarted, so the child waits in its ring for the new process."""
    t = make_worker()
    t.stats.set(CONSUMER_SLOT, STATE, state)
    asyncio.run(_turns(t, 1))
    assert [h.request_id for h, _, _ in t.out.pop_many_framed(8)] == [1]
    records = t.done.pop_completions(8)
    assert [(r[0], r[2], r[4]) for r in records] == [(1, int(Status.OK), 1)]  # the parent's, one child


def test_the_one_child_path_splits_the_credit_as_children_of_does(make_worker):
    """The middle hop's fast path (``lone_child`` + ``push_hop``) gives the child half the credit
    and the parent's record the rest, with one child counted: what ``children_of`` gives."""
    t = make_worker()
    t.stats.set(CONSUMER_SLOT, STATE, READY)
    w = t.worker
    asyncio.run(_turns(t, 1))
    (child,) = t.out.pop_many_framed(8)
    (record,) = t.done.pop_completions(8)
    header = RecordHeader(request_id=1)
    result = w.backend.execute_nowait([1], [bytes(16)])[0]  # (what the item's batch gave, same seed)
    children, shares, kept = w.children_of(header, TOTAL_CREDIT, result)
    assert (child[0].request_id, child[1]) == (1, shares[0]) and len(children) == 1
    assert (record[0], record[4], record[5]) == (1, 1, kept)
    assert child[1] + record[5] == TOTAL_CREDIT


def test_a_child_whose_only_consumer_failed_returns_its_share_as_an_error(make_worker):
    t = make_worker()
    t.stats.set(CONSUMER_SLOT, STATE, FAILED)
    asyncio.run(_turns(t, 1))
    assert t.out.pop_many_framed(8) == []
    records = t.done.pop_completions(8)
    # the parent's record, and the child's drop
    assert sorted(r[2] for r in records) == [int(Status.OK), int(Status.ERROR)]
    assert sum(r[5] for r in records) == TOTAL_CREDIT  # the frontend gets every credit back


def test_queue_length_is_published_while_a_batch_waits_and_after_it(make_worker):
    """A batch that waits on its backend leaves its items counted as queued (the producers route
    by it); once it has finished, the published length is the queue's again."""
    t = make_worker(batch_ms=50.0)
    t.stats.set(CONSUMER_SLOT, STATE, READY)

    async def run() -> tuple[int, int]:
        await _turns(t, 3, wait_s=0.005)
        waiting = t.stats.get(0, QUEUED)
        await t.worker._batch_task
        return waiting, t.stats.get(0, QUEUED)

    waiting, after = asyncio.run(run())
    assert (waiting, after) == (3, 0)
    assert len(t.out.pop_many_framed(8)) == 3


def test_the_records_left_in_the_input_rings_are_published_beside_the_queue(make_worker):
    """Items stay in the rings until the process can batch them: 7 pushed for batches of 4, the
    first batch running, leave 3 in the ring, published as ``RING_QUEUED`` (the frontend's
    estimate of a new request's wait reads them for every task past the root); none once done."""
    t = make_worker(batch_ms=50.0)
    t.stats.set(CONSUMER_SLOT, STATE, READY)

    async def run() -> tuple[int, int, int]:
        await _turns(t, 7, wait_s=0.005)
        queued, in_rings = t.stats.get(0, QUEUED), t.stats.get(0, RING_QUEUED)
        while t.stats.get(0, ITEMS) < 7:
            await t.worker._batch_task
            await asyncio.sleep(0.01)
        return queued, in_rings, t.stats.get(0, RING_QUEUED)

    queued, in_rings, after = asyncio.run(run())
    assert (queued, in_rings, after) == (4, 3, 0)


def test_queue_length_after_a_batch_finished_in_the_turn(make_worker):
    t = make_worker()
    t.stats.set(CONSUMER_SLOT, STATE, READY)
    t.stats.set(0, QUEUED, 99)
    asyncio.run(_turns(t, 2))
    assert t.stats.get(0, QUEUED) == 0
    assert len(t.out.pop_many_framed(8)) == 2


@pytest.mark.parametrize("items", [1, 6])
def test_a_turn_counts_its_batches_and_arms_once_out_of_work(make_worker, items):
    """Batches of up to 4: the slot counts each batch, item and its busy time, clears the batch's
    start stamp, and the turn ends armed (a producer's next ring wakes the process), also when the
    last batch left nothing to look at again."""
    from jigsaw.runtime.stats import BATCHES, BUSY_NS, ITEMS
    t = make_worker()
    t.stats.set(CONSUMER_SLOT, STATE, READY)
    asyncio.run(_turns(t, items))
    assert t.stats.get(0, BATCHES) == (items + 3) // 4
    assert t.stats.get(0, ITEMS) == items
    assert t.stats.get(0, BUSY_NS) > 0 and t.stats.get(0, BATCH_STARTED_NS) == 0
    assert len(t.out.pop_many_framed(8)) == items
    assert t.worker.bell._flag.armed


def test_a_turn_takes_what_came_while_its_batch_ran(make_worker, monkeypatch):
    """A record pushed while the batch runs is taken in the same turn, not left for a wake-up."""
    t = make_worker()
    t.stats.set(CONSUMER_SLOT, STATE, READY)
    w = t.worker
    run = w.backend.execute_nowait
    pushed = []

    def execute_and_push(request_ids, inputs):
        if not pushed:
            pushed.append(True)
            _push(t, 99)
        return run(request_ids, inputs)

    monkeypatch.setattr(w.backend, "execute_nowait", execute_and_push)
    asyncio.run(_turns(t, 1))
    assert [h.request_id for h, _, _ in t.out.pop_many_framed(8)] == [1, 99]
    assert len(t.producer) == 0 and w.bell._flag.armed


def test_a_child_that_finds_its_ring_full_until_its_deadline_returns_its_share_as_a_drop(make_worker):
    """The record and the child go in one call of the core when both fit; when the child's ring
    stays full, the record went and the child takes the long way: its deadline passes and its
    share comes back as a drop."""
    t = make_worker()
    t.stats.set(CONSUMER_SLOT, STATE, READY)
    w = t.worker
    while w.wiring.outputs[0].push_framed(RecordHeader(request_id=99), 1, b""):
        pass
    held = len(t.out)

    async def run() -> None:
        w._loop = asyncio.get_running_loop()
        w._done = w._loop.create_future()
        now = time.monotonic_ns()
        h = RecordHeader(request_id=7, deadline_ns=now + 30 * 10**6, created_ns=now)
        h.stamp(HOP_SENT, now)
        assert t.producer.push_framed(h, TOTAL_CREDIT, bytes(16))
        w._turn()

    asyncio.run(run())
    assert len(t.out) == held
    records = t.done.pop_completions(8)
    assert sorted(r[2] for r in records) == [int(Status.OK), int(Status.DROPPED_DEADLINE)]  # parent, child
    assert sum(r[5] for r in records) == TOTAL_CREDIT


def test_a_sighup_mid_batch_serves_the_new_wiring_at_once_and_the_batch_on_its_own(make_worker, tmp_path):
    """A kept process told to serve a new generation while a batch awaits its backend is ready in
    the new stats slot at once (the daemon switches the routing only when every process is), not
    when the batch ends; the batch's items are answered once, through the rings they came in on;
    the old wiring, no longer listed, is unmapped only after the batch, and the batch's stamp and
    the queue length move to the slot the supervisor and the producers now read."""
    t = make_worker(batch_ms=300.0)
    t.stats.set(CONSUMER_SLOT, STATE, READY)
    w = t.worker
    old = w.wiring
    with SegmentRegistry(None) as reg:
        new = _wiring(reg, 300.0, t.spec.doorbell, tag="-2")
        new.stats.set(CONSUMER_SLOT, STATE, READY)
        spec_path = tmp_path / "new.json"
        spec_path.write_text(new.spec.to_json())
        w.control = tmp_path / "control.json"
        w.control.write_text(json.dumps({"specs": [str(spec_path)]}))  # the old spec no longer listed
        closed: list[bool] = []
        close = old.close
        old.close = lambda: (closed.append(bool(w._busy)), close())  # type: ignore[method-assign]

        async def run() -> tuple[int, int, int, bool]:
            await _turns(t, 3, wait_s=0.02)
            assert w._busy  # the batch awaits its backend
            w._rewire = True  # what the SIGHUP handler does
            w._turn()
            state, queued = new.stats.get(0, STATE), new.stats.get(0, QUEUED)
            started = new.stats.get(0, BATCH_STARTED_NS)
            mapped = old in w._unmapped and not closed
            await w._batch_task
            return state, queued, started, mapped

        try:
            state, queued, started, mapped = asyncio.run(run())
            assert state == READY and mapped  # ready mid-batch, the old rings still mapped
            assert queued == 3 and started > 0 and t.stats.get(0, BATCH_STARTED_NS) == 0
            assert new.stats.get(0, BATCH_STARTED_NS) == 0  # cleared by the batch's end
            assert closed == [False] and w._unmapped == []  # unmapped once, after the batch
            assert w.wiring.spec.stats == new.spec.stats
            records = t.done.pop_completions(8)
            assert sorted(r[0] for r in records) == [1, 2, 3]  # each item answered once, on its wiring
            assert sorted(h.request_id for h, _, _ in t.out.pop_many_framed(8)) == [1, 2, 3]
            assert new.done.pop_completions(8) == [] and new.out.pop_many_framed(8) == []
        finally:
            for ring in (new.producer, new.out, new.done):
                ring.close()
            for seg in new.closing:  # (the worker's own mappings stay until the fixture closes it)
                seg.close()


def test_a_second_sighup_mid_batch_unmaps_the_wiring_the_first_added_at_once(make_worker, tmp_path):
    """A wiring added mid-batch and dropped again before the batch ends holds no item: it is
    unmapped at once, the batch's stamp moving on to the newest slot; the batch's own wiring stays
    mapped until the batch ends."""
    t = make_worker(batch_ms=300.0)
    t.stats.set(CONSUMER_SLOT, STATE, READY)
    w = t.worker
    old = w.wiring
    w.control = tmp_path / "control.json"
    with SegmentRegistry(None) as reg:
        made = [_wiring(reg, 300.0, t.spec.doorbell, tag=f"-{k}") for k in (2, 3)]

        def tell(k: int) -> None:
            path = tmp_path / f"{k}.json"
            path.write_text(made[k].spec.to_json())
            w.control.write_text(json.dumps({"specs": [str(path)]}))
            w._rewire = True  # what the SIGHUP handler does
            w._turn()

        async def run() -> tuple[bool, bool, int, int]:
            await _turns(t, 2, wait_s=0.02)
            assert w._busy
            tell(0)
            second = w.wiring
            tell(1)
            dropped = second not in w._unmapped and second not in w.wirings  # unmapped at once
            kept = old in w._unmapped
            stamps = made[0].stats.get(0, BATCH_STARTED_NS), made[1].stats.get(0, BATCH_STARTED_NS)
            await w._batch_task
            return dropped, kept, *stamps

        try:
            dropped, kept, stamp_dropped, stamp_newest = asyncio.run(run())
            assert dropped and kept and stamp_dropped == 0 and stamp_newest > 0
            assert w._unmapped == [] and sorted(r[0] for r in t.done.pop_completions(8)) == [1, 2]
        finally:
            for x in made:
                for ring in (x.producer, x.out, x.done):
                    ring.close()
                for seg in x.closing:
                    seg.close()
