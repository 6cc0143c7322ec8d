"""``jigsaw modeled``: modeled GPU profiles (one CSV per variant) for GPUs you cannot measure yet.

The numbers come from a small analytical model (see profiles/README.md): per-item FLOPs and
parameter counts, the GPU's dense FP16 peak and SM counts, a per-batch launch floor, a parallel-width
limit for small batches, and a duty-cycle model of MPS sharing. The output is deterministic, so the
committed CSVs can be checked against a fresh run.

Segments are a MIG GPU's profiles x MPS levels, or, for a GPU used whole (``--whole``, a node with
``mig = false``), the whole GPU x MPS levels. The built-in networks' figures are public numbers
(below); a repository model's are read from its ONNX graph (``variant_from_onnx``: FLOPs of its
convolutions and matrix products, its weights, its node count as launches, its intermediate
tensors as activations), at an efficiency ``--efficiency`` of the FP16 peak (default 0.10, the
ResNets'). Rows are ``source=modeled``: measure them with ``jigsaw profile`` when you can.

What a modeled row assumes about the serving pipeline around the network (``PIPELINE_ASSUMPTIONS``,
printed with every run): the input already a prepared FP32 tensor on the host, uploaded per item
from pageable memory; no decode, resize or normalisation; the network in FP16 eager kernels, one
launch each, no CUDA graphs; YOLOv5's box decode and NMS as ~1.5 ms of launches; outputs handed
off within the per-batch framework cost; nothing overlapped. ``bench/modeled_vs_measured.py``
prints the rows against an H200's measured ones.

    jigsaw modeled [--gpu H100-80GB] [--whole] [--out profiles/h100-80gb]     # the zoo's variants
    jigsaw modeled --node node.toml [--app app.toml] [--variants a,b]         # a node's apps
    jigsaw modeled --gpu L4 --memory-gb 24 --sm-count 58 --fp16-tflops 121 --memory-tb-s 0.3

A GPU without a built-in row (``GPU_SPECS``) is modeled from its figures: the node file's
``[gpus]`` ``memory_gb``, ``sm_count``, ``fp16_tflops`` and ``memory_tb_s`` (with ``mig = false``),
or the same four flags; it is used whole (``examples/l4x2.toml``, ``examples/a10x1.toml``).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from jigsaw.errors import JigsawError
from jigsaw.mig import GpuModel, MigProfile, gpu_model, whole_gpu_model
from jigsaw.profiles import ProfileRow, write_profile_csv

MODEL_NAME = "profiles/generate.py"  # the model's name in v1 rows (its first home), kept for them
MODEL_VERSION = "1"
MODEL_DATE = "2026-11-22"  # the date of MODEL_VERSION, written into every row
HOST = f"model:{MODEL_NAME} v{MODEL_VERSION}"

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
MPS_LEVELS = (1, 2, 3, 4)

# Runtime constants shared by every variant (an eager-framework FP16 deployment).
LAUNCH_US = 8.0  # host-side cost of one kernel launch through the framework
FRAMEWORK_MS = 0.4  # per batch: framework call, stream sync, output hand-off
HOST_ITEM_MS = 0.02  # per item: unpack the request, write the answer
CONTEXT_MB = 450.0  # CUDA context + framework state of one process
WORKSPACE_MB = 64.0  # cuDNN / cuBLAS workspace
ALLOCATOR_SLACK = 1.10  # caching-allocator fragmentation on activations
MPS_INTERFERENCE = 0.03  # per extra MPS process: shared L2 / DRAM contention on the latency
P95_BASE = 1.06  # p95 / mean with one process ...
P95_PER_PROCESS = 0.015  # ... plus this per extra MPS process (scheduling jitter)


PIPELINE_ASSUMPTIONS = (
    "input: a prepared FP32 tensor on the host (224x224x3: 0.6 MB), copied to the GPU per item at "
    "12 GB/s (pageable; A100: 10), not overlapped with compute",
    "pre-processing (decode, resize, normalise): not included; 0.02 ms of host work per item",
    "network: FP16 weights, eager unfused kernels (8 us per launch, 0.4 ms per batch), no CUDA graphs, "
    "at the family's fraction of the dense FP16 peak",
    "post-processing: YOLOv5's box decode + NMS ~1.5 ms per batch; the outputs' copy back within "
    "the per-batch 0.4 ms",
)
"""What every modeled row assumes about the pipeline around the network (``jigsaw modeled`` prints it)."""


@dataclass(frozen=True)
class GpuSpec:
    """Public figures of one GPU model that the latency model needs."""

    name: str  # a key of jigsaw.mig.GPU_MODELS
    backend: str  # written into the backend column
    fp16_dense_tflops: float  # tensor-core dense FP16/BF16 peak of the whole GPU
    hbm_tb_s: float  # memory bandwidth of the whole GPU
    host_copy_gb_s: float  # effective host-to-device copy rate of one process (pageable memory)

    whole: bool = False  # used whole: no MIG (or MIG off)
    memory_gb: float = 0.0  # a GPU jigsaw has no MIG table of (used whole): its memory ...
    sm_count: int = 0  # ... and SMs
    model: GpuModel | None = None  # a MIG GPU jigsaw has no table of: the node file's

    @property
    def mig(self) -> GpuModel:
        """The device's segment profiles: its MIG table, or the whole GPU as one profile."""
        if self.model is not None:
            m = self.model
            return whole_gpu_model(m.name, m.memory_gb, m.sm_count) if self.whole else m
        if self.memory_gb:
            return whole_gpu_model(self.name, self.memory_gb, self.sm_count)
        model = gpu_model(self.name)
        return whole_gpu_model(model.name, model.memory_gb, model.sm_count) if self.whole else model


