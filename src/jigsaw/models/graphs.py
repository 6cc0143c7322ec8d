"""Models that are several ONNX graphs glued by a little numpy (the captioner, TTS).

An autoregressive decode loop and a data-dependent output length do not fit one static graph.
Such a model is split into graphs with dynamic axes (``GraphSpec``) and a driver that calls them
through ``Runner`` functions: torch modules, onnxruntime sessions or TensorRT engines run the
same driver, so the backends differ only in how a graph runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

OPSET = 17

Runner = Callable[[dict[str, np.ndarray]], list[np.ndarray]]
"""Runs one graph: inputs by name -> outputs in ``output_names`` order."""


@dataclass(frozen=True)
class GraphSpec:
    """One exportable graph: an eval-mode torch module and how its inputs and outputs are named."""

    module: Any  # torch.nn.Module
    example: tuple[Any, ...]  # torch tensors, one per input, used to trace the export
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    dynamic_axes: dict[str, dict[int, str]] = field(default_factory=dict)


def torch_runner(spec: GraphSpec) -> Runner:
    import torch

    def run(inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        with torch.inference_mode():
            out = spec.module(*(torch.from_numpy(np.ascontiguousarray(inputs[n])) for n in spec.input_names))
        if not isinstance(out, tuple | list):
            out = (out,)
        return [o.numpy() for o in out]

    return run


def export_graph(spec: GraphSpec, path: Path) -> None:
    """Export ``spec`` to ``path`` atomically (a concurrent reader never sees half a file)."""
    import torch
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with torch.inference_mode():
        torch.onnx.export(spec.module, spec.example, str(tmp), input_names=list(spec.input_names),
                          output_names=list(spec.output_names), dynamic_axes=spec.dynamic_axes,
                          opset_version=OPSET, dynamo=False)
    os.replace(tmp, path)


def ort_runner(path: str | Path, threads: int = 1) -> Runner:
    """An onnxruntime CPU session on ``path``: ``threads`` intra-op threads, one inter-op."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}

    def run(inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        return session.run(None, {k: v for k, v in inputs.items() if k in names})

    return run
