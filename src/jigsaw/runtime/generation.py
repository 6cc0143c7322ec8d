"""One generation: an app's processes for one plan, with its own rings, doorbells and stats block.

Segment names carry ``g<id>`` so a generation can be created while the previous one still
serves, and unlinked on its own once it has drained; the frontend's doorbell is shared. Each GPU
worker sees only its MIG instance; each worker of a real backend on a CPU node is pinned to its
core share's CPUs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from jigsaw.app import App
from jigsaw.backends.registry import BackendKind
from jigsaw.errors import JigsawError
from jigsaw.node import Node
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
from jigsaw.runtime.rings import Doorbell, SegmentRegistry, ShmRing
from jigsaw.runtime.topology import Topology, build_topology, write_specs

STOP_TIMEOUT_S = 5.0


class Generation:
    """One app's processes for one plan: its own rings, doorbells, stats block and workers.

    Segment names carry ``g<id>`` so a generation can be created while the previous one still
    serves and unlinked on its own once it has drained; the frontend's doorbell is shared.
    """

    def __init__(self, gid: int, node: Node, app: App, plan: Plan, profiles: ProfileTable, *,
                 run_dir: Path, daemon_id: str, frontend_bell: str, time_scale: float, seed: int,
                 backend: BackendKind) -> None:
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
                                                 time_scale=time_scale, seed=seed + gid, backend=backend.name)
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

    @property
    def app_name(self) -> str:
        return self.app.name

    def failed_workers(self) -> list[str]:
        """Processes the supervisor gave up on (their capacity is lost until a new generation)."""
        if self.stats is None:
            return []
        return [s.name for s in self.topology.processes if self.stats.get(s.slot, st.STATE) == st.FAILED]

    def _worker_envs(self) -> list[dict[str, str] | None]:
        """Each GPU worker sees only its MIG instance (CUDA_VISIBLE_DEVICES=MIG-<uuid>); each
        worker of a real backend on a CPU node is pinned to its core share's CPUs."""
        procs = self.topology.processes
        if self.node.gpu.kind == "cpu" and self.backend.runs_models and not self.backend.needs_gpu:
            return self._cpu_envs()
        if not self.backend.needs_gpu:
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
