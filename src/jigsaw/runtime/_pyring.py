"""Pure-Python shared-memory SPSC ring: the fallback for ``jigsaw._core.ShmRing``.

Byte-compatible with the compiled ring: both read the layout declared once in ``native/core.pxd``
(this module through the generated ``jigsaw.runtime.ring_layout``), so a pure producer and a
compiled consumer can share one segment. The layout is described on :class:`ShmRing`.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import time
from collections.abc import Sequence
from typing import Any

import posix_ipc

from jigsaw.runtime.ring_layout import (
    CLOSED_OFFSET,
    CONSUMER_PID_OFFSET,
    CONTROL_BYTES,
    FRAME_BYTES,
    HEAD_OFFSET,
    HEADER_BYTES,
    HEADER_FIELDS,
    KIND_DATA,
    KIND_SKIP,
    MAGIC,
    MIN_CAPACITY_BYTES,
    NUM_HOPS,
    POPPED_OFFSET,
    PRODUCER_PID_OFFSET,
    PUSHED_OFFSET,
    RECORD_OVERHEAD_BYTES,
    TAIL_OFFSET,
    VERSION,
)

_CONTROL = struct.Struct("<QIIQQIII")  # magic, version, control_bytes, capacity, max_payload, pids, closed
_CREDIT = struct.Struct("<Q")  # the data plane's payload framing (``runtime/records.py``)
_FRAME = struct.Struct("<II")
_RECORD = struct.Struct("<II" + "".join(f"{n}{code}" if n > 1 else code for _, code, n in HEADER_FIELDS))
assert _FRAME.size == FRAME_BYTES and _RECORD.size == RECORD_OVERHEAD_BYTES == FRAME_BYTES + HEADER_BYTES
assert HEADER_FIELDS[-1] == ("hops", "Q", NUM_HOPS)
_U64_TAIL = TAIL_OFFSET // 8
_U64_PUSHED = PUSHED_OFFSET // 8
_U64_HEAD = HEAD_OFFSET // 8
_U64_POPPED = POPPED_OFFSET // 8
_U32_PRODUCER_PID = PRODUCER_PID_OFFSET // 4
_U32_CONSUMER_PID = CONSUMER_PID_OFFSET // 4
_U32_CLOSED = CLOSED_OFFSET // 4


class RingClosedError(ConnectionError):
    """Raised by ``push`` on a ring whose closed flag is set: the peer has gone or said EOF."""


class RingCorruptError(RuntimeError):
    """The ring's contents violate its invariants (a peer wrote garbage or the segment was reused)."""


def _align8(n: int) -> int:
    return (n + 7) & ~7


