"""``jigsawd``: the serving node - plans (or loads) a configuration, starts the workers, serves OIP.

    jigsawd --node-config examples/h100x4.toml --emulate [--host H] [--port P]
            [--demand RPS | --plan plan.json ...] [--apps a,b] [--time-scale K]
            [--space ast|as|at|st|...] [--no-controller] [--bin-seconds S] [--admin-token T]

The controller (``jigsaw.control``) re-plans every bin and swaps generations of workers;
``--plan`` and ``--no-controller`` keep the initial plans. ``/admin/*`` (loopback, or a bearer
token) exposes the plans and the per-bin history.

Lifecycle: remove leftovers of daemons killed with -9 (``cleanup_stale``); plan every app;
create every ring, doorbell and the stats block through one ``SegmentRegistry``; start one
worker process per planned process, all at once; serve once every worker is ready.
SIGINT/SIGTERM: answer new requests 503, drain in-flight ones (bounded), stop the workers,
unlink every segment. Exit status 2 for a usage or configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from jigsaw.app import App
from jigsaw.backends.registry import EMULATED, BackendKind, backend_kind
from jigsaw.control.controller import ANYTIME_MODES
from jigsaw.control.predictor import burst_floor_rps
from jigsaw.errors import JigsawError
from jigsaw.node import HTTP_FRONTS, Node, load_node, load_node_profiles
from jigsaw.plan import NodePlan, Plan
from jigsaw.runtime.forkserver import ForkServer, preload_modules
from jigsaw.runtime.forkserver import prometheus as fork_server_prometheus
from jigsaw.runtime.generations import GenerationManager
from jigsaw.runtime.repository import StaticRepository
from jigsaw.runtime.rings import cleanup_stale
from jigsaw.runtime.topology import TopologyError
from jigsaw.spaces import SPACES

DEFAULT_DEMAND_RPS = 10.0
PLAN_TIME_LIMIT_S = 5.0
READY_TIMEOUT_S = 120.0
DRAIN_TIMEOUT_S = 10.0
OWN_FILES = 1024  # the node's own open files beside its clients' connections (rings, doorbells, pipes)
GRPC_GRACE_S = 5.0  # stopping: gRPC calls in flight get this long


def _log(msg: str) -> None:
    print(f"jigsawd: {msg}", file=sys.stderr, flush=True)


def gpu_available() -> bool:
    """True when torch sees a CUDA device. Asked through NVML, so the daemon does not initialise
    CUDA itself (its workers are started from it); without torch there is no GPU path."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:
        return False


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="jigsawd",
                                description="Serve compound inference apps (OIP/KServe v2 REST).")
    p.add_argument("--node-config", required=True, type=Path, help="node TOML file (lists the apps)")
    p.add_argument("--emulate", action="store_true",
                   help="run the emulated backend (profile latencies, no GPU); results are labelled emulated")
    p.add_argument("--host", default=None, help="bind address (default: the node's server.host)")
    p.add_argument("--port", type=int, default=None, help="port (default: the node's server.port)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--demand", type=float, default=None,
                     help=f"plan each app for this many requests/s (default {DEFAULT_DEMAND_RPS:g})")
    src.add_argument("--plan", type=Path, action="append", default=None,
                     help="serve this plan JSON instead of planning (repeatable, one per app)")
    p.add_argument("--apps", default=None, help="comma-separated app names to serve (default: all)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply emulated latencies, SLOs and planned times by this factor")
    p.add_argument("--plan-time-limit", type=float, default=PLAN_TIME_LIMIT_S,
                   help="planner time limit of the start-up node plan (s)")
    p.add_argument("--seed", type=int, default=0, help="seed of lane draws and emulated outputs")
    p.add_argument("--space", default=None, choices=SPACES,
                   help="search space of every plan, initial and re-planned (default: planner.space)")
    ctl = p.add_mutually_exclusive_group()
    ctl.add_argument("--no-controller", action="store_true",
                     help="keep the initial plans (no per-bin re-planning); the default with --plan")
    ctl.add_argument("--controller", action="store_true",
                     help="re-plan every bin also when started from --plan files")
    p.add_argument("--anytime", choices=ANYTIME_MODES, default="auto",
                   help="deploy the planner's quick verified plan before the exact one: when it is "
                        "needed (auto: an early re-plan, or the exact plan late for the bin boundary), "
                        "always, or off")
    p.add_argument("--bin-seconds", type=float, default=None,
                   help="controller bin length in wall seconds (default: the node's control.bin_seconds)")
    p.add_argument("--admin-token", default=None,
                   help="bearer token guarding /admin/* (default: env JIGSAW_ADMIN_TOKEN; none: loopback)")
    p.add_argument("--http", choices=HTTP_FRONTS, default=None,
                   help="HTTP front end (default: the node's server.http): fast (the hot OIP routes on "
                        "httptools, the rest on aiohttp) or aiohttp")
    p.add_argument("--grpc-port", type=int, default=None,
                   help="Triton's gRPC inference service port (default: the node's server.grpc_port; 0: off)")
    return p.parse_args(argv)


