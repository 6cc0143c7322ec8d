"""What the frontend does with the requests of a crashed worker, and what the door refuses before
a worker sees it: a crash's suspects (the batch it ran) are answered 500 and never sent again,
the others are sent again; an empty image, or inputs that encode larger than a ring to the root
carries, never reach a worker (400, 413)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from factories import one_task_routes

from jigsaw.app import load_app
from jigsaw.errors import ConfigError
from jigsaw.runtime.admission import Admission
from jigsaw.runtime.dispatch import Dispatcher, InputTooLarge, Pending
from jigsaw.runtime.metrics import Metrics
from jigsaw.runtime.oip import BadRequest, parse_infer_request
from jigsaw.runtime.topology import Target

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "apps"


def _dispatcher(routes: object) -> tuple[Dispatcher, Metrics]:
    routing = SimpleNamespace(routes={"x": routes}, rings={}, generations={}, output_specs={"x": {}},
                              fastest_path_ns=lambda r: 0)
    metrics = Metrics("emulated")
    door = Admission(4096)
    door.refresh(routes, [])  # type: ignore[arg-type]
    return Dispatcher(routing, door, metrics, backend_name="emulated", emulated=True), metrics  # type: ignore[arg-type]


def test_a_crashs_suspects_are_answered_500_and_the_others_sent_again():
    async def settle() -> tuple[tuple[int, int], list[int], dict[int, tuple[int, dict]], Metrics]:
        routes = one_task_routes(2)
        d, metrics = _dispatcher(routes)
        d._loop = asyncio.get_running_loop()
        now = time.monotonic_ns()
        for k in range(1, 5):
            req = Pending(k, routes, 0, f"client-{k}", now, now + 10**10, d._loop.create_future(), None)
            req.generation = 2
            d.pending[k] = req
        sent: list[int] = []

        def again(req: Pending, to: object) -> None:
            sent.append(req.request_id)
        d._dispatch_again = again  # type: ignore[method-assign]
        futures = {k: r.future for k, r in d.pending.items()}
        got = d.on_worker_failed(2, "a", "v", frozenset({2, 3, 99}), "exited")
        return got, sent, {k: f.result() for k, f in futures.items() if f.done()}, metrics

    (retried, failed), sent, answered, metrics = asyncio.run(settle())
    assert (retried, failed) == (2, 2) and sent == [1, 4]
    assert sorted(answered) == [2, 3]
    for k, (status, body) in answered.items():
        assert status == 500 and body["status"] == "WORKER_CRASHED" and body["task"] == "a"
        assert "task 'a' (v) crashed" in body["error"] and body["id"] == f"client-{k}"
    assert 'reason="worker_crashed"} 2' in metrics.render()


def test_an_image_apps_input_refuses_an_empty_image_at_the_door():
    app = load_app(EXAMPLES / "traffic_cpu.toml")
    assert app.inputs[0].min_shape == (1, 1, 1)

    def body(shape: list[int]) -> bytes:
        n = shape[0] * shape[1] * shape[2]
        return json.dumps({"inputs": [{"name": "image", "datatype": "UINT8", "shape": shape,
                                       "data": [0] * n}]}).encode()

    for shape in ([0, 0, 3], [4, 0, 3], [0, 4, 3]):
        with pytest.raises(BadRequest, match=r"inputs\[0\]\.shape: input 'image' needs at least \[1, 1, 1\]"):
            parse_infer_request(body(shape), app)
    assert parse_infer_request(body([1, 1, 3]), app).inputs[0][2] == (1, 1, 3)


def test_grpc_refuses_an_empty_image_as_http_does():
    pytest.importorskip("tritonclient.grpc")
    from tritonclient.grpc import service_pb2 as pb

    from jigsaw.runtime.grpc_codec import parse_grpc_request
    app = load_app(EXAMPLES / "traffic_cpu.toml")
    req = pb.ModelInferRequest(model_name="traffic_cpu")
    t = req.inputs.add(name="image", datatype="UINT8", shape=[0, 0, 3])
    req.raw_input_contents.append(b"")
    assert t.name == "image"
    with pytest.raises(BadRequest, match=r"needs at least \[1, 1, 1\]"):
        parse_grpc_request(req, app, None)


def test_min_shape_is_declared_per_axis_and_checked(tmp_path: Path):
    base = ['name = "x"', "latency_slo_ms = 100", "[[tasks]]", 'name = "t"', 'kind = "generic"',
            'variants = [{ name = "v", accuracy = 1.0 }]', "[[inputs]]", 'name = "audio"',
            'datatype = "FP32"', "shape = [-1, 2]"]
    path = tmp_path / "app.toml"
    path.write_text("\n".join(base) + "\n")
    assert load_app(path).inputs[0].min_shape == ()  # a generic root: no minimum unless declared
    path.write_text("\n".join([*base, "min_shape = [160, 2]"]) + "\n")
    app = load_app(path)
    assert app.inputs[0].min_shape == (160, 2)
    short = json.dumps({"inputs": [{"name": "audio", "datatype": "FP32", "shape": [100, 2],
                                    "data": [0.0] * 200}]}).encode()
    with pytest.raises(BadRequest, match=r"needs at least \[160, 2\]"):
        parse_infer_request(short, app)
    for bad in ("min_shape = [1]", "min_shape = [1, 3]", "min_shape = [-1, 1]"):
        path.write_text("\n".join([*base, bad]) + "\n")
        with pytest.raises(ConfigError, match="min_shape"):
            load_app(path)


def test_inputs_larger_than_the_root_ring_carries_are_refused_before_any_push():
    async def submit() -> None:
        routes = one_task_routes(0)
        routes.roots = [{"a": [Target("ring-a", "bell-a", 0)]}]
        d, _ = _dispatcher(routes)
        d.routing.rings = {"ring-a": SimpleNamespace(max_payload_bytes=1024)}  # type: ignore[attr-defined]
        d._loop = asyncio.get_running_loop()
        with pytest.raises(InputTooLarge, match=r"over the 1016 bytes a request to model 'x' carries"):
            d.submit(routes, None, [("image", "INT64", (200,), np.arange(200, dtype=np.int64))], None)
        assert d.pending == {}

    asyncio.run(submit())


def test_which_crash_is_the_batchs():
    """A process that ended itself while a batch ran (a signal of its own, an exit status) or
    whose batch ran past its timeout: the batch's; one stopped from outside: not."""
    import signal

    from jigsaw.runtime.supervisor import the_batchs
    for rc in (-signal.SIGSEGV, -signal.SIGABRT, -signal.SIGBUS, -signal.SIGFPE, 1, 2):
        assert the_batchs(rc, "exited"), rc
    for rc in (-signal.SIGKILL, -signal.SIGTERM, -signal.SIGINT, 0, None):
        assert not the_batchs(rc, "exited"), rc
    assert the_batchs(None, "batch_hung") and not the_batchs(None, "hung")


def test_the_batch_record_holds_the_running_batchs_ids():
    from jigsaw.runtime.rings import SegmentRegistry
    from jigsaw.runtime.stats import BATCH_STARTED_NS, StatsBlock
    with SegmentRegistry(None) as reg:
        name = reg.name("stats")
        reg.add_shm(name)
        block = StatsBlock.create(name, 3, batch_ids=4)
        seen = StatsBlock.attach(name)  # another process's view (the supervisor's)
        try:
            assert (seen.num_slots, seen.batch_ids) == (3, 4)
            block.batch_started(1, 123, [7, 8, 9])
            assert seen.batch_record(1) == [7, 8, 9] and seen.get(1, BATCH_STARTED_NS) == 123
            assert seen.batch_record(0) == seen.batch_record(2) == []
            block.batch_started(2, 5, list(range(10, 20)))  # longer than the record: its first 4
            assert seen.batch_record(2) == [10, 11, 12, 13]
            block.move_batch_record(1, 0)
            assert (seen.batch_record(0), seen.batch_record(1)) == ([7, 8, 9], [])
            block.batch_done(2, 10, 10)
            assert seen.batch_record(2) == [] and seen.get(2, BATCH_STARTED_NS) == 0
        finally:
            seen.close()
            block.close()
