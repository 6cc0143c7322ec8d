"""The fleet planner: which node serves which share of each app's demand, on how many GPUs.

A request never leaves the node it entered, so every node runs complete lanes and the fleet's
capacity for an app is the sum of its nodes' capacities. Nodes of a group are identical, so the
planner never plans the whole fleet as one MILP; it exploits the symmetry:

1. **Curves.** For each node group and app, the node planner's capacity (the maximum
   serviceable demand, ``jigsaw.planner.milp.capacity``) on ``g`` of the node's GPUs, for every
   ``g`` a configuration can give the app (only the whole node when the group serves one app).
   These do not depend on the demand and are reused across re-plans (``FleetCurves``).
2. **Allocation.** A node's *configuration* gives each app a whole number of its GPUs. A small
   exact MILP chooses how many nodes of each group run each configuration (integer counts, not
   one variable per node: the symmetry), first maximising the fleet's headroom ``s`` (every
   app gets at least ``s`` x its demand in capacity), then, at that headroom (``balanced``) or
   at just the demand (``fewest-slices``), the fewest slices.
3. **Shares.** Each app's demand is split over the nodes that host it in proportion to their
   capacity, so every such node runs at the same utilization; the load balancer's weights are
   these shares.
4. **Node plans.** Each distinct (group, app, GPUs, share) is planned once with the node
   planner; nodes with the same one share the plan. A node's apps get disjoint GPUs (the app
   on GPUs ``offset .. offset + g - 1``), so the node's MIG layout is the union.

An app never shares a GPU with another app in a fleet plan: the price of planning apps one at
a time with the public node planner (a whole-node multi-app planner would recover it).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import mip

from jigsaw.app import App
from jigsaw.errors import PlanError
from jigsaw.fleet.config import Fleet, NodeGroup
from jigsaw.node import Node, load_node_profiles
from jigsaw.plan import GpuLayout, Layout, PlacedInstance, Plan, json_safe
from jigsaw.planner.milp import as_linear, capacity, plan
from jigsaw.profiles import ProfileTable

WEIGHT_SCALE = 10_000  # integer load-balancer weights: a share of 1.0 is this weight
RETRY_LIMIT_FACTOR = 3.0  # a capacity solve without an incumbent is retried with this x the limit


@dataclass(frozen=True)
class CurvePoint:
    """The node planner's capacity for one app on ``gpus`` GPUs of one node of a group."""

    gpus: int
    capacity_rps: float
    slices_used: int  # by the plan serving capacity_rps
    status: str  # of the capacity solve: optimal, or feasible (time limit: a lower bound)
    plan: Plan


@dataclass
class FleetCurves:
    """Capacity curves per (group, app): demand-independent, so computed once per fleet."""

    points: dict[tuple[str, str], dict[int, CurvePoint]] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class NodeAppPlan:
    app: str
    gpus: int
    gpu_offset: int  # the app's GPUs on the node are offset .. offset + gpus - 1
    capacity_rps: float
    share_rps: float
    plan: Plan | None  # None when the fleet was planned without node plans


@dataclass
class NodePlan:
    name: str
    group: str
    gpu_model: str
    num_gpus: int
    apps: dict[str, NodeAppPlan]
    layout: Layout | None = None
    # compute slices of one GPU: the node's GPU model's own (a GPU given by its figures, e.g.
    # an L4, has no table to look it up in)
    slices_per_gpu: int = 7
    slices: int = 0  # the node's compute slices where its GPUs differ (several GPU groups); 0: per GPU

    @property
    def slices_used(self) -> int:
        return sum(a.plan.slices_used for a in self.apps.values() if a.plan is not None)

    @property
    def slices_available(self) -> int:
        return self.slices or self.num_gpus * self.slices_per_gpu

    def plans(self) -> list[Plan]:
        return [a.plan for a in self.apps.values() if a.plan is not None]


@dataclass
class AppShares:
    demand_rps: float
    planned_rps: float  # demand_rps, or the most the fleet serves when it is above capacity
    capacity_rps: float  # of the nodes hosting the app in this plan
    shares: dict[str, float]  # node -> fraction of planned_rps it takes (sum 1)


