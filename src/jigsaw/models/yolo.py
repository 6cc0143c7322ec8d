"""A compact, faithful YOLOv5 (v6.x layout) detector and its post-processing.

No maintained YOLOv5 package installs here without fetching weights at run time, so the network
is written out: CSP (C3) backbone, SPPF, PAN neck, three detection heads on strides 8/16/32 with
the COCO anchors, width/depth multiples n 0.25/0.33, s 0.50/0.33, m 0.75/0.67, l 1.00/1.00,
x 1.25/1.33. The module ends with the box decode (sigmoid, grid offsets, anchor scaling) so the
ONNX export carries it; the class filter and NMS (``detect_rows``) run as torch ops on the
network output's device, the whole batch in one NMS call. Layer names follow the reference layout
closely enough that a state dict converted from it loads with ``strict=False`` diagnostics naming
any mismatch.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch
from torch import nn

SIZES: dict[str, tuple[float, float]] = {
    "n": (0.33, 0.25), "s": (0.33, 0.50), "m": (0.67, 0.75), "l": (1.00, 1.00), "x": (1.33, 1.25),
}
ANCHORS = ((10, 13, 16, 30, 33, 23), (30, 61, 62, 45, 59, 119), (116, 90, 156, 198, 373, 326))
STRIDES = (8, 16, 32)
NUM_CLASSES = 80  # COCO
COCO_PERSON, COCO_CAR = 0, 2


def _div8(x: float) -> int:
    return int(math.ceil(x / 8) * 8)


class Conv(nn.Module):
    """Conv2d + BatchNorm + SiLU, 'same' padding."""

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, p: int | None = None) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2 if p is None else p, bias=False)
        self.bn = nn.BatchNorm2d(c2, eps=1e-3, momentum=0.03)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    def __init__(self, c1: int, c2: int, shortcut: bool = True) -> None:
        super().__init__()
        self.cv1 = Conv(c1, c2, 1)
        self.cv2 = Conv(c2, c2, 3)
        self.add = shortcut and c1 == c2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C3(nn.Module):
    """CSP bottleneck with 3 convolutions."""

    def __init__(self, c1: int, c2: int, n: int = 1, shortcut: bool = True) -> None:
        super().__init__()
        c_ = c2 // 2
        self.cv1 = Conv(c1, c_, 1)
        self.cv2 = Conv(c1, c_, 1)
        self.cv3 = Conv(2 * c_, c2, 1)
        self.m = nn.Sequential(*(Bottleneck(c_, c_, shortcut) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: three chained 5x5 max pools."""

    def __init__(self, c1: int, c2: int, k: int = 5) -> None:
        super().__init__()
        c_ = c1 // 2
        self.cv1 = Conv(c1, c_, 1)
        self.cv2 = Conv(c_ * 4, c2, 1)
        self.m = nn.MaxPool2d(k, 1, k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        y1 = self.m(x)
        y2 = self.m(y1)
        return self.cv2(torch.cat((x, y1, y2, self.m(y2)), 1))


class Detect(nn.Module):
    """Three 1x1 heads; decodes to (batch, boxes, 5 + classes) in input pixels (cx, cy, w, h)."""

    def __init__(self, channels: tuple[int, int, int], nc: int = NUM_CLASSES) -> None:
        super().__init__()
        self.nc, self.no, self.na = nc, nc + 5, 3
        self.m = nn.ModuleList(nn.Conv2d(c, self.no * self.na, 1) for c in channels)
        self.register_buffer("anchors", torch.tensor(ANCHORS, dtype=torch.float32).view(3, 3, 2))
        for conv, s in zip(self.m, STRIDES):  # the reference bias prior (objectness ~ 8 per 640^2)
            b = conv.bias.detach().view(self.na, -1)
            b[:, 4] += math.log(8 / (640 / s) ** 2)
            b[:, 5:] += math.log(0.6 / (nc - 0.99))
            conv.bias = nn.Parameter(b.view(-1))

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        out = []
        for i, x in enumerate(feats):
            bs, _, ny, nx = x.shape
            y = self.m[i](x).view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).sigmoid()
            # The grid is made on the input's device (a CPU tensor here broke every CUDA forward).
            yv, xv = torch.meshgrid(torch.arange(ny, dtype=y.dtype, device=y.device),
                                    torch.arange(nx, dtype=y.dtype, device=y.device), indexing="ij")
            grid = torch.stack((xv, yv), 2).view(1, 1, ny, nx, 2)
            anchor = self.anchors[i].view(1, self.na, 1, 1, 2).to(y.dtype)
            xy = (y[..., :2] * 2 - 0.5 + grid) * STRIDES[i]
            wh = (y[..., 2:4] * 2) ** 2 * anchor
            out.append(torch.cat((xy, wh, y[..., 4:]), -1).view(bs, -1, self.no))
        return torch.cat(out, 1)


