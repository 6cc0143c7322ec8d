"""The tight planner's split search and small-stage solver: same optimum as the path before them."""

from __future__ import annotations

import itertools
import math
import time

import pytest
from factories import latency_bound_chain, make_app, make_node, make_profiles

from jigsaw.planner import joint
from jigsaw.planner.milp import capacity, plan
from jigsaw.planner.problem import make_problem
from jigsaw.planner.verify import verify_plan
from jigsaw.spaces import search_space


def _chain():
    return latency_bound_chain()


def test_cap_splits_meet_every_path_and_stay_below_the_needed_caps() -> None:
    app, node, profiles = _chain()
    pb = make_problem(app, node, profiles, search_space("ast"), None)
    lats = joint.task_latencies(pb)
    need = {t: ls[-1] for t, ls in lats.items()}  # every task at its slowest: the path breaks
    assert any(sum(2 * need[t] for t in p) > app.latency_slo_ms for p in app.paths)
    splits = joint._cap_splits(pb, need)
    assert splits
    for caps in splits:
        for p in app.paths:
            assert sum(2 * caps[t] for t in p) <= app.latency_slo_ms * (1 + 1e-9)
        assert all(caps[t] <= need[t] + 1e-9 for t in need)
    # distinct, and the proportional cut comes last
    assert len({tuple(sorted(c.items())) for c in splits}) == len(splits)
    assert splits[-1] == joint._feasible_caps(pb, need)


@pytest.mark.parametrize("demand", [60.0, 150.0, 250.0])
@pytest.mark.parametrize("solver", ["cbc", "highs"])
def test_split_search_and_highs_core_keep_the_optimum(demand: float, solver: str) -> None:
    """The default path (HiGHS for the core, the split search) and the one before both prove
    the same optimum within the node's stopping gap, and both plans pass the verifier."""
    app, node, profiles = _chain()
    pb = make_problem(app, node, profiles, search_space("ast"), None)
    new = joint.solve([joint.Part(pb, demand)], node, solver=solver, time_limit_s=60)
    old = joint.solve([joint.Part(pb, demand)], node, solver=solver, time_limit_s=60,
                      core_solver="same", split_search=False)
    assert new.status == old.status == "optimal"
    if demand == 250.0:
        # the core does not lift here; a split of the SLO (the grid's, or of the core's caps) is
        assert new.stage in ("grid", "split")
    assert abs(new.objective - old.objective) <= node.absolute_gap + 1e-9
    for res in (new, old):
        p = res.plans[0]
        assert p is not None
        assert res.objective <= res.bound + 1e-9
    assert verify_plan(plan(app, node, profiles, demand, solver=solver, time_limit_s=60),
                       app, node, profiles) == []


def test_stage_solver_names() -> None:
    assert joint.stage_solver("cbc", "same") == "cbc"
    assert joint.stage_solver("cbc", "highs") == "highs"
    assert joint.stage_solver("highs", "auto") == (joint.CORE_SOLVER or "highs")
    with pytest.raises(ValueError, match="unknown core solver"):
        joint.stage_solver("cbc", "gurobi")


def test_grid_caps_meet_every_path_and_are_maximal() -> None:
    app, node, profiles = _chain()
    pb = make_problem(app, node, profiles, search_space("ast"), None)
    grid = joint.grid_caps(pb, steps=8)
    assert grid
    unit = app.latency_slo_ms / 2 / 8
    fastest = {t: min(c.latency_ms for c in pb.colset.columns if c.task == t) for t in app.task_names}
    for caps in grid:
        for p in app.paths:
            assert sum(2 * caps[t] for t in p) <= app.latency_slo_ms * (1 + 1e-9)
        assert all(caps[t] >= fastest[t] - 1e-9 for t in caps)  # every task keeps a column
        for t in caps:  # maximal: no task's cap grows a step
            assert any(sum(caps[u] + (unit if u == t else 0.0) for u in p) > app.latency_slo_ms / 2 + 1e-9
                       for p in app.paths if t in p)


