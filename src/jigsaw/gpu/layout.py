"""The node's running layout: one object for all its apps, and the placement of one app against it.

A node's GPUs are shared by every app it serves, so there is exactly one layout: per GPU, the
MIG instances (profile and start slot), the workload each hosts (app, task, variant, MPS level k,
max batch) and, once running, the instance's UUID and its k worker pids. Every plan is laid out
against what the other apps hold (``place_app``), so no two instances overlap and no GPU is
over-committed, whatever the apps' planners asked for.

A MIG instance that k processes of different (task, variant)s share (``jigsaw.shares``: profile
``<profile>-1of<k>``) is k entries, one per process, at the instance's start, each with its seat
(0..k-1); the processes may be of different apps. ``NodeInstance.device`` is the MIG instance they
share (what NVML creates, what its MPS daemon is keyed by), ``slot`` tells the entries apart.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from jigsaw.mig import NUM_PLACEMENT_SLOTS, GpuModel, share_host
from jigsaw.plan import GpuLayout, Layout, PlacedInstance
from jigsaw.planner.layouts import (
    placement_violations,
    room,
    slot_mask,
    usable_compute,
    valid_layouts,
)
from jigsaw.planner.packer import InstanceRequest, PackingError, bundle_shares, seat_violations, unbundled

Slot = tuple[int, int, str]  # (GPU index, start slot, MIG profile): one MIG instance (or one share's seat)
Workload = tuple[str, str, str, int, int]  # (app, task, variant, mps, max_batch)

_DFS_NODE_BUDGET = 20_000


@dataclass(frozen=True)
class NodeInstance:
    """One MIG instance of the node and what runs in it.

    ``app == ""`` marks an idle instance: it exists on the GPU (adopted at start-up) but hosts no
    processes. ``uuid`` and ``pids`` are runtime facts, filled in by the generation manager;
    they take no part in comparisons of what should run where (``slot``, ``workload``).
    """

    gpu: int
    profile: str
    start: int
    app: str = ""
    task: str = ""
    variant: str = ""
    mps: int = 1  # processes in the instance (MPS level k)
    max_batch: int = 1
    index: int = 0  # which of the app plan's instances of (task, variant, profile, mps, max_batch)
    uuid: str = ""  # MIG-<uuid> for CUDA_VISIBLE_DEVICES
    pids: tuple[int, ...] = ()
    seat: int = 0  # a share of a MIG instance: which of the instance's k processes (0..k-1)

    @property
    def slot(self) -> Slot:
        """Tells every entry of the layout apart: the instance's slot, for a share with its seat."""
        if share_host(self.profile):
            return (self.gpu, self.start, f"{self.profile}#{self.seat}")
        return (self.gpu, self.start, self.profile)

    @property
    def device_slot(self) -> Slot:
        """The MIG instance it lies in (GPU, start, the instance's profile): a share's host's."""
        return (self.gpu, self.start, share_host(self.profile) or self.profile)

    def as_device(self) -> NodeInstance:
        """The MIG instance it lies in, as NVML creates it (its shares' seats are the processes')."""
        host = share_host(self.profile)
        return replace(self, profile=host, seat=0, mps=1) if host else self

    @property
    def workload(self) -> Workload:
        return (self.app, self.task, self.variant, self.mps, self.max_batch)

    @property
    def is_idle(self) -> bool:
        return not self.app

    @property
    def name(self) -> str:
        """A short, stable label for logs and history: ``gpu0/3g.40gb@4:traffic/det/yolov5m``."""
        what = f"{self.app}/{self.task}/{self.variant}x{self.mps}" if self.app else "idle"
        return f"gpu{self.gpu}/{self.profile}@{self.start}:{what}"

    def placed(self) -> PlacedInstance:
        return PlacedInstance(
            profile=self.profile,
            start=self.start,
            task=self.task,
            variant=self.variant,
            index=self.index,
            mps=self.mps,
            max_batch=self.max_batch,
            seat=self.seat,
        )


def devices(instances: Iterable[NodeInstance]) -> list[NodeInstance]:
    """The MIG instances of ``instances``: each once, a shared one as its host profile."""
    out: dict[Slot, NodeInstance] = {}
    for i in instances:
        out.setdefault(i.device_slot, i.as_device())
    return list(out.values())


