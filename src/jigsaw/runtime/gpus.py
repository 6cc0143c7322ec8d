"""Which MIG device a worker runs on: (GPU index, placement start) -> ``MIG-<uuid>``.

A plan's layout says where each MIG instance lies (GPU, profile, start slot); CUDA names MIG
devices by UUID. NVML links the two: every MIG device handle has a GPU instance whose placement
start is the layout's start. Workers get ``CUDA_VISIBLE_DEVICES=MIG-<uuid>``; the k MPS
processes of one segment share the instance, as do the k processes of different tasks that
share it (``jigsaw.shares``: each placed at the instance's start with its seat). NVML comes
from ``nvidia-ml-py`` (the ``gpu`` extra), imported only on GPU nodes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jigsaw.errors import JigsawError
from jigsaw.gpu.groups import whole_gpus
from jigsaw.mig import gpu_share_level
from jigsaw.node import Node
from jigsaw.plan import Layout


class GpuMappingError(JigsawError):
    """The GPUs' MIG partition does not match the layout the workers are placed by."""


def mig_devices(nvml: Any = None) -> dict[tuple[int, int], str]:
    """Every MIG device of this host: (GPU index, placement start) -> ``MIG-...`` UUID."""
    if nvml is None:
        import pynvml as nvml
    nvml.nvmlInit()
    try:
        found: dict[tuple[int, int], str] = {}
        for g in range(nvml.nvmlDeviceGetCount()):
            gpu = nvml.nvmlDeviceGetHandleByIndex(g)
            for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(gpu)):
                try:
                    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, i)
                except nvml.NVMLError:
                    continue  # an empty index
                gi = nvml.nvmlDeviceGetGpuInstanceById(gpu, nvml.nvmlDeviceGetGpuInstanceId(mig))
                start = int(nvml.nvmlGpuInstanceGetInfo(gi).placement.start)
                uuid = nvml.nvmlDeviceGetUUID(mig)
                found[(g, start)] = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        return found
    finally:
        nvml.nvmlShutdown()


def gpu_devices(nvml: Any = None) -> dict[tuple[int, int], str]:
    """Every GPU of this host used whole (no MIG): (GPU index, 0) -> ``GPU-...`` UUID, keyed as
    ``mig_devices`` so a whole GPU's one instance (start 0) maps the same way."""
    if nvml is None:
        import pynvml as nvml
    nvml.nvmlInit()
    try:
        found: dict[tuple[int, int], str] = {}
        for g in range(nvml.nvmlDeviceGetCount()):
            uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(g))
            found[(g, 0)] = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        return found
    finally:
        nvml.nvmlShutdown()


def placements(layout: Layout) -> dict[tuple[str, str, str, int, int, int], tuple[int, int]]:
    """(task, variant, profile, mps, max_batch, index) of each placed instance -> (GPU, start)."""
    return {(p.task, p.variant, p.profile, p.mps, p.max_batch, p.index): (g.gpu, p.start)
            for g in layout.gpus for p in g.instances}


Kind = tuple[str, str, str, int, int]  # (task, variant, profile, mps, max_batch) of a plan instance


def numbered(specs: Iterable[Any]) -> list[tuple[Kind, int]]:
    """Each process's instance kind and its number among that kind's processes, in order.

    Process n of a kind belongs to the kind's instance ``n // mps`` (``placements``' index).
    """
    counters: dict[Kind, int] = {}
    out = []
    for spec in specs:
        kind = (spec.task, spec.variant, spec.mig_profile, spec.mps, spec.max_batch)
        out.append((kind, counters.get(kind, 0)))
        counters[kind] = out[-1][1] + 1
    return out


def visible_device(layout: Layout, devices: dict[tuple[int, int], str], task: str, variant: str,
                   profile: str, mps: int, max_batch: int, process: int) -> str:
    """``CUDA_VISIBLE_DEVICES`` for the ``process``-th process of a plan instance kind.

    The processes of one kind are numbered instance by instance, ``mps`` per MIG instance.
    """
    key = (task, variant, profile, mps, max_batch, process // mps)
    where = placements(layout).get(key)
    if where is None:
        raise GpuMappingError(f"{task}/{variant} instance {process // mps} on {profile} is not in the layout")
    uuid = devices.get(device_slot(profile, where))
    if uuid is None:
        raise GpuMappingError(f"no MIG device at GPU {where[0]} start {where[1]} (is the GPU partitioned "
                              "as the layout says? apply 'jigsaw pack --format commands' first)")
    return uuid


def missing_devices(layout: Layout, devices: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Placements of the layout that have no MIG device on this host."""
    have = set(devices)
    return sorted({w for g in layout.gpus for p in g.instances
                   if (w := device_slot(p.profile, (g.gpu, p.start))) not in have})


def device_slot(profile: str, where: tuple[int, int]) -> tuple[int, int]:
    """The (GPU, start) of the device an instance at ``where`` runs on: an MPS share of a whole GPU
    (``jigsaw.shares``) runs on the GPU, keyed (GPU, 0); a share of a MIG instance on that instance
    (at its start); any other instance is its own device."""
    return (where[0], 0) if gpu_share_level(profile) else where


def host_devices(node: Node, nvml: Any = None) -> dict[tuple[int, int], str]:
    """(GPU, start) -> UUID of every device the node's layout may name: the MIG devices of its MIG
    GPUs, ``GPU-...`` (start 0) of those it uses whole; on a node of several GPU groups both."""
    if not node.is_mixed:
        return mig_devices(nvml) if node.gpu.mig else gpu_devices(nvml)
    whole = set(whole_gpus(node))
    of_host = {node.host_index(i): i for i in range(node.num_gpus)}  # the host's index -> the node's
    out = {(of_host[h], s): v for (h, s), v in gpu_devices(nvml).items() if of_host.get(h) in whole}
    out.update({(of_host[h], s): v for (h, s), v in mig_devices(nvml).items()
                if h in of_host and of_host[h] not in whole})
    return out