def test_without_the_grid_the_optimum_is_the_same() -> None:
    app, node, profiles = _chain()
    pb = make_problem(app, node, profiles, search_space("ast"), None)
    new = joint.solve([joint.Part(pb, 250.0)], node, solver="highs", time_limit_s=60)
    saved = joint.GRID_SEARCH
    joint.GRID_SEARCH = False
    try:
        off = joint.solve([joint.Part(pb, 250.0)], node, solver="highs", time_limit_s=60)
    finally:
        joint.GRID_SEARCH = saved
    assert new.status == off.status == "optimal"
    assert off.stage != "grid"
    assert abs(new.objective - off.objective) <= node.absolute_gap + 1e-9


# A detector-like task feeding two others (traffic_analysis's shape): two paths share the first
# task, so the SLO's maximal splits trade it against both children at once.
FORK = dict(tasks={"d": [("d1", 70.0), ("d2", 80.0)], "x": [("x1", 60.0), ("x2", 66.0)], "y": [("y1", 50.0)]},
            edges=[("d", "x", {"d1": 1.0, "d2": 1.5}), ("d", "y", {"d1": 0.5, "d2": 0.8})])
FORK_BASE = {"d1": 2.0, "d2": 5.0, "x1": 3.0, "x2": 7.0, "y1": 1.0}


def _fork():
    node = make_node(num_gpus=8, mps_levels=(1, 2), batch_sizes=(1, 4, 16))
    return make_app(**FORK, latency_slo_ms=120.0), node, make_profiles(node, FORK_BASE)


@pytest.mark.parametrize("make", [_chain, _fork])
def test_maximal_caps_are_every_maximal_split(make) -> None:
    """Against brute force over every combination of the tasks' column latencies."""
    app, node, profiles = make()
    pb = make_problem(app, node, profiles, search_space("ast"), None)
    lats = joint.task_latencies(pb)
    tasks = app.task_names

    def fits(k: dict[str, float]) -> bool:
        return all(sum(2 * k[t] for t in p) <= app.latency_slo_ms * (1 + 1e-12) for p in app.paths)

    brute = []
    for combo in itertools.product(*(lats[t] for t in tasks)):
        k = dict(zip(tasks, combo, strict=True))
        if fits(k) and not any(
                i + 1 < len(lats[t]) and fits({**k, t: lats[t][i + 1]})
                for t in tasks for i in [lats[t].index(k[t])]):
            brute.append(k)
    got = joint.maximal_caps(pb, 10**6)
    assert got is not None and len(got) > 1
    assert sorted(tuple(k[t] for t in tasks) for k in got) == \
        sorted(tuple(k[t] for t in tasks) for k in brute)
    assert joint.maximal_caps(pb, len(brute) - 1) is None  # more than the limit: none


@pytest.mark.parametrize("solver", ["cbc", "highs"])
@pytest.mark.parametrize(("make", "solves"), [(_fork, None), (_chain, None), (_chain, 2), (_fork, 0)])
def test_capacity_over_the_splits_equals_the_full_model(make, solves: int | None, solver: str,
                                                        monkeypatch) -> None:
    """The maximum demand from the SLO's maximal splits is the full model's, proven both ways,
    and so is the cheapest plan at it (searched over the splits too, ``exact_splits``);
    the splits decide (their LP bounds and floor cuts refute the rest: no full model is built);
    where more are left open than the solves allowed (the 2-GPU chain with 2), the full model
    decides from the splits' best plan (with no split solve allowed, from none)."""
    app, node, profiles = make()
    if solves is not None:
        monkeypatch.setattr(joint, "MAX_SPLIT_SOLVES", solves)
    built_full: list[bool] = []
    build = joint.build

    def recording_build(*args, **kwargs):
        built_full.append(kwargs.get("full", False))
        return build(*args, **kwargs)

    monkeypatch.setattr(joint, "build", recording_build)
    new = capacity(app, node, profiles, solver=solver, time_limit_s=60)
    assert any(built_full) == (solves is not None)
    monkeypatch.setattr(joint, "CAPACITY_SPLITS", False)
    old = capacity(app, node, profiles, solver=solver, time_limit_s=60)
    assert new.status == old.status == "optimal"
    assert new.max_demand_rps == pytest.approx(old.max_demand_rps, rel=joint.CAPACITY_RELATIVE_GAP)
    assert new.plan.status == old.plan.status == "optimal"
    assert new.plan.objective == pytest.approx(old.plan.objective, abs=node.absolute_gap + 1e-9)
    assert verify_plan(new.plan, app, node, profiles) == []


