"""The daemon's MIG partition against the emulated NVML: only changed GPUs get NVML calls, slots
still held are deferred until their instances go, and a failed bring-up leaves nothing behind."""

from __future__ import annotations

import pytest

from jigsaw.gpu.emulated_nvml import NVML_ERROR_INSUFFICIENT_RESOURCES, EmulatedNvml
from jigsaw.gpu.layout import NodeInstance, NodeLayout
from jigsaw.gpu.nvml import MigApplier, MigError
from jigsaw.gpu.partition import MigPartition
from jigsaw.mig import GPU_MODELS

H100 = GPU_MODELS["H100-80GB"]


def inst(gpu: int, profile: str, start: int, task: str = "t") -> NodeInstance:
    return NodeInstance(gpu, profile, start, "app", task, "v")


def layout(*instances: NodeInstance) -> NodeLayout:
    return NodeLayout(H100.name, 3, instances)


@pytest.fixture
def part() -> tuple[MigPartition, EmulatedNvml]:
    nvml = EmulatedNvml(H100, 3)
    p = MigPartition(H100, 3, MigApplier(H100, nvml))
    assert p.adopt().instances == ()
    first = layout(inst(0, "3g.40gb", 0), inst(1, "3g.40gb", 4), inst(2, "7g.80gb", 0))
    assert p.bring_up(first) == ()
    yield p, nvml
    p.close()


def test_only_changed_gpus_get_nvml_calls(part) -> None:
    p, nvml = part
    nvml.calls.clear()
    # GPU 1 gets a second instance; GPUs 0 and 2 keep theirs
    desired = layout(inst(0, "3g.40gb", 0), inst(1, "3g.40gb", 4), inst(1, "3g.40gb", 0, task="u"),
                     inst(2, "7g.80gb", 0))
    assert p.bring_up(desired, "test") == ()
    p.tear_down(desired, "test")
    assert {g for _, g, _ in nvml.calls if g is not None} == {1}
    assert [(f, g) for f, g, _ in nvml.mutations()] == [
        ("nvmlDeviceCreateGpuInstanceWithPlacement", 1), ("nvmlGpuInstanceCreateComputeInstance", 1)]
    assert p.with_uuids(desired).instances[2].uuid.startswith("MIG-")


def test_held_slots_are_deferred_until_their_instance_goes(part) -> None:
    p, nvml = part
    # GPU 2: the 7g instance becomes two 3g ones, which overlap it: deferred, made at tear-down
    desired = layout(inst(0, "3g.40gb", 0), inst(1, "3g.40gb", 4), inst(2, "3g.40gb", 0),
                     inst(2, "3g.40gb", 4))
    calls = len(nvml.calls)
    held = p.held(desired)  # read first, as a transition's snapshot does: no NVML call
    assert len(nvml.calls) == calls
    deferred = p.bring_up(desired)
    assert sorted(deferred) == sorted(held) == [(2, 0, "3g.40gb"), (2, 4, "3g.40gb")]
    assert nvml.instances(2) == [("7g.80gb", 0, 1)]
    p.tear_down(desired)
    assert nvml.instances(2) == [("3g.40gb", 0, 1), ("3g.40gb", 4, 1)]
    assert sorted(p.existing) == sorted(i.slot for i in desired.instances)


def test_failed_bring_up_leaves_nothing_half_made(part) -> None:
    p, nvml = part
    before = [nvml.instances(g) for g in range(3)]
    nvml.inject("nvmlGpuInstanceCreateComputeInstance", NVML_ERROR_INSUFFICIENT_RESOURCES, skip=1)
    desired = layout(inst(0, "3g.40gb", 0), inst(0, "3g.40gb", 4), inst(1, "3g.40gb", 4),
                     inst(1, "3g.40gb", 0), inst(2, "7g.80gb", 0))
    with pytest.raises(MigError, match="nvmlGpuInstanceCreateComputeInstance"):
        p.bring_up(desired, "test")
    assert [nvml.instances(g) for g in range(3)] == before
    assert sorted(p.existing) == [(0, 0, "3g.40gb"), (1, 4, "3g.40gb"), (2, 0, "7g.80gb")]
    assert p.stats.failures_total and p.events[-1]["ok"] is False
    assert "jigsaw_mig_failures_total{step=" in p.stats.prometheus()
