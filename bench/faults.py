"""Faults and attacks under load: jigsawd keeps serving while workers fail and clients attack it.

The emulated 4x H100 node serves traffic_analysis on a static plan. Open-loop Poisson load of
valid requests at ``--load`` x the plan's rate runs throughout: a baseline phase without
trouble, then one phase per ``--phases`` entry, each ``--phase-seconds`` long and followed by
``--gap-seconds`` of recovery (not counted):

- ``workers``: every ``--fault-every`` seconds a random worker is SIGKILLed or stopped (SIGSTOP:
  a hang the supervisor finds by its heartbeat), alternately;
- ``bad``: ``--bad-per-s`` hostile requests per second (malformed, oversized, NaN, deeply nested,
  wrong shapes and types, unknown paths and methods);
- ``poison``: inputs a model cannot take (an empty image, zero-size axes);
- ``biginput``: 4 MB requests, far over a ring slot, under the payload limit;
- ``oversized``: requests that fit their rings whose outputs do not (a 160 KB waveform upsampled
  to a 640 KB child, a 120 KB one to a 3.8 MB answer), against a small REAL node
  (``real_node.py``: onnxruntime on this CPU, its own baseline and valid stream on the same app),
  as emulated outputs do not grow with their inputs;
- ``headers``: a 100 KB header line and 10,000 headers, 20 connections at a time, and one 64 MB
  header line;
- ``idle``: 10,000 connections that never send a byte;
- ``stalled``: 2,000 requests whose body stalls after 1 KB of a 1 MB Content-Length;
- ``slowhead``: 2,000 connections sending one header byte a second.

Printed per phase: the valid requests' goodput against the baseline's (200 within the SLO; target
>= 0.9), valid requests lost (sent without an HTTP answer: must be 0), worker restarts, workers
given up (each a capacity loss that re-plans the node: must be 0 but in ``workers``), the daemon's
peak RSS, what the attack got; then shared-memory segments left after the daemon stopped (must be
0). Everything but ``oversized`` is EMULATED on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import attacks
import dataplane as dp
import real_node
from replay import missing_runtime

ROOT = Path(__file__).resolve().parents[1]
APP = "traffic_analysis"
PHASES = ("workers", "bad", *attacks.ATTACKS)
REAL_PHASES = ("oversized",)  # run on real_node's onnxruntime node, not the emulated one
OVERSIZED_ANSWERS = {"500 naming up's child", "500 naming dec's answer"}  # what each attack must get


def hostile_requests(url: str) -> list[tuple[str, str, bytes, dict[str, str]]]:
    """(method, url, body, headers) of requests a correct node answers with a 4xx."""
    infer = f"{url}/v2/models/{APP}/infer"
    js = {"Content-Type": "application/json"}
    good = {"name": "image", "datatype": "UINT8", "shape": [4], "data": [1, 2, 3, 4]}

    def body(doc: Any) -> bytes:
        return json.dumps(doc).encode()
    nested = b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    return [
        ("POST", infer, b"{not json", js),
        ("POST", infer, b'{"inputs": [' + body(good)[:-1], js),
        ("POST", infer, body({"inputs": [{**good, "datatype": "FP32"}]}), js),
        ("POST", infer, body({"inputs": [{**good, "shape": [1 << 40]}]}), js),
        ("POST", infer, body({"inputs": [{**good, "shape": [2, 2], "data": [1, 2, 3]}]}), js),
        ("POST", infer, body({"inputs": [{**good, "data": ["a", "b", "c", "d"]}]}), js),
        ("POST", infer, body({"inputs": [{**good, "shape": [1], "data": [0]}]}).replace(b"[0]", b"[NaN]"),
         js),
        ("POST", infer, nested, js),
        ("POST", infer, body({"inputs": "image"}), js),
        ("POST", infer, body([1, 2, 3]), js),
        ("POST", infer, body({"inputs": [good], "outputs": [{"name": "no.such"}]}), js),
        ("POST", f"{url}/v2/models/no_such_model/infer", body({"inputs": [good]}), js),
        ("GET", infer, b"", {}),
        ("DELETE", f"{url}/v2", b"", {}),
        ("GET", f"{url}/../../etc/passwd", b"", {}),
        ("POST", infer, b"x" * (17 << 20), js),  # over the node's 16 MiB max_payload_bytes
    ]


async def open_load(session: aiohttp.ClientSession, url: str, body: bytes, rate: float, seconds: float,
                    seed: int, out: list[tuple[float, int, float]]) -> int:
    """Poisson arrivals; appends (send time, status, latency s) per answer; returns how many were sent."""
    rng = random.Random(seed)
    pending: set[asyncio.Task[None]] = set()

    async def one() -> None:
        t = time.monotonic()
        try:
            async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                await r.read()
                status = r.status
        except (TimeoutError, aiohttp.ClientError):
            status = 0
        out.append((t, status, time.monotonic() - t))

    end = time.monotonic() + seconds
    next_t = time.monotonic()
    sent = 0
    while True:
        next_t += rng.expovariate(rate)
        if next_t >= end:
            break
        await asyncio.sleep(max(0.0, next_t - time.monotonic()))
        task = asyncio.create_task(one())
        pending.add(task)
        task.add_done_callback(pending.discard)
        sent += 1
    if pending:
        await asyncio.wait(pending, timeout=60)
    return sent


async def hostile_load(session: aiohttp.ClientSession, url: str, seconds: float, per_s: float,
                       out: Counter[str]) -> None:
    cases = hostile_requests(url)
    end = time.monotonic() + seconds
    k = 0
    while time.monotonic() < end:
        method, target, data, headers = cases[k % len(cases)]
        k += 1
        try:
            async with session.request(method, target, data=data or None, headers=headers) as r:
                await r.read()
                out["4xx" if 400 <= r.status < 500 else f"{r.status}"] += 1
        except (TimeoutError, aiohttp.ClientError):
            out["no answer"] += 1
        await asyncio.sleep(1.0 / per_s)


async def admin(session: aiohttp.ClientSession, url: str, path: str) -> Any:
    async with session.get(url + path) as r:
        return await r.json()


async def inject_faults(session: aiohttp.ClientSession, url: str, start_delay_s: float, seconds: float,
                        every_s: float, seed: int, log: list[dict[str, Any]]) -> None:
    rng = random.Random(seed)
    await asyncio.sleep(start_delay_s)
    end = time.monotonic() + seconds
    kind = "kill"
    while time.monotonic() + every_s <= end:
        workers = (await admin(session, url, "/admin/workers"))["workers"]
        ready = [w for w in workers if w["state"] == "ready"]
        victim = rng.choice(ready)
        t = time.time()
        os.kill(victim["pid"], signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
        log.append({"kind": kind, "worker": victim["worker"], "pid": victim["pid"], "at_unix_s": t})
        await asyncio.sleep(every_s)
        if kind == "hang":
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim["pid"], signal.SIGCONT)
        kind = "hang" if kind == "kill" else "kill"


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


async def sample_rss(pid: int, seconds: float, out: list[tuple[float, float]]) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        out.append((time.monotonic(), rss_mb(pid)))
        await asyncio.sleep(0.25)


async def run_phase(name: str, session: aiohttp.ClientSession, url: str, app_url: str, seconds: float,
                    args: argparse.Namespace, stats: Counter[str], faults: list[dict[str, Any]]) -> None:
    if name == "workers":
        await inject_faults(session, url, 0.0, seconds, args.fault_every, args.seed, faults)
        stats["faults"] += len(faults)
    elif name == "bad":
        await hostile_load(session, url, seconds, args.bad_per_s, stats)
    else:  # in a process of its own: its sockets and loop must not slow the valid load's client
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(Path(__file__).resolve().parent / "attacks.py"), name, "127.0.0.1",
            url.rsplit(":", 1)[1], app_url, str(seconds), stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        with contextlib.suppress(ValueError, IndexError):
            stats.update(json.loads(out.decode().strip().splitlines()[-1]))


async def run(url: str, pid: int, args: argparse.Namespace, rate: float, phases: list[str], app: str,
              body: bytes) -> dict[str, Any]:
    """A baseline then ``phases``, under open-loop valid load of ``body`` to ``app`` at ``rate``."""
    answers: list[tuple[float, int, float]] = []
    rss: list[tuple[float, float]] = []
    app_url = f"{url}/v2/models/{app}/infer"
    span = args.phase_seconds + args.gap_seconds
    total_s = args.baseline + span * len(phases)
    timeout = aiohttp.ClientTimeout(total=120)
    windows: dict[str, tuple[float, float]] = {}
    stats: dict[str, Counter[str]] = {}
    faults: list[dict[str, Any]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        t0 = time.monotonic()
        t0_unix = time.time()
        load = asyncio.create_task(open_load(session, app_url, body, rate, total_s, args.seed, answers))
        sampler = asyncio.create_task(sample_rss(pid, total_s, rss))
        windows["baseline"] = (t0, t0 + args.baseline)
        await asyncio.sleep(args.baseline)
        async with aiohttp.ClientSession(timeout=timeout) as side:
            for name in phases:
                start = time.monotonic()
                windows[name] = (start, start + args.phase_seconds)
                stats[name] = Counter()
                print(f"  phase {name} ...", flush=True)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(run_phase(name, side, url, app_url, args.phase_seconds, args,
                                                     stats[name], faults), args.phase_seconds + 30)
                await asyncio.sleep(max(0.0, start + span - time.monotonic()))
        sent = await load
        await sampler
        await asyncio.sleep(1.0)
        doc = await admin(session, url, "/admin/workers")
    return {"t0": t0, "t0_unix": t0_unix, "sent": sent, "answers": answers, "rss": rss, "windows": windows,
            "stats": stats, "faults": faults, "admin": doc}


def report(result: dict[str, Any], phases: list[str], slo_s: float, k: float, load: str) -> bool:
    answers, windows = result["answers"], result["windows"]
    t0, t0_unix = result["t0"], result["t0_unix"]
    events = result["admin"]["events"]

    def goodput(lo: float, hi: float) -> float:
        """The share of the valid requests sent in [lo, hi) answered 200 within the SLO (a rate
        would measure the Poisson draw's count in the window as much as the node)."""
        sent = [(s, lat) for t, s, lat in answers if lo <= t < hi]
        return sum(1 for s, lat in sent if s == 200 and lat <= slo_s) / max(1, len(sent))
    base = goodput(*windows["baseline"])
    statuses = Counter(s for _, s, _ in answers)
    print(f"valid requests: sent {result['sent']}, answered {sum(v for s, v in statuses.items() if s > 0)}, "
          f"statuses {dict(sorted(statuses.items()))}; baseline goodput {base:.1%} of them good, "
          f"peak RSS {max((r for t, r in result['rss'] if t < windows['baseline'][1]), default=0):.0f} MB")
    def p99_ms(lo: float, hi: float) -> float:
        lats = sorted(lat for t, s, lat in answers if lo <= t < hi and s == 200)
        return lats[min(len(lats) - 1, int(0.99 * len(lats)))] * 1000 / k if lats else float("nan")
    print(f"baseline p99 {p99_ms(*windows['baseline']):.0f} ms (node time), SLO {slo_s * 1000 / k:.0f} ms")
    print(f"{'phase':<10} {'goodput':>8} {'p99 ms':>7} {'lost':>5} {'restarts':>8} {'given up':>8} "
          f"{'peak RSS':>9}  attack")
    ok = True
    for name in phases:
        lo, hi = windows[name]
        lost = sum(1 for t, s, _ in answers if lo <= t < hi + 5 and s <= 0)
        ulo, uhi = t0_unix + (lo - t0), t0_unix + (hi - t0) + 5
        evs = [e for e in events if ulo <= e["detected_unix_s"] < uhi]
        restarts = sum(1 for e in evs if e["action"] == "restarted")
        given_up = sum(1 for e in evs if e["action"] == "given_up")
        peak = max((r for t, r in result["rss"] if lo <= t < hi + 5), default=0.0)
        ratio = goodput(lo, hi) / base if base else float("nan")
        print(f"{name:<10} {ratio:>8.2f} {p99_ms(lo, hi):>7.0f} {lost:>5} {restarts:>8} {given_up:>8} "
              f"{peak:>7.0f}MB  "
              f"{attacks.describe(result['stats'].get(name, Counter()))}")
        ok = ok and lost == 0 and (given_up == 0 or name == "workers")
        if name != "workers":
            ok = ok and ratio >= 0.9 and restarts == 0
    print(f"(machine load {load}; goodput = the share of valid requests answered 200 within the SLO, "
          "over the baseline's; lost = sent without an HTTP answer)")
    return ok


def serve_and_attack(node_file: Path, app: str, daemon_args: list[str], emulate: bool,
                     args: argparse.Namespace, rate: float, k: float, phases: list[str],
                     body: bytes) -> tuple[dict[str, Any], bool]:
    """Starts jigsawd on ``node_file``, runs the phases, prints their table; (result, all passed)."""
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    with tempfile.TemporaryDirectory(prefix="jigsaw-faults-") as tmp:
        proc, url = dp.jigsawd(["--node-config", str(node_file), *daemon_args], Path(tmp) / "jigsawd.log",
                               emulate=emulate)
        with proc:
            pid = proc.proc.pid
            result = asyncio.run(run(url, pid, args, rate, phases, app, body))
        left = sorted(dp.shm_jigsaw([pid]))
    from jigsaw.node import load_node
    node = load_node(node_file)
    spec = node.app(app)
    slo_s = (spec.latency_slo_ms + spec.depth * node.planner.hop_latency_ms) * k / 1000.0
    load = f"{' '.join(load_before)} before, {' '.join(Path('/proc/loadavg').read_text().split()[:3])} after"
    ok = report(result, phases, slo_s, k, load)
    print(f"shared-memory segments left: {len(left)} (must be 0)")
    return result, ok and not left


def report_faults(result: dict[str, Any]) -> bool:
    """Per worker fault: detection and recovery; True when every fault was survived."""
    events = {e["pid"]: e for e in result["admin"]["events"]}
    for f in result["faults"]:
        e = events.get(f["pid"], {})
        took = (e.get("detected_unix_s", float("nan")) - f["at_unix_s"])
        back = (e.get("restored_unix_s") or float("nan")) - f["at_unix_s"]
        print(f"  {f['kind']:<4} {f['worker']:<48} detected after {took:5.2f} s, serving again after "
              f"{back:5.2f} s; {e.get('retried_requests', 0)} requests retried, "
              f"{e.get('failed_requests', 0)} answered 503")
    survived = sum(1 for f in result["faults"] if (e := events.get(f["pid"])) and e.get("restored_unix_s"))
    if result["faults"]:
        print(f"worker faults survived: {survived}/{len(result['faults'])}")
    bad = result["stats"].get("bad", Counter())
    if bad:
        print(f"bad inputs tried: {sum(bad.values())}, answered {dict(bad)} (must all be 4xx)")
    return survived == len(result["faults"]) and set(bad) <= {"4xx"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demand", type=float, default=60.0, help="the static plan's demand (req/s, node time)")
    ap.add_argument("--load", type=float, default=0.6, help="offered load as a fraction of --demand")
    ap.add_argument("--time-scale", type=float, default=10.0)
    ap.add_argument("--baseline", type=float, default=10.0, help="seconds of load before the first phase")
    ap.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, of {', '.join(PHASES)}")
    ap.add_argument("--phase-seconds", type=float, default=15.0, help="seconds of each phase")
    ap.add_argument("--gap-seconds", type=float, default=5.0, help="recovery after each phase (not counted)")
    ap.add_argument("--fault-every", type=float, default=5.0, help="seconds between worker faults")
    ap.add_argument("--bad-per-s", type=float, default=10.0, help="hostile requests per second")
    ap.add_argument("--real-rate", type=float, default=20.0, help="valid req/s to the real node (its phases)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        ap.error(f"--phases: unknown {', '.join(unknown)} (choose from {', '.join(PHASES)})")
    why = missing_runtime()
    if why is not None:
        print(f"faults: {why}", file=sys.stderr)
        return 2
    emulated = [p for p in phases if p not in REAL_PHASES]
    real = [p for p in phases if p in REAL_PHASES]
    if real and (why := real_node.missing()) is not None:
        print(f"faults: {', '.join(real)} {why}", file=sys.stderr)
        return 2
    ok = True
    if emulated:
        k = args.time_scale
        rate = args.demand * args.load / k
        print(f"fault bench - EMULATED on this machine: {APP} on examples/h100x4.toml, static plan for "
              f"{args.demand:g} req/s, open-loop load {args.load:g}x of it; time scale {k:g} "
              f"({rate:.1f} req/s wall); phases {', '.join(emulated)} of {args.phase_seconds:g} s")
        daemon_args = ["--apps", APP, "--demand", str(args.demand), "--no-controller", "--time-scale", str(k),
                       "--plan-time-limit", "10"]
        result, ok = serve_and_attack(ROOT / "examples" / "h100x4.toml", APP, daemon_args, True, args,
                                      rate, k, emulated, dp.infer_body(16))
        ok = report_faults(result) and ok
    if real:
        print(f"fault bench - REAL node (onnxruntime on this CPU): {real_node.APP} of bench/real_node.py, "
              f"open-loop load {args.real_rate:g} req/s of {real_node.VALID_SAMPLES}-sample waveforms; "
              f"phases {', '.join(real)} of {args.phase_seconds:g} s")
        with tempfile.TemporaryDirectory(prefix="jigsaw-real-node-") as d:
            node_file = real_node.write_node(Path(d))
            body = real_node.infer_body(real_node.VALID_SAMPLES)
            daemon_args = ["--demand", str(args.real_rate), "--no-controller"]
            result, real_ok = serve_and_attack(node_file, real_node.APP, daemon_args, False, args,
                                               args.real_rate, 1.0, real, body)
        got = set(result["stats"].get("oversized", Counter()))
        if "oversized" in real and got != OVERSIZED_ANSWERS:
            print(f"oversized outputs answered {sorted(got)}: each must be a 500 naming its task and output")
            real_ok = False
        ok = ok and real_ok
    print(f"result: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