class YoloV5(nn.Module):
    """YOLOv5 v6.x (P3-P5) of one size letter."""

    def __init__(self, size: str = "n", nc: int = NUM_CLASSES) -> None:
        super().__init__()
        gd, gw = SIZES[size]

        def ch(c: int) -> int:
            return _div8(c * gw)

        def n(k: int) -> int:
            return max(round(k * gd), 1)

        self.size = size
        self.b0 = Conv(3, ch(64), 6, 2, 2)
        self.b1 = Conv(ch(64), ch(128), 3, 2)
        self.b2 = C3(ch(128), ch(128), n(3))
        self.b3 = Conv(ch(128), ch(256), 3, 2)
        self.b4 = C3(ch(256), ch(256), n(6))
        self.b5 = Conv(ch(256), ch(512), 3, 2)
        self.b6 = C3(ch(512), ch(512), n(9))
        self.b7 = Conv(ch(512), ch(1024), 3, 2)
        self.b8 = C3(ch(1024), ch(1024), n(3))
        self.b9 = SPPF(ch(1024), ch(1024))
        self.h10 = Conv(ch(1024), ch(512), 1)
        self.up = nn.Upsample(scale_factor=2.0, mode="nearest")
        self.h13 = C3(ch(1024), ch(512), n(3), False)
        self.h14 = Conv(ch(512), ch(256), 1)
        self.h17 = C3(ch(512), ch(256), n(3), False)
        self.h18 = Conv(ch(256), ch(256), 3, 2)
        self.h20 = C3(ch(512), ch(512), n(3), False)
        self.h21 = Conv(ch(512), ch(512), 3, 2)
        self.h23 = C3(ch(1024), ch(1024), n(3), False)
        self.detect = Detect((ch(256), ch(512), ch(1024)), nc)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: (batch, 3, H, W) float in [0, 1], H and W multiples of 32."""
        p3 = self.b4(self.b3(self.b2(self.b1(self.b0(x)))))
        p4 = self.b6(self.b5(p3))
        x10 = self.h10(self.b9(self.b8(self.b7(p4))))
        x14 = self.h14(self.h13(torch.cat((self.up(x10), p4), 1)))
        o3 = self.h17(torch.cat((self.up(x14), p3), 1))
        o4 = self.h20(torch.cat((self.h18(o3), x14), 1))
        o5 = self.h23(torch.cat((self.h21(o4), x10), 1))
        return self.detect([o3, o4, o5])


# ---- post-processing ------------------------------------------------------------------------

NMS_GROUP_OFFSET = 4096.0  # per (image, class) group: boxes of two groups never overlap


def detect_rows(pred: torch.Tensor, *, conf_threshold: float = 0.25, iou_threshold: float = 0.45,
                classes: set[int] | None = None, max_det: int = 100) -> torch.Tensor:
    """The batch's detections as (k, 7) rows ``image, x1, y1, x2, y2, score, class`` on
    ``pred``'s device: the confidence and class filter, class-aware NMS over the whole batch in
    one call, each image's rows together, best first, at most ``max_det`` per image.

    ``pred``: (batch, boxes, 5 + classes), the network's decoded output. Nothing leaves the device
    (NMS runs in float64 there: the group offsets stay exact), so a GPU pipeline copies back only
    these rows.
    """
    from torchvision.ops import nms
    pred = pred.float()
    img, idx = torch.nonzero(pred[..., 4] > conf_threshold, as_tuple=True)
    p = pred[img, idx]
    score, cls = (p[:, 5:] * p[:, 4:5]).max(1)
    ok = score > conf_threshold
    if classes is not None:
        ok &= torch.isin(cls, torch.tensor(sorted(classes), device=cls.device))
    img, p, cls, score = img[ok], p[ok], cls[ok], score[ok]
    xy, wh = p[:, :2], p[:, 2:4]
    boxes = torch.cat((xy - wh / 2, xy + wh / 2), 1)
    group = (img * (pred.shape[-1] - 5) + cls).double()[:, None] * NMS_GROUP_OFFSET
    keep = nms(boxes.double() + group, score.double(), iou_threshold)
    by_image = torch.sort(img[keep], stable=True).indices  # score order kept within an image
    keep = keep[by_image]
    counts = torch.bincount(img[keep], minlength=pred.shape[0])
    rank = torch.arange(len(keep), device=keep.device) - (torch.cumsum(counts, 0) - counts)[img[keep]]
    keep = keep[rank < max_det]
    return torch.cat((img[keep, None].float(), boxes[keep], score[keep, None], cls[keep, None].float()), 1)


def split_rows(rows: np.ndarray, batch: int) -> list[np.ndarray]:
    """``detect_rows``' host copy as one (n, 6) array per image (``x1, y1, x2, y2, score, class``)."""
    bounds = np.searchsorted(rows[:, 0], np.arange(batch + 1), side="left")
    return [rows[lo:hi, 1:].astype(np.float32) for lo, hi in itertools.pairwise(bounds)]


def postprocess(pred: np.ndarray, *, conf_threshold: float = 0.25, iou_threshold: float = 0.45,
                classes: set[int] | None = None, max_det: int = 100) -> list[np.ndarray]:
    """Per image: (n, 6) rows ``x1, y1, x2, y2, score, class`` (``detect_rows`` on a host array)."""
    rows = detect_rows(torch.as_tensor(np.asarray(pred)), conf_threshold=conf_threshold,
                       iou_threshold=iou_threshold, classes=classes, max_det=max_det)
    return split_rows(rows.numpy(), len(pred))
