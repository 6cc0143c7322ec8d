"""The ``digits`` app's transform: a glance that is not sure takes a second look.

An edge's transform is called once per finished item with the item's input tensors, the
upstream model's outputs for it (a leading axis of 1) and the edge; it returns the item's
children on the downstream task, 0..n dicts of arrays.
"""

from __future__ import annotations

import numpy as np

CONFIDENT = 0.9  # a glance whose top class has at least this probability needs no second look


def second_look(inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray], edge: object) -> list[dict]:
    """No child when the glance is confident; else the image flipped left-right and upside-down."""
    logits = outputs["logits"].reshape(-1).astype(np.float64)
    p = np.exp(logits - logits.max())
    if p.max() / p.sum() >= CONFIDENT:
        return []
    image = inputs["image"].reshape(1, 28, 28)
    return [{"image": np.ascontiguousarray(image[:, :, ::-1])},
            {"image": np.ascontiguousarray(image[:, ::-1, :])}]
