"""The data plane's pure parts: credit splitting, the emulated backend, request validation."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from jigsaw.app import App, Task, TensorSpec, Variant
from jigsaw.backends.base import Downstream
from jigsaw.backends.emulated import EmulatedBackend
from jigsaw.runtime.oip import BadRequest, parse_infer_request
from jigsaw.runtime.records import TOTAL_CREDIT, frame, split_credit, unframe


@settings(deadline=None)  # a property, not a timing: a loaded machine must not fail it
@given(hs.lists(hs.integers(1, 40), min_size=1, max_size=4))
def test_credit_splits_always_sum_back(fanouts):
    # any tree of splits returns exactly TOTAL_CREDIT when every leaf reports
    frontier = [TOTAL_CREDIT]
    for n in fanouts:
        frontier = [share for c in frontier for share in split_credit(c, n)]
        assert all(c > 0 for c in frontier)
    assert sum(frontier) == TOTAL_CREDIT


def test_frame_roundtrip_and_bad_split():
    credit, body = unframe(frame(12345, b"abc"))
    assert credit == 12345 and bytes(body) == b"abc"
    with pytest.raises(ValueError):
        split_credit(3, 4)


def _ring_impls() -> list[object]:
    from jigsaw.runtime import _pyring
    from jigsaw.runtime.rings import load_core
    core = load_core()
    return [_pyring] + ([core] if core is not None else [])


@pytest.mark.parametrize("impl", _ring_impls(), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_framed_push_reads_back_as_the_joined_frame(impl):
    # push_framed(credit, tensors) is frame(credit, tensors) pushed without the join: the same bytes
    from jigsaw.runtime.rings import SegmentRegistry
    with SegmentRegistry() as reg:
        name = reg.name("framed")
        reg.add_shm(name)
        ring = impl.ShmRing.create(name, 1 << 12)
        try:
            bodies = [b"", b"abc", bytearray(b"x" * 13), memoryview(b"12345678"), bytes(range(200))]
            for k, body in enumerate(bodies):
                assert ring.push_framed(impl.RecordHeader(request_id=k), TOTAL_CREDIT - k, body)
            ring.push(impl.RecordHeader(request_id=99), frame(7, b"joined"))
            got = ring.pop_many_framed(100)
            assert [(h.request_id, c, bytes(t)) for h, c, t in got] == [
                *((k, TOTAL_CREDIT - k, bytes(b)) for k, b in enumerate(bodies)), (99, 7, b"joined")]
            ring.push_framed(impl.RecordHeader(request_id=1), 5, b"abc")
            ((_, payload),) = ring.pop_many(1)
            assert unframe(payload)[0] == 5 and bytes(unframe(payload)[1]) == b"abc"
            with pytest.raises(OverflowError):
                ring.push_framed(impl.RecordHeader(), -1, b"")
            big = bytes(ring.max_payload_bytes - 7)
            with pytest.raises(ValueError, match="exceeds"):  # the credit counts against the limit
                ring.push_framed(impl.RecordHeader(), 1, big)
            ring.push(impl.RecordHeader(), b"short")
            with pytest.raises(impl.RingCorruptError, match="no credit"):
                ring.pop_many_framed(1)
        finally:
            ring.close()


@pytest.mark.parametrize("impl", _ring_impls(), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_completion_records_read_as_flat_tuples(impl):
    # pop_completions: the fields the frontend accounts, durations from the hop stamps (0 when out
    # of order or missing), in push order across a wrap; a record without credit is corrupt
    from jigsaw.runtime import records
    from jigsaw.runtime.rings import SegmentRegistry
    assert impl.HOP_SLOTS == (records.HOP_SENT, records.HOP_POPPED, records.HOP_START, records.HOP_END,
                              records.HOP_DONE, records.HOP_BATCH)
    with SegmentRegistry() as reg:
        name = reg.name("completions")
        reg.add_shm(name)
        ring = impl.ShmRing.create(name, 1 << 12)
        try:
            stamps = (1_000, 4_000, 10_000, 12_500, 13_000, 3)  # sent, popped, start, end, done, batch
            for round_ in range(12):  # 12 x 5 records of ~200 bytes: the ring wraps several times
                for k in range(5):
                    h = impl.RecordHeader(request_id=100 * round_ + k, task=k, status=k % 2, child_index=k,
                                          child_count=2 * k, hops=stamps if k != 3 else (9_000, 0, 5_000))
                    assert ring.push_framed(h, TOTAL_CREDIT - k, bytes([k]) * (100 + k))
                got = ring.pop_completions(4)
                got += ring.pop_completions(100)
                assert ring.pop_completions(10) == [] and len(ring) == 0
                assert [g[0] for g in got] == [100 * round_ + k for k in range(5)]
                _, task, status, child_index, child_count, credit, tensors, queue_us, compute_us, batch, \
                    hop_us, done_ns = got[2]
                assert (task, status, child_index, child_count, credit) == (2, 0, 2, 4, TOTAL_CREDIT - 2)
                assert bytes(tensors) == b"\x02" * 102
                assert (queue_us, compute_us, batch, hop_us, done_ns) == (9.0, 2.5, 3, 3.0, 13_000)
                assert got[3][7:] == (0.0, 0.0, 0, 0.0, 0)  # start before sent, popped and end missing
            ring.push(impl.RecordHeader(request_id=1), b"short")
            with pytest.raises(impl.RingCorruptError, match="no credit"):
                ring.pop_completions(1)
        finally:
            ring.close()


def test_emulated_item_values_are_a_function_of_the_request():
    b = EmulatedBackend("c", "captioner", latency_ms_by_batch={1: 0.0}, seed=3)
    first, again = b.execute([11, 12], [b"", b""]), b.execute([12, 11], [b"", b""])
    assert bytes(first[0].outputs[0].data) == bytes(again[1].outputs[0].data)
    assert bytes(first[0].outputs[0].data) != bytes(first[1].outputs[0].data)
    tokens = [v for r in b.execute(list(range(200)), [b""] * 200)
              for v in memoryview(r.outputs[0].data).cast("i")]
    assert min(tokens) >= 0 and max(tokens) < 30522 and len(set(tokens)) > 3000


def test_emulated_latency_uses_smallest_profiled_batch_at_least_actual():
    b = EmulatedBackend("c", "classifier", latency_ms_by_batch={1: 10.0, 4: 30.0, 8: 50.0})
    assert b.batch_latency_ms(1) == 10.0 and b.batch_latency_ms(2) == 30.0
    assert b.batch_latency_ms(8) == 50.0 and b.batch_latency_ms(20) == 50.0
    fast = EmulatedBackend("c", "classifier", latency_ms_by_batch={1: 40.0}, time_scale=0.5)
    t0 = time.monotonic()
    (r,) = fast.execute([1], [b""])
    assert 0.019 <= time.monotonic() - t0 < 0.1
    assert [t.name for t in r.outputs] == ["label", "score"]


def test_emulated_batch_below_the_loop_timer_is_done_without_a_coroutine():
    """``execute_nowait`` hands a batch shorter than the loop's timer back as its items; a longer
    one as a coroutine that sleeps the whole draw; both give what ``execute`` gives."""
    import asyncio
    import inspect

    quick = EmulatedBackend("c", "generic", [Downstream("d", 1.0)], latency_ms_by_batch={1: 0.1})
    done = quick.execute_nowait([4, 5], [b"", b""])
    assert isinstance(done, list)
    assert [r.children for r in done] == [r.children for r in quick.execute([4, 5], [b"", b""])]
    assert [bytes(r.outputs[0].data) for r in done] == [bytes(r.outputs[0].data)
                                                         for r in quick.execute([4, 5], [b"", b""])]
    slow = EmulatedBackend("c", "classifier", latency_ms_by_batch={1: 30.0})
    pending = slow.execute_nowait([1], [b""])
    assert inspect.iscoroutine(pending)
    t0 = time.monotonic()
    (r,) = asyncio.run(pending)
    assert 0.029 <= time.monotonic() - t0 < 0.2
    assert [t.name for t in r.outputs] == ["label", "score"]


def test_emulated_detector_children_follow_factor():
    d = EmulatedBackend("det", "detector", [Downstream("car", 17.8), Downstream("person", 1.0)],
                        latency_ms_by_batch={1: 0.0})
    results = d.execute(list(range(400)), [b""] * 400)
    cars = [len(r.children["car"]) for r in results]
    assert abs(sum(cars) / len(cars) - 17.8) < 1.0
    assert all(len(r.children["person"]) == 1 for r in results)  # whole factors are exact
    again = d.execute([7], [b""])[0]
    assert len(again.children["car"]) == cars[7]  # seeded by request id


APP = App("m", (Task("t", "generic", (Variant("v", 1.0),)),), (), 100.0,
          inputs=(TensorSpec("x", "FP32", (-1, 2)),))


def test_parse_request_accepts_wildcards_and_flattens():
    r = parse_infer_request(b'{"id": "q", "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2],'
                            b' "data": [[1, 2], [3, 4.5]]}]}', APP)
    assert r.id == "q" and r.inputs[0][2] == (2, 2)
    assert r.inputs[0][3].shape == (2, 2) and r.inputs[0][3].reshape(-1).tolist() == [1, 2, 3, 4.5]


X = b'{"inputs": [{"name": "x", '


@pytest.mark.parametrize(("body", "field"), [
    (b"nope", "body"),
    (b'{"inputs": {}}', "inputs"),
    (b'{"inputs": [{"name": "y", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}', "inputs[0].name"),
    (X + b'"datatype": "INT8", "shape": [1, 2], "data": [1, 2]}]}', "inputs[0].datatype"),
    (X + b'"datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}', "inputs[0].shape"),
    (X + b'"datatype": "FP32", "shape": [1, 2], "data": [1]}]}', "inputs[0].data"),
    (X + b'"datatype": "FP32", "shape": [1, 2], "data": [1, "a"]}]}', "inputs[0].data"),
    (X + b'"datatype": "FP32", "shape": [1, -2], "data": []}]}', "inputs[0].shape"),
])
def test_parse_request_names_the_bad_field(body, field):
    with pytest.raises(BadRequest, match=f"^{field.replace('[', '.').replace(']', '.')}"):
        parse_infer_request(body, APP)


def test_emulated_batch_time_has_the_profiles_mean_and_p95():
    b = EmulatedBackend("t", "classifier", latency_ms_by_batch={1: 10.0, 4: 30.0},
                        mean_ms_by_batch={1: 9.0, 4: 27.0}, seed=3)
    draws = sorted(b.batch_duration_ms(3) for _ in range(20000))
    assert sum(draws) / len(draws) == pytest.approx(27.0, rel=0.02)
    assert draws[int(0.95 * len(draws))] == pytest.approx(30.0, rel=0.03)
    assert draws[0] >= 27.0 - (30.0 - 27.0) / (math.log(20.0) - 1.0) - 1e-9
    fixed = EmulatedBackend("t", "classifier", latency_ms_by_batch={1: 10.0})
    assert fixed.batch_duration_ms(1) == 10.0  # without a mean it sleeps the p95


def _one_task_routes(generation: int = 0) -> object:
    """One task's routes: 2 instances of 200 req/s, a 40 ms batch, a 200 ms SLO."""
    from factories import one_task_routes

    return one_task_routes(generation)


