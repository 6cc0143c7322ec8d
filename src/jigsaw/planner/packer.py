"""Packs a plan's MIG instances onto physical GPUs and writes the result for the node to apply.

``pack`` places instances with the paper's greedy first-fit (largest first, fewest GPUs) and,
where greedy leaves something out, solves the packing exactly, so ``PackingError`` means that no
packing exists. Given the previous bin's layout it keeps GPUs whose MIG partition can stay as it
is, because a repartition is disruptive. The layout is written as a mig-parted config and as
explicit ``nvidia-smi`` commands (only the commands carry the exact start slots).

Shares of a MIG instance (``<profile>-1of<k>``, ``jigsaw.shares``) are laid up to k into one
instance of their profile, and only there: they are bundled first (``bundle_shares``: the shares that
shared an instance in the previous layout together again, the rest k at a time), each bundle
packed as one instance of its host profile, then given back as its shares at the instance's
start, each with its seat (0..k-1).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from jigsaw.errors import JigsawError
from jigsaw.mig import NUM_PLACEMENT_SLOTS, GpuModel, MigProfile
from jigsaw.plan import GpuLayout, Layout, PlacedInstance, Plan
from jigsaw.planner.layouts import (
    Counts,
    fits_on_gpu,
    layout_counts,
    maximal_layout_counts,
    placement_violations,
    room,
    slot_mask,
)

# DFS nodes the exact fallback may visit before handing the problem to a small MILP
_DFS_NODE_BUDGET = 500
_MILP_TIME_LIMIT_S = 30.0


class PackingError(JigsawError):
    """The requested MIG instances cannot be placed on the node's GPUs."""


@dataclass(frozen=True)
class InstanceRequest:
    """One MIG instance the plan wants, with what will run in it."""

    profile: str
    task: str = ""
    variant: str = ""
    mps: int = 1
    max_batch: int = 1
    index: int = 0

    @property
    def key(self) -> tuple[str, str, str, int, int]:
        """What makes two instances interchangeable: same model in the same segment."""
        return (self.task, self.variant, self.profile, self.mps, self.max_batch)


BUNDLE_TASK = "\x00shares"  # the task of a bundle of shares packed as one instance of their host


@dataclass(frozen=True)
class ShareBundle:
    """Up to k shares of one MIG instance, in seat order."""

    share: str  # the share profile (``1g.10gb-1of2``)
    members: tuple[InstanceRequest, ...]
    seats: tuple[int, ...] = ()  # each member's seat (default: 0, 1, ...)

    @property
    def label(self) -> str:
        """Equal for bundles of the same shares: what makes a kept instance keep its processes."""
        return self.share + ":" + "|".join(sorted(f"{r.task}/{r.variant}/{r.mps}/{r.max_batch}/{r.index}"
                                                  for r in self.members))


def bundle_shares(instances: Sequence[InstanceRequest], gpu: GpuModel, previous: Layout | None
                  ) -> tuple[list[InstanceRequest], dict[str, ShareBundle], Layout | None]:
    """The requests with every share of a MIG instance bundled into one request of its host per
    instance, the bundles by their request's label, and ``previous`` seen the same way.

    Shares that sat in one instance of ``previous`` are bundled together again (each one
    identical to a previous share, the same index first, takes its seat), so an unchanged
    instance matches its previous self and keeps its place; the rest fill the free seats of
    those bundles, then new bundles of k in order.
    """
    shares: dict[str, list[InstanceRequest]] = defaultdict(list)
    out: list[InstanceRequest] = []
    for r in instances:
        (shares[r.profile] if gpu.profile(r.profile).host else out).append(r)
    if not shares:
        return out, {}, previous
    groups = _previous_groups(previous, gpu) if previous is not None else {}
    bundles: dict[str, ShareBundle] = {}
    for name, pending in sorted(shares.items()):
        k = gpu.profile(name).share_of
        pending.sort(key=_sort_key)
        seated: list[list[InstanceRequest | None]] = []
        kept: list[str] = []  # a previous instance whose shares all stay: its label (new seats filled)
        for members in (m for (n, _, _), m in sorted(groups.items()) if n == name):
            seats: list[InstanceRequest | None] = [None] * k
            for seat, was in members:
                hit = next((r for r in pending if _placed_key(was) == r.key and r.index == was.index), None) \
                    or next((r for r in pending if _placed_key(was) == r.key), None)
                if hit is not None and seat < k:
                    pending.remove(hit)
                    seats[seat] = hit
            if any(seats):
                seated.append(seats)
                was = tuple(InstanceRequest(name, w.task, w.variant, w.mps, w.max_batch, w.index)
                            for _, w in members)
                was_label = ShareBundle(name, was).label
                now = ShareBundle(name, tuple(r for r in seats if r is not None)).label
                kept.append(was_label if now == was_label else "")
        for seats in seated:
            for i in range(k):
                if seats[i] is None and pending:
                    seats[i] = pending.pop(0)
        seated += [list(pending[i:i + k]) for i in range(0, len(pending), k)]
        kept += [""] * (len(seated) - len(kept))
        for seats, label in zip(seated, kept, strict=True):
            b = ShareBundle(name, tuple(r for r in seats if r is not None),
                            tuple(i for i, r in enumerate(seats) if r is not None))
            bundles[label or b.label] = b
            out.append(InstanceRequest(gpu.profile(name).host, BUNDLE_TASK, label or b.label, k, 0, 0))
    return out, bundles, _previous_bundled(previous, gpu) if previous is not None else None