def _read_plans(paths: list[Path]) -> list[Plan]:
    plans = []
    for path in paths:
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            raise JigsawError(f"{path}: no such plan file") from None
        except json.JSONDecodeError as exc:
            raise JigsawError(f"{path}: not valid JSON: {exc}") from None
        for d in doc if isinstance(doc, list) else [doc]:
            plans.append(Plan.from_json_dict(d, str(path)))
    return plans


def wanted_apps(node: Node, args: argparse.Namespace) -> list[App]:
    """The apps to serve: every app of the node, or those ``--apps`` names."""
    wanted = None if args.apps is None else [a.strip() for a in args.apps.split(",") if a.strip()]
    names = {a.name for a in node.apps}
    for w in wanted or []:
        if w not in names:
            raise JigsawError(f"--apps: unknown app {w!r} (node {node.name} has {', '.join(sorted(names))})")
    return [a for a in node.apps if wanted is None or a.name in wanted]


def failed_apps(apps: list[App], backend: BackendKind) -> dict[str, str]:
    """app -> why it cannot be served (a model or transform that does not load, ``models/check``):
    logged; the node serves the others and answers the app's readiness 503 with the reason."""
    if not backend.runs_models:
        return {}
    from jigsaw.models.check import app_problems
    failed = app_problems(apps, backend.name)
    for name, why in failed.items():
        _log(f"{name}: not served: {why}")
    if failed and len(failed) == len(apps):
        raise JigsawError(f"no app can be served ({'; '.join(failed.values())})")
    return failed


