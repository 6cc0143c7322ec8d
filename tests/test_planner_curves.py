"""The apps' capacity curves (``planner.curves``): what earlier decisions showed about an app's
budgets, kept with its problem, answers a later spike's common fraction without a solve where it
proves it, and agrees with a cold search where it does not (one GPU, HiGHS: small enough for the
searches to prove their fractions on a shared machine)."""

from __future__ import annotations

import pytest
from test_planner_scaled import _assert_serves

from jigsaw.plan import Plan
from jigsaw.planner import curves, joint, problem, scaled
from jigsaw.planner.node_plan import _pack_node, plan_node
from jigsaw.planner.packer import PackingError
from jigsaw.planner.problem import make_problem
from jigsaw.planner.verify import verify_plan
from jigsaw.spaces import search_space

NAMES = ("social_media", "traffic_analysis")


pytestmark = pytest.mark.usefixtures("cold_planner")


def _parts(node, profiles, demands):
    return [joint.Part(make_problem(node.app(a), node, profiles, search_space("ast"), None), d)
            for a, d in zip(NAMES, demands, strict=True)]


def _search(node, profiles, demands) -> scaled.ScaleResult:
    return scaled.max_scale(_parts(node, profiles, demands), node, solver="highs", time_limit_s=60,
                            pack=lambda ps: _pack_node(dict(zip(NAMES, ps, strict=True)), node, None))


def _sound(got: scaled.ScaleResult, node, profiles, demands) -> None:
    """Proven, and its plans serve theta_lo of every demand, verify and pack as one layout."""
    assert got.status == "proven", got.notes
    assert got.theta_hi <= got.theta_lo * (1 + scaled.SCALE_TOLERANCE) * (1 + 1e-6)
    _assert_serves(got, node, profiles, NAMES, demands)


def test_a_spike_seen_before_is_answered_from_the_curves_without_a_test(one_gpu) -> None:
    node, profiles = one_gpu
    demands = (1500.0, 400.0)
    cold = _search(node, profiles, demands)
    _sound(cold, node, profiles, demands)
    assert cold.tests >= 1
    warm = _search(node, profiles, demands)
    assert warm.tests == 0 and any("curves" in n for n in warm.notes)
    _sound(warm, node, profiles, demands)
    # both proven: each fraction lies below the other's proven bound
    assert warm.theta_lo < cold.theta_hi * (1 + 1e-9) and cold.theta_lo < warm.theta_hi * (1 + 1e-9)


def test_another_mix_after_a_spike_agrees_with_a_cold_search(one_gpu) -> None:
    node, profiles = one_gpu
    _search(node, profiles, (1500.0, 400.0))  # the curves now hold what that spike showed
    demands = (1600.0, 380.0)
    warm = _search(node, profiles, demands)
    _sound(warm, node, profiles, demands)
    problem.forget()
    cold = _search(node, profiles, demands)
    _sound(cold, node, profiles, demands)
    assert warm.theta_lo < cold.theta_hi * (1 + 1e-9) and cold.theta_lo < warm.theta_hi * (1 + 1e-9)


def test_a_node_plan_whose_demands_the_curves_refute_skips_the_decision(one_gpu) -> None:
    node, profiles = one_gpu
    apps = [node.app(a) for a in NAMES]
    demands = {"social_media": 1500.0, "traffic_analysis": 400.0}
    first = plan_node(apps, node, profiles, demands, solver="highs", time_limit_s=60)
    again = plan_node(apps, node, profiles, demands, solver="highs", time_limit_s=60)
    for res in (first, again):
        assert res.status == "feasible" and 0 < res.demand_scale < 1, res.notes
        assert res.scale_bound <= res.demand_scale * (1 + scaled.SCALE_TOLERANCE) * (1 + 1e-6)
        for name, p in res.plans.items():
            assert verify_plan(p, node.app(name), node, profiles) == [], name
    assert again.solve_seconds < first.solve_seconds


