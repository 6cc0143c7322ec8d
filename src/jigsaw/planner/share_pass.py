"""Shares of MIG instances as a second pass over the homogeneous plan.

Why a pass and not one model: the MILPs with shares (``jigsaw.shares``: J host instances per
share profile, slices in k-ths) count the same plans many ways, so on the 4-H100 example node
their capacity solves hit a 60 s limit unproven where the homogeneous model (the paper's
segments) proves in seconds; yet shares only pay where an instance would run far from full (a
small demand), which a near-capacity plan never has. So a plan on a node whose MIG instances may
be shared is planned without them first (``homogeneous``: the proven plan, as fast as without
shares), and only where that plan leaves a slice's worth of its instances idle (``underused``) is
the model with shares solved, started from that plan, for at most as long as that plan took
(``pass_limit``: a plan at most about twice as slow); its plan is kept only if strictly better
and sound (``better``). A node's capacity is its homogeneous capacity: proven, never worse than
without shares.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jigsaw.app import App
from jigsaw.node import Node
from jigsaw.plan import NodePlan, Plan
from jigsaw.planner.verify import demand_and_supply, verify_plan
from jigsaw.profiles import ProfileTable

IDLE_SLICES = 1.0
"""The idle compute, in slices, a homogeneous plan must leave for the share pass to run: shares
save whole slices only."""


PASS_FRACTION = 0.25
"""The share pass's time limit against the plan's: it only improves a plan already found."""
PASS_MIN_S = 2.0
"""... and the least it gets, however fast the homogeneous plan came."""


def pass_limit(node: Node, time_limit_s: float | None, base_s: float) -> float:
    """The share pass's time limit: as long as the homogeneous plan took (a plan at most twice
    as slow), at least ``PASS_MIN_S``, at most ``PASS_FRACTION`` of the plan's limit (default:
    the node's)."""
    limit = time_limit_s if time_limit_s is not None else node.planner.time_limit_s
    return min(PASS_FRACTION * limit, max(PASS_MIN_S, base_s))


def _shares(node: Node) -> set[str]:
    """The MIG-instance share profiles the planner may use on ``node``."""
    return {p for g in node.gpu_groups for p in g.mig_profiles if g.gpu.profile(p).host}


def has_mig_shares(node: Node) -> bool:
    """Whether ``node``'s planner may share MIG instances (``[gpus] mig_shares``)."""
    return bool(_shares(node))


def homogeneous(node: Node) -> Node:
    """``node`` without its MIG-instance shares (itself when it has none): segments of one
    (task, variant) each, the paper's plans."""
    shares = _shares(node)
    if not shares:
        return node
    groups = tuple(dataclasses.replace(g, mig_profiles=tuple(p for p in g.mig_profiles if p not in shares))
                   for g in node.groups)
    return dataclasses.replace(node, mig_profiles=tuple(p for p in node.mig_profiles if p not in shares),
                               groups=groups)


def idle_slices(plan: Plan, app: App) -> float:
    """The compute ``plan`` leaves idle, in slices: per (task, variant), the idle fraction of one
    of its instances (at most all of it) times that instance's slices. A task's idle part could
    move to a share (of its own instance's profile or a smaller one, e.g. 1g.20gb's load to a
    1g.10gb share)."""
    demand, supply = demand_and_supply(plan, app, None)
    idle = 0.0
    for key in supply:
        one = min((i for i in plan.instances if (i.task, i.variant) == key), key=lambda i: i.throughput_rps)
        if one.throughput_rps > 0:
            idle += min(1.0, max(0.0, supply[key] - demand[key]) / one.throughput_rps) * one.slices
    return idle


def underused(plan: Plan, app: App) -> bool:
    """Whether shares could save slices on ``plan``: it leaves ``IDLE_SLICES`` idle or more, and
    some of the node's slices free (a plan that takes them all has spent the spare ones on
    accuracy: the node is near its capacity, where the model with shares proves slowly)."""
    return (bool(plan.instances) and plan.slices_used < plan.slices_available
            and idle_slices(plan, app) >= IDLE_SLICES)


def better(shared: Plan | None, base: Plan, app: App, node: Node, profiles: ProfileTable) -> bool:
    """Whether the plan with shares replaces the homogeneous one: feasible, a strictly better
    objective (fewer slices or more accuracy), and sound (``verify_plan``)."""
    return (shared is not None and shared.feasible and shared.objective > base.objective + 1e-9
            and not verify_plan(shared, app, node, profiles))


def node_underused(plan: NodePlan, apps: Sequence[App]) -> bool:
    """``underused`` for a node plan: its apps' idle compute together (shares hold processes of
    different apps in one instance), where it serves all demand and leaves slices free; also a
    node plan that found nothing (shares may fit). A plan of a common fraction below 1, or one
    that takes every slice, fills the node: not searched again (the model with shares does not
    prove there within the limit)."""
    if any(a.name not in plan.plans for a in apps):
        return True
    idle = sum(idle_slices(plan.plans[a.name], a) for a in apps)
    return plan.feasible and plan.slices_used < plan.slices_available and idle >= IDLE_SLICES


def node_better(shared: NodePlan, base: NodePlan, apps: Sequence[App], node: Node,
                profiles: ProfileTable) -> bool:
    """``better`` for a node plan: a larger share of the demands served, or the same and a strictly
    better objective; every app's plan sound."""
    if shared.status not in ("optimal", "feasible") or any(a.name not in shared.plans for a in apps):
        return False
    gain = shared.demand_scale > base.demand_scale + 1e-9 or (
        shared.demand_scale >= base.demand_scale - 1e-9 and shared.objective > base.objective + 1e-9)
    return gain and not any(verify_plan(shared.plans[a.name], a, node, profiles) for a in apps)
