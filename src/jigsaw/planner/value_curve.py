"""Each app's best value per budget at the demands solved before: facts that bound and start
the decomposition's single-app solves at a new demand.

``g(b, d)``, an app's best objective term within budget ``b`` (compute slices, MIG placement
slots) at root demand ``d`` (``decompose``), is nondecreasing in ``b`` and nonincreasing in
``d``: a plan for more demand is a plan for less (its lanes' rates scaled down, the same
instances and variant fractions, so the same accuracy, slices and value). So one solve at
``(b', d')`` gives, at any later demand ``d``:

* an **upper bound** on ``g(b, d)`` for every ``b <= b'`` once ``d >= d'``: the solve's bound;
* an **incumbent** for every ``b >= used`` once ``d`` is at most what the plan's instances
  serve (its rate times its headroom, ``curves.headroom``): the plan scaled to ``d``, of the
  same value.

Where the best such incumbent is within the node's stopping gap of the least such bound, the
point is proven without a solve; elsewhere the solve starts from the incumbent and the bound
stays a valid cap on the frontier. Facts come from every single-app solve of a decision
(``learn``) and from the idle time's grid of demands (``precompute``, ``budget_curve``); each
is kept under the objective and weights it was solved for (``scope``): a value or bound of
another objective or weighting means nothing here.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from jigsaw.node import Node
from jigsaw.plan import Plan
from jigsaw.planner import curves, joint
from jigsaw.planner.curves import headroom, scale_plan
from jigsaw.planner.decompose import FLOOR_LIMIT_S, slot_floor, usage
from jigsaw.planner.problem import Problem

KEY = ("value_curve", "facts")  # its ``Problem.derived`` key
MAX_FACTS = 2000  # per app and scope, the oldest dropped first (a grid: several hundred)
Usage = tuple[int, int]
Scope = tuple[str, float, float]  # (objective, the app's weight, the decision's total weight)
# the idle time's grid (``precompute``): demands first, each interval probed while unproven
# (``next_probe``: halved down to a width, or just above what a plan proves), each demand's
# budgets a slice or two below its own optimum too, then those budgets probed between the
# demands the same way (``open_points``); each solve bounded
GRID_LEVELS = 16
GRID_MIN_WIDTH = 0.004  # of the grid's top demand
GRID_FRONTIER = 1
LEVEL_SOLVES = 5 + 4 * GRID_FRONTIER  # one demand's solves at most (``level_facts``)
GRID_FRONTIER_FROM = 0.45  # of the grid's top demand: below it the apps' own optima fit together
GRID_STEP_S = 4.0
EDGE = 1e-6  # a probe lies this share above the demand the facts prove up to (``next_probe``)
EDGE_MIN_WIDTH = 1e-4  # of the grid's top demand: a strip left open narrower than this is not probed
MAX_PROBES = 12  # one budget's probes between two grid demands at most (``open_points``)


@dataclass(frozen=True)
class Fact:
    """One single-app solve at ``demand_rps`` within ``budget``: its bound on ``g`` and its plan
    (None: none found), the plan's usage, value and the root rate its instances serve."""

    demand_rps: float
    budget: Usage
    bound: float  # the solver's upper bound on g(budget, demand) (-inf: no plan exists)
    plan: Plan | None = None
    used: Usage = (0, 0)
    value: float = -math.inf
    serves_rps: float = 0.0
    learned: bool = False  # from a plan's own solve (``learn``), not the idle time's


def fact_to_json(f: Fact) -> dict[str, Any]:
    """A fact as JSON (the idle time's child answers with these; the bench keeps them)."""
    return {"demand_rps": f.demand_rps, "budget": list(f.budget),
            "bound": f.bound if math.isfinite(f.bound) else ("-inf" if f.bound < 0 else "inf"),
            "plan": f.plan.to_json_dict() if f.plan is not None else None, "used": list(f.used),
            "value": f.value if math.isfinite(f.value) else None}


