"""The node's plan by decomposition: each app alone, a frontier where they compete, one packing.

The joint model (``joint``) couples a node's apps only through the GPUs' MIG layouts; its
objective is a sum of one term per app (``accuracy``: weight x alpha x accuracy minus beta per
slice; ``slices``: minus beta per slice plus a small accuracy tie-break), and every app's part
of a node plan is a plan for that app alone. Any set of MIG instances that packs onto G GPUs
takes at most 7 G compute slices and 8 G placement slots (memory slices). So, with ``g_a(k, m)``
the best value of app ``a`` alone on at most ``k`` slices and ``m`` slots (one small
single-app solve, ``joint.solve(max_slices=k, max_slots=m)``):

    node optimum <= max { sum_a g_a(k_a, m_a) : sum_a k_a <= 7 G, sum_a m_a <= 8 G }   (the bound)

and any choice of single-app plans that packs together is a node plan (an incumbent).
``solve`` computes ``g_a`` lazily, only where the bound's best choice needs it: first each
app's own optimum (no budget; started from a verified plan); when those together overrun the
node in slices or slots, other points, best-first (a knapsack over the apps' budgets,
``budget_choice``, with an upper estimate of each ``g_a`` not yet solved: g is nondecreasing,
so the bound of any larger budget solved; a plan on more slices is worth at most its best
accuracy less their cost, and takes at least a slot per slice; and a lower bound on each app's
slots at a slice budget from the latency-relaxed core, which rules out the budgets below it in
one solve). The points lie below the own optima and beside them: an app may serve its demand
on more slices and fewer slots than its own optimum takes (or the reverse), and a node that
only such budgets fit is no less feasible. A budget beside its own optimum (as many slices or
more, fewer slots) is solved, and its slot floor taken, with every slice of the node: one bound
and one floor then cap the whole column, which the accuracy cap alone (about three slices of
headroom) would leave to a solve per slice. Accuracy lies in [0.9, 1], so an app's optimum is
within about 3 slices of its fewest-slices plan: frontiers are a few points. A point whose solve
finds neither a plan nor a proof in its limit keeps its bound in the knapsack and is parked:
the plans are sought in the best choice without it, and it is solved once more, longer, only
where no such choice is left.

What is proven: each solve reports the solver's own bound on its optimum (an ``optimal`` solve
stops within the gap of it), so the bound above holds with each ``g_a`` replaced by its solve's
bound. When the best choice's plans pack onto the GPUs and their values are within the node's
stopping gap (``Node.absolute_gap``) of that bound, the node plan is ``optimal`` in the joint
model's own sense; where the solves' gaps add up to more, the chosen points are solved again
to a share (the gap / the number of apps) each. When the plans do not pack (the bound knows
the slices and slots, not the placement rules), the best packable choice among the plans
computed is an incumbent and the joint model decides, started from it and cut by the bound.
When no choice of budgets fits, the demands do not fit together: ``infeasible``, proven by the
bound alone.

A spike is screened first: each app's fewest slices in the latency-relaxed core (a relaxation:
a floor on any plan's slices; its LP in milliseconds, the core itself only where the LP floors
come near the node) proves ``infeasible`` when the floors exceed the node, and rules out every
budget below an app's floor without a solve. Where the LP floors do not come near the node but
the apps' own optima overrun it, each own optimum's bound gives its app a floor for free
(``value_floor``: accuracy is at least the SLO, so more value than the bound needs fewer
slices than it allows); the cores' floors run after them only where the free ones come within
``CORE_FLOOR_MARGIN`` slices per app of the node (0, the default: never).
Every floor's solve stops after a node count (``FLOOR_NODES``), not at a share of the clock.

Earlier solves at other demands (``value_curve``: the idle time's grid, earlier decisions) give
points before any solve (``solve(seeds=)``): a plan that serves this demand within a budget and
the least bound proven at a smaller demand and a larger budget. An app's own optimum whose seed
is within the node's gap of its bound is not solved again, nor is a frontier budget the seeds
know; a seed's bound caps the frontier like a solved point's, its plan starts the solve where one
is still needed, and the tightening solves it again like any point. The proof is the same sum
of bounds.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import TYPE_CHECKING

import numpy as np

from jigsaw.mig import NUM_PLACEMENT_SLOTS, slice_unit
from jigsaw.node import Node
from jigsaw.plan import GpuLayout, Layout, Plan
from jigsaw.planner import budget_choice, joint
from jigsaw.planner.anytime import quick_plan
from jigsaw.planner.packer import PackingError

if TYPE_CHECKING:
    from jigsaw.planner.value_curve import Seed

SCREEN_SHARE = 0.85  # the cores' floors are solved where their LP floors reach this share of the node
# each app's latency-relaxed slice floor (``floor_slices``), a quick screen, stops after
# FLOOR_NODES branch-and-bound nodes: a limit of work, so a busy machine gets the same floors
# (the same search after them) as a quiet one. Its dual bound holds wherever it stops; on the
# example apps every floor is proven at the root (traffic_analysis: 0.1-0.4 s there, where the
# 0.3 s clock limit before gave 7 slices on one run and 8 on another). FLOOR_LIMIT_S is a guard
# only (not the decision's share of its limit: a scaled search's later tests have little left).
FLOOR_NODES = 16
FLOOR_LIMIT_S = 2.0
# each slot floor (``slot_floor``): its dual bound holds wherever it stops, so a short solve only
# weakens it (None: the time left)
MIN_SLOTS_LIMIT_S: float | None = FLOOR_LIMIT_S
# HiGHS's presolve on the slot bound: off (traffic_analysis at 75-100% of the node: 0.13-0.34 s
# against 0.33-0.78 s with it, mostly spent at the root node)
MIN_SLOTS_PRESOLVE = False
# the slot floors (``slot_floor``) before each frontier point. Measured on the example node
# (loaded machine, medians of two): at 75% they ruled no budget out and cost 0.26 s; at 90% one
# (traffic_analysis's (9, 10), whose own core took 0.39 s to prove infeasible). Off: 75% 1.58 s,
# 90% 1.72 s; on: 1.74 s and 1.45 s. Kept on (as before).
SLOT_FLOORS = True
# after the apps' own optima overrun the node, their slice floors from those optima's bounds
# (``value_floor``: free) stand in for the latency-relaxed cores' (0.3-0.4 s at 75-90%); the
# cores' floors run only where the free ones come within ``CORE_FLOOR_MARGIN`` slices per app of
# the node without exceeding it (where they may prove that nothing fits). At 90% of the example
# node the free floors are 9, 9, 9 slices against the cores' 9, 9, 10 (28 on 28 slices: no
# proof either way), so a margin of 1 ran the cores for 0.3-0.4 s to no effect: 0, never
VALUE_FLOORS = True
CORE_FLOOR_MARGIN = 0
FIRST_FIT_TRIES = 6  # ``solve(first_fit=True)``: packings tried per new point
# each single-app solve of a ``first_fit`` test at most this long: one that finds no plan in it
# leaves the test undecided (the scaled search keeps what it has shown). The example node's warm
# passes (load 6-8): the tests' solves that decide take 0.1-1 s, but now and then one budget near
# infeasible at 115% or 150% ran 9-10 s to no plan and no proof, and the spike's plan with it
FIT_POINT_LIMIT_S = 1.0
# ... and one that decides nothing in it, once more at most this long: joint.solve shares its
# limit among its stages, and under 1 s never reaches the split search (ar_assistant on 10 slices
# / 11 slots at 264.7 rps, 150% of the example node cold: no plan in 1 s, a plan in 0.9 s of 5)
FIT_POINT_RETRY_S = 3.0
Packer = Callable[[Sequence[Plan]], Layout]  # raises PackingError when the plans do not fit together


Usage = tuple[int, int]  # (compute slices, MIG placement slots) a plan's instances take


def app_layout(layout: Layout, app: str) -> Layout:
    """The node layout restricted to one app's instances (the same GPUs and starts)."""
    return Layout(layout.gpu_model, tuple(
        GpuLayout(g.gpu, tuple(dataclasses.replace(p, app="") for p in g.instances if p.app == app))
        for g in layout.gpus))


