"""``/admin/*``: the running plans and the per-bin history, for operators and ``bench/replay.py``.

Access: loopback clients only, unless a bearer token is configured; with a token every admin
request must carry ``Authorization: Bearer <token>`` (401 otherwise, also from loopback).
Without a token a non-loopback client gets 403.

- ``GET /admin/plan``: ``{app: {"generation", "summary", "plan": plan JSON}}`` of the plans serving now.
- ``GET /admin/layout``: the node's one layout, all apps (``instances``: GPU, start, profile, app,
  task, variant, MPS level, UUID), the MIG instances that exist and the MIG changes made
  (``mig.events``, failures and their roll-backs included).
- ``GET /admin/history[?app=A][&current=1]``: ``{app: [bin records]}`` (see ``controller.BinRecord``;
  ``current=1`` appends the bin in progress). Every node re-plan that finished in a bin is in its
  ``replans`` (trigger, the app's demand, the quick and the exact plan: slices, seconds, deployed).
  A re-plan the node could not apply (it does not fit beside the other apps, or NVML failed and was
  rolled back) is in ``reconfiguration_errors``.
- ``GET /admin/workers``: ``{"workers": [...], "events": [...]}``: every worker's state and pid,
  and the supervisor's failure events (see ``runtime.supervisor.WorkerEvent``).
- ``POST /admin/control`` ``{"app", "history_rps": [...]?, "replan_rps": X?, "restart_bins": bool?}``:
  seed the app's predictor history, re-plan the node now with the app at ``replan_rps`` (as
  asked: no burst floor) or its prediction (the other apps at the demand they were planned
  for), and/or start bin 0 of every app now; answers once the new plans serve. A replay uses it
  to align its bins with the daemon's.
"""

from __future__ import annotations

import hmac
import ipaddress

from aiohttp import web

from jigsaw.control.controller import AppController, plan_summary
from jigsaw.gpu.layout import NodeInstance
from jigsaw.runtime.generations import GenerationManager
from jigsaw.runtime.supervisor import Supervisor

CONTROLLERS_KEY = web.AppKey("controllers", dict[str, AppController])
GENERATIONS_KEY = web.AppKey("generations", GenerationManager)
TOKEN_KEY = web.AppKey("admin_token", str)
SUPERVISOR_KEY = web.AppKey("supervisor", Supervisor)


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def _deny(request: web.Request) -> web.Response | None:
    token = request.app.get(TOKEN_KEY, "")
    if token:
        got = request.headers.get("Authorization", "")
        if not got.startswith("Bearer ") or not hmac.compare_digest(got[7:].encode(), token.encode()):
            return web.json_response({"error": "admin endpoints need Authorization: Bearer <token>"},
                                     status=401, headers={"WWW-Authenticate": "Bearer"})
        return None
    if not is_loopback(request.remote):
        return web.json_response({"error": "admin endpoints answer loopback clients only (set "
                                           "--admin-token to allow others)"}, status=403)
    return None


def add_admin_routes(app: web.Application, generations: GenerationManager,
                     controllers: dict[str, AppController], supervisor: Supervisor, token: str = "") -> None:
    """Register the admin handlers on the frontend's application."""
    app[CONTROLLERS_KEY] = controllers
    app[GENERATIONS_KEY] = generations
    app[TOKEN_KEY] = token
    app[SUPERVISOR_KEY] = supervisor
    app.router.add_get("/admin/workers", h_workers)
    app.router.add_get("/admin/plan", h_plan)
    app.router.add_get("/admin/layout", h_layout)
    app.router.add_get("/admin/history", h_history)
    app.router.add_post("/admin/control", h_control)


async def h_plan(request: web.Request) -> web.Response:
    if (denied := _deny(request)) is not None:
        return denied
    generations = request.app[GENERATIONS_KEY]
    out = {}
    for name in generations.apps:
        plan = generations.plan_of(name)
        out[name] = {"generation": generations.generation_of(name), "summary": plan_summary(plan),
                     "plan": plan.to_json_dict()}
    return web.json_response(out)


