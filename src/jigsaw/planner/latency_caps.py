"""Fewest slices for fixed lane rates, over every split of the latency SLO among the tasks.

Where the latency-relaxed core's optimum does not lift (its columns need more latency than the
paths allow), its bound is often already tight: what is missing is an incumbent. The optimum
then usually keeps the core's lane mix but takes, per group, a column a few percent slower in
throughput and several times faster (a smaller batch), so the paths fit. With the lane rates
fixed the problem separates per task: for a latency cap ``L`` on task t, the fewest slices
that cover each variant's demand with columns no slower than ``L`` is a tiny covering knapsack
over the MIG profiles (``cover``), a step function of ``L``. The caps then combine under the
path constraints by enumeration over each task's few Pareto points (cap, slices). The plans
come out in order of slices; they meet the SLOs by construction, but MIG placement is not
modelled here: callers pack them (``packer.pack``) and check them (``verify.verify_plan``).

Pure and fast (milliseconds on the example apps): the anytime planner and the exact solve's
incumbent search both use it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from jigsaw.mig import NUM_PLACEMENT_SLOTS
from jigsaw.planner.columns import Column
from jigsaw.planner.problem import Problem

_COVER_TOL = 1e-9


@dataclass(frozen=True)
class CapPlan:
    """Instances for fixed lane rates: per task its latency cap, the instances, their slices."""

    slices: int
    caps_ms: dict[str, float]
    chosen: tuple[tuple[Column, int], ...]


def lane_demand(pb: Problem, lanes: dict[int, float]) -> dict[tuple[str, str], float]:
    """Per (task, variant): the rate ``lanes`` (lane index -> root rate) send it."""
    out: dict[tuple[str, str], float] = defaultdict(float)
    for li, x in lanes.items():
        if x <= 0:
            continue
        for k, t in enumerate(pb.app.task_names):
            m = pb.lane_mult[li][t]
            if m > 0:
                out[(t, pb.lanes[li][k])] += x * m
    return dict(out)


def cover(best: dict[str, Column], demand: float, max_cost: int, cost: dict[str, int]
           ) -> tuple[int, list[tuple[Column, int]]] | None:
    """The cheapest multiset of ``best`` (one column per MIG profile) whose throughput covers
    ``demand``, each instance costing ``cost[profile]``: an unbounded knapsack over costs
    (None if ``max_cost`` does not suffice). Returns the cost and the instances."""
    items = list(best.values())
    weights = [cost[c.mig_profile] for c in items]
    gains = [c.throughput_rps for c in items]
    wg = list(zip(range(len(items)), weights, gains))
    top = [0.0] * (max_cost + 1)
    pick: list[int] = [-1] * (max_cost + 1)
    need = demand * (1 - _COVER_TOL)
    for s in range(1, max_cost + 1):
        t, p = top[s - 1], -1
        for k, w, g in wg:
            if w <= s and top[s - w] + g > t:
                t = top[s - w] + g
                p = k
        top[s], pick[s] = t, p
        if t >= need:
            counts: dict[int, int] = defaultdict(int)
            r = s
            while r > 0:
                if pick[r] < 0:
                    r -= 1
                    continue
                counts[pick[r]] += 1
                r -= weights[pick[r]]
            return s, [(items[k], n) for k, n in counts.items()]
    return None


def _task_frontier(pb: Problem, task: str, demand: dict[str, float], cap_max: float,
                   max_cost: int, cost: dict[str, int]
                   ) -> list[tuple[float, int, list[tuple[Column, int]]]]:
    """Per task: the Pareto points (latency cap, least cost, instances), cap ascending and
    cost strictly falling: each cap is the smallest column latency giving that cost."""
    key = ("cap_events", task, tuple(sorted(demand)), cap_max)
    events = pb.derived.get(key)
    if events is None:
        events = pb.derived[key] = _events(pb, task, set(demand), cap_max)
    if not events:
        return []
    best: dict[str, dict[str, Column]] = defaultdict(dict)
    per_variant: dict[str, tuple[int, list[tuple[Column, int]]] | None] = {v: None for v in demand}
    out: list[tuple[float, int, list[tuple[Column, int]]]] = []
    i = 0
    while i < len(events):
        lat = events[i][0]
        changed = set()
        while i < len(events) and events[i][0] <= lat + 1e-9:
            _, v, prof, c = events[i]
            best[v][prof] = c
            changed.add(v)
            i += 1
        for v in changed:
            per_variant[v] = cover(best[v], demand[v], max_cost, cost)
        if any(x is None for x in per_variant.values()):
            continue
        total = sum(x[0] for x in per_variant.values() if x is not None)
        if not out or total < out[-1][1]:
            out.append((lat, total, [ci for x in per_variant.values() if x is not None for ci in x[1]]))
    return out


def _events(pb: Problem, task: str, variants: set[str], cap_max: float
            ) -> list[tuple[float, str, str, Column]]:
    """The latencies (up to ``cap_max``) at which some (variant, MIG profile) group's best
    throughput rises, ascending: the only caps that matter; empty when a variant has no column.
    Independent of the demand, so kept per problem (``Problem.derived``)."""
    groups: dict[tuple[str, str], list[Column]] = defaultdict(list)
    for c in pb.colset.columns:
        if c.task == task and c.variant in variants and c.latency_ms <= cap_max + 1e-9:
            groups[(c.variant, c.mig_profile)].append(c)
    if variants - {v for v, _ in groups}:
        return []
    events: list[tuple[float, str, str, Column]] = []
    for (v, prof), cols in groups.items():
        top = 0.0
        for c in sorted(cols, key=lambda x: (x.latency_ms, -x.throughput_rps)):
            if c.throughput_rps > top:
                top = c.throughput_rps
                events.append((c.latency_ms, v, prof, c))
    events.sort(key=lambda e: e[0])
    return events


def cap_plans(pb: Problem, lanes: dict[int, float], *, max_slices: int | None = None,
              extra: int = 2, limit: int = 8) -> list[CapPlan]:
    """Up to ``limit`` instance sets serving ``lanes``, fewest slices first, each within latency
    caps that meet every path and within the node's slices and MIG placement slots in total.

    Two costs are tried: slices (at most ``extra`` above the fewest), and placement slots
    (memory slices; where slices are cheap but the GPUs' slots bind, e.g. many 3g instances).
    """
    node = pb.node
    budget = node.slices_available if max_slices is None else min(max_slices, node.slices_available)
    size = {p.name: p.size for p in node.gpu.profiles}
    slices_of = {p.name: p.compute_slices for p in node.gpu.profiles}
    slot_budget = node.num_gpus * NUM_PLACEMENT_SLOTS
    out: dict[tuple[tuple[str, int, int], ...], CapPlan] = {}
    for cost, cap_cost in ((slices_of, budget), (size, slot_budget)):
        for cp in _cheapest(pb, lanes, cost, cap_cost, extra, limit):
            used = sum(slices_of[c.mig_profile] * n for c, n in cp.chosen)
            slots = sum(size[c.mig_profile] * n for c, n in cp.chosen)
            if used > budget or slots > slot_budget:
                continue
            key = tuple(sorted((c.key[0] + c.key[1] + c.key[2], c.key[3] * 1000 + c.key[4], n)
                               for c, n in cp.chosen))
            out.setdefault(key, CapPlan(used, cp.caps_ms, cp.chosen))
    return sorted(out.values(), key=lambda cp: cp.slices)[:limit]


def _cheapest(pb: Problem, lanes: dict[int, float], cost: dict[str, int], budget: int,
              extra: int, limit: int) -> list[CapPlan]:
    """``cap_plans`` for one cost (per MIG profile): the cheapest instance sets, at most
    ``extra`` above the least, their ``slices`` field holding that cost."""
    app = pb.app
    demand = lane_demand(pb, lanes)
    fastest = pb.derived.get(("fastest",))
    if fastest is None:
        fastest = pb.derived[("fastest",)] = {
            t: min((c.latency_ms for c in pb.colset.columns if c.task == t), default=math.inf)
            for t in app.task_names}
    half = app.latency_slo_ms / 2
    frontier: dict[str, list[tuple[float, int, list[tuple[Column, int]]]]] = {}
    for t in app.task_names:
        dt = {v: d for (tt, v), d in demand.items() if tt == t and d > 0}
        if not dt:
            frontier[t] = [(0.0, 0, [])]
            continue
        cap = min((half - sum(fastest[u] for u in p if u != t) for p in app.paths if t in p),
                  default=half)
        frontier[t] = _task_frontier(pb, t, dt, cap, budget, cost)
        if not frontier[t]:
            return []
    tasks = sorted(app.task_names, key=lambda t: len(frontier[t]))
    floor_after = [0] * (len(tasks) + 1)
    for k in range(len(tasks) - 1, -1, -1):
        floor_after[k] = floor_after[k + 1] + frontier[tasks[k]][-1][1]
    if floor_after[0] > budget:
        return []
    paths = app.paths
    lat_floor = {t: frontier[t][0][0] for t in tasks}
    found: list[tuple[int, float, dict[str, int]]] = []
    bound = min(budget, floor_after[0] + extra)

    def walk(k: int, pick: dict[str, int], spent: int) -> None:
        if k == len(tasks):
            caps = {t: frontier[t][pick[t]][0] for t in tasks}
            slack = min(half - sum(caps[t] for t in p) for p in paths)
            found.append((spent, -slack, dict(pick)))
            return
        t = tasks[k]
        for idx in range(len(frontier[t]) - 1, -1, -1):  # cheapest first
            _, c, _ = frontier[t][idx]
            if spent + c + floor_after[k + 1] > bound:
                continue
            pick[t] = idx
            if all(sum(frontier[u][pick[u]][0] if u in pick else lat_floor[u] for u in p)
                   <= half + 1e-9 for p in paths):
                walk(k + 1, pick, spent + c)
            del pick[t]

    walk(0, {}, 0)
    found.sort(key=lambda x: (x[0], x[1]))
    return [CapPlan(spent, {t: frontier[t][pick[t]][0] for t in tasks},
                    tuple(ci for t in tasks for ci in frontier[t][pick[t]][2]))
            for spent, _, pick in found[:limit]]


def lanes_of(pb: Problem, rates: list[float], total: float) -> dict[int, float]:
    """Lane index -> rate, the solver's lane values cleaned (negligible ones dropped) and
    rescaled to sum to ``total``."""
    lam = {li: x for li, x in enumerate(rates) if x > 1e-9 * max(1.0, total)}
    s = sum(lam.values())
    if s <= 0:
        return {}
    return {li: x * total / s for li, x in lam.items()}

