"""The whole node's plan: every app at its demand in one decision over the shared slices.

Planning each app as if it had the whole node over-commits it; planning them one after another
gives the first app the best GPUs. ``plan_node`` decides all apps at once over the shared slice
budget, the per-GPU MIG layout constraint and the objective the node config chooses
(``planner.objective``: ``accuracy``, the sum over apps of ``weight x accuracy`` minus beta per
slice; or ``slices``, every app at its demand on the fewest slices), by default through the
decomposition (``decompose``: each app alone on its slice frontier, one packing, proven against
the sum of the apps' bounds), or as one model over all apps (``joint``, the reference the benches
and tests check it against). The result is packed as one
layout, so no two apps' instances overlap. If the demands do not fit together, every app serves
the same largest fraction of its demand (``demand_scale``), on the first plans found that fit
(``scaled``). The decomposition starts from what earlier decisions showed about each app's
budgets (``curves``) and adds to it; where that proves the demands do not fit, it goes straight
to the common fraction.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import product

from jigsaw.app import App
from jigsaw.errors import PlanError
from jigsaw.mig import NUM_PLACEMENT_SLOTS
from jigsaw.node import NODE_OBJECTIVES, Node
from jigsaw.plan import GpuLayout, Layout, NodePlan, PlacedInstance, Plan
from jigsaw.planner import curves, decompose, joint, value_curve
from jigsaw.planner.anytime import (
    Candidate,
    candidate_plan,
    candidates_below,
    extend_plan,
    fewest_first,
    largest_fraction,
    quick_candidates,
    quick_plan,
    rescale,
)
from jigsaw.planner.decompose import app_layout
from jigsaw.planner.diagnose import why_none_together
from jigsaw.planner.groups import pack_node
from jigsaw.planner.packer import InstanceRequest, PackingError
from jigsaw.planner.problem import Factors, Problem, make_problem
from jigsaw.planner.scaled import (
    CURVE_REFINE_S,
    SCALE_TOLERANCE,
    ScaleResult,
    above_greedy,
    max_scale,
    scale_plan,
)
from jigsaw.planner.share_merge import merge_shares
from jigsaw.planner.verify import verify_plan
from jigsaw.profiles import ProfileTable
from jigsaw.spaces import SearchSpace, search_space

FORMULATIONS = ("decomposed", "joint")
DEFAULT_FORMULATION = "decomposed"
QUICK_STATUS = "heuristic"  # a quick_plan_node plan: verified, not proven optimal
QUICK_BUDGET_S = 0.08  # per app: a smaller share loses the LP-rounded candidates of larger apps
_SEP = "\x1f"  # joins app and task in the packer's requests: no name contains it


@dataclass
class _Decision:
    """What either formulation decided (``layout``: already packed, or None)."""

    status: str
    plans: list[Plan | None]
    objective: float
    bound: float
    layout: Layout | None
    notes: list[str]
    stage: str
    floors: list[float] | None = None  # the decomposition's screen, per app (when it ran)


def _requests(plans: Mapping[str, Plan]) -> list[InstanceRequest]:
    return [InstanceRequest(pi.mig_profile, f"{name}{_SEP}{pi.task}", pi.variant, pi.mps, pi.max_batch, i)
            for name, p in plans.items() for pi in p.instances for i in range(pi.count)]


def _encoded(layout: Layout) -> Layout:
    """A node layout in the packer's terms (task names carry their app)."""
    return Layout(layout.gpu_model, tuple(
        GpuLayout(g.gpu, tuple(replace(p, task=f"{p.app}{_SEP}{p.task}", app="") for p in g.instances))
        for g in layout.gpus))


def _decoded(layout: Layout) -> Layout:
    gpus = []
    for g in layout.gpus:
        placed = []
        for p in g.instances:
            app, _, task = p.task.partition(_SEP)
            placed.append(replace(p, task=task, app=app))
        gpus.append(GpuLayout(g.gpu, tuple(placed)))
    return Layout(layout.gpu_model, tuple(gpus))


def _pack_node(plans: Mapping[str, Plan], node: Node, previous: NodePlan | None) -> Layout:
    """One layout for every app's instances, keeping what the previous node plan placed (on the
    same GPU model) where it is. Raises ``PackingError``."""
    prev = previous.layout if previous is not None else None
    if prev is not None and prev.gpu_model != node.gpu.name:
        prev = None
    return _decoded(pack_node(_requests(plans), node, _encoded(prev) if prev is not None else None))


def _pack_within(plans: Mapping[str, Plan], node: Node, previous: NodePlan | None) -> Layout | None:
    """``_pack_node`` of ``plans``, or None when they take more slices than the node has or do
    not pack."""
    if sum(p.slices_used for p in plans.values()) > node.slices_available:
        return None
    try:
        return _pack_node(plans, node, previous)
    except PackingError:
        return None


def extend_in_place(app: App, node: Node, profiles: ProfileTable, running: Mapping[str, Plan],
                    demand_rps: float, *, space: str | SearchSpace | None = None,
                    factors: Factors | None = None,
                    fits: Callable[[Plan], Plan | None] | None = None) -> Plan | None:
    """``app``'s running plan extended (``anytime.extend_plan``) for the largest fraction of
    ``demand_rps`` whose added instances pack beside every running instance of the node
    (``running``: each app's running plan, laid out), none of which moves; verified. None when
    not even a small fraction packs so, or the running plan cannot be extended.

    ``fits``: the runtime's own check (the plan laid out on slots nothing holds, draining
    generations' included, or None), used instead of the packer's. Why: ``pack`` keeps a GPU's
    partition only whole, so added instances never went on the free slots of a GPU that runs
    some (the extension failed on every fraction above the running plan's share once the small
    plan touched every GPU), and it cannot see the slots that drain.

    Why: a spike's quick plan extends the running plan at the full demand only while the added
    instances fit beside it; past that the greedy plans it falls back on reuse the running
    instances' slots, and the runtime refuses them when draining those would leave the app no
    lane (ar_assistant, day 0, bins 138-140: every plan for the spike refused, the 8-slice plan
    for 155 req/s met 560-710 req/s). A plan that keeps what runs and serves 70% of the spike
    needs no slot anyone holds.
    """
    run = running.get(app.name)
    if run is None or run.layout is None or not run.instances:
        return None
    sp = space if isinstance(space, SearchSpace) else search_space(space or node.planner.space)
    layout = merge_layouts(running, node.gpu.name, node.num_gpus)
    held = {(g.gpu, x.start, x.profile, x.app, x.task, x.variant) for g in layout.gpus for x in g.instances}
    previous = NodePlan(node=node.name, objective_kind=node.planner.objective, status=QUICK_STATUS,
                        feasible=True, objective=0.0, gap=math.inf, slices_used=0,
                        slices_available=node.slices_available, solve_seconds=0.0, plans=dict(running),
                        layout=layout)
    pb = make_problem(app, node, profiles, sp, factors)

    def laid_out(p: Plan) -> Plan | None:
        if fits is not None:
            laid = fits(p)
            return None if laid is None or verify_plan(laid, app, node, profiles, factors) else laid
        packed = _pack_within({**running, app.name: p}, node, previous)
        if packed is None:
            return None
        if not held <= {(g.gpu, x.start, x.profile, x.app, x.task, x.variant)
                        for g in packed.gpus for x in g.instances}:
            return None
        p.layout = app_layout(packed, app.name)
        return None if verify_plan(p, app, node, profiles, factors) else p

    def probe(f: float) -> Plan | None:
        return extend_plan(app, node, profiles, run, f * demand_rps, space=sp, factors=factors, problem=pb,
                           accept=laid_out)

    have = run.planned_rps / demand_rps if demand_rps > 0 else 1.0
    if have >= 1.0:
        return None
    whole = probe(1.0)
    got = (1.0, whole) if whole is not None else largest_fraction(probe, first=max(have, 0.5))
    if got is None or got[0] <= have:
        return None
    f, plan = got
    plan.notes = [f"the running plan kept in place, instances added beside it for {f:.0%} of the demand; "
                  "verified, not proven optimal"]
    return plan


