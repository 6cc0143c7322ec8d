"""What crosses between whoever decides a plan and the generation manager that applies it: the
desired state of an app, what applying it did, the data plane's interface (``Router``) and the
refusals. Plain data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from jigsaw.errors import JigsawError
from jigsaw.plan import Plan
from jigsaw.runtime.topology import Topology

if TYPE_CHECKING:
    from jigsaw.gpu.layout import NodeLayout
    from jigsaw.runtime.placement import Beside


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
class Placed:
    """Where the decider placed a plan beside everything that runs and drains (``Beside.place``:
    the node layout with the plan on it) and the node it saw then (``seen``): the manager takes
    the placement as it is while its node is still the one seen, and places the plan again only
    where it changed meanwhile, so a plan is placed once."""

    seen: Beside
    layout: NodeLayout


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
    # placed beside everything that runs and drains where it fits so (``Beside.place``: the running
    # instances kept, the others on slots nothing holds), else as any plan: a needed plan, which
    # should not wait for a drain or drain the app's own instances
    beside: bool = False
    # with ``beside``: placed beside what serves only, on slots that drain where it needs them
    # (``Beside.serving_only``): it waits for those drains, never drains a running instance
    over_draining: bool = False
    # with ``beside``: where the decider placed it (``plan`` laid out so), taken as it is while
    # the node is still the one it saw
    placed: Placed | None = None


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
    # where the wall seconds of the transition went, by phase (``PHASES``), in the order first met
    phases_s: tuple[tuple[str, float], ...] = ()


# the phases of a transition ``Applied.phases_s`` names: placing the plan, creating and destroying
# MIG instances, waiting for (and cutting) the drains in the way, a drain-first's drain (its
# interim generation's start counted as spawn and ready, its MIG changes as mig), MPS daemons,
# segments and new processes started, the wait until every process is ready, and the restore of
# the running plan after a drain-first that failed
PHASES = ("place", "mig", "drains", "drain_first", "spawn", "ready", "restore")


READY_TIMEOUT_S = 120.0  # a new generation's processes are all ready within this, or it failed
Slot = tuple[int, int]
# new MIG instances (GPU, start, profile) whose slots something holds
Deferred = tuple[tuple[int, int, str], ...]


class DrainRefused(JigsawError):
    """A drain-first re-plan that cannot be made safely (nothing was changed): the app would have
    no lane while the instances in the way drain, or their slots are not the app's own."""


# ---- making room: what the manager sees, and the steps it executes --------------------------


@dataclass(frozen=True)
class RoomSnapshot:
    """What the generation manager sees of one app's transition to a new plan: what holds the new
    MIG instances' slots, where the wait for drains stands, and how the running plan copes. Plain
    data: the policy that picks the next step (``control/transition.py``) is a pure function of
    it and of what the controller knows (the demand, the rate now arriving)."""

    app: str
    running_gid: int
    deferred: int  # the new MIG instances whose slots something holds (0: nothing in the way)
    own_in_way: int  # the app's running instances in their way (a drain-first frees them)
    others_in_way: int  # draining generations' or retired ones' instances in their way
    lane_without_own: bool  # the running plan less its instances in the way still has a lane
    drains_in_way: int  # draining generations that hold some of those slots
    drains_settled: bool  # every request they hold is answered, or their deadline has passed
    waiting: bool  # the transition polls the drains in its way (``WaitForDrains`` executed)
    waited: bool  # it ended that wait (``CutDrains`` executed)
    queued_s: float | None  # the running plan's queue, wall seconds (None: unknown)
    drain_budget_s: float  # the longest a request of the app may take, wall seconds
    running_planned_rps: float
    max_utilization: float  # planner.max_utilization: the running plan run hot serves rps / this
    new_planned_rps: float
    new_demand_rps: float  # what the new plan was asked for (above its planned rate: capped)


@dataclass(frozen=True)
class KeepRunning:
    """Change nothing: the running plan serves on (``outcome`` counted, ``why`` said); the MIG
    instances brought up for the new plan go."""

    outcome: str
    why: str
    headroom_rps: float | None = None  # kept out by the headroom rule at this rate


@dataclass(frozen=True)
class Refuse:
    """Change nothing and say why the plan cannot be applied (no lane left while the app's
    instances in the way would drain, slots another generation holds): the decider picks another
    plan."""

    why: str


@dataclass(frozen=True)
class WaitForDrains:
    """Wait one poll for the drains in the new instances' way, then look again."""

    note: str = ""


@dataclass(frozen=True)
class CutDrains:
    """End the drains in the new instances' way (what they still hold settled: late credits
    forgotten, unanswered requests sent again or failed), free their slots and the slots of
    retired instances, and bring up the new instances there."""


@dataclass(frozen=True)
class DrainFirst:
    """Drain the app's running instances in the way (waiting ``wait_s`` for their requests, the
    rest sent again) while the rest of the running plan serves, then bring up the new instances."""

    wait_s: float
    note: str = ""


@dataclass(frozen=True)
class TakeSlots:
    """Nothing is in the way: the new plan's generation starts and the app switches to it."""


RoomStep = KeepRunning | Refuse | WaitForDrains | CutDrains | DrainFirst | TakeSlots


class Transition(Protocol):
    """One app's transition to a new plan, in progress (``GenerationManager.transition``): the
    snapshot to decide on, and ``done`` once a step ended it."""

    @property
    def snapshot(self) -> RoomSnapshot: ...
    @property
    def done(self) -> Applied | None: ...
    async def execute(self, step: RoomStep) -> None: ...
