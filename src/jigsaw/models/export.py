"""ONNX export of a variant with a dynamic batch axis, cached on disk and checked against torch.

Most variants are one graph. The captioner and TTS are two each (``jigsaw.models.graphs``):
GIT's ``encode``/``step`` around a greedy loop, VITS's ``encoder``/``decoder`` around length
regulation; their files are ``<stem>.<graph>.onnx``.

The cache directory is ``$JIGSAW_ONNX_CACHE`` or ``~/.cache/jigsaw/onnx``; a file is keyed by
variant, input size and weights (random init or the weights file's mtime), so a node's workers
and ``jigsaw profile`` share one export. TensorRT builds its engines from the same files.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from jigsaw.models.graphs import GraphSpec, Runner, export_graph
from jigsaw.models.zoo import CAPTION_TOKENS, TTS_TOKENS, _weights_file, build, variant_info

log = logging.getLogger("jigsaw.models")


@dataclass(frozen=True)
class Export:
    path: Path  # the graph that takes the network input (the only one for most variants)
    input_name: str
    input_shape: tuple[int, ...]  # per item (no batch axis)
    max_abs_error: float  # vs torch on random inputs, at export time (nan when loaded from cache)
    seconds: float
    graphs: dict[str, Path] = field(default_factory=dict)  # every graph by name (multi-graph variants)


def cache_dir() -> Path:
    return Path(os.environ.get("JIGSAW_ONNX_CACHE", str(Path.home() / ".cache" / "jigsaw" / "onnx")))


def exportable(variant: str) -> bool:
    """Whether the variant's whole inference is one ONNX graph (captioner/TTS: several, see graphs)."""
    return variant_info(variant).family in ("yolov5", "torchvision")


def input_of(variant: str) -> tuple[str, tuple[int, ...]]:
    """The network input's name and per-item shape."""
    info = variant_info(variant)
    if info.family == "vits":
        return "input_ids", (TTS_TOKENS,)
    name = "pixel_values" if info.family == "git" else "images"
    return name, (3, info.image_size, info.image_size)


def graph_specs(variant: str, model: object) -> dict[str, GraphSpec]:
    """The graphs of a built model: ``{"net": ...}`` for a one-graph variant."""
    import torch
    info = variant_info(variant)
    if info.family == "git":
        from jigsaw.models.git_onnx import git_graphs
        return git_graphs(model, info.image_size)
    if info.family == "vits":
        from jigsaw.models.vits_onnx import vits_graphs
        return vits_graphs(model, TTS_TOKENS)
    name, shape = input_of(variant)
    return {"net": GraphSpec(model, (torch.rand(2, *shape),), (name,), ("output",),
                             {name: {0: "batch"}, "output": {0: "batch"}})}


def driver(variant: str, model_config: object, runners: dict[str, Runner]) -> Any:
    """What runs a multi-graph variant's batch (``batch array -> network output``) over ``runners``."""
    info = variant_info(variant)
    if info.family == "git":
        from jigsaw.models.git_onnx import GitCaptioner
        return GitCaptioner(model_config, runners, CAPTION_TOKENS)
    if info.family == "vits":
        from jigsaw.models.vits_onnx import VitsSpeaker
        return VitsSpeaker(model_config, runners)
    (run,) = runners.values()
    name, _ = input_of(variant)
    return lambda batch: run({name: batch})[0]


def sample_input(variant: str, batch: int, seed: int = 0) -> np.ndarray:
    """A random network input: images in [0, 1), or symbol ids for TTS."""
    rng = np.random.default_rng(seed)
    _, shape = input_of(variant)
    if variant_info(variant).family == "vits":
        return rng.integers(0, 30, (batch, *shape), dtype=np.int64)
    return rng.random((batch, *shape), dtype=np.float32)


def axis_ranges(variant: str, max_batch: int) -> dict[str, tuple[int, int, int]]:
    """(min, opt, max) of every named axis of the variant's graphs (TensorRT's profiles)."""
    ranges = {"batch": (1, max_batch, max_batch)}
    info = variant_info(variant)
    if info.family == "git":
        from jigsaw.models.zoo import model_config
        vision = model_config(variant).vision_config
        prefix = (vision.image_size // vision.patch_size) ** 2 + 2  # image tokens, CLS, BOS
        # the step graph's cache: the prefix and the tokens decoded before the one it feeds
        ranges["past"] = (prefix, prefix + CAPTION_TOKENS // 2, prefix + CAPTION_TOKENS - 2)
    elif info.family == "vits":
        from jigsaw.models.vits_onnx import axis_ranges as vits_ranges
        ranges.update(vits_ranges(max_batch))
    return ranges


def onnx_path(variant: str, weights: str | Path | None = None, graph: str = "net") -> Path:
    info = variant_info(variant)
    wf = _weights_file(variant, weights)
    tag = "random" if wf is None else f"w{int(wf.stat().st_mtime)}"
    suffix = "" if graph == "net" else f".{graph}"
    return cache_dir() / f"{variant}-{info.image_size}-{tag}{suffix}.onnx"


def graph_names(variant: str) -> tuple[str, ...]:
    family = variant_info(variant).family
    return {"git": ("encode", "step"), "vits": ("encoder", "decoder")}.get(family, ("net",))


def check(variant: str, model: object, specs: dict[str, GraphSpec], paths: dict[str, Path],
          batch: int) -> float:
    """Max abs difference between onnxruntime and torch, graph by graph, on one driven batch.

    Each graph's onnxruntime session sees exactly the inputs its torch twin gets while the
    variant's driver runs a random batch through the torch graphs.
    """
    from jigsaw.models.graphs import ort_runner, torch_runner
    worst = 0.0

    def twin(name: str) -> Runner:
        want_run, got_run = torch_runner(specs[name]), ort_runner(paths[name])

        def run(inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
            nonlocal worst
            want, got = want_run(inputs), got_run(inputs)
            for w, g in zip(want, got):
                if np.issubdtype(w.dtype, np.floating):
                    worst = max(worst, float(np.max(np.abs(w - g), initial=0.0)))
                elif not np.array_equal(w, g):
                    worst = float("inf")
            return want
        return run

    config = getattr(model, "config", None)
    driver(variant, config, {n: twin(n) for n in specs})(sample_input(variant, batch))
    return worst


def export(variant: str, *, weights: str | Path | None = None, force: bool = False,
           check_batch: int = 2) -> Export:
    """The cached ONNX files of ``variant`` (exported now when one is missing or ``force``)."""
    paths = {g: onnx_path(variant, weights, g) for g in graph_names(variant)}
    name, shape = input_of(variant)
    first = next(iter(paths.values()))
    if all(p.exists() for p in paths.values()) and not force:
        return Export(first, name, shape, float("nan"), 0.0, paths)
    t0 = time.perf_counter()
    model = build(variant, weights=weights)
    specs = graph_specs(variant, model)
    for g, spec in specs.items():
        export_graph(spec, paths[g])
    err = check(variant, model, specs, paths, check_batch + 1)
    secs = time.perf_counter() - t0
    log.info("%s: exported %d graph(s) to %s in %.1f s; max abs error vs torch %.3g",
             variant, len(paths), first.parent, secs, err)
    return Export(first, name, shape, err, secs, paths)
