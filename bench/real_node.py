"""A small real node for ``bench/faults.py``: onnxruntime on this machine's CPU, one speech-like app.

``speech``: ``up`` (an ONNX graph repeating a free-length FP32 waveform ``UPSAMPLE`` times, as a
vocoder's upsampler does) then ``dec`` (an ONNX echo); the graphs are built in-process. An
output's size follows its input's, so a request of ``OVER_SAMPLES`` samples (a 160 KB input,
under a ring slot) makes ``up`` produce a 640 KB child, over the default ring's slot (524,152
bytes): the worker must answer that request 500 naming the task and the output and serve on.
The emulated backend's outputs do not follow their inputs' sizes, hence a real node.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

APP = "speech"
UPSAMPLE = 4
VALID_SAMPLES = 1_000  # a 16 KB child: the valid stream
OVER_SAMPLES = 40_000  # a 640 KB child from a 160 KB input: the attack
SLO_MS = 500.0
PROFILE = ("variant,mig_profile,mps,batch,latency_ms,throughput_rps,memory_mb,source\n"
           "up,1c,1,1,5.0,200,10,measured\necho,1c,1,1,5.0,200,10,measured\n")


def _save(path: Path, op: str, const: np.ndarray) -> None:
    """y = op(x, const), x and y FP32 [batch, samples] (both axes free)."""
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
    _save(d / "up.onnx", "Tile", np.array([1, UPSAMPLE], np.int64))
    _save(d / "echo.onnx", "Mul", np.ones((1,), np.float32))
    (d / "profiles").mkdir(exist_ok=True)
    (d / "profiles" / "speech.csv").write_text(PROFILE)
    (d / "speech.toml").write_text("\n".join([
        f'name = "{APP}"', f"latency_slo_ms = {SLO_MS}", f"staleness_ms = {SLO_MS}",
        "[[tasks]]", 'name = "up"', 'variants = [{ name = "up", accuracy = 1.0, model = "up.onnx" }]',
        "[[tasks]]", 'name = "dec"', 'variants = [{ name = "echo", accuracy = 1.0, model = "echo.onnx" }]',
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
