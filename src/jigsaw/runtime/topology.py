"""From plans to processes and rings: who runs what, who talks to whom, and how items are routed.

A pure description (plain dataclasses with a JSON form): the daemon creates the named rings and
doorbells it lists, writes one ``ProcessSpec`` per worker as JSON and serves the ``AppRoutes``.

- One process per planned process: an instance of MPS level k is k processes.
- One SPSC ring per (producer, consumer) pair: frontend -> each process of a root task; each
  process of task t -> each process of every child task of t; each process -> the frontend
  (its completion ring). Each consumer owns one doorbell shared by its input rings.
- Routes: for lane l and downstream task d, the processes running lane l's variant of d.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from jigsaw.app import App
from jigsaw.node import Node
from jigsaw.plan import Plan
from jigsaw.profiles import ProfileTable
from jigsaw.runtime.rings import RECORD_OVERHEAD_BYTES

WORK_RING_BYTES = 1 << 20  # task -> task: emulated and real children are small (boxes, crops, tokens)
COMPLETION_RING_BYTES = 4 << 20
BATCH_QUEUE_CAPACITY = 4096


class TopologyError(ValueError):
    """The plans cannot be turned into a running configuration (a lane names an unplanned variant)."""


@dataclass(frozen=True)
class OutputRing:
    ring: str  # POSIX name of the ring this process produces into
    doorbell: str  # the consumer's doorbell
    slot: int  # the consumer's stats slot (its load, for least-loaded routing)
    task: str


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


def _model_fields(app: App, task: str, variant: str) -> dict[str, str]:
    """Where a worker finds its variant's model (see ``jigsaw.models.repository``)."""
    model = app.task(task).variant(variant).resolved
    if model is None:
        return {}
    return {"model": str(model.path)} if model.path is not None else {"zoo": model.zoo}


