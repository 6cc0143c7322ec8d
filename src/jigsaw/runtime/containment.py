"""What a worker answers for an item its backend could not serve, instead of dying.

A worker process serves many requests; one request's bad input, or a model that fails on it,
must cost that request only (an answer 500 naming the task), never the process, its queue, the
instance's capacity or a re-plan. These are the worker's pure helpers for that: the error an item
gets (``item_error``), whether an item's outputs fit their rings (``oversized``), whether a
backend's answer is one result per item (``check_results``), a rate-limited log line
(``ErrorLog``: a stream of poison requests must not flood the daemon's log), and the worker's
part that uses them (``ContainedBatches``: a batch the backend failed, outputs too large, outputs
that cannot be encoded).
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from jigsaw.backends.base import Backend, ItemResult
from jigsaw.runtime.records import CREDIT_BYTES
from jigsaw.runtime.rings import RecordHeader, Status
from jigsaw.runtime.stats import BATCHES, StatsBlock
from jigsaw.tensors import encode_tensors

LOG_EVERY_S = 5.0  # at most one line per this many seconds; the others are counted in the next
PROBE_AFTER_BATCHES = 3  # batches in a row whose every item raised before the backend is probed
ERROR_BYTES = 1000  # an error message is cut to this many characters (it travels in the answer)


def item_error(task: str, variant: str, exc: BaseException) -> ItemResult:
    """The result of an item the backend raised on: its request is answered 500 naming the task."""
    text = f"{type(exc).__name__}: {exc}"
    return ItemResult([], {}, f"task {task!r} ({variant}) failed on this request: {text}"[:ERROR_BYTES])


def check_results(results: Any, n: int) -> list[ItemResult]:
    """``results`` as a list when it is one ``ItemResult`` per item of a batch of ``n``; else a
    ``ValueError`` (a backend bug is contained like a backend error)."""
    if not isinstance(results, list):
        results = list(results)
    if len(results) != n:
        raise ValueError(f"the backend returned {len(results)} results for a batch of {n}")
    return results


def oversized(task: str, result: ItemResult, answer_limit: int, child_limits: dict[str, int]) -> str:
    """Why ``result`` cannot leave the worker ("" when it can): its answered outputs (a sink's,
    ``answer_limit`` > 0) encode larger than the completion ring takes, or a child for task t is
    larger than ``child_limits[t]`` (the smallest ``max_payload_bytes`` of t's rings from here)."""
    for child_task, bodies in result.children.items():
        limit = child_limits.get(child_task)
        if limit is None:
            continue
        for body in bodies:
            if len(body) > limit:
                return (f"task {task!r}: its output for task {child_task!r} is {len(body)} bytes, over the "
                        f"{limit} bytes its ring carries (raise the app's max_item_bytes)")
    if answer_limit > 0:
        size = len(encode_tensors(result.outputs))
        if size > answer_limit:
            names = ", ".join(f"{t.name} {list(t.shape)}" for t in result.outputs)
            return (f"task {task!r}: its outputs ({names}) are {size} bytes, over the {answer_limit} bytes "
                    f"an answer carries (raise the app's max_item_bytes)")
    return ""


class ErrorLog:
    """One line on stderr (the daemon's log) per contained error, at most one per ``LOG_EVERY_S``."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.count = 0  # contained errors since the process started
        self._last_s = 0.0
        self._unlogged = 0

    def note(self, what: BaseException | str) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self._last_s < LOG_EVERY_S:
            self._unlogged += 1
            return
        text = what if isinstance(what, str) else f"{type(what).__name__}: {what}"
        more = f" ({self._unlogged} more since the last line)" if self._unlogged else ""
        print(f"worker {self.worker}: answered 500 for an item it could not serve: {text[:300]}{more}",
              file=sys.stderr, flush=True)
        self._last_s, self._unlogged = now, 0



class WorkerState:
    """The state and calls of ``worker.Worker`` that its mixins (``ContainedBatches`` here,
    ``in_flight.BatchesInFlight``) read, declared once for the type checker; the worker defines
    them."""

    spec: Any  # topology.ProcessSpec
    stats: StatsBlock
    backend: Backend
    _busy: bool
    _in_flight: list[Any]
    _in_flight_queued: int
    _batch_start_ns: int
    _batch_task: Any

    if TYPE_CHECKING:
        def _finish_batch(self, items: list[Any], start: int, results: list[ItemResult]) -> None: ...
        def publish_queued(self, queued: int | None = None) -> None: ...
        def _running_loop(self) -> Any: ...
        def _fail(self, exc: BaseException) -> None: ...
        def _turn(self) -> None: ...


class ContainedBatches(WorkerState):
    """The worker's handling of what its backend does wrong (a mixin of ``worker.Worker``, whose
    state it reads: the module docstring of ``runtime/worker.py`` says when each runs).

    A backend that is broken, not fed bad items (a lost device, a runtime in a bad state), fails
    every item: after ``PROBE_AFTER_BATCHES`` batches in a row whose every item raised, the worker
    runs the backend's warm-up batch (a synthetic item that served at start); when that fails too
    the process exits, once its batch is answered, and the supervisor restarts it (counted toward
    giving it up: a crash not of one batch's making). A stream of bad requests passes the probe.
    """

    _failing = 0  # batches in a row whose every item raised
    _failed_at = -2  # the batch count (``stats.BATCHES``) of the last such batch
    _probe_due = False

    errors: ErrorLog

    if TYPE_CHECKING:  # the worker's, which these methods call
        def complete(self, header: RecordHeader, status: int, credit: int, tensors: Any = b"",
                     num_children: int = 0, wiring: Any = None) -> None: ...

    def _contain(self, items: list[Any], start: int, queued: int, exc: Exception) -> None:
        """A batch whose backend raised before it could wait: a lone item is answered 500 now; a
        larger batch's items run alone in a task (``_run_alone``), which finishes the batch."""
        if len(items) == 1:
            self.errors.note(exc)
            self._failed_whole()
            self._finish_batch(items, start, [item_error(self.spec.task, self.spec.variant, exc)])
            self.probe_if_due()
            return
        self._busy = True
        self._in_flight = items
        self._in_flight_queued = queued
        self._batch_start_ns = start
        self.publish_queued(queued)

        async def alone() -> None:
            try:
                self._finish_batch(items, start, await self._run_alone(items, exc))
                self.probe_if_due()
            except BaseException as failed:
                self._fail(failed)
                return
            finally:
                self._busy = False
                self._in_flight = []
            self._turn()

        self._batch_task = self._running_loop().create_task(alone())

    async def _run_alone(self, items: list[Any], exc: Exception) -> list[ItemResult]:
        """The results of a batch the backend failed as a whole (``exc``): each item run again
        alone, its batch record narrowed to it (a crash then names the one item); an item that
        fails alone is answered 500 naming the task, the others are served."""
        self.errors.note(exc)
        if len(items) == 1:
            self._failed_whole()
            return [item_error(self.spec.task, self.spec.variant, exc)]
        results = []
        failed = 0
        for header, _, tensors, _ in items:
            self.stats.batch_started(self.spec.slot, time.monotonic_ns(), [header.request_id])
            try:
                got = check_results(await self.backend.execute_async([header.request_id], [tensors]), 1)[0]
            except Exception as alone:
                self.errors.note(alone)
                got = item_error(self.spec.task, self.spec.variant, alone)
                failed += 1
            results.append(got)
        if failed == len(items):
            self._failed_whole()
        return results

    def _failed_whole(self) -> None:
        """A batch whose every item raised: one more in a row (``stats.BATCHES`` counts the batches
        finished, so the next one's count is this one's plus one)."""
        finished = self.stats.get(self.spec.slot, BATCHES)
        self._failing = self._failing + 1 if finished == self._failed_at + 1 else 1
        self._failed_at = finished
        if self._failing >= PROBE_AFTER_BATCHES:
            self._failing = 0
            self._probe_due = True

    def probe_if_due(self) -> None:
        """After a batch is answered: the backend's warm-up batch when it is due (the class
        docstring); ``SystemExit`` naming the error when that fails too (the process ends)."""
        if not self._probe_due:
            return
        self._probe_due = False
        try:
            self.backend.warm_up([1])
        except Exception as exc:
            raise SystemExit(f"worker {self.spec.name}: its backend fails every item and its warm-up batch "
                             f"too ({type(exc).__name__}: {exc}): exiting to be restarted") from None

    def _fit(self, items: list[Any], results: list[ItemResult], sink: bool) -> list[ItemResult]:
        """``results`` with each item whose output (a sink's, answered) or child does not fit its
        ring replaced by an error naming the task and the output: that item's request is answered
        500, the worker and the batch's other items go on."""
        results = list(results)
        for i, result in enumerate(results):
            if result.error:
                continue
            w = items[i][3]
            why = oversized(self.spec.task, result, w.done.max_payload_bytes - CREDIT_BYTES if sink else 0,
                            w.child_limits)
            if why:
                self.errors.note(why)
                results[i] = ItemResult([], {}, why)
        return results

    def _answer(self, header: RecordHeader, credit: int, result: ItemResult, w: Any) -> Any:
        """A sink item's outputs encoded for its answer; None when they cannot be (not of their
        declared datatype or shape): the item is answered 500 instead, alone."""
        try:
            return encode_tensors(result.outputs)
        except (ValueError, TypeError) as exc:
            self.errors.note(exc)
            why = f"task {self.spec.task!r}: its outputs cannot be answered: {exc}"
            self.complete(header, Status.ERROR, credit, why.encode()[:4096], wiring=w)
            return None
