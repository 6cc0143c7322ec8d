"""ONNX export of a variant with a dynamic batch axis, cached on disk and checked against torch.

The cache directory is ``$JIGSAW_ONNX_CACHE`` or ``~/.cache/jigsaw/onnx``; a file is keyed by
variant, input size and weights (random init or the weights file's mtime), so a node's workers
and ``jigsaw profile`` share one export. TensorRT builds its engines from the same files.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jigsaw.models.zoo import _weights_file, build, variant_info

log = logging.getLogger("jigsaw.models")
OPSET = 17


@dataclass(frozen=True)
class Export:
    path: Path
    input_name: str
    input_shape: tuple[int, ...]  # per item (no batch axis)
    max_abs_error: float  # vs torch on random inputs, at export time (nan when loaded from cache)
    seconds: float


def cache_dir() -> Path:
    return Path(os.environ.get("JIGSAW_ONNX_CACHE", str(Path.home() / ".cache" / "jigsaw" / "onnx")))


def exportable(variant: str) -> bool:
    """Whether the variant's whole inference is one ONNX graph (captioner/TTS: only partly)."""
    return variant_info(variant).family in ("yolov5", "torchvision")


def _module_and_input(variant: str, weights: str | Path | None) -> tuple[object, str, tuple[int, ...]]:
    info = variant_info(variant)
    model = build(variant, weights=weights)
    if info.family == "git":
        from jigsaw.models.text import GitVisionEncoder
        return GitVisionEncoder(model).eval(), "pixel_values", (3, info.image_size, info.image_size)
    if info.family == "vits":
        raise ValueError(f"{variant}: VITS has a data-dependent output length; it runs with torch")
    return model, "images", (3, info.image_size, info.image_size)


def onnx_path(variant: str, weights: str | Path | None = None) -> Path:
    info = variant_info(variant)
    wf = _weights_file(variant, weights)
    tag = "random" if wf is None else f"w{int(wf.stat().st_mtime)}"
    return cache_dir() / f"{variant}-{info.image_size}-{tag}.onnx"


def check(model: object, path: Path, input_name: str, x: np.ndarray) -> float:
    """Max abs difference between onnxruntime on ``path`` and torch on ``x``."""
    import onnxruntime as ort
    import torch
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {input_name: x})[:1]
    with torch.inference_mode():
        want = model(torch.from_numpy(x)).numpy()  # type: ignore[operator]
    return float(np.max(np.abs(got - want)))


def export(variant: str, *, weights: str | Path | None = None, force: bool = False,
           check_batch: int = 2) -> Export:
    """The cached ONNX file of ``variant`` (exported now when missing or ``force``)."""
    import torch
    path = onnx_path(variant, weights)
    info = variant_info(variant)
    name = "pixel_values" if info.family == "git" else "images"
    shape = (3, info.image_size, info.image_size)
    if path.exists() and not force:
        return Export(path, name, shape, float("nan"), 0.0)
    t0 = time.perf_counter()
    model, name, shape = _module_and_input(variant, weights)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    dummy = torch.rand(check_batch, *shape)
    with torch.inference_mode():
        torch.onnx.export(model, (dummy,), str(tmp), input_names=[name], output_names=["output"],
                          dynamic_axes={name: {0: "batch"}, "output": {0: "batch"}},
                          opset_version=OPSET, dynamo=False)
    rng = np.random.default_rng(0)
    err = check(model, tmp, name, rng.random((check_batch + 1, *shape), dtype=np.float32))
    os.replace(tmp, path)  # atomic: concurrent workers never read a half-written file
    secs = time.perf_counter() - t0
    log.info("%s: exported to %s in %.1f s; max abs error vs torch %.3g", variant, path, secs, err)
    return Export(path, name, shape, err, secs)
