"""The interim plan of a drain-first re-plan: the running plan less the instances in the way."""

from __future__ import annotations

from jigsaw.plan import GpuLayout, LanePlan, Layout, PlacedInstance, Plan, PlanInstance
from jigsaw.runtime.generations import without_instances


def _plan() -> Plan:
    inst = [PlanInstance("detect", "yolov5x", "1g.20gb", 2, 4, 2, 10.0, 50.0, 1),
            PlanInstance("car", "b0", "1g.20gb", 1, 8, 1, 5.0, 80.0, 1),
            PlanInstance("car", "b1", "1g.20gb", 1, 8, 1, 5.0, 80.0, 1)]
    layout = Layout("H100-80GB", (GpuLayout(0, (
        PlacedInstance("1g.20gb", 0, "detect", "yolov5x", 0, 2, 4),
        PlacedInstance("1g.20gb", 2, "car", "b0", 0, 1, 8),
        PlacedInstance("1g.20gb", 4, "detect", "yolov5x", 1, 2, 4),
        PlacedInstance("1g.20gb", 6, "car", "b1", 0, 1, 8))),))
    lanes = [LanePlan({"detect": "yolov5x", "car": "b0"}, 30.0),
             LanePlan({"detect": "yolov5x", "car": "b1"}, 20.0)]
    return Plan("a", "ast", 50, 50, True, False, "optimal", 0.0, 1.0, 4, 7, 0.1, 0.0, inst, lanes,
                {"detect": 10.0, "car": 5.0}, layout)


def test_drops_the_instances_renumbers_and_keeps_the_lanes_that_still_run() -> None:
    mid = without_instances(_plan(), {(0, 0), (0, 6)})
    assert mid is not None and mid.layout is not None
    placed = [(p.start, p.task, p.variant, p.index) for p in mid.layout.gpus[0].instances]
    assert placed == [(2, "car", "b0", 0), (4, "detect", "yolov5x", 0)]  # detect's index 1 -> 0
    assert [(i.variant, i.count) for i in mid.instances] == [("yolov5x", 1), ("b0", 1), ("b1", 0)]
    assert [lp.variants["car"] for lp in mid.lanes] == ["b0"]  # the b1 lane has no process left


def test_none_when_no_lane_is_left() -> None:
    assert without_instances(_plan(), {(0, 0), (0, 4)}) is None  # every lane needs detect
