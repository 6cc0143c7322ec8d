"""The dispatcher: requests to root items, completion records to answers, each request once.

A request admitted at the door gets a lane drawn with probability rate/demand, is split into
root items carrying credit, and is pushed to the least-loaded process of each root task.
Completion records come back over one ring per worker; the loop watches the frontend's doorbell
descriptor (``add_reader``, no thread) and, woken, accounts credits and answers each request exactly
once: 200 with the sink outputs, 504 when a task dropped it (naming the task) or its deadline
passed at the frontend.
Late records are discarded and counted.

Worker faults: ``on_worker_failed`` settles every unanswered request that may have had work on a
dead process. The requests of the batch it was executing when it crashed (its *suspects*, from
the worker's batch record, ``runtime/supervisor.py`` says when a crash is the batch's) are
answered 500 ``WORKER_CRASHED`` naming the task, never sent again: sent again, a request that
crashes its worker would crash the next one. The others (innocent: queued behind it, or a crash
not of the batch's making) are dispatched again under a new id (their late records are
discarded) when the deadline still leaves time for the lane's fastest path, at most
``MAX_ATTEMPTS`` times in all, else answered 503 ``WORKER_FAILED``. The request body is kept for
that until the request is answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jigsaw.runtime.admission import Admission, queue_admits
from jigsaw.runtime.metrics import Metrics, count_into
from jigsaw.runtime.model_stats import count_item
from jigsaw.runtime.records import (
    CREDIT_BYTES,
    HOP_SENT,
    TOTAL_CREDIT,
    TRACE_DIR,
    split_credit,
    write_trace,
)
from jigsaw.runtime.rings import Completion, Doorbell, RecordHeader, ShmRing, Status, drop_reason, load_core
from jigsaw.runtime.routing import RoutingTable
from jigsaw.runtime.topology import AppRoutes
from jigsaw.tensors import DATATYPES, Tensor, decode_tensors, encode_tensors

DRAIN_POP = 256
LATE_GRACE_S = 10.0  # a timed-out request's record is kept this long to absorb its late credits
MAX_ATTEMPTS = 3  # dispatches of one request across worker faults


class InputTooLarge(ValueError):
    """A request's encoded inputs are larger than a ring to its root tasks carries (answered 413)."""


@dataclass(slots=True)
class Pending:
    """One admitted request until its credits are all back (or it is forgotten after a timeout)."""

    request_id: int
    routes: AppRoutes
    lane: int
    client_id: str | None
    created_ns: int
    deadline_ns: int
    future: asyncio.Future[tuple[int, dict[str, Any]]]
    outputs_wanted: list[str] | None
    credit_in: int = 0
    answered: bool = False
    items: dict[str, list[tuple[int, list[Any]]]] = field(default_factory=dict)  # sink task -> items
    timings: dict[str, list[float]] = field(default_factory=dict)  # task -> [queue, compute, n, hop, done]
    children: dict[str, int] = field(default_factory=dict)
    drop: tuple[str, int] | None = None
    error: str = ""  # why a task failed this request's item (answered 500), as its worker said
    timer: asyncio.TimerHandle | None = None
    generation: int = 0
    body: bytes | bytearray = b""  # the encoded inputs, kept to dispatch again after a worker fault
    attempts: int = 1
    on_answer: Callable[[], None] | None = None  # called at once with the answer (``future`` set)


_TaskOutputs = tuple[str, list[tuple[int, str, str, tuple[int, ...]]]]
"""A sink task and its outputs: (index, "task.name", datatype, shape after the batch dimension)."""


_core = load_core()
_WIRE_DTYPES = (None, *DATATYPES.values())
"""A tensor payload's datatype code -> its numpy dtype (``jigsaw.tensors`` numbers the datatypes
from 1 in ``DATATYPES`` order; a test checks they agree)."""


def sink_arrays(payload: bytes) -> list[np.ndarray]:
    """A sink record's output arrays, views into ``payload``: parsed by the compiled core
    (``decode_arrays``, a few times faster), else (pure build, BYTES outputs) by ``decode_tensors``."""
    if _core is not None:
        got = _core.decode_arrays(payload, _WIRE_DTYPES)
        if got is not None:
            return got
    return [x.data if type(x.data) is np.ndarray else np.array(x.data) for x in decode_tensors(payload)]


def _first(item: tuple[int, list[Any]]) -> int:
    return item[0]


