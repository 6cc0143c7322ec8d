"""The demand predictors: mean of the last bins plus slack, the spike profile, the burst floor."""

from __future__ import annotations

import pytest

from jigsaw.control import spikes
from jigsaw.control.predictor import (
    MeanSlackPredictor,
    Predictor,
    SpikeProfilePredictor,
    burst_floor_rps,
    make_predictor,
    rise_rps,
)


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


# ---- the spike profile and the burst floor ---------------------------------------------------
def _spiky(bins: int, period: int, first: int, base: float = 20.0, heights: tuple[float, ...] = (3.0, 4.2),
           ) -> list[float]:
    """A flat demand with a spike every ``period`` bins from ``first``: ``heights`` x the base, bin by bin."""
    h = [base] * bins
    for j in range(first, bins, period):
        for k, x in enumerate(heights):
            if j + k < bins:
                h[j + k] = base * x
    return h


def test_spikes_are_found_with_their_base_and_end() -> None:
    h = [100.0] * 6 + [300.0, 450.0, 320.0, 110.0, 100.0, 400.0]
    assert spikes.spikes(h) == [spikes.Spike(6, 100.0, 9), spikes.Spike(11, 100.0, None)]
    assert list(spikes.spikes(h)[0].bins(len(h))) == [6, 7, 8]
    # a second jump inside a running spike is that spike's, not a new one
    assert spikes.spikes([10.0, 30.0, 60.0, 10.0]) == [spikes.Spike(1, 10.0, 3)]
    assert spikes.spikes([0.0, 5.0]) == []  # no jump from nothing


def test_a_recurring_spike_is_anticipated_on_its_phase() -> None:
    p = SpikeProfilePredictor(window=5, slack=0.05)
    mean = MeanSlackPredictor(window=5, slack=0.05)
    h = _spiky(60, 12, 6)  # spikes at 6, 18, 30, 42 (and their second bins), the next at 54
    assert p.predict(h[:54]) == pytest.approx(20.0 * 3.0 * 1.05)  # the last bin x the jumps' ratio
    assert mean.predict(h[:54]) < 30.0  # the paper's mean plans for the flat demand
    assert p.predict(h[:50]) == pytest.approx(20.0 * 1.05)  # off the phase: the level


def test_a_one_off_spike_is_not_repeated() -> None:
    p = SpikeProfilePredictor(window=5, slack=0.0)
    h = [20.0] * 40
    h[10], h[11] = 60.0, 84.0
    # after it, at every later bin (its phase one, two, three periods on too): the level alone
    for t in range(14, 41):
        assert p.predict(h[:t]) == pytest.approx(20.0), t
    assert p.predict([]) == 0.0 and p.predict([7.0]) == pytest.approx(7.0)


def test_a_running_spike_is_predicted_at_past_spikes_height_and_the_level_after_it() -> None:
    p = SpikeProfilePredictor(window=5, slack=0.0)
    h = _spiky(40, 12, 6, heights=(2.5, 4.4))  # two-bin spikes: 2.5x, then 4.4x the base
    # the spike of bin 30 jumped: its second bin at the past spikes' height at that age (4.4x),
    # more than its jump bin's 2.5x, and more than the mean's
    assert p.predict(h[:31]) == pytest.approx(20.0 * 4.4)
    # a running spike is never planned below its last bin (a spike that outlasts the past ones is
    # held), but once it has fallen the bins after it come from the level: its bins are left out of
    # the mean, which would hold (4 x 20 + 88) / 5 = 33.6
    assert p.predict(h[:32]) == pytest.approx(20.0 * 4.4)
    for t in range(33, 38):
        assert p.predict(h[:t]) == pytest.approx(20.0), t


def test_a_spike_is_held_while_past_spikes_say_it_lasts() -> None:
    p = SpikeProfilePredictor(window=5, slack=0.0)
    h = _spiky(40, 12, 6, heights=(2.5, 3.5, 4.0))  # three-bin spikes, highest in their third
    assert p.predict(h[:32]) == pytest.approx(20.0 * 4.0)  # the third bin, as the past spikes'
    longer = [*h[:33], 70.0]  # this one outlasts every past spike: never below its last bin
    assert p.predict(longer) == pytest.approx(70.0)


def test_the_first_spikes_second_bin_is_planned_from_its_jump() -> None:
    # no past spike: a spike begins within its jump bin (mid-bin on average), so the jump bin's
    # 60 over a base of 20 implies a spike at 100
    p = SpikeProfilePredictor(window=5, slack=0.0)
    assert p.predict([20.0] * 8 + [60.0]) == pytest.approx(2 * 60.0 - 20.0)


def test_two_jumps_in_three_cycles_are_not_a_pattern() -> None:
    # jumps at bins 3 and 9 (period 6), none at 15: at bin 21 the period matched 2 of 3 cycles, which
    # on day 0 of the Twitter trace raised quiet bins to spike level for nothing
    history = [400.0 if i in (3, 9) else 100.0 for i in range(21)]
    p = SpikeProfilePredictor(5, 0.0)
    assert p.recurring_ratio(history, spikes.spikes(history)) == 0.0
    assert p.predict(history) == pytest.approx(100.0)
    loose = SpikeProfilePredictor(5, 0.0, hit_share=0.6)
    assert loose.predict(history) == pytest.approx(400.0)


def test_a_rise_within_the_bin_is_read_as_a_spike_only_past_a_jump() -> None:
    p = SpikeProfilePredictor(5, 0.05)
    flat = [10.0] * 10
    assert rise_rps(p, flat, 14.0, 0.05) == pytest.approx(14.0)  # 1.4x the bin before: the rate itself
    assert rise_rps(p, flat, 25.0, 0.05) == pytest.approx(40.0)  # a jump: the level it implies
    assert rise_rps(MeanSlackPredictor(5, 0.05), flat, 25.0, 0.05) == pytest.approx(25.0)


def test_make_predictor_by_name() -> None:
    assert isinstance(make_predictor("mean", 5, 0.05, 3.0), MeanSlackPredictor)
    assert isinstance(make_predictor("profile", 5, 0.05, 3.0), SpikeProfilePredictor)
    with pytest.raises(ValueError, match="unknown predictor"):
        make_predictor("oracle", 5, 0.05, 3.0)


def test_burst_floor_holds_the_burst_within_half_the_slo() -> None:
    assert burst_floor_rps(650.0, 40) == pytest.approx(40 / 0.325)
    assert burst_floor_rps(650.0, 0) == 0.0