def _previous_groups(previous: Layout, gpu: GpuModel
                     ) -> dict[tuple[str, int, int], list[tuple[int, PlacedInstance]]]:
    """(share profile, GPU, start) -> the (seat, share) of each previous instance's shares."""
    out: dict[tuple[str, int, int], list[tuple[int, PlacedInstance]]] = defaultdict(list)
    for g in previous.gpus:
        for p in g.instances:
            if _is_share(gpu, p.profile):
                out[(p.profile, g.gpu, p.start)].append((p.seat, p))
    for members in out.values():
        members.sort(key=lambda x: x[0])
    return out


def _is_share(gpu: GpuModel, name: str) -> bool:
    return name in gpu.profile_names and bool(gpu.profile(name).host)


def _previous_bundled(previous: Layout, gpu: GpuModel) -> Layout:
    """``previous`` with each MIG instance's shares as one placed instance of its host, labelled
    as ``bundle_shares`` labels the same shares."""
    gpus = []
    for g in previous.gpus:
        plain = [p for p in g.instances if not _is_share(gpu, p.profile)]
        groups: dict[tuple[str, int], list[PlacedInstance]] = defaultdict(list)
        for p in g.instances:
            if _is_share(gpu, p.profile):
                groups[(p.profile, p.start)].append(p)
        for (name, start), members in sorted(groups.items()):
            label = ShareBundle(name, tuple(InstanceRequest(name, p.task, p.variant, p.mps, p.max_batch,
                                                            p.index) for p in members)).label
            plain.append(PlacedInstance(gpu.profile(name).host, start, BUNDLE_TASK, label,
                                        mps=gpu.profile(name).share_of, max_batch=0))
        gpus.append(GpuLayout(g.gpu, tuple(sorted(plain, key=lambda p: p.start))))
    return Layout(previous.gpu_model, tuple(gpus))


def _placed_key(p: PlacedInstance) -> tuple[str, str, str, int, int]:
    return (p.task, p.variant, p.profile, p.mps, p.max_batch)


def _sort_key(r: InstanceRequest) -> tuple[str, str, str, int, int, int]:
    return (r.profile, r.task, r.variant, r.mps, r.max_batch, r.index)


def instances_from_plan(plan: Plan) -> list[InstanceRequest]:
    """One request per MIG instance of the plan (``PlanInstance.count`` copies, indexed 0..)."""
    return [
        InstanceRequest(pi.mig_profile, pi.task, pi.variant, pi.mps, pi.max_batch, i)
        for pi in plan.instances
        for i in range(pi.count)
    ]


# ---------------------------------------------------------------------------------------------
# greedy first-fit


