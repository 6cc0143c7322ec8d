"""Batching queue and deadline dropper (paper §3.3), run against both implementations."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jigsaw.runtime import batching
from jigsaw.runtime._pybatching import DropReason

MS = 1_000_000
EXEC_NS = 5 * MS
REMAINING_NS = 20 * MS
SLACK_NS = EXEC_NS + REMAINING_NS


def make_queue(impl, *, max_batch=4, max_wait_ns=10 * MS, capacity=16, staleness_ns=100 * MS,
               remaining_min_ns=REMAINING_NS, exec_estimate_ns=EXEC_NS):
    return impl.BatchQueue(max_batch, max_wait_ns, capacity, staleness_ns, remaining_min_ns, exec_estimate_ns)


FAR = 10**15


def test_full_batch_released_at_exactly_max_batch(impl):
    q = make_queue(impl)
    for i in range(3):
        assert q.push(i, FAR, 1000, f"r{i}")
    assert q.next_batch(1000, idle=False) is None
    assert q.push(3, FAR, 1000, "r3")
    batch = q.next_batch(1000, idle=False)
    assert [e[0] for e in batch] == [0, 1, 2, 3]
    assert batch[0] == (0, FAR, 1000, "r0")
    assert len(q) == 0 and q.next_batch(1000, idle=True) is None


def test_batch_released_when_oldest_waited_max_wait(impl):
    q = make_queue(impl)
    q.push(1, FAR, 1000, None)
    q.push(2, FAR, 5000, None)
    assert q.next_batch(1000 + 10 * MS - 1, idle=False) is None
    assert [e[0] for e in q.next_batch(1000 + 10 * MS, idle=False)] == [1, 2]


def test_idle_instance_takes_whatever_is_queued(impl):
    q = make_queue(impl)
    assert q.next_batch(0, idle=True) is None
    q.push(1, FAR, 1000, None)
    assert q.next_batch(1000, idle=False) is None
    assert [e[0] for e in q.next_batch(1000, idle=True)] == [1]


def test_batch_is_capped_and_oldest_first_with_edf_ties(impl):
    q = make_queue(impl, max_batch=3)
    q.push(1, FAR - 1, 300, None)
    q.push(2, FAR, 100, None)
    q.push(3, FAR - 5, 200, None)
    q.push(4, FAR - 9, 200, None)
    q.push(5, FAR, 50, None)
    assert [e[0] for e in q.next_batch(400, idle=False)] == [5, 2, 4]
    assert [e[0] for e in q.next_batch(400, idle=True)] == [3, 1]


def test_early_drop_exactly_at_the_deadline_boundary(impl):
    q = make_queue(impl)
    now = 50 * MS
    q.push(1, now + SLACK_NS, now, "ok")
    q.push(2, now + SLACK_NS - 1, now, "late")
    assert q.expired(now) == [(2, now + SLACK_NS - 1, now, "late", DropReason.DROP_DEADLINE)]
    assert q.expired(now) == []
    assert len(q) == 1
    assert q.expired(now + 1) == [(1, now + SLACK_NS, now, "ok", DropReason.DROP_DEADLINE)]


def test_early_drop_uses_batch_one_entry_of_latency_table(impl):
    q = make_queue(impl, exec_estimate_ns=[EXEC_NS, 8 * MS, 11 * MS])
    assert q.exec_estimate_ns == (EXEC_NS, 8 * MS, 11 * MS)
    q.push(1, 100 * MS, 0, None)
    assert q.expired(100 * MS - SLACK_NS) == []
    assert q.expired(100 * MS - SLACK_NS + 1)[0][4] == DropReason.DROP_DEADLINE


def test_remaining_min_can_be_updated(impl):
    q = make_queue(impl)
    q.push(1, 100 * MS, 0, None)
    q.remaining_min_ns = 0
    assert q.remaining_min_ns == 0
    assert q.expired(100 * MS - EXEC_NS) == []
    assert len(q.expired(100 * MS - EXEC_NS + 1)) == 1
    with pytest.raises(ValueError):
        q.remaining_min_ns = -1


def test_stale_drop_after_staleness(impl):
    q = make_queue(impl, staleness_ns=30 * MS)
    q.push(1, FAR, 0, "a")
    q.push(2, FAR, 1, "b")
    assert q.expired(30 * MS) == []
    assert q.expired(30 * MS + 1) == [(1, FAR, 0, "a", DropReason.DROP_STALE)]
    assert q.expired(30 * MS + 2) == [(2, FAR, 1, "b", DropReason.DROP_STALE)]


def test_deadline_reason_wins_over_stale(impl):
    q = make_queue(impl, staleness_ns=0)
    q.push(1, 10, 0, None)
    q.push(2, FAR, 0, None)
    assert [(e[0], e[4]) for e in q.expired(1)] == [(1, DropReason.DROP_DEADLINE), (2, DropReason.DROP_STALE)]


def test_capacity_bound(impl):
    q = make_queue(impl, capacity=3, max_batch=2)
    assert all(q.push(i, FAR, i, None) for i in range(3))
    assert not q.push(9, FAR, 3, None)
    assert len(q) == 3
    assert len(q.next_batch(3, idle=False)) == 2
    assert q.push(9, FAR, 4, None)
    assert [e[0] for e in q.drain()] == [2, 9]


def test_next_wakeup_points_at_the_next_rule(impl):
    q = make_queue(impl, staleness_ns=100 * MS)
    assert q.next_wakeup_ns(0) is None
    q.push(1, FAR, 1000, None)
    assert q.next_wakeup_ns(1000) == 1000 + 10 * MS
    q.push(2, 1000 + 30 * MS, 2000, None)
    assert q.next_wakeup_ns(2000) == 1000 + 30 * MS - SLACK_NS + 1
    assert q.next_wakeup_ns(10 * MS) == 10 * MS, "an overdue rule means wake now"
    for i in range(3, 5):
        q.push(i, FAR, 3000, None)
    assert q.next_wakeup_ns(3000) == 3000


def test_invalid_arguments(impl):
    for kwargs in ({"max_batch": 0}, {"capacity": 0}, {"max_wait_ns": -1}, {"exec_estimate_ns": []},
                   {"exec_estimate_ns": [-1]}):
        with pytest.raises(ValueError):
            make_queue(impl, **kwargs)
    q = make_queue(impl)
    with pytest.raises(OverflowError):
        q.push(-1, 0, 0, None)
    assert len(q) == 0


def test_public_module_picks_an_implementation():
    assert batching.BatchQueue.__module__ == ("jigsaw._core" if batching.HAS_EXTENSION
                                              else "jigsaw.runtime._pybatching")


ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 3 * MS), st.integers(0, 60 * MS), st.integers(-2 * MS, 0)),
        st.tuples(st.just("advance"), st.integers(0, 15 * MS)),
        st.tuples(st.just("batch"), st.booleans()),
        st.tuples(st.just("expire")),
    ),
    max_size=120,
)


def _run(impl, program, max_batch, capacity):
    """Execute ``program``; return the trace of outputs and check the invariants on the way."""
    q = make_queue(impl, max_batch=max_batch, capacity=capacity, staleness_ns=40 * MS)
    now = 0
    next_id = 0
    accepted: set[int] = set()
    returned: list[int] = []
    trace = []
    for op in program:
        if op[0] == "push":
            _, gap, budget, skew = op
            arrival = max(0, now + skew)
            ok = q.push(next_id, now + budget, arrival, ("item", next_id))
            assert ok == (len(accepted) - len(returned) < capacity)
            if ok:
                accepted.add(next_id)
            next_id += 1
            now += gap
            trace.append(ok)
        elif op[0] == "advance":
            wake = q.next_wakeup_ns(now)
            if wake is not None and wake > now:
                assert q.next_batch(wake - 1, idle=False) is None
                assert q.expired(wake - 1) == []
            now += op[1]
        elif op[0] == "batch":
            batch = q.next_batch(now, idle=op[1]) or []
            assert len(batch) <= max_batch
            assert [(e[2], e[1]) for e in batch] == sorted((e[2], e[1]) for e in batch)
            assert all(e[3] == ("item", e[0]) for e in batch)
            returned += [e[0] for e in batch]
            trace.append(batch)
        else:
            dropped = q.expired(now)
            for _, deadline, arrival, _, reason in dropped:
                if reason == DropReason.DROP_DEADLINE:
                    assert now + SLACK_NS > deadline
                else:
                    assert now - arrival > 40 * MS
            returned += [e[0] for e in dropped]
            trace.append(dropped)
            assert q.expired(now) == [], "one call drops everything due"
        assert len(q) == len(accepted) - len(returned)
    rest = q.drain()
    returned += [e[0] for e in rest]
    trace.append(rest)
    assert len(q) == 0
    assert sorted(returned) == sorted(accepted), "every accepted request comes back exactly once"
    return trace


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=ops, max_batch=st.integers(1, 6), capacity=st.integers(1, 12))
def test_every_request_returned_exactly_once(impl, program, max_batch, capacity):
    _run(impl, program, max_batch, capacity)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=ops, max_batch=st.integers(1, 6), capacity=st.integers(1, 12))
def test_compiled_and_pure_agree(pure_impl, compiled_impl, program, max_batch, capacity):
    assert _run(compiled_impl, program, max_batch, capacity) == _run(pure_impl, program, max_batch, capacity)


def test_take_framed_pops_stamps_and_queues_what_fits(impl, new_ring):
    """A worker's intake from one ring in one call: each item ``(header, credit, tensors, tag)``
    stamped popped, arriving now or, when a full batch passed it over, at its ring entry; what the
    queue has no room for comes back, popped, to be answered."""
    import time

    ring = new_ring("intake", 1 << 14)
    queue = (batching._pybatching.BatchQueue if impl.name == "pure" else batching.BatchQueue)(
        4, 10 * MS, 3, 100 * MS, REMAINING_NS, EXEC_NS)
    if impl.name == "compiled" and not batching.HAS_EXTENSION:
        pytest.skip("the compiled queue is not in use")
    assert queue.take_framed(ring, 8, 0, "w") == (0, ())
    t0 = time.monotonic_ns()
    for rid, sent in ((1, 500), (2, 10**12), (3, 7), (4, 8)):
        h = impl.RecordHeader(request_id=rid, deadline_ns=t0 + 10**10, hops=(sent,))
        assert ring.push_framed(h, 100 + rid, bytes([rid]) * 3)
    got, refused = queue.take_framed(ring, 8, 1000, "w")
    now = time.monotonic_ns()
    assert got == 4 and len(queue) == 3 and len(ring) == 0
    ((header, credit, tensors, tag),) = refused
    assert (header.request_id, credit, bytes(tensors), tag) == (4, 104, b"\x04" * 3, "w")
    entries = queue.next_batch(now, True)
    by_id = {e[0]: e for e in entries}
    # passed over (entered before 1000): its ring entry; after it: now
    assert by_id[1][2] == 500 and by_id[3][2] == 7 and t0 <= by_id[2][2] <= now
    for rid, (h, credit, tensors, tag) in ((r, e[3]) for r, e in by_id.items()):
        assert (h.request_id, credit, bytes(tensors), tag) == (rid, 100 + rid, bytes([rid]) * 3, "w")
        assert t0 <= h.hops[1] <= now  # HOP_POPPED
    assert queue.take_framed(ring, 8, 0, "w") == (0, ())


def _intake_queue(impl, max_batch, capacity):
    if impl.name == "compiled" and not batching.HAS_EXTENSION:
        pytest.skip("the compiled queue is not in use")
    cls = batching._pybatching.BatchQueue if impl.name == "pure" else batching.BatchQueue
    return cls(max_batch, 10 * MS, capacity, 100 * MS, REMAINING_NS, EXEC_NS)


def test_take_batch_fills_round_robin_drops_and_releases_in_one_call(impl, new_ring):
    """A worker's intake and release in one call: rings visited from ``first`` (which moves on
    each round), a round that fills the batch followed by the drop rules, the oldest ``max_batch``
    released with their ids and tensors, and the time a full batch left items in the rings kept:
    the item it passed over arrives at its ring entry and so goes stale."""
    import time

    a, b = new_ring("take-a", 1 << 14), new_ring("take-b", 1 << 14)
    queue = _intake_queue(impl, 2, 4)
    t0 = time.monotonic_ns()
    for ring, rid, deadline, sent in ((a, 1, t0 + 10**12, t0), (a, 2, t0, t0), (b, 3, t0 + 10**12, t0),
                                      (b, 4, t0 + 10**12, 5)):
        h = impl.RecordHeader(request_id=rid, deadline_ns=deadline, hops=(sent,))
        assert ring.push_framed(h, 10 * rid, bytes([rid]))
    items, ids, tensors, dropped, refused, first, passed_over = queue.take_batch([a, b], ["A", "B"], 0, 0)
    now = time.monotonic_ns()
    assert ids == [1, 3] and [bytes(t) for t in tensors] == [b"\x01", b"\x03"]
    assert [(h.request_id, credit, tag) for h, credit, _, tag in items] == [(1, 10, "A"), (3, 30, "B")]
    assert [(d[0], d[3][3], d[4]) for d in dropped] == [(2, "A", DropReason.DROP_DEADLINE)]
    assert list(refused) == [] and first == 0 and t0 <= passed_over <= now
    assert len(queue) == 0 and len(a) == 0 and len(b) == 1
    items, ids, tensors, dropped, refused, first, passed = queue.take_batch([a, b], ["A", "B"], 1,
                                                                            passed_over)
    assert items is None and ids is None and tensors is None and list(refused) == []
    assert [(d[0], d[2], d[3][3], d[4]) for d in dropped] == [(4, 5, "B", DropReason.DROP_STALE)]
    assert (first, passed) == (0, passed_over)
    got = queue.take_batch([a, b], ["A", "B"], 1, passed_over)
    assert got[0] is None and list(got[3]) == [] and got[5:] == (0, passed_over)
    with pytest.raises(ValueError, match="tags"):
        queue.take_batch([a, b], ["A"], 0, 0)


def test_take_batch_returns_what_the_queue_has_no_room_for(impl, new_ring):
    ring = new_ring("take-full", 1 << 14)
    queue = _intake_queue(impl, 2, 1)
    for rid in (1, 2):
        assert ring.push_framed(impl.RecordHeader(request_id=rid, deadline_ns=10**18), rid, b"x")
    _, ids, _, dropped, refused, first, _ = queue.take_batch([ring], ["w"], 0, 0)
    assert ids == [1] and list(dropped) == [] and first == 0
    ((header, credit, tensors, tag),) = refused
    assert (header.request_id, credit, bytes(tensors), tag) == (2, 2, b"x", "w")
