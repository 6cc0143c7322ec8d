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
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jigsaw.app import App
from jigsaw.errors import JigsawError
from jigsaw.node import Node, load_node, load_node_profiles
from jigsaw.plan import Plan
from jigsaw.profiles import ProfileTable
from jigsaw.runtime import stats as st
from jigsaw.runtime.cpus import ENV as CPUS_ENV
from jigsaw.runtime.cpus import host_cpus, share_cpus
from jigsaw.runtime.gpus import (
    gpu_devices,
    mig_devices,
    missing_devices,
    numbered,
    placements,
    visible_device,
)
from jigsaw.runtime.rings import Doorbell, SegmentRegistry, ShmRing, cleanup_stale
from jigsaw.runtime.topology import Topology, TopologyError, build_topology, write_specs

DEFAULT_DEMAND_RPS = 10.0
PLAN_TIME_LIMIT_S = 5.0
READY_TIMEOUT_S = 120.0
DRAIN_TIMEOUT_S = 10.0
SPACES = ("unopt", "a", "s", "t", "as", "at", "st", "ast")
STOP_TIMEOUT_S = 5.0


def _log(msg: str) -> None:
    print(f"jigsawd: {msg}", file=sys.stderr, flush=True)


CPU_BACKENDS = ("onnxruntime", "torch")


def gpu_available() -> bool:
    """True when CUDA devices are usable (cupy is optional: absent means no GPU path)."""
    try:
        import cupy  # type: ignore[import-not-found]
    except Exception:
        return False
    try:
        return bool(cupy.cuda.is_available())
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
                   help="planner time limit per app (s)")
    p.add_argument("--seed", type=int, default=0, help="seed of lane draws and emulated outputs")
    p.add_argument("--space", default=None, choices=SPACES,
                   help="search space of every plan, initial and re-planned (default: planner.space)")
    ctl = p.add_mutually_exclusive_group()
    ctl.add_argument("--no-controller", action="store_true",
                     help="keep the initial plans (no per-bin re-planning); the default with --plan")
    ctl.add_argument("--controller", action="store_true",
                     help="re-plan every bin also when started from --plan files")
    p.add_argument("--bin-seconds", type=float, default=None,
                   help="controller bin length in wall seconds (default: the node's control.bin_seconds)")
    p.add_argument("--admin-token", default=None,
                   help="bearer token guarding /admin/* (default: env JIGSAW_ADMIN_TOKEN; none: loopback)")
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


def choose_plans(node: Node, args: argparse.Namespace) -> list[tuple[App, Plan]]:
    """The (app, plan) pairs to serve, from ``--plan`` files or by planning each app."""
    wanted = None if args.apps is None else [a.strip() for a in args.apps.split(",") if a.strip()]
    names = {a.name for a in node.apps}
    for w in wanted or []:
        if w not in names:
            raise JigsawError(f"--apps: unknown app {w!r} (node {node.name} has {', '.join(sorted(names))})")
    if args.plan:
        out = []
        for plan in _read_plans(args.plan):
            if plan.app not in names:
                raise JigsawError(f"plan for {plan.app!r}: not an app of node {node.name}")
            if wanted is None or plan.app in wanted:
                out.append((node.app(plan.app), plan))
        if not out:
            raise JigsawError("no plan left to serve (check --apps against the plans' apps)")
        return out
    apps = [a for a in node.apps if wanted is None or a.name in wanted]
    if not apps:
        raise JigsawError(f"node {node.name} lists no apps")
    profiles = load_node_profiles(node, apps)
    from jigsaw.planner.milp import plan as make_plan
    demand = DEFAULT_DEMAND_RPS if args.demand is None else args.demand
    out = []
    for app in apps:
        p = make_plan(app, node, profiles, demand, space=args.space, time_limit_s=args.plan_time_limit)
        if not p.instances:
            raise JigsawError(f"{app.name}: the planner found no configuration ({p.status}; "
                              f"{'; '.join(p.notes)})")
        _log(f"{app.name}: planned {p.planned_rps:g} rps ({p.status}), {p.slices_used} slices, "
             f"{sum(i.count * i.mps for i in p.instances)} processes, accuracy {p.accuracy:.3f}")
        for note in p.notes:
            _log(f"{app.name}: {note}")
        out.append((app, p))
    return out


