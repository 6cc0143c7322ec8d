"""jigsawd with and without its fork server (``[server] fork_server``, ``runtime/forkserver.py``):
the node of ``test_kept_worker_dies`` (a re-plan at 3.5 rps keeps its three processes and starts
two of ``b``), spares off so the re-plan starts its processes itself. With the fork server the
workers are its children and say so in ``/admin/workers``; a killed worker is restarted through
it; a killed fork server is started again and the processes started meanwhile take the Python
start; without it every worker is the daemon's child. Every request is answered 200, and no
process or shared-memory segment outlives the daemon."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dpserver import Load, Server, http, worker_pids
from test_kept_worker_dies import APP, slow_b_args

BOUND_S = 60.0
NO_SPARES = "[server]\nspare_workers = 0\n"


def _until(what: str, ok: Callable[[], bool], timeout_s: float = BOUND_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < deadline, f"{what} after {timeout_s:g} s"
        time.sleep(0.05)


def _metric(url: str, name: str) -> float | None:
    m = re.search(rf"^{name} (\S+)$", str(http("GET", f"{url}/metrics")[1]), re.M)
    return float(m.group(1)) if m else None


def _workers(url: str) -> dict[str, Any]:
    status, doc, _ = http("GET", f"{url}/admin/workers")
    assert status == 200, doc
    return doc


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _replan(url: str) -> tuple[set[int], set[int], Load]:
    """Re-plan at 3.5 rps under load; (pids before, pids after, the load)."""
    before = {p["pid"] for p in http("GET", f"{url}/admin/layout")[1]["processes"]}
    with Load(url, APP, threads=2, pause_s=0.05) as load:
        time.sleep(0.3)
        status, doc, _ = http("POST", f"{url}/admin/control", {"app": APP, "replan_rps": 3.5}, timeout_s=120)
        assert status == 200, doc
        gen = doc["generation"]
        _until("the old generation is still draining",
               lambda: all(p["generations"] == [gen]
                           for p in http("GET", f"{url}/admin/layout")[1]["processes"]))
    after = {p["pid"] for p in http("GET", f"{url}/admin/layout")[1]["processes"]}
    return before, after, load


def _all_answered(load: Load) -> None:
    assert load.sent == load.answered and load.statuses.get(200, 0) == load.sent, load.statuses


def test_workers_forked_restarted_through_it_and_a_killed_fork_server_falls_back(tmp_path: Path) -> None:
    seen: set[int] = set()
    with Server(slow_b_args(tmp_path, NO_SPARES), tmp_path / "jigsawd.log") as server:
        assert server.proc is not None
        daemon = server.proc.pid
        doc = _workers(server.url)
        fs = doc["fork_server"]
        assert fs["enabled"] and fs["up"] and fs["forks_total"] == 3 and fs["fallbacks_total"] == 0, fs
        zygote = fs["pid"]
        assert _parent(zygote) == daemon
        assert {w["started_by"] for w in doc["workers"]} == {"fork_server"}
        pids = {w["pid"] for w in doc["workers"]}
        assert pids <= worker_pids(daemon) and all(_parent(p) == zygote for p in pids)
        seen |= pids | {zygote}

        # a killed worker: the supervisor restarts it, through the fork server
        victim = doc["workers"][0]
        os.kill(victim["pid"], signal.SIGKILL)

        def restarted() -> bool:
            rows = {w["worker"]: w for w in _workers(server.url)["workers"]}
            row = rows[victim["worker"]]
            return row["pid"] != victim["pid"] and row["state"] == "ready"
        _until("the killed worker was not restarted", restarted)
        row = next(w for w in _workers(server.url)["workers"] if w["worker"] == victim["worker"])
        assert row["started_by"] == "fork_server" and _parent(row["pid"]) == zygote
        seen.add(row["pid"])

        # a killed fork server: the re-plan's two new processes start with Popen, a new one starts
        serving = {w["pid"] for w in _workers(server.url)["workers"]}
        os.kill(zygote, signal.SIGKILL)
        _until("the fork server did not die", lambda: not _alive(zygote))
        time.sleep(1.5)  # past the worker's idle check of its parent (IDLE_WAIT_S)
        assert all(_alive(p) for p in serving)  # its children serve on: they watch the daemon
        before, after, load = _replan(server.url)
        _all_answered(load)
        started = after - before
        assert len(started) == 2 and before <= after, (before, after)
        rows = {w["pid"]: w for w in _workers(server.url)["workers"]}
        assert {rows[p]["started_by"] for p in started} == {"exec"}
        assert all(_parent(p) == daemon for p in started)
        seen |= after
        _until("the fork server was not started again",
               lambda: _metric(server.url, "jigsaw_fork_server_up") == 1)
        fs = _workers(server.url)["fork_server"]
        assert fs["restarts_total"] == 1 and fs["fallbacks_total"] == 2 and fs["pid"] != zygote, fs
        seen.add(fs["pid"])
        assert _metric(server.url, "jigsaw_fork_server_enabled") == 1
        with Load(server.url, APP, threads=2, pause_s=0.05) as load:
            time.sleep(1.0)
        _all_answered(load)
    # no process outlives the daemon (the Server's exit already checked its shared memory)
    _until("a worker or fork server outlived the daemon", lambda: not any(_alive(p) for p in seen), 10.0)


def test_fork_server_off_starts_each_worker_with_python(tmp_path: Path) -> None:
    extra = NO_SPARES + "fork_server = false\n"
    with Server(slow_b_args(tmp_path, extra), tmp_path / "jigsawd.log") as server:
        assert server.proc is not None
        daemon = server.proc.pid
        before, after, load = _replan(server.url)
        doc = _workers(server.url)
        enabled = _metric(server.url, "jigsaw_fork_server_enabled")
        forks = _metric(server.url, "jigsaw_fork_server_forks_total")
        workers = {p for p in worker_pids(daemon)
                   if b"jigsaw.runtime.worker" in Path(f"/proc/{p}/cmdline").read_bytes()}
    _all_answered(load)
    assert len(after - before) == 2 and before <= after
    assert doc["fork_server"] == {"enabled": False}
    assert {w["started_by"] for w in doc["workers"]} == {"exec"}
    assert enabled == 0 and forks is None
    assert workers == after  # the daemon's own children, each a Python start
