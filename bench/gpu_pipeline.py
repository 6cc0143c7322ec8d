"""The network alone beside the served pipeline around it: how much the pipeline costs.

Per variant and batch size, in one run on one device:

- **alone**: the engine on a batch already on the device, at the engine's best settings (on CUDA
  fp16, channels-last, a CUDA graph per batch bucket; fp32 eager on the CPU), each batch waited for;
- **served**: the backend's ``execute`` as a worker calls it: encoded uint8 request images in
  (``jigsaw.tensors`` payloads), per-item results out (and, for the detector, the crops of its
  downstream tasks ``car`` and ``person``), through ``jigsaw.backends.gpu_pipeline``;
- **overlapped**: the same pipeline with two batches in flight (``submit`` of batch n+1 before
  ``collect`` of batch n: its upload overlaps the compute of the one before).

It prints items/s of each, the pipeline efficiency (served / alone) and the overhead per batch
(served minus alone, ms); and, timed apart, the device pipeline around a stored network output
(everything but the network: staging, upload, sampling, normalisation, post-processing, crops)
beside the numpy path's pre-processing alone (``Pipeline.prepare``, what a batch cost before).
``--json PATH`` writes the rows; ``--quick`` is a short check (small inputs, batches 1 and 8, a
fraction of a second per row). The machine's load is printed with the numbers: compare rows of
one run.

    PYTHONPATH=src python bench/gpu_pipeline.py [--device cuda] [--backend torch]
        [--variants yolov5s,efficientnet-b0,vgg11,resnet50] [--batches 1,8,32] [--seconds 2]
        [--image 480x640] [--detector-size 640] [--classifier-size 224] [--threads 1] [--quick]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

VARIANTS = "yolov5s,efficientnet-b0,vgg11,resnet50"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="where the engine runs (default: cuda when torch sees a GPU, else cpu)")
    p.add_argument("--backend", choices=("torch", "tensorrt"), default="torch")
    p.add_argument("--variants", default=VARIANTS)
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--seconds", type=float, default=2.0, help="timed seconds per row and mode")
    p.add_argument("--image", default="480x640", help="request image HxW (uint8 RGB)")
    p.add_argument("--detector-size", type=int, default=None, help="JIGSAW_DETECTOR_SIZE (default 640)")
    p.add_argument("--classifier-size", type=int, default=None, help="JIGSAW_CLASSIFIER_SIZE (default 224)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (the CPU device's share)")
    p.add_argument("--quick", action="store_true",
                   help="a short check: batches 1,8, 0.3 s per row, 160/64 inputs, 120x160 images")
    p.add_argument("--json", default="", help="write the rows and the machine here")
    args = p.parse_args(argv)
    if args.quick:
        args.batches, args.seconds, args.image = "1,8", 0.3, "120x160"
        args.detector_size = args.detector_size or 160
        args.classifier_size = args.classifier_size or 64
    return args


def timed(fn: Callable[[], Any], sync: Callable[[], None], seconds: float) -> tuple[float, int]:
    """Mean seconds per call of ``fn`` (each waited for) over at least ``seconds`` (3 calls at
    least), after two untimed calls."""
    for _ in range(2):
        fn()
    sync()
    n, t0 = 0, time.perf_counter()
    while n < 3 or time.perf_counter() - t0 < seconds:
        fn()
        sync()
        n += 1
    return (time.perf_counter() - t0) / n, n


def overlapped(pipe: Any, payloads: list[bytes], seconds: float) -> float:
    """Mean seconds per batch with two batches in flight (submit n+1, then collect n)."""
    pipe.collect(pipe.submit(payloads))
    n, t0 = 0, time.perf_counter()
    prev = pipe.submit(payloads)
    while n < 3 or time.perf_counter() - t0 < seconds:
        nxt = pipe.submit(payloads)
        pipe.collect(prev)
        prev = nxt
        n += 1
    pipe.collect(prev)
    return (time.perf_counter() - t0) / (n + 1)


class CachedEngine:
    """The engine's device, dtype and layout, answering a stored output: the pipeline alone."""

    def __init__(self, engine: Any, output: Any) -> None:
        self.device, self.dtype, self.channels_last = engine.device, engine.dtype, engine.channels_last
        self.output = output

    def __call__(self, x: Any) -> Any:
        return self.output[:x.shape[0]]

    def warm_up(self, batch_sizes: Any) -> None:
        pass


def pipeline_only(be: Any, payloads: list[bytes], output: Any, sync: Callable[[], None],
                  seconds: float) -> tuple[float, float]:
    """Seconds per batch of the device pipeline around a stored network output (staging, upload,
    sampling, normalisation, post-processing, crops), and of the numpy path's ``prepare`` alone."""
    from jigsaw.backends.gpu_pipeline import GpuPipeline
    pipe = GpuPipeline(be.pipeline, CachedEngine(be._net, output), len(payloads))
    device_s, _ = timed(lambda: pipe(payloads), sync, seconds)
    numpy_s, _ = timed(lambda: be.pipeline.prepare(payloads), lambda: None, seconds)
    return device_s, numpy_s


