"""The tight planner model: one decision for one or several apps over a node's shared slices.

Same constraints as the reference model (``milp._Model``, DESIGN section 3: lanes, capacity per
(task, variant), latency per path, PAS accuracy, packable per-GPU layouts), solved in stages:

1. **Latency-relaxed core.** Each (task, variant, MIG profile) keeps one column: the one of
   highest throughput among those whose latency could be on a feasible path (2 L plus twice the
   fastest latency of every other task on the path within the SLO). The path constraints and
   their binaries are dropped. Any plan of the full model maps onto this one (each instance
   onto its group's column) with the same slices and at least the same capacity, so the core's
   optimum bounds the full optimum. It has about 15x fewer integer variables (traffic: 102
   against 1462 columns) and no big-M latency rows.
2. **Lifting.** With the core's instance counts and lane rates fixed, each task's latency cap
   is lowered to the smallest one at which the best column under the cap of every used group
   still covers the demand of every variant. If every path then meets its SLO, the lifted plan
   is feasible for the full model with the core's objective: it is optimal, proven by the core's
   bound. Otherwise:
3. **Latency levels.** Each task of an app whose lift failed chooses one of a few latency caps
   (binaries, one per task, over a handful of the task's column latencies plus the caps the core
   needed). Its columns are the core's columns under the chosen cap. Counted on the paths at
   the smallest latency each cap's interval admits, the model is a relaxation tighter than the
   core (its optimum is a bound; a solution that lifts is optimal); counted at the cap itself, a
   restriction (every solution is feasible: an incumbent, proven when within the gap of the
   bound). A relaxed solution that does not lift is cut off by splitting the levels just below
   the caps it needed, and the pair is solved again (a few rounds).
   Before the level models, and after each relaxed level model whose solution does not
   lift, the core restricted to a few splits of the SLO near the caps that solution needed
   (each task of a broken path giving way alone, then all in proportion) gives cheap
   incumbents: a relaxation's optimum usually has a twin within the gap under one of them.
   The maximum demand of one app (capacity mode) instead searches every maximal split of the
   SLO over the tasks' column latencies (``maximal_caps``): the full model's optimum is the
   largest of the cores restricted to them, each split's LP bounds its core, and the splits are
   solved in the order of those bounds until the rest are within the gap
   (``_max_over_splits``).
4. Only then the full model (the reference constraints, built as arrays) decides, with the best
   bound as a cut and the best incumbent as its start.

Every model is solved to the node's stopping gap (``Node.absolute_gap``: half a slice's cost by
default), and each restriction and the full model carry the best bound as an objective cut, so a
solver stops once its incumbent is within the gap of that bound rather than of its own.

Several apps share the slices, the per-GPU layout constraint and one slice total; the node's
objective weighs their accuracies (``accuracy``) or asks for the fewest slices with accuracy
as a tie-break only (``slices``).
"""

from __future__ import annotations

import bisect
import copy
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field

from jigsaw.mig import slice_unit
from jigsaw.node import Node
from jigsaw.plan import LanePlan, Plan, PlanInstance
from jigsaw.planner.columns import Column
from jigsaw.planner.groups import layout_budgets
from jigsaw.planner.model import LinearModel, Solution
from jigsaw.planner.problem import Problem, demand_terms, device_names, node_layouts, share_hosts
from jigsaw.planner.routes import settle_lanes

OBJECTIVES = ("accuracy", "slices")
MIN_DEMAND_RPS = 0.01
_RATE_EPS = 1e-9
_COVER_TOL = 1e-7
CAPACITY_RELATIVE_GAP = 1e-5
LEVELS_PER_TASK = 6
# The latency-relaxed core (tens of integer variables, a few dozen rows) is solved by HiGHS
# whichever solver the node names: on the example apps it proved the core 2-40x faster than
# CBC (ar_assistant 0.01-0.3 s against 0.4-3.8 s). Both are exact: the answer is the same.
CORE_SOLVER: str | None = "highs"  # None: the node's solver
SPLIT_SEARCH = True  # the default of ``solve(split_search=...)``
SPLIT_SOLVER: str | None = "highs"  # who solves the split search's restricted cores (None: the node's)


CORE_SOLVERS = ("auto", "same", "cbc", "highs")


def stage_solver(solver: str, core_solver: str = "auto") -> str:
    """The solver of a small stage (the core, a slot bound): ``auto``: ``CORE_SOLVER``;
    ``same``: ``solver`` (every stage on the node's solver, as before); else the one named."""
    if core_solver not in CORE_SOLVERS:
        raise ValueError(f"unknown core solver {core_solver!r} (expected {', '.join(CORE_SOLVERS)})")
    if core_solver == "auto":
        return CORE_SOLVER or solver
    return solver if core_solver == "same" else core_solver
REFINE_ROUNDS = 4
# HiGHS's presolve in ``_nothing_above``: off. ar_assistant at 201.53 rps (70% of the example
# node, its share): the model has a plan (no proof), found at the root in 0.23 s without presolve
# and after 1.0-1.3 s (56 nodes) with it; on the three apps at 10-100% of their capacities and
# at their shares of 50-90% of the node the answers are the same and no other solve was slower
NOTHING_ABOVE_PRESOLVE = False
# The grid search over SLO splits (``_try_grid``): its steps per half SLO, the share
# of the time limit its LP ranking may take, how many splits it solves and each one's share.
GRID_SEARCH = True
GRID_STEPS = 10
# The ranking is cut by count, not by the clock (None: no share): a busy machine ranks the same
# splits as a quiet one, so it solves the same ones and gives the same plan (36 splits for
# ar_assistant, about 8 ms each)
GRID_SHARE: float | None = None
GRID_RANKED = 64  # splits whose LP beats the incumbent, ranked at most
GRID_SOLVES = 3
# Each split's solve stops after GRID_SOLVE_NODES nodes (the same on a busy machine as on a quiet
# one), its time share only a guard: with 5% of the limit (0.5 s) and no node limit,
# ar_assistant at 80% found its 22 slices on a quiet machine and ran to the 10 s limit at load
# 7-10 (the split's solve takes 97 nodes, 0.8 s there); with the node limit it is proven in 2 s
GRID_SOLVE_NODES: int | None = 200
GRID_SOLVE_SHARE = 0.2
# The grid's solves go in two passes: first each of the GRID_SOLVES splits for GRID_FIRST_NODES
# node(s) (the root and its heuristics), then those not finished for GRID_SOLVE_NODES. Why:
# the LP ranks first a split whose integer optimum is worse (ar_assistant at 80%: 97 nodes to
# prove 0.108, where the second split's root already holds the optimum's 0.1315, proven by the
# bound); a root pass finds such an incumbent before any split's long search. None: one pass.
GRID_FIRST_NODES: int | None = 1
# The bound as an objective cut in the grid's solves: off. HiGHS took 0.7-1.1 s on that second
# split with the cut (5 nodes) and 0.2-0.34 s without it (the root); a grid solve's answer is
# checked against the bound all the same (``_result``).
GRID_CUT = False
# HiGHS's presolve in the grid's solves: off (the two splits above: 0.76-0.84 s and 0.29 s at
# their root without it, 1.26-1.45 s and 0.46 s with it, on a loaded machine)
GRID_PRESOLVE = False
# The maximum demand of one app searched over every maximal split of the SLO
# (``_max_over_splits``) where the core's plan does not lift, up to MAX_SPLITS splits, and the
# cheapest plan at it too (``solve(exact_splits=)``); beyond, and with CAPACITY_SPLITS off, the
# full model decides (as before)
CAPACITY_SPLITS = True
_SPLIT_LP_RPS = ("joint", "split capacity LP")  # its ``Problem.derived`` key
# per split, the most a plan found under it serves (its capacity solve's): at a demand up to that
# the split holds a plan, and it is solved first (``_ranked_splits``)
_SPLIT_SERVES = ("joint", "split serves")
_MAXIMAL_CAPS = ("joint", "maximal caps")  # ``maximal_caps``'s memo per problem
_CORE_COLUMNS = ("joint", "core columns")  # ``core_columns``'s memo per problem
MAX_SPLITS = 2048
# ... and where the LP bounds leave more than MAX_SPLIT_SOLVES splits to solve (a small node,
# where integrality takes a few percent off each split's LP: ar_assistant under ``ast`` on 4 GPUs),
# the full model decides, from the best plan found; each split after the first plan is asked only
# for a better one (a floor row): ar_assistant under ``ast`` on 120 GPUs refutes 29 so
MAX_SPLIT_SOLVES = 40
# ... and where ranking the splits by their LPs passes this share of the time limit (ar_assistant's
# 1101 splits: 5-6 s at load 15, too long for a plan above capacity within the node's 10 s)
SPLIT_RANK_SHARE = 0.25
# CBC's cutting planes in the capacity's core and in the maximal splits' cores (``_max_over_splits``,
# the capacity and the cheapest plan at it): off. These models are small (about 100 integer
# variables, 40 rows) and CBC's cut rounds cost more than the nodes they save: every app in all
# eight spaces on 120 GPUs (``bench/capacity.py --app all``) 26.9 -> 19.0 s, ar_assistant under
# ``ast`` 46 503 -> 27 617 nodes, the same capacities and plans.
CAPACITY_CUTS = False


def grid_caps(pb: Problem, steps: int = GRID_STEPS) -> list[dict[str, float]]:
    """Latency caps per task on a grid of ``steps`` per half SLO that meet every path and are
    maximal (no task's cap can grow a step), skipping those that leave a task no column."""
    app = pb.app
    half = app.latency_slo_ms / 2
    fastest = {t: min((c.latency_ms for c in pb.colset.columns if c.task == t), default=math.inf)
               for t in app.task_names}
    unit = half / steps
    low = {t: max(1, math.ceil(fastest[t] / unit - 1e-9)) for t in app.task_names}
    tasks = app.task_names
    out: list[dict[str, float]] = []

    def fits(k: dict[str, int]) -> bool:
        return all(sum(k[t] for t in p) <= steps for p in app.paths)

    def walk(j: int, k: dict[str, int]) -> None:
        if j == len(tasks):
            if all(not fits({**k, t: k[t] + 1}) for t in tasks):
                out.append({t: k[t] * unit for t in tasks})
            return
        t = tasks[j]
        for x in range(low[t], steps + 1):
            k[t] = x
            if not all(sum(k.get(u, low[u]) for u in p) <= steps for p in app.paths if t in p):
                break
            walk(j + 1, k)
        k.pop(t, None)

    walk(0, {})
    return out


