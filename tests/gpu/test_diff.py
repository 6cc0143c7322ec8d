"""The per-instance diff: keep / create / replace / remove, ordered make-before-break, and
instances in the way drained first; GPUs without a change get no step."""

from __future__ import annotations

from jigsaw.gpu.diff import Action, diff
from jigsaw.gpu.layout import NodeInstance, NodeLayout
from jigsaw.mig import GPU_MODELS

H100 = GPU_MODELS["H100-80GB"]


def inst(gpu, profile, start, variant="v", mps=1, app="a", task="t", **kw) -> NodeInstance:
    return NodeInstance(gpu, profile, start, app, task, variant, mps, **kw)


def layout(*instances) -> NodeLayout:
    return NodeLayout(H100.name, 2, tuple(instances))


def names(plan):
    return [(s.action.value, s.instance.name if s.instance else None) for s in plan.steps]


def test_same_layout_is_one_routing_step_and_keeps_runtime_facts():
    running = layout(inst(0, "3g.40gb", 0, uuid="MIG-a", pids=(11, 12)),
                     inst(1, "7g.80gb", 0, uuid="MIG-b", pids=(13,)))
    desired = layout(inst(0, "3g.40gb", 0), inst(1, "7g.80gb", 0))
    plan = diff(running, desired, H100)
    assert [s.action for s in plan.steps] == [Action.ROUTE]
    assert plan.is_noop and plan.nvml_gpus == () and plan.changed_gpus == ()
    assert {(i.uuid, i.pids) for i in plan.keep} == {("MIG-a", (11, 12)), ("MIG-b", (13,))}
    assert plan.summary()["started"] == 0 and plan.summary()["kept"] == 2


def test_create_on_free_slots_comes_first_and_removes_last():
    running = layout(inst(0, "3g.40gb", 0, "old"), inst(1, "7g.80gb", 0, "stay"))
    desired = layout(inst(0, "3g.40gb", 4, "new", mps=2), inst(1, "7g.80gb", 0, "stay"))
    plan = diff(running, desired, H100)
    a, b = "gpu0/3g.40gb@4:a/t/newx2", "gpu0/3g.40gb@0:a/t/oldx1"
    assert names(plan) == [("create_mig", a), ("start_mps", a), ("start_processes", a), ("wait_warm", a),
                           ("route", None),
                           ("drain", b), ("stop_processes", b), ("destroy_mig", b)]
    assert plan.changed_gpus == (0,) and plan.nvml_gpus == (0,)  # GPU 1 is untouched
    assert plan.drained_first == ()
    final = plan.steps[4].active
    assert {i.variant for i in final.instances} == {"new", "stay"}


def test_no_free_slots_drains_the_instances_in_the_way_first():
    # GPU 0 full (4g@0 + 3g@4); the 4g becomes two 2g: the 4g must go before they can be made
    running = layout(inst(0, "4g.40gb", 0, "big"), inst(0, "3g.40gb", 4, "keep"),
                     inst(1, "1g.10gb", 0, "other"))
    desired = layout(inst(0, "2g.20gb", 0, "x"), inst(0, "2g.20gb", 2, "y"), inst(0, "3g.40gb", 4, "keep"),
                     inst(1, "1g.10gb", 0, "other"))
    plan = diff(running, desired, H100)
    big, x, y = "gpu0/4g.40gb@0:a/t/bigx1", "gpu0/2g.20gb@0:a/t/xx1", "gpu0/2g.20gb@2:a/t/yx1"
    assert names(plan) == [("route", None), ("drain", big), ("stop_processes", big), ("destroy_mig", big),
                           ("create_mig", x), ("start_processes", x), ("wait_warm", x),
                           ("create_mig", y), ("start_processes", y), ("wait_warm", y), ("route", None)]
    interim = plan.steps[0].active
    assert {i.variant for i in interim.instances} == {"keep", "other"}  # the rest of the node serves
    assert [i.variant for i in plan.drained_first] == ["big"]
    assert plan.nvml_gpus == (0,)


def test_compute_limit_also_blocks():
    # 7 x 1g at slots 0..6 use all 7 compute slices; a 1g.20gb at 6 needs slot 6 and 7
    running = layout(*(inst(0, "1g.10gb", s, f"v{s}") for s in range(7)))
    desired = layout(*(inst(0, "1g.10gb", s, f"v{s}") for s in range(6)), inst(0, "1g.20gb", 6, "w"))
    plan = diff(running, desired, H100)
    assert [i.variant for i in plan.drained_first] == ["v6"]
    assert [s.action for s in plan.steps][:4] == [Action.ROUTE, Action.DRAIN, Action.STOP_PROCESSES,
                                                   Action.DESTROY_MIG]
    assert len(plan.keep) == 6


def test_a_swap_in_the_same_mig_instance_needs_no_nvml():
    running = layout(inst(0, "3g.40gb", 0, "b0", mps=2, uuid="MIG-a", pids=(1, 2)), inst(1, "1g.10gb", 0))
    desired = layout(inst(0, "3g.40gb", 0, "b7", mps=3), inst(1, "1g.10gb", 0))
    plan = diff(running, desired, H100)
    old, new = "gpu0/3g.40gb@0:a/t/b0x2", "gpu0/3g.40gb@0:a/t/b7x3"
    assert names(plan) == [("route", None), ("drain", old), ("stop_processes", old), ("stop_mps", old),
                           ("start_mps", new), ("start_processes", new), ("wait_warm", new), ("route", None)]
    assert plan.nvml_gpus == ()
    assert plan.replace[0][1].uuid == "MIG-a" and plan.replace[0][1].pids == ()


def test_other_apps_instances_on_a_changed_gpu_are_kept():
    running = layout(inst(0, "3g.40gb", 0, app="a", pids=(5,)), inst(0, "3g.40gb", 4, app="b", pids=(6,)))
    desired = layout(inst(0, "3g.40gb", 0, app="a", pids=(5,)), inst(0, "2g.20gb", 4, app="c"))
    plan = diff(running, desired, H100)
    touched = {s.instance.slot for s in plan.steps if s.instance}
    assert (0, 0, "3g.40gb") not in touched
    assert [k.pids for k in plan.keep] == [(5,)]


def test_idle_instances_are_destroyed_or_filled_without_process_steps():
    running = layout(inst(0, "3g.40gb", 0, app="", task="", variant="", uuid="MIG-i"),
                     inst(1, "7g.80gb", 0, app="", task="", variant=""))
    desired = layout(inst(0, "3g.40gb", 0, "v"))
    plan = diff(running, desired, H100)
    assert [(a, n) for a, n in names(plan)] == [
        ("start_processes", "gpu0/3g.40gb@0:a/t/vx1"), ("wait_warm", "gpu0/3g.40gb@0:a/t/vx1"),
        ("route", None), ("destroy_mig", "gpu1/7g.80gb@0:idle")]
