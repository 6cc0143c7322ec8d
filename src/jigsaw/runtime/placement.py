"""Where a new plan goes on the node beside what runs: ``Beside`` (the slots every live generation
and MIG instance holds, for a needed plan that must wait for no drain), and the plan arithmetic
of a re-plan: which processes a new generation keeps, what serves while instances drain."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from jigsaw.gpu.groups import place_on
from jigsaw.gpu.layout import NodeInstance, NodeLayout
from jigsaw.gpu.partition import overlaps
from jigsaw.mig import NUM_PLACEMENT_SLOTS, GpuModel
from jigsaw.plan import Plan, without_placed
from jigsaw.planner.packer import PackingError, instances_from_plan
from jigsaw.runtime import stats as st
from jigsaw.runtime.generation import Generation

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
            placed = place_on(self.layout, app, instances_from_plan(plan), self.gpu, self.keep_usable)
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