def plan_node(apps: Sequence[App], node: Node, profiles: ProfileTable, demands: Mapping[str, float], *,
              objective: str | None = None, space: str | SearchSpace | None = None,
              previous: NodePlan | None = None, time_limit_s: float | None = None,
              factors: Mapping[str, Factors] | None = None, solver: str | None = None,
              start: NodePlan | None = None, formulation: str | None = None) -> NodePlan:
    """One plan for all ``apps`` of the node at ``demands`` (app name -> root requests/s).

    ``formulation``: ``decomposed`` (default: each app alone, its slice frontier where the
    apps compete, one packing check; ``decompose``) or ``joint`` (one model over all apps,
    kept to check the decomposition against). Both prove the same optimum.
    ``start``: a feasible node plan for the same demands (``quick_plan_node``'s) to start the
    joint model from (the decomposition starts each app from its own greedy plan: packed for
    that app alone, it is the start ``milp.plan`` uses too, so both give the same plans); one
    for a fraction of them (``scale_down``) is where a large node's spike starts (``_quick_first``).
    """
    t0 = time.perf_counter()
    kind, solver, form = _check_node_request(apps, node, demands, objective, solver, formulation)
    sp = space if isinstance(space, SearchSpace) else search_space(space or node.planner.space)
    limit = time_limit_s if time_limit_s is not None else node.planner.time_limit_s
    running = previous.plans if previous is not None else {}
    parts = [joint.Part(make_problem(a, node, profiles, sp, (factors or {}).get(a.name)),
                        float(demands[a.name]), node.planner.app_weight(a.name),
                        keep=_keys(running.get(a.name))) for a in apps]
    names = [a.name for a in apps]

    def decide(parts: list[joint.Part], start_plans: list[Plan | None] | None) -> _Decision:
        if form == "joint":
            r = joint.solve(parts, node, solver=solver, time_limit_s=limit, objective=kind,
                            start=start_plans)
            return _Decision(r.status, r.plans, r.objective, r.bound, None, r.notes, r.stage)
        total = sum(p.weight for p in parts) or 1.0
        scopes = [value_curve.scope_of(kind, p.weight, total) for p in parts]
        d = decompose.solve(parts, node, solver=solver, time_limit_s=limit, objective=kind,
                            pack=lambda ps: _pack_node(dict(zip(names, ps, strict=True)), node, previous),
                            known=curves.seed(parts, node),
                            seeds=[value_curve.seeds(p.pb, sc, p.demand_rps or 0.0)
                                   for p, sc in zip(parts, scopes, strict=True)])
        curves.learn(parts, d)
        value_curve.learn([p.pb for p in parts], scopes, [p.demand_rps or 0.0 for p in parts],
                          d.solved or [[] for _ in parts])
        return _Decision(d.status, d.plans, d.objective, d.bound, d.layout, d.notes, d.stage, d.floors)

    if form != "joint" and (why := why_none_together([p.pb for p in parts])):
        # no demand at all fits (a task without a segment, the tasks' segments beyond the node):
        # said at once, not after a scaled search down to nothing
        return _empty(node, kind, "infeasible", time.perf_counter() - t0,
                      _none_together([p.pb for p in parts]))
    scale = scale_bound = 1.0  # the common fraction served, and the least shown not to fit
    notes: list[str] = []
    refuted = form != "joint" and _refuted(parts, node)
    first, greedy = (None, None) if form == "joint" or refuted else _quick_first(
        apps, node, profiles, demands, parts, kind, sp, solver, limit - (time.perf_counter() - t0),
        previous, factors, start, notes)
    if first is not None:  # the greedy's fraction, bracketed by the tests above it
        res, scale, scale_bound = first
    elif refuted:
        # what earlier plans proved (the apps' curves) shows the demands do not fit together
        res = _Decision("infeasible", [None] * len(parts), math.nan, math.nan, None, [], "curves")
    else:
        res = decide(parts, [start.plans.get(a.name) for a in apps] if start and start.feasible else None)
    if form != "joint" and (res.status == "infeasible" or any(p is None for p in res.plans)):
        # the demands do not fit together (or no plan was found for them in time): every app
        # at the largest common fraction, searched by decomposition (``scaled``)
        left_s = max(limit - (time.perf_counter() - t0), 0.5 * limit)
        res, scale, scale_bound = _decomposed_scale(parts, node, res, solver, left_s, kind, notes,
                                                    lambda ps: _pack_node(dict(zip(names, ps, strict=True)),
                                                                          node, previous), greedy)
    if res.status == "infeasible":
        res, scale, scale_bound, why = _joint_scaled(parts, node, solver, limit, decide)
        if res is None:
            return _empty(node, kind, "infeasible" if why is None else "no_solution",
                          time.perf_counter() - t0, why or _none_together([p.pb for p in parts]))
        notes.append(f"the demands do not fit together: every app serves {scale:.4%} of its demand"
                     + (f" ({why})" if why else ""))
    if any(p is None for p in res.plans):
        return _empty(node, kind, res.status, time.perf_counter() - t0,
                      f"the solver found no plan within {limit:g} s")
    out = _node_plan(apps, node, demands, res, kind=kind, solver=solver, previous=previous, scale=scale,
                     scale_bound=scale_bound, notes=notes, t0=t0)
    return with_shares(out, apps, node, profiles, factors, previous)