def usage(plan: Plan, node: Node) -> Usage:
    """The compute slices and the placement slots (memory slices) of ``plan``'s instances, whole
    (a plan with shares of MIG instances, ``jigsaw.shares``, may use a fraction of one: rounded up)."""
    size = {p.name: p.slot_cost for p in node.gpu.profiles}
    return (math.ceil(plan.slices_used - 1e-9),
            math.ceil(sum(x.count * size[x.mig_profile] for x in plan.instances) - 1e-9))


@dataclass
class _Point:
    """One single-app solve within a budget: its plan (None: none found) and its bound."""

    budget: Usage  # at most these slices and slots (the node's, when unbounded)
    plan: Plan | None
    value: float  # the plan's objective (-inf without a plan)
    bound: float  # upper bound on g(budget), hence on g(b) for every b <= budget
    used: Usage = (0, 0)
    seconds: float = 0.0  # what its solve took (the cheapest are tightened first)
    seeded: bool = False  # from earlier solves' facts (``value_curve``), not solved here


@dataclass
class _Frontier:
    """What is known of one app's g(b): the points solved, and the budgets proven infeasible."""

    points: list[_Point] = field(default_factory=list)
    infeasible: list[Usage] = field(default_factory=list)
    min_slots: dict[int, int] = field(default_factory=dict)  # k -> no plan on <= k slices has fewer
    # budgets whose solve found neither a plan nor a proof within its limit: one below them
    # would likely take as long (the search looks for plans elsewhere; their bounds stay)
    parked: list[Usage] = field(default_factory=list)
    retried: list[Usage] = field(default_factory=list)  # parked budgets solved once more

    def known(self, b: Usage) -> _Point | None:
        """The best solved point whose plan is optimal for budget b (its usage <= b <= its
        budget): of the highest value, then the tightest bound. Why the best and not the first:
        a point solved again to a smaller gap is added beside the first solve's, often with a
        better plan (60% of the example node: the first points chosen again and again left the
        node 0.008 short of its proof, and the joint model ran 5 s, unproven, at the end)."""
        best: _Point | None = None
        for p in self.points:
            if p.plan is not None and p.used[0] <= b[0] <= p.budget[0] and p.used[1] <= b[1] <= p.budget[1] \
                    and (best is None or (p.value, -p.bound) > (best.value, -best.bound)):
                best = p
        return best

    def upper(self, b: Usage) -> float:
        """An upper bound on g(b): g is nondecreasing in b, so the bound of any budget >= b."""
        if any(b[0] <= x[0] and b[1] <= x[1] for x in self.infeasible):
            return -math.inf
        if any(b[0] <= k and b[1] < m for k, m in self.min_slots.items()):
            return -math.inf
        return min((p.bound for p in self.points if p.budget[0] >= b[0] and p.budget[1] >= b[1]),
                   default=math.inf)

    def is_parked(self, b: Usage) -> bool:
        return any(b[0] <= x[0] and b[1] <= x[1] for x in self.parked)

    def grid(self, room: Usage, shape: budget_choice.Shape, avoid_parked: bool = False
             ) -> tuple[np.ndarray, np.ndarray]:
        """``upper`` at every budget within ``room``, tightened by ``shape`` (``shape_of``), and
        whether ``known`` is (``budget_choice``: the knapsack's view of this frontier).
        ``avoid_parked``: the budgets not known at or below a parked one taken out (a search
        for plans elsewhere, no longer a bound)."""
        refuted = [*self.infeasible, *((k, m - 1) for k, m in self.min_slots.items() if m >= 1)]
        est = budget_choice.estimates([(p.budget, p.bound) for p in self.points], refuted, room, shape)
        known = budget_choice.known_cells([(p.used, p.budget) for p in self.points if p.plan is not None],
                                          room)
        if avoid_parked:
            for k, m in self.parked:
                cell = est[:k + 1, :m + 1]
                cell[~known[:k + 1, :m + 1]] = -np.inf
        return est, known


