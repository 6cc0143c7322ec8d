"""``jigsaw``: the offline tools (check, plan, capacity, pack, profile, modeled, import-profiles, doctor)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from jigsaw.app import App, load_app
from jigsaw.backends.registry import MODEL_BACKENDS
from jigsaw.errors import ConfigError, JigsawError
from jigsaw.fields import parse_demands, read_toml
from jigsaw.node import Node, load_node, load_node_profiles
from jigsaw.plan import Layout, Plan, load_plan
from jigsaw.spaces import SPACES


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except JigsawError as exc:
        print(f"jigsaw: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("jigsaw: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (e.g. `| head`): not an error worth a traceback
        return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jigsaw", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    _add_check(sub)
    _add_plan(sub)
    _add_capacity(sub)
    from jigsaw.fleet.commands import add_k8s_parser
    add_k8s_parser(sub)
    _add_pack(sub)
    _add_profile(sub)
    _add_modeled(sub)
    _add_import_profiles(sub)
    _add_doctor(sub)
    return p


def _add_check(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("check", help="validate a node, app or plan file")
    c.add_argument("files", nargs="+", metavar="FILE")
    c.add_argument("--node", help="node config to check a plan against, and whose backend loads an app's "
                                  "models (default for an app file: onnxruntime)")
    c.set_defaults(func=cmd_check)


def _add_plan(sub: argparse._SubParsersAction) -> None:
    pl = sub.add_parser("plan", help="plan one app, all apps of the node together, or a fleet (--fleet)")
    pl.add_argument("--app", help="app TOML file, or the name of an app of the node (one-app plan)")
    pl.add_argument("--node", help="node TOML file")
    pl.add_argument("--demand", metavar="RPS | APP=RPS,APP=RPS",
                    help="root requests/s of --app; or app=rps pairs: one plan for those apps "
                         "of the node over its shared slices")
    pl.add_argument("--objective", choices=("accuracy", "slices"),
                    help="node-wide plan: weighted accuracy minus slices, or fewest slices "
                         "(default: the node's planner.objective)")
    pl.add_argument("--formulation", choices=("tight", "reference", "decomposed", "joint"),
                    help="one-app plan: tight or reference (default: the node's planner.formulation, "
                         "tight); node-wide plan: decomposed (default) or joint (one model over all "
                         "apps, kept to check against)")
    pl.add_argument("--fleet", metavar="F.toml", help="plan a fleet of nodes (--json, --out DIR, --down)")
    pl.add_argument("--down", metavar="NODE,...", help="with --fleet: plan without these nodes")
    pl.add_argument("--space", choices=SPACES, help="search space (default: the node's)")
    pl.add_argument("--time-limit", type=float, metavar="S")
    pl.add_argument("--solver", choices=("cbc", "highs"))
    pl.add_argument("--previous", metavar="PLAN.json", help="warm start and keep unchanged GPUs")
    pl.add_argument("--gpus", type=int, help="override the node's GPU count")
    pl.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    pl.add_argument("--out", metavar="PLAN.json", help="also write the plan's JSON here")
    pl.set_defaults(func=cmd_plan)


def _add_capacity(sub: argparse._SubParsersAction) -> None:
    ca = sub.add_parser("capacity", help="maximum serviceable demand")
    ca.add_argument("--app", required=True)
    ca.add_argument("--node", required=True)
    ca.add_argument("--gpus", type=int, help="override the node's GPU count")
    ca.add_argument("--space", default=None, help=f"one of {', '.join(SPACES)}, or 'all'")
    ca.add_argument("--time-limit", type=float, metavar="S")
    ca.add_argument("--solver", choices=("cbc", "highs"))
    ca.add_argument("--formulation", choices=("tight", "reference"))
    ca.add_argument("--json", action="store_true")
    ca.set_defaults(func=cmd_capacity)


def _add_pack(sub: argparse._SubParsersAction) -> None:
    pk = sub.add_parser("pack", help="lay a plan's MIG instances onto GPUs")
    pk.add_argument("--plan", required=True, metavar="PLAN.json")
    pk.add_argument("--previous", metavar="OLD.json", help="keep GPUs whose layout is unchanged")
    pk.add_argument("--node", help="node TOML (default: the plan's GPU model and its GPU count)")
    pk.add_argument("--format", choices=("mig-parted", "commands", "json"), default="mig-parted")
    pk.set_defaults(func=cmd_pack)


def _add_profile(sub: argparse._SubParsersAction) -> None:
    pr = sub.add_parser("profile", help="measure profiles of real models with the node's backend")
    pr.add_argument("--node", required=True, help="node TOML file (its backend and segments)")
    pr.add_argument("--app", help="app TOML file (default: the node's apps)")
    pr.add_argument("--variants", help="comma-separated variants (default: all of the app)")
    pr.add_argument("--batches", help="comma-separated batch sizes (default: the node's)")
    pr.add_argument("--out", metavar="DIR", help="profile directory (default: the node's)")
    pr.add_argument("--seconds", type=float, default=2.0, help="time budget per row (s)")
    pr.add_argument("--max-iters", type=int, default=50, help="most batches timed per row")
    gp = pr.add_argument_group("GPU nodes (each segment measured inside a MIG instance, or on a whole GPU "
                               "with MIG off for a node with mig = false; needs root)")
    gp.add_argument("--gpu", type=int, default=0,
                    help="index of a GPU with MIG on and no instances (whole GPUs: MIG off) (0)")
    gp.add_argument("--segments", help="comma-separated MIG profiles (default: the node's)")
    gp.add_argument("--mps-levels", help="comma-separated MPS levels (default: the node's)")
    gp.add_argument("--backend", choices=MODEL_BACKENDS,
                    help="measure with this backend instead of the node's")
    gp.add_argument("--inside", metavar="SEGMENT", help=argparse.SUPPRESS)  # a measuring copy
    gp.add_argument("--mps", type=int, default=1, help=argparse.SUPPRESS)
    gp.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    gp.add_argument("--barrier", help=argparse.SUPPRESS)
    gp.add_argument("--cpus", help=argparse.SUPPRESS)  # a CPU share's copy: pinned to these CPUs
    gp.add_argument("--copies", type=int, help=argparse.SUPPRESS)  # copies at the barrier (default --mps)
    pr.set_defaults(func=cmd_profile)


def _add_modeled(sub: argparse._SubParsersAction) -> None:
    from jigsaw import modeled
    mo = sub.add_parser("modeled", help="modeled profiles for GPUs you cannot measure yet (source=modeled)",
                        description=modeled.__doc__.split("\n\n")[0] if modeled.__doc__ else None)
    modeled.add_arguments(mo)
    mo.set_defaults(func=modeled.run)


def _add_import_profiles(sub: argparse._SubParsersAction) -> None:
    im = sub.add_parser("import-profiles", help="profile rows from measured figures in a simple CSV")
    im.add_argument("csv", help="model,hardware,batch,p50|p95|mean,unit[,throughput,memory_mb,mps]")
    im.add_argument("--out", metavar="DIR", help="profile directory (default: the node's)")
    im.add_argument("--node", help="node TOML file: check models and hardware against it")
    im.add_argument("--p95-over-p50", type=float, help="derive a missing p95 as p50 x this ratio")
    im.add_argument("--p95-over-mean", type=float, help="derive a missing p95 as mean x this ratio")
    im.add_argument("--memory-mb", type=float, help="memory of one process where the file gives none")
    im.add_argument("--host", default="", help="where the figures were measured (host column)")
    im.add_argument("--date", default="", help="when (default: the file's modification date)")
    im.set_defaults(func=cmd_import_profiles)


def _add_doctor(sub: argparse._SubParsersAction) -> None:
    dr = sub.add_parser("doctor", help="what a GPU node lacks: driver, NVML, MIG mode, MPS, permissions")
    dr.add_argument("--node-config", "--node", dest="node", required=True, help="node TOML file")
    dr.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    """One line per check; exit 1 when something is missing (read-only: never changes a GPU)."""
    from jigsaw.gpu.doctor import diagnose, failed, format_checks

    checks = diagnose(load_node(args.node, load_apps=False))
    print(format_checks(checks))
    return 1 if failed(checks) else 0


def cmd_import_profiles(args: argparse.Namespace) -> int:
    """Runs ``jigsaw.profile_import.import_csv``; prints each assumption and each file written."""
    from jigsaw.profile_import import import_csv
    segments = variants = None
    out = args.out
    if args.node:
        node = load_node(args.node)
        _one_group(node, "import-profiles")
        segments = list(node.mig_profiles)
        variants = [v.name for a in node.apps for t in a.tasks for v in t.variants]
        out = out or node.profiles_dir
    if out is None:
        raise JigsawError("--out: give the profile directory (or --node, to use its profiles_dir)")
    for ratio in ("p95_over_p50", "p95_over_mean"):
        value = getattr(args, ratio)
        if value is not None and not (value >= 1 and math.isfinite(value)):
            raise JigsawError(f"--{ratio.replace('_', '-')}: a p95 is at least the p50 or mean: expected "
                              f">= 1, got {value}")
    paths = import_csv(args.csv, out, segments=segments, variants=variants, p95_over_p50=args.p95_over_p50,
                       p95_over_mean=args.p95_over_mean, memory_mb=args.memory_mb, host=args.host,
                       date=args.date,
                       say=lambda line: print(f"jigsaw import-profiles: {line}", file=sys.stderr))
    for path in paths:
        print(path)
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    """Runs ``jigsaw.profiler.profile`` (needs the models extra)."""
    try:
        from jigsaw.profiler import profile
    except ImportError as exc:
        raise JigsawError("jigsaw profile needs the models extra "
                          f"(pip install 'jigsaw[models]'): {exc}") from None
    try:
        batches = [int(b) for b in args.batches.split(",")] if args.batches else []
    except ValueError:
        raise JigsawError(f"--batches: expected comma-separated integers, got {args.batches!r}") from None
    variants = [v.strip() for v in args.variants.split(",") if v.strip()] if args.variants else []
    if args.node and not args.inside:
        _one_group(load_node(args.node, load_apps=False), "profile")
    if args.inside:
        from jigsaw.profiler import profile_inside
        if args.out is None:
            raise JigsawError("--inside needs --out")
        paths = profile_inside(args.node, args.app, segment=args.inside, mps=args.mps, rank=args.rank,
                               barrier=args.barrier, backend=args.backend, variants=variants,
                               batches=batches, out=args.out, seconds=args.seconds, max_iters=args.max_iters,
                               cpus=[int(c) for c in args.cpus.split(",")] if args.cpus else [],
                               copies=args.copies)
    else:
        try:
            levels = [int(k) for k in args.mps_levels.split(",")] if args.mps_levels else []
        except ValueError:
            raise JigsawError("--mps-levels: expected comma-separated integers, "
                              f"got {args.mps_levels!r}") from None
        segments = [s.strip() for s in args.segments.split(",") if s.strip()] if args.segments else []
        paths = profile(args.node, args.app, variants=variants, batches=batches, out=args.out,
                        seconds=args.seconds, max_iters=args.max_iters, gpu=args.gpu, segments=segments,
                        mps_levels=levels, backend=args.backend)
    for path in paths:
        print(path)
    return 0


# ---- helpers -------------------------------------------------------------------------------

def _one_group(node: Node, command: str) -> None:
    """``jigsaw profile`` and ``import-profiles`` write one GPU's rows: a node of several GPU
    groups is refused, naming each group's directory."""
    if node.is_mixed:
        dirs = "; ".join(f"{g.name}: {g.profiles_dir}" for g in node.groups)
        raise ConfigError(node.source, "gpus", f"{len(node.groups)} GPU groups: jigsaw {command} writes "
                          f"one GPU's rows; run it per group (a node file of that group, or --out its "
                          f"profiles_dir: {dirs})")


