"""GIT captioning as two graphs and a greedy loop, so onnxruntime and TensorRT can run it.

``encode`` runs the vision encoder and the text decoder over the image tokens and the BOS token,
returning the first token's logits and every layer's keys and values; ``step`` feeds one token
against that cache and returns the next logits and the grown cache. The loop in between is a
few numpy lines (``GitCaptioner``), the same for every backend. The decoder's layers are GIT's own
modules: only the attention's score/cache arithmetic is spelled out, to take the cache as tensors.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

from jigsaw.models.graphs import GraphSpec, Runner


def _attend(layer: Any, hidden: torch.Tensor, past_k: torch.Tensor | None, past_v: torch.Tensor | None,
            mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One GIT text layer over ``hidden`` with keys/values prepended from the cache."""
    sa = layer.attention.self
    shape = (*hidden.shape[:-1], -1, sa.attention_head_size)
    q = sa.query(hidden).view(shape).transpose(1, 2)
    k = sa.key(hidden).view(shape).transpose(1, 2)
    v = sa.value(hidden).view(shape).transpose(1, 2)
    if past_k is not None and past_v is not None:
        k, v = torch.cat([past_k, k], 2), torch.cat([past_v, v], 2)
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(sa.attention_head_size)
    if mask is not None:
        scores = scores + mask
    ctx = torch.matmul(torch.softmax(scores, -1), v).permute(0, 2, 1, 3)
    ctx = ctx.reshape(*ctx.shape[:2], sa.all_head_size)
    out = layer.feed_forward_chunk(layer.attention.output(ctx, hidden))
    return out, k, v


class GitEncode(nn.Module):
    """Image -> (logits after BOS, keys, values); keys/values are (layers, batch, heads, V + 1, head)."""

    def __init__(self, git: Any) -> None:
        super().__init__()
        self.git = git

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        g = self.git.git
        visual = g.visual_projection(g.image_encoder(pixel_values).last_hidden_state)
        bos = torch.full_like(visual[:, :1, 0], self.git.config.bos_token_id, dtype=torch.long)
        hidden = torch.cat([visual, g.embeddings(input_ids=bos)], 1)
        n = hidden.shape[1]
        # image tokens attend each other but not the text; the text token attends everything
        blocked = torch.zeros(n, n, dtype=torch.bool)
        blocked[:-1, -1] = True
        mask = torch.zeros(n, n).masked_fill(blocked, torch.finfo(torch.float32).min)[None, None]
        keys, values = [], []
        for layer in g.encoder.layer:
            hidden, k, v = _attend(layer, hidden, None, None, mask)
            keys.append(k)
            values.append(v)
        return self.git.output(hidden[:, -1]), torch.stack(keys), torch.stack(values)


class GitStep(nn.Module):
    """(token, its text position, cache) -> (next logits, grown keys, grown values)."""

    def __init__(self, git: Any) -> None:
        super().__init__()
        self.git = git

    def forward(self, token: torch.Tensor, position: torch.Tensor, past_keys: torch.Tensor,
                past_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        g = self.git.git
        hidden = g.embeddings(input_ids=token, position_ids=position)
        keys, values = [], []
        for i, layer in enumerate(g.encoder.layer):
            hidden, k, v = _attend(layer, hidden, past_keys[i], past_values[i], None)
            keys.append(k)
            values.append(v)
        return self.git.output(hidden[:, -1]), torch.stack(keys), torch.stack(values)


def git_graphs(git: Any, image_size: int) -> dict[str, GraphSpec]:
    """The ``encode`` and ``step`` graphs of an eval-mode ``GitForCausalLM``, batch axis dynamic."""
    git = git.eval()
    pixels = torch.rand(2, 3, image_size, image_size)
    with torch.inference_mode():
        _, keys, values = GitEncode(git)(pixels)
    cache_axes = {1: "batch", 3: "past"}
    return {
        "encode": GraphSpec(GitEncode(git).eval(), (pixels,), ("pixel_values",), ("logits", "keys", "values"),
                            {"pixel_values": {0: "batch"}, "logits": {0: "batch"},
                             "keys": {1: "batch"}, "values": {1: "batch"}}),
        "step": GraphSpec(GitStep(git).eval(),
                          (torch.ones(2, 1, dtype=torch.long), torch.ones(1, 1, dtype=torch.long),
                           keys.clone(), values.clone()),
                          ("token", "position", "past_keys", "past_values"), ("logits", "keys", "values"),
                          {"token": {0: "batch"}, "past_keys": cache_axes, "past_values": cache_axes,
                           "logits": {0: "batch"}, "keys": {1: "batch", 3: "present"},
                           "values": {1: "batch", 3: "present"}}),
    }


class GitCaptioner:
    """Greedy decoding of exactly ``tokens`` tokens per image over the two graphs.

    EOS is never chosen (as ``generate`` with ``min_new_tokens == max_new_tokens``), so every
    caption has the same length and the batch never shrinks. The first generated token sits at
    text position 1, BOS at 0, as GIT's embeddings number the text.
    """

    def __init__(self, config: Any, runners: dict[str, Runner], tokens: int = 16) -> None:
        self.encode, self.step = runners["encode"], runners["step"]
        self.tokens = tokens
        self.eos = config.eos_token_id

    def _pick(self, logits: np.ndarray) -> np.ndarray:
        logits = np.array(logits, np.float32, copy=True)
        if self.eos is not None:
            logits[:, self.eos] = -np.inf
        return logits.argmax(1).astype(np.int64)

    def __call__(self, pixel_values: np.ndarray) -> np.ndarray:
        logits, keys, values = self.encode({"pixel_values": np.ascontiguousarray(pixel_values, np.float32)})
        out = np.empty((pixel_values.shape[0], self.tokens), np.int64)
        for t in range(self.tokens):
            out[:, t] = self._pick(logits)
            if t + 1 == self.tokens:
                break
            position = np.array([[t + 1]], np.int64)
            logits, keys, values = self.step({"token": out[:, t:t + 1], "position": position,
                                              "past_keys": keys, "past_values": values})
        return out
