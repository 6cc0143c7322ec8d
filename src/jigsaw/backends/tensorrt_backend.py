"""The TensorRT backend (GPU only): an engine per ONNX graph of the variant.

The engine has one optimization profile for batches 1..max_batch (opt = max_batch) and is cached
next to the ONNX file, keyed by GPU name, TensorRT version, precision and max batch, so a node's
processes build it once. Its bindings are torch tensors: ``set_tensor_address`` takes their
``data_ptr()`` and ``execute_async_v3`` runs on the process's current torch CUDA stream, so a
worker loads one CUDA runtime (torch's) and no other array library. A detector or classifier runs
inside ``jigsaw.backends.gpu_pipeline`` (uint8 upload, device-side pre- and post-processing, the
engine in the middle); the captioner and TTS are several graphs (``jigsaw.models.graphs``), each
an engine whose profile spans the ranges ``jigsaw.models.export.axis_ranges`` gives its named axes
(batch, cache length, frames), run synchronously under the variant's numpy driver.

Inside a MIG instance the process sees only that instance (``CUDA_VISIBLE_DEVICES=MIG-<uuid>``),
so torch's device 0 is the instance. ``tensorrt`` is imported lazily; on a machine without it or
without a CUDA device the backend raises at load time with the reason.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jigsaw.backends.model import GraphBackend
from jigsaw.models.graphs import Runner
from jigsaw.models.repository import Model

log = logging.getLogger("jigsaw.backends")
WORKSPACE_BYTES = 2 << 30


def available() -> tuple[bool, str]:
    """(usable, reason) for this process: a CUDA device visible to torch and tensorrt importable."""
    try:
        import torch
    except Exception as exc:
        return False, f"torch is not importable ({exc.__class__.__name__})"
    if not torch.cuda.is_available():
        return False, "torch.cuda.is_available() is false (no GPU)"
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


def _engine(onnx: Path, profile: Profile, max_batch: int, precision: str, device: Any) -> Any:
    """The deserialized engine of ``onnx``, built once and cached next to it."""
    import tensorrt as trt  # type: ignore[import-not-found]
    logger = trt.Logger(trt.Logger.WARNING)
    gpu_name = device_name(device)
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


def device_name(device: Any) -> str:
    """The GPU's name (an engine is specific to it); the CPU's for a fake engine in tests."""
    import torch
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _stream(device: Any) -> int:
    """The current torch stream's handle on ``device`` (0, the default stream, off CUDA)."""
    import torch
    return int(torch.cuda.current_stream(device).cuda_stream) if device.type == "cuda" else 0


class _Bindings:
    """One execution context and its tensors' names, modes and torch dtypes."""

    def __init__(self, engine: Any, device: Any) -> None:
        import tensorrt as trt  # type: ignore[import-not-found]
        import torch
        self.engine, self.device = engine, device
        self.context = engine.create_execution_context()
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        self.dtypes = {n: getattr(torch, np.dtype(trt.nptype(engine.get_tensor_dtype(n))).name)
                       for n in names}

    def run(self, inputs: dict[str, Any]) -> list[Any]:
        """Bind ``inputs`` (device tensors of the engine's dtypes), allocate the outputs from
        torch's caching allocator, enqueue on the current stream; returns the output tensors."""
        import torch
        ctx = self.context
        for n in self.inputs:
            x = inputs[n]
            if not ctx.set_input_shape(n, tuple(x.shape)):
                raise RuntimeError(f"TensorRT: input {n} of shape {tuple(x.shape)} is outside the profile")
            ctx.set_tensor_address(n, x.data_ptr())
        outs = []
        for n in self.outputs:
            out = torch.empty(tuple(ctx.get_tensor_shape(n)), dtype=self.dtypes[n], device=self.device)
            ctx.set_tensor_address(n, out.data_ptr())
            outs.append(out)
        if not ctx.execute_async_v3(_stream(self.device)):
            raise RuntimeError("TensorRT execution failed")
        return outs


class _TrtGraph:
    """One graph of a multi-graph variant (captioner, TTS) or a repository model: host arrays in
    and out, any input shapes within its profile, synchronous (under the variant's driver)."""

    def __init__(self, onnx: Path, ranges: dict[str, tuple[int, int, int]], max_batch: int,
                 precision: str, device: Any) -> None:
        engine = _engine(onnx, graph_profile(onnx, ranges), max_batch, precision, device)
        self.bind = _Bindings(engine, device)

    def __call__(self, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        import torch
        b = self.bind
        dev = {n: torch.from_numpy(np.ascontiguousarray(inputs[n])).to(b.device, b.dtypes[n])
               for n in b.inputs}
        return [o.cpu().numpy() for o in b.run(dev)]


class TrtEngine:
    """A one-graph variant as a device ``Engine`` (``gpu_pipeline``): a dense NCHW batch of the
    engine's input dtype in, its first output out, on the device; enqueued, not waited for."""

    channels_last = False  # an engine built from the NCHW ONNX graph reads dense NCHW

    def __init__(self, onnx: Path, input_name: str, item_shape: tuple[int, ...], max_batch: int,
                 precision: str, device: Any) -> None:
        profile = {input_name: ((1, *item_shape), (max_batch, *item_shape), (max_batch, *item_shape))}
        self.bind = _Bindings(_engine(onnx, profile, max_batch, precision, device), device)
        self.device, self.input_name, self.item_shape = device, input_name, item_shape
        self.dtype = self.bind.dtypes[input_name]

    def __call__(self, x: Any) -> Any:
        return self.bind.run({self.input_name: x.contiguous()})[0]

    def warm_up(self, batch_sizes: Sequence[int]) -> None:
        """Each size once (the engine was built or loaded at construction)."""
        import torch
        for n in batch_sizes:
            self(torch.zeros((n, *self.item_shape), dtype=self.dtype, device=self.device))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class TensorRTBackend(GraphBackend):
    kind = "tensorrt"
    precision = os.environ.get("JIGSAW_TRT_PRECISION", "fp16")

    def _device(self) -> Any:
        ok, why = available()
        if not ok:
            raise RuntimeError(f"the tensorrt backend needs a GPU: {why}")
        from jigsaw.backends.gpu_pipeline import process_device
        return process_device()

    def _load_net(self, variant: str, max_batch: int) -> Any:
        device = self._device()
        from jigsaw.models.export import exportable
        if not exportable(variant):
            return super()._load_net(variant, max_batch)
        from jigsaw.models.export import export
        ex = export(variant)
        return TrtEngine(ex.path, ex.input_name, ex.input_shape, max_batch, self.precision, device)

    def _load_onnx(self, model: Model, max_batch: int) -> Any:
        """A repository model's graph: its batch axis (the first of every input) spans 1..max_batch."""
        device = self._device()
        import onnx as onnx_lib
        assert model.path is not None
        graph = onnx_lib.load(str(model.path), load_external_data=False).graph
        ranges = {d.dim_param: (1, max_batch, max_batch) for inp in graph.input
                  for d in inp.type.tensor_type.shape.dim[:1] if d.dim_param}
        return _TrtGraph(model.path, ranges, max_batch, self.precision, device)

    def _graph_runner(self, path: Path, max_batch: int) -> Runner:
        from jigsaw.backends.gpu_pipeline import process_device
        from jigsaw.models.export import axis_ranges
        return _TrtGraph(path, axis_ranges(self.zoo or self.variant, max_batch), max_batch, self.precision,
                         process_device())
