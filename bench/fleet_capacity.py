"""The 120-GPU case as a fleet: 30 nodes of 4 H100s vs one pool of 120 (bench/capacity.py).

Plans ``--fleet`` (default ``examples/fleet-120.toml``) at its demand and times it (the target:
<= 30 s), then prints the fleet's capacity (every node hosting the app on all its GPUs) beside
the single pool's (the node planner's capacity on ``nodes x GPUs`` GPUs, as
``bench/capacity.py --gpus 120 --spaces ast``) and their ratio (the target: within 2%).

Why they can differ: a request never leaves its node, so each node must hold complete lanes
with a whole number of instances of every task on its own 28 slices; the pool rounds once over
840. ``--accuracy-mix`` also prints a node's capacity at accuracy SLOs around the app's: the
end-to-end accuracy is linear in the lane rates, so a fleet could run some nodes below the SLO
and others above it; that helps only where the node's capacity-versus-accuracy curve is convex.

    PYTHONPATH=src python bench/fleet_capacity.py [--fleet examples/fleet-120.toml] [--no-pool]
        [--accuracy-mix 0.88,0.92] [--time-limit 120]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
try:
    import jigsaw  # noqa: F401
except ImportError:  # run from a checkout without an installed package
    sys.path.insert(0, str(ROOT / "src"))

import mip  # noqa: E402

from jigsaw.fleet.config import load_fleet  # noqa: E402
from jigsaw.fleet.planner import fleet_capacity, plan_fleet  # noqa: E402
from jigsaw.node import load_node_profiles  # noqa: E402
from jigsaw.planner.milp import as_linear, capacity  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fleet", type=Path, default=ROOT / "examples" / "fleet-120.toml")
    ap.add_argument("--no-pool", action="store_true", help="skip the single-pool capacity solve")
    ap.add_argument("--time-limit", type=float, default=120.0, help="of the single-pool solve (s)")
    ap.add_argument("--accuracy-mix", default="", help="comma-separated accuracy SLOs to tabulate")
    args = ap.parse_args(argv)

    fleet = load_fleet(args.fleet)
    if len(fleet.groups) != 1 or len(fleet.apps) != 1:
        ap.error("expects a fleet of one node group and one app")
    group, fa = fleet.groups[0], fleet.apps[0]
    print(f"machine: {platform.platform()}, os.cpu_count()={os.cpu_count()}, "
          f"python {platform.python_version()}; modeled profiles")
    t0 = time.perf_counter()
    fp, curves = plan_fleet(fleet)
    wall = time.perf_counter() - t0
    cap = fleet_capacity(fleet, fa.name, curves)
    print(f"fleet {fleet.name}: {group.count} x {group.node.num_gpus} {group.node.gpu.name}, "
          f"{fa.name} at {fa.demand_rps:g} rps: planned in {wall:.1f} s "
          f"({fp.curve_seconds:.1f} s node capacity, {fp.solve_seconds:.1f} s allocation and node plans; "
          f"target <= 30 s), slices {fp.slices_used}/{fp.slices_available}, "
          f"{'feasible' if fp.feasible else 'above capacity'}")
    for note in fp.notes:
        print(f"  note: {note}")
    print(f"fleet capacity: {cap:.1f} rps ({group.count} x {cap / group.count:.2f})")
    if not args.no_pool:
        pool = group.node.with_gpus(group.count * group.node.num_gpus)
        app = group.node.app(fa.name)
        t0 = time.perf_counter()
        c = capacity(app, pool, load_node_profiles(pool, [app]), space=fleet.space or "ast",
                     time_limit_s=args.time_limit, solver="highs")
        print(f"single pool of {pool.num_gpus} GPUs: {c.max_demand_rps:.1f} rps ({c.status}, "
              f"{time.perf_counter() - t0:.1f} s)")
        ratio = cap / c.max_demand_rps if c.max_demand_rps else float("nan")
        print(f"fleet / pool = {ratio:.4f} ({100 * (ratio - 1):+.2f}%; target within 2%)")
    if args.accuracy_mix:
        app = group.node.app(fa.name)
        profiles = load_node_profiles(group.node, [app])
        base = app.accuracy_slo if app.accuracy_slo is not None else group.node.planner.accuracy_slo
        print(f"one node's capacity by accuracy SLO (the app's is {base:g}):")
        points = []
        for a in sorted({base, *(float(x) for x in args.accuracy_mix.split(",") if x)}):
            c = capacity(replace(app, accuracy_slo=a), group.node, profiles, space=fleet.space,
                         time_limit_s=fleet.time_limit_s, solver=fleet.solver)
            points.append((c.max_demand_rps, c.plan.accuracy))
            print(f"  accuracy >= {a:.3f}: {c.max_demand_rps:8.1f} rps (plan accuracy "
                  f"{c.plan.accuracy:.4f}, {c.status})")
        # The best fleet of nodes at these levels (node counts continuous: an upper bound) whose
        # rate-weighted accuracy meets the app's SLO.
        m = mip.Model(sense=mip.MAXIMIZE, solver_name=mip.CBC)
        m.verbose = 0
        n = [m.add_var(lb=0) for _ in points]
        m += mip.xsum(n) <= group.count
        m += mip.xsum(x * c * (acc - base) for x, (c, acc) in zip(n, points, strict=True)) >= 0
        m.objective = mip.maximize(mip.xsum(x * c for x, (c, _) in zip(n, points, strict=True)))
        sol = as_linear(m).solve("cbc", 60.0, 0.0)  # where a CBC abort cannot end the bench
        mix = sum(sol.values[x.idx] * c for x, (c, _) in zip(n, points, strict=True)) if sol.values else 0.0
        print(f"best mix of these levels over {group.count} nodes: {mix:.1f} rps vs {cap:.1f} all at the SLO "
              f"({100 * (mix / cap - 1):+.2f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
