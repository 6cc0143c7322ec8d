"""The node's anytime plans: a verified quick node plan, the apps' own optima when they fit
together (the node optimum by decomposition), and the choice between a quick and an exact plan."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from jigsaw.node import load_node, load_node_profiles
from jigsaw.plan import NodePlan
from jigsaw.planner.anytime import extend_plan, trim_plan
from jigsaw.planner.node_plan import (
    QUICK_STATUS,
    extend_in_place,
    merge_layouts,
    node_value,
    plan_node,
    plan_node_anytime,
    prefer_quick,
    quick_plan_node,
    scaled_quick_plan_node,
    separate_optima,
)
from jigsaw.planner.packer import validate_layout
from jigsaw.planner.verify import verify_plan

NODE = Path(__file__).resolve().parents[1] / "examples" / "h100x4.toml"
DEMANDS = {"social_media": 10.0, "traffic_analysis": 10.0, "ar_assistant": 10.0}


@pytest.fixture(scope="module")
def example():
    node = load_node(NODE)
    return node, load_node_profiles(node)


def test_quick_node_plan_is_verified_on_one_layout(example) -> None:
    node, profiles = example
    q = quick_plan_node(node.apps, node, profiles, DEMANDS, budget_s=1.0)  # generous: a shared machine
    assert q is not None and q.status == QUICK_STATUS and q.feasible
    assert q.slices_used == sum(p.slices_used for p in q.plans.values()) <= node.slices_available
    assert validate_layout(q.layout, node.gpu) == []  # no two apps' instances overlap
    for name, p in q.plans.items():
        assert p.planned_rps == pytest.approx(DEMANDS[name])
        assert verify_plan(p, node.app(name), node, profiles) == []
    # each app's layout is its part of the node layout; merged back, the node layout
    merged = merge_layouts(q.plans, node.gpu.name, node.num_gpus)
    def placed(layout):
        return sorted((g.gpu, repr(i)) for g in layout.gpus for i in g.instances)
    assert placed(merged) == placed(q.layout)
    # the JSON form (what the solver process sends) comes back the same
    again = NodePlan.from_json_dict(q.to_json_dict())
    assert again.to_json_dict() == q.to_json_dict()


def test_quick_node_plan_gives_up_when_the_greedy_plans_do_not_fit(example) -> None:
    node, profiles = example
    assert quick_plan_node(node.apps, node, profiles, {a.name: 1e6 for a in node.apps}) is None


def test_the_apps_own_optima_that_fit_are_the_node_optimum(example) -> None:
    # without MIG-instance shares: the share pass over each app's optimum alone and over the node's
    # (``share_merge``) may free different slices
    node, profiles = example
    node = dataclasses.replace(node, gpu=dataclasses.replace(node.gpu, profiles=node.gpu.devices))
    apart = separate_optima(node.apps, node, profiles, DEMANDS, time_limit_s=30)
    assert apart is not None and apart.status == "optimal" and apart.gap == 0.0
    assert validate_layout(apart.layout, node.gpu) == []
    joint = plan_node(node.apps, node, profiles, DEMANDS, solver="highs", time_limit_s=30)
    assert joint.status == "optimal"
    assert node_value(apart.plans, node) == pytest.approx(node_value(joint.plans, node), abs=1e-6)
    # not a sum over apps: other app weights, or the fewest-slices objective, go to the joint model
    weighted = dataclasses.replace(node, planner=dataclasses.replace(
        node.planner, app_weights=(("social_media", 2.0),)))
    assert separate_optima(node.apps, weighted, profiles, DEMANDS, time_limit_s=30) is None
    assert separate_optima(node.apps, node, profiles, DEMANDS, objective="slices", time_limit_s=30) is None


def test_anytime_yields_the_quick_plan_then_the_exact_one(example) -> None:
    node, profiles = example
    got = list(plan_node_anytime(node.apps, node, profiles, DEMANDS, time_limit_s=30))
    assert [p.status for p in got][-1] == "optimal"
    assert len(got) in (1, 2) and (len(got) == 1 or got[0].status == QUICK_STATUS)


def test_prefer_quick_only_over_an_unproven_worse_or_empty_exact_plan(example) -> None:
    node, profiles = example
    q = quick_plan_node(node.apps, node, profiles, DEMANDS, budget_s=1.0)
    exact = plan_node(node.apps, node, profiles, DEMANDS, solver="highs", time_limit_s=30)
    assert q is not None and exact.status == "optimal"
    assert not prefer_quick(q, exact, node)  # a proven optimum always wins
    empty = dataclasses.replace(exact, status="no_solution", plans={})
    assert prefer_quick(q, empty, node)
    unproven = dataclasses.replace(exact, status="feasible")
    worse = node_value(q.plans, node) > node_value(exact.plans, node)
    assert prefer_quick(q, unproven, node) == worse


def test_quick_plan_keeps_what_runs(example) -> None:
    """A burst's quick plan extends the running plans: every running instance stays, on the
    same GPU and start, and only instances for the extra demand are added."""
    node, profiles = example
    running = plan_node(node.apps, node, profiles, DEMANDS, solver="highs", time_limit_s=30)
    assert running.status == "optimal"
    burst = {name: 3 * rps for name, rps in DEMANDS.items()}
    q = quick_plan_node(node.apps, node, profiles, burst, previous=running, budget_s=1.0)
    assert q is not None and q.status == QUICK_STATUS and "running plans kept" in q.notes[0]
    for name, p in q.plans.items():
        assert p.planned_rps == pytest.approx(burst[name])
        assert verify_plan(p, node.app(name), node, profiles) == []
        have = {(x.task, x.variant, x.mig_profile, x.mps, x.max_batch): x.count for x in p.instances}
        for x in running.plans[name].instances:
            assert have.get((x.task, x.variant, x.mig_profile, x.mps, x.max_batch), 0) >= x.count
    def placed(layout):
        return {(g.gpu, x.start, x.profile, x.app, x.task, x.variant)
                for g in layout.gpus for x in g.instances}
    assert placed(running.layout) <= placed(q.layout)  # nothing that runs moves
    # without the running plans: each app's greedy plan, which shares no such guarantee
    fresh = quick_plan_node(node.apps, node, profiles, burst, budget_s=1.0)
    assert fresh is None or "greedy" in fresh.notes[0]


def test_quick_node_plan_falls_back_on_each_apps_fewest_slices(example) -> None:
    """At 60% of the node (each app at a fifth of its capacity alone) the apps' best-objective
    greedy plans may not fit together (they did not before the fallback); their fewest-slice
    plans (LP lane mixes, the latency split of the fewest slices) do, on one verified layout."""
    node, profiles = example
    caps = {"social_media": 8502.0, "traffic_analysis": 2012.87, "ar_assistant": 863.7}
    demands = {n: 0.6 * c / 3 for n, c in caps.items()}
    q = quick_plan_node(node.apps, node, profiles, demands, budget_s=1.0)
    assert q is not None and q.status == QUICK_STATUS
    assert validate_layout(q.layout, node.gpu) == []
    assert q.slices_used <= node.slices_available
    for name, p in q.plans.items():
        assert verify_plan(p, node.app(name), node, profiles) == []


def test_anytime_hands_back_the_quick_plan_when_the_exact_one_finds_none(example, monkeypatch) -> None:
    """A spike's re-plan whose exact solve runs out of its limit without a plan ends on the
    verified quick plan (what the controller then keeps deployed), not on "no_solution"."""
    from jigsaw.planner import node_plan

    node, profiles = example
    real = node_plan.plan_node

    def out_of_time(*args, **kwargs):
        got = real(*args, **kwargs)
        return dataclasses.replace(got, status="no_solution", plans={}, layout=None)

    monkeypatch.setattr(node_plan, "plan_node", out_of_time)
    got = list(node_plan.plan_node_anytime(node.apps, node, profiles, DEMANDS, time_limit_s=30))
    assert len(got) == 2 and got[0].status == got[1].status == QUICK_STATUS
    assert got[1].plans and any("not better within the limit" in n for n in got[1].notes)


def test_scaled_quick_plan_serves_the_largest_fraction_it_finds(example) -> None:
    node, profiles = example
    apps = [a for a in node.apps if a.name == "traffic_analysis"]
    demands = {"traffic_analysis": 5000.0}  # 2.5x its capacity: no greedy plan for all of it
    assert quick_plan_node(apps, node, profiles, demands, budget_s=1.0) is None
    q = scaled_quick_plan_node(apps, node, profiles, demands, budget_s=1.0)
    assert q is not None and q.status == "feasible" and not q.feasible
    # about 2012.9 rps fit (its capacity): the fraction found comes near 2012.9 / 5000
    assert 0.25 < q.demand_scale < 2012.9 / 5000 + 1e-6
    p = q.plans["traffic_analysis"]
    assert p.instances and q.slices_used <= node.slices_available
    assert verify_plan(p, apps[0], node, profiles) == []
    assert p.demand_rps == pytest.approx(5000.0 * q.demand_scale)
    assert p.planned_rps == pytest.approx(5000.0 * q.demand_scale)
    # the same from quick_plan_node(scale_down=True), labelled as the quick plan
    again = quick_plan_node(apps, node, profiles, demands, budget_s=1.0, scale_down=True)
    assert again is not None and again.status == QUICK_STATUS and not again.feasible
    assert again.demand_scale == pytest.approx(q.demand_scale)
    # demands that fit: no scaled plan (the full one is quick_plan_node's)
    assert scaled_quick_plan_node(apps, node, profiles, {"traffic_analysis": 500.0}, budget_s=1.0) is None


def test_scaled_quick_plan_of_one_app_at_its_capacity(example) -> None:
    """At 100% of an app's capacity the greedy finds no plan for all of it: ``scaled_quick_plan``
    hands over a verified plan for most of it instead (the controller always has one)."""
    from jigsaw.planner.anytime import quick_plan, scaled_quick_plan

    node, profiles = example
    app = node.app("ar_assistant")
    assert quick_plan(app, node, profiles, 863.7) is None
    p = scaled_quick_plan(app, node, profiles, 863.7, budget_s=1.0)
    assert p is not None and not p.feasible and p.max_demand_plan
    assert p.demand_rps == 863.7 and 0.5 * 863.7 < p.planned_rps < 863.7
    assert verify_plan(p, app, node, profiles) == []
    # below its capacity the plan for all of it
    full = scaled_quick_plan(app, node, profiles, 300.0, budget_s=1.0)
    assert full is not None and full.feasible and full.planned_rps == pytest.approx(300.0)


def test_scaled_quick_plan_just_below_capacity_where_every_candidate_overruns_the_node(example) -> None:
    """At 97% of traffic_analysis's capacity the greedy has candidates for all of it, each a
    little over the node's slices or slots: the scaled quick plan rescales them (it found
    nothing there before, so a spike's re-plan near capacity had no quick plan to deploy)."""
    node, profiles = example
    apps = [a for a in node.apps if a.name == "traffic_analysis"]
    demands = {"traffic_analysis": 1950.0}
    assert quick_plan_node(apps, node, profiles, demands, budget_s=1.0) is None
    q = quick_plan_node(apps, node, profiles, demands, budget_s=1.0, scale_down=True)
    assert q is not None and q.status == QUICK_STATUS and not q.feasible
    assert 0.6 < q.demand_scale < 1.0
    p = q.plans["traffic_analysis"]
    assert q.slices_used <= node.slices_available
    assert verify_plan(p, apps[0], node, profiles) == []
    assert p.planned_rps == pytest.approx(1950.0 * q.demand_scale)


