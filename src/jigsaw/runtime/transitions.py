"""One app's transition to a new plan, executed a step at a time: the generation manager places
the plan and brings up the MIG instances nothing holds (``GenerationManager.transition``), then
whoever decides (the controller, through ``control/transition.py``) reads the ``snapshot``, picks a
step and has it executed here, until a step ends the transition (``done``). The runtime decides
nothing: it executes ``TakeSlots``, ``KeepRunning``, ``Refuse``, ``WaitForDrains`` (one poll),
``CutDrains`` and ``DrainFirst``, and says what it then sees.

Why steps, not one call: the choices between them (keep the running plan, wait, drain first) read
the controller's own knowledge (the rate now arriving, the demand the plan was asked for); with
one call the runtime had to call back into the controller while it waited."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from jigsaw.errors import JigsawError
from jigsaw.gpu.layout import NodeLayout
from jigsaw.plan import Plan
from jigsaw.runtime.applied import (
    Applied,
    CutDrains,
    Deferred,
    DesiredState,
    DrainFirst,
    KeepRunning,
    Refuse,
    RoomSnapshot,
    RoomStep,
    TakeSlots,
    WaitForDrains,
)
from jigsaw.runtime.generation import Generation
from jigsaw.runtime.placement import without_instances

if TYPE_CHECKING:
    from jigsaw.runtime.generations import GenerationManager

DRAIN_POLL_S = 0.05  # one ``WaitForDrains`` step: how long it waits before the next snapshot
DRAIN_END_MARGIN_S = 0.5  # past a drain's own deadline: the frontend's timers answer its last requests


class ManagerTransition:
    """One app's transition in progress on a ``GenerationManager`` (``runtime.applied.Transition``):
    made under the manager's lock (``GenerationManager.transition``), so nothing else changes the
    node meanwhile but the drains that end."""

    def __init__(self, gm: GenerationManager, desired: DesiredState, t0: float) -> None:
        self.gm = gm
        self.desired = desired
        self.app = desired.app
        self.t0 = t0  # the plan is decided: the time to the routing switch counts from here
        self.old_gid = gm.current[self.app]
        self.old: Generation = gm.generations[self.old_gid]  # the generation the new one replaces
        self.new: Plan = desired.plan
        self.node_layout: NodeLayout | None = None
        self.deferred: Deferred = ()
        # once a drain-first has drained the instances in the way, a failure goes back to this
        # (the running plan and the node layout it ran on) instead of staying on the interim plan
        self.restore: tuple[Plan, NodeLayout] | None = None
        self.done: Applied | None = None
        self._waiting_since: float | None = None  # the first ``WaitForDrains`` step
        self._wait_until: float | None = None  # the drains in the way end by then at the latest
        self._waited = False
        self.brought_up = False  # the new instances on free slots exist
        self._snapshot: RoomSnapshot | None = None
        # wall seconds per phase (``applied.PHASES``): the manager's launch adds its own to it
        self.phases: Counter[str] = Counter()

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Count the wall seconds of the block as ``phase``'s."""
        t = time.monotonic()
        try:
            yield
        finally:
            self.phases[phase] += time.monotonic() - t

    def phases_s(self) -> tuple[tuple[str, float], ...]:
        """The phases' seconds for ``Applied.phases_s`` (rounded to 0.1 ms)."""
        return tuple((k, round(v, 4)) for k, v in self.phases.items())

    # ---- opening -----------------------------------------------------------------------------
    async def _open(self) -> None:
        """Place the plan; re-weight in place when it runs the same processes (done), else read
        which of its MIG instances' slots something holds: the first snapshot is taken before
        anything changes, so a step that keeps the running plan or refuses the new one (decided
        on it) creates and destroys no instance."""
        gm, desired = self.gm, self.desired
        with self.timed("place"):
            placed = gm._place_desired(desired, self.old_gid)
        if isinstance(placed, Applied):
            self.done = placed
            return
        self.node_layout, self.new = placed
        old = self.old
        if not desired.fresh_generation and gm.same_processes(old, self.new):
            self.done = gm._reweight(self.app, old, self.new, self.node_layout, self.t0)
            return
        if gm.partition is not None and self.node_layout is not None:
            with self.timed("place"):
                self.deferred = gm.partition.held(self.node_layout)

    async def open(self) -> None:
        """``_open``, ``done`` stamped with its phases when the opening ended the transition."""
        await self._open()
        self._stamp()

    async def _bring_up(self, why: str = "re-plan") -> bool:
        """Create the new MIG instances nothing holds (once, before a step that goes on: they are
        made while the drains in the way end); False when NVML failed (``done``: rolled back)."""
        if self.brought_up or self.gm.partition is None or self.node_layout is None:
            return True
        with self.timed("mig"):
            up = await self.gm._bring_up(self.app, self.node_layout, why)
        if isinstance(up, Applied):
            self.done = up
            return False
        self.brought_up = True
        self.deferred = up
        return True

    # ---- what the decider reads ----------------------------------------------------------------
    @property
    def snapshot(self) -> RoomSnapshot:
        if self._snapshot is None:
            self._snapshot = self._take_snapshot()
        return self._snapshot

    def _take_snapshot(self) -> RoomSnapshot:
        gm, old = self.gm, self.old
        own: set[tuple[int, int]] = set()
        blockers: set[tuple[int, int]] = set()
        in_way: list[int] = []
        settled = True
        if self.deferred:
            assert self.node_layout is not None
            blockers, own = gm._blockers(self.app, old, self.node_layout, self.deferred)
            in_way = gm.drains_in_way(self.node_layout, self.deferred)
            router = gm._router()
            settled = not any(router.unanswered_in(g) for g in in_way) \
                or (self._wait_until is not None and time.monotonic() >= self._wait_until)
        return RoomSnapshot(
            app=self.app, running_gid=old.gid, deferred=len(self.deferred), own_in_way=len(own),
            others_in_way=len(blockers - own),
            lane_without_own=not own or without_instances(old.plan, own) is not None,
            drains_in_way=len(in_way), drains_settled=settled,
            waiting=self._waiting_since is not None, waited=self._waited,
            queued_s=gm.router.queued_end_s(self.app) if gm.router is not None else None,
            drain_budget_s=gm._drain_budget_s(old),
            running_planned_rps=old.plan.planned_rps, max_utilization=gm.node.planner.max_utilization,
            new_planned_rps=self.new.planned_rps, new_demand_rps=self.new.demand_rps)

    # ---- the steps ---------------------------------------------------------------------------
    async def execute(self, step: RoomStep) -> None:
        """Execute ``step``; ``done`` once it ended the transition, else a new ``snapshot``."""
        if self.done is not None:
            raise RuntimeError(f"{self.app}: the transition has ended ({step} after it)")
        try:
            await self._execute(step)
        finally:
            self._stamp()

    def _stamp(self) -> None:
        """``done`` with the phases' seconds, once a step (or the opening) ended the transition."""
        if self.done is not None:
            self.done = dataclasses.replace(self.done, phases_s=self.phases_s())

    async def _execute(self, step: RoomStep) -> None:
        self._snapshot = None
        note = getattr(step, "note", "")
        if note:
            self.gm.log(f"{self.app}: {note}")
        if isinstance(step, (KeepRunning, Refuse)):
            self.done = await (self._keep_running(step) if isinstance(step, KeepRunning) else
                               self.gm._refused(self.app, self.old_gid, step.why, "refused", self.brought_up))
            return
        if not await self._bring_up():
            return
        if isinstance(step, TakeSlots):
            if self.deferred:  # something took the slots since the snapshot: decide again on it
                return
            layout = self.node_layout
            if self.gm.partition is not None and layout is not None:
                layout = self.gm.partition.with_uuids(layout)  # the instances it brought up
            self.done = await self.gm._switch(self.desired, self.old, self.old_gid, self.new, layout,
                                              self.restore, self.t0, self.phases)
        elif isinstance(step, WaitForDrains):
            with self.timed("drains"):
                await self._wait_one_poll()
        elif isinstance(step, CutDrains):
            await self._cut_drains()
        elif isinstance(step, DrainFirst):
            await self._drain_first(step.wait_s)
        else:
            raise TypeError(f"not a making-room step: {step!r}")

    async def _keep_running(self, step: KeepRunning) -> Applied:
        """The running plan serves on: the MIG instances brought up for the new one go (a wait for
        drains that ended so is counted and said)."""
        gm, app = self.gm, self.app
        if self._waiting_since is not None:
            said = {"not_needed": "the plan is no longer needed", "outgrown": "the arrivals outgrew the plan"}
            self._count_wait(f" ({said.get(step.outcome, step.why)}: the wait ends there)")
        if self.brought_up:
            await gm._release_mig(f"{app}: re-plan {step.outcome.replace('_', ' ')}")
        gm.drain_first_total[step.outcome] += 1
        note = (f"the new plan's MIG instances need the slots of {len(self.deferred)} running or draining "
                f"ones and {step.why}: no drain-first, nothing changed, keeping generation {self.old_gid}")
        gm.log(f"{app}: {note}")
        return Applied(self.old_gid, self.old_gid, False, time.monotonic() - self.t0, note=note)

    async def _wait_one_poll(self) -> None:
        """One poll of the wait for the drains in the new instances' way (their end is fixed at the
        first: their own deadline and a margin)."""
        gm = self.gm
        if self._waiting_since is None:
            now = time.monotonic()
            self._waiting_since = now
            assert self.node_layout is not None
            in_way = gm.drains_in_way(self.node_layout, self.deferred)
            self._wait_until = max((gm._drain_ends.get(g, now) for g in in_way), default=now) \
                + DRAIN_END_MARGIN_S
        await asyncio.sleep(DRAIN_POLL_S)

    def _count_wait(self, how: str = "") -> None:
        since = self._waiting_since if self._waiting_since is not None else time.monotonic()
        waited_s = time.monotonic() - since
        self.gm.drain_waits_total += 1
        self.gm.drain_wait_s_total += waited_s
        self.gm.log(f"{self.app}: the new instances need slots of draining generation(s); waited "
                    f"{waited_s * 1e3:.0f} ms for their drains to end{how}")
        self._waiting_since = None

    async def _cut_drains(self) -> None:
        """End the drains still in the way and free their slots (and retired instances'), then
        bring up the new instances there; the slots still held after it are the next snapshot's."""
        gm, app = self.gm, self.app
        assert self.node_layout is not None
        in_way = gm.drains_in_way(self.node_layout, self.deferred)
        if in_way or self._waiting_since is not None:
            self._count_wait()
        self._waited = True
        with self.timed("drains"):
            freed = await gm._free_in_way(app, self.node_layout, self.deferred, in_way)
        if freed:
            with self.timed("mig"):
                up = await gm._bring_up(app, self.node_layout, "re-plan, the drains in its way ended")
            if isinstance(up, Applied):
                self.done = up
            else:
                self.deferred = up

    async def _drain_first(self, wait_s: float) -> None:
        """Drain the app's instances in the way first (``Drains._drain_first``); on a failure after
        the drain the running plan is restored, before it the re-plan fails (nothing changed)."""
        gm, app, old = self.gm, self.app, self.old
        assert gm.node_layout is not None and self.node_layout is not None
        before = (old.plan, gm.node_layout)
        try:
            self.old = await gm._drain_first(app, old, self.node_layout, self.deferred, wait_s, self.phases)
        except JigsawError as exc:
            gm.failures_total += 1
            if gm.current[app] != self.old_gid:  # it failed after the drain: bring the plan back
                gm.log(f"{app}: the re-plan failed after its drain-first ({exc})")
                with self.timed("restore"):
                    self.done = await gm._restore(app, before, self.old_gid, str(exc))
            else:
                self.done = await gm._refused(app, self.old_gid, str(exc), "failed", True)
            return
        self.restore = before
        self.deferred = ()
