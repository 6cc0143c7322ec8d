"""Pre- and post-processing that turns a task's network into a DAG node.

The detector letterboxes the image, runs, decodes and NMS-filters; each detection of a class a
downstream task wants becomes one child (its crop, resized for a classifier), so the fan-out is
the actual number of detections: ``car`` gets COCO cars, ``person`` gets persons, and any other
downstream task (the AR assistant's ``caption``) gets the ``round(factor)`` best detections of
any class. Classifiers return label and score (and echo the crop's box); the captioner returns
16 token ids and hands them to TTS, which maps them onto its symbol table (no tokenizer is
downloaded, so ids map by ``id mod vocab``) and returns the waveform.

Everything crosses processes as ``jigsaw.tensors`` payloads.

``prepare`` is the host (numpy) pre-processing of the onnxruntime backend, which takes host
arrays. The torch and TensorRT backends run the detector and classifiers through
``jigsaw.backends.gpu_pipeline`` on their device instead; both paths sample pixels with
``models.images``' indexes and share this module's post-processing (``top1``, ``detect``: torch ops
on whichever device holds the output) and the per-item results (``classified``, ``detected``).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from jigsaw.backends.base import Downstream, ItemResult, OutputSpec
from jigsaw.models import transforms
from jigsaw.models.images import LETTERBOX_FILL, letterbox_geometry, resize, unletterbox
from jigsaw.models.transforms import TransformError, tensor_list
from jigsaw.models.zoo import CAPTION_TOKENS, variant_info
from jigsaw.tensors import Tensor, decode_tensors, encode_tensors

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)
CLIP_MEAN = np.array([0.4815, 0.4578, 0.4082], np.float32)
CLIP_STD = np.array([0.2686, 0.2613, 0.2758], np.float32)
MAX_DETECTIONS = 100


def decode_image(tensors: Sequence[Tensor]) -> np.ndarray:
    """The request's image as (H, W, 3) uint8: raw pixels, or PNG/JPEG bytes decoded with Pillow."""
    t = next((t for t in tensors if t.name == "image"), tensors[0] if tensors else None)
    if t is None:
        raise ValueError("no 'image' input")
    data = t.data
    if t.datatype == "BYTES":
        data = np.frombuffer(data.ravel()[0], np.uint8)
    if data.ndim == 3 and data.shape[-1] in (1, 3, 4):
        img = np.asarray(data, np.uint8)
    elif data.ndim == 4 and data.shape[0] == 1:
        img = np.asarray(data[0], np.uint8)
    else:
        from PIL import Image
        img = np.asarray(Image.open(io.BytesIO(np.asarray(data, np.uint8).tobytes())).convert("RGB"))
    if img.shape[-1] == 1:
        img = np.repeat(img, 3, axis=-1)
    return np.ascontiguousarray(img[..., :3])


def letterbox(img: np.ndarray, size: int) -> tuple[np.ndarray, float, tuple[int, int]]:
    """Fit into a ``size`` square keeping the aspect ratio; returns (canvas, scale, (pad_x, pad_y))."""
    r, nh, nw, px, py = letterbox_geometry(*img.shape[:2], size)
    canvas = np.full((size, size, 3), LETTERBOX_FILL, np.uint8)
    canvas[py:py + nh, px:px + nw] = resize(img, nh, nw)
    return canvas, r, (px, py)


def _chw(images: list[np.ndarray], mean: np.ndarray | None, std: np.ndarray | None) -> np.ndarray:
    x = np.stack(images).astype(np.float32) / 255.0
    if mean is not None and std is not None:
        x = (x - mean) / std
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def _arr(name: str, datatype: str, values: Any) -> Tensor:
    a = np.ascontiguousarray(values)
    return Tensor(name, datatype, tuple(a.shape), a)