def _plan(rps: float) -> Plan:
    p = Plan.__new__(Plan)
    p.planned_rps = rps
    return p


def test_the_curve_keeps_pareto_fronts() -> None:
    c = curves.Curve()
    c.add_plan(_plan(100.0), (4, 5), 120.0)
    c.add_plan(_plan(90.0), (5, 5), 110.0)  # more slices, less served: dropped
    c.add_plan(_plan(150.0), (4, 4), 150.0)  # less usage, more served: replaces the first
    assert [(s.usage, s.rate_rps) for s in c.served] == [((4, 4), 150.0)]
    c.add_plan(_plan(200.0), (6, 8), 210.0)
    assert sorted(s.usage for s in c.plans_for(160.0)) == [(6, 8)]
    c.add_refuted((3, 8), 100.0)
    c.add_refuted((2, 4), 120.0)  # covered by the first: a smaller budget at a larger rate
    c.add_refuted((3, 8), 90.0)  # the same budget at a smaller rate: replaces the first
    assert c.refuted == [((3, 8), 90.0)]
    assert c.refuted_at(89.0) == [] and c.refuted_at(90.0) == [(3, 8)]


def test_the_refuted_fraction_is_the_least_the_refutations_prove() -> None:
    room = (7, 8)
    a, b = curves.Curve(), curves.Curve()
    a.add_refuted((3, 8), 300.0)  # app a needs 4 slices from 300 rps
    b.add_refuted((3, 8), 50.0)  # app b needs 4 slices from 50 rps
    b.add_refuted((2, 8), 20.0)  # and 3 from 20 rps
    # at theta, a needs 4 slices once 1000 theta >= 300, b 3 once 100 theta >= 20 and 4 once
    # it is >= 50: 4 + 3 fit the 7 slices from 0.3, 4 + 4 do not from 0.5
    assert curves.refuted_theta([1000.0, 100.0], [a, b], room) == pytest.approx(0.5)
    assert curves.refuted_theta([100.0, 100.0], [a, b], room) == pytest.approx(3.0)  # a never needs 4 below
    assert curves.refuted_theta([1000.0, 100.0], [curves.Curve(), b], room) == float("inf")


def test_the_served_fraction_takes_the_next_choice_where_one_does_not_pack() -> None:
    room = (7, 8)
    a, b = curves.Curve(), curves.Curve()
    big, small = _plan(500.0), _plan(300.0)
    a.add_plan(big, (4, 4), 500.0)
    a.add_plan(small, (3, 4), 300.0)
    b.add_plan(_plan(100.0), (3, 4), 100.0)

    def pack(plans):
        if any(p.planned_rps == 500.0 for p in plans):
            raise PackingError("no room for it")
        return "layout"

    # at 0.5 the 4-slice plan and b's fit the node by sum but do not pack; 3 + 3 do, at 0.3
    theta, chosen, layout = curves.served_theta([1000.0, 100.0], [a, b], room, pack)
    assert theta == pytest.approx(0.3) and layout == "layout"
    assert [s.rate_rps for s in chosen] == [300.0, 100.0]
    theta, chosen, _ = curves.served_theta([1000.0, 500.0], [a, b], room, pack)
    assert theta == pytest.approx(0.2) and [s.usage for s in chosen] == [(3, 4), (3, 4)]


def test_the_served_fraction_bounds_its_packer_calls() -> None:
    curves_ = [curves.Curve(), curves.Curve()]
    curves_[0].add_plan(_plan(10.0), (1, 1), 10.0)
    for k in range(1, 30):  # many fractions (more slots, more served), each fits the room by sum
        curves_[1].add_plan(_plan(10.0 * k), (1, k), 10.0 * k)
    calls = []

    def never(plans):
        calls.append(plans)
        raise PackingError("never")

    assert curves.served_theta([10.0, 290.0], curves_, (56, 64), never) is None
    assert len(calls) == curves.MAX_PACKS
