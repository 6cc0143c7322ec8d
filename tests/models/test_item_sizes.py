"""An item larger than its ring, on a real node (onnxruntime): a speech-like app whose first task
passes a variable-length waveform on. Over the default ring size it is answered 500 naming the
task and the output, and the worker serves on (no failure, no restart); the same app declaring
``max_item_bytes`` serves it. An answer over its completion ring (``speech``'s last task
upsamples 8 times) is answered 500 naming that task and its outputs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
ROOT = Path(__file__).resolve().parents[2]
SAMPLES = 150_000  # 600 KB of FP32: over a default ring's 524,152 bytes


def _echo_onnx(path: Path, repeat: int = 1) -> None:
    """y = x repeated ``repeat`` times along the samples, x FP32 [batch, samples] (both free)."""
    from onnx import TensorProto, helper, numpy_helper
    reps = numpy_helper.from_array(np.array([1, repeat], np.int64), "reps")
    graph = helper.make_graph([helper.make_node("Tile", ["x", "reps"], ["y"])], "echo",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "m"])], [reps])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def _app(name: str, extra: str = "", dec: str = "echo") -> str:
    return "\n".join([f'name = "{name}"', "latency_slo_ms = 5000", "staleness_ms = 5000", extra,
                      "[[tasks]]", 'name = "enc"',
                      'variants = [{ name = "echo", accuracy = 1.0, model = "echo.onnx" }]',
                      "[[tasks]]", 'name = "dec"',
                      f'variants = [{{ name = "{dec}", accuracy = 1.0, model = "{dec}.onnx" }}]',
                      "[[edges]]", 'from = "enc"', 'to = "dec"', ""])


def _post(port: int, app: str, n: int) -> tuple[int, dict]:
    tensor = {"name": "x", "datatype": "FP32", "shape": [n], "data": [0.5] * n}
    body = json.dumps({"inputs": [tensor]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/{app}/infer", body,
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _get(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
    except OSError:
        return -1, {}


def test_an_item_over_its_ring_fails_alone_and_max_item_bytes_carries_it(tmp_path: Path) -> None:
    _echo_onnx(tmp_path / "echo.onnx")
    _echo_onnx(tmp_path / "up8.onnx", 8)
    (tmp_path / "speech.toml").write_text(_app("speech", dec="up8"))
    (tmp_path / "roomy.toml").write_text(_app("roomy", "max_item_bytes = 1_000_000"))
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "echo.csv").write_text(
        "variant,mig_profile,mps,batch,latency_ms,throughput_rps,memory_mb,source\n"
        "echo,1c,1,1,5.0,200,10,measured\nup8,1c,1,1,5.0,200,10,measured\n")
    (tmp_path / "node.toml").write_text("\n".join([
        'name = "sizes"', 'apps = ["speech.toml", "roomy.toml"]', "[gpus]", 'model = "CPU-4C"', "count = 1",
        'mig_profiles = ["1c"]', "mps_levels = [1]", "batch_sizes = [1]", 'profiles_dir = "profiles"',
        'backend = "onnxruntime"', "[planner]", "accuracy_slo = 0.5", ""]))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "jigsawd.log"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "jigsaw.daemon", "--node-config",
                                 str(tmp_path / "node.toml"), "--port", str(port), "--demand", "1",
                                 "--no-controller", "--grpc-port", "0"],
                                env=env, stderr=out)
    try:
        deadline = time.monotonic() + 120
        while _get(port, "/v2/health/ready")[0] != 200:
            assert proc.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, "not ready"
            time.sleep(0.3)
        status, body = _post(port, "speech", SAMPLES)
        assert status == 500, body
        assert "task 'enc'" in body["error"] and "output for task 'dec'" in body["error"], body
        assert "max_item_bytes" in body["error"]
        status, body = _post(port, "speech", 1000)  # the same worker serves on
        assert status == 200 and body["outputs"][0]["shape"] == [1, 8000], body
        status, body = _post(port, "roomy", SAMPLES)
        assert status == 200, body
        out = {o["name"]: o for o in body["outputs"]}
        assert out["dec.y"]["shape"] == [1, SAMPLES]
        status, body = _post(port, "speech", 100_000)  # a 400 KB child fits; dec's 3.2 MB answer does not
        assert status == 500, body
        assert "task 'dec'" in body["error"] and "an answer carries" in body["error"], body
        workers = _get(port, "/admin/workers")[1]
        assert workers["events"] == [] and {w["state"] for w in workers["workers"]} == {"ready"}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert "answered 500 for an item it could not serve" in log.read_text()