def test_tally_counts_the_solves_inside_it() -> None:
    from jigsaw.planner.model import LinearModel, tally

    md = LinearModel()
    xs = [md.var(0, 10, cost=i + 1.3, integer=True) for i in range(6)]
    md.row(xs, [2 * i + 1.7 for i in range(6)], hi=23.3)
    md.row(xs, [7 - i + 0.9 for i in range(6)], hi=19.1)
    with tally() as outer:
        sol = md.solve("cbc", 10, 1e-9)
        with tally() as inner:
            md.relaxation()
    assert (outer.milps, outer.lps, inner.milps, inner.lps) == (1, 1, 0, 1)
    assert outer.nodes == sol.nodes >= 0
    md.solve("highs", 10, 1e-9)
    assert outer.milps == 1  # outside the block: not counted


@pytest.mark.parametrize("make", [_chain, _fork])
def test_plan_at_capacity_first_solves_a_split_its_capacity_solve_served(make, monkeypatch) -> None:
    """The cheapest plan at the capacity solves first a split that the capacity's own search
    found a plan under at that demand (the others then only need refuting), and it is the same
    plan as a search that does not know which split that was (a fresh problem)."""
    from jigsaw.planner import problem

    app, node, profiles = make()
    seen: list[tuple[float, tuple, dict]] = []
    ranked = joint._ranked_splits

    def recording(parts, node_, shape, capacity_mode, until):
        got = ranked(parts, node_, shape, capacity_mode, until)
        if not capacity_mode and got:
            seen.append((parts[0].demand_rps, got[0][3],
                         dict(parts[0].pb.derived.get(joint._SPLIT_SERVES, {}))))
        return got

    monkeypatch.setattr(joint, "_ranked_splits", recording)
    cap = capacity(app, node, profiles, solver="cbc", time_limit_s=60)
    assert cap.status == cap.plan.status == "optimal"
    assert seen
    demand, first, served = seen[0]
    assert served.get(first, 0.0) >= demand > 0
    problem.forget()
    pb = make_problem(app, node, profiles, search_space("ast"), None)
    assert joint._SPLIT_SERVES not in pb.derived
    fresh = joint.solve([joint.Part(pb, demand)], node, solver="cbc", time_limit_s=60, exact_splits=True)
    assert fresh.status == "optimal"
    assert fresh.objective == pytest.approx(cap.plan.objective, abs=1e-9)


def test_ranking_puts_a_split_known_to_hold_the_demand_first() -> None:
    """At a demand, the split whose capacity solve served it goes first, the rest by their LP."""
    from jigsaw.planner import problem

    app, node, profiles = _fork()
    problem.forget()
    pb = make_problem(app, node, profiles, search_space("ast"), None)
    shape = {"objective": "accuracy", "scale_demands": False, "max_slices": None, "max_slots": None,
             "total_weight": None}
    parts = [joint.Part(pb, 100.0)]
    plain = joint._ranked_splits(parts, node, shape, False, math.inf)
    assert plain is not None and len(plain) > 2
    assert [x for x, *_ in plain] == sorted((x for x, *_ in plain), reverse=True)
    last = plain[-1][3]
    pb.derived[joint._SPLIT_SERVES] = {last: 100.0}
    again = joint._ranked_splits(parts, node, shape, False, math.inf)
    assert again is not None
    assert [k for *_, k in again] == [last] + [k for *_, k in plain[:-1]]
    pb.derived[joint._SPLIT_SERVES] = {last: 99.0}  # served less than the demand: no fact here
    assert [k for *_, k in joint._ranked_splits(parts, node, shape, False, math.inf)] == \
        [k for *_, k in plain]


