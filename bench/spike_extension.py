"""Does the plan a spike's in-place extensions leave hold the spike?

    PYTHONPATH=src python bench/spike_extension.py [--app ar_assistant] [--start 127] \\
        [--steps 461.7,537.6] [--rates 724,778,778,491,244] [--time-scale 20] [--bin-seconds 5]

The app's exact plan for a quiet bin (``--start`` req/s, planned at ``planner.max_utilization``
0.8), then the chain of extensions the controller's rate trigger makes at a spike
(``node_plan.extend_in_place`` for each of ``--steps``, each laid out beside what runs as the
daemon lays it, ``runtime.placement.Beside``: nothing that runs moves). The plan it ends on is
served by ``jigsawd --emulate --no-controller --plan`` (no re-plan rescues it) and played
``--rates`` (one bin each, open-loop Poisson at rate / time scale): per bin violations, 503 /
504 and p99 (node time), and per task the mean batch, mean queue wait (node ms) and items
dropped. Exit status 1 when the client fell behind its schedule.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.append(str(ROOT / "src"))

from plan_holds import task_metrics  # noqa: E402
from replay import BinSplit, client_concurrency, node_with_settings, percentile, play  # noqa: E402

from jigsaw.gpu.layout import from_app_layouts  # noqa: E402
from jigsaw.node import Node, load_node, load_node_profiles  # noqa: E402
from jigsaw.plan import Plan  # noqa: E402
from jigsaw.planner.node_plan import extend_in_place, plan_node  # noqa: E402
from jigsaw.runtime.placement import Beside  # noqa: E402
from jigsaw.testing import jigsawd  # noqa: E402


def extended_chain(node: Node, app_name: str, start_rps: float, steps: list[float]) -> Plan:
    """The exact plan for ``start_rps`` extended in place for each of ``steps`` in turn (a step
    whose extension serves no more leaves the plan as it was)."""
    profiles = load_node_profiles(node)
    app = node.app(app_name)
    run = plan_node([app], node, profiles, {app.name: start_rps}, solver="highs",
                    time_limit_s=30).plans[app.name]
    for demand in steps:
        laid = from_app_layouts(node.gpu.name, node.num_gpus, {app.name: run.layout})
        beside = Beside(laid, laid.instances, node.gpu)

        def fits(p: Plan, beside: Beside = beside) -> Plan | None:
            got = beside.place(app.name, p)
            return None if got is None else got[1]
        run = extend_in_place(app, node, profiles, {app.name: run}, demand, fits=fits) or run
    return run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--node", type=Path, default=ROOT / "examples" / "h100x4.toml")
    p.add_argument("--app", default="ar_assistant")
    p.add_argument("--start", type=float, default=127.0, help="req/s of the quiet bin's exact plan")
    p.add_argument("--steps", default="461.7,537.6", help="comma-separated req/s the rate trigger asks for")
    p.add_argument("--rates", default="724,778,778,491,244", help="comma-separated req/s played, a bin each")
    p.add_argument("--time-scale", type=float, default=20.0)
    p.add_argument("--bin-seconds", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    try:
        steps = [float(x) for x in args.steps.split(",") if x.strip()]
        rates = [float(x) for x in args.rates.split(",") if x.strip()]
    except ValueError:
        raise SystemExit("spike_extension: --steps and --rates take numbers separated by commas") from None
    if not rates or any(r <= 0 for r in rates) or args.start <= 0:
        raise SystemExit("spike_extension: --start and every rate must be > 0")
    with tempfile.TemporaryDirectory(prefix="jigsaw-spike-") as tmp:
        out = Path(tmp)
        node_file = node_with_settings(args.node, ["planner.max_utilization=0.8"], out)
        node = load_node(node_file)
        plan = extended_chain(node, args.app, args.start, steps)
        print(f"{args.app}: the plan for {args.start:g} req/s extended for {args.steps}: "
              f"{plan.planned_rps:.1f} req/s planned on {plan.slices_used} slices, "
              f"accuracy {plan.accuracy:.3f}", flush=True)
        plan_file = out / "plan.json"
        plan_file.write_text(plan.to_json())
        ts = args.time_scale
        daemon = ["--node-config", str(node_file), "--apps", args.app, "--plan", str(plan_file),
                  "--no-controller", "--time-scale", f"{ts:g}", "--seed", str(args.seed)]
        slo_ms = node.app(args.app).latency_slo_ms
        with jigsawd(daemon, out / "jigsawd.log", ready_timeout_s=180.0) as d:
            split = BinSplit(0.0, args.bin_seconds)
            results, _ = asyncio.run(play(d.url, args.app, rates, split, ts, args.seed, lambda k, r: None,
                                          client_concurrency(max(rates), slo_ms * ts)))
            tasks = task_metrics(d.url, args.app)
    behind = False
    for k, r in enumerate(results):
        behind = behind or r.behind
        print(f"bin {k}: {rates[k]:g} req/s, sent {r.sent}, violations {r.violation_pct:.2f}%, "
              f"503 {r.shed_503}, 504 {r.dropped_504}, "
              f"p99 {percentile(r.latencies_ms, 99):.0f} ms (SLO {slo_ms:g})")
    print("per task: " + "  ".join(f"{t} batch {m['mean_batch']:.1f}, queue {m['queue_ms'] / ts:.0f} ms, "
                                   f"dropped {m.get('dropped', 0):.0f}" for t, m in sorted(tasks.items())))
    if behind:
        print("spike_extension: the client fell behind its schedule", flush=True)
    return 1 if behind else 0


if __name__ == "__main__":
    sys.exit(main())
