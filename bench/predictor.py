"""Offline predictor bench: each demand predictor over every day of the trace, per example app.

    python bench/predictor.py [--trace twitter:../shared/data/twitter/workload.tbz2]
        [--apps traffic_analysis,social_media,ar_assistant] [--days A:B]
        [--peaks traffic_analysis=1610.1,social_media=6801.8,ar_assistant=690.9]
        [--tolerance 0.05] [--history day|trace] [--detail APP:DAY] [--predictors a,b]

Replays what the controller's predictor sees in ``bench/ablation.py``'s full-day runs, without a
node: each day's 5-minute bins scaled so the day's peak is the app's capacity (``--peaks``; by
default computed as the ablation does, ``planner.max_utilization`` 0.8 under ``ast``, about a
minute and a half of solving: pass the printed values to skip it), and for each bin the
prediction from the bins before it (``--history day``: that day's, as a day replay seeds it;
``trace``: the last 288 bins of the trace, as a node that has served since the trace began). The
plan's demand is the prediction raised to the app's burst floor (``control.burst_requests``) and
capped at its capacity, as the controller's. Per predictor and app, over every bin that had
arrivals: under-predictions (bins whose demand exceeds the plan's by more than ``--tolerance``),
those at load (demand at least half the capacity: where a short plan meets the capacity's
limits), the worst bin's demand / plan, the mean over-provisioning (plan / demand - 1 where the
plan is larger) and the planned / arrived requests. Seconds, not the 25 minutes of a replay; the
replay decides (the node re-plans within a bin on the rate; this bench does not).

Variants that left the product are kept here as classes (``VARIANTS``) to compare against.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from jigsaw.control import spikes  # noqa: E402
from jigsaw.control.predictor import (  # noqa: E402
    MeanSlackPredictor,
    Predictor,
    SpikeProfilePredictor,
    burst_floor_rps,
)
from jigsaw.traces import (  # noqa: E402
    DEFAULT_BIN_SECONDS,
    SECONDS_PER_DAY,
    bin_rates,
    load_trace,
    parse_bins,
    parse_trace_spec,
    scale_to_peak,
)

APPS = ("traffic_analysis", "social_media", "ar_assistant")
BINS_PER_DAY = SECONDS_PER_DAY // DEFAULT_BIN_SECONDS
HISTORY_BINS = 288  # the controller's history (control/controller.py, HISTORY_RPS_BINS)
WINDOW, SLACK = 5, 0.05  # control.history_bins, planner.demand_slack of examples/h100x4.toml
AT_LOAD = 0.5  # a bin at load: demand at least this share of the capacity


class RecurringSpikePredictor:
    """The predictor ``SpikeProfilePredictor`` replaced (control.predictor "recurring", with its
    ended spikes skipped and its spikes held): the mean + slack of the bins outside ended spikes;
    a spike's second bin at the jump bin x the 0.75 quantile of past spikes' second bin / jump bin;
    a spike past its second bin at least at its last bin; recurring jumps as the profile's."""

    def __init__(self, window: int, slack: float, default_rps: float) -> None:
        self.mean = MeanSlackPredictor(window, 0.0, default_rps)
        self.slack = slack
        self.period = SpikeProfilePredictor(window, slack, default_rps)

    def predict(self, history_rps: Sequence[float]) -> float:
        h = list(history_rps)
        js = spikes.jumps(h)
        if len(h) < 2 or not js:
            return self.mean.predict(h) * (1.0 + self.slack)
        ended: set[int] = set()
        for j in js:
            m = j
            while m + 1 < len(h) and h[m + 1] >= spikes.SPIKE_LEVEL * h[j - 1]:
                m += 1
            if m + 1 < len(h):
                ended.update(range(j, m + 1))
        base = self.mean.predict([x for i, x in enumerate(h) if i not in ended] or h)
        raised = h[-1] * self.period.recurring_ratio(h, [spikes.Spike(j, h[j - 1], None) for j in js])
        if js[-1] == len(h) - 1:
            tails = [h[j + 1] / h[j] for j in js[:-1]]
            raised = max(raised, h[-1] * max(1.0, spikes.quantile(tails, 0.75)) if tails else h[-1])
        elif all(x >= spikes.SPIKE_LEVEL * h[js[-1] - 1] for x in h[js[-1]:]):
            raised = max(raised, h[-1])
        return max(base, raised) * (1.0 + self.slack)


