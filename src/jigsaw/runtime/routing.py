"""The frontend's routing table: which generation serves each app, and the mapped rings it feeds.

A generation's root rings, completion rings and stats block are mapped here when the generation
manager announces it (``add_generation``); an app's new requests follow ``route`` (one assignment on
the loop, so a switch is atomic for the requests admitted after it); a drained generation is
unmapped (``remove_generation``). ``reweight`` changes only the lane weights of the routes in place:
the same processes keep serving, which is the whole reconfiguration when a new plan runs the same
instances. Routing among the processes of a task is least-loaded (``stats.routable``, the rule the
workers use too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from jigsaw.backends.base import OutputSpec
from jigsaw.backends.registry import BackendKind
from jigsaw.plan import Plan
from jigsaw.runtime import stats as st
from jigsaw.runtime.lanes import LaneShape, choose_lane, lane_shape, soonest_end_s
from jigsaw.runtime.metrics import Metrics
from jigsaw.runtime.rings import Doorbell, ShmRing
from jigsaw.runtime.stats import StatsBlock
from jigsaw.runtime.topology import AppRoutes, ProcessSpec, Target, Topology


@dataclass
class MappedGeneration:
    """The frontend's mappings of one generation's segments."""

    topology: Topology
    rings: dict[str, ShmRing]
    bells: dict[str, Doorbell]
    completions: list[ShmRing]
    stats: StatsBlock
    min_path_ns: list[int] = field(default_factory=list)  # per lane: fastest batch-1 time of its slowest path
    shapes: dict[str, LaneShape] = field(default_factory=dict)  # app -> its lanes' stages (lane shift)
    root_rings: dict[int, ShmRing] = field(default_factory=dict)  # slot of a root process -> its ring

    def close(self) -> None:
        for ring in (*self.rings.values(), *self.completions):
            ring.close()
        for bell in self.bells.values():
            bell.close()
        self.stats.close()


def min_path_ns(topology: Topology, routes: AppRoutes) -> list[int]:
    """Per lane, the least time its slowest path takes (batch-1 estimates, no queueing)."""
    fastest: dict[tuple[str, str], int] = {}
    for p in topology.processes:
        if p.app == routes.app.name and p.exec_estimate_ns:
            key = (p.task, p.variant)
            fastest[key] = min(fastest.get(key, p.exec_estimate_ns[0]), p.exec_estimate_ns[0])
    return [max((sum(fastest.get((t, lane.get(t, "")), 0) for t in path) for path in routes.app.paths),
                default=0) for lane in routes.lanes]


def _queued(mapped: MappedGeneration) -> Callable[[int], int]:
    """A process's items not yet finished: in its batch queue or batch, and still in its input
    rings: a root process's ring read here, live; the rings of a process past the root as it
    published them (``stats.RING_QUEUED``, at its last batch). Without them the backlog of every
    task past the root was invisible (items wait in the rings until the process can batch them):
    ar_assistant's spike (a 3-task chain, time scale 20) estimated 12.4 s of queue while requests
    waited past their 31 s deadline."""
    block, rings = mapped.stats, mapped.root_rings

    def queued(slot: int) -> int:
        ring = rings.get(slot)
        waiting = len(ring) if ring is not None else block.get(slot, st.RING_QUEUED)
        return block.get(slot, st.QUEUED) + waiting
    return queued


def lane_weights(plan: Plan) -> list[float]:
    """A plan's lane draw weights (its lanes' planned rates; equal when none is positive)."""
    weights = [max(0.0, lp.rate_rps) for lp in plan.lanes]
    return weights if sum(weights) > 0 else [1.0] * len(weights)


class RoutingTable:
    """App -> the routes of the generation serving it, over every mapped generation's segments."""

    def __init__(self, backend: BackendKind, metrics: Metrics) -> None:
        self.backend = backend
        self.metrics = metrics
        self.routes: dict[str, AppRoutes] = {}
        self.output_specs: dict[str, dict[str, list[OutputSpec]]] = {}  # app -> sink task -> outputs
        self.generations: dict[int, MappedGeneration] = {}
        self.rings: dict[str, ShmRing] = {}
        self.bells: dict[str, Doorbell] = {}
        self.ring_stats: dict[str, StatsBlock] = {}
        self.completions: list[ShmRing] = []
        self.bell: Doorbell | None = None  # the frontend's doorbell, shared by every generation

    def add_generation(self, generation: int, topology: Topology) -> None:
        """Map a generation's root rings, completion rings and stats (its segments must exist)."""
        if self.bell is None:
            self.bell = Doorbell.attach(topology.frontend_doorbell)
        rings: dict[str, ShmRing] = {}
        bells: dict[str, Doorbell] = {}
        stats = StatsBlock.attach(topology.stats)
        for routes in topology.apps.values():
            routes.generation = generation
            for lane in routes.roots:
                for targets in lane.values():
                    for t in targets:
                        if t.ring not in rings:
                            rings[t.ring] = ShmRing.attach(t.ring, role="producer")
                            bells[t.ring] = Doorbell.attach(t.doorbell)
        completions = [ShmRing.attach(n, role="consumer") for n in topology.completion_rings]
        paths = [min_path_ns(topology, r) for r in topology.apps.values()]
        shapes = {name: lane_shape(topology, r, min_path_ns(topology, r))
                  for name, r in topology.apps.items()}
        root_rings = {t.slot: rings[t.ring] for r in topology.apps.values() for lane in r.roots
                      for targets in lane.values() for t in targets}
        self.generations[generation] = MappedGeneration(topology, rings, bells, completions, stats,
                                                        paths[0] if paths else [], shapes, root_rings)
        self.rings.update(rings)
        self.bells.update(bells)
        self.ring_stats.update(dict.fromkeys(rings, stats))
        self.completions = [r for g in self.generations.values() for r in g.completions]

    def route(self, app: str, generation: int) -> AppRoutes:
        """Send the app's new requests to ``generation`` (one assignment: atomic on the loop)."""
        mapped = self.generations[generation]
        routes = mapped.topology.apps[app]
        self.routes[app] = routes
        a = routes.app
        self.output_specs[app] = {t: self.backend.task_output_specs(a, t) for t in a.sinks}
        self.metrics.slices.set((("app", app),), routes.slices)
        self.metrics.processes.set((("app", app),), sum(1 for p in mapped.topology.processes if p.app == app))
        return routes

    def unroute(self, app: str) -> None:
        """``app`` is no longer served (unloaded): its name answers 404 from now on."""
        self.routes.pop(app, None)
        self.output_specs.pop(app, None)
        self.metrics.slices.set((("app", app),), 0)
        self.metrics.processes.set((("app", app),), 0)

    def reweight(self, app: str, plan: Plan) -> AppRoutes:
        """Run ``plan`` on the processes serving ``app`` now: only the lane weights change."""
        routes = self.routes[app]
        routes.lane_weights = lane_weights(plan)
        routes.plan = plan
        return routes

    def remove_generation(self, generation: int) -> MappedGeneration | None:
        """Forget a drained generation's mappings; the caller drains and closes what is returned."""
        g = self.generations.pop(generation, None)
        if g is None:
            return None
        self.completions = [r for x in self.generations.values() for r in x.completions]
        for name in g.rings:
            self.rings.pop(name, None)
            self.bells.pop(name, None)
            self.ring_stats.pop(name, None)
        return g

    def close(self) -> None:
        for g in self.generations.values():
            g.close()
        self.generations.clear()
        if self.bell is not None:
            self.bell.close()

    # ---- where an item goes ------------------------------------------------------------------
    def load(self, t: Target) -> int:
        return len(self.rings[t.ring]) + self.ring_stats[t.ring].get(t.slot, st.QUEUED)

    def usable(self, targets: list[Target]) -> list[Target]:
        """The targets that may take an item, least loaded first."""
        return st.routable(targets, lambda t: self.ring_stats[t.ring].get(t.slot, st.STATE), self.load)

    def root_states(self, app: str) -> list[int]:
        """The stats state of every process of the app's root tasks (its admission follows them)."""
        routes = self.routes[app]
        targets = {t.ring: t for lane in routes.roots for ts in lane.values() for t in ts}
        return [self.ring_stats[t.ring].get(t.slot, st.STATE) if t.ring in self.ring_stats else st.READY
                for t in targets.values()]

    def shift_lane(self, routes: AppRoutes, drawn: int, budget_ns: int) -> int:
        """The lane a request drawn for lane ``drawn`` takes (``lanes.choose_lane``; ``drawn`` when
        the node's ``server.lane_shift`` is off or the app has one lane)."""
        mapped = self.generations.get(routes.generation)
        shape = mapped.shapes.get(routes.app.name) if mapped is not None else None
        if not routes.lane_shift or shape is None or len(routes.lanes) < 2:
            return drawn
        assert mapped is not None
        block = mapped.stats
        return choose_lane(drawn, shape, _queued(mapped), lambda slot: block.get(slot, st.STATE),
                           budget_ns / 1e9)

    def queued_end_s(self, routes: AppRoutes) -> float | None:
        """Wall seconds until a request admitted now would finish on the processes of ``routes``:
        the work queued ahead of it along its lane plus the lane's fastest path
        (``lanes.soonest_end_s``; the lane a shift may take when ``server.lane_shift`` is on).
        None when unknown (no mapped generation or no lane with live processes)."""
        mapped = self.generations.get(routes.generation)
        shape = mapped.shapes.get(routes.app.name) if mapped is not None else None
        if shape is None:
            return None
        assert mapped is not None
        block = mapped.stats
        return soonest_end_s(shape, _queued(mapped), lambda slot: block.get(slot, st.STATE),
                             routes.lane_weights, routes.lane_shift and len(routes.lanes) > 1)

    def fastest_path_ns(self, routes: AppRoutes) -> int:
        """The least time any lane of ``routes`` can take end to end (0 when unknown)."""
        mapped = self.generations.get(routes.generation)
        return max(mapped.min_path_ns, default=0) if mapped is not None else 0

    def processes(self) -> list[tuple[ProcessSpec, StatsBlock]]:
        """Every mapped process with the stats block holding its slot (for the gauges)."""
        return [(p, g.stats) for g in self.generations.values() for p in g.topology.processes]
