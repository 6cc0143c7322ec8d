"""The scaled-demand mode by decomposition (``scaled.max_scale``): when the demands exceed the
node, every app serves the same largest fraction, found without the joint capacity model and
checked against it on instances small enough for it to prove (one GPU; HiGHS, generous limits
on a shared machine)."""

from __future__ import annotations

import pytest

from jigsaw.planner import joint, problem, scaled
from jigsaw.planner.decompose import app_layout
from jigsaw.planner.node_plan import QUICK_STATUS, _pack_node, plan_node
from jigsaw.planner.packer import validate_layout
from jigsaw.planner.problem import make_problem
from jigsaw.planner.verify import verify_plan
from jigsaw.spaces import search_space

pytestmark = pytest.mark.usefixtures("cold_planner")


def _parts(node, profiles, names, demands):
    return [joint.Part(make_problem(node.app(a), node, profiles, search_space("ast"), None), d)
            for a, d in zip(names, demands, strict=True)]


def _assert_serves(got, node, profiles, names, demands) -> None:
    """``got``'s plans serve theta_lo of every demand, pass the verifier and pack as one layout."""
    assert got.plans is not None and got.layout is not None
    assert validate_layout(got.layout, node.gpu) == []
    for name, d, p in zip(names, demands, got.plans, strict=True):
        assert p.planned_rps == pytest.approx(got.theta_lo * d, rel=1e-6)
        p.layout = app_layout(got.layout, name)
        assert verify_plan(p, node.app(name), node, profiles) == [], name


@pytest.mark.parametrize(("names", "demands"), [
    (("social_media", "traffic_analysis"), (1500.0, 400.0)),
    (("social_media", "ar_assistant"), (1200.0, 200.0)),
])
def test_the_largest_common_fraction_matches_the_joint_capacity_model(one_gpu, names, demands) -> None:
    node, profiles = one_gpu
    parts = _parts(node, profiles, names, demands)
    got = scaled.max_scale(parts, node, solver="highs", time_limit_s=60,
                           pack=lambda ps: _pack_node(dict(zip(names, ps, strict=True)), node, None))
    assert got.status == "proven", got.notes
    assert 0 < got.theta_lo < 1 and got.theta_hi <= got.theta_lo * (1 + scaled.SCALE_TOLERANCE) * (1 + 1e-6)
    # its plans serve theta_lo of every demand, pass the verifier and pack as one layout
    _assert_serves(got, node, profiles, names, demands)
    # the joint capacity model's proven fraction lies in [theta_lo, theta_hi)
    ref = joint.solve(parts, node, solver="highs", time_limit_s=120, scale_demands=True)
    assert ref.status == "optimal" and ref.plans[0] is not None
    theta = ref.plans[0].planned_rps / demands[0]
    assert got.theta_lo <= theta * (1 + 1e-4)
    assert theta < got.theta_hi * (1 + 1e-4)


def test_headroom_scales_a_plan_as_far_as_its_instances_carry(one_gpu) -> None:
    node, profiles = one_gpu
    (part,) = _parts(node, profiles, ("traffic_analysis",), (150.0,))
    res = joint.solve([part], node, solver="highs", time_limit_s=60, objective="slices")
    plan = res.plans[0]
    assert plan is not None
    room = scaled.headroom(plan, part)
    assert room >= 1.0
    app = node.app("traffic_analysis")
    for factor, sound in ((room * (1 - 1e-9), True), (room * 1.01, False)):
        big = scaled.scale_plan(plan, factor)
        big.layout = _pack_node({"traffic_analysis": big}, node, None)
        big.layout = app_layout(big.layout, "traffic_analysis")
        problems = verify_plan(big, app, node, profiles)
        assert (problems == []) == sound, (factor, problems)


def test_a_node_plan_above_the_node_serves_the_scaled_demands(one_gpu) -> None:
    """plan_node at demands the node cannot hold (one app above its capacity alone): a plan for
    every app at one common fraction, never 'infeasible'."""
    node, profiles = one_gpu
    names = ("social_media", "traffic_analysis")
    demands = {"social_media": 1000.0, "traffic_analysis": 5000.0}
    res = plan_node([node.app(a) for a in names], node, profiles, demands, solver="highs",
                    time_limit_s=60)
    assert res.plans and all(p.instances for p in res.plans.values()), res.notes
    assert 0 < res.demand_scale < 1 and not res.feasible
    assert any("every app serves" in n for n in res.notes)
    for name, p in res.plans.items():
        assert p.max_demand_plan
        assert p.planned_rps == pytest.approx(res.demand_scale * demands[name], rel=1e-6)
        assert verify_plan(p, node.app(name), node, profiles) == [], name


