"""Spare worker processes: started ahead of need, imports done, no spec yet.

A re-plan that starts processes spends most of its switch time starting Python and importing the
worker (hundreds of milliseconds per process, more when several start at once on a small host).
The pool keeps ``size`` idle worker processes (``python -m jigsaw.runtime.worker --spare``); a new
generation hands a spare its process's spec through the spare's control file and SIGHUP, the same
path that tells a kept process to serve a new generation (``generation.tell``), with the
environment the process needs (MIG instance, MPS directories, CPU pinning) set before its backend
loads. The pool is refilled after each re-plan, off the switch's critical path. A spare is only
taken once it has said it is ready (``<control>.ready``): a SIGHUP before its handler exists
would end it. ``[server] spare_workers`` sizes it (0: off); ``/metrics`` counts it. With the fork
server (``runtime/forkserver.py``) a spare is a fork: refilling the pool costs milliseconds of
CPU instead of a Python start each, so the refill no longer competes with serving processes for
the cores; a spare then saves a re-plan only that fork.
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

from jigsaw.runtime.forkserver import Launcher, WorkerProcess, launch

STOP_TIMEOUT_S = 2.0


class SparePool:
    """Up to ``size`` idle worker processes (``refill``), handed out one by one (``take``)."""

    def __init__(self, run_dir: Path, size: int, launcher: Launcher | None = None) -> None:
        self.dir = run_dir / "spares"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.size = size
        self.launcher = launcher
        self.idle: list[tuple[WorkerProcess, Path]] = []
        self.started_total = 0
        self.used_total = 0
        self._next = 0

    def refill(self) -> None:
        """Start spares until ``size`` are idle (without waiting for them); dead ones are dropped."""
        self.idle = [(p, c) for p, c in self.idle if p.poll() is None]
        while len(self.idle) < self.size:
            control = self.dir / f"spare-{self._next}.json"
            self._next += 1
            proc = launch(self.launcher, ["--spare", "--control", str(control)])
            self.idle.append((proc, control))
            self.started_total += 1

    def take(self) -> tuple[WorkerProcess, Path] | None:
        """A ready spare and its control file (the caller hands it a spec), or None."""
        for i, (proc, control) in enumerate(self.idle):
            if proc.poll() is None and control.with_suffix(".ready").exists():
                del self.idle[i]
                self.used_total += 1
                return proc, control
        return None

    def ready(self) -> int:
        return sum(1 for p, c in self.idle if p.poll() is None and c.with_suffix(".ready").exists())

    def pids(self) -> list[int]:
        return [p.pid for p, _ in self.idle if p.poll() is None]

    def prometheus(self) -> str:
        rows = [
            ("jigsaw_spare_workers", "gauge", "idle worker processes ready to take a re-plan's spec",
             self.ready()),
            ("jigsaw_spare_workers_used_total", "counter",
             "processes of re-plans that a spare ran (no Python start on the switch path)",
             self.used_total),
            ("jigsaw_spare_workers_started_total", "counter", "spare worker processes started",
             self.started_total),
        ]
        return "".join(f"# HELP {n} {h}\n# TYPE {n} {t}\n{n} {v}\n" for n, t, h, v in rows)

    def close(self) -> None:
        """Stop every idle spare (SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``)."""
        for proc, _ in self.idle:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
        for proc, _ in self.idle:
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.idle = []
