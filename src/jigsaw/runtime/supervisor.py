"""The daemon's worker supervisor: finds dead and hung workers, recovers their rings, restarts them.

``check`` runs on the daemon's event loop every ``POLL_S``. A worker whose process exited, or
whose heartbeat (``stats.HEARTBEAT_NS``, stamped by its event loop) is older than its hang
timeout, has failed:

(A batch runs off the worker's loop, so the heartbeat keeps coming while it computes; a batch
that runs far beyond its profile, ``batch_timeout_ns``, counts as a hang too.)

1. its stats slot is marked DEAD, so the frontend and the upstream workers route around it;
   a hung process is SIGKILLed (nothing else can vouch for what it still holds);
2. the items left in its input rings are discarded: with the consumer dead, the supervisor may
   pop them, and the ring's indexes (in shared memory) stay consistent for the next consumer;
   a record the dead process was writing as a producer was never published and does not exist;
3. it reports the failure to its ``FaultSink`` (the generation manager), whose router settles
   every request that may have had work on it (dispatched again under a new id while the deadline
   allows, else answered 503); a process a re-plan kept serves the older, draining generations
   too: their wirings of it are marked FAILED, their rings emptied and their requests settled
   the same way at once (the restarted process serves only the newest generation);
4. it is restarted on the same spec, rings, doorbell and stats slot; routing returns to it
   once it reports ready.

A crash is *the batch's* when the process ended itself while a batch ran (an exit status, or a
signal it raised: SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL...) or that batch ran past its batch
timeout; the batch's request ids are read from the process's batch record
(``stats.StatsBlock.batch_started``) and reported as its suspects: the router answers them 500
and never sends them again, and such a crash does not count toward giving the worker up (it is
restarted, capacity and plan untouched). A crash from outside the batch (SIGKILL: an operator or
the kernel's OOM killer; SIGTERM; a stopped event loop) has no suspects: its requests are sent
again, at most ``dispatch.MAX_ATTEMPTS`` times each, and it counts toward the give-up.

A worker failing more than ``server.worker_max_restarts`` times within
``server.worker_restart_window_s`` is given up (FAILED): routing skips it even while no other
process of its task is up (the frontend then answers 503 at once instead of queueing), its
capacity is lost, and ``FaultSink.capacity_lost`` has the app re-planned onto a fresh
generation. Until that generation replaces it, it is still restarted now and then (backoff from
``RETRY_BACKOFF_S``, doubling): a node whose re-plan cannot help is not left without the process.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from jigsaw.node import ServerSettings
from jigsaw.runtime import stats as st
from jigsaw.runtime.forkserver import UNKNOWN_STATUS, WorkerProcess
from jigsaw.runtime.forkserver import status as fork_server_status
from jigsaw.runtime.generation import Generation
from jigsaw.runtime.rings import ShmRing
from jigsaw.runtime.topology import ProcessSpec

POLL_S = 0.1
DRAIN_POP = 1024
RESTART_READY_TIMEOUT_S = 120.0
EVENTS_MAX = 1000
RETRY_BACKOFF_S = 5.0
RETRY_BACKOFF_MAX_S = 60.0


@dataclass
class WorkerEvent:
    """One failure as ``/admin/workers`` reports it."""

    worker: str
    app: str
    task: str
    variant: str
    generation: int
    pid: int
    reason: str  # exited, hung, start_failed
    detail: str
    detected_unix_s: float
    discarded_items: int
    retried_requests: int
    failed_requests: int
    action: str  # restarted, given_up
    restored_unix_s: float | None = None
    # older generations the process also served (a re-plan kept it) whose requests were settled too
    older_generations: list[int] = field(default_factory=list)
    # the crash was the batch's (see the module docstring): its requests were answered 500, the
    # failure does not count toward the give-up
    suspect_requests: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


BATCH_SLACK = 10.0  # a batch may take this many times the profile's slowest batch (CPU contention)


class WorkerPool(Protocol):
    """Where the workers are: every generation with processes (the generation manager)."""

    def running(self) -> list[Generation]: ...


class FaultSink(Protocol):
    """Whom the supervisor tells (the generation manager, which tells the router and the controller)."""

    def worker_failed(self, generation: int, spec: ProcessSpec, reason: str,
                      suspects: frozenset[int] = frozenset()) -> tuple[int, int]:
        """Settle the requests the process may have held (``suspects``: the crashing batch's,
        answered, never sent again); returns (retried, failed)."""
        ...

    def worker_restarting(self, spec: ProcessSpec) -> None: ...
    def worker_restored(self, spec: ProcessSpec) -> None: ...
    def worker_given_up(self, spec: ProcessSpec) -> None: ...
    def capacity_lost(self, app: str, why: str) -> None: ...


def batch_timeout_ns(spec: ProcessSpec, base_s: float) -> int:
    """How long one batch may run before the process counts as hung (a stuck kernel or runtime)."""
    slowest_s = max(spec.latency_ms_by_batch.values(), default=0.0) * spec.time_scale / 1000.0
    return int((base_s + BATCH_SLACK * slowest_s) * 1e9)


NOT_THE_BATCH = frozenset({-signal.SIGKILL, -signal.SIGTERM, -signal.SIGINT, -signal.SIGHUP, 0})
"""Exit statuses of a process stopped from outside (or that returned): no batch to blame."""


def the_batchs(rc: int | None, reason: str) -> bool:
    """Whether a failure is the running batch's doing (the module docstring): the process ended
    itself (``rc``) or its batch ran past the batch timeout."""
    if reason == "batch_hung":
        return True
    return reason == "exited" and rc is not None and rc not in NOT_THE_BATCH


def discard_inputs(spec: ProcessSpec) -> int:
    """Pop every record left in a dead process's input rings; returns how many there were."""
    n = 0
    for name in spec.inputs:
        try:
            ring = ShmRing.attach(name)
        except Exception:  # a ring already unlinked has nothing left to recover
            continue
        try:
            while True:
                got = ring.pop_many(DRAIN_POP)
                n += len(got)
                if len(got) < DRAIN_POP:
                    break
        finally:
            ring.close()
    return n


