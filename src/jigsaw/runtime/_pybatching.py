"""Pure-Python batching queue with deadline-aware dropping: the fallback for ``jigsaw._core.BatchQueue``."""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from typing import Any

_HOP_SENT, _HOP_POPPED = 0, 1  # ``runtime/records.py``'s hop slots (a record's ring entry, its pop)

Entry = tuple[int, int, int, Any]
"""``(request_id, deadline_ns, arrival_ns, item)`` as returned by ``next_batch`` and ``drain``."""

Dropped = tuple[int, int, int, Any, "DropReason"]
"""``(request_id, deadline_ns, arrival_ns, item, reason)`` as returned by ``expired``."""

Taken = tuple[list[Any] | None, list[int] | None, list[Any] | None, Sequence[Dropped], Sequence[Any], int,
              int]
"""``(items, request_ids, tensors, dropped, refused, first, passed_over_ns)``: ``take_batch``'s."""


class DropReason(enum.IntEnum):
    """Why a request left the queue without being served; equal to the matching ring ``Status``."""

    DROP_DEADLINE = 1
    DROP_STALE = 2


def _exec_table(exec_estimate_ns: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(exec_estimate_ns, int):
        table: tuple[int, ...] = (exec_estimate_ns,)
    else:
        table = tuple(int(x) for x in exec_estimate_ns)
    if not table or any(x < 0 for x in table):
        raise ValueError("exec_estimate_ns must be a non-negative int or a non-empty table of them")
    return table


class BatchQueue:
    """Bounded per-instance request queue implementing the paper's batching and early-drop rules (§3.3).

    Release (``next_batch``): up to ``max_batch`` requests, oldest arrival first (earlier deadline
    first among equal arrivals), are released when the queue holds ``max_batch`` requests, or when
    the oldest has waited ``max_wait_ns`` (``now - arrival >= max_wait_ns``), or when the caller says
    the instance is ``idle`` (its previous batch finished) and the queue is non-empty. The caller asks
    only when it can start a batch.

    Drop (``expired``): a request is dropped with ``DROP_DEADLINE`` when even a batch of one on this
    instance followed by the fastest variants of the remaining tasks cannot meet its deadline:
    ``now + exec_estimate_ns[0] + remaining_min_ns > deadline_ns``; and with ``DROP_STALE`` when it
    has waited longer than ``staleness_ns`` (``now - arrival > staleness_ns``) without being picked up.
    A request that qualifies for both is reported as ``DROP_DEADLINE``. Call ``expired`` before
    ``next_batch`` so a batch never carries a request that cannot make its deadline.

    ``exec_estimate_ns`` is this instance's own latency: one int (batch of one) or a table indexed by
    batch size - 1. All times are CLOCK_MONOTONIC ns (``time.monotonic_ns``).

    Costs: ``push`` O(log n) when arrivals come in non-decreasing order (the worker stamps
    ``arrival_ns`` on dequeue), plus O(k) for the k queued requests an out-of-order arrival overtakes;
    each request removed costs O(log n). Storage: a doubly linked list in (arrival, deadline) order
    and an indexed binary min-heap by (deadline, push order); ``capacity`` is a hard bound.
    """

    def __init__(self, max_batch: int, max_wait_ns: int, capacity: int, staleness_ns: int,
                 remaining_min_ns: int, exec_estimate_ns: int | Sequence[int]) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if max_wait_ns < 0 or staleness_ns < 0 or remaining_min_ns < 0:
            raise ValueError("max_wait_ns, staleness_ns and remaining_min_ns must be >= 0")
        self._exec_table_ns = _exec_table(exec_estimate_ns)
        self._max_batch = int(max_batch)
        self._capacity = int(capacity)
        self._max_wait_ns = int(max_wait_ns)
        self._staleness_ns = int(staleness_ns)
        self._remaining_min_ns = int(remaining_min_ns)
        self._seq_counter = 0
        self._n = 0
        # slot arrays
        self._rid = [0] * capacity
        self._deadline = [0] * capacity
        self._arrival = [0] * capacity
        self._seq = [0] * capacity
        self._items: list[Any] = [None] * capacity
        self._prev = [-1] * capacity
        self._next = [*range(1, capacity), -1]
        self._hpos = [0] * capacity
        self._heap = [0] * capacity
        self._free = 0
        self._first = -1
        self._last = -1

    @property
    def max_batch(self) -> int:
        return self._max_batch

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def max_wait_ns(self) -> int:
        return self._max_wait_ns

    @property
    def staleness_ns(self) -> int:
        return self._staleness_ns

    @property
    def exec_estimate_ns(self) -> tuple[int, ...]:
        return self._exec_table_ns

    @property
    def remaining_min_ns(self) -> int:
        return self._remaining_min_ns

    @remaining_min_ns.setter
    def remaining_min_ns(self, value: int) -> None:
        if value < 0:
            raise ValueError("remaining_min_ns must be >= 0")
        self._remaining_min_ns = int(value)

    def __len__(self) -> int:
        return self._n

    def _hless(self, a: int, b: int) -> bool:
        da, db = self._deadline[a], self._deadline[b]
        return da < db if da != db else self._seq[a] < self._seq[b]

    def _sift_up(self, i: int) -> None:
        heap, hpos = self._heap, self._hpos
        slot = heap[i]
        while i > 0:
            parent = (i - 1) >> 1
            if not self._hless(slot, heap[parent]):
                break
            heap[i] = heap[parent]
            hpos[heap[i]] = i
            i = parent
        heap[i] = slot
        hpos[slot] = i

    def _sift_down(self, i: int) -> None:
        heap, hpos, n = self._heap, self._hpos, self._n
        slot = heap[i]
        while True:
            child = 2 * i + 1
            if child >= n:
                break
            if child + 1 < n and self._hless(heap[child + 1], heap[child]):
                child += 1
            if not self._hless(heap[child], slot):
                break
            heap[i] = heap[child]
            hpos[heap[i]] = i
            i = child
        heap[i] = slot
        hpos[slot] = i

    def _remove(self, slot: int) -> Entry:
        p, q = self._prev[slot], self._next[slot]
        if p != -1:
            self._next[p] = q
        else:
            self._first = q
        if q != -1:
            self._prev[q] = p
        else:
            self._last = p
        i = self._hpos[slot]
        last = self._n - 1
        self._n = last
        if i != last:
            moved = self._heap[last]
            self._heap[i] = moved
            self._hpos[moved] = i
            self._sift_up(i)
            if self._hpos[moved] == i:
                self._sift_down(i)
        item = self._items[slot]
        self._items[slot] = None
        self._next[slot] = self._free
        self._free = slot
        return (self._rid[slot], self._deadline[slot], self._arrival[slot], item)

    def take_framed(self, ring: Any, max_n: int, passed_over_ns: int, tag: Any) -> tuple[int, Sequence[Any]]:
        """Pop up to ``max_n`` framed records from ``ring`` (a ``rings.ShmRing``) into the queue as
        items ``(header, credit, tensors, tag)``: a worker's intake, one call per ring (the compiled
        core's is one pass). Each header is stamped ``HOP_POPPED`` now; the item arrives now, or
        at its ring-entry time (``HOP_SENT``) when that is not after ``passed_over_ns`` (an item
        a full batch passed over: see ``Worker.take_inputs``). Returns the records popped and the
        items the queue had no room for (to be answered as rejected)."""
        got = ring.pop_many_framed(max_n)
        if not got:
            return 0, ()
        now = time.monotonic_ns()
        refused = []
        for header, credit, tensors in got:
            header.stamp(_HOP_POPPED, now)
            arrival = now
            if passed_over_ns > 0:  # (``hops`` builds a tuple: read only where it can matter)
                sent = header.hops[_HOP_SENT]
                if 0 < sent <= passed_over_ns:
                    arrival = sent
            item = (header, credit, tensors, tag)
            if not self.push(header.request_id, header.deadline_ns, arrival, item):
                refused.append(item)
        return len(got), refused

    def take_batch(self, rings: Sequence[Any], tags: Sequence[Any], first: int,
                   passed_over_ns: int) -> Taken:
        """A worker's intake and release in one call (the compiled core's keeps a lone record's
        pop, drop checks and release out of the interpreter): top the queue up to one batch from
        ``rings`` (``rings.ShmRing``; ``take_framed`` each, ``tags[i]`` tagging ``rings[i]``'s
        items), visiting them round-robin from ``first``, which moves on by one each round when
        there are several; drop what can no longer make its deadline or went stale (``expired``,
        after a round that filled the batch and once at the end); then release the next batch as
        ``next_batch(now, idle=True)`` does (the caller asks only when it can run one).

        ``passed_over_ns`` is the last time a full batch left items in the rings: it comes back
        as now when this call leaves the queue full and a ring not empty, else unchanged.

        Returns ``(items, request_ids, tensors, dropped, refused, first, passed_over_ns)``: the
        batch's items (``(header, credit, tensors, tag)``, oldest first; None when the queue is
        empty), their request ids and tensors (the backend's arguments), the ``expired`` entries
        dropped, the items the queue had no room for (popped, to be answered as rejected), and
        the round-robin start and passed-over time for the next call."""
        if len(tags) != len(rings):
            raise ValueError(f"{len(rings)} rings but {len(tags)} tags")
        k = len(rings)
        dropped: list[Dropped] = []
        refused: list[Any] = []
        while self._n < self._max_batch:
            wanted = self._max_batch - self._n
            taken = 0
            start = first % k if k else 0
            for at in (*range(start, k), *range(start)):  # round-robin from ``first``
                if taken == wanted:
                    break
                popped, no_room = self.take_framed(rings[at], wanted - taken, passed_over_ns, tags[at])
                refused.extend(no_room)
                taken += popped
            if k > 1:
                first = (start + 1) % k
            if taken < wanted:  # every ring gave all it held: no second look
                break
            dropped.extend(self.expired(time.monotonic_ns()))
        if self._n:
            dropped.extend(self.expired(time.monotonic_ns()))
        if self._n >= self._max_batch and any(len(ring) for ring in rings):
            passed_over_ns = time.monotonic_ns()
        batch = self.next_batch(time.monotonic_ns(), True)
        if batch is None:
            return None, None, None, dropped, refused, first, passed_over_ns
        items = [entry[3] for entry in batch]
        return (items, [entry[0] for entry in batch], [item[2] for item in items], dropped, refused, first,
                passed_over_ns)

    def push(self, request_id: int, deadline_ns: int, arrival_ns: int, item: Any) -> bool:
        """Queue one request; False when the queue holds ``capacity`` requests."""
        if not 0 <= request_id < 1 << 64:
            raise OverflowError(f"request_id {request_id} does not fit in u64")
        if not (-(1 << 63) <= deadline_ns < 1 << 63 and -(1 << 63) <= arrival_ns < 1 << 63):
            raise OverflowError("deadline_ns and arrival_ns must fit in i64")
        if self._n >= self._capacity:
            return False
        slot = self._free
        self._free = self._next[slot]
        self._rid[slot] = request_id
        self._deadline[slot] = deadline_ns
        self._arrival[slot] = arrival_ns
        self._seq[slot] = self._seq_counter
        self._seq_counter += 1
        self._items[slot] = item
        arrival, deadline, prev, nxt = self._arrival, self._deadline, self._prev, self._next
        p = self._last
        while p != -1 and (arrival[p] > arrival_ns
                           or (arrival[p] == arrival_ns and deadline[p] > deadline_ns)):
            p = prev[p]
        prev[slot] = p
        if p == -1:
            nxt[slot] = self._first
            self._first = slot
        else:
            nxt[slot] = nxt[p]
            nxt[p] = slot
        if nxt[slot] == -1:
            self._last = slot
        else:
            prev[nxt[slot]] = slot
        self._heap[self._n] = slot
        self._hpos[slot] = self._n
        self._n += 1
        self._sift_up(self._n - 1)
        return True

    def next_batch(self, now_ns: int, idle: bool) -> list[Entry] | None:
        """Release up to ``max_batch`` oldest requests if a release rule holds, else None."""
        n = self._n
        if n == 0:
            return None
        if not (idle or n >= self._max_batch or now_ns - self._arrival[self._first] >= self._max_wait_ns):
            return None
        return [self._remove(self._first) for _ in range(min(n, self._max_batch))]

    def expired(self, now_ns: int) -> list[Dropped]:
        """Remove and return ``(request_id, deadline_ns, arrival_ns, item, reason)`` to drop now."""
        slack_ns = self._exec_table_ns[0] + self._remaining_min_ns
        out: list[Dropped] = []
        while self._n and self._deadline[self._heap[0]] - now_ns < slack_ns:
            out.append((*self._remove(self._heap[0]), DropReason.DROP_DEADLINE))
        while self._n and now_ns - self._arrival[self._first] > self._staleness_ns:
            out.append((*self._remove(self._first), DropReason.DROP_STALE))
        return out

    def next_wakeup_ns(self, now_ns: int) -> int | None:
        """Earliest time a release or drop rule can next fire (>= now_ns), or None when empty."""
        if self._n == 0:
            return None
        if self._n >= self._max_batch:
            return now_ns
        oldest = self._arrival[self._first]
        slack_ns = self._exec_table_ns[0] + self._remaining_min_ns
        t = min(oldest + self._max_wait_ns, oldest + self._staleness_ns + 1,
                self._deadline[self._heap[0]] - slack_ns + 1)
        return max(t, now_ns)

    def drain(self) -> list[Entry]:
        """Remove and return every queued request, oldest first (shutdown, reconfiguration)."""
        return [self._remove(self._first) for _ in range(self._n)]

    def __repr__(self) -> str:
        return (f"<BatchQueue {self._n}/{self._capacity} max_batch={self._max_batch} "
                f"max_wait_ns={self._max_wait_ns}>")
