"""A solver-neutral mixed-integer linear program held as plain arrays, solved by HiGHS or CBC.

The planner builds its models here rather than through a modelling layer: appending numbers to
lists costs microseconds per row, while python-mip's expression objects cost milliseconds per
model, which mattered once the model itself solves in tens of milliseconds. HiGHS receives the
arrays in one call; CBC (through python-mip, the only CBC binding installed) row by row.

Solves run on one thread: on a shared 2-core machine one thread is steadier than two, and the
result of a solve with a given model and limits does not depend on the machine's load except
through the time limit.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

from jigsaw.planner.cbc import Arrays
from jigsaw.planner.solution import Solution, dual_bound, status_word
from jigsaw.planner.solve_runner import SolverCrash, solve_cbc

_LOG = logging.getLogger("jigsaw.planner")
INF = math.inf


@dataclass
class Tally:
    """The solves made within ``tally()``: counts of work that a busy machine does not change
    (unlike seconds), which the benches print beside the seconds."""

    milps: int = 0  # models with integer variables
    lps: int = 0
    nodes: int = 0  # branch-and-bound nodes of the MILPs (CBC's and HiGHS's own counts)
    seconds: float = 0.0  # in the solvers


_TALLIES: list[Tally] = []


@contextlib.contextmanager
def tally() -> Iterator[Tally]:
    """Counts every ``LinearModel.solve`` made inside the block (nested blocks each count)."""
    t = Tally()
    _TALLIES.append(t)
    try:
        yield t
    finally:
        _TALLIES.remove(t)


def _count(model: LinearModel, sol: Solution) -> None:
    mip = any(model.integer)
    for t in _TALLIES:
        t.milps += mip
        t.lps += not mip
        t.nodes += sol.nodes
        t.seconds += sol.seconds


@dataclass
class LinearModel(Arrays):
    """max (or min) c.x subject to row_lo <= A x <= row_hi, col_lo <= x <= col_hi, some x integer:
    the arrays (``cbc.Arrays``) and the calls that build and solve them."""

    @property
    def num_vars(self) -> int:
        return len(self.cost)

    @property
    def num_rows(self) -> int:
        return len(self.row_lo)

    def var(self, lo: float = 0.0, hi: float = INF, cost: float = 0.0, integer: bool = False) -> int:
        self.col_lo.append(float(lo))
        self.col_hi.append(float(hi))
        self.cost.append(float(cost))
        self.integer.append(bool(integer))
        return len(self.cost) - 1

    def row(self, index: list[int], value: list[float], lo: float = -INF, hi: float = INF) -> int:
        self.row_index.append(list(index))
        self.row_value.append([float(v) for v in value])
        self.row_lo.append(float(lo))
        self.row_hi.append(float(hi))
        return len(self.row_lo) - 1

    def solve(self, solver: str, time_limit_s: float, absolute_gap: float,
              start: dict[int, float] | None = None, relative_gap: float = 0.0,
              presolve: bool = True, max_nodes: int | None = None, cuts: bool = True) -> Solution:
        """``presolve``: HiGHS's presolve (CBC ignores it); off where it measured slower (the
        slot bounds of ``decompose``, whose root presolve took most of their time). ``cuts``:
        CBC's cutting planes (HiGHS ignores it); off where they measured slower (``joint``'s
        capacity solves).
        ``max_nodes``: stop after this many branch-and-bound nodes, a limit of work rather than of
        time: a busy machine stops at the same point as a quiet one (the same answer)."""
        if solver == "highs":
            sol = _solve_highs(self, time_limit_s, absolute_gap, start, relative_gap, presolve,
                               max_nodes)
            _count(self, sol)
            return sol
        if solver == "cbc":
            t0 = time.perf_counter()
            sol = _contained_cbc(self, time_limit_s, absolute_gap, start, relative_gap, max_nodes, cuts)
            if start and not sol.crash and sol.has_incumbent and self.violations(sol.values):
                # CBC can return a broken "optimal" answer after a start it could not use:
                # never trust it, solve again from scratch in the time left.
                _count(self, sol)
                left = max(time_limit_s - (time.perf_counter() - t0), 0.05 * time_limit_s)
                sol = _contained_cbc(self, left, absolute_gap, None, relative_gap, max_nodes, cuts)
                _count(self, sol)
                sol.seconds = time.perf_counter() - t0
                return sol
            _count(self, sol)
            return sol
        raise ValueError(f"unknown solver {solver!r} (expected cbc or highs)")

    def violations(self, values: list[float], tol: float = 1e-6) -> int:
        """How many rows or bounds ``values`` break (beyond ``tol``, relative to the row's size)."""
        bad = 0
        for idx, val, lo, hi in zip(self.row_index, self.row_value, self.row_lo, self.row_hi, strict=True):
            v = sum(c * values[i] for i, c in zip(idx, val, strict=True))
            size = max(abs(b) for b in (lo, hi, 1.0) if math.isfinite(b))
            scale = tol * size
            if v < lo - scale or v > hi + scale:
                bad += 1
        for x, lo, hi in zip(values, self.col_lo, self.col_hi, strict=True):
            if x < lo - tol or x > hi + tol:
                bad += 1
        return bad

    def relaxation(self, solver: str = "highs", presolve: bool = True) -> Solution:
        """The LP relaxation (every variable continuous). ``presolve`` off: HiGHS's presolve took
        a third of the small relaxations the anytime planner solves (2.8 against 1.9 ms)."""
        lp = LinearModel(self.maximize, self.col_lo, self.col_hi, self.cost, [False] * self.num_vars,
                         self.row_lo, self.row_hi, self.row_index, self.row_value)
        return lp.solve(solver, 60.0, 0.0, presolve=presolve)


def _contained_cbc(model: LinearModel, time_limit_s: float, absolute_gap: float,
                   start: dict[int, float] | None, relative_gap: float,
                   max_nodes: int | None, cuts: bool = True) -> Solution:
    """CBC in its child process (``solve_runner``); where that dies (a native abort) or hangs,
    the same model on HiGHS here, the crash logged and named in the solution's ``crash``."""
    try:
        return solve_cbc(model, time_limit_s, absolute_gap, start, relative_gap, max_nodes, cuts)
    except SolverCrash as exc:
        _LOG.warning("%s: solving the model (%d variables, %d rows) on HiGHS instead",
                     exc, model.num_vars, model.num_rows)
        sol = _solve_highs(model, time_limit_s, absolute_gap, start, relative_gap, True, max_nodes)
        sol.crash = str(exc)
        return sol


def _solve_highs(model: LinearModel, time_limit_s: float, absolute_gap: float,
                 start: dict[int, float] | None = None, relative_gap: float = 0.0,
                 presolve: bool = True, max_nodes: int | None = None) -> Solution:
    import highspy
    import numpy as np

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    h.setOptionValue("random_seed", 0)
    h.setOptionValue("time_limit", float(max(time_limit_s, 1e-3)))
    h.setOptionValue("mip_abs_gap", float(absolute_gap))
    h.setOptionValue("mip_rel_gap", float(relative_gap))
    if not presolve:
        h.setOptionValue("presolve", "off")
    if max_nodes is not None:
        h.setOptionValue("mip_max_nodes", int(max_nodes))
    lp = highspy.HighsLp()
    n, m = model.num_vars, model.num_rows
    lp.num_col_ = n
    lp.num_row_ = m
    big = highspy.kHighsInf
    lp.col_cost_ = np.array(model.cost, dtype=float)
    lp.col_lower_ = np.clip(np.array(model.col_lo, dtype=float), -big, big)
    lp.col_upper_ = np.clip(np.array(model.col_hi, dtype=float), -big, big)
    lp.row_lower_ = np.clip(np.array(model.row_lo, dtype=float), -big, big)
    lp.row_upper_ = np.clip(np.array(model.row_hi, dtype=float), -big, big)
    starts = [0]
    for idx in model.row_index:
        starts.append(starts[-1] + len(idx))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_ = n
    lp.a_matrix_.num_row_ = m
    lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.array([i for idx in model.row_index for i in idx], dtype=np.int32)
    lp.a_matrix_.value_ = np.array([v for val in model.row_value for v in val], dtype=float)
    lp.sense_ = highspy.ObjSense.kMaximize if model.maximize else highspy.ObjSense.kMinimize
    if any(model.integer):
        lp.integrality_ = [highspy.HighsVarType.kInteger if b else highspy.HighsVarType.kContinuous
                           for b in model.integer]
    h.passModel(lp)
    if start:
        keys = sorted(start)
        h.setSolution(len(keys), np.array(keys, dtype=np.int32),
                      np.array([start[k] for k in keys], dtype=float))
    t0 = time.perf_counter()
    h.run()
    secs = time.perf_counter() - t0
    status = h.getModelStatus()
    info = h.getInfo()
    ms = highspy.HighsModelStatus
    has = info.primal_solution_status == 2  # kSolutionStatusFeasible
    values = list(h.getSolution().col_value) if has else []
    obj = info.objective_function_value if has else math.nan
    mip = any(model.integer)
    bound = info.mip_dual_bound if mip else obj
    word = status_word(status == ms.kOptimal, status in (ms.kInfeasible, ms.kUnboundedOrInfeasible), has)
    dual = dual_bound(model.maximize, obj, bound) if has else math.nan
    if word == "optimal":
        bound = obj
    nodes = int(info.mip_node_count) if mip else 0
    return Solution(word, values, obj, bound, secs, nodes, dual)
