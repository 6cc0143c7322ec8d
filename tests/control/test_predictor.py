"""The demand predictors: mean of the last bins plus slack, the recurring-spike one, the burst floor."""

from __future__ import annotations

import pytest

from jigsaw.control.predictor import (
    MeanSlackPredictor,
    Predictor,
    RecurringSpikePredictor,
    burst_floor_rps,
    make_predictor,
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


# ---- the recurring-spike predictor and the burst floor ---------------------------------------
def _spiky(bins: int, period: int, first: int, base: float = 20.0, peak: float = 60.0) -> list[float]:
    """A flat demand with a two-bin spike every ``period`` bins from ``first``."""
    h = [base] * bins
    for j in range(first, bins, period):
        h[j] = peak
        if j + 1 < bins:
            h[j + 1] = peak * 1.4
    return h


def test_recurring_spikes_are_predicted_on_their_phase() -> None:
    mean = MeanSlackPredictor(window=5, slack=0.05)
    p = RecurringSpikePredictor(mean)
    h = _spiky(60, 12, 6)  # spikes at 6, 18, 30, 42, 54 (and their second bins)
    # before bin 54 (next index = len(history) = 54): jumps at 6, 18, 30, 42 recur every 12 bins
    predicted = p.predict(h[:54])
    assert predicted == pytest.approx(20.0 * 3.0 * 1.05)  # last bin x the median jump ratio, + slack
    assert mean.predict(h[:54]) < 30.0  # the mean would have planned for the flat demand
    # off the phase it is the mean (never below it)
    assert p.predict(h[:50]) == pytest.approx(mean.predict(h[:50]))


def test_a_jumps_second_bin_is_predicted_from_earlier_spikes() -> None:
    p = RecurringSpikePredictor(MeanSlackPredictor(window=5, slack=0.0))
    h = _spiky(43, 12, 6)  # the last bin (42) jumped; earlier spikes rose 1.4x in their second bin
    assert p.predict(h) == pytest.approx(60.0 * 1.4)


def test_a_single_jump_is_not_a_pattern() -> None:
    mean = MeanSlackPredictor(window=5, slack=0.05)
    p = RecurringSpikePredictor(mean)
    h = [20.0] * 30
    h[10] = 80.0
    assert p.predict(h) == pytest.approx(mean.predict(h))
    assert p.predict([]) == mean.predict([])


def test_the_mean_leaves_out_a_spike_once_it_has_ended() -> None:
    # level 100, a spike of 300 and 250, back to 100: the next bins are planned from the level, not
    # from a mean the spike holds at twice it; while the spike runs its bins count
    history = [100.0] * 6 + [300.0, 250.0, 100.0, 100.0]
    p = RecurringSpikePredictor(MeanSlackPredictor(5, 0.0), skip_ended_spikes=True)
    assert p.ended_spike_bins(history, p.jumps(history)) == {6, 7}
    assert p.predict(history) == pytest.approx(100.0)
    off = RecurringSpikePredictor(MeanSlackPredictor(5, 0.0), skip_ended_spikes=False)
    assert off.predict(history) == pytest.approx((300.0 + 250.0 + 300.0) / 5)
    running = history[:8]  # the spike's second bin was the last: not ended, not left out
    assert p.ended_spike_bins(running, p.jumps(running)) == set()
    assert p.predict(running) == pytest.approx((3 * 100.0 + 300.0 + 250.0) / 5)


def test_two_jumps_in_three_cycles_are_not_a_pattern() -> None:
    # jumps at bins 3 and 9 (period 6), none at 15: at bin 21 the period matched 2 of 3 cycles, which
    # on day 0 of the Twitter trace raised bins 99, 102 and 108 to spike level for nothing
    history = [400.0 if i in (3, 9) else 100.0 for i in range(21)]
    p = RecurringSpikePredictor(MeanSlackPredictor(5, 0.0))
    assert p.recurring_ratio(history, p.jumps(history)) == 0.0
    assert p.predict(history) == pytest.approx(100.0)
    loose = RecurringSpikePredictor(MeanSlackPredictor(5, 0.0), hit_share=0.6)
    assert loose.predict(history) == pytest.approx(400.0)


def test_make_predictor_by_name() -> None:
    assert isinstance(make_predictor("mean", 5, 0.05, 3.0), MeanSlackPredictor)
    assert isinstance(make_predictor("recurring", 5, 0.05, 3.0), RecurringSpikePredictor)
    with pytest.raises(ValueError, match="unknown predictor"):
        make_predictor("oracle", 5, 0.05, 3.0)


def test_burst_floor_holds_the_burst_within_half_the_slo() -> None:
    assert burst_floor_rps(650.0, 40) == pytest.approx(40 / 0.325)
    assert burst_floor_rps(650.0, 0) == 0.0


def test_a_spike_past_its_second_bin_is_held_at_its_last_bin() -> None:
    # level 100, a jump to 300, then 450 and 320 (day 0's bins 114-116: 1332, 2013, 1401 after 573):
    # the mean plans the spike's third bin for less than it brings; held, for its last bin
    history = [100.0] * 6 + [300.0, 450.0]
    held = RecurringSpikePredictor(MeanSlackPredictor(5, 0.0), hold_spikes=True)
    mean_only = RecurringSpikePredictor(MeanSlackPredictor(5, 0.0))
    assert mean_only.predict(history) == pytest.approx((3 * 100.0 + 300.0 + 450.0) / 5)
    assert held.predict(history) == pytest.approx(450.0)
    assert held.predict([*history, 320.0]) == pytest.approx(320.0)
    # once a bin falls below the spike level the spike has ended: the mean again
    ended = [*history, 320.0, 110.0]
    assert held.predict(ended) == pytest.approx(mean_only.predict(ended))
    # the bin right after the jump is the tail rule's, not this one's
    assert held.predict(history[:7]) == mean_only.predict(history[:7])