def fact_from_json(d: dict[str, Any]) -> Fact:
    """``fact_to_json``'s inverse (its serving rate measured again when ``add``ed)."""
    bound = d["bound"]
    plan = Plan.from_json_dict(d["plan"], "<value fact>") if d.get("plan") else None
    return Fact(float(d["demand_rps"]), (int(d["budget"][0]), int(d["budget"][1])), float(bound), plan,
                (int(d["used"][0]), int(d["used"][1])),
                -math.inf if d.get("value") is None else float(d["value"]))


@dataclass(frozen=True)
class Seed:
    """What the facts give a new demand at one budget: the best incumbent (a private plan for
    that demand) and the least bound."""

    budget: Usage
    plan: Plan | None
    used: Usage
    value: float
    bound: float


def facts_of(pb: Problem, scope: Scope) -> list[Fact]:
    """``pb``'s facts under ``scope`` (empty at first), kept with the problem."""
    store = pb.derived.setdefault(KEY, {})
    return store.setdefault(scope, [])


def add(pb: Problem, scope: Scope, fact: Fact, *, learned: bool = False) -> None:
    """One fact into ``pb``'s store (a private copy of its plan; its serving rate measured); a
    budget proven infeasible also into its curve (``curves``: the decomposition's infeasible
    budgets and slot floors, at any objective). ``learned``: a plan's own solve (``learn``),
    dropped before the idle time's facts past ``MAX_FACTS`` (a day of bins learns thousands;
    the grid is what every plan of a new mix starts from)."""
    if fact.bound == -math.inf:
        curves.curve_of(pb).add_refuted(fact.budget, fact.demand_rps)
    facts = facts_of(pb, scope)
    if fact.plan is not None:
        plan = copy.deepcopy(fact.plan)
        fact = Fact(fact.demand_rps, fact.budget, fact.bound, plan, fact.used, fact.value,
                    plan.planned_rps * headroom(plan, pb))
    facts.append(dataclasses.replace(fact, learned=learned) if fact.learned != learned else fact)
    if len(facts) > MAX_FACTS:  # the oldest learned one goes, else the oldest
        facts.pop(next((j for j, f in enumerate(facts) if f.learned), 0))


def bound_at(facts: Sequence[Fact], budget: Usage, demand_rps: float) -> float:
    """The least upper bound the facts prove on ``g(budget, demand_rps)`` (inf: none)."""
    return min((f.bound for f in facts if f.demand_rps <= demand_rps * (1 + 1e-12)
                and f.budget[0] >= budget[0] and f.budget[1] >= budget[1]), default=math.inf)


def seeds(pb: Problem, scope: Scope, demand_rps: float, budgets: Sequence[Usage] = ()) -> list[Seed]:
    """Per budget the facts were solved at (and ``budgets``), the best incumbent at
    ``demand_rps`` and the least bound; only budgets with an incumbent (the bound alone is the
    curves' business). The incumbent plans are scaled to ``demand_rps``."""
    facts = facts_of(pb, scope) if KEY in pb.derived else []
    if not facts or demand_rps <= 0:
        return []
    usable = [f for f in facts if f.plan is not None and f.serves_rps >= demand_rps * (1 - 1e-9)
              and f.plan.planned_rps > 0]
    if not usable:
        return []
    out: list[Seed] = []
    for b in dict.fromkeys([*(f.budget for f in facts), *budgets]):
        inc = [f for f in usable if f.used[0] <= b[0] and f.used[1] <= b[1]]
        if not inc:
            continue
        best = max(inc, key=lambda f: f.value)
        bound = max(bound_at(facts, b, demand_rps), best.value)
        assert best.plan is not None
        plan = scale_plan(best.plan, demand_rps / best.plan.planned_rps)
        plan.demand_rps = demand_rps
        out.append(Seed(b, plan, best.used, best.value, bound))
    return out


def scope_of(objective: str, weight: float, total_weight: float) -> Scope:
    """The scope a part's facts are kept under: its objective and weights."""
    return objective, float(weight), float(total_weight)


