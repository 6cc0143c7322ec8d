"""CBC (through python-mip) solving a ``model.LinearModel`` in this process: the code the CBC
child process of ``solve_runner`` runs (a native abort here ends that child, not the caller).

CBC receives the model row by row (python-mip is the only CBC binding installed).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from jigsaw.planner.solution import NO_BOUND, Solution, dual_bound, status_word


@dataclass
class Arrays:
    """A linear program as plain arrays: max (or min) cost.x subject to row_lo <= A x <= row_hi,
    col_lo <= x <= col_hi, some x integer. What the CBC child receives; ``model.LinearModel``
    builds on it."""

    maximize: bool = True
    col_lo: list[float] = field(default_factory=list)
    col_hi: list[float] = field(default_factory=list)
    cost: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    row_lo: list[float] = field(default_factory=list)
    row_hi: list[float] = field(default_factory=list)
    row_index: list[list[int]] = field(default_factory=list)  # per row: its columns
    row_value: list[list[float]] = field(default_factory=list)  # per row: their coefficients


def solve(model: Arrays, time_limit_s: float, absolute_gap: float,
               start: dict[int, float] | None, relative_gap: float = 0.0,
               max_nodes: int | None = None, cuts: bool = True) -> Solution:
    """``cuts`` False: CBC generates no cutting planes (``mip.Model.cuts = 0``)."""
    import mip

    m = mip.Model(sense=mip.MAXIMIZE if model.maximize else mip.MINIMIZE, solver_name=mip.CBC)
    m.verbose = 0
    m.threads = 1
    if not cuts:
        m.cuts = 0
    xs = [m.add_var(lb=lo, ub=hi if math.isfinite(hi) else mip.INF, obj=c,
                    var_type=mip.INTEGER if integ else mip.CONTINUOUS)
          for lo, hi, c, integ in zip(model.col_lo, model.col_hi, model.cost, model.integer, strict=True)]
    _add_rows(m, model)
    m.max_mip_gap_abs = absolute_gap
    m.max_mip_gap = max(relative_gap, 1e-9)
    if start:
        m.start = [(xs[i], v) for i, v in start.items()]
    t0 = time.perf_counter()
    st = m.optimize(max_seconds=max(time_limit_s, 1e-3),
                    **({"max_nodes": int(max_nodes)} if max_nodes is not None else {}))
    secs = time.perf_counter() - t0
    S = mip.OptimizationStatus
    has = st in (S.OPTIMAL, S.FEASIBLE) and m.num_solutions > 0
    values = [x.x if x.x is not None else 0.0 for x in xs] if has else []
    obj = float(m.objective_value) if has else math.nan
    bound = float(m.objective_bound) if m.objective_bound is not None else math.nan
    word = status_word(st == S.OPTIMAL, st in (S.INFEASIBLE, S.INT_INFEASIBLE), has)
    if abs(bound) >= NO_BOUND:
        # CBC's "no bound yet" is +-DBL_MAX on either side (a maximisation stopped before its
        # root LP says -DBL_MAX): no bound is the loose side's infinity, as HiGHS gives it; only
        # an infeasible solve has the tight side's. Read the other way, the decomposition stored
        # such a time-out (traffic_analysis's 9 slices / 11 slots at 608 rps, which serve 614
        # rps) as a refuted budget, and the scaled search "proved" a fraction it serves infeasible.
        loose = math.inf if model.maximize else -math.inf
        bound = -loose if word == "infeasible" else loose
    dual = dual_bound(model.maximize, obj, bound) if has else math.nan
    if word == "optimal":
        bound = obj
    # CBC aborts (SIGABRT) when asked for the node count of a model without integer variables
    nodes = _cbc_nodes(m) if any(model.integer) else 0
    return Solution(word, values, obj, bound, secs, nodes, dual)


_CBC_NODES: list[bool] = []  # whether CBC's node counter is declared (once per process)


def _cbc_nodes(m: object) -> int:
    """The branch-and-bound nodes of CBC's last solve of ``m`` (0 where unknown): a count of
    work, the same on a busy machine as on a quiet one, for the benches' reports. python-mip does
    not declare CBC's ``Cbc_getNodeCount``; the library it loads has it."""
    try:
        import mip.cbc as cbc

        if not _CBC_NODES:
            cbc.ffi.cdef("int Cbc_getNodeCount(Cbc_Model *model);")
            _CBC_NODES.append(True)
        return int(cbc.cbclib.Cbc_getNodeCount(m.solver._model))  # type: ignore[attr-defined]
    except Exception:  # another python-mip or CBC build: the count is only reported
        return 0


def _add_rows(m: object, model: Arrays) -> None:
    """The rows straight into CBC (``Cbc_addRow``), not through python-mip's expressions, which
    took most of the 100-200 ms a large model spent before CBC started (3136 columns, 4554 rows)."""
    from mip.cbc import cbclib

    mp = m.solver._model  # type: ignore[attr-defined]
    for idx, val, lo, hi in zip(model.row_index, model.row_value, model.row_lo, model.row_hi, strict=True):
        n, cols, coefs = (len(idx), idx, val) if idx else (1, [0], [0.0])
        if lo == hi:
            cbclib.Cbc_addRow(mp, b"", n, cols, coefs, b"E", lo)
            continue
        if math.isfinite(lo):
            cbclib.Cbc_addRow(mp, b"", n, cols, coefs, b"G", lo)
        if math.isfinite(hi):
            cbclib.Cbc_addRow(mp, b"", n, cols, coefs, b"L", hi)
