"""Triton's protocol extensions on HTTP: statistics, model config, repository, system shared memory.

The documents are built here once (``statistics``, ``config``), so the HTTP routes and the gRPC
front end (``grpc_server``) answer the same numbers; a gRPC answer is the same JSON parsed into
Triton's message. Routes (Triton's paths)::

    GET  /v2/models/stats, /v2/models/{app}[/versions/{v}]/stats      statistics
    GET  /v2/models/{app}[/versions/{v}]/config                       model configuration
    POST /v2/repository/index, /v2/repository/models/{app}/load|unload
    GET  /v2/systemsharedmemory[/region/{name}]/status
    POST /v2/systemsharedmemory/region/{name}/register, /v2/systemsharedmemory[/region/{name}]/unregister
    *    /v2/cudasharedmemory/...                                       400: no CUDA shared memory

Errors are the OIP's ``{"error": ...}``: 400 naming the field, 404 for an unknown app or region.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from jigsaw.runtime import model_stats as ms
from jigsaw.runtime.model_config import model_config
from jigsaw.runtime.repository import RepositoryError, StaticRepository
from jigsaw.runtime.shm_regions import ShmError

if TYPE_CHECKING:
    from jigsaw.runtime.http import OipHttp

REPOSITORY_STATUS = {"not_found": 404, "unavailable": 503, "invalid": 400}


class ExtError(Exception):
    """An extension call refused: HTTP status and message (``grpc_server`` maps the status)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _app_names(oip: OipHttp, model: str, version: str | None) -> list[str]:
    if not model:
        return list(oip.routing.routes)
    if model not in oip.routing.routes:
        raise ExtError(404, f"unknown model {model!r} (served: {', '.join(oip.routing.routes)})")
    if version not in (None, "", "1"):
        raise ExtError(404, f"model {model!r} has no version {version!r} (versions: 1)")
    return [model]


def statistics(oip: OipHttp, model: str = "", version: str | None = None) -> dict[str, Any]:
    """Triton's ``ModelStatisticsResponse`` JSON: every served app (``model`` empty) or one, each
    followed by its tasks as composing models (``model_stats``)."""
    m = oip.metrics
    dropped: dict[tuple[str, str], float] = {}
    for labels, v in m.dropped.values.items():
        d = dict(labels)
        key = (d.get("app", ""), d.get("task", ""))
        dropped[key] = dropped.get(key, 0.0) + v
    out = []
    for name in _app_names(oip, model, version):
        app = oip.routing.routes[name].app
        out.extend(ms.app_entries(m.models, name, app.topological_order,
                                  {t: n for (a, t), n in dropped.items() if a == name}))
    return {"model_stats": out}


def config(oip: OipHttp, model: str, version: str | None = None) -> dict[str, Any]:
    """Triton's ``ModelConfig`` JSON of one served app (``model_config``)."""
    if not model:
        raise ExtError(400, "name: the model whose config to return is missing")
    (name,) = _app_names(oip, model, version)
    routes = oip.routing.routes[name]
    outputs = {task: [(f"{task}.{s.name}", s.datatype, [-1, *s.shape[1:]]) for s in specs]
               for task, specs in oip.routing.output_specs[name].items()}
    return model_config(routes.app, outputs, routes.plan, generation=routes.generation,
                        backend=oip.backend_name)


def repository(oip: OipHttp) -> Any:
    return oip.repository or StaticRepository(list(oip.routing.routes), list(oip.routing.routes))


def repository_index(oip: OipHttp, ready_only: bool = False) -> list[dict[str, Any]]:
    """The repository's index; an app of the node that failed to load is ``UNAVAILABLE`` with why."""
    out = []
    for e in repository(oip).index():
        why = oip.state.failed_apps.get(e["name"])
        if why is not None:
            e = {**e, "state": "UNAVAILABLE", "reason": why}
        if not ready_only or e["state"] == "READY":
            out.append(e)
    return out