class _GpuState:
    """Occupied slots, per-profile counts and compute slices of one GPU during greedy packing."""

    def __init__(self, max_compute: int) -> None:
        self.max_compute = max_compute
        self.mask = 0
        self.compute = 0
        self.counts: Counter[str] = Counter()
        self.placed: list[tuple[InstanceRequest, int]] = []

    def starts(self, p: MigProfile) -> list[int]:
        if self.counts[p.name] >= p.max_per_gpu or self.compute + p.compute_slices > self.max_compute:
            return []
        return [s for s in p.starts
                if s + p.size <= NUM_PLACEMENT_SLOTS and not self.mask & slot_mask(p, s)]

    def add(self, r: InstanceRequest, p: MigProfile, start: int) -> None:
        self.mask |= slot_mask(p, start)
        self.compute += p.compute_slices
        self.counts[p.name] += 1
        self.placed.append((r, start))

    def signature(self) -> list[tuple[str, int]]:
        return [(r.profile, s) for r, s in self.placed]


def _greedy(requests: Sequence[InstanceRequest], gpu: GpuModel,
            num_gpus: int) -> list[list[tuple[InstanceRequest, int]]] | None:
    """The paper's first-fit: largest first, each onto the first GPU with a valid start.

    Order: size in slots, then compute slices, both descending. Start rule: among the valid
    starts on that GPU take the one that leaves the most ``room`` (still-possible placements
    weighted by their size), the lowest start on ties - e.g. a lone 1g instance goes to slot 6,
    keeping slots 0-3 free for a 4g. Returns per-GPU ``(request, start)`` lists or None.
    """
    states = [_GpuState(gpu.compute_slices) for _ in range(num_gpus)]
    order = sorted(requests, key=lambda r: (-gpu.profile(r.profile).size,
                                            -gpu.profile(r.profile).compute_slices, _sort_key(r)))
    for r in order:
        p = gpu.profile(r.profile)
        for st in states:
            starts = st.starts(p)
            if not starts:
                continue
            base = st.signature()
            best = max(starts, key=lambda s, base=base: (room(gpu, [*base, (p.name, s)]), -s))
            st.add(r, p, best)
            break
        else:
            return None
    return [st.placed for st in states]


# ---------------------------------------------------------------------------------------------
# exact fallback


class _BudgetExceeded(Exception):
    pass


def _exact_dfs(gpu: GpuModel, names: tuple[str, ...], demand: Counts,
               num_gpus: int) -> list[Counts] | None:
    """Per-GPU count vectors covering ``demand`` exactly, by DFS over GPUs; None if impossible.

    On each GPU only the vectors that are maximal within what is still to place are tried: any
    solution can be rewritten to use them, since packable multisets are downward closed.
    """
    vecs = [v for v in layout_counts(gpu, names) if any(v)]
    compute = [gpu.profile(n).compute_slices for n in names]
    failed: set[tuple[Counts, int]] = set()
    nodes = 0

    def dfs(rem: Counts, k: int) -> list[Counts] | None:
        nonlocal nodes
        if not any(rem):
            return []
        if k == 0 or sum(c * x for c, x in zip(compute, rem)) > gpu.compute_slices * k:
            return None
        if (rem, k) in failed:
            return None
        nodes += 1
        if nodes > _DFS_NODE_BUDGET:
            raise _BudgetExceeded
        capped = {tuple(min(a, b) for a, b in zip(v, rem)) for v in vecs}
        cands = [c for c in capped
                 if any(c) and not any(d != c and all(x >= y for x, y in zip(d, c)) for d in capped)]
        cands.sort(key=lambda c: (-sum(a * b for a, b in zip(compute, c)), c))
        for c in cands:
            sub = dfs(tuple(a - b for a, b in zip(rem, c)), k - 1)
            if sub is not None:
                return [c, *sub]
        failed.add((rem, k))
        return None

    return dfs(demand, num_gpus)


def _exact_milp(gpu: GpuModel, names: tuple[str, ...], demand: Counts,
                num_gpus: int) -> list[Counts] | None:
    """The same question as a tiny integer program over the maximal one-GPU vectors.

    x_v = GPUs given vector v; sum x_v <= num_gpus; sum x_v * v >= demand; minimize GPUs. The
    surplus is then trimmed (downward closure keeps every trimmed vector packable).
    """
    from jigsaw.planner.model import LinearModel  # deferred: only needed when the DFS gives up

    vecs = [v for v in maximal_layout_counts(gpu, names) if any(v)]
    m = LinearModel(maximize=False)  # solved where a CBC abort cannot end the caller
    x = [m.var(0, num_gpus, 1.0, integer=True) for _ in vecs]
    m.row(x, [1.0] * len(x), hi=num_gpus)
    for i, d in enumerate(demand):
        m.row(x, [float(v[i]) for v in vecs], lo=d)
    sol = m.solve("cbc", _MILP_TIME_LIMIT_S, 0.0)
    if sol.status == "infeasible":
        return None
    if not sol.has_incumbent:
        raise PackingError(f"exact packing gave no answer within {_MILP_TIME_LIMIT_S:.0f} s ({sol.status})")
    out: list[list[int]] = []
    for v, xv in zip(vecs, sol.values):
        out.extend([list(v) for _ in range(round(xv))])
    surplus = [sum(v[i] for v in out) - d for i, d in enumerate(demand)]
    for i in range(len(names)):
        for v in reversed(out):
            take = min(surplus[i], v[i])
            v[i] -= take
            surplus[i] -= take
    return [tuple(v) for v in out if any(v)]