@dataclass
class FleetPlan:
    fleet: str
    allocation: str
    headroom: float  # fleet capacity / demand for the tightest app (inf at zero demand)
    feasible: bool  # every app's demand is served
    nodes: list[NodePlan]
    apps: dict[str, AppShares]
    down: list[str]
    solve_seconds: float
    curve_seconds: float
    notes: list[str] = field(default_factory=list)

    def node(self, name: str) -> NodePlan:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def weights(self, app: str) -> dict[str, int]:
        """Integer load-balancer weights per node for ``app`` (nodes with no share left out)."""
        return {n: max(1, round(f * WEIGHT_SCALE)) for n, f in self.apps[app].shares.items() if f > 0}

    @property
    def slices_used(self) -> int:
        return sum(n.slices_used for n in self.nodes)

    @property
    def slices_available(self) -> int:
        return sum(n.slices_available for n in self.nodes)

    def to_json_dict(self) -> dict[str, Any]:
        return json_safe({
            "fleet": self.fleet, "allocation": self.allocation, "headroom": self.headroom,
            "feasible": self.feasible, "down": self.down, "solve_seconds": self.solve_seconds,
            "curve_seconds": self.curve_seconds, "slices_used": self.slices_used,
            "slices_available": self.slices_available, "notes": self.notes,
            "apps": {a: {"demand_rps": s.demand_rps, "planned_rps": s.planned_rps,
                         "capacity_rps": s.capacity_rps, "shares": s.shares,
                         "weights": self.weights(a)} for a, s in self.apps.items()},
            "nodes": [{"name": n.name, "group": n.group, "gpu_model": n.gpu_model,
                       "num_gpus": n.num_gpus, "slices_used": n.slices_used,
                       "apps": {a: {"gpus": p.gpus, "gpu_offset": p.gpu_offset,
                                    "capacity_rps": p.capacity_rps, "share_rps": p.share_rps,
                                    "plan": p.plan.to_json_dict() if p.plan is not None else None}
                                for a, p in n.apps.items()},
                       "layout": [{"gpu": g.gpu, "instances": [asdict(i) for i in g.instances]}
                                  for g in (n.layout.gpus if n.layout is not None else ())]}
                      for n in self.nodes],
        })


# ---- 1. curves ------------------------------------------------------------------------------

def _group_apps(fleet: Fleet, group: NodeGroup) -> list[App]:
    names = {a.name for a in group.node.apps}
    return [a.app for a in fleet.apps if a.name in names]


def _gpu_options(fleet: Fleet, group: NodeGroup) -> list[int]:
    """GPU counts an app may get on a node of the group: the whole node when it serves one app, or
    when its GPUs are of several groups (its GPUs are not interchangeable: one app per node)."""
    n = group.node.num_gpus
    return [n] if len(_group_apps(fleet, group)) <= 1 or group.node.is_mixed else list(range(1, n + 1))


def _profiles(node: Node, apps: list[App], cache: dict[str, ProfileTable]) -> ProfileTable:
    key = str(node.profiles_dir)
    if key not in cache:
        cache[key] = load_node_profiles(node, apps)
    return cache[key]


def fleet_curves(fleet: Fleet, previous: FleetCurves | None = None) -> FleetCurves:
    """The capacity of every (group, app) on every GPU count it may get (reusing ``previous``)."""
    t0 = time.perf_counter()
    curves = FleetCurves(dict(previous.points) if previous is not None else {})
    profiles: dict[str, ProfileTable] = {}
    for group in fleet.groups:
        apps = _group_apps(fleet, group)
        for app in apps:
            pts = curves.points.setdefault((group.name, app.name), {})
            for g in _gpu_options(fleet, group):
                if g in pts:
                    continue
                node = group.node.with_gpus(g)
                limit = fleet.time_limit_s if fleet.time_limit_s is not None else node.planner.time_limit_s
                cap = capacity(app, node, _profiles(group.node, apps, profiles), space=fleet.space,
                               time_limit_s=limit, solver=fleet.solver)
                if cap.max_demand_rps <= 0 and cap.status not in ("optimal", "infeasible"):
                    # no incumbent within the limit is not "serves nothing": try once, longer
                    cap = capacity(app, node, _profiles(group.node, apps, profiles), space=fleet.space,
                                   time_limit_s=RETRY_LIMIT_FACTOR * limit, solver=fleet.solver)
                pts[g] = CurvePoint(g, cap.max_demand_rps, cap.plan.slices_used, cap.status, cap.plan)
    curves.seconds = (previous.seconds if previous is not None else 0.0) + time.perf_counter() - t0
    return curves


# ---- 2. allocation --------------------------------------------------------------------------

@dataclass(frozen=True)
class _Config:
    group: str
    gpus: tuple[tuple[str, int], ...]  # (app, GPUs) for the apps it hosts, gpus > 0

    def get(self, app: str) -> int:
        return dict(self.gpus).get(app, 0)


def _configs(fleet: Fleet, group: NodeGroup) -> list[_Config]:
    apps = [a.name for a in _group_apps(fleet, group)]
    options = [0, *_gpu_options(fleet, group)]
    out = []
    for combo in itertools.product(options, repeat=len(apps)):
        if 0 < sum(combo) <= group.node.num_gpus:
            out.append(_Config(group.name, tuple((a, g) for a, g in zip(apps, combo, strict=True) if g)))
    return out