def choose_plans(node: Node, args: argparse.Namespace, skip: Collection[str] = ()) -> list[tuple[App, Plan]]:
    """The (app, plan) pairs to serve, from ``--plan`` files or by planning all the apps served
    (every app of the node, or ``--apps``, less ``skip``: those that cannot load) in one decision
    over the node's slices (``plan_node``), with the objective of the node config: what
    ``jigsaw plan --node N --demand a=R,b=R`` prints."""
    wanted = None if args.apps is None else [a.strip() for a in args.apps.split(",") if a.strip()]
    names = {a.name for a in node.apps}
    for w in wanted or []:
        if w not in names:
            raise JigsawError(f"--apps: unknown app {w!r} (node {node.name} has {', '.join(sorted(names))})")
    if skip:
        wanted = [a.name for a in node.apps if (wanted is None or a.name in wanted) and a.name not in skip]
    if args.plan:
        out = []
        for plan in _read_plans(args.plan):
            if plan.app not in names:
                raise JigsawError(f"plan for {plan.app!r}: not an app of node {node.name}")
            if wanted is None or plan.app in wanted:
                _refuse_unserving(node.app(plan.app), plan)
                out.append((node.app(plan.app), plan))
        if not out:
            raise JigsawError("no plan left to serve (check --apps against the plans' apps)")
        return out
    apps = [a for a in node.apps if wanted is None or a.name in wanted]
    if not apps:
        raise JigsawError(f"node {node.name} lists no apps")
    profiles = load_node_profiles(node, apps)
    from jigsaw.control.solver import solve_node
    from jigsaw.planner.node_plan import prefer_quick
    demand = DEFAULT_DEMAND_RPS if args.demand is None else args.demand
    quick: list[NodePlan] = []
    # without --demand the demand is a guess: a plan the controller will manage then holds a small
    # burst from the start (control.burst_requests); an explicit --demand is planned as asked
    guess = args.demand is None and not args.no_controller
    burst = node.control.burst_requests
    demands = {a.name: max(demand, burst_floor_rps(a.latency_slo_ms, burst) if guess else 0.0) for a in apps}
    result = solve_node(apps, node, profiles, demands, space=args.space, previous=None,
                        time_limit_s=args.plan_time_limit, factors=None, on_quick=quick.append)
    if quick and prefer_quick(quick[0], result, node):
        _log(f"node {node.name}: the exact solve stopped {result.status} short of the verified quick plan "
             f"({quick[0].slices_used} slices); serving the quick plan")
        quick[0].notes.append(f"the exact solve stopped {result.status} short of this verified plan")
        result = quick[0]
    missing = [a.name for a in apps if a.name not in result.plans or not result.plans[a.name].instances]
    if missing:
        notes = [*result.notes, *(n for a in missing if a in result.plans for n in result.plans[a].notes)]
        raise JigsawError(f"{', '.join(missing)}: the planner found no configuration that serves any "
                          f"demand ({result.status}; {'; '.join(dict.fromkeys(notes))})")
    for a in apps:
        _refuse_unserving(a, result.plans[a.name])
    _log(f"node {node.name}: {len(apps)} apps planned in one decision (objective {result.objective_kind}, "
         f"{result.status}), {result.slices_used}/{result.slices_available} slices, "
         f"{result.solve_seconds:.2f} s")
    for note in result.notes:
        _log(f"node {node.name}: {note}")
    out = []
    for app in apps:
        p = result.plans[app.name]
        _log(f"{app.name}: planned {p.planned_rps:g} rps, {p.slices_used:g} slices, "
             f"{sum(i.count * i.mps for i in p.instances)} processes, accuracy {p.accuracy:.3f}")
        for note in p.notes:
            _log(f"{app.name}: {note}")
        out.append((app, p))
    return out


def _refuse_unserving(app: App, plan: Plan) -> None:
    """A plan that serves nothing is refused at start with its reason: a task without instances
    (no lane could reach it) or no rate planned, with the planner's notes on why."""
    idle = [t for t in app.task_names if not any(i.task == t and i.count > 0 for i in plan.instances)]
    if not idle and plan.planned_rps > 0 and plan.lanes:
        return
    what = (f"task{'s' if len(idle) > 1 else ''} {', '.join(idle)} found no segment" if idle
            else "it plans no rate on any lane")
    notes = "; ".join(plan.notes)
    raise JigsawError(f"{app.name}: the plan serves nothing: {what}{f' ({notes})' if notes else ''}")


