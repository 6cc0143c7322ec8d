"""The node's controller: one clock closes every app's bins, one decision re-plans the whole node.

Every ``bin_seconds`` (wall time; the trace's 5-minute bins compressed) the ``NodeController``
closes the bin of every app at once. Each app keeps its own bookkeeping (``AppController``):
observed demand = arrivals / bin length x time_scale (requests/s of the full-speed node), the
violation rate, the measured fan-out of each upstream variant, its predictor and its records.
The decision is node-wide: the predictions of all apps go to one solve (``planner.node_plan``,
through ``control.solver``) over the shared slices with the objective the node config chooses,
and every app's part of the result is pushed to the data plane as its ``DesiredState`` (apps that
shrink first, so the slices they free are there for the ones that grow; an app whose plan runs
the same processes is only re-weighted in place, a no-op when nothing changed).

The re-plan for the next bin starts ahead of the bin's end by what re-plans have recently taken
(``lead_s``), so the plan is in place at the boundary; the planner runs off the loop (a worker
thread waits on the planner child process, or calls the planner itself) with the running plans'
layout to keep, the mean measured factors of the last bins, and a time limit below the bin length.

Early re-plans: a bin whose violation rate crosses ``control.replan_violation_rate`` (once per app
and bin), and with ``control.replan_on_rate`` an arrival rate over the last ``RATE_WINDOW_BINS``
of a bin (grown back within the bin to hold ``MIN_ARRIVALS_FOR_RATE`` arrivals where the wall-clock
rate is low, and then read with a Poisson test) above what the running plan holds (its ``planned_rps``; up to
``control.early_replans_per_bin`` early re-plans per app and bin, each against the plan the last
one deployed): the predictor's
mean of past bins sees a burst one bin late, the door sees it within a second. Either re-plans the
node with the triggering app at its recent observed rate (plus the planner's demand slack; at most
``RATE_JUMP_MAX`` x the last bin's demand, since a stalled loop's backlog of arrivals reads as a
burst; after violations never less than the plan holds) and the other apps at the demand they were
planned for. Every plan holds at least the burst floor (``control.burst_requests``). When the
supervisor gives up on a worker (capacity lost), the node re-plans at once and that app's plan
runs on a fresh generation.

Anytime (``anytime``): the planner hands over a verified greedy plan within about 100 ms while the
exact solve runs on. ``auto`` deploys it when it is needed - an early re-plan whose exact plan is
not in within ``QUICK_PATIENCE_S``, or a routine one whose exact plan is late for the bin
boundary, and the running plans do not hold the new demands - and then the exact plan (which
replaces it unless the exact solve stopped unproven at a worse objective); ``always`` deploys
every quick plan first (for tests and ablations); ``off`` waits for the exact plan. Both are
recorded in the bin records (``replans``) and counted in ``/metrics``.

Deciding, then executing: every choice of what a re-plan deploys is made by two pure policies
on plain data, and this module executes them and keeps the bins. ``deployment.py`` picks the
re-plan's next action (the quick plan, the exact plan, the quick plan for apps whose exact plan
was refused, the running plan extended in place for apps still short) and each app's part:
keep the running plan when it holds its demand and a new generation is not worth it
(``settle``, ``control.shrink_min_slices``; ``short_of_gain``), place a needed plan beside
everything that runs and drains (``for_needed``: the placement, made once, travels with the plan
as ``Placed``), or extend a spike's running plan in place instead, or trim a running plan the
demand no longer needs (``control.trim_min_slices``). ``transition.py`` then moves each app to its
plan one step at a time (``transit``): decide on the runtime's snapshot and what the controller
knows now (``Need``: the rate now arriving, the headroom rule's memory), execute one step,
observe. A refusal is that policy's own step on a snapshot taken before anything changed; the
next action of ``deployment.next_action`` sees it.

A planner that fails or times out leaves the running plans serving; the bin's records and
``jigsaw_planner_failures_total`` report it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from jigsaw.app import App
from jigsaw.control.deployment import (
    ANYTIME_MODES,
    Extend,
    Replan,
    Skip,
    better_only,
    next_action,
    quick_need_by,
    retry_share,
    settle,
    short_of_gain,
)
from jigsaw.control.needed import BesidePlaced, NeededPlans
from jigsaw.control.outcome import Pushed, mark
from jigsaw.control.predictor import Predictor, burst_floor_rps, make_predictor, rise_rps
from jigsaw.control.solver import solve_node
from jigsaw.control.spikes import JUMP_RATIO, spikes
from jigsaw.control.transition import NEEDED, KeepRunning, MakeRoom, Need, RoomPolicy, transit
from jigsaw.errors import JigsawError
from jigsaw.node import Node
from jigsaw.plan import NodePlan, Plan
from jigsaw.planner.node_plan import QUICK_STATUS
from jigsaw.profiles import ProfileTable
from jigsaw.runtime.admission import BinCounters
from jigsaw.runtime.applied import Applied, DesiredState, Placed, Refuse, RoomStep, Transition
from jigsaw.runtime.placement import Beside

LEAD_MARGIN = 1.25  # a re-plan ahead of a bin's end starts this many recent re-plan durations early
HISTORY_MAX_BINS = 20000  # bounded memory: about 70 days of 5-minute bins per app
# the demand history the predictor reads: a day of 5-minute bins, since the spike-profile
# predictor needs several cycles of a spike that recurs every couple of hours to predict the next
HISTORY_RPS_BINS = 288
MIN_ANSWERED_FOR_TRIGGER = 20  # an early re-plan needs this many answers in the bin
MIN_ARRIVALS_FOR_RATE = 20  # the rate trigger needs this many arrivals in its window
RATE_WINDOW_BINS = 0.1  # the rate trigger's window, a share of the bin (at least two polls)
RATE_STALL_S = 1.0  # a gap between polls this long (or the window) is a stalled loop, not a burst
RATE_SAMPLES_MAX = 1024  # a bin's polls kept for a grown window (about 20 a bin; bounded all the same)
# a needed plan of the rate trigger counts as no longer needed (its spike has passed) only when
# the rate now arriving is below this share of what the running plan holds: the trigger's half-second
# window holds a few dozen arrivals at a compressed time scale, and read against the plan alone a
# re-plan for a 6% overshoot read as passed a moment later in a third of the cases (social_media
# 130:166; below 0.8 of the plan still 6 times in a replay, hence the bin so far too); the spike
# that passed fell to 0.5-0.6 of the running plan
PASSED_BELOW = 0.8
QUICK_PATIENCE_S = 0.3  # an urgent re-plan waits this long for the exact plan before deploying the quick one
MAX_REPLANS_RECORDED = 50  # per app and bin
# An early re-plan asks for at most this many times the last bin's demand: a day's spikes jump 2-4x
# within a bin, while a loop that stalled a second counts the arrivals it held back in one short
# window and reads a rate ten times the real one.
RATE_JUMP_MAX = 4.0
Factors = dict[tuple[str, str, str], float]
QuickSink = Callable[[NodePlan], None]


class RateWindow(NamedTuple):
    """The rate trigger's reading: the full-speed rate, the arrivals it is read from, and whether
    the window grew past its tenth of a bin to hold ``MIN_ARRIVALS_FOR_RATE`` of them."""

    rate_rps: float
    arrivals: int
    grown: bool = False


def poisson_tail(count: int, mean: float) -> float:
    """P(X >= ``count``) for X ~ Poisson(``mean``): the terms from ``count`` up, summed until they
    no longer add (each is the last x mean / k; past the mean they fall geometrically)."""
    if count <= 0:
        return 1.0
    if mean <= 0:
        return 0.0
    term = math.exp(count * math.log(mean) - mean - math.lgamma(count + 1))
    total, k = 0.0, count
    while term > 1e-16 * max(total, 1e-300) and k < count + 100000:
        total += term
        k += 1
        term *= mean / k
    return min(1.0, total)


class Solver(Protocol):
    """One node-wide decision: every app's plan at ``demands`` (``control.solver.solve_node``)."""

    def __call__(self, apps: Sequence[App], node: Node, profiles: ProfileTable,
                 demands: Mapping[str, float], *, space: str | None, previous: Mapping[str, Plan] | None,
                 time_limit_s: float | None, factors: Mapping[str, Factors] | None,
                 on_quick: QuickSink | None = None) -> NodePlan: ...