def test_admission_limit_is_capacity_times_the_slos_queueing_share():
    from jigsaw.runtime.admission import admission_limit

    routes = _one_task_routes()
    # 2 instances x 200 req/s, and 200 - 40 ms of the SLO left for queueing: 400 * 0.16 = 64.
    assert admission_limit(routes) == 64


def test_admission_limit_counts_requests_past_the_root_as_in_flight_not_queued():
    """A two-task app whose second task takes most of the SLO: at its planned rate, the requests in
    the second task are in flight too; the limit leaves them the SLO less the root's batch."""
    from jigsaw.app import Edge
    from jigsaw.plan import Plan, PlanInstance
    from jigsaw.runtime.admission import admission_limit
    from jigsaw.runtime.topology import AppRoutes

    tasks = (Task("a", "detector", (Variant("v", 1.0),)), Task("b", "classifier", (Variant("w", 1.0),)))
    app = App("x", tasks, (Edge("a", "b", {"v": 1.0}),), latency_slo_ms=650.0,
              inputs=(TensorSpec("image", "UINT8", (-1,)),))
    plan = Plan(app="x", space="st", demand_rps=60, planned_rps=60, feasible=True, max_demand_plan=False,
                status="optimal", objective=0.0, accuracy=1.0, slices_used=2, slices_available=7,
                solve_seconds=0.0, gap=0.0,
                instances=[PlanInstance("a", "v", "1g.10gb", 1, 2, 1, 50.0, 60.0, 1),
                           PlanInstance("b", "w", "3g.40gb", 1, 16, 1, 250.0, 60.0, 3)],
                task_latency_ms={"a": 50.0, "b": 250.0})
    routes = AppRoutes(app=app, app_index=0, lanes=[{"a": "v", "b": "w"}], lane_weights=[1.0], roots=[{}],
                       depth=2, slices=4, plan=plan)
    # 60 req/s x (650 - 50 ms): a request spends up to ~2 x 250 ms in b, past the root; the
    # path's sum (650 - 300 ms: 21) shed requests at the plan's own rate
    assert admission_limit(routes) == 36


