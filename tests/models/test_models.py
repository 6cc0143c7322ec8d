"""Model zoo, ONNX export, backends, pre/post-processing, the profile command."""

from __future__ import annotations

import csv
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from jigsaw.backends.base import Downstream
from jigsaw.tensors import decode_tensors, encode_tensors

torch = pytest.importorskip("torch", reason="torch not installed (pip install 'jigsaw[models]')")


def _image_payload(img: np.ndarray) -> bytes:
    return bytes(encode_tensors([("image", "UINT8", img.shape, img)]))


@pytest.mark.parametrize("size,channels", [("n", 32), ("s", 64)])
def test_yolo_shapes_and_widths(size: str, channels: int) -> None:
    from jigsaw.models.yolo import YoloV5
    m = YoloV5(size).eval()
    assert m.b1.conv.out_channels == channels  # width multiple 0.25 / 0.5 of 128
    with torch.inference_mode():
        y = m(torch.rand(2, 3, 160, 160))
    assert y.shape == (2, 3 * (20 * 20 + 10 * 10 + 5 * 5), 85)
    assert float(y[..., 4:].min()) >= 0 and float(y[..., 4:].max()) <= 1


def test_variant_table_covers_every_example_app() -> None:
    from jigsaw.app import load_app
    from jigsaw.models.zoo import variant_info
    apps = Path(__file__).resolve().parents[2] / "examples" / "apps"
    for f in apps.glob("*.toml"):
        for t in load_app(f).tasks:
            for v in t.variants:
                assert variant_info(v.name).kind == t.kind, (f.name, v.name)


@pytest.mark.parametrize("name,shape", [("efficientnet-b0", (2, 1000)), ("vgg11", (2, 1000))])
def test_classifier_builders(name: str, shape: tuple[int, int]) -> None:
    from jigsaw.models.zoo import build
    with torch.inference_mode():
        assert tuple(build(name)(torch.rand(2, 3, 64, 64)).shape) == shape


def test_captioner_and_tts_builders() -> None:
    from jigsaw.models.text import build_git, build_vits, caption, speak
    git = build_git("tiny").eval()
    toks = caption(git, torch.rand(2, 3, 32, 32))
    assert toks.shape == (2, 16)
    waves = speak(build_vits("tiny").eval(), toks)
    assert len(waves) == 2 and all(w.ndim == 1 and w.numel() > 0 for w in waves)