def maximal_caps(pb: Problem, limit: int = MAX_SPLITS) -> list[dict[str, float]] | None:
    """Every maximal split of the latency SLO over the tasks' column latencies: per task a cap
    (one of its admissible column latencies) such that every path meets the SLO and no task can
    take its next larger latency. None when there are more than ``limit``.

    Why exact: a plan of the full model, with L(t) its slowest latency of task t, maps onto the
    core restricted to caps L (``core_columns(pb, L)``: each group's fastest-enough column
    carries at least as much on the same slices), and so onto the core under a maximal split
    above L; each such restricted core is a restriction of the full model. So the full model's
    optimum is the largest of the restricted cores' optima over these splits. A task whose paths'
    other tasks all come before it takes the largest latency they leave it (any smaller one is
    not maximal); the others are enumerated.
    """
    # kept per problem: the capacity and the cheapest plan at it walk the same splits (ar_assistant
    # under ``ast``: 1101 of them, 0.6 s each time)
    memo: dict[int, list[dict[str, float]] | None] = pb.derived.setdefault(_MAXIMAL_CAPS, {})
    if limit not in memo:
        memo[limit] = _maximal_caps(pb, limit)
    got = memo[limit]
    return None if got is None else [dict(k) for k in got]


def _maximal_caps(pb: Problem, limit: int) -> list[dict[str, float]] | None:
    """``maximal_caps``, computed."""
    app = pb.app
    lats = task_latencies(pb)
    tasks = app.task_names
    if any(not lats[t] for t in tasks):
        return []
    half = app.latency_slo_ms / 2 * (1 + 1e-12)
    through = {t: [p for p in app.paths if t in p] for t in tasks}
    fastest = {t: lats[t][0] for t in tasks}
    before: set[str] = set()
    determined = {}
    for t in tasks:
        determined[t] = all(u in before for p in through[t] for u in p if u != t)
        before.add(t)

    def room(t: str, k: dict[str, float]) -> float:
        return min((half - sum(k.get(u, fastest[u]) for u in p if u != t) for p in through[t]),
                   default=math.inf)

    out: list[dict[str, float]] = []
    k: dict[str, float] = {}

    def walk(j: int) -> bool:
        if j == len(tasks):
            for t in tasks:
                i = bisect.bisect_left(lats[t], k[t])
                if i + 1 < len(lats[t]) and lats[t][i + 1] <= room(t, k) + 1e-9:
                    return True  # not maximal
            out.append(dict(k))
            return len(out) <= limit
        t = tasks[j]
        top = bisect.bisect_right(lats[t], room(t, k) + 1e-9)
        for x in (lats[t][top - 1:top] if determined[t] else lats[t][:top]):
            k[t] = x
            if not walk(j + 1):
                return False
        k.pop(t, None)
        return True

    return out if walk(0) else None


@dataclass
class Part:
    """One app in a decision: its problem, its demand (None: maximise it), its weight."""

    pb: Problem
    demand_rps: float | None
    weight: float = 1.0
    max_rps: float | None = None  # cap on a variable demand
    # columns (``Column.key``) the running plan uses: among equally good columns, lifting keeps them
    keep: frozenset[tuple[str, str, str, int, int]] = frozenset()


@dataclass
class Built:
    model: LinearModel
    parts: list[Part]
    cols: list[tuple[Column, ...]]
    lam: list[list[int]]
    rate: list[int | None]  # the demand variable of a capacity part
    count: list[list[int]]  # M per column
    slices_total: int
    full: bool
    tv_slices: list[dict[tuple[str, str], int]] = field(default_factory=list)  # S[t,v] per part
    task_total: list[dict[str, int]] = field(default_factory=list)  # slices per task, per part
    layout_vars: list[tuple[int, dict[str, int]]] = field(default_factory=list)  # Y[g], layout g
    # per part of fixed demand: its rows "lane rates sum to r" and "accuracy >= slo x r" (else None)
    demand_rows: list[tuple[int, int] | None] = field(default_factory=list)
    # ``at_rate``'s per count variable: its bound without the demand, and instances per demand rps
    rate_bounds: list[tuple[int, float, float]] | None = None
    share_vars: dict[str, tuple[int, int]] = field(default_factory=dict)  # MIG share -> (J, k)
    # per part of fixed demand, its rows "a lane's (task, variant) has an instance": (row, counts in
    # it, the cover row's largest lane coefficient per demand rps)
    presence_rows: list[list[tuple[int, int, float]]] = field(default_factory=list)


@dataclass
class JointResult:
    status: str  # optimal | feasible | infeasible | no_solution
    plans: list[Plan | None]  # per part (no layout yet)
    objective: float
    bound: float
    seconds: float
    stage: str  # start | core | split | levels | restricted | full: which model gave the answer
    notes: list[str] = field(default_factory=list)


def part_value(plan: Plan, part: Part, node: Node, objective: str, total_weight: float) -> float:
    """One part's term of the model's objective (``build``) for ``plan`` (demand mode)."""
    beta = node.beta
    if objective == "slices":
        return 0.5 * beta * part.weight / total_weight * plan.accuracy - beta * plan.slices_used
    return node.planner.alpha * part.weight * plan.accuracy - beta * plan.slices_used


def _cap_max(pb: Problem) -> dict[str, float]:
    """Per task: the largest latency any column of it may have on every path through it."""
    app, cols = pb.app, pb.colset.columns
    fastest = {t: min((c.latency_ms for c in cols if c.task == t), default=math.inf)
               for t in app.task_names}
    cap = {t: math.inf for t in app.task_names}
    for p in app.paths:
        for t in p:
            rest = sum(2 * fastest[u] for u in p if u != t)
            cap[t] = min(cap[t], (app.latency_slo_ms - rest) / 2)
    return cap


def core_columns(pb: Problem, caps: dict[str, float] | None = None) -> tuple[Column, ...]:
    """The core's columns: per (task, variant, MIG profile) the highest-throughput admissible one.

    With ``caps`` (a latency cap per task meeting every path) the core is a restriction of the
    full model instead of a relaxation: every plan it finds is feasible.
    """
    # kept per problem and caps: the split searches ask for the same splits' columns several
    # times (ranking, building, again at the cheapest plan at the capacity: 3334 calls, 1 s)
    memo: dict[tuple | None, tuple[Column, ...]] = pb.derived.setdefault(_CORE_COLUMNS, {})
    key = None if caps is None else tuple(sorted(caps.items()))
    got = memo.get(key)
    if got is None:
        got = memo[key] = _core_columns(pb, caps)
    return got


def _core_columns(pb: Problem, caps: dict[str, float] | None) -> tuple[Column, ...]:
    """``core_columns``, computed."""
    cap = _cap_max(pb)
    if caps is not None:
        cap = {t: min(cap[t], caps.get(t, math.inf)) for t in cap}
    best: dict[tuple[str, str, str], Column] = {}
    for c in pb.colset.columns:
        if c.latency_ms > cap[c.task] + 1e-9:
            continue
        k = (c.task, c.variant, c.mig_profile)
        b = best.get(k)
        if b is None or (c.throughput_rps, -c.latency_ms) > (b.throughput_rps, -b.latency_ms):
            best[k] = c
    return tuple(c for c in pb.colset.columns if best.get((c.task, c.variant, c.mig_profile)) is c)


def level_columns(pb: Problem, levels: dict[str, list[float]]) -> list[tuple[Column, str, int]]:
    """The level model's columns: per task t and level k, the core's columns under ``levels[t][k]``.

    Each is returned with its task and level index; a column may appear at several levels.
    """
    cap = _cap_max(pb)
    out: list[tuple[Column, str, int]] = []
    for t in pb.app.task_names:
        for k, lev in enumerate(levels[t]):
            for c in core_columns(pb, {t: min(cap[t], lev)}):
                if c.task == t:
                    out.append((c, t, k))
    return out


def task_latencies(pb: Problem) -> dict[str, list[float]]:
    """Per task: the distinct latencies of its admissible columns, ascending (the values L(t) takes)."""
    cap = _cap_max(pb)
    return {t: sorted({c.latency_ms for c in pb.colset.columns
                       if c.task == t and c.latency_ms <= cap[t] + 1e-9})
            for t in pb.app.task_names}


def candidate_levels(pb: Problem, needed: dict[str, float], feasible: dict[str, float],
                     per_task: int = LEVELS_PER_TASK) -> dict[str, list[float]]:
    """Latency caps the level models choose from, per task (ascending, ending at the largest).

    ``per_task`` caps spread by rank over the task's distinct column latencies (the last is the
    largest admissible one, so the relaxed level model covers every plan), the caps the core's
    solution needed and the proportionally shrunk ones that meet every path (so the restricted
    level model contains the single restricted model of earlier versions).
    """
    lats = task_latencies(pb)
    out: dict[str, list[float]] = {}
    for t in pb.app.task_names:
        ls = lats[t]
        if not ls:
            out[t] = []
            continue
        n = len(ls)
        picks = {ls[min(n - 1, round(i * (n - 1) / max(1, per_task - 1)))] for i in range(per_task)}
        picks.add(ls[-1])
        for want in (needed.get(t), feasible.get(t)):
            if want is not None and ls[0] <= want <= ls[-1]:
                picks.add(ls[bisect.bisect_right(ls, want + 1e-9) - 1])  # the latency at the cap
        out[t] = sorted(picks)
    return out


def refine_levels(pb: Problem, levels: dict[str, list[float]],
                  needed: dict[str, float]) -> dict[str, list[float]] | None:
    """``levels`` with a split below each needed cap on a path the needed caps break.

    The relaxed level model counts level k on a path at the smallest column latency above level
    k - 1; a split just below the needed cap (at the next smaller column latency) makes the
    level the solution used count at the needed cap itself, which cuts that solution off.
    None when nothing new can be split (the levels are then exact for those tasks).
    """
    lats = task_latencies(pb)
    out = {t: list(v) for t, v in levels.items()}
    changed = False
    for p in pb.app.paths:
        if sum(2 * needed.get(t, 0.0) for t in p) <= pb.app.latency_slo_ms * (1 + 1e-12):
            continue
        for t in p:
            ls = lats[t]
            k = bisect.bisect_left(ls, needed.get(t, 0.0) - 1e-9)  # index of the needed cap
            for cand in (ls[k - 1] if k >= 1 else None, ls[k] if k < len(ls) else None):
                if cand is not None and all(abs(cand - x) > 1e-9 for x in out[t]):
                    out[t].append(cand)
                    changed = True
            out[t].sort()
    return out if changed else None


