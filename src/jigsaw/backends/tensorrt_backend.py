"""The TensorRT backend (GPU only): an engine per ONNX graph of the variant.

The engine has one optimization profile for batches 1..max_batch (opt = max_batch) and is cached
next to the ONNX file, keyed by GPU name, TensorRT version, precision and max batch, so a node's
processes build it once. A batch is staged in pinned host memory, copied to a cupy device
buffer, run with ``execute_async_v3`` on the process's stream and copied back; the event loop
is not blocked meanwhile (``execute_async`` polls the stream's completion event). The captioner
and TTS are several graphs (``jigsaw.models.graphs``): each gets an engine whose profile spans
the ranges ``jigsaw.models.export.axis_ranges`` gives its named axes (batch, cache length,
frames), run synchronously under the variant's numpy driver.

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
from jigsaw.backends.model import GraphBackend
from jigsaw.models.graphs import Runner
from jigsaw.models.repository import Model

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


Profile = dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]


def graph_profile(onnx: Path, ranges: dict[str, tuple[int, int, int]]) -> Profile:
    """(min, opt, max) shapes of every input of an ONNX graph, its named axes taken from ``ranges``."""
    import onnx as onnx_lib
    model = onnx_lib.load(str(onnx), load_external_data=False)
    profile: Profile = {}
    for inp in model.graph.input:
        dims = inp.type.tensor_type.shape.dim
        lo, opt, hi = [], [], []
        for d in dims:
            if d.dim_param:
                if d.dim_param not in ranges:
                    raise ValueError(f"{onnx}: input {inp.name} has axis {d.dim_param!r} with no range")
                r = ranges[d.dim_param]
            else:
                r = (d.dim_value,) * 3
            lo.append(r[0])
            opt.append(r[1])
            hi.append(r[2])
        profile[inp.name] = (tuple(lo), tuple(opt), tuple(hi))
    return profile


def _engine(onnx: Path, profile: Profile, max_batch: int, precision: str) -> Any:
    """The deserialized engine of ``onnx``, built once and cached next to it."""
    import cupy as cp  # type: ignore[import-not-found]
    import tensorrt as trt  # type: ignore[import-not-found]
    logger = trt.Logger(trt.Logger.WARNING)
    gpu_name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    path = engine_path(onnx, gpu_name, trt.__version__, precision, max_batch)
    if path.exists():
        blob = path.read_bytes()
    else:
        blob = _build(trt, logger, onnx, profile, precision)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(blob)
        os.replace(tmp, path)
        log.info("built TensorRT engine %s", path)
    return trt.Runtime(logger).deserialize_cuda_engine(blob)


def _build(trt: Any, logger: Any, onnx: Path, profile: Profile, precision: str) -> bytes:
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx.read_bytes()):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT cannot parse {onnx}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE_BYTES)
    if precision == "fp16":
        config.set_flag(trt.BuilderFlag.FP16)
    opt = builder.create_optimization_profile()
    for name, (lo, mid, hi) in profile.items():
        opt.set_shape(name, lo, mid, hi)
    config.add_optimization_profile(opt)
    blob = builder.build_serialized_network(network, config)
    if blob is None:
        raise RuntimeError(f"TensorRT could not build an engine from {onnx}")
    return bytes(blob)


class _TrtGraph:
    """One graph of a multi-graph variant (captioner, TTS): any input shapes within its profile.

    Buffers come from cupy's pool per call, as the shapes change from call to call (the decode
    cache grows, TTS lengths vary); the call is synchronous, under the variant's driver.
    """

    def __init__(self, onnx: Path, ranges: dict[str, tuple[int, int, int]], max_batch: int,
                 precision: str) -> None:
        import cupy as cp  # type: ignore[import-not-found]
        import tensorrt as trt  # type: ignore[import-not-found]
        self.cp = cp
        self.engine = _engine(onnx, graph_profile(onnx, ranges), max_batch, precision)
        self.context = self.engine.create_execution_context()
        self.stream = cp.cuda.Stream(non_blocking=True)
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        self.dtypes = {n: np.dtype(trt.nptype(self.engine.get_tensor_dtype(n))) for n in names}

    def __call__(self, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        cp = self.cp
        with self.stream:
            keep = []
            for n in self.inputs:
                arr = cp.asarray(np.ascontiguousarray(inputs[n], self.dtypes[n]))
                keep.append(arr)
                self.context.set_input_shape(n, arr.shape)
                self.context.set_tensor_address(n, arr.data.ptr)
            outs = []
            for n in self.outputs:
                out = cp.empty(tuple(self.context.get_tensor_shape(n)), self.dtypes[n])
                outs.append(out)
                self.context.set_tensor_address(n, out.data.ptr)
            if not self.context.execute_async_v3(self.stream.ptr):
                raise RuntimeError("TensorRT execution failed")
            result = [o.get(stream=self.stream) for o in outs]
        self.stream.synchronize()
        return result


class _TrtNet:
    """A one-graph variant: fixed buffers for max_batch, pinned staging, polled asynchronously."""

    def __init__(self, onnx: Path, input_name: str, item_shape: tuple[int, ...], max_batch: int,
                 precision: str) -> None:
        import cupy as cp  # type: ignore[import-not-found]
        import tensorrt as trt  # type: ignore[import-not-found]
        self.cp, self.trt = cp, trt
        profile = {input_name: ((1, *item_shape), (max_batch, *item_shape), (max_batch, *item_shape))}
        self.engine = _engine(onnx, profile, max_batch, precision)
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


class TensorRTBackend(GraphBackend):
    kind = "tensorrt"
    precision = os.environ.get("JIGSAW_TRT_PRECISION", "fp16")

    def _load_net(self, variant: str, max_batch: int) -> Any:
        ok, why = available()
        if not ok:
            raise RuntimeError(f"the tensorrt backend needs a GPU: {why}")
        from jigsaw.models.export import exportable
        if not exportable(variant):
            return super()._load_net(variant, max_batch)
        from jigsaw.models.export import export
        ex = export(variant)
        return _TrtNet(ex.path, ex.input_name, ex.input_shape, max_batch, self.precision)

    def _load_onnx(self, model: Model, max_batch: int) -> Any:
        """A repository model's graph: its batch axis (the first of every input) spans 1..max_batch."""
        ok, why = available()
        if not ok:
            raise RuntimeError(f"the tensorrt backend needs a GPU: {why}")
        import onnx as onnx_lib
        assert model.path is not None
        graph = onnx_lib.load(str(model.path), load_external_data=False).graph
        ranges = {d.dim_param: (1, max_batch, max_batch) for inp in graph.input
                  for d in inp.type.tensor_type.shape.dim[:1] if d.dim_param}
        return _TrtGraph(model.path, ranges, max_batch, self.precision)

    def _graph_runner(self, path: Path, max_batch: int) -> Runner:
        from jigsaw.models.export import axis_ranges
        return _TrtGraph(path, axis_ranges(self.zoo or self.variant, max_batch), max_batch, self.precision)

    async def execute_async(self, request_ids: Sequence[int], inputs: Sequence[bytes]) -> list[ItemResult]:
        if not isinstance(self._net, _TrtNet):
            return self.execute(request_ids, inputs)
        batch, ctx = self.pipeline.prepare(inputs)
        n = self._net.launch(batch)
        while not self._net.done.query():  # the loop stays free while the GPU works
            await asyncio.sleep(0.0002)
        return self.pipeline.finish(self._net.result(n), ctx)
