"""Shared-memory SPSC ring, doorbell, names and cleanup; ring tests run against both implementations."""

from __future__ import annotations

import hashlib
import os
import random
import stat
import subprocess
import sys
import textwrap
import time
from collections import deque
from pathlib import Path

import posix_ipc
import pytest

from jigsaw.runtime import rings
from jigsaw.runtime._pybatching import DropReason
from jigsaw.runtime.rings import (
    BELL_FIFO,
    RECORD_OVERHEAD_BYTES,
    SHM_DIR,
    Doorbell,
    RingClosedError,
    RingCorruptError,
    SegmentRegistry,
    Status,
    cleanup_stale,
    make_daemon_id,
    segment_name,
)

SRC = str(Path(__file__).resolve().parents[2] / "src")
U64_MAX = (1 << 64) - 1


def _payload(i: int, max_len: int) -> bytes:
    """Deterministic payload for record i, so the consumer can check it without being told."""
    n = random.Random(i).randrange(max_len + 1)
    block = hashlib.blake2b(i.to_bytes(8, "little")).digest()
    return (block * (n // len(block) + 1))[:n]


def _child_env(impl_name: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env["JIGSAW_NO_EXTENSIONS"] = "1" if impl_name == "pure" else "0"
    return env


def test_round_trip_random_sizes_with_wraparound(impl, new_ring, registry):
    ring = new_ring("rt", 4096, role="producer")
    rng = random.Random(7)
    model: deque[tuple[int, bytes]] = deque()
    next_id = 1
    try:
        for _ in range(3000):
            if rng.random() < 0.55:
                payload = rng.randbytes(rng.randrange(ring.max_payload_bytes + 1))
                h = impl.RecordHeader(request_id=next_id, deadline_ns=next_id * 3, hops=(next_id,))
                if ring.push(h, payload):
                    model.append((next_id, payload))
                    next_id += 1
                else:
                    assert ring.used_bytes > 0, "an empty ring must accept any allowed payload"
            else:
                got = ring.pop()
                if not model:
                    assert got is None
                    continue
                want_id, want_payload = model.popleft()
                h, payload = got
                assert (h.request_id, h.deadline_ns, h.hops[0], h.payload_len) == (
                    want_id, want_id * 3, want_id, len(want_payload))
                assert payload == want_payload
            assert len(ring) == len(model)
        assert next_id * 200 > 10 * ring.capacity_bytes, "the test should wrap many times"
        while model:
            assert ring.pop()[1] == model.popleft()[1]
        assert ring.pop() is None and ring.used_bytes == 0
    finally:
        ring.close()


def test_header_fields_round_trip_at_their_limits(impl, new_ring, registry):
    ring = new_ring("hdr", 4096)
    try:
        hops = tuple(U64_MAX - i for i in range(8))
        h = impl.RecordHeader(request_id=U64_MAX, parent_id=U64_MAX - 1, app=0xFFFF, task=0xFFFE,
                              lane=0xFFFFFFFF, child_index=7, child_count=9, status=Status.ERROR,
                              flags=0xABCD, deadline_ns=U64_MAX - 2, created_ns=12345, hops=hops)
        assert ring.push(h, b"xyz")
        got, payload = ring.pop()
        assert payload == b"xyz"
        assert got.as_tuple() == (U64_MAX, U64_MAX - 1, 0xFFFF, 0xFFFE, 0xFFFFFFFF, 7, 9, 3, 0xABCD,
                                  U64_MAX - 2, 12345, hops, 3)
        got.stamp(0, 99)
        assert got.hops[0] == 99
        with pytest.raises(IndexError):
            got.stamp(8, 1)
        with pytest.raises(ValueError):
            impl.RecordHeader(hops=range(9))
        with pytest.raises(OverflowError):
            ring.push(impl.RecordHeader(app=0x10000), b"")
        with pytest.raises(OverflowError):
            ring.push(impl.RecordHeader(request_id=-1), b"")
    finally:
        ring.close()


def test_full_ring_returns_false_and_recovers(impl, new_ring, registry):
    ring = new_ring("full", 2048)
    try:
        payload = bytes(100)
        pushed = 0
        while ring.push(impl.RecordHeader(request_id=pushed), payload):
            pushed += 1
            assert pushed < 100
        assert pushed == 2048 // (RECORD_OVERHEAD_BYTES + 104)
        assert not ring.push(impl.RecordHeader(), payload)
        assert ring.pop()[0].request_id == 0
        assert ring.push(impl.RecordHeader(request_id=pushed), payload)
        assert [h.request_id for h, _ in ring.pop_many(1000)] == list(range(1, pushed + 1))
    finally:
        ring.close()


def test_payload_limits(impl, new_ring, registry):
    with pytest.raises(ValueError, match="at least"):
        new_ring("tiny", 512)
    with pytest.raises(ValueError, match="exceeds"):
        new_ring("cap", 4096, max_payload_bytes=4096)
    ring = new_ring("lim", 4096, max_payload_bytes=1000)
    try:
        assert ring.max_payload_bytes == 1000
        assert ring.push(impl.RecordHeader(), bytes(1000))
        with pytest.raises(ValueError, match="max_payload_bytes=1000"):
            ring.push(impl.RecordHeader(), bytes(1001))
        with pytest.raises(ValueError, match="contiguous"):
            ring.push(impl.RecordHeader(), memoryview(bytes(64))[::2])
    finally:
        ring.close()


def test_empty_ring_always_accepts_max_payload(impl, new_ring, registry):
    """Wherever the write position is, an empty ring takes a maximal record (no deadlock)."""
    ring = new_ring("max", 4096)
    try:
        for small in range(0, 600, 8):
            assert ring.push(impl.RecordHeader(), bytes(small))
            assert ring.pop() is not None
            assert ring.push(impl.RecordHeader(), bytes(ring.max_payload_bytes))
            assert len(ring.pop()[1]) == ring.max_payload_bytes
    finally:
        ring.close()


def test_pop_many_accepts_memoryview_payloads(impl, new_ring, registry):
    ring = new_ring("many", 8192)
    try:
        data = bytearray(range(256))
        for i in range(10):
            assert ring.push(impl.RecordHeader(request_id=i), memoryview(data)[i:i + 20])
        first = ring.pop_many(4)
        rest = ring.pop_many(100)
        assert [h.request_id for h, _ in first + rest] == list(range(10))
        assert [p for _, p in first + rest] == [bytes(data[i:i + 20]) for i in range(10)]
        assert ring.pop_many(5) == [] and len(ring) == 0
    finally:
        ring.close()


def test_closed_flag_refuses_pushes_but_keeps_records(impl, new_ring, registry):
    ring = new_ring("closed", 4096)
    peer = impl.ShmRing.attach(ring.name)
    try:
        assert ring.push(impl.RecordHeader(request_id=1), b"a")
        peer.mark_closed()
        assert ring.closed
        with pytest.raises(RingClosedError):
            ring.push(impl.RecordHeader(), b"b")
        assert ring.pop()[0].request_id == 1
    finally:
        peer.close()
        ring.close()


def test_roles_record_pids(impl, new_ring, registry):
    ring = new_ring("pids", 4096, role="consumer")
    try:
        assert ring.consumer_pid == os.getpid() and ring.producer_pid == 0
        with pytest.raises(ValueError):
            impl.ShmRing.attach(ring.name, role="observer")
    finally:
        ring.close()


def test_attach_rejects_foreign_segment(impl, registry):
    name = registry.name("foreign")
    registry.add_shm(name)
    shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=8192)
    shm.close_fd()
    with pytest.raises(RingCorruptError, match="not a jigsaw ring"):
        impl.ShmRing.attach(name)
    with pytest.raises(posix_ipc.ExistentialError):
        impl.ShmRing.create(name, 4096)


def test_corrupt_record_raises(impl, new_ring, registry):
    ring = new_ring("corrupt", 4096)
    try:
        assert ring.push(impl.RecordHeader(), b"hello")
        import mmap

        shm = posix_ipc.SharedMemory(ring.name)
        mm = mmap.mmap(shm.fd, shm.size)
        shm.close_fd()
        mm[384 + 4:384 + 8] = b"JUNK"
        with pytest.raises(RingCorruptError):
            ring.pop()
        mm.close()
    finally:
        ring.close()


@pytest.fixture(params=["fifo", "eventfd"])
def bell_kind(request, monkeypatch):
    """Both kinds of doorbell (``rings.doorbell_kind``); the eventfd only where it can be shared."""
    if request.param == "eventfd" and not rings._probe_eventfd_sharing():
        pytest.skip("this machine does not let a child take its parent's descriptors (pidfd_getfd)")
    monkeypatch.setenv("JIGSAW_DOORBELL", request.param)
    return request.param


def test_segments_are_private(impl, new_ring, registry, bell_kind):
    ring = new_ring("mode", 4096)
    bell = registry.create_doorbell("mode-bell")
    try:
        assert stat.S_IMODE(os.stat(SHM_DIR / ring.name[1:]).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(SHM_DIR / bell.name[1:]).st_mode) == 0o600
        if bell.kind == BELL_FIFO:
            assert stat.S_IMODE(os.stat(SHM_DIR / (bell.name[1:] + ".fifo")).st_mode) == 0o600
    finally:
        ring.close()
        bell.close()


def test_pure_and_compiled_share_one_format(pure_impl, compiled_impl, registry):
    name = registry.name("interop")
    registry.add_shm(name)
    a = pure_impl.ShmRing.create(name, 4096)
    b = compiled_impl.ShmRing.attach(a.name)
    try:
        rng = random.Random(3)
        for i in range(300):
            producer, consumer = (a, b) if i % 2 else (b, a)
            header = (pure_impl if i % 2 else compiled_impl).RecordHeader
            payload = rng.randbytes(rng.randrange(1500))
            assert producer.push(header(request_id=i, app=i % 7, hops=(i, i + 1)), payload)
            h, got = consumer.pop()
            assert (h.request_id, h.app, h.hops[:2], got) == (i, i % 7, (i, i + 1), payload)
    finally:
        b.close()
        a.close()


def _push_fns(impl):
    from jigsaw.runtime import _pyring
    if impl.name == "pure":
        return _pyring.push_child, _pyring.push_completion, _pyring.push_hop
    core = rings.load_core()
    return core.push_child, core.push_completion, core.push_hop


@pytest.mark.parametrize(("children", "routes", "expected"), [
    ({"c": [b"x"]}, {"c": [0, 2]}, ("c", b"x", [0, 2])),  # the chain's middle hop
    ({"c": [b"x"]}, {"c": []}, None),  # the lane sends task c nowhere
    ({"c": [b"x"]}, {}, None),
    ({"c": [b"x"]}, {"d": [1]}, None),
    ({"c": [b"x", b"y"]}, {"c": [0]}, None),  # two children of one task
    ({"c": [b"x"], "d": [b"y"]}, {"c": [0], "d": [1]}, None),  # children of two tasks
    ({"c": [b"x"], "d": [b"y"]}, {"c": [0]}, None),  # (one routed: the general path decides)
    ({}, {"c": [0]}, None),  # a sink, or no child this time
    ({"c": []}, {"c": [0]}, None),
    ({"c": (b"x",)}, {"c": [0]}, None),  # not a list: the general path
])
def test_lone_child_is_the_one_routed_child_else_none(impl, children, routes, expected):
    """``lone_child`` answers only where ``Worker.children_of`` would give exactly one child of a
    routed task; every other case is left to it (None)."""
    from jigsaw.runtime import _pyring
    lone_child = _pyring.lone_child if impl.name == "pure" else rings.load_core().lone_child
    assert lone_child(children, routes) == expected


def test_push_child_and_completion_write_what_the_worker_built(impl, new_ring, registry):
    """``push_child`` / ``push_completion`` (headers written straight into the ring) give the same
    records as the headers a worker built field by field and pushed with ``push_framed``."""
    push_child, push_completion, _ = _push_fns(impl)
    ring = new_ring("derived", 1 << 16)
    rng = random.Random(5)
    for _ in range(200):
        parent = impl.RecordHeader(request_id=rng.randrange(U64_MAX), parent_id=7, app=rng.randrange(1 << 16),
                                   task=3, lane=rng.randrange(1 << 32), child_index=2, child_count=9,
                                   status=1, flags=0, deadline_ns=rng.randrange(U64_MAX),
                                   created_ns=rng.randrange(U64_MAX), hops=tuple(range(1, 9)))
        before = parent.as_tuple()
        body = rng.randbytes(rng.randrange(300))
        credit, sent_ns = rng.randrange(U64_MAX), rng.randrange(U64_MAX)
        task, k, n = rng.randrange(1 << 16), rng.randrange(1 << 32), rng.randrange(1 << 32)
        assert push_child(ring, parent, task, k, n, sent_ns, credit, body)
        want = impl.RecordHeader(request_id=parent.request_id, parent_id=parent.request_id, app=parent.app,
                                 task=task, lane=parent.lane, child_index=k, child_count=n,
                                 deadline_ns=parent.deadline_ns, created_ns=parent.created_ns)
        want.stamp(0, sent_ns)
        assert ring.push_framed(want, credit, body)
        status = rng.choice(list(Status))
        assert push_completion(ring, parent, task, status, n, sent_ns + 1, credit, body)
        done = parent.copy()
        done.task, done.status, done.child_count = task, int(status), n
        done.stamp(4, sent_ns + 1)
        assert ring.push_framed(done, credit, body)
        assert parent.as_tuple() == before  # the item's own header is left as it is
        (h1, c1, b1), (h2, c2, b2), (h3, c3, b3), (h4, c4, b4) = ring.pop_many_framed(4)
        assert (h1.as_tuple(), c1, bytes(b1)) == (h2.as_tuple(), c2, bytes(b2))
        assert (h3.as_tuple(), c3, bytes(b3)) == (h4.as_tuple(), c4, bytes(b4))
        assert (c1, bytes(b1), h1.hops[0]) == (credit, body, sent_ns)
        assert (h3.status, h3.hops[4]) == (status, sent_ns + 1)
    while push_child(ring, parent, 1, 0, 1, 1, 1, bytes(1000)):
        pass
    assert not push_completion(ring, parent, 1, 0, 0, 1, 1, bytes(1000))  # full: False, as push_framed


def test_push_hop_is_the_stamps_a_completion_and_a_child(impl, new_ring, registry):
    """``push_hop`` stamps the batch on the item's header and pushes what ``push_completion`` (OK,
    one child, no tensors) and ``push_child`` (index 0 of 1) push, with one time in both; a full
    ring says how far it got (2 both, 1 the record only, 0 nothing), a closed one pushes nothing."""
    push_child, push_completion, push_hop = _push_fns(impl)
    done, out = new_ring("hop-done", 1 << 12), new_ring("hop-out", 1 << 12)
    parent = impl.RecordHeader(request_id=U64_MAX - 5, app=9, task=2, lane=3, deadline_ns=77, created_ns=55,
                               hops=(11, 12))
    body = bytes(range(40))
    t0 = time.monotonic_ns()
    assert push_hop(done, parent, 4, 100, 200, 3, 1000, out, 5, 999, body) == 2
    assert parent.hops[2:6] == (100, 200, 0, 3)  # HOP_START, HOP_END, HOP_BATCH on the item's header
    ((d, dc, db),), ((c, cc, cb),) = done.pop_many_framed(2), out.pop_many_framed(2)
    now = d.hops[4]
    assert t0 <= now <= time.monotonic_ns() and c.hops[0] == now
    assert push_completion(done, parent, 4, Status.OK, 1, now, 1000, b"")
    assert push_child(out, parent, 5, 0, 1, now, 999, body)
    ((d2, dc2, db2),), ((c2, cc2, cb2),) = done.pop_many_framed(2), out.pop_many_framed(2)
    assert (d.as_tuple(), dc, bytes(db)) == (d2.as_tuple(), dc2, bytes(db2))
    assert (c.as_tuple(), cc, bytes(cb)) == (c2.as_tuple(), cc2, bytes(cb2))
    while push_child(out, parent, 5, 0, 1, 1, 1, body):
        pass
    assert push_hop(done, parent, 4, 1, 2, 1, 1000, out, 5, 999, body) == 1  # the record went, not the child
    assert len(done) == 1 and done.pop_many_framed(1)
    while push_completion(done, parent, 4, 0, 0, 1, 1, b""):
        pass
    out.pop_many_framed(1)  # room for the child: the full completion ring alone stops it
    held = len(done), len(out)
    assert push_hop(done, parent, 4, 1, 2, 1, 1000, out, 5, 999, body) == 0
    assert (len(done), len(out)) == held
    peer = impl.ShmRing.attach(out.name)
    try:
        for ring in (done, out):
            ring.pop_many_framed(100)
        peer.mark_closed()
        assert push_hop(done, parent, 4, 1, 2, 1, 1000, out, 5, 999, body) == 0 and len(done) == 0
    finally:
        peer.close()


def test_status_and_drop_reason_agree():
    assert Status.DROPPED_DEADLINE == DropReason.DROP_DEADLINE
    assert Status.DROPPED_STALE == DropReason.DROP_STALE


def test_public_module_picks_an_implementation():
    expected = "compiled" if rings.HAS_EXTENSION else "pure"
    assert (rings.ShmRing.__module__ == "jigsaw._core") == (expected == "compiled")
    if os.environ.get("JIGSAW_NO_EXTENSIONS") == "1":
        assert not rings.HAS_EXTENSION


_PRODUCER = textwrap.dedent("""
    import hashlib, random, sys, time
    impl, name, bell_name = sys.argv[1:4]
    n, max_len = int(sys.argv[4]), int(sys.argv[5])
    if impl == "compiled":
        from jigsaw._core import RecordHeader, ShmRing
    else:
        from jigsaw.runtime._pyring import RecordHeader, ShmRing
    from jigsaw.runtime.rings import Doorbell
    def payload(i):
        k = random.Random(i).randrange(max_len + 1)
        block = hashlib.blake2b(i.to_bytes(8, "little")).digest()
        return (block * (k // len(block) + 1))[:k]
    ring = ShmRing.attach(name, role="producer")
    bell = Doorbell.attach(bell_name)
    give_up = time.monotonic() + 60
    for i in range(1, n + 1):
        h = RecordHeader(request_id=i, created_ns=time.monotonic_ns())
        while not ring.push(h, payload(i)):
            bell.ring()
            time.sleep(0.0001)
            if time.monotonic() > give_up:
                sys.exit("consumer stalled")
        bell.ring()
    ring.close()
    bell.close()
""")


def test_cross_process_in_order_and_intact(impl, new_ring, registry, bell_kind):
    n, max_len = 3000, 3000
    ring = new_ring("xproc", 16384, role="consumer")
    bell = registry.create_doorbell("xproc-bell")
    proc = subprocess.Popen([sys.executable, "-c", _PRODUCER, impl.name, ring.name, bell.name,
                             str(n), str(max_len)], env=_child_env(impl.name))
    try:
        expect = 1
        give_up = time.monotonic() + 60
        while expect <= n and time.monotonic() < give_up:
            batch = ring.pop_many(64)
            if not batch:
                bell.wait(0.5)
                continue
            for h, payload in batch:
                assert h.request_id == expect
                assert payload == _payload(expect, max_len), f"record {expect} corrupted"
                assert h.created_ns <= time.monotonic_ns()
                expect += 1
        assert expect == n + 1, f"only {expect - 1} of {n} records arrived"
        assert proc.wait(timeout=30) == 0
        assert ring.producer_pid == proc.pid and ring.consumer_pid == os.getpid()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        ring.close()
        bell.close()


_WAITER = textwrap.dedent("""
    import sys, time
    from jigsaw.runtime.rings import Doorbell
    bell = Doorbell.attach(sys.argv[1])
    print("ready", flush=True)
    cpu0, t0 = time.process_time(), time.monotonic()
    woke = bell.wait(20.0)
    print(woke, time.process_time() - cpu0, time.monotonic() - t0, flush=True)
""")


def test_doorbell_wakes_blocked_consumer_without_spinning(registry):
    bell = registry.create_doorbell("wake")
    proc = subprocess.Popen([sys.executable, "-c", _WAITER, bell.name], env=_child_env("pure"),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        bell.ring()
        out, _ = proc.communicate(timeout=20)
        woke, cpu_s, wall_s = out.split()
        assert woke == "True"
        assert float(wall_s) >= 0.4
        assert float(wall_s) < 10, "the ring did not wake the waiter"
        assert float(cpu_s) < 0.05, f"waiting consumer used {cpu_s} s CPU"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        bell.close()


def test_doorbell_idle_wait_uses_no_cpu_and_times_out(registry):
    bell = registry.create_doorbell("idle")
    try:
        cpu0, t0 = time.process_time(), time.monotonic()
        assert bell.wait(0.5) is False
        assert time.monotonic() - t0 >= 0.45
        assert time.process_time() - cpu0 < 0.05
        assert bell.wait(0) is False
        bell.ring()
        bell.ring()
        assert bell.wait(0) is True
        assert bell.wait(0) is False, "rings coalesce while a wakeup is pending"
    finally:
        bell.close()


def test_names_are_unique_and_validated():
    a, b = make_daemon_id(), make_daemon_id()
    assert a != b and a.startswith(f"{os.getpid()}-")
    assert segment_name(a, "in.task-3") == f"/jigsaw-{a}-in.task-3"
    with pytest.raises(ValueError):
        segment_name(a, "bad/purpose")


def _own_entries() -> set[str]:
    """This process's /dev/shm entries (other processes, xdist workers included, come and go)."""
    tag = f"jigsaw-{os.getpid()}-"
    return {e for e in os.listdir(SHM_DIR) if e.startswith((tag, "sem." + tag))}


def test_registry_cleanup_leaves_nothing(tmp_path, bell_kind):
    before = _own_entries()
    manifest = tmp_path / "jigsaw.manifest"
    reg = SegmentRegistry(manifest)
    try:
        r1 = reg.create_ring("a", 4096)
        r2 = reg.create_ring("b", 8192)
        bell = reg.create_doorbell("bell")
        fifo = {bell.name[1:] + ".fifo"} if bell.kind == BELL_FIFO else set()
        assert _own_entries() - before == {r1.name[1:], r2.name[1:], bell.name[1:], *fifo}
        assert manifest.read_text().split() == ["shm", r1.name, "shm", r2.name, "bell", bell.name]
        for obj in (r1, r2, bell):
            obj.close()
    finally:
        removed = reg.cleanup()
    assert len(removed) == 3
    assert _own_entries() - before == set()
    assert not manifest.exists()


def test_cleanup_manifest_after_crash(tmp_path, bell_kind):
    before = _own_entries()
    manifest = tmp_path / "m"
    reg = SegmentRegistry(manifest)
    try:
        reg.create_ring("r", 4096).close()
        reg.create_doorbell("d").close()
        assert SegmentRegistry.cleanup_manifest(manifest) == reg.names
        assert _own_entries() == before and not manifest.exists()
    finally:
        reg.cleanup()


def test_cleanup_stale_removes_dead_daemons_only(tmp_path, bell_kind):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    dead_reg = SegmentRegistry(None, daemon_id=make_daemon_id(dead.pid))
    live_reg = SegmentRegistry(None)
    try:
        dead_reg.create_ring("r", 4096).close()
        dead_reg.create_doorbell("d").close()
        live_reg.create_ring("r", 4096).close()
        live_reg.create_doorbell("d").close()
        removed = cleanup_stale(f"jigsaw-{dead.pid}-")
        assert sorted(removed) == sorted(dead_reg.names)
        assert cleanup_stale(f"jigsaw-{os.getpid()}-") == []
        entries = set(os.listdir(SHM_DIR))
        assert live_reg.names[0][1:] in entries and live_reg.names[1][1:] in entries
        assert not any(name[1:] in entries or name[1:] + ".fifo" in entries for name in dead_reg.names)
    finally:
        dead_reg.cleanup()
        live_reg.cleanup()


def test_doorbell_attach_and_unlink(registry, bell_kind):
    bell = registry.create_doorbell("attach")
    other = Doorbell.attach(bell.name)
    try:
        other.ring()
        assert bell.wait(1.0)
    finally:
        other.close()
        bell.close()
    bell.unlink()
    bell.unlink()


def test_doorbells_fall_back_to_fifos_where_eventfds_cannot_be_shared(monkeypatch, registry):
    monkeypatch.setattr(rings, "_eventfd_shareable", False)
    monkeypatch.setenv("JIGSAW_DOORBELL", "auto")
    assert rings.doorbell_kind() == BELL_FIFO
    bell = registry.create_doorbell("fallback")
    other = Doorbell.attach(bell.name)
    try:
        assert bell.kind == other.kind == BELL_FIFO
        other.ring()
        assert bell.wait(1.0)
    finally:
        other.close()
        bell.close()
    monkeypatch.setenv("JIGSAW_DOORBELL", "eventfd")
    with pytest.raises(RuntimeError, match="pidfd_getfd"):
        rings.doorbell_kind()


def test_an_eventfd_doorbell_whose_creator_is_gone_does_not_attach(registry):
    if not rings._probe_eventfd_sharing():
        pytest.skip("this machine does not let a child take its parent's descriptors (pidfd_getfd)")
    bell = Doorbell.create(registry.name("gone"), rings.BELL_EVENTFD)
    registry.add_bell(bell.name)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    try:
        kind, _, fd = rings._BELL_INFO.unpack_from(bell._mm, rings._BELL_INFO_AT)
        rings._BELL_INFO.pack_into(bell._mm, rings._BELL_INFO_AT, kind, dead.pid, fd)
        with pytest.raises(posix_ipc.ExistentialError, match="cannot take eventfd"):
            Doorbell.attach(bell.name)
    finally:
        bell.close()


def test_push_hops_pushes_each_lone_child_hop_and_returns_the_rest(impl, new_ring):
    """A batch's one-child hops in one call: an item whose lone child goes to one live consumer
    gets its record and child (half the credit each) and its output is marked to ring; an item
    whose consumer failed, with no credit to split, with an error or with two candidates comes
    back untouched (-1), and one whose child finds its ring full comes back with ``push_hop``'s 1
    (its record went)."""
    from types import SimpleNamespace

    from jigsaw.runtime import _pyring
    from jigsaw.runtime.stats import FAILED, READY, SLOT_WORDS, STATE
    push_hops = _pyring.push_hops if impl.name == "pure" else rings.load_core().push_hops
    done, out = new_ring("hops-done", 1 << 12), new_ring("hops-out", 1 << 12)
    tiny = new_ring("hops-tiny", 1 << 10)
    while tiny.push_framed(impl.RecordHeader(), 1, b""):
        pass
    words = memoryview(bytearray(3 * SLOT_WORDS * 8)).cast("Q")
    for slot, state in enumerate((READY, FAILED, READY)):
        words[slot * SLOT_WORDS + STATE] = state
    # lanes: 0 to output 0 (live), 1 to output 1 (failed), 2 to output 2 (full), 3 to 0 or 2
    routes = [{"c": [0]}, {"c": [1]}, {"c": [2]}, {"c": [0, 2]}]
    rung: set[int] = set()
    wiring = SimpleNamespace(hop=(done, [out, out, tiny], routes, {"c": 7},
                                  words, [s * SLOT_WORDS + STATE for s in range(3)], rung))
    cases = [(0, 100, ""), (1, 100, ""), (0, 1, ""), (0, 100, "bad input"), (3, 100, ""), (2, 101, "")]
    items, results = [], []
    for rid, (lane, credit, error) in enumerate(cases):
        items.append((impl.RecordHeader(request_id=rid, lane=lane, deadline_ns=9), credit, b"", wiring))
        results.append(SimpleNamespace(children={"c": [bytes([rid])]}, error=error))
    assert push_hops(items, results, 4, 10, 20, 3, FAILED) == [(1, -1), (2, -1), (3, -1), (4, -1), (5, 1)]
    assert rung == {0}
    records = [(h.request_id, h.task, h.status, h.child_count, k) for h, k, _ in done.pop_many_framed(8)]
    assert records == [(0, 4, 0, 1, 50), (5, 4, 0, 1, 51)]
    ((child, share, body),) = out.pop_many_framed(8)
    assert (child.request_id, child.task, child.child_index, child.child_count, share, bytes(body)) == (
        0, 7, 0, 1, 50, b"\x00")
    assert items[0][0].hops[2:6] == (10, 20, 0, 6) and items[1][0].hops[2] == 0
    with pytest.raises(ValueError, match="results"):
        push_hops(items, results[:1], 4, 10, 20, 3, FAILED)