async def serve(generations: GenerationManager, sock: socket.socket, *, time_scale: float, seed: int,
                controller: bool = False, space: str | None = None, bin_seconds: float | None = None,
                admin_token: str = "", node_config: Path | None = None, anytime: str = "auto",
                failed: dict[str, str] | None = None) -> None:
    """Serve OIP until SIGINT/SIGTERM: the frontend, the supervisor, the controllers, ``/admin``;
    ``failed``: the apps not served and why (their readiness answers 503 with it)."""
    from concurrent.futures import ThreadPoolExecutor

    from jigsaw.control.admin import add_admin_routes, is_loopback
    from jigsaw.runtime.supervisor import Supervisor
    node = generations.node
    fe = _frontend(generations, time_scale=time_scale, seed=seed, failed=failed)
    loop = asyncio.get_running_loop()
    fe.start(loop)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    web_app = fe.make_app(node.server.max_payload_bytes, node.server.body_timeout_s)
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="planner")
    ctl, solver = _node_controller(generations, fe, executor, controller=controller, space=space,
                                   bin_seconds=bin_seconds, time_scale=time_scale,
                                   node_config=node_config, anytime=anytime)
    controllers = ctl.apps if ctl is not None else {}
    host, port = sock.getsockname()[:2]
    fe.http.repository = _repository(node, generations, ctl)
    if not admin_token and not is_loopback(host):
        _log(f"{host} is not a loopback address: /admin/* answers loopback clients only "
             f"(set --admin-token or JIGSAW_ADMIN_TOKEN to allow others)")
    generations.on_capacity_lost = _capacity_lost_handler(ctl)
    supervisor = Supervisor(generations, generations, node.server, log=_log)
    add_admin_routes(web_app, generations, controllers, supervisor, admin_token)
    runner = fe.runner(web_app, node.server)
    await runner.setup()
    grpc_server = None
    try:
        site = fe.site(runner, sock, node.server)
        await site.start()
        if node.server.grpc_port:
            from jigsaw.runtime.grpc_server import start_grpc
            grpc_server = await start_grpc(fe.http, host, node.server.grpc_port,
                                           node.server.max_payload_bytes)
        fe.state.ready = True
        if ctl is not None:
            ctl.start()
        _log_serving(generations, ctl, host, port, space=space, bin_seconds=bin_seconds,
                     anytime=anytime, grpc_on=grpc_server is not None)
        await _serve_until_stopped(fe, generations, ctl, supervisor, stop)
    finally:
        supervisor.stop()
        if supervisor.ended_while_stopping:
            _log(f"{supervisor.ended_while_stopping} worker processes had ended on the stop signal")
        if ctl is not None:
            await ctl.stop()
        await generations.stop_retiring()
        if grpc_server is not None:
            await grpc_server.stop(GRPC_GRACE_S)
        fe.http.shm.close()
        await runner.cleanup()
        fe.close()
        executor.shutdown(wait=False, cancel_futures=True)
        if solver is not None:
            solver.close()


def _frontend(generations: GenerationManager, *, time_scale: float, seed: int,
              failed: dict[str, str] | None) -> Any:
    """The node's ``Frontend``, attached to its generations, with their metrics on ``/metrics``."""
    from jigsaw.runtime.frontend import Frontend
    node = generations.node
    fe = Frontend(generations.backend, max_queue=node.server.max_queue,
                  hop_latency_ms=node.planner.hop_latency_ms, time_scale=time_scale, seed=seed)
    generations.attach(fe)
    fe.state.failed_apps = dict(failed or {})
    if generations.partition is not None:
        fe.http.extra_metrics.append(generations.partition.stats.prometheus)
    fe.http.extra_metrics.append(generations.prometheus)
    fe.http.extra_metrics.append(lambda: fork_server_prometheus(generations.launcher))
    return fe


def _node_controller(generations: GenerationManager, fe: Any, executor: Any, *, controller: bool,
                     space: str | None, bin_seconds: float | None, time_scale: float,
                     node_config: Path | None, anytime: str) -> tuple[Any, Any]:
    """The ``NodeController`` (None for static plans) and the subprocess solver it plans with (None
    without a node file to hand the child: it then plans in the planner thread)."""
    from jigsaw.control.controller import NodeController, default_solver
    from jigsaw.control.solver import SubprocessSolver, grace_for_bins
    node = generations.node
    grace_s = grace_for_bins(bin_seconds or node.control.bin_seconds, node.control.solver_grace_bins)
    solver = SubprocessSolver(node_config, grace_s=grace_s) \
        if controller and node_config is not None else None
    if solver is not None:
        solver.start()  # its idle time's precompute begins with the first bin, not at its end
    ctl: NodeController | None = None
    if controller:
        ctl = NodeController([node.app(name) for name in generations.apps], generations, fe, space=space,
                             bin_seconds=bin_seconds or node.control.bin_seconds, time_scale=time_scale,
                             executor=executor, log=_log, solver=solver or default_solver, anytime=anytime)
        fe.http.extra_metrics.append(ctl.stats.prometheus)
    return ctl, solver


