"""The node hardware of a node of several GPU groups (``jigsaw.gpu_groups``).

One node layout covers every GPU; what each GPU needs depends on its group. A MIG group's
instances are created and destroyed through NVML by that group's ``MigApplier`` (its table, its
profile names); a group used whole has nothing to create: its segments (the whole GPU, its MPS
shares) exist with the GPU, so "creating" one only reads the GPU's ``GPU-<uuid>``, the device its
processes (and its one MPS daemon) see. ``GroupsApplier`` is the applier ``gpu.partition`` drives
on such a node, so partitioning, draining and restoring work as on a node of one model.

The node's GPU indices are the planner's (the groups' GPUs in file order); NVML is called with
the host's (``Node.host_index``: a group's ``devices``, by default the same). The emulated node
gives each MIG group its own emulated NVML (its GPUs numbered from 0) and translates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from jigsaw.gpu.layout import NodeInstance, NodeLayout, place_app, validate_node_layout
from jigsaw.gpu.nvml import MigApplier, MigError, load_nvml
from jigsaw.gpu_groups import GpuGroup, group_of_gpu
from jigsaw.mig import GpuModel
from jigsaw.node import Node
from jigsaw.planner.packer import InstanceRequest, PackingError


def mig_groups(node: Node) -> list[GpuGroup]:
    return [g for g in node.gpu_groups if g.model.kind == "gpu" and g.model.mig]


def whole_gpus(node: Node) -> tuple[int, ...]:
    """The node's GPUs used whole (no MIG)."""
    return tuple(i for g in node.gpu_groups if g.model.kind == "gpu" and not g.model.mig for i in g.gpus)


class GroupsApplier:
    """``MigApplier``'s interface over a node of several GPU groups (see the module)."""

    def __init__(self, node: Node, nvml: Any = None, *, emulated: bool = False) -> None:
        self.node = node
        self.emulated = emulated
        self._shared = nvml
        self._mig: dict[str, MigApplier] = {}  # MIG group -> its applier
        self._whole: dict[str, Any] = {}  # whole-GPU group -> its NVML (None: the shared one)
        self._dev: dict[int, int] = {}  # node GPU -> its index in its group's NVML
        whole_nvml: Any = None  # emulated: one NVML numbering every GPU, as ``WholeGpus`` reads them
        for g in node.gpu_groups:
            if g.model.kind != "gpu":
                continue
            if g.model.mig:
                own = _emulated(g.model, g.count, True) if emulated else nvml
                self._mig[g.name] = MigApplier(g.gpu, own)
                self._dev.update({i: (i - g.first if emulated else node.host_index(i)) for i in g.gpus})
            else:
                if emulated and whole_nvml is None:
                    whole_nvml = _emulated(g.model, node.num_gpus, False)
                self._whole[g.name] = whole_nvml
                self._dev.update({i: (i if emulated else node.host_index(i)) for i in g.gpus})
        self._uuids: dict[int, str] = {}

    @property
    def nvml(self) -> Any:
        """The first MIG group's NVML (its call log is what ``/admin/layout`` shows)."""
        for applier in self._mig.values():
            return applier.nvml
        return self._shared

    def open(self) -> None:
        for applier in self._mig.values():
            applier.open()

    def close(self) -> None:
        for applier in self._mig.values():
            applier.close()

    def adopt(self, num_gpus: int) -> NodeLayout:
        """What the MIG groups' GPUs hold now (idle instances, node indices)."""
        out: list[NodeInstance] = []
        for g in mig_groups(self.node):
            back = {self._dev[i]: i for i in g.gpus}
            found = self._mig[g.name].adopt(num_gpus, list(back))
            out += [dataclasses.replace(i, gpu=back[i.gpu]) for i in found.instances]
        return NodeLayout(self.node.gpu.name, num_gpus, tuple(out))

    def create(self, inst: NodeInstance) -> NodeInstance:
        g = group_of_gpu(self.node.gpu_groups, inst.gpu)
        if g.name in self._mig:
            made = self._mig[g.name].create(dataclasses.replace(inst, gpu=self._dev[inst.gpu]))
            return dataclasses.replace(made, gpu=inst.gpu)
        return dataclasses.replace(inst, uuid=self._gpu_uuid(g, inst.gpu))

    def destroy(self, inst: NodeInstance) -> None:
        g = group_of_gpu(self.node.gpu_groups, inst.gpu)
        if g.name in self._mig:
            self._mig[g.name].destroy(dataclasses.replace(inst, gpu=self._dev[inst.gpu]))
        # a whole GPU's segment goes with its processes: nothing to destroy

    def _gpu_uuid(self, g: GpuGroup, index: int) -> str:
        """``GPU-...`` of the node's GPU ``index`` (a GPU used whole), read once."""
        if index not in self._uuids:
            own = self._whole[g.name]
            nvml = own if own is not None else (self._shared if self._shared is not None else load_nvml())
            try:
                nvml.nvmlInit()
                try:
                    uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(self._dev[index]))
                finally:
                    nvml.nvmlShutdown()
            except nvml.NVMLError as exc:
                raise MigError(f"GPU {index} ({g.name}, used whole): NVML nvmlDeviceGetUUID failed: {exc}",
                               step="nvmlDeviceGetUUID", code=getattr(exc, "value", None)) from None
            self._uuids[index] = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        return self._uuids[index]