class Generation:
    """One app's processes for one plan: its own rings, doorbells, stats block and workers.

    Segment names carry ``g<id>`` so a generation can be created while the previous one still
    serves and unlinked on its own once it has drained; the frontend's doorbell is shared.
    """

    def __init__(self, gid: int, node: Node, app: App, plan: Plan, profiles: ProfileTable, *,
                 run_dir: Path, daemon_id: str, frontend_bell: str, time_scale: float, seed: int,
                 backend: str = "emulated") -> None:
        self.gid = gid
        self.node = node
        self.backend = backend
        self.app = app
        self.plan = plan
        self.dir = run_dir / f"g{gid}"
        self.dir.mkdir()
        self.registry = SegmentRegistry(run_dir / f"g{gid}.manifest", daemon_id=daemon_id)
        self.workers: list[subprocess.Popen[bytes]] = []
        self.stats: st.StatsBlock | None = None
        self.stopping = False  # set once its workers are asked to stop: exits are then expected
        self._launch: list[tuple[Path, dict[str, str] | None]] = []

        def name_of(purpose: str) -> str:
            return frontend_bell if purpose == "bell-frontend" else self.registry.name(f"g{gid}-{purpose}")

        self.topology: Topology = build_topology(node, [(app, plan)], profiles, name_of=name_of,
                                                 time_scale=time_scale, seed=seed + gid, backend=backend)
        self.frontend_bell = frontend_bell

    def create_segments(self) -> None:
        t = self.topology
        self.registry.add_shm(t.stats)
        self.stats = st.StatsBlock.create(t.stats, len(t.processes))
        for name in t.doorbells:
            if name == self.frontend_bell:
                continue
            self.registry.add_sem(name)
            Doorbell.create(name).close()
        for name, capacity in t.rings.items():
            self.registry.add_shm(name)
            ShmRing.create(name, capacity).close()

    def start_workers(self) -> None:
        envs = self._worker_envs()
        self._launch = list(zip(write_specs(self.topology, self.dir), envs, strict=True))
        for k in range(len(self._launch)):
            self.workers.append(self._spawn(k))

    def _spawn(self, k: int) -> subprocess.Popen[bytes]:
        path, env = self._launch[k]
        return subprocess.Popen([sys.executable, "-m", "jigsaw.runtime.worker", "--spec", str(path)],
                                stdin=subprocess.DEVNULL, env=env)

    def restart_worker(self, k: int) -> None:
        """Start process ``k`` again on its spec: same rings, doorbell and stats slot."""
        if not self.stopping:
            self.workers[k] = self._spawn(k)

    def failed_workers(self) -> list[str]:
        """Processes the supervisor gave up on (their capacity is lost until a new generation)."""
        if self.stats is None:
            return []
        return [s.name for s in self.topology.processes if self.stats.get(s.slot, st.STATE) == st.FAILED]

    def _worker_envs(self) -> list[dict[str, str] | None]:
        """Each GPU worker sees only its MIG instance (CUDA_VISIBLE_DEVICES=MIG-<uuid>); each
        worker of a real backend on a CPU node is pinned to its core share's CPUs."""
        procs = self.topology.processes
        if self.node.gpu.kind == "cpu" and self.backend in ("onnxruntime", "torch"):
            return self._cpu_envs()
        if self.backend != "tensorrt":
            return [None] * len(procs)
        if self.plan.layout is None:
            raise JigsawError(f"the plan of {self.app.name} has no layout to place GPU workers by")
        devices = mig_devices() if self.node.gpu.mig else gpu_devices()
        missing = missing_devices(self.plan.layout, devices)
        if missing:
            raise JigsawError(f"MIG instances missing at (GPU, start) {missing}: partition the GPUs "
                              "as the plan's layout says (jigsaw pack --format commands)")
        layout = self.plan.layout
        return [dict(os.environ, CUDA_VISIBLE_DEVICES=visible_device(layout, devices, *kind, process=n))
                for kind, n in numbered(procs)]

    def _cpu_envs(self) -> list[dict[str, str] | None]:
        procs = self.topology.processes
        if self.plan.layout is None:
            return [None] * len(procs)
        where = placements(self.plan.layout)
        real = host_cpus()
        envs: list[dict[str, str] | None] = []
        for kind, n in numbered(procs):
            placed = where.get((*kind, n // kind[3]))
            if placed is None:
                envs.append(None)
                continue
            cpus = share_cpus(self.node.gpu, kind[2], placed[1], real)
            envs.append(dict(os.environ, **{CPUS_ENV: ",".join(map(str, cpus))}))
        return envs

    def not_ready(self) -> list[str]:
        """Names of workers not ready yet; raises JigsawError when one has exited."""
        assert self.stats is not None
        for proc, spec in zip(self.workers, self.topology.processes):
            if proc.poll() is not None:
                raise JigsawError(f"worker {spec.name} exited with status {proc.returncode} at start-up")
        return [s.name for s in self.topology.processes if self.stats.get(s.slot, st.STATE) != st.READY]

    def signal_stop(self) -> None:
        self.stopping = True
        for p in self.workers:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)

    def stop_workers(self) -> None:
        self.signal_stop()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for p in self.workers:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def close(self) -> None:
        """Stop the workers (if still running) and unlink every segment of this generation."""
        self.stop_workers()
        if self.stats is not None:
            self.stats.close()
            self.stats = None
        self.registry.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)


