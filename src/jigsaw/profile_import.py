"""``jigsaw import-profiles``: profile rows from figures measured elsewhere, in a simple CSV.

The CSV has a header row and one row per (model, hardware, batch)::

    model,hardware,batch,p50,p95,unit,throughput,memory_mb,mps
    digitnet,gpu,8,0.0021,0.0030,s,,812,1

- ``model``: the variant name (profiles are keyed by it);
- ``hardware``: the segment it ran on: a MIG profile (``3g.40gb``), ``gpu`` for a whole GPU
  (no MIG), or a CPU share (``2c``);
- ``batch``: the batch size; ``mps`` (optional, default 1): processes sharing the segment;
- latency, per batch, in ``unit`` (``s``, ``ms`` or ``us``): ``p95``, or ``p50``, or ``mean``
  (at least one of them);
- ``throughput`` (optional): items per second of the whole segment;
- ``memory_mb`` (optional): memory of one process, in MB.

Every figure the planner needs and the file does not give is derived, and each derivation is
printed as an assumption: p95 from p50 or mean (x ``--p95-over-p50`` / ``--p95-over-mean``),
throughput from the mean (or p50) latency (``mps x batch / latency``), memory from
``--memory-mb``. A figure that cannot be right (a memory of 0, a latency <= 0, an unknown unit)
is an error naming the line. Rows are written to ``<out>/<model>.csv`` with ``source=measured``,
replacing rows of the same (segment, MPS, batch) already there.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
from collections.abc import Callable, Sequence
from pathlib import Path

from jigsaw.errors import JigsawError
from jigsaw.profiles import ProfileRow, read_profile_csv, write_profile_csv

UNITS_TO_MS = {"s": 1000.0, "ms": 1.0, "us": 0.001}
REQUIRED = ("model", "hardware", "batch", "unit")
KNOWN = (*REQUIRED, "p50", "p95", "mean", "throughput", "memory_mb", "mps")


class ImportErrorInFile(JigsawError):
    """The CSV cannot be imported (names the file, the line and the column)."""


def _number(path: Path, line: int, column: str, text: str, *, positive: bool = True) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ImportErrorInFile(f"{path}:{line}: {column}: expected a number, got {text!r}") from None
    if not math.isfinite(value) or (positive and value <= 0):
        what = "a memory of 0 cannot be right: give the measured figure, or leave the column empty " \
               "and pass --memory-mb" if column == "memory_mb" and value == 0 else "expected a number > 0"
        raise ImportErrorInFile(f"{path}:{line}: {column}: {what}, got {text!r}")
    return value


def import_csv(path: str | Path, out_dir: str | Path, *, segments: Sequence[str] | None = None,
               variants: Sequence[str] | None = None, p95_over_p50: float | None = None,
               p95_over_mean: float | None = None, memory_mb: float | None = None, host: str = "",
               date: str = "", say: object = print) -> list[Path]:
    """Reads ``path``, writes one profile CSV per model under ``out_dir``; returns the files.

    ``segments`` and ``variants`` (a node's, when given) are what ``hardware`` and ``model`` may
    name. ``say`` receives each assumption as one line.
    """
    path, out = Path(path), Path(out_dir)
    lines, reader = _read_table(path)
    assumptions: dict[str, int] = {}

    def assume(message: str) -> None:
        assumptions[message] = assumptions.get(message, 0) + 1

    date = date or dt.date.fromtimestamp(path.stat().st_mtime).isoformat()
    host = host or f"imported from {path.name}"
    rows: dict[tuple[str, str, int, int], ProfileRow] = {}
    for (line, _), raw in zip(lines[1:], reader):
        r = {k.strip(): (v or "").strip() for k, v in raw.items() if k is not None}
        _check_names(path, line, r, segments, variants)
        row = _profile_row(path, line, r, assume, p95_over_p50=p95_over_p50, p95_over_mean=p95_over_mean,
                           memory_mb=memory_mb, host=host, date=date)
        key = row.key
        if key in rows:
            assume("duplicate (model, hardware, mps, batch): the later row is kept")
        rows[key] = row
    if not rows:
        raise ImportErrorInFile(f"{path}: no rows after the header")
    for message, count in assumptions.items():
        say(f"assumed ({count} row{'s' if count != 1 else ''}): {message}")  # type: ignore[operator]
    return _write_profiles(path, out, rows, say)


def _read_table(path: Path) -> tuple[list[tuple[int, str]], csv.DictReader]:
    """The file's non-blank, non-comment lines (numbered from 1) and a reader over them, its header
    checked: every required column, no unknown one, at least one latency column."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ImportErrorInFile(f"{path}: cannot read it: {exc.strerror or exc}") from None
    lines = [(n, ln) for n, ln in enumerate(text.splitlines(), 1) if ln.strip() and not ln.startswith("#")]
    if not lines:
        raise ImportErrorInFile(f"{path}: empty: expected a header row ({', '.join(KNOWN)})")
    reader = csv.DictReader([ln for _, ln in lines])
    columns = [c.strip() for c in reader.fieldnames or []]
    missing = [c for c in REQUIRED if c not in columns]
    unknown = [c for c in columns if c not in KNOWN]
    if missing or unknown:
        why = (f"missing column(s) {', '.join(missing)}" if missing
               else f"unknown column(s) {', '.join(unknown)}")
        raise ImportErrorInFile(f"{path}:{lines[0][0]}: {why} (columns: {', '.join(KNOWN)})")
    if not any(c in columns for c in ("p50", "p95", "mean")):
        raise ImportErrorInFile(f"{path}:{lines[0][0]}: no latency column: give p95, p50 or mean")
    return lines, reader


def _check_names(path: Path, line: int, r: dict[str, str], segments: Sequence[str] | None,
                 variants: Sequence[str] | None) -> None:
    """A row's model and hardware: not empty, and the node's variant and segment where it is given."""
    model, hardware = r["model"], r["hardware"]
    if not model or not hardware:
        raise ImportErrorInFile(f"{path}:{line}: model and hardware must not be empty")
    if variants is not None and model not in variants:
        raise ImportErrorInFile(f"{path}:{line}: model: {model!r} is not a variant of the node's apps "
                                f"({', '.join(sorted(variants))})")
    if segments is not None and hardware not in segments:
        raise ImportErrorInFile(f"{path}:{line}: hardware: {hardware!r} is not a segment of the node "
                                f"({', '.join(segments)}; a whole GPU is 'gpu')")


def _profile_row(path: Path, line: int, r: dict[str, str], assume: Callable[[str], None], *,
                 p95_over_p50: float | None, p95_over_mean: float | None, memory_mb: float | None,
                 host: str, date: str) -> ProfileRow:
    """One row's profile: batch and MPS, latencies in ms, the p95, throughput and memory given or
    derived (each derivation passed to ``assume``)."""
    batch = _number(path, line, "batch", r["batch"])
    mps = _number(path, line, "mps", r["mps"]) if r.get("mps") else 1.0
    if not r.get("mps"):
        assume("mps: not given, taken as 1 (one process on the segment)")
    if batch != int(batch) or mps != int(mps):
        raise ImportErrorInFile(f"{path}:{line}: batch and mps are whole numbers")
    unit = r["unit"].lower()
    if unit not in UNITS_TO_MS:
        raise ImportErrorInFile(f"{path}:{line}: unit: expected one of {', '.join(UNITS_TO_MS)}, "
                                f"got {r['unit']!r}")
    if unit != "ms":
        assume(f"unit {unit}: latencies converted to milliseconds (x {UNITS_TO_MS[unit]:g})")
    lat = {k: _number(path, line, k, r[k]) * UNITS_TO_MS[unit]
           for k in ("p50", "p95", "mean") if r.get(k)}
    if not lat:
        raise ImportErrorInFile(f"{path}:{line}: no latency: give p95, p50 or mean")
    p95 = _p95_ms(path, line, lat, assume, p95_over_p50, p95_over_mean)
    if r.get("throughput"):
        throughput = _number(path, line, "throughput", r["throughput"])
    else:
        basis = "mean" if "mean" in lat else "p50" if "p50" in lat else "p95"
        throughput = mps * batch / lat[basis] * 1000.0
        assume(f"throughput: not given, taken as mps x batch / {basis} latency (the segment runs "
               "batches back to back)")
    memory = _memory_mb(path, line, r, assume, memory_mb)
    return ProfileRow(r["model"], r["hardware"], int(mps), int(batch), round(p95, 4), round(throughput, 3),
                      round(memory, 1), "measured", host.replace(",", " "), "imported", date)


def _p95_ms(path: Path, line: int, lat: dict[str, float], assume: Callable[[str], None],
            p95_over_p50: float | None, p95_over_mean: float | None) -> float:
    """The p95 latency: given, or derived from p50 or the mean by the ratio the user passed."""
    if "p95" in lat:
        return lat["p95"]
    if "p50" in lat:
        if p95_over_p50 is None:
            raise ImportErrorInFile(f"{path}:{line}: p95 missing: the planner needs the p95 latency; "
                                    "pass --p95-over-p50 RATIO to derive it from p50 (e.g. 1.2)")
        assume(f"p95: not given, taken as p50 x {p95_over_p50:g}")
        return lat["p50"] * p95_over_p50
    if p95_over_mean is None:
        raise ImportErrorInFile(f"{path}:{line}: p95 missing: the planner needs the p95 latency; "
                                "pass --p95-over-mean RATIO to derive it from the mean (e.g. 1.06)")
    assume(f"p95: not given, taken as mean x {p95_over_mean:g}")
    return lat["mean"] * p95_over_mean


def _memory_mb(path: Path, line: int, r: dict[str, str], assume: Callable[[str], None],
               memory_mb: float | None) -> float:
    """One process's memory: the row's, else ``--memory-mb``; neither is an error."""
    if r.get("memory_mb"):
        return _number(path, line, "memory_mb", r["memory_mb"])
    if memory_mb is not None:
        if memory_mb <= 0:
            raise ImportErrorInFile("--memory-mb: expected a number > 0")
        assume(f"memory_mb: not given, taken as --memory-mb {memory_mb:g}")
        return memory_mb
    raise ImportErrorInFile(f"{path}:{line}: memory_mb missing: the planner checks that processes "
                            "fit the segment's memory; add the column or pass --memory-mb")


def _write_profiles(path: Path, out: Path, rows: dict[tuple[str, str, int, int], ProfileRow],
                    say: object) -> list[Path]:
    """One ``<out>/<model>.csv`` per model, keeping rows already there that the import does not
    replace; returns the files."""
    written = []
    for model in sorted({k[0] for k in rows}):
        target = out / f"{model}.csv"
        mine = {k: v for k, v in rows.items() if k[0] == model}
        kept = [row for row in (read_profile_csv(target) if target.exists() else []) if row.key not in mine]
        if kept:
            say(f"{target}: kept {len(kept)} rows already there, replaced or added {len(mine)}")  # type: ignore[operator]
        write_profile_csv(target, [*kept, *sorted(mine.values(), key=lambda x: x.key)],
                          f"Imported by jigsaw import-profiles from {path.name}; latency_ms is p95 of one "
                          "batch, throughput_rps items/s of the segment.")
        written.append(target)
    return written