GPU_SPECS: dict[str, GpuSpec] = {
    s.name: s
    for s in (
        GpuSpec("H100-80GB", "modeled-h100", 989.4, 3.35, 12.0),
        GpuSpec("H200", "modeled-h200", 989.4, 4.8, 12.0),
        GpuSpec("A100-80GB", "modeled-a100-80gb", 312.0, 2.039, 10.0),
        GpuSpec("A100-40GB", "modeled-a100-40gb", 312.0, 1.555, 10.0),
    )
}
HOST_COPY_GB_S = 10.0  # host-to-device copy rate of one process of a GPU given by its figures


@dataclass(frozen=True)
class Variant:
    """Per-item cost figures of one model variant (FLOPs are real FLOPs: 2 x multiply-adds)."""

    name: str
    gflop: float  # compute per item
    params_m: float  # weights, millions (stored FP16)
    kernels: int  # kernels launched per batch (eager, unfused)
    act_mb: float  # peak live activations per item, FP16
    input_mb: float  # bytes copied host -> device per item (FP32 tensor)
    eff: float  # fraction of the dense FP16 peak reached when the slice is full
    steps: int = 0  # sequential decode steps (autoregressive models)
    step_kernels: int = 0  # kernels per decode step
    step_host_ms: float = 0.0  # framework logic per decode step (generate loop)
    step_weight_mb: float = 0.0  # weights re-read from DRAM each decode step
    host_extra_ms: float = 0.0  # per item CPU work (e.g. text to phonemes)

    @property
    def width_sms(self) -> float:
        """SMs one item keeps busy: bigger feature maps / more FLOPs spread over more blocks."""
        return min(96.0, max(2.0, 2.5 * self.gflop ** 0.6))

    @property
    def weights_mb(self) -> float:
        return self.params_m * 2.0


def _img_mb(side: int) -> float:
    return side * side * 3 * 4 / 1e6


# torchvision's "GFLOPS" column counts multiply-adds: doubled here. Ultralytics' YOLOv5 figures are
# already FLOPs. GIT and TTS are estimated from their architectures (profiles/README.md).
_RESNET = (("resnet18", 1.81, 11.7, 70), ("resnet34", 3.66, 21.8, 120), ("resnet50", 4.09, 25.6, 170),
           ("resnet101", 7.80, 44.5, 340), ("resnet152", 11.51, 60.2, 500))