class Daemon:
    """Owns every generation's worker processes and segments; ``close`` releases them all."""

    def __init__(self, node: Node, plans: list[tuple[App, Plan]], *, time_scale: float, seed: int,
                 backend: str = "emulated") -> None:
        self.node = node
        self.backend = backend
        self.time_scale = time_scale
        self.seed = seed
        self.run_dir = Path(tempfile.mkdtemp(prefix="jigsawd-"))
        self.registry = SegmentRegistry(self.run_dir / "segments.manifest")
        self.frontend_bell = self.registry.name("bell-frontend")
        self.profiles = load_node_profiles(node, [a for a, _ in plans])
        self.generations: dict[int, Generation] = {}
        self.current: dict[str, int] = {}
        self._next_gid = 0
        self._bell_created = False
        for app, plan in plans:
            self.current[app.name] = self.new_generation(app, plan).gid

    def new_generation(self, app: App, plan: Plan) -> Generation:
        """Lay out (not yet create or start) a generation for ``plan``."""
        gid = self._next_gid
        self._next_gid += 1
        g = Generation(gid, self.node, app, plan, self.profiles, run_dir=self.run_dir,
                       daemon_id=self.registry.daemon_id, frontend_bell=self.frontend_bell,
                       time_scale=self.time_scale, seed=self.seed, backend=self.backend)
        self.generations[gid] = g
        return g

    @property
    def apps(self) -> list[str]:
        return list(self.current)

    def num_processes(self) -> int:
        return sum(len(self.generations[g].topology.processes) for g in self.current.values())

    def create_segments(self) -> None:
        if not self._bell_created:
            self.registry.add_sem(self.frontend_bell)
            Doorbell.create(self.frontend_bell).close()
            self._bell_created = True
        for gid in self.current.values():
            self.generations[gid].create_segments()

    def start_workers(self) -> None:
        for gid in self.current.values():
            self.generations[gid].start_workers()

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            waiting = [n for gid in self.current.values() for n in self.generations[gid].not_ready()]
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise JigsawError(f"{len(waiting)} workers not ready after {timeout_s:g} s "
                                  f"(first: {waiting[0]})")
            time.sleep(0.05)

    def retire(self, gid: int) -> None:
        """Stop a drained generation's workers and unlink its segments."""
        g = self.generations.pop(gid, None)
        if g is not None:
            g.close()

    def close(self) -> None:
        gens = list(self.generations.values())
        for g in gens:
            g.signal_stop()
        for g in gens:
            g.close()
        self.generations.clear()
        self.registry.cleanup()
        shutil.rmtree(self.run_dir, ignore_errors=True)


