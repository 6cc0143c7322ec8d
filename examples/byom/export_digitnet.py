"""Exports ``digitnet``, a small digit classifier that is not in jigsaw's zoo, to ONNX.

    python examples/byom/export_digitnet.py            # -> examples/byom/models/digitnet/1/model.onnx

The network is randomly initialised with a fixed seed (so every export is the same file);
train it, or load your own weights, before exporting in real use. It is written in Triton's
repository layout: ``models/digitnet/config.pbtxt`` and ``models/digitnet/1/model.onnx``, with a
dynamic batch axis. Input ``image`` FP32 [batch, 1, 28, 28], output ``logits`` FP32 [batch, 10].
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent


class DigitNet(nn.Module):
    """Two convolutions and a linear layer: 0.58 MFLOPs an image (``jigsaw modeled`` reads that
    from the exported graph)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Linear(16 * 7 * 7, 10)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(image).flatten(1))


CONFIG = """name: "digitnet"
platform: "onnxruntime_onnx"
max_batch_size: 64
"""


def export(out_dir: Path) -> Path:
    """Writes ``out_dir/config.pbtxt`` and ``out_dir/1/model.onnx``; returns the ONNX file."""
    torch.manual_seed(0)
    model = DigitNet().eval()
    path = out_dir / "1" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode():
        torch.onnx.export(model, (torch.rand(2, 1, 28, 28),), str(path), input_names=["image"],
                          output_names=["logits"], opset_version=17, dynamo=False,
                          dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})
    (out_dir / "config.pbtxt").write_text(CONFIG)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "models" / "digitnet",
                        help="the model's directory (default: models/digitnet beside this script)")
    print(export(parser.parse_args().out))


if __name__ == "__main__":
    main()
