"""How a repository (ONNX) model's task runs a batch: items' tensors in, the graph's outputs out.

No pre- or post-processing is assumed: an item's tensors are matched to the graph's inputs by
name (a one-input graph takes an item's only tensor whatever its name), cast to the input's
datatype when that loses no kind (integers to floats, wider to narrower floats), given a batch
axis and stacked; item i's outputs are row i of every graph output. Each downstream edge turns
the item into children with its transform (``jigsaw.models.transforms``; as is by default).

A bad item (a missing tensor, a wrong shape, a transform that fails) fails alone: its result
carries the error and its request is answered 500; the rest of the batch runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from jigsaw.backends.base import Downstream, ItemResult, OutputSpec
from jigsaw.models import transforms
from jigsaw.models.repository import NUMPY_DTYPES, Model, TensorInfo, shapes_compatible
from jigsaw.tensors import decode_tensors, encode_tensors

Feeds = dict[str, np.ndarray]


class ItemError(ValueError):
    """One item cannot be fed to the graph (the message says which tensor and why)."""


def feed_item(model: Model, tensors: dict[str, np.ndarray]) -> Feeds:
    """One item's arrays, each shaped ``(1, *item_shape)`` and of its input's dtype."""
    feeds: Feeds = {}
    for info in model.inputs:
        arr = tensors.get(info.name)
        if arr is None and len(model.inputs) == 1 and len(tensors) == 1:
            arr = next(iter(tensors.values()))
        if arr is None:
            raise ItemError(f"{model.describe()}: the item has no tensor {info.name!r} "
                            f"(it has {', '.join(map(repr, tensors)) or 'none'})")
        feeds[info.name] = _shaped(info, np.asarray(arr), model)
    return feeds


def _shaped(info: TensorInfo, arr: np.ndarray, model: Model) -> np.ndarray:
    want = np.dtype(NUMPY_DTYPES[info.datatype])
    if arr.dtype != want:
        if not np.can_cast(arr.dtype, want, "same_kind"):
            raise ItemError(f"{model.describe()}: input {info.name!r} is {info.datatype}; the item's "
                            f"tensor is {arr.dtype} and does not cast without losing its kind")
        arr = arr.astype(want)
    if shapes_compatible(arr.shape, info.item_shape):
        return arr[None]
    if (arr.ndim == len(info.shape) and arr.shape[0] == 1
            and shapes_compatible(arr.shape[1:], info.item_shape)):
        return arr
    raise ItemError(f"{model.describe()}: input {info.name!r} takes items of shape "
                    f"{list(info.item_shape)}; the item's tensor has shape {list(arr.shape)}")


class GraphPipeline:
    """The batch of one variant of one task whose model is an ONNX file of the repository."""

    def __init__(self, model: Model, task: str, downstream: Sequence[Downstream] = ()) -> None:
        self.model = model
        self.task = task
        self.downstream = tuple(downstream)
        self._transforms = {d.task: (transforms.load(d.transform, d.transform_dir or None), d.transform)
                            if d.transform else (transforms.identity, "as is") for d in self.downstream}

    def execute(self, payloads: Sequence[bytes],
                run: Callable[[Feeds], list[np.ndarray]]) -> list[ItemResult]:
        """Feeds the good items to ``run`` as one batch (per item when their free sizes differ)."""
        results: list[ItemResult | None] = [None] * len(payloads)
        items: list[tuple[int, dict[str, np.ndarray], Feeds]] = []
        for i, payload in enumerate(payloads):
            try:
                tensors = {t.name: np.asarray(t.data) for t in decode_tensors(payload)}
                items.append((i, tensors, feed_item(self.model, tensors)))
            except (ItemError, ValueError) as exc:
                results[i] = ItemResult([], {}, f"task {self.task!r}: {exc}")
        for group in self._groups(items):
            feeds = {n: np.concatenate([f[n] for _, _, f in group]) for n in group[0][2]}
            try:
                outputs = run(feeds)
            except Exception as exc:  # the runtime rejected the batch: fail its items, keep serving
                for i, _, _ in group:
                    results[i] = ItemResult([], {}, f"task {self.task!r}: {self.model.describe()} failed: "
                                                    f"{type(exc).__name__}: {exc}")
                continue
            for row, (i, tensors, _) in enumerate(group):
                results[i] = self._item(tensors, {info.name: np.asarray(o)[row:row + 1]
                                                  for info, o in zip(self.model.outputs, outputs)})
        return [r if r is not None else ItemResult([], {}, "not run") for r in results]

    @staticmethod
    def _groups(items: list[tuple[int, dict[str, np.ndarray], Feeds]]) -> list[list[Any]]:
        groups: dict[tuple[Any, ...], list[Any]] = {}
        for item in items:
            key = tuple((n, a.shape[1:]) for n, a in item[2].items())
            groups.setdefault(key, []).append(item)
        return list(groups.values())

    def _item(self, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> ItemResult:
        children: dict[str, list[bytes]] = {}
        try:
            for d in self.downstream:
                fn, ref = self._transforms[d.task]
                edge = transforms.EdgeInfo(self.task, d.task, d.factor)
                kids = transforms.apply(fn, ref, inputs, outputs, edge)
                children[d.task] = [bytes(encode_tensors(transforms.tensor_list(k))) for k in kids]
        except (transforms.TransformError, ValueError) as exc:
            return ItemResult([], {}, f"task {self.task!r}: {exc}")
        return ItemResult(transforms.tensor_list(outputs), children)


def graph_output_specs(model: Model) -> list[OutputSpec]:
    """The per-item outputs of a repository model's task (a leading 1 for the item)."""
    return [OutputSpec(o.name, o.datatype, (1, *o.item_shape)) for o in model.outputs]