def _node_and_app(args: argparse.Namespace) -> tuple[Node, App]:
    node = load_node(args.node)
    if getattr(args, "gpus", None) is not None:
        if args.gpus < 1:
            raise ConfigError("--gpus", "--gpus", f"expected a GPU count >= 1, got {args.gpus}")
        node = node.with_gpus(args.gpus)
    app_path = Path(args.app)
    if app_path.suffix == ".toml" or app_path.exists():
        app = load_app(app_path)
    else:
        try:
            app = node.app(args.app)
        except KeyError:
            names = ", ".join(a.name for a in node.apps) or "none"
            raise ConfigError(args.node, "apps", f"no app named {args.app!r} (apps: {names})") from None
    return node, app


def _table(rows: list[list[Any]], header: list[str]) -> str:
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _slices(n: float) -> str:
    """Slices as a user reads them: a MIG-instance share costs a k-th of a slice (1.33, not 1.333...)."""
    return f"{round(n, 2):g}"


def format_plan(plan: Plan) -> str:
    head = (f"app {plan.app}  space {plan.space}  demand {plan.demand_rps:g} rps  "
            f"status {plan.status}{'  MAX-DEMAND PLAN' if plan.max_demand_plan else ''}\n"
            f"serves {plan.planned_rps:.4g} rps  accuracy {plan.accuracy:.4f} of best "
            f"(SLO {plan.accuracy_slo:g})  slices {_slices(plan.slices_used)}/{plan.slices_available}  "
            f"objective {plan.objective:.5f}  gap {plan.gap:.2g}  "
            f"solved in {plan.solve_seconds:.2f} s ({plan.solver}, "
            f"{plan.columns_pruned}/{plan.columns_total} columns after pruning)")
    parts = [head]
    for note in plan.notes:
        parts.append(f"note: {note}")
    if plan.instances:
        rows = [[i.task, i.variant, i.mig_profile, i.mps, i.max_batch, i.count,
                 f"{i.latency_ms:.1f}", f"{i.throughput_rps:.1f}", _slices(i.count * i.slices)]
                for i in plan.instances]
        parts.append(_table(rows, ["task", "variant", "mig", "mps", "max_batch", "count",
                                   "latency_ms", "rps/inst", "slices"]))
        lat = "  ".join(f"{t} {ms:.1f} ms" for t, ms in plan.task_latency_ms.items())
        parts.append(f"worst per-task latency: {lat}  (SLO {plan.latency_slo_ms:g} ms, 2x per task)")
        lrows = [[" ".join(f"{t}={v}" for t, v in lane.variants.items()), f"{lane.rate_rps:.3f}"]
                 for lane in sorted(plan.lanes, key=lambda x: -x.rate_rps)]
        parts.append(_table(lrows, ["lane", "rate_rps"]))
    if plan.layout is not None:
        lines = []
        for g in plan.layout.gpus:
            desc = ", ".join(f"{p.profile}@{p.start}:{p.variant}" for p in
                             sorted(g.instances, key=lambda p: p.start)) or "(empty)"
            lines.append(f"  GPU {g.gpu}: {desc}")
        parts.append("layout:\n" + "\n".join(lines))
    return "\n\n".join(parts)


