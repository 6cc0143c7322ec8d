"""The plumbing every profiling run shares: resuming, progress, CSV rows and measuring copies.

``jigsaw.profiler`` (CPU nodes, one process per share) and ``jigsaw.profiler_gpu`` (MIG instances,
one process per MPS client) both run measuring copies of ``jigsaw profile --inside`` and append
their rows to the same CSVs; this module is what they have in common, so neither imports the other
for it.
"""

from __future__ import annotations

import csv
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jigsaw.errors import JigsawError
from jigsaw.profiles import COLUMNS


def host_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{socket.gethostname()} {cpu} ({os.cpu_count()} cpus)".replace(",", " ")



def read_done(path: Path) -> set[tuple[str, str, int, int]]:
    """Keys of the rows already measured in a profile CSV (for resuming).

    Modeled rows do not count: a measured row appended after one replaces it when loaded.
    """
    if not path.exists():
        return set()
    lines = [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]
    done = set()
    for r in csv.DictReader(lines):
        if r.get("source") != "measured":
            continue
        try:
            done.add((r["variant"], r["mig_profile"], int(r["mps"]), int(r["batch"])))
        except (KeyError, ValueError, TypeError):
            continue
    return done


class Progress:
    """tqdm when installed, else one plain line per step with an ETA."""

    def __init__(self, total: int) -> None:
        self.total, self.n, self.t0 = total, 0, time.monotonic()
        try:
            from tqdm import tqdm
            self.bar = tqdm(total=total, unit="row", file=sys.stderr)
        except ImportError:
            self.bar = None

    def step(self, label: str) -> None:
        self.n += 1
        if self.bar is not None:
            self.bar.set_postfix_str(label)
            self.bar.update(1)
            return
        elapsed = time.monotonic() - self.t0
        eta = elapsed / self.n * (self.total - self.n)
        print(f"[{self.n}/{self.total}] {label}  elapsed {elapsed:.0f}s  ETA {eta:.0f}s",
              file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()



def append_row(path: Path, row: list[object]) -> None:
    """Append one row to a profile CSV, writing its header first when the file is new (and
    adding the columns an older file's header lacks)."""
    new = not path.exists()
    if not new:
        lines = path.read_text().splitlines(keepends=True)
        at = next((i for i, ln in enumerate(lines) if ln.strip() and not ln.startswith("#")), None)
        if at is not None and lines[at].rstrip("\r\n").split(",") != list(COLUMNS):
            have = lines[at].rstrip("\r\n").split(",")
            if have == list(COLUMNS[:len(have)]):
                lines[at] = ",".join(COLUMNS) + "\n"
                path.write_text("".join(lines))
    with path.open("a", newline="") as f:
        if new:
            f.write(f"# Measured by `jigsaw profile` on {host_description()}; latency_ms is the p95 of "
                    "one whole batch (decode, pre/post-processing, network), throughput_rps items/s.\n")
            f.write(",".join(COLUMNS) + "\n")
        csv.writer(f, lineterminator="\n").writerow(row)
        f.flush()


COPIES_TIMEOUT_S = 6 * 3600.0


def copy_argv(python: Sequence[str], node: Any, app_path: str | Path | None, seg: str, mps: int, rank: int,
              tmp: Path, variants: Sequence[str], batch_list: Sequence[int], backend: str | None,
              seconds: float, max_iters: int, cpus: Sequence[int] = (),
              copies: int | None = None) -> list[str]:
    """The command line of one measuring copy (``jigsaw profile --inside``)."""
    argv = [*python, "profile", "--node", str(node.source), "--inside", seg, "--mps", str(mps),
            "--rank", str(rank), "--barrier", str(tmp / "barrier"), "--out", str(tmp / f"rank-{rank}"),
            "--variants", ",".join(variants), "--batches", ",".join(map(str, batch_list)),
            "--seconds", str(seconds), "--max-iters", str(max_iters)]
    if app_path is not None:
        argv += ["--app", str(app_path)]
    if backend is not None:
        argv += ["--backend", backend]
    if cpus:
        argv += ["--cpus", ",".join(map(str, cpus))]
    if copies is not None:
        argv += ["--copies", str(copies)]
    return argv


def run_copies(argvs: Sequence[Sequence[str]], env: dict[str, str] | None, what: str) -> None:
    """Run the measuring copies at once; the first failure stops the others and raises."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for argv in argvs:
            procs.append(subprocess.Popen(list(argv), env=env, stdout=subprocess.DEVNULL))
        deadline = time.monotonic() + COPIES_TIMEOUT_S
        while any(p.poll() is None for p in procs):
            failed = [p for p in procs if p.returncode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                why = f"exit {failed[0].returncode}" if failed else f"over {COPIES_TIMEOUT_S:.0f} s"
                raise JigsawError(f"a profile copy in {what} failed ({why})")
            time.sleep(0.05)
        codes = [p.returncode for p in procs]
        if any(codes):
            raise JigsawError(f"a profile copy in {what} failed (exit codes {codes})")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def merge_copies(rank_files: Sequence[Path], throughput: str = "sum",
                 skipped: list[str] | None = None) -> dict[tuple[str, str, int, int], list[str]]:
    """One row per (variant, segment, mps, batch) of copies measured together: the worst p95 and
    the copies' summed throughput and memory (``"sum"``: the copies are one segment's processes)
    or their mean (``"mean"``: each copy is a segment of its own, sharing the CPUs), the backend
    and the input. A row some copy did not write (its batch failed there) is an error, or, given
    ``skipped``, left out and named there."""
    merged: dict[tuple[str, str, int, int], list[Any]] = {}
    counts: dict[tuple[str, str, int, int], int] = {}
    for path in rank_files:
        if not path.exists():
            continue  # this copy wrote no row
        lines = [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]
        for r in csv.DictReader(lines):
            key = (r["variant"], r["mig_profile"], int(r["mps"]), int(r["batch"]))
            lat, thr, mem = float(r["latency_ms"]), float(r["throughput_rps"]), float(r["memory_mb"])
            counts[key] = counts.get(key, 0) + 1
            if key in merged:
                row = merged[key]
                row[0], row[1], row[2] = max(row[0], lat), row[1] + thr, row[2] + mem
            else:
                merged[key] = [lat, thr, mem, r["backend"], r.get("input") or ""]
    incomplete = [k for k, n in counts.items() if n != len(rank_files)]
    if incomplete and skipped is None:
        raise JigsawError(f"profile copies measured different rows (e.g. {incomplete[0]})")
    for k in incomplete:
        assert skipped is not None
        skipped.append(f"{k[0]} {k[1]} mps{k[2]} batch {k[3]}: failed in {len(rank_files) - counts[k]} of "
                       f"{len(rank_files)} copies")
        del merged[k]
    div = len(rank_files) if throughput == "mean" else 1
    return {k: [f"{v[0]:.4f}", f"{v[1] / div:.3f}", f"{v[2] / div:.1f}", v[3], v[4]]
            for k, v in merged.items()}


def report_skipped(skipped: Sequence[str]) -> None:
    """Say which rows were not written and why (a batch that raised or failed an item)."""
    if skipped:
        print(f"jigsaw profile: {len(skipped)} rows not written (a timed batch failed; a batch size "
              "without a row is not planned):", file=sys.stderr)
        for line in skipped:
            print(f"  {line}", file=sys.stderr)
