"""``jigsaw profile``: measure p95 latency and throughput of every (variant, segment, batch).

Each row times the whole batch as a worker runs it (decode, pre-processing, network,
post-processing and children payloads) on synthetic inputs of the task's kind, with the node's
backend, and is written with ``source=measured``, the host, backend and library versions, the
date and the input it was timed at (a free axis at the app's ``typical_shape``). A batch size
whose warm-up or any timed batch raised, or answered an item with an error, gets no row: the run
says which were skipped and why. Rows are appended to ``<out>/<variant>.csv`` as soon as
measured; a rerun skips the rows already there, so an interrupted run resumes where it stopped.

CPU nodes: a segment ``<k>c`` is a share of k declared cores, run on the real CPUs
``jigsaw.runtime.cpus`` maps it to (the measuring process pins itself there, with one intra-op
thread per CPU, as the node's workers do). When the node declares more cores than the host has,
shares time-share a CPU: such a share is measured by as many pinned copies as run on its CPUs
at once, timing together, and its row has their mean throughput and worst p95. MPS levels do not
apply (only ``mps = 1``).

GPU nodes: a segment is a MIG profile x MPS level, measured inside a real instance of that
profile by ``jigsaw.profiler_gpu``: k copies of ``profile_inside`` run at once under one MPS
daemon; the segment's throughput is the sum of the copies' and its latency the worst copy's p95.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import importlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jigsaw.backends.registry import KINDS, BackendUnavailable, backend_kind
from jigsaw.errors import JigsawError
from jigsaw.profiling import (
    Progress,
    append_row,
    copy_argv,
    host_description,
    merge_copies,
    read_done,
    report_skipped,
    run_copies,
)

DEFAULT_BATCHES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Measurement:
    latency_ms: float  # p95 of one batch
    throughput_rps: float  # items per second of the segment
    memory_mb: float
    iterations: int


def backend_description(backend: str) -> str:
    """Backend and the versions of the libraries it runs on (no commas: it is a CSV cell)."""
    parts = [backend]
    libraries = backend_kind(backend).libraries
    for mod in dict.fromkeys(lib for k in KINDS.values() for lib in k.libraries):
        if mod in sys.modules or mod in libraries:
            with contextlib.suppress(Exception):
                parts.append(f"{mod}-{importlib.import_module(mod).__version__}")
    return " ".join(dict.fromkeys(parts))


def describe_input(kind: str, model: Any = None, specs: Sequence[Any] = ()) -> str:
    """The input a row of a task of ``kind`` is timed at (the ``input`` column): a repository
    model's item shapes (free axes at the app's ``typical_shape``, else 1), a zoo image model's
    network input side (``JIGSAW_DETECTOR_SIZE`` / ``JIGSAW_CLASSIFIER_SIZE``)."""
    from jigsaw.app import concrete_item_shape
    from jigsaw.models.catalog import classifier_size, detector_size
    if model is not None and model.is_onnx:
        return "; ".join(concrete_item_shape(t.name, t.item_shape, specs)[1] for t in model.inputs)
    if kind == "detector":
        return f"{detector_size()}px"
    if kind == "classifier":
        return f"{classifier_size()}px"
    return "tokens 1x16" if kind == "tts" else ""


def synthetic_batch(kind: str, batch: int, variant: str) -> tuple[list[bytes], str]:
    """``synthetic_inputs`` of a variant ``_select`` accepted, and ``describe_input``'s text."""
    model, specs = _MODELS.get(variant), _SPECS.get(variant, ())
    return (synthetic_inputs(kind, batch, model=model, specs=specs),
            describe_input(kind, model, specs).replace(",", " "))


def synthetic_inputs(kind: str, batch: int, seed: int = 0, model: Any = None,
                     specs: Sequence[Any] = ()) -> list[bytes]:
    """Payloads of ``batch`` items of a task of ``kind``, as a worker would receive them.

    A repository (ONNX) model gets random tensors of its graph's inputs (floats in [0, 1), small
    integers); a free size other than the batch axis takes the app's ``typical_shape`` of that
    input (``specs``: a root task's app inputs), else 1.
    """
    from jigsaw.models.images import street_scene
    from jigsaw.models.zoo import classifier_size
    from jigsaw.tensors import encode_tensors
    out = []
    if model is not None and model.is_onnx:
        from jigsaw.app import concrete_item_shape
        from jigsaw.models.repository import NUMPY_DTYPES
        rng = np.random.default_rng(seed)
        for _ in range(batch):
            tensors = []
            for t in model.inputs:
                shape = concrete_item_shape(t.name, t.item_shape, specs)[0]
                dtype = np.dtype(NUMPY_DTYPES[t.datatype])
                arr = (rng.random(shape).astype(dtype) if dtype.kind == "f"
                       else rng.integers(0, 2, shape).astype(dtype))
                tensors.append((t.name, t.datatype, shape, arr))
            out.append(bytes(encode_tensors(tensors)))
        return out
    for i in range(batch):
        if kind == "tts":
            toks = np.random.default_rng(seed + i).integers(0, 30522, (1, 16)).astype(np.int32)
            out.append(bytes(encode_tensors([("tokens", "INT32", toks.shape, toks)])))
            continue
        size = (480, 640) if kind == "detector" else (classifier_size(),) * 2
        img = street_scene(*size, seed=seed + i)
        out.append(bytes(encode_tensors([("image", "UINT8", img.shape, img)])))
    return out


