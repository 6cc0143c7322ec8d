"""The HTTP frontend: Open Inference Protocol (KServe v2) REST on aiohttp, feeding the worker rings.

A request is validated, admitted (bounded in-flight per app), given a lane drawn with
probability rate/demand, split into root items carrying credit, and pushed to the least-loaded
process of each root task. Completion records come back over one ring per worker; a thread
sleeps on the frontend's doorbell and wakes the loop, which accounts credits and answers each
request exactly once: 200 with the sink outputs, 504 when a task dropped it (naming the task)
or its deadline passed at the frontend, 503 when shed. Late records are discarded and counted.

Worker faults: when the daemon's supervisor finds a worker dead or hung it marks its stats slot
(routing then skips it) and calls ``on_worker_failed``: every unanswered request that may have
had work on that process is dispatched again under a new id (its late records are discarded)
when its deadline still leaves time for the lane's fastest path, else answered 503
``WORKER_FAILED``. The request body is kept for that until the request is answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiohttp import web

from jigsaw import __version__
from jigsaw.backends.base import OutputSpec
from jigsaw.backends.emulated import EmulatedBackend
from jigsaw.runtime import stats as st
from jigsaw.runtime.metrics import Metrics
from jigsaw.runtime.oip import HEADER_LENGTH, BadRequest, encode_response, header_length, parse_infer_request
from jigsaw.runtime.openapi import add_openapi_route, openapi_document
from jigsaw.runtime.records import (
    HOP_BATCH,
    HOP_END,
    HOP_SENT,
    HOP_START,
    TOTAL_CREDIT,
    frame,
    split_credit,
    unframe,
)
from jigsaw.runtime.rings import Doorbell, RecordHeader, ShmRing, Status, drop_reason
from jigsaw.runtime.stats import StatsBlock
from jigsaw.runtime.tensors import decode_tensors, encode_tensors
from jigsaw.runtime.topology import AppRoutes, Target, Topology

DRAIN_POP = 256
LATE_GRACE_S = 10.0  # a timed-out request's record is kept this long to absorb its late credits
RETRY_AFTER_S = "1"
MAX_ATTEMPTS = 3  # dispatches of one request across worker faults
MAX_PAYLOAD_KEY = web.AppKey("max_payload_bytes", int)

@dataclass
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
    timings: dict[str, list[float]] = field(default_factory=dict)  # task -> [queue_us, compute_us, n]
    children: dict[str, int] = field(default_factory=dict)
    drop: tuple[str, int] | None = None
    error: str = ""  # why a task failed this request's item (answered 500), as its worker said
    timer: asyncio.TimerHandle | None = None
    generation: int = 0
    body: bytes = b""  # the encoded inputs, kept to dispatch again after a worker fault
    attempts: int = 1


@dataclass
class BinCounters:
    """What the controller reads per app and bin: arrivals, answers, SLO violations, fan-out."""

    arrivals: int = 0
    answered: int = 0
    violations: int = 0  # 504 (dropped or deadline passed) and 503 shed answers
    # (task, variant) -> [items finished, children spawned]: the measured multiplicative factor
    children: dict[tuple[str, str], list[int]] = field(default_factory=dict)


@dataclass
class _Mapped:
    """The frontend's mappings of one generation's segments."""

    topology: Topology
    rings: dict[str, ShmRing]
    bells: dict[str, Doorbell]
    completions: list[ShmRing]
    stats: StatsBlock
    min_path_ns: list[int] = field(default_factory=list)  # per lane: fastest batch-1 time of its slowest path


def min_path_ns(topology: Topology, routes: AppRoutes) -> list[int]:
    """Per lane, the least time its slowest path takes (batch-1 estimates, no queueing)."""
    fastest: dict[tuple[str, str], int] = {}
    for p in topology.processes:
        if p.app == routes.app.name and p.exec_estimate_ns:
            key = (p.task, p.variant)
            fastest[key] = min(fastest.get(key, p.exec_estimate_ns[0]), p.exec_estimate_ns[0])
    return [max((sum(fastest.get((t, lane.get(t, "")), 0) for t in path) for path in routes.app.paths),
                default=0) for lane in routes.lanes]


def admission_limit(routes: AppRoutes) -> int:
    """Requests an app may have in flight: what its root instances finish within the latency SLO.

    Little's law: capacity (req/s) x the SLO's queueing share (s). Beyond it a new request would
    queue behind work that already fills the SLO and be answered late or dropped, after taking
    its share of the queue from requests that could still make it: shedding it at the door (503)
    keeps goodput near the capacity under overload.
    """
    app = routes.app
    capacities = []
    for root in app.roots:
        cap = sum(i.count * i.throughput_rps for i in routes.plan.instances if i.task == root)
        capacities.append(cap)
    capacity_rps = min(capacities) if capacities else 0.0
    # Queueing may use what the SLO leaves after one batch of each task on the slowest path.
    service_ms = max(sum(routes.plan.task_latency_ms.get(t, 0.0) for t in path) for path in app.paths)
    queue_ms = max(app.latency_slo_ms - service_ms, 0.25 * app.latency_slo_ms)
    return max(1, math.ceil(capacity_rps * queue_ms / 1000.0))


class Frontend:
    """Owns the producer side of the root rings and the consumer side of the completion rings."""

    def __init__(self, topology: Topology, *, backend_kind: str = "emulated", max_queue: int = 4096,
                 hop_latency_ms: float = 10.0, time_scale: float = 1.0, seed: int = 0) -> None:
        self.topology = topology
        self.backend_kind = backend_kind
        self.max_queue = max_queue
        self.hop_latency_ms = hop_latency_ms
        self.time_scale = time_scale
        self.metrics = Metrics(backend_kind)
        self.rng = random.Random(seed)
        self.pending: dict[int, Pending] = {}
        self.inflight: dict[str, int] = dict.fromkeys(topology.apps, 0)
        self.admit_limit: dict[str, int] = {a: admission_limit(r) for a, r in topology.apps.items()}
        self.routes: dict[str, AppRoutes] = dict(topology.apps)  # app -> the generation serving it now
        self.bins: dict[str, BinCounters] = {a: BinCounters() for a in topology.apps}
        self._gens: dict[int, _Mapped] = {}
        self._ring_stats: dict[str, StatsBlock] = {}
        self.next_id = 1
        self.ready = False
        self.draining = False
        self._rings: dict[str, ShmRing] = {}
        self._bells: dict[str, Doorbell] = {}
        self.completions: list[ShmRing] = []
        self.bell: Doorbell | None = None
        self.stats: StatsBlock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watcher: threading.Thread | None = None
        self._closing = False
        self._drain_scheduled = False
        self._output_specs = {name: self._specs_of(r) for name, r in topology.apps.items()}
        for name, r in topology.apps.items():
            self.metrics.slices.set((("app", name),), r.slices)
            self.metrics.processes.set((("app", name),),
                                       sum(1 for p in topology.processes if p.app == name))

    def _specs_of(self, routes: AppRoutes) -> dict[str, list[OutputSpec]]:
        app = routes.app
        if self.backend_kind == "emulated":
            return {t: EmulatedBackend.output_specs(app.task(t).kind, app.children(t)) for t in app.sinks}
        from jigsaw.models.pipeline import task_output_specs

        return {t: task_output_specs(app, t) for t in app.sinks}

    # ---- lifecycle ------------------------------------------------------------------------
    def attach(self) -> None:
        """Map the rings the daemon created for the initial topology (generation 0)."""
        self.add_generation(0, self.topology)
        self.stats = self._gens[0].stats

    def add_generation(self, generation: int, topology: Topology) -> None:
        """Map a generation's root rings, completion rings and stats (its segments must exist).

        Its completions are drained from now on; requests go to it only after ``switch``.
        """
        if self.bell is None:
            self.bell = Doorbell.attach(topology.frontend_doorbell)
        rings: dict[str, ShmRing] = {}
        bells: dict[str, Doorbell] = {}
        stats = StatsBlock.attach(topology.stats)
        for routes in topology.apps.values():
            routes.generation = generation
            for lane in routes.roots:
                for targets in lane.values():
                    for t in targets:
                        if t.ring not in rings:
                            rings[t.ring] = ShmRing.attach(t.ring, role="producer")
                            bells[t.ring] = Doorbell.attach(t.doorbell)
        completions = [ShmRing.attach(n, role="consumer") for n in topology.completion_rings]
        paths = {name: min_path_ns(topology, r) for name, r in topology.apps.items()}
        self._gens[generation] = _Mapped(topology, rings, bells, completions, stats,
                                         next(iter(paths.values()), []))
        self._rings.update(rings)
        self._bells.update(bells)
        self._ring_stats.update(dict.fromkeys(rings, stats))
        self.completions = [r for g in self._gens.values() for r in g.completions]

    def switch(self, app: str, generation: int) -> None:
        """Route the app's new requests to ``generation`` (one assignment: atomic on the loop)."""
        routes = self._gens[generation].topology.apps[app]
        self.routes[app] = routes
        self.inflight.setdefault(app, 0)
        self.refresh_admission(app)
        self.bins.setdefault(app, BinCounters())
        self._output_specs[app] = self._specs_of(routes)
        self.metrics.slices.set((("app", app),), routes.slices)
        self.metrics.processes.set((("app", app),), sum(
            1 for p in self._gens[generation].topology.processes if p.app == app))

    def refresh_admission(self, app: str) -> None:
        """Admission limit of ``app`` scaled by the share of its root processes that are up."""
        routes = self.routes[app]
        targets = {t.ring: t for lane in routes.roots for ts in lane.values() for t in ts}
        states = [self._ring_stats[t.ring].get(t.slot, st.STATE) if t.ring in self._ring_stats else st.READY
                  for t in targets.values()]
        up = sum(1 for s in states if s not in (st.DEAD, st.FAILED))
        limit = admission_limit(routes)
        self.admit_limit[app] = max(1, math.ceil(limit * up / len(states))) if states and up else limit

    def pending_in(self, generation: int) -> int:
        """Requests of ``generation`` whose credits are not all back yet (its drain is not over)."""
        return sum(1 for r in self.pending.values() if r.generation == generation)

    def remove_generation(self, generation: int) -> None:
        """Unmap a drained generation (its workers stopped); late records of it are discarded."""
        g = self._gens.pop(generation, None)
        if g is None:
            return
        self._drain_one(g.completions)
        self.completions = [r for x in self._gens.values() for r in x.completions]
        for name in g.rings:
            self._rings.pop(name, None)
            self._bells.pop(name, None)
            self._ring_stats.pop(name, None)
        for ring in (*g.rings.values(), *g.completions):
            ring.close()
        for bell in g.bells.values():
            bell.close()
        g.stats.close()

    def take_bin(self, app: str) -> BinCounters:
        """The app's counters since the last call, and a fresh set for the next bin."""
        got = self.bins.get(app, BinCounters())
        self.bins[app] = BinCounters()
        return got

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._watcher = threading.Thread(target=self._watch, name="completion-doorbell", daemon=True)
        self._watcher.start()

    def close(self) -> None:
        self._closing = True
        if self.bell is not None:
            self.bell.ring()
        if self._watcher is not None:
            self._watcher.join(timeout=2.0)
        for g in self._gens.values():
            for ring in (*g.rings.values(), *g.completions):
                ring.close()
            for bell in g.bells.values():
                bell.close()
            g.stats.close()
        self._gens.clear()
        if self.bell is not None:
            self.bell.close()

    def _watch(self) -> None:
        assert self.bell is not None and self._loop is not None
        while not self._closing:
            if self.bell.wait(0.5) and not self._drain_scheduled and not self._closing:
                self._drain_scheduled = True
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self._drain)

    def num_pending(self) -> int:
        return sum(self.inflight.values())

    # ---- completions ----------------------------------------------------------------------
    def _drain(self) -> None:
        self._drain_scheduled = False
        more = False
        more = self._drain_one(self.completions)
        if more and not self._drain_scheduled:
            self._drain_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._drain)

    def _drain_one(self, rings: list[ShmRing]) -> bool:
        more = False
        for ring in rings:
            got = ring.pop_many(DRAIN_POP)
            more |= len(got) == DRAIN_POP
            for header, payload in got:
                self._on_completion(header, payload)
        return more

    def _on_completion(self, h: RecordHeader, payload: bytes) -> None:
        req = self.pending.get(h.request_id)
        if req is None:
            self.metrics.late.inc()
            return
        app = req.routes.app
        task = app.task_names[h.task] if h.task < len(app.task_names) else f"#{h.task}"
        credit, tensors = unframe(payload)
        hops = h.hops
        if h.status == Status.OK:
            variant = req.routes.lanes[req.lane].get(task, "")
            queue_us = max(0.0, (hops[HOP_START] - hops[HOP_SENT]) / 1e3)
            compute_us = max(0.0, (hops[HOP_END] - hops[HOP_START]) / 1e3)
            labels = (("app", app.name), ("task", task))
            self.metrics.queue_duration.observe(labels, queue_us)
            self.metrics.compute_duration.observe(labels, compute_us)
            if h.child_index == 0 or h.child_count <= 1:
                self.metrics.batch_size.observe((*labels, ("variant", variant)), hops[HOP_BATCH])
            t = req.timings.setdefault(task, [0.0, 0.0, 0])
            t[0], t[1], t[2] = max(t[0], queue_us), max(t[1], compute_us), t[2] + 1
            if h.child_count:
                req.children[task] = req.children.get(task, 0) + h.child_count
            if app.children(task):
                counters = self.bins.setdefault(app.name, BinCounters())
                acc = counters.children.setdefault((task, variant), [0, 0])
                acc[0] += 1
                acc[1] += h.child_count
            if task in app.sinks and not req.answered:
                arrays = [np.array(x.data) for x in decode_tensors(tensors)]
                req.items.setdefault(task, []).append((h.child_index, arrays))
        else:
            reason = drop_reason(h.status)
            self.metrics.dropped.inc((("app", app.name), ("task", task), ("reason", reason)))
            if req.drop is None:
                req.drop = (task, h.status)
                if h.status == Status.ERROR and len(tensors):
                    req.error = bytes(tensors).decode("utf-8", "replace")
        req.credit_in += credit
        if req.drop is not None and not req.answered:
            self._answer_dropped(req)
        if req.credit_in >= TOTAL_CREDIT:
            if not req.answered:
                self._answer_result(req)
            self._forget(req)

    def _forget(self, req: Pending) -> None:
        self.pending.pop(req.request_id, None)
        if req.timer is not None:
            req.timer.cancel()

    def _finish(self, req: Pending, status: int, body: dict[str, Any], reason: str | None) -> None:
        req.answered = True
        req.body = b""
        self.inflight[req.routes.app.name] -= 1
        app = req.routes.app.name
        counters = self.bins.setdefault(app, BinCounters())
        counters.answered += 1
        if status >= 500:
            counters.violations += 1
        if reason is None:
            self.metrics.success.inc((("app", app),))
        else:
            self.metrics.failure.inc((("app", app), ("reason", reason)))
        self.metrics.request_duration.observe((("app", app),), (time.monotonic_ns() - req.created_ns) / 1e3)
        if not req.future.done():
            req.future.set_result((status, body))

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
                                "reason": reason, "id": req.client_id}, "dropped")

    def _on_deadline(self, req: Pending) -> None:
        if not req.answered:
            self._finish(req, 504, {"error": "request timed out: its deadline passed before every task "
                                             "answered", "status": "DEADLINE_EXCEEDED", "task": None,
                                    "reason": "deadline", "id": req.client_id}, "timeout")
        assert self._loop is not None
        req.timer = self._loop.call_later(LATE_GRACE_S, self._forget, req)

    def _answer_result(self, req: Pending) -> None:
        app = req.routes.app
        outputs = []
        for task, specs in self._output_specs[req.routes.app.name].items():
            items = sorted(req.items.get(task, []), key=lambda x: x[0])
            for k, spec in enumerate(specs):
                name = f"{task}.{spec.name}"
                if req.outputs_wanted is not None and name not in req.outputs_wanted:
                    continue
                parts = [arrays[k] for _, arrays in items if k < len(arrays)]
                if parts:
                    data = np.concatenate([p.reshape((-1, *spec.shape[1:])) for p in parts])
                else:
                    data = np.zeros((0, *spec.shape[1:]), dtype=np.int32)
                outputs.append({"name": name, "datatype": spec.datatype, "shape": list(data.shape),
                                "data": data,  # an array until the handler encodes the response
                                "parameters": {"emulated": self.backend_kind == "emulated"}})
        params: dict[str, Any] = {"backend": self.backend_kind,
                                  "emulated": self.backend_kind == "emulated"}
        for task, variant in req.routes.lanes[req.lane].items():
            params[f"lane.{task}"] = variant
        for task, (queue_us, compute_us, n) in req.timings.items():
            params[f"queue_us.{task}"] = round(queue_us, 1)
            params[f"compute_us.{task}"] = round(compute_us, 1)
            params[f"items.{task}"] = int(n)
        for task, n in req.children.items():
            params[f"children.{task}"] = n
        params["e2e_us"] = round((time.monotonic_ns() - req.created_ns) / 1e3, 1)
        body = {"model_name": app.name, "model_version": "1", "outputs": outputs, "parameters": params}
        if req.client_id is not None:
            body["id"] = req.client_id
        self._finish(req, 200, body, None)

    # ---- admission and dispatch ----------------------------------------------------------
    def _load(self, t: Target) -> int:
        return len(self._rings[t.ring]) + self._ring_stats[t.ring].get(t.slot, st.QUEUED)

    def _usable(self, targets: list[Target]) -> list[Target]:
        return st.routable(targets, lambda t: self._ring_stats[t.ring].get(t.slot, st.STATE), self._load)

    def submit(self, routes: AppRoutes, client_id: str | None,
               tensors: list[tuple[str, str, tuple[int, ...], Any]],
               outputs_wanted: list[str] | None) -> Pending | str:
        """Admit and dispatch one request; a message saying why when it cannot be dispatched (shed)."""
        assert self._loop is not None
        app = routes.app
        now = time.monotonic_ns()
        budget_ms = (app.latency_slo_ms + routes.depth * self.hop_latency_ms) * self.time_scale
        deadline = now + int(budget_ms * 1e6)
        req = Pending(0, routes, 0, client_id, now, deadline, self._loop.create_future(), outputs_wanted,
                      body=bytes(encode_tensors(tensors)))
        why = self._dispatch(req)
        if why is not None:
            return why
        self.inflight[app.name] += 1
        req.timer = self._loop.call_later(max(0.0, (deadline - time.monotonic_ns()) / 1e9),
                                          self._on_deadline, req)
        if req.drop is not None:
            self._answer_dropped(req)
        return req

    def _dispatch(self, req: Pending) -> str | None:
        """Draw a lane, give the request a fresh id and push its root items; None when sent."""
        routes = req.routes
        app = routes.app
        req.lane = self.rng.choices(range(len(routes.lanes)), routes.lane_weights)[0] \
            if len(routes.lanes) > 1 else 0
        req.generation = routes.generation
        req.request_id = self.next_id
        self.next_id += 1
        roots = routes.roots[req.lane]
        shares = split_credit(TOTAL_CREDIT, len(roots))
        sent = 0
        for (task, targets), share in zip(roots.items(), shares):
            h = RecordHeader(request_id=req.request_id, app=routes.app_index, task=app.task_names.index(task),
                             lane=req.lane, deadline_ns=req.deadline_ns, created_ns=req.created_ns)
            h.stamp(HOP_SENT, time.monotonic_ns())
            payload = frame(share, req.body)
            usable = self._usable(targets)
            for t in usable:
                if self._rings[t.ring].push(h, payload):
                    self._bells[t.ring].ring()
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

    def on_worker_failed(self, generation: int, task: str, variant: str) -> tuple[int, int]:
        """Settle the requests a dead process of (task, variant) in ``generation`` may have held.

        Each unanswered one is dispatched again on the app's current routes when its deadline
        leaves time for the fastest path, else answered 503 ``WORKER_FAILED``; answered ones
        waiting for late credits are forgotten. Returns (retried, failed).
        """
        retried = failed = 0
        now = time.monotonic_ns()
        for req in list(self.pending.values()):
            if req.generation != generation or req.routes.lanes[req.lane].get(task) != variant:
                continue
            self.pending.pop(req.request_id, None)
            if req.answered:
                if req.timer is not None:
                    req.timer.cancel()
                continue
            name = req.routes.app.name
            routes = self.routes.get(name, req.routes)
            mapped = self._gens.get(routes.generation)
            fastest = max(mapped.min_path_ns, default=0) if mapped is not None else 0
            why = None
            if req.attempts < MAX_ATTEMPTS and req.deadline_ns - now > fastest:
                req.routes, req.attempts = routes, req.attempts + 1
                req.credit_in, req.drop = 0, None
                req.items, req.timings, req.children = {}, {}, {}
                why = self._dispatch(req)
                if why is None:
                    retried += 1
                    self.metrics.retries.inc((("app", name),))
                    if req.drop is not None:
                        self._answer_dropped(req)
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

    # ---- HTTP -----------------------------------------------------------------------------
    def make_app(self, max_payload_bytes: int) -> web.Application:
        app = web.Application(client_max_size=max_payload_bytes, middlewares=[_json_errors])
        app[MAX_PAYLOAD_KEY] = max_payload_bytes
        r = app.router
        r.add_get("/v2", self.h_server)
        r.add_get("/v2/health/live", self.h_live)
        r.add_get("/v2/health/ready", self.h_ready)
        r.add_get("/metrics", self.h_metrics)
        for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            r.add_get(base, self.h_model)
            r.add_get(base + "/ready", self.h_model_ready)
            r.add_post(base + "/infer", self.h_infer)
        add_openapi_route(app, lambda: openapi_document({n: r.app for n, r in self.routes.items()},
                                                        self._output_specs, version=__version__,
                                                        backend_kind=self.backend_kind))
        return app

    async def h_server(self, request: web.Request) -> web.Response:
        return web.json_response({"name": "jigsaw", "version": __version__,
                                  "extensions": ["binary_tensor_data"]})

    async def h_live(self, request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    def is_ready(self) -> bool:
        return self.ready and not self.draining

    async def h_ready(self, request: web.Request) -> web.Response:
        ok = self.is_ready()
        return web.json_response({"ready": ok}, status=200 if ok else 503)

    def _routes(self, request: web.Request) -> AppRoutes:
        name = request.match_info["model"]
        routes = self.routes.get(name)
        if routes is None:
            raise web.HTTPNotFound(text=f"unknown model {name!r} (served: {', '.join(self.routes)})")
        version = request.match_info.get("version")
        if version is not None and version != "1":
            raise web.HTTPNotFound(text=f"model {name!r} has no version {version!r} (versions: 1)")
        return routes

    async def h_model(self, request: web.Request) -> web.Response:
        routes = self._routes(request)
        app = routes.app
        outputs = [{"name": f"{task}.{s.name}", "datatype": s.datatype, "shape": [-1, *s.shape[1:]]}
                   for task, specs in self._output_specs[app.name].items() for s in specs]
        return web.json_response({
            "name": app.name, "versions": ["1"], "platform": f"jigsaw_{self.backend_kind}",
            "inputs": [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in app.inputs],
            "outputs": outputs,
            "parameters": {"tasks": ",".join(app.task_names), "latency_slo_ms": app.latency_slo_ms,
                           "backend": self.backend_kind},
        })

    async def h_model_ready(self, request: web.Request) -> web.Response:
        routes = self._routes(request)
        ok = self.is_ready()
        return web.json_response({"name": routes.app.name, "ready": ok}, status=200 if ok else 503)

    async def h_infer(self, request: web.Request) -> web.Response:
        routes = self._routes(request)
        name = routes.app.name
        if not self.is_ready():
            self.metrics.failure.inc((("app", name), ("reason", "not_ready")))
            return _error(503, "server is not ready" if not self.draining else "server is shutting down",
                          headers={"Retry-After": RETRY_AFTER_S})
        body = await request.read()
        try:
            json_length = header_length(request.headers.get(HEADER_LENGTH), len(body))
            parsed = parse_infer_request(body, routes.app, json_length)
        except BadRequest as exc:
            self.metrics.failure.inc((("app", name), ("reason", "bad_request")))
            return _error(400, str(exc))
        if parsed.outputs is not None:
            known = {f"{t}.{s.name}" for t, specs in self._output_specs[name].items() for s in specs}
            unknown = [o for o in parsed.outputs if o not in known]
            if unknown:
                self.metrics.failure.inc((("app", name), ("reason", "bad_request")))
                return _error(400, f"outputs: unknown output {unknown[0]!r} (model {name} has "
                                   f"{', '.join(sorted(known))})")
        self.bins[name].arrivals += 1
        limit = min(self.max_queue, self.admit_limit.get(name, self.max_queue))
        if self.inflight[name] >= limit:
            self.bins[name].answered += 1
            self.bins[name].violations += 1
            self.metrics.failure.inc((("app", name), ("reason", "shed")))
            return _error(503, f"model {name!r} has {self.inflight[name]} requests in flight (limit {limit}: "
                               f"the smaller of max_queue {self.max_queue} and what its instances "
                               "finish within the SLO); retry later",
                          headers={"Retry-After": RETRY_AFTER_S})
        routes = self.routes.get(name, routes)  # a reconfiguration may have switched it during the read
        req = self.submit(routes, parsed.id, parsed.inputs, parsed.outputs)
        if isinstance(req, str):
            self.bins[name].answered += 1
            self.bins[name].violations += 1
            self.metrics.failure.inc((("app", name), ("reason", "shed")))
            return _error(503, f"{req}; retry later", headers={"Retry-After": RETRY_AFTER_S})
        status, doc = await req.future
        headers = {"Retry-After": RETRY_AFTER_S} if status == 503 else {}
        payload, json_part = encode_response(doc, parsed.binary_outputs, parsed.all_binary)
        if json_part is None:
            return web.Response(body=payload, status=status, headers=headers, content_type="application/json")
        headers[HEADER_LENGTH] = str(json_part)
        return web.Response(body=payload, status=status, headers=headers,
                            content_type="application/octet-stream")

    async def h_metrics(self, request: web.Request) -> web.Response:
        m = self.metrics
        now = time.monotonic_ns()
        for name, n in self.inflight.items():
            m.inflight.set((("app", name),), n)
        for g in self._gens.values():
            for p in g.topology.processes:
                labels = (("app", p.app), ("task", p.task), ("variant", p.variant), ("instance", p.name))
                started = g.stats.get(p.slot, st.STARTED_NS)
                busy = g.stats.get(p.slot, st.BUSY_NS)
                m.busy.set(labels, round(busy / (now - started), 6) if started and now > started else 0.0)
                m.instance_queue.set(labels, g.stats.get(p.slot, st.QUEUED))
        return web.Response(text=m.render(), content_type="text/plain", charset="utf-8",
                            headers={"X-Prometheus-Format": "0.0.4"})


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


@web.middleware
async def _json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every error an OIP client sees is JSON ``{"error": ...}``, also aiohttp's own 404/405/413."""
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[MAX_PAYLOAD_KEY]
        return _error(413, f"body: payload exceeds the limit of {limit} bytes (server.max_payload_bytes)")
    except web.HTTPMethodNotAllowed as exc:
        return _error(405, f"method {exc.method} not allowed on {request.path} "
                           f"(allowed: {', '.join(sorted(exc.allowed_methods))})",
                      headers={"Allow": ",".join(sorted(exc.allowed_methods))})
    except web.HTTPNotFound as exc:
        text = exc.text if exc.text and not exc.text.startswith("404") else f"no such path {request.path}"
        return _error(404, text)