@dataclass
class Result:
    status: str  # optimal | feasible | infeasible | no_solution
    plans: list[Plan | None]
    objective: float
    bound: float
    seconds: float
    layout: Layout | None
    solves: int  # single-app solves
    stage: str  # apart | frontier | joint
    notes: list[str] = field(default_factory=list)
    floors: list[float] | None = None  # per app, the screen's fewest slices (when it ran)
    # per app, what the decision proved about its budgets (``Known``): they hold at any larger
    # demand too (a plan for more serves less), which the scaled search's next tests reuse
    known: list[Known] | None = None
    # per app, every plan its solves found and the slices and slots it takes (``curves.record``)
    found: list[list[tuple[Usage, Plan]]] | None = None
    # per app, each point solved here (``value_curve.learn``): budget, plan, usage, value, bound
    solved: list[list[tuple[Usage, Plan | None, Usage, float, float]]] | None = None
    # per app, the budgets parked at the end (``solve(parked=)``: the scaled search's next tests)
    parked: list[list[Usage]] | None = None


@dataclass(frozen=True)
class Known:
    """Budgets of one app proven infeasible (no plan within those slices and slots) and its
    slot floors per slice budget, at some demand: both hold at every larger demand."""

    infeasible: tuple[Usage, ...] = ()
    min_slots: tuple[tuple[int, int], ...] = ()

    def budgets(self) -> list[Usage]:
        """Every budget proven infeasible, the slot floors' too (k slices, one slot fewer)."""
        return [*self.infeasible, *((k, m - 1) for k, m in self.min_slots if m >= 1)]

    @staticmethod
    def of(refuted: Sequence[Usage], room: Usage) -> Known:
        """The ``Known`` of refuted budgets (``curves.Curve.refuted_at``): one with every slot of
        the node infeasible, one with fewer a slot floor."""
        floors: dict[int, int] = {}
        for k, m in refuted:
            if m < room[1]:
                floors[k] = max(floors.get(k, 0), m + 1)
        return Known(tuple(b for b in refuted if b[1] >= room[1]), tuple(sorted(floors.items())))


def slot_floor(part: joint.Part, node: Node, solver: str, max_slices: int, time_limit_s: float
               ) -> int | None:
    """A lower bound on the placement slots of any plan of ``part`` on at most ``max_slices``
    slices (None: no such plan): the latency-relaxed core (a relaxation) minimising slots."""
    built = joint.build([part], node, full=False, max_slices=max_slices)
    md = built.model
    size = {p.name: p.slot_cost for p in node.gpu.profiles}
    md.cost = [0.0] * md.num_vars
    for c, v in zip(built.cols[0], built.count[0], strict=True):
        md.cost[v] = -float(size[c.mig_profile])
    sol = md.solve(joint.stage_solver(solver), time_limit_s, 0.5, presolve=MIN_SLOTS_PRESOLVE,
                   max_nodes=FLOOR_NODES)
    if sol.status == "infeasible":
        return None
    dual = sol.dual_bound if not math.isnan(sol.dual_bound) else sol.bound
    if math.isnan(dual) or not math.isfinite(dual):
        return 0
    return max(0, math.ceil(-dual - 1e-6))


def floor_slices(parts: Sequence[joint.Part], node: Node, solver: str, time_limit_s: float,
                 lp: bool = False) -> list[float]:
    """Per part, a lower bound on the slices of any plan at its demand (inf: none serves it):
    the latency-relaxed core's ``slices`` objective, solved within ``time_limit_s`` (its dual
    bound holds whenever it stops; the objective is -beta x slices + a tie-break in [0, beta/2)).
    ``lp``: its linear relaxation only (milliseconds; weaker)."""
    out: list[float] = []
    for part in parts:
        md = joint.build([part], node, full=False, objective="slices").model
        if lp:
            md = dataclasses.replace(md, integer=[False] * md.num_vars)
        sol = md.solve(joint.stage_solver(solver), time_limit_s, 0.5 * node.beta,
                       max_nodes=None if lp else FLOOR_NODES)
        if sol.status == "infeasible":
            out.append(math.inf)
            continue
        dual = sol.dual_bound if not math.isnan(sol.dual_bound) else sol.bound
        out.append(0.0 if math.isnan(dual) or not math.isfinite(dual)
                   else slices_above(dual, node.beta))
    return out


def slices_above(bound: float, beta: float) -> float:
    """The fewest slices of any plan whose ``slices`` term (-beta x slices + an accuracy
    tie-break in [0, beta / 2)) is at most ``bound``: the tie-break is never negative, so slices
    >= -bound / beta. (Rounding -bound / beta - 1/2 up, as before, lost a slice whenever the
    bound lay in the upper half of its slice: at 100% of the example node the own optima's
    bounds gave 9 where 10 was proven, and a scaled test the floors refute went on to the
    frontier search, 8 solves against 3.)"""
    return float(max(0, math.ceil(-bound / beta - 1e-6)))


def value_floor(part: joint.Part, bound: float, node: Node, objective: str) -> float:
    """A lower bound on the slices of any plan of ``part`` at its demand, from ``bound`` (an upper
    bound on its objective term, ``joint.part_value``, over all its plans on the node).

    Why: it is free once the app's own optimum is solved. ``accuracy``: a plan's term is
    alpha x weight x accuracy - beta x slices, and its accuracy is at least the app's accuracy
    SLO (the PAS row) and at least its worst lane's, so slices >= (alpha x weight x that - bound)
    / beta. ``slices``: the accuracy tie-break is never negative, so slices >= -bound / beta
    (``slices_above``).
    """
    if not math.isfinite(bound):
        return 0.0
    beta = node.beta
    if objective == "slices":
        return slices_above(bound, beta)
    app = part.pb.app
    slo = app.accuracy_slo if app.accuracy_slo is not None else node.planner.accuracy_slo
    acc_lo = max(slo, min(part.pb.lane_acc, default=0.0))
    return float(max(0, math.ceil((node.planner.alpha * part.weight * acc_lo - bound) / beta - 1e-7)))


