"""The application model: a DAG of tasks, each served by one of several model variants.

Loaded from an app TOML file (see ``examples/apps/``). Everything the planner and the
runtime need to know about an app's structure is derived here, once:
paths, per-lane demand multipliers and per-lane accuracy (PAS).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from jigsaw.errors import ConfigError
from jigsaw.fields import Fields, check_import_ref, read_toml
from jigsaw.models.repository import Model, ModelError, TensorInfo, resolve, shapes_compatible

TASK_KINDS = ("detector", "classifier", "captioner", "tts", "generic")
DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BYTES")

Lane = tuple[str, ...]
"""One variant per task, in ``App.task_names`` order."""


@dataclass(frozen=True)
class Variant:
    """A model as one task uses it. Its name keys its profile table: tasks that use the same
    variant share one table (and one model), each with its own accuracy and its own instances."""

    name: str
    accuracy: float  # the task's metric (top-1 %, mAP, CIDEr, MOS ...), higher is better
    model: str = ""  # as written: a zoo name, an ONNX file or a model directory (see repository)
    resolved: Model | None = field(default=None, compare=False, hash=False)  # None: not resolvable


@dataclass(frozen=True)
class Task:
    name: str
    kind: str  # one of TASK_KINDS: tells backends how to pre/post-process
    variants: tuple[Variant, ...]

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(name)

    @property
    def best(self) -> Variant:
        return max(self.variants, key=lambda v: v.accuracy)

    def normalized_accuracy(self, variant: str) -> float:
        """Accuracy relative to the task's best variant, so tasks with different metrics compose."""
        return self.variant(variant).accuracy / self.best.accuracy


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    factors: dict[str, float] = field(hash=False)  # src variant -> children per request served
    transform: str = ""  # "module:function" making an item's children (jigsaw.models.transforms)

    def factor(self, variant: str) -> float:
        return self.factors[variant]


