"""Real daemons on 127.0.0.1 for the data-plane tests: a server context manager and tiny configs.

(A uniquely named module rather than conftest.py, so tests can import its helpers.)
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from jigsaw.testing import ServerError, ServerProcess, free_port, jigsawd_command

ROOT = Path(__file__).resolve().parents[2]
HTTP_FRONTS = ("fast", "aiohttp")
# the HTTP front end the daemons of the running test use (``jigsawd --http``); the conftests'
# ``http_front`` fixture runs every data-plane and fault test once with each
http_front: str | None = None
EXAMPLE_NODE = ROOT / "examples" / "h100x4.toml"


def http(method: str, url: str, body: Any = None, *, raw: bytes | None = None,
         timeout_s: float = 30.0) -> tuple[int, Any, dict[str, str]]:
    """One request; returns (status, parsed JSON or text, headers) also for error statuses."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            status, text, headers = r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        status, text, headers = e.code, e.read().decode(), dict(e.headers)
    try:
        return status, json.loads(text), headers
    except json.JSONDecodeError:
        return status, text, headers


class Server(ServerProcess):
    """``jigsawd`` for a test (``jigsaw.testing``): a failure to start or stop, and any shared
    memory it leaves behind, fail the test."""

    def __init__(self, args: list[str], log_path: Path, ready_timeout_s: float = 90.0,
                 env: dict[str, str] | None = None) -> None:
        port = free_port()
        if http_front is not None and "--http" not in args:
            args = [*args, "--http", http_front]
        super().__init__(jigsawd_command(args, port), port, log_path, name="jigsawd",
                         ready_timeout_s=ready_timeout_s, cwd=ROOT, env=env)

    def __enter__(self) -> Server:
        try:
            self.start()
        except ServerError as exc:
            pytest.fail(str(exc))
        return self

    def stop(self, timeout_s: float = 30.0) -> int:
        try:
            return super().stop(timeout_s)
        except ServerError as exc:
            pytest.fail(str(exc))

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        pid = self.proc.pid
        left = self.close()
        if left:
            pytest.fail(f"jigsawd {pid} left shared memory behind: {left}")


class Load:
    """Closed-loop clients until stopped; counts every request sent and every answer by status.

    Status -1 counts a request that got no HTTP answer at all (connection error, timeout).
    """

    def __init__(self, url: str, model: str, body: Any = None, *, threads: int = 6, pause_s: float = 0.01,
                 bound_s: float = 120.0) -> None:
        self.url = f"{url}/v2/models/{model}/infer"
        self.body = body if body is not None else image(8)
        self.pause_s = pause_s
        self.bound_s = bound_s
        self.sent = 0
        self.statuses: dict[int, int] = {}
        self.answers: list[tuple[float, int, Any]] = []  # (monotonic time, status, body)
        self.waiting: dict[int, int] = {}  # thread -> the number (1, 2, ...) of its unanswered request
        self.answered_numbers: list[int] = []  # those of the answered requests, in answer order
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        end = time.monotonic() + self.bound_s
        while not self.stop.is_set() and time.monotonic() < end:
            me = threading.get_ident()
            with self.lock:
                self.sent += 1
                number = self.waiting[me] = self.sent
            try:
                status, doc, _ = http("POST", self.url, self.body, timeout_s=30)
            except OSError:
                status, doc = -1, None
            with self.lock:
                del self.waiting[me]
                self.answered_numbers.append(number)
                self.statuses[status] = self.statuses.get(status, 0) + 1
                self.answers.append((time.monotonic(), status, doc))
            time.sleep(self.pause_s)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=40)

    def overtaken(self, by: int) -> bool:
        """Whether an unanswered request has seen ``by`` requests sent after it answered: one the
        node holds back (a stopped worker's), not one still on its way through a busy node."""
        with self.lock:
            if not self.waiting:
                return False
            oldest = min(self.waiting.values())
            return sum(1 for n in self.answered_numbers[-4 * by:] if n > oldest) >= by

    @property
    def answered(self) -> int:
        return sum(n for s, n in self.statuses.items() if s > 0)


PROFILE_HEADER = ("variant,mig_profile,mps,batch,latency_ms,throughput_rps,memory_mb,source,host,backend,"
                  "date\n")