def shape_of(part: joint.Part, node: Node, objective: str, total_weight: float) -> budget_choice.Shape:
    """What bounds ``part``'s g without a solve (``budget_choice.Shape``): its objective term
    (``joint.part_value``) is at most its best lane's accuracy term less beta per slice, and
    beyond j slices a plan takes at least j plus the least share of a slice the planner counts
    (``slice_unit``); its profiles' slots per slice."""
    beta = node.beta
    acc = max(part.pb.lane_acc, default=1.0)
    top = 0.5 * beta * part.weight / total_weight * acc if objective == "slices" \
        else node.planner.alpha * part.weight * acc
    unit = slice_unit(node.gpu, node.mig_profiles)
    ratios = [p.slot_cost / p.slice_cost for p in node.gpu.profiles if p.slice_cost > 0]
    return budget_choice.Shape(top - beta / unit, beta, min(ratios, default=1.0), max(ratios, default=8.0),
                               unit)


def _best_choice(fronts: Sequence[_Frontier], tops: Sequence[Usage], room: Usage,
                 shapes: Sequence[budget_choice.Shape], avoid_parked: bool = False,
                 resolution: float = 0.0) -> tuple[float, list[Usage]] | None:
    """The knapsack's best choice of budgets over the frontiers (``budget_choice.best_choice``);
    ``avoid_parked``: among the budgets no parked solve left open (``_Frontier.grid``)."""
    grids = [f.grid(room, shape, avoid_parked) for f, shape in zip(fronts, shapes, strict=True)]
    return budget_choice.best_choice([g[0] for g in grids], [g[1] for g in grids], tops, room, resolution)


def solve(parts: Sequence[joint.Part], node: Node, *, solver: str, time_limit_s: float,
          objective: str, pack: Packer, absolute_gap: float | None = None,
          start: Sequence[Plan | None] | None = None, first_fit: bool = False,
          known: Sequence[Known | None] | None = None,
          seeds: Sequence[Sequence[Seed]] | None = None,
          parked: Sequence[Sequence[Usage]] | None = None) -> Result:
    """The node decision over ``parts`` (see the module doc); ``pack`` lays out a choice of plans.

    ``start``: per app, a verified plan at its demand (e.g. ``quick_plan_node``'s) that each
    app's own solve starts from; where none is given, the app's greedy plan (``quick_plan``).
    ``first_fit``: a test of whether the demands fit at all (the scaled search's): the first
    choice of the plans computed that packs together is the answer (``feasible``, or ``optimal``
    where the bound proves it), without going on to the best choice, and each app's own solve
    answers with its incumbent searches' plan (``joint.solve(first_plan=)``: its proof only
    where the plans do not fit); ``infeasible`` is proven as before. ``known``: per app, what an
    earlier decision at a smaller demand proved (``Result.known``) or the app's curve
    (``curves.seed``): its infeasible budgets and slot floors hold here too. ``Result.known`` and
    ``Result.found`` are what ``curves.learn`` keeps.
    ``seeds``: per app, what earlier solves give its budgets at this demand (``value_curve``):
    points known without a solve where their incumbent is within the node's gap of their bound,
    else incumbents and bounds for the solves; ``Result.solved`` is what ``value_curve.learn``
    keeps. ``parked``: per app, budgets an earlier decision at a smaller demand parked (no plan
    nor proof in its limit: one at more demand is no easier), parked here from the start (the
    plans sought elsewhere first, the budget solved once, longer, where no choice is left);
    ``Result.parked`` is this decision's.
    """
    t0 = time.perf_counter()
    room: Usage = (node.slices_available, NUM_PLACEMENT_SLOTS * node.num_gpus)
    fronts = [_Frontier() for _ in parts]
    for f, kn in zip(fronts, known or [None] * len(parts), strict=True):
        if kn is not None:
            f.infeasible.extend(kn.infeasible)
            for k, m in kn.min_slots:
                f.min_slots[k] = max(m, f.min_slots.get(k, 0))
    for f, held in zip(fronts, parked or [()] * len(parts), strict=True):
        f.parked.extend(held)
    res = _solve(parts, node, solver=solver, time_limit_s=time_limit_s, objective=objective,
                 pack=pack, absolute_gap=absolute_gap, start=start, first_fit=first_fit,
                 fronts=fronts, t0=t0, seeds=seeds)
    for f, least in zip(fronts, res.floors or [], strict=False):
        if least >= 1:  # no plan on fewer slices than the floor
            f.infeasible.append((int(min(least, room[0] + 1)) - 1, room[1]))
    res.known = [Known(tuple(f.infeasible), tuple(sorted(f.min_slots.items()))) for f in fronts]
    res.parked = [list(f.parked) for f in fronts]
    # (seeded plans too: a plan for this demand, which the curves keep as any other)
    res.found = [[(p.used, p.plan) for p in f.points if p.plan is not None] for f in fronts]
    res.solved = [[(p.budget, p.plan, p.used, p.value, p.bound) for p in f.points
                   if not p.seeded and (p.plan is not None or p.bound < math.inf)] for f in fronts]
    return res


def _solve(parts: Sequence[joint.Part], node: Node, *, solver: str, time_limit_s: float,
           objective: str, pack: Packer, absolute_gap: float | None, start: Sequence[Plan | None] | None,
           first_fit: bool, fronts: list[_Frontier], t0: float,
           seeds: Sequence[Sequence[Seed]] | None = None) -> Result:
    """``solve``'s body over the apps' frontiers (seeded with what is known)."""
    search = _Search(parts, node, solver, time_limit_s, objective, pack, absolute_gap, first_fit, fronts, t0)
    if seeds is not None:
        search.seeds = [search.seeded(i, s) for i, s in enumerate(seeds)]
    return search.run(start)


