"""The emulated backend: executes a batch for the profile's p95 latency at that batch size.

It runs a 4x H100 node faithfully in time on a machine without GPUs. Outputs have the names,
datatypes and ranks of the real backends' outputs (``pipeline.output_specs`` for a zoo task, the
ONNX graph's outputs for a repository model's: ``outputs``) but made-up values (a free axis is
short: a detector's boxes are its children's, the emulated speech is ``EMULATED_AUDIO_SAMPLES``
long), and every response built from them is labelled emulated. The fan-out is the real
backends': a detector, and any task's edge with a transform, draws its number of children per
downstream task from a Poisson law with the edge's multiplicative factor as mean (or rounds it,
``draw="round"``), seeded by request id, so a given request always fans out the same way; an
edge without a transform from another task passes each item on as one child, as the real
pipelines do. A whole-number factor is taken as exact (the AR assistant captions the one object
in view: factor 1 means one child, not Poisson(1)).
"""

from __future__ import annotations

import asyncio
import math
import random
import struct
import time
from collections.abc import Coroutine, Sequence
from typing import Any

from jigsaw.backends.base import Backend, Downstream, ItemResult, OutputSpec
from jigsaw.tensors import DATATYPES, Tensor, decode_tensors, encode_tensors

CAPTION_TOKENS = 16
LOOP_TIMER_S = 0.001  # the resolution of the workers' uvloop timers
EMULATED_AUDIO_SAMPLES = 256  # the made-up waveform's length (a real one is ~20k samples a caption)


