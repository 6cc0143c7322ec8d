"""The making-room policy (``control/transition.py``) on snapshots, without processes: each rule
that decides whether a new plan keeps the running one, is refused, waits for the drains in its
way (one poll a step), cuts them, drains the app's own instances first or takes the slots; and
the loop that drives a transition step by step (``transit``) against a scripted runtime."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator

import pytest

from jigsaw.control.transition import RISING_MARGIN, MakeRoom, Need, transit
from jigsaw.plan import Plan
from jigsaw.runtime.applied import (
    Applied,
    CutDrains,
    DesiredState,
    DrainFirst,
    KeepRunning,
    Refuse,
    RoomSnapshot,
    RoomStep,
    TakeSlots,
    WaitForDrains,
)

# a needed plan for 1.3 req/s over a running plan for 1 at max_utilization 0.8 (1.25 at full
# utilization): two of the app's running instances in the way, a 10 s SLO, no queue
NEEDED = RoomSnapshot(app="a", running_gid=3, deferred=1, own_in_way=2, others_in_way=0,
                      lane_without_own=True, drains_in_way=0, drains_settled=True, waiting=False,
                      waited=False, queued_s=0.0, drain_budget_s=10.0, running_planned_rps=1.0,
                      max_utilization=0.8, new_planned_rps=1.3, new_demand_rps=1.3)
# a draining generation holds the slot of the new instance: it still answers requests
DRAINING = dataclasses.replace(NEEDED, own_in_way=0, others_in_way=1, drains_in_way=1, drains_settled=False)
POLICY = MakeRoom(drain_wait_slo=0.25)
NEEDED_NOW = Need()


def _decide(need: Need = NEEDED_NOW, **changes: object) -> object:
    return POLICY.decide(dataclasses.replace(NEEDED, **changes), need)


def test_nothing_in_the_way_takes_the_slots_and_a_plan_not_needed_keeps_the_running_one() -> None:
    assert isinstance(_decide(deferred=0), TakeSlots)
    assert isinstance(_decide(Need(needed=False), deferred=0), TakeSlots)
    step = _decide(Need(needed=False))
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
    assert "less than the 1.25 the running plan (for 1.0) serves at full utilization" in step.why
    assert isinstance(_decide(new_planned_rps=2.0, new_demand_rps=2.0), DrainFirst)


def test_a_queue_past_what_the_door_admits_does_not_cope_and_drains_first() -> None:
    # 8 s of queue on a 10 s deadline: past 0.75 of it, neither rule keeps the running plan
    assert isinstance(_decide(new_planned_rps=1.2, new_demand_rps=1.2, queued_s=8.0), DrainFirst)
    assert isinstance(_decide(queued_s=None), DrainFirst)  # no queue estimate: no rule applies


def test_the_headroom_rule_yields_to_a_spike_still_rising() -> None:
    # kept out at 1.1 before: 1.12 is within the margin (kept out), 1.2 is past it (drains first)
    kept = _decide(Need(headroom_kept=(3, 1.1)), new_planned_rps=1.12, new_demand_rps=1.12)
    assert isinstance(kept, KeepRunning) and kept.outcome == "headroom" and kept.headroom_rps == 1.1
    rising = _decide(Need(headroom_kept=(3, 1.1)), new_planned_rps=1.2, new_demand_rps=1.2)
    assert 1.1 * (1 + RISING_MARGIN) < 1.2
    assert isinstance(rising, DrainFirst) and "past the 1.1 the headroom rule kept out" in rising.note
    # kept out over another running generation: this one has no such memory
    other = _decide(Need(headroom_kept=(2, 1.1)), new_planned_rps=1.2, new_demand_rps=1.2)
    assert isinstance(other, KeepRunning) and other.headroom_rps == 1.2


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


def test_a_spikes_replan_keeps_the_running_plan_while_its_queue_admits() -> None:
    # triggered by the arrivals outrunning the running plan: past its headroom, no drain-first
    # while the door still admits (a 2 s queue of a 10 s deadline); once it does not, drain first
    step = _decide(Need(rising=True), new_planned_rps=2.0, new_demand_rps=2.0, queued_s=2.0)
    assert isinstance(step, KeepRunning) and step.outcome == "spike", step
    assert "a drain-first would take capacity away at the spike's height" in step.why
    assert isinstance(_decide(Need(rising=True), new_planned_rps=2.0, new_demand_rps=2.0, queued_s=8.0),
                      DrainFirst)
    # a routine re-plan's plan drains first; nothing in the way, a spike's plan takes the slots
    assert isinstance(_decide(new_planned_rps=2.0, new_demand_rps=2.0, queued_s=2.0), DrainFirst)
    assert isinstance(_decide(Need(rising=True), deferred=0), TakeSlots)


def test_no_lane_left_is_refused_before_any_wait() -> None:
    step = _decide(lane_without_own=False, others_in_way=1)
    assert isinstance(step, Refuse) and "no lane left" in step.why and "refused before waiting" in step.why
    after = _decide(lane_without_own=False, waited=True)
    assert isinstance(after, Refuse) and "refused before waiting" not in after.why


def test_draining_slots_are_waited_for_then_cut_then_refused_if_still_held() -> None:
    busy = {"drains_in_way": 1, "drains_settled": False}
    assert isinstance(_decide(others_in_way=2, own_in_way=0, **busy), WaitForDrains)
    assert isinstance(_decide(others_in_way=2, **busy), WaitForDrains)  # theirs first, then a drain-first
    # settled drains (every request answered, or past their deadline) and retired instances are
    # cut at once: nothing to wait for
    assert isinstance(_decide(others_in_way=2, own_in_way=0, drains_in_way=1), CutDrains)
    assert isinstance(_decide(others_in_way=2, own_in_way=0), CutDrains)
    step = _decide(others_in_way=2, own_in_way=0, waited=True)
    assert isinstance(step, Refuse) and "does not own" in step.why
    assert isinstance(_decide(others_in_way=0, own_in_way=2, waited=True), DrainFirst)
    # only the app's own running instances hold the rules; a wait alone does not need them
    assert isinstance(_decide(others_in_way=1, own_in_way=0, new_planned_rps=1.2,
                              new_demand_rps=1.2, **busy), WaitForDrains)


def test_the_wait_for_drains_polls_until_they_settle_and_ends_when_the_rate_says_so() -> None:
    waiting = dataclasses.replace(DRAINING, waiting=True)
    assert isinstance(POLICY.decide(waiting, Need()), WaitForDrains)
    assert isinstance(POLICY.decide(dataclasses.replace(waiting, drains_settled=True), Need()), CutDrains)
    # the spike the plan was for has passed: the wait ends, nothing cut or changed
    passed = POLICY.decide(waiting, Need(still_needed=False))
    assert isinstance(passed, KeepRunning) and passed.outcome == "not_needed"
    # the arrivals outgrew the plan: the wait ends so that a plan sized to them may come
    grown = POLICY.decide(waiting, Need(outgrown=True))
    assert isinstance(grown, KeepRunning) and grown.outcome == "outgrown"
    assert "outgrew the new plan (1.3 rps)" in grown.why
    # asked before the first poll too, but not once the drains are settled (cutting them costs
    # nothing) nor for a plan that waits for nothing
    assert POLICY.decide(DRAINING, Need(still_needed=False)).outcome == "not_needed"  # type: ignore[union-attr]
    assert isinstance(POLICY.decide(dataclasses.replace(waiting, drains_settled=True),
                                    Need(outgrown=True)), CutDrains)
    # while it waits the running plan's rules are not weighed again (only after the wait): a
    # queue that grows meanwhile does not end it
    assert isinstance(POLICY.decide(dataclasses.replace(waiting, own_in_way=1, queued_s=4.2), Need()),
                      WaitForDrains)


def test_a_drain_first_is_made_only_while_the_rate_still_needs_the_plan() -> None:
    step = _decide(Need(still_needed=False))
    assert isinstance(step, KeepRunning) and step.outcome == "not_needed"
    assert isinstance(_decide(Need(outgrown=True)), DrainFirst)  # outgrown only ends a wait



class _Scripted:
    """A runtime's transition that shows the snapshots given, one per step executed, and ends at
    the first step it is told ends it; it records the steps."""

    def __init__(self, snapshots: list[RoomSnapshot]) -> None:
        self.snapshots = snapshots
        self.steps: list[RoomStep] = []
        self.done: Applied | None = None

    @property
    def snapshot(self) -> RoomSnapshot:
        return self.snapshots[len(self.steps)]

    async def execute(self, step: RoomStep) -> None:
        self.steps.append(step)
        if isinstance(step, TakeSlots):
            self.done = Applied(4, 3, True)
        elif isinstance(step, (KeepRunning, Refuse)):
            self.done = Applied(3, 3, False, note=getattr(step, "why", None))

    @contextlib.asynccontextmanager
    async def transition(self, desired: DesiredState) -> AsyncIterator[_Scripted]:
        yield self


def test_transit_decides_each_step_on_the_snapshot_the_last_one_left() -> None:
    """The controller's loop: a drain in the way polled twice (the rate read at every decision),
    cut once settled, then the app's own instances drained first and the slots taken."""
    waiting = dataclasses.replace(DRAINING, own_in_way=1, waiting=True)
    script = _Scripted([dataclasses.replace(DRAINING, own_in_way=1), waiting,
                        dataclasses.replace(waiting, drains_settled=True),
                        dataclasses.replace(NEEDED, own_in_way=1, waited=True),
                        dataclasses.replace(NEEDED, deferred=0, waited=True)])
    reads: list[int] = []

    def need() -> Need:
        reads.append(1)
        return Need()
    desired = DesiredState("a", Plan.__new__(Plan))
    done, last = asyncio.run(transit(script, desired, POLICY, need))
    assert [type(s) for s in script.steps] == [WaitForDrains, WaitForDrains, CutDrains, DrainFirst, TakeSlots]
    assert done == Applied(4, 3, True) and isinstance(last, TakeSlots) and len(reads) == 5
    # a snapshot that calls for a refusal ends it there, the step returned for the caller to weigh
    script = _Scripted([dataclasses.replace(NEEDED, lane_without_own=False)])
    done, last = asyncio.run(transit(script, desired, POLICY))
    assert isinstance(last, Refuse) and not done.new_generation
