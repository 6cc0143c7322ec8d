"""The fleet's CLI commands: ``jigsaw plan --fleet F.toml`` and ``jigsaw k8s render``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from jigsaw.errors import ConfigError
from jigsaw.fields import parse_demands

if TYPE_CHECKING:  # the planner (mip) and the renderer (yaml) load only when a command runs
    from jigsaw.fleet.planner import FleetPlan


def _down(args: argparse.Namespace) -> set[str]:
    return {n.strip() for n in (getattr(args, "down", None) or "").split(",") if n.strip()}


def format_fleet_plan(fp: FleetPlan) -> str:
    lines = [f"fleet {fp.fleet}  allocation {fp.allocation}  headroom {fp.headroom:.3f}  "
             f"{'feasible' if fp.feasible else 'ABOVE CAPACITY'}  slices {fp.slices_used}/"
             f"{fp.slices_available}  planned in {fp.solve_seconds:.1f} s (+{fp.curve_seconds:.1f} s "
             f"node capacity curves)"]
    if fp.down:
        lines.append(f"down: {', '.join(fp.down)}")
    lines += [f"note: {n}" for n in fp.notes]
    lines.append("")
    lines.append(f"{'app':<20} {'demand rps':>11} {'planned rps':>11} {'capacity rps':>12}  shares")
    for app, s in fp.apps.items():
        share = "  ".join(f"{n} {f:.3f}" for n, f in s.shares.items())
        lines.append(f"{app:<20} {s.demand_rps:>11.6g} {s.planned_rps:>11.6g} "
                     f"{s.capacity_rps:>12.6g}  {share}")
    lines.append("")
    lines.append(f"{'node':<14} {'gpu':<10} {'slices':>7}  apps (GPUs, share rps, accuracy)")
    for n in fp.nodes:
        desc = "  ".join(f"{a}({p.gpus} GPUs, {p.share_rps:.6g} rps"
                         + (f", acc {p.plan.accuracy:.3f}" if p.plan is not None else "") + ")"
                         for a, p in n.apps.items()) or "(idle)"
        lines.append(f"{n.name:<14} {n.gpu_model:<10} {n.slices_used:>3}/{n.slices_available:<3}  {desc}")
    return "\n".join(lines)


def _fleet_demands(text: str, apps: list[str]) -> dict[str, float]:
    """``--demand`` for a fleet: one number for a one-app fleet, or app=rps pairs of its apps."""
    text = str(text).strip()
    if "=" not in text:
        if len(apps) != 1:
            raise ConfigError("--demand", "--demand",
                              "with --fleet, one number only for a fleet of one app "
                              "(give app=rps pairs, or set demand_rps in the fleet file)")
        text = f"{apps[0]}={text}"
    out = parse_demands(text)
    unknown = sorted(set(out) - set(apps))
    if unknown:
        raise ConfigError("--demand", "--demand", f"{', '.join(unknown)}: not an app of the fleet "
                                                  f"({', '.join(apps)})")
    return out


def cmd_plan_fleet(args: argparse.Namespace) -> int:
    from jigsaw.fleet.config import load_fleet
    from jigsaw.fleet.planner import plan_fleet
    from jigsaw.fleet.render import node_plan_json

    fleet = load_fleet(args.fleet)
    if args.demand is not None:
        fleet = fleet.with_demand(_fleet_demands(args.demand, [a.name for a in fleet.apps]))
    fp, _ = plan_fleet(fleet, down=_down(args))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "fleet-plan.json").write_text(json.dumps(fp.to_json_dict(), indent=1) + "\n")
        for n in fp.nodes:
            (out / f"{n.name}.json").write_text(node_plan_json(n))
    print(json.dumps(fp.to_json_dict(), indent=1) if args.json else format_fleet_plan(fp))
    return 0


def cmd_k8s_render(args: argparse.Namespace) -> int:
    from jigsaw.fleet.config import load_fleet
    from jigsaw.fleet.planner import plan_fleet
    from jigsaw.fleet.render import write_manifests

    fleet = load_fleet(args.fleet)
    fp, _ = plan_fleet(fleet, down=_down(args))
    written = write_manifests(fleet, fp, args.out)
    print(format_fleet_plan(fp))
    print(f"\nwrote {len(written)} files to {args.out}")
    return 0


def add_k8s_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    k = sub.add_parser("k8s", help="Kubernetes manifests for a fleet")
    ksub = k.add_subparsers(dest="k8s_command", required=True)
    r = ksub.add_parser("render", help="plan the fleet and write its manifests")
    r.add_argument("--fleet", required=True, metavar="F.toml")
    r.add_argument("--out", required=True, metavar="DIR")
    r.add_argument("--down", metavar="NODE,...", help="plan without these nodes")
    r.set_defaults(func=cmd_k8s_render)