def root_limit(rings: dict[str, Any], routes: AppRoutes) -> int | None:
    """The largest encoded inputs the rings to ``routes``' root processes all take (None: none of
    them is mapped)."""
    limit = None
    for lane in routes.roots:
        for targets in lane.values():
            for t in targets:
                ring = rings.get(t.ring)
                if ring is not None:
                    got = ring.max_payload_bytes - CREDIT_BYTES
                    limit = got if limit is None else min(limit, got)
    return limit


def crashed_answer(task: str, variant: str, reason: str, client_id: str | None) -> dict[str, Any]:
    """The 500 of a request whose batch crashed its worker (``Dispatcher.on_worker_failed``)."""
    return {"error": f"task {task!r} ({variant}) crashed its worker process ({reason}) while running this "
                     f"request's batch; the request is not sent again (it could crash the next one)",
            "status": "WORKER_CRASHED", "task": task, "reason": "worker_crashed", "id": client_id}


def _joined(items: list[tuple[int, list[Any]]], k: int, tail: tuple[int, ...]) -> np.ndarray:
    """Output ``k`` of a sink's items (in child order) as one array of rows of shape ``tail``
    (an output's shape after its item axis). A free axis in ``tail`` (-1: a waveform's length)
    takes each item's own; items of different lengths are padded with zeros to the longest (their
    lengths are the app's to say, as TTS's ``audio_samples`` does). ``ValueError``: an item's array
    does not have the declared shape."""
    if len(items) == 1:  # one item (no fan-out before the sink): its array as it came
        arrays = items[0][1]
        if k >= len(arrays):
            return np.zeros((0, *(max(0, d) for d in tail)), dtype=np.int32)
        return _rows(arrays[k], tail)
    parts = [_rows(arrays[k], tail) for _, arrays in items if k < len(arrays)]
    if not parts:
        return np.zeros((0, *(max(0, d) for d in tail)), dtype=np.int32)
    if -1 in tail:
        longest = tuple(max(p.shape[1 + i] for p in parts) for i in range(len(tail)))
        parts = [p if p.shape[1:] == longest else
                 np.pad(p, [(0, 0), *((0, m - n) for m, n in zip(longest, p.shape[1:]))]) for p in parts]
    return np.concatenate(parts)


def _rows(arr: np.ndarray, tail: tuple[int, ...]) -> np.ndarray:
    """``arr`` as rows of ``tail`` (a -1 in it: any length)."""
    if -1 not in tail:
        return arr.reshape((-1, *tail))
    if arr.ndim == len(tail):
        arr = arr.reshape((1, *arr.shape))
    if arr.ndim != len(tail) + 1 or any(d != -1 and d != n for d, n in zip(tail, arr.shape[1:])):
        raise ValueError(f"an item's array has shape {list(arr.shape)}, not rows of {list(tail)}")
    return arr


def _raw(t: tuple[str, str, tuple[int, ...], Any]) -> Any:
    """A parsed input as a ``Tensor`` of raw bytes when its array is already of its wire type: the
    tensor codec then reuses a cached head for it (``tensors._encode_raw``); the same bytes."""
    name, datatype, shape, data = t
    if type(data) is np.ndarray and datatype != "BF16" and data.dtype == DATATYPES.get(datatype):
        return Tensor(name, datatype, shape, data.tobytes())
    return t


