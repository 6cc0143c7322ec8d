"""One generation: an app's processes for one plan, with its own rings and stats block.

Segment names carry ``g<id>`` so a generation can be created while the previous one still
serves, and unlinked on its own once it has drained; the frontend's doorbell is shared. Each GPU
worker sees only its MIG instance; each worker of a real backend on a CPU node is pinned to its
core share's CPUs.

A generation is a routing version more than a set of processes: a process whose instance the new
plan keeps (same GPU, start slot, profile, variant, MPS level and max batch: ``process_keys``) is
*adopted* (``adopt``) instead of started. It keeps its pid, its loaded backend and its doorbell
(named per process, ``w<gid>.<slot>-bell``, owned by the process, not by a generation), and is
told to serve the new generation's spec beside the old one (``tell``: a control file and SIGHUP;
see ``runtime/worker.py``). The old generation then has *handed over* that process: it neither
supervises nor stops it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from jigsaw.app import App
from jigsaw.backends.registry import BackendKind
from jigsaw.errors import JigsawError
from jigsaw.mig import gpu_share_level, share_level
from jigsaw.node import Node
from jigsaw.plan import Plan
from jigsaw.profiles import ProfileTable
from jigsaw.runtime import stats as st
from jigsaw.runtime.cpus import ENV as CPUS_ENV
from jigsaw.runtime.cpus import host_cpus, share_cpus
from jigsaw.runtime.forkserver import Launcher, WorkerProcess, launch
from jigsaw.runtime.gpus import (
    Kind,
    host_devices,
    missing_devices,
    numbered,
    placements,
    visible_device,
)
from jigsaw.runtime.rings import Doorbell, SegmentRegistry, ShmRing
from jigsaw.runtime.spares import SparePool
from jigsaw.runtime.topology import OutputRing, Target, Topology, build_topology, write_specs

STOP_TIMEOUT_S = 5.0

ProcessKey = tuple[str, str, str, int, int, object, int]
"""(task, variant, profile, mps, max_batch, (GPU, start) or the instance's index, process in it)."""


def tell(control: Path, specs: list[Path], proc: WorkerProcess,
         env: dict[str, str] | None = None) -> None:
    """Have a running worker serve ``specs`` (newest first): written atomically, then SIGHUP.
    ``env``: what a spare adds to its environment before it runs its first spec."""
    tmp = control.with_suffix(".tmp")
    doc: dict[str, object] = {"specs": [str(p) for p in specs]}
    if env:
        doc["env"] = env
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, control)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGHUP)


def _rename_bells(t: Topology, names: dict[str, str]) -> Topology:
    """``t`` with doorbells renamed (adopted processes keep the doorbell they wait on)."""
    def out(o: OutputRing) -> OutputRing:
        return dataclasses.replace(o, doorbell=names.get(o.doorbell, o.doorbell))
    procs = [dataclasses.replace(p, doorbell=names.get(p.doorbell, p.doorbell),
                                 outputs=[out(o) for o in p.outputs]) for p in t.processes]
    for routes in t.apps.values():
        routes.roots = [{task: [Target(x.ring, names.get(x.doorbell, x.doorbell), x.slot) for x in targets]
                         for task, targets in lane.items()} for lane in routes.roots]
    return dataclasses.replace(t, processes=procs, doorbells=[names.get(d, d) for d in t.doorbells])