async def serve(daemon: Daemon, host: str, port: int, *, time_scale: float, seed: int,
                controller: bool = False, space: str | None = None, bin_seconds: float | None = None,
                admin_token: str = "", node_config: Path | None = None) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from aiohttp import web

    from jigsaw.control.admin import add_admin_routes, is_loopback
    from jigsaw.control.controller import AppController, default_solver
    from jigsaw.control.solver import SubprocessSolver
    from jigsaw.runtime.frontend import Frontend
    from jigsaw.runtime.supervisor import POLL_S, Supervisor
    node = daemon.node
    gids = list(daemon.current.items())
    fe = Frontend(daemon.generations[gids[0][1]].topology, backend_kind=daemon.backend,
                  max_queue=node.server.max_queue, hop_latency_ms=node.planner.hop_latency_ms,
                  time_scale=time_scale, seed=seed)
    fe.attach()
    for name, gid in gids[1:]:
        fe.add_generation(gid, daemon.generations[gid].topology)
        fe.switch(name, gid)
    loop = asyncio.get_running_loop()
    fe.start(loop)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    web_app = fe.make_app(node.server.max_payload_bytes)
    controllers: dict[str, AppController] = {}
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="planner")
    solver = SubprocessSolver(node_config) if controller and node_config is not None else None
    if controller:
        bin_s = bin_seconds or node.control.bin_seconds
        for name in daemon.apps:
            controllers[name] = AppController(node.app(name), daemon, fe, space=space, bin_seconds=bin_s,
                                              time_scale=time_scale, executor=executor, log=_log,
                                              solver=solver or default_solver)
    if not admin_token and not is_loopback(host):
        _log(f"{host} is not a loopback address: /admin/* answers loopback clients only "
             f"(set --admin-token or JIGSAW_ADMIN_TOKEN to allow others)")

    def capacity_lost(app: str, why: str) -> None:
        c = controllers.get(app)
        if c is not None:
            c.on_capacity_lost(why)
        else:
            _log(f"{app}: capacity lost ({why}) and no controller to re-plan (static plan)")

    supervisor = Supervisor(daemon, fe, log=_log, on_capacity_lost=capacity_lost)

    def supervise() -> None:
        try:
            supervisor.check()
        except Exception as exc:  # a supervisor bug must not take the node down with it
            _log(f"supervisor: {type(exc).__name__}: {exc}")
    add_admin_routes(web_app, daemon, controllers, admin_token, supervisor)
    runner = web.AppRunner(web_app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        fe.ready = True
        for c in controllers.values():
            c.start()
        what = (f"controller on (space {space or node.planner.space}, bins of "
                f"{bin_seconds or node.control.bin_seconds:g} s)" if controllers else "static plans")
        _log(f"serving {', '.join(daemon.apps)} on http://{host}:{port} with "
             f"{daemon.num_processes()} worker processes (backend: {daemon.backend}; {what})")
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), POLL_S)
            supervise()
        _log("stopping: draining in-flight requests")
        for c in controllers.values():
            await c.stop()
        fe.draining = True
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while fe.num_pending() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            supervise()
        if fe.num_pending():
            _log(f"{fe.num_pending()} requests still in flight after {DRAIN_TIMEOUT_S:g} s")
    finally:
        supervisor.stop()
        for c in controllers.values():
            await c.stop()
        await runner.cleanup()
        fe.close()
        executor.shutdown(wait=False, cancel_futures=True)
        if solver is not None:
            solver.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        node_for_backend = load_node(args.node_config, load_apps=False)
    except JigsawError as exc:
        _log(str(exc))
        return 2
    if args.emulate:
        backend = "emulated"
    elif node_for_backend.backend in CPU_BACKENDS:
        backend = node_for_backend.backend
    elif node_for_backend.backend == "emulated":
        _log("the node's backend is 'emulated': run with --emulate")
        return 2
    elif not gpu_available():
        _log(f"the node's backend {node_for_backend.backend!r} needs a GPU and none is usable "
             "(cupy.cuda.is_available() is false or cupy is not installed); run with --emulate to "
             "serve on the emulated backend")
        return 2
    else:
        backend = node_for_backend.backend
    if args.time_scale <= 0:
        _log("--time-scale must be > 0")
        return 2
    if args.bin_seconds is not None and args.bin_seconds <= 0:
        _log("--bin-seconds must be > 0")
        return 2
    token = args.admin_token if args.admin_token is not None else os.environ.get("JIGSAW_ADMIN_TOKEN", "")
    try:
        node = load_node(args.node_config)
        host = args.host or node.server.host
        port = node.server.port if args.port is None else args.port
        plans = choose_plans(node, args)
        if backend != "emulated":
            from jigsaw.models.check import check_models
            check_models([app for app, _ in plans], backend)
        removed = cleanup_stale()
        if removed:
            _log(f"removed {len(removed)} shared-memory leftovers of dead daemons")
        daemon = Daemon(node, plans, time_scale=args.time_scale, seed=args.seed, backend=backend)
    except (JigsawError, TopologyError) as exc:
        _log(str(exc))
        return 2
    # Until the loop installs its handlers, turn SIGTERM into an exception so cleanup runs.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        daemon.create_segments()
        daemon.start_workers()
        daemon.wait_ready(READY_TIMEOUT_S)
        import uvloop
        uvloop.run(serve(daemon, host, port, time_scale=args.time_scale, seed=args.seed,
                         controller=args.controller or not (args.no_controller or args.plan),
                         space=args.space,
                         bin_seconds=args.bin_seconds, admin_token=token, node_config=args.node_config))
    except JigsawError as exc:
        _log(str(exc))
        return 1
    except KeyboardInterrupt:
        _log("interrupted")
    except OSError as exc:
        _log(f"cannot serve on {host}:{port}: {exc}")
        return 1
    finally:
        daemon.close()
    _log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
