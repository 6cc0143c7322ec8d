"""Data-plane benchmark: jigsawd on the emulated backend, measured end to end on this machine.

    PYTHONPATH=src python bench/dataplane.py [--quick] [--json OUT] [--connections 32]
        [--traffic-demand 300] [--traffic-seconds 20] [--time-scale 1]

Five measurements in one run, every number emulated (profile latencies, no GPU) on this machine:

1. frontend throughput: a closed-loop client (wrk when installed) with N connections against
   jigsawd serving a 1-task app whose emulated task takes ~0 ms, once per HTTP front end
   (``--fronts fast,aiohttp``), and against a plain aiohttp+uvloop JSON echo server (same body,
   same client, alternating rounds); req/s of each and the ratios (target >= 0.6);
1g. gRPC: the same 1-task app on one jigsawd through Triton's gRPC service (raw input contents)
   and through the HTTP fast path with binary tensors, alternating rounds, in-process clients at
   the same concurrency: req/s, the ratio (target >= 0.8) and the server's CPU per request;
2. added latency per hop: a 3-task chain of ~0 ms tasks and the 1-task app under open-loop
   Poisson load at 500 and 2000 req/s; per hop = (p_chain - p_single) / 2 (the chain has two
   more ring hops than the single task), for p50 and p99 (target p99 <= 1 ms per hop), also from
   the per-task ``queue_us`` timings the frontend returns in ``parameters``;
2b. where a hop's time goes: the chain alone at the first rate, every record's timeline kept
   (``JIGSAW_HOP_TRACE``): p50/p99 of each step from the frontend's push to its answer;
3. the traffic app (examples/apps/traffic_analysis.toml) on the emulated examples/h100x4.toml node,
   planned by jigsawd at a demand D and loaded with open-loop Poisson traffic at D: achieved
   throughput, mean fan-out, latency and SLO violations (a 504, a 503 or a transport error counts
   as a violation, as does a 200 later than the app's latency SLO). With ``--time-scale K`` the
   daemon multiplies every emulated latency and the SLO by K and the load is sent at D / K, which
   is the same system slowed down K times (for a machine whose cores cannot keep up in real time).

The client runs in this process (uvloop) and shares the machine's cores with the servers, so the
numbers describe the whole node on this machine, not the frontend alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import uvloop

from jigsaw.testing import SHM, ServerError, ServerProcess, free_port, jigsawd_command, shm_entries

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_NODE = ROOT / "examples" / "h100x4.toml"
LABEL = "emulated, this machine"
# issue 12's targets: per hop at 500 req/s p50 <= 50 us, p99 <= 250 us; at 2000 req/s p99 <= 1 ms
# and the 1-task app's server-side p99 <= 5 ms; throughput >= 0.6x the echo server
HOP_TARGETS_MS = {500: (0.050, 0.250), 2000: (None, 1.0)}
HOP_TARGET_P99_MS = 1.0
SINGLE_P99_TARGET_MS = {2000: 5.0}
RATIO_TARGET = 0.6

ECHO_SERVER = '''
import asyncio, json, sys
import uvloop
from aiohttp import web

async def echo(request):
    return web.json_response(json.loads(await request.read()))

async def main(port):
    app = web.Application(client_max_size=1 << 20)
    app.router.add_post("/v2/models/{name}/infer", echo)
    app.router.add_get("/ready", lambda r: web.json_response({"ready": True}))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()

uvloop.run(main(int(sys.argv[1])))
'''


# ---- processes ------------------------------------------------------------------------------
STARTED_PIDS: list[int] = []  # every server process this run started (jigsawd names its segments by pid)
SERVER_CPUS = ""  # --server-cpus: the CPUs jigsawd and its workers are pinned to ("": not pinned)


def shm_jigsaw(pids: list[int] | None = None) -> set[str]:
    """/dev/shm entries with a ``jigsaw-`` prefix, only those of ``pids`` when given."""
    if pids is not None:
        return {e for pid in pids for e in shm_entries(pid)}
    return {e for e in os.listdir(SHM) if e.startswith("jigsaw-") or e.startswith("sem.jigsaw-")}


class Proc(ServerProcess):
    """A server of this bench (``jigsaw.testing.ServerProcess``); its leftovers are reported."""

    def start(self) -> Proc:
        super().start()
        assert self.proc is not None
        STARTED_PIDS.append(self.proc.pid)
        return self

    def close(self, timeout_s: float = 30.0) -> list[str]:
        pid = self.proc.pid if self.proc is not None else None
        try:
            left = super().close(timeout_s)
        except ServerError:
            print(f"  {self.name} did not stop within {timeout_s:g} s: killed its process group", flush=True)
            left = []
        if left:
            print(f"  WARNING: {self.name} (pid {pid}) left {len(left)} shared-memory entries (removed)",
                  flush=True)
        return left


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def jigsawd(args: list[str], log_path: Path, env: dict[str, str] | None = None,
            emulate: bool = True) -> tuple[Proc, str]:
    port = free_port()
    cmd = jigsawd_command(args, port, emulate=emulate)
    if SERVER_CPUS:  # every process of the node (workers inherit the daemon's CPUs)
        cmd = ["taskset", "-c", SERVER_CPUS, *cmd]
    server = Proc(cmd, port, log_path, name="jigsawd", ready_timeout_s=180.0,
                  cwd=ROOT, env=env)
    return server, server.url


# ---- tiny zero-latency apps -----------------------------------------------------------------
PROFILE_HEADER = ("variant,mig_profile,mps,batch,latency_ms,throughput_rps,memory_mb,source,host,backend,"
                  "date\n")
ZERO_MS = 0.001
BATCHES = (1, 2, 4)


def write_zero_apps(d: Path, server_settings: tuple[str, ...] = ()) -> list[str]:
    """One node serving ``single`` (task t0) and ``chain`` (a -> b -> c), every task ~0 ms emulated;
    ``server_settings`` ("key = value" TOML lines) are added to its ``[server]`` table."""
    (d / "profiles").mkdir(parents=True)
    rows = [PROFILE_HEADER]
    plans = []
    for app_name, tasks in (("single", ["t0"]), ("chain", ["a", "b", "c"])):
        lines = [f'name = "{app_name}"', "latency_slo_ms = 5000.0", "staleness_ms = 5000.0",
                 "[[inputs]]", 'name = "image"', 'datatype = "UINT8"', "shape = [-1]"]
        instances, variants = [], {}
        for task in tasks:
            v = f"{app_name}-{task}-v"
            variants[task] = v
            lines += ["[[tasks]]", f'name = "{task}"', 'kind = "generic"',
                      f'variants = [{{ name = "{v}", accuracy = 1.0 }}]']
            for b in BATCHES:
                rows.append(f"{v},1g.10gb,1,{b},{ZERO_MS},{1000.0 * b / ZERO_MS:.3f},100,modeled,,,\n")
            instances.append({"task": task, "variant": v, "mig_profile": "1g.10gb", "mps": 1,
                              "max_batch": max(BATCHES), "count": 1, "latency_ms": ZERO_MS,
                              "throughput_rps": 1000.0, "slices": 1})
        for src, dst in itertools.pairwise(tasks):
            lines += ["[[edges]]", f'from = "{src}"', f'to = "{dst}"', "factor = 1.0"]
        (d / f"{app_name}.toml").write_text("\n".join(lines) + "\n")
        plan = {"app": app_name, "space": "ast", "demand_rps": 1.0, "planned_rps": 1.0, "feasible": True,
                "max_demand_plan": False, "status": "optimal", "objective": 0.0, "accuracy": 1.0,
                "slices_used": len(instances), "slices_available": 7, "solve_seconds": 0.0, "gap": 0.0,
                "instances": instances, "lanes": [{"variants": variants, "rate_rps": 1.0}],
                "task_latency_ms": {t: ZERO_MS for t in tasks}}
        (d / f"{app_name}.plan.json").write_text(json.dumps(plan))
        plans += ["--plan", str(d / f"{app_name}.plan.json")]
    (d / "profiles" / "zero.csv").write_text("".join(rows))
    (d / "node.toml").write_text("\n".join([
        'name = "bench-zero-node"', 'apps = ["single.toml", "chain.toml"]', "[gpus]", 'model = "H100-80GB"',
        "count = 1", "mps_levels = [1]", "batch_sizes = [1, 2, 4]", 'profiles_dir = "profiles"',
        'backend = "emulated"', "[planner]", "hop_latency_ms = 0.0",
        "[server]", "max_queue = 4096", "max_payload_bytes = 65536", *server_settings,
    ]) + "\n")
    return ["--node-config", str(d / "node.toml"), *plans]


def infer_body(n: int = 16) -> bytes:
    return json.dumps({"inputs": [{"name": "image", "datatype": "UINT8", "shape": [n],
                                   "data": list(range(n))}]}).encode()


HEADERS = {"Content-Type": "application/json"}


# ---- clients --------------------------------------------------------------------------------
async def closed_loop(url: str, body: bytes, connections: int, seconds: float,
                      warmup_s: float) -> dict[str, Any]:
    """N coroutines, each sending its next request when the previous one is answered."""
    conn = aiohttp.TCPConnector(limit=connections)
    counts = {"ok": 0, "other": 0}
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=30)) as session:
        measuring = False
        end = time.perf_counter() + warmup_s + seconds

        async def worker() -> None:
            while time.perf_counter() < end:
                try:
                    async with session.post(url, data=body, headers=HEADERS) as r:
                        await r.read()
                        ok = r.status == 200
                except aiohttp.ClientError:
                    ok = False
                if measuring:
                    counts["ok" if ok else "other"] += 1

        tasks = [asyncio.create_task(worker()) for _ in range(connections)]
        await asyncio.sleep(warmup_s)
        measuring = True
        t0 = time.perf_counter()
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - t0
    return {"rps": counts["ok"] / elapsed, "ok": counts["ok"], "errors": counts["other"], "seconds": elapsed}


async def open_loop(url: str, body: bytes, rate: float, seconds: float, seed: int,
                    drain_timeout_s: float = 60.0) -> dict[str, Any]:
    """Poisson arrivals at ``rate``; one record per request: (status, latency_s, lag_s, parameters)."""
    rng = random.Random(seed)
    records: list[tuple[int, float, float, dict[str, Any] | None]] = []
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def one(t_sched: float) -> None:
            t_start = time.perf_counter()
            params = None
            try:
                async with session.post(url, data=body, headers=HEADERS) as r:
                    raw = await r.read()
                    status = r.status
                t_end = time.perf_counter()
                if status == 200:
                    params = json.loads(raw).get("parameters")
                elif status == 504:  # keep who dropped it and why
                    with contextlib.suppress(ValueError, AttributeError):
                        doc = json.loads(raw)
                        params = {"drop": f"{doc.get('task') or 'frontend'}:{doc.get('reason')}"}
            except (TimeoutError, aiohttp.ClientError):
                status, t_end = 0, time.perf_counter()
            records.append((status, t_end - t_start, t_start - t_sched, params))

        pending: set[asyncio.Task[None]] = set()
        t0 = time.perf_counter()
        end = t0 + seconds
        next_t = t0
        sent = 0
        while True:
            next_t += rng.expovariate(rate)
            if next_t >= end:
                break
            delay = next_t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(one(next_t))
            pending.add(task)
            task.add_done_callback(pending.discard)
            sent += 1
        send_elapsed = time.perf_counter() - t0
        if pending:
            await asyncio.wait(pending, timeout=drain_timeout_s)
        unanswered = len(pending)
        for task in list(pending):
            task.cancel()
        total_elapsed = time.perf_counter() - t0
    return {"offered_rps": rate, "sent": sent, "sent_rps": sent / send_elapsed, "records": records,
            "unanswered": unanswered, "seconds": seconds, "total_seconds": total_elapsed}


# ---- a low-CPU open-loop generator and wrk --------------------------------------------------
class _Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection carrying one request at a time; parses only the status
    line and Content-Length, keeps the body bytes (decoded after the run, off the clock)."""

    def __init__(self, gen: RawOpenLoop) -> None:
        self.gen = gen
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.t_sched = self.t_start = 0.0
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, t_sched: float) -> None:
        self.busy = True
        self.t_sched, self.t_start = t_sched, time.perf_counter()
        assert self.transport is not None
        self.transport.write(self.gen.request)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return
        i = buf.find(b"\r\ncontent-length:", 0, end)
        if i < 0:
            i = buf.find(b"\r\nContent-Length:", 0, end)
        j = buf.find(b"\r\n", i + 17)
        n = int(buf[i + 17:j])
        if len(buf) < end + 4 + n:
            return
        t_end = time.perf_counter()
        status = int(buf[9:12])
        self.gen.done.append((status, t_end - self.t_start, self.t_start - self.t_sched,
                              bytes(buf[end + 4:end + 4 + n])))
        del buf[:end + 4 + n]
        self.busy = False
        self.gen.idle.append(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.busy:
            self.gen.done.append((0, time.perf_counter() - self.t_start, self.t_start - self.t_sched, b""))
        self.busy = True  # never reused
        self.gen.lost += 1


class RawOpenLoop:
    """Open-loop load on a fixed Poisson schedule over a pool of keep-alive connections.

    Costs little CPU per request (a pre-encoded request, a minimal response parse, JSON decoded
    after the run), so the server keeps the cores; a request whose time has come goes out on an
    idle connection, or on a new one when none is idle.
    """

    def __init__(self, host: str, port: int, path: str, body: bytes) -> None:
        self.host, self.port = host, port
        self.request = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        self.idle: list[_Conn] = []
        self.done: list[tuple[int, float, float, bytes]] = []
        self.lost = 0

    async def _conn(self) -> _Conn:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(lambda: _Conn(self), self.host, self.port)
        return conn

    async def run(self, rate: float, seconds: float, seed: int, pool: int = 32,
                  drain_timeout_s: float = 60.0) -> dict[str, Any]:
        rng = random.Random(seed)
        schedule = []
        t = 0.0
        while True:
            t += rng.expovariate(rate)
            if t >= seconds:
                break
            schedule.append(t)
        self.idle = [await self._conn() for _ in range(pool)]
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        sent = 0
        opening = 0
        for at in schedule:
            delay = t0 + at - time.perf_counter()
            if delay > 0.0005:
                await asyncio.sleep(delay)
            while not self.idle:
                opening += 1
                self.idle.append(await self._conn())
            self.idle.pop().send(t0 + at)
            sent += 1
        send_elapsed = time.perf_counter() - t0
        give_up = time.perf_counter() + drain_timeout_s
        while len(self.done) < sent and time.perf_counter() < give_up:
            await asyncio.sleep(0.01)
        cpu_s = time.process_time() - cpu0
        total = time.perf_counter() - t0
        for c in self.idle:
            if c.transport is not None:
                c.transport.close()
        records = []
        for status, lat, lag, raw in self.done:
            params = None
            if status == 200:
                params = json.loads(raw).get("parameters")
            elif status == 504:
                with contextlib.suppress(ValueError, AttributeError):
                    doc = json.loads(raw)
                    params = {"drop": f"{doc.get('task') or 'frontend'}:{doc.get('reason')}"}
            records.append((status, lat, lag, params))
        return {"offered_rps": rate, "sent": sent, "sent_rps": sent / send_elapsed, "records": records,
                "unanswered": sent - len(self.done), "seconds": seconds, "total_seconds": total,
                "generator_cpu_s": cpu_s, "generator_cpu_pct": 100.0 * cpu_s / total,
                "connections_opened": pool + opening}


def raw_open_loop(url: str, path: str, body: bytes, rate: float, seconds: float, seed: int) -> dict[str, Any]:
    host, port = url.removeprefix("http://").split(":")
    return uvloop.run(RawOpenLoop(host, int(port), path, body).run(rate, seconds, seed))


def wrk_path() -> str | None:
    """Debian's wrk when installed (``scripts/wrk.sh install`` installs it)."""
    found = shutil.which("wrk")
    return found or ("/usr/bin/wrk" if os.access("/usr/bin/wrk", os.X_OK) else None)


WRK_LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = io.open(os.getenv("JIGSAW_BENCH_BODY"), "rb"):read("*a")
done = function(summary, latency, requests)
    io.write(string.format("JIGSAW non2xx=%d\\n", summary.errors.status))
end
"""


def wrk_closed_loop(wrk: str, url: str, body: bytes, connections: int, seconds: float, warmup_s: float,
                    work: Path) -> dict[str, Any]:
    """``wrk -t1 -c N``: its req/s, errors, and its own CPU use (from its rusage)."""
    (work / "body.json").write_bytes(body)
    (work / "post.lua").write_text(WRK_LUA)
    env = dict(os.environ, JIGSAW_BENCH_BODY=str(work / "body.json"))
    if warmup_s > 0:
        subprocess.run([wrk, "-t1", f"-c{connections}", f"-d{max(1, round(warmup_s))}s", "-s",
                        str(work / "post.lua"), url], env=env, capture_output=True, timeout=120, check=False)
    proc = subprocess.Popen([wrk, "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "-s",
                             str(work / "post.lua"), url], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    t0 = time.perf_counter()
    out = proc.stdout.read().decode() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    elapsed = time.perf_counter() - t0
    rps = next((float(line.split()[1]) for line in out.splitlines() if line.startswith("Requests/sec:")), 0.0)
    total = next((int(line.split()[0]) for line in out.splitlines() if "requests in" in line), 0)
    non2xx = next((int(line.split("=")[1]) for line in out.splitlines()
                   if line.startswith("JIGSAW non2xx=")), 0)
    sock = next((line.strip() for line in out.splitlines() if "Socket errors" in line), "")
    cpu_s = usage.ru_utime + usage.ru_stime
    return {"rps": rps, "ok": total - non2xx, "errors": non2xx, "socket_errors": sock, "seconds": elapsed,
            "generator": "wrk", "generator_cpu_s": cpu_s, "generator_cpu_pct": 100.0 * cpu_s / elapsed}


# ---- CPU of the server's processes from /proc -----------------------------------------------
def group_cpu_ticks(pgid: int) -> dict[int, int]:
    """utime + stime (clock ticks) of every process in the process group ``pgid``."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after "(comm)": state ppid pgrp ... utime(12) stime(13)
            out[int(entry)] = int(fields[11]) + int(fields[12])
    return out


COUNTS = ("syscr", "syscw", "voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")


def proc_counts(pid: int) -> dict[str, int]:
    """A process's read and write system calls and its voluntary (it slept: a wake-up) and
    involuntary (preempted) context switches so far, from /proc: per request these are much
    steadier than timings on a shared machine; empty when /proc does not say."""
    out = {}
    for path in (f"/proc/{pid}/io", f"/proc/{pid}/status"):
        try:
            with open(path) as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key in COUNTS:
                        out[key] = int(value)
        except OSError:
            pass
    return out


def group_counts(pgid: int) -> dict[int, dict[str, int]]:
    """``proc_counts`` of every process in the process group ``pgid``."""
    return {pid: proc_counts(pid) for pid in group_cpu_ticks(pgid)}


def idle_cpu(pgid: int, seconds: float = 3.0) -> dict[str, Any]:
    """Each process's CPU share while the server is idle (target < 2%)."""
    hz = os.sysconf("SC_CLK_TCK")
    a = group_cpu_ticks(pgid)
    time.sleep(seconds)
    b = group_cpu_ticks(pgid)
    pct_by_pid = {pid: 100.0 * (b[pid] - a.get(pid, 0)) / hz / seconds for pid in b}
    return {"processes": len(pct_by_pid), "max_pct": max(pct_by_pid.values(), default=0.0),
            "total_pct": sum(pct_by_pid.values()), "seconds": seconds}


def pct(values: list[float] | np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


# ---- 1. frontend throughput -----------------------------------------------------------------
def bench_throughput(zero_args: list[str], work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The same closed-loop client against the echo server and jigsawd, both up at once and loaded
    in alternating rounds (so a neighbour's burst on a shared machine hits both alike): wrk when
    installed (it leaves the servers the cores), else the in-process aiohttp client. Also each
    server's CPU time per answered request (all its processes, from /proc): a figure that other
    work on the machine does not inflate."""
    body = infer_body()
    port = free_port()
    echo_path = work / "echo_server.py"
    echo_path.write_text(ECHO_SERVER)
    wrk = None if args.aiohttp_client else wrk_path()
    rounds = max(1, args.rounds)

    def load(url: str, seconds: float, warmup_s: float) -> dict[str, Any]:
        if wrk is not None:
            return wrk_closed_loop(wrk, url, body, args.connections, seconds, warmup_s, work)
        t0, cpu0 = time.perf_counter(), time.process_time()
        r = uvloop.run(closed_loop(url, body, args.connections, seconds, warmup_s))
        cpu_s = time.process_time() - cpu0
        return {**r, "generator": "aiohttp (in process)", "generator_cpu_s": cpu_s,
                "generator_cpu_pct": 100.0 * cpu_s / (time.perf_counter() - t0)}

    echo_server = Proc([sys.executable, str(echo_path), str(port)], port, work / "echo.log",
                       ready_path="/ready", name="echo", ready_timeout_s=180.0, cwd=ROOT)
    jigs = {f"jigsaw_{front}": jigsawd([*zero_args, "--http", front], work / f"jigsawd-zero-tp-{front}.log")
            for front in args.fronts}
    totals: dict[str, dict[str, Any]] = {}
    with contextlib.ExitStack() as stack:
        stack.enter_context(echo_server)
        for server, _ in jigs.values():
            stack.enter_context(server)
        urls = {"echo": f"http://127.0.0.1:{port}/v2/models/single/infer",
                **{name: url + "/v2/models/single/infer" for name, (_, url) in jigs.items()}}
        pgids = {"echo": echo_server.proc.pid,  # type: ignore[union-attr]
                 **{name: server.proc.pid for name, (server, _) in jigs.items()}}  # type: ignore[union-attr]
        for url in urls.values():
            load(url, args.warmup, 0)
        for _ in range(rounds):
            for name, url in urls.items():
                before, counts0 = group_cpu_ticks(pgids[name]), group_counts(pgids[name])
                r = load(url, args.tp_seconds / rounds, 0)
                after, counts1 = group_cpu_ticks(pgids[name]), group_counts(pgids[name])
                ticks = sum(after.values()) - sum(before.values())
                lead = after.get(pgids[name], 0) - before.get(pgids[name], 0)  # the daemon (frontend)
                t = totals.setdefault(name, {"ok": 0, "errors": 0, "seconds": 0.0, "server_cpu_s": 0.0,
                                             "lead_cpu_s": 0.0, "generator_cpu_s": 0.0,
                                             "generator": r["generator"]})
                t["ok"] += r["ok"]
                t["errors"] += r["errors"]
                t["seconds"] += r["seconds"]
                t["generator_cpu_s"] += r["generator_cpu_s"]
                t["server_cpu_s"] += ticks / os.sysconf("SC_CLK_TCK")
                t["lead_cpu_s"] += lead / os.sysconf("SC_CLK_TCK")
                for pid, c1 in counts1.items():  # the lead process (frontend) and the rest (workers)
                    who = "lead" if pid == pgids[name] else "rest"
                    for key, v in c1.items():
                        k = f"{who}_{key}"
                        t[k] = t.get(k, 0) + v - counts0.get(pid, {}).get(key, v)
    for t in totals.values():
        t["rps"] = t["ok"] / t["seconds"] if t["seconds"] else 0.0
        t["generator_cpu_pct"] = 100.0 * t["generator_cpu_s"] / t["seconds"] if t["seconds"] else 0.0
        t["server_cpu_us_per_request"] = 1e6 * t["server_cpu_s"] / t["ok"] if t["ok"] else float("nan")
        t["lead_cpu_us_per_request"] = 1e6 * t["lead_cpu_s"] / t["ok"] if t["ok"] else float("nan")
        t["per_request"] = {k: t[k] / t["ok"] if t["ok"] else float("nan")
                            for k in [f"{w}_{c}" for w in ("lead", "rest") for c in COUNTS] if k in t}
    echo = totals["echo"]
    out = {"echo": echo, "connections": args.connections, "target_ratio": RATIO_TARGET,
           "generator": echo["generator"], "rounds": rounds, "fronts": list(args.fronts)}
    for front in args.fronts:
        jig = totals[f"jigsaw_{front}"]
        out[f"jigsaw_{front}"] = jig
        out[f"ratio_{front}"] = jig["rps"] / echo["rps"] if echo["rps"] else 0.0
    first = args.fronts[0]
    out["jigsaw"], out["ratio"] = out[f"jigsaw_{first}"], out[f"ratio_{first}"]  # the headline front end
    return out


# ---- 1g. gRPC against the HTTP fast path's binary tensors ----------------------------------
GRPC_RATIO_TARGET = 0.8
BINARY_N = 16  # input bytes of one request


def binary_body(n: int = BINARY_N) -> tuple[bytes, dict[str, str]]:
    """Triton's binary tensor extension: the JSON header, then the raw input, outputs binary too."""
    head = json.dumps({"inputs": [{"name": "image", "datatype": "UINT8", "shape": [n],
                                   "parameters": {"binary_data_size": n}}],
                       "parameters": {"binary_data_output": True}}).encode()
    return head + bytes(range(n)), {"Content-Type": "application/octet-stream",
                                    "Inference-Header-Content-Length": str(len(head))}


async def closed_loop_binary(url: str, connections: int, seconds: float) -> dict[str, Any]:
    body, headers = binary_body()
    conn = aiohttp.TCPConnector(limit=connections)
    counts = {"ok": 0, "other": 0}
    end = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=30)) as session:
        async def worker() -> None:
            while time.perf_counter() < end:
                try:
                    async with session.post(url, data=body, headers=headers) as r:
                        await r.read()
                        counts["ok" if r.status == 200 else "other"] += 1
                except aiohttp.ClientError:
                    counts["other"] += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(connections)))
        elapsed = time.perf_counter() - t0
    return {"ok": counts["ok"], "errors": counts["other"], "seconds": elapsed}