class LastBinPredictor:
    """The last bin + slack: the least-lag reference (no smoothing, no spike model)."""

    def __init__(self, window: int, slack: float, default_rps: float) -> None:
        self.slack = slack
        self.default_rps = default_rps

    def predict(self, history_rps: Sequence[float]) -> float:
        return (history_rps[-1] if history_rps else self.default_rps) * (1.0 + self.slack)


class NoOnsetPredictor(SpikeProfilePredictor):
    """The profile without its onset rule: a spike's second bin from past spikes' heights alone
    (and at least its jump bin)."""

    running_spike_rps = staticmethod(SpikeProfilePredictor.past_heights_rps)


class NoPeriodPredictor(SpikeProfilePredictor):
    """The profile without its recurring-jump rule."""

    def recurring_ratio(self, history: list[float], found: list[spikes.Spike]) -> float:
        return 0.0


def _strict(w: int, s: float, d: float) -> Predictor:
    return SpikeProfilePredictor(w, s, d, min_hits=3, hit_share=0.8)


# name -> factory(window, slack, default_rps); the product's control.predictor values first
VARIANTS: dict[str, Callable[[int, float, float], Predictor]] = {
    "mean": MeanSlackPredictor,
    "profile": SpikeProfilePredictor,
    "recurring": RecurringSpikePredictor,
    "no_onset": NoOnsetPredictor,
    "last": LastBinPredictor,
    "no_period": NoPeriodPredictor,
    "strict_period": _strict,
}


@dataclass
class Score:
    """One predictor's record over the bins of one app."""

    bins: int = 0
    under: int = 0
    spike_under: int = 0  # under-predicted bins of a running spike past its jump bin
    short: float = 0.0  # sum over bins of max(0, demand - plan)
    under_at_load: int = 0
    worst: float = 0.0  # the largest demand / plan
    worst_at: str = ""
    over_sum: float = 0.0  # sum over bins of max(0, plan / demand - 1)
    planned: float = 0.0
    arrived: float = 0.0
    details: list[str] = field(default_factory=list)

    def add(self, where: str, demand: float, plan: float, capacity: float, tolerance: float,
            detail: bool, in_spike: bool) -> None:
        self.bins += 1
        self.short += max(0.0, demand - plan)
        self.planned += plan
        self.arrived += demand
        self.over_sum += max(0.0, plan / demand - 1.0)
        ratio = demand / plan
        if ratio > 1.0 + tolerance:
            self.under += 1
            self.under_at_load += demand >= AT_LOAD * capacity
            self.spike_under += in_spike
            if detail:
                self.details.append(f"{where}: {demand:.0f} req/s against {plan:.0f} planned ({ratio:.2f}x)")
        if ratio > self.worst:
            self.worst, self.worst_at = ratio, where

    def row(self, name: str, days: int) -> str:
        return (f"| {name} | {self.under} ({self.under / max(1, days):.2f}/day) | {self.under_at_load} "
                f"| {self.spike_under} | {100 * self.short / max(1e-9, self.arrived):.2f} "
                f"| {self.worst:.2f} ({self.worst_at}) | {100 * self.over_sum / max(1, self.bins):.1f} "
                f"| {self.planned / max(1e-9, self.arrived):.3f} |")


def evaluate(bins: list[float], days: range, capacity: float, floor_rps: float,
             factory: Callable[..., Predictor], history: str, tolerance: float, detail_day: int | None,
             lag: float = 0.0) -> Score:
    """Score one predictor over ``days`` of the trace's bins, each day scaled to ``capacity``;
    ``lag``: the share of each trace bin the controller counts into its next bin (its bins lag
    the client's), so the history it predicts from is blurred by that much."""
    scaled: list[float] = []
    for d in range(days.stop):
        scaled += scale_to_peak(bins[d * BINS_PER_DAY:(d + 1) * BINS_PER_DAY], capacity)
    seen = [(1.0 - lag) * x + lag * (scaled[i - 1] if i else x) for i, x in enumerate(scaled)]
    score = Score()
    for d in days:
        first = d * BINS_PER_DAY
        predictor = factory(WINDOW, SLACK, scaled[first])
        running = {i for sp in spikes.spikes(scaled[first:first + BINS_PER_DAY])
                   for i in sp.bins(BINS_PER_DAY) if i > sp.start}
        for t in range(first + 1, first + BINS_PER_DAY):
            demand = scaled[t]
            if demand <= 0:
                continue
            start = first if history == "day" else max(0, t - HISTORY_BINS)
            plan = min(capacity, max(floor_rps, predictor.predict(seen[start:t])))
            score.add(f"day {d} bin {t - first}", demand, plan, capacity, tolerance, d == detail_day,
                      t - first in running)
    return score


