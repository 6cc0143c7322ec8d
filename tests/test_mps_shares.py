"""MPS shares of a whole GPU (``jigsaw.shares``): processes of different (task, variant)s on one
GPU, planned, packed, verified; the homogeneous plan stays a special case; a plan that serves
nothing says why. On the example nodes of GPUs given by their figures (L4, A10) and one H200."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest

from jigsaw.errors import JigsawError
from jigsaw.mig import share_level, whole_gpu_model
from jigsaw.node import load_node, load_node_profiles
from jigsaw.plan import LanePlan, Plan, PlanInstance
from jigsaw.planner.layouts import fits_on_gpu, placement_violations
from jigsaw.planner.milp import capacity, plan
from jigsaw.planner.verify import verify_plan
from jigsaw.profiles import ProfileRow, ProfileTable
from jigsaw.shares import SHARE_INTERFERENCE, with_share_rows

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _no_shares(path: Path, tmp_path: Path) -> Path:
    """The example node with MPS shares off (only whole-GPU segments of one (task, variant))."""
    text = path.read_text().replace("[gpus]\n", "[gpus]\nmps_shares = 0\n")
    text = text.replace('"apps/', f'"{EXAMPLES}/apps/')
    text = text.replace('"../profiles', f'"{EXAMPLES.parent}/profiles')
    out = tmp_path / path.name
    out.write_text(text)
    return out


def test_a_gpu_given_by_its_figures_is_split_into_mps_shares() -> None:
    node = load_node(EXAMPLES / "l4x2.toml")
    gpu = node.gpu
    figures = (gpu.name, gpu.memory_gb, gpu.sm_count, gpu.fp16_tflops, gpu.memory_tb_s)
    assert figures == ("L4", 24, 58, 121, 0.3)
    assert gpu.profile_names == ("gpu", "gpu-1of4") and node.slices_available == 8
    share = gpu.profile("gpu-1of4")
    assert share.share_of == 4 and share.memory_gb == 6 and share.starts == (0, 2, 4, 6)
    # four shares fit a GPU; a fifth, or a share beside the GPU used as one segment, do not
    assert fits_on_gpu(gpu, ["gpu-1of4"] * 4) is not None
    assert fits_on_gpu(gpu, ["gpu-1of4"] * 5) is None and fits_on_gpu(gpu, ["gpu", "gpu-1of4"]) is None
    assert placement_violations(gpu, [("gpu", 0), ("gpu-1of4", 2)])
    with pytest.raises(ValueError, match="2, 4 or 8"):
        whole_gpu_model("X", 16, 40, shares=3)


def test_share_rows_come_from_the_level_k_rows_and_measured_ones_are_kept() -> None:
    gpu = whole_gpu_model("L4", 24, 58, shares=4)
    quad = ProfileRow("v", "gpu", 4, 8, 30.0, 800.0, 900.0, "modeled")
    solo = ProfileRow("v", "gpu", 1, 8, 10.0, 700.0, 900.0, "modeled")
    table = with_share_rows(ProfileTable([quad, solo]), gpu)
    row = table.get("v", "gpu-1of4", 1, 8)
    # a quarter of the level-4 segment, slowed by the stated interference of unlike neighbours
    assert row.throughput_rps == pytest.approx(200.0 * SHARE_INTERFERENCE, abs=1e-3)
    assert row.latency_ms == pytest.approx(30.0 / SHARE_INTERFERENCE, abs=1e-4) and row.memory_mb == 900.0
    measured = ProfileRow("v", "gpu-1of4", 1, 8, 25.0, 260.0, 900.0, "measured")
    table = with_share_rows(ProfileTable([quad, measured]), gpu)
    assert table.get("v", "gpu-1of4", 1, 8) == measured
    unshared = with_share_rows(ProfileTable([quad]), whole_gpu_model("L4", 24, 58))
    assert unshared.get("v", "gpu-1of4", 1, 8) is None


def test_three_tasks_share_two_l4s_and_the_plan_verifies() -> None:
    node = load_node(EXAMPLES / "l4x2.toml")
    app = node.app("voice_intent")
    profiles = load_node_profiles(node)
    result = plan(app, node, profiles, 200.0)
    assert result.feasible and result.planned_rps == pytest.approx(200.0)
    assert verify_plan(result, app, node, profiles) == []
    tasks_on: dict[int, set[str]] = defaultdict(set)
    for g in result.layout.gpus:
        for p in g.instances:
            tasks_on[g.gpu].add(p.task)
        assert not placement_violations(node.gpu, [(p.profile, p.start) for p in g.instances])
    assert max(len(t) for t in tasks_on.values()) >= 2  # different tasks on one GPU
    assert any(share_level(i.mig_profile) for i in result.instances)


def test_without_shares_the_same_node_serves_nothing_and_says_why(tmp_path: Path) -> None:
    node = load_node(_no_shares(EXAMPLES / "l4x2.toml", tmp_path))
    app = node.app("voice_intent")
    result = plan(app, node, load_node_profiles(node), 100.0)
    assert result.planned_rps == 0 and not result.instances and result.status == "infeasible"
    note = " ".join(result.notes)
    assert "3 tasks need one segment each" in note and "the node has 2" in note and "mps_shares" in note


def test_a_task_over_its_latency_budget_is_named(tmp_path: Path) -> None:
    node = load_node(EXAMPLES / "l4x2.toml")
    app = replace(node.app("voice_intent"), latency_slo_ms=60.0)
    result = plan(app, node, load_node_profiles(node), 10.0)
    assert result.planned_rps == 0
    assert "task 'asr' found no segment: its fastest, git-base on" in result.notes[0]


def test_shares_never_lower_a_nodes_capacity(tmp_path: Path) -> None:
    """The GPU used as one segment is still a choice: the capacity with shares is at least the
    capacity without (on 4 L4s, where both serve)."""
    base = EXAMPLES / "l4x2.toml"
    four = tmp_path / "l4x4.toml"
    four.write_text(base.read_text().replace("count = 2", "count = 4").replace(
        '"apps/', f'"{EXAMPLES}/apps/').replace('"../profiles', f'"{EXAMPLES.parent}/profiles'))
    (tmp_path / "alone").mkdir()
    shared, alone = load_node(four), load_node(_no_shares(four, tmp_path / "alone"))
    app = shared.app("voice_intent")
    with_shares = capacity(app, shared, load_node_profiles(shared)).max_demand_rps
    without = capacity(app, alone, load_node_profiles(alone)).max_demand_rps
    assert without > 0 and with_shares >= without * (1 - 1e-6)


def test_jigsawd_refuses_a_plan_that_serves_nothing() -> None:
    from jigsaw.daemon import _refuse_unserving

    app = load_node(EXAMPLES / "l4x2.toml").app("voice_intent")
    lane = LanePlan({"vad": "efficientnet-b0", "asr": "git-base", "intent": "resnet18"}, 10.0)
    inst = [PlanInstance("vad", "efficientnet-b0", "gpu-1of4", 1, 8, 1, 20.0, 400.0, 1),
            PlanInstance("asr", "git-base", "gpu-1of4", 1, 8, 1, 200.0, 60.0, 1)]
    p = Plan("voice_intent", "ast", 10.0, 10.0, True, False, "optimal", 0.0, 1.0, 2, 8, 0.0, 0.0,
             instances=inst, lanes=[lane], notes=["why"])
    with pytest.raises(JigsawError, match=r"serves nothing: task intent found no segment \(why\)"):
        _refuse_unserving(app, p)
    p.instances.append(PlanInstance("intent", "resnet18", "gpu-1of4", 1, 8, 1, 9.0, 200.0, 1))
    _refuse_unserving(app, p)


def test_a_gpus_array_of_one_group_loads_and_several_are_refused_clearly(tmp_path: Path) -> None:
    from jigsaw.errors import ConfigError

    text = (EXAMPLES / "l4x2.toml").read_text()
    text = text.replace("[gpus]", "[[gpus]]").replace('"apps/', f'"{EXAMPLES}/apps/')
    text = text.replace('"../profiles', f'"{EXAMPLES.parent}/profiles')
    one = tmp_path / "one.toml"
    one.write_text(text)
    node = load_node(one)
    assert node.gpu.name == "L4" and node.num_gpus == 2 and node.slices_available == 8
    two = tmp_path / "two.toml"
    two.write_text(text + '\n[[gpus]]\nmodel = "A100-40GB"\ncount = 2\n')
    with pytest.raises(ConfigError) as err:
        load_node(two)
    assert err.value.field == "gpus" and "2 GPU groups (L4, A100-40GB)" in err.value.message
    assert "--fleet" in err.value.message