@dataclass(frozen=True)
class NodeLayout:
    """Every MIG instance of the node, all apps together (sorted by GPU, start)."""

    gpu_model: str
    num_gpus: int
    instances: tuple[NodeInstance, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "instances", tuple(sorted(self.instances, key=lambda i: (i.gpu, i.start))))

    def on_gpu(self, gpu: int) -> tuple[NodeInstance, ...]:
        return tuple(i for i in self.instances if i.gpu == gpu)

    def of_app(self, app: str) -> tuple[NodeInstance, ...]:
        return tuple(i for i in self.instances if i.app == app)

    @property
    def apps(self) -> tuple[str, ...]:
        return tuple(sorted({i.app for i in self.instances if i.app}))

    def by_slot(self) -> dict[Slot, NodeInstance]:
        return {i.slot: i for i in self.instances}

    def slices_used(self, gpu: GpuModel, app: str | None = None) -> float:
        """Compute slices held by ``app`` (all apps, idle instances included, when None): a share
        of a MIG instance holds its k-th of the instance's."""
        return sum(gpu.profile(i.profile).slice_cost for i in self.instances if app is None or i.app == app)

    def slices_free_for(self, gpu: GpuModel, app: str) -> float:
        """What a plan of ``app`` may use: the node's slices less what the other apps hold."""
        others = sum(gpu.profile(i.profile).slice_cost for i in self.instances if i.app and i.app != app)
        return gpu.compute_slices * self.num_gpus - others

    def without_idle(self) -> NodeLayout:
        """The layout less its idle instances: once every app is placed at start-up, the adopted
        instances no app took are destroyed by the next reconfiguration."""
        return self.with_instances(i for i in self.instances if i.app)

    def with_instances(self, instances: Iterable[NodeInstance]) -> NodeLayout:
        return NodeLayout(self.gpu_model, self.num_gpus, tuple(instances))

    def app_layout(self, app: str) -> Layout:
        """The part of the node one app runs on, as the plan ``Layout`` the runtime places workers by."""
        gpus = tuple(
            GpuLayout(g, tuple(i.placed() for i in self.on_gpu(g) if i.app == app))
            for g in range(self.num_gpus)
        )
        return Layout(self.gpu_model, gpus)


def empty_layout(gpu: GpuModel, num_gpus: int) -> NodeLayout:
    return NodeLayout(gpu.name, num_gpus, ())


def from_app_layouts(gpu_model: str, num_gpus: int, layouts: Mapping[str, Layout]) -> NodeLayout:
    """The node layout made of each app's plan layout (app name -> Layout)."""
    out = []
    for app, layout in layouts.items():
        for g in layout.gpus:
            for p in g.instances:
                out.append(
                    NodeInstance(
                        gpu=g.gpu,
                        profile=p.profile,
                        start=p.start,
                        app=app,
                        task=p.task,
                        variant=p.variant,
                        mps=p.mps,
                        max_batch=p.max_batch,
                        index=p.index,
                        seat=p.seat,
                    )
                )
    return NodeLayout(gpu_model, num_gpus, tuple(out))


def validate_node_layout(layout: NodeLayout, gpu: GpuModel) -> list[str]:
    """Every placement rule the union of all apps' instances breaks (empty when valid)."""
    problems: list[str] = []
    if layout.gpu_model and layout.gpu_model != gpu.name:
        problems.append(f"layout is for {layout.gpu_model}, checked against {gpu.name}")
    for inst in layout.instances:
        if not 0 <= inst.gpu < layout.num_gpus:
            problems.append(f"{inst.name}: GPU {inst.gpu} is not one of the node's {layout.num_gpus}")
        if inst.app and not 1 <= inst.mps <= 4:
            problems.append(f"{inst.name}: MPS level {inst.mps} (1..4)")
    for g in sorted({i.gpu for i in layout.instances}):
        problems += [
            f"GPU {g}: {p}"
            for p in placement_violations(gpu, [(i.profile, i.start) for i in layout.on_gpu(g)])
        ]
        problems += [f"GPU {g}: {p}" for p in seat_violations(gpu, [i.placed() for i in layout.on_gpu(g)])]
    return problems


# ---------------------------------------------------------------------------------------------
# placing one app's plan against the others