def build(parts: list[Part], node: Node, *, full: bool, objective: str = "accuracy",
          scale_demands: bool = False, caps: list[dict[str, float] | None] | None = None,
          levels: list[dict[str, list[float]] | None] | None = None,
          relax_levels: bool = False, max_slices: int | None = None,
          max_slots: int | None = None, total_weight: float | None = None) -> Built:
    """The model over ``parts``: the full one, or the latency-relaxed core (see the module doc).

    ``scale_demands``: serve the largest common fraction (at most 1) of every part's demand
    instead (the node's maximum-demand plan when the demands do not fit together).
    ``max_slices``, ``max_slots``: at most this many compute slices, and MIG placement slots
    (memory slices), in all (budgets below the node's: a point of an app's frontier,
    ``decompose``). ``total_weight``: the weights' sum the ``slices``
    objective's accuracy tie-break divides by (default: the parts'; a node's, when one app of
    it is planned alone as part of the node decision).

    A MILP model builder kept whole (the size rule's exception): it declares the variables and
    constraints of one model, read top to bottom as the module doc writes them.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r} (expected {', '.join(OBJECTIVES)})")
    md = LinearModel(maximize=True)
    beta = node.beta
    alpha = node.planner.alpha
    if total_weight is None:
        total_weight = sum(p.weight for p in parts) or 1.0
    budget = node.slices_available if max_slices is None else max(0, min(max_slices, node.slices_available))
    unit = slice_unit(node.gpu, node.mig_profiles)  # integer slice counts in k-ths of a slice (MIG shares)
    capacity_mode = scale_demands or any(p.demand_rps is None for p in parts)
    theta = md.var(0.0, 1.0, cost=1.0) if scale_demands else None
    max_per_gpu = {p.name: p.max_per_gpu for p in node.gpu.profiles}
    all_lam: list[list[int]] = []
    all_rate: list[int | None] = []
    all_cols: list[tuple[Column, ...]] = []
    all_count: list[list[int]] = []
    task_totals: list[int] = []
    tv_slices: list[dict[tuple[str, str], int]] = []
    presence: list[list[tuple[int, int, float]]] = []
    task_total: list[dict[str, int]] = []
    by_profile: dict[str, list[int]] = defaultdict(list)
    demand_rows: list[tuple[int, int] | None] = []
    for pi, part in enumerate(parts):
        pb, app = part.pb, part.pb.app
        lev = levels[pi] if levels else None
        leveled = level_columns(pb, lev) if lev is not None else []
        if lev is not None:
            cols = tuple(c for c, _, _ in leveled)
        else:
            cols = pb.colset.columns if full else core_columns(pb, caps[pi] if caps else None)
        slo_acc = app.accuracy_slo if app.accuracy_slo is not None else node.planner.accuracy_slo
        if part.demand_rps is None or theta is not None:
            acc_coef = [0.0] * len(pb.lanes)
        elif objective == "accuracy":
            r = max(part.demand_rps, MIN_DEMAND_RPS)
            acc_coef = [alpha * part.weight * a / r for a in pb.lane_acc]
        else:  # fewest slices; accuracy (at most 1 in total) only breaks ties between them
            r = max(part.demand_rps, MIN_DEMAND_RPS)
            acc_coef = [0.5 * beta * part.weight / total_weight * a / r for a in pb.lane_acc]
        lam = [md.var(cost=c) for c in acc_coef]
        rate: int | None = None
        if part.demand_rps is None or theta is not None:
            demand_rows.append(None)
        if part.demand_rps is None:
            rate = md.var(0.0, part.max_rps if part.max_rps is not None else math.inf, cost=1.0)
            md.row([*lam, rate], [1.0] * len(lam) + [-1.0], 0.0, 0.0)
            md.row([*lam, rate], [*pb.lane_acc, -slo_acc], lo=0.0)
            demand_ub = None
        elif theta is not None:
            r = max(part.demand_rps, MIN_DEMAND_RPS)
            md.row([*lam, theta], [1.0] * len(lam) + [-r], 0.0, 0.0)
            md.row([*lam, theta], [*pb.lane_acc, -slo_acc * r], lo=0.0)
            demand_ub = r
        else:
            r = max(part.demand_rps, MIN_DEMAND_RPS)
            demand_rows.append((md.row(lam, [1.0] * len(lam), r, r),
                                md.row(lam, pb.lane_acc, lo=slo_acc * r)))
            demand_ub = r
        terms = demand_terms(pb)
        max_mult = {tv: max(m for _, m in tr) for tv, tr in terms.items()}
        count = []
        for c in cols:
            ub = min(budget // c.slices, node.num_gpus * max_per_gpu[c.mig_profile])
            if demand_ub is not None:
                need = demand_ub * max_mult.get((c.task, c.variant), 0.0) / c.throughput_rps
                ub = min(ub, max(1, math.ceil(need - 1e-9)))
            count.append(md.var(0.0, ub, integer=True))
            by_profile[c.mig_profile].append(count[-1])
        if lev is not None:
            # one level per task; a column counts only under its task's chosen level
            z = {t: [md.var(0.0, 1.0, integer=True) for _ in lev[t]] for t in app.task_names}
            for t in app.task_names:
                md.row(z[t], [1.0] * len(z[t]), 1.0, 1.0)
            for j, (_, t, k) in enumerate(leveled):
                md.row([count[j], z[t][k]], [1.0, -md.col_hi[count[j]]], hi=0.0)
            if relax_levels:
                # level k stands for L(t) in (level k-1, level k]: the path counts the smallest
                # column latency in that interval (L(t) is always some column's latency)
                lats = task_latencies(pb)
                path_lat = {t: [lats[t][bisect.bisect_right(lats[t], lo + 1e-9)]
                                if k else lats[t][0]
                                for k, lo in enumerate([0.0, *lev[t][:-1]])]
                            for t in app.task_names}
            else:
                path_lat = lev
            for p in app.paths:
                md.row([v for t in p for v in z[t]], [2.0 * x for t in p for x in path_lat[t]],
                       hi=app.latency_slo_ms)
        if full:
            used = [md.var(0.0, 1.0, integer=True) for _ in cols]
            for j in range(len(cols)):
                md.row([count[j], used[j]], [1.0, -md.col_hi[count[j]]], hi=0.0)
                md.row([used[j], count[j]], [1.0, -1.0], hi=0.0)
            groups: dict[tuple[str, str, str], list[int]] = defaultdict(list)
            for j, c in enumerate(cols):
                groups[(c.task, c.variant, c.mig_profile)].append(j)
            for js in groups.values():
                if len(js) > 1:
                    md.row([used[j] for j in js], [1.0] * len(js), hi=1.0)
            lat = {t: md.var(0.0) for t in app.task_names}
            for j, c in enumerate(cols):
                md.row([lat[c.task], used[j]], [1.0, -c.latency_ms], lo=0.0)
            for p in app.paths:
                md.row([lat[t] for t in p], [2.0] * len(p), hi=app.latency_slo_ms)
        by_tv: dict[tuple[str, str], list[int]] = defaultdict(list)
        for j, c in enumerate(cols):
            by_tv[(c.task, c.variant)].append(j)
        tv_slices.append({})
        presence.append([])
        task_total.append({})
        for tv, tr in terms.items():
            js = by_tv.get(tv, [])
            if not js:
                for li, _ in tr:
                    md.row([lam[li]], [1.0], 0.0, 0.0)
                continue
            # Rows scaled by their largest throughput (CBC's presolve misjudges rows whose
            # coefficients reach 1e4 beside the unit coefficients of the lane rates).
            scale = 1.0 / max(cols[j].throughput_rps for j in js)
            md.row([count[j] for j in js] + [lam[li] for li, _ in tr],
                   [cols[j].throughput_rps * scale for j in js] + [-m * scale for _, m in tr], lo=0.0)
            if demand_ub is not None:
                # a lane that carries requests needs an instance of each (task, variant) it reaches:
                # the scaled row above lets a tiny rate (m x lam / the largest throughput within the
                # solver's tolerance: 0.01 rps beside 10^4) pass with none (a plan whose lane sent
                # classify to a variant it did not run). Only where the demand is that small
                # (``_presence``; elsewhere the row is empty, so the model solves as without it)
                per_rps = max(m for _, m in tr) * scale
                presence[-1].append((md.row([count[j] for j in js] + [lam[li] for li, _ in tr],
                                            [1.0] * len(js) + [_presence(demand_ub, per_rps)] * len(tr),
                                            lo=0.0), len(js), per_rps))
            s = md.var(0.0, node.slices_available * unit, integer=True)
            tv_slices[-1][tv] = s
            md.row([s] + [count[j] for j in js], [1.0] + [-float(cols[j].slices * unit) for j in js],
                   0.0, 0.0)
            best_per_slice = max(cols[j].throughput_rps / cols[j].slices for j in js)
            md.row([s] + [lam[li] for li, _ in tr],
                   [best_per_slice * scale / unit] + [-m * scale for _, m in tr], lo=0.0)
        budgets = pb.colset.budgets
        for t in app.task_names:
            bound = budgets.slices[t] if budgets else node.slices_available
            tot = md.var(0.0, bound * unit, integer=True)
            js = [j for j, c in enumerate(cols) if c.task == t]
            md.row([tot] + [count[j] for j in js], [1.0] + [-float(cols[j].slices * unit) for j in js],
                   0.0, 0.0)
            task_totals.append(tot)
            task_total[-1][t] = tot
        all_lam.append(lam)
        all_rate.append(rate)
        all_cols.append(cols)
        all_count.append(count)
    if max_slots is not None:
        size = {p.name: p.slot_cost for p in node.gpu.profiles}
        md.row([v for cs, cnt in zip(all_cols, all_count, strict=True) for v in cnt],
               [float(size[c.mig_profile]) for cs in all_cols for c in cs], hi=float(max_slots))
    slice_cost = -1e-6 if capacity_mode else -beta
    slices_total = md.var(0.0, budget * unit, cost=slice_cost / unit, integer=True)
    md.row([slices_total, *task_totals], [1.0] + [-1.0] * len(task_totals), 0.0, 0.0)
    # Packability: every GPU takes one maximal valid layout (or part of it) over all apps' profiles;
    # a MIG share's host instances: J of them hold k shares each (``problem.share_hosts``)
    names = sorted(by_profile)
    layouts = node_layouts(node, device_names(node, names))
    ys = [md.var(0.0, node.num_gpus, integer=True) for _ in layouts]
    for js, num_gpus in layout_budgets(node, layouts):  # one row per GPU group
        md.row([ys[j] for j in js], [1.0] * len(js), hi=float(num_gpus))
    held: dict[str, list[int]] = defaultdict(list)
    share_vars: dict[str, tuple[int, int]] = {}
    # the objective pays a shared instance whole (its empty seats too): J x its slices, not the shares'
    for cs, cnt in zip(all_cols, all_count, strict=True):
        for c, v in zip(cs, cnt, strict=True):
            if node.gpu.profile(c.mig_profile).host:
                md.cost[v] -= slice_cost * c.slices
    for name, (host, k) in share_hosts(node, names).items():
        j_var = md.var(0.0, float(node.num_gpus * max_per_gpu[host]),
                       cost=slice_cost * node.gpu.profile(host).compute_slices, integer=True)
        md.row(by_profile[name] + [j_var], [1.0] * len(by_profile[name]) + [-float(k)], hi=0.0)
        held[host].append(j_var)
        share_vars[name] = (j_var, k)
    for name in device_names(node, names):
        mine = by_profile.get(name, []) + held[name]
        md.row(mine + ys, [1.0] * len(mine) + [-float(lay[name]) for lay in layouts], hi=0.0)
    return Built(md, parts, all_cols, all_lam, all_rate, all_count, slices_total, full, tv_slices,
                  task_total, list(zip(ys, layouts, strict=True)), demand_rows, share_vars=share_vars,
                  presence_rows=presence)


PRESENCE_BELOW = 1e-2
"""The presence rows act where a lane carrying the whole demand has a cover row coefficient below
this: a lane of 1e-4 of it then falls within the solver's 1e-6 tolerance."""


