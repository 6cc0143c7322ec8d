"""The interim plan of a drain-first re-plan: the running plan less the instances in the way."""

from __future__ import annotations

from jigsaw.mig import gpu_model
from jigsaw.plan import GpuLayout, LanePlan, Layout, PlacedInstance, Plan, PlanInstance, with_placed
from jigsaw.runtime.generations import interim_plan, two_step_split, without_instances


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


# the two-step drain-first: a full GPU of 1g.10gb instances (a at start 0, b at 1-6) moves to three
# 2g.20gb instances of b (starts 0, 2, 4) and a at start 6, b's running MIG instance there
def _tiny(placed: list[tuple[str, str, int]], lanes_rps: float = 100.0) -> Plan:
    kinds: dict[tuple[str, str], int] = {}
    gpus = []
    for task, profile, start in placed:
        gpus.append(PlacedInstance(profile, start, task, f"{task}-v", kinds.get((task, profile), 0)))
        kinds[(task, profile)] = kinds.get((task, profile), 0) + 1
    inst = [PlanInstance(t, f"{t}-v", p, 1, 1, n, 1.0, 50.0, int(p[0])) for (t, p), n in kinds.items()]
    return Plan("tiny", "ast", lanes_rps, lanes_rps, True, False, "optimal", 0.0, 1.0, 7, 7, 0.1, 0.0, inst,
                [LanePlan({"a": "a-v", "b": "b-v"}, lanes_rps)], {"a": 1.0, "b": 2.0},
                Layout("H100-80GB", (GpuLayout(0, tuple(gpus)),)))


OLD = [("a", "1g.10gb", 0)] + [("b", "1g.10gb", s) for s in range(1, 7)]
NEW = [("b", "2g.20gb", 0), ("b", "2g.20gb", 2), ("b", "2g.20gb", 4), ("a", "1g.10gb", 6)]
IN_WAY = {(0, s) for s in range(6)}  # b at 6 is the MIG instance a moves to: not in the way


def test_with_placed_adds_the_new_instances_after_the_running_ones() -> None:
    old, new = _tiny(OLD[:3], 60.0), _tiny(NEW, 300.0)
    mixed = with_placed(old, new, {(0, 4), (0, 6)})
    assert mixed is not None and mixed.layout is not None
    placed = [(p.start, p.task, p.profile, p.index) for p in mixed.layout.gpus[0].instances]
    assert placed == [(0, "a", "1g.10gb", 0), (1, "b", "1g.10gb", 0), (2, "b", "1g.10gb", 1),
                      (4, "b", "2g.20gb", 0), (6, "a", "1g.10gb", 1)]  # a's new one numbered after
    assert sorted((i.task, i.mig_profile, i.count) for i in mixed.instances) == \
        [("a", "1g.10gb", 2), ("b", "1g.10gb", 2), ("b", "2g.20gb", 1)]
    assert [(lp.variants, lp.rate_rps) for lp in mixed.lanes] == [({"a": "a-v", "b": "b-v"}, 360.0)]
    assert mixed.task_latency_ms == {"a": 1.0, "b": 2.0}


def test_a_drain_that_would_leave_no_lane_splits_in_two_that_each_leave_one() -> None:
    gpu = gpu_model("H100-80GB")
    old, new = _tiny(OLD), _tiny(NEW)
    assert without_instances(old, IN_WAY) is None  # a's only instance is in the way
    first, kept = two_step_split(gpu, old, new, IN_WAY)  # type: ignore[misc]
    assert kept == {(0, 0)} and first == IN_WAY - kept  # a serves while b's five drain
    mid = interim_plan(gpu, old, new, IN_WAY, kept)
    assert mid is not None and mid.layout is not None
    placed = sorted((p.start, p.task, p.profile) for p in mid.layout.gpus[0].instances)
    # the 2g.20gb at 0 waits for a's drain; a's new process runs beside b's on the instance at 6
    assert placed == [(2, "b", "2g.20gb"), (4, "b", "2g.20gb"), (6, "a", "1g.10gb"), (6, "b", "1g.10gb")]
    # a split needs a lane in both steps: with b at 6 in the way too, keeping a alone would leave
    # no b in the first step, so b at 1 is kept with it
    every = {(0, s) for s in range(7)}
    first2, kept2 = two_step_split(gpu, old, new, every)  # type: ignore[misc]
    assert kept2 == {(0, 0), (0, 1)} and first2 == every - kept2
    assert two_step_split(gpu, old, new, IN_WAY, max_kept=0) is None
    only_a = _tiny([("a", "1g.10gb", 0), ("b", "1g.10gb", 1)])
    assert two_step_split(gpu, only_a, _tiny([("b", "2g.20gb", 0), ("a", "1g.10gb", 2)]),
                          {(0, 0), (0, 1)}) is None  # one instance of each: nothing can serve meanwhile
