"""What a reconfiguration does: the running node layout diffed against the desired one, per instance.

A pure function. Each MIG instance of either layout is one of

* **keep**: same MIG instance, same workload: its processes keep running (same pids, engines stay
  loaded); only its routing weights may change;
* **create**: a new MIG instance: created (NVML), its MPS daemon started if k > 1, its k processes
  started and warmed, then routed;
* **replace**: the same MIG instance hosts another workload (a model swap, no repartition): the old
  processes are drained and stopped, the new ones started; no NVML call;
* **remove**: unrouted, drained, its processes and MPS daemon stopped, the MIG instance destroyed.

Order (make before break): creates whose slots are free now come first, so traffic moves to warm
instances. Where a GPU lacks free slots for a create (overlap, per-profile or compute limits),
the instances in the way are unrouted and drained first, while the rest of the node serves, then
destroyed, then the create runs. Then routing switches to the desired layout in one step, and
the remaining removed instances are drained and destroyed. A GPU with no changed instance gets
no step at all.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum

from jigsaw.gpu.layout import NodeInstance, NodeLayout, Slot
from jigsaw.mig import GpuModel
from jigsaw.planner.layouts import placement_violations, slot_mask


class Action(StrEnum):
    CREATE_MIG = "create_mig"  # NVML: GPU instance with placement + its compute instance
    START_MPS = "start_mps"  # nvidia-cuda-mps-control -d private to the instance (k > 1)
    START_PROCESSES = "start_processes"
    WAIT_WARM = "wait_warm"
    ROUTE = "route"  # routing switches to exactly the instances of ``active``
    DRAIN = "drain"  # no new work reaches it (it was unrouted); wait until its queues are empty
    STOP_PROCESSES = "stop_processes"
    STOP_MPS = "stop_mps"
    DESTROY_MIG = "destroy_mig"  # NVML: its compute instances, then the GPU instance


NVML_ACTIONS = frozenset({Action.CREATE_MIG, Action.DESTROY_MIG})


@dataclass(frozen=True)
class Step:
    action: Action
    instance: NodeInstance | None = None  # None for ROUTE
    active: NodeLayout | None = None  # ROUTE only: the instances that get traffic from now on

    def describe(self) -> str:
        if self.action is Action.ROUTE:
            assert self.active is not None
            return f"route to {sum(1 for i in self.active.instances if i.app)} instances"
        assert self.instance is not None
        return f"{self.action.value} {self.instance.name}"


@dataclass(frozen=True)
class ReconfigPlan:
    """The per-instance diff and the ordered steps that realize it."""

    running: NodeLayout
    desired: NodeLayout
    keep: tuple[NodeInstance, ...]  # the desired instances (with their running uuid/pids)
    create: tuple[NodeInstance, ...]
    replace: tuple[tuple[NodeInstance, NodeInstance], ...]  # (old, new) in one MIG instance
    remove: tuple[NodeInstance, ...]
    drained_first: tuple[NodeInstance, ...]  # removed/replaced ones in the way of a create
    steps: tuple[Step, ...] = field(default=())

    @property
    def changed_gpus(self) -> tuple[int, ...]:
        """GPUs where some instance is created, replaced or removed."""
        gpus = {i.gpu for i in self.create} | {o.gpu for o, _ in self.replace} | {i.gpu for i in self.remove}
        return tuple(sorted(gpus))

    @property
    def nvml_gpus(self) -> tuple[int, ...]:
        """GPUs whose MIG partition changes: the only ones NVML is called on."""
        return tuple(sorted({s.instance.gpu for s in self.steps if s.action in NVML_ACTIONS and s.instance}))

    @property
    def is_noop(self) -> bool:
        return not (self.create or self.replace or self.remove)

    def summary(self) -> dict[str, int]:
        started = sum(1 for i in self.create if not i.is_idle) + len(
            [n for _, n in self.replace if not n.is_idle]
        )
        stopped = sum(1 for i in self.remove if not i.is_idle) + len(
            [o for o, _ in self.replace if not o.is_idle]
        )
        return {
            "kept": len(self.keep),
            "started": started,
            "stopped": stopped,
            "created_mig": len(self.create),
            "destroyed_mig": len(self.remove),
            "replaced": len(self.replace),
            "drained_first": len(self.drained_first),
        }


def _bring_up(inst: NodeInstance, create_mig: bool) -> list[Step]:
    steps = [Step(Action.CREATE_MIG, inst)] if create_mig else []
    if inst.is_idle:
        return steps
    if inst.mps > 1:
        steps.append(Step(Action.START_MPS, inst))
    return [*steps, Step(Action.START_PROCESSES, inst), Step(Action.WAIT_WARM, inst)]


def _tear_down(inst: NodeInstance, destroy_mig: bool) -> list[Step]:
    steps = []
    if not inst.is_idle:
        steps += [Step(Action.DRAIN, inst), Step(Action.STOP_PROCESSES, inst)]
        if inst.mps > 1:
            steps.append(Step(Action.STOP_MPS, inst))
    if destroy_mig:
        steps.append(Step(Action.DESTROY_MIG, inst))
    return steps


def _fits(gpu: GpuModel, present: list[NodeInstance]) -> bool:
    return not placement_violations(gpu, [(i.profile, i.start) for i in present])


def diff(running: NodeLayout, desired: NodeLayout, gpu: GpuModel) -> ReconfigPlan:
    """The ``ReconfigPlan`` taking the node from ``running`` to ``desired`` (both valid layouts)."""
    if (running.gpu_model, running.num_gpus) != (desired.gpu_model, desired.num_gpus) and running.instances:
        raise ValueError(
            f"running layout is {running.num_gpus} x {running.gpu_model}, desired "
            f"{desired.num_gpus} x {desired.gpu_model}"
        )
    old: dict[Slot, NodeInstance] = running.by_slot()
    new: dict[Slot, NodeInstance] = desired.by_slot()
    keep, create, repl, remove = [], [], [], []
    for slot, n in new.items():
        o = old.get(slot)
        if o is None:
            create.append(n)
        elif o.workload == n.workload:
            keep.append(replace_runtime(n, o))
        else:
            repl.append((o, replace_runtime(n, o, processes=False)))
    remove = [o for slot, o in old.items() if slot not in new]

    # which creates must wait for instances in the way, per GPU
    removed_by_gpu: dict[int, list[NodeInstance]] = {}
    for o in remove:
        removed_by_gpu.setdefault(o.gpu, []).append(o)
    early: list[NodeInstance] = []
    late: list[NodeInstance] = []
    # a swap needs its instance emptied first; an idle one (adopted at start-up) is empty already
    blockers: list[NodeInstance] = [o for o, _ in repl if not o.is_idle]
    for g in sorted({i.gpu for i in create}):
        present = list(running.on_gpu(g))  # everything stays until destroyed
        gone: list[NodeInstance] = []
        for c in sorted((i for i in create if i.gpu == g), key=lambda i: i.start):
            if _fits(gpu, [*present, c]):
                present.append(c)
                (late if gone else early).append(c)
                continue
            p = gpu.profile(c.profile)
            in_way = [
                o
                for o in removed_by_gpu.get(g, [])
                if o in present and slot_mask(gpu.profile(o.profile), o.start) & slot_mask(p, c.start)
            ]
            trial = [i for i in present if i not in in_way]
            if not _fits(gpu, [*trial, c]):
                in_way = [o for o in removed_by_gpu.get(g, []) if o in present]
                trial = [i for i in present if i not in in_way]
            if not _fits(gpu, [*trial, c]):
                raise ValueError(
                    f"desired layout does not fit GPU {g}: {c.name} has no room "
                    "even with every removed instance gone"
                )
            present = [*trial, c]
            gone += in_way
            blockers += in_way
            late.append(c)

    steps: list[Step] = []
    for c in early:
        steps += _bring_up(c, create_mig=True)
    for o, n in repl:
        if o.is_idle:
            steps += _bring_up(n, create_mig=False)
    if blockers:
        if any(not b.is_idle for b in blockers):
            blocked = {b.slot for b in blockers}
            interim = [i for i in running.instances if i.slot not in blocked] + early
            steps.append(Step(Action.ROUTE, active=running.with_instances(interim)))
        for b in blockers:
            steps += _tear_down(b, destroy_mig=b in remove)
        for o, n in repl:
            if not o.is_idle:
                steps += _bring_up(n, create_mig=False)
        for c in late:
            steps += _bring_up(c, create_mig=True)
    # always: even when every instance is kept, the plan's routing weights may have changed
    steps.append(
        Step(Action.ROUTE, active=desired.with_instances([*keep, *early, *late, *(n for _, n in repl)]))
    )
    done = set(id(b) for b in blockers)
    for o in remove:
        if id(o) not in done:
            steps += _tear_down(o, destroy_mig=True)
    return ReconfigPlan(
        running=running,
        desired=desired,
        keep=tuple(keep),
        create=tuple(create),
        replace=tuple(repl),
        remove=tuple(remove),
        drained_first=tuple(b for b in blockers),
        steps=tuple(steps),
    )


def replace_runtime(n: NodeInstance, o: NodeInstance, processes: bool = True) -> NodeInstance:
    """``n`` carrying ``o``'s runtime facts: its UUID always, its pids when the processes stay."""
    return dataclasses.replace(n, uuid=o.uuid, pids=o.pids if processes else ())