def _presence(demand_rps: float, per_rps: float) -> float:
    """A presence row's lane coefficient at ``demand_rps``: -1/demand where the cover row cannot
    tell a tiny lane from none, else 0 (the row is empty: count >= 0)."""
    return -1.0 / demand_rps if demand_rps * per_rps < PRESENCE_BELOW else 0.0


def at_rate(built: Built, rate: float, objective: str = "accuracy") -> LinearModel:
    """The model of a one-part ``build`` (fixed demand, no levels, the node's whole slice budget)
    at demand ``rate`` instead: the same as building it again at ``rate``, in a fraction of the time.

    Why: the anytime planner solves the same few LP relaxations (per latency split, per objective)
    at every re-plan's demand; only the lane rates' costs, the two demand rows and the instance
    counts' bounds depend on the demand (``build``: ``acc_coef``, ``demand_ub``).
    """
    if len(built.parts) != 1 or not built.demand_rows or built.demand_rows[0] is None:
        raise ValueError("at_rate: a model of one part at a fixed demand only")
    part = built.parts[0]
    pb, node, md = part.pb, part.pb.node, built.model
    r = max(rate, MIN_DEMAND_RPS)
    cost = list(md.cost)
    alpha, beta = node.planner.alpha, node.beta
    for li, v in enumerate(built.lam[0]):
        a = pb.lane_acc[li]
        cost[v] = alpha * part.weight * a / r if objective == "accuracy" else 0.5 * beta * a / r
    row_lo, row_hi = list(md.row_lo), list(md.row_hi)
    sum_row, acc_row = built.demand_rows[0]
    row_lo[sum_row] = row_hi[sum_row] = float(r)
    slo_acc = pb.app.accuracy_slo if pb.app.accuracy_slo is not None else node.planner.accuracy_slo
    row_lo[acc_row] = float(slo_acc * r)
    col_hi = list(md.col_hi)
    if built.rate_bounds is None:
        max_per_gpu = {p.name: p.max_per_gpu for p in node.gpu.profiles}
        max_mult = {tv: max(m for _, m in tr) for tv, tr in demand_terms(pb).items()}
        built.rate_bounds = [
            (v, min(node.slices_available // c.slices, node.num_gpus * max_per_gpu[c.mig_profile]),
             max_mult.get((c.task, c.variant), 0.0) / c.throughput_rps)
            for c, v in zip(built.cols[0], built.count[0], strict=True)]
    for v, ub, per_rps in built.rate_bounds:
        col_hi[v] = float(min(ub, max(1, math.ceil(r * per_rps - 1e-9))))
    row_value = list(md.row_value)
    for row, n, per_rps in built.presence_rows[0] if built.presence_rows else ():
        row_value[row] = row_value[row][:n] + [_presence(r, per_rps)] * (len(row_value[row]) - n)
    return LinearModel(md.maximize, md.col_lo, col_hi, cost, md.integer, row_lo, row_hi,
                       md.row_index, row_value)


def _lift(built: Built, values: list[float], i: int) -> tuple[tuple[Column, ...] | None, dict[str, float]]:
    """Part i's core solution with each used group moved to its lowest sufficient latency cap.

    Returns the column of every core column (aligned), or None when no caps meet the paths,
    and the caps the solution needs.
    """
    part = built.parts[i]
    pb, app = part.pb, part.pb.app
    cols = built.cols[i]
    counts = [round(values[v]) for v in built.count[i]]
    demand = _lane_demand(pb, [max(0.0, values[v]) for v in built.lam[i]])
    # the columns of each used group, by latency, with the running best throughput
    groups: dict[tuple[str, str, str], list[Column]] = defaultdict(list)
    for c in pb.colset.columns:
        groups[(c.task, c.variant, c.mig_profile)].append(c)
    used = [(j, c) for j, c in enumerate(cols) if counts[j] > 0]
    ladders = {j: _ladder(groups[(c.task, c.variant, c.mig_profile)]) for j, c in used}
    caps = {t: _lowest_cap([(j, c) for j, c in used if c.task == t], t, ladders, counts, demand)
            for t in app.task_names}
    for p in app.paths:
        if sum(2 * caps[t] for t in p) > app.latency_slo_ms * (1 + 1e-12):
            return None, caps
    # The paths' slack goes to every task in proportion: the same instances then take the
    # highest-throughput columns the SLO allows (more headroom, and usually more MPS processes,
    # at the same slices and objective).
    stretch = min((app.latency_slo_ms / total for p in app.paths
                   if (total := sum(2 * caps[t] for t in p)) > 0), default=1.0)
    final = {t: caps[t] * max(1.0, stretch) * (1 - 1e-12) for t in app.task_names}
    out = list(cols)
    supply: dict[tuple[str, str], float] = defaultdict(float)
    for j, c in used:
        col = _best_under(ladders, j, final[c.task])
        assert col is not None
        out[j] = col
        supply[(c.task, c.variant)] += counts[j] * col.throughput_rps
    if part.keep:
        _keep_running(part.keep, out, used, groups, counts, final, supply, demand)
    return tuple(out), caps


def _lane_demand(pb: Problem, lam: list[float]) -> dict[tuple[str, str], float]:
    """The demand on each (task, variant) of the lanes' rates ``lam``."""
    app = pb.app
    demand: dict[tuple[str, str], float] = defaultdict(float)
    index = {t: k for k, t in enumerate(app.task_names)}
    for li, lane in enumerate(pb.lanes):
        if lam[li] > 0:
            for t in app.task_names:
                demand[(t, lane[index[t]])] += lam[li] * pb.lane_mult[li][t]
    return demand


def _ladder(group: list[Column]) -> tuple[list[float], list[Column]]:
    """A group's latencies in order, and at each the highest-throughput column at most that slow."""
    lats, best = [], []
    top: Column | None = None
    for col in sorted(group, key=lambda x: (x.latency_ms, -x.throughput_rps)):
        if top is None or col.throughput_rps > top.throughput_rps:
            top = col
        lats.append(col.latency_ms)
        best.append(top)
    return lats, best


def _best_under(ladders: dict[int, tuple[list[float], list[Column]]], j: int, cap: float) -> Column | None:
    """Core column j's best column within latency ``cap`` (None: none that fast)."""
    lats, best = ladders[j]
    k = bisect.bisect_right(lats, cap + 1e-12) - 1
    return best[k] if k >= 0 else None


def _lowest_cap(mine: list[tuple[int, Column]], t: str, ladders: dict[int, tuple[list[float], list[Column]]],
                counts: list[int], demand: dict[tuple[str, str], float]) -> float:
    """Task t's lowest latency cap at which its used columns (``mine``) still carry its demand
    (bisected over their latencies; the largest when none does; 0 for a task without one)."""
    if not mine:
        return 0.0
    levels = sorted({lat for j, _ in mine for lat in ladders[j][0]})

    def covers(cap: float) -> bool:
        supply: dict[str, float] = defaultdict(float)
        for j, c in mine:
            col = _best_under(ladders, j, cap)
            if col is None:
                return False
            supply[c.variant] += counts[j] * col.throughput_rps
        return all(supply[v] >= d * (1 - _COVER_TOL) - 1e-9
                   for (tt, v), d in demand.items() if tt == t and d > _RATE_EPS)

    lo, hi = 0, len(levels) - 1
    if not covers(levels[hi]):
        return levels[hi]
    while lo < hi:
        mid = (lo + hi) // 2
        if covers(levels[mid]):
            hi = mid
        else:
            lo = mid + 1
    return levels[lo]


def _keep_running(keep: frozenset[tuple[str, str, str, int, int]], out: list[Column],
                  used: list[tuple[int, Column]], groups: dict[tuple[str, str, str], list[Column]],
                  counts: list[int],
                  final: dict[str, float], supply: dict[tuple[str, str], float],
                  demand: dict[tuple[str, str], float]) -> None:
    """A column the running plan uses (``keep``), where it still carries the demand, replaces the
    lifted one in ``out``: the instances that run keep running (same slices, lanes and objective;
    only the MPS level or batch differ)."""
    for j, c in used:
        group = groups[(c.task, c.variant, c.mig_profile)]
        kept = [x for x in group if x.key in keep and x.latency_ms <= final[c.task]]
        if not kept or out[j].key in keep:
            continue
        k = max(kept, key=lambda x: x.throughput_rps)
        tv = (c.task, c.variant)
        after = supply[tv] + counts[j] * (k.throughput_rps - out[j].throughput_rps)
        if after >= demand.get(tv, 0.0) * (1 - _COVER_TOL):
            supply[tv] = after
            out[j] = k


def _cap_splits(pb: Problem, needed: dict[str, float]) -> list[dict[str, float]]:
    """Latency caps that meet every path, near the caps a core solution ``needed``: per task on
    a broken path, that task alone cut to what the others leave it; then every task of a
    broken path cut in proportion (``_feasible_caps``). Distinct, in that order."""
    app = pb.app
    out: list[dict[str, float]] = []
    for t in app.task_names:
        cap = dict(needed)
        for p in app.paths:
            if t in p:
                rest = sum(2 * needed[u] for u in p if u != t)
                cap[t] = min(cap[t], (app.latency_slo_ms - rest) / 2)
        if 0 < cap[t] < needed[t] - 1e-9:
            out.append(_feasible_caps(pb, cap))
    out.append(_feasible_caps(pb, needed))
    distinct: list[dict[str, float]] = []
    for c in out:
        if all(any(abs(c[t] - d[t]) > 1e-9 for t in c) for d in distinct):
            distinct.append(c)
    return distinct


def _feasible_caps(pb: Problem, needed: dict[str, float]) -> dict[str, float]:
    """Caps that meet every path, in the proportions ``needed`` asked for (shrunk where over)."""
    app = pb.app
    factor = {t: 1.0 for t in app.task_names}
    for p in app.paths:
        total = sum(2 * needed[t] for t in p)
        if total > app.latency_slo_ms:
            for t in p:
                factor[t] = min(factor[t], app.latency_slo_ms / total)
    return {t: needed[t] * factor[t] for t in app.task_names}


def _extract(built: Built, values: list[float], i: int, cols: tuple[Column, ...], status: str,
             solve_s: float, gap: float) -> Plan:
    part = built.parts[i]
    pb, app, node = part.pb, part.pb.app, part.pb.node
    counts: dict[tuple[str, str, str, int, int], tuple[Column, int]] = {}
    for j, v in enumerate(built.count[i]):
        n = round(values[v])
        if n > 0:
            c = cols[j]
            prev = counts.get(c.key)
            counts[c.key] = (c, n + (prev[1] if prev else 0))
    instances = [PlanInstance(c.task, c.variant, c.mig_profile, c.mps, c.batch, n, c.latency_ms,
                              c.throughput_rps, c.slices)
                 for c, n in sorted(counts.values(), key=lambda x: (app.task_names.index(x[0].task),
                                                                    x[0].variant, x[0].slices,
                                                                    x[0].mig_profile, x[0].mps,
                                                                    x[0].batch))]
    lam = [max(0.0, values[v]) for v in built.lam[i]]
    total = sum(lam) or 1.0
    lanes = settle_lanes(app, [LanePlan(app.lane_dict(pb.lanes[li]), rate) for li, rate in enumerate(lam)
                               if rate > _RATE_EPS * max(1.0, total)], instances, pb.factors)
    accuracy = sum(pb.lane_acc[li] * lam[li] for li in range(len(lam))) / total
    task_latency = {t: max((x.latency_ms for x in instances if x.task == t), default=0.0)
                    for t in app.task_names}
    slices_used = sum(x.count * x.slices for x in instances)
    demand = part.demand_rps if part.demand_rps is not None else total
    planned = sum(lam)
    if part.demand_rps is not None and abs(planned - demand) <= 1e-9 * max(1.0, demand):
        planned = demand  # the rates' row holds it exactly; the sum of a solver's floats may not
    slo_acc = app.accuracy_slo if app.accuracy_slo is not None else node.planner.accuracy_slo
    return Plan(
        app=app.name, space=pb.space.name, demand_rps=demand, planned_rps=planned,
        feasible=True, max_demand_plan=False, status=status,
        objective=node.planner.alpha * accuracy - node.beta * slices_used, accuracy=accuracy,
        slices_used=slices_used, slices_available=node.slices_available, solve_seconds=solve_s,
        gap=gap, instances=instances, lanes=lanes, task_latency_ms=task_latency, node=node.name,
        gpu_model=node.gpu.name, latency_slo_ms=app.latency_slo_ms, accuracy_slo=slo_acc,
        columns_total=pb.colset.num_candidates, columns_pruned=len(pb.colset.columns),
        solver=node.planner.solver,
    )


def _start(full: Built, best: JointResult | None) -> dict[int, float] | None:
    """The restricted plan as a (partial) start of the full model: instance counts and their binaries."""
    if best is None:
        return None
    start: dict[int, float] = {}
    for i, plan in enumerate(best.plans):
        if plan is None:
            return None
        have = {(x.task, x.variant, x.mig_profile, x.mps, x.max_batch): x.count for x in plan.instances}
        for j, c in enumerate(full.cols[i]):
            start[full.count[i][j]] = float(have.get(c.key, 0))
    return start


def _result(built: Built, sol: Solution, cols: list[tuple[Column, ...] | None], ub: float,
            gap_abs: float, rel_gap: float, capacity_mode: bool, t0: float, stage: str) -> JointResult:
    """A lifted solution as a result: optimal when within the gap of the bound ``ub``."""
    secs = time.perf_counter() - t0
    gap = max(0.0, ub - sol.objective)
    status = "optimal" if gap <= max(gap_abs, rel_gap * abs(ub)) else "feasible"
    plan_gap = math.inf if capacity_mode else (0.0 if status == "optimal" else gap)
    plans: list[Plan | None] = [_extract(built, sol.values, i, c, status, secs, plan_gap)
                                for i, c in enumerate(cols) if c is not None]
    return JointResult(status, plans, sol.objective, ub, secs, stage)


def _nothing_above(parts: list[Part], node: Node, shape: dict, floor: float, cut: float, how: str,
                   limit_s: float, gap_abs: float) -> str:
    """Whether the latency-relaxed core (a relaxation of the full model) has no plan of
    objective at least ``floor``: ``infeasible`` (proven within ``limit_s``, which bounds the
    full model's optimum by ``floor``), ``found`` (it has one) or ``open`` (the limit came first).
    ``cut``: a known bound on the objective (inf: none)."""
    built = build(parts, node, full=False, **shape)
    nz = [(k, c) for k, c in enumerate(built.model.cost) if c]
    built.model.row([k for k, _ in nz], [c for _, c in nz], lo=floor)
    if math.isfinite(cut):
        _objective_cut(built.model, cut)
    sol = built.model.solve(how, limit_s, gap_abs, presolve=NOTHING_ABOVE_PRESOLVE)
    return "infeasible" if sol.status == "infeasible" else "found" if sol.has_incumbent else "open"


def _mark_optimal(res: JointResult, bound: float | None = None, plan_gap: float = 0.0) -> None:
    """Label ``res`` and each of its plans proven optimal (``bound``: the bound that proves it)."""
    res.status = "optimal"
    if bound is not None:
        res.bound = bound
    for p in res.plans:
        if p is not None:
            p.status, p.gap = "optimal", plan_gap


def _better(best: JointResult | None, new: JointResult) -> JointResult:
    return new if best is None or new.objective > best.objective else best


def _objective_cut(model: LinearModel, bound: float) -> None:
    """objective <= bound (a relaxation's optimum), as a row."""
    nz = [(k, c) for k, c in enumerate(model.cost) if c]
    model.row([k for k, _ in nz], [c for _, c in nz], hi=bound + 1e-7)


def _proven(sol: Solution) -> float:
    """The solve's proven upper bound on its model's optimum (inf when unknown): the solver's own
    bound, which an ``optimal`` solve may leave up to the stopping gap above its objective."""
    for b in (sol.dual_bound, sol.bound):
        if not math.isnan(b) and math.isfinite(b):
            return max(b, sol.objective) if not math.isnan(sol.objective) else b
    return math.inf


def _gap(sol: Solution) -> float:
    if sol.status == "optimal":
        return 0.0
    if math.isnan(sol.bound) or math.isnan(sol.objective):
        return math.inf
    return abs(sol.bound - sol.objective)


def _core_start(core: Built, plans: list[Plan | None] | None) -> dict[int, float] | None:
    """Known plans (e.g. the anytime incumbents) as a start of the core: each instance counted
    on its group's core column (which carries at least as much), lane rates as they are."""
    if not plans or any(p is None for p in plans):
        return None
    start: dict[int, float] = {}
    unit = 1
    for i, plan in enumerate(plans):
        assert plan is not None
        pb = core.parts[i].pb
        unit = slice_unit(pb.node.gpu, pb.node.mig_profiles)
        group = {(c.task, c.variant, c.mig_profile): j for j, c in enumerate(core.cols[i])}
        counts: dict[int, int] = defaultdict(int)
        for x in plan.instances:
            j = group.get((x.task, x.variant, x.mig_profile))
            if j is None:
                return None
            counts[j] += x.count
        for j in range(len(core.cols[i])):
            start[core.count[i][j]] = float(counts.get(j, 0))
        lane_index = {tuple(lane): li for li, lane in enumerate(pb.lanes)}
        rates = [0.0] * len(pb.lanes)
        for lp in plan.lanes:
            li = lane_index.get(tuple(lp.variants[t] for t in pb.app.task_names))
            if li is None:
                return None
            rates[li] += lp.rate_rps
        for li, v in enumerate(core.lam[i]):
            start[v] = rates[li]
        for (t, v), var in core.tv_slices[i].items():
            start[var] = float(round(unit * sum(x.count * x.slices for x in plan.instances
                                                if (x.task, x.variant) == (t, v))))
        for t, var in core.task_total[i].items():
            start[var] = float(round(unit * sum(x.count * x.slices for x in plan.instances if x.task == t)))
    start[core.slices_total] = float(round(unit * sum(p.slices_used for p in plans if p is not None)))
    # every GPU of the plans' layouts on a maximal layout that contains it
    per_gpu: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    shared: set[tuple[int, int, str]] = set()
    gpu_model = core.parts[0].pb.node.gpu
    for plan in plans:
        if plan is None or plan.layout is None:
            return None
        for g in plan.layout.gpus:
            for x in g.instances:
                if x.profile in core.share_vars:  # a shared MIG instance: its host, once (any app's)
                    shared.add((g.gpu, x.start, x.profile))
                else:
                    per_gpu[g.gpu][x.profile] += 1
    for gpu, _, name in shared:
        per_gpu[gpu][gpu_model.profile(name).host] += 1
    for name, (var, _) in core.share_vars.items():
        start[var] = float(sum(1 for _, _, n in shared if n == name))
    ys = {y: 0 for y, _ in core.layout_vars}
    for want in per_gpu.values():
        if not any(want.values()):
            continue
        for y, lay in core.layout_vars:
            if all(lay.get(name, 0) >= n for name, n in want.items()):
                ys[y] += 1
                break
        else:
            return None
    for y, n in ys.items():
        start[y] = float(n)
    return start


def _max_over_splits(parts: list[Part], node: Node, shape: dict, solver: str, t0: float,
                     time_limit_s: float, gap_abs: float, rel_gap: float, capacity_mode: bool = True
                     ) -> tuple[JointResult | None, float] | None:
    """The maximum demand of one part as the largest of the cores restricted to each maximal
    split of the SLO (``maximal_caps``: exact, no full model): each split's LP relaxation bounds
    its core (milliseconds), the splits are solved in the order of their bounds, and a split
    whose bound is within the gap of the best plan found is not solved. Returns the best plan
    (None if no split has one) and the bound over every split (its proof), or None when the
    splits are more than ``MAX_SPLITS`` or ranking them passes ``SPLIT_RANK_SHARE`` of the limit.

    Why: traffic_analysis under ``ast`` on 120 GPUs has 39 splits; the full model took 57 s in
    HiGHS (3620 nodes) and 19 s in CBC, the best split's core 0.6-1.1 s, and every split but
    the best three is refuted by its LP bound. At a fixed demand (``capacity_mode`` False) the
    same holds for the objective: near an app's capacity (the cheapest plan at it) only a few
    splits' LPs are feasible at all.
    """
    ranked = _ranked_splits(parts, node, shape, capacity_mode, t0 + SPLIT_RANK_SHARE * time_limit_s)
    if ranked is None:
        return None
    best: JointResult | None = None
    bound = -math.inf  # over the splits solved so far, then the first one not solved
    solves = 0
    top = max((x for x, _, _, _ in ranked), default=-math.inf)
    serves: dict[tuple, float] = parts[0].pb.derived.setdefault(_SPLIT_SERVES, {})
    plain = _plain_capacity(parts, shape, capacity_mode)
    for k, (lp_bound, _, built, key) in enumerate(ranked):
        if best is not None and lp_bound - best.objective <= max(gap_abs, rel_gap * abs(lp_bound)):
            bound = max(bound, lp_bound)  # this split and all below it: within the gap
            break
        # the splits still above the best plan (the ranking's first is solved in any case; at a
        # demand, with no plan yet, every split left: on 4 GPUs ar_assistant's cheapest plan at
        # its capacity under ``st`` has 97 splits whose LPs reach it and whose cores do not)
        above = (1 if capacity_mode else len(ranked) - k) if best is None else \
            sum(1 for x, _, _, _ in ranked[k:] if x - best.objective > max(gap_abs, rel_gap * abs(x)))
        left = time_limit_s - (time.perf_counter() - t0)
        if left <= 0 or solves + above > MAX_SPLIT_SOLVES:
            bound = max(bound, lp_bound)  # too many splits left open: the full model decides
            break
        solves += 1
        floor = None
        if best is not None:
            # only a plan better than the best by the gap matters: a split with none is refuted
            # by its infeasibility, usually sooner than its own optimum is proven
            floor = best.objective + max(gap_abs, rel_gap * abs(best.objective))
            nz = [(j, c) for j, c in enumerate(built.model.cost) if c]
            built.model.row([j for j, _ in nz], [c for _, c in nz], lo=floor)
        sol = built.model.solve(solver, left, gap_abs, relative_gap=rel_gap, cuts=CAPACITY_CUTS)
        if sol.status == "infeasible":
            if floor is not None:
                bound = max(bound, floor)  # nothing of this split above the floor
            continue
        if not sol.has_incumbent:
            bound = max(bound, lp_bound)
            continue
        bound = max(bound, min(_proven(sol), lp_bound))
        cols, _ = _lift(built, sol.values, 0)
        if cols is None:  # the split's caps meet every path: never (kept as a guard)
            bound = max(bound, lp_bound)
            continue
        # labelled against the bound over every split (the ranking's largest); the caller decides
        got = _result(built, sol, [cols], top, gap_abs, rel_gap, capacity_mode, t0, "splits")
        if plain and got.plans[0] is not None:
            serves[key] = max(serves.get(key, 0.0), got.plans[0].planned_rps)
        best = _better(best, got)
    if best is not None:
        bound = max(bound, best.objective)
    return best, bound


def _plain_capacity(parts: list[Part], shape: dict, capacity_mode: bool) -> bool:
    """The app's capacity on the whole node (no rate cap, slice or slot budget): what its splits'
    capacities, kept per problem, are facts of."""
    return capacity_mode and parts[0].max_rps is None and not any(
        shape[k] is not None for k in ("max_slices", "max_slots"))


def _ranked_splits(parts: list[Part], node: Node, shape: dict, capacity_mode: bool, until: float
                   ) -> list[tuple[float, int, Built, tuple]] | None:
    """Part 0's restricted cores over the maximal splits with their LP bounds, best first; None
    where the splits are more than ``MAX_SPLITS`` or the clock passes ``until`` (the ranking
    alone would take the time: the full model decides)."""
    pb = parts[0].pb
    splits = maximal_caps(pb, MAX_SPLITS)
    if splits is None:
        return None
    # each split's capacity LP, kept per problem: at a demand above it the split is infeasible
    # (its LP is not built again: ar_assistant's cheapest plan at its capacity keeps 29 of 1101)
    lp_rps: dict[tuple, float] = pb.derived.setdefault(_SPLIT_LP_RPS, {})
    plain = _plain_capacity(parts, shape, capacity_mode)
    demand = parts[0].demand_rps
    models: dict[tuple, Built] = {}
    for caps in splits:  # splits that leave every group the same column are one model
        if time.perf_counter() > until:
            return None
        key = tuple(c.key for c in core_columns(pb, caps))
        if key not in models and not (demand is not None and lp_rps.get(key, math.inf) < demand):
            models[key] = build(parts, node, full=False, caps=[caps], **shape)
    ranked: list[tuple[float, int, Built, tuple]] = []
    for k, (key, built) in enumerate(models.items()):
        if time.perf_counter() > until:
            return None
        lp = built.model.relaxation("highs")
        if plain:  # the rate, up to the slices' tie-break (1e-6 each)
            lp_rps[key] = lp.objective + 1e-3 if lp.has_incumbent else -math.inf
        if lp.has_incumbent:
            ranked.append((lp.objective, k, built, key))
    ranked.sort(key=lambda x: (-x[0], x[1]))
    # at a demand, a split known to hold a plan there (its capacity solve served as much) first:
    # its optimum is a floor that refutes the splits above it sooner (ar_assistant's cheapest
    # plan at its capacity on 120 GPUs: four splits with no plan at it, each solved without one)
    serves: dict[tuple, float] = pb.derived.get(_SPLIT_SERVES, {})
    held = [j for j, (_, _, _, key) in enumerate(ranked)
            if demand is not None and serves.get(key, -math.inf) >= demand]
    if held and held[0] > 0:
        ranked.insert(0, ranked.pop(held[0]))
    return ranked


@dataclass
class _Search:
    """One ``solve``'s state, shared by its stages: what every model is built and solved with,
    the clock, and what the stages improve: the best incumbent (``best``) and the best proven
    bound on the full model's objective (``ub``: the core's, then the level models')."""

    parts: list[Part]
    node: Node
    shape: dict
    solver: str
    time_limit_s: float
    t0: float
    gap_abs: float
    rel_gap: float
    capacity_mode: bool
    core_how: str  # who solves the core and the proofs against it
    split_search: bool
    exact_splits: bool = False
    first_plan: bool = False  # ``solve(first_plan=)``
    best: JointResult | None = None
    ub: float = math.inf
    # ``prove``'s questions (floor, bound) not answered "infeasible": whether the core had a plan
    # above the floor, how often asked, the longest limit
    asked: dict[tuple[float, float], tuple[bool, int, float]] = field(default_factory=dict)

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.t0

    def left_s(self) -> float:
        """The time left, never under a twentieth of the limit (a stage still gets a try)."""
        return max(self.time_limit_s - self.elapsed_s(), 0.05 * self.time_limit_s)

    def proven(self) -> bool:
        return self.best is not None and self.best.status == "optimal"

    def take(self, got: JointResult | None) -> bool:
        """Keep ``got`` where it beats the best; whether the best is now proven optimal."""
        if got is None:
            return False
        self.best = _better(self.best, got)
        return self.best.status == "optimal"

    def core(self, caps: list[dict[str, float] | None] | None = None) -> Built:
        """The latency-relaxed core (``caps``: restricted to a latency cap per task instead)."""
        return build(self.parts, self.node, full=False, caps=caps, **self.shape)

    def prove(self, spent_s: float) -> None:
        """The core's stop leaves its bound up to the gap above its own incumbent: where that is
        all that keeps the best incumbent from a proof, ask the core for a plan better than it
        by the gap. None exists (infeasible): the incumbent is optimal."""
        best = self.best
        if best is None or best.status == "optimal" or self.ub - best.objective > 2 * self.gap_abs:
            return
        # The same question asked again (the grid's splits often find the same best under the
        # same bound: ar_assistant at 1059 rps on 16 GPUs asked it 7 times, 2.6 of 4.5 s) has the
        # same answer: a plan found stays found. One that ran out of its limit is asked once more
        # with twice that limit, then not again with no longer a limit: on a loaded machine the
        # root alone can outlast the first limit (ar_assistant at 1109 rps on 16 GPUs: proven in
        # 0.36 s on a quiet machine, out of its 0.77 s at load 5, and the level models after it
        # took the rest of the 10 s unproven).
        floor, limit = best.objective + self.gap_abs, max(spent_s, 0.05 * self.time_limit_s)
        key = (floor, self.ub)
        tried = self.asked.get(key)
        if tried is not None:
            found, tries, longest = tried
            if found or (tries >= 2 and longest >= limit):
                return
            limit = min(max(limit, 2 * longest), self.left_s())
        got = _nothing_above(self.parts, self.node, self.shape, floor, self.ub, self.core_how, limit,
                             self.gap_abs)
        if got == "infeasible":
            self.ub = floor
            _mark_optimal(best, self.ub)
        else:
            tries = tried[1] + 1 if tried is not None else 1
            self.asked[key] = (got == "found", tries, max(limit, tried[2] if tried is not None else 0.0))

    def restrict(self, built: Built, stage: str, how: str | None = None,
                 limit_s: float | None = None, max_nodes: int | None = None,
                 cut: bool = True, finished: list[bool] | None = None,
                 presolve: bool = True) -> JointResult | None:
        """Solve a restriction of the full model (every plan it finds is feasible).
        ``finished``: appended whether the solve ended before ``max_nodes`` (its own optimum or
        infeasibility proven: another try would repeat it)."""
        if cut and math.isfinite(self.ub):
            # the relaxations' optimum bounds every restriction: with it as a cut the solver
            # stops once its incumbent is within the gap of that bound
            _objective_cut(built.model, self.ub)
        left = self.left_s() if limit_s is None else min(self.left_s(), limit_s)
        rsol = built.model.solve(how or self.solver, left, self.gap_abs, relative_gap=self.rel_gap,
                                 max_nodes=max_nodes, presolve=presolve)
        if finished is not None:
            finished.append(rsol.status in ("optimal", "infeasible") and
                            (max_nodes is None or rsol.nodes < max_nodes))
        if not rsol.has_incumbent:
            return None
        rl = [_lift(built, rsol.values, i) for i in range(len(self.parts))]
        if any(cols is None for cols, _ in rl):
            return None
        return _result(built, rsol, [c for c, _ in rl], self.ub, self.gap_abs, self.rel_gap,
                       self.capacity_mode, self.t0, stage)


Lifts = list[tuple[tuple[Column, ...] | None, dict[str, float]]]  # per part: ``_lift``'s answer


def solve(parts: list[Part], node: Node, *, solver: str, time_limit_s: float,
          objective: str = "accuracy", absolute_gap: float | None = None,
          scale_demands: bool = False, start: list[Plan | None] | None = None,
          max_slices: int | None = None, max_slots: int | None = None,
          total_weight: float | None = None, upper_bound: float | None = None,
          core_solver: str = "auto", split_search: bool | None = None,
          exact_splits: bool = False, first_plan: bool = False) -> JointResult:
    """Core, lifting, and the full model only where lifting fails (see the module doc).

    The stages are the functions below, over one ``_Search`` state (the clock, the best
    incumbent, the best bound): ``_start_incumbent`` (the warm start), ``_search`` (lifting the
    core's solution; ``_close_core_gap``; ``_incumbent_searches`` or ``_capacity_search``;
    ``_level_rounds``) and ``_conclude`` (the proven incumbent, else the full model).

    ``core_solver``: who solves the small stages (``stage_solver``); ``split_search``: look for
    incumbents on a few splits of the SLO before the level models (``_cap_splits``; None:
    ``SPLIT_SEARCH``). With ``core_solver="same", split_search=False`` (or ``CORE_SOLVER =
    None``, ``SPLIT_SEARCH = False``: how the benches time the path before) the stages run as
    before both existed. ``exact_splits``: one part at a fixed demand is searched over every
    maximal split of the SLO as the capacity is (``_max_over_splits``; the cheapest plan at an
    app's capacity, where few splits are feasible), before the other stages. ``first_plan``:
    where the incumbent searches find a plan but do not prove it, that plan is the answer
    (``feasible``, with the best bound so far) without the level models or the full model: a test
    of whether demands fit together needs plans first and proofs only where they do not fit
    (``decompose``'s first fit; ar_assistant at 1098 rps on 16 GPUs: its optimum's 34 slices
    from the grid in 0.1 s, the proof that 33 do not serve it 9 s).

    ``start``: a known feasible plan per part (the anytime incumbent) to start the core from.
    ``max_slices``, ``max_slots``, ``total_weight``: as in ``build``. ``upper_bound``: a known bound on the
    optimum (e.g. from a decomposition), added to every model as an objective cut.
    """
    t0 = time.perf_counter()
    capacity_mode = scale_demands or any(p.demand_rps is None for p in parts)
    gap_abs = node.absolute_gap if absolute_gap is None else absolute_gap
    rel_gap = 0.0
    if capacity_mode:
        # the maximum demand is proven to within 1e-3 rps or 1e-5 of itself (on a 120-GPU node,
        # 0.6 of 63 000 rps: far below one instance's throughput)
        gap_abs, rel_gap = 1e-3, CAPACITY_RELATIVE_GAP
    if any(not p.pb.colset.columns for p in parts):
        return JointResult("infeasible", [None] * len(parts), math.nan, math.nan,
                           time.perf_counter() - t0, "core", ["an app has no admissible column"])
    shape = {"objective": objective, "scale_demands": scale_demands, "max_slices": max_slices,
             "max_slots": max_slots, "total_weight": total_weight}
    # every plan of the full model maps onto the core with its objective: a known bound cuts it
    cut = upper_bound if upper_bound is not None and math.isfinite(upper_bound) and \
        not capacity_mode else None
    core = build(parts, node, full=False, **shape)
    if cut is not None:
        _objective_cut(core.model, cut)
    s = _Search(parts, node, shape, solver, time_limit_s, t0, gap_abs, rel_gap, capacity_mode,
                # the capacity's core stays on the node's solver: its proven figure is the one
                # benches cite
                core_how=solver if capacity_mode else stage_solver(solver, core_solver),
                split_search=SPLIT_SEARCH if split_search is None else split_search,
                exact_splits=exact_splits, first_plan=first_plan)
    sol = core.model.solve(s.core_how, time_limit_s, gap_abs, start=_core_start(core, start),
                           relative_gap=rel_gap, cuts=CAPACITY_CUTS or not capacity_mode)
    if sol.status == "infeasible":
        return JointResult("infeasible", [None] * len(parts), math.nan, sol.bound, s.elapsed_s(), "core")
    s.ub = _proven(sol) if sol.has_incumbent else math.inf
    if cut is not None:
        s.ub = min(s.ub, cut)
    if start is not None and all(p is not None for p in start) and not capacity_mode:
        s.best = _start_incumbent(s, start, objective, total_weight)
    if sol.has_incumbent:
        done = _search(s, core, sol, start)
        if done is not None:
            return done
    return _conclude(s)


def _start_incumbent(s: _Search, start: list[Plan | None], objective: str,
                     total_weight: float | None) -> JointResult:
    """The warm start (a feasible plan per part) as the first incumbent, valued by the model's
    objective: proven at once when the core's bound is within the gap of it."""
    weights = total_weight if total_weight is not None else (sum(p.weight for p in s.parts) or 1.0)
    value = sum(part_value(p, part, s.node, objective, weights)
                for p, part in zip(start, s.parts, strict=True) if p is not None)
    best = JointResult("feasible", [copy.deepcopy(p) for p in start], value, s.ub, s.elapsed_s(), "start")
    for p in best.plans:
        if p is not None:
            p.status = "feasible"
    if s.ub - value <= s.gap_abs:
        _mark_optimal(best)
    return best


def _search(s: _Search, core: Built, sol: Solution, start: list[Plan | None] | None) -> JointResult | None:
    """The stages after the core (lifting, proofs, incumbent searches, level models): the
    answer where the core's lifted solution is it, else None with ``s.best`` and ``s.ub`` as
    far as the stages took them (``_conclude`` decides)."""
    lifts = [_lift(core, sol.values, i) for i in range(len(s.parts))]
    if all(cols is not None for cols, _ in lifts):
        if s.best is not None and sol.objective <= s.best.objective and sol.status != "optimal":
            return s.best  # the core's own solution, unproven, is no better than the start
        secs = s.elapsed_s()
        gap = math.inf if s.capacity_mode else _gap(sol)
        plans: list[Plan | None] = [_extract(core, sol.values, i, cols, sol.status, secs, gap)
                                    for i, (cols, _) in enumerate(lifts) if cols is not None]
        return JointResult(sol.status, plans, sol.objective, _proven(sol), secs, "core")
    if not s.capacity_mode:
        s.prove(0.1 * s.time_limit_s)  # the start, within the gap of a plan-free core?
    _close_core_gap(s, core, sol, start)
    if s.proven():
        return None  # the start, proven by the core's bound
    # The latency levels: per task of each part whose lift failed, a few caps to choose from
    # (``_level_rounds``); the caps that meet every path in the proportions the core needed.
    caps: list[dict[str, float] | None] = [
        None if cols is not None else _feasible_caps(s.parts[i].pb, need)
        for i, (cols, need) in enumerate(lifts)]
    levels: list[dict[str, list[float]] | None] = [
        None if cols is not None else candidate_levels(s.parts[i].pb, need, caps[i] or {})
        for i, (cols, need) in enumerate(lifts)]
    if s.capacity_mode:
        _capacity_search(s, caps)
    elif _exact_splits(s):
        return None
    elif not _incumbent_searches(s, lifts) and not (s.first_plan and s.best is not None):
        _level_rounds(s, levels)
    return None


def _close_core_gap(s: _Search, core: Built, sol: Solution, start: list[Plan | None] | None) -> None:
    """HiGHS reports its own bound (up to the gap above its incumbent): where that leaves the
    start just short of a proof, the core solved again from the start by the node's solver (CBC
    closes such a core in about a second), or by HiGHS to a quarter of the gap, usually brings
    it within."""
    best = s.best
    if best is None or best.status == "optimal" or sol.status != "optimal" or \
            s.ub - best.objective > 2 * s.gap_abs or s.core_how != "highs":
        return
    again = s.solver
    tsol = core.model.solve(again, s.left_s(), s.gap_abs if again != s.core_how else s.gap_abs / 4,
                            start=_core_start(core, start))
    if tsol.has_incumbent:
        s.ub = min(s.ub, _proven(tsol))
        if s.ub - best.objective <= s.gap_abs:
            _mark_optimal(best, s.ub)


def _incumbent_searches(s: _Search, lifts: Lifts) -> bool:
    """Demand mode's cheap incumbents before the level models: the grid of SLO splits, then the
    splits near the caps the core needed, each followed by a proof against the core. Whether
    the best is proven optimal."""
    _try_grid(s, lifts)
    s.prove(0.1 * s.time_limit_s)
    if s.proven():
        return True
    _try_splits(s, lifts)
    s.prove(0.1 * s.time_limit_s)
    return s.proven()


def _try_splits(s: _Search, lifted: Lifts) -> None:
    """Cheap incumbents: the core restricted to a few splits of the SLO near the caps a relaxed
    solution needed (each task of a broken path giving way alone, then all in proportion). Each
    is as small as the core, and a relaxation's optimum usually has a twin within the gap under
    one of them, which the bound then proves at once."""
    if not s.split_search:
        return
    splits = [_cap_splits(s.parts[i].pb, need) if cols is None else []
              for i, (cols, need) in enumerate(lifted)]
    for k in range(max(len(x) for x in splits)):
        if s.elapsed_s() > 0.5 * s.time_limit_s:
            break
        cand: list[dict[str, float] | None] = [x[min(k, len(x) - 1)] if x else None for x in splits]
        if s.take(s.restrict(s.core(cand), "split", SPLIT_SOLVER or s.solver)):
            return


def _try_grid(s: _Search, lifted: Lifts) -> None:
    """Incumbents from a grid of SLO splits (``grid_caps``) for the one part whose lift failed:
    each split's restricted core is ranked by its LP relaxation (milliseconds), and the best few
    are solved for a short while each, stopping once one is proven (within the gap of the bound
    ``s.ub``). Where the core's bound is tight but its columns are too slow, the optimum sits
    under one such split (ar_assistant at 80%: the core's splits find 23 slices after 10 s, the
    grid's second split the optimum's 22 in 0.5 s)."""
    failed = [i for i, (cols, _) in enumerate(lifted) if cols is None]
    if not (GRID_SEARCH and s.split_search) or len(failed) != 1 or not math.isfinite(s.ub):
        return
    i = failed[0]
    todo = _grid_ranked(s, i)
    passes: list[int | None] = [GRID_SOLVE_NODES]
    if GRID_FIRST_NODES is not None and (GRID_SOLVE_NODES is None or GRID_FIRST_NODES < GRID_SOLVE_NODES):
        passes.insert(0, GRID_FIRST_NODES)
    for nodes in passes:
        left_todo = []
        for cap in todo:
            if s.elapsed_s() > 0.5 * s.time_limit_s:
                break
            cand: list[dict[str, float] | None] = [None] * len(s.parts)
            cand[i] = cap
            finished: list[bool] = []
            got = s.restrict(s.core(cand), "grid", SPLIT_SOLVER or s.solver,
                             GRID_SOLVE_SHARE * s.time_limit_s, nodes, cut=GRID_CUT,
                             finished=finished, presolve=GRID_PRESOLVE)
            if not all(finished):
                left_todo.append(cap)
            if got is not None:
                if s.take(got):
                    return
                # within the gap of a plan-free core? (ar_assistant at 90%: the first split's
                # root, then this, proves it; the other splits are not solved)
                s.prove(0.1 * s.time_limit_s)
                if s.proven():
                    return
        todo = left_todo


def _grid_ranked(s: _Search, i: int) -> list[dict[str, float]]:
    """Part i's grid splits whose restricted core's LP beats the best by the gap, best LP first:
    the ``GRID_SOLVES`` the grid search solves (ranking at most ``GRID_RANKED``)."""
    t_grid = time.perf_counter()
    ranked: list[tuple[float, dict[str, float]]] = []
    for cap in grid_caps(s.parts[i].pb):
        cand: list[dict[str, float] | None] = [None] * len(s.parts)
        cand[i] = cap
        lp = s.core(cand).model.relaxation("highs")
        if lp.has_incumbent and lp.objective > (s.best.objective if s.best else -math.inf) + s.gap_abs:
            ranked.append((lp.objective, cap))
        if len(ranked) >= GRID_RANKED or (GRID_SHARE is not None and
                                          time.perf_counter() - t_grid > GRID_SHARE * s.time_limit_s):
            break
    ranked.sort(key=lambda x: -x[0])
    return [cap for _, cap in ranked[:GRID_SOLVES]]


def _exact_splits(s: _Search) -> bool:
    """One part at a fixed demand searched over every maximal split (``solve(exact_splits=)``):
    whether that proved the optimum (otherwise its best plan and bound are kept for the other
    stages: under a short limit, e.g. a plan above capacity within the node's 10 s, the splits
    may find none)."""
    if not (CAPACITY_SPLITS and s.exact_splits and len(s.parts) == 1 and not s.shape["scale_demands"]):
        return False
    searched = _max_over_splits(s.parts, s.node, s.shape, s.solver, s.t0, s.time_limit_s,
                                s.gap_abs, s.rel_gap, capacity_mode=False)
    if searched is None:
        return False
    got, bound = searched
    s.ub = min(s.ub, bound)
    s.take(got)
    # a refuted split's bound is the best plus the gap: proven up to round-off
    if s.best is not None and s.ub - s.best.objective <= s.gap_abs + 1e-9:
        _mark_optimal(s.best, s.ub)
    return s.proven()


def _capacity_search(s: _Search, caps: list[dict[str, float] | None]) -> None:
    """The maximum demand where the core's plan does not lift: one app's over every maximal
    split of the SLO (``_max_over_splits``, exact with its bound), else the single restricted
    model (the core under the shrunk caps), which finds a large feasible rate fast for the full
    model to start from."""
    searched = None
    if CAPACITY_SPLITS and len(s.parts) == 1 and not s.shape["scale_demands"]:
        searched = _max_over_splits(s.parts, s.node, s.shape, s.solver, s.t0, s.time_limit_s,
                                    s.gap_abs, s.rel_gap)
    if searched is not None:
        got, bound = searched
        s.ub = min(s.ub, bound)
        s.take(got)
        if s.best is not None and s.ub - s.best.objective <= max(s.gap_abs, s.rel_gap * abs(s.ub)):
            _mark_optimal(s.best, s.ub, math.inf)  # proven by the bound over every split
        return
    got = s.restrict(s.core(caps), "restricted")
    if got is not None:
        s.best = got


def _level_rounds(s: _Search, levels: list[dict[str, list[float]] | None]) -> None:
    """The latency level models (module doc, stage 3), a few rounds: the relaxed level model
    bounds the full model more tightly than the core, and its solution, where it lifts, is
    optimal; otherwise the splits near the caps it needed, then the restricted level model give
    incumbents, and the levels are split below those caps (which cuts the solution off)."""
    for _ in range(REFINE_ROUNDS):
        left = s.time_limit_s - s.elapsed_s()
        if left <= 0.05 * s.time_limit_s:
            break
        relaxed = build(s.parts, s.node, full=False, levels=levels, relax_levels=True, **s.shape)
        if math.isfinite(s.ub):
            _objective_cut(relaxed.model, s.ub)
        # at most half the time left: the restriction below must still find an incumbent
        xsol = relaxed.model.solve(s.solver, 0.5 * left, s.gap_abs, relative_gap=s.rel_gap)
        if not xsol.has_incumbent:
            break
        s.ub = min(s.ub, _proven(xsol))
        xl = [_lift(relaxed, xsol.values, i) for i in range(len(s.parts))]
        if all(cols is not None for cols, _ in xl) and \
                s.take(_result(relaxed, xsol, [c for c, _ in xl], s.ub, s.gap_abs, s.rel_gap,
                               s.capacity_mode, s.t0, "levels")):
            return  # feasible as it stands, and proven
        if s.best is not None and s.ub - s.best.objective <= s.gap_abs:
            break  # the tighter bound proves the incumbent (``_conclude``)
        _try_splits(s, xl)
        if s.best is not None and (s.best.status == "optimal" or s.ub - s.best.objective <= s.gap_abs):
            break
        # The same levels, each counted on the paths at its own cap: a restriction.
        if s.take(s.restrict(build(s.parts, s.node, full=False, levels=levels, **s.shape), "restricted")):
            return
        if xsol.status != "optimal":
            break
        refined = _refined_levels(s, levels, xl)
        if refined is None:
            break
        levels = refined


def _refined_levels(s: _Search, levels: list[dict[str, list[float]] | None],
                    xl: Lifts) -> list[dict[str, list[float]] | None] | None:
    """The next round's levels: per part, split below the caps the relaxed solution ``xl``
    needed (``refine_levels``), or new levels for a part that lifted on the core but not now.
    None when no part's levels change."""
    refined = [refine_levels(s.parts[i].pb, lev, xl[i][1]) if lev is not None
               else None if xl[i][0] is not None  # this part lifts on the core columns
               else candidate_levels(s.parts[i].pb, xl[i][1], _feasible_caps(s.parts[i].pb, xl[i][1]))
               for i, lev in enumerate(levels)]
    if all(r is None for r in refined):
        return None
    return [r if r is not None else lev for r, lev in zip(refined, levels, strict=True)]


def _conclude(s: _Search) -> JointResult:
    """The answer after the stages: the best incumbent where proven (a later bound may prove an
    earlier incumbent), else the full model's (module doc, stage 4)."""
    best = s.best
    if best is not None and best.status == "optimal":
        return best
    if best is not None and s.ub - best.objective <= max(s.gap_abs, s.rel_gap * abs(s.ub)):
        # a later bound proves the earlier incumbent
        _mark_optimal(best, s.ub, math.inf if s.capacity_mode else 0.0)
        return best
    if best is not None and s.first_plan:
        best.bound = min(best.bound, s.ub) if not math.isnan(best.bound) else s.ub
        return best
    left = s.left_s()
    full = build(s.parts, s.node, full=True, **s.shape)
    if math.isfinite(s.ub):
        # the relaxations' optimum bounds the full model's objective: a valid cut
        _objective_cut(full.model, s.ub)
    fsol = full.model.solve(s.solver, left, s.gap_abs, start=_start(full, best),
                            relative_gap=s.rel_gap)
    return _full_result(s, full, fsol)


def _full_result(s: _Search, full: Built, fsol: Solution) -> JointResult:
    """The full model's solution as the answer, or the incumbent it started from where it found
    nothing better (proven by the full model's bound where that bound is within the gap)."""
    secs = s.elapsed_s()
    best = s.best
    if not fsol.has_incumbent or (best is not None and fsol.objective <= best.objective):
        if best is None:
            return JointResult(fsol.status, [None] * len(s.parts), math.nan, fsol.bound, secs, "full")
        if fsol.has_incumbent and best.status != "optimal":
            # the full model's bound proves the plan it started from (the splits' best)
            bound = min(_proven(fsol), s.ub)
            if bound - best.objective <= max(s.gap_abs, s.rel_gap * abs(bound)):
                _mark_optimal(best, bound, math.inf if s.capacity_mode else 0.0)
        best.seconds = secs
        for p in best.plans:
            if p is not None:
                p.solve_seconds = secs
        return best
    bound = min(_proven(fsol), s.ub)
    status = fsol.status
    gap = 0.0 if status == "optimal" else (abs(bound - fsol.objective) if not math.isnan(bound) else math.inf)
    if status == "feasible" and gap <= max(s.gap_abs, s.rel_gap * abs(bound)):
        status = "optimal"  # the core's bound proves it
    if s.capacity_mode:
        gap = math.inf
    plans = [_extract(full, fsol.values, i, full.cols[i], status, secs, gap) for i in range(len(s.parts))]
    return JointResult(status, plans, fsol.objective, bound, secs, "full")
