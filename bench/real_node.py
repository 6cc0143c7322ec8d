"""A small real node for ``bench/faults.py``: onnxruntime on this machine's CPU, one speech-like app.

``speech``: ``up`` then ``dec``, ONNX graphs built in-process that repeat a free-length FP32
waveform 4 and 8 times (as a vocoder's upsamplers do). An output's size follows its input's, so
requests that fit their rings make outputs that do not: ``OVER_CHILD`` samples (160 KB) make
``up`` a 640 KB child for ``dec``, over a task ring's slot (524,152 bytes by default);
``OVER_ANSWER`` samples (120 KB) make a 480 KB child, which fits, and ``dec`` a 3.8 MB answer,
over a completion ring's slot (2,097,016 bytes). The worker must answer each 500 naming the task
and the output, and serve on. The emulated backend's outputs do not follow their
inputs' sizes, hence a real node.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

APP = "speech"
VALID_SAMPLES = 500  # an 8 KB child, a 64 KB answer: the valid stream
OVER_CHILD = 40_000  # a 640 KB child from a 160 KB input
OVER_ANSWER = 30_000  # a 480 KB child (fits), a 3.8 MB answer
SLO_MS = 500.0
PROFILE = ("variant,mig_profile,mps,batch,latency_ms,throughput_rps,memory_mb,source\n"
           "up4,1c,1,1,5.0,200,10,measured\nup8,1c,1,1,5.0,200,10,measured\n")


def missing() -> str | None:
    """Why this node cannot run here (its libraries are not installed), else None."""
    import importlib.util
    absent = [m for m in ("onnx", "onnxruntime") if importlib.util.find_spec(m) is None]
    return f"needs {', '.join(absent)} (pip install -e '.[models]')" if absent else None


def _save(path: Path, op: str, const: np.ndarray) -> None:
    """y = op(x, const), x and y FP32 [batch, samples] (every axis free)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    graph = helper.make_graph([helper.make_node(op, ["x", "c"], ["y"])], path.stem,
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "m"])],
                              [numpy_helper.from_array(const, "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def write_node(d: Path) -> Path:
    """Writes the models, profiles, app and node files into ``d``; returns the node file."""
    _save(d / "up4.onnx", "Tile", np.array([1, 4], np.int64))
    _save(d / "up8.onnx", "Tile", np.array([1, 8], np.int64))
    (d / "profiles").mkdir(exist_ok=True)
    (d / "profiles" / "speech.csv").write_text(PROFILE)
    (d / "speech.toml").write_text("\n".join([
        f'name = "{APP}"', f"latency_slo_ms = {SLO_MS}", f"staleness_ms = {SLO_MS}",
        "[[tasks]]", 'name = "up"', 'variants = [{ name = "up4", accuracy = 1.0, model = "up4.onnx" }]',
        "[[tasks]]", 'name = "dec"', 'variants = [{ name = "up8", accuracy = 1.0, model = "up8.onnx" }]',
        "[[edges]]", 'from = "up"', 'to = "dec"', ""]))
    node = d / "node.toml"
    node.write_text("\n".join([
        'name = "speech-cpu"', 'apps = ["speech.toml"]', "[gpus]", 'model = "CPU-4C"', "count = 1",
        'mig_profiles = ["1c"]', "mps_levels = [1]", "batch_sizes = [1]", 'profiles_dir = "profiles"',
        'backend = "onnxruntime"', "[planner]", "accuracy_slo = 0.5", ""]))
    return node


def infer_body(samples: int) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [samples],
                                   "data": [0.5] * samples}]}).encode()
