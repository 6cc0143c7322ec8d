"""A worker process: one (task, variant) process of a plan, fed by shared-memory rings.

``python -m jigsaw.runtime.worker --spec spec.json`` (spec: ``topology.ProcessSpec`` as JSON), or
``--spare --control FILE``: a process started ahead of need that waits, imports done, until the
daemon hands it a spec (``runtime/spares.py``). The daemon forks most workers from its fork
server (``runtime/forkserver.py``), which calls ``main`` in the child with the same arguments.

Each process runs one uvloop event loop, which watches the process's doorbell descriptor
(``add_reader``: no helper thread, no spinning; see ``rings.Doorbell`` for the arm / re-check
handshake). The process's turn (``Worker._turn``) runs in the callback that woke it (the
doorbell, a signal, a timer), not a loop turn later: it pops at most one batch's worth of items
from its input rings (the rings are the task's queue) into the batching queue (see
``take_batch`` for the arrival stamp the stale rule reads), drops what can no longer meet its
deadline or went stale, runs one batch when the queue's release rule allows (the process is idle
whenever it asks, so a batch starts as soon as the previous one finished: paper §3.3), routes
each item's children to the least-loaded process of the lane's variant of each downstream task,
and reports every finished or dropped item to the
frontend with its credit (see ``jigsaw.runtime.records``).

A process runs one batch at a time, as the paper's instances do, unless its backend is a device
pipeline (``Backend.max_in_flight`` 2): then batch n+1 is taken and submitted (staged and uploaded)
while batch n computes, and the batches finish in order (``runtime/in_flight.py``: the release rule
while a batch computes, the batch record of both, a failed batch, a stop). Otherwise the backend's
``execute_nowait`` hands back a batch that needs no wait (an emulated one shorter than the loop's
timer) as its results, finished in the same callback, and one that waits (a timer for the emulated
backend, a device event for a GPU one) as a coroutine. The turn steps that coroutine itself: one
that still finishes at once is finished in the same callback; one that waits is finished by a task,
which then turns again.

A process outlives the generation that started it when a re-plan keeps its instance: the daemon
writes the spec files the process serves (newest first) to its ``--control`` file and sends
SIGHUP. The process then attaches the new spec's rings and stats slot (its *wiring*) beside the
ones it has, reports ready in the new stats slot, and keeps its backend (a loaded engine stays
loaded). Items keep the wiring they came in on: an item popped from an older generation's ring is
routed and completed through that generation's rings, so its lane means what it meant when it was
admitted. A wiring the control file no longer lists takes no more items; its rings are unmapped once
neither the batching queue nor the batch in flight holds one of its items.

Containment: an exception while the backend prepares, runs or finishes a batch never ends the
process. A one-item batch's item is answered 500 naming the task; a larger batch's items are run
again one at a time (``_run_alone``), so only the items that fail alone are answered 500. An
item's output or child larger than its ring's ``max_payload_bytes`` is answered 500 naming the
task and the output (``_fit``); a backend that fails every item and then its own warm-up batch
ends the process (``ContainedBatches``). Before a batch runs, its request ids go to the process's batch
record (``stats.StatsBlock.batch_started``): a crash the process cannot catch (a signal, a hard
abort) leaves them behind, and the supervisor answers those requests instead of sending them into
the next crash.

The signal is taken at once, also while a batch awaits its backend: the daemon switches a re-plan's
routing only when every process of the new generation is ready, so a kept process that waited for
its batch to end held the whole switch for up to a batch (seconds of wall time at the replays' time
scales, where a spike's new plan is most needed). Nothing the batch in flight uses changes meaning:
its items carry their wiring, its stats (the batch's start, busy time, the queue length producers
route by; with two in flight, the record of both) follow the current slot, and the new spec's
batching rule replaces the queue only when the queue is empty (the batch in flight is not in it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Coroutine, Generator
from pathlib import Path
from typing import Any

import uvloop

from jigsaw.backends.base import Backend, Downstream, ItemResult, OutputSpec
from jigsaw.backends.registry import BackendUnavailable, backend_kind
from jigsaw.runtime.batching import BatchQueue
from jigsaw.runtime.containment import ContainedBatches, ErrorLog, check_results
from jigsaw.runtime.in_flight import BatchesInFlight
from jigsaw.runtime.records import (
    CREDIT_BYTES,
    HOP_BATCH,
    HOP_DONE,
    HOP_END,
    HOP_POPPED,
    HOP_SENT,
    HOP_START,
    TRACE_DIR,
    split_credit,
    write_trace,
)
from jigsaw.runtime.rings import (
    Doorbell,
    RecordHeader,
    RingClosedError,
    ShmRing,
    Status,
    lone_child,
    push_child,
    push_completion,
    push_hop,
    push_hops,
)
from jigsaw.runtime.stats import (
    BATCH_STARTED_NS,
    DEAD,
    DROPPED,
    FAILED,
    HEARTBEAT_NS,
    PID,
    QUEUED,
    READY,
    RING_QUEUED,
    SLOT_WORDS,
    STARTED_NS,
    STATE,
    StatsBlock,
    routable,
)
from jigsaw.runtime.topology import ProcessSpec

IDLE_WAIT_S = 1.0  # an idle process wakes this often only to notice that its parent died
HEARTBEAT_S = 0.2  # the loop stamps its heartbeat this often while it is free to run
POP_BATCH = 256
TURN_BATCHES = 16  # batches one turn runs before it lets the loop run its other callbacks
_OK = int(Status.OK)  # (an enum member's lookup costs ~4x an int compare, twice per item on the hop's path)
Buffer = bytes | bytearray | memoryview  # a payload the rings copy in
PUSH_RETRY_S = 0.0005

_running = True


def _any_queued(rings: list[ShmRing]) -> bool:
    """Whether any of ``rings`` holds a record (a loop: ``any`` over a generator makes a frame)."""
    for ring in rings:  # noqa: SIM110 (see the docstring)
        if len(ring):
            return True
    return False


def make_backend(spec: ProcessSpec) -> Backend:
    """The backend named by the spec, loaded with its variant and max batch.

    Real backends (``onnxruntime``, ``torch``, ``tensorrt``) run the variant's model; on a CPU
    segment (``<k>c``) they use k threads. The backend warms up every batch size the spec allows
    here, so the worker reports ready only once they ran.
    """
    downstream = [Downstream(str(d["task"]), float(d["factor"]), str(d.get("transform", "")),  # type: ignore[arg-type]
                             str(d.get("transform_dir", ""))) for d in spec.downstream]
    try:
        kind = backend_kind(spec.backend)
        cls = kind.load_class()
    except (KeyError, BackendUnavailable) as exc:
        raise SystemExit(exc.args[0]) from None
    backend: Backend
    if kind.runs_models:
        from jigsaw.backends.model import cpu_share
        from jigsaw.runtime.cpus import pin_from_env
        threads = pin_from_env() or cpu_share(spec.mig_profile)
        from jigsaw.models.repository import Model, ModelError, load_path
        try:
            zoo = Model(spec.zoo, zoo=spec.zoo or spec.variant)
            model = load_path(Path(spec.model)) if spec.model else zoo
        except ModelError as exc:
            raise SystemExit(f"variant {spec.variant!r}: {exc}") from None
        backend = cls(spec.task, spec.task_kind, downstream, threads=threads, model=model)  # type: ignore[call-arg]
    else:
        outputs = [OutputSpec(str(n), str(dt), tuple(shape)) for n, dt, shape in spec.graph_outputs]  # type: ignore[call-overload]
        backend = cls(spec.task, spec.task_kind, downstream,  # type: ignore[call-arg]
                      latency_ms_by_batch=spec.latency_ms_by_batch, mean_ms_by_batch=spec.mean_ms_by_batch,
                      time_scale=spec.time_scale, seed=spec.seed, outputs=outputs or None)
    backend.load(spec.variant, spec.max_batch)
    backend.warm_up(range(1, spec.max_batch + 1))  # before ready: no request pays a first batch
    return backend


class _Resume:
    """Await a coroutine that was already stepped once and yielded ``waiting`` (a future, or
    None for a bare yield): the rest of it runs in the task that awaits this."""

    __slots__ = ("coro", "waiting")

    def __init__(self, coro: Coroutine[Any, Any, Any], waiting: Any) -> None:
        self.coro = coro
        self.waiting = waiting

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, value = self.coro, self.waiting
        while True:
            try:
                sent = yield value
            except BaseException as exc:
                try:
                    value = coro.throw(exc)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    value = coro.send(sent)
                except StopIteration as done:
                    return done.value


class Wiring:
    """One generation's rings and stats slot of this process (see the module docstring)."""

    def __init__(self, spec: ProcessSpec, path: Path | None = None) -> None:
        self.spec = spec
        self.path = path
        self.inputs: list[ShmRing] = []
        self.outputs: list[ShmRing] = []
        self.output_bells: list[Doorbell] = []
        try:
            self.inputs = [ShmRing.attach(name, role="consumer") for name in spec.inputs]
            self.outputs = [ShmRing.attach(o.ring, role="producer") for o in spec.outputs]
            self.output_bells = [Doorbell.attach(o.doorbell) for o in spec.outputs]
            self.done = ShmRing.attach(spec.completion_ring, role="producer")
            self.done_bell = Doorbell.attach(spec.completion_doorbell)
            self.stats = StatsBlock.attach(spec.stats)
        except BaseException:
            self._close_rings()
            raise
        self.output_slots = [o.slot for o in spec.outputs]
        # seconds per queued item of each consumer (its load is the time to serve its queue); 1.0
        # each where a rate is unknown (a spec without rates): the load is then counted in items
        rates = [o.items_per_s for o in spec.outputs]
        known = all(r > 0 for r in rates)
        self.output_cost = [1.0 / r if known else 1.0 for r in rates]
        self.index_of = {str(d["task"]): int(d["task_index"]) for d in spec.downstream}  # type: ignore[call-overload]
        # downstream task -> the largest child its rings from here all take (``Worker._fit``)
        self.child_limits: dict[str, int] = {}
        for o, ring in zip(spec.outputs, self.outputs):
            limit = ring.max_payload_bytes - CREDIT_BYTES  # (the record's payload: credit, then the child)
            self.child_limits[o.task] = min(limit, self.child_limits.get(o.task, limit))
        self.rung: set[int] = set()  # output rings pushed to this turn: rung once at its end
        self.done_rung = False  # the completion ring too
        # what ``rings.push_hops`` reads of this wiring (its docstring has the layout)
        # what ``Worker._start_batch`` writes a batch's record and start stamp with (a batch's path)
        self.batch_at = (self.stats.words, self.stats.record_at(spec.slot),
                         spec.slot * SLOT_WORDS + BATCH_STARTED_NS, self.stats.batch_ids)
        self.hop = (self.done, self.outputs, spec.routes, self.index_of, self.stats.words,
                    [slot * SLOT_WORDS + STATE for slot in self.output_slots], self.rung)

    def _close_rings(self) -> None:
        for ring in (*self.inputs, *self.outputs):
            ring.close()
        for bell in self.output_bells:
            bell.close()

    def close(self) -> None:
        self._close_rings()
        self.done.close()
        self.done_bell.close()
        self.stats.close()


