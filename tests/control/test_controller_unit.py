"""The controller's decisions without processes: early re-plan trigger, measured factors, bins."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from jigsaw.control.controller import RATE_JUMP_MAX, AppController
from jigsaw.node import Node, load_node
from jigsaw.plan import Plan, PlanInstance
from jigsaw.runtime.admission import BinCounters
from jigsaw.runtime.generations import Applied, DesiredState, same_instances
from jigsaw.runtime.metrics import Metrics

NODE = Path(__file__).resolve().parents[2] / "examples" / "h100x4.toml"


def _plan(demand: float, instances: list[PlanInstance] | None = None) -> Plan:
    return Plan(app="traffic_analysis", space="ast", demand_rps=demand, planned_rps=demand, feasible=True,
                max_demand_plan=False, status="optimal", objective=0.0, accuracy=0.98, slices_used=3,
                slices_available=28, solve_seconds=0.1, gap=0.0, instances=instances or [])


class _Fe:
    """The controller's ``BinSource``: the bin counters and the planner-failure metric."""

    def __init__(self) -> None:
        self.bins: dict[str, BinCounters] = {"traffic_analysis": BinCounters()}
        self.metrics = Metrics("emulated")

    def peek_bin(self, app: str) -> BinCounters | None:
        return self.bins.get(app)

    def take_bin(self, app: str) -> BinCounters:
        got = self.bins[app]
        self.bins[app] = BinCounters()
        return got

    def count_planner_failure(self, app: str) -> None:
        self.metrics.planner_failures.inc((("app", app),))


class _Plane:
    """The controller's ``DataPlane`` without processes: one generation whose plan ``apply`` sets."""

    def __init__(self, node: Node, plan: Plan) -> None:
        self.node = node
        self.profiles = None
        self.plans = {"traffic_analysis": plan}
        self.applied: list[DesiredState] = []

    def plan_of(self, app: str) -> Plan:
        return self.plans[app]

    def generation_of(self, app: str) -> int:
        return 0

    async def apply(self, desired: DesiredState) -> Applied:
        self.applied.append(desired)
        self.plans[desired.app] = desired.plan
        return Applied(0, 0, False)


def _controller(solver: Any, bin_seconds: float = 100.0, rate_trigger: bool = True
                ) -> tuple[AppController, _Fe]:
    node = load_node(NODE)
    # the paper's mean predictor and no burst floor: these tests check the controller's timing and
    # triggers around the demand it asks for
    node = dataclasses.replace(node, control=dataclasses.replace(node.control, replan_on_rate=rate_trigger,
                                                                 predictor="mean", burst_requests=0))
    fe = _Fe()
    c = AppController(node.app("traffic_analysis"), _Plane(node, _plan(10.0)), fe,  # type: ignore[arg-type]
                      space="ast", bin_seconds=bin_seconds,
                      time_scale=2.0, executor=ThreadPoolExecutor(1), solver=solver, log=lambda m: None)
    return c, fe


def test_early_replan_fires_once_above_the_threshold() -> None:
    asked: list[float] = []

    def solver(app: Any, node: Any, profiles: Any, demand: float, **kw: Any) -> Plan:
        asked.append(demand)
        return _plan(demand)  # no instances: the controller keeps the running plan

    async def go() -> None:
        c, fe = _controller(solver, rate_trigger=False)  # the violation trigger alone
        c.history_rps.extend([10.0] * 5)
        b = fe.bins["traffic_analysis"]
        b.arrivals, b.answered, b.violations = 100, 100, 4  # 4% <= 5%: no re-plan
        c._check_early()
        assert c._replan_task is None
        b.violations = 6  # 6% > 5%
        c._check_early()
        assert c._replan_task is not None
        await c._replan_task
        c._check_early()  # once per bin
        assert len(asked) == 1
        # the demand so far (100 arrivals in well under a second, x time scale 2) beats the history,
        # up to RATE_JUMP_MAX x what the plan holds (a rate read over a stall is no demand)
        assert asked[0] == pytest.approx(RATE_JUMP_MAX * 10.0 * 1.05)

    asyncio.run(go())


def test_too_few_answers_do_not_trigger() -> None:
    async def go() -> None:
        c, fe = _controller(lambda *a, **k: _plan(1.0), rate_trigger=False)
        b = fe.bins["traffic_analysis"]
        b.answered, b.violations = 10, 10
        c._check_early()
        assert c._replan_task is None

    asyncio.run(go())


