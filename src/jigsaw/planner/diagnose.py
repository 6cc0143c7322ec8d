"""Why a plan serves nothing: the first reason found, in the words of the node and app files.

Checked in the order a user can act on: a task that found no segment (no profile rows, none
within the latency budget, none fitting the segment's memory), a path whose fastest segments
are over the SLO, no lane of segments within the accuracy SLO, more segments than the node
holds (the tasks' cheapest segments together, one each). Pure, over the planner's ``Problem``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from jigsaw.planner.columns import Column, allowed_segments, allowed_variants
from jigsaw.planner.problem import Problem


def _task_reason(pb: Problem, task: str) -> str:
    """Why ``task`` has no column (called only when it has none)."""
    node, app, profiles = pb.node, pb.app, pb.profiles
    variants = allowed_variants(app, pb.space)[task]
    segments = allowed_segments(node, pb.space)
    rows = [(v, mig, k, b, r) for v in variants for mig, k in segments for b in node.batch_sizes
            if profiles is not None and (r := profiles.get(v, mig.name, k, b)) is not None]
    names = ", ".join(sorted({f"{mig.name}x{k}" for mig, k in segments}))
    if not rows:
        return (f"task {task!r} found no segment: no profile rows of {', '.join(variants)} on "
                f"{names} at batch sizes {list(node.batch_sizes)} (jigsaw profile / jigsaw modeled)")
    budget = pb.colset.budgets.latency_ms[task] if pb.colset.budgets else app.latency_slo_ms
    fast = [x for x in rows if 2 * x[4].latency_ms <= budget + 1e-9]
    if not fast:
        best = min(rows, key=lambda x: x[4].latency_ms)
        return (f"task {task!r} found no segment: its fastest, {best[0]} on {best[1].name}x{best[2]} "
                f"at batch {best[3]}, takes 2 x {best[4].latency_ms:.1f} ms > its latency budget "
                f"{budget:g} ms")
    small = min(fast, key=lambda x: x[2] * x[4].memory_mb / (x[1].memory_gb * 1024))
    v, mig, k, b, r = small
    return (f"task {task!r} found no segment: every one within its latency budget lacks memory, "
            f"e.g. {k} x {r.memory_mb:.0f} MB of {v} at batch {b} > {mig.name}'s "
            f"{mig.memory_gb * 1024:.0f} MB")


def _path_reason(pb: Problem, cols: dict[str, list[Column]]) -> str:
    for path in pb.app.paths:
        total = sum(2 * min(c.latency_ms for c in cols[t]) for t in path)
        if total > pb.app.latency_slo_ms * (1 + 1e-9):
            return (f"path {' -> '.join(path)}: its fastest segments take 2 x latencies = "
                    f"{total:.1f} ms > the SLO {pb.app.latency_slo_ms:g} ms")
    return ""


def _accuracy_reason(pb: Problem, cols: dict[str, list[Column]]) -> str:
    have = {(c.task, c.variant) for cs in cols.values() for c in cs}
    tasks = pb.app.task_names
    ok = [acc for lane, acc in zip(pb.lanes, pb.lane_acc, strict=True)
          if all((t, v) in have for t, v in zip(tasks, lane, strict=True))]
    slo = pb.node.planner.accuracy_slo
    if ok and max(ok) + 1e-12 < slo:
        return (f"the most accurate lane with a segment for every task reaches {max(ok):.3f} of the "
                f"best accuracy < planner.accuracy_slo {slo:g}")
    if not ok:
        return "no lane has a segment for every task"
    return ""


def _room_reason(pb: Problem, cols: dict[str, list[Column]]) -> str:
    need = sum(min(c.slices for c in cols[t]) for t in pb.app.task_names)
    have = pb.node.slices_available
    if need <= have:
        return ""
    gpu = pb.node.gpu
    hint = ""
    if not gpu.mig and gpu.kind == "gpu" and not any(p.share_of for p in gpu.profiles):
        hint = (" (a whole GPU without MPS shares holds one task: give [gpus] mps_shares = 2, 4 or 8, "
                "with that MPS level in mps_levels)")
    return (f"the {len(pb.app.task_names)} tasks need one segment each, {need} slices at the "
            f"cheapest, and the node has {have}{hint}")


def why_unserved(pb: Problem) -> str:
    """The first reason the app of ``pb`` cannot be served at any demand ("" when none of these
    holds: then the segments exist but no layout or combination of them serves it)."""
    cols: dict[str, list[Column]] = defaultdict(list)
    for c in pb.colset.columns:
        cols[c.task].append(c)
    for t in pb.app.task_names:
        if not cols[t]:
            return _task_reason(pb, t)
    return _path_reason(pb, cols) or _accuracy_reason(pb, cols) or _room_reason(pb, cols)


def why_none_together(problems: Sequence[Problem]) -> str:
    """Why the apps of ``problems`` cannot be served together: each app's own reason, else the
    node's room for one segment per task of every app."""
    own = [f"{pb.app.name}: {why}" for pb in problems if (why := why_unserved(pb))]
    if own:
        return "; ".join(own)
    if not problems:
        return ""
    need = sum(min((c.slices for c in pb.colset.columns if c.task == t), default=0)
               for pb in problems for t in pb.app.task_names)
    have = problems[0].node.slices_available
    if need > have:
        return (f"the apps' tasks need one segment each, {need} slices at the cheapest, and the node "
                f"has {have}")
    return ""
