"""What one plan of a re-plan did to the node, as its record says: deployed (some app moved to it:
a new generation, or the running one re-weighted for the new plan) or kept (every app's running
plan serves on), with why for each app that kept its own.

Why a record of its own: a plan that the making-room policy turned down ("no drain-first,
nothing changed") or that only pushed each app its running plan again changed nothing, and
counted as deployed it inflated the re-plans deployed and the decision-to-deployment figures
the benches print (a kept plan's seconds are its decision, no deployment)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jigsaw.runtime.applied import Applied, Refuse, RoomStep

SAME_PLAN = "its running plan holds the demand and is as good (pushed again: a no-op)"


@dataclass
class Pushed:
    """The outcome of pushing a node plan's parts (``NodeController._deploy``): the apps the
    deployment policy kept on their running plan (``settle``, ``short_of_gain``), those the
    making-room policy refused, those that moved to the new plan, and why each other app did not."""

    kept: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    why_kept: dict[str, str] = field(default_factory=dict)

    def note(self, app: str, done: Applied | None, last: RoomStep | None, same_plan: bool) -> None:
        """Record what pushing ``app``'s part did (``done``: the transition's result, None when
        the runtime could not lay it out; ``last``: the step that ended it; ``same_plan``: its
        running plan pushed again)."""
        why = unchanged_why(done, last, same_plan)
        if why is None:
            self.changed.append(app)
        else:
            self.why_kept[app] = why
        if isinstance(last, Refuse):
            self.refused.append(app)


def unchanged_why(done: Applied | None, last: RoomStep | None, same_plan: bool) -> str | None:
    """Why the app's running plan serves on after its push, or None when the app moved to the new
    plan (a new generation, or its running one re-weighted for a plan that differs)."""
    if done is None:
        return "the runtime could not lay the plan out"
    if done.error is not None:
        return done.error
    if isinstance(last, Refuse):
        return done.note or f"refused: {last.why}"
    if done.note is not None:  # a step that keeps the running plan (``KeepRunning``)
        return done.note
    if done.new_generation:
        return None
    return SAME_PLAN if same_plan else None


def mark(summary: dict[str, Any], pushed: Pushed, elapsed_s: float, phases_s: dict[str, float]) -> bool:
    """Stamp a plan's record (``summary``, already marked deployed) with what its push did:
    deployed, with the seconds from the re-plan's decision to its deployment and where the
    transitions' part went; or kept (``deployed`` False, ``outcome`` "kept"), with the seconds
    to that decision. Every app that kept its running plan is named with why. Returns whether
    the plan was deployed."""
    if pushed.why_kept:
        summary["why_kept"] = dict(pushed.why_kept)
    if pushed.changed:
        summary["outcome"] = "deployed"
        summary["deployed_after_s"] = round(elapsed_s, 4)
        summary["phases_s"] = {k: round(v, 4) for k, v in phases_s.items()}
        return True
    summary.update(deployed=False, outcome="kept", decided_after_s=round(elapsed_s, 4))
    return False
