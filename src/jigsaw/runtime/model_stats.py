"""Per-app and per-task inference statistics in Triton's schema (``/v2/models/{app}/stats``).

A jigsaw app is a pipeline, as a Triton ensemble: its entry (``name`` = the app) counts requests
(success / fail, end-to-end nanoseconds), and each of its tasks is reported beside it as a
*composing model* named ``{app}.{task}``, with what Triton users miss for their ensembles: where
each step's time goes. Per task, cumulative counts and nanoseconds (Triton's ``{count, ns}``):

- ``queue``: from the item's arrival in the worker's ring to its batch's start;
- ``compute_input``: the hop into the task, the ring from the frontend or from the upstream
  task (push -> pop by the worker): the per-hop time between tasks;
- ``compute_infer``: the batch's execution as seen by the item;
- ``compute_output``: the completion record's ring back to the frontend, for the items whose
  record woke it (a record that handed work on to children is counted by its children);
- ``success`` / ``fail``: items done / items dropped or failed by the task;
- ``batch_stats``: per executed batch size, executions and their compute nanoseconds
  (``execution_count``: the batches).

The app's ``queue`` / ``compute_*`` are its tasks' sums (as Triton's ensemble entry). The
dispatcher feeds it (``request_done`` as it answers, ``task_series`` for its completion records);
``/metrics`` exports the same numbers under Triton's ``nv_inference_*`` names.
"""

from __future__ import annotations

import time
from typing import Any

# a task's counters, one flat list (the hot path indexes it): items ok, queue us, hop us, compute us,
# output-hop count, output-hop us, executions (batches: each item adds 1/its batch size)
T_OK, T_QUEUE, T_HOP, T_INFER, T_OUT_N, T_OUT_NS, T_EXEC = range(7)
TASK_WORDS = 7


class AppStats:
    """One app's request counters (the ensemble entry)."""

    __slots__ = ("fail", "fail_ns", "last_ms", "ok", "ok_ns")

    def __init__(self) -> None:
        self.ok = self.ok_ns = self.fail = self.fail_ns = 0
        self.last_ms = 0


class ModelStats:
    """The shared statistics: what the dispatcher counts, read by the stats routes and ``/metrics``."""

    def __init__(self) -> None:
        self.apps: dict[str, AppStats] = {}
        self.tasks: dict[tuple[str, str], list[float]] = {}  # (app, task) -> TASK_WORDS counters
        self.batches: dict[tuple[str, str], dict[int, list[float]]] = {}  # -> batch size -> [n, ns]

    # ---- fed by the dispatcher --------------------------------------------------------------
    def request_done(self, app: str, ok: bool, duration_ns: int) -> None:
        s = self.apps.get(app)
        if s is None:
            s = self.apps[app] = AppStats()
        if ok:
            s.ok += 1
            s.ok_ns += duration_ns
        else:
            s.fail += 1
            s.fail_ns += duration_ns
        s.last_ms = time.time_ns() // 1_000_000

    def task_series(self, app: str, task: str) -> tuple[list[float], dict[int, list[float]]]:
        """The counters of (app, task), created empty; the dispatcher keeps and counts into them
        (``count_item``)."""
        key = (app, task)
        t = self.tasks.get(key)
        if t is None:
            t = self.tasks[key] = [0.0] * TASK_WORDS
            self.batches[key] = {}
        return t, self.batches[key]


def count_item(t: list[float], batches: dict[int, list[float]], queue_us: float, hop_us: float,
               compute_us: float, done_us: float, batch: int) -> None:
    """Count one OK completion record of a task into its ``task_series``: an item that ran in a
    batch of ``batch`` items for ``compute_us``. Each item counts 1/batch of its batch's execution,
    so the executions and their time add up per batch whatever order the records come in."""
    t[T_OK] += 1
    t[T_QUEUE] += queue_us
    t[T_HOP] += hop_us
    t[T_INFER] += compute_us
    if done_us >= 0:
        t[T_OUT_N] += 1
        t[T_OUT_NS] += done_us
    share = 1.0 / batch if batch > 0 else 1.0
    t[T_EXEC] += share
    b = batches.get(batch)
    if b is None:
        b = batches[batch] = [0.0, 0.0]
    b[0] += share
    b[1] += compute_us * share


def _d(count: float, us: float) -> dict[str, int]:
    return {"count": round(count), "ns": round(us * 1000)}


def _zero() -> dict[str, int]:
    return {"count": 0, "ns": 0}


def task_entry(app: str, task: str, t: list[float], batches: dict[int, list[float]], failed: float
               ) -> dict[str, Any]:
    """Triton's ``ModelStatistics`` of one task, as a composing model of its app."""
    ok = t[T_OK]
    return {
        "name": f"{app}.{task}", "version": "1", "last_inference": 0,
        "inference_count": round(ok), "execution_count": round(t[T_EXEC]),
        "inference_stats": {
            "success": _d(ok, t[T_QUEUE] + t[T_HOP] + t[T_INFER]), "fail": _d(failed, 0.0),
            "queue": _d(ok, t[T_QUEUE]), "compute_input": _d(ok, t[T_HOP]),
            "compute_infer": _d(ok, t[T_INFER]), "compute_output": _d(t[T_OUT_N], t[T_OUT_NS]),
            "cache_hit": _zero(), "cache_miss": _zero()},
        "batch_stats": [{"batch_size": size, "compute_input": _zero(), "compute_infer": _d(n, us),
                         "compute_output": _zero()}
                        for size, (n, us) in sorted(batches.items())],
        "memory_usage": [],
    }


def app_entries(stats: ModelStats, app: str, tasks: tuple[str, ...], failed_by_task: dict[str, float]
                ) -> list[dict[str, Any]]:
    """The app's entry (an ensemble: its tasks' sums) followed by one entry per task."""
    s = stats.apps.get(app) or AppStats()
    entries = []
    sums = {"queue": [0, 0], "compute_input": [0, 0], "compute_infer": [0, 0], "compute_output": [0, 0]}
    for task in tasks:
        t, batches = stats.tasks.get((app, task)) or [0.0] * TASK_WORDS, stats.batches.get((app, task), {})
        e = task_entry(app, task, t, batches, failed_by_task.get(task, 0.0))
        e["last_inference"] = s.last_ms
        for k, acc in sums.items():
            acc[1] += e["inference_stats"][k]["ns"]
        entries.append(e)
    n = s.ok + s.fail
    for acc in sums.values():
        acc[0] = s.ok
    head = {
        "name": app, "version": "1", "last_inference": s.last_ms, "inference_count": n, "execution_count": n,
        "inference_stats": {"success": {"count": s.ok, "ns": s.ok_ns},
                            "fail": {"count": s.fail, "ns": s.fail_ns},
                            **{k: {"count": c, "ns": ns} for k, (c, ns) in sums.items()},
                            "cache_hit": _zero(), "cache_miss": _zero()},
        "batch_stats": [], "memory_usage": [],
    }
    return [head, *entries]