default_solver: Solver = solve_node


class DataPlane(Protocol):
    """What the controller drives: the generation manager (``runtime.generations``)."""

    node: Node
    profiles: ProfileTable

    def plan_of(self, app: str) -> Plan: ...
    def generation_of(self, app: str) -> int: ...
    def transition(self, desired: DesiredState) -> contextlib.AbstractAsyncContextManager[Transition]: ...
    async def unload_app(self, app: str) -> None: ...
    async def load_app(self, app: App, plan: Plan) -> None: ...
    def beside(self) -> Beside | None: ...


class BinSource(Protocol):
    """What the controller reads from the frontend: the bin counters, and where failures count."""

    def peek_bin(self, app: str) -> BinCounters | None: ...
    def take_bin(self, app: str) -> BinCounters: ...
    def count_planner_failure(self, app: str) -> None: ...


def plan_summary(p: Plan) -> dict[str, Any]:
    return {"slices_used": p.slices_used, "slices_available": p.slices_available,
            "accuracy": round(p.accuracy, 6), "status": p.status, "solve_seconds": round(p.solve_seconds, 3),
            "feasible": p.feasible, "max_demand_plan": p.max_demand_plan,
            "demand_rps": round(p.demand_rps, 3), "planned_rps": round(p.planned_rps, 3),
            "processes": sum(i.count * i.mps for i in p.instances)}


@dataclass
class BinRecord:
    app: str
    bin: int
    start_unix_s: float
    bin_seconds: float
    demand_rps: float = 0.0  # observed, in full-speed requests/s (arrivals / bin x time_scale)
    predicted_rps: float = 0.0  # the prediction the plan serving this bin was made for
    plan: dict[str, Any] = field(default_factory=dict)
    node_slices_used: int = 0  # every app's slices together, when the bin closed
    generation: int = 0
    reconfigurations: int = 0
    reconfiguration_seconds: float = 0.0
    changed_gpus: list[int] = field(default_factory=list)
    early_replans: int = 0
    # the node re-plans that finished in this bin: trigger, this app's demand, the quick and the
    # exact plan (this app's slices, the node's, seconds, whether deployed)
    replans: list[dict[str, Any]] = field(default_factory=list)
    planner_errors: list[str] = field(default_factory=list)
    reconfiguration_errors: list[str] = field(default_factory=list)  # re-plans not applied, and why
    answered: int = 0
    violations: int = 0
    violation_rate: float = 0.0
    factors: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["start_unix_s"] = round(self.start_unix_s, 3)
        d["demand_rps"] = round(self.demand_rps, 3)
        d["predicted_rps"] = round(self.predicted_rps, 3)
        d["reconfiguration_seconds"] = round(self.reconfiguration_seconds, 3)
        d["violation_rate"] = round(self.violation_rate, 6)
        d["replans"] = [dict(x) for x in self.replans]
        return d


class ControllerStats:
    """The controller's Prometheus counters (appended to the frontend's ``/metrics``)."""

    def __init__(self) -> None:
        self.replans: Counter[str] = Counter()  # node re-plans, by trigger
        self.plans: Counter[tuple[str, bool]] = Counter()  # (quick|exact, deployed)
        self.last_seconds: dict[str, float] = {}  # quick|exact -> seconds of the latest
        self.trims = 0  # running plans trimmed to their demand (``control.trim_min_slices``)

    def prometheus(self) -> str:
        rows = ["# HELP jigsaw_node_replans_total Node-wide re-plans (all apps in one decision), by trigger.",
                "# TYPE jigsaw_node_replans_total counter"]
        rows += [f'jigsaw_node_replans_total{{trigger="{k}"}} {v}' for k, v in sorted(self.replans.items())]
        if not self.replans:
            rows.append("jigsaw_node_replans_total 0")
        rows += ["# HELP jigsaw_node_plans_total Node plans the planner handed over: the anytime quick "
                 "plan and the exact plan, and whether each was deployed.",
                 "# TYPE jigsaw_node_plans_total counter"]
        for source in ("quick", "exact"):
            for deployed in (True, False):
                label = f'source="{source}",deployed="{str(deployed).lower()}"'
                rows.append(f"jigsaw_node_plans_total{{{label}}} {self.plans[(source, deployed)]}")
        rows += ["# HELP jigsaw_node_plan_seconds How long the latest quick and exact node plan took.",
                 "# TYPE jigsaw_node_plan_seconds gauge"]
        rows += [f'jigsaw_node_plan_seconds{{source="{k}"}} {v:.6f}'
                 for k, v in sorted(self.last_seconds.items())]
        rows += ["# HELP jigsaw_node_trims_total Running plans that held their demand trimmed to it "
                 "(instances given back, every process kept).",
                 "# TYPE jigsaw_node_trims_total counter", f"jigsaw_node_trims_total {self.trims}"]
        return "\n".join(rows) + "\n"


