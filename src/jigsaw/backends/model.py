"""What the real-model backends share: the task's pipeline around a network runner.

A subclass only says how to run the network (``_load_net`` / ``_run``); decoding inputs,
pre-processing, post-processing and the children payloads come from ``jigsaw.models.pipeline``.
The captioner's decode loop and TTS are not one ONNX/TensorRT graph, so every backend runs them
with torch (logged once at load).
"""

from __future__ import annotations

import abc
import logging
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from jigsaw.backends.base import Backend, Downstream, ItemResult, OutputSpec

log = logging.getLogger("jigsaw.backends")


def cpu_share(segment: str) -> int | None:
    """Cores of a CPU segment name (``"2c"`` -> 2); None for a GPU segment."""
    m = re.fullmatch(r"(\d+)c", segment)
    return int(m.group(1)) if m else None


def default_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)))


class TorchParts:
    """The torch-only tasks (captioner decode loop, TTS), for any backend."""

    def __init__(self, variant: str, kind: str, threads: int) -> None:
        import torch

        from jigsaw.models.zoo import build
        torch.set_num_threads(threads)
        self.kind = kind
        self.model = build(variant)

    def __call__(self, batch: np.ndarray) -> Any:
        import torch

        from jigsaw.models.text import caption, speak
        if self.kind == "captioner":
            return caption(self.model, torch.from_numpy(batch)).numpy()
        return [w.numpy() for w in speak(self.model, torch.from_numpy(batch))]


class ModelBackend(Backend):
    """Runs a batch: pipeline.prepare -> network -> pipeline.finish."""

    kind = "model"

    def __init__(self, task: str, task_kind: str, downstream: Sequence[Downstream] = (), *,
                 threads: int | None = None) -> None:
        super().__init__(task, task_kind, downstream)
        self.threads = threads or default_threads()
        self._net: Any = None
        self.pipeline: Any = None

    def load(self, variant: str, max_batch: int) -> None:
        from jigsaw.models.pipeline import Pipeline
        self.variant, self.max_batch = variant, max_batch
        self.pipeline = Pipeline(variant, self.task_kind, self.downstream)
        if self.pipeline.info.kind in ("captioner", "tts"):
            if self.kind != "torch":
                log.info("%s: %s runs with torch (autoregressive/variable-length, not one %s graph)",
                         variant, self.pipeline.info.kind, self.kind)
            self._net = TorchParts(variant, self.pipeline.info.kind, self.threads)
        else:
            self._net = self._load_net(variant, max_batch)

    @abc.abstractmethod
    def _load_net(self, variant: str, max_batch: int) -> Any:
        """The runnable network of ``variant`` for batches up to ``max_batch`` (each backend's own)."""

    def run(self, batch: np.ndarray) -> Any:
        """The network alone on a prepared batch (what ``jigsaw profile`` times with the rest)."""
        return self._net(batch)

    def execute(self, request_ids: Sequence[int], inputs: Sequence[bytes]) -> list[ItemResult]:
        batch, ctx = self.pipeline.prepare(inputs)
        return self.pipeline.finish(self.run(batch), ctx)

    @classmethod
    def output_specs(cls, task_kind: str, downstream: Sequence[str] = ()) -> list[OutputSpec]:
        from jigsaw.models.pipeline import output_specs
        return output_specs(task_kind, downstream)

    def close(self) -> None:
        super().close()
        self._net = None