def capacities(apps: Sequence[str]) -> dict[str, float]:
    """Each app's capacity under ``ast`` at the ablation's ``planner.max_utilization`` (0.8)."""
    from ablation import DEFAULT_MAX_UTILIZATION
    from replay import capacity_rps, node_with_settings
    node = node_with_settings(ROOT / "examples" / "h100x4.toml",
                              [f"planner.max_utilization={DEFAULT_MAX_UTILIZATION:g}"],
                              Path("/tmp") / "jigsaw-predictor-bench")
    return {a: capacity_rps(node, a) for a in apps}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/predictor.py", description=__doc__.splitlines()[0])
    twitter = ROOT.parent / "shared" / "data" / "twitter" / "workload.tbz2"
    if not twitter.exists():
        twitter = ROOT.parent.parent / "shared" / "data" / "twitter" / "workload.tbz2"
    p.add_argument("--trace", default=f"twitter:{twitter}")
    p.add_argument("--apps", default=",".join(APPS))
    p.add_argument("--days", default=None, help="A:B, the trace's full days (default: all)")
    p.add_argument("--peaks", default=None, help="APP=RPS,...: each app's capacity (default: solved)")
    p.add_argument("--tolerance", type=float, default=0.05,
                   help="a bin is under-predicted when its demand exceeds the plan's by more than this share")
    p.add_argument("--lag", type=float, default=0.0,
                   help="share of each bin the controller counts into the next (its bins lag the client's)")
    p.add_argument("--history", choices=("day", "trace"), default="day")
    p.add_argument("--predictors", default=",".join(VARIANTS), help=f"of {', '.join(VARIANTS)}")
    p.add_argument("--detail", default=None, metavar="APP:DAY", help="list that day's under-predicted bins")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    apps = [a for a in args.apps.split(",") if a]
    names = [n for n in args.predictors.split(",") if n]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"bench/predictor.py: --predictors: unknown {', '.join(unknown)} "
                         f"(choose from {', '.join(VARIANTS)})")
    from jigsaw.node import load_node
    node = load_node(ROOT / "examples" / "h100x4.toml")
    if args.peaks:
        peaks = {k: float(v) for k, _, v in (x.partition("=") for x in args.peaks.split(","))}
        missing = [a for a in apps if a not in peaks]
        if missing:
            raise SystemExit(f"bench/predictor.py: --peaks: no capacity for {', '.join(missing)}")
    else:
        peaks = capacities(apps)
        print("capacities (pass as --peaks):", ",".join(f"{a}={peaks[a]:.1f}" for a in apps))
    bins = bin_rates(load_trace(parse_trace_spec(args.trace)), DEFAULT_BIN_SECONDS)
    full_days = len(bins) // BINS_PER_DAY
    a, b = parse_bins(args.days, full_days)
    days = range(a, b)
    detail_app, _, detail_day = (args.detail or "").partition(":")
    print(f"{len(days)} days ({a}:{b}) of {args.trace}, history: {args.history}, lag {args.lag:g}, "
          f"under-prediction: demand > plan x {1 + args.tolerance:g}")
    for app in apps:
        floor = burst_floor_rps(node.app(app).latency_slo_ms, node.control.burst_requests)
        print(f"\n{app}: capacity {peaks[app]:.1f} req/s, burst floor {floor:.1f} req/s\n")
        print("| predictor | under-predicted bins | at load | in a spike past its jump | arrivals above "
              "the plan % | worst demand / plan | mean over-provisioning % | planned / arrived |")
        print("|---|---|---|---|---|---|---|---|")
        for name in names:
            t0 = time.perf_counter()
            score = evaluate(bins, days, peaks[app], floor, VARIANTS[name], args.history, args.tolerance,
                             int(detail_day) if detail_app == app and detail_day else None, args.lag)
            print(score.row(name, len(days)) + f" <!-- {time.perf_counter() - t0:.1f} s -->")
            for line in score.details:
                print(f"    {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
