"""The image tasks' pipeline on the engine's device: uint8 in, small results out.

A batch's images go from the ring's payloads into one staging buffer allocated once per slot
(pinned when the device is CUDA), together with each image's sampling indexes, and reach the
device in one ``non_blocking`` upload on a copy stream. There one gather samples every image
(resize for a classifier, letterbox for the detector, both with ``models.images.resize_index``,
so the pixels equal the host path's), the batch is scaled and normalised in the engine's dtype and
memory format, the network runs, and the post-processing runs as torch ops (``pipeline.top1``;
the detector's decode and batched NMS, ``yolo.detect_rows``). Only the results (label and score,
or the detection rows) and the detector's downstream crops, sampled on the device from the
uploaded images, come back, as uint8.

Two slots alternate (vLLM's ``CpuGpuBuffer`` pairs, one per batch in flight): ``submit`` stages
and uploads batch n+1 on the copy stream while batch n computes; the compute stream waits on the
upload's event, and a slot's buffers are refilled only after its batch was collected.

On a CPU device the same code runs without pinning, copies or streams, so CI checks it against
the numpy path (``jigsaw.backends.pipeline.Pipeline.prepare``), which stays the onnxruntime
backend's host path. The engine is whatever runs the network on the device (``Engine``): the
torch backend's module (eager or CUDA graphs) or a TensorRT execution context.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from jigsaw.backends.base import ItemResult
from jigsaw.backends.pipeline import IMAGENET_MEAN, IMAGENET_STD, Pipeline, decode_image, top1
from jigsaw.models import transforms
from jigsaw.models.images import LETTERBOX_FILL, crop_window, letterbox_geometry, resize_index
from jigsaw.models.zoo import classifier_size
from jigsaw.tensors import decode_tensors

SLOTS = 2  # batches in flight: one computing, the next one uploading


class Engine(Protocol):
    """The network on a device: a batch tensor in (its ``dtype``, channels-last strides when
    ``channels_last``), the network's output tensor on the same device out."""

    device: torch.device
    dtype: torch.dtype
    channels_last: bool

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...

    def warm_up(self, batch_sizes: Sequence[int]) -> None: ...


def process_device() -> torch.device:
    """The device this process runs on: its first visible CUDA device (``CUDA_VISIBLE_DEVICES``
    names the GPU or MIG instance the worker is pinned to), else the CPU."""
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def batch_buckets(max_batch: int) -> list[int]:
    """The batch sizes an engine prepares (graphs, engine shapes): powers of two and ``max_batch``;
    a batch runs padded to the smallest bucket that holds it."""
    sizes = {1 << k for k in range(max_batch.bit_length()) if 1 << k <= max_batch}
    return sorted(sizes | {max_batch})


class Staging:
    """A host buffer and its device twin, allocated once (vLLM's ``CpuGpuBuffer``); the host side
    is pinned on CUDA so that the upload is an asynchronous DMA. On the CPU they are one buffer."""

    def __init__(self, nbytes: int, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self._alloc(nbytes)

    def _alloc(self, nbytes: int) -> None:
        self.host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.cuda)
        self.dev = torch.empty(nbytes, dtype=torch.uint8, device=self.device) if self.cuda else self.host
        self.np = self.host.numpy()

    def reserve(self, nbytes: int) -> None:
        """Room for ``nbytes`` (grows by doubling: an image larger than any before)."""
        if nbytes > self.host.numel():
            self._alloc(max(nbytes, 2 * self.host.numel()))

    def upload(self, nbytes: int) -> torch.Tensor:
        """The first ``nbytes`` on the device (enqueued on the current stream on CUDA)."""
        if self.cuda:
            self.dev[:nbytes].copy_(self.host[:nbytes], non_blocking=True)
        return self.dev[:nbytes]


@dataclass
class _Slot:
    staging: Staging
    uploaded: Any = None  # CUDA event: the upload finished (the host side may be refilled)
    consumed: Any = None  # CUDA event: the last kernel reading the device side finished
    busy: bool = False