def default_max_payload_bytes(capacity_bytes: int) -> int:
    """Largest payload that can always be pushed into an empty ring of this capacity.

    A record may need the tail of the data area as a skip record plus its own bytes; bounding a
    record by half the capacity guarantees that an empty ring always accepts it.
    """
    return (capacity_bytes // 2 - RECORD_OVERHEAD_BYTES) & ~7


# The hop slots (``runtime/records.py``'s HOP_SENT, HOP_POPPED, HOP_START, HOP_END, HOP_DONE,
# HOP_BATCH) ``pop_completions`` reads; the compiled core declares the same (a test compares them).
HOP_SLOTS = (0, 1, 2, 3, 4, 5)
_SENT, _POPPED, _START, _END, _DONE, _BATCH = HOP_SLOTS

# A completion record as ``pop_completions`` returns it.
Completion = tuple[int, int, int, int, int, int, bytes, float, float, int, float, int]


def _span_us(start_ns: int, end_ns: int) -> float:
    """``end - start`` in microseconds, 0 when the stamps are out of order (or missing)."""
    return (end_ns - start_ns) / 1e3 if end_ns > start_ns else 0.0


class RecordHeader:
    """Fixed per-record metadata; mutable so a worker can stamp hops and status before forwarding.

    ``hops`` holds 8 CLOCK_MONOTONIC ns stamps (enqueue/dequeue per hop); ``payload_len`` is
    filled in by the ring on push and pop.
    """

    __slots__ = ("_hops", "app", "child_count", "child_index", "created_ns", "deadline_ns", "flags",
                 "lane", "parent_id", "payload_len", "request_id", "status", "task")

    def __init__(self, request_id: int = 0, parent_id: int = 0, app: int = 0, task: int = 0, lane: int = 0,
                 child_index: int = 0, child_count: int = 0, status: int = 0, flags: int = 0,
                 deadline_ns: int = 0, created_ns: int = 0, hops: Sequence[int] = (),
                 payload_len: int = 0) -> None:
        self.request_id = request_id
        self.parent_id = parent_id
        self.app = app
        self.task = task
        self.lane = lane
        self.child_index = child_index
        self.child_count = child_count
        self.status = status
        self.flags = flags
        self.deadline_ns = deadline_ns
        self.created_ns = created_ns
        self.hops = hops
        self.payload_len = payload_len

    @property
    def hops(self) -> tuple[int, ...]:
        return tuple(self._hops)

    @hops.setter
    def hops(self, values: Sequence[int]) -> None:
        if len(values) > NUM_HOPS:
            raise ValueError(f"at most {NUM_HOPS} hop timestamps, got {len(values)}")
        self._hops = [*values, *(0,) * (NUM_HOPS - len(values))]

    def stamp(self, hop: int, ns: int) -> None:
        """Record the time ``ns`` in hop slot ``hop`` (0..7)."""
        if not 0 <= hop < NUM_HOPS:
            raise IndexError(f"hop index {hop} out of range 0..{NUM_HOPS - 1}")
        self._hops[hop] = ns

    def as_tuple(self) -> tuple[Any, ...]:
        return (self.request_id, self.parent_id, self.app, self.task, self.lane, self.child_index,
                self.child_count, self.status, self.flags, self.deadline_ns, self.created_ns,
                tuple(self._hops), self.payload_len)

    def copy(self) -> RecordHeader:
        h = RecordHeader.__new__(RecordHeader)
        for name in RecordHeader.__slots__:
            setattr(h, name, getattr(self, name))
        h._hops = list(self._hops)
        return h

    def __eq__(self, other: object) -> bool:
        if not hasattr(other, "as_tuple"):
            return NotImplemented
        return self.as_tuple() == other.as_tuple()  # type: ignore[union-attr]

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"RecordHeader(request_id={self.request_id}, parent_id={self.parent_id}, app={self.app}, "
                f"task={self.task}, lane={self.lane}, child={self.child_index}/{self.child_count}, "
                f"status={self.status}, flags={self.flags}, deadline_ns={self.deadline_ns}, "
                f"payload_len={self.payload_len})")


def _fields_of(h: Any) -> tuple[int, ...]:
    return (h.request_id, h.parent_id, h.app, h.task, h.lane, h.child_index, h.child_count,
            h.status, h.flags)