def with_shares(result: NodePlan, apps: Sequence[App], node: Node, profiles: ProfileTable,
                factors: Mapping[str, Factors] | None, previous: NodePlan | None) -> NodePlan:
    """``result`` with its small tasks' idle tails merged into shared MIG instances where that
    frees slices (``share_merge``: the same lanes, verified; the status and proof of the
    homogeneous plan kept, the note says what moved), else ``result`` itself."""
    if not result.plans or result.layout is None:
        return result
    t0 = time.perf_counter()
    got = merge_shares(apps, node, profiles, result.plans,
                       lambda ps: _pack_node(ps, node, previous), factors)
    if got is None:
        return result
    for p in got.plans.values():
        p.solve_seconds = result.solve_seconds + time.perf_counter() - t0
    return replace(result, plans=got.plans, layout=got.layout,
                   slices_used=sum(p.slices_used for p in got.plans.values()),
                   objective=node_value(got.plans, node, result.objective_kind),
                   solve_seconds=result.solve_seconds + time.perf_counter() - t0,
                   notes=[*result.notes, got.note])


# From this share of the node's slices taken by the apps' LP slice floors (``decompose.floor_slices``
# with ``lp``: milliseconds) a node plan first tries the greedy's largest common fraction
# (``_quick_first``). The example apps' LP floors are 79-86% of the node at 90% of their
# capacities (where most mixes fit: the full decision comes first, as before), 86-91% at 100%
QUICK_FIRST_SHARE = 0.88
# ... on a node of at least this many slices. On the example node (28) the greedy's fraction lies
# up to 12% below theta* (115%: 0.686 against 0.784) and the decision at the full demands costs
# 0.3 s: the test above the greedy finds plans, and the search after it took 3.8 s against 1.8;
# on 16 GPUs (112) the greedy lies within 2% and each test of the search costs 1.5-5 s
QUICK_FIRST_MIN_SLICES = 56
# ... and on a node of at least QUICK_FIRST_CAP_SLICES the tests above the greedy's fraction
# (``scaled.above_greedy``) get at most QUICK_FIRST_TESTS_S in all. On 16 GPUs (112 slices) at
# 100 / 115 / 150% the first test ran the whole 10 s limit undecided in 8 of 9 mixes
# (ar_assistant's or traffic_analysis's budgets at the edge of what 33-40 slots serve, 1 s a
# solve, no plan and no proof) and the greedy's fraction stood; 1.2 s is the test's first stage
# (the floors and each app's own optimum: where those pack, it climbs). On 8 GPUs (56) the greedy
# lies 4-8% below what the tests raise it to within the limit: no cap there
QUICK_FIRST_CAP_SLICES = 112
QUICK_FIRST_TESTS_S = 1.2


def _quick_first(apps: Sequence[App], node: Node, profiles: ProfileTable, demands: Mapping[str, float],
                 parts: list[joint.Part], kind: str, sp: SearchSpace, solver: str, left_s: float,
                 previous: NodePlan | None, factors: Mapping[str, Factors] | None,
                 start: NodePlan | None, notes: list[str]
                 ) -> tuple[tuple[_Decision, float, float] | None, NodePlan | None]:
    """Near a large node's capacity (``QUICK_FIRST_MIN_SLICES``, the LP floors over
    ``QUICK_FIRST_SHARE`` of its slices): the greedy's plans for the largest common fraction they
    reach (the caller's ``start`` where it is such a plan, else ``quick_plan_node(scale_down=True)``),
    bracketed by the tests above them (``scaled.above_greedy``; on the largest nodes
    ``QUICK_FIRST_TESTS_S`` at most, the greedy's fraction with no bound below 1 where they decide
    nothing). Returns the decision with the
    fraction served and the least shown not to fit (a note saying so appended to ``notes``), or
    None where the greedy serves the full demands or the tests above it climb without a
    refutation (the decision at the full demands comes next, as without it); and the greedy's
    scaled plan (None: none), what the scaled search falls back to where it finds no plan in time.

    Why: the decision at the full demands and the scaled search's steps down from them took 10 s
    on 16 GPUs at 100% of three example apps' capacity (each test 1.5-2.2 s) and served 0.932
    unproven; the greedy served 0.948 in 0.2 s, and the test twice the tolerance above it bounds
    theta* in one more test."""
    if node.slices_available < QUICK_FIRST_MIN_SLICES:
        return None, None
    lp = decompose.floor_slices(parts, node, solver, decompose.FLOOR_LIMIT_S, lp=True)
    if sum(lp) < QUICK_FIRST_SHARE * node.slices_available:
        return None, None
    q = start if start is not None and start.demand_scale < 1.0 else None
    if q is None:
        q = quick_plan_node(apps, node, profiles, demands, objective=kind, space=sp, previous=previous,
                            factors=factors, scale_down=True)
    if q is None or q.demand_scale >= 1.0 or q.layout is None:
        return None, None
    if left_s <= 0:
        return None, q
    names = [a.name for a in apps]
    sc = above_greedy(parts, node, [q.plans[n] for n in names], q.layout, q.demand_scale, solver=solver,
                      time_limit_s=min(left_s, QUICK_FIRST_TESTS_S)
                      if node.slices_available >= QUICK_FIRST_CAP_SLICES else left_s,
                      pack=lambda ps: _pack_node(dict(zip(names, ps, strict=True)), node, previous))
    if sc is None:
        return None, q
    hi = sc.theta_hi
    why = (f"the largest common fraction to within {SCALE_TOLERANCE:.0%}: {hi:.4%} does not fit"
           if sc.status == "proven" else f"not proven the largest: {hi:.4%} does not fit" if hi < 1.0
           else "not proven the largest: nothing above it refuted within the limit")
    notes.append(f"the demands do not fit together: every app serves {sc.theta_lo:.4%} of its demand ({why})")
    return (_scaled_decision(parts, sc, node, kind), sc.theta_lo, min(1.0, hi)), q


def _refuted(parts: Sequence[joint.Part], node: Node) -> bool:
    """The apps' curves (``curves``) prove the full demands do not fit together."""
    return curves.refuted_theta([p.demand_rps or 0.0 for p in parts], [curves.curve_of(p.pb) for p in parts],
                                curves.room_of(node)) <= 1.0


