"""Demand traces for replay: load, bin, select a day, scale. Shared by ``bench/replay.py`` and tests.

Accepted inputs (``parse_trace_spec``):

- ``twitter:PATH``: per-second counts. A bz2/gzip tar (``.tbz2``, ``.tar.bz2``, ``.tgz``) whose
  member ``workload.txt`` (or its only member) holds integers separated by whitespace (commas and
  list brackets around tokens are ignored), or that text file itself. Streamed, never extracted.
- ``azure:PATH``: the public AzureFunctionsInvocationTrace per-minute CSV (one row per function
  per day, with columns ``"1"`` .. ``"1440"`` holding the invocations of each minute of the day).
  Every row's minute columns are summed, giving one day of per-minute counts; other columns are
  ignored. Each minute's count is spread evenly over its 60 seconds.
- ``synthetic``: ``synthetic_day(seed)``, a seeded diurnal day with bursts (no file needed).

Everything becomes a per-second count series; ``bin_rates`` turns it into mean requests/s per
bin (default 300 s: 288 bins per day), ``select_day`` picks a day's bins, ``scale_to_peak`` makes
the selected bins' peak equal a target (the app's maximum serviceable demand).
"""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import math
import random
import re
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

SECONDS_PER_DAY = 86400
DEFAULT_BIN_SECONDS = 300
MINUTES_PER_DAY = 1440
_TOKEN_STRIP = "[](),"
_CHUNK_BYTES = 1 << 16


class TraceError(ValueError):
    """A trace file or spec that cannot be read; the message names the file and what was expected."""


@dataclass(frozen=True)
class TraceSpec:
    kind: str  # twitter | azure | synthetic
    path: Path | None
    seed: int = 0


def parse_trace_spec(text: str) -> TraceSpec:
    """``twitter:PATH``, ``azure:PATH``, ``synthetic`` or ``synthetic:SEED``."""
    kind, _, rest = text.partition(":")
    if kind == "synthetic":
        try:
            return TraceSpec("synthetic", None, int(rest) if rest else 0)
        except ValueError:
            raise TraceError(f"--trace {text!r}: synthetic takes an integer seed (synthetic:SEED)") from None
    if kind in ("twitter", "azure"):
        if not rest:
            raise TraceError(f"--trace {text!r}: expected {kind}:PATH")
        return TraceSpec(kind, Path(rest))
    raise TraceError(f"--trace {text!r}: expected twitter:PATH, azure:PATH or synthetic[:SEED]")


def _tokens(chunks: Iterable[str]) -> Iterator[int]:
    """Integers from whitespace-separated text arriving in chunks (a token may span two chunks)."""
    tail = ""
    for chunk in chunks:
        text = tail + chunk
        parts = text.split()
        tail = "" if text[-1:].isspace() else (parts.pop() if parts else "")
        for p in parts:
            yield from _ints(p)
    if tail:
        yield from _ints(tail)


def _ints(token: str) -> Iterator[int]:
    for piece in token.split(","):
        piece = piece.strip(_TOKEN_STRIP)
        if piece:
            try:
                yield int(piece)
            except ValueError:
                raise TraceError(f"not an integer count: {piece!r}") from None


def _read_chunks(f: io.BufferedIOBase | io.RawIOBase) -> Iterator[str]:
    while True:
        b = f.read(_CHUNK_BYTES)
        if not b:
            return
        yield b.decode("ascii", errors="strict")


def load_twitter(path: Path) -> list[int]:
    """Per-second counts of the Twitter workload file (tar.bz2/tgz with ``workload.txt``, or text)."""
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: no such trace file")
    try:
        if tarfile.is_tarfile(path):
            with tarfile.open(path, "r:*") as tar:
                members = [m for m in tar.getmembers() if m.isfile()]
                member = next((m for m in members if Path(m.name).name == "workload.txt"),
                              members[0] if len(members) == 1 else None)
                if member is None:
                    raise TraceError(f"{path}: no member workload.txt (members: "
                                     f"{', '.join(m.name for m in members[:5])})")
                f = tar.extractfile(member)
                assert f is not None
                return list(_tokens(_read_chunks(f)))
        opener = bz2.open if path.suffix in (".bz2", ".tbz2") else gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:  # type: ignore[operator]
            return list(_tokens(_read_chunks(f)))
    except (OSError, tarfile.TarError, UnicodeDecodeError, EOFError) as exc:
        raise TraceError(f"{path}: cannot read the Twitter trace: {exc}") from None
    except TraceError as exc:
        raise TraceError(f"{path}: {exc}") from None


