"""The solver process's precompute kept on disk (``control.precompute_store``): a new process
with the same problems picks up where the last one stopped, and never reads the facts of
another problem."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_budget_curve import _run_one  # one precompute step run to its answer

from jigsaw.control import precompute_store
from jigsaw.control.precompute import Precompute
from jigsaw.planner import budget_curve, curves, problem, value_curve
from jigsaw.planner.problem import make_problem
from jigsaw.spaces import search_space

SM = "social_media"
STEPS = 19  # one GPU: every slice budget with all slots, below 7 with its share and one more


def _pb(node, profiles, name=SM):
    problem.forget()  # a new process's problem: nothing learned
    return make_problem(node.app(name), node, profiles, search_space(node.planner.space), None)


def _bounds_only(pb_, node_, k, m, *, solver, time_limit_s):  # runs in the forked child
    return budget_curve.BudgetFact(pb_.app.name, k, m, None, 100.0 * k, "feasible", time_limit_s)


def test_a_new_process_restores_the_budgets_and_goes_on_where_the_last_stopped(one_gpu, monkeypatch,
                                                                               tmp_path) -> None:
    node, profiles = one_gpu
    monkeypatch.setattr(budget_curve, "budget_capacity", _bounds_only)
    first = budget_curve.MAX_STEP_S / budget_curve.DEEPEN
    pre = Precompute([_pb(node, profiles)], node, solver="highs", step_limit_s=first, store=tmp_path)
    assert pre.restored == 0 and len(pre.todo) == STEPS
    for _ in range(5):
        _run_one(pre)
    (path,) = tmp_path.iterdir()
    assert path.name.startswith(f"{SM}-") and len(path.read_text().splitlines()) == 5
    with path.open("a") as f:
        f.write('{"budget": {"app": "social_media", "sli')  # a line cut short by a crash

    again = Precompute([_pb(node, profiles)], node, solver="highs", step_limit_s=first, store=tmp_path)
    assert again.restored == 5
    # the 14 budgets never answered first, then the 5 unproven ones again, DEEPEN times longer:
    # the steps the first process had left, in its order
    assert [s for *_, s in again.todo] == [first] * (STEPS - 5) + [budget_curve.MAX_STEP_S] * 5
    assert again.todo == pre.todo
    # their bounds are in the new problem's curve as they were in the old one's
    curve = curves.curve_of(again.pbs[0])
    assert curve.refuted_at(701.0) and not curve.refuted_at(99.0)
    while again.todo:
        _run_one(again)
    # 14 new, the 5 again at the longest step, then those 14 again
    assert again.done == 2 * (STEPS - 5) + 5
    last = Precompute([_pb(node, profiles)], node, solver="highs", step_limit_s=first, store=tmp_path)
    assert last.restored == 2 * STEPS and not last.todo  # every step done, the longest ones included


def test_the_value_grid_resumes_at_its_first_unanswered_demand(one_gpu, monkeypatch, tmp_path) -> None:
    node, profiles = one_gpu

    def level(pb, node_, scope, demand_rps, max_rps, **kw):  # runs in the forked child
        return [value_curve.Fact(demand_rps, (7, 8), 1.0)]

    monkeypatch.setattr(budget_curve, "budget_capacity", _bounds_only)
    monkeypatch.setattr(value_curve, "level_facts", level)
    pre = Precompute([_pb(node, profiles)], node, solver="highs", step_limit_s=1, store=tmp_path)
    pre.todo = []  # no budgets: the grid's top is what the curve serves
    curves.curve_of(pre.pbs[0]).add_plan(_any_plan(one_gpu), (7, 8), 1600.0)
    for _ in range(3):
        _run_one(pre)
    assert pre.tops == [1600.0] and sorted(pre.levels_done[0]) == [100.0, 200.0, 300.0]

    again = Precompute([_pb(node, profiles)], node, solver="highs", step_limit_s=1, store=tmp_path)
    again.todo = []
    assert again.tops == [1600.0] and sorted(again.levels_done[0]) == [100.0, 200.0, 300.0]
    assert again.next_level() == (0, 400.0, None)  # the first round's next demand, not its first
    facts = value_curve.facts_of(again.pbs[0], again.scopes[0])
    assert sorted(f.demand_rps for f in facts) == [100.0, 200.0, 300.0]
    assert all(f.bound == 1.0 and f.budget == (7, 8) for f in facts)


def _any_plan(one_gpu):
    from jigsaw.planner.milp import plan
    node, profiles = one_gpu
    return plan(node.app(SM), node, profiles, 100.0, solver="highs", time_limit_s=30)


def test_the_file_is_keyed_by_what_the_facts_hold_for(one_gpu, tmp_path) -> None:
    node, profiles = one_gpu
    pb = _pb(node, profiles)
    scope = value_curve.scope_of("accuracy", 1.0, 1.0)
    key = precompute_store.key_of(pb, node, scope)
    assert precompute_store.key_of(pb, node, scope) == key
    assert precompute_store.key_of(pb, dataclasses.replace(node, source="elsewhere.toml"), scope) == key
    looser = dataclasses.replace(node, planner=dataclasses.replace(node.planner, time_limit_s=3.0))
    assert precompute_store.key_of(pb, looser, scope) == key  # a time limit changes no proof
    other = [
        precompute_store.key_of(pb, node, value_curve.scope_of("accuracy", 2.0, 3.0)),
        precompute_store.key_of(pb, node.with_gpus(2), scope),
        precompute_store.key_of(pb, dataclasses.replace(
            node, planner=dataclasses.replace(node.planner, accuracy_slo=0.85)), scope),
        precompute_store.key_of(_pb(node, profiles, "traffic_analysis"), node, scope),
        precompute_store.key_of(dataclasses.replace(pb, factors={("a", "b", "c"): 2.0}), node, scope),
    ]
    assert len({key, *other}) == 1 + len(other)


def test_nothing_is_kept_without_a_directory(one_gpu, monkeypatch) -> None:
    node, profiles = one_gpu
    monkeypatch.setenv(precompute_store.ENV, "")
    assert precompute_store.cache_dir() is None
    pre = Precompute([_pb(node, profiles)], node, solver="highs", step_limit_s=1,
                     store=precompute_store.cache_dir())
    assert pre.store is None and pre.restored == 0
    monkeypatch.delenv(precompute_store.ENV)
    assert precompute_store.cache_dir() is not None


@pytest.fixture(autouse=True)
def _cold(cold_planner) -> None:
    return None


def test_the_solver_process_starts_its_precompute_before_any_request_and_keeps_it(monkeypatch,
                                                                               tmp_path) -> None:
    import time

    from jigsaw.control.solver import SubprocessSolver
    monkeypatch.setenv(precompute_store.ENV, str(tmp_path))
    solver = SubprocessSolver(Path(__file__).resolve().parents[1] / "examples" / "h100x4.toml")
    try:
        solver.start()
        end = time.monotonic() + 60
        lines: list[str] = []
        while time.monotonic() < end and not lines:
            time.sleep(0.2)
            lines = [ln for f in tmp_path.glob(f"{SM}-*.jsonl") for ln in f.read_text().splitlines()]
        # social_media's first budget (the whole node) answered with no request made
        assert lines, "no precompute step was kept within 60 s of the solver process's start"
        assert '"budget"' in lines[0]
    finally:
        solver.close()