def _free_starts(gpu: GpuModel, held: list[tuple[str, int]], profile: str) -> list[int]:
    p = gpu.profile(profile)
    mask = 0
    compute = 0
    count = 0
    for name, start in held:
        q = gpu.profile(name)
        mask |= slot_mask(q, start)
        compute += q.compute_slices
        count += name == profile
    if count >= p.max_per_gpu or compute + p.compute_slices > gpu.compute_slices:
        return []
    return [s for s in p.starts if s + p.size <= NUM_PLACEMENT_SLOTS and not mask & slot_mask(p, s)]


def _greedy_against(
    gpu: GpuModel, held: dict[int, list[tuple[str, int]]], requests: Sequence[InstanceRequest], num_gpus: int,
    keep_usable: bool = False,
) -> list[tuple[InstanceRequest, int, int]] | None:
    """First fit, largest first, onto GPUs already holding ``held``; the start leaving most room.

    ``keep_usable``: each instance goes where it leaves the most of the other compute slices
    usable (``layouts.usable_compute``: a GPU whose memory slots run out strands its free slices),
    and only among those the first fit. Why: on traffic_analysis's spike windows the running
    layouts held 1-3 compute slices (1.5 on average) fewer usable than the best packing of the same
    instances, and the peak's in-place extension found no memory slot beside its free slices.
    """
    state = {g: list(held.get(g, [])) for g in range(num_gpus)}
    order = sorted(
        requests,
        key=lambda r: (
            -gpu.profile(r.profile).size,
            -gpu.profile(r.profile).compute_slices,
            r.profile,
            r.task,
            r.variant,
            r.index,
        ),
    )
    out = []
    for r in order:
        # the fullest GPU first (fewest GPUs touched), then the lowest index
        best: tuple[tuple[int, ...], int, int] | None = None  # (preference, GPU, start)
        for rank, g in enumerate(sorted(range(num_gpus), key=lambda g: (-len(state[g]), g))):
            starts = _free_starts(gpu, state[g], r.profile)
            if not starts:
                continue
            base = state[g]
            if not keep_usable:
                s = max(starts, key=lambda s, base=base: (room(gpu, [*base, (r.profile, s)]), -s))
                best = ((), g, s)
                break
            # the slices this instance makes unusable beyond its own, then first fit, most room
            left = usable_compute(gpu, base) - gpu.profile(r.profile).compute_slices
            for x in starts:
                after = [*base, (r.profile, x)]
                key = (left - usable_compute(gpu, after), rank, -room(gpu, after), x)
                if best is None or key < best[0]:
                    best = (key, g, x)
        if best is None:
            return None
        _, g, s = best
        state[g].append((r.profile, s))
        out.append((r, g, s))
    return out


def _exact_against(
    gpu: GpuModel, held: dict[int, list[tuple[str, int]]], requests: Sequence[InstanceRequest], num_gpus: int
) -> list[tuple[InstanceRequest, int, int]] | None:
    """Exact: per GPU the valid layouts that contain what it holds; DFS over GPUs with memo."""
    names = tuple(sorted({r.profile for r in requests}))
    index = {n: k for k, n in enumerate(names)}
    demand = [0] * len(names)
    for r in requests:
        demand[index[r.profile]] += 1
    all_layouts = valid_layouts(gpu)
    per_gpu: list[dict[tuple[int, ...], tuple[tuple[str, int], ...]]] = []
    for g in range(num_gpus):
        base = sorted(held.get(g, []))
        base_set = set(base)
        options: dict[tuple[int, ...], tuple[tuple[str, int], ...]] = {}
        for lay in all_layouts:
            if not base_set <= set(lay):
                continue
            added = [x for x in lay if x not in base_set]
            if any(n not in index for n, _ in added):
                continue
            vec = [0] * len(names)
            for n, _ in added:
                vec[index[n]] += 1
            key = tuple(vec)
            if key not in options or room(gpu, lay) > room(gpu, [*base, *options[key]]):
                options[key] = tuple(added)
        per_gpu.append(options)
    failed: set[tuple[tuple[int, ...], int]] = set()
    nodes = 0

    def dfs(rem: tuple[int, ...], g: int) -> list[tuple[int, ...]] | None:
        nonlocal nodes
        if not any(rem):
            return []
        if g == num_gpus or (rem, g) in failed:
            return None
        nodes += 1
        if nodes > _DFS_NODE_BUDGET:
            return None
        cands = sorted(
            (v for v in per_gpu[g] if all(a <= b for a, b in zip(v, rem))), key=lambda v: (-sum(v), v)
        )
        for v in cands:
            sub = dfs(tuple(b - a for a, b in zip(v, rem)), g + 1)
            if sub is not None:
                return [v, *sub]
        failed.add((rem, g))
        return None

    vectors = dfs(tuple(demand), 0)
    if vectors is None:
        return None
    pool: dict[str, list[InstanceRequest]] = defaultdict(list)
    for r in sorted(requests, key=lambda r: (r.profile, r.task, r.variant, r.index)):
        pool[r.profile].append(r)
    out = []
    for g, v in enumerate(vectors):
        for name, start in per_gpu[g][v]:
            out.append((pool[name].pop(0), g, start))
    return out