async def h_layout(request: web.Request) -> web.Response:
    """The node's one layout (all apps), what MIG instances exist, and the MIG changes made."""
    if (denied := _deny(request)) is not None:
        return denied
    generations = request.app[GENERATIONS_KEY]
    layout = generations.node_layout
    processes = generations.processes()
    mps = None if generations.mps is None else {
        "daemons": [{"gpu": s[0], "start": s[1], "profile": s[2], "directory": str(d.directory)}
                    for s, d in sorted(generations.mps.daemons.items())],
        "events": generations.mps_daemons.events[-200:]}
    if layout is None:
        return web.json_response({"gpu_model": generations.node.gpu.name, "instances": [], "mig": None,
                                  "processes": processes, "mps": mps, "applied": generations.applied})
    pids: dict[tuple[int, int], list[int]] = {}
    for p in processes:
        if p["gpu"] is not None and generations.current.get(p["app"]) in p["generations"]:
            pids.setdefault((p["gpu"], p["start"]), []).append(p["pid"])

    def inst(i: NodeInstance) -> dict[str, object]:
        return {"gpu": i.gpu, "start": i.start, "profile": i.profile, "app": i.app, "task": i.task,
                "variant": i.variant, "mps": i.mps, "max_batch": i.max_batch, "index": i.index,
                "seat": i.seat, "uuid": i.uuid, "pids": sorted(pids.get((i.gpu, i.start), []))}
    part = generations.partition
    return web.json_response({
        "gpu_model": layout.gpu_model, "num_gpus": layout.num_gpus,
        "instances": [inst(i) for i in layout.instances],
        "mig": None if part is None else {
            "existing": [inst(i) for _, i in sorted(part.existing.items())],
            "events": part.events,
            # the emulated NVML's call log (function, GPU, detail): the sequence a GPU node would run
            "calls": [list(c) for c in getattr(part.applier.nvml, "calls", [])] or None},
        "processes": processes, "mps": mps, "applied": generations.applied,
    })


async def h_workers(request: web.Request) -> web.Response:
    if (denied := _deny(request)) is not None:
        return denied
    sup = request.app[SUPERVISOR_KEY]
    return web.json_response({"workers": sup.workers(), "events": [e.to_json() for e in sup.events],
                              "fork_server": sup.fork_server()})


async def h_history(request: web.Request) -> web.Response:
    if (denied := _deny(request)) is not None:
        return denied
    controllers = request.app[CONTROLLERS_KEY]
    want = request.query.get("app")
    if want is not None and want not in request.app[GENERATIONS_KEY].apps:
        return web.json_response({"error": f"unknown app {want!r}"}, status=404)
    current = request.query.get("current") in ("1", "true")  # append the bin in progress
    return web.json_response({name: c.history() + ([c.current.to_json()] if current else [])
                              for name, c in controllers.items() if want is None or name == want})


async def h_control(request: web.Request) -> web.Response:
    if (denied := _deny(request)) is not None:
        return denied
    try:
        body = await request.json()
    except ValueError:
        return web.json_response({"error": "body: expected a JSON object"}, status=400)
    if not isinstance(body, dict):
        return web.json_response({"error": "body: expected a JSON object"}, status=400)
    controllers = request.app[CONTROLLERS_KEY]
    name = body.get("app")
    c = controllers.get(name)
    if c is None:
        why = "the controller is off (--no-controller or --plan)" if not controllers else \
            f"unknown app {name!r} (controlled: {', '.join(controllers)})"
        return web.json_response({"error": why}, status=404 if controllers else 409)
    history = body.get("history_rps")
    if history is not None and (not isinstance(history, list)
                                or not all(isinstance(x, (int, float)) and x >= 0 for x in history)):
        return web.json_response({"error": "history_rps: expected a list of numbers >= 0"}, status=400)
    target = body.get("replan_rps")
    if target is not None and (not isinstance(target, (int, float)) or target < 0):
        return web.json_response({"error": "replan_rps: expected a number >= 0"}, status=400)
    if history is not None:
        c.history_rps.clear()
        c.history_rps.extend(float(x) for x in history)
    if target is not None or history is not None:
        demand = float(target) if target is not None else c.predictor.predict(list(c.history_rps))
        await c.replan(demand, as_asked=target is not None)
    if body.get("restart_bins"):
        # seeded again: a bin that closed while the re-plan above ran appended its demand after the
        # seed, and every later bin's history index was one ahead of the trace's (the recurring-
        # spike predictor then planned each spike a bin early and the spike bin for the quiet level)
        c.restart_bins(history)
    generation = request.app[GENERATIONS_KEY].generation_of(name)
    return web.json_response({"app": name, "plan": plan_summary(c.plan), "generation": generation,
                              "predicted_rps": c.predicted_rps})