_VGG = (("vgg11", 7.61, 132.9, 30), ("vgg13", 11.31, 133.0, 34), ("vgg16", 15.47, 138.4, 40),
        ("vgg19", 19.63, 143.7, 46))
# name, GMACs, params M, blocks, resolution, width multiplier
_EFFNET = (("efficientnet-b0", 0.39, 5.3, 16, 224, 1.0), ("efficientnet-b1", 0.69, 7.8, 23, 240, 1.0),
           ("efficientnet-b2", 1.09, 9.1, 23, 288, 1.1), ("efficientnet-b3", 1.83, 12.2, 26, 300, 1.2),
           ("efficientnet-b4", 4.39, 19.3, 32, 380, 1.4), ("efficientnet-b5", 10.27, 30.4, 39, 456, 1.6),
           ("efficientnet-b6", 19.07, 43.0, 45, 528, 1.8), ("efficientnet-b7", 37.75, 66.3, 55, 600, 2.0))
# name, GFLOPs at 640, params M, kernels, width multiplier
_YOLO = (("yolov5n", 4.5, 1.9, 200, 0.25), ("yolov5s", 16.5, 7.2, 200, 0.50),
         ("yolov5m", 49.0, 21.2, 300, 0.75), ("yolov5l", 109.1, 46.5, 400, 1.00),
         ("yolov5x", 205.7, 86.7, 500, 1.25))
NMS_KERNELS = 190  # ~1.5 ms of box decoding + NMS per batch, expressed as launches


def _effnet_eff(gmacs: float) -> float:
    """Depthwise convs are memory bound: 2.5% of peak for b0 rising to 5% for b7 (log in FLOPs)."""
    lo, hi = math.log(0.39), math.log(37.75)
    return 0.025 + 0.025 * (math.log(gmacs) - lo) / (hi - lo)


def variants() -> tuple[Variant, ...]:
    """Every model variant of the example apps with its cost figures."""
    out: list[Variant] = []
    for name, gmacs, params, kernels in _RESNET:
        act = 5.0 if name in ("resnet18", "resnet34") else 8.0
        out.append(Variant(name, 2 * gmacs, params, kernels, act, _img_mb(224), 0.10))
    for name, gmacs, params, kernels in _VGG:
        out.append(Variant(name, 2 * gmacs, params, kernels, 13.0, _img_mb(224), 0.18))
    for name, gmacs, params, blocks, res, wmult in _EFFNET:
        act = 10.0 * (res / 224) ** 2 * wmult
        out.append(Variant(name, 2 * gmacs, params, 15 * blocks + 10, act, _img_mb(res),
                           round(_effnet_eff(gmacs), 4)))
    for name, gflop, params, kernels, wmult in _YOLO:
        out.append(Variant(name, gflop, params, kernels + NMS_KERNELS, 40.0 * wmult, _img_mb(640), 0.14))
    # GIT: CLIP ViT image encoder + 6-layer text decoder over the image tokens, ~20 greedy tokens.
    # base: ViT-B/16 17.6 GMACs + prefill 2*197*42.5M + decode 20*2*65.9M; large: ViT-L/14 81 GMACs
    # + prefill 2*257*75.5M + decode 20*2*106.8M.
    out.append(Variant("git-base", 54.5, 177.0, 12 * 12 + 6 * 15, 10.0, _img_mb(224), 0.15,
                       steps=20, step_kernels=100, step_host_ms=1.5, step_weight_mb=132.0))
    out.append(Variant("git-large", 205.0, 394.0, 24 * 12 + 6 * 15, 25.0, _img_mb(224), 0.15,
                       steps=20, step_kernels=100, step_host_ms=1.5, step_weight_mb=214.0))
    # TTS of one ~5 s sentence. Glow-TTS: flow decoder ~4.6 GMACs + multi-band MelGAN 0.95 GFLOPs/s
    # of audio, phonemization on the CPU. VITS (MMS, 16 kHz): HiFi-GAN decoder ~19.2 GMACs per
    # second of audio + encoder, flow and duration predictor ~5 GFLOPs.
    out.append(Variant("glow-tts", 14.0, 31.1, 560, 15.0, 0.001, 0.04, host_extra_ms=1.0))
    out.append(Variant("vits", 200.0, 36.3, 420, 25.0, 0.001, 0.06, host_extra_ms=0.1))
    return tuple(out)


