"""A needed plan placed beside everything that runs and drains (``runtime.generations.Beside``):
pure, on a hand-made one-GPU layout."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from jigsaw.gpu.layout import NodeInstance, NodeLayout, place_app, validate_node_layout
from jigsaw.node import load_node
from jigsaw.plan import Plan, PlanInstance
from jigsaw.planner.packer import instances_from_plan
from jigsaw.runtime.generations import DRAINING, Beside

NODE = Path(__file__).resolve().parents[2] / "examples" / "h100x4.toml"
GPU = load_node(NODE).gpu  # H100: 7 compute slices


def _inst(start: int, variant: str, profile: str = "1g.10gb", index: int = 0) -> NodeInstance:
    return NodeInstance(0, profile, start, app="a", task="t", variant=variant, index=index)


def _new_slots(layout: NodeLayout, variant: str) -> set[int]:
    return {i.start for i in layout.instances if i.app == "a" and i.variant == variant}


def _plan(**counts: int) -> Plan:
    """App "a"'s plan: ``counts`` 1g instances of task t per variant."""
    inst = [PlanInstance(task="t", variant=v, mig_profile="1g.10gb", mps=1, max_batch=1, count=n,
                         latency_ms=1.0, throughput_rps=1.0, slices=1) for v, n in counts.items()]
    return Plan(app="a", space="ast", demand_rps=1.0, planned_rps=1.0, feasible=True, max_demand_plan=False,
                status="optimal", objective=0.0, accuracy=1.0, slices_used=sum(counts.values()),
                slices_available=7, solve_seconds=0.0, gap=0.0, instances=inst)


def test_a_plan_placed_beside_keeps_what_runs_and_takes_only_slots_nothing_holds() -> None:
    # serving: a/v on slots 0 and 1 (with max batch 1, as the plan asks); draining: a/u on 2 and 3.
    # Two more v: on the free slots 4-6, never on the draining ones (place_app alone takes them)
    serving = (dataclasses.replace(_inst(0, "v"), max_batch=1),
               dataclasses.replace(_inst(1, "v", index=1), max_batch=1))
    layout = NodeLayout(GPU.name, 1, serving)
    draining = (_inst(2, "u"), _inst(3, "u", index=1))
    stand_ins = (dataclasses.replace(d, app=DRAINING) for d in draining)
    beside = Beside(layout.with_instances((*serving, *stand_ins)), (*serving, *draining), GPU)
    grown = _plan(v=4)
    assert _new_slots(place_app(layout, "a", instances_from_plan(grown), GPU), "v") & {2, 3}
    got = beside.place("a", grown)
    assert got is not None
    placed, plan = got
    assert _new_slots(placed, "v") - {4, 5, 6} == {0, 1} and len(_new_slots(placed, "v")) == 4
    assert not validate_node_layout(placed, GPU)
    assert all(i.app == "a" for i in placed.instances) and plan.layout == placed.app_layout("a")
    # more than the free slots hold, a running instance given up, or one swapped for another
    # workload: not beside (a drain, a drain-first or a restart would be needed)
    assert beside.place("a", _plan(v=6)) is None
    # ... though with the draining slots taken for free it fits: it needs only their drains to end
    got = beside.serving_only().place("a", _plan(v=6))
    assert got is not None and _new_slots(got[0], "v") & {2, 3}
    assert beside.serving_only().place("a", _plan(v=8)) is None  # more than the GPU holds
    assert beside.place("a", _plan(v=1, w=2)) is None
    assert beside.place("a", _plan(w=2)) is None


def test_beside_counts_the_memory_slots_nothing_holds_not_only_the_free_compute_slices() -> None:
    # two 3g.40gb instances (one serving, one a draining stand-in) fill GPU 0's eight memory slots
    # while one of its seven compute slices is free: no MIG instance fits there; GPU 1 holds one
    # 1g.20gb (two memory slots, one compute slice)
    serving = (NodeInstance(0, "3g.40gb", 0, app="a", task="t", variant="v"),
               NodeInstance(1, "1g.20gb", 0, app="a", task="t", variant="v"))
    draining = NodeInstance(0, "3g.40gb", 4, app=DRAINING)
    layout = NodeLayout(GPU.name, 2, (*serving, draining))
    beside = Beside(layout, (*serving, draining), GPU)
    assert 2 * GPU.compute_slices - layout.slices_used(GPU) == 7  # compute slices "free"
    assert beside.free_memory_slots() == 6  # all of them on GPU 1
    assert beside.serving_only().free_memory_slots() == 10  # the draining slots counted free
