"""Faults under load: jigsawd keeps serving while workers are killed and hung and clients misbehave.

The emulated 4x H100 node serves traffic_analysis on a static plan. Open-loop Poisson load at
``--load`` x the plan's rate runs throughout: a baseline phase without faults, then a fault
phase in which every ``--fault-every`` seconds a random worker is SIGKILLed or stopped
(SIGSTOP: a hang the supervisor finds by its heartbeat), while a second client sends hostile
requests (malformed, oversized, NaN, deeply nested, wrong shapes and types, unknown paths and
methods). Printed: load held (goodput in the fault phase / goodput in the baseline), faults
survived (the worker was replaced and serves again), bad inputs tried and how they were
answered, requests lost (sent without an HTTP answer: must be 0) and shared-memory segments
left after the daemon stopped (must be 0). Everything is EMULATED on this machine.
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
import dataplane as dp

ROOT = Path(__file__).resolve().parents[1]
APP = "traffic_analysis"


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


async def run(url: str, args: argparse.Namespace, rate: float) -> dict[str, Any]:
    answers: list[tuple[float, int, float]] = []
    bad: Counter[str] = Counter()
    faults: list[dict[str, Any]] = []
    timeout = aiohttp.ClientTimeout(total=120)
    total_s = args.baseline + args.fault_seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        t0 = time.monotonic()
        load = asyncio.create_task(open_load(session, f"{url}/v2/models/{APP}/infer", dp.infer_body(16), rate,
                                             total_s, args.seed, answers))
        hostile = asyncio.create_task(hostile_load(session, url, total_s, args.bad_per_s, bad))
        injector = asyncio.create_task(inject_faults(session, url, args.baseline, args.fault_seconds,
                                                     args.fault_every, args.seed, faults))
        sent = await load
        await hostile
        await injector
        await asyncio.sleep(1.0)
        doc = await admin(session, url, "/admin/workers")
    return {"t0": t0, "sent": sent, "answers": answers, "bad": bad, "faults": faults, "admin": doc}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demand", type=float, default=60.0, help="the static plan's demand (req/s, node time)")
    ap.add_argument("--load", type=float, default=0.6, help="offered load as a fraction of --demand")
    ap.add_argument("--time-scale", type=float, default=10.0)
    ap.add_argument("--baseline", type=float, default=10.0, help="seconds of load before the first fault")
    ap.add_argument("--fault-seconds", type=float, default=30.0, help="seconds of the fault phase")
    ap.add_argument("--fault-every", type=float, default=5.0, help="seconds between faults")
    ap.add_argument("--bad-per-s", type=float, default=10.0, help="hostile requests per second")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    k = args.time_scale
    rate = args.demand * args.load / k
    print(f"fault bench - EMULATED on this machine: {APP} on examples/h100x4.toml, static plan for "
          f"{args.demand:g} req/s, open-loop load {args.load:g}x of it; time scale {k:g} "
          f"({rate:.1f} req/s wall)")
    with tempfile.TemporaryDirectory(prefix="jigsaw-faults-") as tmp:
        daemon_args = ["--node-config", str(ROOT / "examples" / "h100x4.toml"), "--apps", APP,
                       "--demand", str(args.demand), "--no-controller", "--time-scale", str(k),
                       "--plan-time-limit", "10"]
        proc, url = dp.jigsawd(daemon_args, Path(tmp) / "jigsawd.log")
        with proc:
            pid = proc.proc.pid
            result = asyncio.run(run(url, args, rate))
        left = sorted(dp.shm_jigsaw([pid]))
    slo_s = 0.0
    from jigsaw.node import load_node
    node = load_node(ROOT / "examples" / "h100x4.toml")
    app = node.app(APP)
    slo_s = (app.latency_slo_ms + app.depth * node.planner.hop_latency_ms) * k / 1000.0
    t0, answers = result["t0"], result["answers"]
    split = t0 + args.baseline

    def goodput(lo: float, hi: float) -> float:
        good = sum(1 for t, s, lat in answers if lo <= t < hi and s == 200 and lat <= slo_s)
        return good / (hi - lo) * k
    base = goodput(t0, split)
    during = goodput(split, split + args.fault_seconds)
    statuses = Counter(s for _, s, _ in answers)
    lost = result["sent"] - sum(1 for _, s, _ in answers if s > 0)
    events = {e["pid"]: e for e in result["admin"]["events"]}
    survived = sum(1 for f in result["faults"] if (e := events.get(f["pid"])) and e.get("restored_unix_s"))
    detect = [events[f["pid"]]["detected_unix_s"] - f["at_unix_s"] for f in result["faults"]
              if f["pid"] in events]
    bad = result["bad"]
    print(f"requests: sent {result['sent']}, answered {sum(v for s, v in statuses.items() if s > 0)}, "
          f"statuses {dict(sorted(statuses.items()))}")
    print(f"load held: goodput {during:.1f} req/s with faults vs {base:.1f} without = {during / base:.2f} "
          f"(good = 200 within the SLO)" if base else "load held: no baseline goodput")
    for f in result["faults"]:
        e = events.get(f["pid"], {})
        took = (e.get("detected_unix_s", float("nan")) - f["at_unix_s"])
        back = (e.get("restored_unix_s") or float("nan")) - f["at_unix_s"]
        print(f"  {f['kind']:<4} {f['worker']:<48} detected after {took:5.2f} s, serving again after "
              f"{back:5.2f} s; {e.get('retried_requests', 0)} requests retried, "
              f"{e.get('failed_requests', 0)} answered 503")
    print(f"faults survived: {survived}/{len(result['faults'])} (max detection "
          f"{max(detect) if detect else float('nan'):.2f} s; kills must be found within 1 s, hangs within "
          f"worker_hang_timeout_s + 1 s)")
    print(f"bad inputs tried: {sum(bad.values())}, answered {dict(bad)} (must all be 4xx)")
    print(f"requests lost: {lost} (must be 0); shared-memory segments left: {len(left)} (must be 0)")
    ok = lost == 0 and not left and survived == len(result["faults"]) and set(bad) <= {"4xx"}
    print(f"result: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
