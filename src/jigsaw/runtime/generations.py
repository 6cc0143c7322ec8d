"""The one owner of generations: create, start, ready, switch, drain, retire.

The controller says what an app should run (``DesiredState``: a plan) and the manager makes it so
(``apply``): a plan that runs the same processes only re-weights the lanes of the routes in place;
any other plan becomes a new generation of the app's processes, make-before-break: its rings and
workers are created while the old generation serves, it must report ready (and sit out the MIG
repartition delay when the layout changed GPUs), the router switches the app to it in one
assignment, and the old generation drains (every accepted request is answered) before its workers
stop and its segments are unlinked.

The data plane is reached only through the ``Router`` interface (the frontend implements it); the
supervisor reports worker faults to the manager (``worker_failed``, ``worker_restarting``,
``worker_restored``, ``capacity_lost``), which forwards them to the router and to whoever re-plans.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from jigsaw.app import App
from jigsaw.backends.registry import BackendKind
from jigsaw.errors import JigsawError
from jigsaw.node import Node, load_node_profiles
from jigsaw.plan import Plan
from jigsaw.planner.packer import changed_gpus
from jigsaw.runtime.generation import Generation
from jigsaw.runtime.rings import Doorbell, SegmentRegistry
from jigsaw.runtime.topology import ProcessSpec, Topology

READY_TIMEOUT_S = 120.0
DRAIN_MARGIN_S = 12.0  # beyond the deadline: the frontend keeps a timed-out request 10 s for late credits
READY_POLL_S = 0.02
DRAIN_POLL_S = 0.05


class Router(Protocol):
    """What the manager pushes to the data plane (the frontend implements it)."""

    def add_generation(self, generation: int, topology: Topology) -> None: ...
    def route(self, app: str, generation: int) -> None: ...
    def reweight(self, app: str, plan: Plan) -> None: ...
    def pending_in(self, generation: int) -> int: ...
    def remove_generation(self, generation: int) -> None: ...
    def worker_failed(self, generation: int, app: str, task: str, variant: str,
                      reason: str) -> tuple[int, int]: ...
    def worker_restarting(self, app: str, task: str) -> None: ...
    def refresh_admission(self, app: str) -> None: ...


@dataclass(frozen=True)
class DesiredState:
    """What an app should run: a plan, and how long a MIG repartition of its GPUs takes (s)."""

    app: str
    plan: Plan
    repartition_delay_s: float = 0.0
    # new processes even when the plan runs the same instances: after a worker was given up its
    # process may have come back by the time the plan is ready, but the capacity-loss re-plan
    # still replaces it (the supervisor's retry is a stopgap, not a recovery)
    fresh_generation: bool = False


@dataclass(frozen=True)
class Applied:
    """What ``apply`` did: the generation serving now, and whether it is a new one."""

    generation: int
    previous: int
    new_generation: bool  # False: re-weighted in place, or the new generation failed (``error``)
    seconds: float = 0.0
    changed_gpus: tuple[int, ...] = ()
    processes: int = 0
    error: str | None = None


def same_instances(a: Plan, b: Plan) -> bool:
    """The two plans run the same processes (only lane weights may differ)."""
    def key(p: Plan) -> list[tuple[str, str, str, int, int, int]]:
        return sorted((i.task, i.variant, i.mig_profile, i.mps, i.max_batch, i.count)
                      for i in p.instances if i.count > 0)

    def lanes(p: Plan) -> list[tuple[tuple[str, str], ...]]:
        return [tuple(sorted(lp.variants.items())) for lp in p.lanes]
    return key(a) == key(b) and lanes(a) == lanes(b) and a.task_latency_ms == b.task_latency_ms


class GenerationManager:
    """Owns every generation's worker processes and segments; ``close`` releases them all."""

    def __init__(self, node: Node, plans: list[tuple[App, Plan]], *, time_scale: float, seed: int,
                 backend: BackendKind, log: Callable[[str], None] = print) -> None:
        self.node = node
        self.backend = backend
        self.time_scale = time_scale
        self.seed = seed
        self.log = log
        self.run_dir = Path(tempfile.mkdtemp(prefix="jigsawd-"))
        self.registry = SegmentRegistry(self.run_dir / "segments.manifest")
        self.frontend_bell = self.registry.name("bell-frontend")
        self.profiles = load_node_profiles(node, [a for a, _ in plans])
        self.generations: dict[int, Generation] = {}
        self.current: dict[str, int] = {}
        self.router: Router | None = None
        self.on_capacity_lost: Callable[[str, str], None] | None = None
        self._next_gid = 0
        self._bell_created = False
        self._retiring: set[asyncio.Task[None]] = set()
        for app, plan in plans:
            self.current[app.name] = self._lay_out(app, plan).gid

    # ---- reading -------------------------------------------------------------------------------
    @property
    def apps(self) -> list[str]:
        return list(self.current)

    def generation_of(self, app: str) -> int:
        return self.current[app]

    def plan_of(self, app: str) -> Plan:
        return self.generations[self.current[app]].plan

    def num_processes(self) -> int:
        return sum(len(self.generations[g].topology.processes) for g in self.current.values())

    def running(self) -> list[Generation]:
        """Every generation with processes (serving, starting or draining), for the supervisor."""
        return list(self.generations.values())

    # ---- the initial generations (before the loop serves) ----------------------------------------
    def _lay_out(self, app: App, plan: Plan) -> Generation:
        """Lay out (not yet create or start) a generation for ``plan``; raises when it cannot be."""
        gid = self._next_gid
        self._next_gid += 1
        g = Generation(gid, self.node, app, plan, self.profiles, run_dir=self.run_dir,
                       daemon_id=self.registry.daemon_id, frontend_bell=self.frontend_bell,
                       time_scale=self.time_scale, seed=self.seed, backend=self.backend)
        self.generations[gid] = g
        return g

    def _create_bell(self) -> None:
        if not self._bell_created:
            self.registry.add_sem(self.frontend_bell)
            Doorbell.create(self.frontend_bell).close()
            self._bell_created = True

    def start_all(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Create every current generation's segments, start all its workers at once, wait ready."""
        self._create_bell()
        for gid in self.current.values():
            self.generations[gid].create_segments()
        for gid in self.current.values():
            self.generations[gid].start_workers()
        deadline = time.monotonic() + timeout_s
        while True:
            waiting = [n for gid in self.current.values() for n in self.generations[gid].not_ready()]
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise JigsawError(f"{len(waiting)} workers not ready after {timeout_s:g} s "
                                  f"(first: {waiting[0]})")
            time.sleep(0.05)

    def attach(self, router: Router) -> None:
        """Announce every current generation to the data plane and route each app to its own."""
        self.router = router
        for app, gid in self.current.items():
            router.add_generation(gid, self.generations[gid].topology)
            router.route(app, gid)

    # ---- reconfiguration -------------------------------------------------------------------------
    async def apply(self, desired: DesiredState) -> Applied:
        """Make ``desired`` the app's running state: in place when it runs the same processes, else
        as a new generation; the old one drains and retires in the background.

        Raises when the plan cannot be laid out (nothing was started); a generation that fails to
        start is removed and reported in ``Applied.error`` while the old one keeps serving.
        """
        router = self._router()
        app, new = desired.app, desired.plan
        old_gid = self.current[app]
        old = self.generations[old_gid]
        if not desired.fresh_generation and same_instances(old.plan, new) and not old.failed_workers():
            old.plan = new
            router.reweight(app, new)
            return Applied(old_gid, old_gid, False, processes=len(old.topology.processes))
        t0 = time.monotonic()
        changed: list[int] = []
        if old.plan.layout is not None and new.layout is not None:
            changed = changed_gpus(old.plan.layout, new.layout)
        gen = self._lay_out(old.app, new)
        try:
            gen.create_segments()
            gen.start_workers()
            router.add_generation(gen.gid, gen.topology)
            ready_at = time.monotonic() + (desired.repartition_delay_s if changed else 0.0)
            deadline = time.monotonic() + READY_TIMEOUT_S
            while gen.not_ready() or time.monotonic() < ready_at:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"generation {gen.gid} not ready after {READY_TIMEOUT_S:g} s")
                await asyncio.sleep(READY_POLL_S)
        except Exception as exc:
            self.log(f"{app}: new generation {gen.gid} failed ({exc}); keeping generation {old_gid}")
            router.remove_generation(gen.gid)
            await asyncio.get_running_loop().run_in_executor(None, self.retire, gen.gid)
            return Applied(old_gid, old_gid, False, error=str(exc))
        router.route(app, gen.gid)
        self.current[app] = gen.gid
        task = asyncio.get_running_loop().create_task(self._drain_and_retire(old_gid))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)
        return Applied(gen.gid, old_gid, True, time.monotonic() - t0, tuple(changed),
                       len(gen.topology.processes))

    async def _drain_and_retire(self, gid: int) -> None:
        """Wait until the old generation's requests are all settled, then stop and unlink it."""
        router = self._router()
        g = self.generations[gid]
        budget_s = (g.app.latency_slo_ms + g.app.depth * self.node.planner.hop_latency_ms) \
            * self.time_scale / 1000.0
        deadline = time.monotonic() + budget_s + DRAIN_MARGIN_S
        while router.pending_in(gid) and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        left = router.pending_in(gid)
        if left:
            self.log(f"{g.app.name}: generation {gid}: {left} requests unsettled after drain")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, g.stop_workers)
        router.remove_generation(gid)
        await loop.run_in_executor(None, self.retire, gid)

    def retire(self, gid: int) -> None:
        """Stop a drained generation's workers and unlink its segments."""
        g = self.generations.pop(gid, None)
        if g is not None:
            g.close()

    async def stop_retiring(self) -> None:
        """Cancel the drains in progress (the node is stopping; ``close`` releases everything)."""
        for t in list(self._retiring):
            if not t.done():
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t

    def _router(self) -> Router:
        if self.router is None:
            raise RuntimeError("the generation manager has no router attached")
        return self.router

    # ---- what the supervisor reports (``supervisor.FaultSink``) -----------------------------------
    def worker_failed(self, generation: int, spec: ProcessSpec, reason: str) -> tuple[int, int]:
        """A worker died or hung: the router settles its requests; returns (retried, failed)."""
        if self.router is None:
            return 0, 0
        return self.router.worker_failed(generation, spec.app, spec.task, spec.variant, reason)

    def worker_restarting(self, spec: ProcessSpec) -> None:
        if self.router is not None:
            self.router.worker_restarting(spec.app, spec.task)

    def worker_restored(self, spec: ProcessSpec) -> None:
        if self.router is not None:
            self.router.refresh_admission(spec.app)

    def worker_given_up(self, spec: ProcessSpec) -> None:
        if self.router is not None:
            self.router.refresh_admission(spec.app)

    def capacity_lost(self, app: str, why: str) -> None:
        if self.on_capacity_lost is not None:
            self.on_capacity_lost(app, why)
        else:
            self.log(f"{app}: capacity lost ({why}) and no controller to re-plan (static plan)")

    # ---- the end ---------------------------------------------------------------------------------
    def close(self) -> None:
        gens = list(self.generations.values())
        for g in gens:
            g.signal_stop()
        for g in gens:
            g.close()
        self.generations.clear()
        self.registry.cleanup()
        shutil.rmtree(self.run_dir, ignore_errors=True)
