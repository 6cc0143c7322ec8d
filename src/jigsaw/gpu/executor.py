"""Applies a ``ReconfigPlan``: NVML for MIG instances, the MPS manager, and the caller's workers.

The executor owns the order and the undo; the caller owns processes and routing, through the
``Workers`` callbacks (start k processes with an environment, wait until they are warm, route
to a set of instances, drain one, stop one). Every completed step pushes its inverse; when a
step fails (NVML, MPS, or a callback), its own partial effect is cleaned up, then the inverses
run newest first, so the node is back on the running layout and keeps serving: new MIG
instances destroyed, drained ones restarted, routing restored. Each reconfiguration is recorded
(``record`` callback, for ``/admin/history``), logged, and counted (``ReconfigStats``, for
``/metrics``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from jigsaw.errors import JigsawError
from jigsaw.gpu.diff import Action, ReconfigPlan, Step, diff
from jigsaw.gpu.layout import NodeInstance, NodeLayout, Slot, Workload, validate_node_layout
from jigsaw.gpu.mps import MpsManager
from jigsaw.gpu.nvml import MigApplier
from jigsaw.mig import GpuModel

log = logging.getLogger("jigsaw.reconfig")


class ReconfigError(JigsawError):
    """A reconfiguration that cannot even start (its desired layout breaks the rules)."""


class Workers(Protocol):
    """What the daemon supplies: the processes and the routing of the node's instances."""

    async def start(self, inst: NodeInstance, env: Mapping[str, str]) -> tuple[int, ...]:
        """Starts ``inst.mps`` worker processes of ``inst`` with ``env`` added
        (``CUDA_VISIBLE_DEVICES`` and, for k > 1, the MPS pipe/log directories); their pids."""
        ...

    async def wait_warm(self, inst: NodeInstance) -> None:
        """Returns once every process of ``inst`` is ready (engines loaded, first batch run)."""
        ...

    async def route(self, active: NodeLayout) -> None:
        """From now on requests go only to ``active``'s instances, with the weights of their plans.

        Called with the final desired layout, and before instances in the way are drained with
        an interim set (the running instances less those, plus new instances already warm), so
        it may mix instances of the old and the new plan. Instances with ``app == ""`` are idle
        (no processes): they get no traffic."""
        ...

    async def drain(self, inst: NodeInstance) -> None:
        """Returns when ``inst`` (already unrouted) has answered everything it holds."""
        ...

    async def stop(self, inst: NodeInstance) -> None:
        """Stops ``inst``'s processes (idempotent: also after a partial ``start``)."""
        ...


@dataclass
class ReconfigStats:
    """Counters of the node's reconfigurations, for ``/metrics``."""

    reconfigs_total: int = 0
    failures_total: Counter[str] = field(default_factory=Counter)  # by failed action
    rollbacks_total: int = 0
    rollback_failures_total: int = 0
    instances_kept_total: int = 0
    instances_started_total: int = 0
    instances_stopped_total: int = 0
    last_switch_s: float = 0.0

    def prometheus(self) -> str:
        """The counters in Prometheus text format (``jigsaw_reconfig_*``)."""
        rows = [
            (
                "jigsaw_reconfigurations_total",
                "counter",
                "node reconfigurations applied or rolled back",
                [("", self.reconfigs_total)],
            ),
            (
                "jigsaw_reconfiguration_failures_total",
                "counter",
                "reconfigurations that failed, by step",
                [(f'{{step="{k}"}}', v) for k, v in sorted(self.failures_total.items())] or [("", 0)],
            ),
            (
                "jigsaw_reconfiguration_rollbacks_total",
                "counter",
                "failed reconfigurations rolled back",
                [("", self.rollbacks_total)],
            ),
            (
                "jigsaw_reconfiguration_rollback_failures_total",
                "counter",
                "rollbacks that could not restore everything",
                [("", self.rollback_failures_total)],
            ),
            (
                "jigsaw_reconfiguration_instances_total",
                "counter",
                "instances kept, started or stopped",
                [
                    ('{what="kept"}', self.instances_kept_total),
                    ('{what="started"}', self.instances_started_total),
                    ('{what="stopped"}', self.instances_stopped_total),
                ],
            ),
            (
                "jigsaw_reconfiguration_switch_seconds",
                "gauge",
                "time from plan decided to routing switched, last reconfiguration",
                [("", self.last_switch_s)],
            ),
        ]
        out = []
        for name, kind, help_, samples in rows:
            out += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
            out += [f"{name}{labels} {value:g}" for labels, value in samples]
        return "\n".join(out) + "\n"


@dataclass(frozen=True)
class ReconfigResult:
    ok: bool
    running: NodeLayout  # the layout in effect now: the desired one, or the old one restored
    plan: ReconfigPlan
    error: str = ""
    failed_step: str = ""
    rollback_errors: tuple[str, ...] = ()
    switch_s: float = 0.0  # plan decided -> routing switched (0 when it never switched)
    total_s: float = 0.0
    steps_done: tuple[str, ...] = ()