def test_bottleneck_admission_counts_a_chains_later_task_that_lost_instances():
    """A depth-3 chain (ar_assistant's shape: detect -> caption -> speak, one item per edge) whose
    caption kept one of its three instances (an interim plan while the others drain): the roots'
    capacity still admits 300 req/s, which caption cannot finish; with ``admission_bottleneck``
    the limit is caption's 100 req/s, and a plan sized at every task is limited as before."""
    import dataclasses

    from jigsaw.app import Edge
    from jigsaw.plan import Plan, PlanInstance
    from jigsaw.runtime.admission import admission_limit, bottleneck_rps
    from jigsaw.runtime.topology import AppRoutes

    tasks = (Task("detect", "detector", (Variant("n", 1.0), Variant("x", 2.0))),
             Task("caption", "captioner", (Variant("g", 1.0),)),
             Task("speak", "tts", (Variant("t", 1.0),)))
    edges = (Edge("detect", "caption", {"n": 1.0, "x": 2.0}), Edge("caption", "speak", {"g": 1.0}))
    app = App("ar", tasks, edges, latency_slo_ms=1000.0, inputs=(TensorSpec("image", "UINT8", (-1,)),))
    assert app.multipliers(("x", "g", "t")) == \
        {"detect": 1.0, "caption": 2.0, "speak": 2.0}

    def routes(caption_count: int, bottleneck: bool) -> AppRoutes:
        plan = Plan(app="ar", space="ast", demand_rps=300, planned_rps=300, feasible=True,
                    max_demand_plan=False, status="optimal", objective=0.0, accuracy=1.0, slices_used=5,
                    slices_available=28, solve_seconds=0.0, gap=0.0,
                    instances=[PlanInstance("detect", "n", "1g.10gb", 1, 8, 1, 100.0, 300.0, 1),
                               PlanInstance("caption", "g", "1g.10gb", 1, 8, caption_count, 100.0, 100.0, 1),
                               PlanInstance("speak", "t", "1g.10gb", 1, 8, 1, 100.0, 300.0, 1)],
                    task_latency_ms={"detect": 100.0, "caption": 100.0, "speak": 100.0})
        return AppRoutes(app=app, app_index=0, lanes=[{"detect": "n", "caption": "g", "speak": "t"}],
                         lane_weights=[300.0], roots=[{}], depth=3, slices=5, plan=plan,
                         admission_bottleneck=bottleneck)
    # 900 ms of the SLO left behind the root's batch
    assert admission_limit(routes(3, True)) == admission_limit(routes(3, False)) == 270
    assert bottleneck_rps(routes(1, True)) == 100.0
    assert admission_limit(routes(1, False)) == 270  # the roots' capacity only
    assert admission_limit(routes(1, True)) == 90
    # a lane that doubles caption's items halves what caption carries per request
    two = routes(3, True)
    plan = dataclasses.replace(two.plan, instances=[dataclasses.replace(two.plan.instances[0], variant="x"),
                                                    *two.plan.instances[1:]])
    two = dataclasses.replace(two, plan=plan, lanes=[{"detect": "x", "caption": "g", "speak": "t"}])
    assert bottleneck_rps(two) == 150.0