class Generation:
    """One app's processes for one plan: its own rings, doorbells, stats block and workers.

    Segment names carry ``g<id>`` so a generation can be created while the previous one still
    serves and unlinked on its own once it has drained; the frontend's doorbell is shared.
    """

    def __init__(self, gid: int, node: Node, app: App, plan: Plan, profiles: ProfileTable, *,
                 run_dir: Path, daemon_id: str, frontend_bell: str, time_scale: float, seed: int,
                 backend: BackendKind, launcher: Launcher | None = None) -> None:
        self.gid = gid
        self.launcher = launcher  # the fork server when there is one (else a Python start per process)
        self.node = node
        self.backend = backend
        self.app = app
        self.plan = plan
        self.run_dir = run_dir
        self.dir = run_dir / f"g{gid}"
        self.dir.mkdir()
        self.registry = SegmentRegistry(run_dir / f"g{gid}.manifest", daemon_id=daemon_id)
        self.workers: list[WorkerProcess] = []
        self.stats: st.StatsBlock | None = None
        self.stopping = False  # set once its workers are asked to stop: exits are then expected
        self._launch: list[tuple[Path, dict[str, str] | None]] = []

        def name_of(purpose: str) -> str:
            if purpose == "bell-frontend":
                return frontend_bell
            if purpose.startswith("bell-"):  # a process's own doorbell: it may outlive this generation
                return self.registry.name(f"w{gid}.{purpose[5:]}-bell")
            return self.registry.name(f"g{gid}-{purpose}")

        self.topology: Topology = build_topology(node, [(app, plan)], profiles, name_of=name_of,
                                                 time_scale=time_scale, seed=seed + gid, backend=backend.name)
        self.frontend_bell = frontend_bell
        n = len(self.topology.processes)
        # per process: its doorbell's registry (it goes with the process), its control file
        self.bell_registries = [SegmentRegistry(run_dir / f"w{gid}.{p.slot}.manifest", daemon_id=daemon_id)
                                for p in self.topology.processes]
        self.controls = [run_dir / f"ctl-{gid}.{p.slot}.json" for p in self.topology.processes]
        self.adopted: dict[int, tuple[Generation, int]] = {}  # process -> (older generation, its process)
        # processes a newer generation (or, once this one retires, the older one it took them
        # from, still draining) serves and supervises now
        self.handed_over: set[int] = set()
        self._env_of: list[dict[str, str] | None] = [None] * n

    # ---- keeping processes across re-plans ------------------------------------------------------
    def placement(self, k: int) -> tuple[int, int] | None:
        """(GPU, start) of process ``k``'s instance; None without a layout."""
        return self._placements()[k]

    def _placements(self) -> list[tuple[int, int] | None]:
        if self.plan.layout is None:
            return [None] * len(self.topology.processes)
        where = placements(self.plan.layout)
        return [where.get((*kind, n // kind[3])) for kind, n in numbered(self.topology.processes)]

    def process_keys(self) -> list[ProcessKey]:
        """What makes a process the same across plans: its instance (kind and where it lies; the
        instance's index among its kind when there is no layout) and its number within it. An MPS
        share of a whole GPU lies on its GPU whatever its start slot (``jigsaw.shares``): a kind's
        shares of one GPU are numbered in order instead, so a re-plan that moves them keeps them.
        A kind's shares of one MIG instance lie at its start: numbered within it."""
        where = self._placements()
        on_gpu: dict[tuple[Kind, int], int] = {}
        in_instance: dict[tuple[Kind, tuple[int, int]], int] = {}
        keys: list[ProcessKey] = []
        for k, (kind, n) in enumerate(numbered(self.topology.processes)):
            w = where[k]
            number = n % kind[3]
            if w is not None and gpu_share_level(kind[2]):
                i = on_gpu[(kind, w[0])] = on_gpu.get((kind, w[0]), -1) + 1
                w = (w[0], -1 - i)  # below every start slot
            elif w is not None and share_level(kind[2]):
                number = in_instance[(kind, w)] = in_instance.get((kind, w), -1) + 1
            keys.append((*kind, w if w is not None else n // kind[3], number))
        return keys

    def adopt(self, old: Generation, pairs: list[tuple[int, int]]) -> None:
        """Serve with ``old``'s processes instead of starting new ones: ``(mine, old's)`` pairs.
        Before ``create_segments``: an adopted process keeps its doorbell."""
        names = {self.topology.processes[k].doorbell: old.topology.processes[j].doorbell for k, j in pairs}
        self.topology = _rename_bells(self.topology, names)
        for k, j in pairs:
            self.adopted[k] = (old, j)
            self.bell_registries[k] = old.bell_registries[j]
            self.controls[k] = old.controls[j]

    def spec_path(self, k: int) -> Path:
        return self.dir / f"{self.topology.processes[k].slot}.json"

    def own(self) -> list[int]:
        """The processes this generation started (and stops), not adopted ones."""
        return [k for k in range(len(self.topology.processes)) if k not in self.adopted]

    def create_segments(self) -> None:
        t = self.topology
        self.registry.add_shm(t.stats)
        most = max((p.max_batch for p in t.processes), default=1)  # a record holds the batches in flight
        self.stats = st.StatsBlock.create(t.stats, len(t.processes), st.IN_FLIGHT_MAX * most)
        adopted_bells = {t.processes[k].doorbell for k in self.adopted}
        own_bells = {p.doorbell: self.bell_registries[k] for k, p in enumerate(t.processes)}
        for name in t.doorbells:
            if name == self.frontend_bell or name in adopted_bells:
                continue
            own_bells.get(name, self.registry).add_bell(name)
            Doorbell.create(name).close()
        for name, capacity in t.rings.items():
            self.registry.add_shm(name)
            ShmRing.create(name, capacity).close()

    def start_workers(self, extra_env: dict[tuple[int, int], dict[str, str]] | None = None,
                      spares: SparePool | None = None) -> None:
        """Write every spec and start this generation's own processes (``extra_env``: per (GPU,
        start), what the processes of that instance add to their environment: its MPS daemon's).
        A ready spare of ``spares`` runs a process instead of a new one where there is one.
        Adopted processes are taken over as they run; the caller ``tell``s them the new spec."""
        own = self.own()
        envs = self._worker_envs() if own else [None] * len(self.topology.processes)
        where = self._placements()
        for k in own:
            more = (extra_env or {}).get(where[k]) if where[k] is not None else None
            if more:
                envs[k] = {**(envs[k] if envs[k] is not None else os.environ), **more}
        for k, (old, j) in self.adopted.items():
            envs[k] = old._launch[j][1] if j < len(old._launch) else None
        self._launch = list(zip(write_specs(self.topology, self.dir), envs, strict=True))
        for k in range(len(self._launch)):
            if k in self.adopted:
                old, j = self.adopted[k]
                self.workers.append(old.workers[j])
                old.handed_over.add(j)
            else:
                # a spare sets its environment in-process before its backend loads (CUDA and the
                # CPU pinning read it then); an MPS client is not handed to a spare but started
                # anew (forked with its environment, or executed with it: ``_spawn``)
                mps_client = where[k] is not None and bool((extra_env or {}).get(where[k]))
                taken = spares.take() if spares is not None and not mps_client else None
                if taken is None:
                    self.workers.append(self._spawn(k))
                    continue
                proc, control = taken
                self.controls[k] = control  # its control file from now on (restarts included)
                path, env = self._launch[k]
                more = {} if env is None else {n: v for n, v in env.items() if os.environ.get(n) != v}
                tell(control, [path], proc, env=more)
                self.workers.append(proc)

    def hand_back(self, draining: set[int] | None = None) -> list[tuple[Generation, int]]:
        """Its adopted processes go back to their older generations (returned, for the caller to
        ``tell`` them their specs again): all of them when this generation failed before serving;
        when it retires, those that no newer generation took and whose older generation still
        drains (gids ``draining``): that one still has items queued on them, and stops them when
        it retires."""
        back = []
        for k, (old, j) in self.adopted.items():
            if draining is not None and (old.gid not in draining or k in self.handed_over):
                continue
            old.handed_over.discard(j)
            self.handed_over.add(k)
            back.append((old, j))
        return back

    def _spawn(self, k: int) -> WorkerProcess:
        """Start process ``k``: forked from the fork server when there is one (its environment,
        MIG instance, MPS directories and CPU pinning included, is set in the child before its
        backend loads, which is when CUDA reads it), else a Python start."""
        path, env = self._launch[k]
        return launch(self.launcher, ["--spec", str(path), "--control", str(self.controls[k])], env)

    def restart_worker(self, k: int) -> None:
        """Start process ``k`` again on its spec: same rings, doorbell and stats slot."""
        if not self.stopping:
            self.workers[k] = self._spawn(k)

    @property
    def app_name(self) -> str:
        return self.app.name

    def failed_workers(self) -> list[str]:
        """Processes the supervisor gave up on (their capacity is lost until a new generation)."""
        if self.stats is None:
            return []
        return [s.name for s in self.topology.processes if self.stats.get(s.slot, st.STATE) == st.FAILED]

    def _worker_envs(self) -> list[dict[str, str] | None]:
        """Each GPU worker (TensorRT's, torch's on a GPU node) sees only its MIG instance or GPU
        (CUDA_VISIBLE_DEVICES=MIG-<uuid> or GPU-<uuid>); each
        worker of a real backend on a CPU node is pinned to its core share's CPUs."""
        procs = self.topology.processes
        if self.node.gpu.kind == "cpu" and self.backend.runs_models and not self.backend.needs_gpu:
            return self._cpu_envs()
        if not self.backend.on_gpus(self.node.gpu.kind):
            return [None] * len(procs)
        if self.plan.layout is None:
            raise JigsawError(f"the plan of {self.app.name} has no layout to place GPU workers by")
        devices = host_devices(self.node)
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
        for k, p in enumerate(self.workers):
            if k not in self.handed_over and p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)

    def stop_workers(self) -> None:
        self.signal_stop()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for k, p in enumerate(self.workers):
            if k in self.handed_over:
                continue
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
        for k, reg in enumerate(self.bell_registries):
            if k not in self.handed_over:  # a process this generation stopped: its doorbell goes too
                reg.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)
