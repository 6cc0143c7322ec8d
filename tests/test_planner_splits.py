"""The tight planner's split search and small-stage solver: same optimum as the path before them."""

from __future__ import annotations

import pytest
from factories import latency_bound_chain

from jigsaw.planner import joint
from jigsaw.planner.milp import plan
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
