"""A worker's backend warms every batch size its spec allows before the worker can report ready."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from jigsaw.backends.base import Backend, ItemResult, OutputSpec
from jigsaw.runtime import worker as worker_module
from jigsaw.runtime.topology import ProcessSpec


class FirstBatchSlow(Backend):
    """Its first batch of each size pays a one-time cost (a graph capture, an engine shape)."""

    kind = "first-batch-slow"
    calls: ClassVar[list[tuple[str, Any]]] = []

    def __init__(self, task: str, task_kind: str, downstream: Sequence[Any] = (), **_: Any) -> None:
        super().__init__(task, task_kind, downstream)
        self.paid: set[int] = set()

    def load(self, variant: str, max_batch: int) -> None:
        self.calls.append(("load", max_batch))

    def warm_up(self, batch_sizes: Sequence[int]) -> None:
        self.calls.append(("warm_up", list(batch_sizes)))
        for n in batch_sizes:
            self.execute(list(range(n)), [b""] * n)

    def execute(self, request_ids: Sequence[int], inputs: Sequence[bytes]) -> list[ItemResult]:
        first = len(inputs) not in self.paid
        self.paid.add(len(inputs))
        return [ItemResult([], {}, "first batch of its size" if first else "") for _ in inputs]

    @classmethod
    def output_specs(cls, task_kind: str, downstream: Sequence[str] = ()) -> list[OutputSpec]:
        return []


def test_make_backend_warms_each_batch_size_before_returning(monkeypatch: pytest.MonkeyPatch) -> None:
    kind = SimpleNamespace(runs_models=False, load_class=lambda: FirstBatchSlow)
    monkeypatch.setattr(worker_module, "backend_kind", lambda name: kind)
    FirstBatchSlow.calls.clear()
    spec = ProcessSpec(
        slot=0, name="a.t.v.1g.0", app="a", app_index=0, task="t", task_index=0, task_kind="generic",
        variant="v", mig_profile="1g.10gb", mps=1, max_batch=3, latency_ms_by_batch={1: 1.0},
        time_scale=1.0, max_wait_ns=1, staleness_ns=1, remaining_min_ns=0, exec_estimate_ns=[1] * 3,
        downstream=[], doorbell="", inputs=[], outputs=[], routes=[], completion_ring="",
        completion_doorbell="", stats="")
    backend = worker_module.make_backend(spec)
    assert FirstBatchSlow.calls == [("load", 3), ("warm_up", [1, 2, 3])]
    for n in (1, 2, 3):  # after ready no batch is a first one
        assert all(not r.error for r in backend.execute(list(range(n)), [b""] * n))