def place_app(node: NodeLayout, app: str, requests: Sequence[InstanceRequest], gpu: GpuModel,
              keep_usable: bool = False) -> NodeLayout:
    """The node layout with ``app``'s instances replaced by a placement of ``requests``.

    Other apps' instances stay exactly where they are. The app's own running instances are
    reused first: an identical workload keeps its MIG instance (same processes); the rest goes
    onto slots that neither the other apps nor the app's own running instances hold (greedy,
    then exact), so its new processes start beside the running ones (make-before-break). Only
    when those do not hold it does a running instance of the same profile host another of the
    app's workloads, or the new instances go over the slots of the app's outgoing ones (their
    slots are freed first: drained while the rest of the node serves). Idle instances count as free. Raises
    ``PackingError`` when the rest cannot fit beside the other apps. ``keep_usable``: the greedy places
    each new instance where it strands the fewest other compute slices (``_greedy_against``), the
    first fit where that greedy leaves something out.
    """
    _check_room(node, app, requests, gpu)
    others = [i for i in node.instances if i.app and i.app != app]
    tries = ((True, False, True), (True, True, True), (True, False, False), (True, True, False),
             (False, False, False))
    for identical, swaps, beside in tries:
        mine = _attempt(node, app, requests, gpu, keep_usable, identical, swaps, beside)
        if mine is not None:
            return node.with_instances([*others, *mine, *_surviving_idle(node, gpu, others, mine)])
    held_by = ", ".join(sorted({i.app for i in others})) or "no other app"
    raise PackingError(
        f"no room for {app}'s {len(requests)} MIG instances beside what {held_by} holds "
        f"on {node.num_gpus} x {gpu.name}: the placement rules leave no valid start"
    )


def _check_room(node: NodeLayout, app: str, requests: Sequence[InstanceRequest], gpu: GpuModel) -> None:
    """A ``PackingError`` for a profile the GPU lacks, or more compute slices than the other apps
    leave free."""
    unknown = sorted({r.profile for r in requests} - set(gpu.profile_names))
    if unknown:
        raise PackingError(f"unknown MIG profile(s) {', '.join(unknown)} for {gpu.name}")
    need = sum(gpu.profile(r.profile).slice_cost for r in requests)
    free = node.slices_free_for(gpu, app)
    if need > free:
        raise PackingError(
            f"{app} asks for {need:g} compute slices; the other apps of the node hold "
            f"{gpu.compute_slices * node.num_gpus - free:g} of {gpu.compute_slices * node.num_gpus}"
        )


