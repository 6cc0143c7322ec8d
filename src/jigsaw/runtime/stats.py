"""A small shared-memory block where each worker process publishes its state and counters.

One 128-byte slot per process (16 little-endian u64, written by that process, read by the
frontend for routing, readiness and metrics; the daemon's supervisor writes ``state`` of a
process it found dead)::

    0 state     0 starting, 1 ready, 2 stopped, 3 dead (being restarted), 4 failed (given up)
    1 pid
    2 queued    items popped but not yet finished (queue + running batch)
    3 busy_ns   time spent executing batches
    4 batches   batches executed
    5 items     items executed
    6 started_ns  CLOCK_MONOTONIC when the process became ready
    7 dropped   items dropped by this process
    8 heartbeat_ns  CLOCK_MONOTONIC of the process's last event-loop turn (a stale one: hung)
    9 batch_started_ns  CLOCK_MONOTONIC when the running batch started; 0 between batches
    10 ring_queued  records waiting in the process's input rings (published with ``queued``): a
                task's queue stays in its rings until the process can batch it, so ``queued``
                alone hides the backlog of every task past the root (whose ring the frontend reads)
    11-15       reserved

After the slots, one *batch record* per process (``batch_ids + 1`` words: the number of items of
the batches it is executing, 0 between batches, then their request ids), then two words: the number
of slots and ``batch_ids``. The record is how a crash is attributed: a worker that dies while a
batch runs leaves the batch's request ids behind, and the supervisor answers those requests (the
suspects) instead of sending them into the next crash (``runtime/supervisor.py``). A batch longer
than ``batch_ids`` records its first ``batch_ids`` items only.

Readers may see a slightly stale value; nothing depends on a consistent snapshot.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Iterable
from typing import TypeVar

import posix_ipc

SLOT_WORDS = 16
(STATE, PID, QUEUED, BUSY_NS, BATCHES, ITEMS, STARTED_NS, DROPPED, HEARTBEAT_NS, BATCH_STARTED_NS,
 RING_QUEUED) = range(11)
STARTING, READY, STOPPED, DEAD, FAILED = 0, 1, 2, 3, 4
DEFAULT_BATCH_IDS = 128  # request ids a batch record holds (the paper's largest batch)
IN_FLIGHT_MAX = 2  # batches a process may keep in flight (``runtime/in_flight.py``); its record holds all

T = TypeVar("T")


def routable(candidates: Iterable[T], state_of: Callable[[T], int], load_of: Callable[[T], float]) -> list[T]:
    """Where to send work, least loaded first: the processes not found dead or failed.

    When every candidate is dead, those being restarted are returned (the item waits in the ring
    for the new process); none when every one has failed for good. The frontend and the workers
    route by this one rule. A lone live candidate is returned as given (the common case of a
    task with one process, on every hop's path: no lists built, no sort).
    """
    if isinstance(candidates, list) and len(candidates) == 1 \
            and state_of(candidates[0]) not in (DEAD, FAILED):
        return candidates
    live, restarting = [], []
    for c in candidates:
        state = state_of(c)
        if state == DEAD:
            restarting.append(c)
        elif state != FAILED:
            live.append(c)
    return sorted(live or restarting, key=load_of)


class StatsBlock:
    """A mapping of the block; ``create`` in the daemon (which unlinks it), ``attach`` in workers."""

    def __init__(self, name: str, mm: mmap.mmap) -> None:
        self.name = name
        self._mm = mm
        self._words = memoryview(mm).cast("Q")
        self.num_slots, self.batch_ids = self._words[-2], self._words[-1]
        self._records = self.num_slots * SLOT_WORDS  # the first batch record's word

    @staticmethod
    def size_bytes(num_slots: int, batch_ids: int) -> int:
        return (num_slots * (SLOT_WORDS + batch_ids + 1) + 2) * 8

    @classmethod
    def create(cls, name: str, num_slots: int, batch_ids: int = DEFAULT_BATCH_IDS) -> StatsBlock:
        """A block of ``num_slots`` slots whose batch records hold ``batch_ids`` request ids each
        (the largest max batch of the processes it serves)."""
        num_slots, batch_ids = max(1, num_slots), max(1, batch_ids)
        size = cls.size_bytes(num_slots, batch_ids)
        shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size)
        try:
            mm = mmap.mmap(shm.fd, size)
        finally:
            shm.close_fd()
        words = memoryview(mm).cast("Q")
        words[-2], words[-1] = num_slots, batch_ids
        words.release()
        return cls(name, mm)

    @classmethod
    def attach(cls, name: str) -> StatsBlock:
        shm = posix_ipc.SharedMemory(name)
        try:
            size = shm.size
            mm = mmap.mmap(shm.fd, size)
        finally:
            shm.close_fd()
        return cls(name, mm)

    @property
    def words(self) -> memoryview:
        """The block as u64 words (slot ``s``'s word ``w`` at ``s * SLOT_WORDS + w``): what the
        compiled core reads a consumer's state from (``rings.push_hops``)."""
        return self._words

    def get(self, slot: int, word: int) -> int:
        return self._words[slot * SLOT_WORDS + word]

    def set(self, slot: int, word: int, value: int) -> None:
        self._words[slot * SLOT_WORDS + word] = value

    def add(self, slot: int, word: int, delta: int) -> None:
        i = slot * SLOT_WORDS + word
        self._words[i] = self._words[i] + delta

    def batch_started(self, slot: int, started_ns: int, request_ids: list[int]) -> None:
        """A batch of ``request_ids`` starts at ``started_ns``: its record first, then its start
        stamp (the supervisor reads the record of a process that dies while the stamp is set)."""
        words = self._words
        r = self._records + slot * (self.batch_ids + 1)
        n = min(len(request_ids), self.batch_ids)
        for k in range(n):  # (a loop: a slice assignment needs a 'Q' buffer built first)
            words[r + 1 + k] = request_ids[k]
        words[r] = n
        words[slot * SLOT_WORDS + BATCH_STARTED_NS] = started_ns

    def record_at(self, slot: int) -> int:
        """The word of slot ``slot``'s batch record (its item count; the ids follow)."""
        return self._records + slot * (self.batch_ids + 1)

    def batch_record(self, slot: int) -> list[int]:
        """The request ids of the batch the process of ``slot`` is executing ([] between batches)."""
        r = self._records + slot * (self.batch_ids + 1)
        n = min(self._words[r], self.batch_ids)
        return list(self._words[r + 1:r + 1 + n])

    def move_batch_record(self, src: int, dst: int) -> None:
        """Copy slot ``src``'s batch record to ``dst`` (a process rewired mid-batch), clear ``src``'s."""
        width = self.batch_ids + 1
        a, b = self._records + src * width, self._records + dst * width
        self._words[b:b + width] = self._words[a:a + width]
        self._words[a] = 0

    def clear_batch(self, slot: int) -> None:
        """No batch runs in ``slot``'s process (its start stamp and record cleared)."""
        self._words[slot * SLOT_WORDS + BATCH_STARTED_NS] = 0
        self._words[self._records + slot * (self.batch_ids + 1)] = 0

    def batch_done(self, slot: int, busy_ns: int, num_items: int) -> None:
        """A batch of ``num_items`` that ran ``busy_ns`` has ended: its start stamp and record are
        cleared (the supervisor's batch watch) and the busy, batch and item counters advance. One
        call on every batch's path, where four ``set``/``add`` calls were."""
        words, i = self._words, slot * SLOT_WORDS
        words[i + BATCH_STARTED_NS] = 0
        words[self._records + slot * (self.batch_ids + 1)] = 0
        words[i + BUSY_NS] += busy_ns
        words[i + BATCHES] += 1
        words[i + ITEMS] += num_items

    def close(self) -> None:
        if self._mm is not None:
            self._words.release()
            self._mm.close()
            self._mm = None  # type: ignore[assignment]