def bench_variant(variant: str, batches: list[int], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The rows of one variant: alone, served and overlapped per batch size."""
    import torch

    from jigsaw.backends.base import Downstream
    from jigsaw.backends.registry import backend_kind
    from jigsaw.models.catalog import variant_info
    from jigsaw.models.images import street_scene
    from jigsaw.tensors import Tensor, encode_tensors
    info = variant_info(variant)
    downstream = [Downstream("car", 1.0), Downstream("person", 1.0)] if info.kind == "detector" else []
    be: Any = backend_kind(args.backend).load_class()("bench", info.kind, downstream, threads=args.threads)
    be.load(variant, max(batches))
    be.warm_up(range(1, max(batches) + 1))
    engine, pipe = be._net, be.device_pipeline
    device = engine.device

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    h, w = (int(x) for x in args.image.split("x"))
    if info.kind == "classifier":
        h = w = info.image_size  # a classifier is fed crops of its own size
    img = street_scene(h, w)
    payload = bytes(encode_tensors([Tensor("image", "UINT8", img.shape, img)]))
    rows = []
    for b in batches:
        fmt = torch.channels_last if engine.channels_last else torch.contiguous_format
        x = torch.rand(b, 3, info.image_size, info.image_size, device=device).to(engine.dtype)
        x = x.contiguous(memory_format=fmt)
        with torch.inference_mode():
            alone_s, _ = timed(lambda x=x: engine(x), sync, args.seconds)
            output = engine(x).clone()
        payloads = [payload] * b
        pipe_s, numpy_s = pipeline_only(be, payloads, output, sync, args.seconds / 2)
        ids = list(range(b))
        served_s, _ = timed(lambda p=payloads, i=ids: be.execute(i, p), sync, args.seconds)
        over_s = overlapped(pipe, payloads, args.seconds)
        rows.append({"variant": variant, "kind": info.kind, "batch": b, "input": info.image_size,
                     "image": f"{h}x{w}", "alone_items_s": b / alone_s, "served_items_s": b / served_s,
                     "overlapped_items_s": b / over_s, "efficiency": alone_s / served_s,
                     "overlapped_efficiency": alone_s / over_s, "alone_ms": 1e3 * alone_s,
                     "served_ms": 1e3 * served_s, "overhead_ms": 1e3 * (served_s - alone_s),
                     "pipeline_ms": 1e3 * pipe_s, "numpy_prepare_ms": 1e3 * numpy_s})
    be.close()
    return rows


def machine(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    dev = args.device
    name = torch.cuda.get_device_name(0) if dev == "cuda" else platform.processor() or platform.machine()
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    return {"device": dev, "device_name": name, "torch": torch.__version__, "backend": args.backend,
            "cpus": len(os.sched_getaffinity(0)), "threads": args.threads, "loadavg": " ".join(load),
            "precision": os.environ.get("JIGSAW_TORCH_PRECISION", "fp16") if dev == "cuda" else "fp32"}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.detector_size:
        os.environ["JIGSAW_DETECTOR_SIZE"] = str(args.detector_size)
    if args.classifier_size:
        os.environ["JIGSAW_CLASSIFIER_SIZE"] = str(args.classifier_size)
    import torch
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the engine's device is the process's
    elif not torch.cuda.is_available():
        print("gpu_pipeline: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    batches = [int(b) for b in args.batches.split(",")]
    rows: list[dict[str, Any]] = []
    print(f"{'variant':<16}{'batch':>6}{'alone/s':>11}{'served/s':>11}{'overlap/s':>11}{'eff':>7}"
          f"{'eff2':>7}{'alone ms':>10}{'over ms':>9}{'pipe ms':>9}{'numpy ms':>10}")
    for v in args.variants.split(","):
        for r in bench_variant(v, batches, args):
            rows.append(r)
            print(f"{r['variant']:<16}{r['batch']:>6}{r['alone_items_s']:>11.1f}{r['served_items_s']:>11.1f}"
                  f"{r['overlapped_items_s']:>11.1f}{r['efficiency']:>7.2f}{r['overlapped_efficiency']:>7.2f}"
                  f"{r['alone_ms']:>10.2f}{r['overhead_ms']:>9.2f}{r['pipeline_ms']:>9.2f}"
                  f"{r['numpy_prepare_ms']:>10.2f}", flush=True)
    m = machine(args)
    print(f"device {m['device']} ({m['device_name']}), torch {m['torch']}, backend {m['backend']}, "
          f"{m['precision']}, {m['threads']} of {m['cpus']} CPUs, load {m['loadavg']}; "
          "eff = served / alone, eff2 = "
          "overlapped / alone, over ms = served - alone per batch, pipe ms = the device pipeline around a "
          "stored network output, numpy ms = the host path's prepare alone")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": m, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
