"""The deployment policy (``control/deployment.py``) on plain data, without a controller or
processes: the re-plan's sequence (quick plan, exact plan, the quick plan after a refusal, the
running plan extended in place) and each app's choice (keep, beside, extend)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from jigsaw.control.deployment import (
    Asks,
    Deploy,
    Extend,
    ForNeeded,
    Replan,
    Skip,
    asks,
    better_only,
    for_needed,
    next_action,
    quick_need_by,
    retry_share,
    settle,
    short_of_gain,
    trim_frees,
)
from jigsaw.node import ControlSettings, load_node
from jigsaw.plan import NodePlan, Plan, PlanInstance

NODE = load_node(Path(__file__).resolve().parents[2] / "examples" / "h100x4.toml")
CTL = NODE.control


def _plan(rps: float, slices: int = 1, variant: str = "v", app: str = "a", *, capped: bool = False) -> Plan:
    inst = [PlanInstance(task="t", variant=variant, mig_profile="1g.10gb", mps=1, max_batch=4, count=slices,
                         latency_ms=10.0, throughput_rps=100.0, slices=1)]
    return Plan(app=app, space="ast", demand_rps=rps, planned_rps=rps, feasible=True, max_demand_plan=capped,
                status="optimal", objective=0.0, accuracy=0.9, slices_used=slices, slices_available=28,
                solve_seconds=0.1, gap=0.0, instances=inst)


def _node_plan(plans: Mapping[str, Plan], status: str = "optimal") -> NodePlan:
    return NodePlan(node="n", objective_kind="accuracy", status=status, feasible=True, objective=0.0, gap=0.0,
                    slices_used=sum(p.slices_used for p in plans.values()), slices_available=28,
                    solve_seconds=0.1, plans=dict(plans))


RUNNING = {"a": _plan(10.0), "b": _plan(10.0, app="b")}
QUICK = _node_plan({"a": _plan(30.0, 2), "b": _plan(10.0, app="b")}, status="heuristic")
EXACT = _node_plan({"a": _plan(30.0, 3, "w"), "b": _plan(10.0, app="b")})


def _run(r: Replan, refused: Mapping[str, list[str]] = {}, running: Mapping[str, Plan] = RUNNING
         ) -> list[object]:
    """Drive ``next_action`` as the controller does, the transitions refusing ``refused`` (source ->
    apps); the actions taken."""
    taken: list[object] = []
    while (a := next_action(r, running, CTL, NODE)) is not None:
        taken.append(a)
        if isinstance(a, Skip):
            r = dataclasses.replace(r, quick_decided=True) if a.source == "quick" else \
                dataclasses.replace(r, exact_decided=True)
        elif isinstance(a, Extend):
            r = dataclasses.replace(r, extended=True)
        elif a.why == "after_refusal":
            r = dataclasses.replace(r, after_refusal=True)
        else:
            r = dataclasses.replace(r.refusing(a.source, refused.get(a.source, [])), quick_decided=True,
                                    deployed=a.plan, quick_deployed=r.quick_deployed or a.source == "quick",
                                    exact_decided=a.source == "exact")
    return taken


def test_an_urgent_replan_deploys_its_quick_plan_then_the_exact_one() -> None:
    r = Replan("rate", "auto", {"a": 30.0, "b": 10.0}, quick=QUICK)
    assert _run(r) == [Deploy("quick", QUICK)]  # then it waits for the exact plan
    after = dataclasses.replace(r, quick_decided=True, quick_deployed=True, deployed=QUICK, exact=EXACT)
    assert _run(after) == [Deploy("exact", EXACT)]
    # a routine re-plan whose running plans hold the demands keeps its quick plan back
    holding = Replan("bin", "auto", {"a": 10.0, "b": 10.0}, quick=QUICK)
    assert _run(holding) == [Skip("quick", "the running plans hold the demands")]
    assert _run(dataclasses.replace(holding, anytime="always")) == [Deploy("quick", QUICK)]


def test_an_exact_plan_that_finds_nothing_or_loses_to_the_quick_one_is_not_deployed() -> None:
    empty = dataclasses.replace(EXACT, plans={})
    r = Replan("rate", "auto", {"a": 30.0, "b": 10.0}, quick=QUICK, quick_decided=True, exact=empty)
    assert [type(a) for a in _run(r)] == [Skip]
    worse = dataclasses.replace(EXACT, status="time_limit",
                                plans={"a": _plan(30.0, 9, "w"), "b": _plan(10.0, 4)})
    r = dataclasses.replace(r, exact=worse, deployed=QUICK, quick_deployed=True)
    (skip,) = _run(r)
    assert isinstance(skip, Skip) and "worse objective" in skip.why


def test_a_refused_exact_plan_is_followed_by_the_quick_plan_then_the_extension() -> None:
    r = Replan("rate", "auto", {"a": 30.0, "b": 10.0}, quick=QUICK, quick_decided=True, exact=EXACT)
    # a's exact plan refused: the quick plan for a alone (it serves 30 of the running plan's 10)
    taken = _run(r, {"exact": ["a"]})
    assert taken[0] == Deploy("exact", EXACT)
    assert isinstance(taken[1], Deploy) and taken[1].why == "after_refusal"
    assert set(taken[1].plan.plans) == {"a"}
    # a still short of its demand (the fake running plans do not change): extended in place
    assert taken[2:] == [Extend(("a",))]
    # off: nothing after the refusal; a quick plan that serves no more is not pushed either
    ctl = dataclasses.replace(CTL, quick_after_refusal=False, extend_in_place_after_refusal=False)
    r2 = dataclasses.replace(r, refused={"a": frozenset({"exact"})}, exact_decided=True)
    assert next_action(r2, RUNNING, ctl, NODE) is None
    flat = dataclasses.replace(QUICK, plans={"a": _plan(10.0), "b": _plan(10.0, app="b")})
    assert _run(dataclasses.replace(r, quick=flat), {"exact": ["a"]})[1:] == [Extend(("a",))]
    # the quick plan deployed already (an urgent re-plan): straight to the extension; and an app
    # whose running plan now holds its demand is not extended
    deployed = dataclasses.replace(r, quick_deployed=True)
    assert _run(deployed, {"exact": ["a"]})[1:] == [Extend(("a",))]
    holds = {"a": _plan(30.0, 2), "b": RUNNING["b"]}
    assert _run(deployed, {"exact": ["a"]}, holds)[1:] == []


def test_the_quick_plan_is_needed_at_the_patience_or_the_bins_boundary() -> None:
    assert quick_need_by("off", "rate", 100.0, 0.3, None, 0, 200.0) is None
    assert quick_need_by("auto", "admin", 100.0, 0.3, None, 0, 200.0) is None
    assert quick_need_by("always", "admin", 100.0, 0.3, None, 0, 200.0) == 100.0
    assert quick_need_by("auto", "rate", 100.0, 0.3, 1, 0, 200.0) == 100.3
    assert quick_need_by("auto", "bin", 100.0, 0.3, 1, 0, 200.0) == 200.0  # ahead of its bin
    assert quick_need_by("auto", "bin", 100.0, 0.3, 0, 0, 200.0) == 100.3  # its bin runs


def test_settle_keeps_a_running_plan_that_holds_and_is_worth_as_much() -> None:
    same_value = _node_plan({"a": _plan(10.0, 1, "w"), "b": _plan(10.0, app="b")})
    plans, kept = settle(same_value, RUNNING, {"a": 10.0, "b": 10.0}, NODE)
    assert kept == ["a"] and plans["a"] is RUNNING["a"]
    # short of the demand, a lost worker's app, scaled demands: the new plan
    assert settle(same_value, RUNNING, {"a": 20.0, "b": 10.0}, NODE)[1] == []
    assert settle(same_value, RUNNING, {"a": 10.0, "b": 10.0}, NODE, frozenset({"a"}))[1] == []
    scaled = dataclasses.replace(same_value, demand_scale=0.9)
    assert settle(scaled, RUNNING, {"a": 10.0, "b": 10.0}, NODE)[1] == []


def test_each_apps_plan_kept_placed_beside_or_replaced_by_an_extension() -> None:
    run, plan = _plan(100.0, 4), _plan(150.0, 6, "w")
    # the running plan holds: better only; where the node's slices do not allow it, needed
    assert better_only(run, plan, 90.0, 10, 28, False)
    assert not better_only(run, plan, 90.0, 31, 28, False)
    assert not better_only(run, plan, 120.0, 10, 28, False)
    # short of the demand and short of the gain (control.short_plan_min_gain, 10%)
    assert short_of_gain(run, _plan(105.0, 6, "w"), 200.0, 10, 28, 0.1, False, "rate")
    assert not short_of_gain(run, _plan(115.0, 6, "w"), 200.0, 10, 28, 0.1, False, "rate")
    assert not short_of_gain(run, _plan(105.0, 6, "w"), 200.0, 10, 28, 0.1, False, "admin")
    # a needed plan: beside where it fits; a spike's (under 0.8 of the demand held) that does not
    # fit goes out as the running plan extended; a later plan of the same re-plan only where it
    # needs no more than draining slots
    def choose(demand: float, fits: bool, extended: bool = False, serving: bool = False,
               ctl: ControlSettings = CTL) -> ForNeeded:
        return for_needed(run, demand, ctl, extended_first=extended, fits_beside=fits, fits_serving=serving)
    assert choose(150.0, True).what == "beside"
    spike = choose(300.0, False)
    assert spike.what == "extend" and spike.over_draining
    assert choose(110.0, False).what == "any"
    assert choose(300.0, False, extended=True, serving=True).what == "over_draining"
    assert choose(300.0, False, extended=True).what == "serve_on"
    off = dataclasses.replace(CTL, place_needed_beside=False, extend_over_draining=False)
    assert choose(150.0, True, ctl=off).what == "any"
    assert not choose(300.0, False, ctl=off).over_draining
    # the give-back: worth it from control.trim_min_slices freed
    assert trim_frees(_plan(100.0, 8), _plan(50.0, 4), 4)
    assert not trim_frees(_plan(100.0, 8), _plan(50.0, 5), 4)
    assert not trim_frees(_plan(100.0, 8), _plan(50.0, 1), 0)


def test_which_needed_plans_ask_the_rate_whether_it_still_needs_them_or_outgrew_them() -> None:
    # the rate trigger's plan at once; a bin's once its bin has ended; an operator's never, nor
    # a plan of the violation or capacity trigger whether the rate still needs it
    assert asks("rate", 3, 100.0, 100.0, CTL) == Asks(True, None, 100.0)
    assert asks("bin", 4, 100.0, 100.0, CTL) == Asks(True, 4, 100.0)
    assert asks("admin", 4, 100.0, 100.0, CTL) == Asks()
    assert not asks("violations", 3, 100.0, 100.0, CTL).still_needed
    # outgrown: against the larger rate (a plan for more than asked, the burst floor); never for a
    # plan capped below what it was asked for, nor with control.end_wait_outgrown_above off
    assert asks("rate", 3, 120.0, 100.0, CTL).outgrown_rps == 120.0
    assert asks("rate", 3, 80.0, 100.0, CTL).outgrown_rps is None
    off = dataclasses.replace(CTL, end_wait_outgrown_above=0.0)
    assert asks("rate", 3, 100.0, 100.0, off).outgrown_rps is None


def test_a_replan_that_found_nothing_is_asked_again_at_a_share_of_the_demand() -> None:
    assert retry_share(False, "rate", False, CTL) == CTL.unplanned_retry_share == 0.85
    assert retry_share(True, "rate", False, CTL) is None
    assert retry_share(False, "admin", False, CTL) is None and retry_share(False, "bin", True, CTL) is None
    assert retry_share(False, "rate", False, dataclasses.replace(CTL, unplanned_retry_share=0.0)) is None