def test_anytime_falls_back_on_a_scaled_quick_plan_when_the_exact_finds_nothing(example, monkeypatch) -> None:
    import jigsaw.planner.node_plan as node_plan

    node, profiles = example
    apps = [a for a in node.apps if a.name == "traffic_analysis"]
    demands = {"traffic_analysis": 5000.0}

    def nothing(apps, node, profiles, demands, **kw):  # what a solve that ran out of its limit returns
        return NodePlan(node=node.name, objective_kind="accuracy", status="no_solution", feasible=False,
                        objective=float("nan"), gap=float("inf"), slices_used=0,
                        slices_available=node.slices_available, solve_seconds=2.0)
    monkeypatch.setattr(node_plan, "plan_node", nothing)
    got = list(plan_node_anytime(apps, node, profiles, demands, time_limit_s=2.0))
    # the scaled quick plan first (within the quick plan's time), and again as the answer
    assert len(got) == 2 and got[0] is got[1] and got[0].status == QUICK_STATUS
    assert got[0].demand_scale < 1 and not got[0].feasible
    assert got[0].plans["traffic_analysis"].instances
    assert any("no_solution" in n for n in got[0].notes)


def test_quick_node_plan_near_the_node_chooses_candidates_that_fit_together(example) -> None:
    """At 80% of the node each app's own best greedy plan leaves the others too little (no quick
    plan before the choice over the apps' candidates): now one verified layout for all three."""
    node, profiles = example
    caps = {"social_media": 8502.0, "traffic_analysis": 2012.87, "ar_assistant": 863.7}
    demands = {n: 0.8 * c / 3 for n, c in caps.items()}
    q = quick_plan_node(node.apps, node, profiles, demands, budget_s=1.0)
    assert q is not None and q.status == QUICK_STATUS and q.feasible and q.demand_scale == 1.0
    assert validate_layout(q.layout, node.gpu) == []
    assert q.slices_used <= node.slices_available
    for name, p in q.plans.items():
        assert p.planned_rps == pytest.approx(demands[name])
        assert verify_plan(p, node.app(name), node, profiles) == []


