"""What the real-model backends share: the task's pipeline around a network runner.

A subclass says how to load the network (``_load_net``; torch), or, as a ``GraphBackend``, only
how to run one ONNX graph (``_graph_runner``; onnxruntime, TensorRT); decoding inputs,
pre-processing, post-processing and the children payloads come from ``jigsaw.backends.pipeline``.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from jigsaw.backends.base import Backend, Downstream, ItemResult, OutputSpec
from jigsaw.backends.registry import ONNX_BACKENDS
from jigsaw.models.graphs import Runner
from jigsaw.models.repository import Model

log = logging.getLogger("jigsaw.backends")


def cpu_share(segment: str) -> int | None:
    """Cores of a CPU segment name (``"2c"`` -> 2); None for a GPU segment."""
    m = re.fullmatch(r"(\d+)c", segment)
    return int(m.group(1)) if m else None


def default_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)))


class ModelBackend(Backend):
    """Runs a batch: pipeline.prepare -> network -> pipeline.finish."""

    kind = "model"

    def __init__(self, task: str, task_kind: str, downstream: Sequence[Downstream] = (), *,
                 threads: int | None = None, model: Model | None = None) -> None:
        super().__init__(task, task_kind, downstream)
        self.threads = threads or default_threads()
        self.model = model  # the variant's model (None: the zoo network of the variant's name)
        self.zoo = ""  # the zoo network loaded (a built-in model; its builders are keyed by it)
        self.warmed: list[int] = []  # the batch sizes ``warm_up`` ran
        self._net: Any = None
        self.pipeline: Any = None
        self.device_pipeline: Any = None  # a GpuPipeline around the engine (image tasks on a device engine)
        self._device_wait: ThreadPoolExecutor | None = None  # where ``collect`` waits for a CUDA batch

    def load(self, variant: str, max_batch: int) -> None:
        self.variant, self.max_batch = variant, max_batch
        if self.model is not None and self.model.is_onnx:
            from jigsaw.backends.graph_pipeline import GraphPipeline
            self.pipeline = GraphPipeline(self.model, self.task, self.downstream)
            self._net = self._load_onnx(self.model, max_batch)
            return
        from jigsaw.backends.pipeline import Pipeline
        zoo = self.zoo = self.model.zoo if self.model is not None else variant
        self.pipeline = Pipeline(zoo, self.task_kind, self.downstream)
        self._net = self._load_net(zoo, max_batch)
        if hasattr(self._net, "channels_last"):  # a device engine: the pipeline runs beside it
            from jigsaw.backends.gpu_pipeline import SLOTS, GpuPipeline
            self.device_pipeline = GpuPipeline(self.pipeline, self._net, max_batch)
            self.max_in_flight = SLOTS  # batch n+1 stages and uploads while batch n computes

    def _load_onnx(self, model: Model, max_batch: int) -> Any:
        """The runner of a repository model's ONNX graph (backends that run ONNX override it)."""
        raise ValueError(f"the {self.kind} backend runs zoo networks only; {model.describe()} needs "
                         f"the {' or '.join(ONNX_BACKENDS)} backend")

    @abc.abstractmethod
    def _load_net(self, variant: str, max_batch: int) -> Any:
        """The runnable network of ``variant`` for batches up to ``max_batch`` (each backend's own)."""

    def run(self, batch: np.ndarray) -> Any:
        """The network alone on a prepared batch (what ``jigsaw profile`` times with the rest)."""
        return self._net(batch)

    def execute(self, request_ids: Sequence[int], inputs: Sequence[bytes]) -> list[ItemResult]:
        if self.device_pipeline is not None:
            return self.device_pipeline(inputs)  # type: ignore[no-any-return]
        if hasattr(self.pipeline, "execute"):  # a repository model: per-item errors, no pre-processing
            return self.pipeline.execute(inputs, self.run)  # type: ignore[no-any-return]
        batch, ctx = self.pipeline.prepare(inputs)
        return self.pipeline.finish(self.run(batch), ctx)

    async def submit(self, request_ids: Sequence[int], inputs: Sequence[bytes]) -> Any:
        """A device pipeline's batch staged, uploaded and launched on the helper thread (on CUDA it
        returns before the device computes; on the CPU the batch computes here)."""
        if self.device_pipeline is None:
            return await super().submit(request_ids, inputs)
        return await self._on_compute(self.device_pipeline.submit, inputs)

    async def collect(self, handle: Any) -> list[ItemResult]:
        """On CUDA the device is waited for on a thread of its own, so the helper thread is free
        to submit the next batch meanwhile; the results are then read back on the helper thread."""
        pipe = self.device_pipeline
        if pipe is None:
            return await super().collect(handle)
        if handle.done is not None:
            if self._device_wait is None:
                self._device_wait = ThreadPoolExecutor(max_workers=1, thread_name_prefix="device-wait")
            await asyncio.get_running_loop().run_in_executor(self._device_wait, handle.done.synchronize)
        return await self._on_compute(pipe.collect, handle)  # type: ignore[no-any-return]

    def warm_up(self, batch_sizes: Sequence[int]) -> None:
        """Prepares the engine for the sizes (CUDA graphs, engine shapes), then runs whole batches
        of a synthetic item through the pipeline: on a device engine every bucket the sizes use
        (``gpu_pipeline.batch_buckets``), else one item (a CPU runtime has no per-shape state)."""
        from jigsaw.backends.warm import warm_batches, warm_payload
        payload = warm_payload(self.zoo) if self.zoo else None
        sizes = warm_batches(batch_sizes, on_device=self.device_pipeline is not None
                             and self.device_pipeline.cuda)
        if hasattr(self._net, "warm_up"):
            self._net.warm_up(sizes)
        if payload is None:
            return
        for n in sizes:
            errors = {r.error for r in self.execute(list(range(n)), [payload] * n) if r.error}
            if errors:  # an item's error (an edge's transform on a synthetic image) fails items only
                log.warning("%s: warm-up batch of %d: items failed: %s", self.task, n,
                            "; ".join(sorted(errors)))
        self.warmed = list(sizes)

    @classmethod
    def output_specs(cls, task_kind: str, downstream: Sequence[str] = ()) -> list[OutputSpec]:
        from jigsaw.backends.pipeline import output_specs
        return output_specs(task_kind, downstream)

    def close(self) -> None:
        super().close()
        if self._device_wait is not None:
            self._device_wait.shutdown(wait=False)
            self._device_wait = None
        self._net = None
        self.device_pipeline = None


class GraphBackend(ModelBackend):
    """A backend that runs the variant's ONNX graphs, each by ``_graph_runner``, under the
    variant's driver (one graph as is; the captioner's greedy loop; TTS's length regulation)."""

    def _load_net(self, variant: str, max_batch: int) -> Any:
        from jigsaw.models.export import driver, export
        from jigsaw.models.zoo import model_config
        ex = export(variant)
        runners = {g: self._graph_runner(path, max_batch) for g, path in ex.graphs.items()}
        return driver(variant, model_config(variant), runners)

    def _load_onnx(self, model: Model, max_batch: int) -> Any:
        assert model.path is not None
        return self._graph_runner(model.path, max_batch)

    @abc.abstractmethod
    def _graph_runner(self, path: Path, max_batch: int) -> Runner:
        """How this backend runs one ONNX graph."""
