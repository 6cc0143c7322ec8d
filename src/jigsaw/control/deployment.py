"""The deployment policy: what a node re-plan deploys next, and which plan each app gets, decided
from plain data (the running plans, the re-plan's quick and exact node plans, the demands, what
the transitions observed) and the node's ``[control]``. Pure functions; the controller
(``controller.py``) executes what they decide, one action at a time, and records what it saw.

Two levels:

- the re-plan's sequence (``next_action`` on a ``Replan``): the quick plan when it is needed,
  then the exact plan (unless the quick one beats an unproven exact one); for the apps whose
  exact plan the making-room policy refused (no lane left while their instances in the way
  would drain, slots draining generations hold), the quick plan where it serves more than the
  running plan (it keeps the running instances); then, for every app refused in this re-plan
  whose running plan still does not hold its demand, the running plan extended in place.
- each app's part (``settle``, ``better_only``, ``short_of_gain``, ``for_needed``, ``trim_frees``):
  keep the running plan, push the new one beside what runs, or extend the running plan in place
  instead of pushing it.

Why pure: these choices were spread over the controller's methods and answered by the runtime's
refusals, retried through special paths; here each reads a snapshot and returns a value, and the
unit tests check them without processes (``tests/control/test_deployment.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from jigsaw.node import ControlSettings, Node
from jigsaw.plan import NodePlan, Plan
from jigsaw.planner.node_plan import app_value, prefer_quick
from jigsaw.runtime.placement import same_instances

URGENT_TRIGGERS = ("rate", "violations", "capacity")
ANYTIME_MODES = ("auto", "always", "off")
# an extension in place goes out instead of a spike's plan only when it serves at least this share
# of what the running plan lacks: ar_assistant's bin 115 (peak window) was met by an extension that
# re-weighted the running instances for 0.2 more req/s of 311 lacking, and held the spike's plan back
# a re-plan; traffic_analysis's bin 72 was served by one for 22% of the shortfall
EXTEND_FIRST_MIN_GAIN = 0.1
# a plan that plans less than its asked demand by more than this share is capped at what fits
# (rounding in a plan's rates is not a cap)
CAPPED_BELOW = 1e-3
Source = Literal["quick", "exact"]


def holds(run: Plan, demand_rps: float) -> bool:
    """``run`` serves ``demand_rps`` (a plan capped at the node's capacity never does)."""
    return not run.max_demand_plan and run.planned_rps >= demand_rps * (1 - 1e-9)


# ---- the re-plan's sequence --------------------------------------------------------------------


@dataclass(frozen=True)
class Replan:
    """What one node re-plan has seen and done so far: plain data, replaced (not changed) as the
    controller observes more."""

    trigger: str  # bin, rate, violations, capacity, repository, admin
    anytime: str  # auto, always, off
    demands: Mapping[str, float]  # what every app is planned for
    quick: NodePlan | None = None  # the quick plan, once in hand
    exact: NodePlan | None = None  # the exact plan, once in hand
    quick_decided: bool = False  # whether to deploy the quick plan was decided (before the exact)
    deployed: NodePlan | None = None  # the node plan deployed last
    quick_deployed: bool = False
    exact_decided: bool = False
    # app -> the sources of its plans the making-room policy refused in this re-plan
    refused: Mapping[str, frozenset[str]] = field(default_factory=dict)
    after_refusal: bool = False  # the quick plan after a refusal was decided
    extended: bool = False  # the extension of refused apps was decided

    def refusing(self, source: str, apps: list[str]) -> Replan:
        got = dict(self.refused)
        for a in apps:
            got[a] = got.get(a, frozenset()) | {source}
        return dataclasses.replace(self, refused=got)


@dataclass(frozen=True)
class Deploy:
    """Push every app's part of ``plan`` (``source``: quick or exact; ``why``: after a refusal)."""

    source: Source
    plan: NodePlan
    why: str = ""


@dataclass(frozen=True)
class Extend:
    """Extend the running plan of each of ``apps`` in place (``node_plan.extend_in_place``)."""

    apps: tuple[str, ...]


@dataclass(frozen=True)
class Skip:
    """Decided not to deploy the ``source`` plan (said in ``why``); ``next_action`` goes on."""

    source: Source
    why: str


Action = Deploy | Extend | Skip


def next_action(r: Replan, running: Mapping[str, Plan], ctl: ControlSettings, node: Node) -> Action | None:
    """The re-plan's next action, or None: nothing more to do now (before the exact plan: wait
    for it; after it: the re-plan is done)."""
    if not r.quick_decided and r.quick is not None and r.exact is None:
        if use_quick(r.anytime, r.trigger, all(holds(running[n], d) for n, d in r.demands.items())):
            return Deploy("quick", r.quick)
        return Skip("quick", "the running plans hold the demands")
    if r.exact is None:
        return None
    if not r.exact_decided:
        if not r.exact.plans:
            return Skip("exact", "no configuration")
        if r.deployed is not None and prefer_quick(r.deployed, r.exact, node):
            return Skip("exact", "the exact solve stopped at a worse objective than the quick plan's")
        return Deploy("exact", r.exact)
    if not r.after_refusal:
        part = quick_after_refusal(r, running, ctl)
        if part is not None:
            return Deploy("quick", part, "after_refusal")
    if not r.extended and ctl.extend_in_place_after_refusal:
        short = tuple(sorted(n for n in r.refused if not holds(running[n], r.demands[n])))
        if short:
            return Extend(short)
    return None


def use_quick(anytime: str, trigger: str, holds_all: bool) -> bool:
    """A quick plan in hand before the exact one is deployed when every quick plan is (``always``),
    for an urgent re-plan, or when some running plan does not hold its demand."""
    return anytime == "always" or trigger in URGENT_TRIGGERS or not holds_all


def quick_after_refusal(r: Replan, running: Mapping[str, Plan], ctl: ControlSettings) -> NodePlan | None:
    """The re-plan's quick plan for the apps whose exact plan was refused and which it serves
    better than their running plan (it keeps the running instances, so it needs no drain-first),
    when it was not deployed already (``control.quick_after_refusal``); None otherwise.

    Why: the exact plan of a spike rearranges the node and needs the slots of the running
    instances; refused, the spike met the quiet plan until the next re-plan (bin 187 of day 0:
    1414 req/s on a plan for 1007) although the quick plan, which keeps the running instances and
    adds some (``anytime.extend_plan``) and so needs no drain-first, was in hand."""
    q = r.quick
    if not ctl.quick_after_refusal or q is None or r.quick_deployed:
        return None
    better = [n for n, srcs in r.refused.items() if "exact" in srcs and (p := q.plans.get(n)) is not None
              and p.instances and p.planned_rps > running[n].planned_rps * (1 + 1e-9)]
    if not better:
        return None
    return dataclasses.replace(q, plans={n: q.plans[n] for n in sorted(better)})


def quick_need_by(anytime: str, trigger: str, t0: float, patience_s: float, for_bin: int | None,
                  bin_index: int, bin_end: float) -> float | None:
    """When a quick plan in hand is deployed if the exact one is not in (monotonic s), or None:
    never (``off``, or an operator's re-plan unless ``always``: it is asked for a demand, not a
    burst, and a greedy plan replaced a second later restarts processes twice). At once with
    ``always``; after ``patience_s`` for an urgent re-plan; at the boundary of the bin it is for (at
    least the patience) for a routine one."""
    if anytime == "off" or (trigger == "admin" and anytime != "always"):
        return None
    if anytime == "always":
        return t0
    need_by = t0 + patience_s
    if trigger not in URGENT_TRIGGERS and for_bin is not None and for_bin > bin_index:
        need_by = max(need_by, bin_end)
    return need_by


def retry_share(found: bool, trigger: str, as_asked: bool, ctl: ControlSettings) -> float | None:
    """The share of every app's demand a re-plan that found no plan at all (neither quick nor
    exact: the planner's answer near and above the node's capacity, or a planner error) is asked
    again at (``control.unplanned_retry_share``), or None: not again (an operator's re-plan, or
    one asked as given, is asked once). Why: on day 0 of traffic_analysis the spike's re-plans for
    1535-1554 req/s (95-97% of the node's capacity) found nothing in 4.6-4.9 s, twice, and bins
    115-116 met the spike on the 15-slice plan (171 violations in bin 116), while a plan for 85% of
    that is found in 0.3 s."""
    share = ctl.unplanned_retry_share
    return None if found or share <= 0 or trigger == "admin" or as_asked else share


# ---- each app's part -----------------------------------------------------------------------------


def settle(np: NodePlan, running: Mapping[str, Plan], demands: Mapping[str, float], node: Node,
           fresh: frozenset[str] = frozenset()) -> tuple[dict[str, Plan], list[str]]:
    """Each app's plan to push, and the apps that keep their running plan.

    An app keeps the plan it runs when that plan still holds its demand, is worth at least as
    much to the node as the new one (``app_value``: an equally good plan with other variants
    or MIG profiles, which an unproven or degenerate solve returns at will, e.g. for an idle
    app), and the node's slices allow it beside the others' new plans: a new generation costs
    seconds of reconfiguration, and the manager applies one at a time, so churn in one app
    delays the app the re-plan is for. A lost worker's app, and demands scaled to fit, always
    take the new plan. With ``control.shrink_min_slices`` a better plan that frees fewer slices
    than that is not worth its generation either: each new generation drains its predecessor
    for up to an SLO, and MIG slots held by a draining generation refuse the next re-plan that
    needs them (on a compressed replay that is the re-plan for the next burst).
    """
    plans = dict(np.plans)
    kept: list[str] = []
    if np.demand_scale < 1.0:
        return plans, kept
    for name, new in np.plans.items():
        run = running[name]
        if name in fresh or not new.instances or not run.instances or not holds(run, demands[name]) \
                or same_instances(run, new):
            continue
        frees = run.slices_used - new.slices_used
        min_frees = node.control.shrink_min_slices
        if app_value(name, run, node) < app_value(name, new, node) - 1e-9 \
                and (min_frees <= 0 or frees >= min_frees):
            continue
        total = sum(p.slices_used for p in plans.values()) - new.slices_used + run.slices_used
        if total > node.slices_available:
            continue
        plans[name] = run
        kept.append(name)
    return plans, kept


def better_only(run: Plan, plan: Plan, demand_rps: float, total_slices: int, slices_available: int,
                fresh: bool) -> bool:
    """The running plan holds the demand and the node's slices allow it beside the other apps'
    new plans: ``plan`` is better, not needed (no drain-first, no wait for it)."""
    return not fresh and bool(run.instances) and holds(run, demand_rps) \
        and total_slices - plan.slices_used + run.slices_used <= slices_available


def short_of_gain(run: Plan, plan: Plan, demand_rps: float, total_slices: int, slices_available: int,
                  gain: float, fresh: bool, trigger: str) -> bool:
    """``plan`` does not hold ``demand_rps`` either and plans less than ``gain``
    (``control.short_plan_min_gain``) more than the running plan: the running plan serves on.
    Only for the controller's own re-plans, where the running plan fits beside the other apps'
    new plans; a lost worker's app (``fresh``) takes the new plan.

    Why: near the node's capacity a plan that does not hold the demand rearranges the node for a
    few percent more, and its switch waits for drains and drains part of the running plan first:
    at ar_assistant's spike a 28-slice plan for 624 req/s replaced a 24-slice plan for 613 after
    39.6 s, and the drain-first's interim plan met the next bin."""
    return not (gain <= 0 or fresh or not run.instances or trigger == "admin"
                or plan.planned_rps >= demand_rps * (1 - 1e-9)
                or total_slices - plan.slices_used + run.slices_used > slices_available
                or plan.planned_rps >= run.planned_rps * (1 + gain))


@dataclass(frozen=True)
class ForNeeded:
    """What to do with a plan the app needs (``for_needed``): place it beside what runs and
    drains (``beside``), beside what serves, waiting for the drains in its way (``over_draining``),
    as any plan (``any``), or not at all: ``extend`` the running plan in place instead
    (``over_draining`` too where no extension beside everything serves enough), or ``serve_on``
    (the running plan, extended in this re-plan already, serves on)."""

    what: Literal["beside", "over_draining", "any", "extend", "serve_on"]
    over_draining: bool = False


def spike(run: Plan, demand_rps: float, ctl: ControlSettings) -> bool:
    """The running plan holds less than ``control.extend_in_place_first_below`` of the demand."""
    return not run.max_demand_plan and run.planned_rps < ctl.extend_in_place_first_below * demand_rps


def for_needed(run: Plan, demand_rps: float, ctl: ControlSettings, *, extended_first: bool,
               fits_beside: bool, fits_serving: bool) -> ForNeeded:
    """For a plan the app needs (its running plan does not hold ``demand_rps``; the controller's
    own re-plan, not an operator's, who asked for that plan), on a node with a MIG layout:
    beside what runs and drains when it fits so (``fits_beside``, ``control.place_needed_beside``);
    where it does not and the running plan holds less than ``control.extend_in_place_first_below``
    of the demand, the running plan extended in place at once instead (``extend``; over the slots
    that only drain where none beside everything serves enough, ``control.extend_over_draining``);
    a later plan of the same re-plan after such an extension (``extended_first``: the exact one
    after the quick one) only where it needs no more than draining slots (``fits_serving``: it
    waits for them while the extension serves), else the extension serves on.

    Why: a spike's plan placed over the slots of the small running plan needed a drain-first that
    left the app no lane and was refused, three times in 9 s on ar_assistant's day 0 (bins 90-93,
    508-720 req/s on a plan for 227, 18 slices free), and placed over draining slots it waited
    for their drains; the extension after the refusals came 20 s after the spike's onset."""
    if fits_beside:
        return ForNeeded("beside" if ctl.place_needed_beside else "any")
    if extended_first:
        return ForNeeded("over_draining" if fits_serving else "serve_on")
    if spike(run, demand_rps, ctl):
        return ForNeeded("extend", over_draining=ctl.extend_over_draining)
    return ForNeeded("any")


def looks_beside(run: Plan, demand_rps: float, ctl: ControlSettings, extended_first: bool) -> bool:
    """Whether ``for_needed`` can choose anything but ``any`` (so the controller places the plan
    beside what runs first)."""
    return ctl.place_needed_beside or extended_first or spike(run, demand_rps, ctl)


@dataclass(frozen=True)
class Asks:
    """What the making-room policy asks the rate about a needed plan pushed now (``asks``)."""

    still_needed: bool = False  # whether the rate still needs the plan (before a wait or drain-first)
    after_bin: int | None = None  # ... asked only once this bin has ended
    outgrown_rps: float | None = None  # while it waits: whether the arrivals outgrew this rate


def asks(trigger: str, for_bin: int | None, planned_rps: float, asked_rps: float,
         ctl: ControlSettings) -> Asks:
    """For a needed plan of a re-plan of ``trigger`` (for bin ``for_bin``), planned for
    ``planned_rps`` when asked for ``asked_rps``: whether the making-room policy asks the rate
    whether it still needs the plan, and whether the arrivals have outgrown it. An operator's plan
    is pushed as asked (never asked).

    Still needed: a plan of the rate trigger, which was sized to the rate, at once; a plan of a
    bin's re-plan once the bin it was planned for has ended (before then it may be for a spike the
    predictor saw ahead of the rate). Why a bin's plan too: at social_media's spike of bin 156 the
    predictor's plan for bin 157 (6101 req/s) was refused, its quick plan waited 10.5 s for drains
    and drained 11 running instances first, and switched 18.6 s after it was decided, in bin 160,
    at 1356 req/s on a running plan for 3649: the interim plan shed 99 requests (44.6% of the bin).

    Outgrown (``control.end_wait_outgrown_above``; against the larger of the two rates): not for a
    plan capped below the demand it was asked for (at the node's capacity, an extension over
    draining slots): it is the most that fits, and a re-plan for a higher rate gives the same cap.
    Abandoning such plans re-planned the same plan, first when asked against what the plan plans
    (day 0 of social_media, bin 73: an extension for 6261 of 7792 req/s), then against the demand
    it was asked for (the same bin in a later run: an extension for 5206 of 5472 req/s abandoned at
    7119, whose re-plan for 7475 brought one for 5212 2.6 s later, 92 requests shed at the door
    meanwhile)."""
    if trigger == "admin":
        return Asks()
    still = trigger == "rate" or (trigger == "bin" and for_bin is not None)
    after = for_bin if trigger == "bin" else None
    capped = planned_rps < asked_rps * (1 - CAPPED_BELOW)
    outgrown = None if ctl.end_wait_outgrown_above <= 0 or capped else max(asked_rps, planned_rps)
    return Asks(still, after, outgrown)


def trim_frees(run: Plan, smaller: Plan, min_frees: int) -> bool:
    """A running plan that holds its demand and kept a smaller plan out (its MIG instances need
    the running ones' slots) is worth trimming when that frees at least ``min_frees`` slices
    (``control.trim_min_slices``; 0: never)."""
    return min_frees > 0 and run.slices_used - smaller.slices_used >= min_frees
