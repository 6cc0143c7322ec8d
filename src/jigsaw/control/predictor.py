"""Demand prediction for the next bin: pluggable, the paper's moving mean + slack by default."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


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


JUMP_RATIO = 1.6  # a bin whose demand is this many times its predecessor's is a jump (a spike starts)
SPIKE_LEVEL = 1.3  # a spike lasts while demand stays this many times the bin before its jump


def _quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


class RecurringSpikePredictor:
    """The mean + slack, raised where the history says a spike comes: recurring jumps, and their tails.

    A day of the Twitter trace has about ten spikes: within one bin demand jumps 2-4x and stays
    high for one or two bins. The mean of the last bins sees each one a bin late, and the in-bin
    re-plan needs seconds of the spike bin. Two rules over the history alone (no clock, no
    calendar): (1) the jumps recur with a period: for each period P up to ``max_period`` bins, the
    past jumps that fall on the next bin's phase; when at least ``min_hits`` did and they make at
    least ``hit_share`` of the cycles seen (0.7: on day 0 of the Twitter trace, 0.6 let 2 jumps in
    3 cycles through and raised 8 quiet bins to spike level, each a large reconfiguration there and
    back; 0.7 raises 4 and misses 2 of the 10 spikes), the next bin is predicted at the last bin
    times the median jump ratio; (2) after a jump, the next bin is predicted at the jump's level
    times an upper quantile of what past spikes did in their second bin; (3) with ``hold_spikes``, a
    spike past its second bin (every bin since its jump at spike level) is predicted at least at its
    last bin. Otherwise (and never below) it is the mean. The mean leaves out the bins of spikes
    that have ended (``ended_spike_bins``): a spike two or three times the level would otherwise
    hold the mean of the next five bins at twice what they bring, slices the node can spend on the
    spikes themselves. The cost is the slices of the
    bins it raises in vain; bench/README.md reports it.
    """

    def __init__(self, base: MeanSlackPredictor, *, max_period: int = 48, min_hits: int = 2,
                 hit_share: float = 0.7, tail_quantile: float = 0.75,
                 skip_ended_spikes: bool = False, hold_spikes: bool = False) -> None:
        self.base = base
        self.slack = base.slack
        self.max_period = max_period
        self.min_hits = min_hits
        self.hit_share = hit_share
        self.tail_quantile = tail_quantile
        self.skip_ended_spikes = skip_ended_spikes
        self.hold_spikes = hold_spikes

    @staticmethod
    def jumps(history: Sequence[float]) -> list[int]:
        """Indexes of the bins whose demand jumped (at least ``JUMP_RATIO`` x the bin before)."""
        return [i for i in range(1, len(history))
                if history[i - 1] > 0 and history[i] >= JUMP_RATIO * history[i - 1]]

    def recurring_ratio(self, history: Sequence[float], jumps: list[int]) -> float:
        """The median jump ratio when the next bin (index ``len(history)``) is on a recurring
        jump's phase, else 0."""
        nxt = len(history)
        for period in range(2, self.max_period + 1):
            cycles = (nxt - 1) // period  # whole periods back from the next bin that the history covers
            hits = [j for j in jumps if (nxt - j) % period == 0]
            if len(hits) >= self.min_hits and cycles and len(hits) / cycles >= self.hit_share:
                return _quantile([history[j] / history[j - 1] for j in hits], 0.5)
        return 0.0

    @staticmethod
    def ended_spike_bins(history: Sequence[float], jumps: list[int]) -> set[int]:
        """The bins of every spike that has ended: from its jump while demand stays at least
        ``SPIKE_LEVEL`` x the bin before the jump, when a later bin has fallen below that."""
        out: set[int] = set()
        for j in jumps:
            level = SPIKE_LEVEL * history[j - 1]
            m = j
            while m + 1 < len(history) and history[m + 1] >= level:
                m += 1
            if m + 1 < len(history):
                out.update(range(j, m + 1))
        return out

    def predict(self, history_rps: Sequence[float]) -> float:
        history = list(history_rps)
        if len(history) < 2:
            return self.base.predict(history)
        jumps = self.jumps(history)
        if not jumps:
            return self.base.predict(history)
        skip = self.ended_spike_bins(history, jumps) if self.skip_ended_spikes else set()
        kept = [x for i, x in enumerate(history) if i not in skip]
        base = self.base.predict(kept or history)
        last = history[-1]
        raised = last * self.recurring_ratio(history, jumps)
        if jumps[-1] == len(history) - 1:  # the last bin jumped: the spike's second bin comes
            tails = [history[j + 1] / history[j] for j in jumps[:-1]]  # earlier spikes' second bins
            raised = max(raised, last * max(1.0, _quantile(tails, self.tail_quantile)) if tails else last)
        elif self.hold_spikes and all(x >= SPIKE_LEVEL * history[jumps[-1] - 1] for x in history[jumps[-1]:]):
            # a spike in its third bin or later (every bin since its jump at spike level): the mean
            # of five bins, two or three of them the spike's, plans for less than it still brings
            # (bin 116 of day 0: 1401 req/s after 2013, planned for 1001-1066 in two of three runs)
            raised = max(raised, last)
        return max(base, raised * (1.0 + self.slack))


def make_predictor(kind: str, window: int, slack: float, default_rps: float,
                   skip_ended_spikes: bool = False, hold_spikes: bool = False) -> Predictor:
    """The node's ``control.predictor``: "recurring" (spike-aware; ``control.skip_ended_spikes``:
    its mean leaves out the bins of spikes that have ended; ``control.hold_spikes``: a spike past
    its second bin is predicted at least at its last bin) or "mean" (the paper's)."""
    mean = MeanSlackPredictor(window, slack, default_rps)
    if kind == "mean":
        return mean
    if kind == "recurring":
        return RecurringSpikePredictor(mean, skip_ended_spikes=skip_ended_spikes, hold_spikes=hold_spikes)
    raise ValueError(f"unknown predictor {kind!r} (choose recurring or mean)")


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