IMAGE_KINDS = ("detector", "classifier", "captioner")
"""Task kinds that take an image: an app rooted at one refuses an empty one by default."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # Open Inference Protocol datatype
    shape: tuple[int, ...]  # -1 = any size
    # the least size of each axis a request may give (``min_shape``; an app rooted at an image
    # task: 1 on every axis by default, so an empty image is refused at the door); (): none
    min_shape: tuple[int, ...] = ()
    # the shape of a typical item, each -1 axis given a size: what ``jigsaw profile`` measures and
    # ``jigsaw modeled`` costs a variable-length input at (an ASR model at a typical utterance,
    # not at one sample); None: such an axis is taken as 1, and they say so
    typical_shape: tuple[int, ...] | None = None


def concrete_item_shape(name: str, graph_item_shape: Sequence[int], specs: Sequence[TensorSpec]
                        ) -> tuple[tuple[int, ...], str]:
    """A model input's item shape with every free axis (-1 or 0) given a size, and how: the app's
    ``typical_shape`` of the input of that name (or of its only input, for a model with one),
    else 1. Returns (shape, a note naming the source)."""
    shape = tuple(int(d) for d in graph_item_shape)
    if all(d > 0 for d in shape):
        return shape, f"{name} {_dims(shape)}"
    spec = next((s for s in specs if s.name == name), None)
    if spec is None and len(specs) == 1:
        spec = specs[0]
    typical = spec.typical_shape if spec is not None else None
    if typical is not None and len(typical) == len(shape):
        out = tuple(d if d > 0 else t for d, t in zip(shape, typical, strict=True))
        return out, f"{name} {_dims(out)} (the app's typical_shape)"
    out = tuple(d if d > 0 else 1 for d in shape)
    return out, (f"{name} {_dims(out)} (free axes taken as 1: give the app's [[inputs]] a "
                 "typical_shape to measure a typical item)")


def _dims(shape: Sequence[int]) -> str:
    return "x".join(map(str, shape)) or "scalar"


@dataclass(frozen=True)
class App:
    name: str
    tasks: tuple[Task, ...]
    edges: tuple[Edge, ...]
    latency_slo_ms: float  # budget for queueing + inference along every path (paper's SLO_l)
    accuracy_slo: float | None = None  # fraction of the best end-to-end accuracy; None: node's
    staleness_ms: float = 20.0  # a request queued this long unpicked by every instance is dropped
    inputs: tuple[TensorSpec, ...] = (TensorSpec("image", "UINT8", (-1,)),)
    source: str = ""  # file it was loaded from
    # the largest item (a task's child, a sink's answer) the app's rings between tasks must carry,
    # encoded (``max_item_bytes``); 0: the node's default ring sizes (``runtime/topology.py``)
    max_item_bytes: int = 0

    # ---- structure -------------------------------------------------------------------------
    @cached_property
    def task_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tasks)

    def task(self, name: str) -> Task:
        return self._task_by_name[name]

    @cached_property
    def _task_by_name(self) -> dict[str, Task]:
        return {t.name: t for t in self.tasks}

    def parents(self, task: str) -> tuple[str, ...]:
        return tuple(e.src for e in self.edges if e.dst == task)

    def children(self, task: str) -> tuple[str, ...]:
        return tuple(e.dst for e in self.edges if e.src == task)

    def edge(self, src: str, dst: str) -> Edge:
        for e in self.edges:
            if e.src == src and e.dst == dst:
                return e
        raise KeyError((src, dst))

    @cached_property
    def roots(self) -> tuple[str, ...]:
        return tuple(t for t in self.task_names if not self.parents(t))

    @cached_property
    def sinks(self) -> tuple[str, ...]:
        return tuple(t for t in self.task_names if not self.children(t))

    @cached_property
    def topological_order(self) -> tuple[str, ...]:
        order: list[str] = []
        indegree = {t: len(self.parents(t)) for t in self.task_names}
        ready = [t for t in self.task_names if indegree[t] == 0]
        while ready:
            t = ready.pop(0)
            order.append(t)
            for c in self.children(t):
                indegree[c] -= 1
                if indegree[c] == 0:
                    ready.append(c)
        return tuple(order)

    @cached_property
    def paths(self) -> tuple[tuple[str, ...], ...]:
        """Every root-to-sink path of the DAG."""
        found: list[tuple[str, ...]] = []

        def walk(prefix: tuple[str, ...]) -> None:
            kids = self.children(prefix[-1])
            if not kids:
                found.append(prefix)
            for c in kids:
                walk((*prefix, c))

        for r in self.roots:
            walk((r,))
        return tuple(found)

    @cached_property
    def depth(self) -> int:
        return max(len(p) for p in self.paths)

    # ---- lanes ---------------------------------------------------------------------------
    def lanes(self, allowed: dict[str, tuple[str, ...]] | None = None) -> list[Lane]:
        """Every assignment of one variant per task (restricted to ``allowed`` where given)."""
        choices = [
            (allowed or {}).get(t.name) or tuple(v.name for v in t.variants) for t in self.tasks
        ]
        return [tuple(c) for c in itertools.product(*choices)]

    def lane_dict(self, lane: Lane) -> dict[str, str]:
        return dict(zip(self.task_names, lane, strict=True))

    def multipliers(self, lane: Lane, factors: dict[tuple[str, str, str], float] | None = None
                    ) -> dict[str, float]:
        """Requests reaching each task per root request under ``lane`` (paper eq. 5).

        ``factors`` overrides the file's factors per (src, src variant, dst), e.g. with the
        factors the controller measured at run time.
        """
        chosen = self.lane_dict(lane)
        m: dict[str, float] = {}
        for t in self.topological_order:
            parents = self.parents(t)
            if not parents:
                m[t] = 1.0
                continue
            m[t] = sum(m[p] * self.factor(p, chosen[p], t, factors) for p in parents)
        return m

    def factor(self, src: str, variant: str, dst: str,
               factors: dict[tuple[str, str, str], float] | None = None) -> float:
        if factors and (src, variant, dst) in factors:
            return factors[(src, variant, dst)]
        return self.edge(src, dst).factor(variant)

    def path_shares(self, lane: Lane, factors: dict[tuple[str, str, str], float] | None = None
                    ) -> list[float]:
        """f_{p,c}: share of the app's sink-level work on each path, weighted by fan-out."""
        chosen = self.lane_dict(lane)
        weights = []
        for p in self.paths:
            w = 1.0
            for a, b in itertools.pairwise(p):
                w *= self.factor(a, chosen[a], b, factors)
            weights.append(w)
        total = sum(weights)
        if total <= 0:
            return [1.0 / len(weights)] * len(weights)
        return [w / total for w in weights]

    def lane_accuracy(self, lane: Lane, factors: dict[tuple[str, str, str], float] | None = None
                      ) -> float:
        """End-to-end accuracy (PAS) of one lane, relative to each task's best variant."""
        chosen = self.lane_dict(lane)
        acc = 0.0
        for share, p in zip(self.path_shares(lane, factors), self.paths, strict=True):
            prod = 1.0
            for t in p:
                prod *= self.task(t).normalized_accuracy(chosen[t])
            acc += share * prod
        return acc

    @cached_property
    def best_lane(self) -> Lane:
        return tuple(t.best.name for t in self.tasks)

    def max_accuracy(self, factors: dict[tuple[str, str, str], float] | None = None) -> float:
        """A_max: the accuracy of the most accurate variants (paper eq. 12)."""
        return self.lane_accuracy(self.best_lane, factors)