def _exact(requests: Sequence[InstanceRequest], gpu: GpuModel,
           num_gpus: int) -> list[list[tuple[InstanceRequest, int]]] | None:
    """Exact packing: per-GPU multisets from the valid-layout enumeration, then placements."""
    by_profile: dict[str, list[InstanceRequest]] = defaultdict(list)
    for r in sorted(requests, key=_sort_key):
        by_profile[r.profile].append(r)
    names = tuple(n for n in gpu.profile_names if n in by_profile)
    demand = tuple(len(by_profile[n]) for n in names)
    try:
        vectors = _exact_dfs(gpu, names, demand, num_gpus)
    except _BudgetExceeded:
        vectors = _exact_milp(gpu, names, demand, num_gpus)
    if vectors is None:
        return None
    bins: list[list[tuple[InstanceRequest, int]]] = []
    for v in vectors:
        multiset = [n for n, c in zip(names, v) for _ in range(c)]
        placement = fits_on_gpu(gpu, multiset)
        assert placement is not None  # every vector comes from a valid layout
        bins.append([(by_profile[name].pop(0), start) for name, start in placement])
    bins.extend([] for _ in range(num_gpus - len(bins)))
    return bins


def _pack_fresh(requests: Sequence[InstanceRequest], gpu: GpuModel,
                num_gpus: int) -> list[list[tuple[InstanceRequest, int]]] | None:
    """Greedy first, exact when greedy leaves something out; None only if impossible."""
    if not requests:
        return [[] for _ in range(num_gpus)]
    if sum(gpu.profile(r.profile).compute_slices for r in requests) > gpu.compute_slices * num_gpus:
        return None
    bins = _greedy(requests, gpu, num_gpus)
    if bins is None:
        bins = _exact(requests, gpu, num_gpus)
    return bins


# ---------------------------------------------------------------------------------------------
# reuse of the previous layout