def test_the_controllers_re_plan_above_capacity_is_a_scaled_plan(one_gpu) -> None:
    """The controller's solver (in process) for a spike above one app's capacity alone: the
    decomposition's scaled plan, not 'infeasible' and not an empty plan."""
    from jigsaw.control.solver import solve_node

    node, profiles = one_gpu
    apps = [node.app("social_media"), node.app("ar_assistant")]
    demands = {"social_media": 400.0, "ar_assistant": 2000.0}
    quick = []
    res = solve_node(apps, node, profiles, demands, space=None, previous=None, time_limit_s=30,
                     factors=None, on_quick=quick.append)
    assert res.status in ("optimal", "feasible") and 0 < res.demand_scale < 1, res.notes
    assert all(p.instances and p.max_demand_plan for p in res.plans.values())
    assert res.slices_used <= node.slices_available


def test_the_capacity_bound_is_an_upper_bound_and_proves_the_search(one_gpu) -> None:
    """``theta_bound`` (the latency-relaxed joint core in capacity mode) bounds theta* from
    above, equals the joint capacity model's own core optimum when solved to the end, and a
    search started from it stops proven."""
    node, profiles = one_gpu
    names, demands = ("social_media", "traffic_analysis"), (1500.0, 400.0)
    parts = _parts(node, profiles, names, demands)
    tight = scaled.theta_bound(parts, node, time_limit_s=60, relative_gap=1e-6)
    loose = scaled.theta_bound(parts, node, time_limit_s=0.01)
    assert 0 < tight <= 1 and tight <= loose * (1 + 1e-9)
    # the core's proven optimum, solved independently (relative gap 1e-5, theta's cost 1)
    core = joint.build(parts, node, full=False, scale_demands=True)
    sol = core.model.solve("highs", 60, 1e-6, relative_gap=1e-6)
    assert sol.status == "optimal"
    assert sol.objective <= tight <= sol.objective * (1 + scaled.SCALE_TOLERANCE)
    got = scaled.max_scale(parts, node, solver="highs", time_limit_s=60, use_bound=True,
                           bound_limit_s=60,
                           pack=lambda ps: _pack_node(dict(zip(names, ps, strict=True)), node, None))
    assert got.status == "proven", got.notes
    assert got.tests == 1  # the first test, just below the bound, found plans: proven by it
    assert got.bound == pytest.approx(tight, rel=1e-4)
    # every served fraction lies below the bound, and the proof used it: theta_hi is the bound
    assert got.theta_lo <= got.bound
    assert got.theta_hi <= got.bound * (1 + 1e-6)
    assert got.theta_hi <= got.theta_lo * (1 + scaled.SCALE_TOLERANCE) * (1 + 1e-6)
    ref = joint.solve(parts, node, solver="highs", time_limit_s=120, scale_demands=True)
    assert ref.status == "optimal" and ref.plans[0] is not None
    assert ref.plans[0].planned_rps / demands[0] <= got.bound * (1 + 1e-6)


def test_a_controller_replan_above_capacity_gets_the_scaled_plan(one_gpu) -> None:
    """The controller's re-plan (``control.solver.solve_node``, the anytime path a spike takes)
    on demands above the node returns a plan that serves every app the same fraction, packed
    as one layout; not an infeasible empty plan."""
    from jigsaw.control.solver import solve_node

    node, profiles = one_gpu
    names, demands = ("social_media", "traffic_analysis"), {"social_media": 1500.0, "traffic_analysis": 400.0}
    quick = []
    got = solve_node([node.app(n) for n in names], node, profiles, demands, space="ast", previous=None,
                     time_limit_s=60, factors=None, on_quick=quick.append)
    # first the greedy's scaled plan (its candidates for the full demands overrun the node:
    # rescaled), verified, for a fraction the exact plan then matches or beats
    assert len(quick) == 1 and quick[0].status == QUICK_STATUS and not quick[0].feasible
    assert 0 < quick[0].demand_scale < 1 and set(quick[0].plans) == set(names)
    for name in names:
        assert verify_plan(quick[0].plans[name], node.app(name), node, profiles) == [], name
    assert not got.feasible and 0.3 < got.demand_scale < 1
    assert got.demand_scale >= quick[0].demand_scale - 1e-9
    assert got.status in ("optimal", "feasible") and set(got.plans) == set(names)
    assert got.layout is not None and validate_layout(got.layout, node.gpu) == []
    for name in names:
        p = got.plans[name]
        assert p.max_demand_plan and p.instances
        assert p.planned_rps == pytest.approx(got.demand_scale * demands[name], rel=1e-6)
        assert verify_plan(p, node.app(name), node, profiles) == [], name


