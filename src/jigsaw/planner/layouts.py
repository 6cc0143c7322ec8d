"""Valid MIG layouts of one GPU, enumerated exactly from the profile table.

A layout is a set of MIG instances ``(profile, start)`` on one GPU such that

* every start is one of the profile's allowed starts and ``start + size <= 8``,
* no two instances overlap in ``[start, start + size)`` (8 placement slots),
* at most ``max_per_gpu`` instances of each profile,
* the compute slices sum to at most the GPU's (7 for MIG; k for a whole GPU that k MPS processes
  share, ``mig.whole_gpu_model``).

The planner constrains itself with the profile-count vectors of these layouts (exact packing
per GPU), the packer uses them for its exact fallback, and ``fits_on_gpu`` answers "can this
multiset share one GPU, and where does each instance go".

Counts for the H100-80GB table (the H200 and A100 tables have the same geometry and give the
same numbers), each including the empty layout:

=======================================  ==========  =============  =======
profiles                                 placements  count vectors  maximal
=======================================  ==========  =============  =======
all 6 without ``1g.10gb+me``             723         78             28
all 7 (with ``1g.10gb+me``)              2319        128            44
=======================================  ==========  =============  =======

Shares of a MIG instance (``MigProfile.host``: ``1g.10gb-1of2``, k processes of any tasks in one
instance of the host) have no slots of their own: n of them need ``ceil(n / k)`` instances of the
host (the MILPs count those, ``problem.share_hosts``). Placements and count vectors hold devices
only (``device_placement`` turns a placement with shares into one).

The ``+me`` profile has the geometry of ``1g.10gb`` but at most one per GPU, so with it a
count vector also says which of the 1-slot instances carries the media extensions: every
vector with ``k >= 1`` one-slot instances appears once more with one of them being ``+me``
(50 more vectors, 16 more maximal ones).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache

from jigsaw.mig import NUM_PLACEMENT_SLOTS, GpuModel, MigProfile

Placement = tuple[tuple[str, int], ...]  # sorted (profile name, start slot) pairs of one GPU
Counts = tuple[int, ...]  # instances per profile, aligned to a profile-name tuple

MAX_COMPUTE_SLICES = 7  # of a MIG GPU; any GPU's own: ``GpuModel.compute_slices``


def slot_mask(profile: MigProfile, start: int) -> int:
    """Bit i set when the instance occupies placement slot i."""
    return ((1 << profile.size) - 1) << start


def _resolve(gpu: GpuModel, profiles: Sequence[str] | None) -> tuple[str, ...]:
    """Profile names in a canonical tuple; unknown or repeated names are the caller's error."""
    if profiles is None:
        return tuple(p.name for p in gpu.devices)
    names = tuple(profiles)
    known = set(gpu.profile_names)
    for n in names:
        if n not in known:
            raise ValueError(
                f"unknown MIG profile {n!r} for {gpu.name} (known: {', '.join(gpu.profile_names)})")
        if gpu.profile(n).host:
            raise ValueError(f"{n} is a share of a {gpu.profile(n).host} instance: it has no slots of its "
                             "own (count its host's instances)")
    if len(set(names)) != len(names):
        raise ValueError(f"profile list has repeated names: {names}")
    return names


