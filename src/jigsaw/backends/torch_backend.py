"""The torch backend: the variant's module in eval mode on the process's device, the CUDA device
when the process sees one (``CUDA_VISIBLE_DEVICES`` names its GPU or MIG instance), else the CPU
with the instance's share of threads.

Detector and classifiers run inside ``jigsaw.backends.gpu_pipeline`` (uint8 upload, device-side
pre- and post-processing). On CUDA the network runs in fp16 (``JIGSAW_TORCH_PRECISION``) with
channels-last weights and, per batch bucket (``gpu_pipeline.batch_buckets``), a CUDA graph
captured while the worker warms up: a batch replays the smallest graph that holds it, padded.
The captioner and TTS run as transformers runs them (``generate`` with its KV cache, ``VitsModel``
item by item) on the same device: the reference the ONNX graphs match.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from jigsaw.backends.model import ModelBackend

log = logging.getLogger("jigsaw.backends")
PRECISIONS = ("fp16", "fp32")


def precision_dtype(device: Any) -> Any:
    """The network's dtype: ``JIGSAW_TORCH_PRECISION`` (fp16 by default) on CUDA, fp32 on the CPU."""
    import torch
    name = os.environ.get("JIGSAW_TORCH_PRECISION", "fp16")
    if name not in PRECISIONS:
        raise ValueError(f"JIGSAW_TORCH_PRECISION={name!r}: expected one of {', '.join(PRECISIONS)}")
    return torch.float16 if device.type == "cuda" and name == "fp16" else torch.float32


class TorchEngine:
    """A module as a device ``Engine``: eager on the CPU; on CUDA channels-last, and a CUDA graph
    per batch bucket once ``warm_up`` captured them (eager for a size no graph holds)."""

    def __init__(self, module: Any, device: Any, dtype: Any, side: int, *,
                 graphs: bool | None = None, channels_last: bool | None = None) -> None:
        import torch
        self.device, self.dtype, self.side = device, dtype, side
        self.cuda = device.type == "cuda"
        self.channels_last = self.cuda if channels_last is None else channels_last
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        self.module = module.to(device=device, dtype=dtype, memory_format=fmt).eval()
        self.use_graphs = self.cuda if graphs is None else graphs
        self.graphs: dict[int, tuple[Any, Any, Any]] = {}  # bucket -> (graph, static input, output)
        self.warmed: list[int] = []

    def __call__(self, x: Any) -> Any:
        import torch
        n = x.shape[0]
        bucket = min((b for b in self.graphs if b >= n), default=0)
        with torch.inference_mode():
            if not bucket:
                return self.module(x)
            graph, static_in, static_out = self.graphs[bucket]
            static_in[:n].copy_(x)
            graph.replay()
            return static_out[:n].clone()  # the next replay overwrites the static output

    def warm_up(self, batch_sizes: Sequence[int]) -> None:
        """Run every size once (allocator, kernels, cuDNN), then on CUDA capture a graph per size,
        largest first, all in one memory pool (the graphs never run at once)."""
        import torch
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        inputs = {}
        for n in batch_sizes:
            x = torch.zeros(n, 3, self.side, self.side, dtype=self.dtype, device=self.device)
            inputs[n] = x.contiguous(memory_format=fmt)
            with torch.inference_mode():
                self.module(inputs[n])
            self.warmed.append(n)
        pool = None
        for n in sorted(inputs, reverse=True):
            if self.use_graphs:
                pool = self._capture(inputs[n], pool)
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _capture(self, x: Any, pool: Any) -> Any:
        """Capture the module on ``x``'s batch size into a graph; returns the memory pool."""
        import torch
        try:
            side_stream = torch.cuda.Stream(device=self.device)
            side_stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side_stream), torch.inference_mode():
                for _ in range(2):
                    self.module(x)
            torch.cuda.current_stream(self.device).wait_stream(side_stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool), torch.inference_mode():
                out = self.module(x)
            self.graphs[x.shape[0]] = (graph, x, out)
            return graph.pool()
        except Exception as exc:  # a module that cannot be captured still serves, eagerly
            log.warning("CUDA graph capture at batch %d failed (%s): eager", x.shape[0], exc)
            self.use_graphs = False
            self.graphs.clear()
            return pool


class _TorchText:
    """The captioner or TTS through transformers itself, on the process's device."""

    def __init__(self, variant: str, kind: str, threads: int) -> None:
        import torch

        from jigsaw.models.zoo import build
        torch.set_num_threads(threads)
        self.kind = kind
        from jigsaw.backends.gpu_pipeline import process_device
        self.device = process_device()
        self.model = build(variant).to(self.device)

    def __call__(self, batch: np.ndarray) -> Any:
        import torch

        from jigsaw.models.text import caption, speak
        x = torch.from_numpy(batch).to(self.device)
        if self.kind == "captioner":
            return caption(self.model, x).cpu().numpy()
        return [w.cpu().numpy() for w in speak(self.model, x)]


class TorchBackend(ModelBackend):
    kind = "torch"

    def _load_net(self, variant: str, max_batch: int) -> Any:
        from jigsaw.models.zoo import variant_info
        info = variant_info(variant)
        if info.kind in ("captioner", "tts"):
            return _TorchText(variant, info.kind, self.threads)
        import torch

        from jigsaw.backends.gpu_pipeline import process_device
        from jigsaw.models.zoo import build
        torch.set_num_threads(self.threads)
        device = process_device()
        return TorchEngine(build(variant), device, precision_dtype(device), info.image_size)
