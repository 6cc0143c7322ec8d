"""A node of several GPU groups (``jigsaw.gpu_groups``): two A100-40GBs with MIG beside two L4s used
whole (``examples/a100x2_l4x2.toml``), loaded, planned as one node with lanes across the groups,
packed and placed per group, partitioned through each group's NVML, and served by jigsawd."""

from __future__ import annotations

import dataclasses
import json
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from jigsaw.errors import ConfigError, JigsawError
from jigsaw.gpu_groups import plain_profile
from jigsaw.mig import share_level
from jigsaw.node import load_node, load_node_profiles
from jigsaw.plan import GpuLayout, Layout, PlacedInstance
from jigsaw.planner.groups import group_layouts, layout_budgets, pack_node
from jigsaw.planner.milp import plan
from jigsaw.planner.packer import InstanceRequest, PackingError, instances_from_plan
from jigsaw.planner.verify import verify_plan

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MIXED = EXAMPLES / "a100x2_l4x2.toml"


@pytest.fixture(scope="module")
def mixed():  # type: ignore[no-untyped-def]
    node = load_node(MIXED)
    return node, load_node_profiles(node)


def _write(tmp_path: Path, extra: str = "", replace: dict[str, str] | None = None) -> Path:
    text = MIXED.read_text()
    for old, new in (replace or {}).items():
        text = text.replace(old, new)
    text = text.replace('"apps/', f'"{EXAMPLES}/apps/')
    text = text.replace('"../profiles', f'"{EXAMPLES.parent}/profiles')
    path = tmp_path / "node.toml"
    path.write_text(text + extra)
    return path


def test_groups_load_numbered_in_file_order_with_qualified_segments(mixed) -> None:  # type: ignore[no-untyped-def]
    node, table = mixed
    a100, l4 = node.gpu_groups
    assert node.is_mixed and node.num_gpus == 4 and (a100.gpus, l4.gpus) == (range(0, 2), range(2, 4))
    assert a100.model.mig and not l4.model.mig and l4.model.name == "L4"
    assert node.slices_available == 2 * 7 + 2 * 4  # the L4 split in 4 MPS shares costs 4 slices
    assert "A100-40GB:3g.20gb" in node.gpu.profile_names and "L4:gpu-1of4" in node.gpu.profile_names
    assert share_level("L4:gpu-1of4") == 4 and plain_profile("A100-40GB:3g.20gb") == "3g.20gb"
    segments = {(s.mig.name, s.mps) for s in node.segment_types}
    assert ("A100-40GB:1g.5gb", 4) in segments and ("L4:gpu-1of4", 1) in segments
    assert ("L4:gpu-1of4", 2) not in segments  # a share is one process
    # each group's rows, under its qualified profiles, at its own batch sizes
    assert {r.mig_profile.partition(":")[0] for r in table.rows()} == {"A100-40GB", "L4"}
    assert max(r.batch for r in table.rows()) == 32


@pytest.mark.parametrize(("extra", "replace", "field", "words"), [
    ('\n[[gpus]]\nmodel = "L4"\nmig = false\ncount = 1\nmemory_gb = 24\nsm_count = 58\nbackend = "torch"\n',
     {}, "gpus[2].name", "two groups are named 'L4'"),
    ("", {'profiles_dir = "../profiles/l4-whole"\nbackend = "torch"':
          'profiles_dir = "../profiles/l4-whole"\nbackend = "onnxruntime"'},
     "gpus[1].backend", "a node runs one backend"),
    ("", {'count = 2\nmemory_gb': 'count = 2\nspeed = 3\nmemory_gb'}, "gpus[1].speed", "unknown field"),
    ("", {'mps_levels = [1, 2, 4]\nbatch_sizes = [1, 2, 4, 8, 16, 32]\nprofiles_dir = "../profiles/a100':
          'mps_levels = [1, 2, 4]\nmig_profiles = ["2g.20gb"]\nbatch_sizes = [1, 2, 4, 8, 16, 32]\n'
          'profiles_dir = "../profiles/a100'}, "gpus[0].mig_profiles[0]", "not in the A100-40GB table"),
    ("", {'model = "A100-40GB"': 'model = "CPU-4C"'}, "gpus[0].model", "a CPU node has one group"),
    ("", {"memory_tb_s = 0.3\nmps_levels = [1, 2, 4]": "memory_tb_s = 0.3\nmps_levels = [0]"},
     "gpus[1].mps_levels", "between 1 and 48"),
])
def test_a_bad_group_names_its_file_and_field(tmp_path: Path, extra: str, replace: dict[str, str], field: str,
                                              words: str) -> None:
    path = _write(tmp_path, extra, replace)
    assert all(old in MIXED.read_text() for old in replace)
    with pytest.raises(ConfigError) as err:
        load_node(path)
    assert err.value.path == str(path) and err.value.field == field and words in err.value.message


