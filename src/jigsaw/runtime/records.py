"""What the data plane's ring records mean: payload framing, hop-stamp slots, credits.

Every payload is ``u64 credit`` followed by a tensor payload (``jigsaw.tensors``).

Credits make completion race-free across processes (termination detection by credit
splitting): a request starts with ``TOTAL_CREDIT`` split among its root items; an item that
spawns c children splits its credit into c + 1 shares, one for each child and one that its own
completion record returns (so the request cannot complete before that record, which carries
``child_count``, arrives); an item that ends (a sink, an item with no children, a drop) returns
its credit to the frontend. The request is
complete exactly when the returned credits sum to ``TOTAL_CREDIT``, whatever order the
completion rings deliver in.

Work records (frontend -> task, task -> task): ``task`` is the destination task's index in the
app, ``hops[HOP_SENT]`` the send time. Completion records (task -> frontend): one per item a
task finished or dropped; ``task`` is that task, ``status`` a ``Status``, ``child_count`` the
children it spawned, and the hop slots below hold that item's timeline on that task.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

TOTAL_CREDIT = 1 << 62

HOP_SENT = 0  # producer pushed the record to this task's ring
HOP_POPPED = 1  # the worker took it off the ring
HOP_START = 2  # its batch started executing
HOP_END = 3  # its batch finished
HOP_DONE = 4  # completion record pushed
HOP_BATCH = 5  # not a time: the size of the batch it ran in

_CREDIT = struct.Struct("<Q")
CREDIT_BYTES = _CREDIT.size


def frame(credit: int, tensors: bytes | bytearray | memoryview) -> bytes:
    """A ring payload: the item's credit followed by its encoded tensors (one copy of them)."""
    return b"".join((_CREDIT.pack(credit), tensors))


def unframe(payload: bytes) -> tuple[int, memoryview]:
    """``(credit, tensors)``; raises ValueError on a payload too short to carry a credit."""
    if len(payload) < CREDIT_BYTES:
        raise ValueError(f"payload of {len(payload)} bytes has no credit")
    return _CREDIT.unpack_from(payload, 0)[0], memoryview(payload)[CREDIT_BYTES:]


def split_credit(credit: int, n: int) -> list[int]:
    """Split ``credit`` into ``n`` positive shares summing to it (remainder to the first)."""
    if n < 1 or n > credit:
        raise ValueError(f"cannot split credit {credit} into {n} positive shares")
    share, rest = divmod(credit, n)
    return [share + rest] + [share] * (n - 1)


TRACE_DIR = os.environ.get("JIGSAW_HOP_TRACE", "")
"""A directory: each data-plane process then writes every record's timeline there when it stops
(``<role>-<pid>.json``), for ``bench/dataplane.py --breakdown``. Unset (the default): nothing is kept."""


def write_trace(role: str, columns: list[str], rows: list[list[int]]) -> None:
    """Write one process's timelines (monotonic ns) to ``TRACE_DIR`` (see there)."""
    path = Path(TRACE_DIR) / f"{role}-{os.getpid()}.json"
    path.write_text(json.dumps({"role": role, "columns": columns, "rows": rows}))