def _rss_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def measure(execute: Callable[[], object], batch: int, *, warmup: int = 2, min_iters: int = 5,
            max_iters: int = 50, seconds: float = 2.0) -> Measurement:
    """Times ``execute`` (one batch) until ``seconds`` or ``max_iters`` (at least ``min_iters``)."""
    for _ in range(warmup):
        execute()
    times: list[float] = []
    t_end = time.perf_counter() + seconds
    while len(times) < max_iters and (len(times) < min_iters or time.perf_counter() < t_end):
        t0 = time.perf_counter()
        execute()
        times.append(time.perf_counter() - t0)
    arr = np.asarray(times)
    return Measurement(float(np.percentile(arr, 95) * 1000), float(batch / arr.mean()), _rss_mb(), len(times))


def _select(node_path: str | Path, app_path: str | Path | None, variants: Sequence[str],
            batches: Sequence[int]) -> tuple[Any, dict[str, str], list[str], list[int]]:
    """(node, task kind by variant, the variants wanted, the batch sizes) of a profiling run.

    Each wanted variant's model (``_MODELS``) must be resolvable: a zoo network or a repository
    model; a variant with neither is an error naming it and its app file.
    """
    from jigsaw.app import load_app
    from jigsaw.node import load_node
    node = load_node(node_path, load_apps=app_path is None)
    apps = [load_app(app_path)] if app_path is not None else list(node.apps)
    kinds = {v.name: t.kind for a in apps for t in a.tasks for v in t.variants}
    wanted = list(variants) or list(kinds)
    unknown = [v for v in wanted if v not in kinds]
    if unknown:
        raise JigsawError(f"--variants: not in the app(s): {', '.join(unknown)}")
    for a in apps:
        fed = {e.dst for e in a.edges}
        for t in a.tasks:
            for v in t.variants:
                if v.name not in wanted:
                    continue
                _SPECS[v.name] = a.inputs if t.name not in fed else ()
                if v.resolved is None:
                    raise JigsawError(f"{a.source}: task {t.name!r}, variant {v.name!r}: no model to "
                                      f"measure: the zoo has no network named {v.name!r}; set model to a "
                                      "zoo name, an ONNX file or a model directory")
                _MODELS[v.name] = v.resolved
    return node, kinds, wanted, sorted(set(batches or node.batch_sizes))


_MODELS: dict[str, Any] = {}
"""The model of every variant ``_select`` accepted (``jigsaw.models.repository.Model``)."""
_SPECS: dict[str, tuple[Any, ...]] = {}
"""The app inputs (``app.TensorSpec``) a root task's variant takes; () for a task fed by an edge."""