class ShmRing:
    """Single-producer single-consumer ring of variable-length records in one POSIX shm segment.

    Byte layout (all integers little endian; offsets in bytes)::

        0    u64 magic "JIGSAWR1"   written last on create: an attacher seeing it sees the rest
        8    u32 version (1)        12  u32 control_bytes (384)
        16   u64 capacity_bytes     size of the data area, a multiple of 8
        24   u64 max_payload_bytes
        32   u32 producer_pid       36  u32 consumer_pid     (0 = unclaimed; informational)
        40   u32 closed             set by either side; push then raises RingClosedError
        128  u64 tail               producer's cache line: bytes ever written (only the producer stores)
        136  u64 num_pushed
        256  u64 head               consumer's cache line: bytes ever consumed (only the consumer stores)
        264  u64 num_popped
        384  data area [capacity_bytes]

    ``tail`` and ``head`` are free-running 64-bit byte counters; ``tail - head`` is the bytes in
    use and ``counter % capacity`` the position in the data area. A record at position p::

        +0   u32 record_bytes (frame + header + payload, padded to 8)   +4  u32 kind (DATA | SKIP)
        +8   RecordHeader, 120 bytes:
             u64 request_id, u64 parent_id, u16 app, u16 task, u32 lane, u32 child_index,
             u32 child_count, u16 status, u16 flags, u32 payload_len, u64 deadline_ns,
             u64 created_ns, u64 hops[8]
        +128 payload, zero-padded to a multiple of 8

    (``payload_len`` sits after ``flags`` so every u64 is naturally aligned.) A record never
    straddles the end of the data area: when it does not fit in the remaining ``capacity - p``
    bytes (always >= 8) the producer writes a SKIP frame covering them and places the record at 0.
    A payload is bounded by ``max_payload_bytes`` (at most half the capacity less the overhead) so
    an empty ring always accepts it; a larger payload raises ValueError.

    Record states: free (between tail and head + capacity) -> written (producer filled frame,
    header and payload, not yet published) -> published (tail advanced past it) -> consumed (head
    advanced past it; free again). Write ordering: the producer writes the whole record, then
    stores ``tail`` (release); the consumer loads ``tail`` (acquire), copies the record out, then
    stores ``head`` (release) so the producer may overwrite it. This pure-Python version relies on
    aligned 8-byte stores through a ``Q`` memoryview being single machine stores and on the CPU
    keeping stores in program order (x86-64 TSO); CPython executes the record writes before the
    tail store. On weakly ordered CPUs use the compiled ring, which uses C11 atomics.

    Ownership: the creator (normally the daemon, through a SegmentRegistry) owns the name and
    unlinks it; producer and consumer only ``close()`` their mappings. Unlinking while both are
    mapped is safe: the memory lives until the last mapping goes.
    """

    def __init__(self) -> None:
        raise TypeError("use ShmRing.create(...) or ShmRing.attach(...)")

    @classmethod
    def create(cls, name: str, capacity_bytes: int, *, max_payload_bytes: int | None = None,
               role: str | None = None) -> ShmRing:
        """Create and initialise a new segment (fails if ``name`` exists); mode 0o600."""
        capacity_bytes = _align8(int(capacity_bytes))
        if capacity_bytes < MIN_CAPACITY_BYTES:
            raise ValueError(f"ring capacity must be at least {MIN_CAPACITY_BYTES} bytes")
        limit = default_max_payload_bytes(capacity_bytes)
        if max_payload_bytes is None:
            max_payload_bytes = limit
        elif not 0 <= max_payload_bytes <= limit:
            raise ValueError(f"max_payload_bytes={max_payload_bytes} exceeds {limit}, the most a ring of "
                             f"{capacity_bytes} bytes can always accept; make the ring larger")
        shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600,
                                     size=CONTROL_BYTES + capacity_bytes)
        try:
            mm = mmap.mmap(shm.fd, CONTROL_BYTES + capacity_bytes)
        finally:
            shm.close_fd()
        _CONTROL.pack_into(mm, 0, 0, VERSION, CONTROL_BYTES, capacity_bytes, max_payload_bytes, 0, 0, 0)
        struct.pack_into("<Q", mm, 0, MAGIC)
        ring = cls._from_mmap(name, mm)
        ring._claim(role)
        return ring

    @classmethod
    def attach(cls, name: str, *, role: str | None = None) -> ShmRing:
        """Map an existing ring created by another process (or this one)."""
        shm = posix_ipc.SharedMemory(name)
        try:
            if shm.size < CONTROL_BYTES + MIN_CAPACITY_BYTES:
                raise RingCorruptError(f"{name}: segment of {shm.size} bytes is too small for a ring")
            mm = mmap.mmap(shm.fd, shm.size)
        finally:
            shm.close_fd()
        magic, version, control, capacity, max_payload, *_ = _CONTROL.unpack_from(mm, 0)
        if magic != MAGIC or version != VERSION or control != CONTROL_BYTES:
            mm.close()
            raise RingCorruptError(f"{name}: not a jigsaw ring v{VERSION} (magic={magic:#x}, "
                                   f"version={version})")
        if CONTROL_BYTES + capacity > len(mm) or max_payload > default_max_payload_bytes(capacity):
            mm.close()
            raise RingCorruptError(f"{name}: capacity {capacity} inconsistent with segment size {len(mm)}")
        ring = cls._from_mmap(name, mm)
        ring._claim(role)
        return ring

    @classmethod
    def _from_mmap(cls, name: str, mm: mmap.mmap) -> ShmRing:
        self = object.__new__(cls)
        self._name = name
        self._mm = mm
        self._buf = memoryview(mm)
        self._u64 = self._buf[:CONTROL_BYTES].cast("Q")
        self._u32 = self._buf[:CONTROL_BYTES].cast("I")
        _, _, _, self._capacity, self._max_payload, *_ = _CONTROL.unpack_from(mm, 0)
        return self

    def _claim(self, role: str | None) -> None:
        if role == "producer":
            self._u32[_U32_PRODUCER_PID] = os.getpid()
        elif role == "consumer":
            self._u32[_U32_CONSUMER_PID] = os.getpid()
        elif role is not None:
            raise ValueError(f"role must be 'producer', 'consumer' or None, not {role!r}")

    @property
    def name(self) -> str:
        return self._name

    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    @property
    def max_payload_bytes(self) -> int:
        return self._max_payload

    @property
    def producer_pid(self) -> int:
        return self._u32[_U32_PRODUCER_PID]

    @property
    def consumer_pid(self) -> int:
        return self._u32[_U32_CONSUMER_PID]

    @property
    def closed(self) -> bool:
        """True once either side called ``mark_closed``."""
        return self._u32[_U32_CLOSED] != 0

    @property
    def used_bytes(self) -> int:
        return self._u64[_U64_TAIL] - self._u64[_U64_HEAD]

    def __len__(self) -> int:
        return max(0, self._u64[_U64_PUSHED] - self._u64[_U64_POPPED])

    def mark_closed(self) -> None:
        """Tell the peer no more records will be pushed / popped; records already in stay poppable."""
        self._u32[_U32_CLOSED] = 1

    def push(self, header: Any, payload: bytes | bytearray | memoryview) -> bool:
        """Append one record; False when there is no room now (never blocks)."""
        return self._push(header, payload, b"")

    def push_framed(self, header: Any, credit: int, payload: bytes | bytearray | memoryview) -> bool:
        """Append one record whose payload is ``credit`` (u64, little-endian) then ``payload``
        (the data plane's framing, written straight into the ring: one copy of the tensors)."""
        try:
            prefix = _CREDIT.pack(credit)
        except struct.error as exc:
            raise OverflowError(f"credit {credit} out of range: {exc}") from None
        return self._push(header, payload, prefix)

    def _push(self, header: Any, payload: bytes | bytearray | memoryview, prefix: bytes) -> bool:
        mv = memoryview(payload)
        if not mv.c_contiguous:
            raise ValueError("payload must be a C-contiguous buffer")
        k = len(prefix)
        n = mv.nbytes + k
        if n > self._max_payload:
            raise ValueError(f"payload of {n} bytes exceeds this ring's max_payload_bytes="
                             f"{self._max_payload} (ring {self._name}, capacity {self._capacity})")
        u64 = self._u64
        if self._u32[_U32_CLOSED]:
            raise RingClosedError(f"ring {self._name} is closed")
        capacity = self._capacity
        need = RECORD_OVERHEAD_BYTES + _align8(n)
        tail = u64[_U64_TAIL]
        pos = tail % capacity
        skip = capacity - pos if need > capacity - pos else 0
        if skip + need > capacity - (tail - u64[_U64_HEAD]):
            return False
        buf = self._buf
        if skip:
            _FRAME.pack_into(buf, CONTROL_BYTES + pos, skip, KIND_SKIP)
            pos = 0
        at = CONTROL_BYTES + pos
        try:
            _RECORD.pack_into(buf, at, need, KIND_DATA, *_fields_of(header), n, header.deadline_ns,
                              header.created_ns, *header.hops)
        except struct.error as exc:
            raise OverflowError(f"record header field out of range: {exc}") from None
        if k:
            buf[at + RECORD_OVERHEAD_BYTES:at + RECORD_OVERHEAD_BYTES + k] = prefix
        if n > k:
            buf[at + RECORD_OVERHEAD_BYTES + k:at + RECORD_OVERHEAD_BYTES + n] = mv.cast("B")
        u64[_U64_TAIL] = tail + skip + need
        u64[_U64_PUSHED] += 1
        return True

    def _take(self, head: int, tail: int) -> tuple[RecordHeader, bytes, int]:
        capacity = self._capacity
        buf = self._buf
        pos = head % capacity
        record_bytes, kind = _FRAME.unpack_from(buf, CONTROL_BYTES + pos)
        if kind == KIND_SKIP:
            if record_bytes != capacity - pos or head + record_bytes >= tail:
                raise RingCorruptError(f"ring {self._name}: bad skip record at {pos}")
            head += record_bytes
            pos = 0
            record_bytes, kind = _FRAME.unpack_from(buf, CONTROL_BYTES)
        if (kind != KIND_DATA or record_bytes < RECORD_OVERHEAD_BYTES or record_bytes % 8
                or record_bytes > capacity - pos or head + record_bytes > tail):
            raise RingCorruptError(f"ring {self._name}: bad record frame at {pos} "
                                   f"(kind={kind:#x}, bytes={record_bytes})")
        fields = _RECORD.unpack_from(buf, CONTROL_BYTES + pos)
        n = fields[11]
        if RECORD_OVERHEAD_BYTES + _align8(n) != record_bytes:
            raise RingCorruptError(f"ring {self._name}: payload_len {n} disagrees with record size")
        h = RecordHeader.__new__(RecordHeader)
        (_, _, h.request_id, h.parent_id, h.app, h.task, h.lane, h.child_index, h.child_count,
         h.status, h.flags, h.payload_len, h.deadline_ns, h.created_ns) = fields[:14]
        h._hops = list(fields[14:])
        at = CONTROL_BYTES + pos + RECORD_OVERHEAD_BYTES
        return h, bytes(buf[at:at + n]), head + record_bytes

    def pop(self) -> tuple[RecordHeader, bytes] | None:
        """Remove and return the oldest record as ``(header, payload)``, or None when empty."""
        u64 = self._u64
        tail = u64[_U64_TAIL]
        head = u64[_U64_HEAD]
        if head == tail:
            return None
        h, payload, head = self._take(head, tail)
        u64[_U64_HEAD] = head
        u64[_U64_POPPED] += 1
        return h, payload

    def pop_many(self, max_n: int) -> list[tuple[RecordHeader, bytes]]:
        """Pop up to ``max_n`` records with one tail load and one head store."""
        u64 = self._u64
        tail = u64[_U64_TAIL]
        head = u64[_U64_HEAD]
        out: list[tuple[RecordHeader, bytes]] = []
        while head != tail and len(out) < max_n:
            h, payload, head = self._take(head, tail)
            out.append((h, payload))
        if out:
            u64[_U64_HEAD] = head
            u64[_U64_POPPED] += len(out)
        return out

    def pop_many_framed(self, max_n: int) -> list[tuple[RecordHeader, int, bytes]]:
        """``pop_many`` for records pushed by ``push_framed``: ``(header, credit, tensors)`` each."""
        out = []
        for h, payload in self.pop_many(max_n):
            if len(payload) < _CREDIT.size:
                raise RingCorruptError(f"ring {self._name}: payload of {len(payload)} bytes has no credit")
            out.append((h, _CREDIT.unpack_from(payload)[0], payload[_CREDIT.size:]))
        return out

    def pop_completions(self, max_n: int) -> list[Completion]:
        """Up to ``max_n`` completion records (pushed by ``push_framed``) as flat tuples, no
        header object each: ``(request_id, task, status, child_index, child_count, credit,
        tensors, queue_us, compute_us, batch, hop_us, done_ns)``. The durations come from the
        record's stamps (the hop slots of ``runtime/records.py``: ``HOP_SLOTS``); stamps out of
        order (or missing) give 0. The frontend reads every completion record this way."""
        out: list[Completion] = []
        for h, credit, tensors in self.pop_many_framed(max_n):
            hops = h.hops
            out.append((h.request_id, h.task, h.status, h.child_index, h.child_count, credit, tensors,
                        _span_us(hops[_SENT], hops[_START]), _span_us(hops[_START], hops[_END]), hops[_BATCH],
                        _span_us(hops[_SENT], hops[_POPPED]), hops[_DONE]))
        return out

    def close(self) -> None:
        """Unmap this process's view; idempotent. Does not unlink the name."""
        if self._mm is None:
            return
        self._u64.release()
        self._u32.release()
        self._buf.release()
        self._mm.close()
        self._mm = None

    def unlink(self) -> None:
        """Remove the segment's name; idempotent. Existing mappings stay valid."""
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_shared_memory(self._name)

    def __enter__(self) -> ShmRing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "unmapped" if self._mm is None else f"{len(self)} records, {self.used_bytes} bytes used"
        return f"<ShmRing {self._name} capacity={self._capacity} {state}>"


