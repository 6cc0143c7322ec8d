"""Spare worker processes: a re-plan that starts processes hands their specs to idle workers
started ahead of need (control file + SIGHUP), and the pool is refilled; ``spare_workers = 0``
turns it off. The node is the one of ``test_kept_worker_dies``: at 3.5 rps the planner keeps its
three processes and adds two of ``b``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dpserver import Load, Server, http, worker_pids
from test_kept_worker_dies import APP, slow_b_args

from jigsaw.testing import SRC

SPARES = 4  # the default [server] spare_workers
WORKER = [sys.executable, "-m", "jigsaw.runtime.worker"]
ENV = dict(os.environ, PYTHONPATH=str(SRC))


def _workers(daemon: int, *, spares: bool = False) -> set[int]:
    """The daemon's worker processes (not its solver child)."""
    out = set()
    for pid in worker_pids(daemon, spares=spares):
        try:
            if b"jigsaw.runtime.worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.add(pid)
        except OSError:
            pass
    return out


def _metric(url: str, name: str) -> float | None:
    text = str(http("GET", f"{url}/metrics")[1])
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def _wait_spares(url: str, n: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _metric(url, "jigsaw_spare_workers") != n:
        assert time.monotonic() < deadline, f"{n} spare workers not ready after {timeout_s:g} s"
        time.sleep(0.1)


def _replan(server: Server) -> tuple[dict[str, Any], dict[str, Any], Load]:
    before = http("GET", f"{server.url}/admin/layout")[1]
    with Load(server.url, APP, threads=2, pause_s=0.05) as load:
        time.sleep(0.3)
        status, doc, _ = http("POST", f"{server.url}/admin/control", {"app": APP, "replan_rps": 3.5},
                              timeout_s=120)
        assert status == 200, doc
        gen = doc["generation"]
        deadline = time.monotonic() + 30
        while True:
            after = http("GET", f"{server.url}/admin/layout")[1]
            if all(p["generations"] == [gen] for p in after["processes"]) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    return before, after, load


def test_replan_hands_its_new_processes_to_spare_workers(tmp_path: Path) -> None:
    with Server(slow_b_args(tmp_path), tmp_path / "jigsawd.log") as server:
        assert server.proc is not None
        daemon = server.proc.pid
        _wait_spares(server.url, SPARES)
        layout = http("GET", f"{server.url}/admin/layout")[1]
        serving = {p["pid"] for p in layout["processes"]}
        spares = _workers(daemon, spares=True) - serving
        assert len(spares) == SPARES and _workers(daemon) == serving
        before, after, load = _replan(server)
        _wait_spares(server.url, SPARES)  # refilled
        used = _metric(server.url, "jigsaw_spare_workers_used_total")
        refilled = _workers(daemon, spares=True) - {p["pid"] for p in after["processes"]}
    assert load.sent == load.answered and load.statuses.get(200, 0) == load.sent, load.statuses
    old = {p["pid"] for p in before["processes"]}
    new = {p["pid"] for p in after["processes"]}
    started = new - old
    assert len(started) == 2 and old <= new  # the three processes kept, two of b started
    assert started <= spares  # run by spares: no Python start on the switch's path
    assert used == 2
    assert len(refilled) == SPARES and refilled & spares == spares - started  # two new ones


def test_spare_workers_off(tmp_path: Path) -> None:
    with Server(slow_b_args(tmp_path, "[server]\nspare_workers = 0\n"), tmp_path / "jigsawd.log") as server:
        assert server.proc is not None
        daemon = server.proc.pid
        before, after, load = _replan(server)
        children = _workers(daemon, spares=True)
        gauge = _metric(server.url, "jigsaw_spare_workers")
    assert load.sent == load.answered and load.statuses.get(200, 0) == load.sent, load.statuses
    assert children == {p["pid"] for p in after["processes"]}  # no idle process besides the workers
    assert len({p["pid"] for p in after["processes"]} - {p["pid"] for p in before["processes"]}) == 2
    assert gauge is None


def test_worker_needs_a_spec_or_spare_mode(tmp_path: Path) -> None:
    for args in ([], ["--spare"], ["--spare", "--spec", "x.json", "--control", "c.json"]):
        done = subprocess.run([*WORKER, *args], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                              env=ENV)
        assert done.returncode == 2 and "expected --spec SPEC, or --spare --control FILE" in done.stderr, done


def test_idle_spare_stops_on_sigterm(tmp_path: Path) -> None:
    control = tmp_path / "spare.json"
    proc = subprocess.Popen([*WORKER, "--spare", "--control", str(control)], stdin=subprocess.DEVNULL,
                            env=ENV)
    try:
        deadline = time.monotonic() + 60
        while not control.with_suffix(".ready").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the spare never got ready"
            time.sleep(0.05)
        assert Path(f"/proc/{proc.pid}/comm").read_text().strip() == "jigsaw-spare"
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