def device_placement(gpu: GpuModel, placement: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
    """The devices of a placement: each share of a MIG instance replaced by its host instance,
    one per (share profile, start); every other ``(profile, start)`` as it is. Shares of two
    profiles at one start stay two instances (which overlap: ``placement_violations`` says so)."""
    out: list[tuple[str, int]] = []
    seen: set[tuple[str, int]] = set()
    for name, start in placement:
        p = gpu.profile(name)
        if not p.host:
            out.append((name, start))
        elif (name, start) not in seen:
            seen.add((name, start))
            out.append((p.host, start))
    return out


def room(gpu: GpuModel, placement: Iterable[tuple[str, int]]) -> int:
    """How much more a GPU can still take: the candidate placements that remain possible.

    Each still-possible ``(profile, start)`` counts with its size in slots, so that keeping a
    large instance possible outweighs keeping a small one possible. Used to choose among
    equally valid starts (greedy packing) and among equivalent placements of one multiset.
    """
    mask = 0
    compute = 0
    counts: dict[str, int] = {}
    for name, start in device_placement(gpu, placement):
        p = gpu.profile(name)
        mask |= slot_mask(p, start)
        compute += p.compute_slices
        counts[name] = counts.get(name, 0) + 1
    total = 0
    for p in gpu.devices:
        if counts.get(p.name, 0) >= p.max_per_gpu or compute + p.compute_slices > gpu.compute_slices:
            continue
        for s in p.starts:
            if s + p.size <= NUM_PLACEMENT_SLOTS and not mask & slot_mask(p, s):
                total += p.size
    return total


@lru_cache(maxsize=16)
def _most_compute(gpu: GpuModel) -> dict[Placement, int]:
    """For every valid placement of the GPU, the most compute slices of a valid placement that
    contains it (itself included): computed once per GPU model from the largest placements down,
    since every valid superset is reached by adding one instance at a time (downward closure)."""
    layouts = _valid_layouts(gpu, _resolve(gpu, None))
    cands = [(p.name, s) for p in gpu.devices for s in p.starts if s + p.size <= NUM_PLACEMENT_SLOTS]
    most: dict[Placement, int] = {}
    for lay in sorted(layouts, key=len, reverse=True):
        here = set(lay)
        best = sum(gpu.profile(n).compute_slices for n, _ in lay)
        for c in cands:
            if c not in here:
                best = max(best, most.get(tuple(sorted((*lay, c))), 0))
        most[lay] = best
    return most


def usable_compute(gpu: GpuModel, placement: Iterable[tuple[str, int]]) -> int:
    """The compute slices a GPU holding ``placement`` can still give to new MIG instances (0 for a
    placement that breaks the rules): fewer than the slices it has free where its memory slots
    run out first, e.g. 0 beside two 3g.40gb instances (6 slices used, all 8 memory slots held).

    Why: the running layout's free compute slices were counted as room ("7 slices free, 0 MIG
    memory slots"); a placement that keeps them usable leaves room for the next extension.
    """
    lay = tuple(sorted(device_placement(gpu, placement)))
    most = _most_compute(gpu).get(lay)
    if most is None:
        return 0
    return most - sum(gpu.profile(n).compute_slices for n, _ in lay)


@lru_cache(maxsize=256)
def _valid_layouts(gpu: GpuModel, names: tuple[str, ...]) -> tuple[Placement, ...]:
    profs = [gpu.profile(n) for n in names]
    cands = [(p, s) for p in profs for s in p.starts if s + p.size <= NUM_PLACEMENT_SLOTS]
    out: set[Placement] = set()

    def rec(i: int, mask: int, chosen: list[tuple[str, int]], counts: dict[str, int],
            compute: int) -> None:
        if i == len(cands):
            out.add(tuple(sorted(chosen)))
            return
        rec(i + 1, mask, chosen, counts, compute)
        p, s = cands[i]
        m = slot_mask(p, s)
        if (mask & m or counts.get(p.name, 0) >= p.max_per_gpu
                or compute + p.compute_slices > gpu.compute_slices):
            return
        counts[p.name] = counts.get(p.name, 0) + 1
        chosen.append((p.name, s))
        rec(i + 1, mask | m, chosen, counts, compute + p.compute_slices)
        chosen.pop()
        counts[p.name] -= 1

    rec(0, 0, [], {}, 0)
    return tuple(sorted(out))


def valid_layouts(gpu: GpuModel, profiles: Sequence[str] | None = None) -> list[Placement]:
    """Every valid placement of one GPU using only ``profiles`` (default: all), empty included.

    Each placement is a sorted tuple of ``(profile, start)`` (the order of
    ``GpuLayout.signature``); the list is sorted and free of duplicates.
    """
    return list(_valid_layouts(gpu, _resolve(gpu, profiles)))


@lru_cache(maxsize=256)
def _layout_counts(gpu: GpuModel, names: tuple[str, ...]) -> tuple[Counts, ...]:
    index = {n: i for i, n in enumerate(names)}
    vecs: set[Counts] = set()
    for placement in _valid_layouts(gpu, names):
        v = [0] * len(names)
        for n, _ in placement:
            v[index[n]] += 1
        vecs.add(tuple(v))
    return tuple(sorted(vecs))


def layout_counts(gpu: GpuModel, profiles: Sequence[str] | None = None) -> list[Counts]:
    """The distinct profile-count vectors packable on one GPU (empty vector included).

    Vector i counts instances of ``profiles[i]`` (default: ``gpu.profile_names``). The set is
    downward closed: removing instances from a packable multiset leaves a packable one.
    """
    return list(_layout_counts(gpu, _resolve(gpu, profiles)))


@lru_cache(maxsize=256)
def _maximal_layout_counts(gpu: GpuModel, names: tuple[str, ...]) -> tuple[Counts, ...]:
    vecs = _layout_counts(gpu, names)
    return tuple(
        v for v in vecs
        if not any(w != v and all(a >= b for a, b in zip(w, v)) for w in vecs)
    )


def maximal_layout_counts(gpu: GpuModel, profiles: Sequence[str] | None = None) -> list[Counts]:
    """The count vectors not dominated component-wise by another packable one.

    Because packable multisets are downward closed, a multiset fits on one GPU exactly when
    some maximal vector dominates it: the planner's per-GPU constraint needs only these.
    """
    return list(_maximal_layout_counts(gpu, _resolve(gpu, profiles)))


@lru_cache(maxsize=16)
def _best_placements(gpu: GpuModel) -> dict[tuple[str, ...], Placement]:
    """For each packable multiset (sorted names), the placement that leaves the most room."""
    best: dict[tuple[str, ...], tuple[int, Placement]] = {}
    for placement in _valid_layouts(gpu, _resolve(gpu, None)):
        key = tuple(sorted(n for n, _ in placement))
        r = room(gpu, placement)
        cur = best.get(key)
        # most room first, then the lexicographically smallest placement: deterministic
        if cur is None or (-r, placement) < (-cur[0], cur[1]):
            best[key] = (r, placement)
    return {k: v[1] for k, v in best.items()}


def fits_on_gpu(gpu: GpuModel, profile_names: Iterable[str]) -> Placement | None:
    """A placement hosting exactly this multiset of profiles on one GPU, or None if none exists.

    Exact (looked up in the enumeration of all valid layouts); among several placements of the
    same multiset the one leaving the most room for later additions is returned.
    """
    key = tuple(sorted(profile_names))
    _resolve(gpu, tuple(dict.fromkeys(key)))
    return _best_placements(gpu).get(key)


def placement_violations(gpu: GpuModel, placement: Iterable[tuple[str, int]]) -> list[str]:
    """The rule violations of one GPU's ``(profile, start)`` list (empty when valid)."""
    problems: list[str] = []
    placement = list(placement)
    known = set(gpu.profile_names)
    problems += [f"unknown MIG profile {name!r} for {gpu.name}" for name, _ in placement if name not in known]
    seats: dict[tuple[str, int], int] = {}
    for name, start in placement:
        if name in known and gpu.profile(name).host:
            seats[(name, start)] = seats.get((name, start), 0) + 1
    problems += [f"{c} processes share the {gpu.profile(n).host} instance at {s} (at most "
                 f"{gpu.profile(n).share_of} of {n})"
                 for (n, s), c in seats.items() if c > gpu.profile(n).share_of]
    mask = 0
    compute = 0
    counts: dict[str, int] = {}
    for name, start in device_placement(gpu, [(n, s) for n, s in placement if n in known]):
        p = gpu.profile(name)
        if start not in p.starts:
            problems.append(f"{name} cannot start at slot {start} (allowed: {list(p.starts)})")
        if start < 0 or start + p.size > NUM_PLACEMENT_SLOTS:
            problems.append(f"{name} at {start} runs past the {NUM_PLACEMENT_SLOTS} placement slots")
            continue
        m = slot_mask(p, start)
        if mask & m:
            problems.append(f"{name} at {start} overlaps another instance")
        mask |= m
        compute += p.compute_slices
        counts[name] = counts.get(name, 0) + 1
    for name, c in counts.items():
        limit = gpu.profile(name).max_per_gpu
        if c > limit:
            problems.append(f"{c} instances of {name} (at most {limit} per GPU)")
    if compute > gpu.compute_slices:
        problems.append(f"{compute} compute slices (at most {gpu.compute_slices} per GPU)")
    return problems