def _demands(v: Variant, gpu: GpuSpec, prof: MigProfile, batch: int) -> tuple[float, float]:
    """(delay ms, slice-time ms) of one batch: time spent off the slice vs. slice capacity used.

    The delay is host work, kernel launches and the part of the GPU time that a batch too small to
    fill the slice cannot use (the SMs it leaves idle stay free for other MPS processes).
    """
    per_sm_tflops = gpu.fp16_dense_tflops / gpu.mig.sm_count
    sm_ms = v.gflop / (per_sm_tflops * v.eff)  # ms one item takes on a single fully-used SM
    fill = sm_ms * batch / prof.sm_count  # the batch spread over every SM of the slice
    floor = sm_ms / v.width_sms  # ... but one item spreads over at most width_sms SMs
    bandwidth_mb_ms = gpu.hbm_tb_s * 1e3 * prof.size / 8  # MB per ms: the slice's memory slices
    weights = (v.weights_mb + v.steps * v.step_weight_mb) / bandwidth_mb_ms
    launch = FRAMEWORK_MS + (v.kernels + v.steps * v.step_kernels) * LAUNCH_US / 1e3
    launch += v.steps * v.step_host_ms
    host = batch * (v.input_mb / gpu.host_copy_gb_s + HOST_ITEM_MS + v.host_extra_ms)
    return launch + host + floor, fill + weights


def _shared_latency(delay: float, demand: float, processes: int) -> float:
    """Mean batch latency of each of k processes sharing one slice (exact MVA, closed network).

    Each process alternates between ``delay`` (no contention) and ``demand`` on the processor-
    shared slice. One process sees delay + demand; many saturate the slice at 1/demand batches/ms.
    """
    queue = 0.0
    residence = demand
    for n in range(1, processes + 1):
        residence = demand * (1.0 + queue)
        queue = n / (delay + residence) * residence
    return delay + residence


def segment_row(v: Variant, gpu: GpuSpec, prof: MigProfile, mps: int, batch: int) -> ProfileRow:
    """One profile row: p95 latency of a batch on one of ``mps`` processes and the segment's rate."""
    delay, demand = _demands(v, gpu, prof, batch)
    mean = _shared_latency(delay, demand, mps) * (1.0 + MPS_INTERFERENCE * (mps - 1))
    p95 = mean * (P95_BASE + P95_PER_PROCESS * (mps - 1))
    throughput = mps * batch / mean * 1e3
    memory = (CONTEXT_MB + WORKSPACE_MB + v.weights_mb + batch * v.act_mb * ALLOCATOR_SLACK
              + v.input_mb * batch)
    return ProfileRow(variant=v.name, mig_profile=prof.name, mps=mps, batch=batch,
                      latency_ms=round(p95, 4), throughput_rps=round(throughput, 3),
                      memory_mb=round(memory, 1), source="modeled", host=HOST, backend=gpu.backend,
                      date=MODEL_DATE)


def generate(gpu_name: str | GpuSpec = "H100-80GB", chosen: Sequence[Variant] | None = None, *,
             mps_levels: Sequence[int] = MPS_LEVELS, batch_sizes: Sequence[int] = BATCH_SIZES,
             profiles: Sequence[str] | None = None) -> dict[str, list[ProfileRow]]:
    """All rows per variant (default: the zoo's) for one GPU, in a fixed order."""
    gpu = GPU_SPECS[gpu_name] if isinstance(gpu_name, str) else gpu_name
    return {
        v.name: [segment_row(v, gpu, prof, mps, b)
                 for prof in gpu.mig.devices if profiles is None or prof.name in profiles
                 for mps in mps_levels for b in batch_sizes]
        for v in (variants() if chosen is None else chosen)
    }