def _check_node_request(apps: Sequence[App], node: Node, demands: Mapping[str, float],
                        objective: str | None, solver: str | None,
                        formulation: str | None) -> tuple[str, str, str]:
    """The objective, solver and formulation ``plan_node`` runs (the node's defaults where not
    given), or a ``PlanError`` for no apps, an app listed twice, a demand missing, unknown or
    not a finite number >= 0, or an unknown choice."""
    if not apps:
        raise PlanError("no apps to plan")
    names = [a.name for a in apps]
    if len(set(names)) != len(names):
        raise PlanError(f"apps listed twice: {', '.join(sorted({n for n in names if names.count(n) > 1}))}")
    for name in demands:
        if name not in names:
            raise PlanError(f"demand for {name!r}, which is not among the apps ({', '.join(names)})")
    for name in names:
        d = demands.get(name)
        if d is None:
            raise PlanError(f"no demand given for app {name!r}")
        if not d >= 0 or math.isinf(d):
            raise PlanError(f"demand of {name!r} must be a finite number >= 0, got {d!r}")
    kind = objective or node.planner.objective
    if kind not in NODE_OBJECTIVES:
        raise PlanError(f"unknown objective {kind!r} (expected one of {', '.join(NODE_OBJECTIVES)})")
    solver = solver or node.planner.solver
    if solver not in ("cbc", "highs"):
        raise PlanError(f"unknown solver {solver!r} (expected cbc or highs)")
    form = formulation or DEFAULT_FORMULATION
    if form not in FORMULATIONS:
        raise PlanError(f"unknown formulation {form!r} (expected one of {', '.join(FORMULATIONS)})")
    return kind, solver, form


def _decomposed_scale(parts: list[joint.Part], node: Node, res: _Decision, solver: str, left_s: float,
                      kind: str, notes: list[str], pack: decompose.Packer,
                      greedy: NodePlan | None = None) -> tuple[_Decision, float, float]:
    """Every app at the largest common fraction of its demand, searched by decomposition
    (``scaled.max_scale``) after ``res`` found no plan at the full demands: the decision (``res``
    when the search finds none), the fraction served and the least shown not to fit; a note
    saying so appended to ``notes`` when less than all is served."""
    scale = scale_bound = 1.0
    sc = max_scale(parts, node, solver=solver, time_limit_s=left_s, pack=pack,
                   hi_proven=res.status == "infeasible", floors=res.floors, refine_s=CURVE_REFINE_S)
    if sc.plans is None and greedy is not None and greedy.layout is not None:
        # no plan found in time: the greedy's (``_quick_first``), below what the search refuted
        mine = [scale_plan(greedy.plans[p.pb.app.name], 1.0) for p in parts]  # copies: the caller's own
        sc = ScaleResult("bound", greedy.demand_scale, sc.theta_hi, mine, greedy.layout, sc.seconds,
                         sc.tests, [*sc.notes, "the greedy's plan: the search found none in time"])
    if sc.plans is None:
        return res, scale, scale_bound
    scale = min(1.0, sc.theta_lo)
    scale_bound = min(1.0, sc.theta_hi)
    res = _scaled_decision(parts, sc, node, kind)
    if sc.status == "proven":
        why = (f"the largest common fraction to within {SCALE_TOLERANCE:.0%}: "
               f"{sc.theta_hi:.4%} does not fit")
    elif math.isfinite(sc.theta_hi) and sc.theta_hi < 1.0:
        why = f"not proven the largest: {sc.theta_hi:.4%} is the least shown not to fit"
    else:
        why = "not proven the largest"
    if scale < 1.0:
        notes.append(f"the demands do not fit together: every app serves {scale:.4%} of its "
                     f"demand ({why})")
    return res, scale, scale_bound


def _node_plan(apps: Sequence[App], node: Node, demands: Mapping[str, float], res: _Decision, *,
               kind: str, solver: str, previous: NodePlan | None, scale: float, scale_bound: float,
               notes: list[str], t0: float) -> NodePlan:
    """The ``NodePlan`` of a decision with a plan for every app: each plan marked with its demand
    and solver (a max-demand plan where ``scale`` < 1), laid out on the node, the gap computed."""
    plans: dict[str, Plan] = {}
    for a, p in zip(apps, res.plans, strict=True):
        assert p is not None
        p.demand_rps = float(demands[a.name])
        p.solver = solver
        if scale < 1.0:
            p.feasible = False
            p.max_demand_plan = True
            p.notes.append(f"node-wide plan: serving {p.planned_rps:.6g} of {p.demand_rps:g} rps")
        plans[a.name] = p
    layout = res.layout if res.layout is not None else _pack_node(plans, node, previous)
    secs = time.perf_counter() - t0
    for name, p in plans.items():
        p.layout = app_layout(layout, name)
        p.solve_seconds = secs
    gap = 0.0 if res.status == "optimal" else (
        abs(res.bound - res.objective) if math.isfinite(res.bound) and math.isfinite(res.objective)
        else math.inf)
    return NodePlan(node=node.name, objective_kind=kind, status=res.status, feasible=scale >= 1.0,
                    objective=res.objective, gap=gap, slices_used=sum(p.slices_used for p in plans.values()),
                    slices_available=node.slices_available, solve_seconds=secs, plans=plans,
                    layout=layout, demand_scale=scale, scale_bound=max(scale, scale_bound),
                    notes=notes + res.notes)

def _scaled_decision(parts: list[joint.Part], sc: ScaleResult, node: Node, kind: str) -> _Decision:
    """The scaled search's plans as a decision: ``feasible`` (a plan, never a proven optimum).

    Why: the search's tests stop at the first plans that pack (a test of whether a fraction
    fits), so its plans are not the node objective's best at the fraction served, and that
    fraction is proven only to within ``SCALE_TOLERANCE`` (``NodePlan.scale_bound``). Solving
    the objective again at that fraction (a full node: the frontier's hardest case) took 13-28 s
    on three example apps at 100-150% on a loaded machine, where a spike's plan is wanted in one;
    the plans were labelled ``optimal`` before, a status without a proof."""
    assert sc.plans is not None
    got = dict(zip([p.pb.app.name for p in parts], sc.plans, strict=True))
    return _unproven(_Decision("feasible", list(sc.plans), node_value(got, node, kind), math.nan,
                               sc.layout, list(sc.notes), "scaled"))


def _unproven(res: _Decision) -> _Decision:
    """``res`` and its plans labelled ``feasible`` (a plan, not a proven optimum)."""
    res.status = "feasible"
    for p in res.plans:
        if p is not None and p.status == "optimal":
            p.status = "feasible"
    return res


