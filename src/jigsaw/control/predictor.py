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