def learn(pbs: Sequence[Problem], scopes: Sequence[Scope], demands: Sequence[float],
          solved: Sequence[Sequence[tuple[Usage, Plan | None, Usage, float, float]]]) -> None:
    """Each app's points solved at its demand (``decompose.Result.solved``) into its store."""
    for pb, scope, d, points in zip(pbs, scopes, demands, solved, strict=True):
        for budget, plan, used, value, bound in points:
            if d > 0 and not math.isnan(bound):
                add(pb, scope, Fact(d, budget, bound, plan, used, value), learned=True)


def solve_fact(pb: Problem, node: Node, scope: Scope, demand_rps: float, budget: Usage | None, *,
               solver: str, gap: float, time_limit_s: float) -> Fact:
    """One single-app solve at ``demand_rps`` within ``budget`` (None: the whole node), stored."""
    objective, weight, total = scope
    room = curves.room_of(node)
    b = budget or room
    res = joint.solve([joint.Part(pb, demand_rps, weight)], node, solver=solver, time_limit_s=time_limit_s,
                      objective=objective, absolute_gap=gap, total_weight=total,
                      max_slices=b[0] if b[0] < room[0] else None, max_slots=b[1] if b[1] < room[1] else None)
    plan = res.plans[0]
    if res.status == "infeasible":
        fact = Fact(demand_rps, b, -math.inf)
    elif plan is None:  # no plan, no proof: only an ``infeasible`` solve refutes the budget
        fact = Fact(demand_rps, b, res.bound if not math.isnan(res.bound) and res.bound > -math.inf
                    else math.inf)
    else:
        bound = res.bound if not math.isnan(res.bound) else math.inf
        fact = Fact(demand_rps, b, max(bound, res.objective), plan, usage(plan, node), res.objective)
    add(pb, scope, fact)
    return facts_of(pb, scope)[-1]


def frontier_budgets(used: Usage, node: Node, frontier: int = GRID_FRONTIER) -> list[Usage]:
    """The budgets the frontier search asks of an app whose own optimum takes ``used`` when the
    apps compete: the same slices or up to ``frontier`` fewer, each with its share of the node's
    slots (``budget_curve.slots_share``) or one more, and each fewer with every slot; those the
    own optimum fits left out."""
    room = curves.room_of(node)
    out: list[Usage] = []
    for j in range(frontier + 1):
        k = used[0] - j
        if k < 1:
            break
        share = room[1] * k // room[0]
        for m in (share, share + 1, *((room[1],) if j else ())):
            b = (k, min(m, room[1]))
            if not (used[0] <= b[0] and used[1] <= b[1]) and b not in out:
                out.append(b)
    return out


def level_facts(pb: Problem, node: Node, scope: Scope, demand_rps: float, max_rps: float, *, solver: str,
                gap: float, time_limit_s: float = GRID_STEP_S, frontier: int = GRID_FRONTIER,
                frontier_from_rps: float | None = None) -> list[Fact]:
    """One demand of the grid (``precompute``): the app's own optimum there and, from
    ``frontier_from_rps`` (default ``GRID_FRONTIER_FROM`` of ``max_rps``) up, the budgets the
    frontier search asks when the apps compete (``frontier_budgets``); each solve to half of
    ``gap``, stored. The facts."""
    own = solve_fact(pb, node, scope, demand_rps, None, solver=solver, gap=gap / 2, time_limit_s=time_limit_s)
    out = [own]
    if own.plan is None or demand_rps < (GRID_FRONTIER_FROM * max_rps if frontier_from_rps is None
                                         else frontier_from_rps):
        return out
    part = joint.Part(pb, demand_rps, scope[1])
    beside = {own.used[0] + 1} if own.used[0] < curves.room_of(node)[0] else set()
    for k in sorted({b[0] for b in frontier_budgets(own.used, node, frontier)} | beside, reverse=True):
        # the slot floor the frontier search would solve first: (k, floor - 1) is infeasible (and
        # a slice more than the own optimum's: the budgets beside it, on fewer slots)
        floor = slot_floor(part, node, solver, k, min(time_limit_s, FLOOR_LIMIT_S))
        slots = curves.room_of(node)[1] if floor is None else floor - 1
        if slots >= 0:
            out.append(Fact(demand_rps, (k, slots), -math.inf))
            add(pb, scope, out[-1])
    out += [solve_fact(pb, node, scope, demand_rps, b, solver=solver, gap=gap / 2, time_limit_s=time_limit_s)
            for b in frontier_budgets(own.used, node, frontier)]
    return out


