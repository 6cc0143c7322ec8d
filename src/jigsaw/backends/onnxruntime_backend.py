"""The onnxruntime backend: the variant's cached ONNX export(s) on the CPU execution provider.

Intra-op threads are the instance's CPU share (``threads``; a ``<k>c`` segment gives k), with
one inter-op thread, so instances sharing a CPU do not oversubscribe it. The captioner and TTS
run as several graphs under their numpy drivers (``jigsaw.models.graphs``).
"""

from __future__ import annotations

from pathlib import Path

from jigsaw.backends.model import GraphBackend
from jigsaw.models.graphs import Runner, ort_runner


class OnnxRuntimeBackend(GraphBackend):
    kind = "onnxruntime"

    def _graph_runner(self, path: Path, max_batch: int) -> Runner:
        return ort_runner(path, self.threads)
