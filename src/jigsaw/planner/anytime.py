"""Anytime planning: a verified plan within about 100 ms, then the exact one.

A controller reacting to a burst cannot wait for a proof. ``quick_plan`` builds plans
greedily: for each lane accurate enough (most accurate first) and a few splits of the
latency SLO among the tasks, each task gets instances of its best throughput-per-slice column
within its latency share, the last one swapped for the smallest column that covers the rest.
Two more candidates per split come from the LP relaxation of the model restricted to those
latency caps (lane rates as the LP mixes them, each variant's instances rounded up the same
way), and per lane mix of the LP relaxation of the latency-relaxed core (both objectives) the
instance sets of the fewest slices over every split of the SLO (``latency_caps.cap_plans``:
at high loads the only candidates that fit). The candidates are ranked by the planner's
objective; the best one that packs onto the GPUs and passes the independent checker
(``verify.verify_plan``) is returned. ``milp.plan_anytime``
yields that plan first and the exact plan when it is ready; the controller may deploy the first
and replace it by the second. ``extend_plan`` keeps a running plan and adds instances for more
demand (a burst's quick plan); ``trim_plan`` keeps it and drops what less demand leaves spare
(the controller's give-back of a plan whose smaller successor needs its slots).

Where the full demand finds no plan (an app at its capacity, a node past it),
``scaled_quick_plan`` (and ``node_plan.quick_plan_node(scale_down=True)``) rescale the
candidates of the fewest slices to fractions of the demand (``rescale``: the same lane mix, the
fewest slices of columns no slower than the candidate's) and search the largest fraction whose
plan packs and verifies (``largest_fraction``): a verified plan for most of the demand, so the
controller always has something to deploy.

Speed: what depends on the problem alone (the greedy's tables per latency cap, the SLO splits,
the LP relaxations' models) is kept in ``Problem.derived``; each LP is set to the demand
(``joint.at_rate``) rather than built again, and solved without presolve. A node's quick plan
takes 35-65 ms in a warm process (the controller's solver process), 100-175 ms cold.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TypeVar

from jigsaw.app import App
from jigsaw.mig import NUM_PLACEMENT_SLOTS
from jigsaw.node import Node
from jigsaw.plan import LanePlan, Plan, PlanInstance, without_placed
from jigsaw.planner import joint
from jigsaw.planner.columns import Column
from jigsaw.planner.extension_mix import added_mixes, lane_costs
from jigsaw.planner.groups import pack_node
from jigsaw.planner.latency_caps import cap_plans, cover, lane_demand, lanes_of
from jigsaw.planner.model import Solution
from jigsaw.planner.packer import PackingError, instances_from_plan
from jigsaw.planner.problem import Factors, Problem, make_problem
from jigsaw.planner.routes import settle_lanes
from jigsaw.planner.verify import verify_plan
from jigsaw.profiles import ProfileTable
from jigsaw.spaces import SearchSpace, search_space

QUICK_BUDGET_S = 0.08
T = TypeVar("T")
LP_PRESOLVE = False
MIN_DEMAND_RPS = 0.01


def _derived(pb: Problem, key: tuple, make: Callable[[], T]) -> T:
    """What ``make`` derives from ``pb`` alone (no demand), computed once per problem."""
    got = pb.derived.get(key)
    if got is None:
        got = pb.derived[key] = make()
    return got


def _columns_by_tv(pb: Problem) -> dict[tuple[str, str], list[Column]]:
    def make() -> dict[tuple[str, str], list[Column]]:
        out: dict[tuple[str, str], list[Column]] = {}
        for c in pb.colset.columns:
            out.setdefault((c.task, c.variant), []).append(c)
        return out
    return _derived(pb, ("by_tv",), make)


def _compute_slices(c: Column) -> float:
    """A column's cost by compute slices alone (the paper's)."""
    return c.slices


def _greedy_table(cols: list[Column], cap_ms: float, cost: Callable[[Column], float] = _compute_slices
                  ) -> tuple[Column, list[Column]] | None:
    """For ``_task_instances``: the columns within ``cap_ms``, their best per slice and all of
    them by (slices, -throughput) (the cheapest cover of a remainder is the first that covers it).
    ``cost``: what a column costs for the remainder's cover instead of its compute slices (the
    best column stays the best per compute slice: a 7g.80gb priced per slot outranked the
    3g.40gb, and its extensions took 2-3 slices more)."""
    ok = [c for c in cols if c.latency_ms <= cap_ms + 1e-9]
    if not ok:
        return None
    best = max(ok, key=lambda c: (c.throughput_rps / c.slices, c.throughput_rps))
    return best, sorted(ok, key=lambda c: (cost(c), -c.throughput_rps))


def _task_instances_of(pb: Problem, t: str, v: str, demand: float, cap_ms: float
                       ) -> list[tuple[Column, int]] | None:
    """``_task_instances`` for (t, v) of ``pb``, its table kept per latency cap (the caps are the
    SLO splits', the same at every demand)."""
    table = _derived(pb, ("greedy", t, v, cap_ms),
                     lambda: _greedy_table(_columns_by_tv(pb).get((t, v), []), cap_ms) or ())
    return _greedy_instances(table, demand) if table else None


def _greedy_instances(table: tuple[Column, list[Column]], demand: float,
                      cost: Callable[[Column], float] = _compute_slices) -> list[tuple[Column, int]]:
    best, ranked = table
    n = max(1, math.ceil(demand / best.throughput_rps - 1e-9))
    plain = [(best, n)]
    rest = demand - (n - 1) * best.throughput_rps
    last = next((c for c in ranked if c.throughput_rps >= rest), None)
    if last is None:
        return plain
    mixed = ([(best, n - 1)] if n > 1 else []) + [(last, 1)]
    return mixed if (n - 1) * cost(best) + cost(last) < n * cost(best) else plain


def _task_instances(cols: list[Column], demand: float, cap_ms: float,
                    cost: Callable[[Column], float] = _compute_slices) -> list[tuple[Column, int]] | None:
    """Fewest slices (or least ``cost``) for one (task, variant) by the greedy rule, within a
    latency cap."""
    table = _greedy_table(cols, cap_ms, cost)
    return _greedy_instances(table, demand, cost) if table else None


def _splits(pb: Problem, lane: tuple[str, ...], by_tv: dict[tuple[str, str], list[Column]]
            ) -> list[dict[str, float]]:
    """Latency caps per task meeting every path: proportional to each task's natural latency,
    and an even split."""
    return _derived(pb, ("splits", lane), lambda: _make_splits(pb, lane, by_tv))


def _make_splits(pb: Problem, lane: tuple[str, ...], by_tv: dict[tuple[str, str], list[Column]]
                 ) -> list[dict[str, float]]:
    app = pb.app
    out = []
    weights = []
    natural = {}
    for t, v in zip(app.task_names, lane, strict=True):
        cols = by_tv.get((t, v), [])
        if not cols:
            return []
        natural[t] = max(cols, key=lambda c: (c.throughput_rps / c.slices, c.throughput_rps)).latency_ms
    weights.append(natural)
    weights.append({t: 1.0 for t in app.task_names})
    for w in weights:
        caps = {t: math.inf for t in app.task_names}
        for p in app.paths:
            total = sum(w[t] for t in p) or 1.0
            for t in p:
                caps[t] = min(caps[t], app.latency_slo_ms / 2 * w[t] / total)
        out.append(caps)
    return out


def quick_plan(app: App, node: Node, profiles: ProfileTable, demand_rps: float, *,
               space: str | SearchSpace | None = None, factors: Factors | None = None,
               previous: Plan | None = None, budget_s: float = QUICK_BUDGET_S,
               problem: Problem | None = None, fewest_slices: bool = False) -> Plan | None:
    """A verified feasible plan for ``demand_rps`` found greedily, or None if none was found.

    ``fewest_slices``: only the LP lane mixes with their fewest-slice splits of the SLO, fewest
    slices first (a node whose apps' quick plans do not fit together asks each for its least).
    """
    t0 = time.perf_counter()
    sp = space if isinstance(space, SearchSpace) else search_space(space or node.planner.space)
    pb = problem or make_problem(app, node, profiles, sp, factors)
    r = max(demand_rps, MIN_DEMAND_RPS)
    slo_acc = _accuracy_slo(app, node)
    if fewest_slices:
        least = _cap_candidates(pb, r)
        least.sort(key=lambda x: (sum(c.slices * n for c, n in x[2]), -x[0]))
        return _first_verified(pb, demand_rps, r, least, slo_acc, previous, t0, budget_s, 6)
    candidates = quick_candidates(pb, r, budget_s, t0)
    return _first_verified(pb, demand_rps, r, candidates, slo_acc, previous, t0, budget_s, 6)


Candidate = tuple[float, dict[int, float], list[tuple[Column, int]]]  # objective, lanes, instances


def quick_candidates(pb: Problem, r: float, budget_s: float = QUICK_BUDGET_S,
                     t0: float | None = None) -> list[Candidate]:
    """The greedy's candidate plans for ``pb`` at rate ``r``, best objective first, neither packed
    nor verified (``candidate_plan`` makes one a plan): single lanes under each SLO split, the
    LP-rounded ones and the LP lane mixes' fewest-slice ones (``quick_plan`` takes the first
    that packs and verifies; ``node_plan.quick_plan_node`` a choice per app that fits together)."""
    t0 = time.perf_counter() if t0 is None else t0
    app, node = pb.app, pb.node
    slo_acc = _accuracy_slo(app, node)
    by_tv = _columns_by_tv(pb)
    order = _derived(pb, ("order", slo_acc), lambda: sorted(
        (li for li, a in enumerate(pb.lane_acc) if a >= slo_acc - 1e-12), key=lambda li: -pb.lane_acc[li]))
    candidates: list[Candidate] = []
    for li in order:
        if candidates and time.perf_counter() - t0 > 0.6 * budget_s:
            break
        lane = pb.lanes[li]
        for caps in _splits(pb, lane, by_tv):
            chosen: list[tuple[Column, int]] = []
            for t, v in zip(app.task_names, lane, strict=True):
                got = _task_instances_of(pb, t, v, r * pb.lane_mult[li][t], caps[t])
                if got is None:
                    break
                chosen += got
            else:
                slices = sum(c.slices * n for c, n in chosen)
                if slices <= node.slices_available:
                    candidates.append((node.planner.alpha * pb.lane_acc[li] - node.beta * slices,
                                       {li: r}, chosen))
    best_lane = order[0] if order else None
    if best_lane is not None:
        for caps in _splits(pb, pb.lanes[best_lane], by_tv):
            for kind in ("slices", "accuracy"):
                if candidates and time.perf_counter() - t0 > 0.5 * budget_s:
                    break
                got = _lp_rounded(pb, r, caps, kind)
                if got is not None:
                    candidates.append(got)
    # The LP relaxation's lane mixes, each with the latency split that needs the fewest slices
    # for it (``latency_caps``): where no single lane fits (high loads) the only candidates, and
    # elsewhere often better than the single lanes (traffic_analysis at 20%: 7 slices, not 18)
    candidates += _cap_candidates(pb, r)
    candidates.sort(key=lambda x: -x[0])
    return candidates


def rescale(pb: Problem, cand: Candidate, rate_from: float, rate_to: float, cost: str = "slices"
            ) -> Candidate | None:
    """``cand`` (a candidate at ``rate_from``) at ``rate_to``: its lane mix scaled, each (task,
    variant) on the fewest slices (``cost="slots"``: MIG placement slots) of the columns no slower
    than the candidate's for that task (``latency_caps.cover``), or None when that exceeds the
    node's slices.

    Why: a quick plan for a fraction of the demand (where the full demand does not fit) costs a
    few knapsacks this way, not a new candidate search per fraction tried. The lane mix keeps
    the accuracy, and no task gets slower than in the candidate, so the SLOs still hold (the
    verifier checks the plan all the same).
    """
    _, lanes, chosen = cand
    node = pb.node
    f = rate_to / rate_from
    scaled = {li: x * f for li, x in lanes.items()}
    cap: dict[str, float] = {}
    for c, _ in chosen:
        cap[c.task] = max(cap.get(c.task, 0.0), c.latency_ms)
    weight = _derived(pb, ("profile_cost", cost), lambda: {
        p.name: p.compute_slices if cost == "slices" else p.size for p in node.gpu.profiles})
    out: list[tuple[Column, int]] = []
    for (t, v), d in lane_demand(pb, scaled).items():
        if d <= 0:
            continue
        best = _derived(pb, ("best_per_profile", t, v, cap.get(t, 0.0)),
                        lambda t=t, v=v: _best_per_profile(_columns_by_tv(pb).get((t, v), []),
                                                           cap.get(t, 0.0)))
        most = node.slices_available if cost == "slices" else NUM_PLACEMENT_SLOTS * node.num_gpus
        got = cover(best, d, most, weight) if best else None
        if got is None:
            return None
        out += got[1]
    slices = sum(c.slices * n for c, n in out)
    if slices > node.slices_available or not out:
        return None
    accuracy = sum(pb.lane_acc[li] * x for li, x in scaled.items()) / max(rate_to, MIN_DEMAND_RPS)
    return node.planner.alpha * accuracy - node.beta * slices, scaled, out


def _best_per_profile(cols: list[Column], cap_ms: float) -> dict[str, Column]:
    """Per MIG profile the column of highest throughput within ``cap_ms``."""
    best: dict[str, Column] = {}
    for c in cols:
        if c.latency_ms > cap_ms + 1e-9:
            continue
        have = best.get(c.mig_profile)
        if have is None or (c.throughput_rps, -c.latency_ms) > (have.throughput_rps, -have.latency_ms):
            best[c.mig_profile] = c
    return best


SCALE_PROBES = 9  # ``largest_fraction``: fractions tried at most
SCALE_STEP = 0.005  # ... and how close its answer comes to the least fraction found not to fit


def largest_fraction(probe: Callable[[float], T | None], first: float, top: float = 1.0
                     ) -> tuple[float, T] | None:
    """The largest fraction in (0, ``top``] (to within ``SCALE_STEP``, at most ``SCALE_PROBES``
    tries) at which ``probe`` returns something, starting at the guess ``first``; the fraction
    and what ``probe`` returned, or None.

    Why a search over one number: a quick plan for part of the demand exists when the fractions'
    plans use slices about in proportion, so a guess from the slices the full demand needs lands
    near the answer and a few halvings of the interval settle it.
    """
    lo, hi = 0.0, top
    best: tuple[float, T] | None = None
    f = min(max(first, 1e-3), top)
    for _ in range(SCALE_PROBES):
        got = probe(f)
        if got is not None:
            lo, best = f, (f, got)
        else:
            hi = f
        if hi - lo <= SCALE_STEP * max(hi, 1e-9):
            break
        # below the first failure step down fast (0.9x) until one fits, then bisect
        f = 0.5 * (lo + hi) if best is not None else 0.9 * f
    return best


def candidates_below(pb: Problem, rate: float, budget_s: float = QUICK_BUDGET_S
                     ) -> tuple[float, list[Candidate]]:
    """``quick_candidates`` at ``rate``, or, where none exist (the demand alone exceeds the
    node), at the first of its halves, quarters and eighths that has some: the rate they are
    for and the candidates (a scaled quick plan ``rescale``s them)."""
    r = rate
    for _ in range(4):
        got = quick_candidates(pb, r, budget_s)
        if got:
            return r, got
        r *= 0.5
    return rate, []


def fewest_first(cands: list[Candidate], slot_size: dict[str, int], many: int = 4) -> list[Candidate]:
    """The ``many`` candidates of fewest slices and the two of fewest MIG placement slots (the
    ones worth rescaling where the demand does not fit), without repeats."""
    by_slices = sorted(cands, key=lambda c: (sum(x.slices * n for x, n in c[2]), -c[0]))[:many]
    by_slots = sorted(cands, key=lambda c: (sum(slot_size[x.mig_profile] * n for x, n in c[2]),
                                            -c[0]))[:2]
    out: list[Candidate] = []
    for c in by_slices + by_slots:
        if all(c is not o for o in out):
            out.append(c)
    return out


def scaled_quick_plan(app: App, node: Node, profiles: ProfileTable, demand_rps: float, *,
                      space: str | SearchSpace | None = None, factors: Factors | None = None,
                      previous: Plan | None = None, budget_s: float = QUICK_BUDGET_S,
                      problem: Problem | None = None) -> Plan | None:
    """``quick_plan``'s plan for the full demand, else a verified plan for the largest fraction of
    it the greedy's candidates reach (``rescale``, ``largest_fraction``): ``planned_rps`` below the
    demand, ``feasible`` false, ``max_demand_plan`` true. None only when not even a small fraction
    fits. Why: near or above the node's capacity (an app at 100% of it) the greedy finds no plan
    for all of it, and a controller with nothing to deploy keeps a plan that serves far less."""
    t0 = time.perf_counter()
    sp = space if isinstance(space, SearchSpace) else search_space(space or node.planner.space)
    pb = problem or make_problem(app, node, profiles, sp, factors)
    r = max(demand_rps, MIN_DEMAND_RPS)
    cands = quick_candidates(pb, r, budget_s, t0)  # what quick_plan tries
    full = _first_verified(pb, demand_rps, r, cands, _accuracy_slo(app, node), previous, t0, budget_s, 6)
    if full is not None:
        return full
    at = r
    if not cands:
        at, cands = candidates_below(pb, 0.5 * r, budget_s)
    size = {p.name: p.slot_cost for p in node.gpu.profiles}
    few = fewest_first(cands, size)
    if not few:
        return None
    slo_acc = _accuracy_slo(app, node)
    prev = previous.layout if previous is not None and previous.layout is not None \
        and previous.layout.gpu_model == node.gpu.name else None

    def probe(f: float) -> Plan | None:
        scaled = [c for c in (rescale(pb, c, at, f * r, k) for c in few for k in ("slices", "slots"))
                  if c is not None]
        scaled.sort(key=lambda c: -c[0])
        for objective, lanes, chosen in scaled[:3]:
            plan = _as_plan(pb, f * demand_rps, f * r, lanes, chosen, slo_acc, objective)
            try:
                plan.layout = pack_node(instances_from_plan(plan), node, prev)
            except PackingError:
                continue
            if not verify_plan(plan, app, node, profiles, pb.factors):
                return plan
        return None

    least = min(sum(x.slices * n for x, n in c[2]) for c in few)
    guess = at / r * min(1.0, 0.99 * node.slices_available / max(least, 1))
    got = largest_fraction(probe, guess)
    if got is None:
        return None
    frac, plan = got
    plan.demand_rps, plan.feasible, plan.max_demand_plan = demand_rps, False, True
    plan.solve_seconds = time.perf_counter() - t0
    plan.notes = [f"anytime incumbent for {frac:.2%} of the demand (no greedy plan for all of it): "
                  "verified; not proven the largest fraction"]
    return plan


def candidate_plan(pb: Problem, demand_rps: float, rate: float, cand: Candidate) -> Plan:
    """One of ``quick_candidates`` as a plan (no layout; not verified)."""
    slo_acc = _accuracy_slo(pb.app, pb.node)
    objective, lanes, chosen = cand
    return _as_plan(pb, demand_rps, rate, lanes, chosen, slo_acc, objective)


def _first_verified(pb: Problem, demand_rps: float, rate: float,
                    candidates: list[tuple[float, dict[int, float], list[tuple[Column, int]]]],
                    slo_acc: float, previous: Plan | None, t0: float, budget_s: float,
                    at_least: int = 3) -> Plan | None:
    """The first of ``candidates`` (best first) that packs and passes the checker, trying at
    least ``at_least`` of them and then while ``budget_s`` lasts."""
    node = pb.node
    for tried, (objective, lanes, chosen) in enumerate(candidates):
        if tried >= at_least and time.perf_counter() - t0 > budget_s:
            break
        plan = _as_plan(pb, demand_rps, rate, lanes, chosen, slo_acc, objective)
        prev = previous.layout if previous is not None else None
        try:
            plan.layout = pack_node(instances_from_plan(plan), node,
                                    prev if prev is not None and prev.gpu_model == node.gpu.name else None)
        except PackingError:
            continue
        if verify_plan(plan, pb.app, node, pb.profiles, pb.factors):
            continue
        plan.solve_seconds = time.perf_counter() - t0
        return plan
    return None


def _lp_mixes(pb: Problem, rate: float) -> list[dict[int, float]]:
    """Lane mixes from the LP relaxation of the latency-relaxed core, for both objectives (the
    fewest slices, the best accuracy): distinct, each summing to ``rate``."""
    out: list[dict[int, float]] = []
    for kind in ("slices", "accuracy"):
        built, sol = _relaxed(pb, rate, kind, None)
        if not sol.has_incumbent:
            continue
        lanes = lanes_of(pb, [sol.values[v] for v in built.lam[0]], rate)
        if lanes and all(any(abs(lanes.get(li, 0.0) - x.get(li, 0.0)) > 1e-6 * rate
                             for li in set(lanes) | set(x)) for x in out):
            out.append(lanes)
    return out


def _accuracy_slo(app: App, node: Node) -> float:
    """The accuracy SLO the quick plans are held to: the app's own, else the node planner's."""
    return app.accuracy_slo if app.accuracy_slo is not None else node.planner.accuracy_slo


def _cap_candidates(pb: Problem, rate: float) -> list[Candidate]:
    """Per lane mix of the LP relaxation (``_lp_mixes``), its fewest-slice instance sets."""
    return [cand for lanes in _lp_mixes(pb, rate) for cand in _dp_candidates(pb, rate, lanes)]


def _dp_candidates(pb: Problem, rate: float, lanes: dict[int, float]
                   ) -> list[tuple[float, dict[int, float], list[tuple[Column, int]]]]:
    """Candidates for one lane mix: the instance sets of the fewest slices (``cap_plans``)."""
    node = pb.node
    accuracy = sum(pb.lane_acc[li] * x for li, x in lanes.items()) / rate
    return [(node.planner.alpha * accuracy - node.beta * cp.slices, lanes, list(cp.chosen))
            for cp in cap_plans(pb, lanes, limit=4)]


def _lp_rounded(pb: Problem, rate: float, caps: dict[str, float], kind: str
                ) -> tuple[float, dict[int, float], list[tuple[Column, int]]] | None:
    """Lane rates from the LP relaxation of the model restricted to ``caps``, instances rounded up."""
    built, sol = _relaxed(pb, rate, kind, caps)
    if not sol.has_incumbent:
        return None
    lam = {li: max(0.0, sol.values[v]) for li, v in enumerate(built.lam[0])}
    lam = {li: x for li, x in lam.items() if x > 1e-9 * rate}
    total = sum(lam.values())
    if total <= 0:
        return None
    lam = {li: x * rate / total for li, x in lam.items()}
    app = pb.app
    demand: dict[tuple[str, str], float] = {}
    for li, x in lam.items():
        for k, t in enumerate(app.task_names):
            key = (t, pb.lanes[li][k])
            demand[key] = demand.get(key, 0.0) + x * pb.lane_mult[li][t]
    chosen: list[tuple[Column, int]] = []
    for (t, v), d in demand.items():
        if d <= 0:
            continue
        got = _task_instances_of(pb, t, v, d, caps[t])
        if got is None:
            return None
        chosen += got
    node = pb.node
    slices = sum(c.slices * n for c, n in chosen)
    if slices > node.slices_available:
        return None
    accuracy = sum(pb.lane_acc[li] * x for li, x in lam.items()) / rate
    return node.planner.alpha * accuracy - node.beta * slices, lam, chosen


def _relaxed(pb: Problem, rate: float, kind: str, caps: dict[str, float] | None
             ) -> tuple[joint.Built, Solution]:
    """The LP relaxation of the latency-relaxed core (restricted to ``caps`` when given) at
    ``rate``: the model is built once per problem, objective and caps and set to each demand
    (``joint.at_rate``), which is most of the quick plan's time saved in a warm process."""
    key = ("lp", kind, None if caps is None else tuple(sorted(caps.items())))
    built = _derived(pb, key, lambda: joint.build([joint.Part(pb, rate)], pb.node, full=False,
                                                  objective=kind, caps=None if caps is None else [caps]))
    return built, joint.at_rate(built, rate, kind).relaxation("highs", presolve=LP_PRESOLVE)


def _as_plan(pb: Problem, demand_rps: float, rate: float, lanes: dict[int, float],
             chosen: list[tuple[Column, int]], slo_acc: float, objective: float) -> Plan:
    app, node = pb.app, pb.node
    merged: dict[tuple[str, str, str, int, int], tuple[Column, int]] = {}
    for c, n in chosen:
        have = merged.get(c.key)
        merged[c.key] = (c, n + (have[1] if have else 0))
    instances = [PlanInstance(c.task, c.variant, c.mig_profile, c.mps, c.batch, n, c.latency_ms,
                              c.throughput_rps, c.slices) for c, n in merged.values()]
    return Plan(
        app=app.name, space=pb.space.name, demand_rps=demand_rps, planned_rps=rate, feasible=True,
        max_demand_plan=False, status="heuristic", objective=objective,
        accuracy=sum(pb.lane_acc[li] * x for li, x in lanes.items()) / rate,
        slices_used=sum(x.count * x.slices for x in instances), slices_available=node.slices_available,
        solve_seconds=0.0, gap=math.inf, instances=instances,
        lanes=settle_lanes(app, [LanePlan(app.lane_dict(pb.lanes[li]), x) for li, x in lanes.items()],
                           instances, pb.factors),
        task_latency_ms={t: max((x.latency_ms for x in instances if x.task == t), default=0.0)
                         for t in app.task_names},
        node=node.name, gpu_model=node.gpu.name, latency_slo_ms=app.latency_slo_ms,
        accuracy_slo=slo_acc, columns_total=pb.colset.num_candidates,
        columns_pruned=len(pb.colset.columns), solver="greedy",
        notes=["anytime incumbent: greedy single-lane plan, verified; not proven optimal"],
    )



_Kind = tuple[str, str, str, int, int]  # (task, variant, MIG profile, MPS level, max batch)


def _running_parts(app: App, node: Node, profiles: ProfileTable, running: Plan, demand_rps: float,
                   space: str | SearchSpace | None, factors: Factors | None, problem: Problem | None
                   ) -> tuple[Problem, float, dict[int, float], list[tuple[Column, int]],
                              dict[tuple[str, str], float]] | None:
    """The running plan read for a new demand: (problem, rate, lanes at the rate with the running
    mix, its instances as columns with counts, the items/s each (task, variant) must serve). None
    when the plan has no lanes or names a profile row or lane that no longer exists."""
    sp = space if isinstance(space, SearchSpace) else search_space(space or node.planner.space)
    pb = problem or make_problem(app, node, profiles, sp, factors)
    total = sum(lp.rate_rps for lp in running.lanes)
    if not running.instances or total <= 0:
        return None
    r = max(demand_rps, MIN_DEMAND_RPS)
    lane_index = {lane: li for li, lane in enumerate(pb.lanes)}
    lanes: dict[int, float] = {}
    for lp in running.lanes:
        li = lane_index.get(tuple(lp.variants.get(t, "") for t in app.task_names))
        if li is None:
            return None
        lanes[li] = lanes.get(li, 0.0) + lp.rate_rps * r / total
    mig = {p.name: p for p in node.gpu.profiles}
    have: list[tuple[Column, int]] = []
    for x in running.instances:
        row = profiles.get(x.variant, x.mig_profile, x.mps, x.max_batch)
        if row is None or x.mig_profile not in mig:
            return None
        have.append((Column(x.task, x.variant, x.mig_profile, x.mps, x.max_batch, row.latency_ms,
                            row.throughput_rps * node.planner.max_utilization,
                            mig[x.mig_profile].slice_cost), x.count))
    demand: dict[tuple[str, str], float] = {}
    for li, x in lanes.items():
        for k, t in enumerate(app.task_names):
            key = (t, pb.lanes[li][k])
            demand[key] = demand.get(key, 0.0) + x * pb.lane_mult[li][t]
    return pb, r, lanes, have, demand


def _added_instances(app: App, have: list[tuple[Column, int]], shorts: dict[tuple[str, str], float],
                     by_tv: dict[tuple[str, str], list[Column]], *, fair: bool,
                     cost: Callable[[Column], float] = _compute_slices) -> list[tuple[Column, int]] | None:
    """``extend_plan``'s added instances: for each (task, variant) short of capacity, its best
    throughput-per-slice columns whose latency keeps every path within the SLO; None where one
    finds none. ``fair``: each short task of a path may add at most an equal share of that path's
    slack to its latency; else the tasks take it in turn, each from what the ones before left.

    Why: each task's cap was the whole slack of its paths, so three short tasks of one chain each
    took it (ar_assistant at 350 req/s from its 230 req/s plan: detect, caption and speak each
    raised to within the slack, 1822 ms on a 1550 ms SLO), the extension failed verification at
    every fraction of a spike, and the quick plan fell back on the greedy's, which reuses the
    running instances' slots and was refused for no lane left.
    """
    latency = {t: max((c.latency_ms for c, _ in have if c.task == t), default=0.0) for t in app.task_names}
    short_tasks = {t for t, _ in shorts}

    def cap(t: str) -> float:
        """The most an added instance of ``t`` may take."""
        most = math.inf
        for p in app.paths:
            if t in p:
                slack = app.latency_slo_ms / 2 - sum(latency[u] for u in p)
                most = min(most, latency[t] + (slack / sum(u in short_tasks for u in p) if fair else slack))
        return most

    caps = {t: cap(t) for t in short_tasks}
    added: list[tuple[Column, int]] = []
    for (t, v), short in shorts.items():
        got = _task_instances(by_tv.get((t, v), []), short, caps[t] if fair else cap(t), cost)
        if got is None:
            return None
        added += got
        latency[t] = max(latency[t], *(c.latency_ms for c, _ in got))
    return added


def slot_aware_cost(node: Node) -> Callable[[Column], float]:
    """What the instance that covers a remainder costs when a running plan is extended: its
    compute slices, or, with ``planner.extension_slices_per_slot`` > 0, at least that many slices
    per MIG memory slot it holds (0: the compute slices alone, the paper's cost). It never
    costs a slice: a cover priced so never has more compute slices than the cheapest by compute,
    and a mixed cover replaces a plain one only where it is cheaper both ways or as cheap in
    slices (a 1g.10gb instead of a 1g.20gb).

    Why: a GPU has 7 compute slices but 8 memory slots, and a 1g.20gb instance holds 2 slots for
    1 slice, a 3g.40gb one 4 for 3. Priced by compute alone, a spike's chain of extensions on
    traffic_analysis (541 -> 720 -> 990 req/s) covered remainders with 1g.20gb instances until
    the memory slots ran out before the compute slices ("7 slices free, 0 MIG memory slots"), and
    the in-place extension for the peak served 1004 of 1288 req/s (offline). Priced per slot too,
    the same chain takes the same 20 slices on 24 slots instead of 26, and the extension from it
    serves 1274.
    """
    per_slot = node.planner.extension_slices_per_slot
    if per_slot <= 0:
        return _compute_slices
    size = {p.name: p.slot_cost for p in node.gpu.profiles}
    return lambda c: max(float(c.slices), per_slot * size[c.mig_profile])


def extend_plan(app: App, node: Node, profiles: ProfileTable, running: Plan, demand_rps: float, *,
                space: str | SearchSpace | None = None, factors: Factors | None = None,
                problem: Problem | None = None, accept: Callable[[Plan], Plan | None] | None = None
                ) -> Plan | None:
    """The running plan, kept, with instances added greedily where ``demand_rps`` needs more.

    Its lanes keep their mix scaled to the new demand, or keep their rates with the added
    demand on the lanes that cost the fewest slices within the accuracy SLO
    (``extension_mix.added_mixes``), whichever adds the least; each (task, variant) short of
    capacity gets instances of its best throughput-per-slice
    column whose latency keeps every path within the SLO (``_task_instances``). What already
    runs is not touched, so a burst's quick plan restarts nothing; the exact plan may then
    rearrange the node. None when the running plan has no lanes, names a profile row or lane
    that no longer exists, or the additions do not fit. Not yet packed or verified. The instance
    that covers a (task, variant)'s remainder is chosen at its ``slot_aware_cost``
    (``planner.extension_slices_per_slot``). ``accept``: the caller's check of a candidate (laid
    out beside what runs: the plan laid out, or None); the least costly one it accepts is returned.
    """
    parts = _running_parts(app, node, profiles, running, demand_rps, space, factors, problem)
    if parts is None:
        return None
    pb, r, lanes, have, _ = parts
    supply: dict[tuple[str, str], float] = {}
    for c, n in have:
        supply[(c.task, c.variant)] = supply.get((c.task, c.variant), 0.0) + n * c.throughput_rps
    by_tv = _columns_by_tv(pb)
    cost = slot_aware_cost(node)
    slo_acc = _accuracy_slo(app, node)
    total = sum(lp.rate_rps for lp in running.lanes)
    kept = {li: x * total / r for li, x in lanes.items()}  # the running lanes at the rates they carry
    costs = _derived(pb, ("lane_costs", node.planner.extension_slices_per_slot), lambda: lane_costs(pb, cost))
    found: list[tuple[float, int, dict[int, float], list[tuple[Column, int]]]] = []
    for k, mix in enumerate([lanes, *added_mixes(pb, kept, r, slo_acc, costs)]):
        got = _added_for(app, pb, have, supply, mix, by_tv, cost)
        if got is not None:
            found.append((got[0], k, mix, got[1]))
    for _, _, mix, added in sorted(found, key=lambda x: (x[0], x[1])):
        chosen = list(have) + added
        slices = sum(c.slices * n for c, n in chosen)
        if slices > node.slices_available:
            continue
        accuracy = sum(pb.lane_acc[li] * x for li, x in mix.items()) / r
        plan = _as_plan(pb, demand_rps, r, mix, chosen, slo_acc,
                        node.planner.alpha * accuracy - node.beta * slices)
        plan.notes = ["anytime incumbent: the running plan, kept, with instances added for the new demand; "
                      "verified, not proven optimal"]
        laid = plan if accept is None else accept(plan)
        if laid is not None:
            return laid
    return None


def _added_for(app: App, pb: Problem, have: list[tuple[Column, int]], supply: dict[tuple[str, str], float],
               lanes: dict[int, float], by_tv: dict[tuple[str, str], list[Column]],
               cost: Callable[[Column], float]) -> tuple[float, list[tuple[Column, int]]] | None:
    """``extend_plan``'s instances added for one lane mix: (their cost, the instances), None where
    a short (task, variant) finds no column within its latency cap."""
    demand: dict[tuple[str, str], float] = {}
    for li, x in lanes.items():
        for k, t in enumerate(app.task_names):
            key = (t, pb.lanes[li][k])
            demand[key] = demand.get(key, 0.0) + x * pb.lane_mult[li][t]
    shorts = {(t, v): need - supply.get((t, v), 0.0) for (t, v), need in demand.items()
              if need - supply.get((t, v), 0.0) > 1e-9 * max(1.0, need)}
    added = _added_instances(app, have, shorts, by_tv, fair=True, cost=cost)
    if added is None:
        added = _added_instances(app, have, shorts, by_tv, fair=False, cost=cost)
    if added is None:
        return None
    return sum(cost(c) * n for c, n in added), added


def trim_plan(app: App, node: Node, profiles: ProfileTable, running: Plan, demand_rps: float, *,
              space: str | SearchSpace | None = None, factors: Factors | None = None,
              problem: Problem | None = None) -> Plan | None:
    """The running plan, kept where it runs, less the instances ``demand_rps`` leaves spare: the
    mirror of ``extend_plan``, laid out on the running plan's own slots.

    Its lanes keep their mix, scaled to the new demand; each (task, variant) gives up whole
    instances, the least throughput per slice first (the larger first among equals), while what
    stays still serves its share of the demand. Every process left is one the running plan
    runs, on its slot, so the runtime keeps them all and needs no MIG slot anyone holds: the
    give-back of a plan that fills the node, whose re-planned smaller plan needs the slots the
    running one holds (a drain-first, which the runtime does not make while the running plan
    holds the demand). None when nothing can go, the running plan has no
    layout, or it cannot be read for the new demand (``_running_parts``). Verified
    (``verify.verify_plan``) before it is returned.
    """
    if running.layout is None:
        return None
    parts = _running_parts(app, node, profiles, running, demand_rps, space, factors, problem)
    if parts is None:
        return None
    pb, r, lanes, have, demand = parts
    spare: dict[tuple[str, str], float] = {}
    for c, n in have:
        tv = (c.task, c.variant)
        spare[tv] = spare.get(tv, 0.0) + n * c.throughput_rps
    for tv, need in demand.items():
        spare[tv] = spare.get(tv, 0.0) - need
    column: dict[_Kind, Column] = {c.key: c for c, _ in have}
    placed = sorted(((g.gpu, p.start, (p.task, p.variant, p.profile, p.mps, p.max_batch))
                     for g in running.layout.gpus for p in g.instances),
                    key=lambda x: (column[x[2]].throughput_rps / column[x[2]].slices if x[2] in column
                                   else math.inf, -column[x[2]].slices if x[2] in column else 0,
                                   x[0], x[1]))
    gone: set[tuple[int, int]] = set()
    for gpu, start, kind in placed:
        c = column.get(kind)
        if c is None:
            continue
        tv = (c.task, c.variant)
        if spare[tv] - c.throughput_rps >= -1e-9 * max(1.0, demand.get(tv, 0.0)):
            spare[tv] -= c.throughput_rps
            gone.add((gpu, start))
    if not gone:
        return None
    less = without_placed(running, gone)
    if less is None:
        return None
    chosen = [(column[(i.task, i.variant, i.mig_profile, i.mps, i.max_batch)], i.count)
              for i in less.instances if i.count > 0]
    slo_acc = _accuracy_slo(app, node)
    accuracy = sum(pb.lane_acc[li] * x for li, x in lanes.items()) / r
    slices = sum(c.slices * n for c, n in chosen)
    plan = _as_plan(pb, demand_rps, r, lanes, chosen, slo_acc,
                    node.planner.alpha * accuracy - node.beta * slices)
    plan.layout = less.layout
    plan.notes = ["the running plan, kept where it runs, less the instances the new demand leaves spare; "
                  "verified, not proven optimal"]
    if verify_plan(plan, app, node, profiles, pb.factors):
        return None
    return plan


def processes_to_start(running: Plan | None, new: Plan) -> int:
    """How many worker processes ``new`` needs that ``running`` does not run already: per instance
    kind (task, variant, MIG profile, MPS level, max batch), the processes of the instances beyond
    the running plan's count of that kind.

    Why: the node keeps the process of an instance both plans run (same kind, placed on its old
    slot) and starts the rest, seconds each on a loaded host: what a plan's switch waits for.
    """
    have: dict[tuple[str, str, str, int, int], int] = {}
    for x in running.instances if running is not None else ():
        kind = (x.task, x.variant, x.mig_profile, x.mps, x.max_batch)
        have[kind] = have.get(kind, 0) + x.count
    started = 0
    for x in new.instances:
        kind = (x.task, x.variant, x.mig_profile, x.mps, x.max_batch)
        kept = min(x.count, have.get(kind, 0))
        have[kind] = have.get(kind, 0) - kept
        started += (x.count - kept) * x.mps
    return started