def _emulated(model: GpuModel, count: int, mig: bool) -> Any:
    from jigsaw.gpu.emulated_nvml import EmulatedNvml

    return EmulatedNvml(model, count, mig_enabled=mig)


def _parts(layout: NodeLayout, gpu: GpuModel) -> list[tuple[GpuModel, int, NodeLayout]]:
    """Per GPU group of the composite ``gpu``: its model, first GPU, and its part of ``layout``
    (GPUs numbered from 0)."""
    out = []
    first = 0
    for model, count in gpu.parts:
        mine = tuple(dataclasses.replace(i, gpu=i.gpu - first) for i in layout.instances
                     if first <= i.gpu < first + count)
        out.append((model, first, NodeLayout(model.name, count, mine)))
        first += count
    return out


def place_on(layout: NodeLayout, app: str, requests: Sequence[InstanceRequest], gpu: GpuModel,
             keep_usable: bool = False) -> NodeLayout:
    """``layout.place_app`` on the node's GPU: on a node of several groups each group's part of
    ``requests`` is placed on that group's GPUs, against what the other apps hold there."""
    if not gpu.parts:
        return place_app(layout, app, requests, gpu, keep_usable)
    stray = sorted({r.profile for r in requests} - set(gpu.profile_names))
    if stray:
        raise PackingError(f"unknown MIG profile(s) {', '.join(stray)} for {gpu.name}")
    out: list[NodeInstance] = []
    for model, first, part in _parts(layout, gpu):
        mine = [r for r in requests if r.profile in model.profile_names]
        try:
            placed = place_app(part, app, mine, model, keep_usable)
        except PackingError as exc:
            raise PackingError(f"GPU group {model.name}: {exc}") from None
        out += [dataclasses.replace(i, gpu=i.gpu + first) for i in placed.instances]
    return layout.with_instances(out)


def validate_on(layout: NodeLayout, gpu: GpuModel) -> list[str]:
    """``layout.validate_node_layout`` on the node's GPU: per group, and every instance on a GPU
    of its profile's group."""
    if not gpu.parts:
        return validate_node_layout(layout, gpu)
    problems = [f"{i.name}: GPU {i.gpu} is not one of the node's {layout.num_gpus}"
                for i in layout.instances if not 0 <= i.gpu < layout.num_gpus]
    for model, first, part in _parts(layout, gpu):
        problems += [f"{i.name}: {i.profile} is not a profile of GPU {i.gpu + first}'s group {model.name}"
                     for i in part.instances if i.profile not in model.profile_names]
        problems += [_renumbered(p, first) for p in validate_node_layout(
            part.with_instances(i for i in part.instances if i.profile in model.profile_names), model)]
    return problems


def _renumbered(problem: str, first: int) -> str:
    head, sep, rest = problem.partition(":")
    if head.startswith("GPU ") and head[4:].isdigit():
        return f"GPU {int(head[4:]) + first}{sep}{rest}"
    return problem
