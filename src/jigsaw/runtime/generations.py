"""The one owner of generations: create, start, ready, switch, drain, retire.

The controller says what an app should run (``DesiredState``: a plan) and the manager makes it so
(``apply``), per instance: a plan that runs the same processes only re-weights the lanes of the
routes in place; any other plan becomes a new generation, make-before-break. A generation is a
routing version: the processes of the instances both plans run (same GPU, start slot, profile,
variant, MPS level, max batch) are kept (``kept_processes``: same pids, engines stay loaded) and
told to serve the new generation's rings too; only the changed instances get new processes (their
MPS daemons first). Its rings are created while the old generation serves, every process must
report ready (and the new ones sit out the MIG repartition delay when the layout changed GPUs),
the router switches the app to it in one assignment, and the old generation drains (every
accepted request is answered) before the processes not kept stop, the kept ones drop its rings
and its segments are unlinked; then the MPS daemons and MIG instances nothing runs on go. New
instances that need the MIG slots of running ones are preceded by a drain of those
(``_drain_first``) while the app's other processes serve; should the re-plan fail after that
drain, the running plan is brought back (``_restore``: the drained instances created again, their
processes restarted, the app routed back), so a failure never leaves the app on less than it ran.

The manager also holds the node's one layout (``node_layout``, all apps): every plan is placed
against what the other apps hold (``place``), and the MIG instances are kept in step with it
through NVML (``gpu.partition``; the emulated NVML on an emulated node): created before the
generation that needs them starts (a failure rolls them back and the running plan serves on),
destroyed once no live generation runs on them.

The data plane is reached only through the ``Router`` interface (the frontend implements it); the
supervisor reports worker faults to the manager (``worker_failed``, ``worker_restarting``,
``worker_restored``, ``capacity_lost``), which forwards them to the router and to whoever re-plans.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from jigsaw.app import App
from jigsaw.backends.registry import BackendKind
from jigsaw.errors import JigsawError
from jigsaw.gpu.layout import (
    NodeInstance,
    NodeLayout,
    empty_layout,
    from_app_layouts,
    place_app,
    validate_node_layout,
)
from jigsaw.gpu.mps import MpsManager, node_mps
from jigsaw.gpu.nvml import MigApplier
from jigsaw.gpu.partition import MigPartition, overlaps
from jigsaw.mig import NUM_PLACEMENT_SLOTS, GpuModel, share_level
from jigsaw.node import Node, load_node_profiles
from jigsaw.plan import Plan, without_placed
from jigsaw.planner.packer import PackingError, changed_gpus, instances_from_plan
from jigsaw.runtime import stats as st
from jigsaw.runtime.admission import queue_admits
from jigsaw.runtime.forkserver import Launcher
from jigsaw.runtime.generation import Generation, tell
from jigsaw.runtime.gpus import placements
from jigsaw.runtime.rings import Doorbell, SegmentRegistry
from jigsaw.runtime.spares import SparePool
from jigsaw.runtime.topology import ProcessSpec, Topology

FAULT_ENV = "JIGSAW_EMULATED_NVML_FAULT"
MPS_CONTROL_ENV = "JIGSAW_MPS_CONTROL"  # the MPS control binary (on an emulated node: a stand-in script)
READY_TIMEOUT_S = 120.0
MAX_APPLIED = 100
DRAIN_MARGIN_S = 12.0  # beyond the deadline: the frontend keeps a timed-out request 10 s for late credits
READY_POLL_S = 0.02
READY_FAST_S = 0.2  # for this long after the start the readiness is polled every READY_FAST_POLL_S
READY_FAST_POLL_S = 0.002
DRAIN_POLL_S = 0.05
DRAIN_END_MARGIN_S = 0.5  # past a drain's own deadline: the frontend's timers answer its last requests
CUT_WAIT_S = 15.0  # a cut drain's processes stop within ms; past this the re-plan goes on without
DRAIN_FIRST_OUTCOMES = ("done", "refused", "failed", "restored", "restore_failed", "skipped", "not_needed",
                        "headroom", "queue", "outgrown")
RISING_MARGIN = 0.05  # a needed plan this much past the one the headroom rule kept out: still rising
DRAINING = "\x00draining"  # the owner ``place`` gives the slots a draining generation still holds


@dataclass(frozen=True)
class Beside:
    """What a plan placed beside everything that runs sees: the serving layout, and the slots every
    live generation (serving, starting, draining) and every MIG instance of the partition hold.
    Immutable, so the controller's planner thread may place plans against it.

    Why: a needed re-plan's plan was placed as if nothing drained and over the slots of the app's
    own outgoing instances (``place_app``'s fallbacks), so it waited for drains or needed a
    drain-first that left the app no lane, and was refused (ar_assistant, day 0, bins 90-93: three
    refusals while 508-720 req/s met a plan for 227) while the node had 18 slices free.
    """

    layout: NodeLayout  # the serving layout with the other held slots as ``DRAINING`` stand-ins
    held: tuple[NodeInstance, ...]  # every slot held, serving or not
    gpu: GpuModel
    keep_usable: bool = False  # ``place_app``'s: strand the fewest compute slices

    def serving_only(self) -> Beside:
        """The same node with every draining slot taken for free: where a plan fits so, it needs
        only drains to end (a wait), no slot of a running instance (a drain-first)."""
        serving = tuple(i for i in self.layout.instances if i.app != DRAINING)
        return Beside(self.layout.with_instances(serving), serving, self.gpu, self.keep_usable)

    def free_memory_slots(self) -> int:
        """MIG memory slots (of ``NUM_PLACEMENT_SLOTS`` per GPU) nothing holds. Why beside the free
        compute slices: a 3g instance or a 1g.20gb one holds more memory slots than compute slices,
        and a spike's extension found no room with "8 slices free" and no memory slot free."""
        held = {(i.gpu, s) for i in self.layout.instances
                for s in range(i.start, i.start + self.gpu.profile(i.profile).size)}
        return self.layout.num_gpus * NUM_PLACEMENT_SLOTS - len(held)

    def place(self, app: str, plan: Plan) -> tuple[NodeLayout, Plan] | None:
        """The node layout with ``app`` on ``plan`` and the plan laid out, when every instance of
        the app's running plan stays where it runs (same workload) and each other instance goes on
        a slot nothing holds: no drain to wait for, no drain-first, no instance moved. Else None."""
        own = [i for i in self.layout.instances if i.app == app]
        try:
            placed = place_app(self.layout, app, instances_from_plan(plan), self.gpu, self.keep_usable)
        except PackingError:
            return None
        mine = [i for i in placed.instances if i.app == app]
        kept = {(i.slot, i.workload) for i in mine} & {(i.slot, i.workload) for i in own}
        if len(kept) < len(own):  # a running instance moved or hosts another workload
            return None
        for i in mine:
            if (i.slot, i.workload) not in kept and any(
                    overlaps(self.gpu, i, h) and not (h.is_idle and h.slot == i.slot) for h in self.held):
                return None  # an idle instance on its very slot is reused; any other is in the way
        desired = placed.with_instances(i for i in placed.instances if i.app != DRAINING)
        return desired, dataclasses.replace(plan, layout=desired.app_layout(app))


class Router(Protocol):
    """What the manager pushes to the data plane (the frontend implements it)."""

    def add_generation(self, generation: int, topology: Topology) -> None: ...
    def route(self, app: str, generation: int) -> None: ...
    def unroute(self, app: str) -> None: ...
    def reweight(self, app: str, plan: Plan) -> None: ...
    def pending_in(self, generation: int) -> int: ...
    def unanswered_in(self, generation: int) -> int: ...
    def queued_end_s(self, app: str) -> float | None: ...
    def cut_generation(self, generation: int) -> tuple[int, int, int]: ...
    def remove_generation(self, generation: int) -> None: ...
    def worker_failed(self, generation: int, app: str, task: str, variant: str,
                      reason: str, suspects: frozenset[int] = frozenset()) -> tuple[int, int]: ...
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
    # the running plan holds the demand this plan is for: it is a better plan, not a needed one, so
    # it is not worth a drain-first, nor a wait for the drains in its way
    running_holds: bool = False
    # placed beside everything that runs and drains where it fits so (``Beside.place``: the running
    # instances kept, the others on slots nothing holds), else as any plan: a needed plan, which
    # should not wait for a drain or drain the app's own instances
    beside: bool = False
    # with ``beside``: placed beside what serves only, on slots that drain where it needs them
    # (``Beside.serving_only``): it waits for those drains, never drains a running instance
    over_draining: bool = False
    # for a needed plan: asked again before a drain-first of the app's running instances (after
    # any wait for the drains in the way), whether the plan is still needed; False keeps the
    # running plan. None: needed whatever happens
    still_needed: Callable[[], bool] | None = None
    # for a needed plan that waits for the drains in its way: asked at each poll of the wait; True
    # (the rate now arriving is well above the demand this plan was asked for) ends the wait and
    # changes nothing, so the node's re-plan lock is free for a plan sized to that rate
    # None: never asked
    outgrown: Callable[[], bool] | None = None


@dataclass(frozen=True)
class Applied:
    """What ``apply`` did: the generation serving now, and whether it is a new one."""

    generation: int
    previous: int
    new_generation: bool  # False: re-weighted in place, or the new generation failed (``error``)
    seconds: float = 0.0  # plan decided (``apply`` called) -> routing switched
    changed_gpus: tuple[int, ...] = ()
    processes: int = 0
    error: str | None = None
    kept: int = 0  # processes of the old generation the new one serves with (same pids)
    started: int = 0  # processes started for it (the changed instances')
    stopped: int = 0  # processes of the old generation stopped once it drained
    # a re-plan that failed after its drain-first drained instances: True when the running plan
    # was brought back (its drained instances re-created and their processes restarted), False when
    # that failed too (the interim generation serves on); None when no restore was needed
    restored: bool | None = None
    # why the running plan serves on although nothing failed (a drain-first not worth making)
    note: str | None = None
    # the plan was refused before anything changed (``DrainRefused``: a drain-first would leave the
    # app no lane, or the slots in its way are not the app's own): a plan that keeps the running
    # instances may still be applied
    refused: bool = False


Slot = tuple[int, int]  # a MIG instance's (GPU, start)


class WaitOutgrown(Exception):
    """A needed plan's wait for the drains in its way ended because the arrivals outgrew the plan
    (``DesiredState.outgrown``): nothing was cut or changed."""


class DrainRefused(JigsawError):
    """A drain-first re-plan that cannot be made safely (nothing was changed): the app would have
    no lane while the instances in the way drain, or their slots are not the app's own."""


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


def kept_processes(old: Generation, new: Generation) -> list[tuple[int, int]]:
    """(new's process, old's process) pairs of the same instance (``Generation.process_keys``):
    the live processes of ``old`` that ``new`` serves with instead of starting its own."""
    alive = {j: key for j, key in enumerate(old.process_keys())
             if j not in old.handed_over and j < len(old.workers) and old.workers[j].poll() is None
             and old.stats is not None
             and old.stats.get(old.topology.processes[j].slot, st.STATE) == st.READY}
    by_key = {key: j for j, key in alive.items()}
    return [(k, by_key[key]) for k, key in enumerate(new.process_keys()) if key in by_key]


def without_instances(plan: Plan, slots: set[tuple[int, int]]) -> Plan | None:
    """``plan`` less its instances at ``slots`` (GPU, start): the processes that serve on while
    those are drained to free their MIG slots. Only the lanes whose every variant still runs are
    kept (their weights as planned); None when no lane is left."""
    less = without_placed(plan, slots)
    return None if less is None else _served(less)


def _served(plan: Plan) -> Plan | None:
    """``plan`` with only the lanes whose every variant runs; None when none does."""
    running = {(i.task, i.variant) for i in plan.instances if i.count > 0}
    lanes = [lp for lp in plan.lanes if all(tv in running for tv in lp.variants.items())]
    return dataclasses.replace(plan, lanes=lanes) if lanes else None


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
                 backend: BackendKind, log: Callable[[str], None] = print, nvml: Any = None,
                 spare_workers: int = 0, launcher: Launcher | None = None,
                 drain_wait_slo: float = 0.25, keep_usable: bool = True) -> None:
        self.node = node
        # what a drain-first (and a needed plan's wait for the drains in its way past their end)
        # waits for the requests of what is in its way, as a share of the app's SLO; and whether
        # new MIG instances go where they strand the fewest compute slices. Given by the caller
        # (the daemon, from the node's [control]): the runtime reads no [control] setting itself
        self.drain_wait_slo = drain_wait_slo
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
        # the MPS daemons are started and stopped from threads (a re-plan's, a retirement's): one
        # at a time, or two stop the same daemon
        self._mps_lock = threading.Lock()
        # the node's one layout, all apps together (GPU nodes): every plan is placed against it
        # (a GPU model without MIG - whole GPUs - has no partition to keep: ``mig`` false)
        partitioned = node.gpu.kind == "gpu" and getattr(node.gpu, "mig", True)
        self.node_layout: NodeLayout | None = empty_layout(node.gpu, node.num_gpus) if partitioned else None
        # the MIG instances that exist: NVML on a GPU node, the emulated NVML on an emulated one
        self.partition: MigPartition | None = None
        self._fault = ""
        if self.node_layout is not None and (backend.emulated or backend.on_gpus(node.gpu.kind)):
            if nvml is None and backend.emulated:
                from jigsaw.gpu.emulated_nvml import EmulatedNvml

                nvml = EmulatedNvml(node.gpu, node.num_gpus)
                self._fault = os.environ.get(FAULT_ENV, "")
            self.partition = MigPartition(node.gpu, node.num_gpus, MigApplier(node.gpu, nvml))
            self.node_layout = self.partition.adopt()  # idle instances: placed apps reuse them
        # one MPS control daemon per MIG instance (or whole GPU: ``mps_gpus``) of MPS level k > 1,
        # in a private run directory (``gpu/mps.py`` ``node_mps``; a stand-in: ``JIGSAW_MPS_CONTROL``)
        self.mps: MpsManager | None
        self.mps, self.mps_gpus = node_mps(
            node.gpu, node.num_gpus, self.run_dir / "mps", emulated=backend.emulated,
            on_gpus=backend.on_gpus(node.gpu.kind), partitioned=self.partition is not None,
            binary=os.environ.get(MPS_CONTROL_ENV, ""))
        self.mps_started_total = 0
        self.mps_stopped_total = 0
        self.mps_failures_total = 0
        self.failures_total = 0  # new generations that failed to start (the running one served on)
        # drains ended for a re-plan that needed their slots once it had waited for them, and
        # their requests: forgotten (answered, only waiting for late credits), re-sent on the
        # current generation, failed
        self.drains_cut_total = 0
        self.cut_requests_total: Counter[str] = Counter()
        # drain-first re-plans by outcome: done, refused, failed (before the drain: nothing changed),
        # restored (failed after it: the running plan brought back), restore_failed
        self.drain_first_total: Counter[str] = Counter()
        # app -> (running generation, the least rate a needed plan the headroom rule kept out of a
        # drain-first over it planned): a later plan past it by RISING_MARGIN is a spike still rising
        self._headroom_kept: dict[str, tuple[int, float]] = {}
        self.processes_started_total = 0
        self.processes_kept_total = 0
        self.mps_events: list[dict[str, Any]] = []
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
        if not validate_node_layout(seed, gpu):
            self.node_layout = seed

    def place(self, app: str, plan: Plan) -> tuple[NodeLayout | None, Plan]:
        """The node layout with ``app`` on ``plan``, laid out against what the other apps hold
        (its own unchanged instances stay where they run), and the plan with its part of it as
        its layout. Pure: nothing changes until the plan is applied. Raises ``PackingError``."""
        if self.node_layout is None:
            return None, plan
        gpu = self.node.gpu
        desired = place_app(self.node_layout, app, instances_from_plan(plan), gpu, self.keep_usable)
        problems = validate_node_layout(desired, gpu)
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

    def prometheus(self) -> str:
        """Process and MPS counters of the reconfigurations (for ``/metrics``)."""
        rows = [
            ("jigsaw_reconfig_processes_started_total", "counter",
             "worker processes started by re-plans (the changed instances')",
             self.processes_started_total),
            ("jigsaw_reconfig_processes_kept_total", "counter",
             "worker processes a re-plan kept serving (same pid, routing changed only)",
             self.processes_kept_total),
            ("jigsaw_reconfig_failures_total", "counter",
             "re-plans whose new processes failed to start (rolled back; the running plan served on)",
             self.failures_total),
            ("jigsaw_reconfig_drains_cut_total", "counter",
             "drains a re-plan that needed their MIG slots ended after waiting for them",
             self.drains_cut_total),
            ("jigsaw_reconfig_cut_forgotten_total", "counter",
             "answered requests of cut drains that were still waiting for late credits (forgotten)",
             self.cut_requests_total["forgotten"]),
            ("jigsaw_reconfig_cut_resent_total", "counter",
             "unanswered requests of cut drains dispatched again on the app's current generation",
             self.cut_requests_total["resent"]),
            ("jigsaw_reconfig_cut_failed_total", "counter",
             "unanswered requests of cut drains answered 503/504 (no time left to run them again)",
             self.cut_requests_total["failed"]),
            ("jigsaw_reconfig_drain_waits_total", "counter",
             "re-plans the app needed that waited for the drains in their way",
             self.drain_waits_total),
            ("jigsaw_reconfig_drain_wait_seconds_total", "counter",
             "wall seconds those re-plans waited for the drains in their way",
             round(self.drain_wait_s_total, 3)),
            ("jigsaw_reconfig_drains_total", "counter", "drains of replaced generations that ended",
             self.drains_total),
            ("jigsaw_reconfig_drain_seconds_total", "counter",
             "wall seconds the replaced generations drained, in all", round(self.drain_s_total, 3)),
            ("jigsaw_mps_daemons_started_total", "counter", "MPS control daemons started",
             self.mps_started_total),
            ("jigsaw_mps_daemons_stopped_total", "counter", "MPS control daemons stopped",
             self.mps_stopped_total),
            ("jigsaw_mps_failures_total", "counter", "MPS control daemon starts or stops that failed",
             self.mps_failures_total),
            ("jigsaw_mps_daemons", "gauge", "MPS control daemons running",
             len(self.mps.daemons) if self.mps is not None else 0),
        ]
        text = "".join(f"# HELP {n} {h}\n# TYPE {n} {t}\n{n} {v}\n" for n, t, h, v in rows)
        if self.spares is not None:
            text += self.spares.prometheus()
        name = "jigsaw_reconfig_drain_first_total"
        text += (f"# HELP {name} re-plans whose new MIG instances needed the slots of running ones, by "
                 "outcome (done; refused: no lane while they drain; failed before the drain; restored: "
                 "failed after it, the running plan brought back; restore_failed: the interim plan serves; "
                 "skipped: the running plan held the demand; not_needed: the rate fell to one the running "
                 "plan holds before the drain-first; headroom: the new plan planned less than the "
                 "running plan serves at full utilization; queue: the running plan's queue was longer "
                 "than a drain-first waits; outgrown: the arrivals outgrew the new plan while it "
                 "waited for the drains in its way)\n"
                 f"# TYPE {name} counter\n")
        return text + "".join(f'{name}{{outcome="{k}"}} {self.drain_first_total[k]}\n'
                              for k in DRAIN_FIRST_OUTCOMES)

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
            g.start_workers(self._start_mps(g, self.node_layout))
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
    async def apply(self, desired: DesiredState) -> Applied:
        """Make ``desired`` the app's running state: in place when it runs the same processes, else
        as a new generation; the old one drains and retires in the background.

        Raises when the plan cannot be laid out (nothing was started); a generation that fails to
        start is removed and reported in ``Applied.error`` while the old one keeps serving.
        """
        async with self._lock:
            done = await self._apply(desired)
            if self.spares is not None:
                self.spares.refill()  # after the switch, off its path
        self.applied.append({"at": time.time(), "app": desired.app, **dataclasses.asdict(done)})
        del self.applied[:-MAX_APPLIED]
        return done

    async def _apply(self, desired: DesiredState) -> Applied:
        router = self._router()
        t0 = time.monotonic()  # the plan is decided: the time to the routing switch counts from here
        app, new = desired.app, desired.plan
        old_gid = self.current[app]
        old = self.generations[old_gid]
        beside = self.beside() if desired.beside else None
        if beside is not None and desired.over_draining:
            beside = beside.serving_only()
        got = beside.place(app, new) if beside is not None else None
        if beside is not None and got is None:  # the node changed since the controller looked
            self.log(f"{app}: the new plan no longer fits beside what runs and drains; placed as any plan")
        if got is not None:
            node_layout, new = got
        else:
            try:
                node_layout, new = self.place(app, new)
            except PackingError as exc:
                self.log(f"{app}: the new plan does not fit beside the node's other apps ({exc}); "
                         f"keeping generation {old_gid}")
                return Applied(old_gid, old_gid, False, error=f"cannot be laid out: {exc}")
        if not desired.fresh_generation and same_instances(old.plan, new) and not old.failed_workers():
            old.plan = new
            self.node_layout = node_layout
            router.reweight(app, new)
            n = len(old.topology.processes)
            return Applied(old_gid, old_gid, False, time.monotonic() - t0, processes=n, kept=n)
        changed: list[int] = []
        if old.plan.layout is not None and new.layout is not None:
            changed = changed_gpus(old.plan.layout, new.layout)
        # once a drain-first has drained the instances in the way, a failure goes back to this
        # (the running plan and the node layout it ran on) instead of staying on the interim plan
        restore: tuple[Plan, NodeLayout] | None = None
        if self.partition is not None and node_layout is not None:
            try:
                deferred = await asyncio.to_thread(self.partition.bring_up, node_layout, f"{app}: re-plan")
                # a plan the running one does not need (it holds the demand) is not worth a
                # drain-first nor a wait: it is skipped. A needed plan whose drain-first would cost
                # more than the running plan, run hot, loses keeps the running plan, before any wait
                # for the drains in its way; else it waits for those drains to end and takes their
                # slots (refused before the wait when its drain-first would leave the app no lane)
                needed = not desired.running_holds
                kept_by = self._serves_on(app, old, new, node_layout, deferred) \
                    if deferred and needed else None
                skip = bool(deferred) and (not needed or kept_by is not None)
                if deferred and not skip:
                    await self._no_lane_before_wait(app, old, new, node_layout, deferred)
                if deferred and not skip and await self._wait_for_drains(
                        app, node_layout, deferred, desired.still_needed, desired.outgrown):
                    deferred = await asyncio.to_thread(self.partition.bring_up, node_layout,
                                                       f"{app}: re-plan, the drains in its way ended")
                    # the wait took seconds in which the running plan's queue grew or emptied:
                    # the drain-first is weighed again against the queue as it stands now
                    if deferred:
                        kept_by = self._serves_on(app, old, new, node_layout, deferred, waited=True)
                        skip = kept_by is not None
            except DrainRefused as exc:  # before the wait for the drains in its way
                return await self._refused(app, old_gid, exc)
            except WaitOutgrown:
                # the arrivals outgrew the plan while it waited: it changes nothing, and the
                # re-plan lock goes to the rate trigger's next plan, sized to what arrives
                await self._release_mig(f"{app}: re-plan outgrown")
                self.drain_first_total["outgrown"] += 1
                note = (f"the arrivals outgrew the new plan ({new.planned_rps:.1f} rps) while it waited "
                        f"for the drains in its way: nothing changed, keeping generation {old_gid}")
                self.log(f"{app}: {note}")
                return Applied(old_gid, old_gid, False, time.monotonic() - t0, note=note)
            except JigsawError as exc:
                self.log(f"{app}: MIG reconfiguration failed ({exc}); rolled back, "
                         f"keeping generation {old_gid}")
                return Applied(old_gid, old_gid, False, error=str(exc))
            # the spike the plan was for has passed while it waited: a drain-first now would serve
            # the passed spike's backlog on part of the running plan, which holds the rate
            recheck = desired.still_needed
            passed = bool(deferred) and not skip and recheck is not None and not recheck()
            if skip or passed:
                # the running plan holds the demand: cutting drains would send their requests again,
                # and a drain-first would serve on part of the plan for up to an SLO, holding every
                # re-plan of the node meanwhile, for a better plan only
                await self._release_mig(f"{app}: re-plan {'no longer needed' if passed else 'skipped'}")
                self.drain_first_total["not_needed" if passed else kept_by[0] if kept_by else "skipped"] += 1
                holds = "the rate now arriving is one the running plan holds" if passed \
                    else kept_by[1] if kept_by else "the running plan holds the demand"
                note = (f"the new plan's MIG instances need the slots of {len(deferred)} running or "
                        f"draining ones and {holds}: no drain-first, keeping generation {old_gid}")
                self.log(f"{app}: {note}")
                return Applied(old_gid, old_gid, False, time.monotonic() - t0, note=note)
            if deferred:
                assert self.node_layout is not None
                before = (old.plan, self.node_layout)
                try:
                    old = await self._drain_first(app, old, new, node_layout, deferred)
                except JigsawError as exc:
                    self.failures_total += 1
                    if self.current[app] != old_gid:  # it failed after the drain: bring the plan back
                        self.log(f"{app}: the re-plan failed after its drain-first ({exc})")
                        return await self._restore(app, before, old_gid, str(exc))
                    return await self._refused(app, old_gid, exc)
                restore = before
            node_layout = self.partition.with_uuids(node_layout)
        gen = self._lay_out(old.app, new)
        pairs = [] if desired.fresh_generation else kept_processes(old, gen)
        gen.adopt(old, pairs)
        try:
            await self._launch(gen, node_layout, router, desired.repartition_delay_s if changed else 0.0)
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

    async def _refused(self, app: str, old_gid: int, exc: JigsawError) -> Applied:
        """A drain-first that was refused (``DrainRefused``: nothing changed) or failed before its
        switch: the MIG instances brought up for it go, the running generation serves on."""
        await self._release_mig(f"{app}: re-plan abandoned")
        outcome = "refused" if isinstance(exc, DrainRefused) else "failed"
        self.drain_first_total[outcome] += 1
        self.log(f"{app}: cannot free the MIG slots of the new instances ({exc}); "
                 f"re-plan {outcome}, keeping generation {old_gid}")
        return Applied(old_gid, old_gid, False, error=f"drain-first {outcome}: {exc}",
                       refused=outcome == "refused")

    async def _launch(self, gen: Generation, layout: NodeLayout | None, router: Router,
                      hold_s: float = 0.0) -> None:
        """Bring ``gen`` up beside the running generations: its MPS daemons, its segments, its new
        processes (on spares where it can), the processes it adopted told to serve it too; returns
        once every process is ready (``hold_s``: see ``_wait_ready``), raises otherwise. One
        sequence for a re-plan, a drain-first's interim plan and a restore, so they cannot drift."""
        mps_env = await asyncio.to_thread(self._start_mps, gen, layout)
        gen.create_segments()
        # off the loop: starting a spike plan's 15-25 processes (a fork and exec each) held the
        # frontend's loop for seconds on a loaded 2-core host, nothing dispatched or answered and
        # the bin's arrivals counted in the next one (the supervisor skips a generation whose
        # workers are not all started yet)
        await asyncio.to_thread(gen.start_workers, mps_env, self.spares)
        for k in gen.adopted:
            self._tell(gen.workers[k])
        router.add_generation(gen.gid, gen.topology)
        await self._wait_ready(gen, hold_s)

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
        await asyncio.to_thread(self._stop_unused_mps)

    def _drain_budget_s(self, g: Generation) -> float:
        """The longest a request of ``g`` may still take (wall seconds): the app's SLO and hops,
        times the time scale; a drain's own deadline counts from its switch with it."""
        return (g.app.latency_slo_ms + g.app.depth * self.node.planner.hop_latency_ms) \
            * self.time_scale / 1000.0

    def _drain_first_wait_s(self, g: Generation) -> float:
        """How long a drain-first waits for the requests of the instances it drains (wall
        seconds): ``drain_wait_slo`` of ``_drain_budget_s``."""
        return self.drain_wait_slo * self._drain_budget_s(g)

    async def _wait_for_drains(self, app: str, desired: NodeLayout,
                               deferred: tuple[tuple[int, int, str], ...],
                               still_needed: Callable[[], bool] | None = None,
                               outgrown: Callable[[], bool] | None = None) -> bool:
        """Some of the new instances' slots are held by generations that no longer serve (their
        drain runs in the background, up to an SLO and the late-credit grace) or by the MIG
        instances of ones that just retired: wait for those drains to end, until every request
        they hold is answered, at most until their own deadline (``_drain_ends``: by then the
        frontend has answered each 504 at its deadline, so none is sent again), then settle what
        is left (late credits forgotten), retire them and free their slots, so the caller can take
        them. True when slots were freed.

        A plan ``still_needed`` no longer answers for ends the wait at once and frees nothing
        (False: the caller keeps the running plan); a plan the arrivals have ``outgrown`` (asked
        at each poll) raises ``WaitOutgrown``, nothing freed.

        Why: refused, a spike's plan was retried only at the next trigger, after the drain had
        ended anyway; cut short at once or after a part of the SLO, the drains' requests were sent
        again and came back late (both measured more violations in alternating replays)."""
        assert self.partition is not None
        gpu = self.node.gpu
        want = [i for i in desired.instances if i.slot in set(deferred)]
        router = self._router()
        in_way = sorted(gid for gid, held in self._draining_by_generation().items()
                        if gid in self._retiring_gids
                        and any(overlaps(gpu, w, i) for w in want for i in held))
        if in_way:
            t0 = time.monotonic()
            t_end = max(self._drain_ends.get(g, t0) for g in in_way) + DRAIN_END_MARGIN_S
            passed = grew = False
            while any(router.unanswered_in(g) for g in in_way if g in self._retiring_gids) \
                    and time.monotonic() < t_end:
                if still_needed is not None and not still_needed():
                    passed = True
                    break
                if outgrown is not None and outgrown():
                    grew = True
                    break
                await asyncio.sleep(DRAIN_POLL_S)
            in_way = [g for g in in_way if g in self._retiring_gids]
            self.drain_waits_total += 1
            self.drain_wait_s_total += time.monotonic() - t0
            self.log(f"{app}: the new instances need slots of draining generation(s); waited "
                     f"{(time.monotonic() - t0) * 1e3:.0f} ms for their drains to end"
                     + (" (the plan is no longer needed: the wait ends there)" if passed else "")
                     + (" (the arrivals outgrew the plan: the wait ends there)" if grew else ""))
            if grew:
                raise WaitOutgrown
            if passed:
                return False
        if in_way and not await self._end_drains(app, in_way):
            return False
        in_use = self.in_use_layout()
        assert in_use is not None
        used = {i.slot: i for i in in_use.instances}
        orphans = [e for e in self.partition.existing.values()
                   if e.slot not in used and any(overlaps(gpu, w, e) for w in want)]
        if not in_way and not orphans:
            return False
        # what runs, and the new plan's instances (those made already stay): the rest goes
        keep = in_use.with_instances({**used, **{i.slot: i for i in desired.instances}}.values())
        try:
            await asyncio.to_thread(self.partition.tear_down, keep,
                                    f"{app}: the retired generations in the way of a re-plan")
        except JigsawError as exc:
            self.log(f"{app}: freeing the slots of the retired generations failed ({exc})")
            return False
        return True

    async def _end_drains(self, app: str, gids: list[int]) -> bool:
        """Settle the requests the draining generations ``gids`` still hold (the router: answered
        ones waiting for late credits forgotten, unanswered ones dispatched again on the app's
        current generation or answered 503/504) and wait for their retirement (processes stopped,
        segments unlinked, MPS daemons stopped). False when one did not retire in time."""
        router = self._router()
        settled: Counter[str] = Counter()
        for gid in gids:
            forgotten, resent, failed = router.cut_generation(gid)
            settled.update(forgotten=forgotten, resent=resent, failed=failed)
            self._cut.setdefault(gid, asyncio.Event()).set()
        self.drains_cut_total += len(gids)
        self.cut_requests_total.update(settled)
        t0 = time.monotonic()
        # until their retirement is done: it stops their MPS daemons itself (not twice at once)
        while set(gids) & self._retiring_gids and time.monotonic() - t0 < CUT_WAIT_S:
            await asyncio.sleep(READY_FAST_POLL_S)
        self.log(f"{app}: the drains of generation(s) {', '.join(map(str, gids))} in the new "
                 f"instances' way ended ({settled['forgotten']} answered requests' late credits "
                 f"forgotten, {settled['resent']} sent again, {settled['failed']} failed), retired in "
                 f"{(time.monotonic() - t0) * 1e3:.0f} ms")
        return not set(gids) & self._retiring_gids

    def _retire_later(self, gid: int) -> None:
        task = asyncio.get_running_loop().create_task(self._drain_and_retire(gid))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _restore(self, app: str, before: tuple[Plan, NodeLayout], old_gid: int, error: str) -> Applied:
        """A re-plan failed after its drain-first drained and destroyed instances of the running
        plan: re-create those MIG instances on their slots (the new plan's go first), restart their
        processes (MPS daemons first) beside the interim generation's, wait until they are ready and
        route the app back to the running plan. If that fails too, what it made is undone and the
        interim generation serves on (said in the log, the history and ``/metrics``)."""
        assert self.partition is not None
        plan, layout = before
        router = self._router()
        mid = self.generations[self.current[app]]
        target = self.in_use_layout()
        assert target is not None
        held = {i.slot: i for i in target.instances}
        held.update({i.slot: i for i in layout.instances})
        target = target.with_instances(held.values())
        back: Generation | None = None
        try:
            await asyncio.to_thread(self.partition.tear_down, target, f"{app}: restoring the running plan")
            missing = sorted(i.name for i in layout.instances if i.slot not in self.partition.existing)
            if missing:
                raise JigsawError(f"MIG instances {', '.join(missing)} could not be created again")
            layout = self.partition.with_uuids(layout)
            back = self._lay_out(mid.app, plan)
            back.adopt(mid, kept_processes(mid, back))
            await self._launch(back, layout, router)
        except Exception as exc:
            if back is not None:
                await self._abandon(back)
            await self._release_mig(f"{app}: restoring the running plan failed")
            self.drain_first_total["restore_failed"] += 1
            why = (f"{error}; RESTORING THE RUNNING PLAN FAILED TOO ({exc}): the interim plan of "
                   f"generation {mid.gid} serves on, short of the drained instances, until the next re-plan")
            self.log(f"{app}: {why}")
            return Applied(mid.gid, old_gid, mid.gid != old_gid, error=why, restored=False)
        router.route(app, back.gid)
        self.current[app] = back.gid
        self.node_layout = layout
        self._retire_later(mid.gid)  # every process of it is kept: it only drops its wiring
        self.drain_first_total["restored"] += 1
        started = len(back.own())
        self.processes_started_total += started
        why = (f"{error}; rolled back: the running plan serves again (generation {back.gid}: "
               f"{started} processes restarted on re-created MIG instances)")
        self.log(f"{app}: {why}")
        return Applied(back.gid, old_gid, True, changed_gpus=tuple(sorted({i.gpu for i in layout.instances})),
                       processes=len(back.topology.processes), error=why, kept=len(back.adopted),
                       started=started, restored=True)

    def _blockers(self, app: str, old: Generation, desired: NodeLayout,
                  deferred: tuple[tuple[int, int, str], ...]) -> tuple[set[Slot], set[Slot]]:
        """The slots (GPU, start) of the MIG instances in the way of the new ones at ``deferred``,
        and those of them the app's running plan owns."""
        assert self.partition is not None and self.node_layout is not None
        gpu = self.node.gpu
        want = [i for i in desired.instances if i.slot in set(deferred)]
        mine = {(i.gpu, i.start): i for i in self.node_layout.instances}
        blockers = {(e.gpu, e.start) for e in self.partition.existing.values()
                    if any(overlaps(gpu, w, e) for w in want)}
        owned = set(placements(old.plan.layout).values()) if old.plan.layout is not None else set()
        own = {b for b in blockers if b in mine and mine[b].app == app and b in owned}
        return blockers, own

    def _serves_on(self, app: str, old: Generation, new: Plan, desired: NodeLayout,
                   deferred: tuple[tuple[int, int, str], ...], *, waited: bool = False
                   ) -> tuple[str, str] | None:
        """For a plan the app needs whose MIG instances need the slots of its running instances
        (a drain-first), while the running plan's queue still admits a new request
        (``admission.queue_admits``: the work queued on its lanes and their fastest path within
        0.75 of a deadline): (outcome, why) when the running plan serves on instead, else None.

        - ``headroom``: ``new`` plans less than the running plan serves at full utilization (its
          planned rate over ``planner.max_utilization``). The planner leaves each instance
          ``1 - max_utilization`` of its throughput as room for queueing, and a spike's request
          may queue for its whole deadline, so the running plan, run hot, serves what such a plan
          plans. A plan more than ``RISING_MARGIN`` past the least one this rule kept out over the
          same running generation is a spike still rising: it drains first now, while the interim
          plan still holds most of the rate. A plan capped below the rate it was asked for
          (``demand_rps``: the node's capacity, a quick plan's fraction) is weighed by that rate.
        - ``queue``: the running plan's queue is longer than the drain-first waits for the
          instances it drains (``drain_wait_slo``): what they hold past that wait is sent again
          behind the interim plan's queue or answered 504, while the running plan would answer it
          within its deadline.

        Both are weighed when the plan is decided and again (``waited``) after a wait for the
        drains in its way, which can take seconds in which the running plan's queue grows.

        Why: a drain-first serves on part of the plan for up to a quarter of the SLO and answers
        504 what the drained instances' queue cannot finish; on the Twitter day replays such
        drain-firsts failed hundreds of requests and switched 7-13 s after they were decided.
        """
        _, own = self._blockers(app, old, desired, deferred)
        queued_s = self._router().queued_end_s(app)
        if not own or queued_s is None or not queue_admits(queued_s, self._drain_budget_s(old)):
            return None
        after = " after the wait for the drains in its way" if waited else ""
        full_rps = old.plan.planned_rps / self.node.planner.max_utilization
        # a plan capped below what it was asked for (the node's capacity, a quick plan's fraction)
        # is weighed by that demand: the running plan must serve the demand, not the cap
        need_rps = max(new.planned_rps, new.demand_rps)
        asked = f"it is asked for {need_rps:.1f} rps" if need_rps > new.planned_rps else \
            f"it plans {new.planned_rps:.1f} rps"
        if need_rps < full_rps * (1 - 1e-9):
            kept = self._headroom_kept.get(app)
            least_rps = kept[1] if kept is not None and kept[0] == old.gid else need_rps
            if not need_rps > least_rps * (1 + RISING_MARGIN):
                self._headroom_kept[app] = (old.gid, min(least_rps, need_rps))
                return "headroom", (f"{asked}, less than the running plan's "
                                    f"{old.plan.planned_rps:.1f} serves at full utilization{after}")
            if not waited:  # said once per plan, not again when weighed after the wait
                self.log(f"{app}: a plan for {need_rps:.1f} rps, past the {least_rps:.1f} the "
                         "headroom rule kept out over the running plan: the spike still rises, "
                         "no headroom kept")
        elif need_rps > new.planned_rps and not waited:
            self.log(f"{app}: {asked}, past the {full_rps:.1f} the running plan serves at full "
                     f"utilization, and plans {new.planned_rps:.1f}: no headroom kept")
        wait_s = self._drain_first_wait_s(old)
        if queued_s > wait_s:
            return "queue", (f"the running plan's queue ({queued_s:.1f} s) is longer than a drain-first "
                             f"waits ({wait_s:.1f} s) and within what its door admits{after}")
        return None

    async def _no_lane_before_wait(self, app: str, old: Generation, new: Plan, desired: NodeLayout,
                                   deferred: tuple[tuple[int, int, str], ...]) -> None:
        """Raise ``DrainRefused`` when the new instances also need the slots of so many of the app's
        running instances that it would have no lane left while they drain: the drain-first after
        a wait for the drains in the way would refuse the plan anyway (the running instances stay
        in the way whatever the drains do, and taking more slots leaves fewer lanes), so it is
        refused before the wait, and the re-plan's quick plan goes out at once."""
        _, own = self._blockers(app, old, desired, deferred)
        if own and without_instances(old.plan, own) is None:
            raise DrainRefused(f"the app would have no lane left to serve while the {len(own)} "
                               "instances in the way of the new ones drain (refused before waiting "
                               "for the drains in the way)")

    async def _drain_first(self, app: str, old: Generation, new: Plan, desired: NodeLayout,
                           deferred: tuple[tuple[int, int, str], ...]) -> Generation:
        """No free slots for some new instances: drain the app's instances in their way first while
        its other processes (and every other app) serve on, then destroy those and create the new
        ones. Returns the generation now serving (the old one less the drained instances).

        Raises ``DrainRefused`` (nothing changed) when it cannot be done safely; any other failure
        before the switch to the interim generation leaves the running one serving, one after it
        leaves the interim one serving (the caller restores the running plan)."""
        assert self.partition is not None and self.node_layout is not None
        mine = {(i.gpu, i.start): i for i in self.node_layout.instances}
        blockers, own = self._blockers(app, old, desired, deferred)
        strangers = [mine[b].name if b in mine else f"gpu{b[0]}/start{b[1]}" for b in blockers - own]
        if strangers:
            raise DrainRefused(f"the slots are held by instances the app's running plan does not own "
                               f"({', '.join(sorted(strangers))}; a draining generation?)")
        wanted = sum(1 for i in desired.instances if i.slot in set(deferred))
        mid_plan = without_instances(old.plan, blockers)
        if mid_plan is not None:
            self.log(f"{app}: {wanted} new MIG instances need the slots of {len(blockers)} running ones: "
                     "draining those first while the rest serves")
            return await self._drain_step(app, old, mid_plan, blockers, self.node_layout, desired)
        raise DrainRefused(f"the app would have no lane left to serve while the {len(blockers)} "
                           "instances in the way of the new ones drain")

    async def _drain_step(self, app: str, old: Generation, mid_plan: Plan, drained: set[Slot],
                          layout: NodeLayout, desired: NodeLayout) -> Generation:
        """The drain of a drain-first: switch the app to ``mid_plan`` (on ``layout``: the node's
        instances with those it runs on), drain ``old`` (briefly: ``_retire``'s ``first``), destroy
        the ``drained`` instances and create every instance of ``desired``. Returns ``mid_plan``'s
        generation."""
        assert self.partition is not None
        router = self._router()
        mid = self._lay_out(old.app, mid_plan)
        mid.adopt(old, kept_processes(old, mid))
        try:
            await self._launch(mid, layout, router)
        except Exception as exc:
            await self._abandon(mid)
            raise JigsawError(f"the processes serving while the instances drain did not start: {exc}") \
                from None
        router.route(app, mid.gid)
        self.current[app] = mid.gid
        self.node_layout = layout.with_instances(i for i in layout.instances
                                                 if (i.gpu, i.start) not in drained)
        # drained (briefly: see ``_retire``'s ``first``), stopped, its segments unlinked; MPS
        # daemons stopped
        await self._retire(old.gid, first=True)
        keep = self.in_use_layout()
        assert keep is not None
        try:
            await asyncio.to_thread(self.partition.tear_down, keep, f"{app}: drained for the new instances")
            left = await asyncio.to_thread(self.partition.bring_up, desired, f"{app}: re-plan")
        except JigsawError as exc:
            raise JigsawError(f"MIG reconfiguration failed after the drain: {exc}") from None
        if left:
            raise JigsawError(f"MIG slots {sorted(left)} still held after the drain")
        return mid

    def _tell(self, proc: subprocess.Popen[bytes]) -> None:
        """Have a kept process serve every live generation that holds it (newest first)."""
        holders = [(g, k) for g in sorted(self.generations.values(), key=lambda g: -g.gid)
                   for k, p in enumerate(g.workers) if p is proc]
        if holders:
            tell(holders[0][0].controls[holders[0][1]], [g.spec_path(k) for g, k in holders], proc)

    # ---- MPS: one control daemon per instance of MPS level k > 1 ---------------------------------
    def _mps_slots(self, g: Generation, ks: list[int]) -> set[tuple[int, int]]:
        """(GPU, start) of the processes of ``ks`` that run under an MPS daemon: MPS level k > 1,
        or one MPS share of a whole GPU (``jigsaw.shares``)."""
        procs = g.topology.processes
        return {w for k in ks if (procs[k].mps > 1 or share_level(procs[k].mig_profile))
                and (w := g.placement(k)) is not None}

    def _daemon_slot(self, slot: tuple[int, int]) -> tuple[int, int]:
        """The (GPU, start) of the daemon a process at ``slot`` connects to: on whole GPUs the
        GPU's one daemon (its shares' processes share it), else the MIG instance's own."""
        return (slot[0], 0) if not self.node.gpu.mig else slot

    def _start_mps(self, g: Generation, layout: NodeLayout | None) -> dict[tuple[int, int], dict[str, str]]:
        """Start the MPS daemons of ``g``'s new instances (before their processes); their clients'
        environment per (GPU, start). A failure stops the ones this call started and raises."""
        if layout is None and self.mps_gpus is not None:
            layout = self.mps_gpus.layout()  # a node using its GPUs whole: one daemon per GPU
        if self.mps is None or layout is None:
            return {}
        with self._mps_lock:
            return self._start_mps_locked(g, layout)

    def _start_mps_locked(self, g: Generation, layout: NodeLayout) -> dict[tuple[int, int], dict[str, str]]:
        assert self.mps is not None
        at = {(i.gpu, i.start): i for i in layout.instances}
        started = []
        env: dict[tuple[int, int], dict[str, str]] = {}
        try:
            for slot in sorted(self._mps_slots(g, g.own())):
                inst = at.get(self._daemon_slot(slot))
                if inst is None:
                    continue
                if inst.slot not in self.mps.daemons:
                    self.mps.start(inst)
                    started.append(inst)
                    self.mps_started_total += 1
                    self.mps_events.append({"at": time.time(), "event": "mps_start",
                                            "instance": inst.name})
                env[slot] = self.mps.client_env(inst)
        except JigsawError as exc:
            self.mps_failures_total += 1
            for inst in started:
                with contextlib.suppress(JigsawError):
                    self.mps.stop(inst)
            raise JigsawError(f"MPS: {exc}") from None
        return env

    def _stop_unused_mps(self) -> None:
        """Stop the MPS daemons no live process runs on any more (after their processes stopped)."""
        if self.mps is None:
            return
        with self._mps_lock:
            self._stop_unused_mps_locked()

    def _stop_unused_mps_locked(self) -> None:
        assert self.mps is not None
        used = set()
        for g in self.generations.values():
            live = [k for k in range(len(g.topology.processes)) if k not in g.handed_over]
            used |= {self._daemon_slot(w) for w in self._mps_slots(g, live)}
        for slot, daemon in list(self.mps.daemons.items()):
            if slot[:2] in used:
                continue
            inst = NodeInstance(gpu=slot[0], profile=slot[2], start=slot[1])
            try:
                self.mps.stop(inst)
                self.mps_stopped_total += 1
                self.mps_events.append({"at": time.time(), "event": "mps_stop",
                                        "directory": str(daemon.directory)})
            except JigsawError as exc:
                self.mps_failures_total += 1
                self.log(f"MPS daemon of GPU {slot[0]} start {slot[1]} did not stop: {exc}")

    async def _drain_and_retire(self, gid: int) -> None:
        """In the background: ``_retire``, then the MIG instances and MPS daemons nothing uses go."""
        g = self.generations[gid]
        self._retiring_gids.add(gid)
        try:
            await self._retire(gid)
        finally:
            self._retiring_gids.discard(gid)
            self._cut.pop(gid, None)
        async with self._lock:
            await asyncio.to_thread(self._stop_unused_mps)
            await self._release_mig(f"{g.app.name}: generation {gid} retired")

    async def _retire(self, gid: int, *, first: bool = False) -> None:
        """Wait until the old generation's requests are all settled, then stop the processes the new
        one did not keep, tell the kept ones to drop its wiring, and unlink its segments.

        ``first``: a drain-first's, whose new instances wait for these slots while the app serves
        on part of its plan. It waits only for unanswered requests, at most
        ``drain_wait_slo`` of the SLO, then sends the rest again on the serving
        generation and forgets the late credits. Why: waiting for every late credit (a spike's
        timed-out requests hold theirs for 10 s) made a spike's switch take the SLO plus that
        margin, 25 s at time scale 20 (5 bins of the peak window), the app shedding at the door.
        """
        router = self._router()
        g = self.generations[gid]
        budget_s = self._drain_budget_s(g)
        deadline = time.monotonic() + budget_s + DRAIN_MARGIN_S
        self._drain_ends[gid] = time.monotonic() + budget_s
        if first:
            deadline = time.monotonic() + self._drain_first_wait_s(g)
        cut = self._cut.setdefault(gid, asyncio.Event())  # set: a re-plan needs its slots now
        late = not first  # a replaced generation drains until its late credits are settled too
        settled = router.pending_in if late else router.unanswered_in
        t0 = time.monotonic()
        while settled(gid) and time.monotonic() < deadline and not cut.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(cut.wait(), DRAIN_POLL_S)
        self._cut.pop(gid, None)
        self._drain_ends.pop(gid, None)
        self.drains_total += 1
        self.drain_s_total += time.monotonic() - t0
        if first:
            forgotten, resent, failed = router.cut_generation(gid)
            self.log(f"{g.app.name}: generation {gid} drained for the new instances in "
                     f"{(time.monotonic() - t0) * 1e3:.0f} ms ({forgotten} answered requests' late credits "
                     f"forgotten, {resent} sent again, {failed} failed)")
        else:
            self.log(f"{g.app.name}: generation {gid} drained in {(time.monotonic() - t0) * 1e3:.0f} ms"
                     + (" (cut short)" if cut.is_set() else ""))
            if not cut.is_set() and not late and not router.unanswered_in(gid):
                router.cut_generation(gid)  # every request answered: forget the late credits awaited
        left = router.pending_in(gid)
        if left:
            self.log(f"{g.app.name}: generation {gid}: {left} requests unsettled after drain")
        # A process this generation kept from an older one that still drains (a re-plan that came
        # within that one's drain) serves that one's queued items: it goes back to it instead of
        # stopping. Stopped, it took them along, and the older drain held its MIG slots until its
        # deadline (24 s of a spike at time scale 20) while a needed re-plan waited for them.
        g.hand_back({x.gid for x in self.generations.values() if x.gid < gid and not x.stopping})
        g.stopping = True  # (here, on the loop: a younger generation's retirement reads it)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, g.stop_workers)
        router.remove_generation(gid)
        self.generations.pop(gid, None)
        for k in sorted(g.handed_over):
            self._tell(g.workers[k])
        await loop.run_in_executor(None, g.close)
        await asyncio.to_thread(self._stop_unused_mps)

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

    async def unload_app(self, app: str) -> None:
        """Stop serving ``app`` (Triton's repository unload): new requests no longer reach it, its
        generation drains (every request answered) and retires, and its MIG instances and MPS
        daemons go; returns once they have. The node layout keeps none of its slots."""
        async with self._lock:
            gid = self.current.pop(app)
            self._router().unroute(app)
            if self.node_layout is not None:
                self.node_layout = self.node_layout.with_instances(
                    i for i in self.node_layout.instances if i.app != app)
        self.log(f"{app}: unloaded; generation {gid} drains")
        await self._drain_and_retire(gid)

    async def load_app(self, app: App, plan: Plan) -> None:
        """Serve ``app`` again on ``plan`` (Triton's repository load), placed beside the other apps'
        instances; returns once every process is ready and the app is routed. Raises
        ``JigsawError`` (nothing left running) when it does not fit or does not start."""
        router = self._router()
        if self._retiring:  # the drains in its way end first (their slots are freed at the end)
            await asyncio.wait(list(self._retiring), timeout=READY_TIMEOUT_S)
        async with self._lock:
            if app.name in self.current:
                return
            beside = self.beside()  # off every slot that runs or drains, where it fits so
            got = beside.place(app.name, dataclasses.replace(plan, layout=None)) \
                if beside is not None else None
            try:
                node_layout, plan = got if got is not None else self.place(app.name, plan)
            except PackingError as exc:
                raise JigsawError(f"its plan does not fit beside the node's other apps ({exc})") from None
            if self.partition is not None and node_layout is not None:
                deferred = await asyncio.to_thread(self.partition.bring_up, node_layout, f"{app.name}: load")
                if deferred:
                    await self._release_mig(f"{app.name}: load refused")
                    raise JigsawError(f"its plan needs {len(deferred)} MIG slots that other apps hold or "
                                      "drain")
                node_layout = self.partition.with_uuids(node_layout)
            gen = self._lay_out(app, plan)
            try:
                await self._launch(gen, node_layout, router)
            except Exception as exc:
                await self._abandon(gen)
                await self._release_mig(f"{app.name}: generation {gen.gid} failed")
                raise JigsawError(f"its workers did not start ({exc})") from None
            router.route(app.name, gen.gid)
            self.current[app.name] = gen.gid
            self.node_layout = node_layout
        self.log(f"{app.name}: loaded on generation {gen.gid} ({len(gen.topology.processes)} processes)")

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
    def worker_failed(self, generation: int, spec: ProcessSpec, reason: str,
                      suspects: frozenset[int] = frozenset()) -> tuple[int, int]:
        """A worker died or hung: the router settles its requests (``suspects``: those of the batch
        that crashed it, answered, not re-sent); returns (retried, failed)."""
        if self.router is None:
            return 0, 0
        return self.router.worker_failed(generation, spec.app, spec.task, spec.variant, reason, suspects)

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
        if self.spares is not None:
            self.spares.close()
        gens = list(self.generations.values())
        for g in gens:
            g.signal_stop()
        for g in gens:
            g.close()
        self.generations.clear()
        if self.mps is not None:  # after every process that used them
            for why in self.mps.stop_all():
                self.log(f"MPS daemon did not stop: {why}")
        if self.partition is not None:
            self.partition.close()
        self.registry.cleanup()
        shutil.rmtree(self.run_dir, ignore_errors=True)
