"""Lane shift: a request whose drawn lane is backed up takes the lane of the running plan that ends
sooner (``runtime/lanes.py``), checked on the rule alone and on a daemon with emulated latencies."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dpserver import PROFILE_HEADER, Server, http, image

from jigsaw.runtime import stats as st
from jigsaw.runtime.lanes import LaneShape, Stage, backlog_s, choose_lane

# two lanes of one task: lane 0 one process finishing 20 items/s, lane 1 one finishing 1000/s
SHAPE = LaneShape([[[Stage((0,), 20.0)]], [[Stage((1,), 1000.0)]]], [True, True], [0.05, 0.001])
READY = {0: st.READY, 1: st.READY}


def test_backlog_is_queued_items_over_the_lanes_rate() -> None:
    assert backlog_s(SHAPE, 0, {0: 4, 1: 0}.__getitem__) == 4 / 20.0
    two_stages = LaneShape([[[Stage((0,), 10.0), Stage((1, 2), 5.0)], [Stage((3,), 100.0)]]], [True], [0.0])
    queued = {0: 1, 1: 2, 2: 3, 3: 50}.__getitem__
    assert backlog_s(two_stages, 0, queued) == 0.1 + 1.0  # the slowest path counts


def test_the_drawn_lane_is_kept_while_its_backlog_is_within_its_share_of_the_slo() -> None:
    queued = {0: 1, 1: 0}.__getitem__  # 50 ms behind the slow lane: within 0.25 x (300 - 50) ms
    assert choose_lane(0, SHAPE, queued, READY.__getitem__, 0.3) == 0


def test_a_backed_up_lane_shifts_to_the_one_that_ends_sooner() -> None:
    queued = {0: 6, 1: 0}.__getitem__  # 300 ms behind the slow lane
    assert choose_lane(0, SHAPE, queued, READY.__getitem__, 0.3) == 1
    # not to a lane that is further behind still, nor to one whose processes are dead or not running
    behind = {0: 6, 1: 1000}.__getitem__
    assert choose_lane(0, SHAPE, behind, READY.__getitem__, 0.3) == 0
    dead = {0: st.READY, 1: st.FAILED}
    assert choose_lane(0, SHAPE, queued, dead.__getitem__, 0.3) == 0
    idle = LaneShape(SHAPE.lanes, [True, False], SHAPE.min_path_s)
    assert choose_lane(0, idle, queued, READY.__getitem__, 0.3) == 0


def _two_lane_node(tmp_path: Path, lane_shift: bool) -> list[str]:
    """One task with a slow variant (50 ms a batch of 1) planned for 90% of the rate and a fast one
    (1 ms) for 10%; SLO 300 ms."""
    d = tmp_path / f"lanes-{lane_shift}"
    (d / "profiles").mkdir(parents=True)
    rows = [PROFILE_HEADER]
    for v, ms in (("a-slow", 50.0), ("a-fast", 1.0)):
        rows.append(f"{v},1g.10gb,1,1,{ms},{1000.0 / ms:.3f},100,modeled,,,\n")
    (d / "profiles" / "p.csv").write_text("".join(rows))
    (d / "app.toml").write_text("\n".join([
        'name = "lanes"', "latency_slo_ms = 300", "staleness_ms = 1000",
        "[[inputs]]", 'name = "image"', 'datatype = "UINT8"', "shape = [-1]",
        "[[tasks]]", 'name = "a"', 'kind = "classifier"',
        'variants = [{ name = "a-slow", accuracy = 1.0 }, { name = "a-fast", accuracy = 0.5 }]']) + "\n")
    (d / "node.toml").write_text("\n".join([
        'name = "lanes-node"', 'apps = ["app.toml"]', "[gpus]", 'model = "H100-80GB"', "count = 1",
        "mps_levels = [1]", "batch_sizes = [1]", 'profiles_dir = "profiles"', 'backend = "emulated"',
        "[planner]", "hop_latency_ms = 0", "[server]", f"lane_shift = {str(lane_shift).lower()}"]) + "\n")
    instances = [{"task": "a", "variant": v, "mig_profile": "1g.10gb", "mps": 1, "max_batch": 1, "count": 1,
                  "latency_ms": ms, "throughput_rps": 1000.0 / ms, "slices": 1}
                 for v, ms in (("a-slow", 50.0), ("a-fast", 1.0))]
    plan = {"app": "lanes", "space": "ast", "demand_rps": 20.0, "planned_rps": 20.0, "feasible": True,
            "max_demand_plan": False, "status": "optimal", "objective": 0.0, "accuracy": 0.95,
            "slices_used": 2, "slices_available": 7, "solve_seconds": 0.0, "gap": 0.0,
            "instances": instances, "task_latency_ms": {"a": 50.0},
            "lanes": [{"variants": {"a": "a-slow"}, "rate_rps": 18.0},
                      {"variants": {"a": "a-fast"}, "rate_rps": 2.0}]}
    (d / "plan.json").write_text(json.dumps(plan))
    return ["--node-config", str(d / "node.toml"), "--plan", str(d / "plan.json")]


def _burst(url: str, n: int) -> list[tuple[int, dict]]:
    with ThreadPoolExecutor(n) as pool:
        got = list(pool.map(lambda _: http("POST", f"{url}/v2/models/lanes/infer", image(4), timeout_s=30),
                            range(n)))
    return [(status, doc) for status, doc, _ in got]


def test_a_burst_beyond_the_slow_lane_shifts_to_the_fast_one(tmp_path: Path) -> None:
    """30 requests at once: the slow lane finishes 6 within the SLO; with lane shift the rest take
    the fast lane and every request is answered 200; without it most of them time out."""
    with Server(_two_lane_node(tmp_path, True), tmp_path / "on.log") as s:
        on = _burst(s.url, 30)
        _, metrics, _ = http("GET", f"{s.url}/metrics")
    assert [st for st, _ in on] == [200] * 30, [d for st, d in on if st != 200][:3]
    fast = sum(1 for _, d in on if d["parameters"]["lane.a"] == "a-fast")
    assert fast >= 15
    assert 'jigsaw_inference_lane_shifts_total{app="lanes"}' in metrics
    with Server(_two_lane_node(tmp_path, False), tmp_path / "off.log") as s:
        off = _burst(s.url, 30)
    assert sum(1 for st, _ in off if st != 200) >= 5
