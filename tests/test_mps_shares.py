"""MPS shares of a whole GPU (``jigsaw.shares``): processes of different (task, variant)s on one
GPU, planned, packed, verified; the homogeneous plan stays a special case; a plan that serves
nothing says why. On the example nodes of GPUs given by their figures (L4, A10) and one H200."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest

from jigsaw.errors import JigsawError
from jigsaw.mig import gpu_share_level, share_level, whole_gpu_model
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


def test_a_gpus_array_of_one_group_loads_as_the_table_does(tmp_path: Path) -> None:
    text = (EXAMPLES / "l4x2.toml").read_text()
    text = text.replace("[gpus]", "[[gpus]]").replace('"apps/', f'"{EXAMPLES}/apps/')
    text = text.replace('"../profiles', f'"{EXAMPLES.parent}/profiles')
    one = tmp_path / "one.toml"
    one.write_text(text)
    node = load_node(one)
    assert node.gpu.name == "L4" and node.num_gpus == 2 and node.slices_available == 8
    table = load_node(EXAMPLES / "l4x2.toml")
    assert not node.is_mixed and node.segment_types == table.segment_types
    assert (node.gpu, node.profiles_dir) == (table.gpu, table.profiles_dir)


def test_jigsaw_modeled_models_a_gpu_from_its_figures(tmp_path: Path) -> None:
    from jigsaw.modeled import main
    from jigsaw.profiles import read_profile_csv

    with pytest.raises(JigsawError, match=r"no modeled figures for 'L4'.*give its sm_count, fp16_tflops"):
        main(["--gpu", "L4", "--memory-gb", "24", "--memory-tb-s", "0.3", "--out", str(tmp_path)])
    args = ["--gpu", "L4", "--memory-gb", "24", "--sm-count", "58", "--fp16-tflops", "121",
            "--memory-tb-s", "0.3", "--variants", "resnet18", "--out", str(tmp_path / "l4")]
    assert main(args) == 0
    rows = read_profile_csv(tmp_path / "l4" / "resnet18.csv")
    assert {r.mig_profile for r in rows} == {"gpu"} and {r.backend for r in rows} == {"modeled-l4"}
    # the A10: a little more FP16 peak over more (slower) SMs, twice the memory bandwidth: faster
    # on a full GPU (one process, the largest batch), slower per SM at batch 1
    assert main([*args[:-4], "--gpu", "A10", "--sm-count", "72", "--fp16-tflops", "125",
                 "--memory-tb-s", "0.6", "--variants", "resnet18", "--out", str(tmp_path / "a10")]) == 0
    a10 = {r.key: r for r in read_profile_csv(tmp_path / "a10" / "resnet18.csv")}
    l4 = {r.key: r for r in rows}
    full, one = ("resnet18", "gpu", 1, 128), ("resnet18", "gpu", 1, 1)
    assert a10[full].throughput_rps > l4[full].throughput_rps
    assert a10[one].latency_ms > l4[one].latency_ms
    # a node file without the figures modeling needs names them
    node = tmp_path / "node.toml"
    node.write_text(f'apps = ["{EXAMPLES}/apps/voice_intent.toml"]\n[gpus]\nmodel = "L40S"\nmig = false\n'
                    'count = 1\nmemory_gb = 48\nsm_count = 142\nprofiles_dir = "p"\nbackend = "torch"\n')
    with pytest.raises(JigsawError, match=r"node.toml: \[gpus\]: give its fp16_tflops, "
                                          r"memory_tb_s"):
        main(["--node", str(node), "--variants", "resnet18"])


@pytest.mark.parametrize("node_file", ["l4x2.toml", "a10x1.toml", "h200x1.toml"])
def test_the_examples_committed_profiles_equal_a_fresh_model_run(node_file: str, tmp_path: Path) -> None:
    """profiles/l4-whole, a10-whole, h200-whole are `jigsaw modeled --node examples/<node>` output."""
    from jigsaw.modeled import main

    node = load_node(EXAMPLES / node_file)
    assert main(["--node", str(EXAMPLES / node_file), "--out", str(tmp_path)]) == 0
    fresh = sorted(p.name for p in tmp_path.glob("*.csv"))
    assert fresh == sorted(p.name for p in node.profiles_dir.glob("*.csv"))
    for name in fresh:
        assert (tmp_path / name).read_bytes() == (node.profiles_dir / name).read_bytes(), (
            f"{name} differs: regenerate with jigsaw modeled --node examples/{node_file}")


def test_a_mig_gpu_without_a_table_is_given_by_its_figures(tmp_path: Path) -> None:
    """An H800 (the H100's MIG geometry and figures under another name): its table from the node
    file, modeled as the H100 is, planned on MIG instances; a known GPU refuses figures."""
    from jigsaw.errors import ConfigError
    from jigsaw.mig import gpu_model
    from jigsaw.modeled import GPU_SPECS, HOST_COPY_GB_S, generate, main

    h100 = gpu_model("H100-80GB")
    node_file = tmp_path / "h800.toml"
    body = (f'apps = ["{EXAMPLES}/apps/voice_intent.toml"]\n[gpus]\nmodel = "H800"\ncount = 1\n'
            "memory_gb = 80\nsm_count = 132\nmig_memory_gb = [10, 20, 40]\n"
            "mig_sm_counts = [16, 32, 60, 64, 132]\nfp16_tflops = 989.4\nmemory_tb_s = 3.35\n"
            'mps_levels = [1, 2]\nbatch_sizes = [1, 8, 32]\nprofiles_dir = "p"\nbackend = "tensorrt"\n')
    node_file.write_text(body)
    node = load_node(node_file)
    # (its smallest instance also shared by 2 processes: the default MIG-instance shares)
    assert node.gpu.mig and tuple(p for p in node.gpu.profiles if not p.host) == h100.profiles
    assert node.slices_available == 7
    assert main(["--node", str(node_file)]) == 0
    table = load_node_profiles(node)
    spec = replace(GPU_SPECS["H100-80GB"], host_copy_gb_s=HOST_COPY_GB_S)  # the figures' default
    same = generate(spec, mps_levels=(1, 2), batch_sizes=(1, 8, 32))["resnet18"]
    for r in same:
        mine = table.get("resnet18", r.mig_profile, r.mps, r.batch)
        assert (mine.latency_ms, mine.throughput_rps, mine.backend) == (r.latency_ms, r.throughput_rps,
                                                                         "modeled-h800")
    result = plan(node.app("voice_intent"), node, table, 50.0)
    # MIG instances (some may be shared by processes of different tasks), never a whole-GPU share
    assert result.feasible and all(not gpu_share_level(i.mig_profile) for i in result.instances)
    node_file.write_text(body.replace('"H800"', '"H100-80GB"'))
    with pytest.raises(ConfigError) as err:
        load_node(node_file)
    assert err.value.field == "gpus.memory_gb" and "MIG table" in err.value.message
    node_file.write_text(body.replace("mig_sm_counts = [16, 32, 60, 64, 132]", "mig_sm_counts = [16]"))
    with pytest.raises(ConfigError, match="1g, 2g, 3g, 4g and 7g"):
        load_node(node_file)


def test_a_replan_that_moves_shares_on_their_gpu_keeps_their_processes(tmp_path: Path) -> None:
    """The start slot of an MPS share is no place on the GPU: a new plan whose shares of a kind lie
    at other starts of the same GPU keeps their processes (``Generation.process_keys``)."""
    from jigsaw.backends.registry import backend_kind
    from jigsaw.plan import GpuLayout, Layout, PlacedInstance
    from jigsaw.runtime.generation import Generation

    node = load_node(EXAMPLES / "l4x2.toml")
    app, profiles = node.app("voice_intent"), load_node_profiles(node)
    base = plan(app, node, profiles, 150.0)

    def laid(starts: dict[tuple[str, int], tuple[int, int]], gid: int) -> Generation:
        gpus: dict[int, list[PlacedInstance]] = defaultdict(list)
        for i in base.instances:
            for n in range(i.count):
                g, s = starts[(i.task, n)]
                gpus[g].append(PlacedInstance(i.mig_profile, s, i.task, i.variant, n, i.mps, i.max_batch))
        p = replace(base, layout=Layout("L4", tuple(GpuLayout(g, tuple(x)) for g, x in sorted(gpus.items()))))
        (tmp_path / str(gid)).mkdir()
        return Generation(gid, node, app, p, profiles, run_dir=tmp_path / str(gid), daemon_id="t",
                          frontend_bell="bell", time_scale=1.0, seed=0, backend=backend_kind("emulated"))

    assert all(share_level(i.mig_profile) for i in base.instances)
    kinds = [(i.task, n) for i in base.instances for n in range(i.count)]
    assert len(kinds) <= 4
    before = {kn: (0, 2 * j) for j, kn in enumerate(kinds)}
    moved = {kn: (0, 6 - 2 * j) for j, kn in enumerate(kinds)}
    other_gpu = {kn: (1, 2 * j) for j, kn in enumerate(kinds)}
    old = laid(before, 1).process_keys()
    assert laid(moved, 2).process_keys() == old
    assert not set(laid(other_gpu, 3).process_keys()) & set(old)
