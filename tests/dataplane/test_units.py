"""The data plane's pure parts: credit splitting, the emulated backend, request validation."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import given
from hypothesis import strategies as hs

from jigsaw.app import App, Task, TensorSpec, Variant
from jigsaw.backends.base import Downstream
from jigsaw.backends.emulated import EmulatedBackend
from jigsaw.runtime.oip import BadRequest, parse_infer_request
from jigsaw.runtime.records import TOTAL_CREDIT, frame, split_credit, unframe


@given(hs.lists(hs.integers(1, 40), min_size=1, max_size=4))
def test_credit_splits_always_sum_back(fanouts):
    # any tree of splits returns exactly TOTAL_CREDIT when every leaf reports
    frontier = [TOTAL_CREDIT]
    for n in fanouts:
        frontier = [share for c in frontier for share in split_credit(c, n)]
        assert all(c > 0 for c in frontier)
    assert sum(frontier) == TOTAL_CREDIT


def test_frame_roundtrip_and_bad_split():
    credit, body = unframe(frame(12345, b"abc"))
    assert credit == 12345 and bytes(body) == b"abc"
    with pytest.raises(ValueError):
        split_credit(3, 4)


def test_emulated_latency_uses_smallest_profiled_batch_at_least_actual():
    b = EmulatedBackend("c", "classifier", latency_ms_by_batch={1: 10.0, 4: 30.0, 8: 50.0})
    assert b.batch_latency_ms(1) == 10.0 and b.batch_latency_ms(2) == 30.0
    assert b.batch_latency_ms(8) == 50.0 and b.batch_latency_ms(20) == 50.0
    fast = EmulatedBackend("c", "classifier", latency_ms_by_batch={1: 40.0}, time_scale=0.5)
    t0 = time.monotonic()
    (r,) = fast.execute([1], [b""])
    assert 0.019 <= time.monotonic() - t0 < 0.1
    assert [t.name for t in r.outputs] == ["label", "score"]


def test_emulated_detector_children_follow_factor():
    d = EmulatedBackend("det", "detector", [Downstream("car", 17.8), Downstream("person", 1.0)],
                        latency_ms_by_batch={1: 0.0})
    results = d.execute(list(range(400)), [b""] * 400)
    cars = [len(r.children["car"]) for r in results]
    assert abs(sum(cars) / len(cars) - 17.8) < 1.0
    assert all(len(r.children["person"]) == 1 for r in results)  # whole factors are exact
    again = d.execute([7], [b""])[0]
    assert len(again.children["car"]) == cars[7]  # seeded by request id


APP = App("m", (Task("t", "generic", (Variant("v", 1.0),)),), (), 100.0,
          inputs=(TensorSpec("x", "FP32", (-1, 2)),))


def test_parse_request_accepts_wildcards_and_flattens():
    r = parse_infer_request(b'{"id": "q", "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2],'
                            b' "data": [[1, 2], [3, 4.5]]}]}', APP)
    assert r.id == "q" and r.inputs[0][2] == (2, 2)
    assert r.inputs[0][3].shape == (2, 2) and r.inputs[0][3].reshape(-1).tolist() == [1, 2, 3, 4.5]


X = b'{"inputs": [{"name": "x", '


@pytest.mark.parametrize(("body", "field"), [
    (b"nope", "body"),
    (b'{"inputs": {}}', "inputs"),
    (b'{"inputs": [{"name": "y", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}', "inputs[0].name"),
    (X + b'"datatype": "INT8", "shape": [1, 2], "data": [1, 2]}]}', "inputs[0].datatype"),
    (X + b'"datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}', "inputs[0].shape"),
    (X + b'"datatype": "FP32", "shape": [1, 2], "data": [1]}]}', "inputs[0].data"),
    (X + b'"datatype": "FP32", "shape": [1, 2], "data": [1, "a"]}]}', "inputs[0].data"),
    (X + b'"datatype": "FP32", "shape": [1, -2], "data": []}]}', "inputs[0].shape"),
])
def test_parse_request_names_the_bad_field(body, field):
    with pytest.raises(BadRequest, match=f"^{field.replace('[', '.').replace(']', '.')}"):
        parse_infer_request(body, APP)


def test_emulated_batch_time_has_the_profiles_mean_and_p95():
    b = EmulatedBackend("t", "classifier", latency_ms_by_batch={1: 10.0, 4: 30.0},
                        mean_ms_by_batch={1: 9.0, 4: 27.0}, seed=3)
    draws = sorted(b.batch_duration_ms(3) for _ in range(20000))
    assert sum(draws) / len(draws) == pytest.approx(27.0, rel=0.02)
    assert draws[int(0.95 * len(draws))] == pytest.approx(30.0, rel=0.03)
    assert draws[0] >= 27.0 - (30.0 - 27.0) / (math.log(20.0) - 1.0) - 1e-9
    fixed = EmulatedBackend("t", "classifier", latency_ms_by_batch={1: 10.0})
    assert fixed.batch_duration_ms(1) == 10.0  # without a mean it sleeps the p95


def test_admission_limit_is_capacity_times_the_slos_queueing_share():
    from jigsaw.plan import Plan, PlanInstance
    from jigsaw.runtime.frontend import admission_limit
    from jigsaw.runtime.topology import AppRoutes

    app = App("x", (Task("a", "classifier", (Variant("v", 1.0),)),), (), latency_slo_ms=200.0,
              inputs=(TensorSpec("image", "UINT8", (-1,)),))
    plan = Plan(app="x", space="ast", demand_rps=300, planned_rps=300, feasible=True, max_demand_plan=False,
                status="optimal", objective=0.0, accuracy=1.0, slices_used=2, slices_available=7,
                solve_seconds=0.0, gap=0.0,
                instances=[PlanInstance("a", "v", "1g.10gb", 1, 8, 2, 40.0, 200.0, 1)],
                task_latency_ms={"a": 40.0})
    routes = AppRoutes(app=app, app_index=0, lanes=[{"a": "v"}], lane_weights=[1.0], roots=[{}],
                       depth=1, slices=2, plan=plan)
    # 2 instances x 200 req/s, and 200 - 40 ms of the SLO left for queueing: 400 * 0.16 = 64.
    assert admission_limit(routes) == 64
