"""Admission: how many requests an app may have in flight, and the per-bin counts of the door.

An app admits what its root instances finish within the latency SLO (``admission_limit``; with
``server.admission_bottleneck``, what its bottleneck task finishes, ``bottleneck_rps``), scaled
by the share of its root processes that are up, and at most ``server.max_queue``; beyond that a
request is shed with 503 at once, unless (``server.admission_backlog``) the work queued ahead of
it on the processes it would take leaves time for its deadline (``queue_admits``). The same
object counts, per app and bin, the arrivals, answers and SLO violations the controller reads
(``take_bin``), and the measured fan-out of each upstream variant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from jigsaw.runtime import stats as st
from jigsaw.runtime.topology import AppRoutes


@dataclass
class BinCounters:
    """What the controller reads per app and bin: arrivals, answers, SLO violations, fan-out."""

    arrivals: int = 0
    answered: int = 0
    violations: int = 0  # 504 (dropped or deadline passed) and 503 shed answers
    # (task, variant) -> [items finished, children spawned]: the measured multiplicative factor
    children: dict[tuple[str, str], list[int]] = field(default_factory=dict)


def bottleneck_rps(routes: AppRoutes) -> float | None:
    """The request rate the plan's instances carry at the lanes' planned mix: the least, over each
    (task, variant), of its instances' throughput over the items that mix brings it per request.
    None when the plan has no lane with a rate."""
    total = sum(routes.lane_weights)
    if total <= 0 or not routes.lanes:
        return None
    need: dict[tuple[str, str], float] = {}  # items per request, at the mix
    for lane, weight in zip(routes.lanes, routes.lane_weights, strict=True):
        for task, items in routes.app.multipliers(tuple(lane[t] for t in routes.app.task_names)).items():
            key = (task, lane[task])
            need[key] = need.get(key, 0.0) + weight / total * items
    have: dict[tuple[str, str], float] = {}
    for i in routes.plan.instances:
        have[(i.task, i.variant)] = have.get((i.task, i.variant), 0.0) + i.count * i.throughput_rps
    return min((have.get(k, 0.0) / n for k, n in need.items() if n > 0), default=None)


def admission_limit(routes: AppRoutes) -> int:
    """Requests an app may have in flight: what its root instances finish within the latency SLO.

    Little's law: capacity (req/s) x the SLO's share a request may spend in flight behind the
    root's own batch (s). Beyond it a new request would
    queue behind work that already fills the SLO and be answered late or dropped, after taking
    its share of the queue from requests that could still make it: shedding it at the door (503)
    keeps goodput near the capacity under overload.
    """
    app = routes.app
    capacities = []
    for root in app.roots:
        cap = sum(i.count * i.throughput_rps for i in routes.plan.instances if i.task == root)
        capacities.append(cap)
    capacity_rps = min(capacities) if capacities else 0.0
    if routes.admission_bottleneck and (bottleneck := bottleneck_rps(routes)) is not None:
        capacity_rps = min(capacity_rps, bottleneck)
    # A request in flight is in the root's queue or batch, or past the root (in the tasks after it,
    # where it delays no new arrival at the root). The root's queue may use what the SLO leaves
    # after the root's batch; a request past the root stays there at most the SLO's rest. So the
    # SLO less the root's batch, not less the whole path's: with the path's sum, an app whose
    # later tasks take most of the SLO (traffic_analysis under st: 58 + 188 ms of 650) shed 503s
    # at its own planned rate, every request in the later tasks counted as queued at the root.
    root_ms = max((routes.plan.task_latency_ms.get(path[0], 0.0) for path in app.paths), default=0.0)
    queue_ms = max(app.latency_slo_ms - root_ms, 0.25 * app.latency_slo_ms)
    return max(1, math.ceil(capacity_rps * queue_ms / 1000.0))


QUEUE_ADMIT_SHARE = 0.75  # of a request's deadline: the queued work plus fastest path it may face


def queue_admits(end_s: float | None, budget_s: float) -> bool:
    """Whether a request over the in-flight limit is admitted all the same: the work queued ahead
    of it on the lane it would take plus that lane's fastest path (``end_s``, wall seconds,
    ``RoutingTable.queued_end_s``; None when unknown) is within ``QUEUE_ADMIT_SHARE`` of its
    deadline (``budget_s``).

    Why: the limit is an estimate of the queue from a count, and the count sheds requests that
    would have met their deadline: it counts a request past the root as queued, a kept process's
    backlog of an older generation not at all, a re-sent one twice as long. A 503 at the door is the
    paper's early drop only when the request could not have made it; the queue itself says so. The
    share leaves room for what the estimate leaves out (batching waits, hops, the children that
    the requests queued at the root will still bring the later tasks, the processes' rate taken at
    their largest batch, a busy process's queue length published only between its batches).
    Measured twice (social_media 110:124 at time scale 30, a drain-first's interim plan, the door
    at its count): 11.4 s of queue on a 21.3 s deadline while the requests admitted just before
    finished within 14.8 s (p99), and 13.9 s while they finished within 15.3 s: 1.1-1.3x the
    estimate, so a request at 0.75 of its deadline would end at 0.83-0.98 of it. A request the
    estimate admits wrongly is dropped early by the worker at its pop (504), at little cost to
    the others; one shed wrongly is lost.
    """
    return end_s is not None and end_s <= QUEUE_ADMIT_SHARE * budget_s


class Admission:
    """In-flight counts and limits per app, and the bin counters."""

    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue
        self.inflight: dict[str, int] = {}
        # app -> generation -> requests in flight there: with ``server.admission_per_generation``
        # the limit of the current plan applies to the current generation's requests only
        self.by_generation: dict[str, dict[int, int]] = {}
        self.limits: dict[str, int] = {}
        self.bins: dict[str, BinCounters] = {}
        # app -> [over the limit and shed, over the limit and admitted by the queue]
        # (``server.admission_backlog``): how often the count alone would have shed wrongly
        self.over_limit: dict[str, list[int]] = {}

    def refresh(self, routes: AppRoutes, root_states: list[int]) -> None:
        """The app's limit for ``routes``, scaled by the share of its root processes that are up."""
        name = routes.app.name
        self.inflight.setdefault(name, 0)
        self.bins.setdefault(name, BinCounters())
        up = sum(1 for s in root_states if s not in (st.DEAD, st.FAILED))
        limit = admission_limit(routes)
        self.limits[name] = max(1, math.ceil(limit * up / len(root_states))) if root_states and up else limit

    def limit(self, app: str) -> int:
        return min(self.max_queue, self.limits.get(app, self.max_queue))

    def full(self, app: str, generation: int | None = None) -> bool:
        """True when a new request of ``app`` must be shed.

        With ``generation`` (``server.admission_per_generation``) the plan's limit counts only the
        requests of that generation, the one new requests go to; ``max_queue`` still bounds all of
        them. Why: after a spike's re-plan switched, the old generation's backlog (requests that
        wait for their deadline there, seconds of wall time) counted against the new plan's limit
        and shed every new request at the door while the new generation's instances sat nearly
        idle: social_media's bins 115-116 of day 0 at time scale 30, the door full at 1093 in
        flight with 1473 of them in the previous generation and 115 in the current one.
        """
        n = self.inflight[app]
        if generation is None:
            return n >= self.limit(app)
        if n >= self.max_queue:
            return True
        return self.by_generation.get(app, {}).get(generation, 0) >= self.limit(app)

    def over_limit_decided(self, app: str, admitted: bool) -> None:
        """Count one request that arrived over the limit: shed, or admitted by its queue."""
        self.over_limit.setdefault(app, [0, 0])[1 if admitted else 0] += 1

    def admit(self, app: str, generation: int = 0) -> None:
        self.inflight[app] += 1
        gens = self.by_generation.setdefault(app, {})
        gens[generation] = gens.get(generation, 0) + 1

    def release(self, app: str, generation: int = 0) -> None:
        self.inflight[app] -= 1
        gens = self.by_generation.get(app)
        if gens is not None and generation in gens:
            gens[generation] -= 1
            if gens[generation] <= 0:
                del gens[generation]

    def moved(self, app: str, old_generation: int, new_generation: int) -> None:
        """A request in flight was sent again on another generation (a drain cut short)."""
        if old_generation != new_generation:
            self.release(app, old_generation)
            self.admit(app, new_generation)

    def total(self) -> int:
        return sum(self.inflight.values())

    # ---- bins ---------------------------------------------------------------------------------
    def arrived(self, app: str) -> None:
        self.bins[app].arrivals += 1

    def answered(self, app: str, status: int) -> None:
        counters = self.bins.setdefault(app, BinCounters())
        counters.answered += 1
        if status >= 500:
            counters.violations += 1

    def fan_out(self, app: str, task: str, variant: str, children: int) -> None:
        acc = self.bins.setdefault(app, BinCounters()).children.setdefault((task, variant), [0, 0])
        acc[0] += 1
        acc[1] += children

    def peek_bin(self, app: str) -> BinCounters | None:
        """The running bin's counters so far (not reset)."""
        return self.bins.get(app)

    def take_bin(self, app: str) -> BinCounters:
        """The app's counters since the last call, and a fresh set for the next bin."""
        got = self.bins.get(app, BinCounters())
        self.bins[app] = BinCounters()
        return got
