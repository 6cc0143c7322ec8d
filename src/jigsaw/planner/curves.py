"""What one app can serve within a budget of slices and slots, as plans have shown it, kept.

What an app serves within a budget (compute slices, MIG placement slots) depends on the app, its
profiles, the node, the search space and the SLOs (its ``Problem``), not on the demands of the
other apps nor on the bin. Two kinds of fact about it come out of every node decision by
decomposition (``decompose.solve``), at the demand that decision had:

* **served**: a plan on ``usage`` whose instances carry its lanes ``headroom`` times, so the same
  instances serve every rate up to ``planned rate x headroom`` (its lanes scaled down:
  ``scale_plan``);
* **refuted**: a budget proven to serve no plan at rate ``r`` (an infeasible solve, a latency-
  relaxed core's slice or slot floor): it serves no larger rate either.

``Curve`` keeps both, per problem (``Problem.derived``: the controller's solver process keeps its
problems across bins, so a spike's search starts from what the bins before it proved), each
list reduced to its Pareto front (a plan on less for more, a refutation of more at less), so it
stays small. From them, for demands ``d`` (one per app) without a solve (``cached_scale``):

* the largest common fraction theta that stored plans serve together, fitting the node's slices
  and slots by sum and packing onto its GPUs (``served_theta``): served, with those plans;
* the least theta at which the refutations alone leave no choice of budgets within the node
  (``refuted_theta``): theta* lies below it, proven.

Where the two meet within the scaled search's tolerance the fraction needs no solve; elsewhere
the search tests between them (``scaled.max_scale``), and its tests add to the curves.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from jigsaw.mig import NUM_PLACEMENT_SLOTS
from jigsaw.node import Node
from jigsaw.plan import LanePlan, Layout, Plan
from jigsaw.planner import decompose, joint
from jigsaw.planner.packer import PackingError
from jigsaw.planner.problem import Problem
from jigsaw.planner.verify import demand_and_supply

Usage = tuple[int, int]  # (compute slices, MIG placement slots)
PACK_TRIES = 6  # choices of stored plans tried on the packer per fraction (``served_theta``)
MAX_PACKS = 12  # packer calls per ``served_theta`` in all (each 5-50 ms: a bound on its time)
MAX_ENTRIES = 512  # per app and kind: the oldest entries go first past this (a bound on memory)
KEY = ("curve",)  # its entry in ``Problem.derived``


def headroom(plan: Plan, pb: Problem) -> float:
    """How many times its lanes' rates the plan's instances carry (>= 1 for a sound plan):
    the smallest supply/demand over the (task, variant) pairs its lanes reach."""
    demand, supply = demand_and_supply(plan, pb.app, pb.factors)
    ratios = [supply.get(k, 0.0) / v for k, v in demand.items() if v > 0]
    return max(1.0, min(ratios, default=1.0))


def scale_plan(plan: Plan, factor: float) -> Plan:
    """``plan`` with every lane's rate times ``factor`` (at most its headroom: still sound)."""
    out = copy.deepcopy(plan)
    out.lanes = [LanePlan(dict(x.variants), x.rate_rps * factor) for x in plan.lanes]
    out.planned_rps = plan.planned_rps * factor
    return out


@dataclass(frozen=True)
class Served:
    usage: Usage
    rate_rps: float  # the most root requests/s the plan's instances serve
    plan: Plan  # a private copy, never handed out (``scale_plan`` copies it)


@dataclass
class Curve:
    """The facts about one app's budgets (see the module doc), each list a Pareto front."""

    served: list[Served] = field(default_factory=list)
    refuted: list[tuple[Usage, float]] = field(default_factory=list)  # (budget, rate it cannot serve)

    def add_plan(self, plan: Plan, used: Usage, rate_rps: float) -> None:
        """A plan on ``used`` that serves up to ``rate_rps`` (kept unless another serves as much
        on as little)."""
        if rate_rps <= 0:
            return
        if any(_le(s.usage, used) and s.rate_rps >= rate_rps for s in self.served):
            return
        self.served = [s for s in self.served if not (_le(used, s.usage) and rate_rps >= s.rate_rps)]
        self.served.append(Served(used, rate_rps, copy.deepcopy(plan)))
        del self.served[:-MAX_ENTRIES]

    def add_refuted(self, budget: Usage, rate_rps: float) -> None:
        """No plan within ``budget`` serves ``rate_rps``."""
        if any(_le(budget, b) and r <= rate_rps for b, r in self.refuted):
            return
        self.refuted = [(b, r) for b, r in self.refuted if not (_le(b, budget) and rate_rps <= r)]
        self.refuted.append((budget, rate_rps))
        del self.refuted[:-MAX_ENTRIES]

    def refuted_at(self, rate_rps: float) -> list[Usage]:
        """The budgets proven not to serve ``rate_rps``."""
        return [b for b, r in self.refuted if r <= rate_rps * (1 + 1e-12)]

    def plans_for(self, rate_rps: float) -> list[Served]:
        """The stored plans that serve ``rate_rps``."""
        return [s for s in self.served if s.rate_rps >= rate_rps]


def curve_of(pb: Problem) -> Curve:
    """``pb``'s curve (empty at first), kept with the problem."""
    got = pb.derived.get(KEY)
    if got is None:
        got = pb.derived[KEY] = Curve()
    return got


