"""MPS shares of MIG instances chosen by a merge pass over a verified homogeneous plan.

Why a pass and not the MILPs: the models with shares (``jigsaw.shares``: J host instances per
share profile, slices in k-ths) count the same plans many ways, so on the 4-H100 example node
they stopped at a 60 s limit unproven where the homogeneous model (the paper's segments) proves
in seconds; and shares only pay where an instance runs far from full, which the homogeneous
plan shows directly. So the planners solve without shares, and this pure function then moves
the under-used tail of small tasks into shared instances where that frees whole slices, in
milliseconds: the plan's lanes, variants and rates stay, so it serves exactly what the proven
plan serves, on fewer slices (a node's capacity never gets worse).

The pass, per (app, task, variant) of the plan: the last ``j`` instances of its least
throughput kind are replaced by the fewest shares (``<profile>-1of<k>``, one process each, any
batch its rows have) whose planned throughput covers what the others leave of its demand, with a
latency that keeps every path of its app within the SLO. Shares of one profile sit k to a host
instance, paid whole: per share profile (every order of them tried) the options freeing the
most slices are taken first while their paths keep the SLO, and the prefix that frees the most
slices after paying its host instances is kept. The result is packed (against the running
layout, so kept instances stay) and every app's plan checked by ``verify.verify_plan``; any
failure returns None and the homogeneous plan stands.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import permutations

from jigsaw.app import App
from jigsaw.mig import MigProfile
from jigsaw.node import Node
from jigsaw.plan import Layout, Plan, PlanInstance
from jigsaw.planner.decompose import app_layout
from jigsaw.planner.packer import PackingError
from jigsaw.planner.verify import demand_and_supply, verify_plan
from jigsaw.profiles import ProfileTable

MAX_REMOVED = 2
"""At most this many instances of a (task, variant)'s tail go to shares: a task that needs more
is busy enough that its homogeneous segments serve it as well."""
_TOL = 1e-9
_WHOLE_ONLY = ("unopt", "a", "t", "at")  # search spaces of whole GPUs only (``verify``)

Factors = Mapping[str, dict[tuple[str, str, str], float] | None]
Packer = Callable[[Mapping[str, Plan]], Layout]


@dataclass(frozen=True)
class _Option:
    """One (app, task, variant)'s move: ``removed`` instances of ``kind`` for ``count`` shares."""

    app: str
    kind: PlanInstance
    removed: int
    share: PlanInstance  # the share's instance kind, count = shares added

    @property
    def freed(self) -> float:
        return self.removed * self.kind.slices


@dataclass
class Merged:
    """The pass's result: the plans with shares, their layout and the slices freed."""

    plans: dict[str, Plan]
    layout: Layout
    freed_slices: float
    note: str


def share_profiles(node: Node) -> list[MigProfile]:
    """The MIG-instance shares the node offers (``[gpus] mig_shares``)."""
    return [p for p in node.gpu.profiles if p.host]


def merge_shares(apps: Sequence[App], node: Node, profiles: ProfileTable, plans: Mapping[str, Plan],
                 pack: Packer, factors: Factors | None = None) -> Merged | None:
    """``plans`` (each app's verified homogeneous plan, all on one node) with small tasks' idle
    tails merged into shared MIG instances where that frees slices; None where nothing pays,
    the result does not pack or fails ``verify_plan`` (``plans`` then stand as they are)."""
    shares = share_profiles(node)
    by_name = {a.name: a for a in apps}
    if not shares or any(p.space in _WHOLE_ONLY or p.layout is None for p in plans.values()):
        return None
    t0 = time.perf_counter()
    options = [o for a in apps if a.name in plans
               for o in _options(a, node, profiles, plans[a.name], shares, (factors or {}).get(a.name))]
    if not options:
        return None
    best: tuple[float, list[_Option]] = (0.0, [])
    for order in permutations(shares):
        got = _choose(order, options, plans, by_name)
        if got[0] > best[0] + _TOL:
            best = got
    if not best[1]:
        return None
    merged = _applied(plans, best[1], node)
    try:
        layout = pack(merged)
    except PackingError:
        return None
    for name, p in merged.items():
        p.layout = app_layout(layout, name) if len(merged) > 1 else layout  # one app's: unlabelled
        if verify_plan(p, by_name[name], node, profiles, (factors or {}).get(name)):
            return None
    hosts = sorted({o.share.mig_profile for o in best[1]})
    note = (f"MIG-instance shares ({', '.join(hosts)}) merged over the homogeneous plan: "
            f"{best[0]:g} slices fewer, the same lanes ({(time.perf_counter() - t0) * 1e3:.0f} ms)")
    return Merged(merged, layout, best[0], note)


