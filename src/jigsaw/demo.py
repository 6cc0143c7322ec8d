"""``make demo``: a planner table, then jigsawd with its controller following a short demand window.

``python -m jigsaw.demo`` plans one app at the window's peak demand and prints the table, then
runs ``bench/replay.py``: it starts ``jigsawd --emulate`` on the reference node, replays 12 bins
of the synthetic day (a demand rise and fall) for 5 s each, and prints the summary table.
``--plans-only`` plans every example app at half its capacity instead (slower: capacity solves).
Profiles are the modeled H100 profiles under profiles/h100-80gb (source=modeled); every
latency and violation the replay reports is emulated.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from jigsaw.cli import format_plan
from jigsaw.errors import JigsawError
from jigsaw.node import load_node, load_node_profiles
from jigsaw.planner.milp import capacity, plan

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_NODE = ROOT / "examples" / "h100x4.toml"
DEMO_APP = "traffic_analysis"
DEMO_BINS = "164:176"  # the synthetic day around a burst: steady, a rise to the peak, a fall
DEMO_PEAK_RPS = 40.0  # the day's peak: a few worker processes, fine on a 2-core machine
DEMO_BIN_SECONDS = 5.0
DEMO_TIME_SCALE = 2.0


def replay_demo(node_config: str, out: Path) -> int:
    """Run the replay bench on the demo window; its jigsawd is stopped and cleaned up on exit."""
    script = ROOT / "bench" / "replay.py"
    if not script.exists():
        print(f"jigsaw demo: {script} not found (the replay part needs a source checkout)", file=sys.stderr)
        return 2
    cmd = [sys.executable, str(script), "--node", node_config, "--app", DEMO_APP, "--trace", "synthetic",
           "--bins", DEMO_BINS, "--peak-rps", str(DEMO_PEAK_RPS), "--bin-seconds", str(DEMO_BIN_SECONDS),
           "--time-scale", str(DEMO_TIME_SCALE), "--out", str(out)]
    print("$ " + " ".join(cmd[1:]), flush=True)
    proc = subprocess.Popen(cmd)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.wait()  # the replay got the same ^C: it stops its jigsawd and removes its segments
        return 130


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jigsaw.demo", description=__doc__)
    parser.add_argument("--node-config", default=str(DEFAULT_NODE))
    parser.add_argument("--load", type=float, default=0.5, help="fraction of capacity to plan for")
    parser.add_argument("--time-limit", type=float, default=5.0, metavar="S")
    parser.add_argument("--plans-only", action="store_true",
                        help="plan every example app at --load of its capacity; no daemon, no replay")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "demo-replay",
                        help="replay output folder")
    args = parser.parse_args(argv)
    if not args.plans_only:
        try:
            node = load_node(args.node_config)
            app = node.app(DEMO_APP)
            result = plan(app, node, load_node_profiles(node, [app]), DEMO_PEAK_RPS,
                          time_limit_s=args.time_limit)
        except JigsawError as exc:
            print(f"jigsaw demo: error: {exc}", file=sys.stderr)
            return 2
        print(f"{DEMO_APP} at the demo's peak demand ({DEMO_PEAK_RPS:g} rps) on {node.name}:\n")
        print(format_plan(result))
        print()
        return replay_demo(str(args.node_config), args.out)
    try:
        node = load_node(args.node_config)
        profiles = load_node_profiles(node)
        print(f"node {node.name}: {node.gpus_text}, {node.slices_available} slices, "
              f"profiles: {', '.join(sorted(profiles.sources))} ({profiles.source})\n")
        summary = []
        for app in node.apps:
            cap = capacity(app, node, profiles, time_limit_s=args.time_limit)
            demand = round(cap.max_demand_rps * args.load, 1)
            result = plan(app, node, profiles, demand, time_limit_s=args.time_limit)
            print("=" * 100)
            print(f"{app.name}: capacity {cap.max_demand_rps:.1f} rps ({cap.status}); "
                  f"planning for {demand:g} rps ({args.load:.0%} of capacity)\n")
            print(format_plan(result))
            print()
            summary.append((app.name, cap.max_demand_rps, demand, result))
        print("=" * 100)
        print(f"{'app':<18} {'capacity_rps':>12} {'demand_rps':>10} {'slices':>7} {'accuracy':>8} "
              f"{'status':>9} {'solve_s':>8}")
        for name, cap_rps, demand, r in summary:
            print(f"{name:<18} {cap_rps:>12.1f} {demand:>10g} {r.slices_used:>4}/{r.slices_available:<2} "
                  f"{r.accuracy:>8.3f} {r.status:>9} {r.solve_seconds:>8.2f}")
        return 0
    except JigsawError as exc:
        print(f"jigsaw demo: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
