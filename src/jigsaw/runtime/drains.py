"""How a generation leaves: the drain of a replaced generation and its retirement, the wait of a
needed plan for the drains in its way, the drain-first of an app's own instances (and the
restore of the running plan when the re-plan fails after it): the steps the making-room policy
(``control/transition.py``) picks, executed. A part of ``GenerationManager`` (``Drains`` is its
base): the manager's state, these steps."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from jigsaw.errors import JigsawError
from jigsaw.gpu.layout import NodeLayout
from jigsaw.gpu.partition import overlaps
from jigsaw.plan import Plan
from jigsaw.runtime.applied import (
    Applied,
    Deferred,
    DrainRefused,
    Slot,
)
from jigsaw.runtime.generation import Generation
from jigsaw.runtime.gpus import placements
from jigsaw.runtime.placement import kept_processes, without_instances

if TYPE_CHECKING:
    from jigsaw.gpu.partition import MigPartition
    from jigsaw.node import Node
    from jigsaw.runtime.applied import Router
    from jigsaw.runtime.mps_daemons import MpsDaemons

DRAIN_MARGIN_S = 12.0  # beyond the deadline: the frontend keeps a timed-out request 10 s for late credits
DRAIN_POLL_S = 0.05
CUT_WAIT_S = 15.0  # a cut drain's processes stop within ms; past this the re-plan goes on without
READY_FAST_POLL_S = 0.002  # how often a cut drain's retirement is looked at


class Drains:
    """The drain, wait, drain-first and restore steps of ``GenerationManager`` (its base class:
    they read and change the manager's generations, routing and MIG partition)."""

    node: Node
    time_scale: float
    generations: dict[int, Generation]
    current: dict[str, int]
    partition: MigPartition | None
    node_layout: NodeLayout | None
    mps_daemons: MpsDaemons
    log: Callable[[str], None]
    _retiring: set[asyncio.Task[None]]
    _retiring_gids: set[int]
    _cut: dict[int, asyncio.Event]
    _drain_ends: dict[int, float]
    _lock: asyncio.Lock
    drains_total: int
    drain_s_total: float
    drain_waits_total: int
    drain_wait_s_total: float
    drains_cut_total: int
    cut_requests_total: Counter[str]
    drain_first_total: Counter[str]
    failures_total: int
    processes_started_total: int

    # the manager's own steps the drains use
    def _router(self) -> Router: ...
    def _draining_by_generation(self) -> dict[int, Any]: ...
    def in_use_layout(self) -> NodeLayout | None: ...
    def _lay_out(self, app: Any, plan: Plan) -> Generation: ...
    async def _launch(self, gen: Generation, layout: NodeLayout | None, router: Router,
                      hold_s: float = 0.0) -> None: ...
    async def _abandon(self, gen: Generation) -> None: ...
    async def _release_mig(self, reason: str) -> None: ...
    def _tell(self, proc: Any) -> None: ...

    def _drain_budget_s(self, g: Generation) -> float:
        """The longest a request of ``g`` may still take (wall seconds): the app's SLO and hops,
        times the time scale; a drain's own deadline counts from its switch with it."""
        return (g.app.latency_slo_ms + g.app.depth * self.node.planner.hop_latency_ms) \
            * self.time_scale / 1000.0

    def drains_in_way(self, desired: NodeLayout, deferred: Deferred) -> list[int]:
        """The draining generations (in ``_retire``) that hold slots of the new instances at
        ``deferred``: a needed plan waits for their drains to end (``WaitForDrains``)."""
        gpu = self.node.gpu
        want = [i for i in desired.instances if i.slot in set(deferred)]
        return sorted(gid for gid, held in self._draining_by_generation().items()
                      if gid in self._retiring_gids
                      and any(overlaps(gpu, w, i) for w in want for i in held))

    async def _free_in_way(self, app: str, desired: NodeLayout, deferred: Deferred,
                           in_way: list[int]) -> bool:
        """``CutDrains``: end the drains ``in_way`` (what they still hold settled, their retirement
        awaited), then destroy the instances in the new ones' way that nothing runs on any more
        (theirs, retired ones'); True when slots were freed.

        Why a needed plan waits for the drains in its way until every request they hold is answered
        (at most until their own deadline, when the frontend has answered each 504, so none is sent
        again) before it cuts them: refused, a spike's plan was retried only at the next trigger,
        after the drain had ended anyway; cut short at once or after a part of the SLO, the drains'
        requests were sent again and came back late (both measured more violations in alternating
        replays)."""
        assert self.partition is not None
        gpu = self.node.gpu
        want = [i for i in desired.instances if i.slot in set(deferred)]
        in_way = [g for g in in_way if g in self._retiring_gids]
        if in_way and not await self._end_drains(app, in_way):
            return False
        in_use = self.in_use_layout()
        assert in_use is not None
        used = {i.slot: i for i in in_use.instances}
        in_use_devices = {i.device_slot for i in in_use.instances}  # a shared MIG instance: its host's
        orphans = [e for e in self.partition.existing.values()
                   if e.slot not in in_use_devices and any(overlaps(gpu, w, e) for w in want)]
        if not in_way and not orphans:
            return False
        # what runs, and the new plan's instances (those made already stay): the rest goes
        keep = in_use.with_instances({**used, **{i.slot: i for i in desired.instances}}.values())
        try:
            await asyncio.to_thread(self.partition.tear_down, keep,
                                    f"{app}: the retired generations in the way of a re-plan")
        except JigsawError as exc:
            self.log(f"{app}: freeing the slots of the retired generations failed ({exc})")
            return False
        return True

    async def _end_drains(self, app: str, gids: list[int]) -> bool:
        """Settle the requests the draining generations ``gids`` still hold (the router: answered
        ones waiting for late credits forgotten, unanswered ones dispatched again on the app's
        current generation or answered 503/504) and wait for their retirement (processes stopped,
        segments unlinked, MPS daemons stopped). False when one did not retire in time."""
        router = self._router()
        settled: Counter[str] = Counter()
        for gid in gids:
            forgotten, resent, failed = router.cut_generation(gid)
            settled.update(forgotten=forgotten, resent=resent, failed=failed)
            self._cut.setdefault(gid, asyncio.Event()).set()
        self.drains_cut_total += len(gids)
        self.cut_requests_total.update(settled)
        t0 = time.monotonic()
        # until their retirement is done: it stops their MPS daemons itself (not twice at once)
        while set(gids) & self._retiring_gids and time.monotonic() - t0 < CUT_WAIT_S:
            await asyncio.sleep(READY_FAST_POLL_S)
        self.log(f"{app}: the drains of generation(s) {', '.join(map(str, gids))} in the new "
                 f"instances' way ended ({settled['forgotten']} answered requests' late credits "
                 f"forgotten, {settled['resent']} sent again, {settled['failed']} failed), retired in "
                 f"{(time.monotonic() - t0) * 1e3:.0f} ms")
        return not set(gids) & self._retiring_gids

    def _retire_later(self, gid: int) -> None:
        # draining from now (not from when the task first runs): a transition that comes next on
        # the loop sees the drain and its deadline in its first snapshot
        self._retiring_gids.add(gid)
        self._drain_ends[gid] = time.monotonic() + self._drain_budget_s(self.generations[gid])
        task = asyncio.get_running_loop().create_task(self._drain_and_retire(gid))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _drain_and_retire(self, gid: int) -> None:
        """In the background: ``_retire``, then the MIG instances and MPS daemons nothing uses go."""
        g = self.generations[gid]
        self._retiring_gids.add(gid)
        try:
            await self._retire(gid)
        finally:
            self._retiring_gids.discard(gid)
            self._cut.pop(gid, None)
        async with self._lock:
            await asyncio.to_thread(self.mps_daemons.stop_unused, list(self.generations.values()))
            await self._release_mig(f"{g.app.name}: generation {gid} retired")

    def _drains_on(self, slots: set[Slot]) -> list[int]:
        """The draining generations (in ``_retire``) that run on some of the instances at ``slots``."""
        return sorted(gid for gid, held in self._draining_by_generation().items()
                      if gid in self._retiring_gids and any((i.gpu, i.start) in slots for i in held))

    async def _retire(self, gid: int, *, first_wait_s: float | None = None,
                      also: Sequence[int] = ()) -> None:
        """Wait until the old generation's requests are all settled, then stop the processes the new
        one did not keep, tell the kept ones to drop its wiring, and unlink its segments.

        ``first_wait_s``: a drain-first's, whose new instances wait for these slots while the app
        serves on part of its plan. It waits only for unanswered requests, at most that long (the
        policy's ``drain_wait_slo`` of the SLO), then sends the rest again on the serving
        generation and forgets the late credits. Why: waiting for every late credit (a spike's
        timed-out requests hold theirs for 10 s) made a spike's switch take the SLO plus that
        margin, 25 s at time scale 20 (5 bins of the peak window), the app shedding at the door.
        ``also``: with ``first_wait_s``, older draining generations whose unanswered requests it
        waits for too (the caller cuts them next).
        """
        router = self._router()
        g = self.generations[gid]
        budget_s = self._drain_budget_s(g)
        deadline = time.monotonic() + budget_s + DRAIN_MARGIN_S
        self._drain_ends[gid] = time.monotonic() + budget_s
        first = first_wait_s is not None
        if first_wait_s is not None:
            deadline = time.monotonic() + first_wait_s
        cut = self._cut.setdefault(gid, asyncio.Event())  # set: a re-plan needs its slots now
        late = not first  # a replaced generation drains until its late credits are settled too
        settled = router.pending_in if late else router.unanswered_in
        t0 = time.monotonic()
        while (settled(gid) or any(router.unanswered_in(x) for x in also)) \
                and time.monotonic() < deadline and not cut.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(cut.wait(), DRAIN_POLL_S)
        self._cut.pop(gid, None)
        self._drain_ends.pop(gid, None)
        self.drains_total += 1
        self.drain_s_total += time.monotonic() - t0
        if first:
            forgotten, resent, failed = router.cut_generation(gid)
            self.log(f"{g.app.name}: generation {gid} drained for the new instances in "
                     f"{(time.monotonic() - t0) * 1e3:.0f} ms ({forgotten} answered requests' late credits "
                     f"forgotten, {resent} sent again, {failed} failed)")
        else:
            self.log(f"{g.app.name}: generation {gid} drained in {(time.monotonic() - t0) * 1e3:.0f} ms"
                     + (" (cut short)" if cut.is_set() else ""))
            if not cut.is_set() and not late and not router.unanswered_in(gid):
                router.cut_generation(gid)  # every request answered: forget the late credits awaited
        left = router.pending_in(gid)
        if left:
            self.log(f"{g.app.name}: generation {gid}: {left} requests unsettled after drain")
        # A process this generation kept from an older one that still drains (a re-plan that came
        # within that one's drain) serves that one's queued items: it goes back to it instead of
        # stopping. Stopped, it took them along, and the older drain held its MIG slots until its
        # deadline (24 s of a spike at time scale 20) while a needed re-plan waited for them.
        g.hand_back({x.gid for x in self.generations.values() if x.gid < gid and not x.stopping})
        g.stopping = True  # (here, on the loop: a younger generation's retirement reads it)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, g.stop_workers)
        router.remove_generation(gid)
        self.generations.pop(gid, None)
        for k in sorted(g.handed_over):
            self._tell(g.workers[k])
        await loop.run_in_executor(None, g.close)
        await asyncio.to_thread(self.mps_daemons.stop_unused, list(self.generations.values()))

    def _blockers(self, app: str, old: Generation, desired: NodeLayout,
                  deferred: Deferred) -> tuple[set[Slot], set[Slot]]:
        """The slots (GPU, start) of the MIG instances in the way of the new ones at ``deferred``,
        and those of them the app's running plan owns."""
        assert self.partition is not None and self.node_layout is not None
        gpu = self.node.gpu
        want = [i for i in desired.instances if i.slot in set(deferred)]
        apps_at: dict[tuple[int, int], set[str]] = {}  # a shared MIG instance may hold several apps
        for i in self.node_layout.instances:
            apps_at.setdefault((i.gpu, i.start), set()).add(i.app)
        blockers = {(e.gpu, e.start) for e in self.partition.existing.values()
                    if any(overlaps(gpu, w, e) for w in want)}
        owned = set(placements(old.plan.layout).values()) if old.plan.layout is not None else set()
        own = {b for b in blockers if apps_at.get(b) == {app} and b in owned}
        return blockers, own

    async def _drain_first(self, app: str, old: Generation, desired: NodeLayout,
                           deferred: Deferred, wait_s: float,
                           phases: Counter[str] | None = None) -> Generation:
        """No free slots for some new instances: drain the app's instances in their way first while
        its other processes (and every other app) serve on, then destroy those and create the new
        ones. Returns the generation now serving (the old one less the drained instances).

        Raises ``DrainRefused`` (nothing changed) when it cannot be done safely; any other failure
        before the switch to the interim generation leaves the running one serving, one after it
        leaves the interim one serving (the caller restores the running plan)."""
        assert self.partition is not None and self.node_layout is not None
        mine = {(i.gpu, i.start): i for i in self.node_layout.instances}
        blockers, own = self._blockers(app, old, desired, deferred)
        strangers = [mine[b].name if b in mine else f"gpu{b[0]}/start{b[1]}" for b in blockers - own]
        if strangers:
            raise DrainRefused(f"the slots are held by instances the app's running plan does not own "
                               f"({', '.join(sorted(strangers))}; a draining generation?)")
        wanted = sum(1 for i in desired.instances if i.slot in set(deferred))
        mid_plan = without_instances(old.plan, blockers)
        if mid_plan is not None:
            self.log(f"{app}: {wanted} new MIG instances need the slots of {len(blockers)} running ones: "
                     "draining those first while the rest serves")
            return await self._drain_step(app, old, mid_plan, blockers, self.node_layout, desired, wait_s,
                                          Counter() if phases is None else phases)
        raise DrainRefused(f"the app would have no lane left to serve while the {len(blockers)} "
                           "instances in the way of the new ones drain")

    async def _drain_step(self, app: str, old: Generation, mid_plan: Plan, drained: set[Slot],
                          layout: NodeLayout, desired: NodeLayout, wait_s: float,
                          phases: Counter[str]) -> Generation:
        """The drain of a drain-first: switch the app to ``mid_plan`` (on ``layout``: the node's
        instances with those it runs on), drain ``old`` (briefly: ``_retire``'s ``first``), destroy
        the ``drained`` instances and create every instance of ``desired``. Returns ``mid_plan``'s
        generation. ``phases`` gets the seconds of the interim generation's start (``spawn``,
        ``ready``), of the drain (``drain_first``) and of the MIG changes (``mig``)."""
        assert self.partition is not None
        router = self._router()
        mid = self._lay_out(old.app, mid_plan)
        mid.adopt(old, kept_processes(old, mid))
        try:
            await self._launch(mid, layout, router, phases=phases)
        except Exception as exc:
            await self._abandon(mid)
            raise JigsawError(f"the processes serving while the instances drain did not start: {exc}") \
                from None
        router.route(app, mid.gid)
        self.current[app] = mid.gid
        self.node_layout = layout.with_instances(i for i in layout.instances
                                                 if (i.gpu, i.start) not in drained)
        # drained (briefly: see ``_retire``'s ``first``), stopped, its segments unlinked; MPS
        # daemons stopped. Older generations still draining on the drained instances (a re-plan
        # within their drain kept their processes) are waited for as long and then cut: the
        # processes go back to them at this retirement, and they held the slots until their own
        # drain's end (tens of seconds in a spike), so the new instances could not be made, the
        # drain-first failed and the running plan was rolled back.
        t_drain = time.monotonic()
        older = self._drains_on(drained)
        try:
            await self._retire(old.gid, first_wait_s=wait_s, also=older)
            if older and not await self._end_drains(app, older):
                raise JigsawError(f"the drains of generation(s) {older} on the drained instances did not end")
        finally:
            phases["drain_first"] += time.monotonic() - t_drain
        keep = self.in_use_layout()
        assert keep is not None
        t_mig = time.monotonic()
        try:
            await asyncio.to_thread(self.partition.tear_down, keep, f"{app}: drained for the new instances")
            left = await asyncio.to_thread(self.partition.bring_up, desired, f"{app}: re-plan")
        except JigsawError as exc:
            raise JigsawError(f"MIG reconfiguration failed after the drain: {exc}") from None
        finally:
            phases["mig"] += time.monotonic() - t_mig
        if left:
            raise JigsawError(f"MIG slots {sorted(left)} still held after the drain")
        return mid

    async def _restore(self, app: str, before: tuple[Plan, NodeLayout], old_gid: int, error: str) -> Applied:
        """A re-plan failed after its drain-first drained and destroyed instances of the running
        plan: re-create those MIG instances on their slots (the new plan's go first), restart their
        processes (MPS daemons first) beside the interim generation's, wait until they are ready and
        route the app back to the running plan. If that fails too, what it made is undone and the
        interim generation serves on (said in the log, the history and ``/metrics``)."""
        assert self.partition is not None
        plan, layout = before
        router = self._router()
        mid = self.generations[self.current[app]]
        target = self.in_use_layout()
        assert target is not None
        held = {i.slot: i for i in target.instances}
        held.update({i.slot: i for i in layout.instances})
        target = target.with_instances(held.values())
        back: Generation | None = None
        try:
            await asyncio.to_thread(self.partition.tear_down, target, f"{app}: restoring the running plan")
            missing = sorted(i.name for i in layout.instances if i.device_slot not in self.partition.existing)
            if missing:
                raise JigsawError(f"MIG instances {', '.join(missing)} could not be created again")
            layout = self.partition.with_uuids(layout)
            back = self._lay_out(mid.app, plan)
            back.adopt(mid, kept_processes(mid, back))
            await self._launch(back, layout, router)
        except Exception as exc:
            if back is not None:
                await self._abandon(back)
            await self._release_mig(f"{app}: restoring the running plan failed")
            self.drain_first_total["restore_failed"] += 1
            why = (f"{error}; RESTORING THE RUNNING PLAN FAILED TOO ({exc}): the interim plan of "
                   f"generation {mid.gid} serves on, short of the drained instances, until the next re-plan")
            self.log(f"{app}: {why}")
            return Applied(mid.gid, old_gid, mid.gid != old_gid, error=why, restored=False)
        router.route(app, back.gid)
        self.current[app] = back.gid
        self.node_layout = layout
        self._retire_later(mid.gid)  # every process of it is kept: it only drops its wiring
        self.drain_first_total["restored"] += 1
        started = len(back.own())
        self.processes_started_total += started
        why = (f"{error}; rolled back: the running plan serves again (generation {back.gid}: "
               f"{started} processes restarted on re-created MIG instances)")
        self.log(f"{app}: {why}")
        return Applied(back.gid, old_gid, True, changed_gpus=tuple(sorted({i.gpu for i in layout.instances})),
                       processes=len(back.topology.processes), error=why, kept=len(back.adopted),
                       started=started, restored=True)
