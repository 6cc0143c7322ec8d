"""A device-pipeline backend keeps two batches in flight (``Backend.submit`` / ``collect``, what
the worker's ``runtime/in_flight.py`` drives); every other backend keeps one. On the CPU device the
same code runs: submit computes the batch, collect hands it back."""

from __future__ import annotations

import asyncio

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
