"""The TensorRT backend (GPU only): an engine per variant built from the variant's ONNX export.

The engine has one optimization profile for batches 1..max_batch (opt = max_batch) and is cached
next to the ONNX file, keyed by GPU name, TensorRT version, precision and max batch, so a node's
processes build it once. A batch is staged in pinned host memory, copied to a cupy device
buffer, run with ``execute_async_v3`` on the process's stream and copied back; the event loop
is not blocked meanwhile (``execute_async`` polls the stream's completion event).

Inside a MIG instance the process sees only that instance (``CUDA_VISIBLE_DEVICES=MIG-<uuid>``),
so cupy's device 0 is the instance. ``tensorrt`` and ``cupy`` are imported lazily; on a machine
without them the backend raises at load time with the reason.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jigsaw.backends.base import ItemResult
from jigsaw.backends.model import ModelBackend

log = logging.getLogger("jigsaw.backends")
WORKSPACE_BYTES = 2 << 30


def available() -> tuple[bool, str]:
    """(usable, reason) for this process: tensorrt importable and a CUDA device visible."""
    try:
        import cupy  # type: ignore[import-not-found]
    except Exception as exc:
        return False, f"cupy is not importable ({exc.__class__.__name__})"
    try:
        if not cupy.cuda.is_available():
            return False, "cupy.cuda.is_available() is false (no GPU)"
    except Exception as exc:
        return False, f"no CUDA device ({exc})"
    try:
        import tensorrt  # type: ignore[import-not-found]  # noqa: F401
    except Exception as exc:
        return False, f"tensorrt is not importable ({exc.__class__.__name__})"
    return True, ""


def engine_path(onnx: Path, gpu_name: str, trt_version: str, precision: str, max_batch: int) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in gpu_name)
    return onnx.with_name(f"{onnx.stem}.{safe}.trt{trt_version}.{precision}.b{max_batch}.engine")


class _TrtNet:
    def __init__(self, onnx: Path, input_name: str, item_shape: tuple[int, ...], max_batch: int,
                 precision: str) -> None:
        import cupy as cp  # type: ignore[import-not-found]
        import tensorrt as trt  # type: ignore[import-not-found]
        self.cp, self.trt = cp, trt
        self.logger = trt.Logger(trt.Logger.WARNING)
        gpu_name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
        path = engine_path(onnx, gpu_name, trt.__version__, precision, max_batch)
        if path.exists():
            blob = path.read_bytes()
        else:
            blob = self._build(onnx, input_name, item_shape, max_batch, precision)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(blob)
            os.replace(tmp, path)
            log.info("built TensorRT engine %s", path)
        self.engine = trt.Runtime(self.logger).deserialize_cuda_engine(blob)
        self.context = self.engine.create_execution_context()
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.input_name = input_name
        self.names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.outputs = [n for n in self.names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        # Device buffers and pinned host staging sized for max_batch, reused for every batch.
        self.context.set_input_shape(input_name, (max_batch, *item_shape))
        self.dev: dict[str, Any] = {}
        self.host: dict[str, np.ndarray] = {}
        for n in self.names:
            shape = tuple(self.context.get_tensor_shape(n))
            dtype = np.dtype(trt.nptype(self.engine.get_tensor_dtype(n)))
            self.dev[n] = cp.empty(shape, dtype)
            mem = cp.cuda.alloc_pinned_memory(int(np.prod(shape)) * dtype.itemsize)
            self.host[n] = np.frombuffer(mem, dtype, int(np.prod(shape))).reshape(shape)
            self.context.set_tensor_address(n, self.dev[n].data.ptr)
        self.done = cp.cuda.Event(block=False, disable_timing=True)

    def _build(self, onnx: Path, input_name: str, item_shape: tuple[int, ...], max_batch: int,
               precision: str) -> bytes:
        trt = self.trt
        builder = trt.Builder(self.logger)
        network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
        parser = trt.OnnxParser(network, self.logger)
        if not parser.parse(onnx.read_bytes()):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise RuntimeError(f"TensorRT cannot parse {onnx}: {errors}")
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE_BYTES)
        if precision == "fp16":
            config.set_flag(trt.BuilderFlag.FP16)
        profile = builder.create_optimization_profile()
        profile.set_shape(input_name, (1, *item_shape), (max_batch, *item_shape), (max_batch, *item_shape))
        config.add_optimization_profile(profile)
        blob = builder.build_serialized_network(network, config)
        if blob is None:
            raise RuntimeError(f"TensorRT could not build an engine from {onnx}")
        return bytes(blob)

    def launch(self, batch: np.ndarray) -> int:
        """Stage, copy in, enqueue, copy out (all async on the stream); returns the batch size."""
        n = batch.shape[0]
        name = self.input_name
        self.context.set_input_shape(name, batch.shape)
        staged = self.host[name][:n]
        np.copyto(staged, batch.astype(staged.dtype, copy=False))
        self.dev[name][:n].set(staged, stream=self.stream)
        self.context.execute_async_v3(self.stream.ptr)
        for o in self.outputs:
            self.dev[o][:n].get(stream=self.stream, out=self.host[o][:n])
        self.done.record(self.stream)
        return n

    def result(self, n: int) -> np.ndarray:
        return self.host[self.outputs[0]][:n].copy()

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        n = self.launch(batch)
        self.done.synchronize()
        return self.result(n)


class TensorRTBackend(ModelBackend):
    kind = "tensorrt"
    precision = os.environ.get("JIGSAW_TRT_PRECISION", "fp16")

    def _load_net(self, variant: str, max_batch: int) -> Any:
        ok, why = available()
        if not ok:
            raise RuntimeError(f"the tensorrt backend needs a GPU: {why}")
        from jigsaw.models.export import export
        ex = export(variant)
        return _TrtNet(ex.path, ex.input_name, ex.input_shape, max_batch, self.precision)

    async def execute_async(self, request_ids: Sequence[int], inputs: Sequence[bytes]) -> list[ItemResult]:
        if not isinstance(self._net, _TrtNet):
            return self.execute(request_ids, inputs)
        batch, ctx = self.pipeline.prepare(inputs)
        n = self._net.launch(batch)
        while not self._net.done.query():  # the loop stays free while the GPU works
            await asyncio.sleep(0.0002)
        return self.pipeline.finish(self._net.result(n), ctx)