def test_close_bin_measures_demand_and_factors() -> None:
    async def go() -> None:
        c, fe = _controller(lambda *a, **k: _plan(1.0), bin_seconds=100.0)
        b = fe.bins["traffic_analysis"]
        b.arrivals, b.answered, b.violations = 50, 40, 2
        b.children[("detect", "yolov5n")] = [10, 30]  # 3 children per detected frame
        c.bin_start -= 100.0  # the bin is over
        c._close_bin()
        r = c.records[-1]
        assert r.demand_rps == pytest.approx(50 / 100 * 2.0, rel=0.05)
        assert r.violation_rate == pytest.approx(0.05) and r.answered == 40
        app = c.app
        factors = c.measured_factors()
        kids = app.children("detect")
        assert {k[2] for k in factors} == set(kids)
        assert sum(factors.values()) == pytest.approx(3.0)

    app_tasks = load_node(NODE).app("traffic_analysis").task_names
    if "detect" not in app_tasks:
        pytest.skip(f"traffic_analysis has no task named detect ({app_tasks})")
    asyncio.run(go())


def test_same_instances_ignores_lane_rates() -> None:
    i = PlanInstance(task="t", variant="v", mig_profile="1g.10gb", mps=1, max_batch=4, count=1,
                     latency_ms=10.0, throughput_rps=100.0, slices=1)
    assert same_instances(_plan(1.0, [i]), _plan(5.0, [i]))
    j = PlanInstance(task="t", variant="v", mig_profile="2g.20gb", mps=1, max_batch=4, count=1,
                     latency_ms=10.0, throughput_rps=100.0, slices=2)
    assert not same_instances(_plan(1.0, [i]), _plan(1.0, [j]))


def test_solver_child_process_round_trip() -> None:
    from jigsaw.control.solver import SolverError, SubprocessSolver
    node = load_node(NODE)
    app = node.app("traffic_analysis")
    solver = SubprocessSolver(NODE)
    try:
        p = solver(app, node, None, 10.0, space="ast", previous=None, time_limit_s=5.0,  # type: ignore[arg-type]
                   factors={("detect", "yolov5n", "car"): 1.0})
        assert p.instances and p.planned_rps == pytest.approx(10.0) and p.layout is not None
        again = solver(app, node, None, 12.0, space="ast", previous=p, time_limit_s=5.0,  # type: ignore[arg-type]
                       factors=None)
        assert again.instances
        ghost = SimpleNamespace(name="no_such_app")
        with pytest.raises(SolverError, match="no_such_app"):
            solver(ghost, node, None, 1.0, space=None, previous=None, time_limit_s=1.0,  # type: ignore[arg-type]
                   factors=None)
    finally:
        solver.close()


def test_repartition_delay_follows_time_scale_and_bin_compression() -> None:
    c, _ = _controller(lambda *a, **k: _plan(1.0), bin_seconds=600.0)  # 300 s x time scale 2: none
    assert c.repartition_delay_s() == pytest.approx(2.0 * 2.0)
    c, _ = _controller(lambda *a, **k: _plan(1.0), bin_seconds=6.0)  # 100x compressed
    assert c.repartition_delay_s() == pytest.approx(2.0 * 2.0 * 6.0 / 600.0)


def test_planner_failure_keeps_the_running_plan_and_is_reported() -> None:
    def solver(app: Any, node: Any, profiles: Any, demand: float, **kw: Any) -> Plan:
        raise RuntimeError("CBC crashed")

    async def go() -> None:
        c, fe = _controller(solver)
        running = c.plan
        got = await c.replan(50.0)
        assert got is running and c.plan is running
        assert c.current.planner_errors == ["RuntimeError: CBC crashed"]
        assert fe.metrics.planner_failures.get((("app", "traffic_analysis"),)) == 1
        c._close_bin()
        assert c.history()[-1]["planner_errors"] == ["RuntimeError: CBC crashed"]
        assert c.predicted_rps == 10.0  # a failed re-plan does not claim its demand
    asyncio.run(go())