def _le(a: Usage, b: Usage) -> bool:
    return a[0] <= b[0] and a[1] <= b[1]


def room_of(node: Node) -> Usage:
    """What any set of instances that packs onto the node takes at most."""
    return node.slices_available, NUM_PLACEMENT_SLOTS * node.num_gpus


def _pareto(points: list[tuple[Usage, tuple]]) -> list[tuple[Usage, tuple]]:
    """The points whose usage no other point's is below in both (the first of equals kept)."""
    points = sorted(points, key=lambda x: x[0])
    out: list[tuple[Usage, tuple]] = []
    least_m = math.inf
    for u, why in points:
        if u[1] < least_m:
            out.append((u, why))
            least_m = u[1]
    return out


def _combine(options: Sequence[list[tuple[Usage, tuple]]], room: Usage) -> list[tuple[Usage, tuple]]:
    """Every choice of one option per app within ``room`` by sum, as (usage, the choices),
    reduced to the Pareto front after each app."""
    acc: list[tuple[Usage, tuple]] = [((0, 0), ())]
    for opts in options:
        nxt = [((u[0] + v[0], u[1] + v[1]), (*c, w)) for u, c in acc for v, w in opts
               if u[0] + v[0] <= room[0] and u[1] + v[1] <= room[1]]
        acc = _pareto(nxt)
        if not acc:
            return []
    return acc


def _least_budgets(refuted: list[Usage], room: Usage) -> list[tuple[Usage, tuple]]:
    """The smallest budgets within ``room`` that no refuted budget covers (a staircase)."""
    ks = sorted({0, *(b[0] + 1 for b in refuted)})
    out = []
    for k in ks:
        if k > room[0]:
            break
        m = 1 + max((b[1] for b in refuted if b[0] >= k), default=-1)
        if m <= room[1]:
            out.append(((k, m), ()))
    return _pareto(out)


def refuted_theta(demands: Sequence[float], curves: Sequence[Curve], room: Usage) -> float:
    """The least fraction theta of ``demands`` that the curves' refutations prove does not fit
    (no choice of budgets, one per app, each not refuted at its rate, within ``room``); inf when
    they prove none. Monotone: a refutation at theta holds above it."""
    def fits(theta: float) -> bool:
        options = [_least_budgets(c.refuted_at(theta * d), room)
                   for c, d in zip(curves, demands, strict=True)]
        return bool(_combine(options, room))

    cands = sorted({r / d for c, d in zip(curves, demands, strict=True) if d > 0 for _, r in c.refuted})
    lo, hi = 0, len(cands)  # the least index whose theta does not fit: in [lo, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(cands[mid]):
            lo = mid + 1
        else:
            hi = mid
    return cands[lo] if lo < len(cands) else math.inf


def served_theta(demands: Sequence[float], curves: Sequence[Curve], room: Usage,
                 pack: Callable[[Sequence[Plan]], Layout]
                 ) -> tuple[float, list[Served], Layout] | None:
    """The largest common fraction of ``demands`` that stored plans serve together (one per app,
    within ``room`` by sum, packing onto the node): theta, the plans and their layout; None
    when no choice of them packs. Each fraction from the largest down tries the choices of
    fewest slices and slots first, ``PACK_TRIES`` of them, ``MAX_PACKS`` in all."""
    if any(d <= 0 for d in demands):
        return None
    packs = 0
    cands = sorted({min(1.0, s.rate_rps / d) for c, d in zip(curves, demands, strict=True)
                    for s in c.served}, reverse=True)
    for theta in cands:
        options = [[(s.usage, (s,)) for s in c.plans_for(theta * d * (1 - 1e-12))]
                   for c, d in zip(curves, demands, strict=True)]
        if any(not o for o in options):
            continue
        for _, choice in _combine([_pareto(o) for o in options], room)[:PACK_TRIES]:
            if packs >= MAX_PACKS:
                return None
            packs += 1
            plans = [w[0] for w in choice]
            try:
                layout = pack([s.plan for s in plans])
            except PackingError:
                continue
            return theta, plans, layout
    return None


def record(pbs: Sequence[Problem], demands: Sequence[float], refuted: Sequence[Sequence[Usage]],
           found: Sequence[Sequence[tuple[Usage, Plan]]]) -> None:
    """What one decision at ``demands`` showed, per app: the budgets it refuted there and the
    plans it found (each at its headroom)."""
    for pb, d, bad, plans in zip(pbs, demands, refuted, found, strict=True):
        curve = curve_of(pb)
        for b in bad:
            curve.add_refuted(b, d)
        for used, plan in plans:
            curve.add_plan(plan, used, plan.planned_rps * headroom(plan, pb))


def seed(parts: Sequence[joint.Part], node: Node) -> list[decompose.Known]:
    """Per part, what its curve proves at its demand (a decision's ``known``)."""
    room = room_of(node)
    return [decompose.Known.of(curve_of(p.pb).refuted_at(p.demand_rps or 0.0), room) for p in parts]


def learn(parts: Sequence[joint.Part], res: decompose.Result) -> None:
    """What the decision ``res`` over ``parts`` showed, into the parts' curves."""
    record([p.pb for p in parts], [p.demand_rps or 0.0 for p in parts],
           [k.budgets() for k in res.known or [decompose.Known()] * len(parts)],
           res.found or [[] for _ in parts])