def load_azure_minutes(path: Path) -> list[int]:
    """Per-minute invocations of one day: columns "1".."1440" summed over every row of the CSV."""
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: no such trace file")
    totals = [0] * MINUTES_PER_DAY
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise TraceError(f"{path}: empty CSV")
            cols = {h.strip(): i for i, h in enumerate(header)}
            idx = [cols.get(str(m)) for m in range(1, MINUTES_PER_DAY + 1)]
            if any(i is None for i in idx):
                missing = next(m for m, i in zip(range(1, MINUTES_PER_DAY + 1), idx) if i is None)
                raise TraceError(f"{path}: expected the per-minute columns \"1\"..\"1440\" of the Azure "
                                 f"Functions invocation trace; column \"{missing}\" is missing")
            for line, row in enumerate(reader, start=2):
                for m, i in enumerate(idx):
                    cell = row[i].strip() if i is not None and i < len(row) else ""
                    if cell:
                        try:
                            totals[m] += int(float(cell))
                        except ValueError:
                            raise TraceError(f"{path}:{line}: column \"{m + 1}\": not a number: "
                                             f"{cell!r}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read the Azure trace: {exc}") from None
    return totals


def minutes_to_seconds(per_minute: list[int]) -> list[float]:
    """Spread each minute's count evenly over its 60 seconds."""
    return [c / 60.0 for c in per_minute for _ in range(60)]


def synthetic_day(seed: int = 0, *, base_rps: float = 20.0, peak_rps: float = 100.0,
                  bursts: int = 6, seconds: int = SECONDS_PER_DAY) -> list[float]:
    """A seeded diurnal day of per-second rates: a smooth trough-to-peak cycle, noise, short bursts.

    The trough is near 04:00 and the peak near 16:00, like the Twitter day; bursts last 2-10
    minutes and add up to 60% of the peak. Deterministic for a seed.
    """
    rng = random.Random(seed)
    rates = []
    for s in range(seconds):
        phase = 2 * math.pi * (s / SECONDS_PER_DAY - 4 / 24)
        diurnal = base_rps + (peak_rps - base_rps) * 0.5 * (1 - math.cos(phase))
        rates.append(diurnal)
    for _ in range(bursts):
        start = rng.randrange(0, max(1, seconds - 600))
        length = rng.randint(120, 600)
        height = rng.uniform(0.2, 0.6) * peak_rps
        for s in range(start, min(seconds, start + length)):
            rates[s] += height
    return [max(0.0, r * rng.uniform(0.9, 1.1)) for r in rates]


def load_trace(spec: TraceSpec) -> list[float]:
    """Per-second request counts (or rates) of the whole trace."""
    if spec.kind == "twitter":
        assert spec.path is not None
        return [float(c) for c in load_twitter(spec.path)]
    if spec.kind == "azure":
        assert spec.path is not None
        return minutes_to_seconds(load_azure_minutes(spec.path))
    return synthetic_day(spec.seed)


def bin_rates(per_second: list[float], bin_seconds: int = DEFAULT_BIN_SECONDS) -> list[float]:
    """Mean requests/s of each full ``bin_seconds`` bin (a partial last bin is dropped)."""
    if bin_seconds <= 0:
        raise TraceError(f"bin length must be > 0 seconds, got {bin_seconds}")
    n = len(per_second) // bin_seconds
    return [sum(per_second[i * bin_seconds:(i + 1) * bin_seconds]) / bin_seconds for i in range(n)]


def select_day(bins: list[float], day: int, bin_seconds: int = DEFAULT_BIN_SECONDS) -> list[float]:
    """The bins of day ``day`` (0-based); a TraceError when the trace is shorter."""
    per_day = SECONDS_PER_DAY // bin_seconds
    days = len(bins) // per_day
    if day < 0 or day >= max(days, 1) or (days == 0 and day > 0):
        raise TraceError(f"--day {day}: the trace has {days} full day(s) of {per_day} bins")
    return bins[day * per_day:(day + 1) * per_day] if days else list(bins)


def parse_bins(text: str | None, n: int) -> tuple[int, int]:
    """``A:B`` (half-open, either side optional, negative from the end) -> (start, stop) within 0..n."""
    if not text:
        return 0, n
    m = re.fullmatch(r"\s*(-?\d*)\s*:\s*(-?\d*)\s*", text)
    if not m:
        raise TraceError(f"--bins {text!r}: expected A:B (for example 96:144)")
    a = int(m.group(1)) if m.group(1) else 0
    b = int(m.group(2)) if m.group(2) else n
    a, b = (a + n if a < 0 else a), (b + n if b < 0 else b)
    if not 0 <= a < b <= n:
        raise TraceError(f"--bins {text!r}: need 0 <= A < B <= {n}")
    return a, b


def scale_to_peak(bins: list[float], peak_rps: float) -> list[float]:
    """Scale so the largest bin equals ``peak_rps``, preserving the trend (all zero stays zero)."""
    top = max(bins, default=0.0)
    if top <= 0:
        return [0.0] * len(bins)
    return [b * peak_rps / top for b in bins]


def day_bins(spec: TraceSpec, *, day: int = 0, bin_seconds: int = DEFAULT_BIN_SECONDS,
             peak_rps: float | None = None) -> list[float]:
    """Load, bin, pick the day and (optionally) scale its peak to ``peak_rps``: the replay's demand."""
    bins = select_day(bin_rates(load_trace(spec), bin_seconds), day, bin_seconds)
    return scale_to_peak(bins, peak_rps) if peak_rps is not None else bins