def _joint_scaled(parts: list[joint.Part], node: Node, solver: str, limit: float,
                  decide: Callable[[list[joint.Part], list[Plan | None] | None], _Decision]
                  ) -> tuple[_Decision | None, float, float, str | None]:
    """The joint formulation above the node: the joint capacity model's common fraction, then
    the best plans there (``decide``). Returns the decision (None: no plan), the fraction, its
    proven upper bound and why it is not proven (None: proven).

    Why: the capacity model often stops at its limit (three example apps at 115%: "feasible",
    bound 0.85, in 10 s); the plans at the fraction it found were labelled by their own solve,
    ``optimal``, at fractions that changed from run to run, and a stop with nothing served read
    as "cannot be served at any demand". A node plan is ``optimal`` only where the fraction and
    the plans at it are both proven."""
    cap = joint.solve(parts, node, solver=solver, time_limit_s=limit, scale_demands=True)
    first = cap.plans[0]
    demand0 = max(parts[0].demand_rps or 0.0, joint.MIN_DEMAND_RPS)
    bound = cap.bound + 1e-6 * node.slices_available if math.isfinite(cap.bound) else math.inf
    unproven = None if cap.status == "optimal" else (
        f"not proven the largest within {limit:g} s: the capacity model's bound is {bound:.4%}"
        if math.isfinite(bound) else f"not proven the largest within {limit:g} s")
    if first is None or first.planned_rps <= 0:
        return None, 0.0, min(1.0, bound), None if cap.status in ("optimal", "infeasible") else \
            f"no common fraction found within {limit:g} s"
    scale = first.planned_rps / demand0
    bound = scale if unproven is None else min(1.0, max(bound, scale))
    for shrink in (1.0, 1 - 1e-7, 1 - 1e-5):
        scaled = [joint.Part(p.pb, (p.demand_rps or 0.0) * scale * shrink, p.weight, keep=p.keep)
                  for p in parts]
        again = decide(scaled, None)
        if all(p is not None for p in again.plans):
            return (again if unproven is None else _unproven(again)), scale * shrink, bound, unproven
    # the capacity model's own plans: their slices are not minimised
    res = _Decision(cap.status, cap.plans, cap.objective, cap.bound, None,
                    [*cap.notes, "the capacity model's plans: the objective at that fraction unproven"],
                    cap.stage)
    return _unproven(res), scale, bound, unproven


def _keys(plan: Plan | None) -> frozenset[tuple[str, str, str, int, int]]:
    """The columns a running plan uses (what lifting keeps among equally good ones)."""
    if plan is None:
        return frozenset()
    return frozenset((x.task, x.variant, x.mig_profile, x.mps, x.max_batch) for x in plan.instances)


def _empty(node: Node, kind: str, status: str, secs: float, note: str) -> NodePlan:
    return NodePlan(node=node.name, objective_kind=kind, status=status, feasible=False,
                    objective=math.nan, gap=math.inf, slices_used=0,
                    slices_available=node.slices_available, solve_seconds=secs, demand_scale=0.0,
                    notes=[note])


def _none_together(problems: list[Problem]) -> str:
    why = why_none_together(problems)
    return "the apps cannot be served together on this node at any demand" + (f": {why}" if why else "")


def merge_layouts(plans: Mapping[str, Plan], gpu_model: str, num_gpus: int) -> Layout:
    """One node layout from each app's own layout (the inverse of ``app_layout``): every
    instance labelled with its app. Plans without a layout contribute nothing."""
    by_gpu: dict[int, list[PlacedInstance]] = {g: [] for g in range(num_gpus)}
    for name, p in plans.items():
        if p.layout is None:
            continue
        for g in p.layout.gpus:
            by_gpu.setdefault(g.gpu, []).extend(
                replace(x, app=name) for x in g.instances)
    return Layout(gpu_model, tuple(GpuLayout(g, tuple(xs)) for g, xs in sorted(by_gpu.items())))


def app_value(name: str, p: Plan, node: Node, objective: str | None = None) -> float:
    """One app's share of the node objective, computed the same way for a quick and an exact plan:
    ``slices``: fewer is better; ``accuracy``: its weighted accuracy minus beta per slice."""
    if (objective or node.planner.objective) == "slices":
        return -float(p.slices_used)
    return node.planner.app_weight(name) * node.planner.alpha * p.accuracy - node.beta * p.slices_used


def node_value(plans: Mapping[str, Plan], node: Node, objective: str | None = None) -> float:
    """The node objective of a set of plans (``app_value`` summed)."""
    return sum(app_value(n, p, node, objective) for n, p in plans.items())


def prefer_quick(quick: NodePlan, exact: NodePlan, node: Node, objective: str | None = None) -> bool:
    """The verified quick plan beats the exact solve's answer: that found nothing, or stopped
    unproven (a time limit on a loaded machine) at a worse objective. A proven optimum, or an
    answer for scaled demands (the quick plan serves them in full only when they fit), never loses."""
    if not exact.plans or any(not p.instances for p in exact.plans.values()):
        return True
    if quick.demand_scale < exact.demand_scale - 1e-12:
        return False  # a quick plan for part of the demands (``scale_down``) serves less
    return exact.status != "optimal" and exact.demand_scale >= 1.0 and \
        node_value(quick.plans, node, objective) > node_value(exact.plans, node, objective) + 1e-9


