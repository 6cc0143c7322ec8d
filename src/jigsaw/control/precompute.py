"""The solver process's idle time: each app's capacity per slice budget (``budget_curve``), one
step at a time in a forked child that a request kills at once.

Why a child per step: a capacity solve runs for seconds inside CBC, which cannot be interrupted
from Python; a plan request must never wait behind it. The child is a fork of the solver
process, so it starts with the process's problems (columns built, ``warm_up``); it answers one
``BudgetFact`` as JSON on a pipe and exits. The process applies the fact to its own curves
(``budget_curve.apply``), which every later plan reads. A request arriving mid-step kills the
child and the CBC process it started (SIGKILL to its process group: nothing of it is kept) and
the step runs again once the process is idle. A child never uses its parent's warm CBC
processes (``solve_runner`` drops them after a fork).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Sequence

from jigsaw.node import Node
from jigsaw.planner import budget_curve
from jigsaw.planner.problem import Problem

MAX_FACT_BYTES = 16 << 20  # one step's answer at most this long (a plan's JSON: kilobytes)
OVERRUN_S = 30.0  # a step's child still running this long after twice its limit is killed, the step dropped


class Precompute:
    """The steps left and the running child, if any (``fd``: its pipe, to wait on)."""

    def __init__(self, pbs: Sequence[Problem], node: Node, *, solver: str,
                 step_limit_s: float = budget_curve.STEP_LIMIT_S) -> None:
        self.pbs, self.node, self.solver, self.step_limit_s = list(pbs), node, solver, step_limit_s
        # (app index, slices, slots, seconds): every budget, then the unproven again, longer
        self.todo = [(i, k, m, step_limit_s) for i, k, m in budget_curve.steps(self.pbs, node)] \
            if step_limit_s > 0 else []
        self.done = 0
        self._pid: int | None = None
        self.fd: int | None = None
        self.deadline = 0.0  # the running step's (``time.monotonic``): past it, ``expire``
        self._buf = bytearray()

    def start(self) -> None:
        """Fork the next step's child unless one runs or none is left."""
        if self._pid is not None or not self.todo:
            return
        i, k, m, limit_s = self.todo[0]
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: one solve, its answer, gone (never back into the caller)
            code = 1
            try:
                os.setpgid(0, 0)  # its own group: a kill reaches the CBC process it starts too
                os.close(r)
                os.nice(19)  # idle work: the serving processes and the next plan come first
                fact = budget_curve.budget_capacity(self.pbs[i], self.node, k, m, solver=self.solver,
                                                    time_limit_s=limit_s)
                data = memoryview(json.dumps(fact.to_json()).encode())
                while data:
                    data = data[os.write(w, data):]
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        with contextlib.suppress(OSError):  # (the child may have set it first)
            os.setpgid(pid, pid)
        self._pid, self.fd = pid, r
        self.deadline = time.monotonic() + 2 * limit_s + OVERRUN_S
        self._buf = bytearray()

    def readable(self) -> None:
        """The child's pipe is readable: take what it wrote; at its end, apply the fact."""
        assert self.fd is not None
        chunk = os.read(self.fd, 1 << 16)
        self._buf += chunk
        if chunk and len(self._buf) <= MAX_FACT_BYTES:
            return
        i, k, m, limit_s = self.todo.pop(0)  # answered or failed (too long: dropped): not tried again
        data = b"" if chunk else bytes(self._buf)
        self._reap(kill=bool(chunk))
        with contextlib.suppress(ValueError, KeyError, TypeError):
            if data:
                fact = budget_curve.BudgetFact.from_json(json.loads(data))
                budget_curve.apply(self.pbs[i], self.node, fact)
                self.done += 1
                longer = limit_s * budget_curve.DEEPEN
                if fact.status != "optimal" and longer <= budget_curve.MAX_STEP_S:
                    self.todo.append((i, k, m, longer))  # its bound tightened once the rest is done

    def expire(self) -> None:
        """The running step overran (a solver stuck in the child): killed, and not tried again."""
        if self._pid is not None:
            self.todo.pop(0)
            self._reap(kill=True)

    def cancel(self) -> None:
        """Kill the running step (it runs again later)."""
        if self._pid is not None:
            self._reap(kill=True)

    def _reap(self, kill: bool) -> None:
        pid, fd = self._pid, self.fd
        self._pid = self.fd = None
        if pid is not None:
            if kill:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)  # the step and the solver process it started
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        if fd is not None:
            os.close(fd)