def test_a_refuted_test_steps_down_by_the_floors_overshoot_or_a_little() -> None:
    # the floors refuted it (30 slices on 28): in proportion; the frontier did: 2% lower
    assert scaled._step_down(0.9, [10.0, 10.0, 10.0], 28) == pytest.approx(0.9 * 28 / 30)
    assert scaled._step_down(0.9, [9.0, 9.0, 9.0], 28) == pytest.approx(0.9 * scaled._STEP_NEAR)
    assert scaled._step_down(0.9, None, 28) == pytest.approx(0.9 * scaled._STEP_NEAR)
    # a floors' overshoot of less than the near step still steps at least that far
    assert scaled._step_down(0.9, [50.0, 51.0], 100) == pytest.approx(0.9 * scaled._STEP_NEAR)
    # refuted again and again: the step doubles
    assert scaled._step_down(0.9, None, 28, falls=3) == pytest.approx(0.9 * scaled._STEP_NEAR ** 4)


def test_the_search_stops_after_its_test_count_and_says_so(one_gpu, monkeypatch) -> None:
    node, profiles = one_gpu
    names, demands = ("social_media", "traffic_analysis"), (1500.0, 400.0)

    def search():
        return scaled.max_scale(_parts(node, profiles, names, demands), node, solver="highs",
                                time_limit_s=60,
                                pack=lambda ps: _pack_node(dict(zip(names, ps, strict=True)), node, None))

    full = search()
    assert full.status == "proven" and full.tests >= 2
    problem.forget()  # cold again: the curves would answer without a test
    monkeypatch.setattr(scaled, "MAX_TESTS", 1)
    one = search()
    assert one.tests == 1
    # one test cannot prove the fraction: whatever it served is a bound, labelled so
    assert one.status in ("bound", "none")
    assert any("after 1 tests" in n for n in one.notes)


def test_a_served_fraction_close_to_its_cap_ends_the_search_in_the_refine_time(one_gpu) -> None:
    node, profiles = one_gpu
    names, demands = ("social_media", "traffic_analysis"), (1500.0, 400.0)

    def search(refine_s):
        problem.forget()
        return scaled.max_scale(_parts(node, profiles, names, demands), node, solver="highs",
                                time_limit_s=60, refine_s=refine_s,
                                pack=lambda ps: _pack_node(dict(zip(names, ps, strict=True)), node, None))

    full = search(None)
    quick = search(0.0)
    # no test after the first bracket within the gap: fewer tests, the plans served and labelled
    # with the cap proven (never above the full search's proof, never below what it serves)
    assert quick.tests < full.tests
    assert quick.theta_hi <= quick.theta_lo * (1 + scaled.CURVE_REFINE_GAP) * (1 + 1e-6)
    assert quick.theta_lo <= full.theta_hi and full.theta_lo <= quick.theta_hi
    assert quick.status in ("proven", "bound")
    _assert_serves(quick, node, profiles, names, demands)
    # the deadline moves only once a served fraction lies within the gap of a proven cap
    assert scaled._refine_deadline(1e9, 0.9, 0.93, 0.3) < 1e9
    assert scaled._refine_deadline(1e9, 0.9, 0.99, 0.3) == 1e9
    assert scaled._refine_deadline(1e9, 0.0, 0.93, 0.3) == 1e9
    assert scaled._refine_deadline(1e9, 0.9, 0.93, None) == 1e9
    # the first test in the curves' bracket: the lowest whose plans close it to the gap
    closing = 0.945 / (1 + scaled.CURVE_REFINE_GAP)
    assert scaled._closing_test(0.916, 0.888, 0.945, 0.01) == pytest.approx(closing)
    assert scaled._closing_test(0.95, 0.94, 0.96, 0.01) == pytest.approx(0.94 * 1.01)  # never below the proof
    assert scaled._closing_test(0.8, 0.0, 0.9, 0.01) == 0.8  # nothing served
    assert scaled._closing_test(0.8, 0.7, float("inf"), 0.01) == 0.8  # nothing refuted


