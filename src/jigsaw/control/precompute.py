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

Once every budget is done, the steps go on to each app's best values on a grid of demands up
to what its curve serves on the whole node (``value_curve``: one demand a step, its facts as a
JSON list), round after round where the grid leaves an interval unproven, under the node's
objective and weights, then to the budgets short of the node that the grid's demands solved,
bisected between two demands where their feasibility or value is left open
(``value_curve.open_points``: one solve a step); every plan of a mix then starts from them.

Every answer is also appended to a file per app (``precompute_store``, when the process is
given a directory): a new solver process for the same problems reads them first and goes on
with the steps left. A plan asked before the precompute is done starts from what it has proven
so far (the budgets and grid demands answered; the running step is killed and runs again).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from jigsaw.control.precompute_store import Store
from jigsaw.node import Node
from jigsaw.planner import budget_curve, curves, value_curve
from jigsaw.planner.problem import Problem

Usage = tuple[int, int]
ValueStep = tuple[float, Usage | None]  # a grid demand (budget None), or a budget bisected at a demand

MAX_FACT_BYTES = 16 << 20  # one step's answer at most this long (a plan's JSON: kilobytes)
OVERRUN_S = 30.0  # a step's child still running this long after twice its limit is killed, the step dropped


class Precompute:
    """The steps left and the running child, if any (``fd``: its pipe, to wait on)."""

    def __init__(self, pbs: Sequence[Problem], node: Node, *, solver: str,
                 step_limit_s: float = budget_curve.STEP_LIMIT_S, store: Path | None = None) -> None:
        self.pbs, self.node, self.solver, self.step_limit_s = list(pbs), node, solver, step_limit_s
        # (app index, slices, slots, seconds): every budget, then the unproven again, longer
        self.todo = [(i, k, m, step_limit_s) for i, k, m in budget_curve.steps(self.pbs, node)] \
            if step_limit_s > 0 else []
        self.done = 0
        self._pid: int | None = None
        self.fd: int | None = None
        self.deadline = 0.0  # the running step's (``time.monotonic``): past it, ``expire``
        self._buf = bytearray()
        weights = [node.planner.app_weight(pb.app.name) for pb in self.pbs]
        self.scopes = [value_curve.scope_of(node.planner.objective, w, sum(weights) or 1.0) for w in weights]
        self.gap = node.absolute_gap / max(len(self.pbs), 1)
        # per app its grid's top demand (once the budgets are done), the demands done, and the
        # steps left of the round: a demand (budget None) or a budget's bisection at a demand
        self.tops: list[float | None] = [None] * len(self.pbs)
        self.levels_done: list[list[float]] = [[] for _ in self.pbs]
        self.levels: list[list[ValueStep]] = [[] for _ in self.pbs]
        self.bisecting = [False] * len(self.pbs)  # the grid's demands done: the budgets' rounds
        self.finished = [False] * len(self.pbs)
        self.failed: list[set[ValueStep]] = [set() for _ in self.pbs]  # bisections with no answer
        self.steps_done = [0] * len(self.pbs)  # the grid's steps answered per app (turns go round)
        self._value_step: tuple[int, float, Usage | None] | None = None  # the running step, a grid's
        # what an earlier process kept (``precompute_store``): read once, each answer appended
        self.store = Store.of(self.pbs, node, self.scopes, store) if step_limit_s > 0 else None
        self.restored = self._restore() if self.store is not None else 0

    def _restore(self) -> int:
        """Every record an earlier process kept, applied as if its steps had run here: a budget
        answered leaves the steps (an unproven one comes back longer, as ``readable`` has it), a
        grid's demands answered are done. The records applied."""
        assert self.store is not None
        n = 0
        last: dict[tuple[int, int, int | None], tuple[budget_curve.BudgetFact, float]] = {}
        for i, pb in enumerate(self.pbs):
            for doc in self.store.read(i):
                with contextlib.suppress(ValueError, KeyError, TypeError, IndexError, AttributeError):
                    if "budget" in doc:
                        fact = budget_curve.BudgetFact.from_json(doc["budget"])
                        budget_curve.apply(pb, self.node, fact)
                        last[(i, fact.slices, fact.slots)] = (fact, float(doc["limit_s"]))
                    elif "top" in doc:
                        self.tops[i] = float(doc["top"])
                    elif "level" in doc or "bisect" in doc:
                        facts = [value_curve.fact_from_json(f) for f in doc["facts"]]
                        for f in facts:
                            value_curve.add(pb, self.scopes[i], f)
                        if "level" in doc:
                            self.levels_done[i].append(float(doc["level"]))
                        self.steps_done[i] += 1
                    else:
                        continue
                    n += 1
        todo, again = [], []
        for i, k, m, limit_s in self.todo:
            if (i, k, m) not in last:
                todo.append((i, k, m, limit_s))
                continue
            fact, ran_s = last[(i, k, m)]
            if fact.status != "optimal" and ran_s * budget_curve.DEEPEN <= budget_curve.MAX_STEP_S:
                again.append((i, k, m, ran_s * budget_curve.DEEPEN))
        self.todo = todo + again
        for i, top in enumerate(self.tops):  # the first round's demands not answered yet
            if top is not None and top > 0:
                done = self.levels_done[i]
                self.levels[i] = [(d, None) for d in value_curve.first_levels(top)
                                  if all(abs(d - x) > 1e-9 * top for x in done)]
        return n

    def _keep(self, i: int, record: dict) -> None:
        if self.store is not None:
            self.store.append(i, record)

    def next_level(self) -> tuple[int, float, Usage | None] | None:
        """The next grid step (app index, rps, budget) once every budget is done: the apps in
        turn, each grid's next round where its last one ended, first its demands (budget None),
        then its budgets' bisections (``value_curve.open_points``) (None: every grid is done)."""
        if self.todo or self.step_limit_s <= 0:
            return None
        for i, pb in enumerate(self.pbs):
            if self.tops[i] is None:  # what the app serves on the whole node, its curve says
                top = max((x.rate_rps for x in curves.curve_of(pb).served), default=0.0)
                self.tops[i] = top
                self._keep(i, {"top": top})
                self.levels[i] = [(d, None) for d in value_curve.first_levels(top)] if top > 0 else []
                self.finished[i] = top <= 0
            elif not self.levels[i] and not self.finished[i]:
                self.levels[i] = self._round(i)
                self.finished[i] = not self.levels[i]
        ready = [i for i in range(len(self.pbs)) if self.levels[i]]
        if not ready:
            return None
        i = min(ready, key=lambda j: self.steps_done[j])
        return (i, *self.levels[i][0])

    def _round(self, i: int) -> list[ValueStep]:
        """App i's next round of grid steps (empty: its grid is done)."""
        pb, scope, top = self.pbs[i], self.scopes[i], self.tops[i] or 0.0
        if not self.bisecting[i]:
            got = value_curve.next_levels(pb, self.node, scope, self.levels_done[i], top, self.gap)
            if got:
                return [(d, None) for d in got]
            self.bisecting[i] = True
        return list(value_curve.open_points(pb, self.node, scope, self.levels_done[i], top, self.gap,
                                            skip=self.failed[i]))

    def start(self) -> None:
        """Fork the next step's child unless one runs or none is left."""
        if self._pid is not None:
            return
        self._value_step = None if self.todo else self.next_level()
        if not self.todo and self._value_step is None:
            return
        i, k, m, limit_s = self.todo[0] if self.todo else (self._value_step[0], 0, None, self.step_limit_s)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: one solve, its answer, gone (never back into the caller)
            code = 1
            try:
                os.setpgid(0, 0)  # its own group: a kill reaches the CBC process it starts too
                os.close(r)
                os.nice(19)  # idle work: the serving processes and the next plan come first
                data = memoryview(json.dumps(self._solve(i, k, m, limit_s)).encode())
                while data:
                    data = data[os.write(w, data):]
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        with contextlib.suppress(OSError):  # (the child may have set it first)
            os.setpgid(pid, pid)
        self._pid, self.fd = pid, r
        level = self._value_step is not None and self._value_step[2] is None
        solves = value_curve.LEVEL_SOLVES if level else 1  # a grid demand's solves at most; a bisection's
        self.deadline = time.monotonic() + 2 * solves * limit_s + OVERRUN_S
        self._buf = bytearray()

    def _solve(self, i: int, k: int, m: int | None, limit_s: float) -> object:
        """The running step's answer as JSON (in the child)."""
        if self._value_step is not None:
            _, d, budget = self._value_step
            pb, scope = self.pbs[i], self.scopes[i]
            facts = value_curve.level_facts(pb, self.node, scope, d, self.tops[i] or 0.0, solver=self.solver,
                                            gap=self.gap, time_limit_s=limit_s,
                                            frontier_from_rps=self.frontier_from(i)) if budget is None else \
                [value_curve.solve_fact(pb, self.node, scope, d, budget, solver=self.solver, gap=self.gap / 2,
                                        time_limit_s=limit_s)]
            return [value_curve.fact_to_json(f) for f in facts]
        return budget_curve.budget_capacity(self.pbs[i], self.node, k, m, solver=self.solver,
                                            time_limit_s=limit_s).to_json()

    def frontier_from(self, i: int) -> float:
        """The least demand app i's grid asks the budgets the apps compete for at:
        ``GRID_FRONTIER_FROM`` of what the app serves on the whole node split evenly over the
        apps (the grid spans all of it, but the apps compete where each has about its share:
        from that share of the grid's top the example node's mixes at 60-150% would get none,
        and at 60% the apps already compete for slots)."""
        return value_curve.GRID_FRONTIER_FROM * (self.tops[i] or 0.0) / len(self.pbs)

    def _value_answer(self, data: bytes) -> None:
        """A grid step answered (or failed: b""): its facts into the app's store, the step done
        (a bisection that failed is not asked again)."""
        assert self._value_step is not None
        i, d, budget = self._value_step
        self._value_step = None
        self.levels[i].remove((d, budget))
        self.steps_done[i] += 1
        if budget is None:
            self.levels_done[i].append(d)
        else:
            self.failed[i].add((d, budget))
        with contextlib.suppress(ValueError, KeyError, TypeError, IndexError):
            if data:
                docs = json.loads(data)
                for f in docs:
                    value_curve.add(self.pbs[i], self.scopes[i], value_curve.fact_from_json(f))
                self.done += 1
                self._keep(i, {"level": d, "facts": docs} if budget is None
                           else {"bisect": [d, *budget], "facts": docs})

    def readable(self) -> None:
        """The child's pipe is readable: take what it wrote; at its end, apply the fact."""
        assert self.fd is not None
        chunk = os.read(self.fd, 1 << 16)
        self._buf += chunk
        if chunk and len(self._buf) <= MAX_FACT_BYTES:
            return
        if self._value_step is not None:
            data = b"" if chunk else bytes(self._buf)
            self._reap(kill=bool(chunk))
            self._value_answer(data)
            return
        i, k, m, limit_s = self.todo.pop(0)  # answered or failed (too long: dropped): not tried again
        data = b"" if chunk else bytes(self._buf)
        self._reap(kill=bool(chunk))
        with contextlib.suppress(ValueError, KeyError, TypeError):
            if data:
                fact = budget_curve.BudgetFact.from_json(json.loads(data))
                budget_curve.apply(self.pbs[i], self.node, fact)
                self.done += 1
                self._keep(i, {"budget": fact.to_json(), "limit_s": limit_s})
                longer = limit_s * budget_curve.DEEPEN
                if fact.status != "optimal" and longer <= budget_curve.MAX_STEP_S:
                    self.todo.append((i, k, m, longer))  # its bound tightened once the rest is done

    def expire(self) -> None:
        """The running step overran (a solver stuck in the child): killed, and not tried again."""
        if self._pid is not None:
            if self._value_step is not None:
                self._reap(kill=True)
                self._value_answer(b"")
                return
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
