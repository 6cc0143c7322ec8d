"""Mapping layout placements to MIG device UUIDs, against a fake NVML with the real call shapes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from jigsaw.plan import GpuLayout, Layout, PlacedInstance
from jigsaw.runtime.gpus import GpuMappingError, mig_devices, missing_devices, visible_device


class FakeNvml:
    class NVMLError(Exception):
        pass

    def __init__(self, gpus: dict[int, dict[int, int]]) -> None:
        self.gpus = gpus  # gpu -> {mig index: placement start}
        self.calls: list[str] = []

    def nvmlInit(self) -> None:
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, g: int) -> int:
        return g

    def nvmlDeviceGetMaxMigDeviceCount(self, gpu: int) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, gpu: int, i: int) -> tuple[int, int]:
        if i not in self.gpus[gpu]:
            raise self.NVMLError("not found")
        return (gpu, i)

    def nvmlDeviceGetGpuInstanceId(self, mig: tuple[int, int]) -> int:
        return 10 + mig[1]

    def nvmlDeviceGetGpuInstanceById(self, gpu: int, gi_id: int) -> tuple[int, int]:
        return (gpu, gi_id - 10)

    def nvmlGpuInstanceGetInfo(self, gi: tuple[int, int]) -> SimpleNamespace:
        gpu, i = gi
        return SimpleNamespace(placement=SimpleNamespace(start=self.gpus[gpu][i], size=1))

    def nvmlDeviceGetUUID(self, mig: tuple[int, int]) -> bytes:
        return f"MIG-{mig[0]}-{self.gpus[mig[0]][mig[1]]}".encode()


def test_layout_instances_map_to_their_mig_devices() -> None:
    nvml = FakeNvml({0: {0: 0, 1: 4}, 1: {0: 6}})
    devices = mig_devices(nvml)
    assert devices == {(0, 0): "MIG-0-0", (0, 4): "MIG-0-4", (1, 6): "MIG-1-6"}
    assert nvml.calls == ["init", "shutdown"]
    layout = Layout("H100-80GB", (
        GpuLayout(0, (PlacedInstance("3g.40gb", 0, "detect", "yolov5x", 0, 2, 8),
                      PlacedInstance("3g.40gb", 4, "detect", "yolov5x", 1, 2, 8))),
        GpuLayout(1, (PlacedInstance("1g.10gb", 6, "car", "efficientnet-b0", 0, 1, 64),)),
    ))
    # Two MPS processes per instance: processes 0,1 on the first instance, 2,3 on the second.
    assert [visible_device(layout, devices, "detect", "yolov5x", "3g.40gb", 2, 8, p) for p in range(4)] \
        == ["MIG-0-0", "MIG-0-0", "MIG-0-4", "MIG-0-4"]
    assert visible_device(layout, devices, "car", "efficientnet-b0", "1g.10gb", 1, 64, 0) == "MIG-1-6"
    assert missing_devices(layout, devices) == []


def test_unpartitioned_gpu_is_a_clear_error() -> None:
    layout = Layout("H100-80GB", (GpuLayout(0, (PlacedInstance("7g.80gb", 0, "t", "v", 0, 1, 4),)),))
    devices = mig_devices(FakeNvml({0: {}}))
    assert missing_devices(layout, devices) == [(0, 0)]
    with pytest.raises(GpuMappingError, match="no MIG device at GPU 0 start 0"):
        visible_device(layout, devices, "t", "v", "7g.80gb", 1, 4, 0)
    with pytest.raises(GpuMappingError, match="not in the layout"):
        visible_device(layout, devices, "t", "v", "7g.80gb", 1, 4, 3)


def test_the_mps_shares_of_a_whole_gpu_run_on_that_gpu() -> None:
    """Processes of different tasks in the MPS shares of one GPU all see that GPU's UUID."""
    devices = {(0, 0): "GPU-a", (1, 0): "GPU-b"}
    layout = Layout("L4", (
        GpuLayout(0, (PlacedInstance("gpu-1of4", 0, "vad", "effnet", 0, 1, 8),
                      PlacedInstance("gpu-1of4", 2, "asr", "git", 0, 1, 16),
                      PlacedInstance("gpu-1of4", 6, "asr", "git", 1, 1, 16))),
        GpuLayout(1, (PlacedInstance("gpu", 0, "intent", "resnet", 0, 2, 4),)),
    ))
    assert missing_devices(layout, devices) == []
    assert visible_device(layout, devices, "vad", "effnet", "gpu-1of4", 1, 8, 0) == "GPU-a"
    assert [visible_device(layout, devices, "asr", "git", "gpu-1of4", 1, 16, p) for p in (0, 1)] \
        == ["GPU-a", "GPU-a"]
    assert visible_device(layout, devices, "intent", "resnet", "gpu", 2, 4, 1) == "GPU-b"
    assert missing_devices(layout, {(0, 0): "GPU-a"}) == [(1, 0)]


def test_the_shares_of_a_mig_instance_run_on_that_instance() -> None:
    """Processes of different tasks sharing one MIG instance (``1g.10gb-1of2``, seats 0 and 1 at
    its start) all see that instance's UUID; a share's kind numbered across instances."""
    devices = {(0, 0): "MIG-a", (0, 1): "MIG-b"}
    layout = Layout("H100-80GB", (GpuLayout(0, (
        PlacedInstance("1g.10gb-1of2", 0, "vad", "effnet", 0, 1, 8, seat=0),
        PlacedInstance("1g.10gb-1of2", 0, "asr", "git", 0, 1, 16, seat=1),
        PlacedInstance("1g.10gb-1of2", 1, "asr", "git", 1, 1, 16, seat=0))),))
    assert missing_devices(layout, devices) == []
    assert visible_device(layout, devices, "vad", "effnet", "1g.10gb-1of2", 1, 8, 0) == "MIG-a"
    assert [visible_device(layout, devices, "asr", "git", "1g.10gb-1of2", 1, 16, p) for p in (0, 1)] \
        == ["MIG-a", "MIG-b"]
    assert missing_devices(layout, {(0, 0): "MIG-a"}) == [(0, 1)]
