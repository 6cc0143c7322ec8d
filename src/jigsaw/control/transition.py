"""The one policy that decides how a new plan makes room on the node: keep the running plan, refuse
the new one, wait for the drains in its way, drain the app's own instances first, or take the
slots. A pure function of the generation manager's snapshot (``RoomSnapshot``) and two numbers
of the node's ``[control]``; the manager executes the step it returns and asks again with the
snapshot it then sees (``runtime/generations.py`` ``_free_slots``).

Why one policy: the rules grew as switches inside the runtime (17 of them about draining,
cutting, waiting and handing over), each measured in replays; those that measured worse went, and
what is left is this sequence:

1. Nothing in the way: take the slots.
2. A plan the running one does not need (it holds the demand) is not worth a drain-first or a
   wait: keep the running plan (``skipped``).
3. A needed plan whose drain-first would cost more than the running plan, run hot, loses keeps the
   running plan (``headroom``, ``queue``: ``serves_on``).
4. The app would have no lane left while its instances in the way drain: refuse (before any
   wait: the drains in the way do not change that).
5. Draining generations (or retired instances) in the way, not yet waited for: wait for them.
6. Still something in the way that is not the app's own: refuse.
7. Else drain the app's instances in the way first, waiting ``drain_wait_slo`` of the SLO.
"""

from __future__ import annotations

from dataclasses import dataclass

from jigsaw.runtime.admission import queue_admits
from jigsaw.runtime.applied import (
    DrainFirst,
    KeepRunning,
    Refuse,
    RoomSnapshot,
    RoomStep,
    TakeSlots,
    WaitForDrains,
)

RISING_MARGIN = 0.05  # a needed plan this much past the one the headroom rule kept out: still rising


@dataclass(frozen=True)
class MakeRoom:
    """The making-room policy: ``drain_wait_slo`` (``[control] drain_wait_slo``) is the share of
    the SLO a drain-first waits for the requests of the instances it drains."""

    drain_wait_slo: float = 0.25

    def decide(self, s: RoomSnapshot) -> RoomStep:
        if s.deferred == 0:
            return TakeSlots()
        if not s.needed:
            return KeepRunning("skipped", "the running plan holds the demand")
        kept, note = serves_on(s, self.drain_wait_slo)
        if kept is not None:
            return kept
        if s.own_in_way and not s.lane_without_own:
            before = "" if s.waited else " (refused before waiting for the drains in the way)"
            return Refuse(f"the app would have no lane left to serve while the {s.own_in_way} "
                          f"instances in the way of the new ones drain{before}")
        if s.others_in_way and not s.waited:
            return WaitForDrains(note)
        if s.others_in_way:
            return Refuse("the slots are held by instances the app's running plan does not own "
                          "(a draining generation?)")
        return DrainFirst(self.drain_wait_slo * s.drain_budget_s, note)


def serves_on(s: RoomSnapshot, drain_wait_slo: float) -> tuple[KeepRunning | None, str]:
    """For a needed plan whose MIG instances need the slots of the app's running instances (a
    drain-first), while the running plan's queue still admits a new request (``queue_admits``:
    the work queued on its lanes and their fastest path within 0.75 of a deadline): the
    ``KeepRunning`` step when the running plan serves on instead, else None; and a note to log.

    - ``headroom``: the new plan plans less than the running plan serves at full utilization (its
      planned rate over ``max_utilization``): a spike's request may queue for its deadline, so
      the running plan run hot serves what such a plan plans. A plan capped below the rate it was
      asked for is weighed by that rate; a plan ``RISING_MARGIN`` past the least this rule kept
      out over the same running generation is a spike still rising, and goes on.
    - ``queue``: the running plan's queue is longer than the drain-first would wait for the
      instances it drains: what they hold past that wait is sent again behind the interim plan's
      queue or answered 504, while the running plan answers it within its deadline.

    Why: on the Twitter day replays drain-firsts for plans within the running plan's headroom
    failed hundreds of requests and switched 7-13 s after they were decided."""
    if not s.own_in_way or s.queued_s is None or not queue_admits(s.queued_s, s.drain_budget_s):
        return None, ""
    after = " after the wait for the drains in its way" if s.waited else ""
    full_rps = s.running_planned_rps / s.max_utilization
    need_rps = max(s.new_planned_rps, s.new_demand_rps)
    asked = f"it is asked for {need_rps:.1f} rps" if need_rps > s.new_planned_rps else \
        f"it plans {s.new_planned_rps:.1f} rps"
    note = ""
    if need_rps < full_rps * (1 - 1e-9):
        least_rps = s.headroom_least_rps if s.headroom_least_rps is not None else need_rps
        if not need_rps > least_rps * (1 + RISING_MARGIN):
            why = f"{asked}, less than the running plan's {s.running_planned_rps:.1f} serves at full " \
                  f"utilization{after}"
            return KeepRunning("headroom", why, min(least_rps, need_rps)), ""
        if not s.waited:
            note = (f"a plan for {need_rps:.1f} rps, past the {least_rps:.1f} the headroom rule kept "
                    "out over the running plan: the spike still rises, no headroom kept")
    elif need_rps > s.new_planned_rps and not s.waited:
        note = (f"{asked}, past the {full_rps:.1f} the running plan serves at full utilization, and "
                f"plans {s.new_planned_rps:.1f}: no headroom kept")
    wait_s = drain_wait_slo * s.drain_budget_s
    if s.queued_s > wait_s:
        return KeepRunning("queue", f"the running plan's queue ({s.queued_s:.1f} s) is longer than a "
                                    f"drain-first waits ({wait_s:.1f} s) and within what its door "
                                    f"admits{after}"), note
    return None, note
