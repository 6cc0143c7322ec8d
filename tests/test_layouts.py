"""One-GPU MIG layouts: exact counts and an independent slot-by-slot enumeration."""

from __future__ import annotations

import itertools

import pytest

from jigsaw.mig import GPU_MODELS, NUM_PLACEMENT_SLOTS, GpuModel
from jigsaw.planner.layouts import (
    fits_on_gpu,
    layout_counts,
    maximal_layout_counts,
    placement_violations,
    valid_layouts,
)

H100 = GPU_MODELS["H100-80GB"]
NO_ME = [n for n in H100.profile_names if "+me" not in n]


def brute_force_layouts(gpu: GpuModel, names: list[str]) -> set[tuple[tuple[str, int], ...]]:
    """Tiles the 8 slots left to right: each slot is left empty or starts an instance."""
    profiles = [gpu.profile(n) for n in names]
    out = set()

    def walk(slot: int, occupied: int, chosen: list[tuple[str, int]]) -> None:
        if slot == NUM_PLACEMENT_SLOTS:
            if is_valid(gpu, chosen):
                out.add(tuple(sorted(chosen)))
            return
        if occupied & (1 << slot):
            walk(slot + 1, occupied, chosen)
            return
        walk(slot + 1, occupied, chosen)
        for p in profiles:
            bits = sum(1 << i for i in range(slot, slot + p.size))
            if slot in p.starts and slot + p.size <= NUM_PLACEMENT_SLOTS and not occupied & bits:
                walk(slot + 1, occupied | bits, [*chosen, (p.name, slot)])

    walk(0, 0, [])
    return out


def is_valid(gpu: GpuModel, placement: list[tuple[str, int]] | tuple[tuple[str, int], ...]) -> bool:
    """Independent checker: slot occupancy as a list of booleans, counts, compute slices."""
    used = [False] * NUM_PLACEMENT_SLOTS
    per_profile: dict[str, int] = {}
    compute = 0
    for name, start in placement:
        p = gpu.profile(name)
        if start not in p.starts:
            return False
        for i in range(start, start + p.size):
            if i >= NUM_PLACEMENT_SLOTS or used[i]:
                return False
            used[i] = True
        per_profile[name] = per_profile.get(name, 0) + 1
        if per_profile[name] > p.max_per_gpu:
            return False
        compute += p.compute_slices
    return compute <= 7


@pytest.mark.parametrize("gpu_name", sorted(GPU_MODELS))
def test_exact_counts(gpu_name: str) -> None:
    gpu = GPU_MODELS[gpu_name]
    no_me = [n for n in gpu.profile_names if "+me" not in n]
    # without the +me profile: the 78 layouts / 28 maximal ones of the design (empty included)
    assert len(valid_layouts(gpu, no_me)) == 723
    assert len(layout_counts(gpu, no_me)) == 78
    assert len(maximal_layout_counts(gpu, no_me)) == 28
    # with it, every vector with a 1-slot instance also exists with one of them being +me
    assert len(valid_layouts(gpu)) == 2319
    assert len(layout_counts(gpu)) == 128
    assert len(maximal_layout_counts(gpu)) == 44


@pytest.mark.parametrize("names", [None, NO_ME, ["3g.40gb", "4g.40gb"], ["1g.10gb", "1g.20gb", "2g.20gb"]])
def test_enumeration_matches_brute_force(names: list[str] | None) -> None:
    got = valid_layouts(H100, names)
    assert len(got) == len(set(got))
    assert all(is_valid(H100, p) for p in got)
    assert all(list(p) == sorted(p) for p in got)
    assert set(got) == brute_force_layouts(H100, list(names or H100.profile_names))


def test_count_vectors_and_maximal() -> None:
    names = list(H100.profile_names)
    vecs = set(layout_counts(H100))
    from_layouts = {tuple(sum(1 for n, _ in p if n == x) for x in names) for p in valid_layouts(H100)}
    assert vecs == from_layouts
    maximal = maximal_layout_counts(H100)
    for m in maximal:
        assert not any(v != m and all(a >= b for a, b in zip(v, m)) for v in vecs)
    for v in vecs:
        assert any(all(a >= b for a, b in zip(m, v)) for m in maximal)
    # downward closed: every vector minus one instance is still packable
    for v in vecs:
        for i, c in enumerate(v):
            if c:
                assert (*v[:i], c - 1, *v[i + 1:]) in vecs