def _match_previous(previous: Layout, wanted: Sequence[InstanceRequest], num_gpus: int, gpu: GpuModel
                    ) -> tuple[dict[int, list[tuple[InstanceRequest, int]]], dict[int, int],
                               list[InstanceRequest]]:
    """GPUs whose previous partition can stay: every previous MIG instance gets a wanted one.

    Wanted instances are matched first to identical previous ones (same task, variant, profile,
    MPS level and max batch; the same index preferred), which keep their GPU and start; then a
    previous instance left without a match may host another wanted instance of the same profile
    (a model swap inside an existing MIG instance, no repartition) - but only on a GPU that is
    then fully used, since otherwise it must be repartitioned anyway. Returns the kept GPUs'
    assignments, their number of identical matches, and the wanted instances not yet placed.
    """
    # a previous partition that breaks the rules (hand-edited, other table) is never kept
    prev_gpus = [g for g in previous.gpus
                 if 0 <= g.gpu < num_gpus and g.instances
                 and not placement_violations(gpu, [(p.profile, p.start) for p in g.instances])]
    pool: dict[tuple[str, str, str, int, int], list[InstanceRequest]] = defaultdict(list)
    for r in sorted(wanted, key=_sort_key):
        pool[r.key].append(r)
    slots: dict[tuple[int, int], InstanceRequest] = {}  # (gpu, start) -> request

    # identical instance, same index
    for g in prev_gpus:
        for p in g.instances:
            cands = pool.get(_placed_key(p), [])
            for i, r in enumerate(cands):
                if r.index == p.index:
                    slots[(g.gpu, p.start)] = cands.pop(i)
                    break
    # identical instance, any index
    for g in prev_gpus:
        for p in g.instances:
            if (g.gpu, p.start) not in slots and pool.get(_placed_key(p)):
                slots[(g.gpu, p.start)] = pool[_placed_key(p)].pop(0)
    exact = {g.gpu: sum((g.gpu, p.start) in slots for p in g.instances) for g in prev_gpus}

    by_profile: dict[str, list[InstanceRequest]] = defaultdict(list)
    for lst in pool.values():
        for r in lst:
            by_profile[r.profile].append(r)
    for lst in by_profile.values():
        lst.sort(key=_sort_key)

    kept: dict[int, list[tuple[InstanceRequest, int]]] = {}
    # GPUs with the fewest unmatched MIG instances are completed first
    order = sorted(prev_gpus, key=lambda g: (sum((g.gpu, p.start) not in slots for p in g.instances), g.gpu))
    for g in order:
        missing = Counter(p.profile for p in g.instances if (g.gpu, p.start) not in slots)
        if any(len(by_profile[name]) < c for name, c in missing.items()):
            # cannot be fully used: repartitioned, so its matches may refill another GPU
            for p in g.instances:
                r = slots.pop((g.gpu, p.start), None)
                if r is not None:
                    by_profile[r.profile].append(r)
                    by_profile[r.profile].sort(key=_sort_key)
            continue
        assignment = []
        for p in sorted(g.instances, key=lambda p: p.start):
            r = slots.get((g.gpu, p.start))
            if r is None:
                r = by_profile[p.profile].pop(0)
            assignment.append((r, p.start))
        kept[g.gpu] = assignment
    remaining = [r for lst in by_profile.values() for r in lst]
    return kept, {g: exact[g] for g in kept}, remaining


def _assign_bins(bins: list[list[tuple[InstanceRequest, int]]], free_gpus: list[int],
                 previous: Layout | None, gpu: GpuModel) -> dict[int, list[tuple[InstanceRequest, int]]]:
    """Puts freshly packed per-GPU bins onto the free GPUs so that the fewest GPUs change.

    A bin whose multiset equals a free GPU's previous partition takes that GPU and its previous
    starts (unchanged); other bins go to GPUs that change anyway (previously partitioned), then
    to previously empty ones.
    """
    prev = {g.gpu: g for g in previous.gpus} if previous is not None else {}
    free = list(free_gpus)
    out: dict[int, list[tuple[InstanceRequest, int]]] = {}
    rest: list[list[tuple[InstanceRequest, int]]] = []
    for b in (b for b in bins if b):
        names = sorted(r.profile for r, _ in b)
        for gid in free:
            g = prev.get(gid)
            if (g is not None and g.instances and sorted(p.profile for p in g.instances) == names
                    and not placement_violations(gpu, [(p.profile, p.start) for p in g.instances])):
                out[gid] = _onto_placement(b, g)
                free.remove(gid)
                break
        else:
            rest.append(b)
    free.sort(key=lambda gid: (not (gid in prev and prev[gid].instances), gid))
    for b, gid in zip(rest, free):
        out[gid] = b
    return out


def _onto_placement(b: list[tuple[InstanceRequest, int]], g: GpuLayout) -> list[tuple[InstanceRequest, int]]:
    """Moves a bin onto a GPU's previous placement of the same multiset, matching identical
    previous instances to their old starts where possible."""
    reqs = sorted((r for r, _ in b), key=_sort_key)
    out: list[tuple[InstanceRequest, int]] = []
    slots = sorted(g.instances, key=lambda p: p.start)
    pending = []
    for p in slots:
        for i, r in enumerate(reqs):
            if r.key == _placed_key(p):
                out.append((reqs.pop(i), p.start))
                break
        else:
            pending.append(p)
    for p in pending:
        i = next(i for i, r in enumerate(reqs) if r.profile == p.profile)
        out.append((reqs.pop(i), p.start))
    return out


# ---------------------------------------------------------------------------------------------
# public entry points


def unbundled(r: InstanceRequest, bundles: dict[str, ShareBundle]) -> list[tuple[InstanceRequest, int]]:
    """A packed request's (request, seat)s: a bundle's shares in seat order, else itself."""
    if r.task != BUNDLE_TASK:
        return [(r, 0)]
    b = bundles[r.variant]
    return list(zip(b.members, b.seats or range(len(b.members)), strict=True))


