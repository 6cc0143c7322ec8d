"""Overload: goodput of jigsawd at 1x, 2x and 5x its capacity (emulated, this machine).

A one-task app whose emulated batch times are known exactly gives a known capacity C. Open-loop
Poisson load at C, 2C and 5C; goodput = answers (HTTP 200) within the latency SLO per second.
A node that sheds early (503 at admission, deadline drops in the queue) keeps its goodput near
the goodput at capacity; one that queues everything collapses. Also prints what was shed, the
daemon's memory before and after, and that nothing was lost (sent == answered).
``--time-scale K`` stretches latencies by K and divides rates by K so 2 cores can drive 5C.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dataplane as dp

BATCH_MS = {1: 10.0, 2: 12.0, 4: 16.0, 8: 24.0}
MAX_BATCH = 8
SLO_MS = 200.0


def write_app(d: Path, time_scale: float) -> tuple[list[str], float]:
    """Node, app, profile and plan files; returns the daemon arguments and the capacity (req/s)."""
    (d / "profiles").mkdir(parents=True)
    rows = [dp.PROFILE_HEADER]
    for b, ms in BATCH_MS.items():
        rows.append(f"one-v,1g.10gb,1,{b},{ms},{1000.0 * b / ms:.6f},100,modeled,,,\n")
    (d / "profiles" / "one.csv").write_text("".join(rows))
    (d / "one.toml").write_text("\n".join([
        'name = "one"', f"latency_slo_ms = {SLO_MS}", "staleness_ms = 1000.0",
        "[[inputs]]", 'name = "image"', 'datatype = "UINT8"', "shape = [-1]",
        "[[tasks]]", 'name = "t"', 'kind = "classifier"', 'variants = [{ name = "one-v", accuracy = 1.0 }]',
    ]) + "\n")
    capacity = 1000.0 * MAX_BATCH / BATCH_MS[MAX_BATCH]
    plan = {"app": "one", "space": "ast", "demand_rps": capacity, "planned_rps": capacity,
            "feasible": True, "max_demand_plan": False, "status": "optimal", "objective": 0.0,
            "accuracy": 1.0, "slices_used": 1, "slices_available": 7, "solve_seconds": 0.0, "gap": 0.0,
            "instances": [{"task": "t", "variant": "one-v", "mig_profile": "1g.10gb", "mps": 1,
                           "max_batch": MAX_BATCH, "count": 1, "latency_ms": BATCH_MS[MAX_BATCH],
                           "throughput_rps": capacity, "slices": 1}],
            "lanes": [{"variants": {"t": "one-v"}, "rate_rps": capacity}],
            "task_latency_ms": {"t": BATCH_MS[MAX_BATCH]}}
    (d / "one.plan.json").write_text(json.dumps(plan))
    (d / "node.toml").write_text("\n".join([
        'name = "overload-node"', 'apps = ["one.toml"]', "[gpus]", 'model = "H100-80GB"', "count = 1",
        "mps_levels = [1]", "batch_sizes = [1, 2, 4, 8]", 'profiles_dir = "profiles"',
        'backend = "emulated"', "[planner]", "hop_latency_ms = 0.0", "[server]", "max_queue = 256",
    ]) + "\n")
    args = ["--node-config", str(d / "node.toml"), "--plan", str(d / "one.plan.json"),
            "--time-scale", str(time_scale)]
    return args, capacity


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="load duration per level (wall clock)")
    ap.add_argument("--time-scale", type=float, default=5.0)
    ap.add_argument("--levels", default="1,2,5", help="multiples of capacity")
    args = ap.parse_args(argv)
    k = args.time_scale
    levels = [float(x) for x in args.levels.split(",")]
    print(f"overload bench - EMULATED on this machine; time scale {k:g} (latencies x{k:g}, rates /{k:g}); "
          "rates and latencies below in node time")
    with tempfile.TemporaryDirectory(prefix="jigsaw-overload-") as tmp:
        work = Path(tmp)
        daemon_args, capacity = write_app(work, k)
        proc, url = dp.jigsawd(daemon_args, work / "jigsawd.log")
        results = []
        with proc:
            rss0 = rss_kb(proc.proc.pid)
            for level in levels:
                rate = capacity * level / k
                run = asyncio.run(dp.open_loop(url + "/v2/models/one/infer", dp.infer_body(16), rate,
                                               args.seconds, seed=int(level * 100)))
                statuses = Counter(r[0] for r in run["records"])
                good = sum(1 for s, lat, _, _ in run["records"] if s == 200 and lat * 1000 <= SLO_MS * k)
                answered = len(run["records"])
                results.append((level, run["sent"], answered, run["unanswered"], statuses,
                                good / args.seconds * k))
            rss1 = rss_kb(proc.proc.pid)
    base = results[0][5] or float("nan")
    print(f"capacity C = {capacity:.1f} req/s (one instance, max batch {MAX_BATCH}); SLO {SLO_MS:g} ms; "
          f"admission: 503 beyond capacity x the SLO's queueing share (and max_queue 256)")
    print(f"{'load':>5} {'sent':>6} {'answered':>8} {'lost':>5} {'200':>6} {'503':>6} {'504':>6} "
          f"{'goodput rps':>11} {'vs 1x':>6}")
    for level, sent, answered, lost, statuses, goodput in results:
        print(f"{level:>4g}x {sent:>6} {answered:>8} {lost:>5} {statuses.get(200, 0):>6} "
              f"{statuses.get(503, 0):>6} {statuses.get(504, 0):>6} {goodput:>11.1f} {goodput / base:>6.2f}")
    print(f"frontend RSS: {rss0 / 1024:.1f} MB before, {rss1 / 1024:.1f} MB after "
          f"(bounded queues: growth {(rss1 - rss0) / 1024:.1f} MB)")
    worst = min(r[5] / base for r in results[1:]) if len(results) > 1 else 1.0
    lost = sum(r[3] for r in results)
    print(f"target: goodput at 2x and 5x >= 0.90 of goodput at 1x: {'MEETS' if worst >= 0.9 else 'MISSES'} "
          f"(worst {worst:.2f}); requests lost: {lost}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