def test_a_mixed_node_has_no_one_gpu_count(mixed) -> None:  # type: ignore[no-untyped-def]
    node, _ = mixed
    assert node.with_gpus(4) is node
    with pytest.raises(ConfigError, match="2 GPU groups"):
        node.with_gpus(2)


def test_layouts_and_their_budgets_are_per_group(mixed) -> None:  # type: ignore[no-untyped-def]
    node, _ = mixed
    names = sorted(["A100-40GB:1g.5gb", "A100-40GB:3g.20gb", "L4:gpu", "L4:gpu-1of4"])
    layouts = group_layouts(node, names)
    budgets = layout_budgets(node, layouts)
    assert [n for _, n in budgets] == [2, 2]
    for js, _ in budgets:
        groups = {p.partition(":")[0] for j in js for p, c in layouts[j].items() if c}
        assert len(groups) == 1  # no layout mixes two groups' profiles
    l4 = [layouts[j] for j in budgets[1][0]]
    assert {"L4:gpu": 1, "L4:gpu-1of4": 0} in [{k: v for k, v in lay.items() if k.startswith("L4")}
                                               for lay in l4]


def test_one_plan_crosses_groups_verifies_and_packs_per_group(mixed) -> None:  # type: ignore[no-untyped-def]
    node, table = mixed
    app = node.app("voice_intent")
    p = plan(app, node, table, 2000.0)
    assert p.feasible and p.layout is not None
    assert verify_plan(p, app, node, table) == []
    groups_of = {i.task: {i.mig_profile.partition(":")[0] for i in p.instances if i.task == t}
                 for t in app.task_names for i in p.instances if i.task == t}
    assert set().union(*groups_of.values()) == {"A100-40GB", "L4"}  # both groups serve
    lane = p.lanes[0].variants
    crossing = {g for t in lane for g in groups_of[t]}
    assert len(crossing) == 2  # the lane's tasks run on both groups
    for g in p.layout.gpus:  # every instance on a GPU of its own group
        want = "A100-40GB" if g.gpu < 2 else "L4"
        assert all(x.profile.startswith(want + ":") for x in g.instances)
    # the packer refuses what a group cannot hold, naming the group, though the node has room
    five = [InstanceRequest("L4:gpu", "asr", "git-base", 1, 1, n) for n in range(3)]
    with pytest.raises(PackingError, match="GPU group L4"):
        pack_node(five, node)
    # and keeps a previous layout's GPUs per group
    again = pack_node(instances_from_plan(p), node, p.layout)
    assert again == p.layout


def test_the_verifier_catches_an_instance_on_another_groups_gpu(mixed) -> None:  # type: ignore[no-untyped-def]
    node, table = mixed
    app = node.app("voice_intent")
    p = plan(app, node, table, 300.0)
    assert p.layout is not None
    moved = [GpuLayout(g.gpu + 2 if g.gpu < 2 else g.gpu - 2, g.instances) for g in p.layout.gpus]
    p.layout = Layout(p.layout.gpu_model, tuple(moved))
    problems = verify_plan(p, app, node, table)
    assert any("is not a profile of its group L4" in x for x in problems), problems