def test_the_node_plan_at_a_fifth_of_the_node_ends(example, monkeypatch) -> None:
    """At 20% of the node the decomposition once re-solved traffic_analysis's own optimum for
    ever (the solver's bound did not move, so the point stayed loose): each point is now solved
    again only while its bound moves. The solves are counted, not timed."""
    from jigsaw.planner import joint

    node, profiles = example
    caps = {"social_media": 8502.0, "traffic_analysis": 2012.87, "ar_assistant": 863.7}
    calls = []
    real = joint.solve

    def counted(*args, **kwargs):
        calls.append(1)
        if len(calls) > 60:
            raise AssertionError("the node decision does not end")
        return real(*args, **kwargs)

    monkeypatch.setattr(joint, "solve", counted)
    res = plan_node(node.apps, node, profiles, {n: 0.2 * c / 3 for n, c in caps.items()},
                    solver="cbc", time_limit_s=30)
    assert res.status in ("optimal", "feasible") and res.feasible
    for name, p in res.plans.items():
        assert verify_plan(p, node.app(name), node, profiles) == []


def test_processes_to_start_counts_the_processes_a_plan_adds() -> None:
    """Per instance kind, the processes (count x MPS level) beyond what the running plan runs;
    a kind that differs in anything, its max batch included, starts all its processes."""
    from jigsaw.plan import PlanInstance
    from jigsaw.planner.anytime import processes_to_start

    def inst(variant: str, count: int, mps: int = 1, batch: int = 4) -> PlanInstance:
        return PlanInstance("t", variant, "1g.10gb", mps, batch, count, 10.0, 100.0, 1)

    def plan(*xs: PlanInstance):
        return dataclasses.replace(_one_plan(), instances=list(xs))
    running = plan(inst("a", 2), inst("b", 1, mps=4))
    assert processes_to_start(running, running) == 0
    assert processes_to_start(None, running) == 6
    assert processes_to_start(running, plan(inst("a", 3), inst("b", 1, mps=4))) == 1
    assert processes_to_start(running, plan(inst("a", 1), inst("b", 2, mps=4))) == 4
    assert processes_to_start(running, plan(inst("a", 2, batch=8))) == 2  # another max batch