# ---- commands ------------------------------------------------------------------------------

def cmd_check(args: argparse.Namespace) -> int:
    for name in args.files:
        path = Path(name)
        if path.suffix == ".json":
            plan = load_plan(path)
            msg = f"ok: plan for {plan.app} ({len(plan.instances)} instance kinds)"
            if args.node:
                from jigsaw.planner.verify import verify_plan

                node = load_node(args.node)
                app = node.app(plan.app)
                problems = verify_plan(plan, app, node, load_node_profiles(node, [app]))
                if problems:
                    for pr in problems:
                        print(f"{path}: {pr}", file=sys.stderr)
                    return 1
                msg += f", verified against {args.node}"
            print(f"{path}: {msg}")
            continue
        data = read_toml(path)
        from jigsaw.models.check import app_problems
        if "gpus" in data:
            node = load_node(path)
            table = load_node_profiles(node)
            problems = app_problems(node.apps, node.backend)  # what jigsawd checks before its workers start
            for name, why in problems.items():
                print(f"{path}: app {name} will not be served: {why}", file=sys.stderr)
            if problems:
                return 1
            print(f"{path}: ok: node {node.name} ({node.gpus_text}, "
                  f"{len(node.apps)} apps, {len(table)} profile rows: {', '.join(sorted(table.sources))})")
        elif "tasks" in data:
            app = load_app(path)
            backend = load_node(args.node).backend if args.node else "onnxruntime"
            problems = app_problems([app], backend)  # the node's load check: models open, transforms import
            if problems:
                print(f"{path}: {problems[app.name]}", file=sys.stderr)
                return 1
            print(f"{path}: ok: app {app.name} ({len(app.tasks)} tasks, depth {app.depth}, "
                  f"{len(app.lanes())} lanes, SLO {app.latency_slo_ms:g} ms; models and transforms load "
                  f"under {backend})")
        else:
            raise ConfigError(str(path), "(top)", "neither a node ([gpus] table) nor an app "
                                                  "([[tasks]]) file")
    return 0


