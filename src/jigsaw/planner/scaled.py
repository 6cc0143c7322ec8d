"""The largest common fraction of every app's demand a node can serve, by decomposition.

When the apps' demands do not fit on the node together (a spike), every app serves the same
fraction theta of its demand, as large as the node allows. The joint capacity model decides
that in one MILP over all apps, which takes tens of seconds on three apps and stops unproven.
Here theta is searched with the node decision by decomposition (``decompose.solve`` with the
``slices`` objective) as the test of one theta, which either finds plans that pack together
or proves that none fit (its bound: the apps' fewest slices and MIG slots exceed the node):

* a test that finds plans gives more than its theta: with every lane scaled by a plan's
  **headroom** (its smallest supply/demand ratio over the (task, variant) pairs it runs), the
  same instances, packed the same way, serve ``theta x headroom`` of the demand (accuracy and
  latency do not change when all lanes scale together). So ``theta_lo`` rises to the smallest
  headroom's theta, with plans;
* the next test is just above that, ``theta_lo x (1 + tolerance)``: when it is proven
  infeasible, theta* lies in ``[theta_lo, theta_lo x (1 + tolerance))`` (``proven``); when it
  finds plans, theta_lo climbs again. Once some theta_hi is refuted and that proof test also
  found plans, the next test is the geometric mean of theta_lo and theta_hi while that lies more
  than the tolerance above theta_lo (``_between``): a bisection, where climbing by the tolerance
  from below re-tested fractions next to one already refuted. The proof comes first because a
  step down from a refuted test usually lands within the tolerance of theta* (115% and 150% of
  the example node: one test, where bisecting first took 2.5x as long).
* each test is ``decompose.solve(first_fit=True)``: it stops at the first plans that pack (the
  question is whether theta fits, not on how few slices), so the plans served are not always the
  fewest slices for theta_lo (each app's own plan is its incumbent searches', unproven: at 16
  GPUs ar_assistant's proof that one slice fewer cannot serve took 9 s of a test); a test whose
  single-app solves find no plan in time ends undecided and the search keeps what it has
  (before, the joint model ran on in it to the limit).

Optionally (``use_bound``), before any test, a proven upper bound on theta* (``theta_bound``):
the latency-relaxed joint core in capacity mode (all apps in one small model: no latency
binaries, the MIG layouts kept; every node plan maps onto it, DESIGN section 3), solved by
HiGHS for at most ``BOUND_LIMIT_S`` (its dual bound when stopped). It caps theta_hi (a proof
once theta_lo is within the tolerance of it), and when the floors' first test lies above it,
the first test is just below it (``bound / (1 + tolerance)``), then down by the tolerance
(twice), then in proportion. Measured on the three example apps at 115-300% of their capacities
(h100x4, a loaded 2-core machine): the core proves theta* only in 2-5 s (its optimum is within
0.3-0.8% of the theta the tests find); stopped at 0.25-0.5 s its bound is 3-9% above theta*,
which helps only where the floors overshoot more (300%: 3.6-3.9 s proven against 9.9 s);
started from that bound at 115% and 150% the search took 9-10 s against 2.3-5 s, and even as a
cap below the floors' guess it slowed 150% (10.9 s, unproven, against 5.6 s): a test just below
a loose bound lands where the decomposition's screen cannot refute it cheaply. So ``max_scale``
uses it only when asked (``use_bound``): a bound that pays needs the core proven, which is not
cheaper than the tests. Proven (``bound_limit_s`` 6), it makes the search one test, but the
core's proof took 5.2, 2.8 and (unproven) 6.0 s: 6.6, 4.4 and 10.5 s in all against 2.0, 4.7
and 9.9 s without. On one GPU (two apps) it pays: 3.8 s against 7.2 s, 1.6 s against 16 s.

Without a bound (not asked for, or it gave none), the first test is the demands' floors scaled
to the node: each app's fewest slices at its full demand in the latency-relaxed core
(``decompose.floor_slices``; the decision at the full demands computed them), and theta = the
node's slices / their sum. A first test that fails steps down (``_step_down``): in proportion
to the floors' overshoot where the floors refuted it, else (the frontier search refuted it:
theta* lies close below) by 2%, the step doubling with each such refutation in a row. Each test
screens itself by those floors first (``decompose.solve``).
Before any test, what earlier decisions showed about each app's budgets (``curves``: kept with
the app's problem across calls) brackets theta*: the largest fraction stored plans serve
together (and pack) is served at once, the least fraction the stored refutations prove does not
fit caps theta_hi; where they meet within the tolerance the search makes no test, else the
first test lies between them (the floors' guess where the caller computed floors, else their
geometric mean) and a refuted test steps down as from nothing served, never below the proof
just above the stored plans' fraction. Every test (``fit_test``) starts from the budgets the
curves refute at its demands and from the plans and bounds the earlier tests' solves give there
(``value_curve.seeds``), and adds what it shows to both.
Once a fraction is served and a proof caps theta* within ``CURVE_REFINE_GAP`` of it (the curves',
or the tests' own), the tests after get ``CURVE_REFINE_S`` (``_refine_deadline``): closing the
last few percent is where a budget's single-app solve sits at the edge of what it serves.
The search stops after ``MAX_TESTS`` tests (a limit of work; the clock only guards it), so its
answer does not depend on how busy the machine is. Pure: the result depends only on the inputs
(and the solver's answers within the limit).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from jigsaw.node import Node
from jigsaw.plan import Layout, Plan
from jigsaw.planner import curves, decompose, joint, value_curve
from jigsaw.planner.curves import scale_plan

SCALE_TOLERANCE = 1e-2  # theta* is proven to within this fraction of itself
_CARRY_EPS = 1e-9
_STEP_DOWN = 0.92  # a first test that fails: the next one this much lower (see ``_step_down``)
# a test refuted by the frontier search, not by the floors: theta* lies just below it (the
# floors' sum was within the node), so the next test only this much lower
_STEP_NEAR = 0.98
# the search stops after this many tests (a limit of work: the same fraction on a busy machine
# as on a quiet one; the clock, ``time_limit_s``, only guards it). The example node at 100-150%
# of its capacity needs 2-5 tests; one GPU (7 slices: the floors' integer steps are coarse) 8-12.
MAX_TESTS = 16
STEP_RULE = "floors"  # ``floors``: ``_step_down``; ``fixed``: always ``_STEP_DOWN`` (as before)
USE_BOUND = False  # ``max_scale(use_bound=None)``'s default (see the module doc: measured slower)
BOUND_LIMIT_S = 6.0  # the bound's solve (``theta_bound``) at most this long (or half the limit)
_BOUND_GAP = 0.25  # the bound's solve stops within this fraction of the tolerance
FIRST_FIT = True  # each test stops at the first plans that pack (see the module doc)
_NEAR_STEPS = 2  # tests below the bound that step down by the tolerance before the larger steps
# where the apps' curves (their capacities per slice budget precomputed, ``budget_curve``) or the
# search's own tests serve a fraction and prove a cap at most ``CURVE_REFINE_GAP`` above it, the
# tests after get at most ``CURVE_REFINE_S``: a spike's first plan answers in time, serving that
# fraction (or what the tests raise it to) with the least fraction shown not to fit as its bound
CURVE_REFINE_S = 0.3
GREEDY_PROOF_S = 0.5  # ``above_greedy``'s proof test just above the greedy's fraction at most this long
GREEDY_CLIMBS = 3  # ``above_greedy``'s tests that find plans, at most, before the caller's search
CURVE_REFINE_GAP = 0.05


@dataclass
class ScaleResult:
    """theta* lies in [theta_lo, theta_hi); ``plans`` (one per part, packed as ``layout``)
    serve theta_lo x each demand. ``status``: ``proven`` (theta_hi <= theta_lo x (1 +
    tolerance)), ``bound`` (the time ran out first: theta_lo is served, theta_hi is the
    smallest theta proven not to fit), ``none`` (no plans found within the time)."""

    status: str
    theta_lo: float
    theta_hi: float
    plans: list[Plan] | None
    layout: Layout | None
    seconds: float
    tests: int  # node decisions by decomposition
    notes: list[str] = field(default_factory=list)
    bound: float = math.inf  # ``theta_bound``'s proven upper bound on theta* (inf: none)
    bound_seconds: float = 0.0


def theta_bound(parts: Sequence[joint.Part], node: Node, *, time_limit_s: float,
                relative_gap: float = _BOUND_GAP * SCALE_TOLERANCE) -> float:
    """A proven upper bound on the largest common fraction of the parts' demands (at most 1;
    inf when the solve gave no bound within ``time_limit_s``).

    The latency-relaxed joint core with ``scale_demands`` (``joint.build``): every node plan
    maps onto it with the same slices and at least its capacity, so its optimum bounds theta*.
    Its objective is theta minus 1e-6 per slice, so theta <= the solver's dual bound plus 1e-6
    times the node's slices. HiGHS (whichever solver the node names: it proves this small
    model fastest) stops once its bound is within ``relative_gap`` of its incumbent; a solve
    stopped by the time limit still gives its dual bound.
    """
    core = joint.build(list(parts), node, full=False, scale_demands=True)
    sol = core.model.solve("highs", time_limit_s, 1e-4, relative_gap=relative_gap)
    if sol.status == "infeasible":
        return 0.0  # not even no service: cannot happen (theta = 0 on no slices is a plan)
    b = math.inf
    for x in (sol.dual_bound, sol.bound):
        if not math.isnan(x) and math.isfinite(x):
            b = max(x, sol.objective) if not math.isnan(sol.objective) else x
            break
    if not math.isfinite(b):
        return math.inf
    return min(1.0, b + 1e-6 * node.slices_available + 1e-9)


def headroom(plan: Plan, part: joint.Part) -> float:
    """How many times its lanes' rates the plan's instances carry (``curves.headroom``)."""
    return curves.headroom(plan, part.pb)


def _step_down(guess: float, floors: Sequence[float] | None, slices: int, falls: int = 1) -> float:
    """The next test below a refuted ``guess`` while nothing is served yet (``falls``: the
    refuted tests in a row, this one included).

    Why: a test the floors refute (their sum exceeds the node's ``slices``) says by how much:
    the next one is in proportion (at least the near step lower). A test that needed the
    frontier search to refute it had floors within the node, so theta* usually lies close below
    (100% of the example node: refuted at 93.3%, theta* 91.6%): ``_STEP_NEAR`` lower, where the
    fixed 8% step landed at 85.9% and three more tests climbed back. Each refutation in a row
    doubles the near step (0.98, 0.96, 0.92, ...): a guess far above theta* still comes down in
    a few tests.
    """
    if STEP_RULE == "fixed":
        return guess * _STEP_DOWN
    near = _STEP_NEAR ** (2 ** (max(falls, 1) - 1))
    need = sum(min(f, slices + 1) for f in floors) if floors is not None else 0.0
    if need > slices:
        return guess * min(near, slices / need)
    return guess * near


def _floors_refute(floors: Sequence[float] | None, slices: int) -> bool:
    """The floors alone exceed the node's ``slices`` (a test refuted without the frontier)."""
    return floors is not None and sum(min(f, slices + 1) for f in floors) > slices


def _between(lo: float, hi: float, tolerance: float) -> float:
    """The next test between a served ``lo`` and a refuted ``hi``: their geometric mean (a
    bisection in log theta) while that is more than the tolerance above ``lo``, else just above
    ``lo`` by the tolerance (the proof: refuted there, theta* is within the tolerance of lo).
    Re-testing near ``hi`` (a climb that lands within the tolerance of it) proves nothing new."""
    proof = lo * (1 + tolerance) * (1 + 1e-9)
    mid = math.sqrt(lo * hi)
    return mid if mid > proof else proof


def max_scale(parts: Sequence[joint.Part], node: Node, *, solver: str, time_limit_s: float,
              pack: decompose.Packer, tolerance: float = SCALE_TOLERANCE,
              theta_hi: float = 1.0, hi_proven: bool = True,
              floors: Sequence[float] | None = None, use_bound: bool | None = None,
              bound_limit_s: float | None = None, refine_s: float | None = None) -> ScaleResult:
    """theta* for ``parts`` (each at its ``demand_rps``) on ``node``; see the module doc.

    ``theta_hi``: where the search starts from above; ``hi_proven``: it is known not to fit
    (the caller's decision at the full demands proved it), else it is tested too.
    ``floors``: per part, a lower bound on its slices at theta_hi (``decompose.floor_slices``;
    the caller's decision computed them), else computed here. ``use_bound``: compute
    ``theta_bound`` first (within ``bound_limit_s``, default ``BOUND_LIMIT_S`` or half the
    limit) to cap theta_hi and place the first test; None: ``USE_BOUND`` (off: see the
    module doc). ``refine_s``: where the curves serve a fraction and cap theta* at most
    ``CURVE_REFINE_GAP`` above it, the tests between get at most this long (``plan_node``:
    ``CURVE_REFINE_S``; None: the whole limit).
    """
    t0 = time.perf_counter()
    notes: list[str] = []
    tests = 0
    lo, hi = 0.0, theta_hi if hi_proven else math.inf
    plans: list[Plan] | None = None
    layout: Layout | None = None

    deadline = t0 + time_limit_s  # nearer once the curves serve a fraction (``refine_s``)

    def left() -> float:
        return deadline - time.perf_counter()

    bound, bound_s = _bound(parts, node, use_bound, bound_limit_s, time_limit_s, tolerance)
    if bound <= 0:
        notes.append("no common fraction above 0 fits (the capacity bound)")
        return ScaleResult("none", 0.0, 0.0, None, None, time.perf_counter() - t0, 0, notes,
                           bound, bound_s)
    lo, hi, plans, layout, deadline = _curve_start(parts, node, pack, theta_hi, hi, tolerance,
                                                   refine_s, deadline, notes)
    weak = lo  # what the curves' plans serve: the tests step down towards it as towards nothing
    # near: failed tests stepping down from the bound by the tolerance
    guess, hi, near = _first_test(parts, node, solver, theta_hi, hi, tolerance, floors, bound, lo)
    climbs = 0  # feasible tests in a row
    parked: Parked = []  # the tests' parked budgets (``fit_test``)
    falls = 0  # refuted tests in a row before any served
    while hi > lo * (1 + tolerance) * (1 + 1e-6) and lo < theta_hi and left() > 0 and tests < MAX_TESTS:
        tests += 1
        deadline = _refine_deadline(deadline, lo, hi, refine_s)  # served close to a proven cap
        guess = _closing_test(guess, lo, hi, tolerance) if refine_s is not None and lo <= weak else guess
        d = fit_test(parts, node, guess, solver=solver, time_limit_s=max(left(), 0.05), pack=pack,
                     parked=parked)
        if d.status in ("optimal", "feasible") and d.layout is not None and \
                all(p is not None for p in d.plans):
            got = [p for p in d.plans if p is not None]
            factor = _carry_factor(got, parts, guess, theta_hi, hi_proven)
            if guess * factor > lo:
                lo = guess * factor
                plans = [scale_plan(p, factor) for p in got]
                layout = d.layout
            if guess >= theta_hi and not hi_proven:
                break  # the whole demand fits after all
            # just above what is served: a proof of the tolerance when it does not fit; after
            # each climb in a row the step doubles (theta* may lie well above)
            climbs += 1
            guess = _after_fit(lo, hi, climbs, tolerance)
            if guess >= hi:
                break
        elif d.status == "infeasible":
            hi = min(hi, guess)  # proven by the decomposition's bound
            climbs = 0
            guess, near, falls = _after_refuted(guess, lo if lo > weak else 0.0, hi, near, falls,
                                                d.floors, node.slices_available, tolerance)
            guess = max(guess, lo * (1 + tolerance) * (1 + 1e-9))
            if lo > 0 and guess >= hi:
                break
        else:  # no decision within the time: the best found stands, unproven above it
            notes.append(f"the test at {guess:.4%} found no decision within the time")
            break
    notes += _stopped(left() <= 0, deadline - t0,
                      tests >= MAX_TESTS and hi > lo * (1 + tolerance) * (1 + 1e-6))
    return ScaleResult(_status(plans is not None, lo, hi, tolerance), lo, hi, plans, layout,
                       time.perf_counter() - t0, tests, notes, bound, bound_s)


def above_greedy(parts: Sequence[joint.Part], node: Node, plans: Sequence[Plan], layout: Layout, theta: float,
                 *, solver: str, time_limit_s: float, pack: decompose.Packer,
                 tolerance: float = SCALE_TOLERANCE, proof_s: float = GREEDY_PROOF_S) -> ScaleResult | None:
    """theta* bracketed from ``plans`` (one per part, packed as ``layout``), which serve ``theta``
    of every demand (times their smallest headroom, ``lo``): one test twice the tolerance above
    (``decompose.solve(first_fit=True)``); where it finds plans, lo rises to what they serve and
    the next test is twice the tolerance above that (at most ``GREEDY_CLIMBS`` times); where it is
    refuted, theta* lies in [lo, that) and the proof just above lo gets at most ``proof_s`` more
    (refuted: ``proven``; plans: lo rises; else the bracket stands, ``bound``). Where a test stops
    undecided, the bracket as it stands (nothing refuted yet: theta_hi 1): the search from the
    full demands gained nothing there (16 GPUs at 100%, one mix: 0.938 <= 0.970 in 20 s, the
    greedy's 0.938 in 0.2 s); so too where ``time_limit_s`` runs out after a test that climbed.
    None where the tests climb to the whole demands or past ``GREEDY_CLIMBS`` without a
    refutation: the caller searches as before (what the tests showed is in the apps' curves; at
    16 GPUs its decision at the full demands took 3-9 s).

    Why: a greedy plan for the largest common fraction it reaches (``node_plan.quick_plan_node``)
    often lies close below theta*: on 16 GPUs at 100% of three example apps' capacity it served
    0.948 in 0.2 s, where the search from the full demands down took 10 s (the decision at the
    full demands 3 s, then 0.99 and 0.97 refuted, 0.932 served, 0.941 out of time). A test one
    tolerance above it (0.958) ran 6.7 s undecided (ar_assistant within 33 slices at the edge of
    what they serve); two tolerances above, the frontier refutes it as it did 0.97."""
    t0 = time.perf_counter()
    factor = max(1.0, min(headroom(p, part) for p, part in zip(plans, parts, strict=True)) * (1 - _CARRY_EPS))
    lo, hi, tests = theta * factor, math.inf, 0
    served = [scale_plan(p, factor) for p in plans]
    parked: Parked = []  # the tests' parked budgets (``fit_test``)
    late = False  # the time ran out before a test above what is served (nothing refuted)
    while tests <= GREEDY_CLIMBS:
        proof = math.isfinite(hi)  # refuted above lo: the proof just above it, briefly
        guess = lo * (1 + tolerance) ** (1 if proof else 2) * (1 + 1e-9)
        if guess >= 1.0:
            return None  # the test would be the full demands' decision: the caller's
        left = min(proof_s if proof else math.inf, time_limit_s - (time.perf_counter() - t0))
        if left <= 0:
            late = not proof
            break
        tests += 1
        d = fit_test(parts, node, guess, solver=solver, time_limit_s=left, pack=pack, parked=parked)
        if d.status == "infeasible":
            hi = guess
            if proof:
                break
            continue
        if d.status not in ("optimal", "feasible") or d.layout is None or any(p is None for p in d.plans):
            # undecided: the bracket as it stands (above the greedy's, nothing refuted: theta_hi 1)
            return ScaleResult(_status(True, lo, hi, tolerance), lo, min(hi, 1.0), served, layout,
                               time.perf_counter() - t0, tests,
                               [f"the test at {guess:.4%} found no decision"])
        factor = _carry_factor([p for p in d.plans if p is not None], parts, guess, 1.0, False)
        lo, layout = guess * factor, d.layout
        served = [scale_plan(p, factor) for p in d.plans if p is not None]
        if proof:
            break
    if not math.isfinite(hi) and not late:
        return None  # climbed without a refutation: the caller's search goes on from the curves
    return ScaleResult(_status(True, lo, hi, tolerance), lo, min(hi, 1.0), served, layout,
                       time.perf_counter() - t0, tests,
                       [f"the tests above it stopped at the {time_limit_s:g} s limit"] if late else [])


Parked = list[tuple[float, list[list[decompose.Usage]]]]  # per test: its theta, per app its parked budgets


def fit_test(parts: Sequence[joint.Part], node: Node, theta: float, *, solver: str, time_limit_s: float,
             pack: decompose.Packer, parked: Parked | None = None) -> decompose.Result:
    """One test of whether ``theta`` of every demand fits (``decompose.solve(first_fit=True)``),
    told what the search's earlier tests (and earlier decisions) showed, and adding what it shows.

    Why: the tests of one search lie within a few percent of each other and ask the same apps
    for the same budgets, so each re-solved what the one before had shown (at 100% of the
    example node ar_assistant's 10 slices / 11 slots three times, 0.3-0.4 s each). The facts
    are monotone in demand: a budget refuted, or a slot floor, at a smaller demand holds here
    (``curves.seed``); a plan found at a larger demand, or at a smaller one whose instances
    carry this demand (its headroom), is a plan here, and a bound proven at a smaller demand
    bounds this one (``value_curve.seeds``, kept under the ``slices`` objective the tests use).
    ``parked``: the search's earlier tests' parked budgets (``decompose.solve(parked=)``), those
    at a smaller theta parked here too; this test's added (150% of the example node: the next
    test's first second on ar_assistant's 10 slices / 11 slots, parked 0.5% below, not spent).
    """
    at = _at(parts, theta)
    total = sum(p.weight for p in at) or 1.0
    scopes = [value_curve.scope_of("slices", p.weight, total) for p in at]
    d = decompose.solve(at, node, solver=solver, time_limit_s=time_limit_s, objective="slices", pack=pack,
                        first_fit=FIRST_FIT, known=curves.seed(at, node),
                        seeds=[value_curve.seeds(p.pb, sc, p.demand_rps or 0.0)
                               for p, sc in zip(at, scopes, strict=True)],
                        parked=[sorted({b for t, held in parked or [] if t <= theta for b in held[i]})
                                for i in range(len(at))])
    if parked is not None and d.parked is not None:
        parked.append((theta, d.parked))
    curves.learn(at, d)
    value_curve.learn([p.pb for p in at], scopes, [p.demand_rps or 0.0 for p in at],
                      d.solved or [[] for _ in at])
    return d


def _curve_start(parts: Sequence[joint.Part], node: Node, pack: decompose.Packer, theta_hi: float,
                 hi: float, tolerance: float, refine_s: float | None, deadline: float, notes: list[str]
                 ) -> tuple[float, float, list[Plan] | None, Layout | None, float]:
    """Where the search starts from what earlier plans showed (the apps' curves): a proven cap
    on theta* and the plans they serve; the deadline nearer where they bracket theta* closely."""
    cap, cached = _from_curves(parts, node, pack, theta_hi)
    hi = min(hi, cap)
    if cached is None:
        return 0.0, hi, None, None, deadline
    lo, plans, layout = cached
    if lo >= theta_hi or hi <= lo * (1 + tolerance) * (1 + 1e-6):
        notes.append("from what earlier plans showed (the apps' curves), without a test")
    elif refine_s is not None and hi <= lo * (1 + CURVE_REFINE_GAP):
        deadline = min(deadline, time.perf_counter() + refine_s)
    return lo, hi, plans, layout, deadline


def _refine_deadline(deadline: float, lo: float, hi: float, refine_s: float | None) -> float:
    """The search's deadline once a test serves ``lo`` and a proof caps theta* at ``hi``: within
    ``CURVE_REFINE_GAP`` of each other, the tests after get at most ``refine_s`` more.

    Why: the tests that close the last few percent are the slow ones, their single-app solves at
    the edge of what a budget serves (100% of the example node, cold: the first test that served
    0.900 ended 1.6 s in with 0.932 refuted; the climbs to 0.909 and the bisection above it took
    6.7 s more, ar_assistant within 10 slices / 11 slots, and proved nothing). The plan served
    goes out labelled with its bound (``NodePlan.scale_bound``), as the curves' bracket does."""
    if refine_s is None or lo <= 0 or hi > lo * (1 + CURVE_REFINE_GAP):
        return deadline
    return min(deadline, time.perf_counter() + refine_s)


def _closing_test(guess: float, lo: float, hi: float, tolerance: float) -> float:
    """The first test between the fraction the curves serve (``lo``) and the least they prove not
    to fit (``hi``): the lowest whose plans bring the bracket within ``CURVE_REFINE_GAP``,
    ``hi / (1 + CURVE_REFINE_GAP)`` (never below the proof just above lo); ``guess`` where
    nothing is served or nothing refuted.

    Why: the lower a test lies below theta*, the sooner its single-app solves find plans; the
    geometric mean of the bracket lies nearer theta*'s edge (the example node warm at 100%: the
    curves' 0.888 and 0.945, the test at 0.916 ran 4.5 s undecided where theta* is about 0.909;
    at 0.900, 0.7 s, served). After it, the tests get ``CURVE_REFINE_S``. After a test served,
    the next one (the proof just above it, a climb) lies low already."""
    if lo <= 0 or not math.isfinite(hi):
        return guess
    return max(hi / (1 + CURVE_REFINE_GAP) * (1 + 1e-9), lo * (1 + tolerance) * (1 + 1e-9))


def _stopped(late: bool, time_limit_s: float, counted_out: bool) -> list[str]:
    """The note on why the search stopped short of a proof, where it did."""
    if late:
        return [f"stopped at the {time_limit_s:g} s limit"]
    return [f"stopped after {MAX_TESTS} tests"] if counted_out else []


def _bound(parts: Sequence[joint.Part], node: Node, use_bound: bool | None, bound_limit_s: float | None,
           time_limit_s: float, tolerance: float) -> tuple[float, float]:
    """``theta_bound`` and the seconds it took where asked for (``use_bound``, default
    ``USE_BOUND``); else no bound (inf, 0)."""
    if not (USE_BOUND if use_bound is None else use_bound):
        return math.inf, 0.0
    tb = time.perf_counter()
    bound = theta_bound(parts, node, time_limit_s=bound_limit_s if bound_limit_s is not None
                        else min(BOUND_LIMIT_S, 0.5 * time_limit_s),
                        relative_gap=_BOUND_GAP * tolerance)
    return bound, time.perf_counter() - tb


def _carry_factor(got: Sequence[Plan], parts: Sequence[joint.Part], guess: float, theta_hi: float,
                  hi_proven: bool) -> float:
    """How far the plans found at ``guess`` scale (their smallest headroom), never beyond the full
    demand where that is not known not to fit."""
    room = min(headroom(p, part) for p, part in zip(got, parts, strict=True))
    factor = max(1.0, room * (1 - _CARRY_EPS))
    if not hi_proven:
        factor = min(factor, max(1.0, theta_hi / guess))  # never beyond the full demand
    return factor


def _status(served: bool, lo: float, hi: float, tolerance: float) -> str:
    """``proven`` (theta* within the tolerance above lo), ``bound`` (plans, unproven) or ``none``."""
    if served and hi <= lo * (1 + tolerance) * (1 + 1e-6):
        return "proven"
    return "bound" if served else "none"


def _from_curves(parts: Sequence[joint.Part], node: Node, pack: decompose.Packer, theta_hi: float
                 ) -> tuple[float, tuple[float, list[Plan], Layout] | None]:
    """What the apps' curves (``curves``) show without a solve: the least theta their
    refutations prove does not fit (inf: none), and the largest theta at most ``theta_hi`` that
    their stored plans serve together with those plans (scaled to it) and their layout (None:
    no choice of them packs)."""
    demands = [p.demand_rps or 0.0 for p in parts]
    kept = [curves.curve_of(p.pb) for p in parts]
    room = curves.room_of(node)
    cap = curves.refuted_theta(demands, kept, room)
    got = curves.served_theta(demands, kept, room, pack)
    if got is None:
        return cap, None
    theta, served, layout = got
    theta = min(theta, theta_hi)
    plans = [scale_plan(s.plan, theta * d / s.plan.planned_rps) for s, d in zip(served, demands, strict=True)]
    return cap, (theta, plans, layout)


def _at(parts: Sequence[joint.Part], theta: float) -> list[joint.Part]:
    """The parts at ``theta`` of their demands."""
    return [joint.Part(p.pb, (p.demand_rps or 0.0) * theta, p.weight, keep=p.keep) for p in parts]


def _floor_sum(parts: Sequence[joint.Part], node: Node, solver: str, theta: float) -> float:
    """The apps' latency-relaxed fewest slices at theta, summed (a quick lower bound)."""
    return sum(min(f, node.slices_available + 1)
               for f in decompose.floor_slices(_at(parts, theta), node, solver,
                                               decompose.FLOOR_LIMIT_S))


def _first_test(parts: Sequence[joint.Part], node: Node, solver: str, theta_hi: float, hi: float,
                tolerance: float, floors: Sequence[float] | None,
                bound: float, lo: float = 0.0) -> tuple[float, float, int]:
    """The first theta tested, ``hi`` capped by ``bound``, and how many tests then step down by the
    tolerance (``near``): the floors at theta_hi scaled to the node's slices, or just below the
    bound where the floors overshoot it; never above the least theta known not to fit (``hi``)
    nor below the proof above a fraction served (``lo``, the curves'). With ``lo`` and no
    ``floors`` given, between ``lo`` and ``hi`` (``_between``) without the floors' solves."""
    near = 0
    if lo > 0 and floors is None and math.isfinite(hi):
        return _between(lo, hi, tolerance), hi, near
    # the first test: the floors at theta_hi scaled to the node's slices
    need = sum(min(f, node.slices_available + 1) for f in floors) if floors is not None else \
        _floor_sum(parts, node, solver, theta_hi)
    # (just below theta_hi even when it is not known not to fit: the decision there found nothing)
    guess = theta_hi * min(1.0 - tolerance, node.slices_available / max(need, 1))
    if math.isfinite(bound) and bound < min(hi, theta_hi * (1 + tolerance)):
        hi = min(hi, bound * (1 + 1e-9))  # theta* <= bound: proven without a test
        if hi / (1 + tolerance) < guess:
            # the floors overshoot the bound: the first test just below it (when it finds
            # plans, theta* is proven at once), then down by the tolerance
            guess = hi / (1 + tolerance)
            near = _NEAR_STEPS
    if math.isfinite(hi) and hi < theta_hi:
        guess = min(guess, hi / (1 + tolerance))
    return max(guess, lo * (1 + tolerance) * (1 + 1e-9)), hi, near


def _after_fit(lo: float, hi: float, climbs: int, tolerance: float) -> float:
    """The test after one that found plans (``lo`` raised to what they serve): a refuted theta
    above, first the proof just above lo (a step down from a refuted test often lands within the
    tolerance of theta*: one test ends the search), then bisect towards hi; none refuted yet:
    climb, the step doubling after each climb in a row (theta* may lie well above)."""
    if not math.isfinite(hi):
        return lo * (1 + tolerance) ** (2 ** (climbs - 1)) * (1 + 1e-9)
    if climbs == 1:
        return lo * (1 + tolerance) * (1 + 1e-9)
    return _between(lo, hi, tolerance)


def _after_refuted(guess: float, lo: float, hi: float, near: int, falls: int,
                   floors: Sequence[float] | None, slices: int, tolerance: float) -> tuple[float, int, int]:
    """The test after a refuted one at ``guess`` (``hi`` lowered to it), and the ``near`` and
    ``falls`` counts after it: bisect when something was served, else step down."""
    if lo > 0:
        return _between(lo, hi, tolerance), near, falls
    if near > 0:  # just below the bound: step down by the tolerance first
        return guess / (1 + tolerance), near - 1, falls
    # only refutations by the frontier search double the near step: one by the
    # floors steps in proportion to their overshoot (150% of the example node: a
    # floors' refutation, then the frontier's at 62.2% counted as the second in a
    # row stepped 4% down where theta* lay 1.5% below: two more tests, 2.5 s)
    if not _floors_refute(floors, slices):
        falls += 1
    return _step_down(guess, floors, slices, max(falls, 1)), near, falls