class EmulatedBackend(Backend):
    """Sleeps, per batch, a duration drawn for the smallest profiled batch >= the actual one.

    A profile row gives the p95 latency L and the segment's throughput H, so one process's mean
    batch time is m = k * b / H (below L). Always sleeping L would run the node slower than the
    planner assumed; the draw is m plus a shifted exponential tail, so its mean is m and its
    95th percentile is L. Without means it sleeps L. Everything is scaled by ``time_scale``.
    """

    kind = "emulated"

    def __init__(self, task: str, task_kind: str, downstream: Sequence[Downstream] = (), *,
                 latency_ms_by_batch: dict[int, float] | None = None, time_scale: float = 1.0,
                 seed: int = 0, draw: str = "poisson",
                 mean_ms_by_batch: dict[int, float] | None = None,
                 outputs: Sequence[OutputSpec] | None = None) -> None:
        super().__init__(task, task_kind, downstream)
        if draw not in ("poisson", "round"):
            raise ValueError(f"draw must be 'poisson' or 'round', not {draw!r}")
        if time_scale < 0:
            raise ValueError("time_scale must be >= 0")
        self._latency_ms = dict(sorted((latency_ms_by_batch or {1: 0.0}).items()))
        self._mean_ms = dict(sorted((mean_ms_by_batch or {}).items()))
        self._timing = random.Random(seed ^ 0x5EED)
        self._random = self._timing.random
        self._laws: dict[int, tuple[float, float, float]] = {}
        self.time_scale = time_scale
        self.seed = seed
        self.draw = draw
        self._generic_head = _generic_head()
        self._child_tasks = tuple(d.task for d in self.downstream)
        # a repository model's graph outputs (made-up values of their datatype, a free axis 1)
        self._graph = [_zeros(o) for o in outputs] if outputs else None
        # the edges whose fan-out is drawn (a transform's), else one child per item
        self._drawn = any(d.transform for d in self.downstream)

    def load(self, variant: str, max_batch: int) -> None:
        self.variant = variant
        self.max_batch = max_batch

    def batch_latency_ms(self, batch: int) -> float:
        """Profile p95 of the smallest profiled batch >= ``batch`` (the largest one beyond the table)."""
        for b, ms in self._latency_ms.items():
            if b >= batch:
                return ms
        return next(reversed(self._latency_ms.values()))

    def batch_duration_ms(self, batch: int) -> float:
        """One draw of a batch's duration (unscaled): mean from the throughput, p95 from the profile."""
        law = self._laws.get(batch)
        if law is None:
            law = self._laws[batch] = self._law(batch)
        p95, mean, tail = law
        if not tail:
            return p95
        # ``Random.expovariate(1.0 / tail)``'s own arithmetic (the same draw), without its call
        return mean - tail + -_log(1.0 - self._random()) / (1.0 / tail)

    def _law(self, batch: int) -> tuple[float, float, float]:
        """(p95, mean, tail) of a batch's duration (tail 0: always the p95), kept per batch size:
        the per-batch work of a worker whose tasks take ~0 ms is the data plane's own cost."""
        p95 = self.batch_latency_ms(batch)
        mean = next((ms for b, ms in self._mean_ms.items() if b >= batch), None)
        if mean is None or mean >= p95:
            return p95, p95, 0.0
        return p95, mean, (p95 - mean) / (math.log(20.0) - 1.0)  # P(X > mean - tail + tail * ln 20) = 5%

    def num_children(self, request_id: int, factor: float, edge: int) -> int:
        if self.draw == "round" or factor == int(factor):
            return math.floor(factor + 0.5)
        rng = _ItemRandom(request_id * 1_000_003 + edge * 7919 + self.seed)
        # Knuth's method, in log space so large means do not underflow.
        limit, k, acc = -factor, 0, 0.0
        while True:
            acc += math.log(1.0 - rng.random())
            if acc < limit:
                return k
            k += 1

    def execute(self, request_ids: Sequence[int], inputs: Sequence[bytes]) -> list[ItemResult]:
        delay_s = self.batch_duration_ms(len(inputs)) * self.time_scale / 1000.0
        if delay_s > 0:
            time.sleep(delay_s)
        return self._items(request_ids, inputs)

    async def execute_async(self, request_ids: Sequence[int], inputs: Sequence[bytes]) -> list[ItemResult]:
        results = self.execute_nowait(request_ids, inputs)
        return results if isinstance(results, list) else await results

    def execute_nowait(self, request_ids: Sequence[int], inputs: Sequence[bytes]
                       ) -> list[ItemResult] | Coroutine[Any, Any, list[ItemResult]]:
        """The items now when the batch's draw is below the loop's timer, else a coroutine that
        sleeps the draw first (``Backend.execute_nowait``)."""
        delay_s = self.batch_duration_ms(len(inputs)) * self.time_scale / 1000.0
        if delay_s >= LOOP_TIMER_S / 2:
            return self._after(delay_s, request_ids, inputs)
        # (uvloop rounds a timer to whole milliseconds: a shorter sleep would not wait, only
        # cost the worker one more turn of its loop before the batch's children leave)
        if self.task_kind not in _KINDS_DRAWN and self._graph is None and not self._drawn:
            return self._generic_items(request_ids)
        return [self._item(rid, payload) for rid, payload in zip(request_ids, inputs)]

    async def _after(self, delay_s: float, request_ids: Sequence[int],
                     inputs: Sequence[bytes]) -> list[ItemResult]:
        await asyncio.sleep(delay_s)
        return self._items(request_ids, inputs)

    def _items(self, request_ids: Sequence[int], inputs: Sequence[bytes]) -> list[ItemResult]:
        if self.task_kind not in _KINDS_DRAWN and self._graph is None and not self._drawn:
            return self._generic_items(request_ids)
        return [self._item(rid, payload) for rid, payload in zip(request_ids, inputs)]

    def _generic_items(self, request_ids: Sequence[int]) -> list[ItemResult]:
        """The generic task's items (the chain benches' every hop), in one loop: one made-up value
        each, its child bodies from the pre-encoded head (the value is the payload's last data)."""
        seed, head, tasks = self.seed, self._generic_head, self._child_tasks
        results = []
        for rid in request_ids:
            value = _F32.pack(_first_random(rid ^ seed))
            outputs = [_value_tensor(value)]
            if not tasks:
                results.append(ItemResult(outputs))
                continue
            body = head + value + _PAD4 if head is not None else encode_tensors(outputs)
            results.append(ItemResult(outputs, {tasks[0]: [body]} if len(tasks) == 1
                                      else {task: [body] for task in tasks}))
        return results

    def _item(self, request_id: int, payload: bytes) -> ItemResult:
        kind = self.task_kind
        rng = _ItemRandom(request_id ^ self.seed)
        if kind == "detector" and self._graph is None:
            return self._detections(request_id, rng)
        if self._graph is not None:
            outputs = list(self._graph)
        elif kind == "classifier":
            outputs = [Tensor("label", "INT32", (1,), _arr("<i", [rng.randrange(1000)])),
                       Tensor("score", "FP32", (1,), _arr("<f", [rng.random()]))]
            if payload[:_BOX_AT] == _BOX_HEAD:  # a detector's crop: its box is echoed, as the real one does
                outputs.append(Tensor("box", "FP32", (1, 4), bytes(payload[_BOX_AT:_BOX_AT + 16])))
        elif kind == "captioner":
            outputs = [Tensor("tokens", "INT32", (1, CAPTION_TOKENS),
                              _arr("<i", [rng.randrange(30522) for _ in range(CAPTION_TOKENS)]))]
        elif kind == "tts":
            outputs = [Tensor("audio", "FP32", (1, EMULATED_AUDIO_SAMPLES), _SILENCE),
                       Tensor("audio_samples", "INT64", (1,), _arr("<q", [EMULATED_AUDIO_SAMPLES]))]
        else:
            outputs = [Tensor("value", "FP32", (1,), _arr("<f", [rng.random()]))]
        children: dict[str, list[bytes]] = {}
        if self.downstream:
            # Each downstream task gets the item's outputs: one child, or as many as the edge's
            # transform is declared to make (its factor) when it has one.
            body = encode_tensors(outputs)  # (read, never written: the rings copy it in)
            for i, d in enumerate(self.downstream):
                children[d.task] = [body] * (self.num_children(request_id, d.factor, i) if d.transform else 1)
        return ItemResult(outputs, children)

    def _detections(self, request_id: int, rng: _ItemRandom) -> ItemResult:
        """A zoo detector's item: its children (a box each), and the outputs the real one gives
        (``pipeline.output_specs``), the boxes being the children's."""
        children: dict[str, list[bytes]] = {}
        boxes: list[bytes] = []
        labels: list[bytes] = []
        for i, d in enumerate(self.downstream):
            n = self.num_children(request_id, d.factor, i)
            mine = [struct.pack("<4f", *(rng.random() for _ in range(4))) for _ in range(n)]
            boxes += mine
            labels.append(_I32.pack(i) * n)  # (made up: the downstream edge's index)
            children[d.task] = [bytes(encode_tensors([("box", "FP32", (1, 4), box)])) for box in mine]
        total = len(boxes)
        outputs = [Tensor("num_boxes", "INT32", (1,), _arr("<i", [total]))]
        for d in self.downstream:
            outputs.append(Tensor(f"num_{d.task}", "INT32", (1,), _arr("<i", [len(children[d.task])])))
        outputs += [Tensor("boxes", "FP32", (total, 4), b"".join(boxes)),
                    Tensor("scores", "FP32", (total,), _HALF * total),
                    Tensor("labels", "INT32", (total,), b"".join(labels))]
        return ItemResult(outputs, children)

    @classmethod
    def output_specs(cls, task_kind: str, downstream: Sequence[str] = ()) -> list[OutputSpec]:
        """The real backends' outputs of a task of ``task_kind`` (``pipeline.output_specs``)."""
        from jigsaw.backends.pipeline import output_specs
        return output_specs(task_kind, downstream)


