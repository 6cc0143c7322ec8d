"""Maximum serviceable demand of every search space (the paper's Fig. 3).

The app (default: traffic analysis) on the reference node scaled to ``--gpus`` GPUs (default 120,
840 H100 slices, as in the paper). For each of the eight search spaces (A: accuracy scaling,
S: spatial partitioning, T: task-graph-informed budgeting; ``unopt`` has none) the planner's
capacity MILP finds the maximum serviceable demand; then the cheapest plan serving it. Prints
the demand normalized to ``unopt`` beside the paper's, the slices that plan uses (% of those
available) and its accuracy, and writes a two-panel PNG like the paper's figure.

If a capacity solve stops on the time limit its incumbent is a lower bound on the capacity;
the status column says so. Beside each space's seconds: the MILPs and LPs solved and their
branch-and-bound nodes (counts of work, the same on a busy machine). ``--compare-full`` solves
each space again with the full model deciding where the core's plan does not lift (the search
over the SLO's maximal splits off, as before it existed), alternating which goes first, and
prints both with the ratio. The profiles are modeled (profiles/generate.py), not measured.

With ``--app all`` every app of the node in turn, then the total seconds against the target
(every example app in all eight spaces on 120 GPUs, each proven, within 60 s).

    PYTHONPATH=src python bench/capacity.py [--app traffic_analysis|all] [--gpus 120]
        [--solver cbc|highs] [--time-limit 120] [--compare-full] [--out out/]

``--mps-shares`` prints instead the gain of MPS shares (processes of different tasks on one whole
GPU or one MIG instance, ``jigsaw.shares``) per example app: the capacity of the 4 H100s of
examples/h100x4.toml used whole with 8 shares against their MIG partitions (the paper's plan), and
of one and of four whole H200s (examples/h200x1.toml) against the same GPUs without shares (whole-GPU
segments of one task only). Then on the MIG node (whose capacity the MIG-instance shares leave as it
is: the share pass keeps the lanes) without shares, as it is (the default: the share pass,
``planner/share_merge.py``) and with the shares in the MILPs: each app's plan and the three apps'
node plan at 10% and 2% of capacity, slices and seconds; and the share pass's own time on node
plans from 2% to 120% of the node's capacity.

    PYTHONPATH=src python bench/capacity.py --mps-shares [--time-limit 60]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
try:
    import jigsaw  # noqa: F401
except ImportError:  # run from a checkout without an installed package
    sys.path.insert(0, str(ROOT / "src"))

from jigsaw.errors import PlanError  # noqa: E402
from jigsaw.node import load_node, load_node_profiles  # noqa: E402
from jigsaw.plan import json_safe  # noqa: E402
from jigsaw.planner import joint  # noqa: E402
from jigsaw.planner.milp import capacity, column_counts  # noqa: E402
from jigsaw.planner.model import tally  # noqa: E402

# Figure order and labels; the paper's normalized maximum demand (traffic app, 120 GPUs).
ORDER = ("unopt", "s", "a", "t", "at", "st", "as", "ast")
LABELS = {"unopt": "Unopt", "a": "A", "s": "S", "t": "T", "as": "A+S", "at": "A+T", "st": "S+T",
          "ast": "A+S+T"}
PAPER = {"unopt": 1.0, "s": 5.25, "a": 1.6, "t": 1.1, "at": 1.9, "st": 7.8, "as": 12.0, "ast": 21.6}
# The paper gives the slices used only in words: the T spaces use all available GPUs, the
# task-graph-uninformed ones do not.
PAPER_ALL_SLICES = {s: s != "unopt" and "t" in s for s in ORDER}

# Pairs (smaller, larger) where the larger space contains every plan of the smaller one, so its
# capacity can be no lower. Adding T drops the static budgets; adding A keeps the budgets
# (appendix B computes them from the most accurate variants) and adds variants; adding S to a
# T space adds segments. Adding S without T is not a superset: the static budgets are computed
# over the segments the space allows, so they change.
SUPERSETS = (("unopt", "a"), ("s", "as"), ("t", "at"), ("st", "ast"),
             ("unopt", "t"), ("a", "at"), ("s", "st"), ("as", "ast"),
             ("t", "st"), ("at", "ast"))


def machine() -> str:
    return f"{platform.platform()}, os.cpu_count()={os.cpu_count()}, python {platform.python_version()}"


def solve_space(app, node, profiles, sp: str, solver: str, limit: float, splits: bool = True
                ) -> dict[str, Any]:
    """One space's capacity and plan as a row; ``splits`` False: the full model decides where
    the core's plan does not lift (``joint.CAPACITY_SPLITS`` off, the path before the split search)."""
    cols = column_counts(app, node, profiles, sp)
    saved = joint.CAPACITY_SPLITS
    joint.CAPACITY_SPLITS = splits
    t0 = time.perf_counter()
    try:
        with tally() as work:
            cap = capacity(app, node, profiles, space=sp, time_limit_s=limit, solver=solver)
    except PlanError as exc:  # e.g. no incumbent for the re-solve at the maximum within the limit
        wall = time.perf_counter() - t0
        return {"space": sp, "label": LABELS[sp], "max_demand_rps": float("nan"),
                "status": "error", "plan_status": "error", "error": str(exc),
                "seconds": wall, "slices_used": 0, "slices_available": node.slices_available,
                "accuracy": float("nan"), "gap": float("inf"), "objective": float("nan"),
                "columns_total": cols.num_candidates, "columns_pruned": len(cols.columns),
                "gpus_used": 0, "budgets": None, "milps": 0, "lps": 0, "nodes": 0}
    finally:
        joint.CAPACITY_SPLITS = saved
    wall = time.perf_counter() - t0
    p = cap.plan
    return {"space": sp, "label": LABELS[sp], "max_demand_rps": cap.max_demand_rps,
            "status": cap.status, "plan_status": p.status, "seconds": wall,
            "slices_used": p.slices_used, "slices_available": p.slices_available,
            "accuracy": p.accuracy, "gap": p.gap, "objective": p.objective,
            "columns_total": cols.num_candidates, "columns_pruned": len(cols.columns),
            "gpus_used": p.layout.gpus_used if p.layout is not None else 0,
            "budgets": dict(cols.budgets.slices) if cols.budgets is not None else None,
            "milps": work.milps, "lps": work.lps, "nodes": work.nodes}


