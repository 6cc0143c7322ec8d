"""The offline predictor bench's scoring (``bench/predictor.py``) on synthetic days; its numbers
on the Twitter trace are a bench's, in bench/README.md."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import predictor as bench  # noqa: E402

BINS = bench.BINS_PER_DAY


def _day(spike_at: tuple[int, ...], base: float = 100.0) -> list[float]:
    """A flat day with two-bin spikes (2.5x, then 4x the base) from each of ``spike_at``."""
    day = [base] * BINS
    for j in spike_at:
        day[j], day[j + 1] = 2.5 * base, 4.0 * base
    return day


def test_a_flat_day_is_planned_at_its_slack_and_never_short() -> None:
    score = bench.evaluate([100.0] * BINS, range(1), 100.0, 0.0, bench.VARIANTS["mean"], "day", 0.05, None)
    assert score.bins == BINS - 1 and score.under == 0 and score.short == 0
    # the plan is capped at the capacity (the day's peak, 100): the slack over it is no plan
    assert score.planned == pytest.approx(score.arrived)
    # each day is scaled so its peak is the capacity: a day flat at 50 is played at 100
    low = bench.evaluate([50.0] * BINS, range(1), 100.0, 0.0, bench.VARIANTS["mean"], "day", 0.05, None)
    assert low.arrived == pytest.approx(100.0 * (BINS - 1))


def test_spike_bins_past_the_jump_are_counted_and_the_profile_plans_them() -> None:
    days = _day((20, 50, 80, 110, 140, 170, 200)) + _day((30, 60, 90, 120, 150, 180, 210))
    cap = 400.0
    mean = bench.evaluate(days, range(2), cap, 0.0, bench.VARIANTS["mean"], "day", 0.05, 1)
    profile = bench.evaluate(days, range(2), cap, 0.0, bench.VARIANTS["profile"], "day", 0.05, 1)
    # every spike's second bin is short under the mean and none under the profile
    # (the day's first spike from its jump bin's onset: 2 x 250 - 100 = 400, the second bin's 400)
    assert mean.spike_under == 14
    assert profile.spike_under == 0
    # the jump bins: each day's first two come unforeseen, then the period of 30 bins shows
    assert profile.under == 4 and mean.under == 14 + 14
    assert [d.split(":")[0] for d in profile.details] == ["day 1 bin 30", "day 1 bin 60"]  # --detail
    assert profile.planned > mean.planned  # the price: the spikes' bins planned at their height


def test_the_bench_runs_on_the_synthetic_trace(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--trace", "synthetic", "--peaks", "ar_assistant=690.9", "--apps", "ar_assistant",
                       "--predictors", "mean,profile"]) == 0
    out = capsys.readouterr().out
    assert "1 days (0:1) of synthetic" in out
    assert out.count("\n| mean |") == 1 and out.count("\n| profile |") == 1
    with pytest.raises(SystemExit, match="unknown oracle"):
        bench.main(["--trace", "synthetic", "--peaks", "ar_assistant=1", "--apps", "ar_assistant",
                    "--predictors", "oracle"])