class AppController:
    """One app's bins, predictions, early triggers and records; its re-plans are the node's."""

    def __init__(self, app: App, ctl: NodeController, predictor: Predictor | None = None) -> None:
        node = ctl.node
        self.app = app
        self.ctl = ctl
        self.counters = ctl.counters
        plan = ctl.plane.plan_of(app.name)
        self.predictor: Predictor = predictor or make_predictor(
            node.control.predictor, node.control.history_bins, node.planner.demand_slack, plan.demand_rps)
        self.floor_rps = burst_floor_rps(app.latency_slo_ms, node.control.burst_requests)
        self.history_rps: deque[float] = deque(maxlen=max(HISTORY_RPS_BINS, node.control.history_bins))
        self.factor_bins: deque[dict[tuple[str, str], float]] = deque(maxlen=node.control.history_bins)
        self.records: deque[BinRecord] = deque(maxlen=HISTORY_MAX_BINS)
        self.predicted_rps = plan.demand_rps
        self.current = self.new_record()
        # (monotonic s, bin arrivals so far) at each poll of the bin
        self._arrival_samples: deque[tuple[float, int]] = deque(maxlen=RATE_SAMPLES_MAX)

    @property
    def name(self) -> str:
        return self.app.name

    @property
    def node(self) -> Node:
        return self.ctl.node

    @property
    def plan(self) -> Plan:
        return self.ctl.plane.plan_of(self.app.name)

    def new_record(self) -> BinRecord:
        r = BinRecord(self.app.name, self.ctl.bin_index, time.time(), self.ctl.bin_seconds,
                      generation=self.ctl.plane.generation_of(self.app.name))
        r.predicted_rps = self.predicted_rps
        r.plan = plan_summary(self.plan)
        return r

    # ---- bins ----------------------------------------------------------------------------
    def close_bin(self, elapsed_s: float, node_slices_used: int) -> None:
        """Close the running bin (``elapsed_s`` long) into the records; ``open_bin`` starts the next."""
        c = self.counters.take_bin(self.app.name)
        r = self.current
        r.demand_rps = c.arrivals / max(1e-9, elapsed_s) * self.ctl.time_scale
        r.answered += c.answered
        r.violations += c.violations
        r.violation_rate = r.violations / r.answered if r.answered else 0.0
        r.node_slices_used = node_slices_used
        measured = {k: kids / items for k, (items, kids) in c.children.items() if items > 0}
        if measured:
            self.factor_bins.append(measured)
        r.factors = {f"{t}/{v}": round(x, 4) for (t, v), x in measured.items()}
        self.history_rps.append(r.demand_rps)
        self.records.append(r)
        self._arrival_samples.clear()

    def open_bin(self) -> None:
        self.current = self.new_record()

    def predict_ahead(self) -> float:
        """The next bin's prediction with the running bin's rate so far as its latest sample."""
        c = self.counters.peek_bin(self.app.name)
        elapsed = time.monotonic() - self.ctl.bin_start
        history = list(self.history_rps)
        if c is not None and elapsed > 0:
            history.append(c.arrivals / elapsed * self.ctl.time_scale)
        return self._hold(self.predictor.predict(history), self.current, history)

    def predict_next(self) -> float:
        """The next bin's prediction once the running bin has closed."""
        history = list(self.history_rps)
        last = self.records[-1] if self.records else None
        return self._hold(self.predictor.predict(history), last, history)

    def _hold(self, predicted: float, bin_record: BinRecord | None, history: list[float]) -> float:
        """Burst hold: a bin that outran its plan (it re-planned early) keeps its demand for one more bin.

        The predictor's mean of the last bins lags a burst; bursts last more than one bin, and a
        routine re-plan for the mean would undo the early re-plan in the middle of one.
        """
        if bin_record is None or not bin_record.early_replans or not history:
            return predicted
        return max(predicted, history[-1] * (1.0 + self.node.planner.demand_slack))

    def recent_rate_rps(self, arrivals: int) -> RateWindow:
        """The full-speed rate over the last ``RATE_WINDOW_BINS`` of the bin and the arrivals in
        that window (grown where it holds too few: ``_window_rate``).

        Sampled at every poll; until the window is covered, the bin so far stands in for it, and
        before the bin is a window old there is no rate yet ``(0, 0)``: a few arrivals bunched in
        a fraction of a second are noise, not a burst. After a gap between polls longer than
        ``RATE_STALL_S`` (and the window) the loop stalled: the arrivals it counted at once had
        waited for it, so the window starts again from now, and the bin so far stands in until it
        is covered (a stall is no burst, but a burst often stalls the loop: it must still be seen).
        """
        now = time.monotonic()
        samples = self._arrival_samples
        window_s = RATE_WINDOW_BINS * self.ctl.bin_seconds
        if samples and now - samples[-1][0] > max(RATE_STALL_S, window_s):
            samples.clear()
        samples.append((now, arrivals))
        return self._window_rate(now, arrivals) or RateWindow(0.0, 0)

    def _window_rate(self, now: float, arrivals: int) -> RateWindow | None:
        """The rate from the newest poll at least the window old to ``now`` (the bin so far while
        no poll is that old); None before the bin is a window old.

        Where that window holds fewer than ``MIN_ARRIVALS_FOR_RATE`` arrivals and
        ``control.rate_window_grow_z`` is on, it grows back, poll by poll, to the newest one from
        which it holds them (at most to the bin's start): ``grown``, which the trigger and the
        outgrown check read only when significant at that z. Why: a tenth of a 5 s bin at a
        low wall-clock rate holds a dozen arrivals, and a fixed count in a fixed window made the
        trigger blind below a rate (ar_assistant at time scale 20: below 800 req/s, its capacity
        691); a window that holds the count reads a rate of the same noise at every rate, and
        the Poisson test keeps its misreads out."""
        window_s = RATE_WINDOW_BINS * self.ctl.bin_seconds
        grow = self.node.control.rate_window_grow_z > 0
        start: tuple[float, int] | None = None
        grown = False
        # newest first: the polls of the last window are skipped, the first older one starts the
        # window, and a window that holds too few grows back from there (the bin's start last)
        for t, a in itertools.chain(reversed(self._arrival_samples), ((self.ctl.bin_start, 0),)):
            if now - t < window_s:
                continue
            grown = start is not None
            start = (t, a)
            if not grow or arrivals - a >= MIN_ARRIVALS_FOR_RATE:
                break
        if start is None:
            return None
        t0, a0 = start
        return RateWindow((arrivals - a0) / max(1e-9, now - t0) * self.ctl.time_scale, arrivals - a0, grown)

    def rate_now_rps(self) -> float | None:
        """The full-speed arrival rate over the rate trigger's last window (the polls' samples,
        read, not taken), the bin so far until that is covered; None before the bin is a window
        old or while no poll has sampled it."""
        got = self._window_now()
        return None if got is None else got.rate_rps

    def _window_now(self) -> RateWindow | None:
        """``_window_rate`` now, from the polls' samples (read, not taken)."""
        c = self.counters.peek_bin(self.app.name)
        if c is None or not self._arrival_samples:
            return None
        return self._window_rate(time.monotonic(), c.arrivals)

    def still_needed(self) -> bool:
        """Whether the rate now arriving (over the trigger's window, and over the bin so far: the
        window alone is a few dozen arrivals) exceeds ``PASSED_BELOW`` of what the running plan
        holds (unknown: yes); asked by a needed re-plan before it drains the app's running
        instances."""
        rate = self.rate_now_rps()
        c = self.counters.peek_bin(self.app.name)
        elapsed = time.monotonic() - self.ctl.bin_start
        if rate is None or c is None or elapsed < RATE_WINDOW_BINS * self.ctl.bin_seconds:
            return True
        so_far = c.arrivals / elapsed * self.ctl.time_scale
        run = self.plan
        return run.max_demand_plan or max(rate, so_far) > PASSED_BELOW * run.planned_rps

    def in_spike(self) -> bool:
        """Whether a spike runs now: the demand history, the rate now arriving (the trigger's
        window) as its last bin, ends inside one (``spikes.spikes``)."""
        rate = self.rate_now_rps()
        found = spikes(list(self.history_rps) + ([rate] if rate is not None else []))
        return bool(found) and found[-1].end is None

    def outgrows(self, asked_rps: float) -> bool:
        """Whether the rate now arriving (over the trigger's window) is more than
        ``control.end_wait_outgrown_above`` times ``asked_rps``, by more than Poisson noise
        explains (``significant``); asked by a needed plan while it waits for the drains in its way.
        Unknown (no window yet): no, the wait goes on as without the rule."""
        above = self.node.control.end_wait_outgrown_above
        got = self._window_now() if above > 0 else None
        if got is None:
            return False
        holds = above * asked_rps
        return got.arrivals >= MIN_ARRIVALS_FOR_RATE and got.rate_rps > holds \
            and self.significant(got.arrivals, got.rate_rps, holds, grown=got.grown)

    def early_trigger(self) -> tuple[str, str, float] | None:
        """(trigger, why, demand) when this app's bin calls for an early re-plan of the node."""
        c = self.counters.peek_bin(self.app.name)
        if c is None:
            return None
        recent_rps, recent_n, grown = self.recent_rate_rps(c.arrivals)
        node = self.node
        done = self.current.early_replans
        if done >= node.control.early_replans_per_bin or self.ctl.busy():
            return None
        threshold = node.control.replan_violation_rate
        slack = 1.0 + node.planner.demand_slack
        elapsed = max(1e-3, time.monotonic() - self.ctl.bin_start)
        so_far = c.arrivals / elapsed * self.ctl.time_scale
        answered = self.current.answered + c.answered
        violations = self.current.violations + c.violations
        holds_rps = self.plan.planned_rps
        floor_rps = 0.0
        # the violation trigger fires once per bin (the bin's violations stay after its re-plan);
        # the rate trigger again while the plan the earlier re-plan deployed does not hold the rate
        if not done and answered >= MIN_ANSWERED_FOR_TRIGGER and violations / answered > threshold:
            trigger, why = "violations", f"{violations}/{answered} SLO violations (> {threshold:.0%})"
            # violations under a plan that holds the observed rate (a reconfiguration under way, a
            # burst that has passed) are no reason to plan for less: that would reconfigure again
            floor_rps = holds_rps
        elif (node.control.replan_on_rate and not self.plan.max_demand_plan
              and recent_n >= MIN_ARRIVALS_FOR_RATE and recent_rps > holds_rps * slack
              and (self.significant(recent_n, recent_rps, holds_rps * slack, grown=grown)
                   or (not grown and self.significant(c.arrivals, so_far, holds_rps * slack)))):
            trigger = "rate"
            why = f"arrivals at {recent_rps:.1f} rps, above the {holds_rps:.1f} rps the plan holds" \
                + (f" (a window grown to {recent_n} arrivals)" if grown else "")
        else:
            return None
        # against the last bin seen (what the plan holds when there is none): a cap against the
        # plan would let one misread raise the next cap with it
        base_rps = self.history_rps[-1] if self.history_rps and self.history_rps[-1] > 0 else holds_rps
        demand = min(max(recent_rps, so_far), RATE_JUMP_MAX * base_rps)
        if trigger == "rate" and self.significant(recent_n, recent_rps, JUMP_RATIO * base_rps, grown=True):
            # a jump beyond the window's noise, read by the predictor: a spike's level, not its onset
            demand = min(rise_rps(self.predictor, self.history_rps, demand, slack - 1.0),
                         RATE_JUMP_MAX * base_rps)
        return trigger, why, max(demand, floor_rps) * slack

    def significant(self, count: int, rate_rps: float, holds_rps: float, *, grown: bool = False) -> bool:
        """``count`` arrivals, read as ``rate_rps``, are more than the plan's ``holds_rps`` would bring
        by chance: the Poisson upper tail of its expected count in the same time at ``count`` is
        below the one-sided normal tail of ``control.rate_window_grow_z`` (``poisson_tail``). Only a
        window grown to hold its count (``grown``) is tested; any other count is significant.

        Why: the rate window is half a second of a compressed bin, a few dozen arrivals; in the
        trough (15 req/s of wall-clock traffic at time scale 20) it holds about 11, and a count of
        20, which such a window reaches in about one bin of ten, read as 1.8x the plan. Each
        misfire deployed a plan of twice the slices, every instance new, then the routine re-plan
        took it back: three generations in a bin, and the switches' 504s (day 0 of
        traffic_analysis: about 140 of its 320 violations). The exact tail, not a normal
        approximation, because at a dozen arrivals the normal one fires several times too often.
        """
        z = self.node.control.rate_window_grow_z if grown else 0.0
        if z <= 0:
            return True
        if rate_rps <= 0 or count <= 0:
            return False
        expected = holds_rps * count / rate_rps  # what the plan's rate brings in the same time
        return count > expected and poisson_tail(count, expected) < 0.5 * math.erfc(z / math.sqrt(2.0))

    def capacity_demand(self) -> float:
        """What to re-plan for when a worker is lost: the prediction, or the bin's rate so far."""
        elapsed = max(1e-3, time.monotonic() - self.ctl.bin_start)
        c = self.counters.peek_bin(self.app.name)
        so_far = (c.arrivals / elapsed * self.ctl.time_scale) if c is not None else 0.0
        return max(self.predicted_rps, so_far * (1.0 + self.node.planner.demand_slack))

    def measured_factors(self) -> Factors:
        """Mean measured fan-out of each upstream variant over the last bins, per child task.

        Workers report the total children of an item; it is split among the child tasks in the
        proportions of the app's declared factors for that variant.
        """
        sums: dict[tuple[str, str], list[float]] = {}
        for b in self.factor_bins:
            for k, x in b.items():
                sums.setdefault(k, []).append(x)
        out: Factors = {}
        for (task, variant), xs in sums.items():
            total = sum(xs) / len(xs)
            kids = self.app.children(task)
            declared = [max(0.0, self.app.edge(task, c).factor(variant)) for c in kids]
            norm = sum(declared)
            for c, d in zip(kids, declared):
                out[(task, variant, c)] = total * (d / norm if norm > 0 else 1.0 / len(kids))
        return out

    # ---- what the node's re-plans report back ----------------------------------------------
    def record_applied(self, done: Applied, new: Plan, source: str) -> None:
        if done.error is not None and len(self.current.reconfiguration_errors) < 10:
            self.current.reconfiguration_errors.append(done.error[:500])  # the running plan serves on
        if not done.new_generation:
            return
        r = self.current
        r.generation = done.generation
        if done.error is not None:  # failed mid-way: the running plan is back (or an interim one serves)
            self.ctl.log(f"{self.app.name}: the {source} plan was not applied; generation "
                         f"{done.generation} serves")
            return
        r.reconfigurations += 1
        r.reconfiguration_seconds += done.seconds
        r.changed_gpus = sorted(set(r.changed_gpus) | set(done.changed_gpus))
        self.ctl.log(f"{self.app.name}: generation {done.generation} serves the {source} plan "
                     f"({new.slices_used} slices, {done.processes} processes, "
                     f"planned {new.planned_rps:.1f} rps, "
                     f"changed GPUs {list(done.changed_gpus) or 'none'}) after {done.seconds:.2f} s; "
                     f"draining generation {done.previous}")

    def record_error(self, why: str) -> None:
        if len(self.current.planner_errors) < 10:
            self.current.planner_errors.append(why[:500])
        self.counters.count_planner_failure(self.app.name)

    # ---- what the admin endpoint drives ------------------------------------------------------
    async def replan(self, demand_rps: float, *, as_asked: bool = False) -> Plan:
        """Re-plan the node now with this app at ``demand_rps``; the app's plan serving afterwards.
        ``as_asked``: an operator's explicit demand, planned without the burst floor."""
        await self.ctl.replan({self.app.name: demand_rps}, trigger="admin",
                              as_asked=frozenset({self.app.name}) if as_asked else frozenset())
        return self.plan

    def restart_bins(self, history_rps: list[float] | None = None) -> None:
        """Start bin 0 of the node now (a replay aligns its bins with the daemon's), optionally
        seeding this app's history."""
        self.ctl.restart_bins({self.app.name: history_rps} if history_rps is not None else None)

    def on_capacity_lost(self, why: str) -> None:
        self.ctl.on_capacity_lost(self.app.name, why)

    def history(self) -> list[dict[str, Any]]:
        return [r.to_json() for r in self.records]


