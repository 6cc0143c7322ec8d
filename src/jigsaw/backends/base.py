"""The interface every model backend implements (emulated, onnxruntime, torch, tensorrt).

A worker process owns one backend instance for one (task, variant). It hands the backend a batch
of encoded tensor payloads (``jigsaw.tensors`` format) and gets back, per item, the item's
own outputs and the payloads of the children it spawns on each downstream task. Backends never
see rings, deadlines or credits: routing and accounting stay in the worker.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from jigsaw.tensors import Tensor


@dataclass(frozen=True)
class OutputSpec:
    """One output tensor an item of a task produces; ``shape`` is per item (leading dim 1 or fixed)."""

    name: str
    datatype: str  # Open Inference Protocol datatype
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Downstream:
    """A downstream edge as the backend of the upstream task sees it."""

    task: str
    factor: float  # expected children per item for this backend's variant (the app's F(t, v, t'))
    transform: str = ""  # the edge's ``module:function`` (jigsaw.models.transforms); "": as is
    transform_dir: str = ""  # where the transform's module is looked for first (the app's folder)


@dataclass
class ItemResult:
    """What one item of a batch produced."""

    outputs: list[Tensor]  # the item's own outputs (reported to the client when the task is a sink)
    children: dict[str, list[bytes]] = field(default_factory=dict)  # downstream task -> payloads
    error: str = ""  # why this item failed (a bad transform or input): its request is answered 500


class Backend(abc.ABC):
    """Executes batches of one variant of one task.

    ``load`` happens once, before the worker reports ready; ``execute`` is called from the
    worker's loop with 1..max_batch items and blocks until the batch is done.
    """

    kind: str = "abstract"
    max_in_flight: int = 1
    """Batches the worker may keep submitted at once (``submit`` / ``collect``): 2 for a device
    pipeline, whose next batch stages and uploads while this one computes; 1 for a backend whose
    batch holds it until the batch ends."""

    def __init__(self, task: str, task_kind: str, downstream: Sequence[Downstream] = ()) -> None:
        self.task = task
        self.task_kind = task_kind
        self.downstream = tuple(downstream)
        self.variant = ""
        self.max_batch = 0
        self._compute: ThreadPoolExecutor | None = None

    @abc.abstractmethod
    def load(self, variant: str, max_batch: int) -> None:
        """Prepare ``variant`` for batches of up to ``max_batch`` items (weights, engines, buffers)."""

    def warm_up(self, batch_sizes: Sequence[int]) -> None:
        """Run what the first batch of each size would pay for (graphs, engines, kernels) before
        the worker reports ready; ``batch_sizes``: those its plan may send (1..max_batch).
        A backend without such costs (the emulated one) has nothing to do."""
        return None

    @abc.abstractmethod
    def execute(self, request_ids: Sequence[int], inputs: Sequence[bytes]) -> list[ItemResult]:
        """Run one batch; ``inputs[i]`` is item i's encoded tensors; returns one result per item."""

    async def execute_async(self, request_ids: Sequence[int], inputs: Sequence[bytes]) -> list[ItemResult]:
        """``execute`` from the worker's event loop, on one helper thread.

        The model runtimes release the GIL while they compute, so the loop keeps turning: it
        stamps the heartbeat the supervisor watches (a batch is watched by its own timeout) and
        answers signals. A backend that waits on a device or a timer overrides this instead.
        """
        return await self._on_compute(self.execute, request_ids, inputs)  # type: ignore[no-any-return]

    async def _on_compute(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` on the backend's one helper thread (calls run there in the order made)."""
        if self._compute is None:
            self._compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compute")
        return await asyncio.get_running_loop().run_in_executor(self._compute, fn, *args)

    async def submit(self, request_ids: Sequence[int], inputs: Sequence[bytes]) -> Any:
        """Start a batch; returns, once the backend holds it (on a device: staged, uploaded and
        launched), the handle ``collect`` finishes it by. The worker may then submit the next
        batch, up to ``max_in_flight``, and collects them in the order submitted. By default the
        whole batch runs here and the handle is its results."""
        return await self.execute_async(request_ids, inputs)

    async def collect(self, handle: Any) -> list[ItemResult]:
        """The per-item results of the batch ``submit`` returned ``handle`` for (waits for it)."""
        return handle  # type: ignore[no-any-return]

    def execute_nowait(self, request_ids: Sequence[int], inputs: Sequence[bytes]
                       ) -> list[ItemResult] | Coroutine[Any, Any, list[ItemResult]]:
        """The batch's results when it finishes without waiting, else a coroutine that awaits them
        (by default ``execute_async``'s: a model runtime always waits on its thread or device).

        The worker's turn calls this: a batch that needs no wait (an emulated one shorter than the
        loop's timer) is then a plain call, without a coroutine to make, step and finish on the
        hop's path. A backend that overrides it keeps ``execute_async`` meaning the same batch.
        """
        return self.execute_async(request_ids, inputs)

    @classmethod
    @abc.abstractmethod
    def output_specs(cls, task_kind: str, downstream: Sequence[str] = ()) -> list[OutputSpec]:
        """The outputs an item of a task of this kind produces (so empty results keep their shape)."""

    def close(self) -> None:
        """Release models and buffers; subclasses that hold some extend it."""
        if self._compute is not None:
            self._compute.shutdown(wait=False)
            self._compute = None
