"""Each app's capacity per slice budget, precomputed into its curve (``curves``) in idle time.

A spike's first plan of a new mix is slow where the apps' curves know nothing near the budgets
the spike gives them: the scaled search then tests fractions by decomposition, and a single-app
solve at a budget it has never seen can take seconds (ar_assistant at 10 slices and 267 rps:
6.4 s, nothing found). What an app serves within ``k`` slices depends on its problem and the
node only, so it can be computed before any spike: one capacity solve per budget (``joint.solve``
with no demand and ``max_slices=k``), bounded in time, gives

* the plan it found, serving its rate (times its headroom): a **served** fact on its usage;
* the solver's proven upper bound on the rate within ``k`` slices: every rate above it is
  **refuted** on ``(k, all slots)``;

and the same within ``k`` slices and their share of the slots, and one more (``steps``: plans
that pack beside the others').

Both are the curve's own kinds of fact, so everything that reads curves (``scaled.max_scale``'s
bracket, ``curves.seed``'s refutations for the frontier search) uses them unchanged. Nothing is
guessed: an unproven solve stores its plan and its bound, a solve that found nothing stores only
its bound.

The controller's solver process runs the steps (``steps``: one app and budget each) while it
waits for requests, each in a forked child it kills when a request arrives
(``control.solver``), and applies the facts (JSON, ``BudgetFact.to_json``) to its curves.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jigsaw.node import Node
from jigsaw.plan import Plan
from jigsaw.planner import curves, joint
from jigsaw.planner.decompose import usage
from jigsaw.planner.problem import Problem

STEP_LIMIT_S = 4.0  # one budget's capacity solve at most this long (its bound holds when stopped)
DEEPEN = 4  # an unproven budget is solved again this many times longer, once every budget is done
MAX_STEP_S = 64.0  # ... up to this long


@dataclass(frozen=True)
class BudgetFact:
    """What one capacity solve within ``slices`` showed: the plan found (None: none) and the
    proven upper bound on the rate any plan within those slices serves (inf: none proven)."""

    app: str
    slices: int
    slots: int | None  # the MIG placement slots it may take (None: the node's)
    plan: Plan | None
    bound_rps: float
    status: str
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"app": self.app, "slices": self.slices, "slots": self.slots, "status": self.status,
                "seconds": self.seconds,
                "bound_rps": self.bound_rps if math.isfinite(self.bound_rps) else None,
                "plan": self.plan.to_json_dict() if self.plan is not None else None}

    @staticmethod
    def from_json(d: dict[str, Any]) -> BudgetFact:
        bound = d.get("bound_rps")
        slots = d.get("slots")
        return BudgetFact(str(d["app"]), int(d["slices"]), None if slots is None else int(slots),
                          Plan.from_json_dict(d["plan"], "<budget fact>") if d.get("plan") else None,
                          math.inf if bound is None else float(bound), str(d["status"]),
                          float(d["seconds"]))


def steps(pbs: Sequence[Problem], node: Node) -> list[tuple[int, int, int | None]]:
    """The (app index, slices, slots) budgets to precompute: every slice budget of the node, per
    round over the apps, first the whole node (the value grid's top), then from the node's even
    split over the apps outwards, the larger first of two as near (a spike gives each app about
    its split: at 115% and 150% of the example node a warm plan's test spent 4.5 s on
    ar_assistant within 10 slices and 11 slots; with the budgets precomputed, the curves bracket
    the fraction and the plan takes 0.3-0.45 s; largest first, they came after 150 others),
    each with all the node's slots (its refutation caps any split of the node), with its share
    of them, ``slots_share``, and one slot more (plans that pack beside the others': the shares
    round down, so one app of a split may take a slot more).

    Why both: a plan of the most rate on k slices often takes more than k slices' share of the
    slots (social_media on 10 slices: 14 of the 8 x 10 / 7 = 11), so the stored plans of three
    apps exceed the node's slots together; at 100-150% of the example node they served 0.755 /
    0.637 / 0.485 where the refutations capped theta* at 0.895 / 0.805 / 0.612; with the shares
    0.853 / 0.719 / 0.557, with a slot more too 0.870 / 0.784 / 0.596 (the search's own answers
    at 115% and 150%)."""
    room = curves.room_of(node)
    out: list[tuple[int, int, int | None]] = []
    fair = room[0] / max(len(pbs), 1)
    for k in [room[0], *sorted(range(1, room[0]), key=lambda k: (abs(k - fair), -k))]:
        share = slots_share(k, node)
        for i in range(len(pbs)):
            out.append((i, k, None))
            out += [(i, k, m) for m in (share, share + 1) if m < room[1]]
    return out


def slots_share(slices: int, node: Node) -> int:
    """The placement slots ``slices`` compute slices have as their share of the node's: the
    shares of a split of the node's slices sum to at most its slots."""
    room = curves.room_of(node)
    return room[1] * slices // room[0]


def budget_capacity(pb: Problem, node: Node, slices: int, slots: int | None = None, *, solver: str,
                    time_limit_s: float = STEP_LIMIT_S) -> BudgetFact:
    """The app's largest rate within ``slices`` and ``slots`` (None: the node's) (a capacity
    solve, stopped at ``time_limit_s``)."""
    t0 = time.perf_counter()
    room = curves.room_of(node)
    res = joint.solve([joint.Part(pb, None)], node, solver=solver, time_limit_s=time_limit_s,
                      max_slices=slices if slices < room[0] else None,
                      max_slots=slots if slots is not None and slots < room[1] else None)
    plan = res.plans[0]
    if plan is not None and plan.planned_rps <= 0:
        plan = None
    if res.status == "infeasible":
        bound = 0.0
    elif res.status == "optimal" and plan is not None:
        bound = max(plan.planned_rps, res.objective if math.isfinite(res.objective) else 0.0)
    elif math.isfinite(res.bound) and res.bound >= (plan.planned_rps if plan is not None else 0.0):
        bound = res.bound
    else:
        bound = math.inf
    return BudgetFact(pb.app.name, slices, slots, plan, bound, res.status, time.perf_counter() - t0)


def apply(pb: Problem, node: Node, fact: BudgetFact) -> None:
    """``fact`` into ``pb``'s curve: its plan served, every rate above its bound refuted within its
    slices (the bound widened by the capacity solve's stopping gap: a proof, not an estimate)."""
    curve = curves.curve_of(pb)
    if fact.plan is not None:
        rate = fact.plan.planned_rps * curves.headroom(fact.plan, pb)
        curve.add_plan(fact.plan, usage(fact.plan, node), rate)
    if math.isfinite(fact.bound_rps):
        refuted = fact.bound_rps * (1 + 2 * joint.CAPACITY_RELATIVE_GAP) + 2e-3
        slots = curves.room_of(node)[1] if fact.slots is None else fact.slots
        curve.add_refuted((fact.slices, slots), refuted)


def precompute(pbs: Sequence[Problem], node: Node, *, solver: str, time_limit_s: float = STEP_LIMIT_S,
               rounds: int = 1) -> list[BudgetFact]:
    """Every step in this process (a bench's, or a caller with nothing else to do), applied;
    each round after the first solves the budgets still unproven again, ``DEEPEN`` times longer."""
    facts: list[BudgetFact] = []
    todo = steps(pbs, node)
    for r in range(rounds):
        unproven = []
        for i, k, m in todo:
            fact = budget_capacity(pbs[i], node, k, m, solver=solver, time_limit_s=time_limit_s * DEEPEN ** r)
            apply(pbs[i], node, fact)
            facts.append(fact)
            if fact.status != "optimal":
                unproven.append((i, k, m))
        todo = unproven
    return facts