class Supervisor:
    """Watches every worker of a ``WorkerPool`` and reports what it finds to a ``FaultSink``."""

    def __init__(self, pool: WorkerPool, sink: FaultSink, server: ServerSettings, *,
                 log: Callable[[str], None]) -> None:
        self.pool = pool
        self.sink = sink
        self.log = log
        self.hang_timeout_s = server.worker_hang_timeout_s
        self.max_restarts = server.worker_max_restarts
        self.window_s = server.worker_restart_window_s
        self.events: deque[WorkerEvent] = deque(maxlen=EVENTS_MAX)
        self.stopped = False
        self.stopping = False  # the node stops: a worker that ends is settled, not restarted or reported
        self.ended_while_stopping = 0
        self._ended_at: dict[tuple[int, int], float] = {}  # clean exits seen once, judged a poll later
        self._failures: dict[tuple[int, int], deque[float]] = {}
        self._restoring: dict[tuple[int, int], tuple[float, WorkerEvent | None]] = {}
        self._retry_at: dict[tuple[int, int], float] = {}  # given-up workers: when to try again

    def stop(self) -> None:
        """No more failures are handled (the daemon is stopping its workers)."""
        self.stopped = True

    def begin_stopping(self) -> None:
        """The node is stopping (a SIGTERM, which may have reached its whole process group): a
        worker that ends from now on has its requests settled, but is neither restarted nor
        reported as a failure."""
        self.stopping = True

    def check(self) -> None:
        if self.stopped:
            return
        now_ns = time.monotonic_ns()
        for g in self.pool.running():
            gid = g.gid
            if g.stopping or g.stats is None or len(g.workers) != len(g.topology.processes):
                continue
            for k, spec in enumerate(g.topology.processes):
                if k in g.handed_over:
                    continue  # kept by a newer generation, which supervises it
                key = (gid, k)
                proc = g.workers[k]
                state = g.stats.get(spec.slot, st.STATE)
                if key in self._restoring:
                    self._watch_restart(g, k, spec, state)
                    continue
                if state == st.FAILED and key in self._retry_at and time.monotonic() >= self._retry_at[key]:
                    del self._retry_at[key]
                    g.restart_worker(k)
                    last = next((e for e in reversed(self.events)
                                 if e.worker == spec.name and e.generation == gid), None)
                    self._restoring[key] = (time.monotonic(), last)
                    self.log(f"worker {spec.name}: trying it again after its back-off")
                    continue
                if state != st.READY:
                    continue  # starting (a new generation's controller waits for it), or failed
                rc = proc.poll()
                if rc is not None:
                    # a clean or SIGTERM exit (or an unknown one: its fork server ended) may be the
                    # node's own stop signal, sent to the whole process group and not yet seen by
                    # the daemon's loop: judged one poll later
                    if (rc in (0, -signal.SIGTERM, UNKNOWN_STATUS) and not self.stopping
                            and key not in self._ended_at):
                        self._ended_at[key] = time.monotonic()
                        continue
                    self._ended_at.pop(key, None)
                    self._fail(g, k, "exited", f"exited with status {rc}", the_batchs(rc, "exited"))
                    continue
                beat = g.stats.get(spec.slot, st.HEARTBEAT_NS)
                if beat and now_ns - beat > self.hang_timeout_s * 1e9:
                    self._fail(g, k, "hung", f"no heartbeat for {(now_ns - beat) / 1e9:.1f} s")
                    continue
                batch = g.stats.get(spec.slot, st.BATCH_STARTED_NS)
                if batch and now_ns - batch > batch_timeout_ns(spec, self.hang_timeout_s):
                    self._fail(g, k, "hung", f"one batch running for {(now_ns - batch) / 1e9:.1f} s",
                               the_batchs(None, "batch_hung"))

    def _watch_restart(self, g: Generation, k: int, spec: ProcessSpec, state: int) -> None:
        key = (g.gid, k)
        started, event = self._restoring[key]
        if state == st.READY:
            del self._restoring[key]
            if event is not None:
                event.restored_unix_s = time.time()
            self.sink.worker_restored(spec)
            self.log(f"worker {spec.name} restarted (pid {g.workers[k].pid}) and serving again after "
                     f"{time.monotonic() - started:.2f} s")
            return
        rc = g.workers[k].poll()
        if rc is not None:
            del self._restoring[key]
            self._fail(g, k, "start_failed", f"exited with status {rc} while restarting")
        elif time.monotonic() - started > RESTART_READY_TIMEOUT_S:
            del self._restoring[key]
            self._fail(g, k, "start_failed", f"not ready {RESTART_READY_TIMEOUT_S:g} s after its restart")

    def _fail(self, g: Generation, k: int, reason: str, detail: str, batchs: bool = False) -> None:
        """Handle one failed process (the module docstring's steps); ``batchs``: the batch it ran
        caused it (its requests are the suspects, and the failure is not counted)."""
        spec: ProcessSpec = g.topology.processes[k]
        proc: WorkerProcess = g.workers[k]
        assert g.stats is not None
        suspects = frozenset(g.stats.batch_record(spec.slot)) if batchs else frozenset()
        g.stats.set(spec.slot, st.STATE, st.DEAD)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2.0)
        discarded = discard_inputs(spec)
        retried, failed = self.sink.worker_failed(g.gid, spec, reason, suspects)
        # a process a re-plan kept also served the older generations that are still draining:
        # their wirings of it are gone for good (the restart serves the newest spec only), so their
        # requests that may have had work on it are settled now, not left to their deadlines
        older = []
        for old, j in self._older_wirings(g, proc):
            old_spec = old.topology.processes[j]
            if old.stats is not None:
                old.stats.set(old_spec.slot, st.STATE, st.FAILED)  # upstream items fail fast there
            discarded += discard_inputs(old_spec)
            r, f = self.sink.worker_failed(old.gid, old_spec, reason, suspects)
            retried, failed = retried + r, failed + f
            older.append(old.gid)
        now = time.monotonic()
        recent = self._failures.setdefault((g.gid, k), deque())
        if not suspects:  # a crash of one batch's making costs no capacity (the module docstring)
            recent.append(now)
        while recent and now - recent[0] > self.window_s:
            recent.popleft()
        if self.stopping:
            g.stats.set(spec.slot, st.STATE, st.STOPPED)
            self.ended_while_stopping += 1
            return
        give_up = len(recent) > self.max_restarts or self.stopped or g.stopping
        event = WorkerEvent(spec.name, spec.app, spec.task, spec.variant, g.gid, proc.pid, reason, detail,
                            time.time(), discarded, retried, failed, "given_up" if give_up else "restarted",
                            older_generations=older, suspect_requests=sorted(suspects))
        self.events.append(event)
        if give_up:
            g.stats.set(spec.slot, st.STATE, st.FAILED if not (self.stopped or g.stopping) else st.STOPPED)
            extra = len(recent) - self.max_restarts - 1
            self._retry_at[(g.gid, k)] = now + min(RETRY_BACKOFF_MAX_S, RETRY_BACKOFF_S * 2 ** max(0, extra))
            self.sink.worker_given_up(spec)
        else:
            g.restart_worker(k)
            self._restoring[(g.gid, k)] = (now, event)
            self.sink.worker_restarting(spec)
        blamed = f" (its batch's {len(suspects)} requests answered 500, not sent again)" if suspects else ""
        self.log(f"worker {spec.name} (pid {proc.pid}) {detail}{blamed}: {discarded} queued items discarded, "
                 f"{retried} requests dispatched again, {failed} answered with an error; "
                 + ("restarting it" if not give_up else
                    f"given up after {len(recent)} failures in {self.window_s:g} s"))
        if give_up and not (self.stopped or g.stopping):
            self.sink.capacity_lost(spec.app, f"worker {spec.name} failed {len(recent)} times")

    def _older_wirings(self, g: Generation, proc: WorkerProcess) -> list[tuple[Generation, int]]:
        """(generation, process) of every other live generation that handed ``proc`` over to ``g``."""
        return [(old, j) for old in self.pool.running() if old is not g
                for j in sorted(old.handed_over) if j < len(old.workers) and old.workers[j] is proc]

    def fork_server(self) -> dict[str, object]:
        """The fork server's state (``/admin/workers``): enabled, up, pid, forks, fallbacks, restarts."""
        return fork_server_status(getattr(self.pool, "launcher", None))

    def workers(self) -> list[dict[str, Any]]:
        """Every worker of every generation with its state, pid and restarts (``/admin/workers``)."""
        names = {st.STARTING: "starting", st.READY: "ready", st.STOPPED: "stopped", st.DEAD: "restarting",
                 st.FAILED: "failed"}
        out = []
        for g in self.pool.running():
            gid = g.gid
            if g.stats is None:
                continue
            for k, spec in enumerate(g.topology.processes):
                if k in g.handed_over:
                    continue
                proc = g.workers[k] if k < len(g.workers) else None
                out.append({"worker": spec.name, "app": spec.app, "task": spec.task, "variant": spec.variant,
                            "generation": gid, "pid": proc.pid if proc is not None else None,
                            "state": names.get(g.stats.get(spec.slot, st.STATE), "unknown"),
                            "started_by": getattr(proc, "started_by", "exec"),
                            "failures": len(self._failures.get((gid, k), ()))})
        return out
