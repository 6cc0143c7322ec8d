"""The one policy that decides how an app moves to a new plan: keep the running plan, refuse the
new one, wait for the drains in its way, cut them, drain the app's own instances first, or take
the slots. A pure function (``MakeRoom.decide``) of what the generation manager sees
(``RoomSnapshot``), what the controller knows (``Need``: whether the running plan holds the
demand, whether the rate now arriving still needs the plan or has outgrown it) and one number of
the node's ``[control]``; ``transit`` runs the loop: decide the next step, have the runtime
execute it, decide again on the snapshot it then sees, until a step ends the transition.

Why one policy: the rules grew as switches inside the runtime (17 of them about draining,
cutting, waiting and handing over), each measured in replays; those that measured worse went, and
what is left is this sequence:

1. Nothing in the way: take the slots.
2. A plan the running one does not need (it holds the demand) is not worth a drain-first or a
   wait: keep the running plan (``skipped``).
3. While it waits for drains: keep the running plan once the rate no longer needs the plan
   (``not_needed``) or has outgrown it (``outgrown``: the re-plan lock goes to a plan sized to the
   rate); cut the drains once they are settled; else wait another poll.
4. A needed plan whose drain-first would cost more than the running plan, run hot, loses keeps the
   running plan (``headroom``, ``queue``, ``spike``: ``serves_on``).
5. The app would have no lane left while its instances in the way drain: refuse (before any
   wait: the drains in the way do not change that).
6. Draining generations (or retired instances) in the way, not yet waited for: wait for them
   (3), or cut them at once when they are settled.
7. Still something in the way that is not the app's own: refuse.
8. Else, while the rate still needs the plan, drain the app's instances in the way first,
   waiting ``drain_wait_slo`` of the SLO.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from jigsaw.runtime.admission import queue_admits
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
    Transition,
    WaitForDrains,
)

RISING_MARGIN = 0.05  # a needed plan this much past the one the headroom rule kept out: still rising


@dataclass(frozen=True)
class Need:
    """What the controller knows of a plan it pushes, read at each decision: plain values."""

    needed: bool = True  # the running plan does not hold the demand the new plan is for
    still_needed: bool = True  # the rate now arriving still needs it (False: the spike has passed)
    outgrown: bool = False  # the rate now arriving is well above what the plan was asked for
    # (running generation, the least rate a needed plan the headroom rule kept out over it planned)
    headroom_kept: tuple[int, float] | None = None
    # a spike runs: the re-plan's trigger was the arrivals outrunning the running plan, or the
    # demand history with the rate now arriving ends inside a spike
    rising: bool = False


NEEDED = Need()  # an operator's plan, or one pushed as asked: needed whatever arrives


@dataclass(frozen=True)
class MakeRoom:
    """The making-room policy: ``drain_wait_slo`` (``[control] drain_wait_slo``) is the share of
    the SLO a drain-first waits for the requests of the instances it drains."""

    drain_wait_slo: float = 0.25

    def decide(self, s: RoomSnapshot, need: Need = NEEDED) -> RoomStep:
        if s.deferred == 0:
            return TakeSlots()
        if not need.needed:
            return KeepRunning("skipped", "the running plan holds the demand")
        if s.waiting:
            return _wait(s, need)
        kept, note = serves_on(s, self.drain_wait_slo, need.headroom_kept, need.rising)
        if kept is not None:
            return kept
        if s.own_in_way and not s.lane_without_own:
            before = "" if s.waited else " (refused before waiting for the drains in the way)"
            return Refuse(f"the app would have no lane left to serve while the {s.own_in_way} "
                          f"instances in the way of the new ones drain{before}")
        if s.others_in_way and not s.waited:
            return _wait(s, need, note)
        if s.others_in_way:
            return Refuse("the slots are held by instances the app's running plan does not own "
                          "(a draining generation?)")
        if not need.still_needed:
            # the spike the plan was for has passed: a drain-first now would serve its backlog
            # on part of the running plan
            return KeepRunning("not_needed", "the rate now arriving is one the running plan holds")
        return DrainFirst(self.drain_wait_slo * s.drain_budget_s, note)


def _wait(s: RoomSnapshot, need: Need, note: str = "") -> RoomStep:
    """The wait for the drains in the way, one poll at a time: ended (the running plan kept) when
    the rate no longer needs the plan or has outgrown it, the drains cut once settled."""
    if s.drains_in_way and not s.drains_settled:
        if not need.still_needed:
            return KeepRunning("not_needed", "the rate now arriving is one the running plan holds")
        if need.outgrown:
            return KeepRunning("outgrown", f"the arrivals outgrew the new plan ({s.new_planned_rps:.1f} rps) "
                                           "while it waited for the drains in its way")
        return WaitForDrains(note)
    return CutDrains()


def serves_on(s: RoomSnapshot, drain_wait_slo: float, headroom_kept: tuple[int, float] | None = None,
              rising: bool = False) -> tuple[KeepRunning | None, str]:
    """For a needed plan whose MIG instances need the slots of the app's running instances (a
    drain-first), while the running plan's queue still admits a new request (``queue_admits``:
    the work queued on its lanes and their fastest path within 0.75 of a deadline): the
    ``KeepRunning`` step when the running plan serves on instead, else None; and a note to log.

    - ``headroom``: the new plan plans less than the running plan serves at full utilization (its
      planned rate over ``max_utilization``): a spike's request may queue for its deadline, so
      the running plan run hot serves what such a plan plans. A plan capped below the rate it was
      asked for is weighed by that rate; a plan ``RISING_MARGIN`` past the least this rule kept
      out over the same running generation (``headroom_kept``) is a spike still rising, and goes on.
    - ``queue``: the running plan's queue is longer than the drain-first would wait for the
      instances it drains: what they hold past that wait is sent again behind the interim plan's
      queue or answered 504, while the running plan answers it within its deadline.
    - ``spike``: the re-plan was triggered by the arrivals outrunning the running plan (``rising``):
      a drain-first takes the drained instances' capacity away at the spike's height, for its wait
      and the new processes' start, and what they still hold after the wait fails.

    Why: on the Twitter day replays drain-firsts for plans within the running plan's headroom
    failed hundreds of requests and switched 7-13 s after they were decided; in ar_assistant's peak
    window every spike met with a drain-first (the quarter of the SLO it waits is 1.6 bins at time
    scale 20) violated 7-92% of two to four bins, every one the running plan served on held."""
    if not s.own_in_way or s.queued_s is None or not queue_admits(s.queued_s, s.drain_budget_s):
        return None, ""
    after = " after the wait for the drains in its way" if s.waited else ""
    full_rps = s.running_planned_rps / s.max_utilization
    need_rps = max(s.new_planned_rps, s.new_demand_rps)
    asked = f"it is asked for {need_rps:.1f} rps" if need_rps > s.new_planned_rps else \
        f"it plans {s.new_planned_rps:.1f} rps"
    note = ""
    if need_rps < full_rps * (1 - 1e-9):
        kept_rps = headroom_kept[1] if headroom_kept is not None and headroom_kept[0] == s.running_gid \
            else None
        least_rps = kept_rps if kept_rps is not None else need_rps
        if not need_rps > least_rps * (1 + RISING_MARGIN):
            why = f"{asked}, less than the {full_rps:.2f} the running plan (for " \
                  f"{s.running_planned_rps:.1f}) serves at full utilization{after}"
            return KeepRunning("headroom", why, min(least_rps, need_rps)), ""
        if not s.waited:
            note = (f"a plan for {need_rps:.1f} rps, past the {least_rps:.1f} the headroom rule kept "
                    "out over the running plan: the spike still rises, no headroom kept")
    elif need_rps > s.new_planned_rps and not s.waited:
        note = (f"{asked}, past the {full_rps:.1f} the running plan serves at full utilization, and "
                f"plans {s.new_planned_rps:.1f}: no headroom kept")
    wait_s = drain_wait_slo * s.drain_budget_s
    if rising:
        return KeepRunning("spike", f"the arrivals outran the running plan, whose queue ({s.queued_s:.1f} s) "
                                    f"its door admits: a drain-first would take capacity away at the "
                                    f"spike's height{after}"), note
    if s.queued_s > wait_s:
        return KeepRunning("queue", f"the running plan's queue ({s.queued_s:.1f} s) is longer than a "
                                    f"drain-first waits ({wait_s:.1f} s) and within what its door "
                                    f"admits{after}"), note
    return None, note


class RoomPolicy(Protocol):
    """Decides the next step of a transition (``MakeRoom``, or a variant a test or bench drives)."""

    def decide(self, s: RoomSnapshot, need: Need = NEEDED) -> RoomStep: ...


class Transitions(Protocol):
    """What executes the steps: the generation manager (``GenerationManager.transition``)."""

    def transition(self, desired: DesiredState) -> contextlib.AbstractAsyncContextManager[Transition]: ...


async def transit(plane: Transitions, desired: DesiredState, policy: RoomPolicy,
                  need: Callable[[], Need] = lambda: NEEDED) -> tuple[Applied, RoomStep | None]:
    """Move ``desired.app`` to ``desired.plan``: decide the next step on the transition's snapshot
    and what the controller knows now (``need``, read at each decision), have the runtime execute
    it, and again, until a step ends the transition. Returns what was done and the step that ended
    it (None: no step was needed, e.g. a re-weight in place or a plan that cannot be laid out)."""
    last: RoomStep | None = None
    async with plane.transition(desired) as t:
        while (done := t.done) is None:
            last = policy.decide(t.snapshot, need())
            await t.execute(last)
    return done, last