def profile(node_path: str | Path, app_path: str | Path | None = None, *, variants: Sequence[str] = (),
            batches: Sequence[int] = (), out: str | Path | None = None, seconds: float = 2.0,
            max_iters: int = 50, gpu: int = 0, segments: Sequence[str] = (), mps_levels: Sequence[int] = (),
            backend: str | None = None) -> list[Path]:
    """Measures the rows missing from ``out`` (default: the node's profile directory); returns the files.

    A GPU node's segments are measured inside MIG instances (``jigsaw.profiler_gpu``); ``gpu``,
    ``segments``, ``mps_levels`` and ``backend`` apply to GPU nodes only.
    """
    node, kinds, wanted, batch_list = _select(node_path, app_path, variants, batches)
    out_dir = Path(out) if out is not None else node.profiles_dir
    if node.gpu.kind != "cpu":
        from jigsaw.profiler_gpu import profile_gpu
        return profile_gpu(node, app_path, kinds, wanted, batch_list, out_dir, seconds=seconds,
                           max_iters=max_iters, gpu=gpu, segments=segments, mps_levels=mps_levels,
                           backend=backend)
    kind = backend_kind(node.backend)
    if not kind.runs_models or kind.needs_gpu:
        raise JigsawError(f"{node.source}: backend {node.backend!r} does not run on a CPU node")
    if any(k != 1 for k in node.mps_levels):
        raise JigsawError(f"{node.source}: a CPU node has mps_levels = [1] (got {list(node.mps_levels)})")
    out_dir.mkdir(parents=True, exist_ok=True)
    plan = []
    for v in wanted:
        done = read_done(out_dir / f"{v}.csv")
        for seg in node.mig_profiles:
            for b in batch_list:
                if (v, seg, 1, b) not in done:
                    plan.append((v, seg, b))
    if not plan:
        print("jigsaw profile: every row is already measured", file=sys.stderr)
        return [out_dir / f"{v}.csv" for v in wanted]
    for v in wanted:
        print(f"jigsaw profile: {v}: items of {describe_input(kinds[v], _MODELS.get(v), _SPECS.get(v, ()))}",
              file=sys.stderr)
    from jigsaw.runtime.cpus import host_cpus, share_cpus, sharing
    real = host_cpus()
    alone = [row for row in plan if sharing(node.gpu, row[1], real) == 1]
    wanted_rows = set(plan)
    original = os.sched_getaffinity(0)
    skipped: list[str] = []
    try:
        skipped += _measure_rows(alone, kinds, node.backend, out_dir, mps=1, max_batch=max(batch_list),
                      threads_of=lambda seg: len(share_cpus(node.gpu, seg, 0, real)),
                      cpus_of=lambda seg: share_cpus(node.gpu, seg, 0, real),
                      seconds=seconds, max_iters=max_iters)
    finally:
        os.sched_setaffinity(0, original)
    for seg in dict.fromkeys(row[1] for row in plan if row not in alone):
        copies = sharing(node.gpu, seg, real)
        todo = list(dict.fromkeys(v for v, s, _ in plan if s == seg))
        cpus = share_cpus(node.gpu, seg, 0, real)
        print(f"jigsaw profile: {seg}: {copies} shares run at once on CPUs {cpus}; measuring them together",
              file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix="jigsaw-profile-") as tmp:
            argvs = [copy_argv((sys.executable, "-m", "jigsaw.cli"), node, app_path, seg, 1, rank, Path(tmp),
                               todo, batch_list, None, seconds, max_iters, cpus, copies)
                     for rank in range(copies)]
            run_copies(argvs, None, f"{seg} ({copies} shares on CPUs {cpus})")
            rows: dict[Any, list[str]] = {}
            for v in todo:
                rows.update(merge_copies([Path(tmp) / f"rank-{r}" / f"{v}.csv" for r in range(copies)],
                                         throughput="mean", skipped=skipped))
        date = dt.date.today().isoformat()
        host = f"{host_description()} {seg} with {copies} shares on CPUs {'+'.join(map(str, cpus))}"
        for (v, sg, mps, b), (lat, thr, mem, backend_name, described) in sorted(rows.items()):
            if (v, sg, b) in wanted_rows:
                append_row(out_dir / f"{v}.csv",
                           [v, sg, mps, b, lat, thr, mem, "measured", host, backend_name, date, described])
    report_skipped(skipped)
    return [out_dir / f"{v}.csv" for v in wanted]


def profile_inside(node_path: str | Path, app_path: str | Path | None = None, *, segment: str, mps: int,
                   rank: int, barrier: str | Path | None, backend: str | None = None,
                   variants: Sequence[str] = (), batches: Sequence[int] = (), out: str | Path,
                   seconds: float = 2.0, max_iters: int = 50, cpus: Sequence[int] = (),
                   copies: int | None = None) -> list[Path]:
    """One of the measuring copies of a segment: inside a MIG instance (the device this process
    sees), or pinned to ``cpus`` with as many threads (a CPU share measured beside the others).

    The copies wait for each other before every row (a file barrier), so their batches run
    concurrently as the planner's MPS processes (or the CPU's shares) would; the orchestrator
    merges their rows. ``copies`` (default ``mps``) is how many wait at the barrier.
    """
    node, kinds, wanted, batch_list = _select(node_path, app_path, variants, batches)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    plan = [(v, segment, b) for v in wanted for b in batch_list]
    wait = _Barrier(Path(barrier), copies or mps, rank) if barrier is not None else None
    if cpus:
        os.sched_setaffinity(0, set(cpus))
    # a row this copy skips is missing from its file: the orchestrator's merge reports it
    _measure_rows(plan, kinds, backend or node.backend, out_dir, mps=mps, max_batch=max(batch_list),
                  threads_of=lambda seg: max(1, len(cpus)), barrier=wait, seconds=seconds,
                  max_iters=max_iters)
    return [out_dir / f"{v}.csv" for v in wanted]


