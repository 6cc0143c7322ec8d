"""The device pipeline (``jigsaw.backends.gpu_pipeline``) on the CPU device equals the numpy path.

Tolerance: labels, detection counts, classes and crops (uint8) are equal; boxes within 1e-3
pixels and scores within a relative 1e-4 (the same network on the same pixels; only the order
of float operations differs between the numpy and torch normalisation).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not installed (pip install 'jigsaw[models]')")

from jigsaw.backends.base import Downstream, ItemResult  # noqa: E402
from jigsaw.backends.gpu_pipeline import GpuPipeline, Staging, batch_buckets  # noqa: E402
from jigsaw.backends.pipeline import Pipeline  # noqa: E402
from jigsaw.backends.torch_backend import TorchBackend, TorchEngine  # noqa: E402
from jigsaw.models.images import street_scene  # noqa: E402
from jigsaw.tensors import Tensor, decode_tensors, encode_tensors  # noqa: E402


def _payload(img: np.ndarray, box: np.ndarray | None = None) -> bytes:
    ts = [Tensor("image", "UINT8", img.shape, img)]
    if box is not None:
        ts.append(Tensor("box", "FP32", (1, 4), box.reshape(1, 4).astype(np.float32)))
    return bytes(encode_tensors(ts))


def _host(be: TorchBackend, payloads: list[bytes]) -> list[ItemResult]:
    """The numpy path around the same module: ``Pipeline.prepare`` -> network -> ``finish``."""
    batch, ctx = be.pipeline.prepare(payloads)
    with torch.inference_mode():
        out = be._net.module(torch.from_numpy(batch)).numpy()
    return be.pipeline.finish(out, ctx)  # type: ignore[no-any-return]


def _same_tensors(a: list[Tensor], b: list[Tensor]) -> None:
    got, want = {t.name: t.data for t in a}, {t.name: t.data for t in b}
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
        if value.dtype.kind == "f":
            np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-3, err_msg=name)
        else:  # labels, counts, crops' pixels
            np.testing.assert_array_equal(got[name], value, err_msg=name)


def _same(a: ItemResult, b: ItemResult) -> None:
    assert a.error == b.error == ""
    _same_tensors(a.outputs, b.outputs)
    assert a.children.keys() == b.children.keys()
    for task in b.children:
        assert len(a.children[task]) == len(b.children[task])
        for x, y in zip(a.children[task], b.children[task]):
            _same_tensors(decode_tensors(x), decode_tensors(y))


@pytest.fixture(scope="module")
def detector() -> TorchBackend:
    downstream = [Downstream("car", 2.0), Downstream("caption", 3.0)]
    be = TorchBackend("detect", "detector", downstream, threads=1)
    be.load("yolov5n", 8)
    be.pipeline.conf_threshold = 1e-4  # a random network's scores are tiny: keep many boxes
    return be


def test_detector_on_the_device_path_equals_the_numpy_path(detector: TorchBackend) -> None:
    assert detector.device_pipeline is not None
    imgs = [street_scene(120, 200, seed=1), street_scene(200, 90, seed=2), street_scene(160, 160, seed=3),
            street_scene(120, 200, seed=4)]  # mixed shapes: letterboxed both ways, and none
    payloads = [_payload(i) for i in imgs]
    got, want = detector.execute([0, 1, 2, 3], payloads), _host(detector, payloads)
    assert sum(int(r.outputs[0].data[0]) for r in want) > 8  # boxes and crops were compared
    assert sum(len(c) for r in want for c in r.children.values()) > 0  # crops too
    for a, b in zip(got, want):
        _same(a, b)


def test_classifier_on_the_device_path_equals_the_numpy_path() -> None:
    be = TorchBackend("car", "classifier", [Downstream("next", 1.0)], threads=1)
    be.load("resnet18", 4)
    imgs = [street_scene(64, 64, seed=5), street_scene(30, 50, seed=6), street_scene(100, 70, seed=7)]
    payloads = [_payload(imgs[0], np.array([1, 2, 3, 4])), _payload(imgs[1]), _payload(imgs[2])]
    got, want = be.execute([0, 1, 2], payloads), _host(be, payloads)
    for a, b in zip(got, want):
        _same(a, b)
        assert a.children["next"]  # the classifier's outputs passed on downstream
    assert {t.name for t in got[0].outputs} == {"label", "score", "box"}


def test_a_bad_item_fails_alone(detector: TorchBackend) -> None:
    good = _payload(street_scene(64, 96, seed=8))
    res = detector.execute([0, 1, 2], [good, b"not tensors", good])
    assert res[1].error.startswith("bad input") and not res[1].outputs
    assert res[0].error == res[2].error == "" and res[0].outputs[0].data[0] == res[2].outputs[0].data[0]


class RecordingEngine:
    """An engine that records what it is given and answers a fixed detector output."""

    def __init__(self, dtype: Any, channels_last: bool) -> None:
        self.device, self.dtype, self.channels_last = torch.device("cpu"), dtype, channels_last
        self.seen: list[Any] = []

    def __call__(self, x: Any) -> Any:
        self.seen.append(x)
        pred = torch.zeros(x.shape[0], 3, 85)
        pred[:, 0] = torch.tensor([40.0, 40, 20, 20, 0.9] + [0.0] * 80)
        pred[:, 0, 5 + 2] = 1.0  # a car
        return pred

    def warm_up(self, batch_sizes: Any) -> None:
        pass


@pytest.mark.parametrize("channels_last", [True, False])
def test_the_engine_gets_its_dtype_and_layout_and_letterboxed_pixels(channels_last: bool) -> None:
    engine = RecordingEngine(torch.float64, channels_last)
    pipe = GpuPipeline(Pipeline("yolov5n", "detector"), engine, 2)
    img = np.full((40, 160, 3), 255, np.uint8)
    (res,) = pipe([_payload(img)])
    (x,) = engine.seen
    assert x.dtype == torch.float64 and x.shape == (1, 3, 160, 160)
    assert x.is_contiguous(memory_format=torch.channels_last) == channels_last
    assert x[0, :, 80, 80].tolist() == [1.0, 1.0, 1.0]  # the image, scaled to [0, 1]
    assert x[0, :, 0, 0].tolist() == pytest.approx([114 / 255] * 3)  # the letterbox fill
    out = {t.name: t.data for t in res.outputs}
    assert out["num_boxes"].tolist() == [1] and out["labels"].tolist() == [2]
    # the box (30..50 on the 160 canvas, image rows 60..100 of it) back in the image's pixels
    np.testing.assert_allclose(out["boxes"], [[30, 0, 50, 0]], atol=1e-4)


def test_two_batches_in_flight_and_no_more() -> None:
    engine = RecordingEngine(torch.float32, False)
    pipe = GpuPipeline(Pipeline("yolov5n", "detector"), engine, 2)
    a = pipe.submit([_payload(street_scene(32, 32, seed=1))])
    b = pipe.submit([_payload(street_scene(48, 32, seed=2))] * 2)  # the other slot's buffers
    with pytest.raises(RuntimeError, match="in flight"):
        pipe.submit([_payload(street_scene(32, 32))])
    assert len(pipe.collect(a)) == 1 and len(pipe.collect(b)) == 2
    assert len(pipe([_payload(street_scene(600, 700))])) == 1  # larger than staged for: grows
    with pytest.raises(ValueError, match="max_batch"):
        pipe.submit([_payload(street_scene(32, 32))] * 3)


def test_staging_pins_only_for_cuda_and_buckets() -> None:
    s = Staging(64, torch.device("cpu"))
    assert s.dev is s.host and not s.host.is_pinned()
    s.reserve(1000)
    assert s.host.numel() >= 1000
    assert batch_buckets(1) == [1] and batch_buckets(12) == [1, 2, 4, 8, 12]
    assert batch_buckets(32) == [1, 2, 4, 8, 16, 32]


def test_torch_engine_warm_up_runs_every_size_and_serves_any() -> None:
    from jigsaw.models.zoo import build
    engine = TorchEngine(build("resnet18"), torch.device("cpu"), torch.float32, 64)
    engine.warm_up([1, 2, 4])
    assert engine.warmed == [1, 2, 4] and not engine.graphs  # graphs are CUDA's
    assert engine(torch.zeros(3, 3, 64, 64)).shape == (3, 1000)


def test_backend_warm_up_runs_whole_batches_before_serving(detector: TorchBackend) -> None:
    detector.warm_up(range(1, 9))
    assert detector.warmed == [1]  # on the CPU one item; on CUDA every bucket (1, 2, 4, 8)
    from jigsaw.backends.warm import warm_batches
    assert warm_batches(range(1, 9), on_device=True) == [1, 2, 4, 8]
    assert warm_batches([], on_device=True) == []


def test_the_bench_prints_alone_beside_served(tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    import json
    import sys
    from pathlib import Path
    monkeypatch.setenv("JIGSAW_CLASSIFIER_SIZE", "64")  # restored after the bench sets its own
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    import gpu_pipeline
    out = tmp_path / "rows.json"
    assert gpu_pipeline.main(["--device", "cpu", "--variants", "resnet18", "--batches", "1,2",
                              "--seconds", "0", "--classifier-size", "32", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["variant"], r["batch"]) for r in rows] == [("resnet18", 1), ("resnet18", 2)]
    for r in rows:
        assert r["alone_items_s"] > 0 and r["served_items_s"] > 0 and r["overlapped_items_s"] > 0
        assert r["efficiency"] == pytest.approx(r["served_items_s"] / r["alone_items_s"])
        assert r["pipeline_ms"] > 0 and r["numpy_prepare_ms"] > 0
    assert "resnet18" in capsys.readouterr().out
    sys.modules.pop("gpu_pipeline", None)


def test_a_failing_engine_does_not_hold_its_slot() -> None:
    class Failing(RecordingEngine):
        def __call__(self, x: Any) -> Any:
            raise RuntimeError("engine failed")

    pipe = GpuPipeline(Pipeline("yolov5n", "detector"), Failing(torch.float32, False), 1)
    for _ in range(3):  # more failures than slots: each batch fails alone
        with pytest.raises(RuntimeError, match="engine failed"):
            pipe([_payload(street_scene(32, 32))])
    assert not any(s.busy for s in pipe.slots)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here: the CPU tests cover the code")
def test_on_cuda_the_pipeline_answers_as_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """fp32 on CUDA (eager, then replayed graphs) against the CPU device: the same answers;
    fp16 channels-last keeps labels and counts of a classifier."""
    payloads = [_payload(street_scene(120, 200, seed=s)) for s in range(5)]
    monkeypatch.setenv("JIGSAW_TORCH_PRECISION", "fp32")
    cuda = TorchBackend("detect", "detector", [Downstream("caption", 2.0)], threads=1)
    cuda.load("yolov5n", 8)
    assert cuda.device_pipeline is not None and cuda.device_pipeline.cuda
    assert cuda.device_pipeline.slots[0].staging.host.is_pinned()
    cuda.pipeline.conf_threshold = 1e-4
    eager = cuda.execute(list(range(5)), payloads)
    cuda.warm_up(range(1, 9))
    assert sorted(cuda._net.graphs) == [1, 2, 4, 8]
    replayed = cuda.execute(list(range(5)), payloads)  # padded to the 8-graph
    cpu = TorchBackend("detect", "detector", [Downstream("caption", 2.0)], threads=1)
    monkeypatch.setattr("jigsaw.backends.gpu_pipeline.process_device", lambda: torch.device("cpu"))
    cpu.load("yolov5n", 8)
    cpu.pipeline.conf_threshold = 1e-4
    want = cpu.execute(list(range(5)), payloads)
    for got in (eager, replayed):
        for a, b in zip(got, want):
            ga, wb = {t.name: t.data for t in a.outputs}, {t.name: t.data for t in b.outputs}
            assert ga["num_boxes"] == wb["num_boxes"]
            np.testing.assert_allclose(ga["boxes"], wb["boxes"], atol=0.05)


def test_channels_last_engine_answers_as_the_contiguous_one(detector: TorchBackend) -> None:
    """CUDA's layout (channels-last weights and input) through the same pipeline on the CPU."""
    from jigsaw.models.zoo import build
    engine = TorchEngine(build("yolov5n"), torch.device("cpu"), torch.float32, 160, channels_last=True)
    pipe = GpuPipeline(detector.pipeline, engine, 8)
    payloads = [_payload(street_scene(120, 200, seed=s)) for s in range(3)]
    got, want = pipe(payloads), detector.execute([0, 1, 2], payloads)
    for a, b in zip(got, want):
        _same(a, b)


def test_warm_up_survives_an_edge_transform_that_fails(tmp_path: Any,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """A transform that raises fails its items (at warm-up too), never the worker's start."""
    (tmp_path / "edges.py").write_text("def boom(inputs, outputs, edge):\n    raise ValueError('no')\n")
    be = TorchBackend("detect", "detector", [Downstream("next", 1.0, "edges:boom", str(tmp_path))], threads=1)
    be.load("yolov5n", 2)
    be.pipeline.conf_threshold = 1e-4
    be.warm_up([1, 2])
    assert be.warmed == [1] and "items failed" in caplog.text
