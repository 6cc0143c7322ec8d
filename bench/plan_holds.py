"""Does a plan the planner calls feasible at R hold its SLO on the emulated node at R?

    PYTHONPATH=src python bench/plan_holds.py --node examples/h100x4.toml --app traffic_analysis \\
        --space st --rates 20,60,120 --time-scale 20 --seconds 30 [--set section.key=value]

For each rate R it starts ``jigsawd --emulate --no-controller --demand R`` (the planner's plan for
R in ``--space``, no re-plans), plays open-loop Poisson arrivals at R / time scale for
``--seconds`` wall seconds (``bench/replay.py``'s client; ``--play-factor F`` plays F x R against
the plan for R, e.g. 1 / ``planner.max_utilization``: does a plan serve what the controller's
serve-on rules assume it serves at full utilization?) and prints what the plan says it holds
(``planned_rps``, slices) beside what the node did: violations (plain and the paper's counting),
503 / 504 counts, latency percentiles in node time, and per task the workers' queue and batch
statistics from ``/metrics``. Exit status 1 when a plan that holds R violated more than
``--max-violation-pct`` at R, or when the client fell behind its schedule.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.append(str(ROOT / "src"))

from replay import (  # noqa: E402
    BinResult,
    BinSplit,
    client_concurrency,
    node_with_settings,
    percentile,
    play,
)

from jigsaw.node import load_node  # noqa: E402
from jigsaw.spaces import SPACES  # noqa: E402
from jigsaw.testing import jigsawd  # noqa: E402


def task_metrics(url: str, app: str) -> dict[str, dict[str, float]]:
    """Per task of ``app`` from ``/metrics``: items (batch-size count), batches, mean batch, mean
    queue wait and batch time in node ms (scaled back by the caller), items dropped, and the
    busiest worker's busy fraction."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out: dict[str, dict[str, float]] = {}
    pat = re.compile(r'^([a-z_]+)\{([^}]*)\} ([0-9.eE+-]+)$')
    for line in text.splitlines():
        m = pat.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if labels.get("app") != app or "task" not in labels:
            continue
        name, value = m.group(1), float(m.group(3))
        t = out.setdefault(labels["task"], {"busy_max": 0.0})
        if name == "jigsaw_instance_busy_fraction":
            t["busy_max"] = max(t["busy_max"], value)
        elif name.endswith(("_sum", "_count")) and name.startswith((
                "jigsaw_inference_queue_duration_us", "jigsaw_inference_compute_infer_duration_us",
                "jigsaw_inference_batch_size")):
            key = name.removeprefix("jigsaw_inference_")
            t[key] = t.get(key, 0.0) + value
        elif name == "jigsaw_inference_request_dropped_total":
            t["dropped"] = t.get("dropped", 0.0) + value
    for t in out.values():
        n = t.get("batch_size_count", 0.0)
        t["batches"] = n
        t["items"] = t.get("batch_size_sum", 0.0)
        t["mean_batch"] = t["items"] / n if n else 0.0
        q = t.get("queue_duration_us_count", 0.0)
        t["queue_ms"] = t.get("queue_duration_us_sum", 0.0) / q / 1000.0 if q else 0.0
        c = t.get("compute_infer_duration_us_count", 0.0)
        t["compute_ms"] = t.get("compute_infer_duration_us_sum", 0.0) / c / 1000.0 if c else 0.0
    return out


