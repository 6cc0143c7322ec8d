"""The MILP planner: optimality against brute force, soundness by an independent checker."""

from __future__ import annotations

import math

import pytest
from factories import make_app, make_node, make_profiles
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jigsaw.errors import PlanError
from jigsaw.planner.milp import capacity, plan
from jigsaw.planner.verify import verify_plan

SLOTS = 8


def _fits_one_gpu(gpu, names: list[str]) -> bool:
    """Independent brute force: try every start for every instance."""
    profs = [gpu.profile(n) for n in names]
    if sum(p.compute_slices for p in profs) > 7:
        return False

    def place(i: int, used: int) -> bool:
        if i == len(profs):
            return True
        p = profs[i]
        for s in p.starts:
            mask = ((1 << p.size) - 1) << s
            if s + p.size <= SLOTS and not used & mask and place(i + 1, used | mask):
                return True
        return False

    return place(0, 0)


def _brute_force_best(app, node, profiles, demand: float) -> float:
    """Best objective over every instance multiset of a 1-GPU node, lanes solved exactly.

    App shape: a -> b, task a with two variants, task b with one; the rate split over the two
    lanes is a 1-D LP whose optimum is at an end of its feasible interval.
    """
    a1, a2 = (v.name for v in app.task("a").variants)
    (b1,) = (v.name for v in app.task("b").variants)
    f = {a1: app.edge("a", "b").factor(a1), a2: app.edge("a", "b").factor(a2)}
    acc = {a1: app.lane_accuracy((a1, b1)), a2: app.lane_accuracy((a2, b1))}
    a_max = app.max_accuracy()
    cols = []
    for t, v in (("a", a1), ("a", a2), ("b", b1)):
        for name in node.mig_profiles:
            for k in node.mps_levels:
                for b in node.batch_sizes:
                    row = profiles.get(v, name, k, b)
                    cols.append((t, v, name, row.latency_ms, row.throughput_rps,
                                 node.gpu.profile(name).compute_slices))
    best = -math.inf
    for counts in _count_vectors([c[5] for c in cols], 7):
        slices = sum(n * c[5] for n, c in zip(counts, cols))
        used = [c for n, c in zip(counts, cols) if n]
        lat = {t: max((c[3] for c in used if c[0] == t), default=0.0) for t in ("a", "b")}
        if not used or 2 * (lat["a"] + lat["b"]) > app.latency_slo_ms:
            continue
        cap = {key: sum(n * c[4] for n, c in zip(counts, cols) if (c[0], c[1]) == key)
               for key in (("a", a1), ("a", a2), ("b", b1))}
        # x = rate on lane a1; rate on a2 = demand - x.
        lo, hi = 0.0, demand
        hi = min(hi, cap[("a", a1)])
        lo = max(lo, demand - cap[("a", a2)])
        slope = f[a1] - f[a2]  # b's demand: f2*demand + slope*x <= cap_b
        rest = cap[("b", b1)] - f[a2] * demand
        if slope > 0:
            hi = min(hi, rest / slope)
        elif slope < 0:
            lo = max(lo, rest / slope)
        elif rest < -1e-9:
            continue
        slope_acc = (acc[a1] - acc[a2]) / a_max  # accuracy*demand = acc2*demand + slope_acc*x
        need = node.planner.accuracy_slo * demand - acc[a2] / a_max * demand
        if slope_acc > 0:
            lo = max(lo, need / slope_acc)
        elif slope_acc < 0:
            hi = min(hi, need / slope_acc)
        elif need > 1e-9:
            continue
        if lo > hi + 1e-9:
            continue
        if not _fits_one_gpu(node.gpu, [c[2] for n, c in zip(counts, cols) for _ in range(n)]):
            continue
        for x in (lo, hi):
            value = (acc[a2] / a_max * demand + slope_acc * x) / demand - node.beta * slices
            best = max(best, value)
    return best