# ---- loading ---------------------------------------------------------------------------------

def load_app(path: str | Path) -> App:
    """Reads and validates an app TOML file; a mistake raises ConfigError naming the field."""
    path = Path(path)
    f = Fields(path, read_toml(path))
    f.reject_unknown({"name", "description", "latency_slo_ms", "accuracy_slo", "staleness_ms",
                      "tasks", "edges", "inputs", "max_item_bytes"})
    name = f.str("name")
    latency_slo_ms = f.number("latency_slo_ms", low=0, low_open=True)
    accuracy_slo = f.number("accuracy_slo", None, low=0, high=1, low_open=True) \
        if f.has("accuracy_slo") else None
    staleness_ms = f.number("staleness_ms", 20.0, low=0)
    max_item_bytes = f.integer("max_item_bytes", 0, low=0, high=1 << 30)
    tasks = _load_tasks(f, path.parent)
    edges = _load_edges(f, {t.name: t for t in tasks})
    inputs = _load_inputs(f, tasks, edges)
    if not inputs:
        inputs = _graph_inputs(tasks, edges)
    app = App(name, tuple(tasks), tuple(edges), latency_slo_ms, accuracy_slo, staleness_ms,
              tuple(inputs) or App.inputs, str(path), max_item_bytes)
    if len(app.topological_order) != len(app.tasks):
        cyclic = sorted(set(app.task_names) - set(app.topological_order))
        raise f.error("edges", f"the task graph is cyclic (through {', '.join(cyclic)})")
    check_tensors(app)
    return app


def _load_tasks(f: Fields, base: Path) -> list[Task]:
    """The ``[[tasks]]``: unique names, known kinds, at least one; a variant name shared by tasks
    must be the same model in each (one variant is one profile table)."""
    tasks: list[Task] = []
    models: dict[str, tuple[str, Model | None, str]] = {}  # variant -> (task, model, field) first seen
    for tf in f.tables("tasks"):
        tf.reject_unknown({"name", "kind", "variants"})
        tname = tf.str("name")
        if any(t.name == tname for t in tasks):
            raise tf.error("name", f"duplicate task name {tname!r}")
        kind = tf.str("kind", "generic")
        if kind not in TASK_KINDS:
            raise tf.error("kind", f"expected one of {', '.join(TASK_KINDS)}, got {kind!r}")
        variants = _load_variants(tf, tname, models, base)
        if not variants:
            raise tf.error("variants", "a task needs at least one variant")
        onnx = [v.resolved is not None and v.resolved.is_onnx for v in variants]
        if any(onnx) and not all(onnx):
            raise tf.error("variants", "a task's variants are all ONNX models or all zoo networks "
                                       "(their outputs must agree)")
        tasks.append(Task(tname, kind, tuple(variants)))
    if not tasks:
        raise f.error("tasks", "an app needs at least one task")
    return tasks


