"""Lanes the runtime can route: no lane sends requests to a variant the plan does not run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from jigsaw.node import load_node, load_node_profiles
from jigsaw.plan import LanePlan, PlanInstance
from jigsaw.planner.milp import plan
from jigsaw.planner.routes import settle_lanes
from jigsaw.planner.verify import verify_plan

NODE = Path(__file__).resolve().parents[1] / "examples" / "h100x4.toml"


@pytest.fixture(scope="module")
def traffic():
    node = load_node(NODE)
    app = node.app("traffic_analysis")
    profiles = load_node_profiles(node, [app])
    return node, app, profiles, plan(app, node, profiles, 100.0, solver="highs", time_limit_s=30)


def test_verifier_flags_a_lane_to_a_variant_without_instances(traffic) -> None:
    node, app, profiles, p = traffic
    assert verify_plan(p, app, node, profiles) == []
    run = {(x.task, x.variant) for x in p.instances}
    idle = next(v.name for v in app.task("detect").variants if ("detect", v.name) not in run)
    first = p.lanes[0]
    # round-off on a lane to a detector variant with no instance: within every capacity
    # tolerance, but the runtime cannot route it
    stray = LanePlan(dict(first.variants, detect=idle), 1e-8)
    bad = dataclasses.replace(p, lanes=[LanePlan(first.variants, first.rate_rps - 1e-8), stray, *p.lanes[1:]])
    problems = verify_plan(bad, app, node, profiles)
    assert any(f"sends detect to variant {idle!r}, which the plan does not run" in x for x in problems)
    settled = settle_lanes(app, bad.lanes, bad.instances)
    assert all(lp.variants["detect"] != idle for lp in settled)
    assert sum(lp.rate_rps for lp in settled) == pytest.approx(p.planned_rps, rel=1e-12)
    assert verify_plan(dataclasses.replace(bad, lanes=settled), app, node, profiles) == []


def test_more_than_round_off_on_such_a_lane_is_left_for_the_verifier(traffic) -> None:
    _, app, _, p = traffic
    run = {(x.task, x.variant) for x in p.instances}
    idle = next(v.name for v in app.task("detect").variants if ("detect", v.name) not in run)
    lanes = [LanePlan(dict(p.lanes[0].variants, detect=idle), 10.0), *p.lanes]
    assert settle_lanes(app, lanes, p.instances) == lanes


def test_a_task_no_request_reaches_is_routed_to_a_variant_that_runs() -> None:
    node = load_node(NODE)
    app = node.app("traffic_analysis")
    inst = [PlanInstance("detect", "yolov5m", "1g.10gb", 1, 1, 1, 10.0, 100.0, 1),
            PlanInstance("car", "efficientnet-b0", "1g.10gb", 1, 1, 1, 10.0, 100.0, 1),
            PlanInstance("person", "vgg11", "1g.10gb", 1, 1, 1, 10.0, 100.0, 1)]
    factors = {("detect", "yolov5m", "person"): 0.0}  # measured: no person in these frames
    lanes = [LanePlan({"detect": "yolov5m", "car": "efficientnet-b0", "person": "vgg19"}, 3.0),
             LanePlan({"detect": "yolov5m", "car": "efficientnet-b0", "person": "vgg11"}, 2.0)]
    settled = settle_lanes(app, lanes, inst, factors)
    assert settled == [LanePlan({"detect": "yolov5m", "car": "efficientnet-b0", "person": "vgg11"}, 5.0)]
    # without the measured factor the person task is reached: vgg19 would carry requests, and
    # the lane (a broken plan, not round-off) stays for the verifier to report
    assert settle_lanes(app, lanes, inst) == lanes