def test_children_go_to_the_process_that_serves_them_soonest_not_the_shortest_queue():
    """Processes of one task on different segments: the load is the time to serve the queue."""
    from jigsaw.runtime.topology import process_items_per_s

    small = process_items_per_s({8: 210.0}, {8: 226.0}, 8)  # 1g.20gb x2, batch 8: 38 items/s
    large = process_items_per_s({32: 226.0}, {32: 243.0}, 32)  # 3g.40gb x2, batch 32: 142 items/s
    assert small == pytest.approx(38.1, abs=0.1) and large == pytest.approx(141.6, abs=0.1)
    assert process_items_per_s({}, {8: 200.0}, 8) == pytest.approx(40.0)  # the p95 without a mean
    # 6 queued on the large one are served before 2 on the small one
    assert (6 + 1) / large < (2 + 1) / small


def test_topology_tolerates_a_downstream_task_planned_without_processes():
    """Planned for a measured fan-out of 0, a downstream task may get no process: its route is empty."""
    import sys
    from pathlib import Path

    from jigsaw.plan import LanePlan, Plan, PlanInstance
    from jigsaw.runtime.topology import TopologyError, build_topology
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from factories import make_app, make_node, make_profiles

    app = make_app({"a": [("va", 1.0)], "b": [("vb", 1.0)]}, [("a", "b", {"va": 1.0})])
    node = make_node()
    profiles = make_profiles(node, {"va": 1.0, "vb": 1.0})

    def plan(instances: list[PlanInstance]) -> Plan:
        return Plan(app="tiny", space="ast", demand_rps=10, planned_rps=10, feasible=True,
                    max_demand_plan=False, status="optimal", objective=0.0, accuracy=1.0, slices_used=1,
                    slices_available=7, solve_seconds=0.0, gap=0.0, instances=instances,
                    task_latency_ms={"a": 10.0, "b": 10.0}, lanes=[LanePlan({"a": "va", "b": "vb"}, 10.0)])

    only_a = [PlanInstance("a", "va", "1g.10gb", 1, 4, 1, 10.0, 100.0, 1)]
    topo = build_topology(node, [(app, plan(only_a))], profiles, name_of=lambda p: f"/t-{p}")
    (spec,) = topo.processes
    assert spec.task == "a" and spec.routes == [{"b": []}] and spec.outputs == []
    only_b = [PlanInstance("b", "vb", "1g.10gb", 1, 4, 1, 10.0, 100.0, 1)]
    with pytest.raises(TopologyError, match="lane 0 sends a"):
        build_topology(node, [(app, plan(only_b))], profiles, name_of=lambda p: f"/t-{p}")