def _line(row: dict[str, Any], tag: str = "") -> str:
    if row["status"] == "error":
        return f"  {row['label']:<6} {tag}error after {row['seconds']:.1f} s: {row['error']}"
    return (f"  {row['label']:<6} {tag}{row['max_demand_rps']:>10.5g} rps  capacity {row['status']:<9} "
            f"plan {row['plan_status']:<9} {row['seconds']:7.1f} s  slices "
            f"{row['slices_used']}/{row['slices_available']}  {row['milps']} MILPs "
            f"({row['nodes']} nodes), {row['lps']} LPs")


def run(app_name: str, node, profiles, spaces: list[str], solver: str, limit: float,
        compare_full: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each space's row, and with ``compare_full`` its row with the full model (same order)."""
    app = node.app(app_name)
    rows, full_rows = [], []
    for k, sp in enumerate(spaces):
        print(f"  {LABELS[sp]:<6} solving ({len(column_counts(app, node, profiles, sp).columns)} "
              "columns) ...", flush=True)
        order = [True, False] if k % 2 == 0 else [False, True]
        for splits in (order if compare_full else [True]):
            row = solve_space(app, node, profiles, sp, solver, limit, splits)
            (rows if splits else full_rows).append(row)
            print(_line(row, "" if not compare_full else ("splits " if splits else "full   ")),
                  flush=True)
    return rows, full_rows


def compare(rows: list[dict[str, Any]], full_rows: list[dict[str, Any]]) -> list[str]:
    """The two paths side by side; a different answer is a problem."""
    print("\n== the split search against the full model (the path before it), same run")
    header = (f"{'space':<6} {'splits s':>9} {'full s':>8} {'ratio':>6} {'MILPs':>11} {'nodes':>13} "
              f"{'same answer':>11}")
    print(header)
    print("-" * len(header))
    problems = []
    for a, b in zip(rows, full_rows, strict=True):
        same = (a["status"] == b["status"] and a["plan_status"] == b["plan_status"]
                and a["max_demand_rps"] == b["max_demand_rps"]
                and abs(a["objective"] - b["objective"]) <= 1e-9)
        if not same:
            problems.append(f"{a['label']}: {a['max_demand_rps']:.9g} rps ({a['status']}, plan "
                            f"{a['plan_status']} {a['objective']:.6g}) with the splits, "
                            f"{b['max_demand_rps']:.9g} rps ({b['status']}, plan {b['plan_status']} "
                            f"{b['objective']:.6g}) with the full model")
        ratio = b["seconds"] / a["seconds"] if a["seconds"] > 0 else float("nan")
        print(f"{a['label']:<6} {a['seconds']:>9.1f} {b['seconds']:>8.1f} {ratio:>5.1f}x "
              f"{a['milps']:>5}/{b['milps']:<5} {a['nodes']:>6}/{b['nodes']:<6} "
              f"{'yes' if same else 'NO':>11}")
    total_a = sum(r["seconds"] for r in rows)
    total_b = sum(r["seconds"] for r in full_rows)
    print(f"{'total':<6} {total_a:>9.1f} {total_b:>8.1f} {total_b / total_a:>5.1f}x")
    return problems


def _status(row: dict[str, Any]) -> str:
    s = row["status"]
    if s == "optimal":
        return "optimal"
    if s == "feasible":
        return "limit: >="  # the incumbent of a time-limited solve: a lower bound
    return s


def report(rows: list[dict[str, Any]]) -> list[str]:
    base = next((r["max_demand_rps"] for r in rows if r["space"] == "unopt"), None)
    header = (f"{'space':<6} {'max rps':>10} {'ours x':>7} {'paper x':>7} {'slices':>9} "
              f"{'% used':>6} {'paper':>6} {'accuracy':>8} {'columns':>11} {'capacity':>10} {'secs':>6}")
    print(header)
    print("-" * len(header))
    for r in rows:
        norm = r["max_demand_rps"] / base if base else float("nan")
        r["normalized"] = norm
        norm_s = f"{norm:>6.2f}x" if math.isfinite(norm) else f"{'-':>7}"
        pct = 100.0 * r["slices_used"] / r["slices_available"] if r["slices_available"] else 0.0
        r["slices_pct"] = pct
        paper_x = PAPER.get(r["space"])
        paper_sl = "all" if PAPER_ALL_SLICES[r["space"]] else "< all"
        print(f"{r['label']:<6} {r['max_demand_rps']:>10.5g} {norm_s} "
              f"{paper_x:>6.2f}x {r['slices_used']:>4}/{r['slices_available']:<4} {pct:>5.1f}% "
              f"{paper_sl:>6} {r['accuracy']:>8.4f} {r['columns_total']:>5}->{r['columns_pruned']:<5} "
              f"{_status(r):>10} {r['seconds']:>6.1f}")
    if base is None or base <= 0:
        print("(Unopt serves no demand here, so nothing is normalized: on a small node the static "
              "per-task slice budgets of appendix B can round a task's share down to nothing; "
              "the paper uses 120 GPUs so that every budget can be followed)")
    problems = []
    by = {r["space"]: r for r in rows}
    for small, large in SUPERSETS:
        if small in by and large in by:
            a, b = by[small], by[large]
            if "error" in (a["status"], b["status"]):
                continue
            if a["max_demand_rps"] > b["max_demand_rps"] * (1 + 1e-6) + 1e-9:
                why = (" (the larger space's solve stopped on the time limit: its value is a lower bound)"
                       if b["status"] != "optimal" else "")
                problems.append(f"{LABELS[small]} ({a['max_demand_rps']:.6g} rps) > {LABELS[large]} "
                                f"({b['max_demand_rps']:.6g} rps), but {LABELS[large]} contains "
                                f"{LABELS[small]}{why}")
    for msg in problems:
        print(f"WARNING: {msg}")
    return problems


def plot(rows: list[dict[str, Any]], out_dir: Path, app: str, gpus: int) -> Path | None:
    try:
        import matplotlib  # optional: only for the figure

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping the PNG (pip install matplotlib)")
        return None
    labels = [r["label"] for r in rows]
    xs = range(len(rows))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.4
    ours = [r.get("normalized", float("nan")) for r in rows]
    paper = [PAPER.get(r["space"], float("nan")) for r in rows]
    ax1.bar([x - width / 2 for x in xs], ours, width, label="ours (modeled profiles)")
    ax1.bar([x + width / 2 for x in xs], paper, width, label="paper", alpha=0.6)
    for x, r in zip(xs, rows):
        if r["status"] != "optimal" and math.isfinite(ours[x]):
            ax1.annotate(">=", (x - width / 2, ours[x]), ha="center", va="bottom", fontsize=8)
    ax1.set_xticks(list(xs), labels, rotation=30)
    ax1.set_ylabel("max serviceable demand / Unopt")
    ax1.set_title("Normalized maximum demand")
    ax1.legend()
    ax2.bar(list(xs), [r.get("slices_pct", 0.0) for r in rows], 0.6)
    ax2.set_xticks(list(xs), labels, rotation=30)
    ax2.set_ylim(0, 105)
    ax2.set_ylabel("% of GPU slices used")
    ax2.set_title("Slices used at the maximum demand")
    fig.suptitle(f"{app}, {gpus} GPUs ({rows[0]['slices_available']} slices)")
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"capacity_{app}_{gpus}gpus.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path




def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--node", default=str(ROOT / "examples/h100x4.toml"))
    ap.add_argument("--app", default="traffic_analysis",
                    help="an app, comma-separated apps, or all (the node's, with the total time)")
    ap.add_argument("--gpus", type=int, default=120, help="GPUs of the (hypothetical) node")
    ap.add_argument("--spaces", default=",".join(ORDER), help="comma-separated search spaces")
    ap.add_argument("--solver", default=None, choices=("cbc", "highs"),
                    help="cbc or highs (default: the node's, cbc on the example node)")
    ap.add_argument("--time-limit", type=float, default=120.0, help="seconds per MILP solve")
    ap.add_argument("--compare-full", action="store_true",
                    help="each space also with the full model instead of the split search "
                         "(alternating), side by side")
    ap.add_argument("--out", default="out", help="folder for the PNG and JSON")
    ap.add_argument("--mps-shares", action="store_true",
                    help="the gain of MPS shares per app on h100x4 and one whole H200 (see above)")
    args = ap.parse_args(argv)
    if args.mps_shares:
        return shares_gain(args.time_limit, args.solver, Path(args.out))

    base = load_node(args.node)
    node = base.with_gpus(args.gpus)
    profiles = load_node_profiles(node)
    solver = args.solver or node.planner.solver
    spaces = [s for s in args.spaces.split(",") if s]
    unknown = [s for s in spaces if s not in LABELS]
    if unknown:
        ap.error(f"unknown spaces {unknown} (expected {', '.join(ORDER)})")

    print(f"machine: {machine()}")
    apps = [a.name for a in node.apps] if args.app == "all" else [a for a in args.app.split(",") if a]
    failed, total_s, unproven = False, 0.0, []
    for app in apps:
        rows, bad = one_app(args, app, node, profiles, spaces, solver)
        failed |= bad
        total_s += sum(r["seconds"] for r in rows)
        unproven += [f"{app}/{r['space']}" for r in rows if r["status"] != "optimal"]
    if len(apps) > 1:
        print(f"\n== {len(apps)} apps x {len(spaces)} spaces: {total_s:.1f} s in the capacity solves, "
              f"load {os.getloadavg()[0]:.1f} (target <= {ALL_APPS_TARGET_S:g} s, each proven: "
              f"{'met' if total_s <= ALL_APPS_TARGET_S and not unproven else 'NOT met'}); "
              f"not proven: {', '.join(unproven) or 'none'}")
    return 1 if failed else 0


ALL_APPS_TARGET_S = 60.0  # every example app in all eight spaces on 120 GPUs (issue 42)


def one_app(args: argparse.Namespace, app: str, node, profiles, spaces: list[str], solver: str
            ) -> tuple[list[dict[str, Any]], bool]:
    """One app's spaces: solved, reported, plotted and written; its rows and whether any failed."""
    print(f"app {app} on {node.num_gpus}x {node.gpu.name} ({node.slices_available} slices), "
          f"solver {solver}, time limit {args.time_limit:g} s per solve, beta {node.beta:.4g}")
    print("profiles: modeled (profiles/generate.py), not measured on GPUs")
    t0 = time.perf_counter()
    rows, full_rows = run(app, node, profiles, spaces, solver, args.time_limit, args.compare_full)
    wall = time.perf_counter() - t0
    total = sum(r["seconds"] for r in rows)
    print(f"\n== maximum serviceable demand, normalized to Unopt (total {total:.1f} s in the "
          f"capacity solves{'' if full_rows else f', {wall:.1f} s wall'}; "
          f"{sum(r['milps'] for r in rows)} MILPs, {sum(r['nodes'] for r in rows)} nodes)")
    problems = report(rows)
    if full_rows:
        different = compare(rows, full_rows)
        for msg in different:
            print(f"WARNING: a different answer: {msg}")
        problems += different
    print("capacity 'limit: >=': the capacity solve stopped on the time limit, the value is a lower "
          "bound; paper slices: in words only (T spaces use all GPUs)")
    out_dir = Path(args.out)
    png = plot(rows, out_dir, app, args.gpus)
    if png is not None:
        print(f"wrote {png}")
    out_dir.mkdir(parents=True, exist_ok=True)
    js = out_dir / f"capacity_{app}_{args.gpus}gpus.json"
    js.write_text(json.dumps(json_safe({"machine": machine(), "app": app, "gpus": args.gpus,
                                      "solver": solver, "time_limit_s": args.time_limit,
                                      "profiles": "modeled", "rows": rows, "problems": problems}),
                             indent=2))
    print(f"wrote {js}")
    return rows, bool(problems) or any(r["status"] == "error" for r in rows)



# ---- --mps-shares: processes of different tasks sharing a whole GPU ----------------------------

def _whole_node_file(directory: Path, name: str, gpu: str, count: int, shares: int,
                     profiles_dir: Path, apps: list[str]) -> Path:
    """A node file of ``count`` whole ``gpu``s, MPS levels 1, 2, 4, 8, with ``shares`` shares."""
    path = directory / f"{name}.toml"
    app_list = ", ".join(f'"{ROOT / "examples" / "apps" / a}.toml"' for a in apps)
    path.write_text(f'name = "{name}"\napps = [{app_list}]\n[gpus]\nmodel = "{gpu}"\nmig = false\n'
                    f"count = {count}\nmps_levels = [1, 2, 4, 8]\nmps_shares = {shares}\n"
                    f'profiles_dir = "{profiles_dir}"\nbackend = "tensorrt"\n')
    return path


def shares_gain(limit: float, solver: str | None, out_dir: Path) -> int:
    """Per example app: the capacity with MPS shares against the plan without them (see the
    module doc); the profiles are modeled, the whole H100's written here into ``out_dir``."""
    from dataclasses import replace as dc_replace

    from jigsaw.modeled import GPU_SPECS, write

    apps = ["social_media", "traffic_analysis", "ar_assistant"]
    work = out_dir / "mps_shares"
    work.mkdir(parents=True, exist_ok=True)
    h100_whole = work / "h100-80gb-whole"
    h100_whole.mkdir(exist_ok=True)
    write(dc_replace(GPU_SPECS["H100-80GB"], whole=True), h100_whole, mps_levels=(1, 2, 4, 8))
    h200 = ROOT / "profiles" / "h200-whole"
    cases = [  # (label, node without shares, node with shares)
        ("4x H100, MIG -> whole + 8 shares", load_node(ROOT / "examples/h100x4.toml"),
         load_node(_whole_node_file(work, "h100x4-whole", "H100-80GB", 4, 8, h100_whole, apps))),
        ("1x H200 whole, no shares -> 8 shares",
         load_node(_whole_node_file(work, "h200x1-alone", "H200", 1, 0, h200, apps)),
         load_node(ROOT / "examples/h200x1.toml")),
    ]
    cases.append(("4x H200 whole, no shares -> 8 shares", cases[1][1].with_gpus(4), cases[1][2].with_gpus(4)))
    print(f"machine: {machine()}; profiles: modeled, not measured; time limit {limit:g} s per solve")
    header = f"{'node':<38} {'app':<18} {'without rps':>12} {'with rps':>10} {'gain':>7}  status"
    print(header)
    print("-" * len(header))
    bad = 0
    for label, before, after in cases:
        for app_name in apps:
            got = []
            for node in (before, after):
                app = node.app(app_name)
                cap = capacity(app, node, load_node_profiles(node, [app]), time_limit_s=limit,
                               solver=solver or node.planner.solver)
                got.append(cap)
            b, a = got[0].max_demand_rps, got[1].max_demand_rps
            gain = f"{a / b:.2f}x" if b > 0 else ("inf" if a > 0 else "-")
            # an unproven capacity with the solver's bound: the figure lies between
            status = "/".join(c.status if c.status == "optimal" or math.isnan(c.upper_bound_rps)
                              else f"{c.status} (<= {c.upper_bound_rps:.1f})" for c in got)
            bad += any(c.status not in ("optimal", "feasible") for c in got)
            print(f"{label:<38} {app_name:<18} {b:>12.1f} {a:>10.1f} {gain:>7}  {status}")
    print("without rps 0 on one whole GPU: an app of several tasks needs a GPU per task without shares")
    print("4x H100 MIG with instance shares: the capacity is the homogeneous plan's (the share pass "
          "keeps its lanes and rates)")
    bad += _mig_shares_tighter(work, apps, limit, solver)
    return 1 if bad else 0


MIG_SHARES = '["1g.10gb-1of2", "1g.10gb-1of3", "1g.10gb-1of4"]'  # the default: the 1g instance at 2, 3, 4
LOW = (0.1, 0.02)  # the small demands (fractions of each app's capacity alone) the slices are compared at
PASS_LOADS = (0.02, 0.1, 0.3, 0.6, 0.9, 1.0, 1.2)  # node loads (of the apps' capacities over 3) timed
PASS_REPEATS = 5  # the share pass timed this many times over each load's plan


def _mig_node_file(directory: Path, name: str, extra: str) -> Path:
    """examples/h100x4.toml with ``extra`` lines in its ``[gpus]`` table."""
    text = (ROOT / "examples" / "h100x4.toml").read_text()
    text = text.replace('"apps/', f'"{ROOT}/examples/apps/').replace('"../profiles', f'"{ROOT}/profiles')
    path = directory / f"{name}.toml"
    path.write_text(text.replace("count = 4\n", f"count = 4\n{extra}"))
    return path


def instance_slices(layout, node) -> int:
    """The compute slices a layout's MIG instances take, a shared instance once (empty seats too)."""
    if layout is None:
        return 0
    seen = {(g.gpu, p.start) for g in layout.gpus for p in g.instances}
    prof = {(g.gpu, p.start): node.gpu.device_profile(p.profile) for g in layout.gpus for p in g.instances}
    return sum(prof[k].compute_slices for k in seen)


def _mig_shares_tighter(directory: Path, apps: list[str], limit: float, solver: str | None) -> int:
    """examples/h100x4.toml without MIG-instance shares (``mig_shares = []``), as it is (the
    default: the share pass over the homogeneous plan, ``planner/share_merge.py``) and with the
    shares in the MILPs (listed among ``mig_profiles``): each app's plan at ``LOW`` of its
    capacity alone and all three apps together at ``LOW`` of theirs, slices (a shared instance
    whole) and seconds, the three run alternately; then the share pass's own time on the node
    plans at ``PASS_LOADS``. Every plan verified. Returns the failures."""
    from jigsaw.mig import gpu_model
    from jigsaw.planner.milp import plan
    from jigsaw.planner.node_plan import plan_node
    from jigsaw.planner.verify import verify_plan

    own = json.dumps([*gpu_model("H100-80GB").profile_names, *json.loads(MIG_SHARES)])
    nodes = {"without": load_node(_mig_node_file(directory, "h100x4-plain", "mig_shares = []\n")),
             "pass": load_node(ROOT / "examples/h100x4.toml"),
             "milp": load_node(_mig_node_file(directory, "h100x4-milp", f"mig_profiles = {own}\n"))}
    profiles = {k: load_node_profiles(n) for k, n in nodes.items()}
    plain = nodes["without"]
    caps = {a: capacity(plain.app(a), plain, profiles["without"], time_limit_s=limit,
                        solver=solver or plain.planner.solver).max_demand_rps for a in apps}
    bad = 0
    print(f"\n== 4x H100 MIG, slices (a shared instance whole) without shares -> share pass (default) "
          f"-> shares in the MILPs {MIG_SHARES}, and seconds; load {os.getloadavg()[0]:.1f}")
    print(f"{'app':<18} {'demand rps':>10} {'slices':>16} {'accuracy':>21}  seconds")
    for app_name in [*apps, "all three"]:
        for f in LOW:
            got = {}
            for k, node in nodes.items():
                t0 = time.perf_counter()
                if app_name == "all three":
                    np_ = plan_node(list(node.apps), node, profiles[k], {a: caps[a] * f for a in apps},
                                    time_limit_s=limit)
                    ps = np_.plans
                    layout = np_.layout
                else:
                    ps = {app_name: plan(node.app(app_name), node, profiles[k], caps[app_name] * f,
                                         time_limit_s=limit)}
                    layout = ps[app_name].layout
                secs = time.perf_counter() - t0
                problems = [x for a, p in ps.items() for x in verify_plan(p, node.app(a), node, profiles[k])]
                bad += bool(problems) or not all(p.feasible for p in ps.values())
                acc = sum(p.accuracy for p in ps.values()) / max(len(ps), 1)
                got[k] = (instance_slices(layout, node), acc, secs, problems)
            demand = sum(caps.values()) * f if app_name == "all three" else caps[app_name] * f
            print(f"{app_name:<18} {demand:>10.1f} " + " -> ".join(f"{got[k][0]:>2}" for k in nodes)
                  + "   " + " -> ".join(f"{got[k][1]:.3f}" for k in nodes) + "  "
                  + " / ".join(f"{got[k][2]:.2f}" for k in nodes)
                  + "".join(f"  {k}: {got[k][3]}" for k in nodes if got[k][3]))
    return bad + _share_pass_time(nodes["without"], nodes["pass"], profiles, caps, limit)


def _share_pass_time(plain, shared, profiles, caps: dict[str, float], limit: float) -> int:
    """The share pass's own time (``node_plan.with_shares``) over the homogeneous node plan of
    all apps at each of ``PASS_LOADS`` (of their capacities alone over their number), the slices
    before and after; every merged plan verified. Returns the failures."""
    from jigsaw.planner.node_plan import plan_node, with_shares
    from jigsaw.planner.verify import verify_plan

    bad = 0
    print(f"\n== the share pass's own time on the node plan (all three apps at a load of their capacities "
          f"alone over 3); load {os.getloadavg()[0]:.1f}")
    for load in PASS_LOADS:
        demands = {a: c * load / len(caps) for a, c in caps.items()}
        base = plan_node(list(plain.apps), plain, profiles["without"], demands, time_limit_s=limit)
        times_ms = []
        for _ in range(PASS_REPEATS):
            t0 = time.perf_counter()
            merged = with_shares(base, list(shared.apps), shared, profiles["pass"], None, None)
            times_ms.append((time.perf_counter() - t0) * 1e3)
        problems = [x for a in shared.apps if a.name in merged.plans
                    for x in verify_plan(merged.plans[a.name], a, shared, profiles["pass"])]
        bad += bool(problems)
        print(f"load {load:>4.0%}: homogeneous {instance_slices(base.layout, plain):>2} slices "
              f"({base.status}, {base.solve_seconds:.2f} s) -> {instance_slices(merged.layout, shared):>2} "
              f"with the pass: {sorted(times_ms)[len(times_ms) // 2]:.1f} ms median, {max(times_ms):.1f} "
              f"at most of {PASS_REPEATS}" + (f"  {problems}" if problems else ""))
    return bad


if __name__ == "__main__":
    sys.exit(main())

