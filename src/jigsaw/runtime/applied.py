"""What crosses between whoever decides a plan and the generation manager that applies it: the
desired state of an app, what applying it did, the data plane's interface (``Router``) and the
refusals. Plain data."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from jigsaw.errors import JigsawError
from jigsaw.plan import Plan
from jigsaw.runtime.topology import Topology


class Router(Protocol):
    """What the manager pushes to the data plane (the frontend implements it)."""

    def add_generation(self, generation: int, topology: Topology) -> None: ...
    def route(self, app: str, generation: int) -> None: ...
    def unroute(self, app: str) -> None: ...
    def reweight(self, app: str, plan: Plan) -> None: ...
    def pending_in(self, generation: int) -> int: ...
    def unanswered_in(self, generation: int) -> int: ...
    def queued_end_s(self, app: str) -> float | None: ...
    def cut_generation(self, generation: int) -> tuple[int, int, int]: ...
    def remove_generation(self, generation: int) -> None: ...
    def worker_failed(self, generation: int, app: str, task: str, variant: str,
                      reason: str, suspects: frozenset[int] = frozenset()) -> tuple[int, int]: ...
    def worker_restarting(self, app: str, task: str) -> None: ...
    def worker_given_up(self, app: str, task: str) -> None: ...
    def refresh_admission(self, app: str) -> None: ...


@dataclass(frozen=True)
class DesiredState:
    """What an app should run: a plan, and how long a MIG repartition of its GPUs takes (s)."""

    app: str
    plan: Plan
    repartition_delay_s: float = 0.0
    # new processes even when the plan runs the same instances: after a worker was given up its
    # process may have come back by the time the plan is ready, but the capacity-loss re-plan
    # still replaces it (the supervisor's retry is a stopgap, not a recovery)
    fresh_generation: bool = False
    # the running plan holds the demand this plan is for: it is a better plan, not a needed one, so
    # it is not worth a drain-first, nor a wait for the drains in its way
    running_holds: bool = False
    # placed beside everything that runs and drains where it fits so (``Beside.place``: the running
    # instances kept, the others on slots nothing holds), else as any plan: a needed plan, which
    # should not wait for a drain or drain the app's own instances
    beside: bool = False
    # with ``beside``: placed beside what serves only, on slots that drain where it needs them
    # (``Beside.serving_only``): it waits for those drains, never drains a running instance
    over_draining: bool = False
    # for a needed plan: asked again before a drain-first of the app's running instances (after
    # any wait for the drains in the way), whether the plan is still needed; False keeps the
    # running plan. None: needed whatever happens
    still_needed: Callable[[], bool] | None = None
    # for a needed plan that waits for the drains in its way: asked at each poll of the wait; True
    # (the rate now arriving is well above the demand this plan was asked for) ends the wait and
    # changes nothing, so the node's re-plan lock is free for a plan sized to that rate
    # None: never asked
    outgrown: Callable[[], bool] | None = None


@dataclass(frozen=True)
class Applied:
    """What ``apply`` did: the generation serving now, and whether it is a new one."""

    generation: int
    previous: int
    new_generation: bool  # False: re-weighted in place, or the new generation failed (``error``)
    seconds: float = 0.0  # plan decided (``apply`` called) -> routing switched
    changed_gpus: tuple[int, ...] = ()
    processes: int = 0
    error: str | None = None
    kept: int = 0  # processes of the old generation the new one serves with (same pids)
    started: int = 0  # processes started for it (the changed instances')
    stopped: int = 0  # processes of the old generation stopped once it drained
    # a re-plan that failed after its drain-first drained instances: True when the running plan
    # was brought back (its drained instances re-created and their processes restarted), False when
    # that failed too (the interim generation serves on); None when no restore was needed
    restored: bool | None = None
    # why the running plan serves on although nothing failed (a drain-first not worth making)
    note: str | None = None
    # the plan was refused before anything changed (``DrainRefused``: a drain-first would leave the
    # app no lane, or the slots in its way are not the app's own): a plan that keeps the running
    # instances may still be applied
    refused: bool = False


READY_TIMEOUT_S = 120.0  # a new generation's processes are all ready within this, or it failed
Slot = tuple[int, int]
# new MIG instances (GPU, start, profile) whose slots something holds
Deferred = tuple[tuple[int, int, str], ...]


class WaitOutgrown(Exception):
    """A needed plan's wait for the drains in its way ended because the arrivals outgrew the plan
    (``DesiredState.outgrown``): nothing was cut or changed."""


class DrainRefused(JigsawError):
    """A drain-first re-plan that cannot be made safely (nothing was changed): the app would have
    no lane while the instances in the way drain, or their slots are not the app's own."""


# ---- making room: what the manager sees, and the steps a policy picks -------------------------


@dataclass(frozen=True)
class RoomSnapshot:
    """What the generation manager sees when a new plan's MIG instances need slots that something
    holds: the app's running plan, what is in the way, and how the running plan copes. Plain data,
    so the policy that decides on it (``RoomPolicy``) is a pure function of it."""

    app: str
    running_gid: int
    needed: bool  # the running plan does not hold the demand the new plan is for
    waited: bool  # the new plan already waited for the drains in its way
    deferred: int  # the new MIG instances whose slots something holds
    own_in_way: int  # the app's running instances in their way (a drain-first frees them)
    others_in_way: int  # draining generations' or retired ones' instances in their way
    lane_without_own: bool  # the running plan less its instances in the way still has a lane
    queued_s: float | None  # the running plan's queue, wall seconds (None: unknown)
    drain_budget_s: float  # the longest a request of the app may take, wall seconds
    running_planned_rps: float
    max_utilization: float  # planner.max_utilization: the running plan run hot serves rps / this
    new_planned_rps: float
    new_demand_rps: float  # what the new plan was asked for (above its planned rate: capped)
    headroom_least_rps: float | None  # the least plan the headroom rule kept out over this generation


@dataclass(frozen=True)
class KeepRunning:
    """Change nothing: the running plan serves on (``outcome`` counted, ``why`` said)."""

    outcome: str
    why: str
    headroom_rps: float | None = None  # kept out by the headroom rule at this rate


@dataclass(frozen=True)
class Refuse:
    """Refuse the plan before anything changed (``Applied.refused``)."""

    why: str


@dataclass(frozen=True)
class WaitForDrains:
    """Wait for the drains in the new instances' way to end, then take their slots."""

    note: str = ""


@dataclass(frozen=True)
class DrainFirst:
    """Drain the app's running instances in the way (waiting ``wait_s`` for their requests, the
    rest sent again), while the rest of the running plan serves; then the new plan."""

    wait_s: float
    note: str = ""


@dataclass(frozen=True)
class TakeSlots:
    """Nothing is in the way: the new plan's generation starts."""


RoomStep = KeepRunning | Refuse | WaitForDrains | DrainFirst | TakeSlots


class RoomPolicy(Protocol):
    """Decides the next step of making room from a snapshot (``control/transition.py``); pure."""

    def decide(self, snapshot: RoomSnapshot) -> RoomStep: ...
