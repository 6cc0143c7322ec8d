"""A device-pipeline backend keeps two batches in flight (``Backend.submit`` / ``collect``, what
the worker's ``runtime/in_flight.py`` drives); every other backend keeps one. On the CPU device the
same code runs: submit computes the batch, collect hands it back."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not installed (pip install 'jigsaw[models]')")

from jigsaw.backends.base import Downstream  # noqa: E402
from jigsaw.backends.emulated import EmulatedBackend  # noqa: E402
from jigsaw.backends.gpu_pipeline import GpuPipeline  # noqa: E402
from jigsaw.backends.pipeline import Pipeline  # noqa: E402
from jigsaw.backends.torch_backend import TorchBackend  # noqa: E402
from jigsaw.models.images import street_scene  # noqa: E402
from jigsaw.tensors import Tensor, encode_tensors  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from test_worker_turn import make_worker  # noqa: E402, F401 (the fixture: a worker on real rings)


def _payload(img: np.ndarray) -> bytes:
    return bytes(encode_tensors([Tensor("image", "UINT8", img.shape, img)]))


def test_the_torch_backend_submits_two_batches_before_collecting_either() -> None:
    be = TorchBackend("car", "classifier", [Downstream("next", 1.0)], threads=1)
    be.load("resnet18", 2)
    assert be.device_pipeline is not None and be.max_in_flight == 2
    first = [_payload(street_scene(64, 64, seed=1)), _payload(street_scene(40, 90, seed=2))]
    second = [_payload(street_scene(70, 50, seed=3))]

    async def run() -> tuple[list, list]:
        a = await be.submit([1, 2], first)
        b = await be.submit([3], second)  # the other staging slot, while the first is in flight
        return await be.collect(a), await be.collect(b)

    try:
        got_a, got_b = asyncio.run(run())
        for got, want in ((got_a, be.execute([1, 2], first)), (got_b, be.execute([3], second))):
            assert [r.error for r in got] == [""] * len(want)
            assert [{t.name: t.data.tolist() for t in r.outputs} for r in got] == \
                   [{t.name: t.data.tolist() for t in r.outputs} for r in want]
    finally:
        be.close()


def test_a_backend_without_a_device_pipeline_keeps_one_batch() -> None:
    emulated = EmulatedBackend("t", "generic", latency_ms_by_batch={1: 0.01}, time_scale=1.0)
    emulated.load("v", 1)
    assert emulated.max_in_flight == 1

    async def run() -> list:
        return await emulated.collect(await emulated.submit([7], [b""]))  # the whole batch in submit

    assert len(asyncio.run(run())) == 1
    text = TorchBackend("cap", "captioner", threads=1)
    assert text.max_in_flight == 1  # (set by ``load`` only where a device pipeline runs)


def test_a_batch_collected_out_of_turn_frees_its_slot_for_the_next() -> None:
    """Batch b's collect came back (or failed) while batch a is still in flight: the next submit
    takes b's slot (the worker runs a failed batch's items alone while the next is in flight)."""
    pipe = GpuPipeline(Pipeline("resnet18", "classifier"), _cpu_engine(), 2)
    a = pipe.submit([_payload(street_scene(32, 32, seed=1))])
    b = pipe.submit([_payload(street_scene(32, 32, seed=2))])
    assert len(pipe.collect(b)) == 1
    assert len(pipe([_payload(street_scene(32, 32, seed=3))])) == 1  # b's slot, a still in flight
    assert a.slot.busy and len(pipe.collect(a)) == 1 and not any(s.busy for s in pipe.slots)


def _cpu_engine():  # type: ignore[no-untyped-def]
    from jigsaw.backends.torch_backend import TorchEngine
    from jigsaw.models.zoo import build
    return TorchEngine(build("resnet18"), torch.device("cpu"), torch.float32, 64)


def test_a_worker_serves_a_torch_classifier_two_batches_in_flight(make_worker: Any) -> None:  # noqa: F811
    """The worker's two-in-flight path with the real device pipeline on the CPU: eight images in
    batches of four, batch 2 submitted before batch 1 came back, each item's child (the
    classifier's outputs, passed on) as the backend's own ``execute`` makes it, in order."""
    import time

    from jigsaw.runtime.records import HOP_SENT, TOTAL_CREDIT
    from jigsaw.runtime.rings import RecordHeader, Status
    from jigsaw.runtime.stats import READY, STATE
    t = make_worker()
    t.stats.set(1, STATE, READY)
    w = t.worker
    w.backend.close()
    be = w.backend = TorchBackend("b", "classifier", [Downstream("c", 1.0)], threads=1)
    be.load("resnet18", 4)
    w._init_in_flight()
    events: list[tuple[str, int, list[int]]] = []  # (call, batches in flight, the batch record)
    submit, collect = be.submit, be.collect

    async def logged_submit(ids: Any, inputs: Any) -> Any:
        events.append(("submit", len(w._flights), sorted(t.stats.batch_record(0))))
        return await submit(ids, inputs)

    async def logged_collect(handle: Any) -> Any:
        events.append(("collect", len(w._flights), sorted(t.stats.batch_record(0))))
        return await collect(handle)

    be.submit, be.collect = logged_submit, logged_collect  # type: ignore[method-assign]
    payloads = [_payload(street_scene(24 + 4 * i, 32, seed=i)) for i in range(8)]

    async def run() -> None:
        w._loop = asyncio.get_running_loop()
        w._done = w._loop.create_future()
        for i, body in enumerate(payloads):
            now = time.monotonic_ns()
            h = RecordHeader(request_id=i + 1, deadline_ns=now + 60 * 10**9, created_ns=now)
            h.stamp(HOP_SENT, now)
            assert t.producer.push_framed(h, TOTAL_CREDIT, body)
        w._turn()
        for _ in range(3000):
            await asyncio.sleep(0.005)
            if not w._flights and len(events) >= 4 and not len(t.producer):
                break

    try:
        asyncio.run(run())
        # batch 2 was taken and handed over while batch 1 was in flight: batch 1's collect found
        # both in flight and in the record (on the CPU the helper thread then runs batch 1's
        # collect first; on CUDA it waits on the device off that thread while batch 2 uploads)
        assert events[0] == ("submit", 1, [1, 2, 3, 4])
        assert sorted(events[1:3]) == [("collect", 2, list(range(1, 9))), ("submit", 2, list(range(1, 9)))]
        assert events[3] == ("collect", 1, [5, 6, 7, 8])
        records = t.done.pop_completions(16)
        assert [(r[0], r[2]) for r in records] == [(i, int(Status.OK)) for i in range(1, 9)]
        children = t.out.pop_many_framed(16)
        want = be.execute(list(range(4)), payloads[:4]) + be.execute(list(range(4)), payloads[4:])
        assert [h.request_id for h, _, _ in children] == list(range(1, 9))
        assert [bytes(body) for _, _, body in children] == [bytes(r.children["c"][0]) for r in want]
    finally:
        be.close()
