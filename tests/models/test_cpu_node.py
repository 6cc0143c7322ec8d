"""End to end: ``jigsawd --node-config examples/cpu.toml`` serves a real image on the CPU."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path

import pytest

from jigsaw.models.images import street_scene

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dataplane"))
from dpserver import worker_pids

from jigsaw.testing import ServerError, jigsawd

pytest.importorskip("onnxruntime", reason="onnxruntime not installed (pip install 'jigsaw[models]')")
ROOT = Path(__file__).resolve().parents[2]


def _allowed_cpus(pid: int) -> set[int]:
    line = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
                if ln.startswith("Cpus_allowed_list:"))
    cpus: set[int] = set()
    for part in line.split(":", 1)[1].strip().split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def test_cpu_node_serves_a_real_image(tmp_path: Path) -> None:
    if not (ROOT / "profiles" / "cpu-2c").is_dir():
        pytest.skip("no measured CPU profiles in profiles/cpu-2c")
    node = str(ROOT / "examples" / "cpu.toml")
    small = {"JIGSAW_DETECTOR_SIZE": "160", "JIGSAW_CLASSIFIER_SIZE": "64"}
    server = jigsawd(["--node-config", node, "--demand", "1"], tmp_path / "jigsawd.log", emulate=False,
                     ready_timeout_s=180.0, env=small)
    try:
        server.start()
    except ServerError as exc:
        err = str(exc)
        if "no usable GPU" in err or "not available in this build" in err:
            pytest.skip("jigsawd does not yet run a CPU backend without --emulate: " + err.strip()[-200:])
        pytest.fail(err[-2000:])
    port = server.port
    assert server.proc is not None
    proc = server.proc
    try:
        # every worker is pinned to its core share's CPUs (4 declared cores laid on the host's)
        host = os.sched_getaffinity(0)
        workers = worker_pids(proc.pid)
        assert workers
        for pid in workers:
            allowed = _allowed_cpus(pid)
            assert allowed <= host and len(allowed) <= 2
            assert len(allowed) < len(host) or len(host) == 1
        img = street_scene(240, 320, seed=3)
        body = {"inputs": [{"name": "image", "datatype": "UINT8", "shape": list(img.shape),
                            "data": img.reshape(-1).tolist()}]}
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/traffic_cpu/infer",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            resp = json.loads(r.read())
        out = {o["name"]: o for o in resp["outputs"]}
        params = resp["parameters"]
        assert params["backend"] == "onnxruntime" and params["emulated"] is False
        n_items = 0
        for task in ("car", "person"):
            labels, scores = out[f"{task}.label"], out[f"{task}.score"]
            n = labels["shape"][0]
            n_items += n
            assert scores["shape"] == [n] and all(0 <= s <= 1 for s in scores["data"])
            if n:
                boxes = out[f"{task}.box"]
                assert boxes["shape"] == [n, 4]
                b = boxes["data"]
                for i in range(n):
                    x1, y1, x2, y2 = b[4 * i:4 * i + 4]
                    assert 0 <= x1 <= x2 <= img.shape[1] and 0 <= y1 <= y2 <= img.shape[0]
        assert n_items == params.get("children.detect", 0)  # the fan-out is the detections
    finally:
        server.close()
