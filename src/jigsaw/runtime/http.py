"""The Open Inference Protocol (KServe v2) REST layer on aiohttp: parse, check, admit, answer.

Every handler validates its input (400 naming the field), asks admission whether the request may
enter (503 with ``Retry-After`` when shed, not ready or shutting down), hands it to the dispatcher
and encodes the single answer the dispatcher gives (JSON, or Triton's binary tensor extension).
Every error an OIP client sees is JSON ``{"error": ...}``, aiohttp's own 404/405/413 included.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from jigsaw import __version__
from jigsaw.runtime import stats as st
from jigsaw.runtime.admission import Admission, queue_admits
from jigsaw.runtime.compression import compress, response_encoding
from jigsaw.runtime.dispatch import Dispatcher, InputTooLarge, Pending
from jigsaw.runtime.metrics import Metrics
from jigsaw.runtime.oip import (
    HEADER_LENGTH,
    BadRequest,
    InferRequest,
    encode_response,
    header_length,
    parse_infer_request,
    place_outputs,
)
from jigsaw.runtime.openapi import add_openapi_route, openapi_document
from jigsaw.runtime.repository import Repository
from jigsaw.runtime.routing import RoutingTable
from jigsaw.runtime.shm_regions import SharedMemoryRegions
from jigsaw.runtime.topology import AppRoutes
from jigsaw.runtime.triton_ext import add_routes as add_extension_routes

EXTENSIONS = ("binary_tensor_data", "parameters", "statistics", "model_configuration", "model_repository",
              "system_shared_memory")  # Triton's names of the protocol extensions served (HTTP and gRPC)
RETRY_AFTER_S = "1"
DOOR_LOG_EVERY_S = 1.0  # the door's over-the-limit line in the daemon log, at most this often per app
MAX_PAYLOAD_KEY = web.AppKey("max_payload_bytes", int)
BODY_TIMEOUT_KEY = web.AppKey("body_timeout_s", float)


@dataclass
class ServingState:
    """Whether the node takes requests: ready once every worker is, draining once it stops.

    ``failed_apps``: the apps of the node that are not served (a model or transform that cannot
    load) and why. The others serve; ``/v2/models/{app}/ready`` of a failed one answers 503 with
    the reason, and ``/v2/health/ready`` is ready only when every app serves (Triton's default
    strict readiness: the server is ready when all its models are)."""

    ready: bool = False
    draining: bool = False
    failed_apps: dict[str, str] = field(default_factory=dict)

    def accepting(self) -> bool:
        return self.ready and not self.draining

    def all_ready(self) -> bool:
        """``/v2/health/ready``: accepting, and every app of the node serving."""
        return self.ready and not self.draining and not self.failed_apps


class OipHttp:
    """The OIP handlers over the routing table, admission and the dispatcher."""

    def __init__(self, routing: RoutingTable, admission: Admission, dispatcher: Dispatcher, metrics: Metrics,
                 state: ServingState, *, backend_name: str) -> None:
        self.routing = routing
        self.admission = admission
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.state = state
        self.backend_name = backend_name
        self._door_logged: dict[str, float] = {}  # app -> when its door line was last written
        self.extra_metrics: list[Callable[[], str]] = []  # more Prometheus text (the node's MIG counters)
        self.shm = SharedMemoryRegions()  # Triton's system shared memory regions (HTTP and gRPC)
        self.repository: Repository | None = None  # load / unload of apps (the daemon's controller)

    def make_app(self, max_payload_bytes: int, body_timeout_s: float = 30.0) -> web.Application:
        app = web.Application(client_max_size=max_payload_bytes, middlewares=[_json_errors])
        app[MAX_PAYLOAD_KEY] = max_payload_bytes
        app[BODY_TIMEOUT_KEY] = body_timeout_s
        r = app.router
        r.add_get("/v2", self.h_server)
        r.add_get("/v2/health/live", self.h_live)
        r.add_get("/v2/health/ready", self.h_ready)
        r.add_get("/metrics", self.h_metrics)
        add_extension_routes(app, self)  # (before /v2/models/{model}: "stats" is no model name)
        for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            r.add_get(base, self.h_model)
            r.add_get(base + "/ready", self.h_model_ready)
            r.add_post(base + "/infer", self.h_infer)
        add_openapi_route(app, lambda: openapi_document({n: r.app for n, r in self.routing.routes.items()},
                                                        self.routing.output_specs, version=__version__,
                                                        backend_kind=self.backend_name))
        return app

    async def h_server(self, request: web.Request) -> web.Response:
        return web.json_response({"name": "jigsaw", "version": __version__, "extensions": list(EXTENSIONS)})

    async def h_live(self, request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def h_ready(self, request: web.Request) -> web.Response:
        ok = self.state.all_ready()
        return web.json_response({"ready": ok}, status=200 if ok else 503)

    def find_routes(self, model: str, version: str | None) -> AppRoutes | Answer:
        """The app ``model`` names, or the 404 naming what is served (503 with the reason for an
        app of the node that failed to load)."""
        routes = self.routing.routes.get(model)
        if routes is None and model in self.state.failed_apps:
            return Answer(503, {"name": model, "ready": False,
                                "error": f"model {model!r} is not served: {self.state.failed_apps[model]}"})
        if routes is None:
            served = ", ".join(self.routing.routes)
            return Answer(404, {"error": f"unknown model {model!r} (served: {served})"})
        if version is not None and version != "1":
            return Answer(404, {"error": f"model {model!r} has no version {version!r} (versions: 1)"})
        return routes

    def _routes(self, request: web.Request) -> AppRoutes:
        got = self.find_routes(request.match_info["model"], request.match_info.get("version"))
        if isinstance(got, Answer):
            if got.status != 404:
                raise AnswerNow(got)
            raise web.HTTPNotFound(text=got.doc["error"])
        return got

    async def h_model(self, request: web.Request) -> web.Response:
        routes = self._routes(request)
        app = routes.app
        outputs = [{"name": f"{task}.{s.name}", "datatype": s.datatype, "shape": [-1, *s.shape[1:]]}
                   for task, specs in self.routing.output_specs[app.name].items() for s in specs]
        return web.json_response({
            "name": app.name, "versions": ["1"], "platform": f"jigsaw_{self.backend_name}",
            "inputs": [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in app.inputs],
            "outputs": outputs,
            "parameters": {"tasks": ",".join(app.task_names), "latency_slo_ms": app.latency_slo_ms,
                           "backend": self.backend_name},
        })

    async def h_model_ready(self, request: web.Request) -> web.Response:
        routes = self._routes(request)
        ok = self.state.accepting()
        return web.json_response({"name": routes.app.name, "ready": ok}, status=200 if ok else 503)

    def infer_door(self, routes: AppRoutes) -> Answer | None:
        """A 503 while the node is not ready or drains, before the body is read."""
        if self.state.accepting():
            return None
        self.metrics.failure.inc((("app", routes.app.name), ("reason", "not_ready")))
        why = "server is shutting down" if self.state.draining else "server is not ready"
        return Answer(503, {"error": why}, RETRY_HEADERS)

    def infer_begin(self, routes: AppRoutes, body: bytes, header_length_value: str | None
                    ) -> Answer | tuple[Pending, InferRequest]:
        """Parse and check an infer body, ask admission, dispatch: an answer now (400, 503), or
        the dispatched request (its future carries the answer) and the parsed request.

        Both HTTP front ends (this module's aiohttp handler and ``fasthttp``) call it.
        """
        name = routes.app.name
        try:
            json_length = header_length(header_length_value, len(body))
            parsed = parse_infer_request(body, routes.app, json_length, self.shm)
        except BadRequest as exc:
            self.metrics.failure.inc((("app", name), ("reason", "bad_request")))
            return Answer(400, {"error": str(exc)})
        return self.infer_submit(routes, parsed)

    def infer_submit(self, routes: AppRoutes, parsed: InferRequest) -> Answer | tuple[Pending, InferRequest]:
        """Check a parsed request's outputs, ask admission, dispatch (``infer_begin`` after its
        parse; the gRPC front end after its own): an answer now (400, 503) or the dispatched request."""
        name = routes.app.name
        if parsed.outputs is not None:
            known = {f"{t}.{s.name}" for t, specs in self.routing.output_specs[name].items() for s in specs}
            unknown = [o for o in parsed.outputs if o not in known]
            if unknown:
                self.metrics.failure.inc((("app", name), ("reason", "bad_request")))
                return Answer(400, {"error": f"outputs: unknown output {unknown[0]!r} (model {name} has "
                                             f"{', '.join(sorted(known))})"})
        door = self.admission
        door.arrived(name)
        generation = routes.generation if routes.admission_per_generation else None
        if door.full(name, generation) and not self._queue_admits(routes, parsed.timeout_us):
            door.answered(name, 503)
            self.metrics.failure.inc((("app", name), ("reason", "shed")))
            held = door.inflight[name] if generation is None else \
                door.by_generation.get(name, {}).get(generation, 0)
            return Answer(503, {"error": f"model {name!r} has {held} requests in flight "
                                         f"(limit {door.limit(name)}: the smaller of max_queue "
                                         f"{door.max_queue} and what its instances finish within the "
                                         "SLO); retry later"},
                          RETRY_HEADERS, "shed")
        routes = self.routing.routes.get(name, routes)  # a reconfiguration may have switched it meanwhile
        try:
            req = self.dispatcher.submit(routes, parsed.id, parsed.inputs, parsed.outputs,
                                         timeout_us=parsed.timeout_us)
        except InputTooLarge as exc:
            door.answered(name, 413)
            self.metrics.failure.inc((("app", name), ("reason", "bad_request")))
            return Answer(413, {"error": str(exc)})
        if isinstance(req, str):
            door.answered(name, 503)
            self.metrics.failure.inc((("app", name), ("reason", "shed")))
            # no live instance of a root task (a task of one process that failed, e.g. a MIG-instance
            # share), or every input ring full: an answer of the same form as the dispatcher's 503s
            return Answer(503, {"error": f"{req}; retry later", "status": "UNAVAILABLE", "task": None,
                                "reason": "shed"}, RETRY_HEADERS, "shed")
        return req, parsed

    def _queue_admits(self, routes: AppRoutes, timeout_us: int | None) -> bool:
        """A request over the in-flight limit: whether the work queued ahead of it leaves time for
        its deadline (``server.admission_backlog``, ``admission.queue_admits``); ``max_queue``
        bounds every app's requests whatever the queue."""
        name = routes.app.name
        if not routes.admission_backlog or self.admission.inflight[name] >= self.admission.max_queue:
            return False
        end_s = self.routing.queued_end_s(routes)
        budget_s = self.dispatcher.budget_ns(routes, timeout_us) / 1e9
        admitted = queue_admits(end_s, budget_s)
        door = self.admission
        door.over_limit_decided(name, admitted)
        now = time.monotonic()
        if now - self._door_logged.get(name, 0.0) >= DOOR_LOG_EVERY_S:  # a line a second at most
            self._door_logged[name] = now
            shed, taken = door.over_limit[name]
            queued = "unknown" if end_s is None else f"{end_s:.2f} s"
            print(f"jigsawd: {name}: door: over the in-flight limit {door.limit(name)} (generation "
                  f"{routes.generation}: {door.by_generation.get(name, {}).get(routes.generation, 0)}, all: "
                  f"{door.inflight[name]}), {shed} shed and {taken} admitted by their queue so far; "
                  f"now queued work and fastest path {queued} of a {budget_s:.2f} s deadline",
                  file=sys.stderr, flush=True)
        return admitted

    async def h_infer(self, request: web.Request) -> web.Response:
        routes = self._routes(request)
        shut = self.infer_door(routes)
        if shut is not None:
            return _error(shut)
        body = await _read_body(request)  # inflated by aiohttp (Content-Encoding), bounded by client_max_size
        if isinstance(body, Answer):
            resp = _error(body)
            resp.force_close()  # the rest of the body, if it ever comes, is not read
            return resp
        got = self.infer_begin(routes, body, request.headers.get(HEADER_LENGTH))
        if isinstance(got, Answer):
            return _error(got)
        req, parsed = got
        status, doc = await req.future
        if parsed.shm_outputs:
            status, doc = place_outputs(status, doc, parsed.shm_outputs, self.shm)
        headers = {"Retry-After": RETRY_AFTER_S} if status == 503 else {}
        payload, json_part = encode_response(doc, parsed.binary_outputs, parsed.all_binary)
        encoding = response_encoding(request.headers.get("Accept-Encoding"))
        if encoding is not None:
            payload = compress(payload, encoding)
            headers["Content-Encoding"] = encoding
        if json_part is None:
            return web.Response(body=payload, status=status, headers=headers, content_type="application/json")
        headers[HEADER_LENGTH] = str(json_part)
        return web.Response(body=payload, status=status, headers=headers,
                            content_type="application/octet-stream")

    async def h_metrics(self, request: web.Request) -> web.Response:
        m = self.metrics
        now = time.monotonic_ns()
        for name, n in self.admission.inflight.items():
            m.inflight.set((("app", name),), n)
        for p, stats in self.routing.processes():
            labels = (("app", p.app), ("task", p.task), ("variant", p.variant), ("instance", p.name))
            started = stats.get(p.slot, st.STARTED_NS)
            busy = stats.get(p.slot, st.BUSY_NS)
            m.busy.set(labels, round(busy / (now - started), 6) if started and now > started else 0.0)
            m.instance_queue.set(labels, stats.get(p.slot, st.QUEUED))
        text = m.render() + "".join(f() for f in self.extra_metrics)
        return web.Response(text=text, content_type="text/plain", charset="utf-8",
                            headers={"X-Prometheus-Format": "0.0.4"})


