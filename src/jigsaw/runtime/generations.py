"""The one owner of generations: create, start, ready, switch, drain, retire.

The controller says what an app should run (``DesiredState``: a plan) and the manager makes it
so (``transition``: the controller decides each step, the manager executes it), per instance: a
plan that runs the same processes only re-weights the lanes of the routes in place; any other
plan becomes a new generation, make-before-break. A generation is a routing version: the
processes of the instances both plans run (same GPU, start slot, profile, variant, MPS level, max
batch) are kept (``kept_processes``: same pids, engines stay loaded) and told to serve the new
generation's rings too; only the changed instances get new processes (their MPS daemons first).
Its rings are created while the old generation serves, every process must report ready (and the
new ones sit out the MIG repartition delay when the layout changed GPUs), the router switches the
app to it in one assignment, and the old generation drains (every accepted request is answered)
before the processes not kept stop, the kept ones drop its rings and its segments are unlinked;
then the MPS daemons and MIG instances nothing runs on go. New instances that need the MIG slots
of running ones may be preceded by a drain of those (``DrainFirst``, when the controller's policy
picks it) while the app's other processes serve; should the re-plan fail after that drain, the
running plan is brought back (``_restore``: the drained instances created again, their processes
restarted, the app routed back), so a failure never leaves the app on less than it ran.

The manager also holds the node's one layout (``node_layout``, all apps): every plan is placed
against what the other apps hold (``place``), and the MIG instances are kept in step with it
through NVML (``gpu.partition``; the emulated NVML on an emulated node): created before the
generation that needs them starts (a failure rolls them back and the running plan serves on),
destroyed once no live generation runs on them.

The data plane is reached only through the ``Router`` interface (the frontend implements it); the
supervisor reports worker faults to the manager (``worker_failed``, ``worker_restarting``,
``worker_restored``, ``capacity_lost``), which forwards them to the router and to whoever re-plans.

One concept per module: what crosses to the controller (``applied``: ``DesiredState``,
``Applied``, ``Router``, the steps), placement beside what runs and the plan arithmetic of a
re-plan (``placement``), the steps of a transition executed (``transitions``), MPS daemons
(``mps_daemons``), drains, drain-firsts and restores (``drains``, a base of this class), unload
and load of an app (``app_loading``, another), the fault sink (``fault_sink``, another), the
``/metrics`` counters (``reconfig_metrics``); here: the generations themselves, their launch and
readiness, the switch, and MIG bring-up and release.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from jigsaw.app import App
from jigsaw.backends.registry import BackendKind
from jigsaw.errors import JigsawError
from jigsaw.gpu.groups import GroupsApplier, place_on, validate_on, whole_gpus
from jigsaw.gpu.layout import NodeInstance, NodeLayout, empty_layout, from_app_layouts
from jigsaw.gpu.mps import MpsManager, node_mps
from jigsaw.gpu.nvml import MigApplier
from jigsaw.gpu.partition import MigPartition, overlaps
from jigsaw.node import Node, load_node_profiles
from jigsaw.plan import Plan
from jigsaw.planner.packer import PackingError, changed_gpus, instances_from_plan
from jigsaw.runtime import reconfig_metrics
from jigsaw.runtime.app_loading import AppLoading
from jigsaw.runtime.applied import (
    READY_TIMEOUT_S,
    Applied,
    Deferred,
    DesiredState,
    DrainRefused,
    Placed,
    Router,
)
from jigsaw.runtime.drains import Drains
from jigsaw.runtime.fault_sink import WorkerFaults
from jigsaw.runtime.forkserver import Launcher
from jigsaw.runtime.generation import Generation, tell
from jigsaw.runtime.mps_daemons import MpsDaemons
from jigsaw.runtime.placement import DRAINING, Beside, kept_processes, same_instances, without_instances
from jigsaw.runtime.rings import Doorbell, SegmentRegistry
from jigsaw.runtime.spares import SparePool
from jigsaw.runtime.transitions import ManagerTransition

# the names callers import from here
__all__ = ["DRAINING", "Applied", "Beside", "DesiredState", "DrainRefused", "GenerationManager", "Placed",
           "Router", "kept_processes", "same_instances", "without_instances"]

FAULT_ENV = "JIGSAW_EMULATED_NVML_FAULT"
MPS_CONTROL_ENV = "JIGSAW_MPS_CONTROL"  # the MPS control binary (on an emulated node: a stand-in script)
MAX_APPLIED = 100
READY_POLL_S = 0.02
READY_FAST_S = 0.2  # for this long after the start the readiness is polled every READY_FAST_POLL_S
READY_FAST_POLL_S = 0.002


def inject_fault(nvml: Any, spec: str) -> None:
    """``JIGSAW_EMULATED_NVML_FAULT=function:code[:skip][,function:code[:skip]...]`` on an emulated
    node: once it serves, the call of ``function`` after ``skip`` successful ones fails with that
    NVML error code, once per entry (the daemon-level failure tests inject them; the start-up
    partition is not affected)."""
    for one in spec.split(","):
        parts = one.split(":")
        try:
            nvml.inject(parts[0], int(parts[1]), skip=int(parts[2]) if len(parts) > 2 else 0)
        except (IndexError, ValueError, AttributeError):
            raise JigsawError(f"{FAULT_ENV}={spec!r}: expected function:code[:skip] "
                              "(an NVML function), comma-separated") from None


class GenerationManager(Drains, AppLoading, WorkerFaults):
    """Owns every generation's worker processes and segments; ``close`` releases them all."""

    def __init__(self, node: Node, plans: list[tuple[App, Plan]], *, time_scale: float, seed: int,
                 backend: BackendKind, log: Callable[[str], None] = print, nvml: Any = None,
                 spare_workers: int = 0, launcher: Launcher | None = None,
                 keep_usable: bool = True) -> None:
        self.node = node
        # whether new MIG instances go where they strand the fewest compute slices: given by the
        # caller (the daemon, from the node's [control]; the runtime reads no [control] setting)
        self.keep_usable = keep_usable
        self.launcher = launcher  # starts worker processes: the fork server, or None (a Python start)
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
        self._init_counters()
        self._init_partition(nvml)
        self.applied: list[dict[str, Any]] = []  # the last re-plans applied (``Applied``), for /admin/layout
        # idle worker processes a re-plan hands its new processes' specs to (started after start-up)
        self.spares = SparePool(self.run_dir, spare_workers, launcher) if spare_workers > 0 else None
        self._lock = asyncio.Lock()  # one reconfiguration of the node at a time
        self._seed_layout(plans)
        for app, plan in plans:
            try:
                self.node_layout, plan = self.place(app.name, plan)
            except PackingError as exc:
                raise JigsawError(f"{app.name}: its plan does not fit beside the node's other apps: {exc}") \
                    from None
            self.current[app.name] = self._lay_out(app, plan).gid
        if self.node_layout is not None:
            self.node_layout = self.node_layout.without_idle()

    def _init_counters(self) -> None:
        """The drains' bookkeeping and the counters ``/metrics`` shows."""
        self._retiring: set[asyncio.Task[None]] = set()
        # generations in ``_retire`` (until their processes and MPS daemons are stopped), and the
        # event that cuts each one's drain short (``_end_drains``)
        self._retiring_gids: set[int] = set()
        self._cut: dict[int, asyncio.Event] = {}
        # when each draining generation's requests are all answered or timed out at the latest
        # (monotonic s): what a needed re-plan waits for
        self._drain_ends: dict[int, float] = {}
        self.drains_total = 0  # drains of replaced generations, and their wall seconds in all
        self.drain_s_total = 0.0
        self.drain_waits_total = 0  # needed re-plans that waited for the drains in their way
        self.drain_wait_s_total = 0.0
        self.failures_total = 0  # new generations that failed to start (the running one served on)
        # drains ended for a re-plan that needed their slots once it had waited for them, and
        # their requests: forgotten (answered, only waiting for late credits), re-sent on the
        # current generation, failed
        self.drains_cut_total = 0
        self.cut_requests_total: Counter[str] = Counter()
        # drain-first re-plans by outcome: done, refused, failed (before the drain: nothing changed),
        # restored (failed after it: the running plan brought back), restore_failed
        self.drain_first_total: Counter[str] = Counter()
        self.processes_started_total = 0
        self.processes_kept_total = 0

    def _init_partition(self, nvml: Any) -> None:
        """The node's one layout, its MIG partition and its MPS daemons."""
        node, backend = self.node, self.backend
        # the node's one layout, all apps together (GPU nodes): every plan is placed against it
        # (a GPU model without MIG - whole GPUs - has no partition to keep: ``mig`` false)
        partitioned = node.gpu.kind == "gpu" and getattr(node.gpu, "mig", True)
        self.node_layout: NodeLayout | None = empty_layout(node.gpu, node.num_gpus) if partitioned else None
        # the MIG instances that exist: NVML on a GPU node, the emulated NVML on an emulated one
        self.partition: MigPartition | None = None
        self._fault = ""
        if self.node_layout is not None and (backend.emulated or backend.on_gpus(node.gpu.kind)):
            emulated = nvml is None and backend.emulated
            if emulated:
                self._fault = os.environ.get(FAULT_ENV, "")
            if node.is_mixed:  # several GPU groups: each group's MIG, whole GPUs as they are
                applier: Any = GroupsApplier(node, nvml, emulated=emulated)
            else:
                if emulated:
                    from jigsaw.gpu.emulated_nvml import EmulatedNvml

                    nvml = EmulatedNvml(node.gpu, node.num_gpus)
                applier = MigApplier(node.gpu, nvml)
            self.partition = MigPartition(node.gpu, node.num_gpus, applier)
            self.node_layout = self.partition.adopt()  # idle instances: placed apps reuse them
        # one MPS control daemon per MIG instance (or whole GPU: ``WholeGpus``) of MPS level k > 1,
        # in a private run directory (``gpu/mps.py`` ``node_mps``; a stand-in: ``JIGSAW_MPS_CONTROL``)
        mps, gpus = node_mps(
            node.gpu, node.num_gpus, self.run_dir / "mps", emulated=backend.emulated,
            on_gpus=backend.needs_gpu, partitioned=self.partition is not None,
            binary=os.environ.get(MPS_CONTROL_ENV, ""), whole_gpus=whole_gpus(node) if node.is_mixed else (),
            whole_hosts=tuple(node.host_index(i) for i in whole_gpus(node)) if node.is_mixed else ())
        self.mps_daemons = MpsDaemons(mps, self.log, gpus)

    def _seed_layout(self, plans: list[tuple[App, Plan]]) -> None:
        """On a node with no MIG instances yet, start from the plans' own layouts when they fit
        together (one node-wide plan: what ``jigsaw plan --node`` printed); ``place`` then keeps
        every instance where the plan put it. Separately made plans overlap and are placed anew."""
        if self.node_layout is None or self.node_layout.instances:
            return
        gpu = self.node.gpu
        laid = {a.name: p.layout for a, p in plans if p.layout is not None and p.layout.gpu_model == gpu.name}
        if not laid or len(laid) != len(plans):
            return
        seed = from_app_layouts(gpu.name, self.node.num_gpus, laid)
        if not validate_on(seed, gpu):
            self.node_layout = seed

    def place(self, app: str, plan: Plan) -> tuple[NodeLayout | None, Plan]:
        """The node layout with ``app`` on ``plan``, laid out against what the other apps hold
        (its own unchanged instances stay where they run), and the plan with its part of it as
        its layout. Pure: nothing changes until the plan is applied. Raises ``PackingError``."""
        if self.node_layout is None:
            return None, plan
        gpu = self.node.gpu
        desired = place_on(self.node_layout, app, instances_from_plan(plan), gpu, self.keep_usable)
        problems = validate_on(desired, gpu)
        if problems:  # place_app never does this; a guard, since an overlap would break a GPU
            raise PackingError(f"node layout would break the placement rules: {'; '.join(problems)}")
        return desired, dataclasses.replace(plan, layout=desired.app_layout(app))

    def beside(self) -> Beside | None:
        """What a plan placed beside everything that runs sees now; None without a node layout."""
        if self.node_layout is None:
            return None
        in_use = self.in_use_layout()
        assert in_use is not None
        held = {i.slot: i for i in in_use.instances}
        if self.partition is not None:
            for e in self.partition.existing.values():
                held.setdefault(e.slot, e)
        serving = self.node_layout.instances
        serving_slots = {i.slot for i in serving}
        stand_ins = [dataclasses.replace(h, app=DRAINING) for h in held.values()
                     if h.slot not in serving_slots and not h.is_idle
                     and not any(overlaps(self.node.gpu, h, i) for i in serving)]
        return Beside(self.node_layout.with_instances((*serving, *stand_ins)), tuple(held.values()),
                      self.node.gpu, self.keep_usable)

    def draining_instances(self) -> list[NodeInstance]:
        """The MIG instances of every generation that no longer serves its app (draining or retiring)."""
        return [i for held in self._draining_by_generation().values() for i in held]

    def _draining_by_generation(self) -> dict[int, tuple[NodeInstance, ...]]:
        return {g.gid: from_app_layouts(self.node.gpu.name, self.node.num_gpus,
                                        {g.app.name: g.plan.layout}).instances
                for g in self.generations.values()
                if g.gid != self.current.get(g.app.name) and g.plan.layout is not None}

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

    def processes(self) -> list[dict[str, Any]]:
        """Every live worker process, once, with the generations it serves and its instance
        (``/admin/layout``): a process a re-plan kept shows the same pid under the new generation."""
        out: dict[int, dict[str, Any]] = {}
        for g in sorted(self.generations.values(), key=lambda g: g.gid):
            for k, spec in enumerate(g.topology.processes):
                if k >= len(g.workers):
                    continue
                proc = g.workers[k]
                where = g.placement(k)
                row = out.setdefault(id(proc), {
                    "pid": proc.pid, "app": spec.app, "task": spec.task, "variant": spec.variant,
                    "profile": spec.mig_profile, "mps": spec.mps, "max_batch": spec.max_batch,
                    "gpu": where[0] if where else None, "start": where[1] if where else None,
                    "generations": []})
                row["pid"] = proc.pid
                row["generations"].append(g.gid)
        return list(out.values())


    @property
    def mps(self) -> MpsManager | None:
        """The node's MPS daemons (``/admin/layout``)."""
        return self.mps_daemons.manager

    def prometheus(self) -> str:
        """Process and MPS counters of the reconfigurations (for ``/metrics``)."""
        return reconfig_metrics.prometheus(self)

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
                       time_scale=self.time_scale, seed=self.seed, backend=self.backend,
                       launcher=self.launcher)
        self.generations[gid] = g
        return g

    def _create_bell(self) -> None:
        if not self._bell_created:
            self.registry.add_bell(self.frontend_bell)
            Doorbell.create(self.frontend_bell).close()
            self._bell_created = True

    def start_all(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Create every current generation's segments, start all its workers at once, wait ready."""
        self._create_bell()
        if self.partition is not None and self.node_layout is not None:
            self.partition.tear_down(self.node_layout, reason="start-up")  # unused idle ones go
            self.node_layout = self.partition.with_uuids(self.node_layout)
            if self._fault:
                inject_fault(self.partition.applier.nvml, self._fault)
        for gid in self.current.values():
            self.generations[gid].create_segments()
        for gid in self.current.values():
            g = self.generations[gid]
            g.start_workers(self.mps_daemons.start(g, self.node_layout))
        deadline = time.monotonic() + timeout_s
        while True:
            waiting = [n for gid in self.current.values() for n in self.generations[gid].not_ready()]
            if not waiting:
                if self.spares is not None:
                    self.spares.refill()  # after the workers: they do not compete for the CPUs
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
    @contextlib.asynccontextmanager
    async def transition(self, desired: DesiredState) -> AsyncIterator[ManagerTransition]:
        """Begin making ``desired`` the app's running state, under the manager's lock (one
        reconfiguration of the node at a time): the plan placed, re-weighted in place when it runs
        the same processes (``done`` at once), else its MIG instances on free slots brought up. The
        caller executes the steps it decides on (``ManagerTransition.execute``) until ``done``;
        one it leaves unfinished changes nothing (the running plan serves on).

        Raises when the plan cannot be laid out (nothing was started); a generation that fails to
        start is removed and reported in ``Applied.error`` while the old one keeps serving."""
        async with self._lock:
            t = ManagerTransition(self, desired, time.monotonic())
            await t.open()
            try:
                yield t
            finally:
                if t.done is None and t.brought_up:  # left unfinished (an error, a cancel)
                    await self._release_mig(f"{desired.app}: re-plan left unfinished")
            if self.spares is not None and t.done is not None and t.done.new_generation:
                self.spares.refill()  # after the switch, off its path
        if t.done is not None:
            self.applied.append({"at": time.time(), "app": desired.app, **dataclasses.asdict(t.done)})
            del self.applied[:-MAX_APPLIED]

    def same_processes(self, old: Generation, new: Plan) -> bool:
        """``new`` runs ``old``'s processes (only lane weights may differ) and none of them failed."""
        return same_instances(old.plan, new) and not old.failed_workers()

    def _reweight(self, app: str, old: Generation, new: Plan, node_layout: NodeLayout | None,
                  t0: float) -> Applied:
        """The same processes: the lanes of the running generation re-weighted in place."""
        old.plan = new
        self.node_layout = node_layout
        self._router().reweight(app, new)
        n = len(old.topology.processes)
        return Applied(old.gid, old.gid, False, time.monotonic() - t0, processes=n, kept=n)

    def _place_desired(self, desired: DesiredState, old_gid: int) -> tuple[NodeLayout | None, Plan] | Applied:
        """The node layout with the app on its new plan, and the plan laid out: where the decider
        placed it while the node is the one it saw (``Placed``), else beside everything that runs
        and drains when it asked so and the plan still fits there, else as any plan; an ``Applied``
        naming why when it does not fit at all."""
        app, new = desired.app, desired.plan
        beside = self.beside() if desired.beside else None
        if beside is not None and desired.over_draining:
            beside = beside.serving_only()
        placed = desired.placed
        if placed is not None and beside is not None and placed.seen == beside:
            return placed.layout, new
        got = beside.place(app, new) if beside is not None else None
        if beside is not None and got is None:  # the node changed since the controller looked
            self.log(f"{app}: the new plan no longer fits beside what runs and drains; placed as any plan")
        if got is not None:
            return got
        try:
            return self.place(app, new)
        except PackingError as exc:
            self.log(f"{app}: the new plan does not fit beside the node's other apps ({exc}); "
                     f"keeping generation {old_gid}")
            return Applied(old_gid, old_gid, False, error=f"cannot be laid out: {exc}")

    async def _bring_up(self, app: str, node_layout: NodeLayout, why: str) -> Deferred | Applied:
        """Create the MIG instances of ``node_layout`` nothing holds; the ones whose slots are held,
        or an ``Applied`` when NVML failed (rolled back, the running plan serves on)."""
        assert self.partition is not None
        try:
            return await asyncio.to_thread(self.partition.bring_up, node_layout, f"{app}: {why}")
        except JigsawError as exc:
            old_gid = self.current[app]
            self.log(f"{app}: MIG reconfiguration failed ({exc}); rolled back, keeping generation {old_gid}")
            return Applied(old_gid, old_gid, False, error=str(exc))

    async def _switch(self, desired: DesiredState, old: Generation, old_gid: int, new: Plan,
                      node_layout: NodeLayout | None, restore: tuple[Plan, NodeLayout] | None,
                      t0: float, phases: Counter[str] | None = None) -> Applied:
        """Launch the new generation (the processes of identical instances adopted from ``old``),
        route the app to it and retire ``old``; a launch failure restores the running plan where a
        drain-first took instances from it, else keeps ``old`` serving."""
        app, router = desired.app, self._router()
        changed: list[int] = []
        if old.plan.layout is not None and new.layout is not None:
            changed = changed_gpus(old.plan.layout, new.layout)
        gen = self._lay_out(old.app, new)
        pairs = [] if desired.fresh_generation else kept_processes(old, gen)
        gen.adopt(old, pairs)
        try:
            await self._launch(gen, node_layout, router, desired.repartition_delay_s if changed else 0.0,
                               phases)
        except Exception as exc:
            self.log(f"{app}: new generation {gen.gid} failed ({exc}); keeping generation {old.gid}")
            self.failures_total += 1
            await self._abandon(gen)
            if restore is not None:  # the running plan lost instances to the drain: bring them back
                return await self._restore(app, restore, old_gid, str(exc))
            await self._release_mig(f"{app}: generation {gen.gid} failed")
            return Applied(old.gid, old_gid, old.gid != old_gid, error=str(exc))
        router.route(app, gen.gid)
        self.current[app] = gen.gid
        self.node_layout = node_layout
        if restore is not None:
            self.drain_first_total["done"] += 1
        switched_s = time.monotonic() - t0
        self.log(f"{app}: generation {gen.gid}: {len(pairs)} processes kept, "
                 f"{len(gen.topology.processes) - len(pairs)} started; routing switched "
                 f"{switched_s * 1e3:.1f} ms after the plan was decided")
        self._retire_later(old.gid)
        n = len(gen.topology.processes)
        stopped = len(old.topology.processes) - len(old.handed_over)
        self.processes_started_total += n - len(pairs)
        self.processes_kept_total += len(pairs)
        return Applied(gen.gid, old_gid, True, switched_s, tuple(changed), n,
                       kept=len(pairs), started=n - len(pairs), stopped=stopped)

    async def _refused(self, app: str, old_gid: int, why: str, outcome: str, brought_up: bool) -> Applied:
        """A re-plan refused (the decider's ``Refuse``) or failed before its switch (``outcome``):
        the MIG instances ``brought_up`` for it go, the running generation serves on."""
        if brought_up:
            await self._release_mig(f"{app}: re-plan abandoned")
        self.drain_first_total[outcome] += 1
        self.log(f"{app}: cannot free the MIG slots of the new instances ({why}); "
                 f"re-plan {outcome}, keeping generation {old_gid}")
        return Applied(old_gid, old_gid, False, error=f"drain-first {outcome}: {why}")

    async def _launch(self, gen: Generation, layout: NodeLayout | None, router: Router,
                      hold_s: float = 0.0, phases: Counter[str] | None = None) -> None:
        """Bring ``gen`` up beside the running generations: its MPS daemons, its segments, its new
        processes (on spares where it can), the processes it adopted told to serve it too; returns
        once every process is ready (``hold_s``: see ``_wait_ready``), raises otherwise. One
        sequence for a re-plan, a drain-first's interim plan and a restore, so they cannot drift.
        ``phases`` gets the seconds of the start (``spawn``) and of the wait for readiness."""
        t_spawn = time.monotonic()
        mps_env = await asyncio.to_thread(self.mps_daemons.start, gen, layout)
        gen.create_segments()
        # off the loop: starting a spike plan's 15-25 processes (a fork and exec each) held the
        # frontend's loop for seconds on a loaded 2-core host, nothing dispatched or answered and
        # the bin's arrivals counted in the next one (the supervisor skips a generation whose
        # workers are not all started yet)
        await asyncio.to_thread(gen.start_workers, mps_env, self.spares)
        for k in gen.adopted:
            self._tell(gen.workers[k])
        router.add_generation(gen.gid, gen.topology)
        t_ready = time.monotonic()
        try:
            await self._wait_ready(gen, hold_s)
        finally:
            if phases is not None:
                phases["spawn"] += t_ready - t_spawn
                phases["ready"] += time.monotonic() - t_ready

    async def _wait_ready(self, gen: Generation, hold_s: float = 0.0) -> None:
        """Until every process of ``gen`` is ready (and ``hold_s`` passed: a MIG repartition's
        delay); raises when one exits or after ``READY_TIMEOUT_S``."""
        started_at = time.monotonic()
        ready_at = started_at + hold_s
        deadline = started_at + READY_TIMEOUT_S
        while (waiting := gen.not_ready()) or time.monotonic() < ready_at:
            if time.monotonic() > deadline:
                kept = sum(1 for k, spec in enumerate(gen.topology.processes)
                           if k in gen.adopted and spec.name in waiting)
                raise JigsawError(f"generation {gen.gid} not ready after {READY_TIMEOUT_S:g} s "
                                  f"({len(waiting)} processes, {kept} of them kept from an older generation: "
                                  f"{', '.join(waiting[:6])}{', ...' if len(waiting) > 6 else ''})")
            # kept processes are ready within milliseconds of their SIGHUP: look often at first
            soon = time.monotonic() - started_at < READY_FAST_S
            await asyncio.sleep(READY_FAST_POLL_S if soon else READY_POLL_S)

    async def _abandon(self, gen: Generation) -> None:
        """``gen`` failed before serving: unannounce it, hand its adopted processes back (they serve
        only what they served before), stop the ones it started, unlink its segments, and stop the
        MPS daemons nothing uses any more."""
        self._router().remove_generation(gen.gid)
        self.generations.pop(gen.gid, None)
        for back, j in gen.hand_back():
            self._tell(back.workers[j])
        await asyncio.get_running_loop().run_in_executor(None, gen.close)
        await asyncio.to_thread(self.mps_daemons.stop_unused, list(self.generations.values()))


    def _tell(self, proc: subprocess.Popen[bytes]) -> None:
        """Have a kept process serve every live generation that holds it (newest first)."""
        holders = [(g, k) for g in sorted(self.generations.values(), key=lambda g: -g.gid)
                   for k, p in enumerate(g.workers) if p is proc]
        if holders:
            tell(holders[0][0].controls[holders[0][1]], [g.spec_path(k) for g, k in holders], proc)

    # ---- MPS: one control daemon per instance of MPS level k > 1 ---------------------------------


    def in_use_layout(self) -> NodeLayout | None:
        """Every MIG instance a live generation runs on (serving, starting or draining) or the
        node layout holds; overlapping instances of an old and a new plan may both appear."""
        if self.node_layout is None:
            return None
        held = {i.slot: i for i in self.node_layout.instances}
        for g in self.generations.values():
            if g.plan.layout is not None:
                for i in from_app_layouts(self.node.gpu.name, self.node.num_gpus,
                                          {g.app.name: g.plan.layout}).instances:
                    held.setdefault(i.slot, i)
        return self.node_layout.with_instances(held.values())

    async def _release_mig(self, reason: str) -> None:
        """Destroy the MIG instances nothing runs on any more and create the deferred ones."""
        keep = self.in_use_layout()
        if self.partition is None or keep is None:
            return
        try:
            await asyncio.to_thread(self.partition.tear_down, keep, reason)
        except JigsawError as exc:
            self.log(f"MIG clean-up after {reason} failed ({exc}); retried after the next re-plan")
        if self.node_layout is not None:
            self.node_layout = self.partition.with_uuids(self.node_layout)

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

    # ---- the end ---------------------------------------------------------------------------------
    def close(self) -> None:
        if self.spares is not None:
            self.spares.close()
        gens = list(self.generations.values())
        for g in gens:
            g.signal_stop()
        for g in gens:
            g.close()
        self.generations.clear()
        self.mps_daemons.close()  # after every process that used them
        if self.partition is not None:
            self.partition.close()
        self.registry.cleanup()
        shutil.rmtree(self.run_dir, ignore_errors=True)
