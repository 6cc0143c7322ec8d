"""What a solve of a ``model.LinearModel`` returns, in words both solvers share."""

from __future__ import annotations

import math
from dataclasses import dataclass

NO_BOUND = 1e300  # a solver bound this large is none (CBC reports +-DBL_MAX before it has one)


@dataclass
class Solution:
    status: str  # optimal | feasible (limit hit with an incumbent) | infeasible | no_solution
    values: list[float]  # per variable; empty without an incumbent
    objective: float  # of the incumbent (nan without one)
    bound: float  # the solver's best bound on the optimum (objective when proven)
    seconds: float
    nodes: int = 0
    # the solver's own bound when it stopped: an ``optimal`` solve stops once its incumbent is
    # within the absolute gap of it, so it may exceed ``objective`` (``bound`` is then the
    # objective); nan when unknown
    dual_bound: float = math.nan
    # CBC's process died or hung in this solve (``solve_runner``): why; the solution is HiGHS's
    crash: str = ""

    @property
    def has_incumbent(self) -> bool:
        return bool(self.values)


def status_word(optimal: bool, infeasible: bool, has_solution: bool) -> str:
    """The solver-neutral status of a solve (``Solution.status``)."""
    if optimal:
        return "optimal"
    if infeasible:
        return "infeasible"
    return "feasible" if has_solution else "no_solution"


def dual_bound(maximize: bool, objective: float, bound: float) -> float:
    """The solver's bound, never on the wrong side of its own incumbent."""
    if bound is None or math.isnan(bound):
        return math.nan
    return max(objective, bound) if maximize else min(objective, bound)
