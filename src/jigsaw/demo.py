"""``make demo``: plan the example apps on the reference node and print what the planner chose.

Profiles are the modeled H100 profiles under profiles/h100-80gb (source=modeled).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jigsaw.cli import format_plan
from jigsaw.errors import JigsawError
from jigsaw.node import load_node, load_node_profiles
from jigsaw.planner.milp import capacity, plan

DEFAULT_NODE = Path(__file__).resolve().parents[2] / "examples" / "h100x4.toml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jigsaw.demo", description=__doc__)
    parser.add_argument("--node-config", default=str(DEFAULT_NODE))
    parser.add_argument("--load", type=float, default=0.5, help="fraction of capacity to plan for")
    parser.add_argument("--time-limit", type=float, default=5.0, metavar="S")
    args = parser.parse_args(argv)
    try:
        node = load_node(args.node_config)
        profiles = load_node_profiles(node)
        print(f"node {node.name}: {node.num_gpus}x {node.gpu.name}, {node.slices_available} slices, "
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