def _capacity_lost_handler(ctl: Any) -> Callable[[str, str], None]:
    """What the runtime calls when an app loses capacity: re-plan through the controller, or say
    that a static plan cannot."""
    def capacity_lost(app: str, why: str) -> None:
        if ctl is not None:
            ctl.on_capacity_lost(app, why)
        else:
            _log(f"{app}: capacity lost ({why}) and no controller to re-plan (static plan)")
    return capacity_lost


def _log_serving(generations: GenerationManager, ctl: Any, host: str, port: int, *, space: str | None,
                 bin_seconds: float | None, anytime: str, grpc_on: bool) -> None:
    """The one line that says the node is up: apps, addresses, workers, backend, control."""
    node = generations.node
    what = (f"node controller on (space {space or node.planner.space}, "
            f"objective {node.planner.objective}, "
            f"bins of {bin_seconds or node.control.bin_seconds:g} s, anytime {anytime})"
            if ctl is not None else "static plans")
    grpc_at = f" and grpc://{host}:{node.server.grpc_port}" if grpc_on else ""
    _log(f"serving {', '.join(generations.apps)} on http://{host}:{port}{grpc_at} with "
         f"{generations.num_processes()} worker processes (backend: {generations.backend.name}; {what})")


async def _serve_until_stopped(fe: Any, generations: GenerationManager, ctl: Any, supervisor: Any,
                               stop: asyncio.Event) -> None:
    """Supervise the workers until ``stop``; then stop re-planning and drain in-flight requests
    (bounded by ``DRAIN_TIMEOUT_S``), still supervising."""
    from jigsaw.runtime.supervisor import POLL_S

    def supervise() -> None:
        try:
            supervisor.check()
        except Exception as exc:  # a supervisor bug must not take the node down with it
            _log(f"supervisor: {type(exc).__name__}: {exc}")
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), POLL_S)
        supervise()
    supervisor.begin_stopping()
    _log("stopping: draining in-flight requests")
    if ctl is not None:
        await ctl.stop()
    await generations.stop_retiring()
    fe.state.draining = True
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while fe.num_pending() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        supervise()
    if fe.num_pending():
        _log(f"{fe.num_pending()} requests still in flight after {DRAIN_TIMEOUT_S:g} s")


def _repository(node: Node, generations: GenerationManager, ctl: Any) -> Any:
    """Triton's repository of the node's apps: load / unload through the controller, or static."""
    node_apps = [a.name for a in node.apps]
    if ctl is None:
        return StaticRepository(node_apps, list(generations.apps))
    from jigsaw.control.repository import ControllerRepository
    return ControllerRepository(ctl, node_apps)


def start_fork_server(backend: BackendKind) -> ForkServer | None:
    """The fork server workers are forked from, its imports done; None (each worker then starts
    Python) when it cannot be started."""
    fs = ForkServer(preload_modules(backend.class_path, backend.needs_gpu), log=_log)
    t0 = time.monotonic()
    try:
        if fs.start():
            _log(f"fork server ready (pid {fs.pid}, {time.monotonic() - t0:.2f} s): workers are forked")
            return fs
    except OSError as exc:
        _log(f"fork server not started ({exc}): workers start Python each")
        fs.close()
        return None
    _log("fork server not ready: workers start Python each")
    fs.close()
    return None


