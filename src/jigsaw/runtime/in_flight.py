"""Two batches in flight: a worker whose backend keeps more than one batch submitted.

A device pipeline (``backends/gpu_pipeline.py``) stages and uploads batch n+1 while batch n
computes, but only if the worker hands it batch n+1 before batch n ends. So a worker whose backend
says so (``Backend.max_in_flight`` > 1) starts a batch with ``Backend.submit``, which returns once
the backend holds the batch (on CUDA: staged, uploaded and launched, before the device computed
it), and may then take and submit the next one, up to ``max_in_flight`` (at most
``stats.IN_FLIGHT_MAX``); each batch is then ``collect``-ed and finished (answers, children,
stats) in the order the batches were submitted, so each item's records go as before.

The batching rule stays the paper's (§3.3): a batch is released when full, when its oldest item
waited the planned wait, or when the process is idle. A process with a batch computing is not
idle, so the next batch is released early only by the first two (``take_while_computing``); once
no batch is in flight, the next turn releases what is queued as before.

The process's batch record (``stats.StatsBlock.batch_started``) holds the request ids of every
batch in flight, and its start stamp is the oldest's: a crash while batch n+1 uploads or batch n
computes blames both batches' requests. When batch n ends, the record is cleared with its stats
(``_finish_batch``) and written again for the batches still in flight: a crash in the few
instructions between names no suspects (its requests are sent again, as between batches), never
an item already answered.

A batch whose submit or collect fails has its items run again alone (``_run_alone``), after the
batch before it finished; a failed submit holds the next batch back until then. The batches after
a failed one are not lost: they finish after it, in order. A backend found failing every item
(``ContainedBatches``) is probed once no batch is in flight. A stop (SIGTERM) takes no new batch and
ends the process once the batches in flight finished.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jigsaw.backends.base import ItemResult
from jigsaw.runtime.containment import WorkerState, check_results
from jigsaw.runtime.stats import IN_FLIGHT_MAX


@dataclass(eq=False)
class Flight:
    """One batch submitted to the backend and not yet finished."""

    items: list[Any]
    request_ids: list[int]
    start_ns: int
    submitted: bool = False  # the backend holds it (its submit returned)
    collected_ns: int = 0  # when its results came back
    finished: asyncio.Future[None] | None = None  # set once it was finished (the next one waits on it)
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class BatchesInFlight(WorkerState):
    """The worker's batches in flight (a mixin of ``worker.Worker``, whose state it reads: see the
    module docstring)."""

    queue: Any  # batching.BatchQueue
    inputs: list[Any]
    _input_wiring: list[Any]
    _next_input: int
    _passed_over_ns: int

    if TYPE_CHECKING:  # the containment mixin's, which these methods call
        async def _run_alone(self, items: list[Any], exc: Exception) -> list[ItemResult]: ...
        def probe_if_due(self) -> None: ...

    def _init_in_flight(self) -> None:
        self._flights: list[Flight] = []  # oldest first
        self._collected_ns = 0  # when the last batch finished came back from the backend
        self.in_flight_max = max(1, min(self.backend.max_in_flight, IN_FLIGHT_MAX))
        if self.in_flight_max > 1:  # the worker's batches start here (bound once: no test per batch)
            self._start_batch = self.submit_batch  # type: ignore[method-assign]
        else:
            self.__dict__.pop("_start_batch", None)

    def take_while_computing(self) -> tuple[Any, Any, Any, list[Any], list[Any], int, int]:
        """``BatchQueue.take_batch``'s intake and drops, released by the rule of a process that is
        not idle (a batch computes): ``next_batch(now, idle=False)``. Returns what ``take_batch``
        does: ``(items, request ids, tensors, dropped, refused, first, passed_over_ns)``, items
        None when nothing is released."""
        q, rings, tags = self.queue, self.inputs, self._input_wiring
        refused: list[Any] = []
        want = q.max_batch - len(q)
        k = len(rings)
        first = self._next_input % k if k else 0
        for at in (*range(first, k), *range(first)):
            if want <= 0:
                break
            got, no_room = q.take_framed(rings[at], want, self._passed_over_ns, tags[at])
            refused.extend(no_room)
            want -= got
        if k > 1:
            self._next_input = (first + 1) % k
        now = time.monotonic_ns()
        dropped = list(q.expired(now)) if len(q) else []
        passed_over_ns = self._passed_over_ns
        if len(q) >= q.max_batch and any(len(ring) for ring in rings):
            passed_over_ns = now
        batch = q.next_batch(now, False)
        if batch is None:
            return None, None, None, dropped, refused, self._next_input, passed_over_ns
        items = [entry[3] for entry in batch]
        return (items, [entry[0] for entry in batch], [item[2] for item in items], dropped, refused,
                self._next_input, passed_over_ns)

    def submit_batch(self, items: list[Any], request_ids: list[int], tensors: list[Any]) -> None:
        """Hand the backend a batch ``take_batch`` released (the worker's ``_start_batch`` when
        the backend keeps batches in flight); the turn takes no batch until the backend holds it."""
        flight = Flight(items, list(request_ids), time.monotonic_ns())
        loop = self._running_loop()
        flight.finished = loop.create_future()
        previous = self._flights[-1].finished if self._flights else None
        self._flights.append(flight)
        self._busy = True
        self._in_flight = [item for f in self._flights for item in f.items]
        self._record_flights()
        self._in_flight_queued = len(self.queue) + len(self._in_flight)
        self.publish_queued(self._in_flight_queued)  # what waits here (the batches' items too)
        flight.task = self._batch_task = loop.create_task(self._fly(flight, previous, tensors))

    def _record_flights(self) -> None:
        """The batch record: every batch in flight's request ids, the oldest's start stamp."""
        self._batch_start_ns = self._flights[0].start_ns
        self.stats.batch_started(self.spec.slot, self._batch_start_ns,
                                 [rid for f in self._flights for rid in f.request_ids])

    def _update_busy(self) -> None:
        flights = self._flights
        self._busy = len(flights) >= self.in_flight_max or any(not f.submitted for f in flights)

    async def _fly(self, flight: Flight, previous: asyncio.Future[None] | None, tensors: list[Any]) -> None:
        """Submit the batch, let the turn take the next one, then (after the batch before it)
        collect and finish it."""
        try:
            failed: Exception | None = None
            handle: Any = None
            try:
                handle = await self.backend.submit(flight.request_ids, tensors)
            except Exception as exc:  # run alone once the batch before it finished (the module doc)
                failed = exc
            else:
                flight.submitted = True
                self._update_busy()
                if not self._busy:
                    self._turn()  # the next batch, by the rule of a process that computes
            if previous is not None:
                await previous
            if failed is None:
                try:
                    results = check_results(await self.backend.collect(handle), len(flight.items))
                except Exception as exc:
                    failed = exc
            if failed is not None:
                results = await self._run_alone(flight.items, failed)
            flight.collected_ns = time.monotonic_ns()
            self._finish_flight(flight, results)
            if not self._flights:  # (the warm-up batch runs on the loop: never beside a batch in flight)
                self.probe_if_due()
        except BaseException as exc:
            self._fail(exc)
            return
        finally:
            assert flight.finished is not None
            flight.finished.set_result(None)
        self._update_busy()
        self._turn()

    def _finish_flight(self, flight: Flight, results: list[ItemResult]) -> None:
        """Finish the oldest batch in flight; the record then names the ones still in flight."""
        flights = self._flights
        flights.remove(flight)  # (the oldest: batches finish in order)
        # its busy time (and its items' start stamps) from when the batch before it came back:
        # the device runs them one after the other, so the overlap is not counted twice
        start = max(flight.start_ns, self._collected_ns)
        self._collected_ns = flight.collected_ns
        self._in_flight = [item for f in flights for item in f.items]
        self._finish_batch(flight.items, start, results)  # (clears the record)
        if flights:
            self._record_flights()