def write_tiny(tmp_path: Path, *, tasks: list[tuple[str, str, dict[int, float], int]],
               edges: tuple[tuple[str, str, float], ...] | list[tuple[str, str, float]] = (),
               latency_slo_ms: float = 200.0,
               staleness_ms: float = 1000.0, hop_latency_ms: float = 0.0, max_queue: int = 4096,
               max_payload_bytes: int = 65536, two_inputs: bool = False, name: str = "tiny",
               counts: dict[str, int] | None = None, server: dict[str, float] | None = None) -> list[str]:
    """A one-GPU node serving one app whose tasks are (task, kind, {batch: latency_ms}, max_batch).

    Each task has one variant ``<task>-v`` on ``counts[task]`` (default 1) 1g.10gb x1 segments;
    ``server`` adds ``[server]`` settings. Returns the daemon arguments (``--node-config`` and
    ``--plan``) to serve it.
    """
    d = tmp_path / name
    (d / "profiles").mkdir(parents=True)
    rows = [PROFILE_HEADER]
    app = [f'name = "{name}"', f"latency_slo_ms = {latency_slo_ms}", f"staleness_ms = {staleness_ms}",
           '[[inputs]]', 'name = "image"', 'datatype = "UINT8"', "shape = [-1]"]
    if two_inputs:
        app += ['[[inputs]]', 'name = "meta"', 'datatype = "FP32"', "shape = [2]"]
    instances, variants = [], {}
    for task, kind, lat, max_batch in tasks:
        v = f"{task}-v"
        variants[task] = v
        app += ["[[tasks]]", f'name = "{task}"', f'kind = "{kind}"',
                f'variants = [{{ name = "{v}", accuracy = 1.0 }}]']
        for b, ms in sorted(lat.items()):
            rows.append(f"{v},1g.10gb,1,{b},{ms},{1000.0 * b / max(ms, 0.001):.3f},100,modeled,,,\n")
        instances.append({"task": task, "variant": v, "mig_profile": "1g.10gb", "mps": 1,
                          "max_batch": max_batch, "count": (counts or {}).get(task, 1),
                          "latency_ms": lat[max(lat)],
                          "throughput_rps": 1000.0, "slices": 1})
    for src, dst, factor in edges:
        app += ["[[edges]]", f'from = "{src}"', f'to = "{dst}"', f"factor = {factor}"]
    (d / "profiles" / "tiny.csv").write_text("".join(rows))
    (d / "app.toml").write_text("\n".join(app) + "\n")
    (d / "node.toml").write_text("\n".join([
        f'name = "{name}-node"', 'apps = ["app.toml"]', "[gpus]", 'model = "H100-80GB"', "count = 1",
        "mps_levels = [1]", "batch_sizes = [1, 2, 4]", 'profiles_dir = "profiles"', 'backend = "emulated"',
        "[planner]", f"hop_latency_ms = {hop_latency_ms}",
        "[server]", f"max_queue = {max_queue}", f"max_payload_bytes = {max_payload_bytes}",
        *(f"{k} = {v}" for k, v in (server or {}).items()),
    ]) + "\n")
    plan = {"app": name, "space": "ast", "demand_rps": 1.0, "planned_rps": 1.0, "feasible": True,
            "max_demand_plan": False, "status": "optimal", "objective": 0.0, "accuracy": 1.0,
            "slices_used": sum(int(i["count"]) for i in instances), "slices_available": 7,
            "solve_seconds": 0.0, "gap": 0.0,
            "instances": instances, "lanes": [{"variants": variants, "rate_rps": 1.0}],
            "task_latency_ms": {t: lat[max(lat)] for t, _, lat, _ in tasks}}
    (d / "plan.json").write_text(json.dumps(plan))
    return ["--node-config", str(d / "node.toml"), "--plan", str(d / "plan.json")]


def image(n: int = 4, rid: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"inputs": [{"name": "image", "datatype": "UINT8", "shape": [n],
                                        "data": list(range(n))}]}
    if rid is not None:
        body["id"] = rid
    return body


def _idle_spare(pid: int, stat: str) -> bool:
    """A spare worker that has not been handed a spec. It is named ``jigsaw-spare`` only once its
    imports are done, so a spare still starting is told by its command line: ``--spare`` with a
    control file the daemon has not written yet (it writes it before the SIGHUP that hands a spec)."""
    if stat.startswith(f"{pid} (jigsaw-spare)"):
        return True
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if b"--spare" not in argv or b"--control" not in argv:
        return False
    i = argv.index(b"--control") + 1
    return i < len(argv) and not Path(os.fsdecode(argv[i])).exists()


def _children(parent: int) -> dict[int, str]:
    """``parent``'s direct children and their /proc stat lines."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                out[int(entry)] = stat
    return out


def _is_solver(pid: int) -> bool:
    """Whether ``pid`` is the daemon's solver process (by its command line: it names itself
    only once its imports are done)."""
    try:
        return b"jigsaw.control.solver" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def worker_pids(daemon_pid: int, *, spares: bool = False) -> set[int]:
    """The daemon's worker processes, from /proc: its direct children and those of its fork server
    (``runtime/forkserver.py``, named ``jigsaw-zygote``), not the fork server itself nor the
    solver process (``control/solver.py``, ``jigsaw-solver``); idle spare workers
    (``runtime/spares.py``) only with ``spares``."""
    found = {pid: stat for pid, stat in _children(daemon_pid).items() if not _is_solver(pid)}
    for pid, stat in list(found.items()):
        if stat.startswith(f"{pid} (jigsaw-zygote)"):
            del found[pid]
            found.update(_children(pid))
    return {pid for pid, stat in found.items() if spares or not _idle_spare(pid, stat)}