def test_proofs_carried_from_a_smaller_demand_give_the_same_decision(one_gpu) -> None:
    from jigsaw.planner import decompose

    node, profiles = one_gpu
    names = ("social_media", "traffic_analysis")
    pack = lambda ps: _pack_node(dict(zip(names, ps, strict=True)), node, None)  # noqa: E731
    low = decompose.solve(_parts(node, profiles, names, (1500.0, 380.0)), node, solver="highs",
                          time_limit_s=60, objective="slices", pack=pack, first_fit=True)
    assert low.known is not None and len(low.known) == 2
    high = _parts(node, profiles, names, (1500.0, 400.0))
    plain = decompose.solve(high, node, solver="highs", time_limit_s=60, objective="slices", pack=pack,
                            first_fit=True)
    seeded = decompose.solve(high, node, solver="highs", time_limit_s=60, objective="slices",
                             pack=pack, first_fit=True, known=low.known)
    assert seeded.status == plain.status
    if plain.status != "infeasible":
        assert seeded.objective == pytest.approx(plain.objective, abs=node.absolute_gap)
    # what the larger demand proved includes what the smaller one did
    for a, b in zip(low.known, seeded.known, strict=True):
        assert set(a.infeasible) <= set(b.infeasible)


def test_the_bracket_above_a_served_fraction_holds_theta(one_gpu) -> None:
    """``above_greedy`` from plans that serve a fraction (the greedy's, 3.5% below theta* on one
    GPU; the search's own): the joint capacity model's proven fraction lies in its
    [theta_lo, theta_hi), never below what the plans it starts from serve, and its plans serve
    theta_lo, verified and packed."""
    from jigsaw.planner.node_plan import quick_plan_node

    node, profiles = one_gpu
    names, demands = ("social_media", "traffic_analysis"), (1500.0, 400.0)
    parts = _parts(node, profiles, names, demands)

    def pack(ps):
        return _pack_node(dict(zip(names, ps, strict=True)), node, None)

    ref = joint.solve(parts, node, solver="highs", time_limit_s=120, scale_demands=True)
    assert ref.status == "optimal" and ref.plans[0] is not None
    theta = ref.plans[0].planned_rps / demands[0]
    q = quick_plan_node([node.app(a) for a in names], node, profiles, dict(zip(names, demands, strict=True)),
                        scale_down=True)
    assert q is not None and q.demand_scale < 1 and q.layout is not None
    near = scaled.max_scale(parts, node, solver="highs", time_limit_s=60, pack=pack)
    assert near.plans is not None and near.layout is not None
    for plans, layout, served in (([q.plans[a] for a in names], q.layout, q.demand_scale),
                                  (near.plans, near.layout, near.theta_lo)):
        problem.forget()
        parts = _parts(node, profiles, names, demands)
        got = scaled.above_greedy(parts, node, plans, layout, served, solver="highs", time_limit_s=60,
                                  pack=pack)
        assert got is not None and got.status == "proven", got
        assert served <= got.theta_lo < got.theta_hi <= 1.0
        assert got.theta_lo <= theta * (1 + 1e-4) and theta < got.theta_hi * (1 + 1e-4)
        _assert_serves(got, node, profiles, names, demands)


