"""Transforms on the edges of an app: how one task's finished item becomes the next task's items.

An edge without a transform passes the upstream item's outputs on as they are: one child per
item, whose tensors are the upstream outputs (the downstream model's inputs are matched by name).
An edge may name a transform instead, ``transform = "module:function"``, an import path loaded
from the app file's folder first (``module.py`` or ``package/module.py`` beside the app file;
it may import its siblings there), then from the installed packages. The function is called
once per finished item::

    def function(inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray],
                 edge: jigsaw.models.transforms.EdgeInfo) -> list[dict[str, np.ndarray]]

``inputs`` are the item's input tensors, ``outputs`` what the upstream model produced for it
(each with a leading axis of 1), and the result is the item's children on ``edge.dst``: 0..n
tensor dicts (a detector's boxes become crops that way). The built-in detector's crops are such
a function, ``jigsaw.models.transforms:crop_detections``.

A transform that cannot be imported is an error at start-up; one that raises, or returns
something else than a list of dicts of arrays, fails only the request whose item it was given.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jigsaw.errors import JigsawError
from jigsaw.fields import check_import_ref as check_ref

Tensors = dict[str, np.ndarray]
Transform = Callable[[Tensors, Tensors, "EdgeInfo"], Any]


class TransformError(JigsawError):
    """A transform cannot be loaded, or its call failed or returned something unusable."""


@dataclass(frozen=True)
class EdgeInfo:
    """The edge a transform runs on, as the transform sees it."""

    src: str  # the upstream task
    dst: str  # the downstream task the children go to
    factor: float  # the app's expected children per item for the upstream variant


def _module(name: str, base_dir: Path | None) -> Any:
    if base_dir is not None:
        parts = name.split(".")
        for candidate in (base_dir.joinpath(*parts).with_suffix(".py"),
                          base_dir.joinpath(*parts, "__init__.py")):
            if candidate.is_file():
                # A private name per folder: two apps' ``transforms.py`` do not collide.
                tag = hashlib.sha1(str(candidate.resolve()).encode()).hexdigest()[:10]
                key = f"_jigsaw_app_{tag}.{name}"
                if key in sys.modules:
                    return sys.modules[key]
                spec = importlib.util.spec_from_file_location(key, candidate)
                assert spec is not None and spec.loader is not None
                module = importlib.util.module_from_spec(spec)
                sys.modules[key] = module
                sys.path.insert(0, str(base_dir))  # so that it may import its siblings
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[key]
                    raise
                finally:
                    sys.path.remove(str(base_dir))
                return module
    return importlib.import_module(name)


def load(ref: str, base_dir: str | Path | None = None) -> Transform:
    """The function ``ref`` names; TransformError (with the reason) when it cannot be had."""
    why = check_ref(ref)
    if why is not None:
        raise TransformError(why)
    module_name, func_name = ref.split(":")
    try:
        module = _module(module_name, Path(base_dir) if base_dir is not None else None)
    except Exception as exc:
        where = f" (looked in {base_dir} first)" if base_dir is not None else ""
        raise TransformError(f"transform {ref!r}: cannot import {module_name!r}{where}: "
                             f"{type(exc).__name__}: {exc}") from None
    fn = getattr(module, func_name, None)
    if fn is None:
        raise TransformError(f"transform {ref!r}: module {module_name!r} has no {func_name!r}")
    if not callable(fn):
        raise TransformError(f"transform {ref!r}: {func_name!r} is not a function")
    return fn  # type: ignore[no-any-return]


def apply(fn: Transform, ref: str, inputs: Tensors, outputs: Tensors, edge: EdgeInfo) -> list[Tensors]:
    """Calls a transform on one item and checks what it returned."""
    try:
        result = fn(inputs, outputs, edge)
    except Exception as exc:
        raise TransformError(f"transform {ref!r} on edge {edge.src} -> {edge.dst} raised "
                             f"{type(exc).__name__}: {exc}") from None
    if isinstance(result, Mapping) or not isinstance(result, list | tuple):
        raise TransformError(f"transform {ref!r} on edge {edge.src} -> {edge.dst}: expected a list of "
                             f"dicts of arrays (one per child), got {type(result).__name__}")
    children: list[Tensors] = []
    for k, child in enumerate(result):
        if not isinstance(child, Mapping) or not child:
            raise TransformError(f"transform {ref!r}: child {k} is {type(child).__name__}, expected a "
                                 "non-empty dict of arrays")
        tensors: Tensors = {}
        for name, value in child.items():
            arr = np.asarray(value)
            if not isinstance(name, str) or arr.dtype.kind not in "biuf":
                raise TransformError(f"transform {ref!r}: child {k}: {name!r} is not a named numeric "
                                     f"array (dtype {arr.dtype})")
            tensors[name] = np.ascontiguousarray(arr)
        children.append(tensors)
    return children


def identity(inputs: Tensors, outputs: Tensors, edge: EdgeInfo) -> list[Tensors]:
    """An edge without a transform: the item's outputs are its one child's inputs."""
    return [dict(outputs)]


CLASS_OF_TASK = {"car": {2}, "cars": {2}, "vehicle": {2, 3, 5, 7}, "person": {0}, "persons": {0}}
"""COCO classes a downstream task of the built-in detector wants, by the task's name."""


def crop_detections(inputs: Tensors, outputs: Tensors, edge: EdgeInfo) -> list[Tensors]:
    """The built-in detector's fan-out: each wanted detection's crop of the image, with its box.

    A task named like a COCO class group (``car``, ``person``, ``vehicle``) gets those classes'
    detections; any other task the ``round(factor)`` best detections of any class. Crops are
    resized to the classifiers' input size (``JIGSAW_CLASSIFIER_SIZE``).
    """
    from jigsaw.models.images import crop
    from jigsaw.models.zoo import classifier_size
    img = inputs["image"]
    boxes = np.asarray(outputs["boxes"], np.float32).reshape(-1, 4)
    size = classifier_size()
    return [{"image": crop(img, boxes[i], size), "box": boxes[i].reshape(1, 4)}
            for i in wanted_detections(outputs["labels"], edge.dst, edge.factor)]


def wanted_detections(labels: np.ndarray, task: str, factor: float) -> list[int]:
    """Which detections (best first) the built-in fan-out crops for downstream ``task``."""
    labels = np.asarray(labels).reshape(-1)
    wanted = CLASS_OF_TASK.get(task)
    if wanted is not None:
        return [i for i in range(len(labels)) if int(labels[i]) in wanted]
    return list(range(min(len(labels), max(1, round(factor)))))


def tensor_list(tensors: Mapping[str, np.ndarray]) -> list[Any]:
    """Named arrays as ``jigsaw.tensors.Tensor`` values (what crosses the rings)."""
    from jigsaw.tensors import Tensor, datatype_of
    out = []
    for name, value in tensors.items():
        arr = np.ascontiguousarray(value)
        out.append(Tensor(name, datatype_of(arr.dtype), tuple(arr.shape), arr))
    return out