def variant_from_onnx(name: str, path: str | Path, efficiency: float = 0.10,
                      item_shapes: dict[str, tuple[int, ...]] | None = None) -> Variant:
    """A repository model's cost figures, read from its ONNX graph (see the module doc) with its
    inputs at ``item_shapes`` (free axes 1 otherwise)."""
    from jigsaw.models.repository import graph_cost
    cost = graph_cost(path, item_shapes)
    if cost.flops <= 0:
        raise JigsawError(f"{path}: no convolution or matrix product found to model its compute; "
                          "measure it with jigsaw profile")
    return Variant(name, cost.flops / 1e9, cost.params / 1e6, max(1, cost.nodes),
                   cost.activation_bytes_fp16 / 1e6, cost.input_bytes / 1e6, efficiency)


def header(v: Variant, gpu: GpuSpec) -> str:
    """The comment block written above each CSV."""
    segments = "whole-GPU x MPS" if not gpu.mig.mig else "MIG x MPS"
    return "\n".join((
        f"Modeled profile of {v.name} on {gpu.name} {segments} segments - NOT measured on hardware.",
        f"Written by {MODEL_NAME} v{MODEL_VERSION} ({MODEL_DATE}); see profiles/README.md.",
        f"Per item: {v.gflop:g} GFLOP, {v.params_m:g} M params (FP16), {v.eff:g} of the "
        f"{gpu.fp16_dense_tflops:g} TFLOPS dense FP16 peak when the slice is full, "
        f"{v.kernels + v.steps * v.step_kernels} launches per batch.",
        "latency = launch floor + host copy + FLOPs / (SMs usable by the batch) + weight reads;",
        "MPS k: k processes share the slice (mean-value analysis); latency_ms is p95 of one process,",
        "throughput_rps the whole segment, memory_mb one process (rows that do not fit are kept).",
    ))


def write(gpu_name: str | GpuSpec, out_dir: Path, chosen: Sequence[Variant] | None = None,
          **options: object) -> list[Path]:
    """Writes one CSV per variant; returns the paths written."""
    gpu = GPU_SPECS[gpu_name] if isinstance(gpu_name, str) else gpu_name
    by_name = {v.name: v for v in (variants() if chosen is None else chosen)}
    paths = []
    for name, rows in generate(gpu, list(by_name.values()), **options).items():  # type: ignore[arg-type]
        path = out_dir / f"{name}.csv"
        write_profile_csv(path, rows, header(by_name[name], gpu))
        paths.append(path)
    return paths


FIGURES = ("memory_gb", "sm_count", "fp16_tflops", "memory_tb_s")
"""What models a GPU without a built-in row: its memory, SMs, dense FP16 peak, memory bandwidth."""


def spec_from_figures(name: str, figures: dict[str, float], where: str,
                      model: GpuModel | None = None) -> GpuSpec:
    """The spec of a GPU jigsaw has no row for, from its four ``FIGURES``: used whole, or with
    ``model``'s MIG table (a node file's); an error naming the missing ones (and where to give
    them) otherwise."""
    missing = [k for k in FIGURES if not figures.get(k)]
    if missing:
        raise JigsawError(f"no modeled figures for {name!r} (known: {', '.join(sorted(GPU_SPECS))}); "
                          f"{where}: give its {', '.join(missing)}")
    return GpuSpec(name, f"modeled-{name.lower()}", float(figures["fp16_tflops"]),
                   float(figures["memory_tb_s"]), HOST_COPY_GB_S, whole=model is None,
                   memory_gb=float(figures["memory_gb"]), sm_count=int(figures["sm_count"]),
                   model=model)


