"""The node's MIG partition as the serving daemon keeps it: what exists on the GPUs, in step with
the layout its generations run on.

The generation manager brings a new plan up beside the running one (make-before-break), so the
MIG side of a re-plan is two halves: ``bring_up`` creates the desired instances that do not exist
yet, before the new processes start (instances whose slots are still held by running ones are
deferred); ``tear_down`` destroys the instances no plan uses any more, once their processes have
stopped, and then creates the deferred ones. Only GPUs whose partition changed get an NVML call.
A failed creation destroys whatever this bring-up created (nothing is left half-made) and the
caller keeps serving the running plan. Every change and failure is recorded (``events``, for
``/admin/layout``), logged by the caller and counted (``prometheus``, for ``/metrics``).
On an emulated node the applier runs on ``EmulatedNvml``: same calls, same order, in memory.
The shares of one MIG instance (``jigsaw.shares``) are that one instance here (``layout.devices``).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from jigsaw.gpu.layout import NodeInstance, NodeLayout, Slot, devices
from jigsaw.gpu.nvml import MigApplier
from jigsaw.mig import GpuModel
from jigsaw.planner.layouts import slot_mask

MAX_EVENTS = 200


@dataclass
class PartitionStats:
    created_total: int = 0
    destroyed_total: int = 0
    failures_total: Counter[str] = field(default_factory=Counter)  # by NVML step

    def prometheus(self) -> str:
        rows = [
            "# HELP jigsaw_mig_instances_created_total MIG instances created through NVML",
            "# TYPE jigsaw_mig_instances_created_total counter",
            f"jigsaw_mig_instances_created_total {self.created_total}",
            "# HELP jigsaw_mig_instances_destroyed_total MIG instances destroyed through NVML",
            "# TYPE jigsaw_mig_instances_destroyed_total counter",
            f"jigsaw_mig_instances_destroyed_total {self.destroyed_total}",
            "# HELP jigsaw_mig_failures_total MIG changes that failed (rolled back), by NVML step",
            "# TYPE jigsaw_mig_failures_total counter",
        ]
        failed = sorted(self.failures_total.items())
        rows += [f'jigsaw_mig_failures_total{{step="{k}"}} {v}' for k, v in failed]
        if not self.failures_total:
            rows.append("jigsaw_mig_failures_total 0")
        return "\n".join(rows) + "\n"


def overlaps(gpu: GpuModel, a: NodeInstance, b: NodeInstance) -> bool:
    """Whether ``a`` needs what ``b`` holds: their MIG instances' slots overlap, except within one
    shared instance (``jigsaw.shares``): two shares of its level need the same seat for that (two
    levels cannot share it), and a share lies in the instance itself (its partition's record)
    without taking it."""
    if a.gpu != b.gpu:
        return False
    shares = bool(gpu.profile(a.profile).host) + bool(gpu.profile(b.profile).host)
    if a.device_slot == b.device_slot and shares:
        return shares == 2 and (a.profile != b.profile or a.seat == b.seat)
    return bool(slot_mask(gpu.device_profile(a.profile), a.start)
                & slot_mask(gpu.device_profile(b.profile), b.start))


class MigPartition:
    """What exists on the node's GPUs (``existing``: one idle-or-used instance per slot, with UUIDs)."""

    def __init__(self, gpu: GpuModel, num_gpus: int, applier: MigApplier) -> None:
        self.gpu = gpu
        self.num_gpus = num_gpus
        self.applier = applier
        self.stats = PartitionStats()
        self.events: list[dict[str, Any]] = []
        self.existing: dict[Slot, NodeInstance] = {}

    def adopt(self) -> NodeLayout:
        """Opens NVML, checks MIG mode, and reads what the GPUs hold (idle instances, to be reused)."""
        self.applier.open()
        found = self.applier.adopt(self.num_gpus)
        self.existing = {i.slot: i for i in found.instances}
        return found

    def _record(self, **event: Any) -> None:
        self.events.append({"at": time.time(), **event})
        del self.events[:-MAX_EVENTS]

    def held(self, desired: NodeLayout) -> tuple[Slot, ...]:
        """The slots of ``desired``'s missing instances that an existing one is in the way of: what
        ``bring_up`` would defer, read without changing anything."""
        held: list[Slot] = []
        for inst in devices(desired.instances):  # the MIG instances (shares: their host's, once)
            if inst.slot not in self.existing \
                    and any(overlaps(self.gpu, inst, e) for e in self.existing.values()):
                held.extend(i.slot for i in desired.instances if i.device_slot == inst.slot)
        return tuple(held)

    def bring_up(self, desired: NodeLayout, reason: str = "") -> tuple[Slot, ...]:
        """Creates ``desired``'s missing instances that no existing one is in the way of; returns
        the slots deferred to ``tear_down``. Raises ``MigError`` after destroying what it created."""
        made: list[NodeInstance] = []
        deferred: list[Slot] = []
        for inst in devices(desired.instances):  # the MIG instances (shares: their host's, once)
            if inst.slot in self.existing:
                continue
            if any(overlaps(self.gpu, inst, e) for e in self.existing.values()):
                deferred.extend(i.slot for i in desired.instances if i.device_slot == inst.slot)
                continue
            try:
                made.append(self.applier.create(inst))
            except Exception as exc:
                self.stats.failures_total[getattr(exc, "step", "") or "create"] += 1
                undo_errors = []
                for m in reversed(made):
                    try:
                        self.applier.destroy(m)
                        del self.existing[m.slot]
                    except Exception as undo:
                        undo_errors.append(f"{m.name}: {undo}")
                self._record(event="mig", ok=False, reason=reason, error=str(exc),
                             rolled_back=[m.name for m in made], rollback_errors=undo_errors)
                raise
            self.existing[inst.slot] = made[-1]
        self.stats.created_total += len(made)
        if made:
            self._record(event="mig", ok=True, reason=reason, created=[m.name for m in made],
                         gpus=sorted({m.gpu for m in made}))
        return tuple(deferred)

    def tear_down(self, keep: NodeLayout, reason: str = "") -> None:
        """Destroys the existing instances ``keep`` has no use for (their processes are stopped),
        then creates ``keep``'s instances still missing (those deferred by ``bring_up``).
        A failure is recorded and raised; what exists stays known."""
        wanted = {i.device_slot for i in keep.instances}
        gone: list[str] = []
        try:
            for slot, inst in sorted(self.existing.items()):
                if slot not in wanted:
                    self.applier.destroy(inst)
                    del self.existing[slot]
                    gone.append(inst.name)
                    self.stats.destroyed_total += 1
        except Exception as exc:
            self.stats.failures_total[getattr(exc, "step", "") or "destroy"] += 1
            self._record(event="mig", ok=False, reason=reason, error=str(exc), destroyed=gone)
            raise
        if gone:
            self._record(event="mig", ok=True, reason=reason, destroyed=gone)
        self.bring_up(keep, reason=reason)  # a failure is counted and recorded there, once

    def with_uuids(self, layout: NodeLayout) -> NodeLayout:
        """``layout`` with the UUIDs of the instances that exist."""
        return layout.with_instances(
            replace(i, uuid=self.existing[i.device_slot].uuid) if i.device_slot in self.existing else i
            for i in layout.instances)

    def close(self) -> None:
        self.applier.close()
