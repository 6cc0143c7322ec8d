"""Reconfigurations of the emulated node over a replayed day: what each one keeps, starts, stops.

    PYTHONPATH=src python bench/reconfig.py [--node examples/h100x4.toml] [--bins 12] [--first-bin 96]
        [--peaks social_media=120,traffic_analysis=60,ar_assistant=30] [--time-limit 3]

Every app of the node is re-planned each bin for the bin's demand (a synthetic diurnal day, 5-minute
bins, scaled per app to ``--peaks``), laid out against what the other apps hold (one node layout)
and applied through the reconfiguration executor on the emulated NVML and emulated MPS (the same
calls and order as on GPUs), with one real OS process per planned process (an idle Python
process standing in for a worker), so kept instances really keep their pids. A further
re-apply of the unchanged layout per bin measures a pure re-weight.

Per reconfiguration: instances kept / started / stopped, processes started against what a new
generation of the whole app would start (the node before this change: every re-plan restarts all
of the app's processes), the GPUs NVML was called on, and the time from plan decided to routing
switched. Requests lost are measured by ``bench/replay.py`` once the daemon applies layouts
through this executor; here there is no traffic, so the column says ``n/a``. Times are wall
clock on the machine that runs it (shared and small here: compare ratios from one run).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "src"))

from jigsaw.gpu.executor import make_reconfigurer  # noqa: E402
from jigsaw.gpu.layout import NodeInstance, NodeLayout, empty_layout, place_app  # noqa: E402
from jigsaw.node import load_node, load_node_profiles  # noqa: E402
from jigsaw.planner.milp import plan  # noqa: E402
from jigsaw.planner.packer import PackingError, instances_from_plan  # noqa: E402
from jigsaw.traces import bin_rates, scale_to_peak, synthetic_day  # noqa: E402

IDLE = [sys.executable, "-c", "import signal; signal.pause()"]


class StandInWorkers:
    """One idle OS process per planned process; routing and drains are recorded, not served."""

    def __init__(self) -> None:
        self.procs: dict[tuple, list[subprocess.Popen]] = {}
        self.processes_started = 0

    async def start(self, inst: NodeInstance, env: Mapping[str, str]) -> tuple[int, ...]:
        procs = [subprocess.Popen(IDLE, stdin=subprocess.DEVNULL) for _ in range(inst.mps)]
        self.procs[(inst.slot, inst.workload)] = procs
        self.processes_started += len(procs)
        return tuple(p.pid for p in procs)

    async def wait_warm(self, inst: NodeInstance) -> None:
        return None

    async def route(self, active: NodeLayout) -> None:
        return None

    async def drain(self, inst: NodeInstance) -> None:
        return None

    async def stop(self, inst: NodeInstance) -> None:
        for p in self.procs.pop((inst.slot, inst.workload), []):
            p.terminate()
            p.wait(timeout=10)

    def close(self) -> None:
        for ps in self.procs.values():
            for p in ps:
                p.kill()
                p.wait()


def _peaks(text: str) -> dict[str, float]:
    out = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        out[name.strip()] = float(value)
    return out


async def run(args: argparse.Namespace) -> int:
    node = load_node(args.node)
    profiles = load_node_profiles(node)
    peaks = _peaks(args.peaks)
    day = bin_rates(synthetic_day(args.seed), 300)
    window = day[args.first_bin: args.first_bin + args.bins]
    demand = {a.name: scale_to_peak(window, peaks.get(a.name, 30.0)) for a in node.apps}
    workers = StandInWorkers()
    with tempfile.TemporaryDirectory(prefix="jigsaw-bench-mps-") as mps_dir:
        rec = make_reconfigurer(node, workers, emulate=True, run_dir=Path(mps_dir))
        running = empty_layout(node.gpu, node.num_gpus)
        previous = {}
        rows = []
        last = args.first_bin + args.bins - 1
        print(f"node {node.name}: {node.num_gpus} x {node.gpu.name}, emulated NVML and MPS; "
              f"apps {', '.join(a.name for a in node.apps)}; bins {args.first_bin}..{last}")
        header = (f"{'bin':>4} {'app':<17} {'rps':>6} {'kept':>5} {'start':>5} {'stop':>5} {'procs':>6} "
                  f"{'today':>6} {'nvml_gpus':<10} {'switch_ms':>10} {'total_ms':>9} lost")
        print(header)
        try:
            for b in range(len(window)):
                for app in node.apps:
                    rps = demand[app.name][b]
                    p = plan(app, node, profiles, rps, previous=previous.get(app.name),
                             time_limit_s=args.time_limit, solver="highs")
                    decided = time.monotonic()
                    try:
                        desired = place_app(running, app.name, instances_from_plan(p), node.gpu)
                    except PackingError as exc:
                        print(f"{b:>4} {app.name:<17} {rps:>6.1f}  no room beside the other apps, keeps its "
                              f"running plan: {exc}")
                        continue
                    previous[app.name] = p
                    before = workers.processes_started
                    result = await rec.apply(running, desired, decided_at=decided, reason=f"bin {b}")
                    if not result.ok:
                        print(f"{b:>4} {app.name:<17} failed and rolled back: {result.error}")
                        continue
                    running = result.running
                    s = result.plan.summary()
                    started = workers.processes_started - before
                    today = sum(i.mps for i in running.of_app(app.name))
                    rows.append(("replan", s, started, today, result.switch_s))
                    gpus = ",".join(map(str, result.plan.nvml_gpus)) or "-"
                    print(f"{b:>4} {app.name:<17} {rps:>6.1f} {s['kept']:>5} {s['started']:>5} "
                          f"{s['stopped']:>5} {started:>6} {today:>6} {gpus:<10} "
                          f"{result.switch_s * 1e3:>10.2f} {result.total_s * 1e3:>9.2f} n/a")
                # a re-weight: the same layout again (lane weights are the routing callback's)
                decided = time.monotonic()
                result = await rec.apply(running, running, decided_at=decided, reason="re-weight")
                s = result.plan.summary()
                rows.append(("reweight", s, 0, 0, result.switch_s))
                print(f"{b:>4} {'(re-weight all)':<17} {'':>6} {s['kept']:>5} {s['started']:>5} "
                      f"{s['stopped']:>5} {0:>6} {0:>6} {'-':<10} {result.switch_s * 1e3:>10.2f} "
                      f"{result.total_s * 1e3:>9.2f} n/a")
        finally:
            workers.close()
            rec.mps.stop_all()
    keep_only = [r[4] for r in rows if r[1]["started"] == 0 and r[1]["stopped"] == 0]
    changed = [r for r in rows if r[0] == "replan"]
    started = sum(r[2] for r in changed)
    today = sum(r[3] for r in changed)
    print()
    print(f"re-plans that keep every instance (incl. re-weights): {len(keep_only)}; switch ms "
          f"median {statistics.median(keep_only) * 1e3:.2f}, max {max(keep_only) * 1e3:.2f} (target <= 50)"
          if keep_only else "no re-plan kept every instance")
    print(f"processes started over {len(changed)} re-plans: {started}, against {today} for a new generation "
          f"of the whole app each time ({started / today:.2f}x)" if today else "no processes")
    print(f"reconfigurations {rec.stats.reconfigs_total}, failures {sum(rec.stats.failures_total.values())}; "
          "requests lost: n/a (no traffic here; bench/replay.py measures them through the daemon)")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--node", default=str(ROOT / "examples" / "h100x4.toml"))
    p.add_argument("--bins", type=int, default=12)
    p.add_argument("--first-bin", type=int, default=96, help="first 5-minute bin of the synthetic day")
    p.add_argument("--peaks", default="social_media=120,traffic_analysis=60,ar_assistant=30",
                   help="peak demand (root requests/s) of each app over the window")
    p.add_argument("--time-limit", type=float, default=3.0, help="planner time limit per solve (s)")
    p.add_argument("--seed", type=int, default=0)
    return asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
