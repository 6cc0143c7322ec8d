"""The torch backend: the variant's module in eval mode, CPU threads set to the instance's share
(or CUDA when the process sees a GPU). The captioner and TTS run as transformers runs them
(``generate`` with its KV cache, ``VitsModel`` item by item): the reference the ONNX graphs match."""

from __future__ import annotations

from typing import Any

import numpy as np

from jigsaw.backends.model import ModelBackend


class _TorchNet:
    def __init__(self, variant: str, threads: int) -> None:
        import torch

        from jigsaw.models.zoo import build
        torch.set_num_threads(threads)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = build(variant).to(self.device)

    def __call__(self, batch: np.ndarray) -> Any:
        import torch
        with torch.inference_mode():
            return self.model(torch.from_numpy(batch).to(self.device)).cpu().numpy()


class _TorchText:
    """The captioner or TTS through transformers itself (CPU)."""

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


class TorchBackend(ModelBackend):
    kind = "torch"

    def _load_net(self, variant: str, max_batch: int) -> Any:
        from jigsaw.models.zoo import variant_info
        kind = variant_info(variant).kind
        if kind in ("captioner", "tts"):
            return _TorchText(variant, kind, self.threads)
        return _TorchNet(variant, self.threads)
