"""What a worker runs before it reports ready: the batch sizes and a synthetic item per task kind.

A batch size's first run pays one-time costs (a CUDA graph's capture, cuDNN's kernel choice, the
allocator's first blocks, TensorRT's shapes); run before ready, no request pays them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def warm_batches(batch_sizes: Sequence[int], *, on_device: bool) -> list[int]:
    """The sizes to run: every bucket up to the largest planned size on a device, else one item."""
    if not batch_sizes:
        return []
    if not on_device:
        return [1]
    from jigsaw.backends.gpu_pipeline import batch_buckets
    return batch_buckets(max(batch_sizes))


def warm_payload(variant: str) -> bytes:
    """One encoded item a task of ``variant`` takes (a synthetic street scene, or token ids)."""
    from jigsaw.models.images import street_scene
    from jigsaw.models.zoo import CAPTION_TOKENS, variant_info
    from jigsaw.tensors import Tensor, encode_tensors
    info = variant_info(variant)
    if info.kind == "tts":
        tokens = np.arange(CAPTION_TOKENS, dtype=np.int32).reshape(1, -1)
        return bytes(encode_tensors([Tensor("tokens", "INT32", tokens.shape, tokens)]))
    side = info.image_size or 64
    img = street_scene(side, side)
    return bytes(encode_tensors([Tensor("image", "UINT8", img.shape, img)]))
