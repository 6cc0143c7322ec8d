"""Lane shift: the lane a request takes when the plan's draw would put it behind a backlog.

A plan splits an app's demand over lanes (one variant per task each) in proportion to their
planned rates; the dispatcher draws a lane with those weights. When arrivals outrun the plan
(a burst inside a bin, before the controller's re-plan is in place) the drawn lane's queues
grow while another lane of the same running plan, often a faster variant, may still have room.
Re-planning takes seconds; this rule acts on the next request, on the frontend alone.

The rule (two choices, as Ray Serve's power-of-two-choices on queue length): the request's first
choice is the plan's weighted draw; its second is the lane whose backlog plus fastest path ends
soonest. A lane's backlog is, along each path of the app, the sum over its tasks of the items queued
at the processes of the lane's variant (the root rings, and each process's batch queue and running
batch from the stats block) divided by what those processes finish per second at their largest
batch, the slowest path counting. The request keeps its drawn lane while that backlog is within
``SHIFT_SHARE`` of the time the SLO leaves after the lane's fastest path; beyond it, it takes the
second choice when that ends sooner. Dividing by each lane's own processes' rate bounds the shift by
the capacity the plan gave each lane: a lane that takes more than it can finish builds its own
backlog and stops being chosen. Switch: ``[server] lane_shift``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from jigsaw.runtime import stats as st
from jigsaw.runtime.topology import AppRoutes, ProcessSpec, Topology

SHIFT_SHARE = 0.25  # of the SLO's slack after the fastest path: a backlog beyond it shifts the request


@dataclass(frozen=True)
class Stage:
    """The processes of one task's variant in a lane, and what they finish per second (wall)."""

    slots: tuple[int, ...]
    items_per_s: float


@dataclass(frozen=True)
class LaneShape:
    """Per lane: the stages of each path of the app (``lanes[l][path] -> stages``), whether every
    root task of the lane has processes (a lane the plan gave no rate may run none), and the least
    time its slowest path takes."""

    lanes: list[list[list[Stage]]]
    runs: list[bool]
    min_path_s: list[float]  # per lane: its slowest path's fastest batch-1 time (wall seconds)


def _items_per_s(p: ProcessSpec) -> float:
    """What one process finishes per wall second at its largest batch (its profile, x time scale)."""
    b = p.max_batch
    ms = p.mean_ms_by_batch.get(b)
    if ms is not None and ms > 0:
        return 1000.0 * b / (ms * p.time_scale)
    ns = p.exec_estimate_ns[b - 1] if len(p.exec_estimate_ns) >= b else 0
    return 1e9 * b / ns if ns > 0 else 0.0


def lane_shape(topology: Topology, routes: AppRoutes, min_path_ns: list[int]) -> LaneShape:
    """The stages of every lane of ``routes`` from the generation's process specs."""
    by_variant: dict[tuple[str, str], list[ProcessSpec]] = {}
    for p in topology.processes:
        if p.app == routes.app.name:
            by_variant.setdefault((p.task, p.variant), []).append(p)
    lanes, runs = [], []
    for lane in routes.lanes:
        runs.append(all(by_variant.get((t, lane.get(t, ""))) for t in routes.app.roots))
        paths = []
        for path in routes.app.paths:
            stages = []
            for task in path:
                procs = by_variant.get((task, lane.get(task, "")), [])
                if procs:
                    stages.append(Stage(tuple(p.slot for p in procs), sum(_items_per_s(p) for p in procs)))
            paths.append(stages)
        lanes.append(paths)
    return LaneShape(lanes, runs, [ns / 1e9 for ns in min_path_ns])


def backlog_s(shape: LaneShape, lane: int, queued: Callable[[int], int]) -> float:
    """Seconds of queued work ahead of a new request of ``lane`` (its slowest path)."""
    worst = 0.0
    for stages in shape.lanes[lane]:
        total = 0.0
        for s in stages:
            if s.items_per_s > 0:
                total += sum(queued(slot) for slot in s.slots) / s.items_per_s
        worst = max(worst, total)
    return worst


def choose_lane(drawn: int, shape: LaneShape, queued: Callable[[int], int], state: Callable[[int], int],
                budget_s: float) -> int:
    """The lane a request takes: ``drawn`` (the plan's draw) unless its backlog is past its share
    of the SLO and another lane with live processes ends sooner (see the module docstring)."""
    n = len(shape.lanes)
    if n < 2 or drawn >= n:
        return drawn
    wait = backlog_s(shape, drawn, queued)
    if wait <= SHIFT_SHARE * max(0.0, budget_s - _path_s(shape, drawn)):
        return drawn
    best, best_end = drawn, wait + _path_s(shape, drawn)
    for lane in range(n):
        if lane == drawn or not shape.runs[lane] or not _live(shape, lane, state):
            continue
        end = backlog_s(shape, lane, queued) + _path_s(shape, lane)
        if end < best_end:
            best, best_end = lane, end
    return best


def _path_s(shape: LaneShape, lane: int) -> float:
    """The lane's fastest path end to end, seconds (0 when unknown)."""
    return shape.min_path_s[lane] if lane < len(shape.min_path_s) else 0.0


def _live(shape: LaneShape, lane: int, state: Callable[[int], int]) -> bool:
    """Every stage of the lane has a process that is not dead or failed."""
    return all(any(state(slot) not in (st.DEAD, st.FAILED) for slot in s.slots)
               for stages in shape.lanes[lane] for s in stages)


def soonest_end_s(shape: LaneShape, queued: Callable[[int], int], state: Callable[[int], int],
                  weights: list[float], any_lane: bool) -> float | None:
    """Seconds until a new request would finish: its lane's backlog plus fastest path, on the lane
    that ends soonest among those it may take (``any_lane``: every lane with live processes, as a
    lane shift may take any; else the lanes the plan's draw gives a rate, the latest of them
    counting, as the draw may give any). None when no such lane runs."""
    ends = []
    for lane in range(len(shape.lanes)):
        if not shape.runs[lane] or not _live(shape, lane, state):
            continue
        if not any_lane and (lane >= len(weights) or weights[lane] <= 0):
            continue
        ends.append(backlog_s(shape, lane, queued) + _path_s(shape, lane))
    if not ends:
        return None
    return min(ends) if any_lane else max(ends)
