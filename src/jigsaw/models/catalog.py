"""Which network a built-in variant name stands for: its family, task kind and input geometry.

Only names and sizes, no network code: the app's model references are resolved against it when an
app file is loaded (``jigsaw.models.repository``), below everything that builds or runs models.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass


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