def test_place_on_keeps_each_group_on_its_gpus_and_validate_on_checks_it(mixed) -> None:  # type: ignore[no-untyped-def]
    from jigsaw.gpu.groups import place_on, validate_on
    from jigsaw.gpu.layout import NodeInstance, empty_layout

    node, _ = mixed
    start = empty_layout(node.gpu, node.num_gpus)
    reqs = [InstanceRequest("L4:gpu-1of4", "vad", "efficientnet-b0", 1, 8, n) for n in range(5)] + \
        [InstanceRequest("A100-40GB:3g.20gb", "asr", "git-base", 2, 16, n) for n in range(3)]
    laid = place_on(start, "voice_intent", reqs, node.gpu)
    assert validate_on(laid, node.gpu) == []
    by_gpu = Counter((i.gpu, i.profile.partition(":")[0]) for i in laid.instances)
    assert set(by_gpu) <= {(0, "A100-40GB"), (1, "A100-40GB"), (2, "L4"), (3, "L4")}
    assert sum(n for (g, _), n in by_gpu.items() if g >= 2) == 5
    wrong = laid.with_instances([*laid.instances, NodeInstance(gpu=3, profile="A100-40GB:1g.5gb", start=7)])
    assert any("not a profile of GPU 3's group L4" in x for x in validate_on(wrong, node.gpu))
    with pytest.raises(PackingError, match="GPU group L4"):
        place_on(start, "voice_intent", reqs + [InstanceRequest("L4:gpu", "x", "y")] * 2, node.gpu)


def test_the_partition_creates_mig_instances_on_mig_gpus_only(mixed) -> None:  # type: ignore[no-untyped-def]
    from jigsaw.gpu.groups import GroupsApplier, place_on
    from jigsaw.gpu.layout import empty_layout
    from jigsaw.gpu.partition import MigPartition

    node, table = mixed
    p = plan(node.app("voice_intent"), node, table, 2000.0)
    applier = GroupsApplier(node, emulated=True)
    part = MigPartition(node.gpu, node.num_gpus, applier)
    assert part.adopt().instances == ()
    desired = place_on(empty_layout(node.gpu, node.num_gpus), "voice_intent", instances_from_plan(p),
                       node.gpu)
    assert part.bring_up(desired) == ()
    made = part.with_uuids(desired).instances
    assert {i.uuid[:4] for i in made if i.gpu < 2} == {"MIG-"}
    assert {i.uuid[:4] for i in made if i.gpu >= 2} == {"GPU-"}
    created = [c for c in applier.nvml.calls if c[0] == "nvmlDeviceCreateGpuInstanceWithPlacement"]
    assert len(created) == sum(1 for i in made if i.gpu < 2)
    part.tear_down(desired.with_instances([]))
    assert part.existing == {} and applier.adopt(node.num_gpus).instances == ()


def test_workers_see_mig_devices_on_mig_gpus_and_whole_gpus_by_uuid(mixed) -> None:  # type: ignore[no-untyped-def]
    from jigsaw.gpu.emulated_nvml import EmulatedNvml
    from jigsaw.gpu.layout import NodeInstance
    from jigsaw.gpu.nvml import MigApplier
    from jigsaw.runtime.gpus import host_devices

    node, _ = mixed
    group = node.gpu_groups[0]
    nvml = EmulatedNvml(group.model, 4, mig_enabled=[True, True, False, False])
    with MigApplier(group.gpu, nvml) as applier:
        made = applier.create(NodeInstance(gpu=1, profile="A100-40GB:3g.20gb", start=4))
    devices = host_devices(node, nvml)
    assert devices[(1, 4)] == made.uuid and devices[(1, 4)].startswith("MIG-")
    assert devices[(2, 0)].startswith("GPU-") and devices[(3, 0)].startswith("GPU-")
    assert (0, 0) not in devices and (1, 0) not in devices  # MIG GPUs are not handed out whole


