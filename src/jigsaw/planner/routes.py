"""A plan's lanes as the runtime can route them: every task a lane sends requests to runs the
lane's variant.

The MILP's capacity rows hold within the solver's tolerance, so a lane may carry a rate of
round-off size (1e-7 rps) through a (task, variant) with no instance, and a lane may name, for
a task its requests never reach (a fan-out of 0), a variant the plan does not run. The runtime
refuses the first (``TopologyError: lane 0 sends classify to variant ..., which the plan does
not run``) and gives the second an empty route. ``settle_lanes`` removes both before a plan
leaves the planner; ``verify.verify_plan`` flags the first independently.
"""

from __future__ import annotations

from collections.abc import Sequence

from jigsaw.app import App
from jigsaw.plan import LanePlan, PlanInstance

Factors = dict[tuple[str, str, str], float]
_SAME_ACCURACY = 1e-12
_ROUND_OFF = 1e-6  # of the plan's rate: what a lane without instances may carry and be dropped


def settle_lanes(app: App, lanes: Sequence[LanePlan], instances: Sequence[PlanInstance],
                 factors: Factors | None = None) -> list[LanePlan]:
    """``lanes`` with every task a lane reaches on a variant that runs (see the module doc).

    1. A lane that sends requests (multiplier > 0) to a (task, variant) without instances can
       only carry round-off (the plan's capacity covers every variant's demand): it is dropped
       and its rate spread over the other lanes in proportion, so the total stays the same.
       (If such lanes carry more than round-off, the lanes are returned unchanged.)
    2. For a task the lane's requests never reach, the lane names a variant that runs (the
       first, by name) when one does and the lane's accuracy stays the same.
    3. Lanes that became equal are merged.
    """
    running: dict[str, list[str]] = {}
    for x in instances:
        if x.count > 0 and x.variant not in running.setdefault(x.task, []):
            running[x.task].append(x.variant)
    for vs in running.values():
        vs.sort()
    kept: list[LanePlan] = []
    dropped = 0.0
    total = sum(lp.rate_rps for lp in lanes)
    for lp in lanes:
        order = tuple(lp.variants[t] for t in app.task_names)
        mult = app.multipliers(order, factors)
        if any(mult[t] > 0 and lp.variants[t] not in running.get(t, []) for t in app.task_names):
            dropped += lp.rate_rps
            continue
        variants = dict(lp.variants)
        acc = app.lane_accuracy(order, factors)
        for t in app.task_names:
            if mult[t] > 0 or variants[t] in running.get(t, []) or not running.get(t):
                continue
            moved = dict(variants, **{t: running[t][0]})
            moved_acc = app.lane_accuracy(tuple(moved[u] for u in app.task_names), factors)
            if abs(moved_acc - acc) <= _SAME_ACCURACY:
                variants = moved
        kept.append(LanePlan(variants, lp.rate_rps))
    if not kept or dropped > _ROUND_OFF * total:
        return list(lanes)  # more than round-off: a broken plan, left for the verifier to report
    if dropped > 0:
        scale = total / (total - dropped)
        kept = [LanePlan(lp.variants, lp.rate_rps * scale) for lp in kept]
    merged: dict[tuple[str, ...], LanePlan] = {}
    for lp in kept:
        key = tuple(lp.variants[t] for t in app.task_names)
        have = merged.get(key)
        merged[key] = lp if have is None else LanePlan(lp.variants, have.rate_rps + lp.rate_rps)
    return list(merged.values())