def test_a_large_nodes_spike_starts_from_the_greedys_fraction(one_gpu, monkeypatch) -> None:
    """``plan_node``'s greedy-first spike (here on one GPU, the node-size and LP-floor gates
    lowered to it): the plan serves at least the greedy's fraction, labelled ``feasible`` with a
    bound that the joint capacity model's proven fraction lies under; the anytime path hands its
    quick plan over and gets the same bracket, its quick plan left as it was yielded."""
    from jigsaw.planner import node_plan
    from jigsaw.planner.node_plan import plan_node_anytime, quick_plan_node

    monkeypatch.setattr(node_plan, "QUICK_FIRST_MIN_SLICES", 0)
    monkeypatch.setattr(node_plan, "QUICK_FIRST_SHARE", 0.0)
    answers: list[scaled.ScaleResult | None] = []

    def spy(*a, **k):
        answers.append(scaled.above_greedy(*a, **k))
        return answers[-1]

    monkeypatch.setattr(node_plan, "above_greedy", spy)
    node, profiles = one_gpu
    names, demands = ("social_media", "traffic_analysis"), {"social_media": 1500.0, "traffic_analysis": 400.0}
    apps = [node.app(a) for a in names]
    q = quick_plan_node(apps, node, profiles, demands, scale_down=True)
    assert q is not None and q.demand_scale < 1
    ref = joint.solve(_parts(node, profiles, names, demands.values()), node, solver="highs",
                      time_limit_s=120, scale_demands=True)
    assert ref.status == "optimal" and ref.plans[0] is not None
    theta = ref.plans[0].planned_rps / demands["social_media"]
    problem.forget()
    res = plan_node(apps, node, profiles, demands, solver="highs", time_limit_s=60)
    assert res.status == "feasible" and not res.feasible, res.notes
    assert len(answers) == 1 and answers[0] is not None  # the spike was decided from the greedy's
    assert q.demand_scale <= res.demand_scale <= theta * (1 + 1e-4) < res.scale_bound * (1 + 1e-4)
    assert any("every app serves" in n for n in res.notes)
    for name, p in res.plans.items():
        assert p.planned_rps == pytest.approx(res.demand_scale * demands[name], rel=1e-6)
        assert verify_plan(p, node.app(name), node, profiles) == [], name
    problem.forget()
    got = list(plan_node_anytime(apps, node, profiles, demands, solver="highs", time_limit_s=60))
    assert got[0].status == QUICK_STATUS and got[-1].status == "feasible" and len(answers) == 2
    first = {n: (p.planned_rps, p.demand_rps, list(p.notes)) for n, p in got[0].plans.items()}
    assert got[-1].demand_scale <= theta * (1 + 1e-4) < got[-1].scale_bound * (1 + 1e-4)
    assert {n: (p.planned_rps, p.demand_rps, list(p.notes)) for n, p in got[0].plans.items()} == first


def test_a_large_nodes_spike_keeps_the_greedys_fraction_when_its_tests_get_no_time(
        one_gpu, monkeypatch) -> None:
    """The tests above the greedy's fraction get ``QUICK_FIRST_TESTS_S`` in all; where that runs
    out before any decides, the greedy's fraction is the answer, labelled with no bound below 1
    (``feasible``, a note saying nothing above it was refuted), and no search from the full
    demands follows (it took the whole limit on 16 GPUs)."""
    from jigsaw.planner import decompose, node_plan
    from jigsaw.planner.node_plan import quick_plan_node

    monkeypatch.setattr(node_plan, "QUICK_FIRST_MIN_SLICES", 0)
    monkeypatch.setattr(node_plan, "QUICK_FIRST_SHARE", 0.0)
    monkeypatch.setattr(node_plan, "QUICK_FIRST_TESTS_S", 0.0)
    monkeypatch.setattr(node_plan, "QUICK_FIRST_CAP_SLICES", 0)

    def no_search(*a, **k):
        raise AssertionError("a decision or search after the greedy's bracket")

    monkeypatch.setattr(decompose, "solve", no_search)
    monkeypatch.setattr(node_plan, "max_scale", no_search)
    node, profiles = one_gpu
    names, demands = ("social_media", "traffic_analysis"), {"social_media": 1500.0, "traffic_analysis": 400.0}
    apps = [node.app(a) for a in names]
    q = quick_plan_node(apps, node, profiles, demands, scale_down=True)
    assert q is not None and q.demand_scale < 1
    problem.forget()
    res = plan_node(apps, node, profiles, demands, solver="highs", time_limit_s=60)
    assert res.status == "feasible" and not res.feasible, res.notes
    assert q.demand_scale <= res.demand_scale < 1 and res.scale_bound == 1.0
    assert any("nothing above it refuted" in n for n in res.notes), res.notes
    for name, p in res.plans.items():
        assert p.planned_rps == pytest.approx(res.demand_scale * demands[name], rel=1e-6)
        assert verify_plan(p, node.app(name), node, profiles) == [], name