_MASK64 = (1 << 64) - 1
_log = math.log
_KINDS_DRAWN = frozenset(("detector", "classifier", "captioner", "tts"))
_F32 = struct.Struct("<f")
_PAD4 = bytes(4)


_GOLDEN64 = 0x9E3779B97F4A7C15  # splitmix64's state increment


def _mix64(s: int) -> int:
    """splitmix64's output function of one state."""
    z = ((s ^ (s >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _first_random(seed: int) -> float:
    """``_ItemRandom(seed).random()``, without the object nor ``_mix64``'s call (the generic
    task's one draw, on every item of the chain benches' every hop)."""
    z = (seed + _GOLDEN64) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return ((z ^ (z >> 31)) >> 11) * _TO_UNIT


_TO_UNIT = 1.0 / (1 << 53)


_new_object = object.__new__
_set_name, _set_datatype = Tensor.name.__set__, Tensor.datatype.__set__  # type: ignore[attr-defined]
_set_shape, _set_data = Tensor.shape.__set__, Tensor.data.__set__  # type: ignore[attr-defined]


def _value_tensor(value: bytes) -> Tensor:
    """``Tensor("value", "FP32", (1,), value)``, its slots set directly: a frozen dataclass's
    ``__init__`` sets each field through ``object.__setattr__``, 1.0 us a tensor against 0.3 us,
    on every item of a generic task (the chain benches' every hop)."""
    t = _new_object(Tensor)
    _set_name(t, "value")
    _set_datatype(t, "FP32")
    _set_shape(t, _SHAPE_1)
    _set_data(t, value)
    return t


_SHAPE_1 = (1,)


def _zeros(spec: OutputSpec) -> Tensor:
    """A tensor of ``spec`` (a free axis 1) of zeros: a graph output's made-up value."""
    shape = tuple(d if d >= 0 else 1 for d in spec.shape)
    dtype = DATATYPES.get(spec.datatype)
    n = math.prod(shape)
    data: Any = bytes(n * dtype.itemsize) if dtype is not None else [b""] * n
    return Tensor(spec.name, spec.datatype, shape, data)


def _box_head() -> tuple[bytes, int]:
    """An emulated detector's child up to its box's 16 bytes, and where they start (a classifier
    fed by it echoes the box, as the real one echoes its crop's)."""
    probe = bytes(range(16))
    whole = bytes(encode_tensors([("box", "FP32", (1, 4), probe)]))
    at = whole.index(probe)
    return whole[:at], at


_BOX_HEAD, _BOX_AT = _box_head()
_SILENCE = bytes(4 * EMULATED_AUDIO_SAMPLES)
_HALF = struct.pack("<f", 0.5)  # an emulated detection's score
_I32 = struct.Struct("<i")


def _generic_head() -> bytes | None:
    """The generic task's encoded output up to its 4 data bytes (then 4 bytes of padding), checked
    by decoding it; None (encode each item) if the codec lays it out otherwise."""
    probe = b"\x01\x02\x03\x04"
    whole = bytes(encode_tensors([Tensor("value", "FP32", (1,), probe)]))
    if not whole.endswith(probe + _PAD4):
        return None
    head = whole[:-8]
    got = decode_tensors(head + probe + _PAD4)
    if len(got) != 1 or bytes(got[0].data) != probe:
        return None
    return head


class _ItemRandom:
    """The made-up values and fan-out of one item, a pure function of its seed (splitmix64).

    Seeding a Mersenne Twister per item (``random.Random(seed)``) cost more than the rest of an
    emulated item; this is a few integer operations per draw, and as reproducible.
    """

    __slots__ = ("_state",)

    def __init__(self, seed: int) -> None:
        self._state = seed & _MASK64

    def _next(self) -> int:
        self._state = s = (self._state + _GOLDEN64) & _MASK64
        return _mix64(s)

    def random(self) -> float:
        """A float in [0, 1) (53 random bits)."""
        return (self._next() >> 11) * (1.0 / (1 << 53))

    def randrange(self, n: int) -> int:
        """An int in [0, n) (modulo of 64 bits: a bias below 1e-15 for the ranges used here)."""
        return self._next() % n


def _arr(fmt: str, values: list[float] | list[int]) -> bytes:
    """Raw little-endian data (the tensor codec takes bytes, so workers need no array objects)."""
    return struct.pack(f"{fmt[0]}{len(values)}{fmt[1]}", *values)
