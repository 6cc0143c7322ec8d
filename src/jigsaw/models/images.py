"""Synthetic test images (drawn with numpy): nothing is downloaded to test or profile."""

from __future__ import annotations

import numpy as np


def street_scene(height: int = 480, width: int = 640, seed: int = 0) -> np.ndarray:
    """An (H, W, 3) uint8 picture: sky, road, a few box-shaped 'cars' and upright 'persons'."""
    rng = np.random.default_rng(seed)
    img = np.empty((height, width, 3), np.uint8)
    horizon = height // 2
    img[:horizon] = (135, 180, 230)
    img[horizon:] = (90, 90, 90)
    yy, xx = np.mgrid[0:height, 0:width]
    for _ in range(4):  # cars: wide boxes with two dark wheels
        w, h = int(rng.integers(width // 10, width // 5)), int(rng.integers(height // 14, height // 8))
        x, y = int(rng.integers(0, width - w)), int(rng.integers(horizon, height - h))
        img[y:y + h, x:x + w] = rng.integers(0, 255, 3)
        for cx in (x + w // 4, x + 3 * w // 4):
            img[((xx - cx) ** 2 + (yy - (y + h)) ** 2) < (h // 4) ** 2] = (20, 20, 20)
    for _ in range(2):  # persons: a head disc over a narrow body
        w, h = int(rng.integers(width // 40, width // 25)), int(rng.integers(height // 8, height // 5))
        x, y = int(rng.integers(0, width - w)), int(rng.integers(horizon - h // 2, height - h))
        img[y + h // 5:y + h, x:x + w] = rng.integers(0, 255, 3)
        img[((xx - (x + w // 2)) ** 2 + (yy - (y + h // 10)) ** 2) < (w // 2 + 1) ** 2] = (230, 190, 160)
    noise = rng.integers(-8, 9, img.shape)
    return np.clip(img.astype(np.int16) + noise, 0, 255).astype(np.uint8)


def resize(img: np.ndarray, h: int, w: int) -> np.ndarray:
    """Nearest-neighbour resize (cheap, dependency-free, deterministic)."""
    ys = np.minimum((np.arange(h) + 0.5) * img.shape[0] / h, img.shape[0] - 1).astype(np.intp)
    xs = np.minimum((np.arange(w) + 0.5) * img.shape[1] / w, img.shape[1] - 1).astype(np.intp)
    return img[ys[:, None], xs[None, :]]


def crop(img: np.ndarray, box: np.ndarray, size: int) -> np.ndarray:
    """The (x1, y1, x2, y2) region of ``img`` (at least one pixel) resized to ``size`` x ``size``."""
    h, w = img.shape[:2]
    x1 = int(np.clip(np.floor(box[0]), 0, w - 1))
    y1 = int(np.clip(np.floor(box[1]), 0, h - 1))
    x2 = int(np.clip(np.ceil(box[2]), x1 + 1, w))
    y2 = int(np.clip(np.ceil(box[3]), y1 + 1, h))
    return resize(img[y1:y2, x1:x2], size, size)
