"""Profiles for anything: whole GPUs as a node kind, ``jigsaw modeled`` and ``jigsaw import-profiles``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jigsaw.errors import ConfigError
from jigsaw.node import load_node, load_node_profiles
from jigsaw.profile_import import ImportErrorInFile, import_csv
from jigsaw.profiles import read_profile_csv

ROOT = Path(__file__).resolve().parents[1]
APPS = ROOT / "examples" / "apps"


def jigsaw(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jigsaw.cli", *args], capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}, timeout=300,
                          check=False)


def whole_node(tmp_path: Path, gpu: str = 'model = "A100-80GB"\nmig = false',
               app: str = "traffic_analysis.toml", profiles: str = "profiles") -> Path:
    path = tmp_path / "node.toml"
    path.write_text(textwrap.dedent(f"""
        name = "whole"
        apps = ["{APPS / app}"]
        [gpus]
        {gpu}
        count = 8
        mps_levels = [1, 2]
        batch_sizes = [1, 4, 16]
        profiles_dir = "{profiles}"
        backend = "tensorrt"
    """))
    return path


def test_a_whole_gpu_node_has_one_segment_per_gpu_and_mps_level(tmp_path: Path) -> None:
    node = load_node(whole_node(tmp_path), load_apps=False)
    # MPS level 2 is listed: each GPU may also be shared by 2 processes of any (task, variant)s
    assert not node.gpu.mig and node.gpu.profile_names == ("gpu", "gpu-1of2")
    assert node.slices_available == 16
    assert [s.name for s in node.segment_types] == ["gpux1", "gpux2", "gpu-1of2x1"]
    alone = load_node(whole_node(tmp_path, 'model = "A100-80GB"\nmig = false\nmps_shares = 0'),
                      load_apps=False)
    assert alone.gpu.profile_names == ("gpu",) and alone.slices_available == 8
    with pytest.raises(ConfigError) as err:
        load_node(whole_node(tmp_path, 'model = "A100-80GB"\nmig = false\nmps_shares = 4'), load_apps=False)
    assert err.value.field == "gpus.mps_shares" and "mps_levels" in err.value.message
    assert node.gpu.profile("gpu").memory_gb == 80 and node.gpu.profile("gpu").sm_count == 108
    custom = load_node(whole_node(tmp_path, 'model = "L4"\nmig = false\nmemory_gb = 24\nsm_count = 58'),
                       load_apps=False)
    assert custom.gpu.name == "L4" and custom.gpu.profile("gpu").memory_gb == 24
    with pytest.raises(ConfigError) as err:
        load_node(whole_node(tmp_path, 'model = "L4"\nmig = false\nmemory_gb = 24'), load_apps=False)
    assert err.value.field == "gpus.sm_count" and "used whole" in err.value.message
    with pytest.raises(ConfigError) as err:
        load_node(whole_node(tmp_path, 'model = "L4"'), load_apps=False)
    assert err.value.field == "gpus.model" and "mig = false" in err.value.message


def test_modeled_profiles_of_whole_gpus_plan_a_node(tmp_path: Path) -> None:
    node_file = whole_node(tmp_path)
    done = jigsaw("modeled", "--node", str(node_file))
    assert done.returncode == 0, done.stderr
    rows = read_profile_csv(tmp_path / "profiles" / "vgg11.csv")
    want = {("gpu", k, b) for k in (1, 2) for b in (1, 4, 16)}
    assert {(r.mig_profile, r.mps, r.batch) for r in rows} == want
    assert {r.source for r in rows} == {"modeled"}
    table = load_node_profiles(load_node(node_file))
    assert table.get("vgg11", "gpu", 1, 16) is not None
    # one process of a GPU that two share: the GPU's level-2 row, half its throughput (less the
    # stated interference of unlike neighbours)
    pair, share = table.get("vgg11", "gpu", 2, 16), table.get("vgg11", "gpu-1of2", 1, 16)
    assert share.memory_mb == pair.memory_mb and share.latency_ms > pair.latency_ms
    assert share.throughput_rps == pytest.approx(pair.throughput_rps / 2 * 0.85, abs=1e-3)
    done = jigsaw("plan", "--app", "traffic_analysis", "--node", str(node_file), "--demand", "200", "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["feasible"] and plan["slices_used"] <= 16
    assert {i["mig_profile"] for i in plan["instances"]} <= {"gpu", "gpu-1of2"}
    (tmp_path / "plan.json").write_text(done.stdout)
    done = jigsaw("pack", "--plan", str(tmp_path / "plan.json"), "--format", "commands")
    assert done.returncode == 0 and "nothing to partition" in done.stdout and "-cgi" not in done.stdout


def test_modeled_reads_a_repository_models_compute_from_its_graph(tmp_path: Path) -> None:
    onnx = pytest.importorskip("onnx")
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.ones((64, 32), np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "net.onnx"))
    (tmp_path / "app.toml").write_text(textwrap.dedent("""
        name = "mine"
        latency_slo_ms = 50
        [[tasks]]
        name = "t"
        variants = [{ name = "net", accuracy = 1.0, model = "net.onnx" }]
    """))
    node = whole_node(tmp_path, 'model = "H100-80GB"\nmig = false', app=str(tmp_path / "app.toml"))
    from jigsaw.modeled import variant_from_onnx
    v = variant_from_onnx("net", tmp_path / "net.onnx")
    assert v.gflop == pytest.approx(2 * 64 * 32 / 1e9) and v.params_m == pytest.approx(64 * 32 / 1e6)
    done = jigsaw("modeled", "--node", str(node))
    assert done.returncode == 0, done.stderr
    rows = read_profile_csv(tmp_path / "profiles" / "net.csv")
    assert len(rows) == 6 and all(r.latency_ms > 0 and r.memory_mb > 0 for r in rows)
    assert jigsaw("plan", "--app", "mine", "--node", str(node), "--demand", "50").returncode == 0
    done = jigsaw("modeled", "--gpu", "RTX-9090")
    assert done.returncode == 2 and "no modeled figures" in done.stderr and "Traceback" not in done.stderr


CSV = """\
# seconds per batch, one whole GPU
model,hardware,batch,p50,p95,unit,memory_mb
digitnet,gpu,1,0.0010,0.0012,s,800
digitnet,gpu,8,0.0020,,s,820
"""


def test_import_profiles_prints_every_assumption(tmp_path: Path) -> None:
    (tmp_path / "m.csv").write_text(CSV)
    said: list[str] = []
    with pytest.raises(ImportErrorInFile, match=r"m.csv:4: p95 missing.*--p95-over-p50"):
        import_csv(tmp_path / "m.csv", tmp_path / "out", say=said.append)
    (written,) = import_csv(tmp_path / "m.csv", tmp_path / "out", p95_over_p50=1.25, say=said.append)
    rows = {r.batch: r for r in read_profile_csv(written)}
    assert rows[1].latency_ms == pytest.approx(1.2) and rows[8].latency_ms == pytest.approx(2.5)
    assert rows[8].throughput_rps == pytest.approx(8 / 0.002)  # mps x batch / p50
    assert {r.source for r in rows.values()} == {"measured"} and rows[1].mig_profile == "gpu"
    text = "\n".join(said)
    for words in ("unit s", "p50 x 1.25", "throughput: not given", "mps: not given"):
        assert words in text, (words, text)
    (tmp_path / "zero.csv").write_text(CSV.replace("800", "0"))
    with pytest.raises(ImportErrorInFile, match=r"zero.csv:3: memory_mb: a memory of 0 cannot be right"):
        import_csv(tmp_path / "zero.csv", tmp_path / "out", p95_over_p50=1.25)
    (tmp_path / "unit.csv").write_text(CSV.replace(",s,", ",minutes,"))
    with pytest.raises(ImportErrorInFile, match="unit: expected one of s, ms, us"):
        import_csv(tmp_path / "unit.csv", tmp_path / "out")
    with pytest.raises(ImportErrorInFile, match="model: 'digitnet' is not a variant"):
        import_csv(tmp_path / "m.csv", tmp_path / "out", variants=["resnet50"], p95_over_p50=1.2)


def test_import_profiles_cli_checks_against_the_node(tmp_path: Path) -> None:
    (tmp_path / "m.csv").write_text(CSV.replace("digitnet", "vgg11"))
    node = whole_node(tmp_path)
    done = jigsaw("import-profiles", str(tmp_path / "m.csv"), "--node", str(node), "--p95-over-p50", "1.2")
    assert done.returncode == 0, done.stderr
    assert "assumed" in done.stderr and "vgg11.csv" in done.stdout
    (tmp_path / "bad.csv").write_text(CSV.replace("digitnet", "vgg11").replace("gpu,", "3g.40gb,"))
    done = jigsaw("import-profiles", str(tmp_path / "bad.csv"), "--node", str(node), "--p95-over-p50", "1.2")
    assert done.returncode == 2 and "hardware: '3g.40gb' is not a segment" in done.stderr
    assert "Traceback" not in done.stderr
    done = jigsaw("import-profiles", str(tmp_path / "m.csv"), "--out", str(tmp_path), "--p95-over-p50", "0.5")
    assert done.returncode == 2 and "--p95-over-p50" in done.stderr


def test_profile_names_a_variant_without_a_model(tmp_path: Path) -> None:
    (tmp_path / "app.toml").write_text(textwrap.dedent("""
        name = "game"
        latency_slo_ms = 95
        [[tasks]]
        name = "digit1"
        variants = [{ name = "lenet-1", accuracy = 99.0 }]
    """))
    node = tmp_path / "cpu.toml"
    node.write_text(f'apps = ["{tmp_path / "app.toml"}"]\n[gpus]\nmodel = "CPU-2C"\ncount = 1\n'
                    'mps_levels = [1]\nprofiles_dir = "p"\nbackend = "onnxruntime"\n')
    done = jigsaw("profile", "--node", str(node))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "variant 'lenet-1': no model to measure" in done.stderr and "app.toml" in done.stderr