def test_jigsaw_plan_pack_and_check_on_the_mixed_example(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from jigsaw.cli import main

    out = tmp_path / "plan.json"
    assert main(["plan", "--app", "voice_intent", "--node", str(MIXED), "--demand", "2000",
                 "--out", str(out)]) == 0
    assert main(["check", str(MIXED)]) == 0
    assert "2x A100-40GB (MIG) + 2x L4 (whole)" in capsys.readouterr().out
    assert main(["pack", "--plan", str(out), "--node", str(MIXED), "--format", "commands"]) == 0
    cmds = capsys.readouterr().out.splitlines()
    assert cmds[0].startswith("# GPUs 2, 3 are used whole")
    assert all(" -i 0 " in c or " -i 1 " in c or c.endswith((" 0", " 1")) for c in cmds[1:])
    assert any("-cgi " in c and ":" not in c.split("-cgi ")[1].split(":")[0] for c in cmds[1:])
    assert main(["capacity", "--app", "voice_intent", "--node", str(MIXED), "--gpus", "2"]) == 2
    assert "2 GPU groups" in capsys.readouterr().err


def test_modeled_writes_each_groups_rows_into_its_profiles_dir(tmp_path: Path) -> None:
    from jigsaw.modeled import main

    with pytest.raises(JigsawError, match="give --group NAME"):
        main(["--node", str(MIXED), "--out", str(tmp_path)])
    with pytest.raises(JigsawError, match="'H100' is not a GPU group"):
        main(["--node", str(MIXED), "--group", "H100", "--out", str(tmp_path)])
    assert main(["--node", str(MIXED), "--group", "A100-40GB", "--out", str(tmp_path)]) == 0
    committed = load_node(MIXED).gpu_groups[0].profiles_dir
    for f in committed.glob("*.csv"):
        assert (tmp_path / f.name).read_bytes() == f.read_bytes(), f"regenerate {committed}"


def test_jigsawd_serves_the_speech_app_across_both_groups(tmp_path: Path) -> None:
    from jigsaw.testing import jigsawd

    with jigsawd(["--node-config", str(MIXED), "--demand", "2000", "--no-controller"],
                 tmp_path / "d.log") as server:
        with urllib.request.urlopen(server.url + "/admin/layout", timeout=10) as r:
            layout = json.load(r)
        on = {(i["gpu"], i["profile"].partition(":")[0]) for i in layout["instances"]}
        assert {g for _, g in on} == {"A100-40GB", "L4"}
        assert all((gpu < 2) == (group == "A100-40GB") for gpu, group in on)
        assert all(i["pids"] for i in layout["instances"])
        calls = layout["mig"]["calls"]
        assert {c[1] for c in calls if c[0] == "nvmlDeviceCreateGpuInstanceWithPlacement"} <= {0, 1}
        body = json.dumps({"inputs": [{"name": "audio", "datatype": "UINT8", "shape": [4],
                                       "data": [1, 2, 3, 4]}]}).encode()
        for _ in range(5):
            req = urllib.request.Request(server.url + "/v2/models/voice_intent/infer", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as r:
                answer = json.load(r)
            assert answer["parameters"]["emulated"] is True
            assert {o["name"] for o in answer["outputs"]} >= {"intent.label", "intent.score"}


def test_the_fleet_planner_takes_a_mixed_node_whole(tmp_path: Path) -> None:
    from jigsaw.fleet.config import load_fleet
    from jigsaw.fleet.planner import plan_fleet

    text = (f'name = "f"\ntime_limit_s = 5.0\nsolver = "highs"\n[[nodes]]\nname = "mixed"\n'
            f'node = "{MIXED}"\ncount = 1\n[[nodes]]\nname = "l4"\nnode = "{EXAMPLES / "l4x2.toml"}"\n'
            'count = 1\n[[apps]]\nname = "voice_intent"\ndemand_rps = 1500\n')
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    result, _ = plan_fleet(load_fleet(path))
    mixed = next(n for n in result.nodes if n.group == "mixed")
    assert result.feasible and mixed.num_gpus == 4 and mixed.slices_available == 22
    assert all(a.gpus == 4 for a in mixed.apps.values())
    # its Kubernetes objects: MIG resources by the GPUs' own profile names, the L4s as whole GPUs
    import yaml

    from jigsaw.fleet.render import manifests, mig_config_name

    objs = manifests(load_fleet(path), result)
    mig = yaml.safe_load(objs["mig-parted-config.yaml"][0]["data"]["config.yaml"])["mig-configs"]
    devices = mig[mig_config_name(mixed.name)]
    assert {x for d in devices for x in d["devices"]} <= {0, 1}
    names = {p for d in devices for p in d.get("mig-devices") or {}}
    assert names and all(":" not in p and not p.startswith("gpu") for p in names)
    pods = [o for o in objs[f"nodes/{mixed.name}.yaml"] if o.get("kind") in ("Pod", "Deployment")]
    asked = json.dumps(pods)
    assert "nvidia.com/mig-A100" not in asked and ("nvidia.com/mig-" in asked or "nvidia.com/gpu" in asked)
    # a MIG instance shared by two processes (the default shares) is one device of its host profile
    seats = tuple(PlacedInstance("A100-40GB:1g.5gb-1of2", 4, t, "v", seat=s)
                  for s, t in enumerate(("vad", "asr")))
    shared = dataclasses.replace(mixed, layout=Layout(mixed.layout.gpu_model, (GpuLayout(0, seats),)))
    objs = manifests(load_fleet(path), dataclasses.replace(result, nodes=[shared]))
    mig = yaml.safe_load(objs["mig-parted-config.yaml"][0]["data"]["config.yaml"])["mig-configs"]
    assert mig[mig_config_name(mixed.name)] == [{"devices": [0], "mig-enabled": True,
                                                 "mig-devices": {"1g.5gb": 1}}]
    pod = next(o for o in objs[f"nodes/{mixed.name}.yaml"] if o.get("kind") == "Deployment")
    asks = pod["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert {k: v for k, v in asks.items() if k.startswith("nvidia.com/")} == {"nvidia.com/mig-1g.5gb": "1"}
    path.write_text(text.replace("count = 1\n[[nodes]]", "count = 1\ngpus = 2\n[[nodes]]", 1))
    with pytest.raises(ConfigError) as err:
        load_fleet(path)
    assert err.value.field == "nodes[0].gpus" and "2 GPU groups" in err.value.message


def test_doctor_checks_each_gpu_against_its_group(mixed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from jigsaw.gpu.doctor import diagnose
    from jigsaw.gpu.emulated_nvml import EmulatedNvml

    node, _ = mixed
    nvml = EmulatedNvml(node.gpu_groups[0].model, 4, mig_enabled=[True, True, False, True],
                        device_name="NVIDIA A100-SXM4-40GB")
    checks = {c.what: c for c in diagnose(node, nvml=nvml, which=lambda name: f"/usr/bin/{name}", euid=0,
                                          run_dir=tmp_path / "r")}
    assert "2x A100-40GB (MIG) + 2x L4 (whole)" in checks["node"].detail
    assert checks["gpu 0"].status == "ok" and "(node config says" not in checks["gpu 0"].detail
    assert checks["gpu 2"].status == "ok" and "(node config says L4)" in checks["gpu 2"].detail
    assert checks["gpu 3"].status == "FAIL" and "-i 3 -mig 0" in checks["gpu 3"].detail


def test_the_driver_tables_are_each_mig_groups(mixed) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    from jigsaw.gpu.emulated_nvml import EmulatedNvml
    from jigsaw.gpu.nvml import driver_node

    node, _ = mixed
    a100 = node.gpu_groups[0].model
    fewer = dataclasses.replace(a100, profiles=tuple(
        dataclasses.replace(p, sm_count=p.sm_count - 2) if p.name == "3g.20gb" else p for p in a100.profiles))
    said: list[str] = []
    got = driver_node(node, EmulatedNvml(fewer, 4, mig_enabled=[True, True, False, False]), said.append)
    assert got.gpu.profile("A100-40GB:3g.20gb").sm_count == 40 and got.gpu_groups[1] == node.gpu_groups[1]
    assert any("3g.20gb" in line and "A100-40GB (GPU 0)" in line for line in said)


def test_a_node_plan_of_two_apps_keeps_each_group_on_its_gpus(tmp_path: Path) -> None:
    """An A100-80GB with MIG beside an H200 used whole: the node-wide plan (the decomposition, its
    packing per group) of two apps verifies, every instance on its own group's GPU."""
    from jigsaw.planner.node_plan import plan_node

    path = tmp_path / "mixed.toml"
    path.write_text(f'apps = ["{EXAMPLES}/apps/social_media.toml", "{EXAMPLES}/apps/traffic_analysis.toml"]\n'
                    f'[[gpus]]\nmodel = "A100-80GB"\ncount = 1\nprofiles_dir = "{EXAMPLES.parent}/profiles/'
                    f'a100-80gb"\n[[gpus]]\nmodel = "H200"\nmig = false\ncount = 1\n'
                    'mps_levels = [1, 2, 4, 8]\n'
                    f'profiles_dir = "{EXAMPLES.parent}/profiles/h200-whole"\n')
    node = load_node(path)
    table = load_node_profiles(node)
    result = plan_node(list(node.apps), node, table, {"social_media": 600.0, "traffic_analysis": 300.0},
                       time_limit_s=5.0)
    assert result.layout is not None and result.slices_used <= node.slices_available == 15
    for name, p in result.plans.items():
        assert verify_plan(p, node.app(name), node, table) == [], name
    for g in result.layout.gpus:
        want = "A100-80GB:" if g.gpu == 0 else "H200:"
        assert all(x.profile.startswith(want) for x in g.instances)
    groups = {x.profile.partition(":")[0] for g in result.layout.gpus for x in g.instances}
    assert groups == {"A100-80GB", "H200"}


def test_profiling_a_mixed_node_is_refused_per_group(capsys: pytest.CaptureFixture[str]) -> None:
    from jigsaw.cli import main

    assert main(["import-profiles", str(EXAMPLES / "apps" / "voice_intent.toml"), "--node", str(MIXED)]) == 2
    err = capsys.readouterr().err
    assert "gpus: 2 GPU groups" in err and "a100-40gb" in err and "l4-whole" in err


def test_a_mig_group_may_share_its_instances_beside_a_whole_gpu_group(tmp_path: Path) -> None:
    path = _write(tmp_path, replace={'mps_levels = [1, 2, 4]\nbatch_sizes = [1, 2, 4, 8, 16, 32]\n'
                                     'profiles_dir = "../profiles/a100':
                                     'mps_levels = [1, 2, 4]\nmig_shares = ["1g.10gb-1of2"]\n'
                                     'batch_sizes = [1, 2, 4, 8, 16, 32]\nprofiles_dir = "../profiles/a100'})
    node = load_node(path)
    share = node.gpu.profile("A100-40GB:1g.10gb-1of2")
    assert share.host == "A100-40GB:1g.10gb" and share.share_of == 2
    table = load_node_profiles(node)
    assert any(r.mig_profile == "A100-40GB:1g.10gb-1of2" for r in table.rows())
    app = node.app("voice_intent")
    for rps in (30.0, 2000.0):
        p = plan(app, node, table, rps)
        assert p.feasible and verify_plan(p, app, node, table) == [], rps
    bad = _write(tmp_path, replace={"memory_tb_s = 0.3\n": 'memory_tb_s = 0.3\nmig_shares = ["gpu-1of2"]\n'})
    with pytest.raises(ConfigError) as err:
        load_node(bad)
    assert err.value.field == "gpus[1].mig_shares" and "mps_shares" in err.value.message


def _swapped(tmp_path: Path) -> Path:
    """The example with the host's GPUs the other way round: the L4s at 0-1, the A100s at 2-3."""
    return _write(tmp_path, replace={'count = 2\nmps_levels': 'count = 2\ndevices = [2, 3]\nmps_levels',
                                     'count = 2\nmemory_gb': 'count = 2\ndevices = [0, 1]\nmemory_gb'})


def test_devices_map_a_groups_gpus_to_the_hosts_indices(tmp_path: Path) -> None:
    node = load_node(_swapped(tmp_path))
    assert [node.host_index(i) for i in range(4)] == [2, 3, 0, 1]
    for replace, field in (
            ({'count = 2\nmps_levels': 'count = 2\ndevices = [2]\nmps_levels'}, "gpus[0].devices"),
            ({'count = 2\nmps_levels': 'count = 2\ndevices = [2, 3]\nmps_levels'}, "gpus[1].devices")):
        with pytest.raises(ConfigError) as err:  # one index for two GPUs; the L4s' default 2, 3 taken
            load_node(_write(tmp_path, replace=replace))
        assert err.value.field == field, err.value
    one = tmp_path / "one.toml"
    text = (EXAMPLES / "l4x2.toml").read_text().replace("count = 2", "count = 2\ndevices = [1, 0]")
    one.write_text(text.replace('"apps/', f'"{EXAMPLES}/apps/')
                   .replace('"../profiles', f'"{EXAMPLES.parent}/profiles'))
    with pytest.raises(ConfigError, match="a node of several groups only"):
        load_node(one)


def test_the_runtime_reaches_each_gpu_by_its_host_index(tmp_path: Path) -> None:
    from jigsaw.gpu.emulated_nvml import EmulatedNvml
    from jigsaw.gpu.groups import GroupsApplier
    from jigsaw.gpu.layout import NodeInstance
    from jigsaw.runtime.gpus import host_devices

    node = load_node(_swapped(tmp_path))
    nvml = EmulatedNvml(node.gpu_groups[0].model, 4, mig_enabled=[False, False, True, True])
    applier = GroupsApplier(node, nvml)
    made = applier.create(NodeInstance(gpu=1, profile="A100-40GB:3g.20gb", start=4))
    assert made.gpu == 1 and made.uuid.startswith("MIG-")
    assert next(c for c in nvml.calls if c[0] == "nvmlDeviceCreateGpuInstanceWithPlacement")[1] == 3
    l4 = applier.create(NodeInstance(gpu=2, profile="L4:gpu-1of4", start=2))
    assert l4.uuid == "GPU-emulated-0000"  # the host's GPU 0
    assert [(i.gpu, i.start) for i in applier.adopt(4).instances] == [(1, 4)]
    devices = host_devices(node, nvml)
    assert devices[(1, 4)] == made.uuid and devices[(2, 0)] == "GPU-emulated-0000"
    assert devices[(3, 0)] == "GPU-emulated-0001" and (0, 0) not in devices
    applier.destroy(made)
    assert applier.adopt(4).instances == ()


def test_pack_commands_and_doctor_speak_the_hosts_indices(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from jigsaw.cli import main
    from jigsaw.gpu.doctor import diagnose
    from jigsaw.gpu.emulated_nvml import EmulatedNvml

    path = _swapped(tmp_path)
    out = tmp_path / "plan.json"
    assert main(["plan", "--app", "voice_intent", "--node", str(path), "--demand", "300",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["pack", "--plan", str(out), "--node", str(path), "--format", "commands"]) == 0
    cmds = capsys.readouterr().out.splitlines()
    assert cmds[0].startswith("# GPUs 0, 1 are used whole")
    assert any(" -i 2 -cgi " in c for c in cmds) and not any(" -i 0 -cgi " in c for c in cmds)
    node = load_node(path)
    nvml = EmulatedNvml(node.gpu_groups[0].model, 4, mig_enabled=[False, False, False, True])
    checks = {c.what: c for c in diagnose(node, nvml=nvml, which=lambda n: f"/usr/bin/{n}", euid=0,
                                          run_dir=tmp_path / "r")}
    assert checks["gpu 0"].status == "FAIL" and "nvidia-smi -i 2 -mig 1" in checks["gpu 0"].detail
    assert checks["gpu 1"].status == "ok" and checks["gpu 2"].status == "ok"


def _one_of_each(tmp_path: Path, extra: str = "") -> Path:
    """The example on one A100 and one L4 (quick to plan to capacity); ``extra`` goes into the
    A100 group."""
    return _write(tmp_path, replace={
        'model = "A100-40GB"\ncount = 2\n': f'model = "A100-40GB"\ncount = 1\n{extra}',
        'model = "L4"\nmig = false\ncount = 2': 'model = "L4"\nmig = false\ncount = 1'})


def test_each_mig_group_shares_its_own_smallest_instance_at_its_own_levels(tmp_path: Path) -> None:
    node = load_node(_write(tmp_path, extra='\n[[gpus]]\nmodel = "A100-80GB"\ncount = 1\n'
                                            'mps_levels = [1, 3, 4]\nprofiles_dir = "../profiles/a100-80gb"\n'
                                            'backend = "torch"\n'))
    shares = {p.name: p.host for p in node.gpu.profiles if p.host}
    assert shares == {"A100-40GB:1g.5gb-1of2": "A100-40GB:1g.5gb",
                      "A100-40GB:1g.5gb-1of4": "A100-40GB:1g.5gb",
                      "A100-80GB:1g.10gb-1of3": "A100-80GB:1g.10gb",
                      "A100-80GB:1g.10gb-1of4": "A100-80GB:1g.10gb"}
    assert not any(p.startswith("L4:") for p in shares)  # a whole GPU's shares are its mps_shares
    assert not any(p in shares for g in node.gpu_groups for p in g.mig_profiles)  # the MILPs plan without
    off = load_node(_one_of_each(tmp_path, "mig_shares = []\n"))
    assert not any(p.host for p in off.gpu.profiles)


def test_a_mixed_node_at_a_small_demand_shares_a_mig_instance_and_loses_no_capacity(tmp_path: Path) -> None:
    """Default shares on a node of several groups: at a small demand the plan (node-wide and one
    app's) runs different tasks in one shared instance of the MIG group on fewer slices, with the
    same lanes, verified, packed on that group's GPU and placed by the node layout; the node's
    capacity is what it is without shares."""
    from jigsaw.gpu.groups import place_on, validate_on
    from jigsaw.gpu.layout import empty_layout
    from jigsaw.planner.milp import capacity
    from jigsaw.planner.node_plan import plan_node

    node, plain = load_node(_one_of_each(tmp_path)), load_node(_one_of_each(tmp_path, "mig_shares = []\n"))
    table, plain_table = load_node_profiles(node), load_node_profiles(plain)
    app = node.app("voice_intent")
    got = plan_node([app], node, table, {app.name: 20.0})
    base = plan_node([plain.app(app.name)], plain, plain_table, {app.name: 20.0})
    mine, theirs = got.plans[app.name], base.plans[app.name]
    assert got.feasible and got.slices_used < base.slices_used and any("merged" in n for n in got.notes)
    assert mine.lanes == theirs.lanes and mine.planned_rps == theirs.planned_rps == 20.0
    assert verify_plan(mine, app, node, table) == []
    one = plan(app, node, table, 20.0)
    assert one.slices_used < plan(plain.app(app.name), plain, plain_table, 20.0).slices_used
    for p in (mine, one):
        assert p.layout is not None and verify_plan(p, app, node, table) == []
        seats = [(g.gpu, x) for g in p.layout.gpus for x in g.instances if "-1of" in x.profile]
        assert seats and all(gpu == 0 and x.profile.startswith("A100-40GB:1g.5gb-1of") for gpu, x in seats)
        assert len({x.task for _, x in seats if x.start == seats[0][1].start}) >= 2  # tasks share it
    laid = place_on(empty_layout(node.gpu, node.num_gpus), app.name, instances_from_plan(one), node.gpu)
    assert validate_on(laid, node.gpu) == []
    assert any("-1of" in i.profile and i.gpu == 0 for i in laid.instances)
    share = next(i for i in laid.instances if "-1of" in i.profile)
    wrong = laid.with_instances([*laid.instances, dataclasses.replace(share, gpu=1, seat=1)])
    assert any("not a profile of GPU 1's group L4" in x for x in validate_on(wrong, node.gpu))
    cap, cap_plain = capacity(app, node, table), capacity(plain.app(app.name), plain, plain_table)
    assert cap.status == cap_plain.status == "optimal"
    assert cap.max_demand_rps >= cap_plain.max_demand_rps - 1e-6
    top = plan(app, node, table, cap.max_demand_rps * 0.99)
    assert top.feasible and verify_plan(top, app, node, table) == []


def test_shares_of_a_mig_group_after_a_whole_gpu_group_stay_on_its_gpus(tmp_path: Path) -> None:
    """The MIG group second in the file (its GPUs 2-3): the plan's shared instance and two apps'
    shares placed one after the other (the second takes the first's free seat) sit on its GPUs."""
    from jigsaw.gpu.groups import place_on, validate_on
    from jigsaw.gpu.layout import empty_layout

    text = _write(tmp_path).read_text()
    head, mark, rest = text.partition('[[gpus]]\nmodel = "A100-40GB"')
    a100, mark2, l4 = rest.partition('[[gpus]]\nmodel = "L4"')
    path = tmp_path / "l4_first.toml"
    path.write_text(f"{head}{mark2}{l4}\n{mark}{a100}")
    node = load_node(path)
    assert [(g.name, g.gpus) for g in node.gpu_groups] == [("L4", range(0, 2)), ("A100-40GB", range(2, 4))]
    table = load_node_profiles(node)
    app = node.app("voice_intent")
    p = plan(app, node, table, 20.0)
    assert p.layout is not None and verify_plan(p, app, node, table) == []
    shared = {g.gpu for g in p.layout.gpus for x in g.instances if "-1of" in x.profile}
    assert shared and shared <= {2, 3}
    laid = empty_layout(node.gpu, node.num_gpus)
    for name, task in (("a", "vad"), ("b", "intent")):
        laid = place_on(laid, name, [InstanceRequest("A100-40GB:1g.5gb-1of2", task, "v", 1, 1, 0)], node.gpu)
    assert validate_on(laid, node.gpu) == []
    assert len({(i.gpu, i.start) for i in laid.instances}) == 1 and laid.instances[0].gpu in (2, 3)
    assert sorted((i.app, i.seat) for i in laid.instances) == [("a", 0), ("b", 1)]
