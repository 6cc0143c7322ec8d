"""The configuration search spaces of the paper's ablation (section 4.3, Fig. 3).

A: accuracy scaling (off: only each task's most accurate variant).
S: spatial partitioning (off: whole GPUs, one process each).
T: task-graph-informed budgeting (off: the static per-task latency and slice budgets of
   appendix B, which make the uninformed baselines as strong as possible).
"""

from __future__ import annotations

from dataclasses import dataclass

SPACES = ("unopt", "a", "s", "t", "as", "at", "st", "ast")


@dataclass(frozen=True)
class SearchSpace:
    name: str
    accuracy_scaling: bool
    spatial: bool
    task_graph: bool


def search_space(name: str) -> SearchSpace:
    key = name.lower().replace("+", "")
    if key in ("jigsaw", "jigsawserve"):
        key = "ast"
    if key not in SPACES:
        raise ValueError(f"unknown search space {name!r} (expected one of {', '.join(SPACES)})")
    letters = "" if key == "unopt" else key
    return SearchSpace(key, "a" in letters, "s" in letters, "t" in letters)