def listen_socket(host: str, port: int) -> socket.socket:
    """The node's socket, bound to ``host:port`` now (``httplimits.bind_listener``): a
    ``JigsawError`` naming the address when it is taken."""
    from jigsaw.runtime.httplimits import bind_listener
    try:
        sock = bind_listener(host, port)
    except OSError as exc:
        why = ("the port is in use (another jigsawd or server?)" if exc.errno == errno.EADDRINUSE
               else exc.strerror)
        raise JigsawError(f"cannot listen on {host}:{port}: {why}; choose another with --port or "
                          "[server] port") from None
    return sock


EXPORT_SCRIPT = "import sys\nfrom jigsaw.models.export import export\nfor v in sys.argv[1:]:\n    export(v)\n"


def export_models(plans: list[tuple[App, Plan]]) -> None:
    """Export the zoo models the planned workers will load and the cache lacks, once, saying so:
    each worker would otherwise export its own copy, silently, before the node is ready. In a
    child process: torch stays out of the daemon."""
    from jigsaw.models.export import cache_dir, exportable, graph_names, onnx_path
    planned = {(i.task, i.variant) for _, p in plans for i in p.instances}
    missing = list(dict.fromkeys(
        v.resolved.zoo for a, _ in plans for t in a.tasks for v in t.variants
        if (t.name, v.name) in planned and v.resolved is not None and v.resolved.zoo
        and exportable(v.resolved.zoo)
        and not all(onnx_path(v.resolved.zoo, None, g).exists() for g in graph_names(v.resolved.zoo))))
    if not missing:
        return
    _log(f"exporting {', '.join(missing)} to ONNX (first start only; cached in {cache_dir()}): "
         "this can take a minute")
    t0 = time.monotonic()
    for zoo_name in missing:
        done = subprocess.run([sys.executable, "-c", EXPORT_SCRIPT, zoo_name], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, check=False)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise JigsawError(f"{zoo_name}: the ONNX export failed: {last}")
        _log(f"exported {zoo_name} ({time.monotonic() - t0:.1f} s so far)")


def allow_open_files(max_connections: int) -> None:
    """Raise the soft open-file limit so ``max_connections`` clients fit beside the node's own
    files (rings, doorbells, pipes): past it accept() fails and every new client waits."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max_connections + OWN_FILES
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
    if soft != resource.RLIM_INFINITY and soft < want:
        _log(f"open files are limited to {soft} (ulimit -n): fewer than server.max_connections "
             f"{max_connections} clients can connect at once")


def choose_backend(node_config: Path, emulate: bool) -> BackendKind:
    """The backend jigsawd runs: ``--emulate``, else the node's; a GPU one needs a usable GPU."""
    node = load_node(node_config, load_apps=False)
    if emulate:
        return backend_kind(EMULATED)
    kind = backend_kind(node.backend)
    if kind.emulated:
        raise JigsawError(f"the node's backend is {kind.name!r}: run with --emulate")
    if kind.on_gpus(node.gpu.kind) and not gpu_available():
        raise JigsawError(f"the node's backend {kind.name!r} needs a GPU on a GPU node and none is usable "
                          "(torch.cuda.is_available() is false or torch is not installed); run with "
                          "--emulate to serve on the emulated backend")
    return kind


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        backend = choose_backend(args.node_config, args.emulate)
    except JigsawError as exc:
        _log(str(exc))
        return 2
    if args.time_scale <= 0:
        _log("--time-scale must be > 0")
        return 2
    if args.bin_seconds is not None and args.bin_seconds <= 0:
        _log("--bin-seconds must be > 0")
        return 2
    token = args.admin_token if args.admin_token is not None else os.environ.get("JIGSAW_ADMIN_TOKEN", "")
    try:
        node = _served_node(args, backend)
        host = args.host or node.server.host
        port = node.server.port if args.port is None else args.port
        sock = listen_socket(host, port)  # a taken port fails here, before planning or a process start
        allow_open_files(node.server.max_connections)
    except (JigsawError, TopologyError) as exc:
        _log(str(exc))
        return 2
    try:
        failed, plans = _prepare_plans(node, args, backend)
        controller = args.controller or not (args.no_controller or args.plan)
        generations, fork_server = _start_generations(node, plans, args, backend, controller)
    except (JigsawError, TopologyError) as exc:
        sock.close()
        _log(str(exc))
        return 2
    # Until the loop installs its handlers, turn SIGTERM into an exception so cleanup runs.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        generations.start_all(READY_TIMEOUT_S)
        import uvloop
        uvloop.run(serve(generations, sock, time_scale=args.time_scale, seed=args.seed,
                         controller=controller,
                         space=args.space,
                         bin_seconds=args.bin_seconds, admin_token=token, node_config=args.node_config,
                         anytime=args.anytime, failed=failed))
    except JigsawError as exc:
        _log(str(exc))
        return 1
    except KeyboardInterrupt:
        _log("interrupted")
    except OSError as exc:
        _log(f"cannot serve on {host}:{port}: {exc}")
        return 1
    finally:
        sock.close()
        generations.close()
        if fork_server is not None:
            fork_server.close()
    _log("stopped")
    return 0