def _one_plan():
    node = load_node(NODE)
    return plan_node([node.app("social_media")], node, load_node_profiles(node),
                     {"social_media": 100.0}, solver="highs").plans["social_media"]


def test_a_quick_replan_of_the_same_or_a_little_more_demand_keeps_the_processes(example) -> None:
    """The quick plan for the demand the running plan was made for starts no process; for 20%
    more it starts only the added instances' processes, fewer than the greedy plan made without
    the running one (which shares nothing with it)."""
    from jigsaw.planner.anytime import processes_to_start

    node, profiles = example
    apps = [node.app("social_media")]
    demand = {"social_media": 2000.0}
    running = plan_node(apps, node, profiles, demand, solver="highs", time_limit_s=30)
    run = running.plans["social_media"]
    same = quick_plan_node(apps, node, profiles, demand, previous=running, budget_s=1.0)
    assert same is not None and processes_to_start(run, same.plans["social_media"]) == 0
    more = {"social_media": 2400.0}
    kept = quick_plan_node(apps, node, profiles, more, previous=running, budget_s=1.0)
    fresh = quick_plan_node(apps, node, profiles, more, budget_s=1.0)
    assert kept is not None and fresh is not None
    started = processes_to_start(run, kept.plans["social_media"])
    total = sum(x.count * x.mps for x in kept.plans["social_media"].instances)
    assert started < total
    assert started < processes_to_start(run, fresh.plans["social_media"])


