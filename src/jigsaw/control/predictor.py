"""Demand prediction for the next bin: pluggable; the spike profile by default, or the paper's mean."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from jigsaw.control import spikes


class Predictor(Protocol):
    """Predicts the next bin's demand (requests/s) from the observed demand of past bins."""

    def predict(self, history_rps: Sequence[float]) -> float: ...


class MeanSlackPredictor:
    """Mean of the last ``window`` bins times ``1 + slack`` (JigsawServe section 4.2).

    With fewer bins than the window it averages those it has; with none it returns ``default_rps``
    (the demand the daemon was started for), so the first plan is not a plan for zero.
    """

    def __init__(self, window: int = 5, slack: float = 0.05, default_rps: float = 0.0) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if slack < 0:
            raise ValueError(f"slack must be >= 0, got {slack}")
        self.window = window
        self.slack = slack
        self.default_rps = default_rps

    def predict(self, history_rps: Sequence[float]) -> float:
        recent = list(history_rps)[-self.window:]
        if not recent:
            return self.default_rps
        return sum(recent) / len(recent) * (1.0 + self.slack)


class SpikeProfilePredictor:
    """The mean + slack of the bins outside spikes; a running spike predicted from how high past
    spikes rose at its age; a spike's jump foreseen where the jumps recur with a period.

    A day of the Twitter trace has about ten spikes: within one bin demand jumps 2-4x, holds for one
    to three bins and falls back. The paper's mean of the last five bins sees each one a bin late,
    plans its second bin for half of it (a spike begins anywhere in its jump bin, so the jump bin
    holds only part of it: its second bin brought 0.6-1.6x the jump bin's demand), then holds the
    node at twice the level for the bins after it. Four rules over the history alone
    (``control/spikes.py``; no clock or calendar):

    - the base is the mean of the last ``window`` bins that belong to no spike, so a spike that
      has ended does not raise the bins after it;
    - while a spike runs (every bin since its jump at least ``SPIKE_LEVEL`` x the bin before it),
      its next bin (age k since the jump) is predicted at its base x the highest that the past
      spikes which lasted k bins reached at age k over their own bases (a spike's height over its
      base is steadier than its second bin over its jump bin), and never below its last bin;
    - a spike's second bin also at least at the level its jump bin implies had the spike begun in
      the bin's middle, its mean being half base and half spike: twice the jump bin less the base
      (the day's first spike has no past spike to go by);
    - otherwise, when the next bin falls on the phase of recurring jumps (for a period P up to
      ``max_period`` bins, at least ``min_hits`` past jumps on the next bin's phase, making at
      least ``hit_share`` of the cycles seen: 0.7, since on day 0 of the Twitter trace 0.6 let 2
      jumps in 3 cycles raise quiet bins to spike level), the last bin times the median of those
      jumps' ratios.

    It never predicts below the base (+ slack). ``bench/predictor.py`` measures it against the
    mean and the variants it replaced over every day of the trace (bench/README.md).
    """

    def __init__(self, window: int = 5, slack: float = 0.05, default_rps: float = 0.0, *,
                 max_period: int = 48, min_hits: int = 2, hit_share: float = 0.7) -> None:
        self.mean = MeanSlackPredictor(window, 0.0, default_rps)
        if slack < 0:
            raise ValueError(f"slack must be >= 0, got {slack}")
        self.slack = slack
        self.max_period = max_period
        self.min_hits = min_hits
        self.hit_share = hit_share

    def predict(self, history_rps: Sequence[float]) -> float:
        history = list(history_rps)
        found = spikes.spikes(history)
        inside = {i for s in found for i in s.bins(len(history))}
        base = self.mean.predict([x for i, x in enumerate(history) if i not in inside] or history)
        if found and found[-1].end is None:
            guess = self.running_spike_rps(history, found)
        else:
            guess = history[-1] * self.recurring_ratio(history, found) if history else 0.0
        return max(base, guess) * (1.0 + self.slack)

    @staticmethod
    def past_heights_rps(history: list[float], found: list[spikes.Spike]) -> float:
        """The running spike's next bin from the heights past spikes reached at its age (at
        least its last bin)."""
        run = found[-1]
        age = len(history) - run.start
        heights = [history[s.start + age] / s.base_rps for s in found[:-1]
                   if s.end is not None and s.end - s.start >= age and s.start + age < len(history)]
        return max([history[-1], *(run.base_rps * h for h in heights)])

    @staticmethod
    def running_spike_rps(history: list[float], found: list[spikes.Spike]) -> float:
        """The next bin of the running spike (the last of ``found``)."""
        run = found[-1]
        age = len(history) - run.start
        level = SpikeProfilePredictor.past_heights_rps(history, found)
        if age == 1:  # the jump bin held the spike from its onset on: mid-bin, on average
            level = max(level, 2.0 * history[-1] - run.base_rps)
        return level

    def recurring_ratio(self, history: list[float], found: list[spikes.Spike]) -> float:
        """The median jump ratio when the next bin (index ``len(history)``) is on the phase of
        recurring spikes' jumps, else 0."""
        nxt = len(history)
        starts = [s.start for s in found]
        for period in range(2, self.max_period + 1):
            cycles = (nxt - 1) // period  # whole periods back from the next bin that the history covers
            hits = [j for j in starts if (nxt - j) % period == 0]
            if len(hits) >= self.min_hits and cycles and len(hits) / cycles >= self.hit_share:
                return spikes.quantile([history[j] / history[j - 1] for j in hits], 0.5)
        return 0.0


def rise_rps(predictor: Predictor, history_rps: Sequence[float], rate_rps: float, slack: float) -> float:
    """The demand an arrival rate above the plan calls for within a bin: the rate, or, where more,
    what ``predictor`` makes of it as the running bin's demand (without its ``slack``).

    Why: a spike begins within a bin; the rate trigger sees it there and, planning for the rate,
    met the spike's next bin (often 1.4x its jump bin) with a plan for the onset, while the
    bin's routine re-plan for the spike's level waited behind it (day 0, bins 90-91, beside a
    loaded machine: 1215 req/s planned, 1544 arriving, 16% violations). Read by the spike profile
    the rise is a spike, planned for the level it comes to in one re-plan, not two.
    """
    return max(rate_rps, predictor.predict([*history_rps, rate_rps]) / (1.0 + slack))


def make_predictor(kind: str, window: int, slack: float, default_rps: float) -> Predictor:
    """The node's ``control.predictor``: "profile" (``SpikeProfilePredictor``) or "mean" (the paper's)."""
    if kind == "mean":
        return MeanSlackPredictor(window, slack, default_rps)
    if kind == "profile":
        return SpikeProfilePredictor(window, slack, default_rps)
    raise ValueError(f"unknown predictor {kind!r} (choose profile or mean)")


def burst_floor_rps(latency_slo_ms: float, burst_requests: int) -> float:
    """The least demand a plan is made for so that ``burst_requests`` arriving at once are all
    answered within the SLO: they must be through the app's slowest stage in half the SLO (the
    other half is the path's own batch times). 0 when ``burst_requests`` is 0.

    Why: a node planned for a small demand runs one small instance per task; a burst of concurrent
    requests then queues several batches deep and times out while most slices sit idle. On the
    reference node this floor costs 1-2 slices for each example app.
    """
    if burst_requests <= 0 or latency_slo_ms <= 0:
        return 0.0
    return burst_requests / (0.5 * latency_slo_ms / 1000.0)