@dataclass
class Answer:
    """An answer given without dispatching: an error body (``{"error": ...}``) and its status."""

    status: int
    doc: dict[str, Any]
    headers: dict[str, str] | None = None
    reason: str = ""  # "shed": a 503 of the door (gRPC RESOURCE_EXHAUSTED), not of readiness


RETRY_HEADERS = {"Retry-After": RETRY_AFTER_S}


async def _read_body(request: web.Request) -> bytes | Answer:
    """The request's body, or the answer when it does not arrive within ``body_timeout_s`` (408)
    or is not valid for its ``Content-Encoding`` (400)."""
    limit_s = request.app[BODY_TIMEOUT_KEY]
    try:
        async with asyncio.timeout(limit_s):
            return await request.read()
    except TimeoutError:
        return Answer(408, {"error": f"request timeout: its body did not arrive within {limit_s:g} s "
                                     "(server.body_timeout_s)"})
    except (HttpProcessingError, RequestPayloadError) as exc:
        cause = exc.__cause__ or exc.__context__ or exc
        return Answer(400, {"error": f"body: not valid for its Content-Encoding ({cause})"})


class AnswerNow(Exception):
    """Raised by a handler to answer ``answer`` at once (``_json_errors`` writes it)."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(answer.doc.get("error", ""))
        self.answer = answer


def _error(answer: Answer) -> web.Response:
    return web.json_response(answer.doc, status=answer.status, headers=answer.headers)


@web.middleware
async def _json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every error an OIP client sees is JSON ``{"error": ...}``, also aiohttp's own 404/405/413."""
    try:
        return await handler(request)
    except AnswerNow as exc:
        return _error(exc.answer)
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[MAX_PAYLOAD_KEY]
        return _error(Answer(413, {"error": payload_too_large(limit)}))
    except web.HTTPMethodNotAllowed as exc:
        return _error(Answer(405, {"error": f"method {exc.method} not allowed on {request.path} "
                                            f"(allowed: {', '.join(sorted(exc.allowed_methods))})"},
                             {"Allow": ",".join(sorted(exc.allowed_methods))}))
    except web.HTTPNotFound as exc:
        text = exc.text if exc.text and not exc.text.startswith("404") else f"no such path {request.path}"
        return _error(Answer(404, {"error": text}))


def payload_too_large(limit: int) -> str:
    return f"body: payload exceeds the limit of {limit} bytes (server.max_payload_bytes)"