def quick_plan_node(apps: Sequence[App], node: Node, profiles: ProfileTable, demands: Mapping[str, float], *,
                    objective: str | None = None, space: str | SearchSpace | None = None,
                    previous: NodePlan | None = None, factors: Mapping[str, Factors] | None = None,
                    budget_s: float = QUICK_BUDGET_S, scale_down: bool = False) -> NodePlan | None:
    """A verified node plan within about ``budget_s`` per app, or None: one of each app's
    greedy candidates (``anytime.quick_candidates``) at its full demand, chosen so that they fit
    the node together (``_fit_together``: the best first, then those of the fewest slices and
    slots), packed as one layout and each checked by ``verify.verify_plan``. None when none fit
    together or any app has none. A single app takes its greedy plan (``anytime.quick_plan``).

    ``scale_down``: where the full demands find no plan, the plan for the largest common
    fraction of them that the candidates reach (``_scaled_fit``; ``demand_scale`` says which,
    ``feasible`` is false, the status still ``heuristic``): near and above the node's capacity
    the controller then still has a verified plan within the quick plan's time.

    With ``previous`` (the running node plan), each app's running plan is kept and extended
    for its new demand first (``anytime.extend_plan``): a burst's quick plan then adds
    instances beside the running ones instead of restarting the node on a greedy plan that
    shares nothing with it. Only if those do not fit together are the greedy plans tried.

    What a controller reacting to a burst deploys while ``plan_node`` proves the optimum.
    """
    t0 = time.perf_counter()
    kind = objective or node.planner.objective
    sp = space if isinstance(space, SearchSpace) else search_space(space or node.planner.space)
    by_name = {a.name: a for a in apps}
    for a in apps:
        if a.name not in demands:
            raise PlanError(f"no demand given for app {a.name!r}")
    kept = _extended_running(apps, node, profiles, demands, previous, sp, factors)

    def attempt(use_kept: bool) -> tuple[dict[str, Plan], Layout] | None:
        plans: dict[str, Plan] = {}
        for a in apps:
            p = kept.get(a.name) if use_kept else None
            if p is None:
                p = quick_plan(a, node, profiles, float(demands[a.name]), space=sp,
                               factors=(factors or {}).get(a.name), budget_s=budget_s)
            if p is None:
                return None
            plans[a.name] = p
        layout = _pack_within(plans, node, previous)
        if layout is None:
            return None
        for name, p in plans.items():
            p.layout = app_layout(layout, name)
            if verify_plan(p, by_name[name], node, profiles, (factors or {}).get(name)):
                return None
        return plans, layout

    # the running plans kept (what runs stays where it is) first; else, for several apps, a
    # choice of each app's greedy candidates that fits together (``_fit_together``)
    got = attempt(True) if kept else None
    options: list[_AppOptions] | None = None
    if got is None:
        if len(apps) == 1:
            got = attempt(False)
        else:
            options = _app_options(apps, node, profiles, demands, sp, factors, budget_s, kind)
            got = _fit_together(options, node, profiles, demands, factors, previous, budget_s) \
                if options is not None else None
    scale = 1.0
    if got is None and scale_down:
        options = options or _app_options(apps, node, profiles, demands, sp, factors, budget_s, kind,
                                          lower=True)
        found = _scaled_fit(options, node, profiles, demands, factors, previous) \
            if options is not None else None
        if found is not None:
            scale, plans, layout = found
            got = plans, layout
    if got is None:
        return None
    plans, layout = got
    return _quick_node_plan(node, kind, plans, layout, kept, scale, time.perf_counter() - t0)


def _extended_running(apps: Sequence[App], node: Node, profiles: ProfileTable, demands: Mapping[str, float],
                      previous: NodePlan | None, sp: SearchSpace,
                      factors: Mapping[str, Factors] | None) -> dict[str, Plan]:
    """Each app's running plan (in ``previous``) extended for its new demand
    (``anytime.extend_plan``), by app name; an app without one, or whose extension fails, is absent."""
    kept: dict[str, Plan] = {}
    if previous is not None:
        for a in apps:
            run = previous.plans.get(a.name)
            if run is not None and run.instances:
                p = extend_plan(a, node, profiles, run, float(demands[a.name]), space=sp,
                                factors=(factors or {}).get(a.name))
                if p is not None:
                    kept[a.name] = p
    return kept


def _quick_node_plan(node: Node, kind: str, plans: dict[str, Plan], layout: Layout, kept: dict[str, Plan],
                     scale: float, secs: float) -> NodePlan:
    """The quick plan's ``NodePlan``: its notes say which plans it took (the running ones extended,
    or the greedy's) and, where ``scale`` < 1, the fraction of the demands served."""
    for p in plans.values():
        p.solve_seconds = secs
    slices = sum(p.slices_used for p in plans.values())
    what = ("the running plans kept, instances added for the new demands"
            if any(plans.get(n) is k for n, k in kept.items()) else "each app's greedy plan")
    notes = ["anytime incumbent: " + what + ", packed together and verified; not proven optimal"]
    if scale < 1.0:
        notes.append(f"the greedy's plan for {scale:.2%} of every app's demand: none found for the full "
                     "demands (not proven the largest fraction)")
    return NodePlan(node=node.name, objective_kind=kind, status=QUICK_STATUS, feasible=scale >= 1.0,
                    objective=node_value(plans, node, kind),
                    gap=math.inf, slices_used=slices, slices_available=node.slices_available,
                    solve_seconds=secs, plans=plans, layout=layout, demand_scale=scale, notes=notes)


FIT_TRIES = 8  # ``_fit_together``: choices packed and verified at most, per order tried


@dataclass
class _AppOptions:
    """One app's greedy candidates for ``_fit_together`` and ``_scaled_fit``."""

    app: App
    pb: Problem
    rate: float  # the app's demand (root rps, at least joint.MIN_DEMAND_RPS)
    at: float  # the rate the candidates are for (``rate``, or a half of it, ... where none fit)
    opts: list[tuple[tuple[int, int], float, Candidate]]  # (slices, slots), node value, candidate
    cands: list[Candidate]  # every candidate (``_scaled_fit`` rescales the fewest-slice ones)


def _app_options(apps: Sequence[App], node: Node, profiles: ProfileTable, demands: Mapping[str, float],
                 sp: SearchSpace, factors: Mapping[str, Factors] | None, budget_s: float, kind: str,
                 lower: bool = False) -> list[_AppOptions] | None:
    """Per app its greedy candidates (``anytime.quick_candidates``) not dominated in (value,
    slices, slots), with each one's runner-up of the same usage; None if an app has none that
    fits the node (with ``lower``: none at all).
    ``lower``: an app without candidates at its demand takes those at the first half, quarter...
    that has some (``anytime.candidates_below``; for ``_scaled_fit``)."""
    size = {p.name: p.slot_cost for p in node.gpu.profiles}
    room = (node.slices_available, NUM_PLACEMENT_SLOTS * node.num_gpus)
    out: list[_AppOptions] = []
    for a in apps:
        pb = make_problem(a, node, profiles, sp, (factors or {}).get(a.name))
        r = max(float(demands[a.name]), joint.MIN_DEMAND_RPS)
        at, cands = candidates_below(pb, r, budget_s) if lower else (r, quick_candidates(pb, r, budget_s))
        by_use: dict[tuple[int, int], list[tuple[float, Candidate]]] = {}
        w = node.planner.app_weight(a.name)
        for cand in cands:
            use = (sum(c.slices * n for c, n in cand[2]), sum(size[c.mig_profile] * n for c, n in cand[2]))
            if use[0] > room[0] or use[1] > room[1]:
                continue
            # the node objective's term (``app_value``): the candidate's accuracy weighted
            value = -float(use[0]) if kind == "slices" else \
                w * (cand[0] + node.beta * use[0]) - node.beta * use[0]
            kept = by_use.setdefault(use, [])
            if len(kept) < 2:
                kept.append((value, cand))
        best = {u: cs[0][0] for u, cs in by_use.items()}
        front = [u for u in best if not any(
            v != u and v[0] <= u[0] and v[1] <= u[1] and best[v] >= best[u] for v in best)]
        opts = [(u, val, c) for u in front for val, c in by_use[u]]
        if not opts and not (lower and cands):
            # (``lower``: candidates too large for the node at this rate are still what
            # ``_scaled_fit`` rescales: near capacity every one overran the slices or slots by
            # a little, and the scaled quick plan found nothing where it is needed most)
            return None
        out.append(_AppOptions(a, pb, r, at, opts, cands))
    return out