def _allocate(fleet: Fleet, curves: FleetCurves, live: dict[str, int], demand: dict[str, float]
              ) -> tuple[dict[_Config, int], float]:
    """Node counts per configuration and the headroom they give (see the module docstring)."""
    configs = [c for g in fleet.groups for c in _configs(fleet, g) if live[g.name] > 0]
    if not configs:
        raise PlanError(f"fleet {fleet.name}: no live node hosts any of its apps")

    def cap(c: _Config, app: str) -> float:
        g = c.get(app)
        return curves.points[(c.group, app)][g].capacity_rps if g else 0.0

    def slices(c: _Config) -> int:
        return sum(curves.points[(c.group, a)][g].slices_used for a, g in c.gpus)

    # Zero demand everywhere: allocate as if every app had the same demand (a serving shape).
    weights = demand if any(d > 0 for d in demand.values()) else {a: 1.0 for a in demand}
    total_cap = {a: sum(live[g.name] * max((p.capacity_rps for p in curves.points.get((g.name, a), {})
                                            .values()), default=0.0) for g in fleet.groups)
                 for a in weights}
    for a, d in weights.items():
        if d > 0 and total_cap[a] <= 0:
            raise PlanError(f"fleet {fleet.name}: no live node can serve app {a!r} within its SLOs")

    def model(stage: str, floor: float = 0.0) -> tuple[dict[_Config, int], float]:
        m = mip.Model(sense=mip.MAXIMIZE if stage == "headroom" else mip.MINIMIZE, solver_name=mip.CBC)
        m.verbose = 0
        n = {c: m.add_var(var_type=mip.INTEGER, lb=0, ub=live[c.group]) for c in configs}
        for g in fleet.groups:
            mine = [n[c] for c in configs if c.group == g.name]
            if mine:
                m += mip.xsum(mine) <= live[g.name]
        # s scaled by the largest possible headroom keeps the coefficients near 1.
        s_max = min(total_cap[a] / d for a, d in weights.items() if d > 0)
        s = m.add_var(lb=0, ub=s_max)
        for a, d in weights.items():
            if d > 0:
                m += mip.xsum(cap(c, a) / d * n[c] for c in configs) >= s
        if stage == "headroom":
            m.objective = mip.maximize(s)
        else:
            m += s >= floor
            m.objective = mip.minimize(mip.xsum(slices(c) * n[c] for c in configs))
        # solved where a CBC abort cannot end the caller (``planner.solve_runner``)
        sol = as_linear(m).solve("cbc", 30.0, m.max_mip_gap_abs, relative_gap=m.max_mip_gap)
        if not sol.has_incumbent:
            raise PlanError(f"fleet {fleet.name}: the allocation MILP ended {sol.status}")
        counts = {c: round(sol.values[n[c].idx]) for c in configs if round(sol.values[n[c].idx]) > 0}
        return counts, float(sol.values[s.idx])

    counts, headroom = model("headroom")
    floor = headroom * (1 - 1e-9) if fleet.allocation == "balanced" else min(1.0, headroom) * (1 - 1e-9)
    counts, _ = model("slices", floor)
    if not any(d > 0 for d in demand.values()):
        headroom = math.inf
    return counts, headroom


# ---- 3 and 4: shares and node plans ---------------------------------------------------------

def _assign(fleet: Fleet, counts: dict[_Config, int], down: set[str]) -> dict[str, _Config]:
    """Concrete nodes for the configuration counts: each group's live nodes in order."""
    out: dict[str, _Config] = {}
    for g in fleet.groups:
        names = [n for n in g.node_names() if n not in down]
        mine = sorted((c for c in counts if c.group == g.name), key=lambda c: c.gpus, reverse=True)
        it = iter(names)
        for c in mine:
            for _ in range(counts[c]):
                out[next(it)] = c
    return out


def _shifted(p: Plan, offset: int) -> Plan:
    """The plan with its GPUs renumbered from ``offset``: the app's GPUs on a shared node."""
    if offset == 0 or p.layout is None:
        return p
    gpus = tuple(GpuLayout(g.gpu + offset, g.instances) for g in p.layout.gpus)
    return replace(p, layout=Layout(p.layout.gpu_model, gpus), notes=list(p.notes))


def _combined_layout(node: Node, apps: list[NodeAppPlan]) -> Layout:
    gpus: list[GpuLayout] = []
    by_gpu: dict[int, list[PlacedInstance]] = {}
    for a in apps:
        if a.plan is None or a.plan.layout is None:
            continue
        for g in a.plan.layout.gpus:
            by_gpu.setdefault(g.gpu, []).extend(g.instances)
    for i in range(node.num_gpus):
        gpus.append(GpuLayout(i, tuple(by_gpu.get(i, ()))))
    return Layout(node.gpu.name, tuple(gpus))