class _Search:
    """One node decision by decomposition (``solve``): its stages as methods over shared state
    (the apps' frontiers, the single-app solves counted, the clock)."""

    def __init__(self, parts: Sequence[joint.Part], node: Node, solver: str, time_limit_s: float,
                 objective: str, pack: Packer, absolute_gap: float | None, first_fit: bool,
                 fronts: list[_Frontier], t0: float) -> None:
        self.parts, self.node, self.solver, self.objective = parts, node, solver, objective
        self.time_limit_s, self.pack, self.first_fit, self.fronts, self.t0 = \
            time_limit_s, pack, first_fit, fronts, t0
        self.n = len(parts)
        self.gap_abs = node.absolute_gap if absolute_gap is None else absolute_gap
        self.delta = self.gap_abs / self.n  # each app's share of the stopping gap, where a proof needs it
        self.total_weight = sum(p.weight for p in parts) or 1.0
        self.room: Usage = (node.slices_available, NUM_PLACEMENT_SLOTS * node.num_gpus)
        self.solves = 0
        self.floors: list[float] | None = None
        self.stage = "apart"
        self.tops: list[Usage] = []  # each app's own optimum's usage (``own_optima``)
        self.shapes = [shape_of(p, node, objective, self.total_weight) for p in parts]
        # a test of whether demands fit (``first_fit``) asks for plans, not the best: choices
        # within the node's gap of each other are alike to it (``budget_choice.best_choice``)
        self.resolution = self.gap_abs if first_fit else 0.0
        self.seeds: list[list[_Point]] = [[] for _ in parts]  # per app, from ``value_curve``

    def seeded(self, i: int, seeds: Sequence[Seed]) -> list[_Point]:
        """App i's seeds as points, each valued here (its plan is one for this demand)."""
        part = self.parts[i]
        out = []
        for s in seeds:
            if s.plan is None:
                continue
            value = joint.part_value(s.plan, part, self.node, self.objective, self.total_weight)
            out.append(_Point(s.budget, s.plan, value, max(s.bound, value), s.used, 0.0, seeded=True))
        return out

    def left(self) -> float:
        return max(self.time_limit_s - self.elapsed(), 0.05 * self.time_limit_s)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def result(self, status: str, stage: str, notes: list[str], floors: list[float] | None = None,
               plans: list[Plan | None] | None = None, objective: float = math.nan,
               bound: float = math.nan, layout: Layout | None = None) -> Result:
        return Result(status, plans if plans is not None else [None] * self.n, objective, bound,
                      self.elapsed(), layout, self.solves, stage, notes, floors)

    def point(self, i: int, budget: Usage, start: tuple[Plan, float] | None = None,
              gap: float | None = None, first_plan: bool = False,
              limits_s: Sequence[float] | None = None) -> _Point:
        """g at ``budget`` for app i; ``start``: a known plan within the budget and its value;
        ``first_plan``: the incumbent searches' plan without its proof (``joint.solve``);
        ``limits_s``: the solve's tries (default: a ``first_fit`` test's two, else the time left)."""
        self.solves += 1
        t1 = time.perf_counter()
        room = self.room
        if limits_s is None:
            limits_s = (FIT_POINT_LIMIT_S, FIT_POINT_RETRY_S) if self.first_fit else (math.inf,)
        for limit in (min(self.left(), x) for x in limits_s):
            res = joint.solve([self.parts[i]], self.node, solver=self.solver, time_limit_s=limit,
                              objective=self.objective, absolute_gap=self.gap_abs if gap is None else gap,
                              start=[start[0]] if start is not None else None,
                              max_slices=budget[0] if budget[0] < room[0] else None,
                              max_slots=budget[1] if budget[1] < room[1] else None,
                              total_weight=self.total_weight, first_plan=first_plan)
            if res.plans[0] is not None or res.status == "infeasible" or self.left() <= limit:
                break
        plan = res.plans[0]
        if res.status == "infeasible":
            return _Point(budget, None, -math.inf, -math.inf)
        # proven (the solver's own); only an ``infeasible`` solve refutes the budget: a bound of
        # -inf without it is no proof (CBC's "no bound yet" once read so: ``cbc.solve``)
        bound = res.bound if not math.isnan(res.bound) and res.bound > -math.inf else math.inf
        if start is not None and (plan is None or start[1] > res.objective):
            plan, value = start
        elif plan is not None:
            value = res.objective
        else:
            return _Point(budget, None, -math.inf, bound)
        return _Point(budget, plan, value, max(bound, value), usage(plan, self.node),
                      time.perf_counter() - t1)

    def run(self, start: Sequence[Plan | None] | None) -> Result:
        screened = self.screen()
        if isinstance(screened, Result):
            return screened
        failed = self.own_optima(start) or self.overrun_floors(screened)
        if failed is not None:
            return failed
        self.cut_below_floors()
        if self.first_fit and all(f.points[0].plan is not None for f in self.fronts):
            got_fit = self.fitting()
            if got_fit is not None:
                return got_fit
        got = self.best_first()
        if isinstance(got, Result):
            return got
        bound, budgets, unsolved = got
        if self.first_fit and unsolved:
            # a test of whether the demands fit: the joint model below would rarely decide it in
            # the time such a test has; undecided, the caller keeps what it has shown
            return self.result("no_solution", self.stage,
                               ["a single-app solve found no plan within the limit"])
        best = self.incumbent(budgets, unsolved)
        if best is not None and bound - sum(q.value for q in best[0]) <= self.gap_abs + 1e-9:
            combo, layout = best
            return self.result("optimal", self.stage, [], plans=[q.plan for q in combo],
                               objective=sum(q.value for q in combo), bound=bound, layout=layout)
        return self.joint_decides(best, bound)

    def screen(self) -> Result | bool:
        """0. The latency-relaxed cores' fewest slices bound every app's share; their linear
        relaxations take milliseconds, the cores themselves (tighter) run only where those come
        near the node (a spike: the apps' own optima would be solved in vain). Whether the cores
        ran, or the answer where they prove that nothing fits."""
        room = self.room
        lp_floors = floor_slices(self.parts, self.node, self.solver, FLOOR_LIMIT_S, lp=True)
        if sum(lp_floors) < SCREEN_SHARE * room[0]:
            return False
        floors = self.floors = floor_slices(self.parts, self.node, self.solver, FLOOR_LIMIT_S)
        self.solves += self.n
        if sum(floors) > room[0]:
            alone = [self.parts[i].pb.app.name for i, f in enumerate(floors) if f > room[0]]
            return self.result("infeasible", "apart",
                               [f"{', '.join(alone)} alone does not fit on the node at its demand" if alone
                                else "the apps' fewest slices (latency relaxed) exceed the node together"],
                               floors)
        return True

    def own_optima(self, start: Sequence[Plan | None] | None) -> Result | None:
        """1. Each app's own optimum, started from its greedy plan (or the caller's ``start``);
        the answer where one alone does not fit."""
        for i, part in enumerate(self.parts):
            pb = part.pb
            mine = [q for q in self.seeds[i] if q.budget == self.room]
            if mine and mine[0].bound - mine[0].value <= self.gap_abs + 1e-9:
                # proven by earlier solves' facts: as a solve to the node's gap would give
                self.fronts[i].points.append(mine[0])
                continue
            quick = copy.deepcopy(start[i]) if start is not None else None  # the caller keeps its own
            if quick is None and mine:
                quick = mine[0].plan
            if quick is None and pb.profiles is not None and pb.colset.columns \
                    and part.demand_rps is not None:
                quick = quick_plan(pb.app, self.node, pb.profiles, part.demand_rps, factors=pb.factors,
                                   problem=pb)
            # a test of whether the demands fit: plans first, proofs where they do not fit
            p = self.point(i, self.room, (quick, joint.part_value(quick, part, self.node, self.objective,
                                                                  self.total_weight))
                           if quick is not None else None, first_plan=self.first_fit)
            if p.bound == -math.inf:
                self.fronts[i].infeasible.append(self.room)
                return self.result("infeasible", "apart",
                                   [f"{pb.app.name} alone does not fit on the node at its demand"])
            self.fronts[i].points.append(p)
        self.tops = [f.points[0].used for f in self.fronts]
        for f, mine in zip(self.fronts, self.seeds, strict=True):
            f.points += [q for q in mine if q.budget != self.room]
        return None

    def overrun_floors(self, screened: bool) -> Result | None:
        """Where the apps' own optima overrun the node, their bounds give each app a floor for
        free (``value_floor``); the latency-relaxed cores' fewest slices (a tighter bound, each
        within a small share of the time) run where those come near the node, and often prove
        at once that nothing fits (the answer then)."""
        room, n = self.room, self.n
        if screened or not any(sum(t[r] for t in self.tops) > room[r] for r in (0, 1)):
            return None
        floors = [value_floor(part, f.points[0].bound, self.node, self.objective)
                  for part, f in zip(self.parts, self.fronts, strict=True)] if VALUE_FLOORS else None
        if floors is None or room[0] - CORE_FLOOR_MARGIN * n < sum(floors) <= room[0]:
            core = floor_slices(self.parts, self.node, self.solver, FLOOR_LIMIT_S)
            floors = core if floors is None else [max(a, b) for a, b in zip(floors, core, strict=True)]
            self.solves += n
        self.floors = floors
        if sum(floors) > room[0]:
            return self.result("infeasible", "apart", ["the apps' fewest slices (latency relaxed) exceed "
                                                       "the node together"], floors)
        return None

    def cut_below_floors(self) -> None:
        """No plan of an app takes fewer slices than its floor (the core's) nor, with the
        ``slices`` objective, than its own optimum's bound proves: budgets below are out."""
        for i, f in enumerate(self.fronts):
            least = self.floors[i] if self.floors is not None else 0.0
            if self.objective == "slices" and math.isfinite(f.points[0].bound):
                least = max(least, slices_above(f.points[0].bound, self.node.beta))
            if least >= 1:
                f.infeasible.append((int(min(least, self.room[0] + 1)) - 1, self.room[1]))

    def fitting(self) -> Result | None:
        """``first_fit``: the best choice among the plans computed that packs (a few tries)."""
        room = self.room
        options = [[q for q in f.points if q.plan is not None] for f in self.fronts]
        combos = sorted((c for c in product(*options)
                         if all(sum(q.used[r] for q in c) <= room[r] for r in (0, 1))),
                        key=lambda c: -sum(q.value for q in c))
        for combo in combos[:FIRST_FIT_TRIES]:
            try:
                layout = self.pack([q.plan for q in combo if q.plan is not None])
            except PackingError:
                continue
            value = sum(q.value for q in combo)
            ub = sum(f.upper(f.points[0].budget) for f in self.fronts)
            return self.result("optimal" if ub - value <= self.gap_abs + 1e-9 else "feasible", "first-fit",
                               ["the first choice of plans that packs (a test of whether the demands fit)"],
                               plans=[q.plan for q in combo], objective=value, bound=ub, layout=layout)
        return None

    def best_first(self) -> Result | tuple[float, list[Usage], bool]:
        """2. Best-first over the budgets: g solved where the bound's best choice needs it. The
        bound, the best choice's budgets and whether a solve found no plan (the joint model
        decides then); or the answer (infeasible, or a ``first_fit`` test's plans)."""
        bound = math.inf
        budgets: list[Usage] = []
        tight: set[int] = set()  # the points solved to delta
        unsolved = any(f.points[0].plan is None for f in self.fronts)
        while not unsolved:
            got = _best_choice(self.fronts, self.tops, self.room, self.shapes, resolution=self.resolution)
            if got is None:
                # the floors go with it: the scaled search's first test starts from them
                return self.result("infeasible", self.stage, ["the apps' plans with the fewest slices and "
                                                              "MIG slots exceed the node together"],
                                   self.floors)
            bound, budgets = got
            todo = [i for i, b in enumerate(budgets) if self.fronts[i].known(b) is None]
            if any(self.fronts[i].is_parked(budgets[i]) for i in todo):
                # a budget no solve decided in its limit: the bound keeps it, and the plans are
                # sought in the best choice without it (its own budgets solved in turn); only
                # where there is none, a parked budget is solved once more, longer
                alt = _best_choice(self.fronts, self.tops, self.room, self.shapes, avoid_parked=True,
                                   resolution=self.resolution)
                if alt is None:
                    again = self.retry_parked(budgets, todo)
                    if isinstance(again, Result):
                        return again
                    unsolved = not again
                    continue
                budgets = alt[1]
                todo = [i for i, b in enumerate(budgets) if self.fronts[i].known(b) is None]
                if not todo:  # its plans, where they pack, are the incumbent (a test's: undecided)
                    unsolved = self.first_fit
                    break
            if not todo:
                if self.elapsed() > self.time_limit_s or not self.tighten(bound, budgets, tight):
                    break  # proven, or the incumbent below unproven
                continue
            if self.elapsed() > self.time_limit_s:
                unsolved = True
                break
            self.stage = "frontier"
            # every chosen budget's slot floor before any of them is solved: a floor takes a
            # fraction of a solve and often rules the choice out (the floors' sum over the node)
            # (the whole columns' first, each ruling out more than any budget's own)
            floors = sorted((k, i) for i in todo if (k := self.floor_needed(i, budgets[i])) is not None)
            if floors:
                self.slot_floor_at(floors[-1][1], floors[-1][0])
                continue
            step = self.frontier_step(todo[0], budgets[todo[0]])
            if step is not None:
                return step
        return bound, budgets, unsolved

    def tighten(self, bound: float, budgets: list[Usage], tight: set[int]) -> bool:
        """Every solve so far stopped within the node's gap of its own bound; where their sum
        leaves more than the node's gap, the chosen ones are solved again, the quickest first,
        each to what the others leave of the node's gap (at least its share), until the sum
        fits: the slowest is then often left alone or asked little. False: nothing to tighten
        (the best choice is proven, or every loose point was solved to its share)."""
        gap_abs, delta = self.gap_abs, self.delta
        chosen = [self.fronts[i].known(b) for i, b in enumerate(budgets)]
        loose = [i for i, q in enumerate(chosen) if q is not None and q.bound - q.value > delta + 1e-12
                 and id(q) not in tight]
        if bound - sum(q.value for q in chosen if q is not None) <= gap_abs + 1e-9 or not loose:
            return False
        for i in sorted(loose, key=lambda i: chosen[i].seconds):  # type: ignore[union-attr]
            q = chosen[i]
            assert q is not None
            spent = sum(x.bound - x.value for x in chosen if x is not None)
            if bound - sum(x.value for x in chosen if x is not None) <= gap_abs + 1e-9 or \
                    spent <= gap_abs + 1e-9:
                break
            others = spent - (q.bound - q.value)
            target = max(delta, gap_abs - others - 1e-9)
            if target >= q.bound - q.value:
                continue  # within what the others leave it already
            p = self.point(i, q.budget, (q.plan, q.value) if q.plan is not None else None, target)
            # both are plans within the same budget: the new bound holds for both
            was = q.bound
            q.bound = min(q.bound, max(p.bound, q.value))
            q.seeded = q.seeded and q.bound >= was - 1e-12  # a tighter bound is a fact learned here
            if target <= delta or q.bound >= was - 1e-9:
                # solved to its share, or the solver's bound did not move (it may stop on its
                # own gap test above the target): solving it again would repeat this solve
                tight.update((id(p), id(q)))
            if p.plan is not None and p.plan is not q.plan:
                p.bound = min(p.bound, q.bound)  # the same budget: both bounds hold for it
                self.fronts[i].points.append(p)
        return True

    def retry_parked(self, budgets: list[Usage], todo: list[int]) -> Result | bool:
        """A parked budget of the best choice solved again with ``FIT_POINT_RETRY_S`` (a
        ``first_fit`` test's first try at a frontier point is ``FIT_POINT_LIMIT_S`` only): whether
        one was left to retry, or a ``first_fit`` test's answer."""
        for i in todo:
            front = self.fronts[i]
            for x in front.parked:
                if budgets[i][0] <= x[0] and budgets[i][1] <= x[1] and x not in front.retried:
                    front.retried.append(x)
                    p = self.point(i, x, limits_s=(FIT_POINT_RETRY_S,) if self.first_fit else None)
                    if p.bound == -math.inf or p.plan is not None:
                        front.parked.remove(x)
                    return self.record(i, x, p) or True
        return False

    def record(self, i: int, probe: Usage, p: _Point) -> Result | None:
        """Point ``p`` of app i solved within ``probe`` into its frontier: refuted, a plan (a
        ``first_fit`` test's answer where the plans now pack), or neither (parked)."""
        front = self.fronts[i]
        if p.bound == -math.inf:
            front.infeasible.append(probe)
            return None
        front.points.append(p)
        if p.plan is None:
            if probe not in front.parked:
                front.parked.append(probe)
            return None
        return self.fitting() if self.first_fit else None

    def beside(self, i: int, budget: Usage) -> bool:
        """Whether ``budget`` lies beside app i's own optimum: as many slices or more, fewer slots
        (``frontier_step`` solves it with every slice of the node; ``floor_needed``). Never
        in a ``first_fit`` test, which asks for plans within the chosen budget quickly, not bounds."""
        top = self.tops[i]
        return budget[0] >= top[0] and budget[1] < top[1] and not self.first_fit

    def floor_needed(self, i: int, budget: Usage) -> int | None:
        """The slices of the next slot floor to take before app i's ``budget`` is solved (None:
        those known, or ``SLOT_FLOORS`` off). Beside the own optimum first the floor on every
        slice of the node: it rules out the whole column at once (at 90% of the example node
        every app's 0.005-0.12 s, where traffic_analysis's on 10 slices took 0.35-0.6 s for the
        same 11 slots); where it does not rule the budget out, the budget's own (more slices
        may take fewer slots: traffic_analysis at another 90% mix, 10 on every slice, 11 on 9)."""
        have = self.fronts[i].min_slots
        if not SLOT_FLOORS:
            return None
        if self.beside(i, budget) and self.room[0] not in have and budget[0] not in have:
            return self.room[0]
        return None if budget[0] in have else budget[0]

    def slot_floor_at(self, i: int, k: int) -> int | None:
        """App i's slot floor on k slices (``slot_floor``) into its frontier (None: no plan)."""
        front = self.fronts[i]
        self.solves += 1
        limit = self.left() if MIN_SLOTS_LIMIT_S is None else min(self.left(), MIN_SLOTS_LIMIT_S)
        floor = slot_floor(self.parts[i], self.node, self.solver, k, limit)
        if floor is None:
            front.infeasible.append((k, self.room[1]))
        else:
            front.min_slots[k] = floor
        return floor

    def frontier_step(self, i: int, budget: Usage) -> Result | None:
        """One new point of app i's frontier for the best choice's ``budget``: its slot floor
        first, then g (``record``). A ``first_fit`` test's answer, where its plans now pack."""
        front, room = self.fronts[i], self.room
        k = budget[0]
        while (need := self.floor_needed(i, budget)) is not None:
            floor = self.slot_floor_at(i, need)
            if floor is None or floor > budget[1]:
                return None
        # first the budget with every slot the app's own optimum took: its plan (often on
        # fewer slots) covers the budgets between, and its bound caps those it does not; above
        # those slots (fewer slices than its own optimum, more slots), every slot of the node:
        # its bound caps the whole row, where a budget one slot wider each time would not.
        # Beside it (as many slices or more, fewer slots), every slice of the node: its bound
        # caps the whole column, whose budgets the accuracy cap alone leaves about three slices
        # of headroom (90% of the example node: traffic_analysis's and ar_assistant's (28, 11)
        # in one solve each, against (9, 11) and (10, 11), (10, 11) and (11, 11) and a slot
        # floor, one at a time; the decision 2.4-2.5 s -> about 1 s)
        top = self.tops[i]
        wide = (room[0], budget[1]) if self.beside(i, budget) \
            else (k, top[1] if budget[1] <= top[1] else room[1])
        fresh = front.known(wide) is None and all(q.budget != wide for q in front.points)
        probe = wide if fresh else budget
        # not even a plan within the limit: its bound holds, the search goes elsewhere first
        p = self.point(i, probe, limits_s=(FIT_POINT_LIMIT_S,) if self.first_fit else None)
        return self.record(i, probe, p)

    def incumbent(self, budgets: list[Usage], unsolved: bool) -> tuple[tuple[_Point, ...], Layout] | None:
        """3. The best choice among the plans computed that packs onto the GPUs (the best
        choice's own first), and its layout; None when none packs."""
        room, n = self.room, self.n
        options = [sorted((q for q in f.points if q.plan is not None), key=lambda q: -q.value)
                   for f in self.fronts]
        combos: list[tuple[_Point, ...]] = []
        if not unsolved:
            chosen = [self.fronts[i].known(b) for i, b in enumerate(budgets)]
            combos.append(tuple(q for q in chosen if q is not None))
        combos += sorted(product(*options), key=lambda c: -sum(q.value for q in c))
        for combo in combos:
            if len(combo) != n or any(sum(q.used[r] for q in combo) > room[r] for r in (0, 1)):
                continue
            try:
                layout = self.pack([q.plan for q in combo if q.plan is not None])
            except PackingError:
                continue
            return combo, layout
        return None

    def joint_decides(self, best: tuple[tuple[_Point, ...], Layout] | None, bound: float) -> Result:
        """4. Unproven: the joint model, started from the incumbent and cut by the bound."""
        gap_abs = self.gap_abs
        incumbent: list[Plan | None] | None = None
        if best is not None:
            incumbent = [q.plan for q in best[0]]
            for plan, part in zip(incumbent, self.parts, strict=True):
                if plan is not None:
                    plan.layout = app_layout(best[1], part.pb.app.name)
        res = joint.solve(list(self.parts), self.node, solver=self.solver, time_limit_s=self.left(),
                          objective=self.objective, absolute_gap=gap_abs, start=incumbent, upper_bound=bound)
        b = bound if math.isnan(res.bound) else min(bound, res.bound)
        have = res.status in ("optimal", "feasible") and all(p is not None for p in res.plans)
        if best is not None and (not have or res.objective <= sum(q.value for q in best[0])):
            combo, layout = best
            value = sum(q.value for q in combo)
            return self.result("optimal" if b - value <= gap_abs + 1e-9 else "feasible", "joint",
                               ["the best choice of each app's plans did not pack: the joint model "
                                "decided, started from the best that packs"],
                               plans=[q.plan for q in combo], objective=value, bound=b, layout=layout)
        if not have:
            return self.result(res.status, "joint", [], bound=b)
        try:
            layout = self.pack([p for p in res.plans if p is not None])
        except PackingError:
            return self.result("no_solution", "joint", ["the joint model's plan did not pack"], bound=b)
        status = res.status if b - res.objective > gap_abs + 1e-9 else "optimal"
        return self.result(status, "joint", [], plans=list(res.plans), objective=res.objective, bound=b,
                           layout=layout)