def _to_layout(gpu: GpuModel, num_gpus: int, assignment: dict[int, list[tuple[InstanceRequest, int]]],
               bundles: dict[str, ShareBundle]) -> Layout:
    """The layout of the packed requests, each bundle given back as its shares, seated in order."""
    gpus = []
    for gid in range(num_gpus):
        placed = sorted(assignment.get(gid, []), key=lambda x: x[1])
        gpus.append(GpuLayout(gid, tuple(
            PlacedInstance(profile=m.profile, start=s, task=m.task, variant=m.variant, index=m.index,
                           mps=m.mps, max_batch=m.max_batch, seat=seat)
            for r, s in placed for m, seat in unbundled(r, bundles))))
    return Layout(gpu.name, tuple(gpus))


def pack(instances: Sequence[InstanceRequest], gpu: GpuModel, num_gpus: int,
         previous: Layout | None = None) -> Layout:
    """Places every requested MIG instance on ``num_gpus`` GPUs of model ``gpu``.

    Greedy first-fit (largest first, fewest GPUs), with an exact fallback, so it raises
    ``PackingError`` only when no packing exists. With ``previous``, GPUs whose partition can
    stay (see ``_match_previous``) come out unchanged and only the rest is packed; if that rest
    does not fit, kept GPUs are given up (those with the fewest identical instances first, 1,
    then 2, 4, ... at a time) until it does - with all given up it is a fresh packing, so reuse never makes a
    packable plan fail.
    """
    if num_gpus < 0:
        raise PackingError(f"number of GPUs must be >= 0, got {num_gpus}")
    unknown = sorted({r.profile for r in instances} - set(gpu.profile_names))
    if unknown:
        raise PackingError(f"unknown MIG profile(s) {', '.join(unknown)} for {gpu.name} "
                           f"(known: {', '.join(gpu.profile_names)})")
    if previous is not None and previous.gpu_model and previous.gpu_model != gpu.name:
        raise PackingError(f"previous layout is for {previous.gpu_model}, not {gpu.name}")
    asked = instances
    instances, bundles, previous = bundle_shares(asked, gpu, previous)
    total = sum(gpu.profile(r.profile).compute_slices for r in instances)
    if total > gpu.compute_slices * num_gpus:
        raise PackingError(f"{len(instances)} MIG instances need {total} compute slices; "
                           f"{num_gpus} x {gpu.name} have {gpu.compute_slices * num_gpus}")

    kept: dict[int, list[tuple[InstanceRequest, int]]] = {}
    exact: dict[int, int] = {}
    remaining = list(instances)
    if previous is not None:
        kept, exact, remaining = _match_previous(previous, instances, num_gpus, gpu)
    give_up = 1
    while True:
        free = [gid for gid in range(num_gpus) if gid not in kept]
        bins = _pack_fresh(remaining, gpu, len(free))
        if bins is not None:
            assignment = dict(kept)
            assignment.update(_assign_bins(bins, free, previous, gpu))
            return _to_layout(gpu, num_gpus, assignment, bundles)
        if not kept:
            break
        # a tier is the kept GPUs with the fewest identical instances; no tier is given up
        # before the one below it, and within a tier 1, 2, 4, ... GPUs at a time bound the
        # number of exact solves, also on a 100-GPU node
        tier = min(exact[gid] for gid in kept)
        in_tier = sorted((gid for gid in kept if exact[gid] == tier), key=lambda gid: (len(kept[gid]), -gid))
        for gid in in_tier[:give_up]:
            remaining += [r for r, _ in kept.pop(gid)]
        give_up *= 2
    counts = Counter(r.profile for r in asked)
    what = ", ".join(f"{c} x {n}" for n, c in sorted(counts.items()))
    raise PackingError(f"no valid MIG packing of {what} ({total} compute slices) "
                       f"on {num_gpus} x {gpu.name}: the placement rules leave no room")


def changed_gpus(previous: Layout, new: Layout) -> list[int]:
    """GPUs whose MIG partition (the ``(profile, start)`` signature) differs: to repartition."""
    old = {g.gpu: g.signature for g in previous.gpus}
    cur = {g.gpu: g.signature for g in new.gpus}
    return sorted(gid for gid in set(old) | set(cur) if old.get(gid, ()) != cur.get(gid, ()))


