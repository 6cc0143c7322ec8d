"""Trace loading, binning, day selection and scaling against hand-computed values."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from jigsaw.traces import (
    TraceError,
    TraceSpec,
    bin_rates,
    day_bins,
    load_azure_minutes,
    load_trace,
    load_twitter,
    parse_bins,
    parse_trace_spec,
    scale_to_peak,
    select_day,
    synthetic_day,
)

REAL_TWITTER = Path(__file__).resolve().parents[3] / "shared" / "data" / "twitter" / "workload.tbz2"


def _write_tbz2(path: Path, text: str) -> None:
    data = text.encode()
    with tarfile.open(path, "w:bz2") as tar:
        info = tarfile.TarInfo("workload.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def test_twitter_tar_with_brackets(tmp_path: Path) -> None:
    p = tmp_path / "w.tbz2"
    _write_tbz2(p, "[1 2 3\n4 5 6]")
    assert load_twitter(p) == [1, 2, 3, 4, 5, 6]


def test_twitter_plain_text_and_chunk_boundaries(tmp_path: Path) -> None:
    p = tmp_path / "w.txt"
    counts = list(range(50000))  # longer than one read chunk: tokens straddle chunk boundaries
    p.write_text("[" + " ".join(map(str, counts)) + "]")
    assert load_twitter(p) == counts


def test_twitter_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such trace file"):
        load_twitter(tmp_path / "missing.tbz2")
    bad = tmp_path / "bad.txt"
    bad.write_text("1 2 x3")
    with pytest.raises(TraceError, match=r"bad\.txt"):
        load_twitter(bad)


def test_bins_by_hand() -> None:
    per_second = [1, 2, 3, 4, 5, 6, 7]  # bins of 3 s: mean 2, mean 5, the partial bin dropped
    assert bin_rates([float(x) for x in per_second], 3) == [2.0, 5.0]


def test_twitter_day_scaled(tmp_path: Path) -> None:
    p = tmp_path / "w.tbz2"
    # two days of 300 s bins: day 0 has rates 1 in its first bin and 3 in its second, else 2
    day0 = [1] * 300 + [3] * 300 + [2] * (86400 - 600)
    day1 = [4] * 86400
    _write_tbz2(p, "[" + " ".join(map(str, day0 + day1)) + "]")
    bins = day_bins(TraceSpec("twitter", p), day=0, peak_rps=600.0)
    assert len(bins) == 288
    assert bins[0] == pytest.approx(200.0) and bins[1] == pytest.approx(600.0)
    assert bins[2] == pytest.approx(400.0)
    assert day_bins(TraceSpec("twitter", p), day=1) == [4.0] * 288
    with pytest.raises(TraceError, match="2 full day"):
        day_bins(TraceSpec("twitter", p), day=2)


def test_azure_per_minute(tmp_path: Path) -> None:
    header = ["HashOwner", "HashApp", "HashFunction", "Trigger"] + [str(m) for m in range(1, 1441)]
    row1 = ["o", "a", "f1", "http"] + ["60"] * 1440
    row2 = ["o", "a", "f2", "timer"] + ["120"] * 5 + ["0"] * 1435
    p = tmp_path / "invocations_per_function_md.anon.d01.csv"
    p.write_text("\n".join(",".join(r) for r in (header, row1, row2)) + "\n")
    minutes = load_azure_minutes(p)
    assert minutes[:5] == [180] * 5 and minutes[5] == 60 and len(minutes) == 1440
    bins = day_bins(TraceSpec("azure", p))
    # the first 5-minute bin: 5 minutes of 180 -> 3 req/s; the others 1 req/s
    assert bins[0] == pytest.approx(3.0) and bins[1] == pytest.approx(1.0) and len(bins) == 288


def test_azure_missing_columns(tmp_path: Path) -> None:
    p = tmp_path / "x.csv"
    p.write_text("HashFunction,1,2\nf,1,2\n")
    with pytest.raises(TraceError, match='column "3" is missing'):
        load_azure_minutes(p)


def test_synthetic_is_seeded_diurnal() -> None:
    a, b = synthetic_day(1), synthetic_day(1)
    assert a == b and len(a) == 86400 and synthetic_day(2) != a
    bins = bin_rates(a)
    assert min(bins[:96]) < max(bins[144:216])  # night trough below afternoon


def test_bins_window_and_spec() -> None:
    assert parse_bins("96:144", 288) == (96, 144)
    assert parse_bins(":10", 288) == (0, 10)
    assert parse_bins("-48:", 288) == (240, 288)
    assert parse_bins(None, 288) == (0, 288)
    with pytest.raises(TraceError):
        parse_bins("10:5", 288)
    assert parse_trace_spec("synthetic:3") == TraceSpec("synthetic", None, 3)
    assert parse_trace_spec("twitter:/x").path == Path("/x")
    with pytest.raises(TraceError):
        parse_trace_spec("nope:/x")
    assert scale_to_peak([1.0, 2.0, 4.0], 100.0) == [25.0, 50.0, 100.0]
    assert scale_to_peak([0.0, 0.0], 10.0) == [0.0, 0.0]
    assert select_day([1.0] * 10, 0) == [1.0] * 10  # shorter than a day: the whole trace is day 0


@pytest.mark.skipif(not REAL_TWITTER.exists(), reason=f"{REAL_TWITTER} not present (shared data)")
def test_real_twitter_first_day() -> None:
    counts = load_trace(TraceSpec("twitter", REAL_TWITTER))
    assert len(counts) == 1899061 and max(counts) == 388
    bins = day_bins(TraceSpec("twitter", REAL_TWITTER), day=0, peak_rps=1000.0)
    assert len(bins) == 288 and max(bins) == pytest.approx(1000.0)
