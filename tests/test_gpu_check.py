"""``scripts/gpu-check``'s CPU-runnable parts: its files and steps (``--dry-run``), and the load
generator it serves through (``bench/serve_load.py``) against a real ``jigsawd --emulate``: the
first requests after ready, closed-loop load, answers compared with a reference."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import uvloop

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_check  # noqa: E402
import serve_load  # noqa: E402

from jigsaw.testing import jigsawd  # noqa: E402


def test_dry_run_writes_loadable_nodes_and_lists_every_step(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--dry-run", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    for step in ("doctor", "pipeline", "profile", "serve-classifier", "serve-detector"):
        assert f"  {step}" in done.stdout
    node = (tmp_path / "node.toml").read_text()
    assert "mig = false" in node and 'solver = "highs"' in node and "mps_levels = [1, 2, 4]" in node
    assert "batch_sizes = [1, 8, 32]" in node
    assert "node.toml: 1 x GPU (gpu, gpu-1of4), backend torch, apps gc_classify, gc_detect" in done.stdout
    assert (tmp_path / "reference-profiles" / "efficientnet-b0.csv").exists()  # the CPU path plans


def test_model_names_and_the_json_a_bench_prints() -> None:
    assert gpu_check.model_name("NVIDIA H200", 139.8) == "H200"
    assert gpu_check.model_name("NVIDIA H100 80GB HBM3", 79.2) == "H100-80GB"
    assert gpu_check.model_name("NVIDIA L4", 22.0) == "NVIDIA-L4"
    out = 'loading...\n{"rows": [{"variant": "vgg11", "batch": 32, "alone_items_s": 100.0, ' \
          '"served_items_s": 80.0}]}\n'
    rows = gpu_check._records(gpu_check._last_json(out))
    assert rows == [{"variant": "vgg11", "batch": 32, "alone_items_s": 100.0, "served_items_s": 80.0}]
    assert gpu_check._efficiency(rows[0]) == pytest.approx(0.8)
    # bench/gpu_pipeline.py's file: {"machine": ..., "rows": [...]} with its own efficiency
    doc = {"machine": {"device": "cuda"}, "rows": [{"variant": "yolov5s", "kind": "detector", "batch": 8,
                                                    "alone_items_s": 900.0, "served_items_s": 450.0,
                                                    "efficiency": 0.5}]}
    assert gpu_check._efficiency(gpu_check._records(doc)[0]) == 0.5
    assert gpu_check._last_json("no json here") is None


def test_answers_match_within_the_stated_tolerance() -> None:
    ref = {"c.label": np.array([3.0]), "c.score": np.array([0.5]), "c.box": np.zeros((1, 4))}
    assert serve_load.same_answer(dict(ref), ref, serve_load.INTEGER_OUTPUTS) == ""
    near = {**ref, "c.score": np.array([0.52])}  # within 0.02 + 1% of 0.5
    assert serve_load.same_answer(near, ref, serve_load.INTEGER_OUTPUTS) == ""
    far = {**ref, "c.score": np.array([0.6])}
    assert "c.score: max difference" in serve_load.same_answer(far, ref, serve_load.INTEGER_OUTPUTS)
    other = {**ref, "c.label": np.array([4.0])}
    assert serve_load.same_answer(other, ref, serve_load.INTEGER_OUTPUTS).startswith("c.label:")
    boxes = {"num_boxes": np.array([1.0]), "boxes": np.array([[100.0, 50, 200, 150]])}
    moved = {**boxes, "boxes": np.array([[101.0, 50, 200, 151]])}  # 1 px at 100-150 px: within 1%
    assert serve_load.same_answer(moved, boxes, serve_load.INTEGER_OUTPUTS) == ""
    assert serve_load.same_answer(None, boxes, serve_load.INTEGER_OUTPUTS) == "no answer"
    got = serve_load.compare([ref, far, None], [ref, ref, ref])
    assert (got["matched"], got["samples"]) == (1, 3) and len(got["mismatches"]) == 2
    report = {"first": {"failures": 1, "sent": 200, "statuses": {"200": 199, "504": 1}},
              "load": {"ok": 10, "statuses": {"200": 10}}, "answers": got}
    failed = serve_load.failed_checks(report)
    assert len(failed) == 2 and "1 of the first 200" in failed[0] and "1 of 3 answers" in failed[1]


def test_the_load_generator_against_a_real_daemon(tmp_path: Path) -> None:
    app = tmp_path / "classify.toml"
    app.write_text(gpu_check.APP.format(name="cls", slo=650, task="classify", kind="classifier",
                                        variant="efficientnet-b0"))
    node = tmp_path / "node.toml"
    node.write_text(textwrap.dedent(f"""
        name = "emulated"
        apps = ["{app}"]
        [gpus]
        model = "H100-80GB"
        count = 1
        mps_levels = [1]
        batch_sizes = [1, 2, 4, 8]
        profiles_dir = "{ROOT / 'profiles' / 'h100-80gb'}"
        backend = "tensorrt"
    """))
    images = [serve_load.binary_request(im) for im in serve_load.make_images(4, 32)]
    assert images[0][1][serve_load.HEADER_LENGTH].isdigit() and len(images[0][0]) > 32 * 32 * 3
    with jigsawd(["--node-config", str(node), "--demand", "50", "--no-controller"],
                 tmp_path / "jigsawd.log") as server:
        infer = f"{server.url}/v2/models/cls/infer"
        first = uvloop.run(serve_load.run_phase(infer, images, 4, count=20))
        load = uvloop.run(serve_load.run_phase(infer, images, 4, seconds=1.0))
        answers = uvloop.run(serve_load.collect_answers(infer, images[:2]))
        bad = [serve_load.binary_request(np.zeros((2, 2), np.uint8))]  # not an image: a 400
        refused = uvloop.run(serve_load.run_phase(infer, bad, 1, count=2))
    assert first.sent == 20 and first.failures == 0, first.statuses
    summary = load.summary()
    assert summary["ok"] > 0 and summary["p50_ms"] <= summary["p99_ms"] and summary["answers_per_s"] > 0
    assert all(a is not None and {"classify.label", "classify.score"} <= set(a) for a in answers), answers
    assert serve_load.compare(answers, answers)["fraction"] == 1.0
    assert refused.failures == 2 and refused.statuses[400] == 2