def test_solver_process_that_hangs_is_killed_and_replaced(tmp_path: Path) -> None:
    import sys
    import time

    from jigsaw.control.solver import SolverError, SubprocessSolver
    node = load_node(NODE)
    app = node.app("traffic_analysis")
    hang = [sys.executable, "-c", "import sys, time; sys.stdin.readline(); time.sleep(120)"]
    solver = SubprocessSolver(NODE, command=hang, grace_s=0.5)
    try:
        t0 = time.monotonic()
        with pytest.raises(SolverError, match="timed out"):
            solver(app, node, None, 10.0, space=None, previous=None, time_limit_s=0.25,  # type: ignore[arg-type]
                   factors=None)
        assert time.monotonic() - t0 < 10.0
        assert solver._proc is None  # the hung process is gone; the next solve starts a fresh one
        with pytest.raises(SolverError, match="timed out"):
            solver(app, node, None, 10.0, space=None, previous=None, time_limit_s=0.25,  # type: ignore[arg-type]
                   factors=None)
    finally:
        solver.close()


def test_the_next_bins_plan_starts_ahead_of_the_bin_end() -> None:
    import time
    calls: list[tuple[float, float]] = []

    def solver(app: Any, node: Any, profiles: Any, demand: float, **kw: Any) -> Plan:
        calls.append((time.monotonic(), demand))
        return _plan(demand)  # no instances: keeps the running plan

    async def go() -> None:
        c, fe = _controller(solver, bin_seconds=1.0, rate_trigger=False)  # the routine re-plan alone
        assert c.lead_s() == 0.0  # nothing measured yet: re-plan at the bin's end
        c.history_rps.extend([10.0] * 4)
        c._replan_s = 0.4  # recent re-plans took 0.4 s: start 0.5 s (1.25 x 0.4) before the end
        assert c.lead_s() == pytest.approx(0.5)
        c.bin_start = time.monotonic()
        fe.bins["traffic_analysis"].arrivals = 50  # ~100 req/s so far, x time scale 2
        c.start()
        try:
            await asyncio.sleep(1.25)
        finally:
            await c.stop()
        assert len(calls) == 1, calls  # one re-plan for the boundary, none again at the close
        at, demand = calls[0]
        assert 0.45 <= at - (c.bin_start - 1.0) <= 0.8
        # the mean of 4 bins of 10 and the running bin's ~200 req/s, + 5% slack
        assert demand == pytest.approx((40.0 + 200.0) / 5 * 1.05, rel=0.1)
        assert c.records[-1].predicted_rps == 10.0  # the closed bin keeps the prediction it ran with
        assert c.current.predicted_rps == pytest.approx(demand)
    asyncio.run(go())


def test_a_bin_that_replanned_early_holds_its_demand_for_the_next_bin() -> None:
    from jigsaw.control.controller import BinRecord
    c, _ = _controller(lambda *a, **k: _plan(1.0))
    c.history_rps.extend([10.0, 10.0, 10.0, 10.0, 100.0])
    c.records.append(BinRecord("traffic_analysis", 4, 0.0, 100.0, demand_rps=100.0))
    assert c.predict_next() == pytest.approx(28.0 * 1.05)  # the paper's mean + slack
    c.records[-1].early_replans = 1  # the burst outran the plan: hold its demand one more bin
    assert c.predict_next() == pytest.approx(100.0 * 1.05)


def test_the_burst_floor_and_the_spike_predictor_shape_the_demand_asked_for() -> None:
    asked, solver = _asking()

    async def go() -> None:
        c, _ = _controller(solver)
        c.floor_rps = 123.0
        await c.replan(10.0)
        assert asked == [123.0]  # every plan holds the burst
    asyncio.run(go())
    node = load_node(NODE)
    c = AppController(node.app("traffic_analysis"), _Plane(node, _plan(10.0)), _Fe(),  # type: ignore[arg-type]
                      space="ast", bin_seconds=100.0, time_scale=2.0, executor=ThreadPoolExecutor(1),
                      solver=solver, log=lambda m: None)
    assert c.floor_rps == pytest.approx(40 / 0.325)  # the node's default control.burst_requests
    c.history_rps.extend([10.0, 10.0, 10.0, 10.0, 40.0])  # the last bin jumped: its level holds
    assert c.predict_next() == pytest.approx(40.0 * 1.05)


