"""The onnxruntime backend: the variant's cached ONNX export on the CPU execution provider.

Intra-op threads are the instance's CPU share (``threads``; a ``<k>c`` segment gives k), with
one inter-op thread, so instances sharing a CPU do not oversubscribe it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jigsaw.backends.model import ModelBackend


class _OrtNet:
    def __init__(self, path: str, input_name: str, threads: int) -> None:
        import onnxruntime as ort
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        self.input_name = input_name

    def __call__(self, batch: np.ndarray) -> Any:
        return self.session.run(None, {self.input_name: np.ascontiguousarray(batch, np.float32)})[0]


class OnnxRuntimeBackend(ModelBackend):
    kind = "onnxruntime"

    def _load_net(self, variant: str, max_batch: int) -> Any:
        from jigsaw.models.export import export
        ex = export(variant)
        return _OrtNet(str(ex.path), ex.input_name, self.threads)