def _fit_together(options: list[_AppOptions], node: Node, profiles: ProfileTable,
                  demands: Mapping[str, float], factors: Mapping[str, Factors] | None,
                  previous: NodePlan | None, budget_s: float) -> tuple[dict[str, Plan], Layout] | None:
    """The best choice of one greedy candidate per app (``_app_options``) whose slices and MIG
    slots fit the node together, packed as one layout and every plan verified: up to
    ``FIT_TRIES`` choices best first, then as many of the fewest slices and of the fewest slots.

    Why: each app's own best greedy plan often leaves too little for the others near the node's
    capacity (70-90% of it: no quick plan before), while a slightly worse candidate of one app
    lets all fit; at 90% only the choices of the fewest slices do.
    """
    t0 = time.perf_counter()
    room = (node.slices_available, NUM_PLACEMENT_SLOTS * node.num_gpus)
    combos = [c for c in product(*(o.opts for o in options))
              if sum(x[0][0] for x in c) <= room[0] and sum(x[0][1] for x in c) <= room[1]]
    orders = (lambda c: -sum(x[1] for x in c),
              lambda c: (sum(x[0][0] for x in c), -sum(x[1] for x in c)),
              lambda c: (sum(x[0][1] for x in c), -sum(x[1] for x in c)))
    bad: set[int] = set()  # candidates (by id) whose plan failed the verifier
    seen: set[tuple[int, ...]] = set()
    for order in orders:
        tries = 0
        for combo in sorted(combos, key=order):
            if tries >= FIT_TRIES or (tries and time.perf_counter() - t0 > len(options) * budget_s):
                break
            ids = tuple(id(x[2]) for x in combo)
            if ids in seen or any(i in bad for i in ids):
                continue
            seen.add(ids)
            tries += 1
            got = _fit_one(options, [x[2] for x in combo], 1.0, node, profiles, demands, factors,
                           previous, bad)
            if got is not None:
                return got
    return None


def _fit_one(options: list[_AppOptions], cands: list[Candidate], scale: float, node: Node,
             profiles: ProfileTable, demands: Mapping[str, float], factors: Mapping[str, Factors] | None,
             previous: NodePlan | None, bad: set[int] | None = None
             ) -> tuple[dict[str, Plan], Layout] | None:
    """One candidate per app (for ``scale`` of its demand) as plans packed together and verified,
    or None (each candidate whose plan fails the verifier goes into ``bad``)."""
    plans = {o.app.name: candidate_plan(o.pb, scale * float(demands[o.app.name]), scale * o.rate, c)
             for o, c in zip(options, cands, strict=True)}
    try:
        layout = _pack_node(plans, node, previous)
    except PackingError:
        return None
    ok = True
    for o, c in zip(options, cands, strict=True):
        p = plans[o.app.name]
        p.layout = app_layout(layout, o.app.name)
        if verify_plan(p, o.app, node, profiles, (factors or {}).get(o.app.name)):
            if bad is not None:
                bad.add(id(c))
            ok = False
    return (plans, layout) if ok else None


def _scaled_fit(options: list[_AppOptions], node: Node, profiles: ProfileTable,
                demands: Mapping[str, float], factors: Mapping[str, Factors] | None,
                previous: NodePlan | None) -> tuple[float, dict[str, Plan], Layout] | None:
    """The largest common fraction of the demands (``anytime.largest_fraction``) at which each
    app's candidates of the fewest slices or slots, ``anytime.rescale``d to it, fit together:
    the fraction, the verified plans (each for its fraction of the demand) and their layout.

    Why: a re-plan near or above the node's capacity found no quick plan before, and the scaled
    one took 0.1-0.5 s (a whole candidate search per fraction tried); rescaling the candidates
    found for the full demands costs a few knapsacks per fraction.
    """
    size = {p.name: p.slot_cost for p in node.gpu.profiles}
    room = (node.slices_available, NUM_PLACEMENT_SLOTS * node.num_gpus)
    few = [fewest_first(o.cands, size) for o in options]

    def usage(c: Candidate) -> tuple[int, int]:
        return sum(x.slices * n for x, n in c[2]), sum(size[x.mig_profile] * n for x, n in c[2])

    def probe(f: float) -> tuple[dict[str, Plan], Layout] | None:
        per_app = []
        for o, cs in zip(options, few, strict=True):
            got = [c for c in (rescale(o.pb, c, o.at, f * o.rate, k) for c in cs for k in ("slices", "slots"))
                   if c is not None]
            if not got:
                return None
            per_app.append(got)
        # per app the rescaled candidates not dominated in (slices, slots), then the choices
        # that fit the node's slices and slots, fewest slices first (at most 3 packed)
        fronts = []
        for got in per_app:
            use = {id(c): usage(c) for c in got}
            fronts.append([c for c in got if not any(
                use[id(o)] != use[id(c)] and use[id(o)][0] <= use[id(c)][0] and use[id(o)][1] <= use[id(c)][1]
                for o in got)])
        choices = []
        for pick in product(*fronts):
            slices = sum(usage(c)[0] for c in pick)
            slots = sum(usage(c)[1] for c in pick)
            if slices <= room[0] and slots <= room[1]:
                choices.append((slices, slots, -sum(c[0] for c in pick), pick))
        choices.sort(key=lambda x: x[:3])
        for *_, pick in choices[:3]:
            got = _fit_one(options, list(pick), f, node, profiles, demands, factors, previous)
            if got is not None:
                return got
        return None

    need = [min(usage(c)[k] for c in cs) for k in (0, 1) for cs in few]
    n = len(options)
    at = min(o.at / o.rate for o in options)
    guess = at * min(1.0, 0.99 * room[0] / max(sum(need[:n]), 1), 0.99 * room[1] / max(sum(need[n:]), 1))
    found = largest_fraction(probe, guess)
    if found is None:
        return None
    frac, (plans, layout) = found
    return frac, plans, layout