def first_levels(max_rps: float, levels: int = GRID_LEVELS) -> list[float]:
    """The grid's first round: ``levels`` demands evenly up to ``max_rps``."""
    return [max_rps * (j + 1) / levels for j in range(levels)]


def next_levels(pb: Problem, node: Node, scope: Scope, done: Sequence[float], max_rps: float, gap: float,
                min_width: float = GRID_MIN_WIDTH) -> list[float]:
    """The next round after the demands ``done``: in each interval the facts leave more than
    ``gap`` unproven across, its next probe (``next_probe``)."""
    room = curves.room_of(node)
    levels = sorted(done)
    out = [next_probe(pb, scope, room, lo, hi, gap, max_rps, min_width)
           for lo, hi in zip([0.0, *levels], levels, strict=False)]
    return [d for d in out if d is not None]


def proven_to(pb: Problem, scope: Scope, budget: Usage, lo_rps: float, hi_rps: float,
              gap: float) -> float | None:
    """How far above ``lo`` the facts prove ``g(budget, .)`` to within ``gap`` (a plan within the
    budget whose value is within ``gap`` of the bound at ``lo`` serves up to there; ``lo`` when
    none does); None when they prove it up to ``hi``, or the budget infeasible from there on."""
    facts = facts_of(pb, scope)
    bound = bound_at(facts, budget, lo_rps)
    served = max((f.serves_rps for f in facts if f.plan is not None and f.value >= bound - gap
                  and f.used[0] <= budget[0] and f.used[1] <= budget[1]), default=lo_rps)
    edge = max(served, lo_rps)
    if edge * (1 + EDGE) >= hi_rps or any(b[0] >= budget[0] and b[1] >= budget[1]
                                          for b in curves.curve_of(pb).refuted_at(edge * (1 + EDGE))):
        return None
    return edge


def next_probe(pb: Problem, scope: Scope, budget: Usage, lo_rps: float, hi_rps: float, gap: float,
               max_rps: float, min_width: float = GRID_MIN_WIDTH) -> float | None:
    """The demand to solve ``budget`` at next between two demands (None: the facts prove it
    across). Where a plan's instances prove a stretch above ``lo`` (``proven_to``), just above
    that stretch, while more than ``EDGE_MIN_WIDTH`` of ``max_rps`` is left; else the middle,
    while the interval is wider than ``min_width`` of ``max_rps`` (``EDGE_MIN_WIDTH`` where the
    budget is proven infeasible at ``hi``: its feasibility changes inside).

    Why both: ``g`` falls continuously where accuracy scaling moves traffic to a cheaper variant
    (the plan's instances then serve its demand and no more: halving the interval narrows the
    fall), and in steps where a plan of other instances takes over (the plan below the step
    serves up to it: a solve just above proves the next stair at once, where halving leaves a
    strip around the step open however often it is halved). And a budget's feasibility is what
    a spike's plan cannot guess: an open strip of it costs a solve near infeasibility."""
    edge = proven_to(pb, scope, budget, lo_rps, hi_rps, gap)
    if edge is None:
        return None
    if lo_rps > 0 and edge > lo_rps * (1 + EDGE):
        if hi_rps - edge <= EDGE_MIN_WIDTH * max_rps:
            return None
        # never closer than that to ``lo``: plans that each serve a hair more are not walked
        return min(max(edge * (1 + EDGE), lo_rps + EDGE_MIN_WIDTH * max_rps), (edge + hi_rps) / 2)
    flips = any(b[0] >= budget[0] and b[1] >= budget[1] for b in curves.curve_of(pb).refuted_at(hi_rps))
    width = EDGE_MIN_WIDTH if flips else min_width
    return (lo_rps + hi_rps) / 2 if hi_rps - lo_rps > width * max_rps else None


