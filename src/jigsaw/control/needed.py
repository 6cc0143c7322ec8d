"""The node controller's plans for an app that needs more than its running plan holds, executed as
the deployment policy decides (``deployment.for_needed``, ``trim_frees``): placed beside
everything that runs and drains (the placement made here, once, and handed over as ``Placed``),
or the running plan extended in place (over slots that only drain, when those hold the free
ones); what the making-room policy reads of such a plan while it moves (``_need_reader``: whether
the rate still needs it, whether the arrivals outgrew it); and the give-back of a running plan the
demand no longer needs (``trim``). A base of ``NodeController``: its state, these executions."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from jigsaw.control.deployment import EXTEND_FIRST_MIN_GAIN, asks, for_needed, looks_beside, trim_frees
from jigsaw.control.transition import Need
from jigsaw.gpu.layout import NodeLayout
from jigsaw.node import Node
from jigsaw.plan import Plan
from jigsaw.planner.anytime import trim_plan
from jigsaw.planner.node_plan import extend_in_place
from jigsaw.runtime.applied import Applied, DesiredState, Placed, RoomStep
from jigsaw.runtime.placement import Beside

if TYPE_CHECKING:
    from jigsaw.control.controller import AppController, ControllerStats, DataPlane



class BesidePlaced(NamedTuple):
    """A plan placed beside what runs and drains: what the node looked like, the node layout with
    the plan on it, and the plan laid out (``Beside.place``)."""

    seen: Beside
    layout: NodeLayout
    plan: Plan
    over_draining: bool = False  # placed beside what serves only (``Beside.serving_only``)


class NeededPlans:
    """Needed plans, extensions in place and the give-back (a base of ``NodeController``)."""

    node: Node
    apps: dict[str, AppController]
    plane: DataPlane
    space: str
    stats: ControllerStats
    bin_index: int
    _trigger: str
    _for_bin: int | None
    _extended_first: Any
    _headroom_kept: dict[str, tuple[int, float]]
    log: Callable[[str], None]

    async def _apply(self, desired: DesiredState, source: str, need: Callable[[], Need] = ...,
                     *, record_error: bool = True) -> tuple[Applied, RoomStep | None] | None: ...
    def repartition_delay_s(self) -> float: ...

    async def _extend_in_place(self, name: str, demand_rps: float, fresh: frozenset[str], why: str,
                               beside: Beside | None = None, min_gain: float = 0.0,
                               over_draining: bool = False) -> Plan | None:
        """Push ``name``'s running plan extended in place for the largest share of ``demand_rps``
        that fits beside what runs (``node_plan.extend_in_place``; with the runtime's own check of
        the slots that run and drain, ``Beside``, where the node has a layout) when that serves
        more than the running plan, by at least ``min_gain`` of what it lacks; the plan pushed, or
        None. ``over_draining``: ``beside`` is what serves only, and the runtime places the plan
        so too (it waits for the drains in its way)."""
        c = self.apps[name]
        run = c.plan
        least_rps = run.planned_rps + min_gain * max(0.0, demand_rps - run.planned_rps)
        running = {n: a.plan for n, a in self.apps.items()}
        beside = beside if beside is not None else self.plane.beside()
        # the plans laid out (kept, so their ids stay theirs) -> the node layout each was placed on
        found: dict[int, tuple[Plan, NodeLayout]] = {}

        def fits(p: Plan) -> Plan | None:
            assert beside is not None
            got = beside.place(name, p)
            if got is None:
                return None
            found[id(got[1])] = (got[1], got[0])
            return got[1]
        p = await asyncio.to_thread(extend_in_place, c.app, self.node, self.plane.profiles, running,
                                    demand_rps, space=self.space, factors=c.measured_factors() or None,
                                    fits=None if beside is None else fits)
        if p is None or p.planned_rps <= max(run.planned_rps * (1 + 1e-9), least_rps):
            free = "" if beside is None else \
                (f" ({self.node.slices_available - beside.layout.slices_used(self.node.gpu)} slices free, "
                 f"{beside.free_memory_slots()} MIG memory slots)")
            self.log(f"{name}: {why}; no extension of the running plan that fits beside what runs "
                     f"serves enough more{free}")
            return None
        self.log(f"{name}: {why}; the running plan, kept in place, is extended for "
                 f"{p.planned_rps:.1f} of {demand_rps:.1f} rps ({p.slices_used} slices)")
        hit = found.get(id(p))
        placed = Placed(beside, hit[1]) if beside is not None and hit is not None and hit[0] is p else None
        got = await self._apply(DesiredState(
            name, p, repartition_delay_s=self.repartition_delay_s(), fresh_generation=name in fresh,
            beside=beside is not None, over_draining=over_draining, placed=placed),
            "in-place", self._need_reader(c, p, demand_rps, False))
        # re-weighted in place counts (the instances that run serve more); a skip (``note``) does not
        if got is None:
            return None
        done = got[0]
        if done.error is not None or (not done.new_generation and done.note is not None):
            return None
        return p

    def _need_reader(self, c: AppController, plan: Plan, asked_rps: float, holds: bool) -> Callable[[], Need]:
        """What the making-room policy reads of a plan of ``c``'s app pushed now, at each of its
        decisions (``transition.Need``): ``holds`` (the running plan holds the demand: the plan is
        better, not needed), and, where the deployment policy asks the rate (``deployment.asks``),
        whether it still needs the plan (``AppController.still_needed``) and whether the arrivals
        outgrew it (``AppController.outgrows``); and the least plan the headroom rule kept out."""
        if holds:
            return lambda: Need(needed=False)
        q = asks(self._trigger, self._for_bin, plan.planned_rps, asked_rps, self.node.control)

        def read() -> Need:
            still = not q.still_needed or (q.after_bin is not None and self.bin_index <= q.after_bin) \
                or c.still_needed()
            grown = q.outgrown_rps is not None and c.outgrows(q.outgrown_rps)
            rising = self._trigger == "rate" or c.in_spike()
            return Need(True, still, grown, self._headroom_kept.get(c.name), rising)
        return read

    async def _needed_beside(self, name: str, plan: Plan, demand_rps: float, fresh: frozenset[str],
                             source: str) -> tuple[BesidePlaced | None, bool]:
        """For a plan ``name`` needs: (where it goes beside what runs and drains, None: as any plan;
        whether it is not pushed at all), as the deployment policy decides (``for_needed``) from
        where it fits: the running plan extended in place at once instead (here), or serving on."""
        ctl = self.node.control
        run = self.apps[name].plan
        again = name in self._extended_first
        if not looks_beside(run, demand_rps, ctl, again):
            return None, False
        beside = self.plane.beside()
        if beside is None:  # no MIG layout to keep off
            return None, False
        got = await asyncio.to_thread(beside.place, name, plan)
        serving = beside.serving_only()
        over = await asyncio.to_thread(serving.place, name, plan) if got is None and again else None
        choice = for_needed(run, demand_rps, ctl, extended_first=again, fits_beside=got is not None,
                            fits_serving=over is not None)
        if choice.what == "beside":
            assert got is not None
            return BesidePlaced(beside, got[0], got[1]), False
        if choice.what == "over_draining":
            # a later plan of the re-plan whose running plan was extended at once: it needs only
            # draining slots, and waits for them while the extension serves
            assert over is not None
            return BesidePlaced(serving, over[0], over[1], over_draining=True), False
        if choice.what == "any":
            return None, False
        why = f"the {source} plan needs slots that run or drain"
        if choice.what == "serve_on":
            # extended at once in this re-plan already: a drain-first of that plan (or its refusal)
            # would serve the spike on less while it drains; the next re-plan asks again
            self.log(f"{name}: {why}; its running plan, extended in place in this re-plan, serves on")
            return None, True
        if await self._extend_in_place(name, demand_rps, fresh, why, beside, EXTEND_FIRST_MIN_GAIN) is None \
                and (not choice.over_draining or await self._extend_in_place(
                    name, demand_rps, fresh, f"{why}; over the slots that only drain", beside.serving_only(),
                    EXTEND_FIRST_MIN_GAIN, over_draining=True) is None):
            return None, False
        self._extended_first.append(name)
        return None, True

    async def _trim_running(self, name: str, skipped: Plan, demand_rps: float, delay: float) -> None:
        """The app's running plan held its demand and the re-plan's smaller plan was not applied
        (its MIG instances need slots the running ones hold, and no drain-first is made for a plan
        that is only better): give back the running instances the demand leaves spare instead
        (``anytime.trim_plan``: what stays runs where it runs, so every process is kept and no slot
        is waited for), when that frees at least ``control.trim_min_slices`` slices.

        Why: ar_assistant's spike plans fill the node (24-25 of 28 slices), every smaller plan
        needs some of their slots, and on day 0 such a plan served 92 of 288 bins after the
        spikes (115 re-plans not applied), 54% of the slices against the 45% target; a
        drain-first for the give-back served on part of the plan while it drained.
        """
        min_frees = self.node.control.trim_min_slices
        c = self.apps[name]
        run = c.plan
        if not trim_frees(run, skipped, min_frees):
            return
        factors = c.measured_factors() or None
        trimmed = await asyncio.to_thread(trim_plan, c.app, self.node, self.plane.profiles, run,
                                          demand_rps, space=self.space, factors=factors)
        if trimmed is None or not trim_frees(run, trimmed, min_frees):
            return
        if await self._apply(DesiredState(name, trimmed, repartition_delay_s=delay), "trimmed",
                             lambda: Need(needed=False), record_error=False) is not None:
            self.stats.trims += 1