def plan_fleet(fleet: Fleet, *, down: set[str] | frozenset[str] = frozenset(),
               curves: FleetCurves | None = None, plan_nodes: bool = True) -> tuple[FleetPlan, FleetCurves]:
    """The fleet plan for the fleet's demands, without the nodes in ``down``.

    Returns the curves too, so a caller re-planning every bin passes them back in. With
    ``plan_nodes=False`` only the shares are computed (each node's own controller plans it).
    """
    known = {n for g in fleet.groups for n in g.node_names()}
    unknown = sorted(set(down) - known)
    if unknown:
        raise PlanError(f"fleet {fleet.name}: no node named {', '.join(unknown)}")
    curves = fleet_curves(fleet, curves)
    t0 = time.perf_counter()
    demand = {a.name: a.demand_rps for a in fleet.apps}
    live = {g.name: sum(1 for n in g.node_names() if n not in down) for g in fleet.groups}
    counts, headroom = _allocate(fleet, curves, live, demand)
    assigned = _assign(fleet, counts, set(down))
    notes: list[str] = []
    for (group, app), pts in sorted(curves.points.items()):
        for g, p in sorted(pts.items()):
            if p.status != "optimal":
                notes.append(f"{group}/{app} on {g} GPUs: the capacity solve stopped on its time limit "
                             f"({p.status}): {p.capacity_rps:.6g} rps is a lower bound")

    apps: dict[str, AppShares] = {}
    for fa in fleet.apps:
        hosts = {n: curves.points[(c.group, fa.name)][c.get(fa.name)].capacity_rps
                 for n, c in assigned.items() if c.get(fa.name)}
        cap_total = sum(hosts.values())
        planned = min(fa.demand_rps, cap_total)
        if planned < fa.demand_rps * (1 - 1e-9):
            notes.append(f"{fa.name}: demand {fa.demand_rps:g} rps is above the fleet's capacity "
                         f"{cap_total:.6g} rps: serving the maximum")
        shares = {n: c / cap_total for n, c in hosts.items()} if cap_total > 0 else {}
        apps[fa.name] = AppShares(fa.demand_rps, planned, cap_total, shares)

    node_plans: list[NodePlan] = []
    cache: dict[tuple[str, str, int, float], Plan] = {}
    profiles: dict[str, ProfileTable] = {}
    for g in fleet.groups:
        for name in g.node_names():
            if name in down:
                continue
            cfg = assigned.get(name)
            entries: list[NodeAppPlan] = []
            offset = 0
            for app_name, gpus in (cfg.gpus if cfg is not None else ()):
                point = curves.points[(g.name, app_name)][gpus]
                share = apps[app_name].planned_rps * apps[app_name].shares.get(name, 0.0)
                p = None
                if plan_nodes:
                    key = (g.name, app_name, gpus, round(share, 6))
                    if key not in cache:
                        if share >= point.capacity_rps * (1 - 1e-9):
                            cache[key] = replace(point.plan, notes=list(point.plan.notes))
                        else:
                            app = g.node.app(app_name)
                            p = plan(app, g.node.with_gpus(gpus),
                                     _profiles(g.node, _group_apps(fleet, g), profiles), share,
                                     space=fleet.space, time_limit_s=fleet.time_limit_s, solver=fleet.solver)
                            if not p.feasible or not p.instances:
                                # no plan for the share within the time limit: the capacity
                                # plan serves it (more slices than needed, never fewer)
                                p = replace(point.plan, notes=[*point.plan.notes, *p.notes])
                                notes.append(f"{g.name}/{app_name} at {share:.6g} rps: no plan within the "
                                             "time limit, serving with the capacity plan")
                            cache[key] = p
                    p = _shifted(cache[key], offset)
                entries.append(NodeAppPlan(app_name, gpus, offset, point.capacity_rps, share, p))
                offset += gpus
            np_ = NodePlan(name, g.name, g.node.gpu.name, g.node.num_gpus, {e.app: e for e in entries},
                           slices_per_gpu=g.node.gpu.compute_slices,
                           slices=g.node.slices_available if g.node.is_mixed else 0)
            if plan_nodes:
                np_.layout = _combined_layout(g.node, entries)
            node_plans.append(np_)
    feasible = all(s.planned_rps >= s.demand_rps * (1 - 1e-9) for s in apps.values())
    result = FleetPlan(fleet.name, fleet.allocation, headroom, feasible, node_plans, apps,
                       sorted(down), time.perf_counter() - t0, curves.seconds, notes)
    return result, curves


def fleet_capacity(fleet: Fleet, app: str, curves: FleetCurves) -> float:
    """The most ``app`` alone can get from the fleet: every node hosting it on all its GPUs."""
    total = 0.0
    for g in fleet.groups:
        pts = curves.points.get((g.name, app))
        if pts:
            total += g.count * pts[max(pts)].capacity_rps
    return total
