"""Planner speed: solve time, gap and plan quality from 10% to 100% of each app's capacity.

For each app of the node: the maximum serviceable demand (search space ``ast``) is computed once,
then the planner solves at 10%, 20%, ..., 100% of it with each solver (one thread each) and each
formulation (``tight``: the latency-relaxed core with lifting, the default; ``reference``: the
original single model), in the same run. Per solve it prints demand, status, wall seconds
(columns, model build and solve), absolute gap, slices used, accuracy and the columns
before/after pruning (the capacity's plan, its lanes scaled to the demand, is each solve's start
where the greedy plan finds none, as at 100%; ``--no-capacity-start`` turns that off); per app,
solver and formulation a summary against the targets (median
<= 0.3 s, max <= 1.5 s per solve, every solve proven: absolute gap below one slice's cost
beta), the speed-up of tight over reference (ratio of medians) and whether both found the same
optimum on every instance both proved.

The objective is alpha * accuracy - beta * slices with alpha = 1, so the absolute gap is in
accuracy units: a gap of 0.01 is 1% of the best end-to-end accuracy.

The profiles are modeled (profiles/generate.py), not measured on GPUs: the numbers describe the
solver on this MILP, not a GPU.

    PYTHONPATH=src python bench/planner_speed.py [--apps traffic_analysis] [--solvers cbc,highs]
        [--fractions 0.1,0.5,1.0] [--time-limit 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
try:
    import jigsaw  # noqa: F401
except ImportError:  # run from a checkout without an installed package
    sys.path.insert(0, str(ROOT / "src"))

from jigsaw.node import load_node, load_node_profiles  # noqa: E402
from jigsaw.plan import json_safe  # noqa: E402
from jigsaw.planner import joint, problem  # noqa: E402
from jigsaw.planner.milp import capacity, plan  # noqa: E402

TARGET_MEDIAN_S = 0.3
TARGET_MAX_S = 1.5
DEFAULT_FRACTIONS = tuple(round(0.1 * i, 1) for i in range(1, 11))


def machine() -> str:
    return (f"{platform.platform()}, {platform.processor() or platform.machine()}, "
            f"os.cpu_count()={os.cpu_count()}, python {platform.python_version()}")


PLAIN = "tight-plain"  # the tight model as before the split search and the HiGHS core stage


@contextlib.contextmanager
def formulation_of(form: str) -> Iterator[str]:
    """The formulation ``plan`` takes for the bench's name: ``tight-plain`` is ``tight`` with
    every stage on the solver named and no split search (the path before both)."""
    if form != PLAIN:
        yield form
        return
    saved = joint.CORE_SOLVER, joint.SPLIT_SEARCH
    joint.CORE_SOLVER, joint.SPLIT_SEARCH = None, False
    try:
        yield "tight"
    finally:
        joint.CORE_SOLVER, joint.SPLIT_SEARCH = saved


def hit_limit(status: str, seconds: float, limit: float) -> bool:
    """The solve stopped on the time limit rather than on proven optimality/infeasibility."""
    return status not in ("optimal", "infeasible") or seconds >= 0.98 * limit


def fmt_gap(gap: float) -> str:
    return "inf" if math.isinf(gap) else f"{gap:.2e}" if gap else "0"


def run_app(app_name: str, node, profiles, solvers: list[str], fractions: list[float],
            limit: float, space: str, cap_solver: str, cap_limit: float,
            formulations: list[str], start_from_capacity: bool = True,
            reference_limit: float | None = None) -> dict[str, Any]:
    app = node.app(app_name)
    t0 = time.perf_counter()
    cap = capacity(app, node, profiles, space=space, time_limit_s=cap_limit, solver=cap_solver)
    cap_wall = time.perf_counter() - t0
    print(f"\n== {app_name}: capacity ({space}, {cap_solver}) = {cap.max_demand_rps:.6g} rps "
          f"[{cap.status}{', a lower bound' if cap.status != 'optimal' else ''}] "
          f"in {cap_wall:.1f} s; slices {cap.plan.slices_used}/{cap.plan.slices_available}, "
          f"accuracy {cap.plan.accuracy:.4f}", flush=True)
    out: dict[str, Any] = {"app": app_name, "capacity_rps": cap.max_demand_rps,
                           "capacity_status": cap.status, "capacity_seconds": cap_wall,
                           "runs": {}}
    if cap.max_demand_rps <= 0:
        print("   no serviceable demand: nothing to time")
        return out
    tight_limit = limit
    for solver, form in [(s, f) for s in solvers for f in formulations]:
        # the reference may run under its own (shorter) limit: said in its header and summary
        limit = reference_limit if form == "reference" and reference_limit is not None else tight_limit
        print(f"\n-- {app_name} / {solver} / {form} (time limit {limit:g} s, 1 thread)")
        header = (f"{'frac':>5} {'demand rps':>11} {'status':>10} {'solve s':>8} {'wall s':>7} "
                  f"{'abs gap':>9} {'slices':>9} {'accuracy':>8} {'columns':>11}")
        print(header)
        print("-" * len(header))
        rows = []
        for f in fractions:
            demand = f * cap.max_demand_rps
            problem.forget()  # each solve builds its columns, as a first plan of the app does
            t1 = time.perf_counter()
            # the capacity's plan serves every fraction: the start where the greedy plan finds none
            with formulation_of(form) as name:
                p = plan(app, node, profiles, demand, space=space, time_limit_s=limit, solver=solver,
                         formulation=name, start=cap.plan if start_from_capacity else None)
            wall = time.perf_counter() - t1
            status = p.status if p.feasible or not p.max_demand_plan else f"{p.status}*"
            row = {"fraction": f, "demand_rps": demand, "status": p.status, "feasible": p.feasible,
                   "max_demand_plan": p.max_demand_plan, "solve_seconds": p.solve_seconds,
                   "wall_seconds": wall, "gap": p.gap, "slices_used": p.slices_used,
                   "slices_available": p.slices_available, "accuracy": p.accuracy,
                   "columns_total": p.columns_total, "columns_pruned": p.columns_pruned,
                   "objective": p.objective,
                   "hit_limit": hit_limit(p.status, p.solve_seconds, limit)}
            rows.append(row)
            print(f"{f:>5.0%} {demand:>11.5g} {status:>10} {p.solve_seconds:>8.3f} {wall:>7.3f} "
                  f"{fmt_gap(p.gap):>9} {p.slices_used:>4}/{p.slices_available:<4} "
                  f"{p.accuracy:>8.4f} {p.columns_total:>5}->{p.columns_pruned:<5}", flush=True)
        out["runs"][f"{solver}/{form}"] = {"rows": rows, "summary": summarize(
            app_name, f"{solver}/{form}", rows, limit, node.beta)}
    return out


def summarize(app_name: str, solver: str, rows: list[dict[str, Any]], limit: float,
              beta: float) -> dict[str, Any]:
    times = [r["wall_seconds"] for r in rows]
    gaps = [r["gap"] for r in rows]
    med, mx, max_gap = statistics.median(times), max(times), max(gaps)
    n_limit = sum(r["hit_limit"] for r in rows)
    ok = {"median": med <= TARGET_MEDIAN_S, "max": mx <= TARGET_MAX_S, "gap": max_gap < beta}
    mark = {True: "ok", False: "MISS"}
    print(f"summary {app_name}/{solver}: median {med:.2f} s (target <= {TARGET_MEDIAN_S:g}: "
          f"{mark[ok['median']]}), max {mx:.2f} s (<= {TARGET_MAX_S:g}: {mark[ok['max']]}), "
          f"max abs gap {fmt_gap(max_gap)} (< beta {beta:.3g}: {mark[ok['gap']]}), "
          f"{n_limit}/{len(rows)} hit the {limit:g} s limit")
    return {"median_s": med, "max_s": mx, "max_gap": max_gap, "hit_limit": n_limit,
            "solves": len(rows), "targets_met": ok}




def same_optimum(rows: list[dict[str, Any]], ref_rows: list[dict[str, Any]], tol: float) -> str:
    """'yes (n)' when every instance both proved has the same objective within ``tol``.

    Both solves stop once no plan is better by more than the stopping gap ``tol`` (the node's
    ``absolute_gap``, half a slice's cost by default), so two proven optima may differ by up to
    ``tol`` and, when accuracy trades against a slice, in their slice count: the count of
    instances whose slices differ is printed beside the verdict ("slices differ on k").
    """
    both = [(a, b) for a, b in zip(rows, ref_rows, strict=True)
            if a["status"] == "optimal" and b["status"] == "optimal"]
    if not both:
        return "none proved"
    bad = sum(abs(a["objective"] - b["objective"]) > tol + 1e-9 for a, b in both)
    slices = sum(a["slices_used"] != b["slices_used"] for a, b in both)
    verdict = f"yes ({len(both)})" if not bad else f"NO {bad}/{len(both)}"
    return verdict + (f", slices differ on {slices}" if slices else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--node", default=str(ROOT / "examples/h100x4.toml"))
    ap.add_argument("--apps", default="", help="comma-separated app names (default: all of the node's)")
    ap.add_argument("--solvers", default="cbc,highs")
    ap.add_argument("--formulations", default="tight,reference",
                    help="tight (default formulation), tight-plain (tight as before the split "
                         "search and the HiGHS core stage) and/or reference (the original model)")
    ap.add_argument("--fractions", default=",".join(f"{f:g}" for f in DEFAULT_FRACTIONS),
                    help="demands as fractions of the capacity")
    ap.add_argument("--time-limit", type=float, default=10.0, help="seconds per solve")
    ap.add_argument("--reference-time-limit", type=float, default=None,
                    help="seconds per solve of the reference formulation (default: --time-limit); "
                         "a shorter one leaves its hard instances unproven, which the summary counts")
    ap.add_argument("--space", default="ast")
    ap.add_argument("--capacity-solver", default="highs")
    ap.add_argument("--capacity-time-limit", type=float, default=60.0)
    ap.add_argument("--no-capacity-start", action="store_true",
                    help="do not hand the capacity's plan to the solves as a start (where the greedy "
                         "plan finds none)")
    ap.add_argument("--json", metavar="OUT", help="write every row and summary to this JSON file")
    args = ap.parse_args(argv)

    node = load_node(args.node)
    profiles = load_node_profiles(node)
    apps = [a for a in args.apps.split(",") if a] or [a.name for a in node.apps]
    solvers = [s for s in args.solvers.split(",") if s]
    fractions = [float(f) for f in args.fractions.split(",") if f]

    print(f"machine: {machine()}")
    print(f"node: {node.name} ({node.num_gpus}x {node.gpu.name}, {node.slices_available} slices), "
          f"space {args.space}, beta {node.beta:.4g}, stopping gap {node.absolute_gap:.4g}")
    print("profiles: modeled (profiles/generate.py), not measured; times are this machine's, "
          "one solver thread")
    print("columns: candidates -> after pruning; status*: above capacity, max-demand plan returned")

    formulations = [f for f in args.formulations.split(",") if f]
    results = [run_app(a, node, profiles, solvers, fractions, args.time_limit, args.space,
                       args.capacity_solver, args.capacity_time_limit, formulations,
                       not args.no_capacity_start, args.reference_time_limit) for a in apps]
    if args.reference_time_limit is not None and "reference" in formulations:
        print(f"\nnote: the reference formulation ran with a {args.reference_time_limit:g} s limit per "
              f"solve, the others with {args.time_limit:g} s: its medians are capped by it")

    print(f"\n== summary (wall per solve incl. columns and build; targets: median <= "
          f"{TARGET_MEDIAN_S:g} s, max <= {TARGET_MAX_S:g} s, every gap < beta {node.beta:.3g})")
    print("speed-up and same optimum: tight against tight-plain where both ran, else against "
          "reference")
    print(f"{'app':<18} {'solver/formulation':<16} {'median s':>8} {'max s':>7} {'max gap':>9} "
          f"{'at limit':>8} {'speed-up':>8} {'same optimum':>12}")
    for r in results:
        for key, run in r["runs"].items():
            s = run["summary"]
            solver, form = key.split("/")
            ref = r["runs"].get(f"{solver}/reference")
            if form == "tight" and f"{solver}/{PLAIN}" in r["runs"]:
                ref = r["runs"][f"{solver}/{PLAIN}"]  # the same model before: the change's ratio
            speedup, same = "-", "-"
            if form not in ("reference", PLAIN) and ref is not None:
                speedup = f"{ref['summary']['median_s'] / max(s['median_s'], 1e-9):.1f}x"
                same = same_optimum(run["rows"], ref["rows"], node.absolute_gap)
            print(f"{r['app']:<18} {key:<16} {s['median_s']:>8.3f} {s['max_s']:>7.2f} "
                  f"{fmt_gap(s['max_gap']):>9} {s['hit_limit']:>4}/{s['solves']:<3} {speedup:>8} {same:>12}")

    if args.json:
        payload = {"machine": machine(), "cpu_count": os.cpu_count(), "node": node.name,
                   "space": args.space, "time_limit_s": args.time_limit, "profiles": "modeled",
                   "apps": results}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(json_safe(payload), indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
