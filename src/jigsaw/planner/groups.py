"""The planner on a node of several GPU groups: per-group layouts, budgets and packing.

A node's segments are the union of its groups' (``jigsaw.gpu_groups``: profiles qualified by
their group). What is per GPU stays per group: a GPU takes one valid layout of its own group's
profiles, so the MILP's layout variables are bounded by each group's GPU count, and the packer
lays each group's instances on that group's GPUs. A node of one group goes through the same
functions unchanged (one group, every GPU), so it plans exactly as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jigsaw.gpu_groups import GpuGroup, group_of_gpu, group_of_profile, plain_profile
from jigsaw.mig import GpuModel
from jigsaw.node import Node
from jigsaw.plan import GpuLayout, Layout
from jigsaw.planner.layouts import maximal_layout_counts
from jigsaw.planner.packer import InstanceRequest, PackingError, pack


def group_layouts(node: Node, profile_names: Sequence[str]) -> list[dict[str, int]]:
    """The maximal per-GPU count vectors over ``profile_names`` (sorted), each group's in turn,
    as dicts over all of ``profile_names`` (a group's layout counts 0 of the others')."""
    names = list(profile_names)
    if not names:
        return []
    if not node.is_mixed:
        return [dict(zip(names, counts, strict=True))
                for counts in maximal_layout_counts(node.gpu, names)]
    out: list[dict[str, int]] = []
    for g in node.groups:
        own = [n for n in names if n in g.gpu.profile_names]
        if not own:
            continue
        for counts in maximal_layout_counts(g.gpu, own):
            if any(counts):
                lay = dict.fromkeys(names, 0)
                lay.update(zip(own, counts, strict=True))
                out.append(lay)
    return out


def layout_budgets(node: Node, layouts: Sequence[dict[str, int]]) -> list[tuple[list[int], int]]:
    """(indices of ``layouts``, GPUs) per group: at most that many GPUs take those layouts."""
    if not layouts:
        return []
    if not node.is_mixed:
        return [(list(range(len(layouts))), node.num_gpus)]
    by_group: dict[str, list[int]] = {}
    for j, lay in enumerate(layouts):
        used = next((p for p, c in lay.items() if c), None)
        if used is not None:
            by_group.setdefault(group_of_profile(node.groups, used).name, []).append(j)
    return [(by_group[g.name], g.count) for g in node.groups if g.name in by_group]


def gpu_of(node: Node, index: int) -> GpuModel:
    """The model (as the planner names its profiles) of the node's GPU ``index``."""
    return group_of_gpu(node.gpu_groups, index).gpu if node.is_mixed else node.gpu


def pack_node(requests: Sequence[InstanceRequest], node: Node, previous: Layout | None = None) -> Layout:
    """``packer.pack`` on the node: each group's instances on that group's GPUs (GPU indices the
    node's), ``previous`` kept per group where it can be. Raises ``PackingError`` naming the group."""
    if not node.is_mixed:
        return pack(requests, node.gpu, node.num_gpus, previous)
    if previous is not None and previous.gpu_model != node.gpu.name:
        previous = None
    gpus: list[GpuLayout] = []
    for g in node.groups:
        mine = [r for r in requests if _group_name(node, r.profile) == g.name]
        try:
            part = pack(mine, g.gpu, g.count, _group_part(previous, g))
        except PackingError as exc:
            raise PackingError(f"GPU group {g.name}: {exc}") from None
        gpus += [GpuLayout(x.gpu + g.first, x.instances) for x in part.gpus]
    stray = sorted({r.profile for r in requests} - set(node.gpu.profile_names))
    if stray:
        raise PackingError(f"unknown MIG profile(s) {', '.join(stray)} for {node.gpu.name}")
    return Layout(node.gpu.name, tuple(gpus))


def _group_name(node: Node, profile: str) -> str:
    try:
        return group_of_profile(node.groups, profile).name
    except KeyError:
        return ""


def _group_part(previous: Layout | None, g: GpuGroup) -> Layout | None:
    if previous is None:
        return None
    return Layout(g.gpu.name, tuple(GpuLayout(x.gpu - g.first, x.instances)
                                    for x in previous.gpus if x.gpu in g.gpus))


def group_layout_problems(layout: Layout, node: Node) -> list[str]:
    """On a node of several groups: each placed instance's profile is its GPU's group's."""
    if not node.is_mixed:
        return []
    out = []
    for x in layout.gpus:
        if not 0 <= x.gpu < node.num_gpus:
            continue
        g = group_of_gpu(node.groups, x.gpu)
        out += [f"GPU {x.gpu}: {p.profile} is not a profile of its group {g.name}"
                for p in x.instances if p.profile not in g.gpu.profile_names]
    return out


def mig_part(layout: Layout, node: Node) -> Layout:
    """What a node's MIG tooling (nvidia-smi, mig-parted, the device plugin's resources) sees of
    ``layout``: the GPUs of its MIG groups by the host's indices, profiles by their GPU's names
    (``3g.20gb``). A node of one group: ``layout`` as it is."""
    if not node.is_mixed:
        return layout
    mig = {i for g in node.groups if g.model.mig for i in g.gpus}
    return Layout(layout.gpu_model, tuple(
        GpuLayout(node.host_index(g.gpu), tuple(dataclasses.replace(p, profile=plain_profile(p.profile))
                                                for p in g.instances))
        for g in layout.gpus if g.gpu in mig))