def _load_variants(tf: Fields, tname: str, models: dict[str, tuple[str, Model | None, str]],
                   base: Path) -> list[Variant]:
    """One task's ``[[tasks.variants]]``; ``models`` (variant -> first task, model, field) is
    checked and extended so a variant name means one model across the app."""
    variants: list[Variant] = []
    for vf in tf.tables("variants"):
        vf.reject_unknown({"name", "accuracy", "model"})
        vname = vf.str("name")
        if any(v.name == vname for v in variants):
            raise vf.error("name", f"duplicate variant {vname!r} in task {tname!r}")
        ref = vf.str("model", "")
        model = _resolve_model(vf, ref, vname, base)
        if vname in models:
            first_task, first, where = models[vname]
            if ref and (first is None or model is None or first.describe() != model.describe()):
                first_model = first.describe() if first else "no model"
                raise vf.error("model", f"variant {vname!r} is already {where} in task "
                                        f"{first_task!r} ({first_model}); a variant is one model "
                                        "(its profile table): give it another name")
            model = first
        else:
            models[vname] = (tname, model, f"model = {ref!r}" if ref else "declared")
        variants.append(Variant(vname, vf.number("accuracy", low=0, low_open=True), ref, model))
    return variants


def _load_edges(f: Fields, by_name: dict[str, Task]) -> list[Edge]:
    """The ``[[edges]]``: known tasks, no self-loop or duplicate, a factor per upstream variant
    (one number or a table by variant), an importable transform."""
    edges: list[Edge] = []
    for ef in f.tables("edges", []):
        ef.reject_unknown({"from", "to", "factor", "transform"})
        src, dst = ef.str("from"), ef.str("to")
        for key, t in (("from", src), ("to", dst)):
            if t not in by_name:
                raise ef.error(key, f"unknown task {t!r} (tasks: {', '.join(by_name)})")
        if src == dst:
            raise ef.error("to", f"an edge from {src!r} to itself makes the graph cyclic")
        if any(e.src == src and e.dst == dst for e in edges):
            raise ef.error("to", f"duplicate edge {src} -> {dst}")
        factor_field = ef.raw("factor", 1.0)
        upstream = by_name[src]
        if isinstance(factor_field, dict):
            ff = ef.sub("factor")
            ff.reject_unknown({v.name for v in upstream.variants})
            factors = {v.name: ff.number(v.name, low=0) for v in upstream.variants}
        else:
            value = ef.number("factor", 1.0, low=0)
            factors = {v.name: value for v in upstream.variants}
        transform = ef.str("transform", "")
        if transform and (why := check_import_ref(transform)) is not None:
            raise ef.error("transform", why)
        edges.append(Edge(src, dst, factors, transform))
    return edges


def _load_inputs(f: Fields, tasks: list[Task], edges: list[Edge]) -> list[TensorSpec]:
    """The declared ``[[inputs]]`` (empty when none are): datatype, shape, typical and least shapes
    (an image root task needs at least one element per axis unless ``min_shape`` says otherwise)."""
    inputs: list[TensorSpec] = []
    for inf in f.tables("inputs", []):
        inf.reject_unknown({"name", "datatype", "shape", "min_shape", "typical_shape"})
        dt = inf.str("datatype")
        if dt not in DATATYPES:
            raise inf.error("datatype", f"expected one of {', '.join(DATATYPES)}, got {dt!r}")
        shape = inf.list("shape")
        if not shape or not all(isinstance(d, int) and not isinstance(d, bool) and (d == -1 or d > 0)
                                for d in shape):
            raise inf.error("shape", "expected a non-empty array of positive integers or -1")
        typical = inf.raw("typical_shape", None)
        if typical is not None and (
                not isinstance(typical, list) or len(typical) != len(shape)
                or not all(isinstance(t, int) and not isinstance(t, bool) and t > 0 and (d == -1 or t == d)
                           for d, t in zip(shape, typical, strict=True))):
            raise inf.error("typical_shape", f"expected {len(shape)} positive integers, equal to shape "
                                             f"{shape} where it is not -1, got {typical!r}")
        least: tuple[int, ...] = (1,) * len(shape) if any(t.kind in IMAGE_KINDS for t in tasks
                                                         if t.name not in {e.dst for e in edges}) else ()
        if inf.has("min_shape"):
            given = inf.list("min_shape")
            if (len(given) != len(shape) or not all(isinstance(m, int) and not isinstance(m, bool) and m >= 0
                                                    and (d == -1 or m <= d) for m, d in zip(given, shape))):
                raise inf.error("min_shape", f"expected one non-negative integer per axis of shape {shape}, "
                                             "none above a fixed size")
            least = tuple(given)
        inputs.append(TensorSpec(inf.str("name"), dt, tuple(shape), least,
                                 tuple(typical) if typical is not None else None))
    return inputs


