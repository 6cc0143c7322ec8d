"""Builders for every model variant of the example apps, by variant name.

A variant is built randomly initialised (seeded by its name, so every process of a node builds
the same network) unless weights are found: ``weights=`` a ``.pt``/``.pth``/``.safetensors``
state-dict file, or ``$JIGSAW_WEIGHTS_DIR/<variant>.{pt,pth,safetensors}``. Random
initialisation is logged once per variant. Nothing is ever downloaded: hub names are never
passed to ``from_pretrained`` and ``HF_HUB_OFFLINE`` is set before transformers is imported.

Image sizes: the detector's square input (default 640) and the classifiers' (default 224) can be
lowered with ``JIGSAW_DETECTOR_SIZE`` / ``JIGSAW_CLASSIFIER_SIZE`` (a CPU node trades accuracy
for latency that way; the profiles must be measured with the same values).
"""

from __future__ import annotations

import logging
import os
import zlib
from pathlib import Path
from typing import Any

from jigsaw.models.catalog import (  # noqa: F401  (re-exported: the zoo's names)
    VariantInfo,
    classifier_size,
    detector_size,
    variant_info,
)

log = logging.getLogger("jigsaw.models")
_warned: set[str] = set()

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

CAPTION_TOKENS = 16
TTS_TOKENS = CAPTION_TOKENS


def seed_of(name: str) -> int:
    return zlib.crc32(name.encode())


def _weights_file(name: str, weights: str | Path | None) -> Path | None:
    if weights:
        return Path(weights)
    d = os.environ.get("JIGSAW_WEIGHTS_DIR")
    if d:
        for ext in (".pt", ".pth", ".safetensors"):
            p = Path(d) / f"{name}{ext}"
            if p.exists():
                return p
    return None


def _load_weights(model: Any, name: str, weights: str | Path | None) -> bool:
    path = _weights_file(name, weights)
    if path is None:
        if name not in _warned:
            _warned.add(name)
            log.warning("%s: no weights given (weights= or $JIGSAW_WEIGHTS_DIR/%s.pt): randomly "
                        "initialised; outputs are not meaningful", name, name)
        return False
    import torch
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        state = load_file(str(path))
    else:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        log.warning("%s: weights %s: %d missing, %d unexpected keys", name, path,
                    len(missing), len(unexpected))
    log.info("%s: weights loaded from %s", name, path)
    return True


def _pool_matrix(n_in: int, n_out: int) -> Any:
    import torch
    m = torch.zeros(n_out, n_in)
    for i in range(n_out):
        lo, hi = (i * n_in) // n_out, -((-(i + 1) * n_in) // n_out)
        m[i, lo:hi] = 1.0 / (hi - lo)
    return m


def _matrix_pool_class() -> Any:
    from torch import nn

    class MatrixAdaptivePool(nn.Module):
        """``AdaptiveAvgPool2d(n_out)`` for a known input side, as two matmuls: exact, and ONNX
        exports it for any size (the native op exports only when the sizes divide)."""

        def __init__(self, n_in: int, n_out: int) -> None:
            super().__init__()
            self.register_buffer("p", _pool_matrix(max(n_in, 1), n_out))

        def forward(self, x: Any) -> Any:
            return self.p @ x @ self.p.transpose(0, 1)

    return MatrixAdaptivePool


def _MatrixAdaptivePool(n_in: int, n_out: int) -> Any:
    return _matrix_pool_class()(n_in, n_out)


def build(name: str, *, weights: str | Path | None = None) -> Any:
    """The torch module of variant ``name`` in eval mode (see the module doc for weights)."""
    import torch
    info = variant_info(name)
    torch.manual_seed(seed_of(name))
    if info.family == "yolov5":
        from jigsaw.models.yolo import YoloV5
        model: Any = YoloV5(info.arch)
    elif info.family == "torchvision":
        import torchvision
        model = getattr(torchvision.models, info.arch)(weights=None)
        if info.arch.startswith("vgg") and info.image_size != 224:
            model.avgpool = _MatrixAdaptivePool(info.image_size // 32, 7)
    elif info.family == "git":
        from jigsaw.models.text import build_git
        model = build_git(info.arch)
    else:
        from jigsaw.models.text import build_vits
        model = build_vits(info.arch)
    _load_weights(model, name, weights)
    return model.eval()


def model_config(name: str) -> Any:
    """The transformers config of a captioner or TTS variant (None for the others), without building it."""
    info = variant_info(name)
    if info.family == "git":
        from jigsaw.models.text import git_config
        return git_config(info.arch)
    if info.family == "vits":
        from jigsaw.models.text import vits_config
        return vits_config(info.arch)
    return None
