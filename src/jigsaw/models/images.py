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


LETTERBOX_FILL = 114


def resize_index(n_out: int, n_in: int) -> np.ndarray:
    """The source row (or column) of each of ``n_out`` nearest-neighbour samples of ``n_in``.

    Every resize, letterbox and crop samples with these indexes, on the host (``resize``) and on
    the device (``jigsaw.backends.gpu_pipeline``), so both paths pick the same pixels.
    """
    return np.minimum((np.arange(n_out) + 0.5) * n_in / n_out, n_in - 1).astype(np.intp)


def resize(img: np.ndarray, h: int, w: int) -> np.ndarray:
    """Nearest-neighbour resize (cheap, dependency-free, deterministic)."""
    ys, xs = resize_index(h, img.shape[0]), resize_index(w, img.shape[1])
    return img[ys[:, None], xs[None, :]]


def letterbox_geometry(h: int, w: int, size: int) -> tuple[float, int, int, int, int]:
    """An (h, w) image fit into a ``size`` square keeping its aspect ratio:
    (scale, resized height, resized width, pad_x, pad_y)."""
    r = min(size / h, size / w)
    nh, nw = max(1, round(h * r)), max(1, round(w * r))
    return r, nh, nw, (size - nw) // 2, (size - nh) // 2


def unletterbox(boxes: np.ndarray, r: float, pad: tuple[int, int], h: int, w: int) -> np.ndarray:
    """(x1, y1, x2, y2) boxes on the letterboxed canvas back in the (h, w) image's pixels."""
    px, py = pad
    out = np.asarray(boxes, np.float32).reshape(-1, 4).copy()
    out[:, [0, 2]] = np.clip((out[:, [0, 2]] - px) / r, 0, w)
    out[:, [1, 3]] = np.clip((out[:, [1, 3]] - py) / r, 0, h)
    return out


def crop_window(box: np.ndarray, h: int, w: int) -> tuple[int, int, int, int]:
    """The whole-pixel (x1, y1, x2, y2) window of a box in an (h, w) image, at least one pixel."""
    x1 = int(np.clip(np.floor(box[0]), 0, w - 1))
    y1 = int(np.clip(np.floor(box[1]), 0, h - 1))
    x2 = int(np.clip(np.ceil(box[2]), x1 + 1, w))
    y2 = int(np.clip(np.ceil(box[3]), y1 + 1, h))
    return x1, y1, x2, y2


def crop(img: np.ndarray, box: np.ndarray, size: int) -> np.ndarray:
    """The (x1, y1, x2, y2) region of ``img`` (at least one pixel) resized to ``size`` x ``size``."""
    x1, y1, x2, y2 = crop_window(box, *img.shape[:2])
    return resize(img[y1:y2, x1:x2], size, size)