class Dispatcher:
    """Owns the pending requests: dispatch, retries, credits, completion and the single answer."""

    def __init__(self, routing: RoutingTable, admission: Admission, metrics: Metrics, *,
                 backend_name: str, emulated: bool, hop_latency_ms: float = 10.0, time_scale: float = 1.0,
                 seed: int = 0) -> None:
        self.routing = routing
        self.admission = admission
        self.metrics = metrics
        self.backend_name = backend_name
        self.emulated = emulated
        self.hop_latency_ms = hop_latency_ms
        self.time_scale = time_scale
        self.rng = random.Random(seed)
        self.pending: dict[int, Pending] = {}
        self.next_id = 1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watched: Doorbell | None = None  # the frontend's doorbell, once registered with the loop
        self._closing = False
        self._drain_scheduled = False
        self._bells_due: dict[str, Doorbell] = {}  # ring -> its consumer's doorbell, rung at the turn's end
        self._turn_pushed = False  # this loop turn pushed (and rang) once already
        self._woke_ns = 0  # when the doorbell last woke the loop
        self._rung = False  # woken by the doorbell: its FIFO's bytes are still to be read
        self._observed: list[tuple[Pending, str, Completion]] = []  # read by ``drain``, for ``_observe``
        self._popped_ns = 0  # when the drain's first pop returned (JIGSAW_HOP_TRACE only)
        # JIGSAW_HOP_TRACE: each request's timeline (records.TRACE_DIR)
        self.trace: dict[int, list[int]] | None = {} if TRACE_DIR else None
        self._unrung: list[list[int]] = []
        # app -> task -> the keys of its timings in an answer's parameters
        self._keys: dict[str, dict[str, tuple[str, str, str, str, str, str]]] = {}
        # (app, task, variant) -> its histogram series: queue, compute, batch size; their buckets
        self._series: dict[tuple[str, str, str], tuple[Any, ...]] = {}
        # (app, lane index) -> (the lane's variants, an answer's first parameters built from them)
        self._lane_params: dict[tuple[str, int], tuple[dict[str, str], dict[str, Any]]] = {}
        # app -> (its output spec table, the outputs in answer order: ``_outputs_of``)
        self._outputs: dict[str, tuple[Any, list[_TaskOutputs]]] = {}
        self._root_limits: dict[str, tuple[AppRoutes, int | None]] = {}  # app -> (routes, ``_root_limit``)

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Drain completions on ``loop`` whenever a worker rings the frontend's doorbell."""
        self._loop = loop
        self.watch_bell()

    def watch_bell(self) -> None:
        """Register the frontend's doorbell with the loop (once it is mapped; idempotent)."""
        bell = self.routing.bell
        if self._loop is None or bell is None or self._watched is bell or self._closing:
            return
        self._loop.add_reader(bell.fileno(), self._on_bell)
        self._watched = bell

    def stop(self) -> None:
        if self.trace:
            write_trace("frontend", ["app", "request_id", "created", "sent", "rung", "woke", "answered",
                                     "popped", "written"],
                        list(self.trace.values()))
            self.trace = {}
        self._closing = True
        if self._watched is not None and self._loop is not None:
            with contextlib.suppress(RuntimeError, ValueError, OSError):  # the loop may be closed
                self._loop.remove_reader(self._watched.fileno())
        self._watched = None

    def _on_bell(self) -> None:
        bell = self._watched
        if bell is None:
            return
        self._woke_ns = time.monotonic_ns()
        self._popped_ns = 0
        # The flag stays clear: workers need not ring until the drain re-arms it. The FIFO's
        # bytes are read once the drain's answers are out (``_quiet_bell``).
        self._rung = True
        if not self._drain_scheduled:
            self._drain()
        else:
            self._quiet_bell()

    def _quiet_bell(self) -> None:
        """Read the doorbell's wake-up bytes (``Doorbell.clear``) after the drain's work and before
        the arm (a byte read after it could be a new ring's, lost); a FIFO left readable would
        call ``_on_bell`` at every loop iteration."""
        if self._rung and self._watched is not None:
            self._rung = False
            self._watched.clear()

    def pending_in(self, generation: int) -> int:
        """Requests of ``generation`` whose credits are not all back yet (its drain is not over)."""
        return sum(1 for r in self.pending.values() if r.generation == generation)

    def unanswered_in(self, generation: int) -> int:
        """Requests of ``generation`` not answered yet (the rest only wait for late credits)."""
        return sum(1 for r in self.pending.values() if r.generation == generation and not r.answered)

    # ---- completions --------------------------------------------------------------------------
    def _drain(self) -> None:
        """Account every ready completion; yield to the loop after each ``DRAIN_POP`` per ring,
        and when none is left, arm the doorbell and look once more (``rings.Doorbell``)."""
        self._drain_scheduled = False
        bell = self._watched
        while not self._closing:
            if self.drain(self.routing.completions):
                self._quiet_bell()
                self._drain_scheduled = True
                assert self._loop is not None
                self._loop.call_soon(self._drain)
                return
            if bell is None:
                return
            self._quiet_bell()
            bell.arm()
            if not any(len(ring) for ring in self.routing.completions):
                return
            bell.disarm()

    def drain(self, rings: list[ShmRing]) -> bool:
        """Account every completion record waiting in ``rings``; True when more may be left.

        Each record comes out of the ring as one flat tuple (``ShmRing.pop_completions``: the
        fields and durations read in the compiled core, no header object per record). What an
        answer needs (credits, the sink's outputs, the timings it reports) is done record by
        record, so an answer leaves as soon as its last record is read; the metrics and bin
        counters of the records follow once the drain's answers are out (``_observe``)."""
        more = False
        pending = self.pending
        for ring in rings:
            got = ring.pop_completions(DRAIN_POP)
            if not got:
                continue
            more |= len(got) == DRAIN_POP
            if self.trace is not None and not self._popped_ns:  # the drain's first pop
                self._popped_ns = time.monotonic_ns()
            for rec in got:
                req = pending.get(rec[0])
                if req is None:
                    self.metrics.late.inc()
                else:
                    self._on_completion(req, rec)
        if self._observed:
            self._observe()
        return more

    def _on_completion(self, req: Pending, rec: Completion) -> None:
        (_, task_index, status, child_index, child_count, credit, tensors, queue_us, compute_us, _,
         hop_us, done_ns) = rec
        app = req.routes.app
        names = app.task_names
        task = names[task_index] if task_index < len(names) else f"#{task_index}"
        if status == 0:  # Status.OK
            self._observed.append((req, task, rec))
            # the two ring hops of this item, from server-side stamps: push -> pop by the worker
            # (``hop_us``), and its completion record's push -> this drain (only a record that woke
            # the frontend: one that handed work on to children waits in its ring for a child's record)
            done_us = -1.0 if child_count else max(0.0, (time.monotonic_ns() - done_ns) / 1e3)
            t = req.timings.get(task)
            if t is None:
                req.timings[task] = [queue_us, compute_us, 1, hop_us, done_us]
            else:
                t[0], t[1], t[2] = max(t[0], queue_us), max(t[1], compute_us), t[2] + 1
                t[3], t[4] = max(t[3], hop_us), max(t[4], done_us)
            if child_count:
                req.children[task] = req.children.get(task, 0) + child_count
            if task in app.sinks and not req.answered:
                # views into ``tensors`` (bytes of its own, out of the ring: the views keep it alive)
                req.items.setdefault(task, []).append((child_index, sink_arrays(tensors)))
        else:
            reason = drop_reason(status)
            self.metrics.dropped.inc((("app", app.name), ("task", task), ("reason", reason)))
            if req.drop is None:
                req.drop = (task, status)
                if status == Status.ERROR and len(tensors):
                    req.error = bytes(tensors).decode("utf-8", "replace")
        req.credit_in += credit
        if req.drop is not None and not req.answered:
            self._answer_dropped(req)
        if req.credit_in >= TOTAL_CREDIT:
            if not req.answered:
                self._answer_result(req)
            self._forget(req)

    def _observe(self) -> None:
        """The metrics (queue, compute, batch size), the per-task statistics (``model_stats``) and
        the bin's fan-out counters of the OK records the drain has read (each (app, task,
        variant)'s histogram series kept, counted into with ``metrics.count_into``)."""
        observed, self._observed = self._observed, []
        now = time.monotonic_ns()
        for req, task, rec in observed:
            app = req.routes.app
            variant = req.routes.lanes[req.lane].get(task, "")
            c = self._series.get((app.name, task, variant))
            if c is None:
                c = self._series[(app.name, task, variant)] = self._series_of(app.name, task, variant)
            queue, compute, batch, lat_buckets, batch_buckets, task_stats, batch_stats = c
            count_into(queue, lat_buckets, rec[7])
            count_into(compute, lat_buckets, rec[8])
            if rec[3] == 0 or rec[4] <= 1:  # a batch counts once: its first child (or its one item)
                count_into(batch, batch_buckets, rec[9])
            count_item(task_stats, batch_stats, rec[7], rec[10], rec[8],
                       -1.0 if rec[4] else max(0.0, (now - rec[11]) / 1e3), rec[9])
            if task not in app.sinks:  # (a cached tuple; ``children`` walks the edges)
                self.admission.fan_out(app.name, task, variant, rec[4])

    def _series_of(self, app: str, task: str, variant: str) -> tuple[Any, ...]:
        """The histogram series of (app, task, variant), their buckets, and the task's statistics
        (``model_stats``)."""
        m = self.metrics
        at = (("app", app), ("task", task))
        assert m.queue_duration.buckets == m.compute_duration.buckets
        return (m.queue_duration.series_for(at), m.compute_duration.series_for(at),
                m.batch_size.series_for((*at, ("variant", variant))), m.queue_duration.buckets,
                m.batch_size.buckets, *m.models.task_series(app, task))

    def _forget(self, req: Pending) -> None:
        self.pending.pop(req.request_id, None)
        if req.timer is not None:
            req.timer.cancel()

    def _finish(self, req: Pending, status: int, body: dict[str, Any], reason: str | None) -> None:
        """Answer ``req`` once: the answer first (written in this call by the fast front end), the
        bookkeeping after it (nothing else runs in between: the same callback)."""
        now = time.monotonic_ns()
        row = self.trace.get(req.request_id) if self.trace is not None else None
        if row is not None:
            row[5:8] = [self._woke_ns, now, self._popped_ns]
        req.answered = True
        req.body = b""
        if not req.future.done():
            req.future.set_result((status, body))
            if req.on_answer is not None:
                # In this drain, not a loop turn later as a future's callbacks are: the answer
                # leaves as soon as the record that completes it is read.
                try:
                    req.on_answer()
                except Exception as exc:  # one answer must not stop the drain
                    print(f"jigsawd: answering request {req.request_id} failed: {exc!r}", file=sys.stderr,
                          flush=True)
        if row is not None:
            row[8] = time.monotonic_ns()
        app = req.routes.app.name
        self.admission.release(app, req.generation)
        self.admission.answered(app, status)
        if reason is None:
            self.metrics.success.inc((("app", app),))
        else:
            self.metrics.failure.inc((("app", app), ("reason", reason)))
        self.metrics.request_duration.observe((("app", app),), (now - req.created_ns) / 1e3)
        self.metrics.models.request_done(app, reason is None, now - req.created_ns)

    def _answer_dropped(self, req: Pending) -> None:
        assert req.drop is not None
        task, status = req.drop
        if req.error:  # the task ran and failed on this item (a model or transform error)
            self._finish(req, 500, {"error": req.error, "status": "ERROR", "task": task, "reason": "error",
                                    "id": req.client_id}, "error")
            return
        name = Status(status).name if status in Status._value2member_map_ else str(status)
        reason = drop_reason(status)
        self._finish(req, 504, {"error": f"request dropped by task {task!r} ({reason}): it could not "
                                         f"meet its deadline", "status": name, "task": task,
                                "reason": reason, "items_lost": self._items_lost(req, task),
                                "id": req.client_id}, "dropped")

    @staticmethod
    def _items_lost(req: Pending, task: str) -> float:
        """The items ``task`` would have produced for the dropped item (its multiplicative factor
        under the request's lane, at least 1): the paper counts an early drop as that many violations."""
        app = req.routes.app
        variant = req.routes.lanes[req.lane].get(task, "") if req.lane < len(req.routes.lanes) else ""
        try:
            produced = sum(app.factor(task, variant, child) for child in app.children(task))
        except KeyError:
            produced = 0.0
        return round(max(1.0, produced), 3)

    def _on_deadline(self, req: Pending) -> None:
        if not req.answered:
            self._finish(req, 504, {"error": "request timed out: its deadline passed before every task "
                                             "answered", "status": "DEADLINE_EXCEEDED", "task": None,
                                    "reason": "deadline", "id": req.client_id}, "timeout")
        assert self._loop is not None
        req.timer = self._loop.call_later(LATE_GRACE_S, self._forget, req)

    def _outputs_of(self, app_name: str) -> list[_TaskOutputs]:
        """The app's outputs in answer order: (sink task, [(index, "task.name", datatype, shape
        after the batch dimension)]), built once per output spec table (a re-plan maps a new one)."""
        specs = self.routing.output_specs[app_name]
        cached = self._outputs.get(app_name)
        if cached is None or cached[0] is not specs:
            cached = self._outputs[app_name] = (specs, [
                (task, [(k, f"{task}.{spec.name}", spec.datatype, tuple(spec.shape[1:]))
                        for k, spec in enumerate(task_specs)])
                for task, task_specs in specs.items()])
        return cached[1]

    def _answer_result(self, req: Pending) -> None:
        app = req.routes.app
        outputs = []
        wanted = req.outputs_wanted
        emulated = self.emulated
        for task, specs in self._outputs_of(app.name):
            items = req.items.get(task)
            if items is None:
                items = []
            elif len(items) > 1:
                items.sort(key=_first)
            for k, name, datatype, tail in specs:
                if wanted is not None and name not in wanted:
                    continue
                try:
                    data = _joined(items, k, tail)
                except ValueError as exc:  # an item whose output is not of its declared shape
                    self._finish(req, 500, {"error": f"output {name!r}: {exc}", "status": "ERROR",
                                            "task": task, "reason": "error", "id": req.client_id}, "error")
                    return
                outputs.append({"name": name, "datatype": datatype, "shape": list(data.shape),
                                "data": data,  # an array until the handler encodes the response
                                "parameters": {"emulated": emulated}})
        lane = req.routes.lanes[req.lane]
        cached = self._lane_params.get((app.name, req.lane))
        if cached is None or cached[0] is not lane:  # (a re-plan's routes bring new lane dicts)
            cached = self._lane_params[(app.name, req.lane)] = (lane, {
                "backend": self.backend_name, "emulated": self.emulated,
                **{f"lane.{task}": variant for task, variant in lane.items()}})
        params = cached[1].copy()
        keys = self._keys.get(app.name)
        if keys is None:
            keys = self._keys[app.name] = {}
        for task, (queue_us, compute_us, n, hop_us, done_us) in req.timings.items():
            k = keys.get(task)
            if k is None:
                k = keys[task] = (f"queue_us.{task}", f"compute_us.{task}", f"items.{task}", f"hop_us.{task}",
                                  f"done_us.{task}", f"children.{task}")
            # to 0.1 us (the durations are >= 0; half-way rounds up: 3x cheaper than ``round``)
            params[k[0]] = int(queue_us * 10.0 + 0.5) / 10.0
            params[k[1]] = int(compute_us * 10.0 + 0.5) / 10.0
            params[k[2]] = n
            params[k[3]] = int(hop_us * 10.0 + 0.5) / 10.0
            if done_us >= 0:  # (a task whose every item had children did not wake the frontend)
                params[k[4]] = int(done_us * 10.0 + 0.5) / 10.0
        for task, n in req.children.items():
            k = keys.get(task)
            params[k[5] if k is not None else f"children.{task}"] = n
        params["e2e_us"] = int((time.monotonic_ns() - req.created_ns) / 100.0 + 0.5) / 10.0
        body = {"model_name": app.name, "model_version": "1", "outputs": outputs, "parameters": params}
        if req.client_id is not None:
            body["id"] = req.client_id
        self._finish(req, 200, body, None)

    # ---- dispatch -----------------------------------------------------------------------------
    def submit(self, routes: AppRoutes, client_id: str | None,
               tensors: list[tuple[str, str, tuple[int, ...], Any]],
               outputs_wanted: list[str] | None, timeout_us: int | None = None) -> Pending | str:
        """Admit and dispatch one request; a message saying why when it cannot be dispatched (shed).

        Its deadline is the app's SLO (plus one hop per level, times the time scale) from now, or
        ``timeout_us`` (OIP ``parameters.timeout``, wall microseconds) when that is sooner. Inputs
        that encode larger than a root ring's records carry raise ``InputTooLarge`` (JSON numbers
        may take fewer bytes than their datatype: a body within ``server.max_payload_bytes`` can
        still be too large).
        """
        assert self._loop is not None
        app = routes.app
        now = time.monotonic_ns()
        deadline = now + self.budget_ns(routes, timeout_us)
        body = encode_tensors([_raw(t) for t in tensors])
        limit = self._root_limit(routes)
        if len(body) > limit:
            raise InputTooLarge(f"inputs: {len(body)} bytes as tensors, over the {limit} bytes a request to "
                                f"model {app.name!r} carries (server.max_payload_bytes)")
        req = Pending(0, routes, 0, client_id, now, deadline, self._loop.create_future(), outputs_wanted,
                      body=body)
        why = self._dispatch(req)
        if why is not None:
            return why
        self.admission.admit(app.name, req.generation)
        req.timer = self._loop.call_later(max(0.0, (deadline - time.monotonic_ns()) / 1e9),
                                          self._on_deadline, req)
        if req.drop is not None:
            self._answer_dropped(req)
        return req

    def _root_limit(self, routes: AppRoutes) -> int:
        """``root_limit`` of ``routes``, kept per app while its routes are the same object."""
        cached = self._root_limits.get(routes.app.name)
        if cached is None or cached[0] is not routes:
            cached = (routes, root_limit(self.routing.rings, routes))
            if cached[1] is not None:  # (none mapped yet: not kept, the push will say)
                self._root_limits[routes.app.name] = cached
        return cached[1] if cached[1] is not None else 1 << 62

    def budget_ns(self, routes: AppRoutes, timeout_us: int | None = None) -> int:
        """Wall nanoseconds from arrival to a request's deadline: the app's SLO plus one hop per
        level, times the time scale, or ``timeout_us`` when that is sooner."""
        budget = int((routes.app.latency_slo_ms + routes.depth * self.hop_latency_ms) * self.time_scale * 1e6)
        return budget if timeout_us is None else min(budget, timeout_us * 1000)

    def _dispatch(self, req: Pending) -> str | None:
        """Draw a lane, give the request a fresh id and push its root items; None when sent."""
        routes = req.routes
        app = routes.app
        if len(routes.lanes) > 1:
            drawn = self.rng.choices(range(len(routes.lanes)), routes.lane_weights)[0]
            req.lane = self.routing.shift_lane(routes, drawn, req.deadline_ns - time.monotonic_ns())
            if req.lane != drawn:
                self.metrics.lane_shifts.inc((("app", app.name),))
        else:
            req.lane = 0
        req.generation = routes.generation
        req.request_id = self.next_id
        self.next_id += 1
        roots = routes.roots[req.lane]
        mapped = self.routing.generations.get(routes.generation)
        paths_ns = mapped.min_path_ns if mapped is not None else []
        fastest_ns = paths_ns[req.lane] if req.lane < len(paths_ns) else 0
        if req.deadline_ns - time.monotonic_ns() < fastest_ns:
            # Early drop at push (paper §3.3): even the lane's fastest path cannot make the
            # deadline (a tight OIP timeout), so no instance spends time on it.
            req.credit_in = TOTAL_CREDIT
            req.drop = (next(iter(roots)), int(Status.DROPPED_DEADLINE))
            self.metrics.dropped.inc((("app", app.name), ("task", req.drop[0]),
                                      ("reason", drop_reason(req.drop[1]))))
            self.pending[req.request_id] = req
            return None
        shares = split_credit(TOTAL_CREDIT, len(roots))
        sent = 0
        for (task, targets), share in zip(roots.items(), shares):
            h = RecordHeader(request_id=req.request_id, app=routes.app_index, task=app.task_names.index(task),
                             lane=req.lane, deadline_ns=req.deadline_ns, created_ns=req.created_ns)
            h.stamp(HOP_SENT, time.monotonic_ns())
            usable = self.routing.usable(targets)
            for t in usable:
                if self.routing.rings[t.ring].push_framed(h, share, req.body):
                    row = None
                    if self.trace is not None and sent == 0:
                        row = [routes.app_index, req.request_id, req.created_ns, h.hops[HOP_SENT]] + [0] * 5
                        self.trace[req.request_id] = row
                    self._ring(t.ring, row)
                    sent += 1
                    break
            else:
                if sent == 0 and task == next(iter(roots)):
                    if not usable:
                        return f"every instance of task {task!r} of model {app.name!r} has failed"
                    return f"every input ring of model {app.name!r} is full"
                req.credit_in += share
                req.drop = req.drop or (task, int(Status.REJECTED))
        self.pending[req.request_id] = req
        return None

    def _ring(self, ring: str, row: list[int] | None) -> None:
        """Ring the worker's doorbell: at once for the loop turn's first push, at the turn's end for
        the others. A request alone in its turn (light load) wakes its worker without waiting for
        the rest of the turn; a turn that parses many (a burst, a closed loop) wakes each worker at
        most twice, not once per request: rung at every push, a worker that keeps up re-arms
        between pushes and is woken for each, which cost the workers twice the CPU per request.
        The flag makes a ring a system call only when the worker may sleep (``rings.Doorbell``)."""
        bell = self.routing.bells[ring]
        if self._turn_pushed:
            self._bells_due[ring] = bell
            if row is not None:
                self._unrung.append(row)
            return
        self._turn_pushed = True
        if row is not None:
            row[4] = time.monotonic_ns()  # (before the write: a woken worker may run before it returns)
        bell.ring()
        assert self._loop is not None
        self._loop.call_soon(self._ring_due)  # (after the ring: the worker need not wait for it)

    def _ring_due(self) -> None:
        """The end of the turn: ring what its later pushes left (the first push's worker again too,
        if it re-armed meanwhile)."""
        self._turn_pushed = False
        due, self._bells_due = self._bells_due, {}
        if self._unrung:
            rung = time.monotonic_ns()
            for row in self._unrung:
                row[4] = rung
            self._unrung = []
        for bell in due.values():
            bell.ring()

    def _forget_answered(self, req: Pending) -> bool:
        """Take ``req`` out of the pending table; True when it was answered already (it only
        waited for late credits, which its generation will no longer send)."""
        self.pending.pop(req.request_id, None)
        if req.answered and req.timer is not None:
            req.timer.cancel()
        return req.answered

    def _dispatch_again(self, req: Pending, routes: AppRoutes) -> str | None:
        """Send an unanswered request again from its inputs on ``routes`` (what its old wiring held
        is forgotten); None when a ring took it (a drop at once is answered), else why not."""
        req.routes = routes
        req.credit_in, req.drop, req.error = 0, None, ""
        req.items, req.timings, req.children = {}, {}, {}
        old_generation = req.generation
        why = self._dispatch(req)
        self.admission.moved(routes.app.name, old_generation, req.generation)
        if why is None and req.drop is not None:
            self._answer_dropped(req)
        return why

    def cut_generation(self, generation: int) -> tuple[int, int, int]:
        """Settle every request of ``generation`` now: its drain is cut short (a re-plan needs its
        slots) and its processes stop.

        Answered ones only waiting for late credits are forgotten; an unanswered one is dispatched
        again on the app's current routes when its deadline leaves time for their fastest path
        (with ``server.admission_backlog``, for the queue there too: ``admission.queue_admits``
        against the time it has left, oldest first), else answered 504 (it would time out) or 503
        (no ring took it). Returns (forgotten, resent, failed).

        Why the queue: a drain-first in a spike cut 869 requests of the drained instances and sent
        them all again on the interim plan, whose door admits 379 (social_media bins 115-117 at
        time scale 30): 37 s of queue on a 21 s deadline, every one of them answered 504 at its
        deadline, and the door shut to new requests (which had their whole deadline) for 20 s.
        """
        forgotten = resent = failed = 0
        now = time.monotonic_ns()
        for req in [r for r in self.pending.values() if r.generation == generation]:
            if self._forget_answered(req):
                forgotten += 1
                continue
            routes = self.routing.routes.get(req.routes.app.name, req.routes)
            why = None
            time_left_ns = req.deadline_ns - now
            if routes.generation != generation and time_left_ns > self.routing.fastest_path_ns(routes) \
                    and self._queue_leaves_time(routes, time_left_ns):
                why = self._dispatch_again(req, routes)
                if why is None:
                    resent += 1
                    continue
            failed += 1
            if req.timer is not None:
                req.timer.cancel()
            if why is None:
                self._finish(req, 504, {"error": "request timed out: its generation was retired early and "
                                                 "its deadline leaves no time to run it again",
                                        "status": "DEADLINE_EXCEEDED", "task": None, "reason": "deadline",
                                        "id": req.client_id}, "timeout")
            else:
                self._finish(req, 503, {"error": f"its generation was retired early and {why}; retry later",
                                        "status": "UNAVAILABLE", "task": None, "reason": "shed",
                                        "id": req.client_id}, "shed")
        return forgotten, resent, failed

    def _queue_leaves_time(self, routes: AppRoutes, time_left_ns: int) -> bool:
        """Whether a request sent again on ``routes`` with ``time_left_ns`` until its deadline may
        still make it behind their queue (always, with ``server.admission_backlog`` off)."""
        if not routes.admission_backlog:
            return True
        return queue_admits(self.routing.queued_end_s(routes), time_left_ns / 1e9)

    def on_worker_failed(self, generation: int, task: str, variant: str,
                         suspects: frozenset[int] = frozenset(), reason: str = "exited") -> tuple[int, int]:
        """Settle the requests a dead process of (task, variant) in ``generation`` may have held.

        A suspect (a request id of the batch that crashed it) is answered 500 ``WORKER_CRASHED``.
        Each other unanswered one is dispatched again on the app's current routes when its
        deadline leaves time for the fastest path, else answered 503 ``WORKER_FAILED``; answered
        ones waiting for late credits are forgotten. Returns (retried, failed).
        """
        retried = failed = 0
        now = time.monotonic_ns()
        for req in list(self.pending.values()):
            if req.generation != generation or req.routes.lanes[req.lane].get(task) != variant:
                continue
            if self._forget_answered(req):
                continue
            if req.request_id in suspects:
                failed += 1
                if req.timer is not None:
                    req.timer.cancel()
                self._finish(req, 500, crashed_answer(task, variant, reason, req.client_id), "worker_crashed")
                continue
            name = req.routes.app.name
            routes = self.routing.routes.get(name, req.routes)
            fastest = self.routing.fastest_path_ns(routes)
            why = None
            if req.attempts < MAX_ATTEMPTS and req.deadline_ns - now > fastest:
                req.attempts += 1
                why = self._dispatch_again(req, routes)
                if why is None:
                    retried += 1
                    self.metrics.retries.inc((("app", name),))
                    continue
            failed += 1
            if req.timer is not None:
                req.timer.cancel()
            detail = why or ("its deadline leaves no time to run it again" if req.attempts < MAX_ATTEMPTS
                             else f"it was dispatched {req.attempts} times")
            self._finish(req, 503, {"error": f"an instance of task {task!r} ({variant}) failed while serving "
                                             f"this request and {detail}; retry later",
                                    "status": "WORKER_FAILED", "task": task, "reason": "worker_failed",
                                    "id": req.client_id}, "worker_failed")
        return retried, failed