def _app_variants(apps: Sequence[object], wanted: Sequence[str], efficiency: float) -> list[Variant]:
    """The cost figures of the apps' variants: the zoo's table, or read from a repository model."""
    zoo = {v.name: v for v in variants()}
    out: dict[str, Variant] = {}
    for app in apps:
        for task in app.tasks:  # type: ignore[attr-defined]
            for v in task.variants:
                if v.name in out or (wanted and v.name not in wanted):
                    continue
                model = v.resolved
                if model is not None and model.is_onnx:
                    out[v.name] = variant_from_onnx(v.name, model.path, efficiency,
                                                    _item_shapes(app, task.name, v.name, model))
                elif model is not None and model.zoo in zoo:
                    out[v.name] = replace(zoo[model.zoo], name=v.name)
                else:
                    raise JigsawError(f"{app.source}: variant {v.name!r}: the model has no figures for "  # type: ignore[attr-defined]
                                      f"{model.describe() if model else 'no model'}; give it an ONNX model")
    missing = [w for w in wanted if w not in out]
    if missing:
        raise JigsawError(f"--variants: not in the app(s): {', '.join(missing)}")
    return list(out.values())


def _item_shapes(app: Any, task: str, variant: str, model: Any) -> dict[str, tuple[int, ...]]:
    """A root task's model inputs at the app's ``typical_shape`` (``app.concrete_item_shape``),
    printed: an item is costed at that size, not silently at 1."""
    from jigsaw.app import concrete_item_shape
    specs = app.inputs if task not in {e.dst for e in app.edges} else ()
    got = {t.name: concrete_item_shape(t.name, t.item_shape, specs) for t in model.inputs}
    print(f"{variant}: modeled at items of {'; '.join(note for _, note in got.values())}", file=sys.stderr)
    return {name: shape for name, (shape, _) in got.items()}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu", default=None,
                        help=f"GPU model ({', '.join(sorted(GPU_SPECS))}; default: the node's, "
                             "else H100-80GB)")
    parser.add_argument("--whole", action="store_true", help="the GPU used whole (no MIG / MIG off)")
    for key, what in (("memory_gb", "framebuffer, GB"), ("sm_count", "streaming multiprocessors"),
                      ("fp16_tflops", "dense FP16 tensor peak, TFLOPS"),
                      ("memory_tb_s", "memory bandwidth, TB/s")):
        parser.add_argument("--" + key.replace("_", "-"), dest=key, type=float, default=0.0,
                            help=f"a GPU without a built-in row (used whole): its {what}")
    parser.add_argument("--node", type=Path, default=None,
                        help="model the variants of this node's apps on its GPU, segments, MPS levels and "
                             "batch sizes, into its profiles_dir")
    parser.add_argument("--app", type=Path, default=None, help="model this app's variants (with --node)")
    parser.add_argument("--group", default="", help="with a --node of several GPU groups: model this "
                                                    "group only (default: each into its profiles_dir)")
    parser.add_argument("--variants", default="", help="comma-separated variant names (default: all)")
    parser.add_argument("--efficiency", type=float, default=0.10,
                        help="fraction of the FP16 peak a repository model reaches (default 0.10)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output directory (default: the node's profiles_dir, else profiles/<gpu>)")