def push_child(ring: ShmRing, parent: RecordHeader, task: int, child_index: int, child_count: int,
               sent_ns: int, credit: int, payload: bytes | bytearray | memoryview) -> bool:
    """Push a child item of ``parent`` to ``ring`` (``credit`` then ``payload``): the parent's
    request, app, lane, deadline and creation time, this child's task and index, hops cleared but
    ``HOP_SENT = sent_ns``. False when the ring is full. (The compiled core writes the header
    straight into the ring.)"""
    h = RecordHeader(request_id=parent.request_id, parent_id=parent.request_id, app=parent.app, task=task,
                     lane=parent.lane, child_index=child_index, child_count=child_count,
                     deadline_ns=parent.deadline_ns, created_ns=parent.created_ns)
    h.stamp(_SENT, sent_ns)
    return ring.push_framed(h, credit, payload)


def push_completion(ring: ShmRing, header: RecordHeader, task: int, status: int, child_count: int,
                    done_ns: int, credit: int, tensors: bytes | bytearray | memoryview) -> bool:
    """Push the completion record of the item ``header``: a copy of it with ``task``, ``status``,
    ``child_count`` and ``HOP_DONE = done_ns`` (``header`` is left as it is), framed as ``credit``
    then ``tensors``. False when the ring is full."""
    h = header.copy()
    h.task = task
    h.status = int(status)
    h.child_count = child_count
    h.stamp(_DONE, done_ns)
    return ring.push_framed(h, credit, tensors)