def _count_vectors(costs: list[int], budget: int):
    """Every vector of non-negative counts whose total cost fits the budget."""
    if not costs:
        yield ()
        return
    for n in range(budget // costs[0] + 1):
        for rest in _count_vectors(costs[1:], budget - n * costs[0]):
            yield (n, *rest)


TINY = dict(
    tasks={"a": [("a1", 70.0), ("a2", 80.0)], "b": [("b1", 60.0)]},
    edges=[("a", "b", {"a1": 1.0, "a2": 1.6})],
)


@pytest.mark.parametrize("demand", [5.0, 60.0, 150.0, 240.0])
def test_milp_optimum_equals_brute_force(demand: float) -> None:
    app = make_app(**TINY, latency_slo_ms=120.0, accuracy_slo=None)
    node = make_node(num_gpus=1, mig_profiles=("1g.10gb", "2g.20gb", "3g.40gb"), batch_sizes=(1, 4),
                     accuracy_slo=0.9)
    profiles = make_profiles(node, {"a1": 2.0, "a2": 6.0, "b1": 3.0})
    expected = _brute_force_best(app, node, profiles, demand)
    result = plan(app, node, profiles, demand)
    if expected == -math.inf:
        assert not result.feasible
        return
    assert result.feasible and result.status == "optimal"
    assert result.objective == pytest.approx(expected, abs=1e-6)
    assert verify_plan(result, app, node, profiles) == []


def test_above_capacity_returns_the_max_demand_plan() -> None:
    app = make_app(**TINY, latency_slo_ms=120.0)
    node = make_node(num_gpus=1)
    profiles = make_profiles(node, {"a1": 2.0, "a2": 6.0, "b1": 3.0})
    cap = capacity(app, node, profiles)
    assert cap.max_demand_rps > 0
    over = plan(app, node, profiles, cap.max_demand_rps * 3)
    assert over.max_demand_plan and not over.feasible
    assert over.planned_rps == pytest.approx(cap.max_demand_rps, rel=1e-4)
    assert verify_plan(over, app, node, profiles) == []
    under = plan(app, node, profiles, cap.max_demand_rps * 0.98)
    assert under.feasible and not under.max_demand_plan


def test_max_utilization_leaves_headroom_on_every_instance() -> None:
    app = make_app(**TINY, latency_slo_ms=120.0)
    profiles = make_profiles(make_node(num_gpus=1), {"a1": 2.0, "a2": 6.0, "b1": 3.0})
    full = capacity(app, make_node(num_gpus=1), profiles)
    node = make_node(num_gpus=1, max_utilization=0.8)
    headroom = capacity(app, node, profiles)
    assert headroom.max_demand_rps == pytest.approx(0.8 * full.max_demand_rps, rel=1e-3)
    p = plan(app, node, profiles, 0.5 * full.max_demand_rps)
    assert p.feasible and verify_plan(p, app, node, profiles) == []
    for inst in p.instances:  # planned at 80% of what the profile says the segment does
        row = profiles.get(inst.variant, inst.mig_profile, inst.mps, inst.max_batch)
        assert inst.throughput_rps == pytest.approx(0.8 * row.throughput_rps)


def test_no_column_meets_the_slo_gives_an_empty_infeasible_plan() -> None:
    app = make_app(**TINY, latency_slo_ms=1.0)
    node = make_node(num_gpus=1)
    profiles = make_profiles(node, {"a1": 2.0, "a2": 6.0, "b1": 3.0})
    result = plan(app, node, profiles, 10.0)
    assert not result.feasible and not result.instances
    assert result.notes


def test_bad_demand_is_a_plan_error() -> None:
    app = make_app(**TINY)
    node = make_node()
    profiles = make_profiles(node, {"a1": 2.0, "a2": 6.0, "b1": 3.0})
    with pytest.raises(PlanError):
        plan(app, node, profiles, -1.0)
    with pytest.raises(PlanError):
        plan(app, node, profiles, float("nan"))


def test_more_demand_never_needs_fewer_slices() -> None:
    app = make_app(**TINY, latency_slo_ms=150.0)
    node = make_node(num_gpus=2, mps_levels=(1, 2))
    profiles = make_profiles(node, {"a1": 2.0, "a2": 6.0, "b1": 3.0})
    used = [plan(app, node, profiles, d).slices_used for d in (10, 50, 100, 200, 400)]
    assert used == sorted(used)


def test_warm_start_reaches_the_same_optimum() -> None:
    app = make_app(**TINY, latency_slo_ms=150.0)
    node = make_node(num_gpus=2, mps_levels=(1, 2))
    profiles = make_profiles(node, {"a1": 2.0, "a2": 6.0, "b1": 3.0})
    first = plan(app, node, profiles, 200.0)
    again = plan(app, node, profiles, 210.0, previous=first)
    cold = plan(app, node, profiles, 210.0)
    assert again.objective == pytest.approx(cold.objective, abs=1e-6)
    assert verify_plan(again, app, node, profiles) == []


def test_spaces_respect_their_restrictions() -> None:
    app = make_app(**TINY, latency_slo_ms=150.0)
    node = make_node(num_gpus=2, mps_levels=(1, 2))
    profiles = make_profiles(node, {"a1": 2.0, "a2": 6.0, "b1": 3.0})
    caps = {}
    for space in ("unopt", "a", "s", "t", "as", "at", "st", "ast"):
        result = capacity(app, node, profiles, space=space)
        caps[space] = result.max_demand_rps
        assert verify_plan(result.plan, app, node, profiles) == [], space
        if "s" not in space:
            assert {i.mig_profile for i in result.plan.instances} <= {"7g.80gb"}
        if "a" not in space:
            assert {i.variant for i in result.plan.instances} <= {"a2", "b1"}
    # Each feature only adds options, so capacity never shrinks when one is turned on.
    for small, big in (("unopt", "a"), ("unopt", "s"), ("unopt", "t"), ("s", "as"), ("t", "st"),
                       ("at", "ast"), ("st", "ast"), ("a", "at")):
        assert caps[big] >= caps[small] * (1 - 1e-6), (small, big)


@st.composite
def small_apps(draw):
    num_tasks = draw(st.integers(1, 3))
    names = [f"t{i}" for i in range(num_tasks)]
    tasks = {}
    for t in names:
        n = draw(st.integers(1, 3))
        accs = sorted(draw(st.lists(st.floats(10, 90), min_size=n, max_size=n, unique=True)))
        tasks[t] = [(f"{t}v{i}", a) for i, a in enumerate(accs)]
    edges = []
    for i in range(1, num_tasks):
        parent = names[draw(st.integers(0, i - 1))]
        edges.append((parent, names[i], {v: draw(st.floats(0.2, 3.0)) for v, _ in tasks[parent]}))
    base = {v: draw(st.floats(0.5, 8.0)) for vs in tasks.values() for v, _ in vs}
    slo = draw(st.floats(60.0, 400.0))
    return make_app(tasks, edges, latency_slo_ms=slo), base


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_apps(), st.floats(1.0, 3000.0), st.integers(1, 2))
def test_random_apps_give_sound_plans(app_and_base, demand: float, num_gpus: int) -> None:
    app, base = app_and_base
    node = make_node(num_gpus=num_gpus, mps_levels=(1, 2), time_limit_s=30.0)
    profiles = make_profiles(node, base)
    result = plan(app, node, profiles, demand)
    assert verify_plan(result, app, node, profiles) == []
    if result.feasible:
        assert result.planned_rps == pytest.approx(demand)
        assert result.accuracy >= 0.9 - 1e-6
    elif result.max_demand_plan:
        assert result.planned_rps < demand


def test_the_capacity_models_fallback_is_labelled_feasible_not_optimal(monkeypatch) -> None:
    """Where a solve at the demand ends without a plan, the capacity model's plan is the answer:
    its own status says its rate is the most it serves, not that its slices are the fewest, so
    the plan is an incumbent (``feasible``, gap unknown), never ``optimal``."""
    from pathlib import Path

    from jigsaw.node import load_node, load_node_profiles
    from jigsaw.planner import milp

    node = load_node(Path(__file__).resolve().parents[1] / "examples" / "h100x4.toml")
    profiles = load_node_profiles(node)
    app = node.app("social_media")
    monkeypatch.setattr(milp, "_solve_at", lambda *a, **k: ("no_solution", None))
    p = milp.plan(app, node, profiles, 500.0, formulation="reference", time_limit_s=20)
    assert p.instances and p.status == "feasible" and math.isinf(p.gap)
    assert any("capacity model" in n for n in p.notes)