def _resolve_model(vf: Fields, ref: str, variant: str, base: Path) -> Model | None:
    """The variant's model; None when ``model`` is empty and the zoo has no network of that name
    (an emulated node needs none; a real backend says so when it would load it)."""
    try:
        return resolve(ref, variant, base)
    except ModelError as exc:
        if not ref:
            return None
        raise vf.error("model", f"variant {variant!r}: {exc}") from None


def _graph_inputs(tasks: list[Task], edges: list[Edge]) -> list[TensorSpec]:
    """An app that declares no inputs takes its ONNX root task's graph inputs (per item)."""
    fed = {e.dst for e in edges}
    for t in tasks:
        if t.name not in fed:
            model = t.variants[0].resolved
            if model is not None and model.is_onnx:
                return [TensorSpec(i.name, i.datatype, i.item_shape) for i in model.inputs]
            return []
    return []


def _feeds(model: Model, given: dict[str, TensorInfo]) -> str | None:
    """Why tensors ``given`` (per-item shapes with a leading batch axis) cannot feed ``model``."""
    import numpy as np

    from jigsaw.models.repository import NUMPY_DTYPES
    for want in model.inputs:
        have = given.get(want.name)
        if have is None and len(model.inputs) == 1 and len(given) == 1:
            have = next(iter(given.values()))
        if have is None:
            return (f"{model.describe()} takes input {want.describe()}, which is not among "
                    f"{', '.join(t.describe() for t in given.values()) or 'nothing'}")
        if have.datatype not in NUMPY_DTYPES or not np.can_cast(
                np.dtype(NUMPY_DTYPES[have.datatype]), np.dtype(NUMPY_DTYPES[want.datatype]), "same_kind"):
            return f"{model.describe()} takes input {want.describe()}; it would get {have.describe()}"
        item = have.item_shape
        if not (shapes_compatible(item, want.item_shape)
                or (len(item) == len(want.shape) and item[:1] in ((1,), (-1,))
                    and shapes_compatible(item[1:], want.item_shape))):
            return f"{model.describe()} takes input {want.describe()}; it would get {have.describe()}"
    return None


def check_tensors(app: App) -> None:
    """Checks that every ONNX model gets the tensors its graph takes, where that is known statically:
    a root task's models from the app's inputs, and a model fed by an edge without a transform
    from its upstream ONNX model's outputs. Errors name the app file, the field and the ONNX file."""
    declared = {i.name: TensorInfo(i.name, i.datatype, (-1, *i.shape)) for i in app.inputs}
    for ti, task in enumerate(app.tasks):
        for vi, v in enumerate(task.variants):
            model = v.resolved
            if model is None or not model.is_onnx or app.parents(task.name):
                continue
            why = _feeds(model, declared)
            if why is not None:
                raise ConfigError(app.source, f"tasks[{ti}].variants[{vi}].model",
                                  f"{why} (the app's [[inputs]])")
    for ei, e in enumerate(app.edges):
        if e.transform:
            continue
        for dv in app.task(e.dst).variants:
            if dv.resolved is None or not dv.resolved.is_onnx:
                continue
            for sv in app.task(e.src).variants:
                if sv.resolved is None or not sv.resolved.is_onnx:
                    continue
                why = _feeds(dv.resolved, {o.name: o for o in sv.resolved.outputs})
                if why is not None:
                    raise ConfigError(app.source, f"edges[{ei}]",
                                      f"{e.src} ({sv.name}) -> {e.dst} ({dv.name}) passes outputs as they "
                                      f"are, but {why}; name a transform")
    for ti, task in enumerate(app.tasks):
        outs = {tuple((o.name, o.datatype) for o in v.resolved.outputs) for v in task.variants
                if v.resolved is not None and v.resolved.is_onnx}
        if len(outs) > 1 and not app.children(task.name):
            raise ConfigError(app.source, f"tasks[{ti}].variants",
                              "the variants of a sink task answer the client: their ONNX models "
                              "must have the same output names and datatypes")
