"""End to end, as a user brings a model: export one that is not in the zoo, profile it on the CPU,
plan, serve it with ``jigsawd`` in two tasks joined by a custom transform, and check the answer
against onnxruntime run directly. A transform that fails answers 500 for its request only."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from jigsaw.testing import ServerProcess, free_port, jigsawd_command

ort = pytest.importorskip("onnxruntime")
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "byom"

BAD_TRANSFORM = '''
from second_look import second_look

def fussy(inputs, outputs, edge):
    """The example's transform, but an image whose first pixel is negative is refused."""
    if float(inputs["image"].reshape(-1)[0]) < 0:
        raise ValueError("a negative first pixel")
    return second_look(inputs, outputs, edge)
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(env: dict[str, str], *args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                          timeout=timeout_s, check=False)


def _infer(port: int, app: str, image: np.ndarray) -> tuple[int, dict]:
    body = {"inputs": [{"name": "image", "datatype": "FP32", "shape": list(image.shape),
                        "data": image.reshape(-1).tolist()}]}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/{app}/infer",
                                 json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """The example copied out (its model exported there), plus a node serving it beside a twin
    app whose transform refuses some images."""
    d = tmp_path / "byom"
    shutil.copytree(EXAMPLE, d, ignore=shutil.ignore_patterns("models", "profiles", "__pycache__"))
    (d / "fussy.py").write_text(BAD_TRANSFORM)
    app = (d / "digits.toml").read_text()
    (d / "fussy.toml").write_text(app.replace('name = "digits"', 'name = "fussy"')
                                  .replace("second_look:second_look", "fussy:fussy"))
    node = (d / "cpu.toml").read_text()
    node = node.replace('apps = ["digits.toml"]', 'apps = ["digits.toml", "fussy.toml"]')
    (d / "node.toml").write_text(node.replace('model = "CPU-2C"', 'model = "CPU-4C"')
                                 .replace("batch_sizes = [1, 2, 4, 8]", "batch_sizes = [1, 4]"))
    return d