def scaled_quick_plan_node(apps: Sequence[App], node: Node, profiles: ProfileTable,
                           demands: Mapping[str, float], *, objective: str | None = None,
                           space: str | SearchSpace | None = None, previous: NodePlan | None = None,
                           factors: Mapping[str, Factors] | None = None,
                           budget_s: float = QUICK_BUDGET_S) -> NodePlan | None:
    """``quick_plan_node(scale_down=True)``'s plan when it serves less than the full demands,
    labelled as the scaled search's plans are (status ``feasible``: verified, not proven), else
    None (the full demands have a quick plan, or not even a small fraction fits).

    Why: a spike's re-plan near or above the node's capacity can end its time limit with no plan
    at all (the exact solve and its scaled search run out), and a controller with nothing to
    deploy keeps the quiet plan through the whole spike.
    """
    q = quick_plan_node(apps, node, profiles, demands, objective=objective, space=space,
                        previous=previous, factors=factors, budget_s=budget_s, scale_down=True)
    if q is None or q.demand_scale >= 1.0:
        return None
    q.status = "feasible"
    return q


def plan_node_anytime(apps: Sequence[App], node: Node, profiles: ProfileTable,
                      demands: Mapping[str, float], *, objective: str | None = None,
                      space: str | SearchSpace | None = None,
                      previous: NodePlan | None = None, time_limit_s: float | None = None,
                      factors: Mapping[str, Factors] | None = None, solver: str | None = None,
                      formulation: str | None = None) -> Iterator[NodePlan]:
    """Yields ``quick_plan_node``'s plan (status ``heuristic``) when it finds one (where the full
    demands find none, its plan for the largest common fraction it reaches: ``scale_down``), then
    the exact node plan, ``plan_node``'s started from a full quick plan (with the ``joint``
    formulation: ``separate_optima``'s when the apps' own optima fit together, else the joint
    model's); the quick plan again where the exact solve found nothing (or nothing better)."""
    quick = quick_plan_node(apps, node, profiles, demands, objective=objective, space=space,
                            previous=previous, factors=factors, scale_down=True)
    if quick is not None:
        yield quick
    start = quick if quick is not None and quick.demand_scale >= 1.0 else None
    if (formulation or DEFAULT_FORMULATION) != "joint":
        # the decomposition starts with each app's own optimum (what separate_optima checks), a
        # large node's spike from the quick plan's fraction
        exact = plan_node(apps, node, profiles, demands, objective=objective, space=space,
                          previous=previous, time_limit_s=time_limit_s, factors=factors,
                          solver=solver, start=quick, formulation=formulation)
        if quick is not None and quick.demand_scale < 1.0 and \
                (not exact.plans or any(not p.instances for p in exact.plans.values())):
            quick.notes.append(f"the exact node plan ended {exact.status}")
            yield quick
            return
        if quick is not None and prefer_quick(quick, exact, node, objective):
            # the exact solve ran out of its limit with nothing better (a spike's re-plan): the
            # verified quick plan is the answer, said so in its notes
            quick.notes.append(f"the exact node plan ({exact.status}) was not better within the limit")
            yield quick
            return
        yield exact
        return
    limit = time_limit_s if time_limit_s is not None else node.planner.time_limit_s
    t0 = time.perf_counter()
    apart = separate_optima(apps, node, profiles, demands, objective=objective, space=space,
                            previous=previous, time_limit_s=0.5 * limit, factors=factors, solver=solver)
    if apart is not None and apart.status == "optimal":
        yield apart
        return
    exact = plan_node(apps, node, profiles, demands, objective=objective, space=space, previous=previous,
                      time_limit_s=max(0.5 * limit, limit - (time.perf_counter() - t0)), factors=factors,
                      solver=solver, start=apart if apart is not None else start, formulation="joint")
    yield apart if apart is not None and prefer_quick(apart, exact, node, objective) else exact


def separate_optima(apps: Sequence[App], node: Node, profiles: ProfileTable, demands: Mapping[str, float], *,
                    objective: str | None = None, space: str | SearchSpace | None = None,
                    previous: NodePlan | None = None, time_limit_s: float | None = None,
                    factors: Mapping[str, Factors] | None = None, solver: str | None = None
                    ) -> NodePlan | None:
    """The node optimum by decomposition when the shared slices do not bind, else None.

    With the ``accuracy`` objective and every app's weight 1, the node objective is the sum of
    the apps' own (``milp.plan``'s); any node plan restricted to one app is a plan for that app
    alone, so the sum of the apps' proven optima bounds the node optimum, and when those optima
    pack together onto the GPUs (and pass the verifier) they reach the bound: proven optimal
    without the joint model, which couples the apps through the slices and is much slower to
    prove. An app not proven within ``time_limit_s`` (shared by the apps) gives a ``feasible``
    plan whose gap is the sum of the apps' gaps; apps that crowd the node give None.
    """
    from jigsaw.planner.milp import plan as plan_app

    kind = objective or node.planner.objective
    if kind != "accuracy" or any(node.planner.app_weight(a.name) != 1.0 for a in apps):
        return None
    t0 = time.perf_counter()
    budget_s = time_limit_s if time_limit_s is not None else node.planner.time_limit_s
    sp = space if isinstance(space, SearchSpace) else search_space(space or node.planner.space)
    plans: dict[str, Plan] = {}
    for a in apps:
        left_s = max(budget_s / len(apps), budget_s - (time.perf_counter() - t0))  # a fair share at least
        p = plan_app(a, node, profiles, float(demands[a.name]), space=sp, time_limit_s=left_s,
                     factors=(factors or {}).get(a.name), solver=solver)
        if p.status not in ("optimal", "feasible") or not p.feasible or not p.instances:
            return None
        plans[a.name] = p
    slices = sum(p.slices_used for p in plans.values())
    if slices > node.slices_available:
        return None
    try:
        layout = _pack_node(plans, node, previous)
    except PackingError:
        return None
    by_name = {a.name: a for a in apps}
    secs = time.perf_counter() - t0
    for name, p in plans.items():
        p.layout = app_layout(layout, name)
        p.solve_seconds = secs
        if verify_plan(p, by_name[name], node, profiles, (factors or {}).get(name)):
            return None
    # milp.plan's fallback without an incumbent keeps the capacity model's status, but its slices
    # are not minimised (its note says so): not a proof of this app's optimum
    proven = all(p.status == "optimal" and not any("capacity model" in n for n in p.notes)
                 for p in plans.values())
    return NodePlan(node=node.name, objective_kind=kind, status="optimal" if proven else "feasible",
                    feasible=True, objective=node_value(plans, node, kind),
                    gap=sum(p.gap for p in plans.values()) if not proven else 0.0, slices_used=slices,
                    slices_available=node.slices_available, solve_seconds=secs, plans=plans, layout=layout,
                    notes=["each app's own optimum, and together they fit: the node optimum (the shared "
                           "slices do not bind)" if proven else
                           "each app's own best plan, not all proven, and together they fit"])