def _served_node(args: argparse.Namespace, backend: BackendKind) -> Node:
    """The node file as served: the driver's MIG figures on a GPU node, ``--http`` and
    ``--grpc-port`` over the file's ``[server]``."""
    node = load_node(args.node_config)
    if backend.on_gpus(node.gpu.kind):  # the driver's MIG figures, where they differ from jigsaw.mig's
        from jigsaw.gpu.nvml import driver_node
        node = driver_node(node, say=_log)
    if args.http is not None:
        node = dataclasses.replace(node, server=dataclasses.replace(node.server, http=args.http))
    if args.grpc_port is not None:
        if not 0 <= args.grpc_port <= 65535:
            raise JigsawError(f"--grpc-port: expected 0 (off) to 65535, got {args.grpc_port}")
        node = dataclasses.replace(node, server=dataclasses.replace(node.server,
                                                                    grpc_port=args.grpc_port))
    return node


def _prepare_plans(node: Node, args: argparse.Namespace,
                   backend: BackendKind) -> tuple[dict[str, str], list[tuple[App, Plan]]]:
    """The apps that cannot be served (and why) and the first plan of every other one, their models
    exported and served at measured input sizes; shared-memory leftovers of dead daemons removed."""
    failed = failed_apps(wanted_apps(node, args), backend)
    plans = choose_plans(node, args, skip=failed)
    if backend.runs_models:
        from jigsaw.models.input_sizes import serve_at_measured_sizes
        served = [app for app, _ in plans]
        serve_at_measured_sizes(served, load_node_profiles(node, served), _log)
        export_models(plans)
    removed = cleanup_stale()
    if removed:
        _log(f"removed {len(removed)} shared-memory leftovers of dead daemons")
    return failed, plans


def _start_generations(node: Node, plans: list[tuple[App, Plan]], args: argparse.Namespace,
                       backend: BackendKind, controller: bool) -> tuple[GenerationManager, ForkServer | None]:
    """The fork server (when the node asks for one) and the ``GenerationManager`` of the first plans;
    the fork server is closed again when the manager cannot be made."""
    fork_server = start_fork_server(backend) if node.server.fork_server else None
    try:
        generations = GenerationManager(node, plans, time_scale=args.time_scale, seed=args.seed,
                                        backend=backend, log=_log,
                                        spare_workers=node.server.spare_workers if controller else 0,
                                        launcher=fork_server,
                                        keep_usable=node.control.keep_compute_usable)
    except BaseException:
        if fork_server is not None:
            fork_server.close()
        raise
    return generations, fork_server


if __name__ == "__main__":
    sys.exit(main())