def test_known_facts() -> None:
    vecs = set(layout_counts(H100, NO_ME))
    index = {n: i for i, n in enumerate(NO_ME)}

    def vec(**counts: int) -> tuple[int, ...]:
        v = [0] * len(NO_ME)
        for k, c in counts.items():
            v[index[k.replace("_", ".")]] = c
        return tuple(v)

    assert vec(**{"4g_40gb": 1, "3g_40gb": 1}) in vecs  # 4g at 0 + 3g at 4
    assert vec(**{"3g_40gb": 2}) in vecs
    assert vec(**{"3g_40gb": 2, "1g_10gb": 1}) not in vecs  # two 3g fill all 8 slots
    assert vec(**{"1g_10gb": 7}) in vecs
    assert vec(**{"1g_10gb": 8}) not in vecs  # slot 7 is unusable by a 1g.10gb
    assert vec(**{"1g_20gb": 4}) in vecs
    assert vec(**{"2g_20gb": 3, "1g_10gb": 1}) in vecs
    assert vec(**{"2g_20gb": 3, "1g_20gb": 1}) in vecs
    assert vec(**{"4g_40gb": 1, "2g_20gb": 1, "1g_20gb": 1}) in vecs
    assert vec(**{"7g_80gb": 1}) in vecs
    assert vec(**{"7g_80gb": 1, "1g_10gb": 1}) not in vecs
    assert is_valid(H100, [("4g.40gb", 0), ("3g.40gb", 4)])
    assert (("3g.40gb", 4), ("4g.40gb", 0)) in valid_layouts(H100)


def test_fits_on_gpu_exhaustive() -> None:
    names = list(H100.profile_names)
    vecs = set(layout_counts(H100))
    bounds = [9, 3, 6, 5, 4, 3, 3]  # one more than the most that fit of each profile
    assert len(bounds) == len(names)
    for v in itertools.product(*(range(b) for b in bounds)):
        if sum(v) > 9:
            continue
        multiset = [n for n, c in zip(names, v) for _ in range(c)]
        placement = fits_on_gpu(H100, multiset)
        assert (placement is not None) == (v in vecs), v
        if placement is not None:
            assert sorted(n for n, _ in placement) == sorted(multiset)
            assert is_valid(H100, placement)
            assert placement_violations(H100, placement) == []


def test_fits_on_gpu_order_independent_and_errors() -> None:
    a = fits_on_gpu(H100, ["1g.10gb", "3g.40gb", "2g.20gb"])
    b = fits_on_gpu(H100, ("2g.20gb", "1g.10gb", "3g.40gb"))
    assert a == b and a is not None
    assert fits_on_gpu(H100, []) == ()
    assert fits_on_gpu(H100, ["1g.10gb+me", "1g.10gb+me"]) is None
    with pytest.raises(ValueError, match="unknown MIG profile"):
        fits_on_gpu(H100, ["1g.5gb"])
    with pytest.raises(ValueError, match="unknown MIG profile"):
        valid_layouts(H100, ["9g.90gb"])
    with pytest.raises(ValueError, match="repeated"):
        layout_counts(H100, ["1g.10gb", "1g.10gb"])


def test_results_are_copies() -> None:
    first = valid_layouts(H100, NO_ME)
    first.clear()
    assert len(valid_layouts(H100, NO_ME)) == 723


def test_other_gpu_models_use_their_names() -> None:
    h200 = GPU_MODELS["H200"]
    a100 = GPU_MODELS["A100-40GB"]
    assert fits_on_gpu(h200, ["3g.71gb", "4g.71gb"]) == (("3g.71gb", 4), ("4g.71gb", 0))
    assert fits_on_gpu(a100, ["1g.5gb"] * 7) is not None
    assert fits_on_gpu(a100, ["1g.5gb"] * 8) is None
    with pytest.raises(ValueError):
        fits_on_gpu(a100, ["1g.20gb"])


def test_placement_violations() -> None:
    assert placement_violations(H100, [("3g.40gb", 0), ("4g.40gb", 0)])  # overlap
    assert placement_violations(H100, [("3g.40gb", 2)])  # not an allowed start
    assert placement_violations(H100, [("1g.10gb+me", 0), ("1g.10gb+me", 1)])  # at most one
    assert placement_violations(H100, [("1g.10gb", 7)])
    assert placement_violations(H100, [("5g.50gb", 0)])
    assert placement_violations(H100, [("4g.40gb", 0), ("3g.40gb", 4)]) == []


def test_usable_compute_counts_what_the_memory_slots_leave():
    from jigsaw.planner.layouts import usable_compute

    gpu = GPU_MODELS["H100-80GB"]
    assert usable_compute(gpu, []) == 7
    assert usable_compute(gpu, [("3g.40gb", 4)]) == 4  # a 4g.40gb at slot 0
    assert usable_compute(gpu, [("3g.40gb", 0)]) == 3  # 4 slots left, a 4g only starts at 0
    assert usable_compute(gpu, [("3g.40gb", 0), ("3g.40gb", 4)]) == 0  # 1 slice free, no slot
    assert usable_compute(gpu, [("1g.20gb", 0), ("1g.20gb", 2), ("3g.40gb", 4)]) == 0
    assert usable_compute(gpu, [("2g.20gb", 0), ("3g.40gb", 4)]) == 2
    assert usable_compute(gpu, [("3g.40gb", 0), ("3g.40gb", 0)]) == 0  # breaks the rules