class NodeController(NeededPlans):
    """Closes every app's bins on one clock and re-plans all the node's apps in one decision."""

    def __init__(self, apps: Sequence[App], plane: DataPlane, bins: BinSource, *, space: str | None,
                 bin_seconds: float, time_scale: float, executor: ThreadPoolExecutor,
                 solver: Solver = default_solver, anytime: str = "auto",
                 predictors: Mapping[str, Predictor] | None = None,
                 log: Callable[[str], None] = print, room: RoomPolicy | None = None) -> None:
        if anytime not in ANYTIME_MODES:
            raise ValueError(f"anytime must be one of {', '.join(ANYTIME_MODES)}, got {anytime!r}")
        if not apps:
            raise ValueError("a node controller needs at least one app")
        self.node = plane.node
        self.plane = plane
        self.counters = bins
        self.space = space
        self.bin_seconds = bin_seconds
        self.time_scale = time_scale
        self.executor = executor
        self.solver = solver
        self.anytime = anytime
        self.log = log
        self.stats = ControllerStats()
        self.time_limit_s = min(self.node.planner.time_limit_s, 0.4 * bin_seconds)
        self.lock = asyncio.Lock()  # one node re-plan + reconfiguration at a time
        self.bin_index = 0
        self.bin_start = time.monotonic()
        self.apps: dict[str, AppController] = {}
        for a in apps:
            self.apps[a.name] = AppController(a, self, (predictors or {}).get(a.name))
        self._task: asyncio.Task[None] | None = None
        self._replan_task: asyncio.Task[Any] | None = None
        self._ahead_bin: int | None = None  # the bin whose successor's re-plan has started
        self._routine_for: int | None = None  # a routine re-plan put off while another ran: its bin
        self._extended_first: list[str] = []  # the running re-plan's apps extended in place at once
        self._phases_s: Counter[str] = Counter()  # the running deployment's transitions, by phase
        self._trigger = ""  # the running re-plan's trigger
        self._for_bin: int | None = None  # and the bin it plans for (None: the running one)
        self._lost: dict[str, float] = {}  # capacity-loss re-plans waiting: app -> demand
        self.unloaded: dict[str, tuple[AppController, Plan]] = {}  # apps unloaded (Triton's repository)
        self._replan_s: float | None = None  # smoothed duration of recent re-plans (solve + reconfigure)
        # how a new plan makes room on the node (``control/transition.py``)
        self.room: RoomPolicy = room if room is not None else MakeRoom(self.node.control.drain_wait_slo)
        # app -> (running generation, the least rate a needed plan the headroom rule kept out over it)
        self._headroom_kept: dict[str, tuple[int, float]] = {}

    # ---- the clock ---------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        for t in (self._task, self._replan_task):
            if t is not None and not t.done():
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t

    def busy(self) -> bool:
        """A node re-plan is running (or about to): triggers wait for it."""
        return self.lock.locked() or (self._replan_task is not None and not self._replan_task.done())

    def restart_bins(self, histories: Mapping[str, list[float] | None] | None = None) -> None:
        """Start bin 0 now for every app, optionally seeding some apps' demand history."""
        for name, c in self.apps.items():
            history = (histories or {}).get(name)
            if history is not None:
                c.history_rps.clear()
                c.history_rps.extend(float(x) for x in history)
            self.counters.take_bin(name)
            c._arrival_samples.clear()
            c.records.clear()
        self.bin_index = 0
        self.bin_start = time.monotonic()
        self._ahead_bin = None
        self._routine_for = None
        for c in self.apps.values():
            c.open_bin()

    async def _run(self) -> None:
        for c in self.apps.values():
            c.open_bin()
        poll_s = max(0.05, min(0.5, self.bin_seconds / 20))
        while True:
            end = self.bin_start + self.bin_seconds
            now = time.monotonic()
            start_ahead = end - self.lead_s()
            ahead = self._ahead_bin == self.bin_index
            if not ahead and start_ahead <= now < end:
                self._ahead_bin = self.bin_index
                ahead = True
                self._spawn({n: c.predict_ahead() for n, c in self.apps.items()}, "bin", for_next_bin=True)
            if now < end:
                wake = start_ahead if not ahead and start_ahead > now else end
                await asyncio.sleep(min(poll_s, wake - now))
                self._check_early()
                continue
            self.close_bins()
            if not ahead:
                self._spawn({n: c.predict_next() for n, c in self.apps.items()}, "bin", for_next_bin=True)

    def close_bins(self) -> None:
        """Close every app's bin at the same instant and open the next."""
        elapsed = max(1e-9, time.monotonic() - self.bin_start)
        node_slices = sum(c.plan.slices_used for c in self.apps.values())
        for c in self.apps.values():
            c.close_bin(elapsed, node_slices)
        self.bin_index += 1
        self.bin_start += self.bin_seconds
        if time.monotonic() - self.bin_start > self.bin_seconds:  # the loop stalled: do not replay bins
            self.bin_start = time.monotonic()
        for c in self.apps.values():
            c.open_bin()

    def lead_s(self) -> float:
        """How long before a bin ends its successor's re-plan starts: what re-plans have taken lately.

        Solving and starting generations take seconds; started at the bin's end, the new plan
        would serve the next bin late by that much. Started this far ahead, with the bin so far
        standing in for its full count, it is in place at the boundary. At most half a bin.
        """
        if self._replan_s is None:
            return 0.0
        return min(0.5 * self.bin_seconds, LEAD_MARGIN * self._replan_s)

    def _routine_due(self) -> None:
        """Spawn the routine re-plan a busy node put off (``_spawn``), once nothing else runs."""
        if self._routine_for is None or self.busy():
            return
        target, self._routine_for = self._routine_for, None
        if target > self.bin_index:  # still ahead of its bin: the bin so far counts
            self._spawn({n: c.predict_ahead() for n, c in self.apps.items()}, "bin", for_next_bin=True)
        elif target == self.bin_index:
            self._spawn({n: c.predict_next() for n, c in self.apps.items()}, "bin")

    def _check_early(self) -> None:
        self._replan_lost()
        self._routine_due()
        demands: dict[str, float] = {}
        triggers: list[str] = []
        for name, c in self.apps.items():
            got = c.early_trigger()
            if got is None:
                continue
            trigger, why, demand = got
            c.current.early_replans += 1
            demands[name] = demand
            triggers.append(trigger)
            self.log(f"{name}: bin {self.bin_index}: {why}: re-planning the node early for {demand:.1f} rps")
        if demands:
            self._spawn(demands, "violations" if "violations" in triggers else "rate")

    async def set_app_enabled(self, app: str, enabled: bool) -> None:
        """Unload ``app`` (its generation drains and its slices go back to the node) or load it
        again (its last plan placed beside the others), then re-plan the node for the apps it
        serves; returns once the node serves the new state. Raises ``JigsawError`` with the
        reason when it cannot (the last app, a plan that does not fit or start)."""
        running = self._replan_task
        if running is not None and not running.done():  # the re-plan in flight ends first
            await asyncio.wait([running])
        async with self.lock:
            if not enabled:
                if app not in self.apps:
                    return
                if len(self.apps) == 1:
                    raise JigsawError(f"{app} is the node's last served app: unloading it would leave the "
                                      "node nothing to plan")
                c = self.apps.pop(app)
                self.unloaded[app] = (c, self.plane.plan_of(app))
                await self.plane.unload_app(app)
            else:
                if app not in self.unloaded:
                    return
                c, plan = self.unloaded[app]
                await self.plane.load_app(c.app, plan)
                del self.unloaded[app]
                self.counters.take_bin(app)
                c.open_bin()
                self.apps[app] = c
        self.log(f"{app}: {'loaded' if enabled else 'unloaded'}; re-planning the node")
        self._spawn({}, "repository")

    def on_capacity_lost(self, app: str, why: str) -> None:
        """A worker is gone for good: re-plan now (that app's plan runs as a fresh generation)."""
        c = self.apps.get(app)
        if c is None:
            return
        demand = c.capacity_demand()
        self.log(f"{app}: capacity lost ({why}): re-planning the node for {demand:.1f} rps")
        self._lost[app] = demand
        self._replan_lost()

    def _replan_lost(self) -> None:
        """Spawn the capacity-loss re-plan, now or at the next poll if a re-plan is running."""
        if self._lost and not self.busy():
            lost, self._lost = self._lost, {}
            self._spawn(lost, "capacity", fresh=frozenset(lost))

    def _spawn(self, demands: dict[str, float], trigger: str, *, for_next_bin: bool = False,
               fresh: frozenset[str] = frozenset()) -> None:
        # ahead of the bin's end the plan is for the next bin; after it (or early) for this one
        target = self.bin_index + 1 if for_next_bin and time.monotonic() < self.bin_start + self.bin_seconds \
            else self.bin_index
        if self._replan_task is not None and not self._replan_task.done():
            # the previous re-plan still runs. A bin's routine re-plan is not dropped: it runs, with
            # a fresh prediction, as soon as that one is done (``_routine_due``); skipped, the bin
            # ran on the plan of two bins before, which on a busy node (re-plans of 5-10 s against
            # 5 s bins) was how a predicted spike met the plan made for the quiet bin before it
            if trigger == "bin":
                self._routine_for = max(self._routine_for or 0, target)
            return
        self._replan_task = asyncio.get_running_loop().create_task(
            self.replan(demands, for_bin=target, fresh=fresh, trigger=trigger))

    # ---- one node-wide decision ----------------------------------------------------------------
    async def replan(self, demands: Mapping[str, float], *, for_bin: int | None = None,
                     fresh: frozenset[str] = frozenset(), trigger: str = "admin",
                     as_asked: frozenset[str] = frozenset()) -> NodePlan | None:
        """Re-plan every app of the node, ``demands`` for those given and the rest at the demand
        they were planned for; deploy the quick plan when it is needed, then the exact one.

        ``for_bin``: the bin the plan is for (default: the running one); that bin's record gets
        the prediction and the plan once it runs. ``fresh``: apps whose plan runs on new processes
        even when it runs the same instances (a worker was given up). ``as_asked``: apps whose
        given demand is an operator's, planned without the burst floor. Returns the node plan
        deployed last (None when nothing was).

        A re-plan that finds no plan at all is asked once more at a share of every app's demand
        where the deployment policy says so (``deployment.retry_share``).
        """
        got, found = await self._replan_once(demands, for_bin=for_bin, fresh=fresh, trigger=trigger,
                                             as_asked=as_asked)
        share = retry_share(found, trigger, bool(as_asked), self.node.control)
        if share is None:
            return got
        smaller = {n: share * max(c.floor_rps, float(demands[n]) if n in demands else c.predicted_rps)
                   for n, c in self.apps.items()}
        self.log(f"node: no plan for the demands; re-planning once at {share:.0%} of them "
                 f"({self._demands_text(smaller)})")
        again, _ = await self._replan_once(smaller, for_bin=for_bin, fresh=fresh, trigger=trigger)
        return again or got

    async def _replan_once(self, demands: Mapping[str, float], *, for_bin: int | None,
                           fresh: frozenset[str], trigger: str, as_asked: frozenset[str] = frozenset()
                           ) -> tuple[NodePlan | None, bool]:
        """``replan``'s one attempt: (the node plan deployed last or None, whether the planner found
        any plan, quick or exact, for the demands). The deployment policy
        (``deployment.next_action``) picks each action from what the re-plan has seen; this
        executes it and records what it did."""
        async with self.lock:
            t0 = time.monotonic()
            self.stats.replans[trigger] += 1
            # every plan holds at least a small burst (``control.burst_requests``), unless an
            # operator asked for exactly this demand
            full = {n: max(0.0 if n in as_asked else c.floor_rps,
                           float(demands[n]) if n in demands else c.predicted_rps)
                    for n, c in self.apps.items()}
            exact_f, quick_box = self._start_solve(full, asyncio.get_running_loop())
            entry: dict[str, Any] = {"trigger": trigger, "for_bin": for_bin, "quick": None, "exact": None}
            if for_bin is not None and for_bin > self.bin_index:  # a routine re-plan: decided ahead
                entry["ahead_s"] = round(max(0.0, self.bin_start + self.bin_seconds - t0), 4)
            self._extended_first = []
            self._trigger = trigger
            self._for_bin = for_bin
            r = Replan(trigger, self.anytime, full)
            quick = await self._first_needed(exact_f, quick_box, trigger, for_bin, t0)
            if quick is not None:
                r, fresh = await self._act(dataclasses.replace(r, quick=quick), fresh, entry, t0)
            try:
                exact = await exact_f
            except Exception as exc:  # a planner failure keeps the running plans (or the quick one)
                self._planner_failed(exc)
                entry["error"] = f"{type(exc).__name__}: {exc}"[:500]
                self._record(entry, full, t0)
                return r.deployed, r.deployed is not None
            if entry["quick"] is None and quick_box.done():  # found, but the exact one came first
                entry["quick"] = self._summary(quick_box.result(), False)
                r = dataclasses.replace(r, quick=quick_box.result(), quick_decided=True)
            for n, c in self.apps.items():
                c.predicted_rps = full[n]
                if for_bin is None or for_bin == self.bin_index:  # else open_bin copies it over
                    c.current.predicted_rps = full[n]
            r, fresh = await self._act(dataclasses.replace(r, exact=exact), fresh, entry, t0, quick_box)
            took = time.monotonic() - t0
            self._replan_s = took if self._replan_s is None else 0.5 * (self._replan_s + took)
            if for_bin is None or for_bin == self.bin_index:
                for c in self.apps.values():
                    c.current.plan = plan_summary(c.plan)
            self._record(entry, full, t0)
            return r.deployed, r.deployed is not None or bool(exact.plans) or quick_box.done()

    async def _act(self, r: Replan, fresh: frozenset[str], entry: dict[str, Any], t0: float,
                   quick_box: asyncio.Future[NodePlan] | None = None) -> tuple[Replan, frozenset[str]]:
        """Execute the deployment policy's actions (``next_action``) until it has none left now;
        the re-plan as seen after them, and the apps still to run on fresh processes. A quick plan
        that lands in ``quick_box`` meanwhile is seen by the next decision."""
        while True:
            if r.quick is None and quick_box is not None and quick_box.done():
                r = dataclasses.replace(r, quick=quick_box.result(), quick_decided=True)
            a = next_action(r, {n: c.plan for n, c in self.apps.items()}, self.node.control, self.node)
            if a is None:
                return r, fresh
            if isinstance(a, Skip):
                r = self._skipped(a, r, entry)
            elif isinstance(a, Extend):
                pushed = await self._extend_refused(a.apps, r.demands, fresh, entry)
                r = dataclasses.replace(r, extended=True, deployed=pushed or r.deployed)
            elif a.why == "after_refusal":
                better = sorted(a.plan.plans)
                self.log(f"node: the exact plan of {', '.join(better)} was refused; the quick plan serves "
                         "meanwhile (it keeps the running instances)")
                self._phases_s = Counter()
                out = await self._deploy(a.plan, fresh & frozenset(better), "quick", r.demands)
                self._count_quick_deployed(r, entry, a.plan)
                entry["quick"].update(kept=out.kept, after_refusal=better)
                self._mark(entry["quick"], "quick", out, t0)
                r = dataclasses.replace(r.refusing("quick", out.refused), after_refusal=True,
                                        deployed=r.quick)
            else:
                summary = entry[a.source] = self._summary(a.plan, True)
                if a.source == "exact":
                    for note in a.plan.notes:
                        self.log(f"node: {note}")
                self._phases_s = Counter()
                out = await self._deploy(a.plan, fresh, a.source, r.demands)
                summary["kept"] = out.kept
                self._mark(summary, a.source, out, t0)
                r = dataclasses.replace(r.refusing(a.source, out.refused), deployed=a.plan,
                                        quick_decided=True,
                                        quick_deployed=r.quick_deployed or a.source == "quick",
                                        exact_decided=a.source == "exact")
                if a.source == "quick":  # its new generations are the fresh ones
                    fresh = frozenset()

    def _skipped(self, a: Skip, r: Replan, entry: dict[str, Any]) -> Replan:
        """Record the ``Skip`` the deployment policy decided."""
        if a.source == "quick":
            assert r.quick is not None
            entry["quick"] = self._summary(r.quick, False)
            return dataclasses.replace(r, quick_decided=True)
        assert r.exact is not None
        entry["exact"] = self._summary(r.exact, False)
        if not r.exact.plans:
            self.log(f"node: no configuration for {self._demands_text(r.demands)} ({r.exact.status}; "
                     f"{'; '.join(r.exact.notes)}); keeping the running plans")
        else:
            self.log(f"node: the exact solve stopped {r.exact.status} at a worse objective than the quick "
                     "plan's; keeping the quick plan")
        return dataclasses.replace(r, exact_decided=True)

    def _mark(self, summary: dict[str, Any], source: str, pushed: Pushed, t0: float) -> None:
        """Record what the push of a plan counted as deployed did (``outcome.mark``): from the
        re-plan's decision (its trigger) to its deployment and where the transitions' part of it
        went (``applied.PHASES``), or kept, with why, and counted as not deployed."""
        if not mark(summary, pushed, time.monotonic() - t0, dict(self._phases_s)):
            self.stats.plans[(source, True)] -= 1
            self.stats.plans[(source, False)] += 1

    def _count_quick_deployed(self, r: Replan, entry: dict[str, Any], part: NodePlan) -> None:
        """The quick plan, deployed after a refusal: counted and summarised as deployed."""
        assert r.quick is not None
        if entry["quick"] is None:
            entry["quick"] = self._summary(r.quick, True)
        else:  # summarised as not deployed when the exact plan came first
            self.stats.plans[("quick", False)] -= 1
            self.stats.plans[("quick", True)] += 1
            entry["quick"]["deployed"] = True

    def _start_solve(self, full: Mapping[str, float], loop: asyncio.AbstractEventLoop
                     ) -> tuple[asyncio.Future[NodePlan], asyncio.Future[NodePlan]]:
        """Start the node's solve for ``full`` in the executor: (the exact plan's future, the box
        the quick plan lands in when the planner hands one over first)."""
        factors = {n: f for n, c in self.apps.items() if (f := c.measured_factors())}
        quick_box: asyncio.Future[NodePlan] = loop.create_future()

        def on_quick(p: NodePlan) -> None:  # called in the planner's thread
            loop.call_soon_threadsafe(lambda: quick_box.done() or quick_box.set_result(p))
        call = functools.partial(
            self.solver, [c.app for c in self.apps.values()], self.node, self.plane.profiles, full,
            space=self.space, previous={n: c.plan for n, c in self.apps.items()},
            time_limit_s=self.time_limit_s, factors=factors or None,
            on_quick=None if self.anytime == "off" else on_quick)
        return loop.run_in_executor(self.executor, call), quick_box

    async def _first_needed(self, exact_f: asyncio.Future[NodePlan], quick_box: asyncio.Future[NodePlan],
                            trigger: str, for_bin: int | None, t0: float) -> NodePlan | None:
        """The quick plan if it is in hand when a plan is needed (``deployment.quick_need_by``) and
        the exact one is not, else None."""
        need_by = quick_need_by(self.anytime, trigger, t0, QUICK_PATIENCE_S, for_bin, self.bin_index,
                                self.bin_start + self.bin_seconds)
        if need_by is None:
            return None
        wait_s = need_by - time.monotonic()
        if wait_s > 0:
            await asyncio.wait({exact_f}, timeout=wait_s)
        if self.anytime == "always":
            await asyncio.wait({exact_f, quick_box}, return_when=asyncio.FIRST_COMPLETED)
            return quick_box.result() if quick_box.done() else None
        if exact_f.done():
            return None
        await asyncio.wait({exact_f, quick_box}, return_when=asyncio.FIRST_COMPLETED)
        return None if exact_f.done() or not quick_box.done() else quick_box.result()

    async def _extend_refused(self, apps: tuple[str, ...], demands: Mapping[str, float],
                              fresh: frozenset[str], entry: dict[str, Any]) -> NodePlan | None:
        """``Extend``: each of ``apps`` (refused in this re-plan, its running plan short of its
        demand) gets its running plan extended in place for the largest fraction of the demand
        that packs beside every running instance (``node_plan.extend_in_place``), when that serves
        more than the running plan. Returns the node plan pushed, or None.

        Why: a spike's exact and quick plans (the greedy's, once the running plan extended for the
        whole spike no longer fits beside itself) both reuse the running instances' slots, and a
        small running plan cannot be drained for them without leaving the app no lane: on
        ar_assistant's peak window every plan of the second spike was refused for that, twice per
        re-plan over three bins, and 560-710 req/s met the 8-slice plan for 155 (30% and 79% of
        the bins' requests violated). The plan kept in place serves 75% of that spike.
        """
        pushed: dict[str, Plan] = {}
        for name in apps:
            p = await self._extend_in_place(name, float(demands[name]), fresh, "its plans were refused")
            if p is not None:
                pushed[name] = p
        entry["in_place"] = {n: {"slices_used": p.slices_used, "planned_rps": round(p.planned_rps, 3)}
                             for n, p in pushed.items()} or None
        if not pushed:
            return None
        running = {n: c.plan for n, c in self.apps.items()}
        return NodePlan(node=self.node.name, objective_kind=self.node.planner.objective, status=QUICK_STATUS,
                        feasible=False, objective=0.0, gap=math.inf,
                        slices_used=sum(p.slices_used for p in running.values()),
                        slices_available=self.node.slices_available, solve_seconds=0.0, plans=pushed)

    async def _apply(self, desired: DesiredState, source: str, need: Callable[[], Need] = lambda: NEEDED,
                     *, record_error: bool = True) -> tuple[Applied, RoomStep | None] | None:
        """Move one app to ``desired`` (``transition.transit``: the making-room policy decides each
        step on the runtime's snapshot and ``need``) and record what was done with its ``source``
        plan, and the step that ended the transition; None when the runtime could not lay it out
        (logged, and with ``record_error`` kept in the bin's record): the running plan serves on."""
        c = self.apps[desired.app]
        try:
            done, last = await transit(self.plane, desired, self.room, need)
        except Exception as exc:  # a plan the runtime cannot lay out: keep the running one
            if record_error:
                c.record_error(f"{type(exc).__name__}: {exc}")
            self.log(f"{desired.app}: the {source} plan was not applied ({type(exc).__name__}: {exc})")
            return None
        if isinstance(last, KeepRunning) and last.headroom_rps is not None:
            # a later plan past this by RISING_MARGIN over the same generation: a spike still rising
            self._headroom_kept[desired.app] = (done.generation, last.headroom_rps)
        c.record_applied(done, desired.plan, source)
        self._phases_s.update(dict(done.phases_s))
        return done, last

    async def _deploy(self, np: NodePlan, fresh: frozenset[str], source: str,
                      demands: Mapping[str, float]) -> Pushed:
        """Push every app's part of ``np`` as its DesiredState (apps that shrink first), as the
        deployment policy decides for each (``deployment``: ``settle``, ``better_only``,
        ``for_needed``, ``short_of_gain``); apps that keep their running plan are pushed it again,
        a no-op. Returns what each app's push did (``outcome.Pushed``: the apps kept, those whose
        plan the making-room policy refused, ``Refuse``: nothing changed, those that moved)."""
        delay = self.repartition_delay_s()
        plans, kept = settle(np, {n: c.plan for n, c in self.apps.items()}, demands, self.node, fresh)
        out = Pushed(kept=kept)
        order = sorted(plans.items(), key=lambda kv: kv[1].slices_used - self.apps[kv[0]].plan.slices_used)
        total = sum(p.slices_used for p in plans.values())
        for name, plan in order:
            c = self.apps[name]
            if not plan.instances:
                self.log(f"{name}: the {source} node plan has no configuration for it ({plan.status}); "
                         "keeping its running plan")
                out.why_kept[name] = f"no configuration for it ({plan.status})"
                continue
            run, demand = c.plan, float(demands[name])
            holds = better_only(run, plan, demand, total, self.node.slices_available, name in fresh)
            placed: BesidePlaced | None = None
            if name not in fresh and bool(run.instances) and self._trigger != "admin" \
                    and (run.max_demand_plan or run.planned_rps < demand * (1 - 1e-9)):
                extended = len(self._extended_first)
                placed, not_pushed = await self._needed_beside(name, plan, demand, fresh, source)
                if not_pushed:  # its running plan extended in place at once, or serving on
                    if len(self._extended_first) > extended:
                        out.changed.append(name)
                    else:
                        out.why_kept[name] = "its running plan, extended in place in this re-plan, serves on"
                    continue
            if placed is None and short_of_gain(run, plan, demand, total, self.node.slices_available,
                                                self.node.control.short_plan_min_gain, name in fresh,
                                                self._trigger):
                self.log(f"{name}: the new plan serves {plan.planned_rps:.1f} of {demand:.1f} rps, less than "
                         f"{self.node.control.short_plan_min_gain:.0%} more than the running plan's "
                         f"{run.planned_rps:.1f}: keeping the running plan")
                kept.append(name)
                out.why_kept[name] = "the new plan serves too little more than the running one"
                continue
            desired = DesiredState(name, plan, repartition_delay_s=delay, fresh_generation=name in fresh)
            if placed is not None:
                desired = dataclasses.replace(desired, plan=placed.plan, beside=True,
                                              over_draining=placed.over_draining,
                                              placed=Placed(placed.seen, placed.layout))
            got = await self._apply(desired, source, self._need_reader(c, plan, demand, holds))
            out.note(name, *(got or (None, None)), same_plan=name in kept)
            if got is None:
                continue
            done, last = got
            if not isinstance(last, Refuse) and done.note is not None and holds:
                await self._trim_running(name, plan, demands[name], delay)
        return out

    def _summary(self, np: NodePlan, deployed: bool) -> dict[str, Any]:
        source = "quick" if np.status == QUICK_STATUS else "exact"
        self.stats.plans[(source, deployed)] += 1
        self.stats.last_seconds[source] = np.solve_seconds
        return {"status": np.status, "slices_used": np.slices_used, "seconds": round(np.solve_seconds, 4),
                "deployed": deployed, "demand_scale": round(np.demand_scale, 6),
                "apps": {n: p.slices_used for n, p in np.plans.items()}}

    def _record(self, entry: dict[str, Any], demands: Mapping[str, float], t0: float) -> None:
        entry["seconds"] = round(time.monotonic() - t0, 4)
        if self._extended_first:  # apps whose plan went out as the running plan extended in place
            entry["in_place_first"] = sorted(set(self._extended_first))
        for n, c in self.apps.items():
            if len(c.current.replans) < MAX_REPLANS_RECORDED:
                c.current.replans.append(dict(entry, demand_rps=round(demands[n], 3)))

    @staticmethod
    def _demands_text(demands: Mapping[str, float]) -> str:
        return ", ".join(f"{n} {d:.1f} rps" for n, d in demands.items())

    def _planner_failed(self, exc: BaseException) -> None:
        why = f"{type(exc).__name__}: {exc}"
        self.log(f"node: re-plan failed ({why}); keeping the running plans")
        for c in self.apps.values():
            c.record_error(why)

    def repartition_delay_s(self) -> float:
        """The emulated MIG repartition time in wall seconds: x time scale, and compressed with the bins.

        With bins compressed (``--bin-seconds`` below ``control.bin_seconds`` x time scale), the delay
        keeps its share of a bin, as on the full-speed node; otherwise it is the node's delay x K.
        """
        nominal_s = self.node.control.bin_seconds * self.time_scale
        compression = min(1.0, self.bin_seconds / nominal_s) if nominal_s > 0 else 1.0
        return self.node.control.repartition_delay_s * self.time_scale * compression
