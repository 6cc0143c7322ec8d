"""Value curves (``planner.value_curve``): facts from solves at other demands bound and start the
decomposition's single-app solves, and a decision seeded with them proves what a cold one
proves (one GPU, two apps where they compete; HiGHS, generous limits on a shared machine)."""

from __future__ import annotations

import math

import pytest

from jigsaw.planner import curves, decompose, joint, value_curve
from jigsaw.planner.decompose import app_layout
from jigsaw.planner.node_plan import _pack_node
from jigsaw.planner.problem import make_problem
from jigsaw.planner.verify import verify_plan
from jigsaw.spaces import search_space

NAMES = ("social_media", "traffic_analysis")
DEMANDS = (500.0, 150.0)  # they compete for the GPU's slices (``test_planner_decompose``)
SCOPE = value_curve.scope_of("accuracy", 1.0, 2.0)


def _parts(node, profiles, factor: float = 1.0) -> list[joint.Part]:
    return [joint.Part(make_problem(node.app(a), node, profiles, search_space("ast"), None), d * factor)
            for a, d in zip(NAMES, DEMANDS, strict=True)]


def _decide(node, parts, seeds=None) -> decompose.Result:
    return decompose.solve(parts, node, solver="highs", time_limit_s=60, objective="accuracy",
                           pack=lambda ps: _pack_node(dict(zip(NAMES, ps, strict=True)), node, None),
                           seeds=seeds)


def test_a_fact_bounds_larger_demands_and_its_plan_serves_smaller_ones(one_gpu, cold_planner) -> None:
    node, profiles = one_gpu
    pb = _parts(node, profiles)[0].pb
    fact = value_curve.solve_fact(pb, node, SCOPE, 400.0, None, solver="highs", gap=1e-3, time_limit_s=60)
    assert fact.plan is not None and fact.serves_rps >= 400.0 and fact.bound >= fact.value
    # the bound holds above its demand only, and for no larger budget
    assert value_curve.bound_at([fact], fact.budget, 450.0) == fact.bound
    assert value_curve.bound_at([fact], fact.budget, 350.0) == math.inf
    # below what its instances serve, its plan is one for that demand, of the same value
    (seed,) = value_curve.seeds(pb, SCOPE, 300.0)
    assert seed.plan is not None and seed.plan.planned_rps == pytest.approx(300.0)
    seed.plan.layout = app_layout(_pack_node({pb.app.name: seed.plan}, node, None), pb.app.name)
    assert verify_plan(seed.plan, pb.app, node, profiles) == []
    part = joint.Part(pb, 300.0)
    assert joint.part_value(seed.plan, part, node, "accuracy", 2.0) == pytest.approx(fact.value)
    assert value_curve.seeds(pb, SCOPE, fact.serves_rps * 1.01) == []  # it serves no more
    other = value_curve.scope_of("slices", 1.0, 2.0)  # another objective's facts are not these
    assert value_curve.seeds(pb, other, 300.0) == []


def test_a_seeded_decision_proves_the_cold_one_with_fewer_solves(one_gpu, cold_planner) -> None:
    node, profiles = one_gpu
    parts = _parts(node, profiles)
    cold = _decide(node, parts)
    assert cold.status == "optimal" and cold.stage == "frontier"
    gap = node.absolute_gap / len(parts)
    for p in parts:  # a grid up to a little above the demands, the frontier's budgets included
        value_curve.precompute(p.pb, node, SCOPE, 1.2 * (p.demand_rps or 0.0), solver="highs", gap=gap,
                               levels=4, min_width=0.05, time_limit_s=60)
    seeded = _decide(node, parts, [value_curve.seeds(p.pb, SCOPE, p.demand_rps or 0.0) for p in parts])
    assert seeded.status == "optimal", seeded.notes
    assert seeded.objective == pytest.approx(cold.objective, abs=node.absolute_gap + 1e-9)
    assert seeded.bound - seeded.objective <= node.absolute_gap + 1e-9
    assert seeded.solves < cold.solves
    for name, plan in zip(NAMES, seeded.plans, strict=True):
        assert plan is not None and seeded.layout is not None
        assert plan.demand_rps == pytest.approx(plan.planned_rps), name  # a plan for this demand
        plan.layout = app_layout(seeded.layout, name)
        assert verify_plan(plan, node.app(name), node, profiles) == [], name
    # what it solved itself is learned; what the seeds gave is not stored twice
    assert all(len(s) <= seeded.solves for s in seeded.solved or [])