async def closed_loop_grpc(target: str, connections: int, seconds: float,
                           channels: int = 4) -> dict[str, Any]:
    """N calls in flight over a few HTTP/2 channels, raw input contents (what tritonclient sends)."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pbg
    req = pb.ModelInferRequest(model_name="single")
    req.inputs.add(name="image", datatype="UINT8", shape=[BINARY_N])
    req.raw_input_contents.append(bytes(range(BINARY_N)))
    chans = [grpc.aio.insecure_channel(target) for _ in range(channels)]
    stubs = [pbg.GRPCInferenceServiceStub(c) for c in chans]
    counts = {"ok": 0, "other": 0}
    end = time.perf_counter() + seconds

    async def worker(k: int) -> None:
        infer = stubs[k % len(stubs)].ModelInfer
        while time.perf_counter() < end:
            try:
                await infer(req, timeout=30)
                counts["ok"] += 1
            except grpc.aio.AioRpcError:
                counts["other"] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(connections)))
    elapsed = time.perf_counter() - t0
    for c in chans:
        await c.close()
    return {"ok": counts["ok"], "errors": counts["other"], "seconds": elapsed}


async def closed_loop_grpc_stream(target: str, connections: int, seconds: float,
                                  streams: int = 4) -> dict[str, Any]:
    """``ModelStreamInfer``: ``connections`` requests in flight over a few streams (one channel
    each), a new request written as each answer is read."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pbg
    req = pb.ModelInferRequest(model_name="single")
    req.inputs.add(name="image", datatype="UINT8", shape=[BINARY_N])
    req.raw_input_contents.append(bytes(range(BINARY_N)))
    counts = {"ok": 0, "other": 0}
    end = time.perf_counter() + seconds

    async def one(depth: int) -> None:
        async with grpc.aio.insecure_channel(target) as channel:
            call = pbg.GRPCInferenceServiceStub(channel).ModelStreamInfer()
            for _ in range(depth):
                await call.write(req)
            inflight = depth
            while inflight:
                answer = await call.read()
                if answer is grpc.aio.EOF:
                    break
                inflight -= 1
                counts["other" if answer.error_message else "ok"] += 1
                if time.perf_counter() < end:
                    await call.write(req)
                    inflight += 1
            await call.done_writing()

    t0 = time.perf_counter()
    await asyncio.gather(*(one(connections // streams + (k < connections % streams)) for k in range(streams)))
    return {"ok": counts["ok"], "errors": counts["other"], "seconds": time.perf_counter() - t0}


def bench_grpc(zero_args: list[str], work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """gRPC against the HTTP fast path on one jigsawd (the 1-task ~0 ms app), the same clients'
    machinery (in-process, uvloop) and concurrency, alternating rounds; req/s and the server's CPU
    per answered request (all its processes, from /proc: what other load does not inflate)."""
    grpc_port = free_port()
    server, url = jigsawd([*zero_args, "--http", "fast", "--grpc-port", str(grpc_port)],
                          work / "jigsawd-grpc.log")
    runs = {"http_binary": lambda s: closed_loop_binary(url + "/v2/models/single/infer", args.connections, s),
            "grpc": lambda s: closed_loop_grpc(f"127.0.0.1:{grpc_port}", args.connections, s),
            "grpc_stream": lambda s: closed_loop_grpc_stream(f"127.0.0.1:{grpc_port}", args.connections, s)}
    totals = {name: {"ok": 0, "errors": 0, "seconds": 0.0, "server_cpu_s": 0.0, "generator_cpu_s": 0.0}
              for name in runs}
    with server:
        pgid = server.proc.pid  # type: ignore[union-attr]
        for run in runs.values():
            uvloop.run(run(args.warmup))
        for _ in range(max(1, args.rounds)):
            for name, run in runs.items():
                before, cpu0 = group_cpu_ticks(pgid), time.process_time()
                r = uvloop.run(run(args.tp_seconds / max(1, args.rounds)))
                t = totals[name]
                t["generator_cpu_s"] += time.process_time() - cpu0
                t["server_cpu_s"] += (sum(group_cpu_ticks(pgid).values()) - sum(before.values())) / \
                    os.sysconf("SC_CLK_TCK")
                for k in ("ok", "errors", "seconds"):
                    t[k] += r[k]
    for t in totals.values():
        t["rps"] = t["ok"] / t["seconds"] if t["seconds"] else 0.0
        t["server_cpu_us_per_request"] = 1e6 * t["server_cpu_s"] / t["ok"] if t["ok"] else float("nan")
        t["generator_cpu_us_per_request"] = 1e6 * t["generator_cpu_s"] / t["ok"] if t["ok"] else float("nan")
    h, g, gs = totals["http_binary"], totals["grpc"], totals["grpc_stream"]
    return {**totals, "connections": args.connections, "target_ratio": GRPC_RATIO_TARGET,
            "ratio": g["rps"] / h["rps"] if h["rps"] else 0.0,
            "ratio_stream": gs["rps"] / h["rps"] if h["rps"] else 0.0,
            "overhead_us_per_request": g["server_cpu_us_per_request"] - h["server_cpu_us_per_request"],
            "overhead_stream_us_per_request":
                gs["server_cpu_us_per_request"] - h["server_cpu_us_per_request"]}


def print_grpc(gr: dict[str, Any]) -> None:
    for label, key in (("HTTP fast path, binary tensors", "http_binary"),
                       ("gRPC (grpc.aio), raw contents", "grpc"),
                       ("gRPC stream (ModelStreamInfer)", "grpc_stream")):
        x = gr[key]
        print(f"  {label:<32}: {x['rps']:8.0f} req/s ({x['errors']} errors); server CPU "
              f"{x['server_cpu_us_per_request']:.0f} us per request (all its processes); client CPU "
              f"{x['generator_cpu_us_per_request']:.0f} us per request")
    verdict = "meets" if gr["ratio"] >= GRPC_RATIO_TARGET else "MISSES"
    print(f"  ratio gRPC / HTTP binary: {gr['ratio']:.2f} (target >= {GRPC_RATIO_TARGET}: {verdict}); gRPC's "
          f"server overhead per request {gr['overhead_us_per_request']:+.0f} us CPU", flush=True)
    print(f"  ratio gRPC stream / HTTP binary: {gr['ratio_stream']:.2f}; the stream's server overhead per "
          f"request {gr['overhead_stream_us_per_request']:+.0f} us CPU", flush=True)


# ---- 2. per-hop latency ---------------------------------------------------------------------
def _lat_summary(run: dict[str, Any], tasks: list[str]) -> dict[str, Any]:
    recs = run["records"]
    ok = [r for r in recs if r[0] == 200]
    lat_ms = [r[1] * 1e3 for r in ok]
    e2e_ms = [r[3]["e2e_us"] / 1e3 for r in ok if r[3]]
    out: dict[str, Any] = {
        "offered_rps": run["offered_rps"], "sent_rps": run["sent_rps"], "sent": run["sent"], "ok": len(ok),
        "failed": len(recs) - len(ok) + run["unanswered"],
        "client_p50_ms": pct(lat_ms, 50), "client_p99_ms": pct(lat_ms, 99),
        "server_p50_ms": pct(e2e_ms, 50), "server_p99_ms": pct(e2e_ms, 99),
        "client_lag_p99_ms": pct([r[2] * 1e3 for r in recs], 99),
        "generator_cpu_pct": run.get("generator_cpu_pct", float("nan")),
        "server_cpu_us_per_request": run.get("server_cpu_us_per_request", float("nan")),
        "queue_ms": {}, "ring_hop_us": {},
    }
    for t in tasks:
        q = [r[3][f"queue_us.{t}"] / 1e3 for r in ok if r[3] and f"queue_us.{t}" in r[3]]
        out["queue_ms"][t] = {"p50": pct(q, 50), "p99": pct(q, 99)}
        h = [r[3][f"hop_us.{t}"] for r in ok if r[3] and f"hop_us.{t}" in r[3]]
        out["ring_hop_us"][t] = {"p50": pct(h, 50), "p99": pct(h, 99)}
    d = [r[3][f"done_us.{t}"] for r in ok if r[3] for t in tasks if f"done_us.{t}" in r[3]]
    out["ring_hop_us"]["completion"] = {"p50": pct(d, 50), "p99": pct(d, 99)}
    return out


def bench_hops(zero_args: list[str], work: Path, args: argparse.Namespace) -> dict[str, Any]:
    body = infer_body()
    results: dict[str, Any] = {}
    server, url = jigsawd([*zero_args, "--http", args.fronts[0]], work / "jigsawd-zero-hops.log")
    with server:
        assert server.proc is not None

        def run(app: str, rate: float, seconds: float, seed: int) -> dict[str, Any]:
            before = sum(group_cpu_ticks(server.proc.pid).values())  # type: ignore[union-attr]
            if args.aiohttp_client:
                r = uvloop.run(open_loop(f"{url}/v2/models/{app}/infer", body, rate, seconds, seed=seed))
            else:
                r = raw_open_loop(url, f"/v2/models/{app}/infer", body, rate, seconds, seed)
            ticks = sum(group_cpu_ticks(server.proc.pid).values()) - before  # type: ignore[union-attr]
            answered = sum(1 for x in r["records"] if x[0] == 200)
            r["server_cpu_us_per_request"] = (1e6 * ticks / os.sysconf("SC_CLK_TCK") / answered
                                              if answered else float("nan"))
            return r

        # warm both apps, then the idle processes' CPU
        run("single", 200, 0.5, 1)
        run("chain", 200, 0.5, 1)
        results["idle_cpu"] = idle_cpu(server.proc.pid)
        for rate in args.rates:
            single = _lat_summary(run("single", rate, args.hop_seconds, rate), ["t0"])
            chain = _lat_summary(run("chain", rate, args.hop_seconds, rate + 1), ["a", "b", "c"])
            per_hop = {k: (chain[f"{k}_ms"] - single[f"{k}_ms"]) / 2.0
                       for k in ("client_p50", "client_p99", "server_p50", "server_p99")}
            results[str(rate)] = {"single": single, "chain": chain, "per_hop_ms": per_hop}
    return results


# ---- 2b. where a hop's time goes ------------------------------------------------------------
BREAKDOWN_STEPS = [
    ("frontend: request parsed -> root item pushed", "fe.created", "fe.sent"),
    ("frontend: pushed -> doorbell written (first push of a turn: at once)", "fe.sent", "fe.rung"),
    ("wake-up: doorbell written -> worker's loop sees it", "fe.rung", "a.woke"),
    ("worker: woken -> item popped", "a.woke", "a.popped"),
    ("worker: popped -> batch starts (batch formation)", "a.popped", "a.start"),
    ("worker: batch runs (emulated ~0 ms)", "a.start", "a.end"),
    ("worker: batch done -> completion record pushed", "a.end", "a.completion_pushed"),
    ("worker: completion pushed -> child pushed", "a.completion_pushed", "a.children_pushed"),
    ("worker: child pushed -> doorbell written", "a.children_pushed", "a.rung"),
    ("wake-up: doorbell written -> next worker's loop sees it", "a.rung", "b.woke"),
    ("ring hop: child pushed -> popped by the next worker", "a.children_pushed", "b.popped"),
    ("one worker, woken -> next doorbell written", "b.woke", "b.rung"),
    ("a->b hop: popped by a -> popped by b", "a.popped", "b.popped"),
    ("last worker: completion pushed -> doorbell written", "c.completion_pushed", "c.rung"),
    ("wake-up: doorbell written -> frontend's loop sees it", "c.rung", "fe.woke"),
    ("frontend: woken -> request answered (e2e_us stamp)", "fe.woke", "fe.answered"),
    ("  of which: woken -> first records popped", "fe.woke", "fe.popped"),
    ("  of which: popped -> answered (records accounted, answer built)", "fe.popped", "fe.answered"),
    ("frontend: answered -> response written to the socket", "fe.answered", "fe.written"),
    ("server e2e: request parsed -> answered", "fe.created", "fe.answered"),
]


def read_traces(trace_dir: Path) -> dict[int, dict[str, int]]:
    """Each chain request's timeline, ``{"fe.sent": ns, "a.popped": ns, ...}``, from the
    ``JIGSAW_HOP_TRACE`` files (``runtime/records.py``) of one jigsawd serving ``chain`` only."""
    by_request: dict[int, dict[str, int]] = {}
    workers = []
    for path in sorted(trace_dir.glob("*.json")):
        doc = json.loads(path.read_text())
        if doc["role"] == "frontend":
            for row in doc["rows"]:
                by_request.setdefault(row[1], {}).update(
                    {f"fe.{c}": v for c, v in zip(doc["columns"][2:], row[2:])})
        else:
            workers.append(doc)
    for doc in workers:
        for row in doc["rows"]:
            task = "abc"[row[0]] if row[0] < 3 else f"t{row[0]}"
            stamps = {f"{task}.{c}": v for c, v in zip(doc["columns"][2:], row[2:])}
            by_request.setdefault(row[1], {}).update(stamps)
    return by_request


def summarize_breakdown(by_request: dict[int, dict[str, int]]) -> list[dict[str, Any]]:
    """p50 / p99 (us) of each step of ``BREAKDOWN_STEPS`` over the requests that have both stamps.
    A "woke" stamp older than the doorbell before it means the loop was awake already (no wake-up
    needed, the step is left out for that request)."""
    out = []
    for label, start, end in BREAKDOWN_STEPS:
        vals = [(t[end] - t[start]) / 1e3 for t in by_request.values()
                if t.get(start) and t.get(end) and t[end] >= t[start]]
        skipped = sum(1 for t in by_request.values() if t.get(start) and t.get(end) and t[end] < t[start])
        out.append({"step": label, "p50_us": pct(vals, 50), "p99_us": pct(vals, 99), "n": len(vals),
                    "skipped": skipped, "wake": end.endswith(".woke")})
    return out


def bench_breakdown(zero_args: list[str], work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The chain app alone at the first rate with every record's timeline kept (JIGSAW_HOP_TRACE)."""
    trace_dir = work / "trace"
    trace_dir.mkdir()
    only_chain = []
    for k, a in enumerate(zero_args):
        if zero_args[k - 1] == "--plan" and "single" in Path(a).name:
            only_chain.pop()
            continue
        only_chain.append(a)
    body = infer_body()
    server, url = jigsawd([*only_chain, "--http", args.fronts[0]], work / "jigsawd-breakdown.log",
                          env={"JIGSAW_HOP_TRACE": str(trace_dir)})
    with server:
        raw_open_loop(url, "/v2/models/chain/infer", body, 200, 0.5, 1)
        rate = args.rates[0]
        run = raw_open_loop(url, "/v2/models/chain/infer", body, rate, args.hop_seconds, rate + 2)
    by_request = read_traces(trace_dir)
    first = min((t["fe.created"] for t in by_request.values() if t.get("fe.created")), default=0)
    warm = {rid: t for rid, t in by_request.items() if t.get("fe.created", 0) > first + 0.6e9}
    return {"rate": rate, "sent_rps": run["sent_rps"], "requests": len(warm),
            "steps": summarize_breakdown(warm)}


def print_breakdown(bd: dict[str, Any]) -> None:
    print(f"  chain a -> b -> c at {bd['rate']} req/s (sent {bd['sent_rps']:.0f}), {bd['requests']} "
          "requests; server-side stamps, p50 / p99 us")
    for row in bd["steps"]:
        why = "loop already awake" if row["wake"] else "the other order"
        awake = f"  ({why} for {row['skipped']})" if row["skipped"] else ""
        print(f"    {row['step']:<62} {fmt(row['p50_us'], 1):>8} / {fmt(row['p99_us'], 1):>8}{awake}")


# ---- 3. traffic app -------------------------------------------------------------------------
def planned_processes(demand: float) -> tuple[int, float, dict[str, Any]]:
    cmd = [sys.executable, "-m", "jigsaw.cli", "plan", "--app", "traffic_analysis", "--node",
           str(EXAMPLE_NODE), "--demand", f"{demand:g}", "--json"]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=True)
    plan = json.loads(out.stdout)
    return sum(i["count"] * i["mps"] for i in plan["instances"]), plan["planned_rps"], plan


def bench_traffic(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    demand, k = args.traffic_demand, args.time_scale
    nproc, planned_rps, plan = planned_processes(demand)
    print(f"  plan at {demand:g} req/s: {nproc} worker processes, planned {planned_rps:g} req/s, "
          f"{plan['slices_used']} slices, instances: "
          + ", ".join(f"{i['task']}={i['variant']}@{i['mig_profile']}x{i['mps']} b{i['max_batch']} "
                      f"n{i['count']}" for i in plan["instances"]), flush=True)
    if nproc > args.max_processes:
        raise SystemExit(f"the plan at {demand:g} req/s makes {nproc} processes (> {args.max_processes}); "
                         "choose a lower --traffic-demand")
    slo_ms = 650.0  # examples/apps/traffic_analysis.toml latency_slo_ms
    with contextlib.suppress(Exception):
        import tomllib
        app_doc = tomllib.loads((ROOT / "examples/apps/traffic_analysis.toml").read_text())
        slo_ms = float(app_doc["latency_slo_ms"])
    server, url = jigsawd(["--node-config", str(EXAMPLE_NODE), "--apps", "traffic_analysis",
                           "--demand", f"{demand:g}", "--time-scale", f"{k:g}"], work / "jigsawd-traffic.log")
    rate = demand / k
    with server:
        startup = server.startup_s
        run = uvloop.run(open_loop(url + "/v2/models/traffic_analysis/infer", infer_body(), rate,
                                   args.traffic_seconds, seed=7, drain_timeout_s=30 + 2 * slo_ms * k / 1e3))
    recs = run["records"]
    n = run["sent"]
    ok = [r for r in recs if r[0] == 200]
    late = [r for r in ok if r[1] * 1e3 > slo_ms * k]
    n504 = sum(1 for r in recs if r[0] == 504)
    n503 = sum(1 for r in recs if r[0] == 503)
    other = len(recs) - len(ok) - n504 - n503 + run["unanswered"]
    fanout = [r[3].get("children.detect", 0) for r in ok if r[3]]
    lat_ms = [r[1] * 1e3 / k for r in ok]  # in unscaled (node) time
    violations = len(late) + n504 + n503 + other
    drops: dict[str, int] = {}
    for r in recs:
        if r[0] == 504:
            key = (r[3] or {}).get("drop", "unknown")
            drops[key] = drops.get(key, 0) + 1
    wall = run["seconds"]
    return {
        "demand_rps": demand, "planned_rps": planned_rps, "processes": nproc, "time_scale": k,
        "startup_s": startup, "sent_rps_wall": run["sent_rps"], "offered_rps_wall": rate,
        "sent": n, "ok": len(ok), "ok_in_slo": len(ok) - len(late),
        "goodput_rps": (len(ok) - len(late)) / wall * k, "throughput_rps": len(ok) / wall * k,
        "sent_rps": run["sent_rps"] * k,
        "mean_fanout": float(np.mean(fanout)) if fanout else float("nan"),
        "p50_ms": pct(lat_ms, 50), "p99_ms": pct(lat_ms, 99), "slo_ms": slo_ms,
        "late": len(late), "http_504": n504, "drops_504": drops, "http_503": n503,
        "errors_or_unanswered": other,
        "violations": violations, "violation_rate": violations / n if n else float("nan"),
        "client_lag_p99_ms": pct([r[2] * 1e3 for r in recs], 99), "seconds": wall,
    }


# ---- main -----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="shorter durations")
    p.add_argument("--server-cpus", default="", help="pin jigsawd and its workers to these CPUs (taskset "
                   "list, e.g. 0): a placement study; default: the scheduler's")
    p.add_argument("--client-cpus", default="", help="pin this process (the load generator) to these CPUs")
    p.add_argument("--server-setting", action="append", default=[], metavar="'KEY = VALUE'",
                   help="a TOML line for the zero-latency node's [server] table (an A/B of a data-plane "
                        "setting, e.g. 'http = \"aiohttp\"'); repeatable")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("--connections", type=int, default=32, help="closed-loop connections (throughput)")
    p.add_argument("--rates", default="500,2000", help="open-loop rates of the per-hop test (req/s)")
    p.add_argument("--traffic-demand", type=float, default=300.0, help="traffic app demand D (req/s)")
    p.add_argument("--traffic-seconds", type=float, default=None, help="traffic load duration (default 20 s)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="traffic app: scale emulated latencies and the SLO by K, send D / K req/s")
    p.add_argument("--max-processes", type=int, default=40, help="refuse plans with more worker processes")
    p.add_argument("--rounds", type=int, default=5, help="throughput: alternate echo and jigsawd so often")
    p.add_argument("--aiohttp-client", action="store_true",
                   help="load with the in-process aiohttp clients, not wrk and the raw open-loop sender")
    p.add_argument("--fronts", default="fast,aiohttp",
                   help="jigsawd HTTP front ends to load in the throughput part (the first: also the hops)")
    p.add_argument("--skip", default="",
                   help="comma-separated parts to skip: throughput,grpc,hops,breakdown,traffic")
    a = p.parse_args(argv)
    a.rates = [int(x) for x in a.rates.split(",") if x]
    a.fronts = [x.strip() for x in a.fronts.split(",") if x.strip()]
    a.tp_seconds = 2.0 if a.quick else 5.0
    a.warmup = 0.5 if a.quick else 1.0
    a.hop_seconds = 1.5 if a.quick else 4.0
    if a.traffic_seconds is None:
        a.traffic_seconds = 6.0 if a.quick else 20.0
    a.skip = {x.strip() for x in a.skip.split(",") if x.strip()}
    return a


def fmt(x: float, nd: int = 2) -> str:
    return "n/a" if x != x else f"{x:.{nd}f}"


def print_hops(hops: dict[str, Any]) -> None:
    idle = hops.get("idle_cpu")
    if idle:
        v = "meets" if idle["max_pct"] < 2.0 else "MISSES"
        print(f"  idle: {idle['processes']} server processes, busiest {idle['max_pct']:.2f}% CPU, "
              f"all together {idle['total_pct']:.2f}% over {idle['seconds']:g} s (target < 2% each: {v})")
    for rate, r in hops.items():
        if rate == "idle_cpu":
            continue
        s, c, h = r["single"], r["chain"], r["per_hop_ms"]
        print(f"  offered {rate} req/s:")
        saturated = False
        for name, x in (("single", s), ("chain", c)):
            q = ", ".join(f"{t} {fmt(v['p50'], 3)}/{fmt(v['p99'], 3)}" for t, v in x["queue_ms"].items())
            rh = ", ".join(f"{t} {fmt(v['p50'], 0)}/{fmt(v['p99'], 0)}" for t, v in x["ring_hop_us"].items())
            print(f"    {name:6s} sent {x['sent_rps']:6.0f} req/s ({x['ok']} ok, {x['failed']} failed); "
                  f"client p50/p99 {fmt(x['client_p50_ms'], 3)}/{fmt(x['client_p99_ms'], 3)} ms; "
                  f"server e2e_us p50/p99 {fmt(x['server_p50_ms'], 3)}/{fmt(x['server_p99_ms'], 3)} ms")
            print(f"           per-task queue_us p50/p99 ms: {q}; client send lag p99 "
                  f"{fmt(x['client_lag_p99_ms'], 2)} ms; generator CPU {fmt(x['generator_cpu_pct'], 1)}%")
            print(f"           ring hops (push -> pop in the next process) p50/p99 us: {rh}; server CPU "
                  f"{fmt(x['server_cpu_us_per_request'], 0)} us per request (all its processes)")
            saturated |= x["sent_rps"] < 0.95 * float(rate) or x["client_lag_p99_ms"] > 5.0
        p50_t, p99_t = HOP_TARGETS_MS.get(int(rate), (None, HOP_TARGET_P99_MS))
        ok = h["server_p99"] <= p99_t and (p50_t is None or h["server_p50"] <= p50_t)
        target = (f"p50 <= {p50_t * 1e3:g} us, " if p50_t else "") + f"p99 <= {p99_t * 1e3:g} us"
        print(f"    per hop, server e2e_us: p50 {fmt(h['server_p50'] * 1e3, 0)} us, "
              f"p99 {fmt(h['server_p99'] * 1e3, 0)} us (target {target}: {'meets' if ok else 'MISSES'})")
        print(f"    per hop, client       : p50 {fmt(h['client_p50'] * 1e3, 0)} us, "
              f"p99 {fmt(h['client_p99'] * 1e3, 0)} us")
        single_t = SINGLE_P99_TARGET_MS.get(int(rate))
        if single_t is not None:
            v = "meets" if s["server_p99_ms"] <= single_t else "MISSES"
            print(f"    1-task app server-side p99 {fmt(s['server_p99_ms'], 3)} ms "
                  f"(target <= {single_t:g} ms: {v})")
        if saturated:
            sent = min(s["sent_rps"], c["sent_rps"])
            print(f"    NOTE: the client cannot keep up with {rate} req/s on this machine (achieved "
                  f">= {sent:.0f} req/s, send lag p99 up to "
                  f"{max(s['client_lag_p99_ms'], c['client_lag_p99_ms']):.0f} ms): client-side latencies "
                  "include client queueing; the server-side e2e_us figures are the ones to read")
    sys.stdout.flush()


def print_traffic(tr: dict[str, Any]) -> None:
    print(f"  jigsawd start-up (plan + {tr['processes']} worker processes): {tr['startup_s']:.1f} s")
    print(f"  sent {tr['sent']} requests at {tr['sent_rps']:.1f} req/s (demand {tr['demand_rps']:g}); "
          f"answered 200: {tr['ok']} = {tr['throughput_rps']:.1f} req/s; within SLO: "
          f"{tr['goodput_rps']:.1f} req/s")
    print(f"  mean fan-out (children of detect per answered request): {fmt(tr['mean_fanout'])}")
    print(f"  latency of the 200s: p50 {fmt(tr['p50_ms'], 1)} ms, p99 {fmt(tr['p99_ms'], 1)} ms "
          f"(SLO {tr['slo_ms']:g} ms)")
    print(f"  SLO violations: {tr['violations']} of {tr['sent']} ({100 * tr['violation_rate']:.2f}%) = "
          f"{tr['late']} late 200s + {tr['http_504']} 504 + {tr['http_503']} 503 + "
          f"{tr['errors_or_unanswered']} errors/unanswered")
    if tr["drops_504"]:
        print("  504s by task:reason: " + ", ".join(f"{k} {v}" for k, v in sorted(tr["drops_504"].items())))
    print(f"  client send lag p99 {fmt(tr['client_lag_p99_ms'], 1)} ms (wall clock)")
    if tr["sent_rps_wall"] < 0.95 * tr["offered_rps_wall"]:
        print(f"  NOTE: the client sent only {tr['sent_rps_wall']:.0f} of {tr['offered_rps_wall']:.0f} req/s "
              "(wall clock) on this machine")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    global SERVER_CPUS
    SERVER_CPUS = args.server_cpus
    if args.client_cpus:
        os.sched_setaffinity(0, {int(c) for c in args.client_cpus.split(",")})
    results: dict[str, Any] = {
        "label": LABEL, "backend": "emulated", "machine": platform.node(), "cpus": os.cpu_count(),
        "platform": platform.platform(), "python": platform.python_version(),
        "loadavg_before": os.getloadavg()[0],
    }
    print(f"jigsaw data-plane benchmark - every number is EMULATED on this machine "
          f"({platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}); "
          f"client, servers and workers share these cores; load average before the run "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="jigsaw-bench-"))
    status = 0
    try:
        zero_args = write_zero_apps(work / "zero", tuple(args.server_setting))
        if "throughput" not in args.skip:
            print(f"\n[1] frontend throughput ({LABEL}): closed loop, {args.connections} connections, "
                  f"{args.tp_seconds:g} s in {args.rounds} alternating rounds after {args.warmup:g} s "
                  "warm-up, same OIP infer body", flush=True)
            tp = bench_throughput(zero_args, work, args)
            results["throughput"] = tp
            print(f"  client: {tp['generator']}")
            rows = [("aiohttp+uvloop JSON echo server", "echo")]
            rows += [(f"jigsawd --http {f}, 1-task ~0 ms app", f"jigsaw_{f}") for f in args.fronts]
            for label, key in rows:
                x = tp[key]
                print(f"  {label:<38}: {x['rps']:9.0f} req/s ({x['errors']} non-200; client CPU "
                      f"{x['generator_cpu_pct']:.0f}%; server CPU {x['server_cpu_us_per_request']:.0f} us "
                      f"per request, all its processes)")
            for f in args.fronts:
                jig = tp[f"jigsaw_{f}"]
                lead, total = jig["lead_cpu_us_per_request"], jig["server_cpu_us_per_request"]
                print(f"  jigsawd --http {f} CPU per request: frontend {lead:.0f} us, "
                      f"workers {total - lead:.0f} us")
                per = jig.get("per_request", {})
                if per:
                    nan = float("nan")
                    print(f"  jigsawd --http {f} per request (/proc): " + "; ".join(
                        f"{who} reads {fmt(per.get(w + '_syscr', nan))}, writes "
                        f"{fmt(per.get(w + '_syscw', nan))}, wake-ups "
                        f"{fmt(per.get(w + '_voluntary_ctxt_switches', nan))}, preempted "
                        f"{fmt(per.get(w + '_nonvoluntary_ctxt_switches', nan))}"
                        for who, w in (("frontend", "lead"), ("workers", "rest"))))
            for f in args.fronts:
                verdict = "meets" if tp[f"ratio_{f}"] >= RATIO_TARGET else "MISSES"
                print(f"  ratio jigsawd --http {f} / echo{' ' * (8 - len(f))}: {tp[f'ratio_{f}']:9.2f}   "
                      f"(target >= {RATIO_TARGET}: {verdict})", flush=True)
        if "grpc" not in args.skip:
            print(f"\n[1g] gRPC against the HTTP fast path ({LABEL}): one jigsawd, 1-task ~0 ms app, closed "
                  f"loop, {args.connections} in flight, in-process clients (uvloop), "
                  f"{args.tp_seconds:g} s in {args.rounds} alternating rounds", flush=True)
            gr = bench_grpc(zero_args, work, args)
            results["grpc"] = gr
            print_grpc(gr)
        if "hops" not in args.skip:
            print(f"\n[2] added latency per hop ({LABEL}, jigsawd --http {args.fronts[0]}): open-loop "
                  f"Poisson, {args.hop_seconds:g} s per app "
                  f"and rate; 1-task app vs 3-task chain of ~0 ms tasks; per hop = (chain - single) / 2",
                  flush=True)
            hops = bench_hops(zero_args, work, args)
            results["hops"] = hops
            print_hops(hops)
        if "breakdown" not in args.skip:
            print(f"\n[2b] where a hop's time goes ({LABEL}, jigsawd --http {args.fronts[0]}): the chain "
                  f"alone, open-loop Poisson at {args.rates[0]} req/s for {args.hop_seconds:g} s, every "
                  "record's timeline kept (JIGSAW_HOP_TRACE)", flush=True)
            bd = bench_breakdown(zero_args, work, args)
            results["breakdown"] = bd
            print_breakdown(bd)
        if "traffic" not in args.skip:
            k = args.time_scale
            scaled = (f", time scale {k:g} (latencies and SLO x{k:g}, load sent at "
                      f"{args.traffic_demand / k:g} req/s; rates and latencies below in node time)"
                      ) if k != 1 else ""
            print(f"\n[3] traffic app on the emulated 4x H100 node ({LABEL}): demand "
                  f"{args.traffic_demand:g} req/s, open-loop Poisson for {args.traffic_seconds:g} s{scaled}",
                  flush=True)
            tr = bench_traffic(work, args)
            results["traffic"] = tr
            print_traffic(tr)
    except Exception as exc:
        print(f"\nFAILED: {exc}", flush=True)
        status = 1
    finally:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
        left = shm_jigsaw(STARTED_PIDS)
        alive = [pid for pid in STARTED_PIDS if _alive(pid)]
        results["shm_left"] = sorted(left)
        results["processes_left"] = alive
        print(f"\n/dev/shm entries with a jigsaw- prefix left by this run's {len(STARTED_PIDS)} servers: "
              f"{len(left)}" + (f" {sorted(left)}" if left else "")
              + f"; their process groups still alive: {len(alive)}")
        if alive:
            status = 1
        if left:
            status = 1
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2, default=float))
        print(f"results written to {args.json}")
    return status


if __name__ == "__main__":
    sys.exit(main())
