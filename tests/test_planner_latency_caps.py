"""Fewest slices for fixed lane rates over the splits of the SLO (``latency_caps``), and the
quick plan's fallback on the LP's lane mixes that uses it."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from factories import latency_bound_chain

from jigsaw.node import load_node, load_node_profiles
from jigsaw.planner import latency_caps
from jigsaw.planner.anytime import quick_plan
from jigsaw.planner.problem import make_problem
from jigsaw.planner.verify import verify_plan
from jigsaw.spaces import search_space

NODE = Path(__file__).resolve().parents[1] / "examples" / "h100x4.toml"


def _chain():
    app, node, profiles = latency_bound_chain()
    return app, node, make_problem(app, node, profiles, search_space("ast"), None)


def test_cover_is_the_cheapest_multiset() -> None:
    _, node, pb = _chain()
    cols = [c for c in pb.colset.columns if (c.task, c.variant) == ("b", "b2")]
    best = {}
    for c in cols:
        if c.mig_profile not in best or c.throughput_rps > best[c.mig_profile].throughput_rps:
            best[c.mig_profile] = c
    cost = {p.name: p.compute_slices for p in node.gpu.profiles}
    items = list(best.values())
    for demand in (5.0, 40.0, 130.0):
        got = latency_caps.cover(best, demand, 14, cost)
        brute = min((sum(n * cost[c.mig_profile] for n, c in zip(ns, items, strict=True))
                     for ns in itertools.product(range(6), repeat=len(items))
                     if sum(n * c.throughput_rps for n, c in zip(ns, items, strict=True)) >= demand),
                    default=None)
        if brute is None or brute > 14:
            assert got is None or got[0] <= 14
            continue
        assert got is not None and got[0] == brute
        assert sum(c.throughput_rps * n for c, n in got[1]) >= demand * (1 - 1e-9)


@pytest.mark.parametrize("rate", [20.0, 80.0, 200.0])
def test_cap_plans_cover_the_lanes_within_the_slo(rate: float) -> None:
    app, node, pb = _chain()
    lanes = {li: rate / len(pb.lanes) for li in range(len(pb.lanes))}
    plans = latency_caps.cap_plans(pb, lanes)
    assert plans
    assert [p.slices for p in plans] == sorted(p.slices for p in plans)
    demand = latency_caps.lane_demand(pb, lanes)
    for cp in plans:
        for p in app.paths:
            assert sum(2 * cp.caps_ms[t] for t in p) <= app.latency_slo_ms * (1 + 1e-9)
        supply: dict[tuple[str, str], float] = {}
        for c, n in cp.chosen:
            assert c.latency_ms <= cp.caps_ms[c.task] + 1e-9
            supply[(c.task, c.variant)] = supply.get((c.task, c.variant), 0.0) + n * c.throughput_rps
        assert all(supply.get(k, 0.0) >= d * (1 - 1e-6) for k, d in demand.items() if d > 0)
        assert cp.slices == sum(c.slices * n for c, n in cp.chosen) <= node.slices_available


def test_quick_plan_finds_a_verified_plan_at_high_load() -> None:
    """At 90% of capacity no single lane fits; the LP's lane mixes with their fewest-slice split
    of the SLO do (ar_assistant: 863.7 rps, social_media: 8502 rps alone on the example node)."""
    node = load_node(NODE)
    profiles = load_node_profiles(node)
    for name, capacity_rps in (("ar_assistant", 863.7), ("social_media", 8502.0)):
        app = node.app(name)
        got = quick_plan(app, node, profiles, 0.9 * capacity_rps)
        assert got is not None, name
        assert got.layout is not None
        assert verify_plan(got, app, node, profiles) == []
        assert got.slices_used <= node.slices_available