async def repository_call(oip: OipHttp, verb: str, model: str) -> None:
    if model in oip.state.failed_apps:
        raise ExtError(400, f"model {model!r} cannot {verb}: it failed to load at start-up "
                            f"({oip.state.failed_apps[model]}); fix it and restart the daemon")
    try:
        await getattr(repository(oip), verb)(model)
    except RepositoryError as exc:
        raise ExtError(REPOSITORY_STATUS.get(exc.kind, 400), str(exc)) from None


def shm_call(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except ShmError as exc:
        raise ExtError(404 if exc.not_found else 400, str(exc)) from None


async def _json_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ExtError(400, f"body: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ExtError(400, "body: expected a JSON object")
    return doc


async def _load_body(request: web.Request) -> None:
    """A load / unload body: nothing, or ``{"parameters": {...}}`` (none of Triton's is used here)."""
    body = await _json_body(request)
    if not isinstance(body.get("parameters", {}), dict):
        raise ExtError(400, "parameters: expected an object")


def add_routes(app: web.Application, oip: OipHttp) -> None:
    """Register the extension routes (before ``/v2/models/{model}``, which would take "stats")."""
    r = app.router

    def handler(fn: Any) -> Any:
        async def run(request: web.Request) -> web.Response:
            try:
                got = await fn(request)
            except ExtError as exc:
                return web.json_response({"error": str(exc)}, status=exc.status)
            return web.json_response(got if got is not None else {})
        return run

    async def stats(request: web.Request) -> Any:
        return statistics(oip, request.match_info.get("model", ""), request.match_info.get("version"))

    async def cfg(request: web.Request) -> Any:
        return config(oip, request.match_info["model"], request.match_info.get("version"))

    async def index(request: web.Request) -> Any:
        body = await _json_body(request)
        ready = body.get("ready", False)
        if not isinstance(ready, bool):
            raise ExtError(400, "ready: expected true or false")
        if not isinstance(body.get("repository_name", ""), str):
            raise ExtError(400, "repository_name: expected a string")
        return repository_index(oip, ready)

    async def load(request: web.Request) -> Any:
        await _load_body(request)
        await repository_call(oip, "load", request.match_info["model"])

    async def unload(request: web.Request) -> Any:
        await _load_body(request)
        await repository_call(oip, "unload", request.match_info["model"])

    async def shm_status(request: web.Request) -> Any:
        return shm_call(oip.shm.status, request.match_info.get("name"))

    async def shm_register(request: web.Request) -> Any:
        body = await _json_body(request)
        shm_call(oip.shm.register, request.match_info["name"], body.get("key"), body.get("offset", 0),
                 body.get("byte_size"))

    async def shm_unregister(request: web.Request) -> Any:
        shm_call(oip.shm.unregister, request.match_info.get("name"))

    async def cuda(request: web.Request) -> Any:
        raise ExtError(400, "CUDA shared memory is not supported by this server; use system shared memory "
                            "(/v2/systemsharedmemory)")

    r.add_get("/v2/models/stats", handler(stats))
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        r.add_get(base + "/stats", handler(stats))
        r.add_get(base + "/config", handler(cfg))
    r.add_post("/v2/repository/index", handler(index))
    r.add_post("/v2/repository/models/{model}/load", handler(load))
    r.add_post("/v2/repository/models/{model}/unload", handler(unload))
    r.add_get("/v2/systemsharedmemory/status", handler(shm_status))
    r.add_get("/v2/systemsharedmemory/region/{name}/status", handler(shm_status))
    r.add_post("/v2/systemsharedmemory/region/{name}/register", handler(shm_register))
    r.add_post("/v2/systemsharedmemory/unregister", handler(shm_unregister))
    r.add_post("/v2/systemsharedmemory/region/{name}/unregister", handler(shm_unregister))
    r.add_get("/v2/cudasharedmemory/status", handler(cuda))
    r.add_get("/v2/cudasharedmemory/region/{name}/status", handler(cuda))
    r.add_post("/v2/cudasharedmemory/region/{name}/register", handler(cuda))
    r.add_post("/v2/cudasharedmemory/unregister", handler(cuda))
    r.add_post("/v2/cudasharedmemory/region/{name}/unregister", handler(cuda))