def test_a_blocking_backend_computes_off_the_loop_so_heartbeats_continue():
    import asyncio

    from jigsaw.backends.base import Backend, ItemResult

    class Slow(Backend):
        def load(self, variant, max_batch):
            pass

        def execute(self, request_ids, inputs):
            time.sleep(0.3)  # a model runtime computing with the GIL released
            return [ItemResult([]) for _ in inputs]

        @classmethod
        def output_specs(cls, task_kind, downstream=()):
            return []

    async def go() -> int:
        ticks = 0

        async def beat() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.02)
        b = Slow("t", "classifier")
        task = asyncio.get_running_loop().create_task(beat())
        try:
            assert len(await b.execute_async([1, 2], [b"", b""])) == 2
        finally:
            task.cancel()
            b.close()
        return ticks
    assert asyncio.run(go()) >= 5


def test_batch_timeout_allows_ten_times_the_slowest_profiled_batch():
    from jigsaw.runtime.supervisor import batch_timeout_ns
    from jigsaw.runtime.topology import ProcessSpec
    fields = {f: None for f in ProcessSpec.__dataclass_fields__}
    fields.update(latency_ms_by_batch={1: 50.0, 8: 200.0}, time_scale=2.0)
    spec = ProcessSpec(**fields)
    assert batch_timeout_ns(spec, 3.0) == int((3.0 + 10 * 0.4) * 1e9)


