"""What a worker answers for an item its backend could not serve, instead of dying.

A worker process serves many requests; one request's bad input, or a model that fails on it,
must cost that request only (an answer 500 naming the task), never the process, its queue, the
instance's capacity or a re-plan. These are the worker's pure helpers for that: the error an item
gets (``item_error``), whether an item's outputs fit their rings (``oversized``), whether a
backend's answer is one result per item (``check_results``), and a rate-limited log line
(``ErrorLog``: a stream of poison requests must not flood the daemon's log).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from jigsaw.backends.base import ItemResult
from jigsaw.tensors import encode_tensors

LOG_EVERY_S = 5.0  # at most one line per this many seconds; the others are counted in the next
ERROR_BYTES = 1000  # an error message is cut to this many characters (it travels in the answer)


def item_error(task: str, variant: str, exc: BaseException) -> ItemResult:
    """The result of an item the backend raised on: its request is answered 500 naming the task."""
    text = f"{type(exc).__name__}: {exc}"
    return ItemResult([], {}, f"task {task!r} ({variant}) failed on this request: {text}"[:ERROR_BYTES])


def check_results(results: Any, n: int) -> list[ItemResult]:
    """``results`` as a list when it is one ``ItemResult`` per item of a batch of ``n``; else a
    ``ValueError`` (a backend bug is contained like a backend error)."""
    if not isinstance(results, list):
        results = list(results)
    if len(results) != n:
        raise ValueError(f"the backend returned {len(results)} results for a batch of {n}")
    return results


def oversized(task: str, result: ItemResult, answer_limit: int, child_limits: dict[str, int]) -> str:
    """Why ``result`` cannot leave the worker ("" when it can): its answered outputs (a sink's,
    ``answer_limit`` > 0) encode larger than the completion ring takes, or a child for task t is
    larger than ``child_limits[t]`` (the smallest ``max_payload_bytes`` of t's rings from here)."""
    for child_task, bodies in result.children.items():
        limit = child_limits.get(child_task)
        if limit is None:
            continue
        for body in bodies:
            if len(body) > limit:
                return (f"task {task!r}: its output for task {child_task!r} is {len(body)} bytes, over the "
                        f"{limit} bytes its ring carries (raise the app's max_item_bytes)")
    if answer_limit > 0:
        size = len(encode_tensors(result.outputs))
        if size > answer_limit:
            names = ", ".join(f"{t.name} {list(t.shape)}" for t in result.outputs)
            return (f"task {task!r}: its outputs ({names}) are {size} bytes, over the {answer_limit} bytes "
                    f"an answer carries (raise the app's max_item_bytes)")
    return ""


class ErrorLog:
    """One line on stderr (the daemon's log) per contained error, at most one per ``LOG_EVERY_S``."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.count = 0  # contained errors since the process started
        self._last_s = 0.0
        self._unlogged = 0

    def note(self, what: BaseException | str) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self._last_s < LOG_EVERY_S:
            self._unlogged += 1
            return
        text = what if isinstance(what, str) else f"{type(what).__name__}: {what}"
        more = f" ({self._unlogged} more since the last line)" if self._unlogged else ""
        print(f"worker {self.worker}: answered 500 for an item it could not serve: {text[:300]}{more}",
              file=sys.stderr, flush=True)
        self._last_s, self._unlogged = now, 0