def _attempt(node: NodeLayout, app: str, requests: Sequence[InstanceRequest], gpu: GpuModel,
             keep_usable: bool, reuse_identical: bool, reuse_swaps: bool,
             beside: bool) -> list[NodeInstance] | None:
    """One try at the app's instances: ``reuse_identical`` keeps running instances of identical
    workloads (and takes idle ones of the profile), ``reuse_swaps`` lets a running instance host
    another of the app's workloads, ``beside`` keeps the app's unused running instances' slots
    held; the rest placed greedy, then exact. None when it does not fit."""
    others = [i for i in node.instances if i.app and i.app != app]
    kept: list[NodeInstance] = []
    pending = sorted(requests, key=lambda r: (r.profile, r.task, r.variant, r.mps, r.max_batch, r.index))
    unused = [i for i in node.instances if i.app == app]
    if reuse_identical:
        _keep_identical(pending, unused, kept)
        # an idle instance (adopted at start-up) of the profile
        _host_on([i for i in node.instances if not i.app], pending, kept, app=app)
    if reuse_swaps:  # a running instance of the app hosts another of its workloads
        _host_on(unused, pending, kept, uuid="")
    holders = [*others, *kept, *(unused if beside else [])]
    seated = _free_seats(gpu, holders, pending, app)
    pending, bundles, _ = bundle_shares(pending, gpu, None)
    held: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for i in devices(holders):
        held[i.gpu].append((i.profile, i.start))
    placed = _greedy_against(gpu, held, pending, node.num_gpus, keep_usable) if keep_usable else None
    if placed is None:
        placed = _greedy_against(gpu, held, pending, node.num_gpus)
    if placed is None:  # greedy left something out: the exact search decides
        placed = _exact_against(gpu, held, pending, node.num_gpus)
    if placed is None:
        return None
    return kept + seated + [
        NodeInstance(gpu=g, profile=m.profile, start=s, app=app, task=m.task, variant=m.variant, mps=m.mps,
                     max_batch=m.max_batch, index=m.index, seat=seat)
        for r, g, s in placed for m, seat in unbundled(r, bundles)
    ]


def _free_seats(gpu: GpuModel, holders: list[NodeInstance], pending: list[InstanceRequest],
                app: str) -> list[NodeInstance]:
    """Pending shares of a MIG instance seated in the free seats of instances of their profile that
    ``holders`` share already (any app's: its MPS daemon runs, nothing is created); moved from
    ``pending`` to the result."""
    taken: dict[tuple[int, int, str], set[int]] = defaultdict(set)
    for i in holders:
        if gpu.profile(i.profile).host:
            taken[(i.gpu, i.start, i.profile)].add(i.seat)
    out: list[NodeInstance] = []
    for (g, start, name), seats in sorted(taken.items()):
        for seat in range(gpu.profile(name).share_of):
            r = next((r for r in pending if r.profile == name), None)
            if r is None:
                break
            if seat in seats:
                continue
            pending.remove(r)
            seats.add(seat)
            out.append(NodeInstance(gpu=g, profile=name, start=start, app=app, task=r.task, variant=r.variant,
                                    mps=r.mps, max_batch=r.max_batch, index=r.index, seat=seat))
    return out


def _keep_identical(pending: list[InstanceRequest], unused: list[NodeInstance],
                    kept: list[NodeInstance]) -> None:
    """Each pending request with a running instance of the identical workload keeps it (the one
    of the same index first): moved from ``pending`` and ``unused`` to ``kept``."""
    for r in list(pending):
        match = [
            i
            for i in unused
            if (i.task, i.variant, i.profile, i.mps, i.max_batch)
            == (r.task, r.variant, r.profile, r.mps, r.max_batch)
        ]
        if match:
            best = next((i for i in match if i.index == r.index), match[0])
            unused.remove(best)
            pending.remove(r)
            kept.append(replace(best, index=r.index))


def _host_on(pool: list[NodeInstance], pending: list[InstanceRequest], kept: list[NodeInstance],
             **changes: str) -> None:
    """Each pending request onto an instance of its profile taken from ``pool`` (no NVML call)."""
    for r in list(pending):
        match = [i for i in pool if i.profile == r.profile]
        if match:
            pool.remove(match[0])
            pending.remove(r)
            kept.append(replace(match[0], task=r.task, variant=r.variant, mps=r.mps,
                                max_batch=r.max_batch, index=r.index, pids=(), **changes))


def _surviving_idle(node: NodeLayout, gpu: GpuModel, others: list[NodeInstance],
                    mine: list[NodeInstance]) -> list[NodeInstance]:
    """The idle instances that still fit beside the placement; those overlapping it give way (they
    are destroyed)."""
    taken = {i.slot for i in mine}
    idle = [i for i in node.instances if not i.app and i.slot not in taken]
    survivors: list[NodeInstance] = []
    for i in idle:
        trial = [(x.profile, x.start) for x in [*others, *mine, *survivors, i] if x.gpu == i.gpu]
        if not placement_violations(gpu, trial):
            survivors.append(i)
    return survivors
