"""The planner's columns: every (task, variant, segment type, max batch) that may run, pruned.

Pruning is exact: a column is dropped only when no optimal plan needs it.
1. search space: only allowed variants (A) and segment types (S);
2. latency: 2 * L > the latency budget (the SLO, or the task's static budget when T is off);
3. memory: ``mps`` copies of the model with their batch activations exceed the MIG instance;
4. dominance: the model sees a column only through its latency L, throughput H, slice cost and
   MIG profile; a column is dropped when another column of the same (task, variant) has
   L' <= L and H' >= H on a MIG profile that places at least as easily at no higher cost
   (fewer or equal slices, a subset of the slots, a superset of the starts).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from jigsaw.app import App
from jigsaw.gpu_groups import SEP
from jigsaw.mig import MigProfile
from jigsaw.node import Node
from jigsaw.profiles import ProfileTable
from jigsaw.spaces import SearchSpace


@dataclass(frozen=True)
class Column:
    task: str
    variant: str
    mig_profile: str
    mps: int
    batch: int
    latency_ms: float
    throughput_rps: float  # the profile's, times the node's planner.max_utilization
    slices: float  # compute slices it costs: a MIG share's a k-th of its instance's

    @property
    def key(self) -> tuple[str, str, str, int, int]:
        return (self.task, self.variant, self.mig_profile, self.mps, self.batch)


@dataclass(frozen=True)
class Budgets:
    """Static per-task budgets of the task-graph-uninformed spaces (paper appendix B)."""

    latency_ms: dict[str, float]  # bound on 2 * L(t) for every column of task t
    slices: dict[str, int]  # bound on the slices task t may use


@dataclass(frozen=True)
class ColumnSet:
    columns: tuple[Column, ...]
    num_candidates: int  # before any pruning
    num_after_latency: int
    num_after_memory: int
    budgets: Budgets | None


def allowed_variants(app: App, space: SearchSpace) -> dict[str, tuple[str, ...]]:
    if space.accuracy_scaling:
        return {t.name: tuple(v.name for v in t.variants) for t in app.tasks}
    return {t.name: (t.best.name,) for t in app.tasks}


def allowed_segments(node: Node, space: SearchSpace) -> list[tuple[MigProfile, int]]:
    if space.spatial:
        return [(s.mig, s.mps) for s in node.segment_types]
    whole = node.gpu.whole_gpu_profile
    return [(whole, 1)]


def places_as_easily(p: MigProfile, q: MigProfile) -> bool:
    """Any valid layout using q stays valid with p in its place (at no higher slice cost); never
    across GPU groups (``jigsaw.gpu_groups``: a profile lies only on its own group's GPUs)."""
    return (p.compute_slices <= q.compute_slices and p.size <= q.size
            and set(q.starts) <= set(p.starts) and p.max_per_gpu >= q.max_per_gpu
            and p.name.rpartition(SEP)[0] == q.name.rpartition(SEP)[0])


def _raw_columns(app: App, node: Node, profiles: ProfileTable, space: SearchSpace
                 ) -> tuple[list[tuple[Column, float]], int]:
    variants = allowed_variants(app, space)
    segments = allowed_segments(node, space)
    out: list[tuple[Column, float]] = []
    for task in app.tasks:
        for v in variants[task.name]:
            for mig, mps in segments:
                for b in node.batch_sizes:
                    row = profiles.get(v, mig.name, mps, b)
                    if row is None:
                        continue
                    col = Column(task.name, v, mig.name, mps, b, row.latency_ms,
                                 row.throughput_rps * node.planner.max_utilization, mig.slice_cost)
                    fits = mps * row.memory_mb <= mig.memory_gb * 1024.0
                    out.append((col, 1.0 if fits else 0.0))
    return out, len(out)


def static_budgets(app: App, node: Node, profiles: ProfileTable, space: SearchSpace,
                   factors: dict[tuple[str, str, str], float] | None = None) -> Budgets:
    """Appendix B: split the SLO and the slices among tasks by the most accurate variants' needs.

    Latency: on each path, the SLO is split in the ratio of each task's highest latency (of
    its most accurate variant, over the segments and batches the space allows and the SLO
    admits); a task on several paths takes its smallest share. Slices: each task's expected
    demand (factors of the most accurate variants) over the best throughput per slice of its
    most accurate variant, the node's slices divided in that ratio.
    """
    slo = app.latency_slo_ms
    best_cols: dict[str, list[Column]] = defaultdict(list)
    raw, _ = _raw_columns(app, node, profiles, space)
    for col, fits in raw:
        if fits and col.variant == app.task(col.task).best.name and 2 * col.latency_ms <= slo:
            best_cols[col.task].append(col)
    lat_max = {t: max((c.latency_ms for c in best_cols[t]), default=slo / 2) for t in app.task_names}
    latency_ms: dict[str, float] = {}
    for p in app.paths:
        total = sum(lat_max[t] for t in p)
        for t in p:
            share = slo * lat_max[t] / total
            latency_ms[t] = min(latency_ms.get(t, share), share)
    demand = app.multipliers(app.best_lane, factors)
    need: dict[str, float] = {}
    for t in app.task_names:
        cols = best_cols[t]
        if not cols:
            need[t] = 1.0
            continue
        best = max(cols, key=lambda c: (c.throughput_rps, -c.slices))
        need[t] = demand[t] / best.throughput_rps * best.slices
    # Whole instances: every task gets one of the smallest instance the space allows, the rest
    # is divided in proportion to need by largest remainder (plain flooring starves small tasks).
    unit = min((mig.compute_slices for mig, _ in allowed_segments(node, space)), default=1)
    units = node.slices_available // unit
    tasks = list(app.task_names)
    given = {t: 1 if units >= len(tasks) else 0 for t in tasks}
    spare = units - sum(given.values())
    total_need = sum(need.values()) or 1.0
    share = {t: spare * need[t] / total_need for t in tasks}
    for t in tasks:
        given[t] += int(share[t])
    left = units - sum(given.values())
    for t in sorted(tasks, key=lambda t: share[t] - int(share[t]), reverse=True)[:max(0, left)]:
        given[t] += 1
    slices = {t: given[t] * unit for t in tasks}
    return Budgets(latency_ms, slices)


def build_columns(app: App, node: Node, profiles: ProfileTable, space: SearchSpace,
                  factors: dict[tuple[str, str, str], float] | None = None) -> ColumnSet:
    budgets = None if space.task_graph else static_budgets(app, node, profiles, space, factors)
    raw, num_candidates = _raw_columns(app, node, profiles, space)

    def latency_ok(c: Column) -> bool:
        bound = budgets.latency_ms[c.task] if budgets else app.latency_slo_ms
        return 2 * c.latency_ms <= bound + 1e-9

    after_latency = [(c, fits) for c, fits in raw if latency_ok(c)]
    after_memory = [c for c, fits in after_latency if fits]

    mig = {p.name: p for p in node.gpu.profiles}
    groups: dict[tuple[str, str], list[Column]] = defaultdict(list)
    for c in after_memory:
        groups[(c.task, c.variant)].append(c)
    kept: list[Column] = []
    for cols in groups.values():
        # Sorting makes the survivor of an exact tie the cheapest, simplest column.
        cols.sort(key=lambda c: (c.slices, mig[c.mig_profile].size, c.latency_ms,
                                 -c.throughput_rps, c.mps, c.batch))
        survivors: list[Column] = []
        for c in cols:
            q = mig[c.mig_profile]
            dominated = any(
                s.latency_ms <= c.latency_ms and s.throughput_rps >= c.throughput_rps
                and places_as_easily(mig[s.mig_profile], q)
                for s in survivors
            )
            if not dominated:
                survivors = [s for s in survivors if not (
                    c.latency_ms <= s.latency_ms and c.throughput_rps >= s.throughput_rps
                    and places_as_easily(q, mig[s.mig_profile]))]
                survivors.append(c)
        kept.extend(survivors)
    kept.sort(key=lambda c: (app.task_names.index(c.task), c.variant, c.slices, c.mig_profile,
                             c.mps, c.batch))
    return ColumnSet(tuple(kept), num_candidates, len(after_latency), len(after_memory), budgets)
