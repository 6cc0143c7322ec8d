"""The generation manager as the supervisor's fault sink (``supervisor.FaultSink``): a worker's
death, restart, recovery or give-up is forwarded to the data plane (its requests settled, the
door's limits refreshed) and a lost capacity to whoever re-plans."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from jigsaw.runtime.topology import ProcessSpec

if TYPE_CHECKING:
    from jigsaw.runtime.applied import Router


class WorkerFaults:
    """What the supervisor reports, forwarded (a base of ``GenerationManager``)."""

    router: Router | None
    on_capacity_lost: Callable[[str, str], None] | None
    log: Callable[[str], None]

    def worker_failed(self, generation: int, spec: ProcessSpec, reason: str,
                      suspects: frozenset[int] = frozenset()) -> tuple[int, int]:
        """A worker died or hung: the router settles its requests (``suspects``: those of the batch
        that crashed it, answered, not re-sent); returns (retried, failed)."""
        if self.router is None:
            return 0, 0
        return self.router.worker_failed(generation, spec.app, spec.task, spec.variant, reason, suspects)

    def worker_restarting(self, spec: ProcessSpec) -> None:
        if self.router is not None:
            self.router.worker_restarting(spec.app, spec.task)

    def worker_restored(self, spec: ProcessSpec) -> None:
        if self.router is not None:
            self.router.refresh_admission(spec.app)

    def worker_given_up(self, spec: ProcessSpec) -> None:
        if self.router is not None:
            self.router.worker_given_up(spec.app, spec.task)

    def capacity_lost(self, app: str, why: str) -> None:
        if self.on_capacity_lost is not None:
            self.on_capacity_lost(app, why)
        else:
            self.log(f"{app}: capacity lost ({why}) and no controller to re-plan (static plan)")