def test_a_scaled_search_without_a_plan_falls_back_to_the_greedys(one_gpu, monkeypatch) -> None:
    """Where the scaled search finds no plan in time, the greedy's (copies, its fraction, below
    what the search refuted) rather than none."""
    from jigsaw.planner import node_plan
    from jigsaw.planner.node_plan import _Decision, _decomposed_scale, quick_plan_node

    node, profiles = one_gpu
    names, demands = ("social_media", "traffic_analysis"), {"social_media": 1500.0, "traffic_analysis": 400.0}
    q = quick_plan_node([node.app(a) for a in names], node, profiles, demands, scale_down=True)
    assert q is not None and q.demand_scale < 0.9
    monkeypatch.setattr(node_plan, "max_scale", lambda *a, **k: scaled.ScaleResult(
        "none", 0.0, 0.9, None, None, 0.1, 2, ["stopped at the 1 s limit"]))
    parts = _parts(node, profiles, names, demands.values())
    nothing = _Decision("infeasible", [None, None], float("nan"), float("nan"), None, [], "apart")
    notes: list[str] = []
    def pack(ps):
        return _pack_node(dict(zip(names, ps, strict=True)), node, None)

    res, scale, bound = _decomposed_scale(parts, node, nothing, "highs", 1.0, "accuracy", notes, pack, q)
    assert res.status == "feasible" and scale == q.demand_scale and bound == 0.9
    assert all(a is not q.plans[n] for a, n in zip(res.plans, names, strict=True))
    assert [p.planned_rps for p in res.plans] == [q.plans[n].planned_rps for n in names]
    assert any("not proven the largest" in n for n in notes)


def test_a_second_fit_test_reuses_the_first_ones_plans_and_bounds(one_gpu, monkeypatch) -> None:
    """A scaled search's tests share what they show: a test at a demand an earlier test solved
    takes its plans (they serve it) and bounds (they hold) without a single-app solve, and its
    plans still verify and pack."""
    from jigsaw.planner import decompose

    node, profiles = one_gpu
    names = ("social_media", "traffic_analysis")
    parts = _parts(node, profiles, names, (1500.0, 400.0))
    solves = []
    point = decompose._Search.point
    monkeypatch.setattr(decompose._Search, "point",
                        lambda self, i, *a, **k: solves.append(i) or point(self, i, *a, **k))
    pack = lambda ps: _pack_node(dict(zip(names, ps, strict=True)), node, None)  # noqa: E731
    first = scaled.fit_test(parts, node, 0.3, solver="highs", time_limit_s=30, pack=pack)
    assert first.status in ("optimal", "feasible") and solves  # it solved its apps' budgets
    n_first = len(solves)
    again = scaled.fit_test(parts, node, 0.3, solver="highs", time_limit_s=30, pack=pack)
    assert again.status in ("optimal", "feasible")
    assert len(solves) == n_first, "the second test re-solved budgets the first had solved"
    assert again.layout is not None and validate_layout(again.layout, node.gpu) == []
    for name, part, p in zip(names, parts, again.plans, strict=True):
        assert p is not None and p.planned_rps == pytest.approx(0.3 * part.demand_rps, rel=1e-6)
        p.layout = app_layout(again.layout, name)
        assert verify_plan(p, node.app(name), node, profiles) == [], name


def test_a_fit_test_parks_what_a_test_at_a_smaller_fraction_parked(one_gpu, monkeypatch) -> None:
    """A budget no solve decided in its limit at a smaller fraction is parked from the start of
    a test at a larger one (no easier there), not one parked at a larger fraction; the test's
    own parked budgets are added for the next."""
    from jigsaw.planner import decompose

    node, profiles = one_gpu
    names = ("social_media", "traffic_analysis")
    parts = _parts(node, profiles, names, (1500.0, 400.0))
    given = []
    solve = decompose.solve
    monkeypatch.setattr(decompose, "solve", lambda *a, **k: given.append(k["parked"]) or solve(*a, **k))
    pack = lambda ps: _pack_node(dict(zip(names, ps, strict=True)), node, None)  # noqa: E731
    held: scaled.Parked = [(0.28, [[(3, 4)], []]), (0.35, [[(2, 3)], [(3, 3)]])]
    d = scaled.fit_test(parts, node, 0.3, solver="highs", time_limit_s=30, pack=pack, parked=held)
    assert given == [[[(3, 4)], []]]
    assert len(held) == 3 and held[-1] == (0.3, d.parked)
    assert d.status in ("optimal", "feasible") and d.parked is not None and (3, 4) in d.parked[0]