def test_trim_plan_gives_back_what_a_lower_demand_leaves_spare_on_the_running_slots(example) -> None:
    """A spike's plan for a quiet bin: the instances the demand leaves spare go, what stays runs on
    its own slot (the runtime keeps every process of it), the plan verifies and holds the demand."""
    node, profiles = example
    node = dataclasses.replace(node, planner=dataclasses.replace(node.planner, max_utilization=0.8))
    app = node.app("ar_assistant")
    spike = plan_node([app], node, profiles, {app.name: 600.0}, solver="highs", time_limit_s=30)
    running = spike.plans[app.name]
    assert running.slices_used >= 20  # the spike's plan fills most of the node
    for demand in (250.0, 450.0):
        t = trim_plan(app, node, profiles, running, demand)
        assert t is not None and t.slices_used < running.slices_used
        assert t.planned_rps == pytest.approx(demand) and verify_plan(t, app, node, profiles) == []
        assert t.accuracy == pytest.approx(running.accuracy)  # the lanes keep their mix

        def placed(p):
            return {(g.gpu, x.start, x.profile, x.task, x.variant, x.mps, x.max_batch)
                    for g in p.layout.gpus for x in g.instances}
        assert placed(t) < placed(running)  # a subset: nothing moves, nothing new
        # the counts match the layout, and each kind's indexes run 0..count-1 again
        for i in t.instances:
            idx = sorted(x.index for g in t.layout.gpus for x in g.instances
                         if (x.task, x.variant, x.profile, x.mps, x.max_batch)
                         == (i.task, i.variant, i.mig_profile, i.mps, i.max_batch))
            assert idx == list(range(i.count))
    # more trimmed for less demand; nothing to give back at the demand it was planned for
    assert trim_plan(app, node, profiles, running, 250.0).slices_used \
        < trim_plan(app, node, profiles, running, 450.0).slices_used
    assert trim_plan(app, node, profiles, running, running.planned_rps) is None


def test_extend_in_place_serves_the_largest_share_that_packs_beside_what_runs(example) -> None:
    """A spike on a small running plan: its extension for the whole spike does not fit beside it,
    the plan kept in place for a share of it does; nothing that runs moves, and it verifies."""
    node, profiles = example
    node = dataclasses.replace(node, planner=dataclasses.replace(node.planner, max_utilization=0.8))
    app = node.app("ar_assistant")
    running = plan_node([app], node, profiles, {app.name: 155.0}, solver="highs", time_limit_s=30)
    run = running.plans[app.name]
    spike = 560.0
    p = extend_in_place(app, node, profiles, running.plans, spike)
    assert p is not None and run.planned_rps < p.planned_rps < spike  # a share of the spike, more than runs
    assert verify_plan(p, app, node, profiles) == []

    def placed(layout):
        return {(g.gpu, x.start, x.profile, x.task, x.variant) for g in layout.gpus for x in g.instances}
    assert placed(run.layout) <= placed(p.layout)
    # a demand the extension holds whole is served whole; one the running plan holds needs none
    small = extend_in_place(app, node, profiles, running.plans, 250.0)
    assert small is not None and small.planned_rps == pytest.approx(250.0)
    assert extend_in_place(app, node, profiles, running.plans, run.planned_rps) is None