def run(args: argparse.Namespace) -> int:
    """``jigsaw modeled``: writes the CSVs; prints what it wrote."""
    if not 0 < args.efficiency <= 1:
        raise JigsawError(f"--efficiency: expected a fraction in (0, 1], got {args.efficiency}")
    wanted = [v for v in args.variants.split(",") if v]
    figures = {k: getattr(args, k, 0.0) for k in FIGURES}
    where = "the flags --memory-gb, --sm-count, --fp16-tflops, --memory-tb-s"
    if args.node is not None:
        jobs = _node_jobs(args, wanted, figures)
    elif args.app is not None:
        raise JigsawError("--app: give --node too (the GPU and segments come from the node)")
    else:
        chosen: list[Variant] | None = None
        if args.group:
            raise JigsawError("--group: give --node too (the groups are the node's)")
        if wanted:
            zoo = {v.name: v for v in variants()}
            unknown = [w for w in wanted if w not in zoo]
            if unknown:
                raise JigsawError(f"--variants: not zoo variants: {', '.join(unknown)} (for a repository "
                                  "model give --node with its app)")
            chosen = [zoo[w] for w in wanted]
        jobs = [_job(args.gpu or "H100-80GB", args.whole, figures, where, None, args.out, chosen, {})]
    for spec, out, chosen, options in jobs:
        paths = write(spec, Path(out), chosen, **options)
        rows = sum(1 for p in paths for line in p.read_text().splitlines()
                   if line and not line.startswith(("#", "variant,")))
        print(f"wrote {len(paths)} files, {rows} rows (source=modeled) to {out}")
    print("the rows assume (profiles/README.md; compare with bench/modeled_vs_measured.py):")
    for line in PIPELINE_ASSUMPTIONS:
        print(f"  - {line}")
    return 0


Job = tuple["GpuSpec", Path, "list[Variant] | None", dict[str, object]]


def _job(gpu_name: str, whole: bool, figures: dict[str, float], where: str, mig_model: GpuModel | None,
         out: Path | None, chosen: list[Variant] | None, options: dict[str, object]) -> Job:
    spec = next((s for k, s in GPU_SPECS.items() if k.lower() == gpu_name.lower()), None)
    if spec is None:
        spec = spec_from_figures(gpu_name, figures, where, mig_model)
    if whole:
        spec = replace(spec, whole=True)
    out = out or Path("profiles") / (spec.name.lower() + ("-whole" if whole else ""))
    return spec, out, chosen, options


def _node_jobs(args: argparse.Namespace, wanted: list[str], flags: dict[str, float]) -> list[Job]:
    """One job per GPU group of ``--node`` (``--group``: that one), into its profiles_dir."""
    from jigsaw.app import load_app
    from jigsaw.gpu_groups import plain_profile
    from jigsaw.node import load_node
    node = load_node(args.node, load_apps=args.app is None)
    if node.gpu.kind == "cpu":
        raise JigsawError(f"{args.node}: a CPU node is measured, not modeled: jigsaw profile --node ...")
    apps = [load_app(args.app)] if args.app is not None else list(node.apps)
    chosen = _app_variants(apps, wanted, args.efficiency)
    groups = [g for g in node.gpu_groups if not args.group or g.name == args.group]
    if not groups:
        raise JigsawError(f"--group: {args.group!r} is not a GPU group of {args.node} "
                          f"({', '.join(g.name for g in node.gpu_groups)})")
    if len(groups) > 1 and (args.out or args.gpu or args.whole):
        raise JigsawError(f"{args.node} has {len(groups)} GPU groups: each is modeled into its own "
                          "profiles_dir; give --group NAME for --out, --gpu or --whole")
    jobs = []
    for g in groups:
        gpu, figures, where, mig_model = g.model, dict(flags), f"{args.node}: [gpus]", None
        gpu_name, whole = args.gpu or gpu.name, args.whole or not gpu.mig
        if gpu_name == gpu.name:  # the node file's figures, where it gives them
            given = {"memory_gb": gpu.memory_gb, "sm_count": gpu.sm_count,
                     "fp16_tflops": gpu.fp16_tflops, "memory_tb_s": gpu.memory_tb_s}
            figures = {k: figures[k] or given[k] for k in FIGURES}
            if len(node.gpu_groups) > 1:
                where = f"{args.node}: [[gpus]] {g.name}"
            if gpu.mig:
                mig_model = gpu
        options = {"mps_levels": g.mps_levels, "batch_sizes": g.batch_sizes,
                   "profiles": tuple(plain_profile(p) for p in g.mig_profiles)}
        jobs.append(_job(gpu_name, whole, figures, where, mig_model, args.out or g.profiles_dir, chosen,
                         options))
    return jobs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jigsaw modeled", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
