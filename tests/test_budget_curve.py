"""Each app's capacity per slice budget (``planner.budget_curve``) and its precompute in the
solver process's idle time (``control.precompute``): the facts are proofs (a plan that serves
its rate within the budget, a rate above the bound that no plan within the budget serves), and
a step runs in a child a request can kill."""

from __future__ import annotations

import copy
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jigsaw.control.precompute import Precompute
from jigsaw.planner import budget_curve, curves, joint
from jigsaw.planner.decompose import app_layout, usage
from jigsaw.planner.node_plan import _pack_node
from jigsaw.planner.problem import make_problem
from jigsaw.planner.verify import verify_plan
from jigsaw.spaces import search_space

SM = "social_media"


pytestmark = pytest.mark.usefixtures("cold_planner")


def _pb(node, profiles, name=SM):
    return make_problem(node.app(name), node, profiles, search_space(node.planner.space), None)


def test_a_budget_fact_is_a_plan_within_the_budget_and_a_proven_bound_above_it(one_gpu) -> None:
    node, profiles = one_gpu
    pb = _pb(node, profiles)
    fact = budget_curve.budget_capacity(pb, node, 3, solver="highs", time_limit_s=30)
    assert fact.status == "optimal" and fact.plan is not None
    assert usage(fact.plan, node)[0] <= 3 and fact.bound_rps >= fact.plan.planned_rps
    checked = copy.deepcopy(fact.plan)
    checked.layout = app_layout(_pack_node({SM: checked}, node, None), SM)
    assert verify_plan(checked, node.app(SM), node, profiles) == []
    budget_curve.apply(pb, node, fact)
    curve = curves.curve_of(pb)
    (served,) = curve.served
    assert served.rate_rps >= fact.plan.planned_rps and served.usage == usage(fact.plan, node)
    (refuted,) = curve.refuted
    assert refuted[0] == (3, curves.room_of(node)[1]) and refuted[1] > fact.bound_rps
    # the truth: at the refuted rate no plan fits in 3 slices, at the served one a plan does
    at = joint.solve([joint.Part(pb, refuted[1])], node, solver="highs", time_limit_s=30, max_slices=3)
    assert at.status == "infeasible"
    ok = joint.solve([joint.Part(pb, served.rate_rps)], node, solver="highs", time_limit_s=30, max_slices=3)
    assert ok.status in ("optimal", "feasible") and ok.plans[0] is not None
    # and through JSON (the solver process's pipe) the same fact
    again = budget_curve.BudgetFact.from_json(fact.to_json())
    assert again.plan is not None and again.plan.planned_rps == pytest.approx(fact.plan.planned_rps)
    assert again.bound_rps == fact.bound_rps and again.slices == 3


def test_an_unproven_step_stores_its_bound_never_a_guess(one_gpu) -> None:
    node, profiles = one_gpu
    pb = _pb(node, profiles, "ar_assistant")
    fact = budget_curve.budget_capacity(pb, node, 7, solver="cbc", time_limit_s=0.2)
    budget_curve.apply(pb, node, fact)
    curve = curves.curve_of(pb)
    if fact.plan is not None:
        assert fact.bound_rps >= fact.plan.planned_rps
    for _, r in curve.refuted:
        assert r > fact.bound_rps  # refuted only above what the solver proved
    ref = joint.solve([joint.Part(pb, None)], node, solver="highs", time_limit_s=120)
    if ref.status == "optimal":
        assert all(r > ref.plans[0].planned_rps for _, r in curve.refuted)


