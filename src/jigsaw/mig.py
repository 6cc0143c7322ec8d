"""MIG profile tables of the GPU models jigsaw can partition.

A GPU has 8 memory-slice placement slots; an instance of a profile occupies
``[start, start + size)`` for one of its allowed ``starts`` and no two instances
of one GPU may overlap. ``compute_slices`` (out of 7) is what the planner pays for.
Figures are NVIDIA's MIG user guide tables for each GPU. On a GPU node the driver is the truth:
``with_driver_profiles`` gives the table with what NVML reports for each profile (memory in MiB,
SMs, instances per GPU) where the two differ (the H200's 1g.35gb has 26 SMs, not 16; its 1g.18gb
has 16384 MiB, not 18 GB). The daemon that read them exports them (``DRIVER_TABLE_ENV``), so the
processes it starts (its planner child) look the model up with the same figures.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass

from jigsaw.errors import JigsawError

NUM_PLACEMENT_SLOTS = 8


@dataclass(frozen=True)
class MigProfile:
    name: str  # e.g. "1g.10gb"
    compute_slices: int  # out of 7: the planner's cost s_n
    memory_gb: float  # framebuffer of one instance
    size: int  # placement slots occupied (memory slices)
    starts: tuple[int, ...]  # allowed start slots
    sm_count: int  # streaming multiprocessors of one instance
    max_per_gpu: int = 7  # e.g. 1 for the "+me" (media extensions) profile
    share_of: int = 0  # k: one process's share of a device that k MPS processes share (0: a device)
    host: str = ""  # a share of a MIG instance: the instance's profile (its k shares sit in one)

    @property
    def slice_cost(self) -> float:
        """What one instance of the profile costs the planner in compute slices: a share of a MIG
        instance its k-th of the instance's (its geometry is the instance's), any other its own."""
        return self.compute_slices / self.share_of if self.host else self.compute_slices

    @property
    def slot_cost(self) -> float:
        """The placement slots one instance of the profile takes: a MIG share's a k-th of its
        instance's, any other its size."""
        return self.size / self.share_of if self.host else self.size


@dataclass(frozen=True)
class GpuModel:
    name: str  # e.g. "H100-80GB"
    memory_gb: float
    sm_count: int
    profiles: tuple[MigProfile, ...]
    total_slices: int = 7  # compute slices of the whole device (a CPU: its cores)
    kind: str = "gpu"  # "gpu" (MIG instances) or "cpu" (core shares; see ``cpu_model``)
    mig: bool = True  # False: a whole GPU, no MIG (``whole_gpu_model``)
    fp16_tflops: float = 0.0  # dense FP16 tensor peak of the whole GPU (0: not given)
    memory_tb_s: float = 0.0  # memory bandwidth of the whole GPU, TB/s (0: not given)
    # a node of several GPU groups (``jigsaw.gpu_groups.composite_model``): each group's model
    # (profiles qualified by the group) and GPU count, in GPU order; empty for one GPU model
    parts: tuple[tuple[GpuModel, int], ...] = ()

    @property
    def compute_slices(self) -> int:
        return self.total_slices

    def profile(self, name: str) -> MigProfile:
        for p in self.profiles:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def profile_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.profiles)

    @property
    def whole_gpu_profile(self) -> MigProfile:
        return max(self.devices, key=lambda p: (p.compute_slices, p.size))

    @property
    def devices(self) -> tuple[MigProfile, ...]:
        """The profiles that are devices of their own on the GPU's placement slots: all but the
        shares of MIG instances (``MigProfile.host``), which sit in an instance of their host."""
        return tuple(p for p in self.profiles if not p.host)

    def device_profile(self, name: str) -> MigProfile:
        """The profile of the device an instance of ``name`` lies in: a MIG share's host, else its own."""
        p = self.profile(name)
        return self.profile(p.host) if p.host else p


def _table(name: str, memory_gb: float, sm_count: int, mem_gb: tuple[int, int, int],
           sms: tuple[int, int, int, int, int], *, fp16_tflops: float = 0.0,
           memory_tb_s: float = 0.0) -> GpuModel:
    """The A100/H100/H200 family share one placement geometry; only sizes differ.

    ``mem_gb`` is the framebuffer of a 1-, 2- and 4-memory-slice instance.
    """
    sm1, sm2, sm3, sm4, sm7 = sms
    m1, m2, m4 = mem_gb
    m7 = int(memory_gb)
    profiles = (
        MigProfile(f"1g.{m1}gb", 1, m1, 1, (0, 1, 2, 3, 4, 5, 6), sm1),
        MigProfile(f"1g.{m1}gb+me", 1, m1, 1, (0, 1, 2, 3, 4, 5, 6), sm1, max_per_gpu=1),
        MigProfile(f"1g.{m2}gb", 1, m2, 2, (0, 2, 4, 6), sm1, max_per_gpu=4),
        MigProfile(f"2g.{m2}gb", 2, m2, 2, (0, 2, 4), sm2, max_per_gpu=3),
        MigProfile(f"3g.{m4}gb", 3, m4, 4, (0, 4), sm3, max_per_gpu=2),
        MigProfile(f"4g.{m4}gb", 4, m4, 4, (0,), sm4, max_per_gpu=1),
        MigProfile(f"7g.{m7}gb", 7, memory_gb, 8, (0,), sm7, max_per_gpu=1),
    )
    return GpuModel(name, memory_gb, sm_count, profiles, fp16_tflops=fp16_tflops,
                    memory_tb_s=memory_tb_s)