def test_violations_under_a_plan_that_holds_the_rate_do_not_plan_for_less() -> None:
    asked, solver = _asking()

    async def go() -> None:
        c, fe = _controller(solver, rate_trigger=False)
        c.plane.plans["traffic_analysis"] = _plan(500.0)  # type: ignore[attr-defined]
        c.bin_start = time.monotonic() - 10.0
        b = fe.bins["traffic_analysis"]
        b.arrivals, b.answered, b.violations = 100, 100, 50  # 20 rps observed, half of them late
        c._check_early()
        assert c._replan_task is not None
        await c._replan_task
        assert asked and asked[0] >= 500.0, asked
    asyncio.run(go())


def test_a_capacity_loss_replan_asks_for_fresh_processes() -> None:
    inst = PlanInstance(task="t", variant="v", mig_profile="1g.10gb", mps=1, max_batch=4, count=1,
                        latency_ms=10.0, throughput_rps=100.0, slices=1)

    async def go() -> None:
        c, _ = _controller(lambda *a, **k: _plan(12.0, [inst]))
        plane = c.plane
        await c.replan(11.0)  # a routine re-plan may reuse the processes
        c.on_capacity_lost("worker x failed 4 times")
        assert c._replan_task is not None
        await c._replan_task
        assert [d.fresh_generation for d in plane.applied] == [False, True]  # type: ignore[attr-defined]
    asyncio.run(go())


def _asking() -> tuple[list[float], Any]:
    asked: list[float] = []

    def solver(app: Any, node: Any, profiles: Any, demand: float, **kw: Any) -> Plan:
        asked.append(demand)
        return _plan(demand)
    return asked, solver


def test_arrivals_above_what_the_plan_holds_replan_within_the_bin() -> None:
    # The plan holds 10 rps; 1000 arrivals in the bin's first 10.5 s (its window is 10 s) at time
    # scale 2 are ~190 rps: re-plan at once, with no violation yet, for the observed rate (+ slack).
    asked, solver = _asking()

    async def go() -> None:
        c, fe = _controller(solver)
        c.history_rps.extend([10.0] * 4 + [60.0])  # the last bin's 60 rps allows up to 240 rps
        c.bin_start = time.monotonic() - 0.5
        fe.bins["traffic_analysis"].arrivals = 100
        c._check_early()  # half a second is too short to tell a burst from bunched arrivals
        assert c._replan_task is None
        c._arrival_samples.clear()
        c.bin_start = time.monotonic() - 10.5
        fe.bins["traffic_analysis"].arrivals = 1000
        c._check_early()
        assert c._replan_task is not None
        await c._replan_task
        c._check_early()  # once per bin
        assert len(asked) == 1 and c.current.early_replans == 1
        slack = 1.0 + c.node.planner.demand_slack
        assert 150.0 * slack < asked[0] < 210.0 * slack, asked

    asyncio.run(go())


def test_arrivals_the_plan_holds_or_a_switched_off_trigger_do_not_replan() -> None:
    asked, solver = _asking()

    async def go() -> None:
        c, fe = _controller(solver)
        c.bin_start = time.monotonic() - 10.0
        fe.bins["traffic_analysis"].arrivals = 45  # 4.5/s x 2 = 9 rps <= 10 rps
        c._check_early()
        assert c._replan_task is None
        off, fe2 = _controller(solver, rate_trigger=False)
        off.bin_start = time.monotonic() - 1.0
        fe2.bins["traffic_analysis"].arrivals = 100  # 200 rps, but the trigger is off
        off._check_early()
        assert off._replan_task is None and not asked

    asyncio.run(go())


def test_the_rate_trigger_reads_the_recent_window_not_the_whole_bin() -> None:
    # 50 arrivals over the bin's first 50 s (2 rps), then 100 in the last 12 s: the bin's mean
    # (6 rps at time scale 2) is under the plan's 10 rps, the recent window's (~17 rps) is over.
    asked, solver = _asking()

    async def go() -> None:
        c, fe = _controller(solver)
        now = time.monotonic()
        c.bin_start = now - 50.0
        c._arrival_samples = deque([(now - 12.0, 50), (now - 9.0, 60)])
        fe.bins["traffic_analysis"].arrivals = 150
        c._check_early()
        assert c._replan_task is not None
        await c._replan_task
        assert asked and asked[0] > 15.0, asked

    asyncio.run(go())
