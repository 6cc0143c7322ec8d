"""A plan (what to run) and a layout (where it runs): the planner's and packer's outputs.

Plain dataclasses with a JSON form; the CLI, the controller, the runtime and the benches all
read and write these.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from jigsaw.errors import ConfigError
from jigsaw.mig import share_host


@dataclass(frozen=True)
class PlanInstance:
    """``count`` identical GPU segments running one variant of one task."""

    task: str
    variant: str
    mig_profile: str
    mps: int  # processes in the MIG instance
    max_batch: int
    count: int  # number of MIG instances of this kind
    latency_ms: float  # p95 of one batch of max_batch on one process
    throughput_rps: float  # of one segment (all its processes), times planner.max_utilization
    slices: int  # compute slices of one MIG instance


@dataclass(frozen=True)
class LanePlan:
    """One variant per task and the root request rate sent down that lane."""

    variants: dict[str, str]
    rate_rps: float


@dataclass(frozen=True)
class PlacedInstance:
    profile: str
    start: int
    task: str = ""
    variant: str = ""
    index: int = 0  # which of the plan's instances of (task, variant, profile, mps, max_batch)
    mps: int = 1
    max_batch: int = 1
    app: str = ""  # which app's instance, in a node-wide layout of several apps ("" in one app's)
    seat: int = 0  # a share of a MIG instance: which of the instance's k processes (0..k-1)


@dataclass(frozen=True)
class GpuLayout:
    gpu: int
    instances: tuple[PlacedInstance, ...] = ()

    @property
    def signature(self) -> tuple[tuple[str, int], ...]:
        """What a repartition changes: the (profile, start) pairs of the MIG instances, not what
        runs on them (the shares of one instance are that instance: its host profile)."""
        return tuple(sorted({(share_host(p.profile) or p.profile, p.start) for p in self.instances}))


@dataclass(frozen=True)
class Layout:
    gpu_model: str
    gpus: tuple[GpuLayout, ...]

    @property
    def gpus_used(self) -> int:
        return sum(1 for g in self.gpus if g.instances)


@dataclass
class Plan:
    app: str
    space: str
    demand_rps: float  # the demand asked for
    planned_rps: float  # the demand the plan serves (== demand_rps unless max_demand_plan)
    feasible: bool  # a plan serving demand_rps within the SLOs was found
    max_demand_plan: bool  # demand was above capacity: this plan serves the most it can
    status: str  # optimal | feasible | infeasible | error: solver's word
    objective: float
    accuracy: float  # end-to-end accuracy relative to the best achievable (0..1)
    slices_used: int
    slices_available: int
    solve_seconds: float
    gap: float  # absolute gap on the objective; 0 when proven optimal
    instances: list[PlanInstance] = field(default_factory=list)
    lanes: list[LanePlan] = field(default_factory=list)
    task_latency_ms: dict[str, float] = field(default_factory=dict)
    layout: Layout | None = None
    node: str = ""
    gpu_model: str = ""
    latency_slo_ms: float = 0.0
    accuracy_slo: float = 0.0
    columns_total: int = 0
    columns_pruned: int = 0  # columns left after pruning
    solver: str = ""
    notes: list[str] = field(default_factory=list)

    def to_json_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.layout is not None:
            d["layout"] = [
                {"gpu": g.gpu, "instances": [asdict(p) for p in g.instances]}
                for g in self.layout.gpus
            ]
        else:
            d["layout"] = []
        d["gpu_model"] = self.gpu_model or (self.layout.gpu_model if self.layout else "")
        return json_safe(d)

    def to_json(self) -> str:
        return json.dumps(self.to_json_dict(), indent=2, sort_keys=False)

    @classmethod
    def from_json_dict(cls, d: dict[str, Any], source: str = "<plan>") -> Plan:
        try:
            kwargs = dict(d)
            kwargs["objective"] = float("nan") if d.get("objective") is None else d["objective"]
            kwargs["gap"] = float("inf") if d.get("gap") is None else d["gap"]
            kwargs["instances"] = [PlanInstance(**i) for i in d.get("instances", [])]
            kwargs["lanes"] = [LanePlan(dict(x["variants"]), float(x["rate_rps"]))
                               for x in d.get("lanes", [])]
            gpus = tuple(
                GpuLayout(int(g["gpu"]), tuple(PlacedInstance(**p) for p in g["instances"]))
                for g in d.get("layout", [])
            )
            kwargs["layout"] = Layout(d.get("gpu_model", ""), gpus) if gpus else None
            return cls(**kwargs)
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(source, "(plan)", f"not a jigsaw plan: {exc}") from None


@dataclass
class NodePlan:
    """Every app of a node planned in one decision over the shared slices, with one layout.

    ``plans[app].layout`` is the node layout restricted to that app's instances (same GPU
    indices and starts), so each app's plan stands on its own for the runtime and the verifier;
    ``layout`` holds all of them, each instance labelled with its app.
    """

    node: str
    objective_kind: str  # accuracy | slices (the node config's planner.objective)
    status: str  # optimal | feasible | infeasible | no_solution
    feasible: bool  # every app's demand is served
    objective: float  # sum of weight x accuracy minus beta x slices ("accuracy"), or -slices
    gap: float  # absolute, on that objective; 0 when proven optimal
    slices_used: int
    slices_available: int
    solve_seconds: float
    plans: dict[str, Plan] = field(default_factory=dict)
    layout: Layout | None = None
    demand_scale: float = 1.0  # < 1: the demands did not fit together; each app serves this share
    notes: list[str] = field(default_factory=list)
    # the least common fraction shown not to fit (1 where the demands fit): the largest fraction
    # lies in [demand_scale, scale_bound]
    scale_bound: float = 1.0

    def to_json_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k not in ("plans", "layout")}
        d["plans"] = {name: p.to_json_dict() for name, p in self.plans.items()}
        d["layout"] = ([{"gpu": g.gpu, "instances": [asdict(p) for p in g.instances]}
                        for g in self.layout.gpus] if self.layout is not None else [])
        return json_safe(d)

    def to_json(self) -> str:
        return json.dumps(self.to_json_dict(), indent=2)

    @classmethod
    def from_json_dict(cls, d: dict[str, Any], source: str = "<node plan>") -> NodePlan:
        """The inverse of ``to_json_dict`` (unknown numbers, null in JSON, come back as NaN/inf)."""
        try:
            plans = {str(name): Plan.from_json_dict(p, source) for name, p in d.get("plans", {}).items()}
            gpu_model = next((p.gpu_model for p in plans.values() if p.gpu_model), "")
            gpus = tuple(GpuLayout(int(g["gpu"]), tuple(PlacedInstance(**p) for p in g["instances"]))
                         for g in d.get("layout", []))
            kwargs = {k: v for k, v in d.items() if k not in ("plans", "layout")}
            for k, missing in (("objective", math.nan), ("gap", math.inf)):
                kwargs[k] = missing if kwargs.get(k) is None else float(kwargs[k])
            return cls(**kwargs, plans=plans, layout=Layout(gpu_model, gpus) if gpus else None)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(source, "(node plan)", f"not a jigsaw node plan: {exc}") from None


def without_placed(plan: Plan, slots: set[tuple[int, int]]) -> Plan | None:
    """``plan`` less its placed instances at ``slots`` (GPU, start): instance counts and layout
    (each kind's instances numbered 0.. again in their old order: process n of a kind runs on
    index n // mps); its lanes as they were. None when the plan has no layout.

    Shared by the runtime's drain-first (the processes that serve on while some instances drain)
    and the planner's trimmed plans (a running plan less what its demand leaves spare)."""
    if plan.layout is None:
        return None
    removed: dict[tuple[str, str, str, int, int], int] = {}
    gpus = []
    for g in plan.layout.gpus:
        kept = []
        for p in g.instances:
            if (g.gpu, p.start) in slots:
                kind = (p.task, p.variant, p.profile, p.mps, p.max_batch)
                removed[kind] = removed.get(kind, 0) + 1
            else:
                kept.append(p)
        gpus.append(replace(g, instances=tuple(kept)))
    order = sorted(((p.task, p.variant, p.profile, p.mps, p.max_batch), p.index, g.gpu, p.start, p.seat)
                   for g in gpus for p in g.instances)
    counts: dict[tuple[str, str, str, int, int], int] = {}
    index: dict[tuple[int, int, int], int] = {}  # (GPU, start, seat): a MIG instance's shares have seats
    for kind, _, gpu, start, seat in order:
        index[(gpu, start, seat)] = counts.get(kind, 0)
        counts[kind] = index[(gpu, start, seat)] + 1
    gpus = [replace(g, instances=tuple(replace(p, index=index[(g.gpu, p.start, p.seat)])
                                       for p in g.instances)) for g in gpus]
    instances = []
    for i in plan.instances:
        kind = (i.task, i.variant, i.mig_profile, i.mps, i.max_batch)
        gone = min(i.count, removed.get(kind, 0))
        removed[kind] = removed.get(kind, 0) - gone
        instances.append(replace(i, count=i.count - gone))
    return replace(plan, instances=instances, layout=replace(plan.layout, gpus=tuple(gpus)))


def json_safe(x: Any) -> Any:
    """JSON has no NaN or infinity: non-finite numbers become null ("unknown"), recursively."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_safe(v) for v in x]
    return x


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(str(path), "(file)", "no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), "(syntax)", f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(str(path), "(top)", "expected a JSON object")
    return Plan.from_json_dict(data, str(path))