def push_hop(done: ShmRing, header: RecordHeader, task: int, start_ns: int, end_ns: int, batch: int,
             kept: int, out: ShmRing, child_task: int, share: int,
             body: bytes | bytearray | memoryview) -> int:
    """An item's hop to its one child: stamp its batch on ``header`` (``HOP_START``, ``HOP_END``,
    ``HOP_BATCH = batch``), push its completion record to ``done`` (status OK, one child, credit
    ``kept``, no tensors) and its child to ``out`` (index 0 of 1, credit ``share``), both stamped
    with one clock read. 2: both went; 1: only the completion record (``out`` is full); 0: neither
    (``done`` is full, or a ring is closed). (The compiled core does it in one call.)"""
    header.stamp(_START, start_ns)
    header.stamp(_END, end_ns)
    header.stamp(_BATCH, batch)
    if done.closed or out.closed:
        return 0
    now = time.monotonic_ns()
    if not push_completion(done, header, task, 0, 1, now, kept, b""):
        return 0
    return 2 if push_child(out, header, child_task, 0, 1, now, share, body) else 1


def lone_child(children: dict[str, list[bytes]], routes: dict[str, list[int]]
               ) -> tuple[str, bytes, list[int]] | None:
    """The item's one child, when its backend gave exactly one (one task, one payload in a list)
    and ``routes`` (its lane's: task -> candidate output indexes) sends that task somewhere:
    ``(task, payload, candidates)``; else None (the compiled core's twin)."""
    if len(children) != 1:
        return None
    for task, bodies in children.items():
        if type(bodies) is not list or len(bodies) != 1:
            return None
        candidates = routes.get(task)
        return (task, bodies[0], candidates) if candidates else None
    return None