@dataclass
class InFlight:
    """A submitted batch: what ``collect`` needs to finish it."""

    slot: _Slot
    results: list[ItemResult | None]  # per item; None: still to come from the device
    ok: list[int]  # the items in the device batch, in order
    ctx: list[Any]  # per device item: (image, scale, pad) for a detector, the crop's box for a classifier
    pixels: torch.Tensor  # the uploaded images, (pixels, 3) uint8 on the device
    bases: list[tuple[int, int, int]]  # per device item: (first pixel, height, width) in ``pixels``
    out: torch.Tensor  # the network's output (detector) or top-1 rows (classifier) on the device
    done: Any = None  # CUDA event recorded after the batch's last kernel
    host_out: torch.Tensor | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _indexes(rows: list[np.ndarray], cols: list[np.ndarray], starts: Sequence[int],
             widths: Sequence[int]) -> np.ndarray:
    """(n, 2S + 2) int32 sampling indexes: per output image its source rows and columns (-1: fill),
    first pixel and row width in the staged pixels."""
    side = len(rows[0])
    meta = np.empty((len(rows), 2 * side + 2), np.int32)
    meta[:, :side], meta[:, side:2 * side] = rows, cols
    meta[:, 2 * side], meta[:, 2 * side + 1] = starts, widths
    return meta


@functools.lru_cache(maxsize=256)
def _sampling(letterboxed: bool, side: int, h: int, w: int) -> tuple[np.ndarray, np.ndarray, Any]:
    """An (h, w) image's source rows and columns (-1: the letterbox fill) of a ``side`` square
    input, and its (scale, pad) when letterboxed; cached: a node's requests share a few sizes."""
    if not letterboxed:
        return resize_index(side, h), resize_index(side, w), None
    r, nh, nw, px, py = letterbox_geometry(h, w, side)
    ys, xs = np.full(side, -1, np.intp), np.full(side, -1, np.intp)
    ys[py:py + nh], xs[px:px + nw] = resize_index(nh, h), resize_index(nw, w)
    return ys, xs, (r, (px, py))


def sample(pixels: torch.Tensor, meta: torch.Tensor, fill: int | None) -> torch.Tensor:
    """(n, S, S, 3) uint8 images gathered from ``pixels`` ((p, 3) uint8) by ``meta`` (``_indexes``
    on the device) in one gather: resize, letterbox and crop are all this."""
    side = (meta.shape[1] - 2) // 2
    ys, xs = meta[:, :side], meta[:, side:2 * side]
    start, width = meta[:, 2 * side, None, None], meta[:, 2 * side + 1, None, None]
    index = start + ys.clamp(min=0)[:, :, None] * width + xs.clamp(min=0)[:, None, :]
    out = pixels.index_select(0, index.reshape(-1)).view(len(meta), side, side, 3)
    if fill is not None:
        valid = (ys >= 0)[:, :, None] & (xs >= 0)[:, None, :]
        out.masked_fill_(~valid[..., None], fill)
    return out


