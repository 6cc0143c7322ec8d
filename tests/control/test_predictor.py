"""The demand predictor: mean of the last bins plus slack, short histories, pluggable."""

from __future__ import annotations

import pytest

from jigsaw.control.predictor import MeanSlackPredictor, Predictor


def test_mean_of_last_five_plus_slack() -> None:
    p = MeanSlackPredictor(window=5, slack=0.05)
    history = [100.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # the first bin is outside the window
    assert p.predict(history) == pytest.approx(3.0 * 1.05)


def test_fewer_bins_than_the_window_average_what_there_is() -> None:
    p = MeanSlackPredictor(window=5, slack=0.05, default_rps=7.0)
    assert p.predict([10.0, 20.0]) == pytest.approx(15.0 * 1.05)
    assert p.predict([]) == 7.0


def test_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError):
        MeanSlackPredictor(window=0)
    with pytest.raises(ValueError):
        MeanSlackPredictor(slack=-0.1)


def test_pluggable_protocol() -> None:
    class LastBin:
        def predict(self, history_rps: list[float]) -> float:
            return history_rps[-1] if history_rps else 0.0

    p: Predictor = LastBin()
    assert p.predict([1.0, 9.0]) == 9.0
