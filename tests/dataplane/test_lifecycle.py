"""Start-up, idle cost, graceful shutdown and recovery after kill -9."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from dpserver import ROOT, Load, Server, http, image, write_tiny

from jigsaw.testing import shm_entries


def _group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of every live process in a process group."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # field 5 of stat: pgrp
            total += int(fields[11]) + int(fields[12])
    return total / tick


def test_without_emulate_and_gpu_exits_2(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    r = subprocess.run([sys.executable, "-m", "jigsaw.daemon", "--node-config", "examples/h100x4.toml"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "--emulate" in r.stderr and "GPU" in r.stderr


def test_idle_node_uses_under_2_percent_cpu(server_factory, tmp_path):
    args = write_tiny(tmp_path, tasks=[("a", "detector", {1: 1.0}, 1), ("b", "classifier", {1: 1.0}, 1),
                                       ("c", "classifier", {1: 1.0}, 1)],
                      edges=[("a", "b", 2.0), ("a", "c", 1.0)])
    s = server_factory(args)
    assert http("POST", s.url + "/v2/models/tiny/infer", image())[0] == 200
    time.sleep(1.0)
    pgid = s.proc.pid
    c0, t0 = _group_cpu_s(pgid), time.monotonic()
    time.sleep(4.0)
    used = (_group_cpu_s(pgid) - c0) / (time.monotonic() - t0)
    assert used < 0.02, f"idle node used {used:.1%} of a CPU"


def test_sigterm_drains_in_flight_requests_and_cleans_up(tmp_path):
    args = write_tiny(tmp_path, tasks=[("a", "classifier", {1: 500.0}, 1)], latency_slo_ms=5000.0)
    s = Server(args, tmp_path / "drain.log")
    with s:
        result: list = []
        t = threading.Thread(target=lambda: result.append(
            http("POST", s.url + "/v2/models/tiny/infer", image())), daemon=True)
        t.start()
        time.sleep(0.2)
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        late = http("POST", s.url + "/v2/models/tiny/infer", image())
        assert late[0] == 503 and late[2].get("Retry-After")
        t.join(timeout=10)
        assert result and result[0][0] == 200, result
        assert s.proc.wait(timeout=20) == 0
        assert "stopped" in s.log()
    assert shm_entries(s.proc.pid) == []


@pytest.mark.serial  # every daemon that starts removes every dead daemon's leftovers, host-wide
def test_restart_after_kill_9_removes_leftovers(server_factory, tmp_path):
    args = write_tiny(tmp_path, tasks=[("a", "classifier", {1: 1.0}, 1)])
    # a daemon started elsewhere on the host at the same moment may still take them first (outside
    # make test's serial step), so try up to three times
    for attempt in range(3):
        s = Server(args, tmp_path / f"killed-{attempt}.log")
        with s:
            pid = s.proc.pid
            assert shm_entries(pid)
            os.killpg(pid, signal.SIGKILL)
            s.proc.wait(timeout=10)
            assert shm_entries(pid), "kill -9 should leave segments for the next start to remove"
            s2 = server_factory(args, name=f"restarted-{attempt}")
            assert http("GET", s2.url + "/v2/health/ready")[0] == 200
            assert shm_entries(pid) == []
            if "leftovers" in s2.log():
                return
    pytest.fail("no restarted daemon said it removed the leftovers: " + s2.log())


def test_a_taken_port_fails_before_planning_or_starting_processes(tmp_path):
    args = write_tiny(tmp_path, tasks=[("a", "classifier", {1: 1.0}, 1)])
    taken = socket.socket()
    with taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        r = subprocess.run([sys.executable, "-m", "jigsaw.daemon", *args, "--emulate", "--port", str(port)],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert f"127.0.0.1:{port}" in r.stderr and "in use" in r.stderr
    assert "fork server" not in r.stderr and "worker" not in r.stderr and "serving" not in r.stderr


def test_sigterm_to_the_process_group_stops_quietly(tmp_path):
    args = write_tiny(tmp_path, tasks=[("a", "detector", {1: 1.0}, 2), ("b", "classifier", {1: 1.0}, 2)],
                      edges=[("a", "b", 1.0)])
    s = Server([*args, "--controller"], tmp_path / "group.log")
    with s, Load(s.url, "tiny", threads=2):
        time.sleep(0.5)
        os.killpg(s.proc.pid, signal.SIGTERM)  # the daemon, its fork server and every worker
        assert s.proc.wait(timeout=30) == 0
        log = s.log()
        assert "stopped" in log
        assert "restarting it" not in log and "given up" not in log and "Traceback" not in log, log
    assert shm_entries(s.proc.pid) == []