class GpuPipeline:
    """The detector's or a classifier's batch on ``engine``'s device (see the module doc)."""

    def __init__(self, pipeline: Pipeline, engine: Engine, max_batch: int) -> None:
        if pipeline.kind not in ("detector", "classifier"):
            raise ValueError(f"the device pipeline runs image tasks, not a {pipeline.kind}")
        self.pipeline, self.engine, self.max_batch = pipeline, engine, max_batch
        self.device = engine.device
        self.side = pipeline.info.image_size
        self.cuda = self.device.type == "cuda"
        mean, std = (IMAGENET_MEAN, IMAGENET_STD) if pipeline.kind == "classifier" else (0.0, 1.0)
        scale = np.broadcast_to(1.0 / (255.0 * np.asarray(std, np.float64)), 3)
        bias = np.broadcast_to(-np.asarray(mean, np.float64) / np.asarray(std, np.float64), 3)
        self.scale = torch.tensor(scale, dtype=engine.dtype, device=self.device).view(1, 3, 1, 1)
        self.bias = torch.tensor(bias, dtype=engine.dtype, device=self.device).view(1, 3, 1, 1)
        nbytes = max_batch * (self.side * self.side * 3 + (2 * self.side + 2) * 4) + 64
        self.slots = [_Slot(Staging(nbytes, self.device)) for _ in range(SLOTS)]
        self.crop_staging = Staging(4096, self.device)
        self._next = 0
        if self.cuda:
            self.copy_stream = torch.cuda.Stream(device=self.device)
            for s in self.slots:
                s.uploaded, s.consumed = torch.cuda.Event(), torch.cuda.Event()

    # ---- host: decode and stage -----------------------------------------------------------
    def _decode(self, payloads: Sequence[bytes]) -> tuple[list[ItemResult | None], list[int], list[Any],
                                                          list[Any]]:
        """Per item its image and crop box (a bad one answers that item alone with its reason)."""
        results: list[ItemResult | None] = [None] * len(payloads)
        ok, images, boxes = [], [], []
        for i, p in enumerate(payloads):
            try:
                tensors = decode_tensors(p)
                img = decode_image(tensors)
                box = next((np.asarray(t.data, np.float32).reshape(4) for t in tensors if t.name == "box"),
                           None)
            except Exception as exc:
                results[i] = ItemResult([], {}, f"bad input: {type(exc).__name__}: {exc}")
                continue
            ok.append(i)
            images.append(img)
            boxes.append(box)
        return results, ok, images, boxes

    def _geometry(self, h: int, w: int) -> tuple[np.ndarray, np.ndarray, Any]:
        """Source rows and columns of the network input for an (h, w) image, and its context."""
        return _sampling(self.pipeline.kind == "detector", self.side, h, w)

    def submit(self, payloads: Sequence[bytes]) -> InFlight:
        """Stage, upload and launch a batch (network and the post-processing that needs no host
        decision); returns at once on CUDA, the work queued on the device."""
        if len(payloads) > self.max_batch:
            raise ValueError(f"batch of {len(payloads)} over max_batch {self.max_batch}")
        # the next slot in turn that is free (a batch whose collect failed frees its slot while
        # the one after it is still in flight: its items, run again alone, take the free slot)
        free = [s for s in (*self.slots[self._next:], *self.slots[:self._next]) if not s.busy]
        if not free:
            raise RuntimeError(f"more than {SLOTS} batches in flight: collect one first")
        slot = free[0]
        self._next = (self.slots.index(slot) + 1) % SLOTS
        results, ok, images, boxes = self._decode(payloads)
        if not ok:
            empty = torch.empty(0, 3, dtype=torch.uint8, device=self.device)
            return InFlight(slot, results, ok, [], empty, [], empty)
        rows, cols, ctx, bases = [], [], [], []
        pixel = 0
        for img, box in zip(images, boxes):
            h, w = img.shape[:2]
            ys, xs, geo = self._geometry(h, w)
            rows.append(ys)
            cols.append(xs)
            ctx.append(box if geo is None else (img, *geo))
            bases.append((pixel, h, w))
            pixel += h * w
        meta = _indexes(rows, cols, [b[0] for b in bases], [b[2] for b in bases])
        slot.busy = True
        try:
            pixels, dev_meta = self._stage(slot, meta, images, pixel)
            out = self._compute(pixels, dev_meta)
        except BaseException:
            slot.busy = False  # a failed batch does not hold its slot
            raise
        flight = InFlight(slot, results, ok, ctx, pixels, bases, out)
        if self.cuda:
            if self.pipeline.kind == "classifier":  # the results' copy is queued now too
                flight.host_out = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
                flight.host_out.copy_(out, non_blocking=True)
            flight.done = torch.cuda.Event()
            flight.done.record()
        return flight

    def _stage(self, slot: _Slot, meta: np.ndarray, images: list[np.ndarray], pixels: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """The indexes and the images into the slot's staging buffer (the one host copy of the
        pixels), uploaded; their device views: (pixels, 3) uint8 and the (n, 2S + 2) indexes."""
        meta_bytes = -(-meta.nbytes // 16) * 16
        staging = slot.staging
        if self.cuda:
            slot.uploaded.synchronize()  # the slot's last upload has left the host buffer
        staging.reserve(meta_bytes + 3 * pixels)
        staging.np[:meta.nbytes] = meta.view(np.uint8).reshape(-1)
        at = meta_bytes
        for img in images:
            staging.np[at:at + img.size] = img.reshape(-1)
            at += img.size
        dev = self._upload(slot, at)
        return dev[meta_bytes:at].view(-1, 3), dev[:meta.nbytes].view(torch.int32).view(meta.shape)

    def _upload(self, slot: _Slot, nbytes: int) -> torch.Tensor:
        if not self.cuda:
            return slot.staging.upload(nbytes)
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.copy_stream):
            self.copy_stream.wait_event(slot.consumed)  # its last batch no longer reads the device side
            dev = slot.staging.upload(nbytes)
            slot.uploaded.record(self.copy_stream)
        compute.wait_event(slot.uploaded)
        dev.record_stream(compute)
        return dev

    # ---- device: sample, normalise, run, post-process --------------------------------------
    def network_input(self, pixels: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
        """The engine's input batch: sampled, scaled and normalised in its dtype and layout."""
        fill = LETTERBOX_FILL if self.pipeline.kind == "detector" else None
        nchw = sample(pixels, meta, fill).permute(0, 3, 1, 2)  # channels-last strides, NCHW shape
        if not self.engine.channels_last:
            nchw = nchw.contiguous()  # reordered as uint8, a quarter of the bytes of the float batch
        return nchw.to(self.engine.dtype).mul_(self.scale).add_(self.bias)  # keeps the strides

    def _compute(self, pixels: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            out = self.engine(self.network_input(pixels, meta))
            return top1(out) if self.pipeline.kind == "classifier" else out

    # ---- back on the host -----------------------------------------------------------------
    def ready(self, flight: InFlight) -> bool:
        """Whether the device finished the batch's queued work (polled by an event loop)."""
        return flight.done is None or bool(flight.done.query())

    def collect(self, flight: InFlight) -> list[ItemResult]:
        """The batch's per-item results (waits for the device)."""
        try:
            done = self._finish(flight) if flight.ok else []
        finally:
            if self.cuda:
                flight.slot.consumed.record()
            flight.slot.busy = False
        results = flight.results
        for i, r in zip(flight.ok, done):
            results[i] = r
        return [r if r is not None else ItemResult([], {}, "no result") for r in results]

    def _finish(self, flight: InFlight) -> list[ItemResult]:
        pipe = self.pipeline
        if pipe.kind == "classifier":
            if flight.done is not None:
                flight.done.synchronize()
            top = flight.host_out if flight.host_out is not None else flight.out
            return pipe.classified(top.numpy(), flight.ctx)
        with torch.inference_mode():
            rows = pipe.detect(flight.out).cpu().numpy()
        crops = self._crops(flight, rows) if any(not d.transform for d in pipe.downstream) else None
        return pipe.detected(rows, flight.ctx, crops)

    def _crops(self, flight: InFlight, rows: np.ndarray) -> list[dict[str, list[np.ndarray]]]:
        """The built-in fan-out's crops of every item, sampled on the device in one gather."""
        from jigsaw.models.images import unletterbox
        from jigsaw.models.yolo import split_rows
        size = classifier_size()
        want: list[dict[str, list[int]]] = []
        ys, xs, starts, widths = [], [], [], []
        for d, (_, r, pad), (start, h, w) in zip(split_rows(rows, len(flight.ctx)), flight.ctx, flight.bases):
            boxes = unletterbox(d[:, :4], r, pad, h, w)
            labels = d[:, 5].astype(np.int32)
            per: dict[str, list[int]] = {}
            for ds in self.pipeline.downstream:
                if ds.transform:
                    continue
                idx = transforms.wanted_detections(labels, ds.task, ds.factor)
                per[ds.task] = list(range(len(ys), len(ys) + len(idx)))
                for i in idx:
                    x1, y1, x2, y2 = crop_window(boxes[i], h, w)
                    ys.append(y1 + resize_index(size, y2 - y1))
                    xs.append(x1 + resize_index(size, x2 - x1))
                    starts.append(start)
                    widths.append(w)
            want.append(per)
        if not ys:
            return [{t: [] for t in w} for w in want]
        meta = _indexes(ys, xs, starts, widths)
        self.crop_staging.reserve(meta.nbytes)
        self.crop_staging.np[:meta.nbytes] = meta.view(np.uint8).reshape(-1)
        dev = self.crop_staging.upload(meta.nbytes).view(torch.int32).view(meta.shape)
        crops = sample(flight.pixels, dev, None).cpu().numpy()
        return [{t: [crops[j] for j in js] for t, js in w.items()} for w in want]

    def __call__(self, payloads: Sequence[bytes]) -> list[ItemResult]:
        return self.collect(self.submit(payloads))
