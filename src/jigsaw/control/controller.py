"""The per-app controller: bins demand, predicts, re-plans off the loop, reconfigures by generations.

Every ``bin_seconds`` (wall time; the trace's 5-minute bins compressed) it closes the bin: observed
demand = arrivals / bin length x time_scale (requests/s of the full-speed node), the violation rate,
and the measured fan-out of each upstream variant. The predictor gives the next bin's demand (the
re-plan starts ahead of the bin's end by what re-plans have recently taken, ``lead_s``, so the plan
is in place at the boundary); the planner runs off the loop (a worker thread waits on the planner
child process of ``jigsaw.control.solver``, or calls the planner itself) with the running plan as
warm start, the mean measured factors of the last bins, and a time limit below the bin length. The
new plan is pushed to the data plane as a ``DesiredState``; the generation manager
(``jigsaw.runtime.generations``) applies it: a plan with the same instances only re-weights the
lanes in place, any other becomes a new *generation* of the app's processes (make-before-break),
with the emulated repartition delay the controller gives when a GPU's MIG layout changed. A bin
whose violation rate crosses ``control.replan_violation_rate`` triggers an early re-plan (once per
bin); so does, with ``control.replan_on_rate``, an arrival rate over the last ``RATE_WINDOW_BINS``
of a bin above what the running plan holds (its ``planned_rps``): the predictor's mean of past
bins sees a burst one bin late, the door sees it within a second. Either early re-plan is for
the recent observed rate (plus the planner's demand slack), not the old prediction, at most
``RATE_JUMP_MAX`` x the last bin's demand (a stalled loop's backlog of arrivals reads as a
burst), and after violations never less than the plan holds. When the
supervisor gives up on a worker (capacity lost), the app re-plans at once onto a fresh generation. A
planner that fails or times out leaves the running plan serving; the bin's record and
``jigsaw_planner_failures_total`` report it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from jigsaw.app import App
from jigsaw.control.predictor import Predictor, burst_floor_rps, make_predictor
from jigsaw.node import Node
from jigsaw.plan import Plan
from jigsaw.profiles import ProfileTable
from jigsaw.runtime.admission import BinCounters
from jigsaw.runtime.generations import Applied, DesiredState

LEAD_MARGIN = 1.25  # a re-plan ahead of a bin's end starts this many recent re-plan durations early
HISTORY_MAX_BINS = 20000  # bounded memory: about 70 days of 5-minute bins per app
MIN_ANSWERED_FOR_TRIGGER = 20  # an early re-plan needs this many answers in the bin
MIN_ARRIVALS_FOR_RATE = 20  # the rate trigger needs this many arrivals in its window
RATE_WINDOW_BINS = 0.1  # the rate trigger's window, a share of the bin (at least two polls)
# An early re-plan asks for at most this many times the last bin's demand: a day's spikes jump 2-4x
# within a bin, while a loop that stalled a second counts the arrivals it held back in one short
# window and reads a rate ten times the real one.
RATE_JUMP_MAX = 4.0
Factors = dict[tuple[str, str, str], float]


class Solver(Protocol):
    def __call__(self, app: App, node: Node, profiles: ProfileTable, demand_rps: float, *,
                 space: str | None, previous: Plan | None, time_limit_s: float | None,
                 factors: Factors | None) -> Plan: ...


def default_solver(app: App, node: Node, profiles: ProfileTable, demand_rps: float, *,
                   space: str | None, previous: Plan | None, time_limit_s: float | None,
                   factors: Factors | None) -> Plan:
    from jigsaw.planner.milp import plan
    return plan(app, node, profiles, demand_rps, space=space, previous=previous,
                time_limit_s=time_limit_s, factors=factors)


class DataPlane(Protocol):
    """What the controller drives: the generation manager (``runtime.generations``)."""

    node: Node
    profiles: ProfileTable

    def plan_of(self, app: str) -> Plan: ...
    def generation_of(self, app: str) -> int: ...
    async def apply(self, desired: DesiredState) -> Applied: ...


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
    generation: int = 0
    reconfigurations: int = 0
    reconfiguration_seconds: float = 0.0
    changed_gpus: list[int] = field(default_factory=list)
    early_replans: int = 0
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
        return d


class AppController:
    """Closes bins, predicts, re-plans and reconfigures one app of a running daemon."""

    def __init__(self, app: App, plane: DataPlane, bins: BinSource, *, space: str | None, bin_seconds: float,
                 time_scale: float, executor: ThreadPoolExecutor, predictor: Predictor | None = None,
                 solver: Solver = default_solver, log: Callable[[str], None] = print) -> None:
        node = plane.node
        self.app = app
        self.plane = plane
        self.counters = bins
        self.node = node
        self.space = space
        self.bin_seconds = bin_seconds
        self.time_scale = time_scale
        self.executor = executor
        self.solver = solver
        self.log = log
        plan = plane.plan_of(app.name)
        self.predictor: Predictor = predictor or make_predictor(
            node.control.predictor, node.control.history_bins, node.planner.demand_slack, plan.demand_rps)
        self.floor_rps = burst_floor_rps(app.latency_slo_ms, node.control.burst_requests)
        self.history_rps: deque[float] = deque(maxlen=max(64, node.control.history_bins))
        self.factor_bins: deque[dict[tuple[str, str], float]] = deque(maxlen=node.control.history_bins)
        self.records: deque[BinRecord] = deque(maxlen=HISTORY_MAX_BINS)
        self.time_limit_s = min(node.planner.time_limit_s, 0.4 * bin_seconds)
        self.lock = asyncio.Lock()  # one re-plan + reconfiguration at a time
        self.bin_index = 0
        self.bin_start = time.monotonic()
        self.current = self._new_record()
        self.predicted_rps = plan.demand_rps
        self._task: asyncio.Task[None] | None = None
        self._replan_task: asyncio.Task[None] | None = None
        self._lost_demand_rps: float | None = None
        self._replan_s: float | None = None  # smoothed duration of recent re-plans (solve + reconfigure)
        self._arrival_samples: deque[tuple[float, int]] = deque()  # (monotonic s, bin arrivals so far)

    @property
    def plan(self) -> Plan:
        return self.plane.plan_of(self.app.name)

    def _new_record(self) -> BinRecord:
        return BinRecord(self.app.name, self.bin_index, time.time(), self.bin_seconds,
                         generation=self.plane.generation_of(self.app.name))

    # ---- bins ----------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        for t in (self._task, self._replan_task):
            if t is not None and not t.done():
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t

    def restart_bins(self, history_rps: list[float] | None = None) -> None:
        """Start bin 0 now (a replay aligns its bins with the daemon's), optionally seeding history."""
        if history_rps is not None:
            self.history_rps.clear()
            self.history_rps.extend(float(x) for x in history_rps)
        self.counters.take_bin(self.app.name)
        self._arrival_samples.clear()
        self.records.clear()
        self.bin_index = 0
        self.bin_start = time.monotonic()
        self.current = self._new_record()
        self.current.predicted_rps = self.predicted_rps
        self.current.plan = plan_summary(self.plan)

    async def _run(self) -> None:
        self.current.plan = plan_summary(self.plan)
        self.current.predicted_rps = self.predicted_rps
        poll_s = max(0.05, min(0.5, self.bin_seconds / 20))
        ahead = False  # the next bin's plan is on its way
        while True:
            end = self.bin_start + self.bin_seconds
            now = time.monotonic()
            start_ahead = end - self.lead_s()
            if not ahead and now >= start_ahead and now < end:
                ahead = True
                self._spawn_replan(self.predict_ahead(), early=False, for_next_bin=True)
            if now < end:
                wake = start_ahead if not ahead and start_ahead > now else end
                await asyncio.sleep(min(poll_s, wake - now))
                self._check_early()
                continue
            self._close_bin()
            if not ahead:
                self._spawn_replan(self.predict_next(), early=False, for_next_bin=True)
            ahead = False

    def lead_s(self) -> float:
        """How long before a bin ends its successor's re-plan starts: what re-plans have taken lately.

        Solving and starting a generation take seconds; started at the bin's end, the new plan
        would serve the next bin late by that much. Started this far ahead, with the bin so far
        standing in for its full count, it is in place at the boundary. At most half a bin.
        """
        if self._replan_s is None:
            return 0.0
        return min(0.5 * self.bin_seconds, LEAD_MARGIN * self._replan_s)

    def predict_ahead(self) -> float:
        """The next bin's prediction with the running bin's rate so far as its latest sample."""
        c = self.counters.peek_bin(self.app.name)
        elapsed = time.monotonic() - self.bin_start
        history = list(self.history_rps)
        if c is not None and elapsed > 0:
            history.append(c.arrivals / elapsed * self.time_scale)
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

    def _close_bin(self) -> None:
        c = self.counters.take_bin(self.app.name)
        r = self.current
        elapsed = max(1e-9, time.monotonic() - self.bin_start)
        r.demand_rps = c.arrivals / elapsed * self.time_scale
        r.answered += c.answered
        r.violations += c.violations
        r.violation_rate = r.violations / r.answered if r.answered else 0.0
        measured = {k: kids / items for k, (items, kids) in c.children.items() if items > 0}
        if measured:
            self.factor_bins.append(measured)
        r.factors = {f"{t}/{v}": round(x, 4) for (t, v), x in measured.items()}
        self.history_rps.append(r.demand_rps)
        self.records.append(r)
        self.bin_index += 1
        self.bin_start += self.bin_seconds
        if time.monotonic() - self.bin_start > self.bin_seconds:  # the loop stalled: do not replay bins
            self.bin_start = time.monotonic()
        self._arrival_samples.clear()
        self.current = self._new_record()
        self.current.predicted_rps = self.predicted_rps
        self.current.plan = plan_summary(self.plan)

    def recent_rate_rps(self, arrivals: int) -> tuple[float, int]:
        """(full-speed rate over the last ``RATE_WINDOW_BINS`` of the bin, arrivals in that window).

        Sampled at every poll; until the window is covered, the bin so far stands in for it, and
        before the bin is a window old there is no rate yet ``(0, 0)``: a few arrivals bunched in
        a fraction of a second are noise, not a burst.
        """
        now = time.monotonic()
        samples = self._arrival_samples
        samples.append((now, arrivals))
        window_s = RATE_WINDOW_BINS * self.bin_seconds
        while len(samples) > 2 and now - samples[1][0] >= window_s:
            samples.popleft()
        t0, a0 = samples[0]
        if now - t0 < window_s:
            t0, a0 = self.bin_start, 0
        if now - t0 < window_s:
            return 0.0, 0
        dt = now - t0
        return (arrivals - a0) / dt * self.time_scale, arrivals - a0

    def _check_early(self) -> None:
        self._replan_lost()
        threshold = self.node.control.replan_violation_rate
        c = self.counters.peek_bin(self.app.name)
        if c is None:
            return
        recent_rps, recent_n = self.recent_rate_rps(c.arrivals)
        if self.current.early_replans or self.lock.locked():
            return
        slack = 1.0 + self.node.planner.demand_slack
        elapsed = max(1e-3, time.monotonic() - self.bin_start)
        so_far = c.arrivals / elapsed * self.time_scale
        answered = self.current.answered + c.answered
        violations = self.current.violations + c.violations
        holds_rps = self.plan.planned_rps
        floor_rps = 0.0
        if answered >= MIN_ANSWERED_FOR_TRIGGER and violations / answered > threshold:
            why = f"{violations}/{answered} SLO violations (> {threshold:.0%})"
            # violations under a plan that holds the observed rate (a reconfiguration under way, a
            # burst that has passed) are no reason to plan for less: that would reconfigure again
            floor_rps = holds_rps
        elif (self.node.control.replan_on_rate and not self.plan.max_demand_plan
              and recent_n >= MIN_ARRIVALS_FOR_RATE and recent_rps > holds_rps * slack):
            why = f"arrivals at {recent_rps:.1f} rps, above the {holds_rps:.1f} rps the plan holds"
        else:
            return
        # against the last bin seen (what the plan holds when there is none): a cap against the
        # plan would let one misread raise the next cap with it
        base_rps = self.history_rps[-1] if self.history_rps and self.history_rps[-1] > 0 else holds_rps
        demand = min(max(recent_rps, so_far), RATE_JUMP_MAX * base_rps)
        demand = max(demand, floor_rps) * slack
        self.current.early_replans += 1
        self.log(f"{self.app.name}: bin {self.bin_index}: {why}: re-planning early for {demand:.1f} rps")
        self._spawn_replan(demand, early=True)

    def on_capacity_lost(self, why: str) -> None:
        """A worker is gone for good: re-plan now (the new plan runs as a fresh generation)."""
        elapsed = max(1e-3, time.monotonic() - self.bin_start)
        c = self.counters.peek_bin(self.app.name)
        so_far = (c.arrivals / elapsed * self.time_scale) if c is not None else 0.0
        demand = max(self.predicted_rps, so_far * (1.0 + self.node.planner.demand_slack))
        self.log(f"{self.app.name}: capacity lost ({why}): re-planning for {demand:.1f} rps")
        self._lost_demand_rps = demand
        self._replan_lost()

    def _replan_lost(self) -> None:
        """Spawn the capacity-loss re-plan, now or at the next poll if a re-plan is running."""
        if self._lost_demand_rps is not None and (self._replan_task is None or self._replan_task.done()):
            demand, self._lost_demand_rps = self._lost_demand_rps, None
            self._spawn_replan(demand, early=True, fresh=True)

    def _spawn_replan(self, demand_rps: float, *, early: bool, for_next_bin: bool = False,
                      fresh: bool = False) -> None:
        if self._replan_task is not None and not self._replan_task.done():
            return  # the previous re-plan still runs: the next bin end re-plans with fresher data
        # ahead of the bin's end the plan is for the next bin; after it (or early) for this one
        target = self.bin_index + 1 if for_next_bin and time.monotonic() < self.bin_start + self.bin_seconds \
            else self.bin_index
        self._replan_task = asyncio.get_running_loop().create_task(
            self.replan(demand_rps, for_bin=target, fresh=fresh))

    # ---- planning and reconfiguration ------------------------------------------------------
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

    async def replan(self, demand_rps: float, for_bin: int | None = None, *, fresh: bool = False) -> Plan:
        """Plan for ``demand_rps`` off the loop and reconfigure if the plan changed.

        ``for_bin``: the bin the plan is for (default: the running one); that bin's record gets
        the prediction and the plan once it runs. ``fresh``: run the plan on new processes even
        when it runs the same instances (a worker was given up).
        """
        async with self.lock:
            t0 = time.monotonic()
            loop = asyncio.get_running_loop()
            previous = self.plan
            factors = self.measured_factors() or None
            demand_rps = max(demand_rps, self.floor_rps)  # every plan holds a small burst
            call = functools.partial(self.solver, self.app, self.node, self.plane.profiles, demand_rps,
                                     space=self.space, previous=previous, time_limit_s=self.time_limit_s,
                                     factors=factors)
            try:
                new = await loop.run_in_executor(self.executor, call)
            except Exception as exc:  # a planner failure keeps the running plan
                self._planner_failed(exc)
                return previous
            self.predicted_rps = demand_rps
            mine = for_bin is None or for_bin == self.bin_index  # else _close_bin copies it over
            if mine:
                self.current.predicted_rps = demand_rps
            if not new.instances:
                self.log(f"{self.app.name}: no configuration for {demand_rps:.1f} rps ({new.status}); "
                         f"keeping the running plan")
                return previous
            try:
                await self.apply(new, fresh=fresh)
            except Exception as exc:  # a plan the runtime cannot lay out: keep the running one
                self._planner_failed(exc)
                return previous
            took = time.monotonic() - t0
            self._replan_s = took if self._replan_s is None else 0.5 * (self._replan_s + took)
            if mine or for_bin == self.bin_index:
                self.current.plan = plan_summary(self.plan)
            return self.plan

    def _planner_failed(self, exc: BaseException) -> None:
        why = f"{type(exc).__name__}: {exc}"
        self.log(f"{self.app.name}: re-plan failed ({why}); keeping the running plan")
        if len(self.current.planner_errors) < 10:
            self.current.planner_errors.append(why[:500])
        self.counters.count_planner_failure(self.app.name)

    async def apply(self, new: Plan, *, fresh: bool = False) -> None:
        """Push ``new`` to the data plane as the app's desired state and record what it took."""
        app = self.app.name
        done = await self.plane.apply(DesiredState(app, new, repartition_delay_s=self.repartition_delay_s(),
                                                   fresh_generation=fresh))
        if done.error is not None and len(self.current.reconfiguration_errors) < 10:
            self.current.reconfiguration_errors.append(done.error[:500])  # the running plan serves on
        if not done.new_generation:
            return
        r = self.current
        r.generation = done.generation
        r.reconfigurations += 1
        r.reconfiguration_seconds += done.seconds
        r.changed_gpus = sorted(set(r.changed_gpus) | set(done.changed_gpus))
        self.log(f"{app}: generation {done.generation} serves ({new.slices_used} slices, "
                 f"{done.processes} processes, planned {new.planned_rps:.1f} rps, "
                 f"changed GPUs {list(done.changed_gpus) or 'none'}) after {done.seconds:.2f} s; "
                 f"draining generation {done.previous}")

    def repartition_delay_s(self) -> float:
        """The emulated MIG repartition time in wall seconds: x time scale, and compressed with the bins.

        With bins compressed (``--bin-seconds`` below ``control.bin_seconds`` x time scale), the delay
        keeps its share of a bin, as on the full-speed node; otherwise it is the node's delay x K.
        """
        nominal_s = self.node.control.bin_seconds * self.time_scale
        compression = min(1.0, self.bin_seconds / nominal_s) if nominal_s > 0 else 1.0
        return self.node.control.repartition_delay_s * self.time_scale * compression

    def history(self) -> list[dict[str, Any]]:
        return [r.to_json() for r in self.records]