def test_random_init_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    from jigsaw.models import zoo
    zoo._warned.discard("yolov5n")
    with caplog.at_level("WARNING", logger="jigsaw.models"):
        zoo.build("yolov5n")
        zoo.build("yolov5n")
    assert sum("randomly initialised" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize("name", ["yolov5n", "efficientnet-b0", "git-tiny"])
def test_onnx_export_matches_torch_and_is_cached(name: str) -> None:
    from jigsaw.models.export import export
    ex = export(name, force=True)
    assert ex.path.exists() and ex.max_abs_error < 1e-3
    again = export(name)
    assert again.path == ex.path and again.seconds == 0.0  # from the cache
    import onnxruntime as ort
    sess = ort.InferenceSession(str(ex.path), providers=["CPUExecutionProvider"])
    out = sess.run(None, {ex.input_name: np.random.rand(3, *ex.input_shape).astype(np.float32)})[0]
    assert out.shape[0] == 3  # dynamic batch axis


def test_nms_on_hand_made_boxes() -> None:
    from jigsaw.models.yolo import postprocess
    # postprocess: (cx, cy, w, h, obj, classes...) with 3 classes; two overlapping cars, one person
    pred = np.zeros((1, 4, 8), np.float32)
    pred[0, 0] = [5, 5, 10, 10, 0.9, 0, 0, 1.0]   # class 2, score 0.9
    pred[0, 1] = [6, 6, 10, 10, 0.8, 0, 0, 1.0]   # suppressed by 0
    pred[0, 2] = [6, 6, 10, 10, 0.8, 1.0, 0, 0]   # class 0: other class, kept (class-aware)
    pred[0, 3] = [30, 30, 4, 4, 0.1, 1.0, 0, 0]   # below the confidence threshold
    (d,) = postprocess(pred)
    assert d.shape == (2, 6) and sorted(d[:, 5].tolist()) == [0.0, 2.0]
    np.testing.assert_allclose(d[0, :4], [0, 0, 10, 10])
    (only_cars,) = postprocess(pred, classes={2})
    assert only_cars[:, 5].tolist() == [2.0]
    # the batch in one NMS call: an image's boxes never suppress another's; max_det per image
    two = np.concatenate([pred, pred, np.zeros_like(pred)])
    a, b, none = postprocess(two)
    np.testing.assert_array_equal(a, d)
    np.testing.assert_array_equal(b, d)
    assert none.shape == (0, 6)
    assert [len(x) for x in postprocess(two, max_det=1)] == [1, 1, 0]


def test_letterbox_and_crop() -> None:
    from jigsaw.backends.pipeline import letterbox
    from jigsaw.models.images import crop
    img = np.zeros((100, 200, 3), np.uint8)
    img[40:60, 90:110] = 255
    canvas, r, (px, py) = letterbox(img, 64)
    assert canvas.shape == (64, 64, 3) and r == pytest.approx(0.32) and (px, py) == (0, 16)
    c = crop(img, np.array([90, 40, 110, 60], np.float32), 32)
    assert c.shape == (32, 32, 3) and c.min() == 255
    edge = crop(img, np.array([-5, -5, 0.2, 0.2], np.float32), 8)  # degenerate box: still 1 pixel
    assert edge.shape == (8, 8, 3)


def test_detector_fan_out_is_the_detections() -> None:
    from jigsaw.backends.onnxruntime_backend import OnnxRuntimeBackend
    from jigsaw.models.images import street_scene
    downstream = [Downstream("car", 2.0), Downstream("person", 0.6)]
    be = OnnxRuntimeBackend("detect", "detector", downstream, threads=1)
    be.load("yolov5n", 4)
    imgs = [street_scene(120, 200, seed=s) for s in range(3)]
    results = be.execute([1, 2, 3], [_image_payload(i) for i in imgs])
    assert len(results) == 3
    for img, r in zip(imgs, results):
        out = {t.name: t for t in r.outputs}
        n = int(out["num_boxes"].data[0])
        boxes, scores, labels = out["boxes"].data, out["scores"].data, out["labels"].data
        assert boxes.shape == (n, 4) and scores.shape == (n,) and labels.shape == (n,)
        assert (boxes[:, 0] >= 0).all() and (boxes[:, 2] <= img.shape[1]).all()
        assert (boxes[:, 1] >= 0).all() and (boxes[:, 3] <= img.shape[0]).all()
        assert ((scores >= 0) & (scores <= 1)).all()
        assert len(r.children["car"]) == int(out["num_car"].data[0]) == int((labels == 2).sum())
        assert len(r.children["person"]) == int(out["num_person"].data[0]) == int((labels == 0).sum())
        for payload in r.children["car"]:
            t = {x.name: x for x in decode_tensors(payload)}
            assert t["image"].data.shape == (64, 64, 3)


def test_onnxruntime_classifier_batch_and_torch_agree() -> None:
    from jigsaw.backends.onnxruntime_backend import OnnxRuntimeBackend
    from jigsaw.backends.torch_backend import TorchBackend
    from jigsaw.models.images import street_scene
    payloads = [_image_payload(street_scene(64, 64, seed=s)) for s in range(4)]
    outs = []
    for cls in (OnnxRuntimeBackend, TorchBackend):
        be = cls("car", "classifier", threads=1)
        be.load("efficientnet-b0", 4)
        res = be.execute(list(range(4)), payloads)
        assert len(res) == 4
        outs.append([int(r.outputs[0].data[0]) for r in res])
        assert all(0 <= float(r.outputs[1].data[0]) <= 1 for r in res)
    assert outs[0] == outs[1]


def test_captioner_feeds_tts() -> None:
    from jigsaw.backends.onnxruntime_backend import OnnxRuntimeBackend
    from jigsaw.models.images import street_scene
    cap = OnnxRuntimeBackend("caption", "captioner", [Downstream("speak", 1.0)], threads=1)
    cap.load("git-tiny", 2)
    (r,) = cap.execute([1], [_image_payload(street_scene(32, 32))])
    assert r.outputs[0].name == "tokens" and r.outputs[0].shape == (1, 16)
    tts = OnnxRuntimeBackend("speak", "tts", threads=1)
    tts.load("vits-tiny", 2)
    (a,) = tts.execute([1], r.children["speak"])
    out = {t.name: t for t in a.outputs}
    assert out["audio"].shape[1] == int(out["audio_samples"].data[0]) > 0


def test_tensorrt_backend_skips_without_gpu() -> None:
    from jigsaw.backends.tensorrt_backend import available
    ok, why = available()
    if not ok:
        pytest.skip(f"no TensorRT GPU path here: {why}")
    from jigsaw.backends.tensorrt_backend import TensorRTBackend
    be = TensorRTBackend("car", "classifier")
    be.load("efficientnet-b0", 4)
    from jigsaw.models.images import street_scene
    assert len(be.execute([1, 2], [_image_payload(street_scene(64, 64, seed=s)) for s in range(2)])) == 2


def _cpu_node(tmp_path: Path) -> Path:
    apps = Path(__file__).resolve().parents[2] / "examples" / "apps"
    node = tmp_path / "node.toml"
    node.write_text(f'name = "t"\napps = ["{apps / "traffic_cpu.toml"}"]\n[gpus]\nmodel = "CPU-2C"\n'
                    f'count = 1\nmig_profiles = ["1c"]\nmps_levels = [1]\nbatch_sizes = [1, 2]\n'
                    f'profiles_dir = "{tmp_path / "prof"}"\nbackend = "onnxruntime"\n')
    return node


def test_profile_writes_measured_rows_and_resumes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from jigsaw.cli import main
    from jigsaw.profiles import load_profiles
    node = _cpu_node(tmp_path)
    args = ["profile", "--node", str(node), "--variants", "efficientnet-b0", "--batches", "1",
            "--seconds", "0.1", "--max-iters", "3"]
    assert main(args) == 0
    path = tmp_path / "prof" / "efficientnet-b0.csv"
    rows = [r for r in csv.DictReader(ln for ln in path.read_text().splitlines() if not ln.startswith("#"))]
    assert len(rows) == 1 and rows[0]["source"] == "measured" and rows[0]["mig_profile"] == "1c"
    assert "onnxruntime" in rows[0]["backend"] and rows[0]["host"] and rows[0]["date"]
    assert float(rows[0]["latency_ms"]) > 0 and float(rows[0]["throughput_rps"]) > 0
    # resumes: the existing row is skipped, only batch 2 is measured
    assert main([*args[:-6], "--batches", "1,2", "--seconds", "0.1", "--max-iters", "3"]) == 0
    table = load_profiles(tmp_path / "prof")
    assert sorted(r.batch for r in table.rows("efficientnet-b0")) == [1, 2]
    assert table.sources == {"measured"}
    assert main(args) == 0
    assert "already measured" in capsys.readouterr().err


def test_profile_measures_cpu_shares_together(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Four declared cores on one real CPU: a 1c share is measured by four copies pinned to it."""
    from jigsaw import profiler
    from jigsaw.cli import main
    from jigsaw.profiles import load_profiles
    node = _cpu_node(tmp_path)
    node.write_text(node.read_text().replace('model = "CPU-2C"', 'model = "CPU-4C"'))
    launched: list[list[str]] = []
    real_run_copies = profiler.run_copies

    def run_copies(argvs, env, what):  # type: ignore[no-untyped-def]
        launched.extend(list(a) for a in argvs)
        return real_run_copies(argvs, env, what)

    monkeypatch.setattr(profiler, "run_copies", run_copies)
    original = os.sched_getaffinity(0)
    cpu = min(original)
    os.sched_setaffinity(0, {cpu})
    try:
        assert main(["profile", "--node", str(node), "--variants", "efficientnet-b0", "--batches", "1",
                     "--seconds", "0.1", "--max-iters", "3"]) == 0
    finally:
        os.sched_setaffinity(0, original)
    assert f"1c: 4 shares run at once on CPUs [{cpu}]" in capsys.readouterr().err
    assert len(launched) == 4  # the four copies pinned to the CPU, waiting for each other at every row
    for argv in launched:
        assert argv[argv.index("--cpus") + 1] == str(cpu) and argv[argv.index("--copies") + 1] == "4"
    (row,) = load_profiles(tmp_path / "prof").rows("efficientnet-b0")
    assert row.source == "measured" and row.mps == 1 and row.batch == 1 and row.throughput_rps > 0
    assert f"4 shares on CPUs {cpu}" in row.host


def test_profile_on_a_gpu_node_needs_the_driver_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    from jigsaw.cli import main
    h100 = Path(__file__).resolve().parents[2] / "examples" / "h100x4.toml"
    assert main(["profile", "--node", str(h100), "--variants", "yolov5n"]) == 2


def test_cpu_node_plans_from_measured_profiles() -> None:
    root = Path(__file__).resolve().parents[2]
    if not (root / "profiles" / "cpu-2c").is_dir():
        pytest.skip("no measured CPU profiles in profiles/cpu-2c")
    from jigsaw.node import load_node, load_node_profiles
    from jigsaw.planner.milp import plan
    node = load_node(root / "examples" / "cpu.toml")
    profiles = load_node_profiles(node)
    assert profiles.sources == {"measured"}
    p = plan(node.apps[0], node, profiles, 2.0)
    assert p.instances and p.slices_used <= node.slices_available


if sys.platform != "linux":  # pragma: no cover
    pytest.skip("sched_setaffinity is Linux-only", allow_module_level=True)