def open_points(pb: Problem, node: Node, scope: Scope, done: Sequence[float], max_rps: float, gap: float,
                min_width: float = GRID_MIN_WIDTH, skip: Collection[tuple[float, Usage]] = ()
                ) -> list[tuple[float, Usage]]:
    """The next round of budget probes after the grid's demands ``done``: between each two
    neighbouring demands, every budget short of the node that either one's facts were solved
    within (the frontier's budgets and slot floors there) and that the facts leave unproven
    across the interval, or across a part of it between two demands it was solved at since:
    (``next_probe``'s demand, the budget); none where a solve within the budget there was
    undecided (no plan, no proof: it would be again), past ``MAX_PROBES`` solves of it there,
    nor those in ``skip``.

    Why: the grid's demands are refined where the whole node's values leave a gap, but a plan
    between two of them also asks budgets short of the node, whose feasibility and values
    change between the two: at 90% of the example node traffic_analysis at (9 slices, 10 slots)
    was infeasible at a demand between two grid demands, feasible at the lower, and took 1.5 s
    of the spike's plan to prove."""
    room = curves.room_of(node)
    facts = facts_of(pb, scope)
    levels = sorted(done)
    out: list[tuple[float, Usage]] = []
    for lo, hi in pairwise(levels):
        at = [f for f in facts if lo <= f.demand_rps <= hi]
        budgets = dict.fromkeys(f.budget for f in at if f.budget != room and f.demand_rps in (lo, hi))
        for b in budgets:
            mine = [f for f in at if f.budget == b]
            if any(f.plan is None and f.bound > -math.inf for f in mine) or \
                    sum(lo < f.demand_rps < hi for f in mine) >= MAX_PROBES:
                continue  # undecided in its time once (it would be again), or probed enough
            for a, c in pairwise(sorted({lo, hi, *(f.demand_rps for f in mine)})):
                d = next_probe(pb, scope, b, a, c, gap, max_rps, min_width)
                if d is not None and (d, b) not in skip:
                    out.append((d, b))
    return out


def precompute(pb: Problem, node: Node, scope: Scope, max_rps: float, *, solver: str, gap: float,
               levels: int = GRID_LEVELS, min_width: float = GRID_MIN_WIDTH, frontier: int = GRID_FRONTIER,
               time_limit_s: float = GRID_STEP_S, budget_s: float = math.inf,
               frontier_from_rps: float | None = None) -> int:
    """The whole grid in this process (a bench's, or a caller with nothing else to do): the
    demands of ``first_levels``, then rounds of ``next_levels`` until none is left, each
    ``level_facts``, then rounds of ``open_points`` until none is left, each one solve;
    ``budget_s`` in all at most. The solves made."""
    t0 = time.perf_counter()
    solves = 0
    todo = first_levels(max_rps, levels)
    done: list[float] = []
    while todo and time.perf_counter() - t0 < budget_s:
        d = todo.pop(0)
        solves += len(level_facts(pb, node, scope, d, max_rps, solver=solver, gap=gap,
                                  time_limit_s=time_limit_s, frontier=frontier,
                                  frontier_from_rps=frontier_from_rps))
        done.append(d)
        if not todo:
            todo = next_levels(pb, node, scope, done, max_rps, gap, min_width)
    points = open_points(pb, node, scope, done, max_rps, gap, min_width)
    while points and time.perf_counter() - t0 < budget_s:
        d, b = points.pop(0)
        solve_fact(pb, node, scope, d, b, solver=solver, gap=gap / 2, time_limit_s=time_limit_s)
        solves += 1
        if not points:
            points = open_points(pb, node, scope, done, max_rps, gap, min_width)
    return solves
