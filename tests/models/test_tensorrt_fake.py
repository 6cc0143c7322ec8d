"""The TensorRT backend's torch bindings against a fake ``tensorrt`` that keeps its rules
(``fake_tensorrt``): the same device pipeline as the torch backend, the engine bound by
``data_ptr()`` and run on the current stream, its answers equal to torch's.

Tolerance: labels, counts and crops equal; boxes within 1e-3 pixels (scaled by the box size),
scores within a relative 1e-3 (onnxruntime's kernels against torch's on the same pixels).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not installed (pip install 'jigsaw[models]')")

import fake_tensorrt  # noqa: E402

from jigsaw.backends import tensorrt_backend  # noqa: E402
from jigsaw.backends.base import Downstream  # noqa: E402
from jigsaw.backends.tensorrt_backend import TensorRTBackend  # noqa: E402
from jigsaw.backends.torch_backend import TorchBackend  # noqa: E402
from jigsaw.models.images import street_scene  # noqa: E402
from jigsaw.tensors import Tensor, decode_tensors, encode_tensors  # noqa: E402


@pytest.fixture
def fake_trt(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt)
    monkeypatch.setattr(tensorrt_backend, "available", lambda: (True, ""))
    yield fake_tensorrt


def _payload(img: np.ndarray) -> bytes:
    return bytes(encode_tensors([Tensor("image", "UINT8", img.shape, img)]))


def _outputs(r: Any) -> dict[str, np.ndarray]:
    assert not r.error
    return {t.name: t.data for t in r.outputs}


def test_detector_engine_answers_as_torch_does(fake_trt: Any) -> None:
    downstream = [Downstream("caption", 2.0)]
    trt_be = TensorRTBackend("detect", "detector", downstream, threads=1)
    trt_be.load("yolov5n", 4)
    builds = fake_trt.Builder.builds
    assert trt_be.device_pipeline is not None and trt_be._net.dtype == torch.float32
    torch_be = TorchBackend("detect", "detector", downstream, threads=1)
    torch_be.load("yolov5n", 4)
    for be in (trt_be, torch_be):
        be.pipeline.conf_threshold = 1e-4  # a random network's scores are tiny: keep many boxes
    payloads = [_payload(street_scene(120, 200, seed=s)) for s in range(3)]
    runs = fake_trt._Context.executions
    got, want = trt_be.execute([0, 1, 2], payloads), torch_be.execute([0, 1, 2], payloads)
    assert fake_trt._Context.executions == runs + 1  # one engine run for the batch
    for a, b in zip(got, want):
        ga, wb = _outputs(a), _outputs(b)
        assert ga["num_boxes"] == wb["num_boxes"] and int(wb["num_boxes"][0]) > 0
        np.testing.assert_array_equal(ga["labels"], wb["labels"])
        np.testing.assert_allclose(ga["scores"], wb["scores"], rtol=1e-3)
        np.testing.assert_allclose(ga["boxes"], wb["boxes"], atol=1e-3 * 200)
        crops = [{t.name: t.data for t in decode_tensors(p)}["image"] for p in a.children["caption"]]
        assert len(crops) == 2 and all(c.dtype == np.uint8 and c.shape == (64, 64, 3) for c in crops)
    # the engine is cached beside the ONNX file: a second process loads it, builds nothing
    again = TensorRTBackend("detect", "detector", downstream, threads=1)
    again.load("yolov5n", 4)
    again.warm_up([1, 2, 3, 4])
    assert fake_trt.Builder.builds == builds


def test_bindings_keep_the_profile_and_the_stream_rules(fake_trt: Any) -> None:
    be = TensorRTBackend("c", "classifier", threads=1)
    be.load("efficientnet-b0", 2)
    engine = be._net
    side = engine.item_shape[-1]
    assert engine(torch.zeros(2, 3, side, side)).shape == (2, 1000)
    with pytest.raises(RuntimeError, match="outside the profile"):
        engine(torch.zeros(3, 3, side, side))  # over max_batch: TensorRT refuses the shape
    ctx = engine.bind.context
    ctx.set_tensor_address(engine.bind.outputs[0], 0)
    assert not ctx.execute_async_v3(0)  # an unbound output fails the enqueue
    (res,) = be.execute([0], [_payload(street_scene(50, 80))])
    assert {t.name for t in res.outputs} >= {"label", "score"}
