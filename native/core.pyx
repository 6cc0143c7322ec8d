"""Compiled data-plane core: the shared-memory SPSC ring and the batching queue.

Synchronous and asyncio-free. The ring's byte layout is declared in ``core.pxd`` (the pure-Python
ring reads the same constants from the generated ``jigsaw.runtime.ring_layout``); behaviour is
that of the pure-Python fallbacks (``jigsaw.runtime._pyring``, ``jigsaw.runtime._pybatching``);
tests run against both.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_GetItem, PyDict_Next, PyDict_Size
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.ref cimport PyObject
from libc.stdint cimport INT64_MAX, int64_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset
from posix.mman cimport MAP_FAILED, MAP_SHARED, PROT_READ, PROT_WRITE, mmap, munmap
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

# the ring's byte layout (native/core.pxd)
from core cimport *

import os

import posix_ipc

from jigsaw.runtime._pybatching import DropReason
from jigsaw.runtime._pyring import RingClosedError, RingCorruptError

cdef object _DROP_DEADLINE = DropReason.DROP_DEADLINE
cdef object _DROP_STALE = DropReason.DROP_STALE

cdef inline uint64_t _align8(uint64_t n) noexcept nogil:
    return (n + 7) & ~(<uint64_t>7)

# the hop slots of ``runtime/records.py`` (HOP_SENT ...) that ``pop_completions`` reads; a test
# checks they agree
cdef enum:
    HOP_SENT_SLOT = 0
    HOP_POPPED_SLOT = 1
    HOP_START_SLOT = 2
    HOP_END_SLOT = 3
    HOP_DONE_SLOT = 4
    HOP_BATCH_SLOT = 5
HOP_SLOTS = (HOP_SENT_SLOT, HOP_POPPED_SLOT, HOP_START_SLOT, HOP_END_SLOT, HOP_DONE_SLOT, HOP_BATCH_SLOT)

cdef inline double _span_us(uint64_t start_ns, uint64_t end_ns) noexcept nogil:
    """``end - start`` in microseconds, 0 when the stamps are out of order (or missing)."""
    return (end_ns - start_ns) / 1e3 if end_ns > start_ns else 0.0

cdef inline int64_t _now_ns() noexcept nogil:
    """CLOCK_MONOTONIC in ns (``time.monotonic_ns`` without its call)."""
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec

def default_max_payload_bytes(uint64_t capacity_bytes):
    return (capacity_bytes // 2 - RECORD_OVERHEAD_BYTES) & ~(<uint64_t>7)

cdef class RecordHeader:
    """Fixed per-record metadata (a C struct); see ``jigsaw.runtime._pyring.RecordHeader``."""

    cdef jg_header_t c

    def __init__(self, uint64_t request_id=0, uint64_t parent_id=0, uint16_t app=0, uint16_t task=0,
                 uint32_t lane=0, uint32_t child_index=0, uint32_t child_count=0, uint16_t status=0,
                 uint16_t flags=0, uint64_t deadline_ns=0, uint64_t created_ns=0, hops=(),
                 uint32_t payload_len=0):
        self.c.request_id = request_id
        self.c.parent_id = parent_id
        self.c.app = app
        self.c.task = task
        self.c.lane = lane
        self.c.child_index = child_index
        self.c.child_count = child_count
        self.c.status = status
        self.c.flags = flags
        self.c.deadline_ns = deadline_ns
        self.c.created_ns = created_ns
        self.hops = hops
        self.c.payload_len = payload_len

    @property
    def request_id(self):
        return self.c.request_id

    @request_id.setter
    def request_id(self, uint64_t v):
        self.c.request_id = v

    @property
    def parent_id(self):
        return self.c.parent_id

    @parent_id.setter
    def parent_id(self, uint64_t v):
        self.c.parent_id = v

    @property
    def app(self):
        return self.c.app

    @app.setter
    def app(self, uint16_t v):
        self.c.app = v

    @property
    def task(self):
        return self.c.task

    @task.setter
    def task(self, uint16_t v):
        self.c.task = v

    @property
    def lane(self):
        return self.c.lane

    @lane.setter
    def lane(self, uint32_t v):
        self.c.lane = v

    @property
    def child_index(self):
        return self.c.child_index

    @child_index.setter
    def child_index(self, uint32_t v):
        self.c.child_index = v

    @property
    def child_count(self):
        return self.c.child_count

    @child_count.setter
    def child_count(self, uint32_t v):
        self.c.child_count = v

    @property
    def status(self):
        return self.c.status

    @status.setter
    def status(self, uint16_t v):
        self.c.status = v

    @property
    def flags(self):
        return self.c.flags

    @flags.setter
    def flags(self, uint16_t v):
        self.c.flags = v

    @property
    def deadline_ns(self):
        return self.c.deadline_ns

    @deadline_ns.setter
    def deadline_ns(self, uint64_t v):
        self.c.deadline_ns = v

    @property
    def created_ns(self):
        return self.c.created_ns

    @created_ns.setter
    def created_ns(self, uint64_t v):
        self.c.created_ns = v

    @property
    def payload_len(self):
        return self.c.payload_len

    @payload_len.setter
    def payload_len(self, uint32_t v):
        self.c.payload_len = v

    @property
    def hops(self):
        return tuple([self.c.hops[i] for i in range(NUM_HOPS)])

    @hops.setter
    def hops(self, values):
        cdef uint64_t tmp[NUM_HOPS]
        cdef Py_ssize_t i, n = len(values)
        if n > NUM_HOPS:
            raise ValueError(f"at most {NUM_HOPS} hop timestamps, got {n}")
        memset(tmp, 0, sizeof(tmp))
        for i in range(n):
            tmp[i] = values[i]
        memcpy(self.c.hops, tmp, sizeof(tmp))

    def stamp(self, int hop, uint64_t ns):
        """Record the time ``ns`` in hop slot ``hop`` (0..7)."""
        if not 0 <= hop < NUM_HOPS:
            raise IndexError(f"hop index {hop} out of range 0..{NUM_HOPS - 1}")
        self.c.hops[hop] = ns

    def as_tuple(self):
        return (self.c.request_id, self.c.parent_id, self.c.app, self.c.task, self.c.lane,
                self.c.child_index, self.c.child_count, self.c.status, self.c.flags,
                self.c.deadline_ns, self.c.created_ns, self.hops, self.c.payload_len)

    def copy(self):
        cdef RecordHeader h = RecordHeader.__new__(RecordHeader)
        h.c = self.c
        return h

    def __eq__(self, other):
        if not hasattr(other, "as_tuple"):
            return NotImplemented
        return self.as_tuple() == other.as_tuple()

    __hash__ = None

    def __repr__(self):
        return (f"RecordHeader(request_id={self.c.request_id}, parent_id={self.c.parent_id}, "
                f"app={self.c.app}, task={self.c.task}, lane={self.c.lane}, "
                f"child={self.c.child_index}/{self.c.child_count}, status={self.c.status}, "
                f"flags={self.c.flags}, deadline_ns={self.c.deadline_ns}, "
                f"payload_len={self.c.payload_len})")

cdef int _fill_header(jg_header_t *dst, object h) except -1:
    """Copy a header-like object (any class with the RecordHeader attributes) into ``dst``."""
    cdef RecordHeader tmp = RecordHeader(
        h.request_id, h.parent_id, h.app, h.task, h.lane, h.child_index, h.child_count, h.status,
        h.flags, h.deadline_ns, h.created_ns, h.hops)
    dst[0] = tmp.c
    return 0

cdef class ShmRing:
    """SPSC ring in one POSIX shm segment; layout and ordering on ``jigsaw.runtime._pyring.ShmRing``.

    Head and tail are accessed with C11 acquire/release atomics, so this version is correct on
    weakly ordered CPUs too.
    """

    cdef char *_base
    cdef size_t _map_bytes
    cdef char *_data
    cdef uint64_t *_tail
    cdef uint64_t *_pushed
    cdef uint64_t *_head
    cdef uint64_t *_popped
    cdef uint32_t *_pids
    cdef uint32_t *_closed
    cdef uint64_t _capacity
    cdef uint64_t _max_payload
    cdef object _name

    def __init__(self):
        raise TypeError("use ShmRing.create(...) or ShmRing.attach(...)")

    def __dealloc__(self):
        if self._base != NULL:
            munmap(self._base, self._map_bytes)
            self._base = NULL

    @staticmethod
    cdef ShmRing _from_fd(str name, int fd, size_t map_bytes):
        cdef void *base = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
        if base == MAP_FAILED:
            raise OSError(f"mmap of ring {name} ({map_bytes} bytes) failed")
        cdef ShmRing self = ShmRing.__new__(ShmRing)
        self._name = name
        self._base = <char *>base
        self._map_bytes = map_bytes
        self._data = self._base + CONTROL_BYTES
        self._tail = <uint64_t *>(self._base + TAIL_OFFSET)
        self._pushed = <uint64_t *>(self._base + PUSHED_OFFSET)
        self._head = <uint64_t *>(self._base + HEAD_OFFSET)
        self._popped = <uint64_t *>(self._base + POPPED_OFFSET)
        self._pids = <uint32_t *>(self._base + PRODUCER_PID_OFFSET)
        self._closed = <uint32_t *>(self._base + CLOSED_OFFSET)
        return self

    @classmethod
    def create(cls, str name, capacity_bytes, *, max_payload_bytes=None, role=None):
        """Create and initialise a new segment (fails if ``name`` exists); mode 0o600."""
        cdef uint64_t capacity = _align8(capacity_bytes)
        if capacity < MIN_CAPACITY_BYTES:
            raise ValueError(f"ring capacity must be at least {MIN_CAPACITY_BYTES} bytes")
        limit = default_max_payload_bytes(capacity)
        if max_payload_bytes is None:
            max_payload_bytes = limit
        elif not 0 <= max_payload_bytes <= limit:
            raise ValueError(f"max_payload_bytes={max_payload_bytes} exceeds {limit}, the most a ring of "
                             f"{capacity} bytes can always accept; make the ring larger")
        shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=CONTROL_BYTES + capacity)
        try:
            self = ShmRing._from_fd(name, shm.fd, CONTROL_BYTES + capacity)
        finally:
            shm.close_fd()
        cdef char *base = (<ShmRing>self)._base
        (<uint32_t *>(base + 8))[0] = VERSION
        (<uint32_t *>(base + 12))[0] = CONTROL_BYTES
        (<uint64_t *>(base + 16))[0] = capacity
        (<uint64_t *>(base + 24))[0] = max_payload_bytes
        (<ShmRing>self)._capacity = capacity
        (<ShmRing>self)._max_payload = max_payload_bytes
        jg_store_release(<uint64_t *>base, JG_MAGIC)
        self._claim(role)
        return self

    @classmethod
    def attach(cls, str name, *, role=None):
        """Map an existing ring created by another process (or this one)."""
        shm = posix_ipc.SharedMemory(name)
        try:
            if shm.size < CONTROL_BYTES + MIN_CAPACITY_BYTES:
                raise RingCorruptError(f"{name}: segment of {shm.size} bytes is too small for a ring")
            self = ShmRing._from_fd(name, shm.fd, shm.size)
        finally:
            shm.close_fd()
        cdef char *base = (<ShmRing>self)._base
        cdef uint64_t magic = jg_load_acquire(<uint64_t *>base)
        cdef uint32_t version = (<uint32_t *>(base + 8))[0]
        cdef uint32_t control = (<uint32_t *>(base + 12))[0]
        cdef uint64_t capacity = (<uint64_t *>(base + 16))[0]
        cdef uint64_t max_payload = (<uint64_t *>(base + 24))[0]
        if magic != JG_MAGIC or version != VERSION or control != CONTROL_BYTES:
            self.close()
            raise RingCorruptError(f"{name}: not a jigsaw ring v{VERSION} (magic={magic:#x}, "
                                   f"version={version})")
        if (CONTROL_BYTES + capacity > (<ShmRing>self)._map_bytes or capacity % 8
                or max_payload > default_max_payload_bytes(capacity)):
            self.close()
            raise RingCorruptError(f"{name}: capacity {capacity} inconsistent with segment size "
                                   f"{(<ShmRing>self)._map_bytes}")
        (<ShmRing>self)._capacity = capacity
        (<ShmRing>self)._max_payload = max_payload
        self._claim(role)
        return self

    def _claim(self, role):
        self._check_mapped()
        if role == "producer":
            self._pids[0] = os.getpid()
        elif role == "consumer":
            self._pids[1] = os.getpid()
        elif role is not None:
            raise ValueError(f"role must be 'producer', 'consumer' or None, not {role!r}")

    cdef int _check_mapped(self) except -1:
        if self._base == NULL:
            raise ValueError(f"ring {self._name} is closed (unmapped)")
        return 0

    @property
    def name(self):
        return self._name

    @property
    def capacity_bytes(self):
        return self._capacity

    @property
    def max_payload_bytes(self):
        return self._max_payload

    @property
    def producer_pid(self):
        self._check_mapped()
        return self._pids[0]

    @property
    def consumer_pid(self):
        self._check_mapped()
        return self._pids[1]

    @property
    def closed(self):
        """True once either side called ``mark_closed``."""
        self._check_mapped()
        return jg_load32(self._closed) != 0

    @property
    def used_bytes(self):
        self._check_mapped()
        cdef uint64_t head = jg_load_acquire(self._head)
        return jg_load_acquire(self._tail) - head

    def __len__(self):
        return self._queued()

    cdef uint64_t _queued(self) except? 0xFFFFFFFFFFFFFFFF:
        """The records in the ring (``len``)."""
        self._check_mapped()
        cdef uint64_t popped = jg_load_acquire(self._popped)
        cdef uint64_t pushed = jg_load_acquire(self._pushed)
        return pushed - popped if pushed > popped else 0

    def mark_closed(self):
        """Tell the peer no more records will be pushed / popped; records already in stay poppable."""
        self._check_mapped()
        jg_store32(self._closed, 1)

    def push(self, header, payload):
        """Append one record; False when there is no room now (never blocks)."""
        return _ring_push(self, header, payload, NULL, 0)

    def push_framed(self, header, uint64_t credit, payload):
        """Append one record whose payload is ``credit`` (u64, little-endian) then ``payload``:
        the data plane's framing (``runtime/records.py``) written straight into the ring, so the
        tensors are copied once, here, and never joined with their credit first."""
        cdef uint64_t le = credit  # x86-64 and aarch64 Linux: little-endian
        return _ring_push(self, header, payload, <const char *>&le, 8)

    cdef object _take(self, uint64_t *head, uint64_t tail):
        return self._take_at(head, tail, 0)

    cdef char *_record_at(self, uint64_t *h, uint64_t tail, uint32_t *record_bytes) except NULL:
        """The record at ``h[0]``, checked whole (frame kind and size, payload length), past a
        skip record at the ring's end (``h[0]`` moves over it): the one check every pop makes, so
        a corrupt ring raises the same error whichever pop reads it."""
        cdef uint64_t pos = h[0] % self._capacity
        cdef jg_frame_t *frame = <jg_frame_t *>(self._data + pos)
        cdef uint32_t nbytes = frame.record_bytes
        cdef uint32_t kind = frame.kind
        cdef jg_header_t *src
        if kind == KIND_SKIP:
            if nbytes != self._capacity - pos or h[0] + nbytes >= tail:
                raise RingCorruptError(f"ring {self._name}: bad skip record at {pos}")
            h[0] += nbytes
            pos = 0
            frame = <jg_frame_t *>self._data
            nbytes = frame.record_bytes
            kind = frame.kind
        if (kind != KIND_DATA or nbytes < RECORD_OVERHEAD_BYTES or nbytes % 8
                or nbytes > self._capacity - pos or h[0] + nbytes > tail):
            raise RingCorruptError(f"ring {self._name}: bad record frame at {pos} "
                                   f"(kind={kind:#x}, bytes={nbytes})")
        src = <jg_header_t *>(self._data + pos + FRAME_BYTES)
        if RECORD_OVERHEAD_BYTES + _align8(src.payload_len) != nbytes:
            raise RingCorruptError(f"ring {self._name}: payload_len {src.payload_len} disagrees with "
                                   f"record size")
        record_bytes[0] = nbytes
        return self._data + pos

    cdef object _take_at(self, uint64_t *head, uint64_t tail, bint framed):
        cdef uint64_t h = head[0]
        cdef uint32_t record_bytes
        cdef char *at = self._record_at(&h, tail, &record_bytes)
        cdef jg_header_t *src = <jg_header_t *>(at + FRAME_BYTES)
        cdef RecordHeader rh = RecordHeader.__new__(RecordHeader)
        cdef uint64_t credit
        rh.c = src[0]
        if framed:
            if src.payload_len < 8:
                raise RingCorruptError(f"ring {self._name}: payload of {src.payload_len} bytes has no credit")
            memcpy(&credit, at + RECORD_OVERHEAD_BYTES, 8)
            body = PyBytes_FromStringAndSize(at + RECORD_OVERHEAD_BYTES + 8, src.payload_len - 8)
            head[0] = h + record_bytes
            return (rh, credit, body)
        payload = PyBytes_FromStringAndSize(at + RECORD_OVERHEAD_BYTES, src.payload_len)
        head[0] = h + record_bytes
        return (rh, payload)

    def pop(self):
        """Remove and return the oldest record as ``(header, payload)``, or None when empty."""
        self._check_mapped()
        cdef uint64_t tail = jg_load_acquire(self._tail)
        cdef uint64_t head = jg_load_relaxed(self._head)
        if head == tail:
            return None
        rec = self._take(&head, tail)
        jg_store_release(self._head, head)
        jg_store_release(self._popped, jg_load_relaxed(self._popped) + 1)
        return rec

    cdef list _pop_n(self, Py_ssize_t max_n, bint framed):
        """Up to ``max_n`` records with one tail load and one head store."""
        self._check_mapped()
        cdef uint64_t tail = jg_load_acquire(self._tail)
        cdef uint64_t head = jg_load_relaxed(self._head)
        cdef list out = []
        cdef Py_ssize_t k = 0
        while head != tail and k < max_n:
            out.append(self._take_at(&head, tail, framed))
            k += 1
        if k:
            jg_store_release(self._head, head)
            jg_store_release(self._popped, jg_load_relaxed(self._popped) + k)
        return out

    def pop_many(self, Py_ssize_t max_n):
        """Pop up to ``max_n`` records with one tail load and one head store."""
        return self._pop_n(max_n, 0)

    def pop_many_framed(self, Py_ssize_t max_n):
        """``pop_many`` for records pushed by ``push_framed``: ``(header, credit, tensors)`` each,
        the tensors copied once, out of the ring (no framed payload to slice again)."""
        return self._pop_n(max_n, 1)

    def pop_completions(self, Py_ssize_t max_n):
        """Up to ``max_n`` completion records (pushed by ``push_framed``) as flat tuples, no
        ``RecordHeader`` each: ``(request_id, task, status, child_index, child_count, credit,
        tensors, queue_us, compute_us, batch, hop_us, done_ns)``, the durations from the record's
        stamps (``runtime/records.py``'s hop slots; negative ones are 0). The frontend reads every
        record this way; see ``jigsaw.runtime._pyring.ShmRing.pop_completions``."""
        self._check_mapped()
        cdef uint64_t tail = jg_load_acquire(self._tail)
        cdef uint64_t head = jg_load_relaxed(self._head)
        cdef list out = []
        cdef Py_ssize_t k = 0
        cdef uint64_t h, credit
        cdef uint32_t record_bytes
        cdef jg_header_t *src
        cdef char *at
        while head != tail and k < max_n:
            h = head
            at = self._record_at(&h, tail, &record_bytes)
            src = <jg_header_t *>(at + FRAME_BYTES)
            if src.payload_len < 8:
                raise RingCorruptError(f"ring {self._name}: payload of {src.payload_len} bytes has no credit")
            memcpy(&credit, at + RECORD_OVERHEAD_BYTES, 8)
            out.append((src.request_id, src.task, src.status, src.child_index, src.child_count, credit,
                        PyBytes_FromStringAndSize(at + RECORD_OVERHEAD_BYTES + 8, src.payload_len - 8),
                        _span_us(src.hops[HOP_SENT_SLOT], src.hops[HOP_START_SLOT]),
                        _span_us(src.hops[HOP_START_SLOT], src.hops[HOP_END_SLOT]),
                        src.hops[HOP_BATCH_SLOT],
                        _span_us(src.hops[HOP_SENT_SLOT], src.hops[HOP_POPPED_SLOT]),
                        src.hops[HOP_DONE_SLOT]))
            head = h + record_bytes
            k += 1
        if k:
            jg_store_release(self._head, head)
            jg_store_release(self._popped, jg_load_relaxed(self._popped) + k)
        return out

    def close(self):
        """Unmap this process's view; idempotent. Does not unlink the name."""
        if self._base != NULL:
            munmap(self._base, self._map_bytes)
            self._base = NULL

    def unlink(self):
        """Remove the segment's name; idempotent. Existing mappings stay valid."""
        try:
            posix_ipc.unlink_shared_memory(self._name)
        except posix_ipc.ExistentialError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        if self._base == NULL:
            return f"<ShmRing {self._name} capacity={self._capacity} unmapped>"
        return (f"<ShmRing {self._name} capacity={self._capacity} {len(self)} records, "
                f"{self.used_bytes} bytes used>")

cdef inline object _ring_push(ShmRing self, header, payload, const char *prefix, uint64_t prefix_len):
    """``ShmRing.push``: one record whose payload is ``prefix`` then ``payload`` (inlined into both
    push calls; a method call would cost the plain push about 7%)."""
    cdef jg_header_t tmp
    if type(header) is RecordHeader:
        return _ring_push_c(self, &(<RecordHeader>header).c, payload, prefix, prefix_len)
    _fill_header(&tmp, header)
    return _ring_push_c(self, &tmp, payload, prefix, prefix_len)


def push_child(ShmRing ring, RecordHeader parent, uint16_t task, uint32_t child_index,
               uint32_t child_count, uint64_t sent_ns, uint64_t credit, payload):
    """Push a child item of ``parent`` to ``ring`` (the data plane's framing: ``credit`` then
    ``payload``): the parent's request, app, lane, deadline and creation time, this child's task
    and index, no status, hops cleared but ``HOP_SENT = sent_ns``. The header is written straight
    into the ring (no header object); what a worker's ``forward`` built field by field. False
    when the ring is full."""
    cdef jg_header_t h
    cdef uint64_t le = credit
    _child_header(&h, parent, task, child_index, child_count, sent_ns)
    return _ring_push_c(ring, &h, payload, <const char *>&le, 8)


cdef inline void _child_header(jg_header_t *h, RecordHeader parent, uint16_t task, uint32_t child_index,
                               uint32_t child_count, uint64_t sent_ns):
    memset(h, 0, sizeof(jg_header_t))
    h.request_id = parent.c.request_id
    h.parent_id = parent.c.request_id
    h.app = parent.c.app
    h.task = task
    h.lane = parent.c.lane
    h.child_index = child_index
    h.child_count = child_count
    h.deadline_ns = parent.c.deadline_ns
    h.created_ns = parent.c.created_ns
    h.hops[HOP_SENT_SLOT] = sent_ns


def push_completion(ShmRing ring, RecordHeader header, uint16_t task, uint16_t status,
                    uint32_t child_count, uint64_t done_ns, uint64_t credit, tensors):
    """Push the completion record of the item ``header`` to ``ring``: a copy of the header with
    this worker's ``task``, ``status`` and ``child_count`` and ``HOP_DONE = done_ns`` (``header``
    itself is left as it is), framed as ``credit`` then ``tensors``. False when the ring is full."""
    cdef jg_header_t h = header.c
    cdef uint64_t le = credit
    h.task = task
    h.status = status
    h.child_count = child_count
    h.hops[HOP_DONE_SLOT] = done_ns
    return _ring_push_c(ring, &h, tensors, <const char *>&le, 8)


def push_hop(ShmRing done, RecordHeader header, uint16_t task, uint64_t start_ns, uint64_t end_ns,
             uint32_t batch, uint64_t kept, ShmRing out, uint16_t child_task, uint64_t share, body):
    """An item's hop to its one child, in one call (the chain's every middle hop): stamp its batch
    on ``header`` (``HOP_START``, ``HOP_END``, ``HOP_BATCH = batch``), then push its completion
    record to ``done`` (as ``push_completion``: status OK, one child, credit ``kept``, no tensors)
    and its child to ``out`` (as ``push_child``: task ``child_task``, index 0 of 1, credit
    ``share``, ``body``), both stamped with one clock read. Returns 2 when both went, 1 when only
    the completion record did (``out`` is full), 0 when neither (``done`` is full, or a ring is
    closed): the caller pushes the rest as ``push_completion`` and ``push_child`` would."""
    return _push_hop(done, header, task, start_ns, end_ns, batch, kept, out, child_task, share, body)


cdef int _push_hop(ShmRing done, RecordHeader header, uint16_t task, uint64_t start_ns, uint64_t end_ns,
                   uint32_t batch, uint64_t kept, ShmRing out, uint16_t child_task, uint64_t share,
                   body) except -1:
    cdef timespec ts
    cdef jg_header_t h
    cdef uint64_t now
    header.c.hops[HOP_START_SLOT] = start_ns
    header.c.hops[HOP_END_SLOT] = end_ns
    header.c.hops[HOP_BATCH_SLOT] = batch
    done._check_mapped()
    out._check_mapped()
    if jg_load32(done._closed) or jg_load32(out._closed):
        return 0
    clock_gettime(CLOCK_MONOTONIC, &ts)
    now = <uint64_t>ts.tv_sec * 1000000000 + <uint64_t>ts.tv_nsec
    h = header.c
    h.task = task
    h.status = 0
    h.child_count = 1
    h.hops[HOP_DONE_SLOT] = now
    if not _ring_push_c(done, &h, b"", <const char *>&kept, 8):
        return 0
    _child_header(&h, header, child_task, 0, 1, now)
    return 2 if _ring_push_c(out, &h, body, <const char *>&share, 8) else 1


def lone_child(dict children, dict routes):
    """The item's one child, when its backend gave exactly one (one task, one payload in a list)
    and ``routes`` (its lane's: task -> candidate output indexes) sends that task somewhere:
    ``(task, payload, candidates)``; else None, and ``Worker.children_of`` decides (several
    children, none, or one the lane does not route). The chain's every middle hop takes this path,
    without the lists and the credit split of the general one."""
    return _lone_child(children, routes)


cdef object _lone_child(dict children, dict routes):
    cdef Py_ssize_t pos = 0
    cdef PyObject *task
    cdef PyObject *bodies
    cdef PyObject *candidates
    if children is None or routes is None or PyDict_Size(children) != 1:
        return None
    PyDict_Next(children, &pos, &task, &bodies)
    if type(<object>bodies) is not list or PyList_GET_SIZE(<object>bodies) != 1:
        return None
    candidates = PyDict_GetItem(routes, <object>task)
    if candidates is NULL or not <object>candidates:
        return None
    return (<object>task, <object>PyList_GET_ITEM(<object>bodies, 0), <object>candidates)


def push_hops(list items, list results, uint16_t task, uint64_t start_ns, uint64_t end_ns,
              uint64_t dead, uint64_t failed):
    """A batch's one-child hops in one call: rules on ``jigsaw.runtime._pyring.push_hops``."""
    cdef Py_ssize_t i, n = len(items), c, at
    cdef list rest = []
    cdef tuple item, hop, one
    cdef list routes, state_at
    cdef RecordHeader header
    cdef uint64_t credit, share, state
    cdef int pushed
    cdef Py_buffer view
    if len(results) != n:
        raise ValueError(f"{n} items but {len(results)} results")
    for i in range(n):
        item = <tuple?>items[i]
        result = results[i]
        header = <RecordHeader?>item[0]
        credit = item[1]
        one = None
        if credit > 1:
            children = result.children
            if children and not result.error:
                hop = <tuple?>item[3].hop
                routes = <list?>hop[2]
                if header.c.lane < <uint64_t>len(routes):
                    one = _lone_child(children, routes[header.c.lane])
        if one is None or len(one[2]) != 1:
            rest.append((i, -1))
            continue
        c = one[2][0]
        state_at = <list?>hop[5]
        at = state_at[c]
        PyObject_GetBuffer(hop[4], &view, PyBUF_SIMPLE)
        try:
            if at < 0 or (at + 1) * 8 > view.len:
                raise IndexError(f"stats word {at} is outside the stats block")
            state = (<uint64_t *>view.buf)[at]
        finally:
            PyBuffer_Release(&view)
        if state == dead or state == failed:
            rest.append((i, -1))
            continue
        share = credit // 2
        pushed = _push_hop(hop[0], header, task, start_ns, end_ns, n, credit - share, hop[1][c],
                           hop[3][one[0]], share, one[1])
        if pushed == 2:
            (<set?>hop[6]).add(c)
        else:
            rest.append((i, pushed))
    return rest


cdef inline object _ring_push_c(ShmRing self, const jg_header_t *src, payload, const char *prefix,
                                uint64_t prefix_len):
    cdef Py_buffer view
    cdef uint64_t n, need, tail, pos, skip
    cdef jg_frame_t *frame
    cdef char *at
    self._check_mapped()
    try:
        PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
    except BufferError as exc:
        raise ValueError(f"payload must be a C-contiguous buffer: {exc}") from None
    try:
        n = view.len + prefix_len
        if n > self._max_payload:
            raise ValueError(f"payload of {n} bytes exceeds this ring's max_payload_bytes="
                             f"{self._max_payload} (ring {self._name}, capacity {self._capacity})")
        if jg_load32(self._closed):
            raise RingClosedError(f"ring {self._name} is closed")
        need = RECORD_OVERHEAD_BYTES + _align8(n)
        tail = jg_load_relaxed(self._tail)
        pos = tail % self._capacity
        skip = self._capacity - pos if need > self._capacity - pos else 0
        if skip + need > self._capacity - (tail - jg_load_acquire(self._head)):
            return False
        if skip:
            frame = <jg_frame_t *>(self._data + pos)
            frame.record_bytes = <uint32_t>skip
            frame.kind = KIND_SKIP
            pos = 0
        at = self._data + pos
        frame = <jg_frame_t *>at
        frame.record_bytes = <uint32_t>need
        frame.kind = KIND_DATA
        memcpy(at + FRAME_BYTES, src, sizeof(jg_header_t))
        (<jg_header_t *>(at + FRAME_BYTES)).payload_len = <uint32_t>n
        if prefix_len:
            memcpy(at + RECORD_OVERHEAD_BYTES, prefix, prefix_len)
        if n > prefix_len:
            memcpy(at + RECORD_OVERHEAD_BYTES + prefix_len, view.buf, n - prefix_len)
        if n & 7:
            memset(at + RECORD_OVERHEAD_BYTES + n, 0, 8 - (n & 7))
        jg_store_release(self._tail, tail + skip + need)
        jg_store_release(self._pushed, jg_load_relaxed(self._pushed) + 1)
        return True
    finally:
        PyBuffer_Release(&view)


cdef class BatchQueue:
    """Bounded batching queue with deadline-aware dropping; rules on
    ``jigsaw.runtime._pybatching.BatchQueue``.

    Storage: fixed slot arrays (capacity is a hard bound), a doubly linked list of slots in
    (arrival, deadline) order and an indexed binary min-heap of slots by (deadline, push order).
    """

    cdef Py_ssize_t _capacity
    cdef Py_ssize_t _max_batch
    cdef Py_ssize_t _n
    cdef int64_t _max_wait_ns
    cdef int64_t _staleness_ns
    cdef int64_t _remaining_min_ns
    cdef tuple _exec_table_ns
    cdef uint64_t _seq_counter
    # per-slot storage (slot index = position in these arrays)
    cdef uint64_t *_rid
    cdef int64_t *_deadline
    cdef int64_t *_arrival
    cdef uint64_t *_seq
    cdef Py_ssize_t *_prev
    cdef Py_ssize_t *_next
    cdef Py_ssize_t *_hpos
    # min-heap of slots by (deadline, seq)
    cdef Py_ssize_t *_heap
    cdef list _items
    cdef Py_ssize_t _first
    cdef Py_ssize_t _last
    cdef Py_ssize_t _free

    def __cinit__(self, Py_ssize_t max_batch, int64_t max_wait_ns, Py_ssize_t capacity,
                  int64_t staleness_ns, int64_t remaining_min_ns, exec_estimate_ns):
        cdef Py_ssize_t i
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if max_wait_ns < 0 or staleness_ns < 0 or remaining_min_ns < 0:
            raise ValueError("max_wait_ns, staleness_ns and remaining_min_ns must be >= 0")
        if isinstance(exec_estimate_ns, int):
            table = (exec_estimate_ns,)
        else:
            table = tuple(int(x) for x in exec_estimate_ns)
        if not table or any(x < 0 for x in table):
            raise ValueError("exec_estimate_ns must be a non-negative int or a non-empty table of them")
        self._exec_table_ns = table
        self._max_batch = max_batch
        self._capacity = capacity
        self._max_wait_ns = max_wait_ns
        self._staleness_ns = staleness_ns
        self._remaining_min_ns = remaining_min_ns
        self._n = 0
        self._seq_counter = 0
        self._rid = <uint64_t *>malloc(capacity * sizeof(uint64_t))
        self._deadline = <int64_t *>malloc(capacity * sizeof(int64_t))
        self._arrival = <int64_t *>malloc(capacity * sizeof(int64_t))
        self._seq = <uint64_t *>malloc(capacity * sizeof(uint64_t))
        self._prev = <Py_ssize_t *>malloc(capacity * sizeof(Py_ssize_t))
        self._next = <Py_ssize_t *>malloc(capacity * sizeof(Py_ssize_t))
        self._hpos = <Py_ssize_t *>malloc(capacity * sizeof(Py_ssize_t))
        self._heap = <Py_ssize_t *>malloc(capacity * sizeof(Py_ssize_t))
        if (self._rid == NULL or self._deadline == NULL or self._arrival == NULL or self._seq == NULL
                or self._prev == NULL or self._next == NULL or self._hpos == NULL or self._heap == NULL):
            raise MemoryError()
        self._items = [None] * capacity
        for i in range(capacity):
            self._next[i] = i + 1
        self._next[capacity - 1] = -1
        self._free = 0
        self._first = -1
        self._last = -1

    def __dealloc__(self):
        free(self._rid)
        free(self._deadline)
        free(self._arrival)
        free(self._seq)
        free(self._prev)
        free(self._next)
        free(self._hpos)
        free(self._heap)

    @property
    def max_batch(self):
        return self._max_batch

    @property
    def capacity(self):
        return self._capacity

    @property
    def max_wait_ns(self):
        return self._max_wait_ns

    @property
    def staleness_ns(self):
        return self._staleness_ns

    @property
    def exec_estimate_ns(self):
        return self._exec_table_ns

    @property
    def remaining_min_ns(self):
        return self._remaining_min_ns

    @remaining_min_ns.setter
    def remaining_min_ns(self, int64_t value):
        if value < 0:
            raise ValueError("remaining_min_ns must be >= 0")
        self._remaining_min_ns = value

    def __len__(self):
        return self._n

    cdef int64_t _exec1(self):
        return self._exec_table_ns[0]

    cdef inline bint _hless(self, Py_ssize_t a, Py_ssize_t b) noexcept:
        if self._deadline[a] != self._deadline[b]:
            return self._deadline[a] < self._deadline[b]
        return self._seq[a] < self._seq[b]

    cdef void _sift_up(self, Py_ssize_t i) noexcept:
        cdef Py_ssize_t slot = self._heap[i], parent
        while i > 0:
            parent = (i - 1) >> 1
            if not self._hless(slot, self._heap[parent]):
                break
            self._heap[i] = self._heap[parent]
            self._hpos[self._heap[i]] = i
            i = parent
        self._heap[i] = slot
        self._hpos[slot] = i

    cdef void _sift_down(self, Py_ssize_t i) noexcept:
        cdef Py_ssize_t slot = self._heap[i], child
        cdef Py_ssize_t n = self._n
        while True:
            child = 2 * i + 1
            if child >= n:
                break
            if child + 1 < n and self._hless(self._heap[child + 1], self._heap[child]):
                child += 1
            if not self._hless(self._heap[child], slot):
                break
            self._heap[i] = self._heap[child]
            self._hpos[self._heap[i]] = i
            i = child
        self._heap[i] = slot
        self._hpos[slot] = i

    cdef void _heap_remove(self, Py_ssize_t slot) noexcept:
        cdef Py_ssize_t i = self._hpos[slot]
        cdef Py_ssize_t last = self._n - 1
        cdef Py_ssize_t moved
        self._n = last
        if i != last:
            moved = self._heap[last]
            self._heap[i] = moved
            self._hpos[moved] = i
            self._sift_up(i)
            if self._hpos[moved] == i:
                self._sift_down(i)

    cdef object _remove(self, Py_ssize_t slot):
        cdef uint64_t rid = self._rid[slot]
        cdef int64_t deadline = self._deadline[slot], arrival = self._arrival[slot]
        item = self._remove_item(slot)
        return (rid, deadline, arrival, item)

    cdef object _remove_item(self, Py_ssize_t slot):
        """Unlink ``slot`` and free it; its item."""
        cdef Py_ssize_t p = self._prev[slot], q = self._next[slot]
        if p != -1:
            self._next[p] = q
        else:
            self._first = q
        if q != -1:
            self._prev[q] = p
        else:
            self._last = p
        self._heap_remove(slot)
        item = self._items[slot]
        self._items[slot] = None
        self._next[slot] = self._free
        self._free = slot
        return item

    def push(self, uint64_t request_id, int64_t deadline_ns, int64_t arrival_ns, item):
        """Queue one request; False when the queue holds ``capacity`` requests."""
        return self._push_c(request_id, deadline_ns, arrival_ns, item)

    def take_framed(self, ShmRing ring, Py_ssize_t max_n, int64_t passed_over_ns, tag):
        """Pop up to ``max_n`` framed records from ``ring`` into the queue, in one call: rules on
        ``jigsaw.runtime._pybatching.BatchQueue.take_framed``."""
        cdef list refused = []
        cdef Py_ssize_t got = self._take_framed_c(ring, max_n, passed_over_ns, tag, refused)
        if not got:
            return 0, ()
        return got, (refused if refused else ())

    cdef Py_ssize_t _take_framed_c(self, ShmRing ring, Py_ssize_t max_n, int64_t passed_over_ns, tag,
                                   list refused) except -1:
        """``take_framed``: the records popped; the items refused (queue full) appended to ``refused``."""
        cdef list got = ring._pop_n(max_n, 1)
        cdef RecordHeader h
        cdef tuple rec
        cdef int64_t now, arrival
        cdef uint64_t sent
        if not got:
            return 0
        now = _now_ns()
        for obj in got:
            rec = <tuple>obj
            h = <RecordHeader>rec[0]
            h.c.hops[HOP_POPPED_SLOT] = <uint64_t>now
            arrival = now
            if passed_over_ns > 0:
                sent = h.c.hops[HOP_SENT_SLOT]
                if 0 < sent <= <uint64_t>passed_over_ns:
                    arrival = <int64_t>sent
            if h.c.deadline_ns > <uint64_t>INT64_MAX:
                raise OverflowError("deadline_ns must fit in i64")
            item = (h, rec[1], rec[2], tag)
            if not self._push_c(h.c.request_id, <int64_t>h.c.deadline_ns, arrival, item):
                refused.append(item)
        return len(got)

    def take_batch(self, list rings, list tags, Py_ssize_t first, int64_t passed_over_ns):
        """A worker's intake and release in one call: rules on
        ``jigsaw.runtime._pybatching.BatchQueue.take_batch``."""
        cdef Py_ssize_t k = len(rings), want, n, j, at, count, i
        cdef list dropped = []
        cdef list refused = []
        cdef list items, ids, tensors
        if len(tags) != k:
            raise ValueError(f"{k} rings but {len(tags)} tags")
        while self._n < self._max_batch:
            want = self._max_batch - self._n
            n = 0
            for j in range(k):
                if n >= want:
                    break
                at = (first + j) % k
                n += self._take_framed_c(rings[at], want - n, passed_over_ns, tags[at], refused)
            if k > 1:
                first = (first + 1) % k
            if n < want:  # every ring gave all it held: no second look
                break
            self._expire_into(_now_ns(), dropped)
        if self._n:
            self._expire_into(_now_ns(), dropped)
        if self._n >= self._max_batch:
            for j in range(k):
                if (<ShmRing?>rings[j])._queued():
                    passed_over_ns = _now_ns()
                    break
        if self._n == 0:
            items = None
            ids = tensors = None
        else:
            count = self._n if self._n < self._max_batch else self._max_batch
            items = []
            ids = []
            tensors = []
            for i in range(count):
                ids.append(self._rid[self._first])
                item = self._remove_item(self._first)
                items.append(item)
                tensors.append(item[2])
        return (items, ids, tensors, dropped if dropped else (), refused if refused else (), first,
                passed_over_ns)

    cdef bint _push_c(self, uint64_t request_id, int64_t deadline_ns, int64_t arrival_ns, item):
        cdef Py_ssize_t slot, p
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
        p = self._last
        while p != -1 and (self._arrival[p] > arrival_ns
                           or (self._arrival[p] == arrival_ns and self._deadline[p] > deadline_ns)):
            p = self._prev[p]
        self._prev[slot] = p
        if p == -1:
            self._next[slot] = self._first
            self._first = slot
        else:
            self._next[slot] = self._next[p]
            self._next[p] = slot
        if self._next[slot] == -1:
            self._last = slot
        else:
            self._prev[self._next[slot]] = slot
        self._heap[self._n] = slot
        self._hpos[slot] = self._n
        self._n += 1
        self._sift_up(self._n - 1)
        return True

    def next_batch(self, int64_t now_ns, bint idle):
        """Release up to ``max_batch`` oldest requests if a release rule holds, else None."""
        cdef Py_ssize_t k
        if self._n == 0:
            return None
        if not (idle or self._n >= self._max_batch
                or now_ns - self._arrival[self._first] >= self._max_wait_ns):
            return None
        k = self._n if self._n < self._max_batch else self._max_batch
        return [self._remove(self._first) for _ in range(k)]

    def expired(self, int64_t now_ns):
        """Remove and return ``(request_id, deadline_ns, arrival_ns, item, reason)`` to drop now."""
        cdef list out = []
        self._expire_into(now_ns, out)
        return out

    cdef int _expire_into(self, int64_t now_ns, list out) except -1:
        cdef int64_t slack_ns = self._exec1() + self._remaining_min_ns
        cdef Py_ssize_t slot
        while self._n:
            slot = self._heap[0]
            if self._deadline[slot] - now_ns >= slack_ns:
                break
            out.append(self._remove(slot) + (_DROP_DEADLINE,))
        while self._n:
            slot = self._first
            if now_ns - self._arrival[slot] <= self._staleness_ns:
                break
            out.append(self._remove(slot) + (_DROP_STALE,))
        return 0

    def next_wakeup_ns(self, int64_t now_ns):
        """Earliest time a release or drop rule can next fire (>= now_ns), or None when empty."""
        if self._n == 0:
            return None
        if self._n >= self._max_batch:
            return now_ns
        cdef int64_t oldest = self._arrival[self._first]
        cdef int64_t t = oldest + self._max_wait_ns
        cdef int64_t t_stale = oldest + self._staleness_ns + 1
        cdef int64_t t_drop = self._deadline[self._heap[0]] - (self._exec1() + self._remaining_min_ns) + 1
        if t_stale < t:
            t = t_stale
        if t_drop < t:
            t = t_drop
        return t if t > now_ns else now_ns

    def drain(self):
        """Remove and return every queued request, oldest first (shutdown, reconfiguration)."""
        cdef list out = []
        while self._n:
            out.append(self._remove(self._first))
        return out

    def __repr__(self):
        return (f"<BatchQueue {self._n}/{self._capacity} max_batch={self._max_batch} "
                f"max_wait_ns={self._max_wait_ns}>")


cdef extern from *:
    """
    static inline void jg_fence_seq_cst(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
    static inline void jg_arm(uint32_t *p) {
        __atomic_store_n(p, 1, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
    }
    static inline void jg_disarm(uint32_t *p) { __atomic_store_n(p, 0, __ATOMIC_RELAXED); }
    static inline int jg_take(uint32_t *p) {
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        if (__atomic_load_n(p, __ATOMIC_RELAXED) == 0) return 0;
        return __atomic_exchange_n(p, 0, __ATOMIC_SEQ_CST) != 0;
    }
    """
    void jg_fence_seq_cst() nogil
    void jg_arm(uint32_t *p) nogil
    void jg_disarm(uint32_t *p) nogil
    int jg_take(uint32_t *p) nogil


cdef class BellFlag:
    """A doorbell's "may be asleep" flag: one u32 in a shared mapping, with full barriers.

    The consumer ``arm``s (stores 1, then a full fence) before its last look at its rings; a
    producer, after its push, ``take``s (a full fence, then clears a set flag) and signals only
    when it took it. The two fences make the store-then-load on each side a Dekker handshake:
    either the producer sees the flag or the consumer sees the record, so no wake-up is lost.
    """

    cdef Py_buffer _view
    cdef bint _held
    cdef uint32_t *_flag

    def __init__(self, buf):
        PyObject_GetBuffer(buf, &self._view, PyBUF_WRITABLE)
        self._held = True
        if self._view.len < 4 or (<size_t>self._view.buf) % 4:
            self.release()
            raise ValueError("a bell flag needs 4 aligned writable bytes")
        self._flag = <uint32_t *>self._view.buf

    def __dealloc__(self):
        if self._held:
            PyBuffer_Release(&self._view)
            self._held = False

    cdef int _check(self) except -1:
        if not self._held:
            raise ValueError("bell flag released")
        return 0

    def arm(self):
        """The consumer may sleep from now on: producers must signal (a full fence follows)."""
        self._check()
        jg_arm(self._flag)

    def disarm(self):
        """The consumer is awake and will look at its rings again: producers need not signal."""
        self._check()
        jg_disarm(self._flag)

    def take(self):
        """After a push: True when the consumer may be asleep (the caller signals it); clears the flag."""
        self._check()
        return jg_take(self._flag) != 0

    @property
    def armed(self):
        self._check()
        return jg_load32(self._flag) != 0

    def release(self):
        if self._held:
            PyBuffer_Release(&self._view)
            self._held = False

# ---- the frontend's read of a sink's outputs -------------------------------------------------------
cdef uint32_t _TENSORS_MAGIC = 0x534E544A  # b"JTNS", little-endian (``jigsaw.tensors.MAGIC``)
cdef uint16_t _TENSORS_VERSION = 1
cdef int _MAX_NDIM = 32
cdef object _frombuffer = None

def decode_arrays(payload, tuple wire_dtypes):
    """The arrays of a tensor payload (``jigsaw.tensors.encode_tensors``), views into ``payload``,
    or None when a tensor is BYTES (the caller decodes that payload the general way).

    ``wire_dtypes[code]`` is the numpy dtype of a tensor's datatype code (None for BYTES). The
    frontend reads every sink record's outputs this way: the checks of ``decode_tensors`` (a
    malformed payload raises ValueError), without its ``Tensor`` objects and Python-level parse."""
    global _frombuffer
    if _frombuffer is None:
        import numpy
        _frombuffer = numpy.frombuffer
    cdef Py_buffer view
    PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
    cdef const unsigned char *p = <const unsigned char *>view.buf
    cdef uint64_t end = view.len
    cdef uint64_t pos, data_bytes, dim
    cdef uint32_t magic, reserved
    cdef uint16_t version, num, name_len
    cdef unsigned char code, ndim
    cdef Py_ssize_t i, d
    cdef list out = []
    cdef list shape
    try:
        if end < 8:
            raise ValueError(f"tensor payload of {end} bytes is shorter than its preamble")
        memcpy(&magic, p, 4)
        memcpy(&version, p + 4, 2)
        memcpy(&num, p + 6, 2)
        if magic != _TENSORS_MAGIC or version != _TENSORS_VERSION:
            raise ValueError(f"not a jigsaw tensor payload v{_TENSORS_VERSION} (magic={magic:#x}, "
                             f"version={version})")
        pos = 8
        for i in range(num):
            if end - pos < 16:
                raise ValueError(f"truncated tensor payload: header of tensor {i} missing")
            memcpy(&name_len, p + pos, 2)
            code = p[pos + 2]
            ndim = p[pos + 3]
            memcpy(&reserved, p + pos + 4, 4)
            memcpy(&data_bytes, p + pos + 8, 8)
            pos += 16
            if code == 0 or code >= len(wire_dtypes) or reserved != 0 or ndim > _MAX_NDIM:
                raise ValueError(f"corrupt header of tensor {i} (dtype code {code}, ndim {ndim})")
            dtype = wire_dtypes[code]
            if dtype is None:
                return None
            if end - pos < 8 * <uint64_t>ndim + name_len:
                raise ValueError(f"truncated tensor payload: shape/name of tensor {i} missing")
            shape = []
            count = 1
            for d in range(ndim):
                memcpy(&dim, p + pos + 8 * d, 8)
                shape.append(dim)
                count *= dim
            pos = _align8(pos + 8 * <uint64_t>ndim + name_len)
            if pos > end or data_bytes > end - pos:
                raise ValueError(f"truncated tensor payload: data of tensor {i} overruns the payload")
            if count * dtype.itemsize != data_bytes:
                raise ValueError(f"tensor {i}: {data_bytes} data bytes for {dtype} shape {tuple(shape)}")
            out.append(_frombuffer(payload, dtype, count, pos).reshape(shape))
            pos = _align8(pos + data_bytes)
        if pos != end:
            raise ValueError(f"tensor payload is {end} bytes but its tensors end at {pos}")
        return out
    finally:
        PyBuffer_Release(&view)
