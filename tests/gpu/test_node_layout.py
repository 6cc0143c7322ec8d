"""One layout for the node: the three example apps planned and laid out together never overlap."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from jigsaw.gpu.layout import (
    NodeInstance,
    NodeLayout,
    empty_layout,
    from_app_layouts,
    place_app,
    validate_node_layout,
)
from jigsaw.mig import GPU_MODELS, GpuModel
from jigsaw.node import load_node, load_node_profiles
from jigsaw.planner.milp import plan
from jigsaw.planner.packer import InstanceRequest, PackingError, instances_from_plan, pack
from jigsaw.runtime.gpus import placements

ROOT = Path(__file__).resolve().parents[2]
H100 = GPU_MODELS["H100-80GB"]


def overlaps(layout: NodeLayout, gpu: GpuModel) -> list[str]:
    """A second checker, by slot sets, sharing no code with validate_node_layout."""
    bad = []
    for g in range(layout.num_gpus):
        taken: dict[int, str] = {}
        compute = 0
        shared: set[tuple[str, int]] = set()
        for i in layout.on_gpu(g):
            p = gpu.profile(i.profile)
            if p.host:  # a share of a MIG instance (``mig_shares``): the instance holds the slots once
                if (i.profile, i.start) in shared:
                    continue
                shared.add((i.profile, i.start))
            compute += p.compute_slices
            if i.start not in p.starts:
                bad.append(f"{i.name}: bad start")
            for s in range(i.start, i.start + p.size):
                if s in taken or s >= 8:
                    bad.append(f"{i.name} overlaps {taken.get(s)}")
                taken[s] = i.name
        if compute > 7:
            bad.append(f"GPU {g}: {compute} compute slices")
    return bad


def kinds(instances) -> Counter:
    return Counter((i.task, i.variant, i.profile, i.mps, i.max_batch) for i in instances)


@pytest.fixture(scope="module")
def example_plans():
    node = load_node(ROOT / "examples" / "h100x4.toml")
    profiles = load_node_profiles(node)
    demands = {"social_media": 120.0, "traffic_analysis": 60.0, "ar_assistant": 30.0}
    return node, {a.name: plan(a, node, profiles, demands[a.name], time_limit_s=5.0, solver="highs")
                  for a in node.apps}


def test_three_example_apps_share_the_node_without_overlap(example_plans):
    node, plans = example_plans
    assert len(plans) == 3
    # each app's own packer, planned as if it owned the node, puts them on the same slots
    separate = {name: pack(instances_from_plan(p), node.gpu, node.num_gpus) for name, p in plans.items()}
    naive = from_app_layouts(node.gpu.name, node.num_gpus, separate)
    assert overlaps(naive, node.gpu), "the apps' separate layouts were expected to collide"

    layout = empty_layout(node.gpu, node.num_gpus)
    for name, p in plans.items():
        layout = place_app(layout, name, instances_from_plan(p), node.gpu)
    assert validate_node_layout(layout, node.gpu) == []
    assert overlaps(layout, node.gpu) == []
    assert set(layout.apps) == set(plans)
    for name, p in plans.items():
        assert kinds(layout.of_app(name)) == kinds(
            NodeInstance(0, r.profile, 0, name, r.task, r.variant, r.mps, r.max_batch)
            for r in instances_from_plan(p))
        # the per-app view is what the runtime places workers by
        assert len(placements(layout.app_layout(name))) == sum(pi.count for pi in p.instances)
    assert layout.slices_used(node.gpu) == sum(p.slices_used for p in plans.values())


def test_replacing_one_app_leaves_the_others_where_they_are(example_plans):
    node, plans = example_plans
    layout = empty_layout(node.gpu, node.num_gpus)
    for name, p in plans.items():
        layout = place_app(layout, name, instances_from_plan(p), node.gpu)
    again = place_app(layout, "traffic_analysis", instances_from_plan(plans["traffic_analysis"]), node.gpu)
    assert again == layout  # the same plan changes nothing
    smaller = instances_from_plan(plans["traffic_analysis"])[:1]
    after = place_app(layout, "traffic_analysis", smaller, node.gpu)
    for other in ("social_media", "ar_assistant"):
        assert after.of_app(other) == layout.of_app(other)
    assert len(after.of_app("traffic_analysis")) == 1
    assert after.of_app("traffic_analysis")[0] in layout.of_app("traffic_analysis")  # kept in place


def test_an_app_gets_no_more_than_the_others_leave():
    node = empty_layout(H100, 1)
    node = place_app(node, "a", [InstanceRequest("4g.40gb", "t", "v")], H100)
    with pytest.raises(PackingError, match="other apps of the node hold 4 of 7"):
        place_app(node, "b", [InstanceRequest("4g.40gb", "t", "v")], H100)
    # fits in what is left: 3 compute slices, but the placement rules decide where
    node = place_app(node, "b", [InstanceRequest("3g.40gb", "t", "v")], H100)
    assert [(i.app, i.profile, i.start) for i in node.instances] == [("a", "4g.40gb", 0), ("b", "3g.40gb", 4)]
    with pytest.raises(PackingError):
        place_app(node, "c", [InstanceRequest("1g.10gb", "t", "v")], H100)


def test_placement_around_small_instances_of_another_app():
    # a's 1g at slot 1 of GPU 0 and slot 6 of GPU 1 leave room for b's 4g, 3g and 2g only in
    # arrangements that put the 4g on GPU 1 and the 3g at slot 4 of GPU 0
    gpu = H100
    node = NodeLayout(gpu.name, 2, (NodeInstance(0, "1g.10gb", 1, "a", "t", "v"),
                                    NodeInstance(1, "1g.10gb", 6, "a", "t", "v")))
    out = place_app(node, "b", [InstanceRequest("4g.40gb", "t", "v", index=0),
                                InstanceRequest("3g.40gb", "t", "w", index=0),
                                InstanceRequest("2g.20gb", "t", "x", index=0)], gpu)
    assert validate_node_layout(out, gpu) == []
    assert overlaps(out, gpu) == []


def test_new_instances_go_where_they_strand_no_compute():
    """A 1g.20gb instance (2 memory slots, 1 compute slice) beside a 3g.40gb at slot 4: first fit
    puts it on that GPU, whose last 2 slots then hold only 2 of its 3 free compute slices; with
    ``keep_usable`` it goes on the empty GPU, where it strands none, and the node keeps one more
    compute slice usable (and room for a 4g.40gb beside the 3g)."""
    from jigsaw.planner.layouts import usable_compute

    gpu = H100
    node = NodeLayout(gpu.name, 2, (NodeInstance(0, "3g.40gb", 4, "a", "t", "v"),))
    req = [InstanceRequest("1g.20gb", "t", "w")]

    def usable(layout: NodeLayout) -> int:
        return sum(usable_compute(gpu, [(i.profile, i.start) for i in layout.on_gpu(g)])
                   for g in range(layout.num_gpus))

    first = place_app(node, "b", req, gpu)
    kept = place_app(node, "b", req, gpu, keep_usable=True)
    for out in (first, kept):
        assert validate_node_layout(out, gpu) == [] and overlaps(out, gpu) == []
    assert [i.gpu for i in first.of_app("b")] == [0]
    assert [i.gpu for i in kept.of_app("b")] == [1]
    assert (usable(first), usable(kept)) == (2 + 7, 4 + 6)
    placed = place_app(kept, "c", [InstanceRequest("4g.40gb", "t", "x")], gpu, keep_usable=True)
    assert [(i.gpu, i.start) for i in placed.of_app("c")] == [(0, 0)]


@pytest.mark.parametrize("seed", range(25))
def test_random_apps_placed_one_after_another_never_overlap(seed):
    rng = random.Random(seed)
    gpu = GPU_MODELS[rng.choice(["H100-80GB", "A100-40GB"])]
    num_gpus = rng.randint(1, 4)
    layout = empty_layout(gpu, num_gpus)
    names = [p.name for p in gpu.profiles]
    for round_ in range(6):
        app = rng.choice(["a", "b", "c"])
        reqs = [InstanceRequest(rng.choice(names), f"t{k}", "v", rng.randint(1, 4), 1, k)
                for k in range(rng.randint(0, 4))]
        try:
            new = place_app(layout, app, reqs, gpu)
        except PackingError:
            continue  # the others hold too much: the running layout stays
        assert validate_node_layout(new, gpu) == [], (seed, round_)
        assert overlaps(new, gpu) == []
        assert kinds(new.of_app(app)) == kinds(
            NodeInstance(0, r.profile, 0, app, r.task, r.variant, r.mps, r.max_batch) for r in reqs)
        for other in {"a", "b", "c"} - {app}:
            assert new.of_app(other) == layout.of_app(other)
        layout = new


def test_idle_instances_give_way():
    node = NodeLayout(H100.name, 1, (NodeInstance(0, "7g.80gb", 0),))  # adopted, idle
    out = place_app(node, "a", [InstanceRequest("3g.40gb", "t", "v")], H100)
    assert [(i.app, i.profile) for i in out.instances] == [("a", "3g.40gb")]
    adopted = NodeInstance(0, "3g.40gb", 0, uuid="MIG-x")
    keep = place_app(NodeLayout(H100.name, 1, (adopted,)), "a", [InstanceRequest("3g.40gb", "t", "v")], H100)
    assert [(i.app, i.start, i.uuid) for i in keep.instances] == [("a", 0, "MIG-x")]  # reused, no NVML call


def test_where_greedy_fails_the_exact_search_places_it():
    from jigsaw.gpu import layout as layout_mod

    held = NodeLayout(H100.name, 2, (NodeInstance(0, "2g.20gb", 4, "a", "t", "v"),
                                     NodeInstance(1, "1g.10gb+me", 5, "a", "t", "w")))
    reqs = [InstanceRequest("1g.10gb+me", "t", "x", index=0), InstanceRequest("4g.40gb", "t", "y", index=0),
            InstanceRequest("1g.20gb", "t", "z", index=0)]
    assert layout_mod._greedy_against(H100, {0: [("2g.20gb", 4)], 1: [("1g.10gb+me", 5)]}, reqs, 2) is None
    out = place_app(held, "b", reqs, H100)
    assert validate_node_layout(out, H100) == [] and overlaps(out, H100) == []
    want = kinds(NodeInstance(0, r.profile, 0, "b", r.task, r.variant) for r in reqs)
    assert kinds(out.of_app("b")) == want
