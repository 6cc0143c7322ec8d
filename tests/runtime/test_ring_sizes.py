"""Rings carry what the app says its items are: the app's ``max_item_bytes``, or its ONNX models'
fixed output shapes, grow the rings between tasks and to the frontend past their defaults (a real
ring of the size given takes an item of exactly that size, framed as the data plane frames it)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from factories import one_task_routes

from jigsaw.app import Task, Variant
from jigsaw.runtime.records import CREDIT_BYTES
from jigsaw.runtime.rings import RecordHeader, SegmentRegistry, default_max_payload_bytes
from jigsaw.runtime.topology import (
    COMPLETION_RING_BYTES,
    TENSOR_HEAD_BYTES,
    WORK_RING_BYTES,
    declared_item_bytes,
    item_ring_bytes,
)

APP = one_task_routes().app


def test_an_app_without_large_items_keeps_the_default_sizes():
    assert declared_item_bytes(APP) == 0
    assert item_ring_bytes(APP, WORK_RING_BYTES) == WORK_RING_BYTES
    assert item_ring_bytes(APP, COMPLETION_RING_BYTES) == COMPLETION_RING_BYTES


def test_max_item_bytes_grows_the_rings_to_carry_one_such_item():
    item = 554_016  # a speech app's upstream output (150k samples), over a default ring's 524,160
    assert default_max_payload_bytes(WORK_RING_BYTES) - CREDIT_BYTES < item
    app = dataclasses.replace(APP, max_item_bytes=item)
    capacity = item_ring_bytes(app, WORK_RING_BYTES)
    assert capacity % 4096 == 0 and capacity < 2 * WORK_RING_BYTES
    with SegmentRegistry(None) as reg:
        ring = reg.create_ring("big", capacity)
        try:
            assert ring.push_framed(RecordHeader(request_id=1), 1, bytes(item))
        finally:
            ring.close()
    assert item_ring_bytes(app, COMPLETION_RING_BYTES) == COMPLETION_RING_BYTES  # 4 MB carries it already


def test_fixed_onnx_outputs_size_the_rings_without_a_setting():
    mask = SimpleNamespace(name="mask", datatype="FP32", item_shape=(21, 256, 256))
    free = SimpleNamespace(name="boxes", datatype="FP32", item_shape=(-1, 4))
    onnx = SimpleNamespace(is_onnx=True, outputs=[mask])
    app = dataclasses.replace(APP, tasks=(Task("a", "generic", (Variant("v", 1.0, "", onnx),)),))  # type: ignore[arg-type]
    assert declared_item_bytes(app) == TENSOR_HEAD_BYTES + 21 * 256 * 256 * 4
    assert default_max_payload_bytes(item_ring_bytes(app, WORK_RING_BYTES)) >= \
        declared_item_bytes(app) + CREDIT_BYTES
    onnx.outputs = [mask, free]  # a free axis: the size is unknown, the default stays
    assert declared_item_bytes(app) == 0