def mig_family_model(name: str, memory_gb: float, sm_count: int, mem_gb: tuple[int, int, int],
                     sms: tuple[int, int, int, int, int], *, fp16_tflops: float = 0.0,
                     memory_tb_s: float = 0.0) -> GpuModel:
    """A MIG GPU jigsaw has no table of, of the A100/H100 family's geometry (7 compute slices
    over 8 memory slices: H800, H20, GH200, B200, ...), from its figures: the framebuffer of a 1-,
    2- and 4-memory-slice instance (``mem_gb``, whole GB as in the profile names) and the SMs of a
    1g, 2g, 3g, 4g and 7g instance (``sms``). On a GPU node the driver's answers replace them
    (``with_driver_profiles``)."""
    return _table(name, memory_gb, sm_count, mem_gb, sms, fp16_tflops=fp16_tflops,
                  memory_tb_s=memory_tb_s)


GPU_MODELS: dict[str, GpuModel] = {
    g.name: g
    for g in (
        _table("H100-80GB", 80, 132, (10, 20, 40), (16, 32, 60, 64, 132)),
        _table("H200", 141, 132, (18, 35, 71), (16, 32, 60, 64, 132)),
        _table("A100-80GB", 80, 108, (10, 20, 40), (14, 28, 42, 56, 98)),
        _table("A100-40GB", 40, 108, (5, 10, 20), (14, 28, 42, 56, 98)),
    )
}