def test_raw_tensor_encoding_matches_the_general_path_and_checks_lengths():
    # Tensors of raw bytes (what backends emit) are encoded from cached heads; the bytes must be
    # those of the general path (tuples take it), and a wrong length still fails on every call
    import struct

    from jigsaw.tensors import Tensor, decode_tensors, encode_tensors
    cases = [[Tensor("value", "FP32", (1,), struct.pack("<f", 0.5))],
             [Tensor("label", "INT32", (1,), struct.pack("<i", 5)), Tensor("x" * 13, "UINT8", (3,), b"abc")],
             [Tensor("tokens", "INT32", (1, 16), bytes(range(64))), Tensor("é", "INT64", (1,), bytes(8))], []]
    for tensors in cases:
        for _ in range(2):  # the second encodes from the cache
            fast = encode_tensors(tensors)
            assert fast == encode_tensors([(t.name, t.datatype, t.shape, t.data) for t in tensors])
        assert [(d.name, d.shape, bytes(d.data)) for d in decode_tensors(fast)] == [
            (t.name, t.shape, t.data) for t in tensors]
    for _ in range(2):
        with pytest.raises(ValueError, match="expected 8"):
            encode_tensors([Tensor("v", "FP32", (2,), bytes(4))])


def test_a_stepped_coroutine_finishes_in_the_task_that_resumes_it():
    """The worker steps its backend's coroutine in the doorbell callback (``_Resume``): one that
    waits is finished by a task with its value, its exception or its cancellation."""
    from jigsaw.runtime.worker import _Resume

    async def waits(n: int) -> int:
        await asyncio.sleep(0)  # a bare yield
        await asyncio.sleep(0.001)  # a future
        if n < 0:
            raise ValueError("bad batch")
        return n * 2

    async def main() -> None:
        coro = waits(21)
        first = coro.send(None)
        assert await asyncio.get_running_loop().create_task(_wrap(_Resume(coro, first))) == 42
        coro = waits(-1)
        first = coro.send(None)
        with pytest.raises(ValueError, match="bad batch"):
            await asyncio.get_running_loop().create_task(_wrap(_Resume(coro, first)))
        coro = waits(1)
        task = asyncio.get_running_loop().create_task(_wrap(_Resume(coro, coro.send(None))))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert coro.cr_frame is None  # the inner coroutine was closed by the cancellation

    async def _wrap(awaitable: _Resume) -> int:
        return await awaitable

    asyncio.run(main())


def test_dispatched_inputs_encode_to_the_same_bytes_on_the_raw_path():
    """The dispatcher hands parsed arrays of their wire type to the codec as raw bytes (cached
    heads); the payload must be byte for byte what the general path makes, for every layout."""
    import numpy as np

    from jigsaw.runtime.dispatch import _raw
    from jigsaw.tensors import encode_tensors

    cases = [("image", "UINT8", (16,), np.arange(16, dtype=np.uint8)),
             ("x", "FP32", (2, 3), np.arange(6, dtype="<f4").reshape(2, 3)),
             ("b", "BOOL", (2,), np.array([True, False])), ("s", "BYTES", (2,), ["a", "bc"]),
             ("h", "FP16", (3,), np.arange(3, dtype="<f2")),
             ("t", "INT64", (2, 2), np.arange(4, dtype="<i8").reshape(2, 2).T),  # not contiguous
             ("e", "INT32", (0,), np.zeros(0, dtype="<i4")), ("f", "BF16", (1,), np.zeros(1, dtype="<u2"))]
    for case in cases:
        assert bytes(encode_tensors([_raw(case)])) == bytes(encode_tensors([case])), case[0]
    assert bytes(encode_tensors([_raw(c) for c in cases])) == bytes(encode_tensors(cases))


def test_the_generic_items_child_is_its_outputs_encoded():
    """The generic task's pre-encoded child body is the codec's own encoding of its outputs, and
    its value the item's first draw."""
    import struct

    from jigsaw.backends.emulated import _ItemRandom
    from jigsaw.tensors import decode_tensors, encode_tensors

    b = EmulatedBackend("a", "generic", [Downstream("b", 1.0), Downstream("c", 1.0)], seed=7)
    for rid in (0, 1, 12345, 2**40 + 3):
        r = b._item(rid, b"")
        assert bytes(r.children["b"][0]) == bytes(encode_tensors(r.outputs)) == bytes(r.children["c"][0])
        (value,) = struct.unpack("<f", bytes(decode_tensors(r.children["b"][0])[0].data))
        assert value == pytest.approx(_ItemRandom(rid ^ 7).random(), rel=1e-6)
    assert EmulatedBackend("z", "generic")._item(5, b"").children == {}