class _Barrier:
    """A barrier of ``parties`` processes on files in a directory (step n: files ``n.<rank>``)."""

    def __init__(self, directory: Path, parties: int, rank: int, timeout_s: float = 1800.0) -> None:
        self.dir, self.parties, self.rank, self.timeout_s = directory, parties, rank, timeout_s
        self.dir.mkdir(parents=True, exist_ok=True)
        self.step = 0

    def wait(self) -> None:
        self.step += 1
        (self.dir / f"{self.step}.{self.rank}").touch()
        deadline = time.monotonic() + self.timeout_s
        while len(list(self.dir.glob(f"{self.step}.*"))) < self.parties:
            if time.monotonic() > deadline:
                raise JigsawError(f"profile copy {self.rank}: the other copies did not reach row "
                                  f"{self.step} within {self.timeout_s:.0f} s")
            time.sleep(0.01)


class BatchFailed(RuntimeError):
    """A timed batch raised or answered an item with an error: its batch size gets no row."""


def checked_batch(execute: Callable[[], Sequence[Any]]) -> Callable[[], None]:
    """``execute`` (one batch) raising ``BatchFailed`` when it raises or any item has an error."""
    def run() -> None:
        try:
            results = execute()
        except Exception as exc:
            raise BatchFailed(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
                              ) from exc
        errors = [r.error for r in results if getattr(r, "error", "")]
        if errors:
            raise BatchFailed(f"{len(errors)} of {len(results)} items failed: {errors[0]}")
    return run


def _measure_rows(plan: list[tuple[str, str, int]], kinds: dict[str, str], backend: str, out_dir: Path, *,
                  mps: int, max_batch: int, threads_of: Callable[[str], int],
                  cpus_of: Callable[[str], Sequence[int]] | None = None,
                  barrier: _Barrier | None = None, seconds: float, max_iters: int) -> list[str]:
    """Measures ``plan``'s rows; a row is written only when every timed batch (and the warm-up)
    ran without error. Returns one line per row skipped, saying why."""
    host, backend_name = host_description(), backend_description(backend)
    date = dt.date.today().isoformat()
    progress = Progress(len(plan))
    loaded: dict[tuple[str, str], object] = {}
    skipped: list[str] = []
    try:
        for v, seg, b in plan:
            threads = threads_of(seg)
            if cpus_of is not None:
                os.sched_setaffinity(0, set(cpus_of(seg)))
            key = (v, seg)
            if key not in loaded:
                loaded.clear()
                loaded[key] = _backend(backend, kinds[v], v, threads, max_batch)
            be = loaded[key]
            inputs, described = synthetic_batch(kinds[v], b, v)
            run = checked_batch(functools.partial(be.execute, list(range(b)), inputs))  # type: ignore[attr-defined]
            try:
                if barrier is not None:
                    try:
                        run()  # load and warm up before the copies start timing together
                    finally:
                        barrier.wait()  # the other copies wait for this one, failed or not
                m = measure(run, b, seconds=seconds, max_iters=max_iters)
            except BatchFailed as exc:
                skipped.append(f"{v} {seg} mps{mps} batch {b}: {exc}")
                progress.step(f"{v} {seg} mps{mps} b{b}: skipped ({exc})")
                continue
            append_row(out_dir / f"{v}.csv", [v, seg, mps, b, f"{m.latency_ms:.4f}",
                                              f"{m.throughput_rps:.3f}", f"{m.memory_mb:.1f}", "measured",
                                              host, backend_name, date, described])
            progress.step(f"{v} {seg} mps{mps} b{b}: p95 {m.latency_ms:.1f} ms, {m.throughput_rps:.1f}/s")
    finally:
        progress.close()
    return skipped


def _backend(kind_of_backend: str, task_kind: str, variant: str, threads: int, max_batch: int) -> object:
    from jigsaw.backends.base import Downstream
    try:
        Real = backend_kind(kind_of_backend).load_class()
    except BackendUnavailable as exc:
        raise JigsawError(f"{variant}: {exc}") from None
    model = _MODELS.get(variant)
    # A detector is timed with its real fan-out work: crops for a car and a person task.
    downstream = [Downstream("car", 1.0), Downstream("person", 1.0)] \
        if task_kind == "detector" and not (model is not None and model.is_onnx) else []
    be = Real("profile", task_kind, downstream, threads=threads, model=model)  # type: ignore[call-arg]
    try:
        be.load(variant, max_batch)
        be.warm_up(range(1, max_batch + 1))  # as a worker does: the rows time the engine it serves
    except (RuntimeError, ImportError, OSError, ValueError, KeyError) as exc:
        where = f" ({model.describe()})" if model is not None else ""
        raise JigsawError(f"{variant}{where}: the {kind_of_backend} backend cannot load it: {exc}") from None
    return be