def test_bring_your_own_model_end_to_end(workdir: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    done = _run(env, str(workdir / "export_digitnet.py"))
    assert done.returncode == 0, done.stderr[-2000:]
    onnx_file = workdir / "models" / "digitnet" / "1" / "model.onnx"
    assert onnx_file.is_file()

    node = str(workdir / "node.toml")
    done = _run(env, "-m", "jigsaw.cli", "profile", "--node", node, "--seconds", "0.2", "--max-iters", "20")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = list(csv.DictReader(ln for ln in (workdir / "profiles" / "digitnet.csv").read_text().splitlines()
                               if not ln.startswith("#")))
    assert {(r["mig_profile"], int(r["batch"])) for r in rows} == {("1c", 1), ("1c", 4)}
    assert {r["source"] for r in rows} == {"measured"}
    again = _run(env, "-m", "jigsaw.cli", "profile", "--node", node, "--seconds", "0.2")
    assert again.returncode == 0 and "already measured" in again.stderr  # resumable: nothing redone

    done = _run(env, "-m", "jigsaw.cli", "plan", "--app", "digits", "--node", node, "--demand", "5", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    plan = json.loads(done.stdout)
    assert plan["feasible"]
    assert {(i["task"], i["variant"]) for i in plan["instances"]} == {("glance", "digitnet"),
                                                                      ("recheck", "digitnet")}

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "jigsaw.daemon", "--node-config", node, "--host",
                             "127.0.0.1", "--port", str(port), "--demand", "5", "--grpc-port", "0"],
                            env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read() if proc.stderr else ""
                pytest.fail(f"jigsawd exited {proc.returncode}: {err[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "jigsawd did not become ready"
            time.sleep(0.3)

        session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
        image = np.random.default_rng(7).random((1, 28, 28)).astype(np.float32)
        status, body = _infer(port, "digits", image)
        assert status == 200, body
        glance = session.run(None, {"image": image[None]})[0][0]
        p = np.exp(glance - glance.max())
        sure = p.max() / p.sum() >= 0.9
        views = np.stack([image[:, :, ::-1], image[:, ::-1, :]])
        want = np.zeros((0, 10), np.float32) if sure else session.run(None, {"image": views})[0]
        out = {o["name"]: o for o in body["outputs"]}
        got = np.asarray(out["recheck.logits"]["data"], np.float32).reshape(out["recheck.logits"]["shape"])
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        assert body["parameters"]["lane.glance"] == body["parameters"]["lane.recheck"] == "digitnet"

        status, body = _infer(port, "fussy", -image)  # the transform raises: this request fails alone
        assert status == 500, body
        assert "a negative first pixel" in body["error"] and "fussy:fussy" in body["error"]
        status, body = _infer(port, "fussy", image)  # the same workers go on serving
        assert status == 200, body
        status, body = _infer(port, "digits", image)
        assert status == 200, body
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_jigsawd_exits_naming_the_variant_and_file_it_cannot_load(workdir: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    model_dir = workdir / "models" / "digitnet" / "1"
    model_dir.mkdir(parents=True)
    (model_dir / "model.onnx").write_bytes(b"\x08\x07")  # a protobuf, but no graph onnxruntime can run
    (workdir / "profiles").mkdir()
    (workdir / "profiles" / "digitnet.csv").write_text(
        "variant,mig_profile,mps,batch,latency_ms,throughput_rps,memory_mb,source\n"
        "digitnet,1c,1,1,1.0,1000,10,measured\ndigitnet,1c,1,4,2.0,2000,10,measured\n")
    node = str(workdir / "cpu.toml")
    done = _run(env, "-m", "jigsaw.daemon", "--node-config", node, "--port", str(_free_port()),
                "--demand", "1", timeout_s=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "digitnet" in done.stderr and "model.onnx" in done.stderr
    assert "Traceback" not in done.stderr


def _get(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_an_app_that_cannot_load_fails_alone(workdir: Path) -> None:
    """A node with ``digits`` and a twin whose transform cannot be imported: ``jigsaw check`` says
    which app and why, ``jigsawd`` serves ``digits``, answers the twin's readiness and requests 503
    with the reason, and reports the node not ready (every app must serve, as Triton does)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    done = _run(env, str(workdir / "export_digitnet.py"))
    assert done.returncode == 0, done.stderr[-2000:]
    app = (workdir / "digits.toml").read_text()
    (workdir / "broken.toml").write_text(app.replace('name = "digits"', 'name = "broken"')
                                         .replace("second_look:second_look", "nowhere:nothing"))
    (workdir / "node.toml").write_text((workdir / "node.toml").read_text().replace(
        '"fussy.toml"]', '"broken.toml"]'))
    (workdir / "profiles").mkdir()
    (workdir / "profiles" / "digitnet.csv").write_text(
        "variant,mig_profile,mps,batch,latency_ms,throughput_rps,memory_mb,source\n"
        "digitnet,1c,1,1,1.0,1000,10,measured\ndigitnet,1c,1,4,2.0,2000,10,measured\n")
    check = _run(env, "-m", "jigsaw.cli", "check", str(workdir / "broken.toml"))
    assert check.returncode == 1 and "nowhere" in check.stderr and "broken.toml" in check.stderr, check
    check = _run(env, "-m", "jigsaw.cli", "check", str(workdir / "digits.toml"))
    assert check.returncode == 0 and "load under onnxruntime" in check.stdout, check
    check = _run(env, "-m", "jigsaw.cli", "check", str(workdir / "node.toml"))
    assert check.returncode == 1 and "app broken will not be served" in check.stderr, check

    args = ["--node-config", str(workdir / "node.toml"), "--demand", "5"]
    port = free_port()
    server = ServerProcess(jigsawd_command(args, port, emulate=False), port, workdir / "jigsawd.log",
                           ready_path="/v2/models/digits/ready", name="jigsawd", ready_timeout_s=120)
    with server:
        status, body = _get(port, "/v2/models/broken/ready")
        assert status == 503 and body["ready"] is False and "nowhere" in body["error"], body
        assert _get(port, "/v2/health/ready") == (503, {"ready": False})
        assert _get(port, "/v2/health/live")[0] == 200
        image = np.random.default_rng(7).random((1, 28, 28)).astype(np.float32)
        assert _infer(port, "digits", image)[0] == 200
        status, body = _infer(port, "broken", image)
        assert status == 503 and "nowhere" in body["error"], body
    err = server.log()
    assert "broken: not served" in err and "Traceback" not in err, err[-2000:]