class Worker(ContainedBatches, BatchesInFlight):
    """The state of one worker process; ``run`` is its loop (what it does with a batch its backend
    failed: ``containment.ContainedBatches``; with two batches in flight: ``in_flight``)."""

    def __init__(self, spec: ProcessSpec, spec_path: Path | None = None, control: Path | None = None) -> None:
        self.backend = make_backend(spec)
        self.bell = Doorbell.attach(spec.doorbell)
        self.control = control
        self.wirings: list[Wiring] = []  # newest (current) first; older ones drain their items
        self._unmapped: list[Wiring] = []  # no longer listed: closed once no queued item uses them
        self._use([Wiring(spec, spec_path)])
        self.queue = self._new_queue(spec)
        self._queue_spec: ProcessSpec | None = None  # a newer spec's batching rule, once the queue empties
        # the daemon, whose end this process notices when idle; None: watched otherwise (a child of
        # the fork server, whose parent is the fork server: ``main``'s ``watch_parent``)
        self.parent_pid: int | None = os.getppid()
        self._next_input = 0
        self._passed_over_ns = 0  # the last time a full batch left items in the rings
        self._rewire = False
        self._woke_ns = 0  # when the doorbell last woke the loop
        self._rung = False  # woken by the doorbell: its FIFO's bytes are still to be read
        self._busy = False  # the turn takes no batch: one awaits its backend (``in_flight.py``: or two)
        self._in_flight: list[Any] = []  # those batches' items (their wirings stay mapped until they end)
        self._in_flight_queued = 0  # the queue length published when it started (its items included)
        self._batch_start_ns = 0
        self._batch_task: asyncio.Task[None] | None = None
        self._done: asyncio.Future[None] | None = None  # set when ``run`` is to return
        # the running loop, kept: ``asyncio.get_running_loop`` makes a getpid(2) system call
        # (glibc caches no pid), which every turn would pay
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None  # the next turn when no doorbell rings first
        self._idle = False  # that timer is the idle one (not a batching deadline)
        self.trace: list[list[int]] | None = [] if TRACE_DIR else None
        # a backend that runs models makes outputs of any size: each is checked against its ring
        # (the emulated backend's are a few bytes by construction)
        self._check_sizes = self.backend.kind != "emulated"
        self.errors = ErrorLog(spec.name)
        self._init_in_flight()

    @staticmethod
    def _new_queue(spec: ProcessSpec) -> BatchQueue:
        return BatchQueue(spec.max_batch, spec.max_wait_ns, spec.queue_capacity, spec.staleness_ns,
                          spec.remaining_min_ns, spec.exec_estimate_ns)

    def _use(self, wirings: list[Wiring]) -> None:
        """Serve ``wirings`` (current first); the current one's names are the worker's own."""
        self.wirings = wirings
        w = wirings[0]
        self.wiring = w
        self.spec = w.spec
        self.inputs = [ring for x in wirings for ring in x.inputs]
        self._input_wiring = [x for x in wirings for _ in x.inputs]
        self.stats = w.stats

    def rewire(self) -> None:
        """Serve the spec files the control file lists (newest first): see the module docstring."""
        if self.control is None:
            return
        import json
        try:
            paths = [Path(p) for p in json.loads(self.control.read_text())["specs"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"worker {self.spec.name}: unreadable control file {self.control}: {exc}", file=sys.stderr)
            return
        have = {w.path: w for w in (*self.wirings, *self._unmapped)}
        wirings = []
        for path in paths:
            w = have.pop(path, None)
            if w is None:
                spec = ProcessSpec.from_json(path.read_text())
                if (spec.task, spec.variant, spec.max_batch) != (self.spec.task, self.spec.variant,
                                                                 self.spec.max_batch):
                    print(f"worker {self.spec.name}: {path} is another process's spec", file=sys.stderr)
                    continue
                w = Wiring(spec, path)
            wirings.append(w)
        if not wirings:
            return
        self._unmapped = list(have.values())
        previous = self.wiring
        self._use(wirings)
        slot = self.spec.slot
        # a batch in flight (a SIGHUP mid-batch): its start stamp moves to the current slot, which
        # the supervisor watches (and ``_finish_batch`` clears), and so does the queue length
        # (before ``_maybe_swap_queue``, which may unmap the previous wiring)
        started = self._batch_start_ns if self._in_flight else 0
        if started and previous is not self.wiring:
            self.stats.batch_started(slot, started, previous.stats.batch_record(previous.spec.slot))
            previous.stats.clear_batch(previous.spec.slot)
            self.stats.set(slot, QUEUED, self._in_flight_queued)
        self._queue_spec = self.spec
        self._maybe_swap_queue()
        now = time.monotonic_ns()
        if not started:
            self.stats.clear_batch(slot)
        self.stats.set(slot, HEARTBEAT_NS, now)
        self.stats.set(slot, PID, os.getpid())
        self.stats.set(slot, STARTED_NS, now)
        self.stats.set(slot, STATE, READY)

    def _maybe_swap_queue(self) -> None:
        """Take a newer spec's batching rule (planned wait, estimates) once no item is queued (a
        batch in flight is not in the queue), and unmap the wirings no longer served that no item
        queued or in flight uses."""
        if len(self.queue):
            return
        if self._queue_spec is not None:
            self.queue = self._new_queue(self._queue_spec)
            self._queue_spec = None
        in_use = {item[3] for item in self._in_flight}
        for w in self._unmapped:
            if w not in in_use:
                w.close()
        self._unmapped = [w for w in self._unmapped if w in in_use]

    # ---- outputs ------------------------------------------------------------------------
    def _push_blocking(self, ring: ShmRing, header: RecordHeader, credit: int, tensors: Buffer,
                       until_ns: int) -> bool:
        """Push, retrying while the ring is full until ``until_ns``; False when it never fit."""
        while not ring.push_framed(header, credit, tensors):
            now = time.monotonic_ns()
            if now >= until_ns or not _running:
                return False
            self._beat(now)  # waiting on a peer is not hanging
            time.sleep(PUSH_RETRY_S)
        return True

    def _beat(self, now_ns: int) -> None:
        for w in self.wirings:
            w.stats.set(w.spec.slot, HEARTBEAT_NS, now_ns)

    def complete(self, header: RecordHeader, status: int, credit: int, tensors: Buffer = b"",
                 num_children: int = 0, wiring: Wiring | None = None) -> None:
        """Report an item this task finished or dropped (with the credit it returns).

        A record that ends a branch (no children, a drop, an error) wakes the frontend: it may
        complete or answer the request. One that hands its work on to children does not: the
        request cannot complete before a child's own record, which does wake it, and the frontend
        drains every completion ring per wake-up. For that, ``run_batch`` pushes an item's record
        before its children exist, so it is in the ring before any record that a child causes.
        """
        w = wiring or self.wiring
        now = time.monotonic_ns()
        # The frontend always drains: wait for room rather than lose an answer.
        try:
            if not push_completion(w.done, header, self.spec.task_index, status, num_children, now, credit,
                                   tensors):
                h = header.copy()
                h.task = self.spec.task_index
                h.status = int(status)
                h.child_count = num_children
                h.stamp(HOP_DONE, now)
                self._push_blocking(w.done, h, credit, tensors, now + 60 * 10**9)
        except RingClosedError:
            pass
        if num_children == 0 or status != _OK:
            w.done_rung = True  # rung once per turn (``_ring_outputs``): one wake-up for a batch

    def _least_loaded(self, candidates: list[int], w: Wiring) -> list[int]:
        if len(candidates) == 1:  # (``routable``'s lone-candidate case, without its two closures)
            state = w.stats.get(w.output_slots[candidates[0]], STATE)
            if state != DEAD and state != FAILED:
                return candidates
        # the time until the consumer would serve one more item: its queue plus that item, at its rate
        return routable(candidates, lambda i: w.stats.get(w.output_slots[i], STATE),
                        lambda i: (len(w.outputs[i]) + w.stats.get(w.output_slots[i], QUEUED) + 1)
                        * w.output_cost[i])

    @staticmethod
    def _routes(header: RecordHeader, w: Wiring) -> dict[str, list[int]]:
        """The item's lane's routes: downstream task -> the output rings that may take its children."""
        routes = w.spec.routes
        return routes[header.lane] if header.lane < len(routes) else {}

    def children_of(self, header: RecordHeader, credit: int, result: ItemResult,
                    wiring: Wiring | None = None) -> tuple[list[tuple[str, Buffer]], list[int], int]:
        """The children the item sends (those its lane routes), their credit shares, and the share
        its own completion record keeps: the frontend cannot see every credit back (and answer)
        before that record, with its ``child_count``, arrives."""
        if not result.children:
            return [], [], credit
        w = wiring or self.wiring
        routes = self._routes(header, w)
        children: list[tuple[str, Buffer]] = []
        for task, bodies in result.children.items():  # (a loop, not a comprehension: no frame)
            if routes.get(task):
                for body in bodies:
                    children.append((task, body))
        if not children or credit < 2:
            return [], [], credit
        if len(children) == 1:  # ``split_credit(credit, 2)``, without its call and lists
            share = credit // 2
            return children, [share], credit - share
        if len(children) > credit - 1:
            children = children[:credit - 1]
        kept, *shares = split_credit(credit, len(children) + 1)
        return children, shares, kept

    def forward(self, header: RecordHeader, children: list[tuple[str, Buffer]], shares: list[int],
                wiring: Wiring | None = None) -> None:
        """Send the item's children (``children_of``) downstream; a child no process of its task
        can take returns its share to the frontend as a drop."""
        w = wiring or self.wiring
        routes = self._routes(header, w)
        index_of = w.index_of
        count = len(children)
        for k, ((task, body), share) in enumerate(zip(children, shares)):
            task_index = index_of[task]
            sent_ns = time.monotonic_ns()
            order = self._least_loaded(routes[task], w)
            for i in order:  # the header is written into the ring by the core (``push_child``)
                if push_child(w.outputs[i], header, task_index, k, count, sent_ns, share, body):
                    w.rung.add(i)
                    break
            else:
                h = RecordHeader(request_id=header.request_id, parent_id=header.request_id, app=header.app,
                                 task=task_index, lane=header.lane, child_index=k, child_count=count,
                                 deadline_ns=header.deadline_ns, created_ns=header.created_ns)
                h.stamp(HOP_SENT, sent_ns)
                sent = False
                if order:
                    sent = self._push_blocking(w.outputs[order[0]], h, share, body, header.deadline_ns)
                    w.rung.add(order[0])
                if not sent:
                    # Never reached the next task: its deadline passed while every ring was full,
                    # or every process of that task has failed for good.
                    dropped = h.copy()
                    dropped.status = int(Status.DROPPED_DEADLINE if order else Status.ERROR)
                    dropped.stamp(HOP_DONE, time.monotonic_ns())
                    self._push_blocking(w.done, dropped, share, b"", time.monotonic_ns() + 60 * 10**9)
                    w.done_rung = True

    def _ring_outputs(self) -> None:
        """Ring each consumer this turn pushed to, once: a batch's records cost one wake-up each
        (the wirings no longer listed too: their items queued or in flight were pushed there)."""
        for w in (self.wirings if not self._unmapped else (*self.wirings, *self._unmapped)):
            for i in w.rung:
                w.output_bells[i].ring()
            w.rung.clear()
            if w.done_rung:
                w.done_rung = False
                w.done_bell.ring()

    # ---- the loop -----------------------------------------------------------------------
    def take_batch(self) -> tuple[list[Any], list[int], list[Any]] | None:
        """Top the batching queue up to one batch from the input rings, drop what can no longer
        make its deadline, and release the next batch (``BatchQueue.take_batch``, one call of the
        core): its items, request ids and tensors, or None when nothing is queued. The drops and
        the items the queue had no room for are reported (rung with the turn's other records).

        Items stay in the rings (the task's queue) until this process can batch them, so the
        batching queue holds at most one batch; the items a batch takes were forming it while
        the previous batch ran. The stale rule (paper §3.3) is about the others: a request that no
        instance picked up because every forming batch was full. So an item the process passed
        over (it was in a ring when a full batch left it there, ``_passed_over_ns``) arrives at
        its ring-entry time (``HOP_SENT``): its real age; one that made the first batch it could
        arrives now. The deadline rule reads the absolute deadline, which always is real. The
        rings are visited round-robin from a rotating start (``_next_input``); an item's tag is
        the wiring it came in on.
        """
        items, ids, tensors, dropped, refused, self._next_input, self._passed_over_ns = self.queue.take_batch(
            self.inputs, self._input_wiring, self._next_input, self._passed_over_ns) if not self._in_flight \
            else self.take_while_computing()  # a batch computes: the process is not idle (``in_flight.py``)
        if refused:  # the queue was full: rejected
            for header, credit, _, wiring in refused:
                self.complete(header, Status.REJECTED, credit, wiring=wiring)
                self.stats.add(self.spec.slot, DROPPED, 1)
        if dropped:
            for _, _, _, (header, credit, _, wiring), reason in dropped:
                self.complete(header, int(reason), credit, wiring=wiring)
                self.stats.add(self.spec.slot, DROPPED, 1)
        if items is None:
            return None
        return items, ids, tensors  # type: ignore[return-value]

    def _start_batch(self, items: list[Any], request_ids: list[int], tensors: list[Any]) -> None:
        """Run the batch ``take_batch`` released.

        ``idle=True`` is the paper's release rule (§3.3), not a shortcut: this process asks only
        once its previous batch has finished, and while that batch ran, new items waited in the
        rings with their age counted from ring entry. So an item's batching wait is bounded by the
        time until this process can run its next batch (and by L^(t) through the 2 L^(t) <= SLO
        budget), and a free process never holds a partial batch back.

        A batch the backend finishes without waiting (``execute_nowait``: an emulated batch
        shorter than the loop's timer resolution) is finished in the same turn; otherwise its
        coroutine is stepped here, in the doorbell's callback, and one that waits (a device, a
        thread, a timer) is finished by a task, and the process takes no new batch until then
        (``_busy``).
        """
        queued = len(items) + len(self.queue)  # (the queue as it was before the release)
        start = time.monotonic_ns()
        # the batch record, then the start stamp (``StatsBlock.batch_started``, inlined: a batch's path)
        words, at, stamp, most = self.wiring.batch_at
        n = len(request_ids)
        if n == 1:
            words[at + 1] = request_ids[0]
        else:
            n = min(n, most)
            for k in range(n):
                words[at + 1 + k] = request_ids[k]
        words[at] = n
        words[stamp] = start
        waiting: Any = None
        try:
            coro = self.backend.execute_nowait(request_ids, tensors)
            if type(coro) is not list:
                try:
                    waiting = coro.send(None)
                except StopIteration as done:
                    coro = done.value
            if type(coro) is list and len(coro) != len(items):
                check_results(coro, len(items))
        except Exception as exc:  # the backend failed the batch: contained (the module docstring)
            self._contain(items, start, queued, exc)
            return
        if type(coro) is list:  # done without waiting: no coroutine to step
            self._finish_batch(items, start, coro)
            return
        self._busy = True
        self._in_flight = items
        self._in_flight_queued = queued
        self._batch_start_ns = start
        self.publish_queued(queued)  # what waits here while the batch runs (the batch's items too)
        self._batch_task = self._running_loop().create_task(
            self._await_batch(items, start, _Resume(coro, waiting)))

    async def _await_batch(self, items: list[Any], start: int, pending: _Resume) -> None:
        try:
            try:
                results = check_results(await pending, len(items))
            except Exception as exc:  # the backend failed the batch: its items run alone
                results = await self._run_alone(items, exc)
            self._finish_batch(items, start, results)
            self.probe_if_due()
        except BaseException as exc:
            self._fail(exc)
            return
        finally:
            self._busy = False
            self._in_flight = []
        self._turn()

    def _finish_batch(self, items: list[Any], start: int, results: list[ItemResult]) -> None:
        """Report each item of a finished batch and send its children on, ring, then account the
        batch in the stats block (after the ring: the next process need not wait for it)."""
        end = time.monotonic_ns()
        sink = not self.spec.downstream
        trace = self.trace
        n = len(items)
        if self._check_sizes:
            results = self._fit(items, results, sink)
        task_index = self.spec.task_index
        # The items with one child its lane routes to one consumer that is not failed (the chain's
        # every middle hop): their records and children in one call of the core (``push_hops``),
        # half the credit each (``children_of``'s split of one child). The rest come back: what
        # did not fit goes the long way, the others take the general path below (all of them
        # when the hops are traced: the trace stamps each item's records).
        if trace is None:
            pending = push_hops(items, results if type(results) is list else list(results), task_index, start,
                                end, DEAD, FAILED)
        else:
            pending = [(i, -1) for i in range(n)]
        for i, pushed in pending:
            header, credit, _, w = items[i]
            result = results[i]
            if pushed >= 0:  # push_hops pushed the record (1) or nothing (0): the child goes the long way
                task, body, _ = lone_child(result.children, self._routes(header, w))  # type: ignore[misc]
                share = credit // 2
                if pushed == 0:
                    self.complete(header, _OK, credit - share, b"", 1, w)
                self.forward(header, [(task, body)], [share], w)
                continue
            # One child its lane routes, to a consumer chosen by load (several candidates) or one
            # that push_hops left out (failed, or traced): as push_hops does, one call of the core.
            one = None
            order = None
            if credit > 1 and result.children and not result.error:
                one = lone_child(result.children, self._routes(header, w))
                if one is not None:
                    order = self._least_loaded(one[2], w)
            if order:
                task, body, _ = one  # type: ignore[misc]
                share = credit // 2
                kept = credit - share
                pushed = push_hop(w.done, header, task_index, start, end, n, kept, w.outputs[order[0]],
                                  w.index_of[task], share, body)
                if pushed == 2:
                    w.rung.add(order[0])
                else:
                    if pushed == 0:
                        self.complete(header, _OK, kept, b"", 1, w)
                    self.forward(header, [(task, body)], [share], w)
                done_ns = 0
            else:
                header.stamp(HOP_START, start)
                header.stamp(HOP_END, end)
                header.stamp(HOP_BATCH, n)
                if result.error:  # this item alone failed (a bad transform or input): its request gets a 500
                    self.complete(header, Status.ERROR, credit, result.error.encode()[:4096], wiring=w)
                    continue
                answer = self._answer(header, credit, result, w) if sink else b""
                if answer is None:
                    continue
                children, shares, kept = self.children_of(header, credit, result, w)
                # Only a sink's outputs are answered; the frontend reads no other task's (the children
                # carry what the next tasks need). The record goes before the children: see complete.
                self.complete(header, _OK, kept, answer, len(children), w)
                done_ns = time.monotonic_ns() if trace is not None else 0
                if children:
                    self.forward(header, children, shares, w)
            if trace is not None:
                hops = header.hops
                pushed_ns = time.monotonic_ns()  # (one call pushed both records: one time for both)
                trace.append([task_index, header.request_id, hops[HOP_SENT], self._woke_ns,
                              hops[HOP_POPPED], start, end, done_ns or pushed_ns, pushed_ns])
        if trace is not None:
            rung = time.monotonic_ns()  # (before the write: a woken consumer may run before it returns)
            for row in trace[len(trace) - n:]:
                row.append(rung)
        self._ring_outputs()
        self.stats.batch_done(self.spec.slot, end - start, n)

    def publish_queued(self, queued: int | None = None) -> None:
        """Publish the items queued here (``queued``, else the queue's length), which producers route
        by, and those still in its input rings, which ``routing.queued_end_s`` adds past the root."""
        n = len(self.queue) + len(self._in_flight) if queued is None else queued
        for w in self.wirings:
            w.stats.set(w.spec.slot, QUEUED, n)
            w.stats.set(w.spec.slot, RING_QUEUED, sum(len(ring) for ring in self.inputs))

    def _turn(self) -> None:
        """One turn of the process, run in the callback that woke it (the doorbell, a signal, a
        timer): drain the rings into the batching queue, run batches while there are any, and when
        out of work arm the doorbell, look once more (``rings.Doorbell``) and return to the loop.

        A turn runs at most ``TURN_BATCHES`` batches before it hands the loop one turn (the
        heartbeat, signals), then goes on.
        """
        if self._busy or self._done is None or self._done.done():
            if self._rewire and self._busy and self._done is not None and not self._done.done():
                self._rewire_now()  # a kept process is ready for the new generation mid-batch
            self._quiet_bell()
            return
        bell = self.bell
        try:
            batches = 0
            while True:
                if not _running:
                    self._quiet_bell()
                    if not self._in_flight:  # (else the last batch in flight to finish turns again)
                        self._done.set_result(None)
                    return
                bell.disarm()  # awake: every push until the next arm() is seen by the look below
                if self._rewire:
                    self._rewire = False
                    self.rewire()
                if self._unmapped or self._queue_spec is not None:
                    self._maybe_swap_queue()
                batch = self.take_batch()
                w = self.wiring
                if w.done_rung or w.rung or len(self.wirings) > 1 or self._unmapped:
                    self._ring_outputs()  # the drops take_batch reported
                # (the queue's length is published after the batch, or by ``_start_batch`` when
                # the batch waits: not before it, on the way from the wake-up to the next ring)
                if batch is not None:
                    self._start_batch(*batch)
                    if self._busy:
                        self._quiet_bell()
                        return  # its task finishes it and turns again
                    self.publish_queued()
                    batches += 1
                    if batches >= TURN_BATCHES:
                        self._quiet_bell()
                        self._running_loop().call_soon(self._turn)
                        return
                    # Nothing queued, nothing in the rings, nothing to take up: out of work
                    # already, so on to the arm without a pass that would find nothing (its fill,
                    # drop check, release rule and publish are a fifth of a lone record's turn).
                    if (len(self.queue) or self._rewire or self._unmapped or self._queue_spec is not None
                            or not _running or _any_queued(self.inputs)):
                        continue
                else:
                    self.publish_queued()
                # Out of work: arm (producers ring from now on), then look at the rings once more,
                # so a push that came before the arm is not left waiting for the next one. The
                # wake-up bytes are read first (a byte written after the arm must stay).
                self._quiet_bell()
                bell.arm()
                if self._rewire or _any_queued(self.inputs):
                    continue
                break
            timeout_s = IDLE_WAIT_S
            self._idle = True
            if len(self.queue):
                due = self.queue.next_wakeup_ns(time.monotonic_ns())
                if due is not None:
                    timeout_s = min(IDLE_WAIT_S, max(0.0, (due - time.monotonic_ns()) / 1e9))
                    self._idle = timeout_s >= IDLE_WAIT_S
            # A pending timer due no later is kept (a turn that finds nothing to do is harmless):
            # an idle process's turns then make no timer each (one a second, not one a turn).
            # Every timer is set at most IDLE_WAIT_S ahead, so a pending one is due within the
            # idle wait without asking the loop's clock.
            timer = self._timer
            if (timer is None or timer.cancelled()
                    or (timeout_s < IDLE_WAIT_S and timer.when() > self._running_loop().time() + timeout_s)):
                if timer is not None:
                    timer.cancel()
                self._timer = self._running_loop().call_later(timeout_s, self._on_timer)
        except BaseException as exc:
            self._fail(exc)

    def _rewire_now(self) -> None:
        """Take the new wiring while a batch awaits its backend (see the module docstring)."""
        self._rewire = False
        try:
            self.rewire()
        except BaseException as exc:
            self._fail(exc)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def _quiet_bell(self) -> None:
        """Read the doorbell's wake-up bytes (``Doorbell.clear``) when the turn it woke is past its
        work: the system call is off the woken path (pop, batch, the next process's ring). Called
        before the arm (a byte read after it could be a new ring's, lost) and before every other
        return of a turn (a readable FIFO would call ``on_bell`` again at every loop iteration)."""
        if self._rung:
            self._rung = False
            self.bell.clear()

    def _on_timer(self) -> None:
        self._timer = None
        # (a system call: only when idle; PR_SET_PDEATHSIG stops a busy one with its parent)
        if self._idle and self.parent_pid is not None and os.getppid() != self.parent_pid:
            if self._done is not None and not self._done.done():
                self._done.set_result(None)
            return
        self._turn()

    def _fail(self, exc: BaseException) -> None:
        """An error in a turn ends ``run`` with it (the supervisor restarts the process)."""
        if self._done is not None and not self._done.done():
            self._done.set_exception(exc)

    async def run(self) -> None:
        slot = self.spec.slot
        loop = self._loop = asyncio.get_running_loop()
        bell = self.bell
        self._done = loop.create_future()

        def on_bell() -> None:
            self._woke_ns = time.monotonic_ns()
            self._rung = True  # the flag stays clear: producers need not ring until this turn re-arms
            self._turn()

        def on_sigterm() -> None:
            _stop(signal.SIGTERM, None)
            self._turn()

        def on_sighup() -> None:
            self._rewire = True
            self._turn()

        loop.add_reader(bell.fileno(), on_bell)
        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        loop.add_signal_handler(signal.SIGHUP, on_sighup)
        if _rewire_early:
            self._rewire = True

        def heartbeat() -> None:
            self._beat(time.monotonic_ns())
            loop.call_later(HEARTBEAT_S, heartbeat)

        heartbeat()
        self.stats.clear_batch(slot)  # a predecessor killed mid-batch left its stamp and record
        self.stats.set(slot, PID, os.getpid())
        self.stats.set(slot, STARTED_NS, time.monotonic_ns())
        self.stats.set(slot, STATE, READY)
        loop.call_soon(self._turn)
        try:
            await self._done
        finally:
            loop.remove_reader(bell.fileno())
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def close(self) -> None:
        if self.trace:
            write_trace("worker", ["task", "request_id", "sent", "woke", "popped", "start", "end",
                                   "completion_pushed", "children_pushed", "rung"], self.trace)
        for w in (*self.wirings, *self._unmapped):
            w.close()
        self.bell.close()
        self.backend.close()


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when the daemon dies (Linux prctl PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def _stop(signum: int, frame: object) -> None:
    global _running
    _running = False


_rewire_early = False  # a SIGHUP before the loop runs (the loop's handler takes over then)


def _hup(signum: int, frame: object) -> None:
    global _rewire_early
    _rewire_early = True


SPARE_NAME = b"jigsaw-spare"  # the process name (``/proc/<pid>/comm``) of a spare while it waits


def _set_name(name: bytes) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(15, ctypes.c_char_p(name[:15]))  # PR_SET_NAME


def await_spec(control: Path) -> Path | None:
    """A spare (``--spare``): started ahead of need, its imports done, it waits for the daemon to
    hand it a process to run: the daemon writes the spec (and the environment to add, e.g. the
    MIG instance and MPS directories) to its control file and sends SIGHUP, as it tells a kept
    process. Marks itself ready (``<control>.ready``) once it can take the signal. Returns the
    spec's path; None on SIGTERM."""
    import json
    try:
        own = Path("/proc/self/comm").read_bytes().strip()
    except OSError:
        own = b"python"
    _set_name(SPARE_NAME)
    signals = {signal.SIGHUP, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)  # taken by sigwait: no race with a wait
    control.with_suffix(".ready").touch()
    while True:
        if signal.sigwait(signals) == signal.SIGTERM:
            return None
        try:
            doc = json.loads(control.read_text())
            path = Path(doc["specs"][0])
            env = {str(k): str(v) for k, v in doc.get("env", {}).items()}
        except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            print(f"spare worker: unreadable control file {control}: {exc}", file=sys.stderr)
            continue
        break
    os.environ.update(env)  # before the backend loads (CUDA reads it at its first call)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
    _set_name(own)
    return path


def main(argv: list[str] | None = None, *, watch_parent: bool = True) -> int:
    """Run one worker process. ``watch_parent`` false: the caller already arranged for this
    process to die with the daemon (a child of the fork server watches the daemon, not its
    parent, the fork server: ``runtime/forkserver.py``)."""
    parser = argparse.ArgumentParser(prog="jigsaw-worker", description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=None, help="the spec of the process to run")
    parser.add_argument("--control", type=Path, default=None,
                        help="the file listing the spec files this process serves (read on SIGHUP)")
    parser.add_argument("--spare", action="store_true",
                        help="start idle and wait for a spec in the control file (SIGHUP)")
    args = parser.parse_args(argv)
    if (args.spec is None) == (not args.spare) or (args.spare and args.control is None):
        parser.error("expected --spec SPEC, or --spare --control FILE")
    if watch_parent:
        _die_with_parent()
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGHUP, _hup)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the daemon handles ^C and stops workers itself
    if args.spare:
        args.spec = await_spec(args.control)
        if args.spec is None:
            return 0
    spec = ProcessSpec.from_json(args.spec.read_text())
    worker = Worker(spec, args.spec, args.control)
    if not watch_parent:
        worker.parent_pid = None  # its parent may die before the daemon: the caller watches the daemon
    try:
        uvloop.run(worker.run())
    finally:
        worker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