def _options(app: App, node: Node, profiles: ProfileTable, plan: Plan, shares: list[MigProfile],
             factors: dict[tuple[str, str, str], float] | None) -> list[_Option]:
    """Per (task, variant) of ``plan`` and share profile, its best move (most slices freed net of
    the shares' own k-ths, then the fewest shares, then the lowest latency), if it frees any."""
    demand, supply = demand_and_supply(plan, app, factors)
    util = node.planner.max_utilization
    shared = {p.name for p in shares}
    out: list[_Option] = []
    for (task, variant), have in supply.items():
        kinds = [i for i in plan.instances if (i.task, i.variant) == (task, variant) and i.count > 0]
        if not kinds or any(i.mig_profile in shared for i in kinds):
            continue
        tail = min(kinds, key=lambda i: (i.throughput_rps, i.slices))
        for s in shares:
            rows = [r for b in node.batch_sizes
                    if (r := profiles.get(variant, s.name, 1, b)) is not None
                    and r.throughput_rps > 0 and r.memory_mb <= s.memory_gb * 1024]
            best: tuple[tuple[float, int, float], _Option] | None = None
            for j in range(1, min(tail.count, MAX_REMOVED) + 1):
                deficit = demand[(task, variant)] - (have - j * tail.throughput_rps)
                if deficit <= _TOL:
                    continue  # the plan does not need them: not this pass's business
                for r in rows:
                    n = math.ceil(deficit / (r.throughput_rps * util) - 1e-9)
                    if n > s.share_of or n * s.slice_cost >= j * tail.slices - _TOL:
                        continue
                    key = (-(j * tail.slices - n * s.slice_cost), n, r.latency_ms)
                    if best is None or key < best[0]:
                        share = PlanInstance(task, variant, s.name, 1, r.batch, n, r.latency_ms,
                                             r.throughput_rps * util, s.slice_cost)
                        best = (key, _Option(app.name, tail, j, share))
            if best is not None:
                out.append(best[1])
    return out


def _choose(order: Sequence[MigProfile], options: list[_Option], plans: Mapping[str, Plan],
            apps: Mapping[str, App]) -> tuple[float, list[_Option]]:
    """The moves taken with the share profiles filled in ``order``, and the slices they free net
    of the host instances they fill (each paid whole)."""
    lat = _Latency(plans, apps)
    taken: list[_Option] = []
    keys: set[tuple[str, str, str]] = set()
    saved = 0.0
    for s in order:
        host_slices = s.compute_slices
        mine = sorted((o for o in options if o.share.mig_profile == s.name
                       and (o.app, o.kind.task, o.kind.variant) not in keys),
                      key=lambda o: (-o.freed, o.share.count, o.app, o.kind.task, o.kind.variant))
        run: list[_Option] = []
        best = (0.0, 0)  # (saving, prefix length)
        n = 0
        freed = 0.0
        for o in mine:
            if not lat.fits(o):
                continue
            lat.take(o)
            run.append(o)
            n += o.share.count
            freed += o.freed
            gain = freed - math.ceil(n / s.share_of) * host_slices
            if gain > best[0] + _TOL:
                best = (gain, len(run))
        for o in run[best[1]:]:
            lat.drop(o)
        taken += run[:best[1]]
        keys |= {(o.app, o.kind.task, o.kind.variant) for o in run[:best[1]]}
        saved += best[0]
    return saved, taken


class _Latency:
    """Each app's task latencies (the worst instance of each task) as moves are taken, and the
    SLO check of its paths (``verify``'s rule: twice each task's worst along every path)."""

    def __init__(self, plans: Mapping[str, Plan], apps: Mapping[str, App]) -> None:
        self.apps = apps
        self.kinds: dict[str, dict[tuple[str, str, str, int, int], tuple[float, int]]] = {}
        for name, p in plans.items():
            self.kinds[name] = {}
            for i in p.instances:
                self._add(name, i, i.count)

    def _add(self, app: str, i: PlanInstance, count: int) -> None:
        kinds = self.kinds[app]
        key = (i.task, i.variant, i.mig_profile, i.mps, i.max_batch)
        lat, n = kinds.get(key, (i.latency_ms, 0))
        kinds[key] = (lat, n + count)

    def _worst(self, app: str) -> dict[str, float]:
        worst: dict[str, float] = {}
        for (task, *_), (lat, n) in self.kinds[app].items():
            if n > 0:
                worst[task] = max(worst.get(task, 0.0), lat)
        return worst

    def take(self, o: _Option) -> None:
        self._add(o.app, o.kind, -o.removed)
        self._add(o.app, o.share, o.share.count)

    def drop(self, o: _Option) -> None:
        self._add(o.app, o.share, -o.share.count)
        self._add(o.app, o.kind, o.removed)

    def fits(self, o: _Option) -> bool:
        self.take(o)
        worst = self._worst(o.app)
        self.drop(o)
        app = self.apps[o.app]
        return all(sum(2 * worst.get(t, 0.0) for t in path) <= app.latency_slo_ms * (1 + 1e-6)
                   for path in app.paths if o.kind.task in path)


def _applied(plans: Mapping[str, Plan], moves: list[_Option], node: Node) -> dict[str, Plan]:
    """Copies of ``plans`` with ``moves`` made: instance counts, slices and objective (the lanes,
    accuracy and rates as they were; layout to be packed)."""
    out: dict[str, Plan] = {}
    for name, p in plans.items():
        mine = [o for o in moves if o.app == name]
        if not mine:
            out[name] = replace(p, instances=list(p.instances), notes=list(p.notes))
            continue
        counts: dict[PlanInstance, int] = {i: i.count for i in p.instances}
        for o in mine:
            counts[o.kind] -= o.removed
            same = next((i for i in counts if replace(i, count=0) == replace(o.share, count=0)), None)
            if same is not None:
                counts[same] += o.share.count
            else:
                counts[o.share] = o.share.count
        instances = [replace(i, count=n) for i, n in counts.items() if n > 0]
        slices = sum(i.count * i.slices for i in instances)
        freed = p.slices_used - slices
        slices_used = int(slices) if float(slices).is_integer() else slices
        out[name] = replace(p, instances=instances, slices_used=slices_used,
                            objective=p.objective + node.beta * freed if math.isfinite(p.objective)
                            else p.objective, notes=list(p.notes))
    return out