def test_extending_a_chain_shares_its_latency_slack_among_the_tasks_that_grow(example) -> None:
    """ar_assistant's 230 req/s plan (detect -> caption -> speak, 2 x 635 ms of a 1550 ms SLO)
    extended for 1.5x its demand: every task needs more instances, and each added instance may
    take only its share of the path's slack, so the extension verifies (each task taking the
    whole slack made 1821 ms: the quick plan and the in-place extension were lost)."""
    node, profiles = example
    node = dataclasses.replace(node, planner=dataclasses.replace(node.planner, max_utilization=0.8))
    app = node.app("ar_assistant")
    run = plan_node([app], node, profiles, {app.name: 231.792}, solver="highs",
                    time_limit_s=30).plans[app.name]
    # caption as the daemon's plan of day 0 ran it: 3 processes of batch 32 (353 ms), not 2 of 64
    row = profiles.get("git-large", "3g.40gb", 3, 32)
    run = dataclasses.replace(run, instances=[
        dataclasses.replace(i, mps=3, max_batch=32, latency_ms=row.latency_ms,
                            throughput_rps=row.throughput_rps * node.planner.max_utilization)
        if i.task == "caption" else i for i in run.instances])
    for demand in (300.0, 346.5, 420.0):
        p = extend_plan(app, node, profiles, run, demand)
        assert p is not None and p.planned_rps == pytest.approx(demand)
        assert verify_plan(p, app, node, profiles) == ["the plan has no layout"], demand  # not packed yet
        assert {(i.task, i.variant, i.mig_profile, i.mps, i.max_batch) for i in run.instances} <= \
            {(i.task, i.variant, i.mig_profile, i.mps, i.max_batch) for i in p.instances}


def _slots(plan, node) -> int:
    return sum(node.gpu.profile(i.mig_profile).size * i.count for i in plan.instances)


def test_a_spikes_extensions_leave_memory_slots_for_the_peak(example) -> None:
    """traffic_analysis's spike of day 0 (541 -> 720 -> 990 -> 1288 req/s) met by extending the
    running plan: priced by compute slices alone the extensions covered remainders with 1g.20gb
    instances (2 memory slots for 1 slice) until the extension for the peak found no memory slot
    its instances fit and served 1004 of 1288 req/s; with the remainder's cover priced per memory
    slot too (``extension_slices_per_slot``, on by default), each step takes no more slices and
    fewer slots, and the peak's extension, laid out beside everything that runs as the daemon
    lays it, serves almost all of it, more than the compute price's (96% since the added demand
    goes on the cheapest lanes, ``extension_mix``)."""
    from jigsaw.gpu.layout import from_app_layouts
    from jigsaw.planner.decompose import app_layout
    from jigsaw.planner.milp import plan as plan_app
    from jigsaw.planner.node_plan import _pack_node
    from jigsaw.runtime.placement import Beside

    node, profiles = example
    node = dataclasses.replace(node, planner=dataclasses.replace(node.planner, max_utilization=0.8))
    app = node.app("traffic_analysis")
    start = plan_app(app, node, profiles, 541.0, space="ast", solver="highs", time_limit_s=30)

    def spike(n):
        run = start
        for demand in (720.0, 990.0):
            run = extend_plan(app, n, profiles, run, demand)
            assert run is not None and run.planned_rps == pytest.approx(demand)
        run.layout = app_layout(_pack_node({app.name: run}, n, None), app.name)
        assert verify_plan(run, app, n, profiles) == []
        # laid out as the daemon lays it, beside what runs (``Beside``: no instance moves)
        laid = from_app_layouts(n.gpu.name, n.num_gpus, {app.name: run.layout})
        beside = Beside(laid, laid.instances, n.gpu)

        def fits(p):
            got = beside.place(app.name, p)
            return None if got is None else got[1]
        return run, extend_in_place(app, n, profiles, {app.name: run}, 1288.0, fits=fits)

    run_on, peak_on = spike(node)
    assert peak_on is not None and peak_on.planned_rps >= 0.95 * 1288.0
    assert verify_plan(peak_on, app, node, profiles) == []
    run_off, peak_off = spike(dataclasses.replace(
        node, planner=dataclasses.replace(node.planner, extension_slices_per_slot=0.0)))
    assert run_on.slices_used <= run_off.slices_used
    assert _slots(run_on, node) < _slots(run_off, node)
    assert peak_off is None or peak_off.planned_rps < peak_on.planned_rps  # what the compute price left


