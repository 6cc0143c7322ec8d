"""Per-(variant, segment, batch) latency and throughput tables.

A profile directory holds CSV files (any name ending in ``.csv``), ``#`` lines being comments,
with the columns of ``COLUMNS``. ``latency_ms`` is the p95 latency of one batch on one of the
segment's ``mps`` processes; ``throughput_rps`` is the whole segment's (all processes);
``memory_mb`` is one process's footprint (weights + activations at that batch).
``source`` is ``modeled`` (written by a documented script) or ``measured`` (by
``jigsaw profile``); a reader can always tell which. ``input`` (optional) is the input a
measured row was timed at (``jigsaw.profiler.describe_input``): the node checks it against what
it would serve (``jigsaw.models.input_sizes``).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from jigsaw.errors import ConfigError

COLUMNS = ("variant", "mig_profile", "mps", "batch", "latency_ms", "throughput_rps",
           "memory_mb", "source", "host", "backend", "date", "input")
SOURCES = ("modeled", "measured")


@dataclass(frozen=True)
class ProfileRow:
    variant: str
    mig_profile: str
    mps: int
    batch: int
    latency_ms: float
    throughput_rps: float
    memory_mb: float
    source: str
    host: str = ""
    backend: str = ""
    date: str = ""
    input: str = ""  # what a measured row's items were: "image 320x320", "audio 16000 (typical_shape)"

    @property
    def key(self) -> tuple[str, str, int, int]:
        return (self.variant, self.mig_profile, self.mps, self.batch)


class ProfileTable:
    """All profile rows of a node, indexed by (variant, mig_profile, mps, batch)."""

    def __init__(self, rows: Iterable[ProfileRow] = (), source: str = "") -> None:
        self.source = source
        self.version = 0  # bumped by every ``add``: what remembers work done from the rows checks it
        self._rows: dict[tuple[str, str, int, int], ProfileRow] = {}
        for r in rows:
            self._rows[r.key] = r

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, key: object) -> bool:
        return key in self._rows

    def get(self, variant: str, mig_profile: str, mps: int, batch: int) -> ProfileRow | None:
        return self._rows.get((variant, mig_profile, mps, batch))

    def rows(self, variant: str | None = None) -> list[ProfileRow]:
        return [r for r in self._rows.values() if variant is None or r.variant == variant]

    @property
    def variants(self) -> set[str]:
        return {r.variant for r in self._rows.values()}

    @property
    def sources(self) -> set[str]:
        return {r.source for r in self._rows.values()}

    def add(self, row: ProfileRow) -> None:
        self._rows[row.key] = row
        self.version += 1

    def with_rows(self, rows: Iterable[ProfileRow]) -> ProfileTable:
        table = ProfileTable(self._rows.values(), self.source)
        for r in rows:
            table.add(r)
        return table


def read_profile_csv(path: str | Path) -> list[ProfileRow]:
    """Reads one profile CSV; a malformed row raises ConfigError naming file, line and column."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(str(path), "(file)", f"cannot read: {exc.strerror}") from None
    lines = [(i + 1, line) for i, line in enumerate(text.splitlines())
             if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        return []
    reader = csv.reader([line for _, line in lines])
    header = next(reader)
    missing = [c for c in COLUMNS[:8] if c not in header]
    if missing:
        raise ConfigError(str(path), f"line {lines[0][0]}", f"header lacks columns {missing}")
    idx = {name: header.index(name) for name in header}
    rows: list[ProfileRow] = []
    for (lineno, _), values in zip(lines[1:], reader, strict=True):
        def get(col: str, values: list[str] = values, lineno: int = lineno) -> str:
            if col not in idx:
                return ""
            if idx[col] >= len(values):
                if col in COLUMNS[8:]:
                    return ""  # an optional column a row written before it lacks
                raise ConfigError(str(path), f"line {lineno}, {col}", "missing value")
            return values[idx[col]].strip()

        def num(col: str, kind: type, low: float, lineno: int = lineno) -> float:
            raw = get(col)
            try:
                value = kind(raw)
            except ValueError:
                raise ConfigError(str(path), f"line {lineno}, {col}",
                                  f"expected {'an integer' if kind is int else 'a number'}, "
                                  f"got {raw!r}") from None
            if not value >= low or value != value or value in (float("inf"), float("-inf")):
                raise ConfigError(str(path), f"line {lineno}, {col}",
                                  f"expected a finite number >= {low:g}, got {raw!r}")
            return value

        source = get("source")
        if source not in SOURCES:
            raise ConfigError(str(path), f"line {lineno}, source",
                              f"expected one of {', '.join(SOURCES)}, got {source!r}")
        latency = num("latency_ms", float, 0.0)
        throughput = num("throughput_rps", float, 0.0)
        if latency <= 0 or throughput <= 0:
            raise ConfigError(str(path), f"line {lineno}, latency_ms/throughput_rps",
                              "expected positive latency and throughput")
        rows.append(ProfileRow(
            variant=get("variant"), mig_profile=get("mig_profile"), mps=int(num("mps", int, 1)),
            batch=int(num("batch", int, 1)), latency_ms=latency, throughput_rps=throughput,
            memory_mb=num("memory_mb", float, 0.0), source=source, host=get("host"),
            backend=get("backend"), date=get("date"), input=get("input"),
        ))
    return rows


def load_profiles(directory: str | Path) -> ProfileTable:
    """Loads every ``*.csv`` of a profile directory (sorted, later files override earlier ones)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError(str(directory), "(profiles_dir)", "no such profile directory")
    rows: list[ProfileRow] = []
    for csv_path in sorted(directory.glob("*.csv")):
        rows.extend(read_profile_csv(csv_path))
    return ProfileTable(rows, str(directory))


def write_profile_csv(path: str | Path, rows: Iterable[ProfileRow], header_comment: str = "") -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        for line in header_comment.splitlines():
            fh.write(f"# {line}\n" if line else "#\n")
        w = csv.writer(fh, lineterminator="\n")
        rows = list(rows)
        inputs = any(r.input for r in rows)  # modeled rows have none: the column is left out
        w.writerow(COLUMNS if inputs else COLUMNS[:-1])
        for r in rows:
            w.writerow([r.variant, r.mig_profile, r.mps, r.batch, f"{r.latency_ms:.4f}",
                        f"{r.throughput_rps:.3f}", f"{r.memory_mb:.1f}", r.source, r.host,
                        r.backend, r.date, *([r.input] if inputs else [])])


def check_coverage(profiles: ProfileTable, variants: Iterable[str], gpu_profiles: Iterable[str],
                   node_source: str = "") -> None:
    """Rows must name the GPU's MIG profiles, and every variant needs rows on this node."""
    table = set(gpu_profiles)
    for r in profiles.rows():
        if r.mig_profile not in table:
            raise ConfigError(profiles.source or node_source, f"variant {r.variant}, mig_profile",
                              f"MIG profile {r.mig_profile!r} is not in the GPU's table "
                              f"({', '.join(sorted(table))})")
    for variant in variants:
        if not profiles.rows(variant):
            raise ConfigError(profiles.source or node_source, f"variant {variant}",
                              "no profile rows for this variant (run 'jigsaw profile' or "
                              "profiles/generate.py)")
