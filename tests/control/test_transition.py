"""The making-room policy (``control/transition.py``) on snapshots, without processes: each rule
that decides whether a new plan keeps the running one, is refused, waits for the drains in its
way, drains the app's own instances first or takes the slots."""

from __future__ import annotations

import dataclasses

import pytest

from jigsaw.control.transition import RISING_MARGIN, MakeRoom
from jigsaw.runtime.applied import DrainFirst, KeepRunning, Refuse, RoomSnapshot, TakeSlots, WaitForDrains

# a needed plan for 1.3 req/s over a running plan for 1 at max_utilization 0.8 (1.25 at full
# utilization): two of the app's running instances in the way, a 10 s SLO, no queue
NEEDED = RoomSnapshot(app="a", running_gid=3, needed=True, waited=False, deferred=1, own_in_way=2,
                      others_in_way=0, lane_without_own=True, queued_s=0.0, drain_budget_s=10.0,
                      running_planned_rps=1.0, max_utilization=0.8, new_planned_rps=1.3,
                      new_demand_rps=1.3, headroom_least_rps=None)
POLICY = MakeRoom(drain_wait_slo=0.25)


def _decide(**changes: object) -> object:
    return POLICY.decide(dataclasses.replace(NEEDED, **changes))


def test_nothing_in_the_way_takes_the_slots_and_a_plan_not_needed_keeps_the_running_one() -> None:
    assert isinstance(_decide(deferred=0), TakeSlots)
    assert isinstance(_decide(deferred=0, needed=False), TakeSlots)
    step = _decide(needed=False)
    assert isinstance(step, KeepRunning) and step.outcome == "skipped"
    assert "holds the demand" in step.why


def test_a_needed_plan_past_the_running_plans_headroom_drains_first_for_a_share_of_the_slo() -> None:
    step = _decide()
    assert isinstance(step, DrainFirst) and step.wait_s == pytest.approx(2.5)
    assert MakeRoom(drain_wait_slo=1.0).decide(NEEDED) == DrainFirst(10.0)


def test_the_headroom_rule_keeps_a_plan_the_running_plan_serves_run_hot() -> None:
    # 1.2 < 1.25 at full utilization: the running plan serves it; 2.0 does not
    step = _decide(new_planned_rps=1.2, new_demand_rps=1.2)
    assert isinstance(step, KeepRunning) and step.outcome == "headroom" and step.headroom_rps == 1.2
    assert "less than the running plan's 1.0 serves at full utilization" in step.why
    assert isinstance(_decide(new_planned_rps=2.0, new_demand_rps=2.0), DrainFirst)


def test_a_queue_past_what_the_door_admits_does_not_cope_and_drains_first() -> None:
    # 8 s of queue on a 10 s deadline: past 0.75 of it, neither rule keeps the running plan
    assert isinstance(_decide(new_planned_rps=1.2, new_demand_rps=1.2, queued_s=8.0), DrainFirst)
    assert isinstance(_decide(queued_s=None), DrainFirst)  # no queue estimate: no rule applies


def test_the_headroom_rule_yields_to_a_spike_still_rising() -> None:
    # kept out at 1.1 before: 1.12 is within the margin (kept out), 1.2 is past it (drains first)
    kept = _decide(new_planned_rps=1.12, new_demand_rps=1.12, headroom_least_rps=1.1)
    assert isinstance(kept, KeepRunning) and kept.outcome == "headroom" and kept.headroom_rps == 1.1
    rising = _decide(new_planned_rps=1.2, new_demand_rps=1.2, headroom_least_rps=1.1)
    assert 1.1 * (1 + RISING_MARGIN) < 1.2
    assert isinstance(rising, DrainFirst) and "past the 1.1 the headroom rule kept out" in rising.note


def test_a_capped_plan_is_weighed_by_the_demand_it_was_asked_for() -> None:
    step = _decide(new_planned_rps=1.2, new_demand_rps=1.5)
    assert isinstance(step, DrainFirst)
    assert "asked for 1.5 rps, past the 1.2 the running plan serves at full utilization" in step.note
    kept = _decide(new_planned_rps=1.2, new_demand_rps=1.22)
    assert isinstance(kept, KeepRunning) and "asked for 1.2 rps" in kept.why


def test_the_queue_rule_keeps_a_running_plan_whose_queue_outlasts_the_drain_first_wait() -> None:
    # 4.2 s queued: longer than the 2.5 s wait, within the door's 7.5 s; also past full utilization
    for rps in (1.3, 2.0):
        step = _decide(new_planned_rps=rps, new_demand_rps=rps, queued_s=4.2)
        assert isinstance(step, KeepRunning) and step.outcome == "queue", rps
        assert "is longer than a drain-first waits (2.5 s)" in step.why
    waited = _decide(queued_s=4.2, waited=True)
    assert isinstance(waited, KeepRunning) and "after the wait for the drains in its way" in waited.why
    assert isinstance(_decide(queued_s=2.0), DrainFirst)


def test_no_lane_left_is_refused_before_any_wait() -> None:
    step = _decide(lane_without_own=False, others_in_way=1)
    assert isinstance(step, Refuse) and "no lane left" in step.why and "refused before waiting" in step.why
    after = _decide(lane_without_own=False, waited=True)
    assert isinstance(after, Refuse) and "refused before waiting" not in after.why


def test_draining_slots_are_waited_for_once_then_refused_if_still_held() -> None:
    assert isinstance(_decide(others_in_way=2, own_in_way=0), WaitForDrains)
    assert isinstance(_decide(others_in_way=2), WaitForDrains)  # theirs first, then a drain-first
    step = _decide(others_in_way=2, own_in_way=0, waited=True)
    assert isinstance(step, Refuse) and "does not own" in step.why
    assert isinstance(_decide(others_in_way=0, own_in_way=2, waited=True), DrainFirst)
    # only the app's own running instances hold the rules; a wait alone does not need them
    assert isinstance(_decide(others_in_way=1, own_in_way=0, new_planned_rps=1.2,
                              new_demand_rps=1.2), WaitForDrains)