def test_first_plan_answers_with_the_incumbent_searches_plan_and_a_true_bound(monkeypatch) -> None:
    """``first_plan``: where the incumbent searches find a plan they cannot prove (their proofs
    against the core switched off here), it is the answer, ``feasible`` with a bound no lower
    than the proven optimum, and no level model is built; without it the level models prove
    the optimum, which the plan lies within the bound's reach of."""
    app, node, profiles = _chain()
    pb = make_problem(app, node, profiles, search_space("ast"), None)
    proven = joint.solve([joint.Part(pb, 250.0)], node, solver="highs", time_limit_s=60)
    assert proven.status == "optimal" and proven.stage in ("grid", "split")
    monkeypatch.setattr(joint._Search, "prove", lambda self, spent_s: None)
    levels: list[bool] = []
    build = joint.build

    def recording_build(*args, **kwargs):
        levels.append(kwargs.get("levels") is not None)
        return build(*args, **kwargs)

    monkeypatch.setattr(joint, "build", recording_build)
    first = joint.solve([joint.Part(pb, 250.0)], node, solver="highs", time_limit_s=60, first_plan=True)
    assert first.stage in ("grid", "split")
    assert not any(levels)
    assert first.plans[0] is not None and first.plans[0].planned_rps >= 250.0 * (1 - 1e-9)
    assert first.objective <= proven.objective + node.absolute_gap + 1e-9
    assert first.bound >= proven.objective - 1e-9
    assert first.status == "feasible" and first.bound > first.objective + node.absolute_gap
    full = joint.solve([joint.Part(pb, 250.0)], node, solver="highs", time_limit_s=60)
    assert any(levels) and full.status == "optimal"
    assert abs(full.objective - proven.objective) <= node.absolute_gap + 1e-9


def test_a_proof_asked_again_is_not_solved_again(monkeypatch) -> None:
    """``prove``: a floor under the same bound whose core had a plan above it is not solved again
    (the grid's splits often find the same best); one whose solve ran out of its limit is asked
    once more with twice that limit, then not with no longer a limit; a new best, a new bound or
    a longer limit is asked."""
    app, node, profiles = _chain()
    pb = make_problem(app, node, profiles, search_space("ast"), None)
    answers = ["found"]
    asked: list[float] = []

    def answering(parts, node_, shape, floor, cut, how, limit_s, gap_abs):
        asked.append(limit_s)
        return answers[0]

    monkeypatch.setattr(joint, "_nothing_above", answering)
    s = joint._Search([joint.Part(pb, 100.0)], node, {"objective": "accuracy"}, "highs", 10.0,
                      time.perf_counter(), 0.5, 0.0, False, "highs", True)
    s.ub = 1.0
    s.best = joint.JointResult("feasible", [None], 0.2, 1.0, 0.0, "grid")
    s.prove(1.0)
    s.prove(5.0)  # the core had a plan above that floor: no limit changes it
    assert len(asked) == 1
    s.best = joint.JointResult("feasible", [None], 0.3, 1.0, 0.0, "grid")
    answers[0] = "open"
    s.prove(1.0)
    s.prove(1.0)  # ran out: once more, twice as long
    assert asked[1:] == [1.0, 2.0]
    s.prove(1.0)  # ran out of a longer limit before
    s.prove(2.0)
    assert len(asked) == 3
    s.prove(3.0)
    assert asked[3] == 4.0  # longer than any before, and at least twice the longest
    answers[0] = "infeasible"
    s.ub = 0.9  # a new bound: a new question
    s.prove(1.0)
    assert len(asked) == 5 and s.best.status == "optimal" and s.ub == pytest.approx(0.3 + 0.5)


def test_splits_and_their_columns_are_kept_per_problem() -> None:
    """``maximal_caps`` and ``core_columns`` are pure in the problem: kept in it, the same answers
    as computed afresh, and a caller's change to the splits it got does not reach the kept ones."""
    app, node, profiles = _fork()
    pb = make_problem(app, node, profiles, search_space("ast"), None)
    first = joint.maximal_caps(pb, 10**6)
    assert first is not None and len(first) > 1
    assert first == joint._maximal_caps(pb, 10**6)
    first[0].clear()
    assert joint.maximal_caps(pb, 10**6) == joint._maximal_caps(pb, 10**6)
    for caps in [None, *joint.maximal_caps(pb, 10**6)]:
        got = joint.core_columns(pb, caps)
        assert got == joint._core_columns(pb, caps)
        assert joint.core_columns(pb, None if caps is None else dict(caps)) is got
    assert joint.maximal_caps(pb, 1) is None  # more than the limit: none, kept apart