def _parse_rps(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError("--demand", "--demand", f"expected a number of requests/s (or app=rps "
                                                  f"pairs without --app), got {text!r}") from None


def cmd_plan(args: argparse.Namespace) -> int:
    from jigsaw.errors import PlanError
    from jigsaw.planner.milp import plan

    if args.fleet:
        from jigsaw.fleet.commands import cmd_plan_fleet
        return cmd_plan_fleet(args)
    missing = [f"--{k}" for k in ("node", "demand") if getattr(args, k) is None]
    if missing:
        raise ConfigError("(arguments)", ", ".join(missing), "required (or plan a fleet with --fleet)")
    if "=" in args.demand:
        return _cmd_plan_node(args)
    if not args.app:
        raise ConfigError("--app", "--app", "a one-app plan needs --app (or give --demand as app=rps pairs)")
    if args.formulation in ("decomposed", "joint"):
        raise ConfigError("--formulation", "--formulation",
                          "a one-app plan is tight or reference (decomposed and joint plan a node's apps)")
    node, app = _node_and_app(args)
    profiles = load_node_profiles(node, [app])
    previous = load_plan(args.previous) if args.previous else None
    try:
        result = plan(app, node, profiles, _parse_rps(args.demand), space=args.space, previous=previous,
                      time_limit_s=args.time_limit, solver=args.solver, formulation=args.formulation)
    except PlanError as exc:
        raise ConfigError("--demand", "--demand", str(exc)) from None
    if args.out:
        Path(args.out).write_text(result.to_json() + "\n")
    print(result.to_json() if args.json else format_plan(result))
    return 0


def _cmd_plan_node(args: argparse.Namespace) -> int:
    from jigsaw.errors import PlanError
    from jigsaw.planner.node_plan import QUICK_STATUS, plan_node_anytime, prefer_quick

    if args.app:
        raise ConfigError("--app", "--app",
                          "give either --app with one demand, or app=rps pairs without --app")
    node = load_node(args.node)
    if args.gpus is not None:
        if args.gpus < 1:
            raise ConfigError("--gpus", "--gpus", f"expected a GPU count >= 1, got {args.gpus}")
        node = node.with_gpus(args.gpus)
    demands = parse_demands(args.demand)
    apps = []
    for name in demands:
        try:
            apps.append(node.app(name))
        except KeyError:
            names = ", ".join(a.name for a in node.apps) or "none"
            raise ConfigError(args.node, "apps", f"no app named {name!r} (apps: {names})") from None
    if args.formulation in ("reference", "tight"):
        raise ConfigError("--formulation", "--formulation",
                          "a node-wide plan is decomposed (default) or joint")
    node_form = args.formulation
    profiles = load_node_profiles(node, apps)
    if args.previous:
        raise ConfigError("--previous", "--previous", "a node-wide plan does not take --previous yet "
                                                      "(the library's plan_node(previous=) does)")
    try:  # what jigsawd does at start-up: the quick plan, the exact one started from it, the better
        quick = None
        for result in plan_node_anytime(apps, node, profiles, demands, objective=args.objective,
                                        space=args.space, time_limit_s=args.time_limit, solver=args.solver,
                                        formulation=node_form):
            quick = result if result.status == QUICK_STATUS else quick
        if quick is not None and prefer_quick(quick, result, node, args.objective):
            quick.notes.append(f"the exact solve stopped {result.status} short of this verified plan")
            result = quick
    except PlanError as exc:
        raise ConfigError("--demand", "--demand", str(exc)) from None
    if args.out:
        Path(args.out).write_text(result.to_json() + "\n")
    if args.json:
        print(result.to_json())
        return 0
    print(f"node {result.node}: {len(result.plans)} apps in one plan  objective {result.objective_kind}  "
          f"status {result.status}  slices {_slices(result.slices_used)}/{result.slices_available}  "
          f"gap {result.gap:.2g}  solved in {result.solve_seconds:.2f} s"
          + ("" if result.feasible else f"  DEMANDS SCALED TO {result.demand_scale:.4%}"))
    for note in result.notes:
        print(f"note: {note}")
    for p in result.plans.values():
        print()
        print(format_plan(p))
    return 0


def cmd_capacity(args: argparse.Namespace) -> int:
    from jigsaw.planner.milp import capacity

    node, app = _node_and_app(args)
    profiles = load_node_profiles(node, [app])
    spaces = SPACES if args.space == "all" else (args.space or node.planner.space,)
    for s in spaces:
        if s not in SPACES:
            raise ConfigError("--space", "--space", f"expected one of {', '.join(SPACES)} or all")
    results = [capacity(app, node, profiles, space=s, time_limit_s=args.time_limit,
                        solver=args.solver, formulation=args.formulation) for s in spaces]
    base = next((r.max_demand_rps for r in results if r.space == "unopt"), None)
    if args.json:
        out = [{"app": r.app, "space": r.space, "max_demand_rps": r.max_demand_rps,
                "vs_unopt": (r.max_demand_rps / base) if base else None,
                "slices_used": r.plan.slices_used, "slices_available": r.plan.slices_available,
                "accuracy": r.plan.accuracy, "status": r.status,
                "upper_bound_rps": r.upper_bound_rps if r.status != "optimal" else r.max_demand_rps,
                "solve_seconds": r.solve_seconds}
               for r in results]
        print(json.dumps(out[0] if len(out) == 1 else out, indent=2))
        return 0
    rows = [[r.space, f"{r.max_demand_rps:.2f}", f"{r.max_demand_rps / base:.2f}x" if base else "-",
             f"{_slices(r.plan.slices_used)}/{r.plan.slices_available}", f"{r.plan.accuracy:.3f}",
             r.status if r.status == "optimal" else f"lower bound (<= {r.upper_bound_rps:.2f})",
             f"{r.solve_seconds:.1f}"] for r in results]
    print(f"capacity of {app.name} on {node.gpus_text}")
    print(_table(rows, ["space", "max_rps", "vs_unopt", "slices", "accuracy", "status", "seconds"]))
    return 0


def cmd_pack(args: argparse.Namespace) -> int:
    from jigsaw.mig import (
        WHOLE_GPU,
        gpu_model,
        gpu_share_level,
        share_host,
        share_level,
        whole_gpu_model,
        with_mig_shares,
    )
    from jigsaw.planner.packer import (
        instances_from_plan,
        pack,
        to_mig_parted_yaml,
        to_nvidia_smi_commands,
    )

    plan = load_plan(args.plan)
    previous = load_plan(args.previous).layout if args.previous else None
    if args.node and load_node(args.node, load_apps=False).is_mixed:
        return _pack_mixed(args, plan, previous)
    if args.node:
        node = load_node(args.node, load_apps=False)
        gpu, num_gpus = node.gpu, node.num_gpus
    else:
        whole = bool(plan.instances) and all(i.mig_profile == WHOLE_GPU or gpu_share_level(i.mig_profile)
                                             for i in plan.instances)
        # the GPU's MPS shares: a share's name says k, a whole GPU that k shares costs k slices
        shares = max((gpu_share_level(i.mig_profile) or (i.slices if i.slices > 1 else 0)
                      for i in plan.instances), default=0)
        try:
            gpu = gpu_model(plan.gpu_model)
        except KeyError:
            if not whole:
                hint = ": a plan of a node of several GPU groups; give --node" \
                    if "+" in plan.gpu_model else ""
                raise ConfigError(args.plan, "gpu_model",
                                  f"unknown GPU model {plan.gpu_model!r}{hint}") from None
            gpu = whole_gpu_model(plan.gpu_model, 0.0, 0)  # only the layout is asked for
        if whole:
            gpu = whole_gpu_model(gpu.name, gpu.memory_gb, gpu.sm_count, shares=shares)
        for i in plan.instances:  # shares of MIG instances the plan runs (jigsaw.shares)
            if share_host(i.mig_profile) in gpu.profile_names:
                gpu = with_mig_shares(gpu, [share_level(i.mig_profile)], [share_host(i.mig_profile)])
        num_gpus = max(plan.slices_available // gpu.compute_slices, 1)
    layout = pack(instances_from_plan(plan), gpu, num_gpus, previous)
    if not gpu.mig and args.format != "json":
        print("# whole GPUs (mig = false): nothing to partition; keep MIG off "
              "(nvidia-smi -i N -mig 0)")
    elif args.format == "mig-parted":
        print(to_mig_parted_yaml(layout), end="")
    elif args.format == "commands":
        print("\n".join(to_nvidia_smi_commands(layout, previous)))
    else:
        plan.layout = layout
        print(json.dumps(plan.to_json_dict()["layout"], indent=2))
    return 0


def _pack_mixed(args: argparse.Namespace, plan: Plan, previous: Layout | None) -> int:
    """``jigsaw pack`` on a node of several GPU groups: one layout; the MIG groups' partitions
    (their GPUs, plain profile names), the GPUs used whole left as they are."""
    from jigsaw.planner.groups import mig_part, pack_node
    from jigsaw.planner.packer import instances_from_plan, to_mig_parted_yaml, to_nvidia_smi_commands

    node = load_node(args.node, load_apps=False)
    layout = pack_node(instances_from_plan(plan), node, previous)
    if args.format == "json":
        plan.layout = layout
        print(json.dumps(plan.to_json_dict()["layout"], indent=2))
        return 0

    whole = sorted(node.host_index(i) for g in node.groups if not g.model.mig for i in g.gpus)
    if whole:
        print(f"# GPUs {', '.join(map(str, whole))} are used whole: nothing to partition; keep MIG off "
              "(nvidia-smi -i N -mig 0); GPU numbers are the host's")
    part = mig_part(layout, node)
    if args.format == "mig-parted":
        print(to_mig_parted_yaml(part), end="")
    else:
        print("\n".join(to_nvidia_smi_commands(part, None if previous is None else mig_part(previous, node))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
