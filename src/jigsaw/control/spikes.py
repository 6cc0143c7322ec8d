"""The spikes of a demand history: where each jumped, from what level, and how long it held.

Plain functions over a list of per-bin rates (requests/s), shared by the spike-aware predictors
(``control/predictor.py``) and the offline predictor bench (``bench/predictor.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

JUMP_RATIO = 1.6  # a bin whose demand is this many times its predecessor's is a jump (a spike starts)
SPIKE_LEVEL = 1.3  # a spike lasts while demand stays this many times the bin before its jump


@dataclass(frozen=True)
class Spike:
    """A spike: its jump bin ``start``, the demand of the bin before it (``base_rps``) and ``end``,
    the first bin after it below ``SPIKE_LEVEL`` x that base (None: it still runs at the history's end)."""

    start: int
    base_rps: float
    end: int | None

    def bins(self, history_len: int) -> range:
        return range(self.start, history_len if self.end is None else self.end)


def jumps(history: Sequence[float]) -> list[int]:
    """Indexes of the bins whose demand jumped (at least ``JUMP_RATIO`` x the bin before)."""
    return [i for i in range(1, len(history))
            if history[i - 1] > 0 and history[i] >= JUMP_RATIO * history[i - 1]]


def spikes(history: Sequence[float]) -> list[Spike]:
    """Every spike of ``history`` in order; a jump inside a running spike belongs to that spike."""
    out: list[Spike] = []
    n = len(history)
    for j in jumps(history):
        if out and (out[-1].end is None or j < out[-1].end):
            continue
        level = SPIKE_LEVEL * history[j - 1]
        m = j + 1
        while m < n and history[m] >= level:
            m += 1
        out.append(Spike(j, history[j - 1], m if m < n else None))
    return out


def quantile(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` by nearest rank (the largest for q = 1); ``xs`` must not be empty."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]
