"""What every formulation of the planner's MILP starts from: one app's columns, lanes and layouts.

Computed once per (app, node, profiles, space, factors) and shared by the reference model
(``milp``), the tight model (``joint``) and the greedy incumbent (``anytime``).
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from dataclasses import dataclass, field

from jigsaw.app import App, Lane
from jigsaw.node import Node
from jigsaw.planner.columns import ColumnSet, allowed_variants, build_columns
from jigsaw.planner.groups import group_layouts
from jigsaw.profiles import ProfileTable
from jigsaw.spaces import SearchSpace

Factors = dict[tuple[str, str, str], float]


@dataclass
class Problem:
    app: App
    node: Node
    space: SearchSpace
    colset: ColumnSet
    lanes: list[Lane]
    lane_acc: list[float]  # relative to A_max
    lane_mult: list[dict[str, float]]  # per lane: requests per root request at each task
    layouts: list[dict[str, int]]  # maximal per-GPU profile counts over the columns' profiles
    factors: Factors | None = None
    profiles: ProfileTable | None = None  # what the columns came from (the verifier needs it)
    # what the planner derives from the fields above alone (never from a demand), kept: a warm
    # solver process's quick plan then skips rebuilding it (``anytime``); never changed once set,
    # but for the app's curve (``curves.Curve``: facts about its budgets, which only grows)
    derived: dict = field(default_factory=dict, init=False, compare=False, repr=False)


# make_problem's memo: per profile table (weakly: a table dropped takes its problems along), the
# problems of its last few (app, node, space, factors), each with the table's version it saw
_MEMO: weakref.WeakKeyDictionary[ProfileTable, dict[tuple, tuple[int, Problem]]] = \
    weakref.WeakKeyDictionary()
_MEMO_PER_TABLE = 64


def make_problem(app: App, node: Node, profiles: ProfileTable, space: SearchSpace,
                 factors: Factors | None) -> Problem:
    """The problem of ``app`` on ``node`` (pure in its inputs, so remembered).

    Why remembered: building the columns takes 10-90 ms per app, and a node's every plan (the
    quick plan, the exact one, each re-plan of the controller) starts from the same problems;
    the quick node plan's 100 ms would go on it alone. The problems are shared, never changed
    by their users; a profile table that gains or replaces rows (``ProfileTable.add``) has a
    new version, and its problems are built again.
    """
    try:
        key = (app, node, space, tuple(sorted(factors.items())) if factors else None)
        hash(key)
    except TypeError:  # an unhashable input (never in the config types): built each time
        return _make_problem(app, node, profiles, space, factors)
    memo = _MEMO.setdefault(profiles, {})
    hit = memo.get(key)
    version = getattr(profiles, "version", 0)
    if hit is not None and hit[0] == version:
        return hit[1]
    pb = _make_problem(app, node, profiles, space, factors)
    if len(memo) >= _MEMO_PER_TABLE:
        memo.clear()
    memo[key] = (version, pb)
    return pb


def forget() -> None:
    """Drop every remembered problem (benches that time the columns' building call it)."""
    _MEMO.clear()


def _make_problem(app: App, node: Node, profiles: ProfileTable, space: SearchSpace,
                  factors: Factors | None) -> Problem:
    colset = build_columns(app, node, profiles, space, factors)
    lanes = app.lanes(allowed_variants(app, space))
    a_max = app.max_accuracy(factors)
    lane_acc = [app.lane_accuracy(c, factors) / a_max for c in lanes]
    lane_mult = [app.multipliers(c, factors) for c in lanes]
    used_profiles = sorted({c.mig_profile for c in colset.columns})
    layouts = node_layouts(node, device_names(node, used_profiles))
    return Problem(app, node, space, colset, lanes, lane_acc, lane_mult, layouts, factors, profiles)


def node_layouts(node: Node, profile_names: list[str]) -> list[dict[str, int]]:
    """The maximal per-GPU count vectors over ``profile_names`` (sorted), as dicts (each GPU
    group's in turn on a node of several: ``groups.group_layouts``)."""
    return group_layouts(node, profile_names)


def device_names(node: Node, profile_names: list[str]) -> list[str]:
    """The device profiles (sorted) that per-GPU vectors over ``profile_names`` are counted in: a
    MIG share's host instead of the share (``jigsaw.shares``)."""
    return sorted({node.gpu.device_profile(n).name for n in profile_names})


def share_hosts(node: Node, profile_names: list[str]) -> dict[str, tuple[str, int]]:
    """Each MIG share among ``profile_names``: its host profile and k.

    Why the MILPs take shares this way: an integer count J of the host's instances that hold
    shares of level k (k J >= the shares) beside the per-GPU vectors over devices is exact (the
    packer bundles a profile's shares k to an instance node-wide) and keeps those vectors few;
    vectors that hand each instance to k shares took 204 against 44 on an H100 with 1g shares of
    2 and 4, and the capacity solves ten times as long."""
    return {n: (p.host, p.share_of) for n in profile_names if (p := node.gpu.profile(n)).host}


def demand_terms(pb: Problem) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """Per (task, variant): the (lane index, multiplier) pairs whose rates make its demand."""
    app = pb.app
    index = {t: i for i, t in enumerate(app.task_names)}
    terms: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    for li, lane in enumerate(pb.lanes):
        for t in app.task_names:
            mult = pb.lane_mult[li][t]
            if mult > 0:
                terms[(t, lane[index[t]])].append((li, mult))
    return terms