def cpu_model(cores: int, memory_gb: float = 16.0) -> GpuModel:
    """A CPU as a partitionable device: a profile ``<k>c`` is a share of k cores (k a power of two
    dividing ``cores``, at most 4), laid on the same 8 placement slots as MIG so the layout
    enumeration and the packer need no special case (a k-core share spans ``8k/cores`` slots).
    Compute slices are cores; memory is split in proportion."""
    if cores not in (1, 2, 4):
        raise ValueError("a CPU device has 1, 2 or 4 cores (the layout code allows 7 compute slices)")
    profiles = []
    k = 1
    while k <= cores:
        size = NUM_PLACEMENT_SLOTS * k // cores
        profiles.append(MigProfile(f"{k}c", k, memory_gb * k / cores, size,
                                   tuple(range(0, NUM_PLACEMENT_SLOTS, size)), 0, max_per_gpu=cores // k))
        k *= 2
    return GpuModel(f"CPU-{cores}C", memory_gb, 0, tuple(profiles), total_slices=cores, kind="cpu")


CPU_MODELS: dict[str, GpuModel] = {m.name: m for m in (cpu_model(c) for c in (1, 2, 4))}
"""CPU devices a node may name as its ``gpus.model`` (kept apart: GPU_MODELS are MIG GPUs)."""


WHOLE_GPU = "gpu"
"""The one segment profile of a GPU without MIG (or with MIG off): the whole device."""


MPS_SHARE_LEVELS = (2, 4, 8)
"""The MPS levels a whole GPU can be split into shares at: those whose shares tile the 8
placement slots."""


def share_profile_name(k: int, host: str = WHOLE_GPU) -> str:
    """The segment profile of one of k MPS processes sharing a whole GPU (``gpu-1of4``) or one MIG
    instance of profile ``host`` (``1g.10gb-1of2``)."""
    return f"{host}-1of{k}"


def _split_share(profile_name: str) -> tuple[str, int]:
    host, sep, k = profile_name.rpartition("-1of")
    return (host, int(k)) if sep and host and k.isdigit() and int(k) > 1 else ("", 0)


def share_level(profile_name: str) -> int:
    """k of a share profile's name (``gpu-1of4`` -> 4, ``1g.10gb-1of2`` -> 2); 0 for any other."""
    return _split_share(profile_name)[1]


def share_host(profile_name: str) -> str:
    """The MIG profile whose instance a share profile's processes sit in (``1g.10gb-1of2`` ->
    ``1g.10gb``); "" for a share of a whole GPU (its shares have slots of their own) or no share."""
    host = _split_share(profile_name)[0]
    return "" if host.rpartition(":")[2] == WHOLE_GPU else host


def gpu_share_level(profile_name: str) -> int:
    """k of a share of a whole GPU (``gpu-1of4`` -> 4, also qualified by its GPU group:
    ``L4:gpu-1of4``); 0 for any other profile."""
    host, k = _split_share(profile_name)
    return k if host.rpartition(":")[2] == WHOLE_GPU else 0


MIG_SHARE_LEVELS = (2, 3, 4)
"""The MPS levels a MIG instance can be shared at by processes of different (task, variant)s."""


def slice_unit(gpu: GpuModel, names: Iterable[str] | None = None) -> int:
    """The parts the planner's integer slice counts cut a compute slice into: the least common
    multiple of the k of the MIG shares among ``names`` (default: the GPU's), 1 without any, so
    that a share's k-th of a slice is a whole number of them."""
    allowed = set(gpu.profile_names if names is None else names)
    return math.lcm(1, *(p.share_of for p in gpu.profiles if p.host and p.name in allowed))


def with_mig_shares(gpu: GpuModel, levels: Iterable[int], hosts: Iterable[str]) -> GpuModel:
    """``gpu`` (a MIG GPU) with the share profiles ``<host>-1of<k>`` of each of ``hosts`` at each
    of ``levels``: one process of k, each of any (task, variant), that share one instance of
    ``host`` under its MPS daemon (``jigsaw.shares``). A share has its host's geometry (the
    layout code lays its host instance, up to k shares in each), a k-th of its memory and costs
    the planner a k-th of its compute slices (``MigProfile.slice_cost``)."""
    if not gpu.mig or gpu.kind != "gpu":
        raise ValueError(f"{gpu.name}: only a MIG GPU's instances are shared this way")
    added = []
    for name in hosts:
        p = gpu.profile(name)
        if p.host or p.share_of:
            raise ValueError(f"{name} is itself a share")
        for k in sorted(set(levels)):
            if k not in MIG_SHARE_LEVELS:
                raise ValueError(f"a MIG instance is shared by {MIG_SHARE_LEVELS} processes, not {k}")
            added.append(dataclasses.replace(p, name=share_profile_name(k, name), memory_gb=p.memory_gb / k,
                                              max_per_gpu=p.max_per_gpu * k, share_of=k, host=name))
    known = set(gpu.profile_names)
    return dataclasses.replace(gpu, profiles=gpu.profiles + tuple(a for a in added if a.name not in known))


def whole_gpu_model(name: str, memory_gb: float, sm_count: int, *, shares: int = 0,
                    fp16_tflops: float = 0.0, memory_tb_s: float = 0.0) -> GpuModel:
    """A GPU used whole (no MIG, or MIG off): the profile ``gpu`` is the device.

    Its segments are the whole GPU x MPS levels. Without shares it costs one compute slice and
    fills the 8 placement slots, so the planner counts GPUs, and the layout and packer code need
    no special case (one instance per GPU, nothing to partition).

    With ``shares`` = k (one of ``MPS_SHARE_LEVELS``) the GPU costs k slices and also offers the
    profile ``gpu-1of<k>``: one process of k that share the GPU under one MPS control daemon,
    each of any (task, variant). A share spans 8/k placement slots, so the layout code places up
    to k of them per GPU beside no ``gpu`` instance; its profile rows are the level-k rows of the
    whole GPU divided by k (``jigsaw.shares``: k busy processes, the neighbours' interference in
    the measurement).
    """
    if shares and shares not in MPS_SHARE_LEVELS:
        levels = f"{', '.join(map(str, MPS_SHARE_LEVELS[:-1]))} or {MPS_SHARE_LEVELS[-1]}"
        raise ValueError(f"a whole GPU is shared by {levels} MPS processes, not {shares}")
    slices = shares or 1
    profiles = [MigProfile(WHOLE_GPU, slices, memory_gb, NUM_PLACEMENT_SLOTS, (0,), sm_count, max_per_gpu=1)]
    if shares:
        size = NUM_PLACEMENT_SLOTS // shares
        profiles.append(MigProfile(share_profile_name(shares), 1, memory_gb / shares, size,
                                   tuple(range(0, NUM_PLACEMENT_SLOTS, size)), sm_count,
                                   max_per_gpu=shares, share_of=shares))
    return GpuModel(name, memory_gb, sm_count, tuple(profiles), total_slices=slices, mig=False,
                    fp16_tflops=fp16_tflops, memory_tb_s=memory_tb_s)


def gpu_model(name: str) -> GpuModel:
    """Looks a GPU model up by name, case-insensitively (with the driver's figures where this
    process's daemon exported them: ``export_driver_profiles``)."""
    for key, model in (GPU_MODELS | CPU_MODELS).items():
        if key.lower() == name.lower():
            return _as_exported(model)
    raise KeyError(name)


@dataclass(frozen=True)
class DriverProfile:
    """What the driver reports for one GPU-instance profile (``nvmlDeviceGetGpuInstanceProfileInfo``)."""

    name: str  # the table's name of the profile (e.g. "1g.18gb")
    slices: int  # compute slices (``sliceCount``)
    memory_mib: int  # framebuffer of one instance (``memorySizeMB``, MiB)
    sm_count: int  # streaming multiprocessors of one instance (``multiprocessorCount``)
    max_per_gpu: int  # instances a GPU holds at most (``instanceCount``); 0: not offered


class DriverTableError(JigsawError, ValueError):
    """The driver's profiles cannot be laid on the table's placement geometry."""


def driver_differences(model: GpuModel, driver: Iterable[DriverProfile]) -> list[str]:
    """One line per figure where the driver and ``model``'s table differ (memory compared in MiB:
    the planner reads ``memory_gb`` as GiB, ``memory_mb <= memory_gb * 1024``)."""
    out = []
    for d in driver:
        p = model.profile(d.name)
        if d.max_per_gpu == 0:
            out.append(f"{p.name}: not offered by the driver (the table allows {p.max_per_gpu} per GPU)")
            continue
        if d.slices != p.compute_slices:
            out.append(f"{p.name}: {d.slices} compute slices (the table says {p.compute_slices})")
        if d.memory_mib != round(p.memory_gb * 1024):
            out.append(f"{p.name}: memory {d.memory_mib} MiB (the table says {p.memory_gb:g} GB, "
                       f"{round(p.memory_gb * 1024)} MiB)")
        if d.sm_count != p.sm_count:
            out.append(f"{p.name}: {d.sm_count} SMs (the table says {p.sm_count})")
        if d.max_per_gpu != p.max_per_gpu:
            out.append(f"{p.name}: {d.max_per_gpu} per GPU (the table says {p.max_per_gpu})")
    return out


def with_driver_profiles(model: GpuModel, driver: Iterable[DriverProfile]) -> GpuModel:
    """``model`` with the driver's memory, SMs and instances per GPU for each profile it reports (a
    profile the driver does not offer: 0 per GPU, so no plan places it); names, placement slots and
    starts stay the table's. A profile whose compute slices differ has no place on the table's
    geometry: ``DriverTableError``."""
    by_name = {d.name: d for d in driver}
    profiles = []
    for p in model.profiles:
        d = by_name.get(p.name)
        if d is None:
            profiles.append(p)
            continue
        if d.max_per_gpu and d.slices != p.compute_slices:
            raise DriverTableError(f"{model.name} {p.name}: the driver reports {d.slices} compute slices, "
                                   f"the table {p.compute_slices}: the placement table does not fit this GPU")
        if d.max_per_gpu == 0:
            profiles.append(dataclasses.replace(p, max_per_gpu=0))
        else:
            profiles.append(dataclasses.replace(p, memory_gb=d.memory_mib / 1024, sm_count=d.sm_count,
                                                max_per_gpu=d.max_per_gpu))
    # a MIG share follows its host instance (a k-th of its memory, k to each of its instances)
    host = {p.name: p for p in profiles}
    profiles = [dataclasses.replace(p, memory_gb=h.memory_gb / p.share_of, sm_count=h.sm_count,
                                    max_per_gpu=h.max_per_gpu * p.share_of)
                if (h := host.get(p.host)) is not None else p for p in profiles]
    return dataclasses.replace(model, profiles=tuple(profiles))


DRIVER_TABLE_ENV = "JIGSAW_DRIVER_MIG_TABLE"
"""The GPU-instance profiles a GPU node's daemon read from the driver (JSON: ``model``, ``profiles``),
inherited by the processes it starts so that they plan with the table it serves with."""


def export_driver_profiles(model: str, profiles: Iterable[DriverProfile]) -> None:
    """Make ``gpu_model(model)`` answer with the driver's figures in this process and its children."""
    os.environ[DRIVER_TABLE_ENV] = json.dumps(
        {"model": model, "profiles": [dataclasses.asdict(p) for p in profiles]})


def _as_exported(model: GpuModel) -> GpuModel:
    raw = os.environ.get(DRIVER_TABLE_ENV)
    if not raw:
        return model
    try:
        doc = json.loads(raw)
        if doc["model"] != model.name:
            return model
        return with_driver_profiles(model, [DriverProfile(**p) for p in doc["profiles"]])
    except (ValueError, KeyError, TypeError) as exc:
        raise DriverTableError(f"{DRIVER_TABLE_ENV}: not a driver table jigsaw wrote ({exc})") from None