def test_a_spikes_extension_serves_the_added_demand_on_the_lanes_cheapest_per_slice(example) -> None:
    """ar_assistant's plan for a quiet bin (127 req/s) runs its most accurate lane only; a spike's
    extension keeps that lane's rate and serves the rest on the lanes that cost the fewest slices
    within the accuracy SLO: 431 req/s on 19 slices (the running mix scaled took 21 for 335),
    every lane mix it tried at the SLO, and nothing that runs changes."""
    from jigsaw.planner.anytime import _accuracy_slo, slot_aware_cost
    from jigsaw.planner.extension_mix import added_mixes, lane_costs
    from jigsaw.planner.problem import make_problem
    from jigsaw.spaces import search_space

    node, profiles = example
    node = dataclasses.replace(node, planner=dataclasses.replace(node.planner, max_utilization=0.8))
    app = node.app("ar_assistant")
    run = plan_node([app], node, profiles, {app.name: 127.0}, solver="highs", time_limit_s=30).plans[app.name]
    assert run.accuracy == pytest.approx(1.0)  # the spare slices of a quiet bin went to accuracy
    slo = _accuracy_slo(app, node)
    p = extend_plan(app, node, profiles, run, 431.0)
    assert p is not None and p.planned_rps == pytest.approx(431.0)
    assert p.slices_used <= 19 and slo - 1e-6 <= p.accuracy < run.accuracy
    assert {(i.task, i.variant, i.mig_profile, i.mps, i.max_batch) for i in run.instances} <= \
        {(i.task, i.variant, i.mig_profile, i.mps, i.max_batch) for i in p.instances}
    kept = {tuple(lp.variants.values()): lp.rate_rps for lp in run.lanes}
    got = {tuple(lp.variants.values()): lp.rate_rps for lp in p.lanes}
    assert all(got.get(k, 0.0) >= x - 1e-6 for k, x in kept.items())  # the running lanes carry what they did
    assert verify_plan(p, app, node, profiles) == ["the plan has no layout"]  # not packed yet
    # the mixes tried: each the running lanes kept, the rest added, at the rate and the SLO
    pb = make_problem(app, node, profiles, search_space("ast"), None)
    lane = {tuple(pb.lanes[li]): li for li in range(len(pb.lanes))}
    running = {lane[tuple(lp.variants[t] for t in app.task_names)]: lp.rate_rps for lp in run.lanes}
    mixes = added_mixes(pb, running, 431.0, slo, lane_costs(pb, slot_aware_cost(node)))
    assert len(mixes) >= 2
    for mix in mixes:
        assert sum(mix.values()) == pytest.approx(431.0)
        assert sum(pb.lane_acc[li] * x for li, x in mix.items()) / 431.0 >= slo - 1e-9
        assert all(mix[li] >= x - 1e-9 for li, x in running.items())
    assert added_mixes(pb, running, run.planned_rps, slo, lane_costs(pb, slot_aware_cost(node))) == []