def push_hops(items: list[tuple[Any, int, Any, Any]], results: list[Any], task: int, start_ns: int,
              end_ns: int, dead: int, failed: int) -> list[tuple[int, int]]:
    """A finished batch's one-child hops in one call (the compiled core's keeps a chain's middle
    hop out of the interpreter): for each item ``(header, credit, tensors, wiring)`` whose result
    (``children``, ``error``) has one child its lane routes (``lone_child``) to one candidate
    whose stats state is neither ``dead`` nor ``failed``, ``push_hop`` its record and its child,
    half the credit each (``credit > 1``), and add the candidate to the wiring's rung set.

    ``wiring.hop`` is ``(done, outputs, routes, index_of, words, state_at, rung)``: the completion
    ring, the output rings, the routes per lane (task -> candidate output indexes), the task
    indexes by name, the stats block's u64 words, the index of each output's state word, and the
    set of outputs to ring. Returns ``(index, pushed)`` for the items left to the caller: -1 for
    one not taken here (no lone child, several candidates, a failed one, no credit to split),
    else ``push_hop``'s 0 or 1 (what did not fit goes the long way)."""
    if len(results) != len(items):
        raise ValueError(f"{len(items)} items but {len(results)} results")
    n = len(items)
    rest: list[tuple[int, int]] = []
    for i, (header, credit, _, wiring) in enumerate(items):
        result = results[i]
        one = None
        if credit > 1 and result.children and not result.error:
            done, outputs, routes, index_of, words, state_at, rung = wiring.hop
            if header.lane < len(routes):
                one = lone_child(result.children, routes[header.lane])
        if one is None or len(one[2]) != 1 or words[state_at[one[2][0]]] in (dead, failed):
            rest.append((i, -1))
            continue
        child_task, body, (c,) = one
        share = credit // 2
        pushed = push_hop(done, header, task, start_ns, end_ns, n, credit - share, outputs[c],
                          index_of[child_task], share, body)
        if pushed == 2:
            rung.add(c)
        else:
            rest.append((i, pushed))
    return rest