Undo = Callable[[], Awaitable[None]]


class Reconfigurer:
    """Takes the node from its running layout to a desired one (see ``diff``), safely."""

    def __init__(
        self,
        gpu: GpuModel,
        mig: MigApplier,
        mps: MpsManager,
        workers: Workers,
        record: Callable[[dict[str, Any]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        step_timeout_s: float = 300.0,
    ) -> None:
        self.gpu = gpu
        self.step_timeout_s = step_timeout_s  # a worker callback running longer has failed
        self.mig = mig
        self.mps = mps
        self.workers = workers
        self.record = record or (lambda event: None)
        self.clock = clock
        self.stats = ReconfigStats()
        self._lock = asyncio.Lock()

    async def apply(
        self, running: NodeLayout, desired: NodeLayout, decided_at: float | None = None, reason: str = ""
    ) -> ReconfigResult:
        """Diffs and applies; never raises for a failed step (the result says what happened).

        Raises ``ReconfigError`` only for a desired layout that breaks the placement rules.
        """
        problems = validate_node_layout(desired, self.gpu)
        if problems:
            raise ReconfigError(f"desired node layout is invalid: {'; '.join(problems)}")
        async with self._lock:
            plan = diff(running, desired, self.gpu)
            return await self.execute(plan, decided_at=decided_at, reason=reason)

    async def execute(
        self, plan: ReconfigPlan, decided_at: float | None = None, reason: str = ""
    ) -> ReconfigResult:
        t0 = self.clock()
        decided = t0 if decided_at is None else decided_at
        run = _Run(self, plan)
        done: list[str] = []
        switch_s = 0.0
        failed: Step | None = None
        error = ""
        final_route = next((s for s in reversed(plan.steps) if s.action is Action.ROUTE), None)
        for step in plan.steps:
            try:
                await run.do(step)
            except Exception as exc:  # any failure of NVML, MPS or a callback rolls back
                failed, error = step, f"{step.describe()}: {exc}"
                break
            done.append(step.describe())
            if step is final_route:
                switch_s = self.clock() - decided
        self.stats.reconfigs_total += 1
        summary = plan.summary()
        event: dict[str, Any] = {
            "event": "reconfiguration",
            "reason": reason,
            **summary,
            "changed_gpus": list(plan.changed_gpus),
            "nvml_gpus": list(plan.nvml_gpus),
            "steps": done,
        }
        if failed is None:
            self.stats.instances_kept_total += summary["kept"]
            self.stats.instances_started_total += summary["started"]
            self.stats.instances_stopped_total += summary["stopped"]
            self.stats.last_switch_s = switch_s
            result = ReconfigResult(
                True,
                run.layout(plan.desired),
                plan,
                switch_s=switch_s,
                total_s=self.clock() - t0,
                steps_done=tuple(done),
            )
            event.update(ok=True, switch_ms=round(switch_s * 1e3, 3), total_ms=round(result.total_s * 1e3, 3))
            log.info(
                "reconfigured: kept %d, started %d, stopped %d, routing switched after %.1f ms",
                summary["kept"],
                summary["started"],
                summary["stopped"],
                switch_s * 1e3,
            )
            self.record(event)
            return result
        self.stats.failures_total[failed.action.value] += 1
        log.error("reconfiguration failed at %s; rolling back to the running layout", error)
        rollback_errors = await run.rollback(failed)
        self.stats.rollbacks_total += 1
        if rollback_errors:
            self.stats.rollback_failures_total += 1
            log.error("rollback incomplete: %s", "; ".join(rollback_errors))
        result = ReconfigResult(
            False,
            run.layout(plan.running),
            plan,
            error=error,
            failed_step=failed.action.value,
            rollback_errors=tuple(rollback_errors),
            total_s=self.clock() - t0,
            steps_done=tuple(done),
        )
        event.update(
            ok=False,
            error=error,
            failed_step=failed.action.value,
            rolled_back=True,
            rollback_errors=list(rollback_errors),
            total_ms=round(result.total_s * 1e3, 3),
        )
        self.record(event)
        return result


class _Run:
    """The state of one execution: which version of each instance is live, and the undo stack."""

    def __init__(self, ex: Reconfigurer, plan: ReconfigPlan) -> None:
        self.ex = ex
        self.plan = plan
        self.live: dict[tuple[Slot, Workload], NodeInstance] = {
            (i.slot, i.workload): i for i in plan.running.instances
        }
        self.routed: NodeLayout = plan.running
        self.undo: list[tuple[str, Undo]] = []

    def cur(self, inst: NodeInstance) -> NodeInstance:
        return self.live.get((inst.slot, inst.workload), inst)

    def put(self, inst: NodeInstance) -> None:
        self.live[(inst.slot, inst.workload)] = inst

    def layout(self, target: NodeLayout) -> NodeLayout:
        return target.with_instances(self.cur(i) for i in target.instances)

    async def call(self, what: str, inst: NodeInstance | None, coro: Awaitable[Any]) -> Any:
        """A worker callback, bounded by the step timeout (NVML and MPS calls are not cancelled:
        a thread cannot be, and what they create must be known to be undone)."""
        try:
            return await asyncio.wait_for(coro, timeout=self.ex.step_timeout_s)
        except TimeoutError:
            name = inst.name if inst is not None else "the node"
            raise ReconfigError(
                f"{what} of {name} did not finish within {self.ex.step_timeout_s:g} s"
            ) from None

    def env(self, inst: NodeInstance) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": inst.uuid, **self.ex.mps.client_env(inst)}

    async def _start(self, inst: NodeInstance) -> None:
        inst = self.cur(inst)
        try:
            pids = await self.call("start", inst, self.ex.workers.start(inst, self.env(inst)))
        except BaseException:
            await self.call("stop", inst, self.ex.workers.stop(inst))  # whatever part of it did start
            raise
        self.put(dataclasses.replace(inst, pids=tuple(pids)))

    async def _stop(self, inst: NodeInstance) -> None:
        inst = self.cur(inst)
        await self.call("stop", inst, self.ex.workers.stop(inst))
        self.put(dataclasses.replace(inst, pids=()))

    async def _create(self, inst: NodeInstance) -> None:
        made = await asyncio.to_thread(self.ex.mig.create, self.cur(inst))
        self.put(dataclasses.replace(self.cur(inst), uuid=made.uuid))

    async def _destroy(self, inst: NodeInstance) -> None:
        await asyncio.to_thread(self.ex.mig.destroy, self.cur(inst))

    async def _route(self, active: NodeLayout) -> None:
        resolved = self.layout(active)
        await self.call("route", None, self.ex.workers.route(resolved))
        self.routed = active

    async def do(self, step: Step) -> None:
        a, inst = step.action, step.instance
        ex = self.ex
        if a is Action.ROUTE:
            assert step.active is not None
            before = self.routed
            await self._route(step.active)
            self.undo.append(("route back", lambda: self._route(before)))
            return
        assert inst is not None
        if a is Action.CREATE_MIG:
            await self._create(inst)
            self.undo.append((f"destroy {inst.name}", lambda: self._destroy(inst)))
        elif a is Action.START_MPS:
            await asyncio.to_thread(ex.mps.start, self.cur(inst))
            self.undo.append(
                (f"stop MPS of {inst.name}", lambda: asyncio.to_thread(ex.mps.stop, self.cur(inst)))
            )
        elif a is Action.START_PROCESSES:
            await self._start(inst)
            self.undo.append((f"stop {inst.name}", lambda: self._stop(inst)))
        elif a is Action.WAIT_WARM:
            await self.call("wait_warm", inst, ex.workers.wait_warm(self.cur(inst)))
        elif a is Action.DRAIN:
            await self.call("drain", inst, ex.workers.drain(self.cur(inst)))
        elif a is Action.STOP_PROCESSES:
            await self._stop(inst)

            async def restart(inst: NodeInstance = inst) -> None:
                await self._start(inst)
                await self.call("wait_warm", inst, ex.workers.wait_warm(self.cur(inst)))

            self.undo.append((f"restart {inst.name}", restart))
        elif a is Action.STOP_MPS:
            await asyncio.to_thread(ex.mps.stop, self.cur(inst))
            self.undo.append(
                (f"restart MPS of {inst.name}", lambda: asyncio.to_thread(ex.mps.start, self.cur(inst)))
            )
        elif a is Action.DESTROY_MIG:
            await self._destroy(inst)
            self.undo.append((f"recreate {inst.name}", lambda: self._create(inst)))
        else:  # pragma: no cover - every Action is handled above
            raise AssertionError(a)

    async def rollback(self, failed: Step) -> list[str]:
        """Cleans up the failed step's partial effect, then runs the inverses newest first."""
        errors: list[str] = []
        if failed.action is Action.ROUTE:  # a routing switch that failed half-way: the last good one
            self.undo.append(("route back", lambda before=self.routed: self._route(before)))
        while self.undo:
            what, fn = self.undo.pop()
            try:
                await fn()
            except Exception as exc:
                errors.append(f"{what}: {exc}")
        return errors


def make_reconfigurer(
    node: Any,
    workers: Workers,
    *,
    emulate: bool,
    record: Callable[[dict[str, Any]], None] | None = None,
    run_dir: Any = None,
    nvml: Any = None,
) -> Reconfigurer:
    """The node's reconfigurer: real NVML and MPS on a GPU node; the emulated NVML and MPS (same
    calls, same order, in memory) on an emulated one, so a replay runs the real sequence."""
    from jigsaw.gpu.emulated_nvml import EmulatedNvml
    from jigsaw.gpu.mps import EmulatedMps

    if emulate:
        mig = MigApplier(node.gpu, nvml or EmulatedNvml(node.gpu, node.num_gpus))
        mps: MpsManager = EmulatedMps(run_dir)
    else:
        mig = MigApplier(node.gpu, nvml)
        mps = MpsManager(run_dir)
    return Reconfigurer(node.gpu, mig, mps, workers, record=record)