def build_topology(node: Node, plans: list[tuple[App, Plan]], profiles: ProfileTable, *,
                   name_of: callable = lambda purpose: purpose,  # type: ignore[valid-type]
                   time_scale: float = 1.0, seed: int = 0, backend: str = "emulated") -> Topology:
    """Lay out processes, rings and routes for ``plans``; ``name_of(purpose)`` makes POSIX names."""
    ns = 1e6 * time_scale
    procs: list[dict[str, object]] = []
    app_procs: dict[str, list[dict[str, object]]] = {}
    for app_index, (app, plan) in enumerate(plans):
        mine: list[dict[str, object]] = []
        for inst in plan.instances:
            if inst.count <= 0:
                continue
            table = _latency_table(profiles, inst.variant, inst.mig_profile, inst.mps)
            means = _mean_table(profiles, inst.variant, inst.mig_profile, inst.mps)
            for n in range(inst.count * inst.mps):
                p = {"slot": len(procs), "app": app.name, "app_index": app_index, "task": inst.task,
                     "variant": inst.variant, "mig": inst.mig_profile, "mps": inst.mps,
                     "max_batch": inst.max_batch, "table": table, "means": means,
                     "name": f"{app.name}.{inst.task}.{inst.variant}.{inst.mig_profile}x{inst.mps}.{n}"}
                procs.append(p)
                mine.append(p)
        app_procs[app.name] = mine

    frontend_bell = name_of("bell-frontend")
    stats = name_of("stats")
    rings: dict[str, int] = {}
    bells = [frontend_bell]
    root_ring_bytes = 2 * (node.server.max_payload_bytes + 8 + RECORD_OVERHEAD_BYTES) + 4096
    specs: list[ProcessSpec] = []
    routes: dict[str, AppRoutes] = {}
    completion_rings: list[str] = []
    for app_index, (app, plan) in enumerate(plans):
        mine = app_procs[app.name]
        lanes = [dict(lp.variants) for lp in plan.lanes]
        weights = [max(0.0, lp.rate_rps) for lp in plan.lanes]
        if not lanes:
            raise TopologyError(f"plan of {app.name} has no lanes")
        if sum(weights) <= 0:
            weights = [1.0] * len(lanes)
        by_tv: dict[tuple[str, str], list[dict[str, object]]] = {}
        for p in mine:
            by_tv.setdefault((p["task"], p["variant"]), []).append(p)  # type: ignore[arg-type]
        for li, lane in enumerate(lanes):
            for t in app.roots:
                if weights[li] > 0 and not by_tv.get((t, lane.get(t, ""))):
                    raise TopologyError(f"{app.name}: lane {li} sends {t} to variant "
                                        f"{lane.get(t)!r}, which the plan does not run")
        # A downstream task may have no process in a lane: planned for a measured fan-out of 0, its
        # route is empty and the workers do not send it children (until the next plan).
        fastest = {t: min((latency_for_batch_ms(p["table"], 1) for p in mine  # type: ignore[arg-type]
                           if p["task"] == t), default=0.0) for t in app.task_names}
        remaining: dict[str, float] = {}
        for t in reversed(app.topological_order):
            remaining[t] = max((fastest[c] + remaining[c] for c in app.children(t)), default=0.0)
        level: dict[str, int] = {}
        for t in app.topological_order:
            level[t] = max((level[p] + 1 for p in app.parents(t)), default=0)
        task_index = {t: i for i, t in enumerate(app.task_names)}

        inputs: dict[int, list[str]] = {int(p["slot"]): [] for p in mine}  # type: ignore[call-overload]
        root_targets: dict[int, Target] = {}
        for p in mine:
            slot = int(p["slot"])  # type: ignore[call-overload]
            bell = name_of(f"bell-{slot}")
            bells.append(bell)
            p["bell"] = bell
            if not app.parents(str(p["task"])):
                ring = name_of(f"in-{slot}-fe")
                rings[ring] = root_ring_bytes
                inputs[slot].append(ring)
                root_targets[slot] = Target(ring, bell, slot)
        for p in mine:
            slot = int(p["slot"])  # type: ignore[call-overload]
            task, variant = str(p["task"]), str(p["variant"])
            outputs: list[OutputRing] = []
            out_index: dict[int, int] = {}
            for child in app.children(task):
                for q in mine:
                    if q["task"] != child:
                        continue
                    qs = int(q["slot"])  # type: ignore[call-overload]
                    ring = name_of(f"in-{qs}-{slot}")
                    rings[ring] = WORK_RING_BYTES
                    inputs[qs].append(ring)
                    out_index[qs] = len(outputs)
                    outputs.append(OutputRing(ring, str(q["bell"]), qs, child))
            lane_routes = []
            for lane in lanes:
                lane_routes.append({child: [out_index[int(q["slot"])]  # type: ignore[call-overload]
                                            for q in by_tv.get((child, lane.get(child, "")), [])]
                                    for child in app.children(task)})
            done = name_of(f"done-{slot}")
            rings[done] = COMPLETION_RING_BYTES
            completion_rings.append(done)
            table = p["table"]
            max_batch = int(p["max_batch"])  # type: ignore[call-overload]
            specs.append(ProcessSpec(
                slot=slot, name=str(p["name"]), app=app.name, app_index=app_index, task=task,
                task_index=task_index[task], task_kind=app.task(task).kind, variant=variant,
                mig_profile=str(p["mig"]), mps=int(p["mps"]),  # type: ignore[call-overload]
                max_batch=max_batch, latency_ms_by_batch=table,  # type: ignore[arg-type]
                mean_ms_by_batch=p["means"],  # type: ignore[arg-type]
                time_scale=time_scale,
                max_wait_ns=int(plan.task_latency_ms.get(task, 0.0) * ns),
                staleness_ns=int(app.staleness_ms * ns),
                remaining_min_ns=int(remaining[task] * ns),
                exec_estimate_ns=[int(latency_for_batch_ms(table, b) * ns)  # type: ignore[arg-type]
                                  for b in range(1, max_batch + 1)],
                downstream=[{"task": c, "task_index": task_index[c],
                             "factor": app.edge(task, c).factor(variant),
                             "transform": app.edge(task, c).transform,
                             "transform_dir": str(Path(app.source).parent) if app.source else ""}
                            for c in app.children(task)],
                doorbell=str(p["bell"]), inputs=[], outputs=outputs, routes=lane_routes,
                completion_ring=done, completion_doorbell=frontend_bell, stats=stats, seed=seed,
                backend=backend, **_model_fields(app, task, variant),
            ))
        for s in specs:
            if s.app == app.name:
                object.__setattr__(s, "inputs", inputs[s.slot])
        roots = [{t: [root_targets[int(q["slot"])] for q in by_tv.get((t, lane.get(t, "")), [])]  # type: ignore[call-overload]
                  for t in app.roots} for lane in lanes]
        routes[app.name] = AppRoutes(app, app_index, lanes, weights, roots, app.depth,
                                     sum(i.count * i.slices for i in plan.instances), plan)
    return Topology(specs, routes, frontend_bell, completion_rings, stats, rings, bells)


def write_specs(topology: Topology, directory: Path) -> list[Path]:
    """One ``<slot>.json`` per process in ``directory``; returns the paths."""
    paths = []
    for s in topology.processes:
        path = directory / f"{s.slot}.json"
        path.write_text(s.to_json())
        paths.append(path)
    return paths
