"""``jigsaw profile`` writes a row only for a batch size that ran every timed batch, says which it
skipped and why, measures a variable-length input at the app's ``typical_shape`` and records the
input each row was timed at; ``jigsaw modeled`` costs that input at the same size and says so."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _model(path: Path, shape: list) -> None:
    """An ONNX model of one input ``x`` of ``shape`` (None: a free axis) through a MatMul."""
    path.parent.mkdir(parents=True, exist_ok=True)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [*shape[:-1], 4])
    w = helper.make_tensor("w", TensorProto.FLOAT, [shape[-1], 4], [0.5] * (4 * shape[-1]))
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], [w])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))


def _setup(tmp_path: Path) -> Path:
    _model(tmp_path / "models" / "fixed" / "1" / "model.onnx", [1, 8])  # cannot batch: batch axis 1
    (tmp_path / "fixed.toml").write_text("\n".join([
        'name = "fixed"', "latency_slo_ms = 2000",
        '[[inputs]]', 'name = "x"', 'datatype = "FP32"', "shape = [8]",
        '[[tasks]]', 'name = "t"',
        'variants = [{ name = "fixed", accuracy = 1.0, model = "models/fixed" }]']))
    (tmp_path / "node.toml").write_text("\n".join([
        'name = "n"', 'apps = ["fixed.toml"]',
        "[gpus]", 'model = "CPU-2C"', "count = 1", 'mig_profiles = ["1c"]', "mps_levels = [1]",
        "batch_sizes = [1, 4]", 'profiles_dir = "profiles"', 'backend = "onnxruntime"']))
    return tmp_path


def _rows(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(ln for ln in path.read_text().splitlines() if not ln.startswith("#")))


def _jigsaw(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return subprocess.run([sys.executable, "-m", "jigsaw.cli", *args], env=env, capture_output=True,
                          text=True, timeout=240, check=False)


def test_a_batch_size_that_fails_gets_no_row_and_is_named(tmp_path: Path) -> None:
    d = _setup(tmp_path)
    done = _jigsaw("profile", "--node", str(d / "node.toml"), "--seconds", "0.1", "--max-iters", "5")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = _rows(d / "profiles" / "fixed.csv")
    assert [int(r["batch"]) for r in rows] == [1]  # batch 4 raised in onnxruntime: no row
    assert rows[0]["input"] == "x 8"
    assert "1 rows not written" in done.stderr and "fixed 1c mps1 batch 4" in done.stderr
    assert "INVALID_ARGUMENT" in done.stderr or "Invalid" in done.stderr or "dimension" in done.stderr


def test_a_variable_length_input_is_measured_and_modeled_at_its_typical_shape(tmp_path: Path) -> None:
    d = _setup(tmp_path)
    _model(d / "models" / "wave" / "1" / "model.onnx", [None, None, 8])  # batch x frames x 8
    app = ['name = "wave"', "latency_slo_ms = 2000",
           '[[inputs]]', 'name = "x"', 'datatype = "FP32"', "shape = [-1, 8]", "{typical}",
           '[[tasks]]', 'name = "t"', 'variants = [{ name = "wave", accuracy = 1.0, model = "models/wave" }]']
    (d / "wave.toml").write_text("\n".join(app).replace("{typical}", "typical_shape = [6000, 8]"))
    node = d / "node.toml"
    node.write_text(node.read_text().replace('apps = ["fixed.toml"]', 'apps = ["wave.toml"]'))
    done = _jigsaw("profile", "--node", str(node), "--seconds", "0.1", "--max-iters", "5")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "x 6000x8 (the app's typical_shape)" in done.stderr
    assert {r["input"] for r in _rows(d / "profiles" / "wave.csv")} == {"x 6000x8 (the app's typical_shape)"}
    gpu = d / "gpu.toml"  # the same app on a GPU node, whose rows are modeled
    gpu.write_text(node.read_text().replace('model = "CPU-2C"', 'model = "H100-80GB"')
                   .replace('mig_profiles = ["1c"]', 'mig_profiles = ["1g.10gb"]')
                   .replace("onnxruntime", "tensorrt"))
    done = _jigsaw("modeled", "--node", str(gpu), "--out", str(d / "modeled"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "wave: modeled at items of x 6000x8 (the app's typical_shape)" in done.stderr
    # without a typical_shape the free axis is 1, and the run says so
    (d / "wave.toml").write_text("\n".join(app).replace("{typical}", ""))
    done = _jigsaw("modeled", "--node", str(gpu), "--out", str(d / "modeled-1"))
    assert done.returncode == 0 and "x 1x8 (free axes taken as 1" in done.stderr, done.stderr[-2000:]
    from jigsaw.models.repository import graph_cost
    path = d / "models" / "wave" / "1" / "model.onnx"
    assert graph_cost(path, {"x": (6000, 8)}).flops == 6000 * graph_cost(path).flops
