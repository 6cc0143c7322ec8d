"""From plans to processes and rings: who runs what, who talks to whom, and how items are routed.

A pure description (plain dataclasses with a JSON form): the daemon creates the named rings and
doorbells it lists, writes one ``ProcessSpec`` per worker as JSON and serves the ``AppRoutes``.

- One process per planned process: an instance of MPS level k is k processes.
- One SPSC ring per (producer, consumer) pair: frontend -> each process of a root task; each
  process of task t -> each process of every child task of t; each process -> the frontend
  (its completion ring). Each consumer owns one doorbell shared by its input rings.
- Routes: for lane l and downstream task d, the processes running lane l's variant of d.
- Ring sizes: a ring between tasks and a completion ring carry at least the app's largest item
  (``item_ring_bytes``: the app's ``max_item_bytes``, or what its models' fixed output shapes
  need), else their default sizes; a ring from the frontend carries ``server.max_payload_bytes``.
  An item that still does not fit is answered 500 for its request (``runtime/containment.py``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from jigsaw.app import App
from jigsaw.node import Node
from jigsaw.plan import Plan
from jigsaw.profiles import ProfileTable
from jigsaw.runtime.records import CREDIT_BYTES
from jigsaw.runtime.rings import RECORD_OVERHEAD_BYTES, default_max_payload_bytes
from jigsaw.tensors import DATATYPES

WORK_RING_BYTES = 1 << 20  # task -> task: emulated and real children are small (boxes, crops, tokens)
COMPLETION_RING_BYTES = 4 << 20
BATCH_QUEUE_CAPACITY = 4096
TENSOR_HEAD_BYTES = 256  # an encoded tensor's name, datatype and shape, at most (a generous bound)
RING_PAGE_BYTES = 4096  # a grown ring's capacity is a whole number of pages


class TopologyError(ValueError):
    """The plans cannot be turned into a running configuration (a lane names an unplanned variant)."""


NEVER_STALE_NS = 1 << 62  # staleness when stale drops are off (node.server.stale_drops)

@dataclass(frozen=True)
class OutputRing:
    ring: str  # POSIX name of the ring this process produces into
    doorbell: str  # the consumer's doorbell
    slot: int  # the consumer's stats slot (its load, for least-loaded routing)
    task: str
    # the consumer's planned rate at its max batch (items/s, node time; 0: unknown): its load is
    # counted as the time to serve its queue, not as items (``process_items_per_s``)
    items_per_s: float = 0.0


def declared_item_bytes(app: App) -> int:
    """The largest encoded item a task of ``app`` makes as its models declare it: the sum of each
    ONNX model's outputs when every axis is fixed (0 where one is free or a model is a zoo network,
    whose items are small: boxes, labels, tokens, crops)."""
    most = 0
    for task in app.tasks:
        for v in task.variants:
            model = v.resolved
            if model is None or not model.is_onnx:
                continue
            total = 0
            for o in model.outputs:
                dtype = DATATYPES.get(o.datatype)
                if dtype is None or any(d < 0 for d in o.item_shape):
                    total = 0
                    break
                total += TENSOR_HEAD_BYTES + math.prod(o.item_shape) * dtype.itemsize
            most = max(most, total)
    return most


def item_ring_bytes(app: App, default_bytes: int) -> int:
    """The capacity of a ring of ``app`` that carries items (a default of ``default_bytes``): grown
    so that one item of the app's largest (``App.max_item_bytes``, ``declared_item_bytes``) fits."""
    need = max(app.max_item_bytes, declared_item_bytes(app)) + CREDIT_BYTES
    if need <= default_max_payload_bytes(default_bytes):
        return default_bytes
    raw = 2 * (need + 8 + RECORD_OVERHEAD_BYTES)  # (``default_max_payload_bytes`` inverted, aligned)
    return -(-raw // RING_PAGE_BYTES) * RING_PAGE_BYTES


def process_items_per_s(mean_ms: dict[int, float], latency_ms: dict[int, float], max_batch: int) -> float:
    """One process's rate at its max batch (items/s): ``max_batch`` over its mean batch time (the
    p95 latency where the profile has no mean).

    Why: children go to the least-loaded process of their task, and the processes of one task may
    run on different segments (a 1g.20gb x2 at batch 8 serves 38 items/s, a 3g.40gb x2 at batch 32
    141). Counted in items, an equal queue on both means a wait four times longer on the small
    one, which then holds a fan-out's slowest items past the SLO while the large one idles.
    """
    ms = latency_for_batch_ms(mean_ms or latency_ms, max_batch) if (mean_ms or latency_ms) else 0.0
    return 1000.0 * max_batch / ms if ms > 0 else 0.0


@dataclass(frozen=True)
class ProcessSpec:
    """Everything one worker process needs; crosses the process boundary as JSON."""

    slot: int  # index in the stats block, unique in the daemon
    name: str  # app.task.variant.mig.n, for logs and metrics
    app: str
    app_index: int
    task: str
    task_index: int
    task_kind: str
    variant: str
    mig_profile: str
    mps: int
    max_batch: int
    latency_ms_by_batch: dict[int, float]  # this segment's profile, per profiled batch size
    time_scale: float  # emulated and planned times are multiplied by it
    max_wait_ns: int  # the task's planned latency L^(t), scaled
    staleness_ns: int
    remaining_min_ns: int  # fastest batch-1 latency of the remaining tasks on the longest path
    exec_estimate_ns: list[int]  # index b-1: this segment's latency for a batch of b, scaled
    downstream: list[dict[str, object]]  # [{task, task_index, factor}] for this variant
    doorbell: str
    inputs: list[str]
    outputs: list[OutputRing]
    routes: list[dict[str, list[int]]]  # per lane: downstream task -> indexes into outputs
    completion_ring: str
    completion_doorbell: str
    stats: str
    backend: str = "emulated"
    seed: int = 0
    queue_capacity: int = BATCH_QUEUE_CAPACITY
    mean_ms_by_batch: dict[int, float] = field(default_factory=dict)  # from the profile's throughput
    model: str = ""  # the variant's ONNX file (a repository model); "": the zoo network ``zoo``
    zoo: str = ""  # the zoo network of a built-in model ("": the variant's name)
    # a repository model's outputs [name, datatype, per-item shape] (what the emulated backend makes)
    graph_outputs: list[list[object]] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ProcessSpec:
        d = json.loads(text)
        d["outputs"] = [OutputRing(**o) for o in d["outputs"]]
        d["latency_ms_by_batch"] = {int(k): float(v) for k, v in d["latency_ms_by_batch"].items()}
        d["mean_ms_by_batch"] = {int(k): float(v) for k, v in d.get("mean_ms_by_batch", {}).items()}
        return cls(**d)


@dataclass
class Target:
    """A consumer as the frontend sees it: the ring it produces into and the consumer's load."""

    ring: str
    doorbell: str
    slot: int


@dataclass
class AppRoutes:
    """The frontend's view of one app: lanes and where each lane's root items go."""

    app: App
    app_index: int
    lanes: list[dict[str, str]]  # lane index -> {task: variant}
    lane_weights: list[float]  # rate_rps of each lane
    roots: list[dict[str, list[Target]]]  # lane index -> root task -> targets
    depth: int
    slices: int  # compute slices its plan uses
    plan: Plan
    generation: int = 0  # which generation of the app's processes these routes lead to
    lane_shift: bool = True  # node.server.lane_shift: a backed-up lane's requests may take another
    admission_bottleneck: bool = False  # node.server.admission_bottleneck (runtime/admission.py)
    admission_per_generation: bool = False  # node.server.admission_per_generation (the same)
    admission_backlog: bool = False  # node.server.admission_backlog (the same)


@dataclass
class Topology:
    processes: list[ProcessSpec]
    apps: dict[str, AppRoutes]
    frontend_doorbell: str
    completion_rings: list[str]
    stats: str
    rings: dict[str, int] = field(default_factory=dict)  # every ring name -> capacity_bytes
    doorbells: list[str] = field(default_factory=list)


def _mean_table(profiles: ProfileTable, variant: str, mig: str, mps: int) -> dict[int, float]:
    """Mean batch time of one process, as the profile's segment throughput implies (k * b / H)."""
    return dict(sorted((r.batch, 1000.0 * r.mps * r.batch / r.throughput_rps)
                       for r in profiles.rows(variant) if r.mig_profile == mig and r.mps == mps))


def _latency_table(profiles: ProfileTable, variant: str, mig: str, mps: int) -> dict[int, float]:
    table = {r.batch: r.latency_ms for r in profiles.rows(variant) if r.mig_profile == mig and r.mps == mps}
    if not table:
        raise TopologyError(f"no profile rows for {variant} on {mig} x{mps}")
    return dict(sorted(table.items()))


def latency_for_batch_ms(table: dict[int, float], batch: int) -> float:
    """The latency of the smallest profiled batch >= ``batch`` (the largest profiled beyond it)."""
    for b, ms in table.items():
        if b >= batch:
            return ms
    return table[max(table)]


NameOf = Callable[[str], str]
"""``name_of(purpose)``: the POSIX name of a segment (the daemon's registry prefixes its id)."""


def _model_fields(app: App, task: str, variant: str) -> dict[str, object]:
    """Where a worker finds its variant's model (see ``jigsaw.models.repository``), and a
    repository model's outputs."""
    model = app.task(task).variant(variant).resolved
    if model is None:
        return {}
    if model.path is None:
        return {"zoo": model.zoo}
    return {"model": str(model.path),
            "graph_outputs": [[o.name, o.datatype, [1, *o.item_shape]] for o in model.outputs]}


@dataclass
class _Process:
    """One planned process while the topology is laid out (becomes a ``ProcessSpec``)."""

    slot: int
    name: str
    task: str
    variant: str
    mig_profile: str
    mps: int
    max_batch: int
    latency_ms: dict[int, float]
    mean_ms: dict[int, float]
    doorbell: str = ""


@dataclass
class _Wiring:
    """Every ring and doorbell of the topology, filled as the apps are wired."""

    rings: dict[str, int] = field(default_factory=dict)  # name -> capacity_bytes
    doorbells: list[str] = field(default_factory=list)
    completion_rings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Shared:
    """What every process spec of a topology carries alike."""

    name_of: NameOf
    stats: str
    frontend_doorbell: str
    time_scale: float
    seed: int
    backend: str
    stale_drops: bool = False  # node.server.stale_drops: else no item is ever stale


def build_topology(node: Node, plans: list[tuple[App, Plan]], profiles: ProfileTable, *,
                   name_of: NameOf = lambda purpose: purpose, time_scale: float = 1.0, seed: int = 0,
                   backend: str = "emulated") -> Topology:
    """Lay out processes, rings and routes for ``plans``; ``name_of(purpose)`` makes POSIX names.

    Steps: number every planned process (``_lay_out_processes``); then per app, check that every
    lane's root variants run (``_check_lanes``), give each process its doorbell and the root ones
    their ring from the frontend (``_root_rings``), and wire each process to its children's
    processes and to the frontend (``_process_specs``); the app's routes say where the frontend
    sends each lane's root items (``_app_routes``).
    """
    wiring = _Wiring(doorbells=[name_of("bell-frontend")])
    stats = name_of("stats")
    root_ring_bytes = 2 * (node.server.max_payload_bytes + 8 + RECORD_OVERHEAD_BYTES) + 4096
    by_app = _lay_out_processes(plans, profiles)
    specs: list[ProcessSpec] = []
    routes: dict[str, AppRoutes] = {}
    for app_index, (app, plan) in enumerate(plans):
        procs = by_app[app.name]
        lanes = [dict(lp.variants) for lp in plan.lanes]
        weights = [max(0.0, lp.rate_rps) for lp in plan.lanes]
        if not lanes:
            raise TopologyError(f"plan of {app.name} has no lanes")
        if sum(weights) <= 0:
            weights = [1.0] * len(lanes)
        by_variant: dict[tuple[str, str], list[_Process]] = {}
        for p in procs:
            by_variant.setdefault((p.task, p.variant), []).append(p)
        _check_lanes(app, lanes, weights, by_variant)
        roots = _root_rings(app, procs, name_of, wiring, max(root_ring_bytes,
                                                            item_ring_bytes(app, root_ring_bytes)))
        specs += _process_specs(app, app_index, plan, procs, lanes, by_variant, roots, wiring,
                                Shared(name_of, stats, wiring.doorbells[0], time_scale, seed, backend,
                                       node.server.stale_drops))
        routes[app.name] = _app_routes(app, app_index, plan, lanes, weights, by_variant, roots)
        routes[app.name].lane_shift = node.server.lane_shift
        routes[app.name].admission_bottleneck = node.server.admission_bottleneck
        routes[app.name].admission_per_generation = node.server.admission_per_generation
        routes[app.name].admission_backlog = node.server.admission_backlog
    return Topology(specs, routes, wiring.doorbells[0], wiring.completion_rings, stats, wiring.rings,
                    wiring.doorbells)


def _lay_out_processes(plans: list[tuple[App, Plan]], profiles: ProfileTable) -> dict[str, list[_Process]]:
    """One ``_Process`` per planned process (an instance of MPS level k is k), slots numbered across apps."""
    slot = 0
    out: dict[str, list[_Process]] = {}
    for app, plan in plans:
        mine = out.setdefault(app.name, [])
        for inst in plan.instances:
            if inst.count <= 0:
                continue
            table = _latency_table(profiles, inst.variant, inst.mig_profile, inst.mps)
            means = _mean_table(profiles, inst.variant, inst.mig_profile, inst.mps)
            for n in range(inst.count * inst.mps):
                name = f"{app.name}.{inst.task}.{inst.variant}.{inst.mig_profile}x{inst.mps}.{n}"
                mine.append(_Process(slot, name, inst.task, inst.variant, inst.mig_profile, inst.mps,
                                     inst.max_batch, table, means))
                slot += 1
    return out


def _check_lanes(app: App, lanes: list[dict[str, str]], weights: list[float],
                 by_variant: dict[tuple[str, str], list[_Process]]) -> None:
    """Every lane that gets traffic runs its root variants.

    A downstream task may have no process in a lane: planned for a measured fan-out of 0, its route
    is empty and the workers do not send it children (until the next plan).
    """
    for li, lane in enumerate(lanes):
        for t in app.roots:
            if weights[li] > 0 and not by_variant.get((t, lane.get(t, ""))):
                raise TopologyError(f"{app.name}: lane {li} sends {t} to variant "
                                    f"{lane.get(t)!r}, which the plan does not run")


def _root_rings(app: App, procs: list[_Process], name_of: NameOf, wiring: _Wiring,
                ring_bytes: int) -> dict[int, Target]:
    """Give each process its doorbell, and each process of a root task its ring from the frontend."""
    roots: dict[int, Target] = {}
    for p in procs:
        p.doorbell = name_of(f"bell-{p.slot}")
        wiring.doorbells.append(p.doorbell)
        if not app.parents(p.task):
            ring = name_of(f"in-{p.slot}-fe")
            wiring.rings[ring] = ring_bytes
            roots[p.slot] = Target(ring, p.doorbell, p.slot)
    return roots


def _remaining_ms(app: App, procs: list[_Process]) -> dict[str, float]:
    """Per task, the fastest batch-1 time of the tasks after it on its longest path."""
    fastest = {t: min((latency_for_batch_ms(p.latency_ms, 1) for p in procs if p.task == t), default=0.0)
               for t in app.task_names}
    remaining: dict[str, float] = {}
    for t in reversed(app.topological_order):
        remaining[t] = max((fastest[c] + remaining[c] for c in app.children(t)), default=0.0)
    return remaining


def _process_specs(app: App, app_index: int, plan: Plan, procs: list[_Process], lanes: list[dict[str, str]],
                   by_variant: dict[tuple[str, str], list[_Process]], roots: dict[int, Target],
                   wiring: _Wiring, shared: Shared) -> list[ProcessSpec]:
    """Wire every process to each process of its children (one ring per pair) and to the frontend."""
    ns = 1e6 * shared.time_scale
    remaining = _remaining_ms(app, procs)
    task_index = {t: i for i, t in enumerate(app.task_names)}
    transform_dir = str(Path(app.source).parent) if app.source else ""  # edges' transforms resolve here
    inputs: dict[int, list[str]] = {p.slot: [roots[p.slot].ring] if p.slot in roots else [] for p in procs}
    work_bytes = item_ring_bytes(app, WORK_RING_BYTES)
    done_bytes = item_ring_bytes(app, COMPLETION_RING_BYTES)
    wired: list[tuple[_Process, list[OutputRing], list[dict[str, list[int]]], str]] = []
    for p in procs:
        outputs: list[OutputRing] = []
        out_index: dict[int, int] = {}
        for child in app.children(p.task):
            for q in procs:
                if q.task != child:
                    continue
                ring = shared.name_of(f"in-{q.slot}-{p.slot}")
                wiring.rings[ring] = work_bytes
                inputs[q.slot].append(ring)
                out_index[q.slot] = len(outputs)
                outputs.append(OutputRing(ring, q.doorbell, q.slot, child,
                                          process_items_per_s(q.mean_ms, q.latency_ms, q.max_batch)))
        lane_routes = [{child: [out_index[q.slot] for q in by_variant.get((child, lane.get(child, "")), [])]
                        for child in app.children(p.task)} for lane in lanes]
        done = shared.name_of(f"done-{p.slot}")
        wiring.rings[done] = done_bytes
        wiring.completion_rings.append(done)
        wired.append((p, outputs, lane_routes, done))
    return [ProcessSpec(
        slot=p.slot, name=p.name, app=app.name, app_index=app_index, task=p.task,
        task_index=task_index[p.task], task_kind=app.task(p.task).kind, variant=p.variant,
        mig_profile=p.mig_profile, mps=p.mps, max_batch=p.max_batch, latency_ms_by_batch=p.latency_ms,
        mean_ms_by_batch=p.mean_ms, time_scale=shared.time_scale,
        max_wait_ns=int(plan.task_latency_ms.get(p.task, 0.0) * ns),
        staleness_ns=int(app.staleness_ms * ns) if shared.stale_drops else NEVER_STALE_NS,
        remaining_min_ns=int(remaining[p.task] * ns),
        exec_estimate_ns=[int(latency_for_batch_ms(p.latency_ms, b) * ns) for b in range(1, p.max_batch + 1)],
        downstream=[{"task": c, "task_index": task_index[c], "factor": app.edge(p.task, c).factor(p.variant),
                     "transform": app.edge(p.task, c).transform, "transform_dir": transform_dir}
                    for c in app.children(p.task)],
        doorbell=p.doorbell, inputs=inputs[p.slot], outputs=outputs, routes=lane_routes,
        completion_ring=done, completion_doorbell=shared.frontend_doorbell, stats=shared.stats,
        seed=shared.seed, backend=shared.backend, **_model_fields(app, p.task, p.variant),
    ) for p, outputs, lane_routes, done in wired]


def _app_routes(app: App, app_index: int, plan: Plan, lanes: list[dict[str, str]], weights: list[float],
                by_variant: dict[tuple[str, str], list[_Process]], roots: dict[int, Target]) -> AppRoutes:
    """Where the frontend sends each lane's root items: the processes of the lane's root variants."""
    targets = [{t: [roots[q.slot] for q in by_variant.get((t, lane.get(t, "")), [])] for t in app.roots}
               for lane in lanes]
    return AppRoutes(app, app_index, lanes, weights, targets, app.depth,
                     sum(i.count * i.slices for i in plan.instances), plan)


def write_specs(topology: Topology, directory: Path) -> list[Path]:
    """One ``<slot>.json`` per process in ``directory``; returns the paths."""
    paths = []
    for s in topology.processes:
        path = directory / f"{s.slot}.json"
        path.write_text(s.to_json())
        paths.append(path)
    return paths
