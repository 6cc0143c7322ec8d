"""What the daemon supplies to the reconfiguration executor, stood in by real worker processes (one
idle Python process per MPS process, so pids are real and checked), a routing log and drains."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping

from jigsaw.gpu.layout import NodeInstance, NodeLayout


class WorkerFailure(RuntimeError):
    pass


class ProcessWorkers:
    """``Workers`` with real processes; ``fail_on[(method, n)]`` makes the n-th call (0-based) fail."""

    def __init__(self) -> None:
        self.procs: dict[tuple, list[subprocess.Popen]] = {}
        self.routes: list[NodeLayout] = []
        self.calls: list[tuple[str, str]] = []
        self.envs: dict[str, dict[str, str]] = {}
        self.fail_on: set[tuple[str, int]] = set()
        self._counts: dict[str, int] = {}

    def _maybe_fail(self, method: str) -> None:
        n = self._counts.get(method, 0)
        self._counts[method] = n + 1
        if (method, n) in self.fail_on:
            raise WorkerFailure(f"{method} #{n} failed (injected)")

    @staticmethod
    def key(inst: NodeInstance) -> tuple:
        return (inst.slot, inst.workload)

    async def start(self, inst: NodeInstance, env: Mapping[str, str]) -> tuple[int, ...]:
        self.calls.append(("start", inst.name))
        self.envs[inst.name] = dict(env)
        procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
                 for _ in range(inst.mps)]
        self.procs[self.key(inst)] = procs
        self._maybe_fail("start")  # after starting: the executor must stop what did start
        return tuple(p.pid for p in procs)

    async def wait_warm(self, inst: NodeInstance) -> None:
        self.calls.append(("wait_warm", inst.name))
        self._maybe_fail("wait_warm")

    async def route(self, active: NodeLayout) -> None:
        self.calls.append(("route", str(len(active.instances))))
        self._maybe_fail("route")
        self.routes.append(active)

    async def drain(self, inst: NodeInstance) -> None:
        self.calls.append(("drain", inst.name))
        self._maybe_fail("drain")

    async def stop(self, inst: NodeInstance) -> None:
        self.calls.append(("stop", inst.name))
        self._maybe_fail("stop")
        for p in self.procs.pop(self.key(inst), []):
            p.terminate()
            p.wait(timeout=10)

    def alive(self) -> dict[tuple, tuple[int, ...]]:
        return {k: tuple(p.pid for p in ps) for k, ps in self.procs.items()
                if all(p.poll() is None for p in ps)}

    def cleanup(self) -> None:
        for ps in self.procs.values():
            for p in ps:
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGKILL)
                    p.wait()
        self.procs.clear()