@dataclass
class Pipeline:
    """Pre/post-processing of one variant of one task; the backend runs the network between."""

    variant: str
    kind: str
    downstream: tuple[Downstream, ...] = ()
    conf_threshold: float = 0.25
    iou_threshold: float = 0.45

    def __post_init__(self) -> None:
        self.info = variant_info(self.variant)
        self._transforms: dict[str, transforms.Transform] = {}
        if self.info.kind != self.kind and self.kind != "generic":
            raise ValueError(f"variant {self.variant} is a {self.info.kind}, task is a {self.kind}")

    # ---- before the network -------------------------------------------------------------
    def prepare(self, payloads: Sequence[bytes]) -> tuple[np.ndarray, list[Any]]:
        """Batch array for the network and per-item context for ``finish``."""
        items = [decode_tensors(p) for p in payloads]
        if self.kind == "tts":
            toks = np.stack([np.asarray(next(t for t in it if t.name == "tokens").data, np.int64)
                             .reshape(-1)[:CAPTION_TOKENS] for it in items])
            return toks, [None] * len(items)
        size = self.info.image_size
        images = [decode_image(it) for it in items]
        if self.kind == "detector":
            boxes = [letterbox(img, size) for img in images]
            ctx = [(img, r, pad) for img, (_, r, pad) in zip(images, boxes)]
            return _chw([b[0] for b in boxes], None, None), ctx
        resized = [img if img.shape[:2] == (size, size) else resize(img, size, size) for img in images]
        boxes_in = [next((np.asarray(t.data, np.float32).reshape(4) for t in it if t.name == "box"), None)
                    for it in items]
        if self.kind == "captioner":
            return _chw(resized, CLIP_MEAN, CLIP_STD), boxes_in
        return _chw(resized, IMAGENET_MEAN, IMAGENET_STD), boxes_in

    # ---- after the network --------------------------------------------------------------
    def finish(self, output: Any, ctx: list[Any]) -> list[ItemResult]:
        """Per-item results of the network's host ``output`` (what ``prepare`` returned as ``ctx``)."""
        if self.kind in ("detector", "classifier"):
            import torch
            out = torch.from_numpy(np.ascontiguousarray(output, np.float32))
            if self.kind == "detector":
                return self.detected(self.detect(out).numpy(), ctx)
            return self.classified(top1(out).numpy(), ctx)
        if self.kind == "captioner":
            tokens = np.asarray(output, np.int64)
            return [self._pass_on([_arr("tokens", "INT32", row.astype(np.int32).reshape(1, -1))])
                    for row in tokens]
        waves = list(output)
        return [self._pass_on([_arr("audio", "FP32", np.asarray(w, np.float32).reshape(1, -1)),
                               _arr("audio_samples", "INT64", np.array([np.asarray(w).size], np.int64))])
                for w in waves]

    def detect(self, pred: Any) -> Any:
        """The detections of a batch's network output, on its device (``yolo.detect_rows``)."""
        from jigsaw.models.yolo import detect_rows
        return detect_rows(pred, conf_threshold=self.conf_threshold, iou_threshold=self.iou_threshold,
                           max_det=MAX_DETECTIONS)

    def classified(self, top: np.ndarray, boxes: list[Any]) -> list[ItemResult]:
        """Per item: label and score (``top1``'s (batch, 2) rows), the crop's box echoed."""
        out = []
        for (label, score), box in zip(top, boxes):
            ts = [_arr("label", "INT32", np.array([int(label)], np.int32)),
                  _arr("score", "FP32", np.array([score], np.float32))]
            if box is not None:
                ts.append(_arr("box", "FP32", np.asarray(box, np.float32).reshape(1, 4)))
            out.append(self._pass_on(ts))
        return out

    def _pass_on(self, outputs: list[Tensor]) -> ItemResult:
        """A non-detector feeds each downstream task one child carrying its outputs."""
        body = bytes(encode_tensors(outputs)) if self.downstream else b""
        return ItemResult(outputs, {d.task: [body] for d in self.downstream})

    def detected(self, rows: np.ndarray, ctx: list[Any],
                 crops: list[dict[str, list[np.ndarray]]] | None = None) -> list[ItemResult]:
        """Per item: its detections (``detect``'s rows, host copy) in the image's pixels and its
        children. ``crops``: the built-in fan-out's crops per item and task, already made (on the
        device); without them each edge's transform makes its children here."""
        from jigsaw.models.yolo import split_rows
        results = []
        for k, (d, (img, r, pad)) in enumerate(zip(split_rows(rows, len(ctx)), ctx)):
            found = {"boxes": unletterbox(d[:, :4], r, pad, *img.shape[:2]),
                     "scores": d[:, 4].astype(np.float32), "labels": d[:, 5].astype(np.int32)}
            outputs = [_arr("num_boxes", "INT32", np.array([len(d)], np.int32))]
            try:
                children = {ds.task: [bytes(encode_tensors(tensor_list(child)))
                                      for child in self._children(ds, img, found, crops, k)]
                            for ds in self.downstream}
            except TransformError as exc:
                results.append(ItemResult([], {}, str(exc)))
                continue
            outputs += [_arr(f"num_{ds.task}", "INT32", np.array([len(children[ds.task])], np.int32))
                        for ds in self.downstream]
            outputs += [_arr("boxes", "FP32", found["boxes"]), _arr("scores", "FP32", found["scores"]),
                        _arr("labels", "INT32", found["labels"])]
            results.append(ItemResult(outputs, children))
        return results

    def _children(self, ds: Downstream, img: np.ndarray, found: dict[str, np.ndarray],
                  crops: list[dict[str, list[np.ndarray]]] | None, k: int) -> list[dict[str, np.ndarray]]:
        if crops is None or ds.transform:
            return self._edge_children(ds, {"image": img}, found)
        idx = transforms.wanted_detections(found["labels"], ds.task, ds.factor)
        return [{"image": c, "box": found["boxes"][i].reshape(1, 4)} for c, i in zip(crops[k][ds.task], idx)]

    def _edge_children(self, ds: Downstream, inputs: dict[str, np.ndarray],
                       outputs: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        """A detection's children on ``ds``: the edge's transform, the built-in crops by default."""
        if ds.transform:
            fn = self._transforms.get(ds.task)
            if fn is None:
                fn = self._transforms[ds.task] = transforms.load(ds.transform, ds.transform_dir or None)
            ref = ds.transform
        else:
            fn, ref = transforms.crop_detections, "jigsaw.models.transforms:crop_detections"
        return transforms.apply(fn, ref, inputs, outputs, transforms.EdgeInfo("", ds.task, ds.factor))


def output_specs(task_kind: str, downstream: Sequence[str] = ()) -> list[OutputSpec]:
    """Per-item outputs of a real task (-1: a length that depends on the item)."""
    if task_kind == "detector":
        return ([OutputSpec("num_boxes", "INT32", (1,))]
                + [OutputSpec(f"num_{t}", "INT32", (1,)) for t in downstream]
                + [OutputSpec("boxes", "FP32", (-1, 4)), OutputSpec("scores", "FP32", (-1,)),
                   OutputSpec("labels", "INT32", (-1,))])
    if task_kind == "classifier":
        return [OutputSpec("label", "INT32", (1,)), OutputSpec("score", "FP32", (1,)),
                OutputSpec("box", "FP32", (1, 4))]  # the crop's box, when fed by a detector
    if task_kind == "captioner":
        return [OutputSpec("tokens", "INT32", (1, CAPTION_TOKENS))]
    if task_kind == "tts":
        return [OutputSpec("audio", "FP32", (1, -1)), OutputSpec("audio_samples", "INT64", (1,))]
    return [OutputSpec("value", "FP32", (1,))]


def task_output_specs(app: Any, task: str) -> list[OutputSpec]:
    """A task's per-item outputs: its ONNX models' graph outputs, or those of its kind."""
    model = app.task(task).variants[0].resolved
    if model is not None and model.is_onnx:
        from jigsaw.backends.graph_pipeline import graph_output_specs
        return graph_output_specs(model)
    return output_specs(app.task(task).kind, app.children(task))


def top1(logits: Any) -> Any:
    """(batch, 2) float32 rows ``label, score`` (softmax's best class) of a torch logits batch,
    on its device."""
    import torch
    score, label = torch.softmax(logits.float(), 1).max(1)
    return torch.stack((label.float(), score), 1)


Runner = Callable[[np.ndarray], Any]