def _run(pre: Precompute, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while pre.todo and time.monotonic() < end:
        pre.start()
        assert pre.fd is not None
        ready, _, _ = select.select([pre.fd], [], [], max(0.0, end - time.monotonic()))
        if ready:
            pre.readable()
    pre.cancel()


def test_the_solver_process_precompute_fills_the_curves_from_forked_steps(one_gpu) -> None:
    node, profiles = one_gpu
    pb = _pb(node, profiles)
    pre = Precompute([pb], node, solver="highs", step_limit_s=10)
    # every slice budget with all 8 slots, and below 7 slices with their share of them and one more
    assert [(k, m, s) for _, k, m, s in pre.todo][:5] == [(7, None, 10), (6, None, 10), (6, 6, 10),
                                                         (6, 7, 10), (5, None, 10)]
    assert len(pre.todo) == 19
    _run(pre, 240)
    assert not pre.todo and pre.done == 19
    curve = curves.curve_of(pb)
    assert curve.served and curve.refuted
    # more slices serve more: the stored plans' front rises with the budget
    rates = [s.rate_rps for s in sorted(curve.served, key=lambda s: s.usage)]
    assert rates == sorted(rates)


def test_a_request_kills_the_running_step_which_runs_again_later(one_gpu) -> None:
    node, profiles = one_gpu
    pb = _pb(node, profiles, "ar_assistant")
    pre = Precompute([pb], node, solver="cbc", step_limit_s=60)
    pre.start()
    pid = pre._pid
    assert pid is not None
    pre.cancel()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped: no zombie left
    assert pre.fd is None and len(pre.todo) == 19 and pre.done == 0
    assert not curves.curve_of(pb).served


def test_no_precompute_when_its_step_is_zero(one_gpu) -> None:
    node, profiles = one_gpu
    pre = Precompute([_pb(node, profiles)], node, solver="highs", step_limit_s=0)
    pre.start()
    assert pre.fd is None and not pre.todo


def test_an_unproven_step_runs_again_longer_once_the_rest_is_done(one_gpu, monkeypatch) -> None:
    node, profiles = one_gpu
    pb = _pb(node, profiles)
    seen: list[float] = []

    def stopped(pb_, node_, k, m, *, solver, time_limit_s):  # runs in the forked child
        return budget_curve.BudgetFact(pb_.app.name, k, m, None, 100.0 * k, "feasible", time_limit_s)

    monkeypatch.setattr(budget_curve, "budget_capacity", stopped)
    pre = Precompute([pb], node, solver="highs", step_limit_s=budget_curve.MAX_STEP_S / budget_curve.DEEPEN)
    for _ in range(19):
        pre.start()
        seen.append(pre.todo[0][3])
        _run_one(pre)
    # every budget once, each queued again DEEPEN times longer (that reaches the most a step takes)
    assert pre.done == 19 and seen == [budget_curve.MAX_STEP_S / budget_curve.DEEPEN] * 19
    assert [s for *_, s in pre.todo] == [budget_curve.MAX_STEP_S] * 19
    for _ in range(19):
        _run_one(pre)
    assert not pre.todo and pre.done == 38
    # only bounds were stored: every rate above 100 x k refuted on k slices, nothing served
    curve = curves.curve_of(pb)
    assert not curve.served and curve.refuted_at(100.0 * 7 + 1) and not curve.refuted_at(99.0)


def _run_one(pre: Precompute) -> None:
    pre.start()
    while pre.fd is not None:
        ready, _, _ = select.select([pre.fd], [], [], 30)
        assert ready, "the step's child answered nothing in 30 s"
        pre.readable()


def test_a_stuck_step_is_killed_and_dropped(one_gpu, monkeypatch) -> None:
    node, profiles = one_gpu

    def stuck(*a, **kw):  # runs in the forked child: a solver that never returns
        time.sleep(3600)

    monkeypatch.setattr(budget_curve, "budget_capacity", stuck)
    pre = Precompute([_pb(node, profiles)], node, solver="highs", step_limit_s=1)
    pre.start()
    pid = pre._pid
    assert pid is not None and pre.deadline > time.monotonic()
    pre.expire()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    assert pre.fd is None and len(pre.todo) == 18  # dropped, the rest still to do


def test_a_kill_reaches_the_solver_process_the_step_started(one_gpu, monkeypatch, tmp_path) -> None:
    node, profiles = one_gpu
    pid_file = tmp_path / "grandchild"

    def spawning(*a, **kw):  # runs in the forked child: a solver process of its own, then waits
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        pid_file.write_text(str(proc.pid))
        time.sleep(3600)

    monkeypatch.setattr(budget_curve, "budget_capacity", spawning)
    pre = Precompute([_pb(node, profiles)], node, solver="cbc", step_limit_s=60)
    pre.start()
    end = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < end, "the step never started its process"
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    pre.cancel()
    while time.monotonic() < end:
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        if Path(f"/proc/{grandchild}/stat").read_text().split()[2] == "Z":
            break  # killed, waiting for init to reap it
        time.sleep(0.05)
    else:
        os.kill(grandchild, 9)
        raise AssertionError("the step's solver process outlived the kill")


def test_a_forked_process_does_not_share_its_parents_warm_cbc_processes() -> None:
    from jigsaw.planner import solve_runner
    sentinel = object()
    before = len(solve_runner._IDLE)
    solve_runner._IDLE.append(sentinel)  # type: ignore[arg-type]
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0 if not solve_runner._IDLE else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert len(solve_runner._IDLE) == before + 1  # the parent's kept
    finally:
        solve_runner._IDLE.remove(sentinel)  # type: ignore[arg-type]