def validate_layout(layout: Layout, gpu: GpuModel) -> list[str]:
    """Every rule the layout breaks (empty when valid): an independent check of any packing."""
    problems: list[str] = []
    if layout.gpu_model and layout.gpu_model != gpu.name:
        problems.append(f"layout is for {layout.gpu_model}, checked against {gpu.name}")
    seen: set[int] = set()
    for g in layout.gpus:
        if g.gpu < 0:
            problems.append(f"GPU index {g.gpu} is negative")
        if g.gpu in seen:
            problems.append(f"GPU {g.gpu} appears more than once")
        seen.add(g.gpu)
        problems += [f"GPU {g.gpu}: {p}"
                     for p in placement_violations(gpu, [(i.profile, i.start) for i in g.instances])]
        problems += [f"GPU {g.gpu}: {p}" for p in seat_violations(gpu, g.instances)]
    return problems


def seat_violations(gpu: GpuModel, placed: Sequence[PlacedInstance]) -> list[str]:
    """The shares of one GPU's MIG instances whose seat is outside 0..k-1 or taken twice."""
    problems: list[str] = []
    taken: set[tuple[int, int]] = set()
    for p in placed:
        if p.profile not in gpu.profile_names:
            continue
        k = gpu.profile(p.profile).share_of if gpu.profile(p.profile).host else 1
        if not 0 <= p.seat < k:
            problems.append(f"{p.profile} at {p.start}: seat {p.seat} (0..{k - 1})")
        elif (p.start, p.seat) in taken:
            problems.append(f"{p.profile} at {p.start}: seat {p.seat} taken twice")
        taken.add((p.start, p.seat))
    return problems


_CONFIG_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def to_mig_parted_yaml(layout: Layout, config_name: str = "jigsaw") -> str:
    """The layout as an ``nvidia-mig-parted`` config (``version: v1``), one entry per GPU.

    mig-parted takes per-GPU profile counts and chooses the start slots itself, so this file
    carries the partition sizes, not the exact placement (``to_nvidia_smi_commands`` does).
    A GPU without instances stays in MIG mode with no devices (``mig-devices: {}``): switching
    MIG mode off and on needs a GPU reset, while an empty partition can be filled next bin.
    """
    if not _CONFIG_NAME.match(config_name):
        raise ValueError(f"config name {config_name!r}: use letters, digits, '.', '_' or '-'")
    lines = ["version: v1", "mig-configs:", f"  {config_name}:"]
    for g in sorted(layout.gpus, key=lambda g: g.gpu):
        lines += [f"    - devices: [{g.gpu}]", "      mig-enabled: true"]
        counts = Counter(name for name, _ in g.signature)  # a shared instance once, as its host
        if not counts:
            lines.append("      mig-devices: {}")
            continue
        lines.append("      mig-devices:")
        lines += [f'        "{name}": {counts[name]}' for name in sorted(counts)]
    return "\n".join(lines) + "\n"


def to_nvidia_smi_commands(layout: Layout, previous: Layout | None = None) -> list[str]:
    """Explicit commands that realize the layout: per changed GPU, destroy then create.

    Without ``previous`` every GPU is treated as changed and its existing instances are
    destroyed first (the destroy commands fail harmlessly on a GPU with none). With ``previous``
    only ``changed_gpus`` get commands, and the destroy pair is left out where the previous
    layout had no instances. Creation uses the documented ``<profile>:<start>`` placement form
    with ``-C`` (default compute instance), one instance per command, in slot order. MIG mode
    itself must already be enabled.
    """
    prev = {g.gpu: g for g in previous.gpus} if previous is not None else {}
    targets = set(changed_gpus(previous, layout)) if previous is not None else {g.gpu for g in layout.gpus}
    cur = {g.gpu: g for g in layout.gpus}
    cmds: list[str] = []
    for gid in sorted(targets):
        if previous is None or (gid in prev and prev[gid].instances):
            cmds += [f"nvidia-smi mig -dci -i {gid}", f"nvidia-smi mig -dgi -i {gid}"]
        g = cur.get(gid)
        if g is None:
            continue
        for name, start in sorted(g.signature, key=lambda x: (x[1], x[0])):  # shares: their instance
            cmds.append(f"nvidia-smi mig -i {gid} -cgi {name}:{start} -C")
    return cmds
