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
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("jigsaw.models")
_warned: set[str] = set()

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

CAPTION_TOKENS = 16
TTS_TOKENS = CAPTION_TOKENS


@dataclass(frozen=True)
class VariantInfo:
    """What a variant is: its family, its kind of task and its input geometry."""

    name: str
    family: str  # yolov5 | torchvision | git | vits
    kind: str  # detector | classifier | captioner | tts
    arch: str  # builder argument: yolov5 size letter, torchvision function, git/vits size
    image_size: int = 0  # square input side (0: not an image model)


_GIT = {"git-base": "base", "git-large": "large", "git-tiny": "tiny"}
_TTS = {"vits": "vits", "glow-tts": "glow-tts", "vits-tiny": "tiny"}


def detector_size() -> int:
    return int(os.environ.get("JIGSAW_DETECTOR_SIZE", "640"))


def classifier_size() -> int:
    return int(os.environ.get("JIGSAW_CLASSIFIER_SIZE", "224"))


def variant_info(name: str) -> VariantInfo:
    """Parses a variant name of the example apps (``yolov5s``, ``efficientnet-b0``, ``vgg11``, ...)."""
    m = re.fullmatch(r"yolov5([nsmlx])", name)
    if m:
        return VariantInfo(name, "yolov5", "detector", m.group(1), detector_size())
    if re.fullmatch(r"efficientnet-b[0-7]|resnet(18|34|50|101|152)|vgg(11|13|16|19)(-bn)?", name):
        return VariantInfo(name, "torchvision", "classifier", name.replace("-", "_"), classifier_size())
    if name in _GIT:
        return VariantInfo(name, "git", "captioner", _GIT[name], 224 if name != "git-tiny" else 32)
    if name in _TTS:
        return VariantInfo(name, "vits", "tts", _TTS[name])
    raise KeyError(f"no model builder for variant {name!r}")


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