def one_rate(node_file: Path, app: str, space: str, rate: float, time_scale: float, seconds: float,
             seed: int, out_dir: Path, play_factor: float = 1.0) -> dict[str, Any]:
    """The plan for ``rate`` (no re-plans) played at ``play_factor`` x ``rate``."""
    played = rate * play_factor
    args = ["--node-config", str(node_file), "--space", space, "--apps", app, "--demand", f"{rate:g}",
            "--no-controller", "--time-scale", f"{time_scale:g}", "--seed", str(seed)]
    log_path = out_dir / f"jigsawd-{app}-{space}-{rate:g}.log"
    slo_ms = load_node(node_file).app(app).latency_slo_ms
    with jigsawd(args, log_path, ready_timeout_s=180.0) as d:
        url = d.url
        conc = client_concurrency(played, slo_ms * time_scale)
        results, _ = asyncio.run(play(url, app, [played], BinSplit(0.0, seconds), time_scale, seed,
                                      lambda k, r: None, conc))
        per_task = task_metrics(url, app)
    planned = re.search(rf"{re.escape(app)}: planned ([0-9.]+) rps, ([0-9.]+) slices", log_path.read_text())
    r: BinResult = results[0]
    return {"rate_rps": rate, "played_rps": played,
            "planned_rps": float(planned.group(1)) if planned else float("nan"),
            "slices": float(planned.group(2)) if planned else -1, "sent": r.sent, "answered": r.answered,
            "violation_pct": r.violation_pct, "violation_paper_pct": r.violation_paper_pct,
            "shed_503": r.shed_503, "dropped_504": r.dropped_504, "other_failed": r.other_failed,
            "p50_ms": percentile(r.latencies_ms, 50), "p95_ms": percentile(r.latencies_ms, 95),
            "p99_ms": percentile(r.latencies_ms, 99), "max_ms": max(r.latencies_ms, default=float("nan")),
            "behind_s": r.behind_s, "behind": r.behind,
            "tasks": {t: {**m, "queue_ms": m["queue_ms"] / time_scale,
                          "compute_ms": m["compute_ms"] / time_scale} for t, m in per_task.items()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/plan_holds.py", description=__doc__.splitlines()[0])
    p.add_argument("--node", type=Path, default=ROOT / "examples" / "h100x4.toml")
    p.add_argument("--app", default="traffic_analysis")
    p.add_argument("--space", default="st", choices=SPACES)
    p.add_argument("--rates", default="20,60,120", help="comma-separated root requests/s (node time)")
    p.add_argument("--time-scale", type=float, default=20.0)
    p.add_argument("--seconds", type=float, default=30.0, help="wall seconds played per rate")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--max-violation-pct", type=float, default=1.0)
    p.add_argument("--play-factor", type=float, default=1.0,
                   help="play this many times each rate against the plan for it (default 1)")
    p.add_argument("--out", type=Path, default=ROOT / "out" / "plan_holds")
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = p.parse_args(argv)
    try:
        rates = [float(x) for x in args.rates.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"plan_holds: --rates {args.rates!r}: expected numbers separated by "
                         "commas") from None
    if not rates or any(r <= 0 for r in rates):
        raise SystemExit("plan_holds: --rates: every rate must be > 0")
    if not 0 < args.play_factor <= 10:
        raise SystemExit(f"plan_holds: --play-factor {args.play_factor:g}: expected 0 < F <= 10")
    args.out.mkdir(parents=True, exist_ok=True)
    node_file = node_with_settings(args.node, args.set, args.out)
    rows = []
    failed = False
    print(f"{'rate':>6} {'planned':>8} {'slices':>6} {'sent':>5} {'viol %':>7} {'paper %':>8} {'503':>4} "
          f"{'504':>4} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} {'max ms':>7} {'late s':>6}  per task: "
          "mean batch, queue ms, batch ms, busiest worker, dropped")
    for rate in rates:
        row = one_rate(node_file, args.app, args.space, rate, args.time_scale, args.seconds, args.seed,
                       args.out, args.play_factor)
        rows.append(row)
        tasks = "  ".join(f"{t} b{m['mean_batch']:.1f} q{m['queue_ms']:.0f} x{m['compute_ms']:.0f} "
                          f"u{m['busy_max']:.2f} d{m.get('dropped', 0):.0f}"
                          for t, m in sorted(row["tasks"].items()))
        print(f"{row['played_rps']:>6g} {row['planned_rps']:>8.1f} {row['slices']:>6d} {row['sent']:>5d} "
              f"{row['violation_pct']:>7.2f} {row['violation_paper_pct']:>8.2f} {row['shed_503']:>4d} "
              f"{row['dropped_504']:>4d} {row['p50_ms']:>7.0f} {row['p95_ms']:>7.0f} {row['p99_ms']:>7.0f} "
              f"{row['max_ms']:>7.0f} {row['behind_s']:>6.2f}  {tasks}", flush=True)
        holds = row["planned_rps"] >= row["played_rps"] * (1 - 1e-3)
        if row["behind"]:
            print(f"plan_holds: {rate:g} rps: the client fell behind its schedule", flush=True)
            failed = True
        elif holds and row["violation_paper_pct"] > args.max_violation_pct:
            failed = True
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