def test_sink_arrays_read_as_the_general_decoder_reads_them():
    """The frontend's compiled read of a sink's outputs (``_core.decode_arrays``) gives the arrays
    ``decode_tensors`` gives, refuses what it refuses, and leaves BYTES payloads to it."""
    import numpy as np

    from jigsaw import tensors as tz
    from jigsaw.runtime import dispatch
    from jigsaw.runtime.rings import load_core
    from jigsaw.tensors import Tensor, decode_tensors, encode_tensors

    assert all(dispatch._WIRE_DTYPES[code] is tz.DATATYPES[name] for name, code in tz._CODE_OF.items())
    rng = np.random.default_rng(7)
    payloads = []
    for n in range(40):
        ts = []
        for i in range(int(rng.integers(0, 4))):
            dt = str(rng.choice([d for d in tz.DATATYPES if d != "BYTES"]))
            shape = tuple(int(x) for x in rng.integers(0, 4, size=int(rng.integers(0, 4))))
            count = math.prod(shape)
            raw = rng.integers(0, 256, size=count * tz.DATATYPES[dt].itemsize, dtype=np.uint8).tobytes()
            ts.append(Tensor(f"t{n}.{i}", dt, shape, raw))
        payloads.append(bytes(encode_tensors(ts)))
    core = load_core()
    for p in payloads:
        want = [t.data for t in decode_tensors(p)]
        reads = [dispatch.sink_arrays(p)] + ([core.decode_arrays(p, dispatch._WIRE_DTYPES)] if core else [])
        for got in reads:
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes()
    words = bytes(encode_tensors([Tensor("s", "BYTES", (2,), np.array([b"ab", b""], dtype=object))]))
    assert list(dispatch.sink_arrays(words)[0]) == [b"ab", b""]
    if core is None:
        return
    assert core.decode_arrays(words, dispatch._WIRE_DTYPES) is None
    good = payloads[next(i for i, p in enumerate(payloads) if len(p) > 8)]
    for bad in (good[:-1], good + bytes(8), b"XXXX" + good[4:], good[:5], good[:8] + b"\xff" * 16):
        with pytest.raises(ValueError):
            decode_tensors(bad)
        with pytest.raises(ValueError):
            core.decode_arrays(bad, dispatch._WIRE_DTYPES)


def test_admission_per_generation_keeps_a_previous_generations_backlog_off_the_new_plans_limit():
    """After a switch, the requests still in flight on the previous generation (a spike's backlog
    that ends by its deadline there) do not shed new requests at the current generation's door;
    ``max_queue`` still bounds all of them, and a request sent again on another generation moves."""
    from jigsaw.runtime.admission import Admission

    door = Admission(max_queue=140)
    door.refresh(_one_task_routes(generation=2), [])
    assert door.limit("x") == 64
    for _ in range(70):
        door.admit("x", 1)  # the previous generation's backlog
    assert door.full("x")  # counted the old way: every request of the app
    assert not door.full("x", 2)  # the current generation has none yet
    for _ in range(63):
        door.admit("x", 2)
    assert not door.full("x", 2)
    door.admit("x", 2)
    assert door.full("x", 2)  # its own limit reached
    door.release("x", 2)
    door.moved("x", 1, 2)  # sent again on the current generation: counts there now
    assert door.full("x", 2) and door.by_generation["x"] == {1: 69, 2: 64}
    for _ in range(64):
        door.release("x", 2)
    assert not door.full("x", 2) and door.by_generation["x"] == {1: 69}
    for _ in range(63):
        door.admit("x", 2)
    assert not door.full("x", 2)
    for _ in range(8):
        door.admit("x", 1)
    assert door.inflight["x"] == 140 and door.full("x", 2)  # max_queue bounds them all
    for _ in range(77):
        door.release("x", 1)
    assert door.by_generation["x"] == {2: 63} and not door.full("x", 2)
