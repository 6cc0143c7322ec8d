"""The planner: an exact MILP (DESIGN section 3, "lanes") solved with CBC or HiGHS.

``plan(app, node, profiles, demand_rps) -> Plan`` is a pure function of its inputs.

Variables: ``lam[c]`` root rate sent down lane c (one variant per task); ``M[j]`` instances
of column j (task, variant, segment, max batch); ``N[j]`` whether column j is used;
``L[t]`` the slowest chosen latency of task t; ``S[t,v]`` the slices of (t, v) as an
integer the solver can branch on; ``Y[g]`` GPUs laid out by maximal per-GPU layout g.
Constraints (paper's equation numbers): demand per (t,v) from lanes (5), capacity (6),
latency binaries (1)-(3), slices (7)-(8), PAS accuracy (10)-(13) made linear by lanes,
packability by maximal valid per-GPU layouts. Objective (14).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import mip

from jigsaw.app import App
from jigsaw.errors import PlanError
from jigsaw.mig import slice_unit
from jigsaw.node import Node
from jigsaw.plan import LanePlan, Plan, PlanInstance
from jigsaw.planner import joint
from jigsaw.planner.columns import ColumnSet, build_columns
from jigsaw.planner.diagnose import why_unserved
from jigsaw.planner.groups import layout_budgets, pack_node
from jigsaw.planner.model import LinearModel
from jigsaw.planner.packer import PackingError, instances_from_plan
from jigsaw.planner.problem import Problem, demand_terms, device_names, make_problem, share_hosts
from jigsaw.planner.routes import settle_lanes
from jigsaw.planner.share_merge import merge_shares
from jigsaw.planner.solution import NO_BOUND, Solution
from jigsaw.profiles import ProfileTable
from jigsaw.spaces import SearchSpace, search_space

Factors = dict[tuple[str, str, str], float]
MIN_DEMAND_RPS = 0.01  # below this a plan still keeps one instance per task warm
_RATE_EPS = 1e-9


@dataclass(frozen=True)
class Capacity:
    """The maximum serviceable demand of an app on a node under a search space."""

    app: str
    space: str
    max_demand_rps: float
    plan: Plan  # the cheapest plan serving max_demand_rps
    solve_seconds: float
    status: str  # optimal: proven; feasible: the limit was hit, max_demand_rps is a lower bound
    upper_bound_rps: float = math.nan  # the solver's bound (== max_demand_rps when proven)


_Problem = Problem


def _problem(app: App, node: Node, profiles: ProfileTable, space: SearchSpace,
             factors: Factors | None) -> Problem:
    return make_problem(app, node, profiles, space, factors)


class _Model:
    """One MILP over a _Problem; ``demand_rps`` None makes the demand a variable (capacity)."""

    def __init__(self, pb: _Problem, demand_rps: float | None, solver: str, threads: int = 1,
                 max_rps: float | None = None):
        """The model's variables, constraints and objective. A MILP model builder kept whole (the
        size rule's exception): read top to bottom as the paper's formulation."""
        self.pb = pb
        node, app, cols = pb.node, pb.app, pb.colset.columns
        name = {"cbc": mip.CBC, "highs": "HiGHS"}.get(solver)
        if name is None:
            raise PlanError(f"unknown solver {solver!r} (expected cbc or highs)")
        m = mip.Model(sense=mip.MAXIMIZE, solver_name=name)
        m.verbose = 0
        m.threads = threads
        self.m = m
        self.solver = solver
        self.start: dict[int, float] | None = None
        self.sol: Solution | None = None
        slo_acc = app.accuracy_slo if app.accuracy_slo is not None else node.planner.accuracy_slo
        self.slo_acc = slo_acc

        self.lam = [m.add_var(lb=0.0, name=f"lam{i}") for i in range(len(pb.lanes))]
        if demand_rps is None:
            self.R: mip.Var | float = m.add_var(lb=0.0, ub=max_rps if max_rps is not None else mip.INF,
                                                name="R")
            m += mip.xsum(self.lam) == self.R
        else:
            self.R = float(demand_rps)
            m += mip.xsum(self.lam) == demand_rps

        # Demand on each (task, variant) and its largest possible value (for big-M bounds).
        terms_tv = demand_terms(pb)
        max_mult = {tv: max(mm for _, mm in terms) for tv, terms in terms_tv.items()}

        by_tv: dict[tuple[str, str], list[int]] = defaultdict(list)
        for j, c in enumerate(cols):
            by_tv[(c.task, c.variant)].append(j)

        max_per_gpu = {p.name: p.max_per_gpu for p in node.gpu.profiles}
        unit = slice_unit(node.gpu, node.mig_profiles)  # integer slice counts in k-ths (MIG shares)
        self.M: list[mip.Var] = []
        self.N: list[mip.Var] = []
        for j, c in enumerate(cols):
            ub = min(node.slices_available // c.slices, node.num_gpus * max_per_gpu[c.mig_profile])
            if demand_rps is not None:
                need = demand_rps * max_mult.get((c.task, c.variant), 0.0) / c.throughput_rps
                ub = min(ub, max(1, math.ceil(need - 1e-9)))
            self.M.append(m.add_var(var_type=mip.INTEGER, lb=0, ub=ub, name=f"M{j}"))
            self.N.append(m.add_var(var_type=mip.BINARY, name=f"N{j}"))
            m += self.M[j] <= ub * self.N[j]
            m += self.N[j] <= self.M[j]

        # Within one (task, variant, MIG profile) the Pareto columns trade latency for
        # throughput; once the slowest of them sets L(t), the others are dominated, so some
        # optimal plan uses at most one column per group: a clique cut on N.
        groups: dict[tuple[str, str, str], list[int]] = defaultdict(list)
        for j, c in enumerate(cols):
            groups[(c.task, c.variant, c.mig_profile)].append(j)
        for js in groups.values():
            if len(js) > 1:
                m += mip.xsum(self.N[j] for j in js) <= 1

        self.L = {t: m.add_var(lb=0.0, name=f"L_{t}") for t in app.task_names}
        for j, c in enumerate(cols):
            m += self.L[c.task] >= c.latency_ms * self.N[j]
        budgets = pb.colset.budgets
        # Hop latency is budgeted on top of the SLO: the runtime deadline adds it per depth.
        for p in app.paths:
            m += mip.xsum(2 * self.L[t] for t in p) <= app.latency_slo_ms

        # Capacity per (t, v), with an integer slice count and its valid inequality.
        self.S: dict[tuple[str, str], mip.Var] = {}
        for tv, terms in terms_tv.items():
            demand = mip.xsum(mult * self.lam[li] for li, mult in terms)
            js = by_tv.get(tv, [])
            if not js:
                for li, _ in terms:
                    m += self.lam[li] == 0
                continue
            # Rows scaled by their largest throughput: CBC's presolve misjudges feasibility
            # when coefficients reach 1e4 next to the unit coefficients of the lane rates.
            scale = 1.0 / max(cols[j].throughput_rps for j in js)
            m += mip.xsum(cols[j].throughput_rps * scale * self.M[j] for j in js) >= scale * demand
            s = m.add_var(var_type=mip.INTEGER, lb=0, ub=node.slices_available * unit,
                          name=f"S_{tv[0]}_{tv[1]}")
            m += s == mip.xsum(cols[j].slices * unit * self.M[j] for j in js)
            best_per_slice = max(cols[j].throughput_rps / cols[j].slices for j in js)
            m += best_per_slice / unit * scale * s >= scale * demand
            self.S[tv] = s

        # Integer slice totals per task and overall: branching on these few integers closes
        # the gap far faster than branching on thousands of instance counts.
        task_totals = []
        for t in app.task_names:
            bound = budgets.slices[t] if budgets else node.slices_available
            total_t = m.add_var(var_type=mip.INTEGER, lb=0, ub=bound * unit, name=f"St_{t}")
            m += total_t == mip.xsum(c.slices * unit * self.M[j] for j, c in enumerate(cols) if c.task == t)
            task_totals.append(total_t)
        slices_total = m.add_var(var_type=mip.INTEGER, lb=0, ub=node.slices_available * unit, name="S_total")
        m += slices_total == mip.xsum(task_totals)

        # Packability: every GPU takes one maximal valid layout (or a part of it).
        self.Y = [m.add_var(var_type=mip.INTEGER, lb=0, ub=node.num_gpus, name=f"Y{g}")
                  for g in range(len(pb.layouts))]
        for js, num_gpus in layout_budgets(node, pb.layouts):  # one row per GPU group
            m += mip.xsum(self.Y[g] for g in js) <= num_gpus
        # a MIG share's host instances: J of them hold k shares each (``problem.share_hosts``)
        shares = share_hosts(node, sorted({c.mig_profile for c in cols}))
        held: dict[str, list[mip.Var]] = defaultdict(list)
        empty_seats = []  # slices of the shared instances' empty seats: the objective pays them too
        for prof, (host, k) in shares.items():
            j_var = m.add_var(var_type=mip.INTEGER, lb=0, ub=node.num_gpus * max_per_gpu[host],
                              name=f"J_{prof}")
            mine = [j for j, c in enumerate(cols) if c.mig_profile == prof]
            m += mip.xsum(self.M[j] for j in mine) <= k * j_var
            held[host].append(j_var)
            empty_seats.append(node.gpu.profile(host).compute_slices * j_var
                               - mip.xsum(cols[j].slices * self.M[j] for j in mine))
        for prof in device_names(node, sorted({c.mig_profile for c in cols})):
            m += mip.xsum(self.M[j] for j, c in enumerate(cols) if c.mig_profile == prof) + \
                mip.xsum(held[prof]) <= \
                mip.xsum(lay.get(prof, 0) * self.Y[g] for g, lay in enumerate(pb.layouts))

        # Accuracy (PAS over lanes, relative to the best): A_obj * R >= SLO_a * R.
        acc_total = mip.xsum(a * self.lam[li] for li, a in enumerate(pb.lane_acc))
        m += acc_total >= slo_acc * (self.R if demand_rps is None else demand_rps)

        beta = node.beta
        if demand_rps is None:
            # Maximise the demand; slices only break ties (the plan is re-solved afterwards).
            m.objective = mip.maximize(self.R - 1e-6 / unit * slices_total - 1e-6 * mip.xsum(empty_seats))
        else:
            r = max(demand_rps, MIN_DEMAND_RPS)
            m.objective = mip.maximize(node.planner.alpha * acc_total * (1.0 / r)
                                       - beta / unit * slices_total - beta * mip.xsum(empty_seats))
        m.max_mip_gap_abs = node.absolute_gap if demand_rps is not None else 1e-3
        m.max_mip_gap = 1e-6

    def warm_start(self, previous: Plan) -> None:
        cols = self.pb.colset.columns
        index = {c.key: j for j, c in enumerate(cols)}
        start: dict[int, float] = {}
        for inst in previous.instances:
            j = index.get((inst.task, inst.variant, inst.mig_profile, inst.mps, inst.max_batch))
            if j is None:
                return  # the previous plan uses a column that no longer exists
            start[self.M[j].idx] = float(inst.count)
            start[self.N[j].idx] = 1.0
        self.start = start or None

    def solve(self, time_limit_s: float) -> tuple[str, float]:
        """The model solved as a ``LinearModel`` (CBC in its child process: a native abort
        there is retried on HiGHS, never the caller's end); its status word and seconds."""
        t0 = time.perf_counter()
        self.sol = as_linear(self.m).solve(self.solver, time_limit_s, self.m.max_mip_gap_abs,
                                           self.start, relative_gap=self.m.max_mip_gap)
        return self.sol.status, time.perf_counter() - t0

    def x(self, var: mip.Var) -> float | None:
        """``var``'s value in the solution (None without one)."""
        return self.sol.values[var.idx] if self.sol is not None and self.sol.values else None

    def extract(self, pb: _Problem, demand_rps: float, planned_rps: float, status: str,
                solve_s: float) -> Plan:
        cols = pb.colset.columns
        app, node = pb.app, pb.node
        counts: dict[int, int] = {}
        for j, var in enumerate(self.M):
            x = self.x(var)
            if x is not None and round(x) > 0:
                counts[j] = round(x)
        instances = [
            PlanInstance(c.task, c.variant, c.mig_profile, c.mps, c.batch, counts[j], c.latency_ms,
                         c.throughput_rps, c.slices)
            for j, c in enumerate(cols) if j in counts
        ]
        lanes = []
        total = sum(max(0.0, self.x(v) or 0.0) for v in self.lam) or 1.0
        for li, var in enumerate(self.lam):
            rate = self.x(var) or 0.0
            if rate > _RATE_EPS * max(1.0, total):
                lanes.append(LanePlan(app.lane_dict(pb.lanes[li]), rate))
        lanes = settle_lanes(app, lanes, instances, pb.factors)
        accuracy = sum(pb.lane_acc[li] * (self.x(self.lam[li]) or 0.0) for li in range(len(pb.lanes))) / total
        task_latency = {t: max((i.latency_ms for i in instances if i.task == t), default=0.0)
                        for t in app.task_names}
        slices_used = sum(i.count * i.slices for i in instances)
        obj = node.planner.alpha * accuracy - node.beta * slices_used
        assert self.sol is not None
        bound = self.sol.bound
        if not isinstance(self.R, float):
            gap = float("inf")  # a capacity model's solution: its slices were not minimised
        elif status == "optimal":
            gap = 0.0
        else:
            gap = abs(bound - self.sol.objective) if math.isfinite(bound) else float("inf")
        return Plan(
            app=app.name, space=pb.space.name, demand_rps=demand_rps, planned_rps=planned_rps,
            feasible=True, max_demand_plan=False, status=status, objective=obj,
            accuracy=accuracy, slices_used=slices_used, slices_available=node.slices_available,
            solve_seconds=solve_s, gap=gap, instances=instances, lanes=lanes,
            task_latency_ms=task_latency, node=node.name, gpu_model=node.gpu.name,
            latency_slo_ms=app.latency_slo_ms, accuracy_slo=self.slo_acc,
            columns_total=pb.colset.num_candidates, columns_pruned=len(cols),
            solver=node.planner.solver,
        )


def as_linear(m: mip.Model) -> LinearModel:
    """A python-mip model's variables, rows and objective as a ``LinearModel`` (variable k is
    ``m.vars[k]``), so that it is solved where a native abort cannot end the caller."""
    out = LinearModel(maximize=m.sense == mip.MAXIMIZE)
    for v in m.vars:
        ub = v.ub
        out.var(v.lb, ub if abs(ub) < NO_BOUND else math.inf, v.obj, v.var_type in (mip.INTEGER, mip.BINARY))
    for c in m.constrs:
        e = c.expr
        idx = [v.idx for v in e.expr]
        val = list(e.expr.values())
        rhs = -e.const
        lo, hi = {"<": (-math.inf, rhs), ">": (rhs, math.inf), "=": (rhs, rhs)}[e.sense]
        out.row(idx, val, lo=lo, hi=hi)
    return out


def _with_layout(plan: Plan, node: Node, previous: Plan | None) -> Plan:
    prev_layout = previous.layout if previous is not None else None
    if prev_layout is not None and prev_layout.gpu_model != node.gpu.name:
        prev_layout = None
    plan.layout = pack_node(instances_from_plan(plan), node, prev_layout)
    return plan


def _with_shares(plan: Plan, app: App, node: Node, profiles: ProfileTable, factors: Factors | None,
                 previous: Plan | None) -> Plan:
    """``plan`` with its small tasks' idle tails merged into shared MIG instances where that
    frees slices (``share_merge``; the same lanes, verified), else ``plan`` itself."""
    if plan.layout is None or not plan.instances:
        return plan
    t0 = time.perf_counter()
    prev_layout = previous.layout if previous is not None else None
    if prev_layout is not None and prev_layout.gpu_model != node.gpu.name:
        prev_layout = None
    got = merge_shares([app], node, profiles, {app.name: plan},
                       lambda ps: pack_node(instances_from_plan(ps[app.name]), node, prev_layout),
                       {app.name: factors})
    if got is None:
        return plan
    out = got.plans[app.name]
    out.layout = got.layout
    out.solve_seconds = plan.solve_seconds + time.perf_counter() - t0
    out.notes.append(got.note)
    return out


FORMULATIONS = ("tight", "reference")
DEFAULT_FORMULATION = "tight"


def _solve_at(pb: Problem, demand: float, solver: str, limit: float, previous: Plan | None,
              formulation: str, start: Plan | None = None, start_is_fallback: bool = False,
              exact_splits: bool = False) -> tuple[str, Plan | None]:
    """One solve at a fixed demand: the solver's word and its plan (None without an incumbent).

    ``start``: a feasible plan at ``demand`` to start from; with ``start_is_fallback``, only
    where the greedy plan finds none (the greedy plan is usually the cheaper start)."""
    if formulation == "reference":
        model = _Model(pb, demand, solver)
        if previous is not None:
            model.warm_start(previous)
        word, secs = model.solve(limit)
        if word in ("optimal", "feasible"):
            return word, model.extract(pb, demand, demand, word, secs)
        return word, None
    from jigsaw.planner.anytime import quick_plan

    quick = start
    if pb.colset.columns and pb.profiles is not None and (quick is None or start_is_fallback):
        quick = quick_plan(pb.app, pb.node, pb.profiles, demand, factors=pb.factors, problem=pb) or start
    res = joint.solve([joint.Part(pb, demand)], pb.node, solver=solver, time_limit_s=limit,
                      start=[quick] if quick is not None else None, exact_splits=exact_splits)
    exact = res.plans[0]
    if quick is not None and res.status != "optimal" and (exact is None or quick.objective > exact.objective):
        # the limit came first: the verified greedy plan beats no plan (or a worse incumbent)
        quick.notes.append(f"the solver's best within {limit:g} s was not better than the greedy plan")
        return "feasible", quick
    return res.status, exact


def _scaled_to(plan: Plan | None, demand_rps: float) -> Plan | None:
    """``plan`` serving ``demand_rps`` on the same instances: every lane's rate scaled down (its
    instances carry at least as much; accuracy and slices unchanged). None if ``plan`` serves
    less, has no lanes, or has no layout (a start needs one)."""
    if plan is None or not plan.lanes or plan.layout is None or not plan.feasible:
        return None
    total = sum(lp.rate_rps for lp in plan.lanes)
    if total < demand_rps * (1 - 1e-9) or total <= 0:
        return None
    k = demand_rps / total
    return dataclasses.replace(plan, demand_rps=demand_rps, planned_rps=demand_rps, status="feasible",
                               gap=math.inf, max_demand_plan=False,
                               lanes=[LanePlan(dict(lp.variants), lp.rate_rps * k) for lp in plan.lanes],
                               instances=list(plan.instances), notes=list(plan.notes))


def _check_formulation(formulation: str | None) -> str:
    f = formulation or DEFAULT_FORMULATION
    if f not in FORMULATIONS:
        raise PlanError(f"unknown formulation {f!r} (expected one of {', '.join(FORMULATIONS)})")
    return f


def plan(app: App, node: Node, profiles: ProfileTable, demand_rps: float, *,
         space: str | SearchSpace | None = None, previous: Plan | None = None,
         time_limit_s: float | None = None, factors: Factors | None = None,
         solver: str | None = None, formulation: str | None = None, start: Plan | None = None) -> Plan:
    """The cheapest accurate-enough configuration serving ``demand_rps`` root requests/s.

    ``start``: a feasible plan serving at least ``demand_rps`` (e.g. ``capacity``'s plan), the
    tight formulation's start where the greedy plan finds none (right at capacity it rarely does,
    and without a start the solver may find no plan within the limit).

    Above capacity, returns the plan of the maximum serviceable demand with
    ``max_demand_plan=True`` and ``feasible=False``. Always packed onto the node's GPUs.
    ``formulation``: ``tight`` (default: the latency-relaxed core with lifting, ``joint``) or
    ``reference`` (the original single model, kept to check the tight one against).
    """
    if not demand_rps >= 0 or math.isinf(demand_rps):
        raise PlanError(f"demand must be a finite number >= 0, got {demand_rps!r}")
    form = _check_formulation(formulation or node.planner.formulation)
    sp = space if isinstance(space, SearchSpace) else search_space(space or node.planner.space)
    limit = time_limit_s if time_limit_s is not None else node.planner.time_limit_s
    solver = solver or node.planner.solver
    if solver not in ("cbc", "highs"):
        raise PlanError(f"unknown solver {solver!r} (expected cbc or highs)")
    t0 = time.perf_counter()
    pb = _problem(app, node, profiles, sp, factors)
    r = max(demand_rps, MIN_DEMAND_RPS)
    word, result = _solve_at(pb, r, solver, limit, previous, form, _scaled_to(start, r), True)
    if result is not None:
        result.demand_rps = demand_rps
        result.solver = solver
        result.solve_seconds = time.perf_counter() - t0
        return _with_shares(_with_layout(result, node, previous), app, node, profiles, factors, previous)
    if word == "infeasible" or not pb.colset.columns:
        cap = _capacity(pb, solver, limit, formulation=form)
        if cap.plan is None:
            return _empty_plan(pb, demand_rps, cap.status, time.perf_counter() - t0,
                               _unserved_note(pb))
        result = _plan_at(pb, cap, solver, limit, form)
        result.demand_rps = demand_rps
        result.feasible = False
        result.max_demand_plan = True
        result.solve_seconds = time.perf_counter() - t0
        result.notes.append(f"demand {demand_rps:g} rps is above capacity "
                            f"{cap.max_demand_rps:.6g} rps: serving the maximum")
        return _with_shares(_with_layout(result, node, previous), app, node, profiles, factors, previous)
    # No incumbent within the limit (typically right at capacity): the capacity model, capped at
    # the demand, always has one (serve nothing) and finds a good one fast.
    cap = _capacity(pb, solver, limit, max_rps=r, formulation=form)
    if cap.plan is None:
        return _empty_plan(pb, demand_rps, word, time.perf_counter() - t0,
                           f"the solver found no plan within {limit:g} s")
    result = cap.plan
    result.demand_rps = demand_rps
    result.solve_seconds = time.perf_counter() - t0
    # a fallback is an incumbent, never a proof: the capacity model's own status says its rate is
    # the most it serves, not that these are the fewest slices for the demand
    _as_fallback(result)
    if cap.max_demand_rps >= r * (1 - 1e-6):
        result.notes.append(f"no incumbent within {limit:g} s: the plan comes from the capacity "
                            "model and its slices are not minimised")
    else:
        result.feasible = False
        result.max_demand_plan = True
        result.notes.append(f"no plan for {demand_rps:g} rps found within {limit:g} s: serving "
                            f"{cap.max_demand_rps:.6g} rps, the most found")
    return _with_layout(result, node, previous)


def _plan_at(pb: Problem, cap: _Cap, solver: str, limit: float, formulation: str = "reference") -> Plan:
    """The cheapest plan at the maximum demand; the capacity model's own plan if none is found.

    Capacity is the supremum of a closed set, but round-off can make exactly that demand
    infeasible: back off by a hair before giving up.
    """
    start = cap.plan if cap.plan is not None and cap.plan.layout is not None else None
    for shrink in (1.0, 1 - 1e-7, 1 - 1e-5):
        demand = cap.max_demand_rps * shrink
        # at the capacity few splits of the SLO are feasible: searched exactly (``joint``)
        word, result = _solve_at(pb, demand, solver, limit, None, formulation,
                                 start if shrink == 1.0 else None, exact_splits=True)
        if result is not None:
            return result
        if word == "no_solution":
            break
    assert cap.plan is not None
    cap.plan.notes.append("the capacity model's plan: its slices are not minimised")
    _as_fallback(cap.plan)
    return cap.plan


def _as_fallback(plan: Plan) -> None:
    """Label the capacity model's plan, used as the answer at a demand, for what it is: a
    feasible incumbent whose slices are not minimised (status ``feasible``, gap unknown), not the
    proven optimum its own solve's status would claim."""
    plan.status = "feasible"
    plan.gap = math.inf


def _unserved_note(pb: Problem) -> str:
    """The note of a plan that serves nothing, with the reason found (``diagnose``)."""
    why = why_unserved(pb)
    return "no configuration serves any demand within the SLOs" + (f": {why}" if why else "")


def _empty_plan(pb: Problem, demand_rps: float, status: str, secs: float, note: str) -> Plan:
    """A plan that serves nothing; "infeasible" where the solver proved that no demand fits (its
    capacity model "optimal" at 0 rps), so no caller reads "optimal" beside "serves 0 rps"."""
    status = "infeasible" if status == "optimal" else status
    return Plan(app=pb.app.name, space=pb.space.name, demand_rps=demand_rps, planned_rps=0.0,
                feasible=False, max_demand_plan=False, status=status, objective=float("nan"),
                accuracy=0.0, slices_used=0, slices_available=pb.node.slices_available,
                solve_seconds=secs, gap=float("inf"), node=pb.node.name,
                gpu_model=pb.node.gpu.name, latency_slo_ms=pb.app.latency_slo_ms,
                columns_total=pb.colset.num_candidates, columns_pruned=len(pb.colset.columns),
                solver=pb.node.planner.solver, notes=[note])


@dataclass
class _Cap:
    max_demand_rps: float
    status: str
    seconds: float
    plan: Plan | None = None  # the capacity model's solution (slices not minimised)
    upper_bound_rps: float = math.nan  # the solver's bound on the capacity


def _capacity(pb: Problem, solver: str, limit: float, max_rps: float | None = None,
              formulation: str = "reference") -> _Cap:
    if not pb.colset.columns:
        return _Cap(0.0, "infeasible", 0.0)
    if formulation != "reference":
        res = joint.solve([joint.Part(pb, None, max_rps=max_rps)], pb.node, solver=solver,
                          time_limit_s=limit)
        p = res.plans[0]
        if p is None or p.planned_rps <= 0:
            return _Cap(0.0, res.status, res.seconds)
        bound = res.bound if res.status != "optimal" else p.planned_rps
        return _Cap(p.planned_rps, res.status, res.seconds, p, bound)
    model = _Model(pb, None, solver, max_rps=max_rps)
    word, secs = model.solve(limit)
    if word not in ("optimal", "feasible"):
        return _Cap(0.0, word, secs)
    r = max(0.0, (model.x(model.R) if isinstance(model.R, mip.Var) else model.R) or 0.0)
    if r <= 0:
        return _Cap(0.0, word, secs)
    assert model.sol is not None
    bound = model.sol.bound if word == "feasible" else r
    return _Cap(r, word, secs, model.extract(pb, r, r, word, secs), float(bound))


# ``capacity``'s default time limit (at least the node's planning limit): a capacity is an offline
# figure, and a proven one is the same on every run. ar_assistant's full capacity model is proven
# at CBC's root: 12.4 s at load 10 on the 2-core machine, so the node's 10 s stopped it at
# 862.94 rps ("feasible", a lower bound), where a quiet run proves 863.68.
CAPACITY_TIME_LIMIT_S = 60.0


def capacity(app: App, node: Node, profiles: ProfileTable, *, space: str | SearchSpace | None = None,
             time_limit_s: float | None = None, factors: Factors | None = None,
             solver: str | None = None, formulation: str | None = None) -> Capacity:
    """Maximum serviceable demand (root requests/s) and the cheapest plan that serves it.

    ``status`` is ``optimal`` when the maximum is proven; otherwise ``max_demand_rps`` is the
    best found (a lower bound) and ``upper_bound_rps`` the solver's bound. ``time_limit_s``
    defaults to the node's planning limit or ``CAPACITY_TIME_LIMIT_S``, whichever is longer.
    """
    form = _check_formulation(formulation or node.planner.formulation)
    sp = space if isinstance(space, SearchSpace) else search_space(space or node.planner.space)
    limit = time_limit_s if time_limit_s is not None else \
        max(node.planner.time_limit_s, CAPACITY_TIME_LIMIT_S)
    solver = solver or node.planner.solver
    t0 = time.perf_counter()
    pb = _problem(app, node, profiles, sp, factors)
    cap = _capacity(pb, solver, limit, formulation=form)
    if cap.plan is not None and form == "tight":
        with contextlib.suppress(PackingError):
            cap.plan = _with_layout(cap.plan, node, None)
    if cap.plan is None:
        empty = _empty_plan(pb, 0.0, cap.status, time.perf_counter() - t0,
                            _unserved_note(pb))
        return Capacity(app.name, sp.name, 0.0, empty, time.perf_counter() - t0, cap.status, 0.0)
    result = _plan_at(pb, cap, solver, limit, form)
    result.solve_seconds = time.perf_counter() - t0
    result.solver = solver
    result = _with_layout(result, node, None)
    return Capacity(app.name, sp.name, result.planned_rps, result, time.perf_counter() - t0,
                    cap.status, cap.upper_bound_rps)


def column_counts(app: App, node: Node, profiles: ProfileTable, space: str = "ast",
                  factors: Factors | None = None) -> ColumnSet:
    """The columns the MILP would see (for reports and benches)."""
    return build_columns(app, node, profiles, search_space(space), factors)


__all__: Sequence[str] = ("FORMULATIONS", "Capacity", "PackingError", "capacity", "column_counts", "plan")


def plan_anytime(app: App, node: Node, profiles: ProfileTable, demand_rps: float, *,
                 space: str | None = None, previous: Plan | None = None,
                 time_limit_s: float | None = None, factors: Factors | None = None,
                 solver: str | None = None) -> Iterator[Plan]:
    """Yields a verified quick plan (when the greedy finds one), then the exact plan."""
    from jigsaw.planner.anytime import quick_plan

    quick = quick_plan(app, node, profiles, demand_rps, space=space, factors=factors, previous=previous)
    if quick is not None:
        yield quick
    yield plan(app, node, profiles, demand_rps, space=space, previous=previous,
               time_limit_s=time_limit_s, factors=factors, solver=solver)
