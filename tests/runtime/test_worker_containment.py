"""A worker contains what its backend does wrong: an exception on a batch, on one item, a wrong
number of results or an output too large for its ring is answered 500 for the items concerned
(naming the task), the other items are served and the process goes on; the batch running is in
the process's batch record (what the supervisor reads after a crash). Real rings and stats block,
in this process (the worker's turn as in ``test_worker_turn``)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_worker_turn import _push, make_worker  # noqa: F401 (the fixture)

from jigsaw.backends.base import ItemResult
from jigsaw.runtime.records import CREDIT_BYTES, TOTAL_CREDIT
from jigsaw.runtime.rings import Status
from jigsaw.runtime.stats import READY, STATE
from jigsaw.tensors import Tensor

CONSUMER_SLOT = 1
POISON = 2  # the request id the fake backend fails on


class Fussy:
    """A backend failing every batch that holds request ``POISON`` (as a model whose pre-processing
    divides by an empty image's size), after ``wait_s`` (0: without waiting)."""

    kind = "fake"

    def __init__(self, wait_s: float = 0.0, child_bytes: int = 16) -> None:
        self.wait_s = wait_s
        self.child_bytes = child_bytes
        self.batches: list[list[int]] = []
        self.records: list[list[int]] = []  # the batch record as each batch started
        self.stats: Any = None

    def _results(self, request_ids: Sequence[int]) -> list[ItemResult]:
        self.batches.append(list(request_ids))
        if self.stats is not None:
            self.records.append(self.stats.batch_record(0))
        if POISON in request_ids:
            raise ZeroDivisionError("division by zero")
        return [ItemResult([Tensor("value", "FP32", (1,), bytes(4))], {"c": [bytes(self.child_bytes)]})
                for _ in request_ids]

    def execute_nowait(self, request_ids: Sequence[int], inputs: Sequence[bytes]
                       ) -> list[ItemResult] | Coroutine[Any, Any, list[ItemResult]]:
        return self._results(request_ids) if not self.wait_s else self.execute_async(request_ids, inputs)

    async def execute_async(self, request_ids: Sequence[int], inputs: Sequence[bytes]) -> list[ItemResult]:
        await asyncio.sleep(self.wait_s)
        return self._results(request_ids)

    def close(self) -> None:
        pass


def _serve(t: Any, backend: Fussy, items: int, check_sizes: bool = False,
           ids: list[int] | None = None) -> list[tuple[int, int, bytes]]:
    """Run ``items`` requests (ids 1..items, or ``ids``) through the worker; (request id, status,
    error) of each completion record, the worker still running."""
    ids = ids or list(range(1, items + 1))
    t.stats.set(CONSUMER_SLOT, STATE, READY)
    backend.stats = t.stats
    w = t.worker
    w.backend.close()
    w.backend = backend
    w._check_sizes = check_sizes

    async def run() -> None:
        w._loop = asyncio.get_running_loop()
        w._done = w._loop.create_future()
        for rid in ids:
            _push(t, rid)
        w._turn()
        for _ in range(200):
            if not w._busy:
                break
            await asyncio.sleep(0.01)
        assert not w._done.done(), "the worker's run ended"

    asyncio.run(run())
    assert t.stats.batch_record(0) == []  # no batch runs now
    records = t.done.pop_completions(64)
    children = t.out.pop_many_framed(64)
    assert sum(r[5] for r in records) + sum(c[1] for c in children) == len(ids) * TOTAL_CREDIT
    return [(r[0], r[2], bytes(r[6])) for r in records]


def _errors(records: list[tuple[int, int, bytes]]) -> dict[int, str]:
    return {rid: err.decode() for rid, status, err in records if status == int(Status.ERROR)}


def test_a_batch_that_raises_runs_its_items_alone_and_only_the_poison_fails(make_worker):  # noqa: F811
    t = make_worker()
    backend = Fussy()
    records = _serve(t, backend, 3)
    assert backend.batches == [[1, 2, 3], [1], [2], [3]]
    assert backend.records == [[1, 2, 3], [1], [2], [3]]  # each alone run narrows the record
    errors = _errors(records)
    assert list(errors) == [POISON]
    assert "task 'b'" in errors[POISON] and "ZeroDivisionError" in errors[POISON]
    assert sorted(rid for rid, status, _ in records if status == int(Status.OK)) == [1, 3]
    assert t.worker.errors.count == 2  # the batch, then the item alone


def test_a_lone_item_that_raises_is_answered_without_running_again(make_worker):  # noqa: F811
    t = make_worker()
    backend = Fussy()
    records = _serve(t, backend, 1, ids=[POISON])
    assert backend.batches == [[POISON]]
    assert list(_errors(records)) == [POISON]


def test_a_batch_that_fails_while_it_waits_is_contained_too(make_worker):  # noqa: F811
    t = make_worker()
    backend = Fussy(wait_s=0.01)
    records = _serve(t, backend, 4)
    assert backend.batches == [[1, 2, 3, 4], [1], [2], [3], [4]]
    assert list(_errors(records)) == [POISON]


def test_a_wrong_number_of_results_is_a_batch_error(make_worker):  # noqa: F811
    t = make_worker()

    class Short(Fussy):
        def _results(self, request_ids: Sequence[int]) -> list[ItemResult]:
            return super()._results([r for r in request_ids if r != POISON])  # one short

    records = _serve(t, Short(), 3)
    errors = _errors(records)
    assert list(errors) == [POISON] and "0 results for a batch of 1" in errors[POISON], errors


@pytest.mark.parametrize("extra", [1, 0])
def test_a_child_too_large_for_its_ring_fails_its_item_only(make_worker, extra):  # noqa: F811
    """A child one byte over the ring's max payload: its item 500 naming the task and the output;
    exactly the max payload goes."""
    t = make_worker()
    limit = t.worker.wiring.outputs[0].max_payload_bytes - CREDIT_BYTES
    records = _serve(t, Fussy(child_bytes=limit + extra), 1, check_sizes=True)
    errors = _errors(records)
    if not extra:
        assert errors == {}
        return
    assert list(errors) == [1]
    assert "output for task 'c'" in errors[1] and f"{limit + 1} bytes" in errors[1]


@pytest.mark.parametrize("warm_up_works", [True, False])
def test_a_backend_that_fails_every_item_is_probed_and_a_broken_one_exits(make_worker, warm_up_works):  # noqa: F811
    """Three batches in a row whose every item raised: the warm-up batch probes the backend. Bad
    requests (the probe passes) keep the worker serving; a broken backend (the probe fails too)
    ends the process once the third batch is answered (the supervisor restarts it)."""
    t = make_worker()

    class Broken(Fussy):
        probes = 0

        def _results(self, request_ids: Sequence[int]) -> list[ItemResult]:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

        def warm_up(self, batch_sizes: Sequence[int]) -> None:
            Broken.probes += 1
            if not warm_up_works:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")

    backend = Broken()
    t.stats.set(CONSUMER_SLOT, STATE, READY)
    w = t.worker
    w.backend.close()
    w.backend = backend

    async def run() -> list[int]:
        w._loop = asyncio.get_running_loop()
        w._done = w._loop.create_future()
        answered = []
        for rid in (1, 2, 3, 4, 5, 6):
            _push(t, rid)
            w._turn()
            answered += [r[0] for r in t.done.pop_completions(8) if r[2] == int(Status.ERROR)]
            if w._done.done():
                break
        return answered

    answered = asyncio.run(run())
    if warm_up_works:
        assert answered == [1, 2, 3, 4, 5, 6] and not w._done.done() and Broken.probes == 2
        return
    assert answered == [1, 2, 3] and Broken.probes == 1  # the third batch answered, then the exit
    with pytest.raises(SystemExit, match="fails every item and its warm-up batch too"):
        w._done.result()
    assert t.stats.batch_record(0) == []  # nothing to blame on a batch: the restart is counted
