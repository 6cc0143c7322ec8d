"""The anytime planner's parts that make it fast: the LP relaxations set to each demand instead of
built again (``joint.at_rate``), candidates rescaled to a fraction of the demand (``rescale``) and
the search for the largest fraction that fits (``largest_fraction``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jigsaw.node import load_node, load_node_profiles
from jigsaw.planner import joint
from jigsaw.planner.anytime import (
    SCALE_STEP,
    candidate_plan,
    largest_fraction,
    quick_candidates,
    rescale,
)
from jigsaw.planner.packer import instances_from_plan, pack
from jigsaw.planner.problem import make_problem
from jigsaw.planner.verify import verify_plan
from jigsaw.spaces import search_space

NODE = Path(__file__).resolve().parents[1] / "examples" / "h100x4.toml"


@pytest.fixture(scope="module")
def example():
    node = load_node(NODE)
    profiles = load_node_profiles(node)
    sp = search_space(node.planner.space)
    return node, profiles, {a.name: make_problem(a, node, profiles, sp, None) for a in node.apps}


@pytest.mark.parametrize("objective", ["slices", "accuracy"])
def test_a_model_set_to_another_demand_is_the_model_built_for_it(example, objective) -> None:
    node, _, pbs = example
    for pb in pbs.values():
        caps = {t: pb.app.latency_slo_ms / 2 / len(pb.app.task_names) for t in pb.app.task_names}
        for cap in (None, [caps]):
            first = joint.build([joint.Part(pb, 100.0)], node, full=False, objective=objective, caps=cap)
            for rate in (0.5, 37.5, 2500.0, 9000.0):
                want = joint.build([joint.Part(pb, rate)], node, full=False, objective=objective,
                                   caps=cap).model
                got = joint.at_rate(first, rate, objective)
                for name in ("col_lo", "col_hi", "cost", "integer", "row_lo", "row_hi", "row_index",
                             "row_value", "maximize"):
                    assert getattr(got, name) == getattr(want, name), (pb.app.name, rate, name)
    with pytest.raises(ValueError, match="one part"):
        joint.at_rate(joint.build([joint.Part(pb, None)], node, full=False), 10.0)


def test_a_rescaled_candidate_serves_its_fraction_within_the_slos(example) -> None:
    node, profiles, pbs = example
    pb = pbs["traffic_analysis"]
    rate = 1500.0
    cands = quick_candidates(pb, rate, budget_s=1.0)
    assert cands
    for cand in cands[:4]:
        lat = {}
        for c, _ in cand[2]:
            lat[c.task] = max(lat.get(c.task, 0.0), c.latency_ms)
        for frac in (0.3, 0.7):
            for cost in ("slices", "slots"):
                got = rescale(pb, cand, rate, frac * rate, cost)
                assert got is not None
                _, lanes, chosen = got
                assert sum(lanes.values()) == pytest.approx(frac * rate)
                # no task slower than in the candidate, and fewer slices for less demand
                assert all(c.latency_ms <= lat[c.task] + 1e-9 for c, _ in chosen)
                assert sum(c.slices * n for c, n in chosen) <= sum(c.slices * n for c, n in cand[2])
                plan = candidate_plan(pb, frac * rate, frac * rate, got)
                plan.layout = pack(instances_from_plan(plan), node.gpu, node.num_gpus)
                assert verify_plan(plan, pb.app, node, profiles) == []


def test_largest_fraction_comes_within_a_step_of_the_edge() -> None:
    calls = []

    def probe(f: float) -> str | None:
        calls.append(f)
        return "fits" if f <= 0.62 else None

    for first in (0.95, 0.62, 0.3, 2.0):
        calls.clear()
        frac, what = largest_fraction(probe, first)
        assert what == "fits" and 0.62 * (1 - 2 * SCALE_STEP) - 0.01 <= frac <= 0.62
        assert len(calls) <= 9
    assert largest_fraction(lambda f: None, 0.5) is None


def test_the_slot_price_of_a_remainder_never_costs_a_slice(example) -> None:
    """The cover of a (task, variant)'s remainder priced per memory slot too
    (``slot_aware_cost``) takes no more compute slices than the cover priced by compute, and
    never more memory slots, at every demand tried for every (task, variant) of the three apps;
    somewhere it takes fewer slots (a 1g.10gb where a 1g.20gb covered the remainder)."""
    from jigsaw.planner.anytime import _task_instances, slot_aware_cost

    node, _, pbs = example
    cost = slot_aware_cost(node)
    assert cost is not None
    size = {p.name: p.size for p in node.gpu.profiles}
    fewer_slots = 0
    for pb in pbs.values():
        by_tv: dict = {}
        for c in pb.colset.columns:
            by_tv.setdefault((c.task, c.variant), []).append(c)
        for cols in by_tv.values():
            top = max(c.throughput_rps for c in cols)
            for k in range(1, 40):
                demand = top * k / 7.3
                plain = _task_instances(cols, demand, float("inf"))
                priced = _task_instances(cols, demand, float("inf"), cost)
                assert plain is not None and priced is not None
                assert sum(c.throughput_rps * n for c, n in priced) >= demand * (1 - 1e-9)
                assert sum(c.slices * n for c, n in priced) <= sum(c.slices * n for c, n in plain)
                slots = [sum(size[c.mig_profile] * n for c, n in got) for got in (plain, priced)]
                assert slots[1] <= slots[0]
                fewer_slots += slots[1] < slots[0]
    assert fewer_slots > 0
