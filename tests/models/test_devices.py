"""Every zoo variant's forward creates its tensors on its input's device.

A tensor made without ``device=`` lands on the default device; on a GPU that is the CPU, and the
forward fails ("Expected all tensors to be on the same device"). CPU runs cannot see that, so:
image variants run on the ``meta`` device (no memory, no compute) with the default device left on
the CPU; the captioner, whose decode loop needs values, runs on the CPU with the default device
set to ``meta``. Either way a tensor created off the input's device meets one on it and
the forward raises.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch not installed (pip install 'jigsaw[models]')")

from jigsaw.models.catalog import variant_info  # noqa: E402
from jigsaw.models.zoo import build  # noqa: E402

IMAGE_VARIANTS = ["yolov5n", "yolov5s", "yolov5m", "yolov5l", "yolov5x", "efficientnet-b0",
                  "efficientnet-b1", "efficientnet-b2", "efficientnet-b3", "efficientnet-b4",
                  "efficientnet-b5", "efficientnet-b6", "efficientnet-b7", "resnet18", "resnet34",
                  "resnet50", "resnet101", "resnet152", "vgg11", "vgg13", "vgg16", "vgg19"]


@pytest.mark.parametrize("name", IMAGE_VARIANTS)
def test_image_variant_forward_stays_on_the_input_device(name: str) -> None:
    with torch.device("meta"):
        model = build(name)
    side = variant_info(name).image_size
    x = torch.empty(2, 3, side, side, device="meta")
    with torch.inference_mode():
        y = model(x)
    assert y.device.type == "meta" and y.shape[0] == 2


def test_the_meta_check_catches_a_cpu_tensor_made_in_forward() -> None:
    """The check is not vacuous: a forward that makes its grid on the default device fails it."""
    class GridOnDefault(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.arange(x.shape[-1], dtype=x.dtype)

    with pytest.raises((RuntimeError, NotImplementedError)):
        GridOnDefault()(torch.empty(2, 4, device="meta"))


def test_captioner_makes_no_tensor_on_the_default_device() -> None:
    """GIT's greedy decode (``generate``) around the image: tensors follow the pixels' device.
    (TTS is not checked this way: transformers' VITS samples its noise on the default device and
    moves it with ``.to(inputs.device)``, legal on a GPU but a meta tensor's copy here.)"""
    from jigsaw.models.text import caption
    git = build("git-tiny")
    pixels = torch.rand(1, 3, 32, 32)
    torch.set_default_device("meta")
    try:
        ids = caption(git, pixels, tokens=4)
    finally:
        torch.set_default_device(None)
    assert ids.device.type == "cpu" and ids.shape == (1, 4)