def test_the_solver_process_goes_on_to_the_value_grid_in_forked_steps(one_gpu, cold_planner) -> None:
    import select
    import time

    from jigsaw.control.precompute import Precompute

    node, profiles = one_gpu
    pb = _parts(node, profiles)[0].pb
    pre = Precompute([pb], node, solver="highs", step_limit_s=10)
    pre.todo = pre.todo[:1]  # the whole node's capacity only: the grid's top
    assert pre.next_level() is None  # not before the budgets are done
    end = time.monotonic() + 120
    while time.monotonic() < end and (pre.todo or pre.done < 4):
        pre.start()
        if pre.fd is None:
            break  # every grid done
        ready, _, _ = select.select([pre.fd], [], [], max(0.0, end - time.monotonic()))
        if ready:
            pre.readable()
    pre.cancel()
    assert not pre.todo and pre.done >= 4 and pre.tops[0]
    facts = value_curve.facts_of(pb, pre.scopes[0])
    assert facts and all(f.demand_rps <= (pre.tops[0] or 0) * (1 + 1e-9) for f in facts)
    # what the child solved is a start for a plan at a demand below its largest level
    d = max(f.demand_rps for f in facts if f.plan is not None)
    assert value_curve.seeds(pb, pre.scopes[0], 0.9 * d)


def test_a_budget_short_of_the_node_is_probed_until_no_demand_between_two_grid_demands_is_open(
        one_gpu, cold_planner) -> None:
    """Between two grid demands a slot-limited budget turns infeasible (social_media on 3 slices
    and 3 slots serves at most 564.3 rps): ``open_points`` probes it until every demand between
    is proven, infeasible or served by a plan within the gap of its bound, as the truth has it."""
    node, profiles = one_gpu
    pb = _parts(node, profiles)[0].pb
    scope, gap, b = value_curve.scope_of("accuracy", 1.0, 1.0), 1e-3, (3, 3)
    lo, hi = 400.0, 700.0
    for d in (lo, hi):  # two grid demands: the own optimum and the budget at each
        for budget in (None, b):
            value_curve.solve_fact(pb, node, scope, d, budget, solver="highs", gap=gap / 2, time_limit_s=60)
    assert value_curve.open_points(pb, node, scope, [lo, hi], hi, gap)
    probes = 0
    while points := value_curve.open_points(pb, node, scope, [lo, hi], hi, gap):
        for d, budget in points:
            assert budget == b and lo < d < hi
            value_curve.solve_fact(pb, node, scope, d, budget, solver="highs", gap=gap / 2, time_limit_s=60)
            probes += 1
        assert probes <= value_curve.MAX_PROBES
    curve = curves.curve_of(pb)
    capacity = 564.3  # budget_curve.budget_capacity(pb, node, 3, 3): proven
    for d in [lo + j for j in range(1, 300, 3)] + [capacity - 0.5, capacity + 0.5]:
        refuted = any(r[0] >= b[0] and r[1] >= b[1] for r in curve.refuted_at(d))
        served = [s for s in value_curve.seeds(pb, scope, d, [b]) if s.budget == b]
        assert refuted or (served and served[0].bound - served[0].value <= gap + 1e-9), d
        assert refuted == (d > capacity), d  # what a solve at d says


def test_past_the_most_facts_kept_a_plans_own_facts_go_before_the_idle_times(monkeypatch) -> None:
    from types import SimpleNamespace

    monkeypatch.setattr(value_curve, "MAX_FACTS", 4)
    pb = SimpleNamespace(derived={})
    grid = [value_curve.Fact(float(d), (1, 1), 1.0) for d in range(3)]
    for f in grid:
        value_curve.add(pb, SCOPE, f)  # type: ignore[arg-type]
    for d in (10.0, 11.0, 12.0):
        value_curve.learn([pb], [SCOPE], [d], [[((2, 2), None, (0, 0), -math.inf, 1.0)]])  # type: ignore[list-item]
    kept = value_curve.facts_of(pb, SCOPE)  # type: ignore[arg-type]
    assert [f.demand_rps for f in kept] == [0.0, 1.0, 2.0, 12.0]  # the learned ones went, oldest first
    for d in (20.0, 21.0):
        value_curve.add(pb, SCOPE, value_curve.Fact(d, (1, 1), 1.0))  # type: ignore[arg-type]
    assert [f.demand_rps for f in value_curve.facts_of(pb, SCOPE)] == [1.0, 2.0, 20.0, 21.0]  # type: ignore[arg-type]
