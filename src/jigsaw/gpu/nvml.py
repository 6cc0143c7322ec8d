"""MIG instances through NVML: check MIG mode, create with placement, destroy, read UUIDs, adopt;
the driver's GPU-instance profiles (``DriverTable``, ``driver_node``: the table a GPU node plans with).

The NVML module is ``pynvml`` from ``nvidia-ml-py`` (the ``gpu`` extra), imported only when a
GPU node asks for it; the emulated node passes ``EmulatedNvml``, which has the same functions,
so both run the same sequence of calls. Every operation leaves the GPU as it found it when it
fails: a GPU instance whose compute instance or UUID cannot be had is destroyed again before the
error is raised (``MigError``, carrying the NVML code and the step).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from jigsaw.errors import JigsawError
from jigsaw.gpu.emulated_nvml import GI_PROFILE_IDS, ci_profile_id, gi_profile_id
from jigsaw.gpu.layout import NodeInstance, NodeLayout
from jigsaw.gpu_groups import composite_model, with_qualified_profiles
from jigsaw.mig import (
    DriverProfile,
    DriverTableError,
    GpuModel,
    MigProfile,
    driver_differences,
    export_driver_profiles,
    with_driver_profiles,
)
from jigsaw.node import Node

_MAX_GPU_INSTANCES = 16  # per GPU and profile: more than any MIG table allows


class MigError(JigsawError):
    """An NVML call failed; ``step`` says which, ``code`` is the NVML return code (or None)."""

    def __init__(self, message: str, step: str = "", code: int | None = None) -> None:
        super().__init__(message)
        self.step = step
        self.code = code


def load_nvml() -> Any:
    """The ``pynvml`` module, or a clear ``MigError`` saying how to install it."""
    try:
        import pynvml
    except ImportError:
        raise MigError(
            "NVML Python binding not installed: pip install 'jigsaw[gpu]' (nvidia-ml-py)", step="import"
        ) from None
    return pynvml


@dataclass(frozen=True)
class MigInstanceInfo:
    """A MIG instance found on, or created on, a GPU."""

    gpu: int
    profile: str
    start: int
    gi_id: int
    ci_id: int | None  # None: a GPU instance without compute instance (a leftover)
    uuid: str  # "" without compute instance


class MigApplier:
    """Creates and destroys the MIG instances of a node layout, one NVML session (``open``/``close``)."""

    def __init__(self, gpu: GpuModel, nvml: Any = None) -> None:
        self.gpu = gpu
        self._nvml = nvml
        self._open = False
        # a MIG share (``MigProfile.host``) is no NVML profile: its instance is its host's
        self._profiles = {gi_profile_id(p): p for p in gpu.devices}

    @property
    def nvml(self) -> Any:
        if self._nvml is None:
            self._nvml = load_nvml()
        return self._nvml

    def _err(self, exc: Exception, step: str, what: str) -> MigError:
        code = getattr(exc, "value", None)
        hint = ""
        if code == getattr(self.nvml, "NVML_ERROR_NO_PERMISSION", 4):
            hint = " (creating and destroying MIG instances needs root)"
        elif code == getattr(self.nvml, "NVML_ERROR_IN_USE", 19):
            hint = " (a process still uses it)"
        elif code == getattr(self.nvml, "NVML_ERROR_INSUFFICIENT_RESOURCES", 23):
            hint = " (the slots are taken)"
        return MigError(f"{what}: NVML {step} failed: {exc}{hint}", step=step, code=code)

    def open(self) -> None:
        if not self._open:
            try:
                self.nvml.nvmlInit()
            except self.nvml.NVMLError as exc:
                raise self._err(exc, "nvmlInit", "NVML") from None
            self._open = True

    def close(self) -> None:
        if self._open:
            self._open = False
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlShutdown()

    def __enter__(self) -> MigApplier:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _device(self, gpu: int) -> Any:
        self.open()
        try:
            return self.nvml.nvmlDeviceGetHandleByIndex(gpu)
        except self.nvml.NVMLError as exc:
            raise self._err(exc, "nvmlDeviceGetHandleByIndex", f"GPU {gpu}") from None

    # ---- MIG mode --------------------------------------------------------------------------

    def check_mig_mode(self, gpus: Iterable[int]) -> None:
        """Raises ``MigError`` naming each GPU without MIG mode on, and how to turn it on."""
        off = []
        for g in gpus:
            try:
                current, pending = self.nvml.nvmlDeviceGetMigMode(self._device(g))
            except self.nvml.NVMLError as exc:
                raise self._err(exc, "nvmlDeviceGetMigMode", f"GPU {g}") from None
            if current != self.nvml.NVML_DEVICE_MIG_ENABLE:
                off.append((g, pending == self.nvml.NVML_DEVICE_MIG_ENABLE))
        if off:
            parts = [
                f"GPU {g} ({'enabled, pending a GPU reset' if pending else 'off'})" for g, pending in off
            ]
            idx = ",".join(str(g) for g, _ in off)
            raise MigError(
                f"MIG mode is not on for {', '.join(parts)}: run `sudo nvidia-smi -i {idx} -mig 1` "
                "(then reset the GPU or reboot) before starting the node",
                step="nvmlDeviceGetMigMode",
            )

    # ---- reading -----------------------------------------------------------------------------

    def _gpu_instances(self, dev: Any, profile_id: int) -> list[Any]:
        nvml = self.nvml
        arr = (nvml.c_nvmlGpuInstance_t * _MAX_GPU_INSTANCES)()
        count = ctypes.c_uint(0)
        nvml.nvmlDeviceGetGpuInstances(dev, profile_id, arr, ctypes.byref(count))
        return [arr[k] for k in range(count.value)]

    def _compute_instances(self, gi: Any, profile_id: int) -> list[Any]:
        nvml = self.nvml
        arr = (nvml.c_nvmlComputeInstance_t * _MAX_GPU_INSTANCES)()
        count = ctypes.c_uint(0)
        nvml.nvmlGpuInstanceGetComputeInstances(gi, profile_id, arr, ctypes.byref(count))
        return [arr[k] for k in range(count.value)]

    def _uuids(self, dev: Any) -> dict[tuple[int, int], str]:
        """(GPU instance id, compute instance id) -> ``MIG-...`` of every MIG device of a GPU."""
        nvml = self.nvml
        out = {}
        for k in range(nvml.nvmlDeviceGetMaxMigDeviceCount(dev)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(dev, k)
            except nvml.NVMLError as exc:
                if exc.value == nvml.NVML_ERROR_NOT_FOUND:
                    continue
                raise
            uuid = nvml.nvmlDeviceGetUUID(mig)
            key = (int(nvml.nvmlDeviceGetGpuInstanceId(mig)), int(nvml.nvmlDeviceGetComputeInstanceId(mig)))
            out[key] = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        return out

    def _find(self, gpu: int) -> list[tuple[MigInstanceInfo, Any, list[Any]]]:
        """Each GPU instance of ``gpu`` with its handle and its compute instances' handles."""
        nvml = self.nvml
        dev = self._device(gpu)
        found = []
        try:
            uuids = self._uuids(dev)
            for pid, prof in self._profiles.items():
                try:
                    gis = self._gpu_instances(dev, pid)
                except nvml.NVMLError as exc:
                    if exc.value in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT):
                        continue  # a profile this GPU (or driver) does not offer
                    raise
                for gi in gis:
                    info = nvml.nvmlGpuInstanceGetInfo(gi)
                    cis = self._compute_instances(gi, ci_profile_id(prof))
                    ci_id = int(nvml.nvmlComputeInstanceGetInfo(cis[0]).id) if cis else None
                    uuid = uuids.get((int(info.id), ci_id), "") if ci_id is not None else ""
                    found.append(
                        (
                            MigInstanceInfo(
                                gpu, prof.name, int(info.placement.start), int(info.id), ci_id, uuid
                            ),
                            gi,
                            cis,
                        )
                    )
        except nvml.NVMLError as exc:
            raise self._err(exc, "listing instances", f"GPU {gpu}") from None
        return sorted(found, key=lambda x: x[0].start)

    def existing(self, gpu: int) -> list[MigInstanceInfo]:
        return [info for info, _, _ in self._find(gpu)]

    # ---- creating and destroying ---------------------------------------------------------

    def create(self, inst: NodeInstance) -> NodeInstance:
        """Creates ``inst``'s GPU instance at its start slot and its compute instance; returns it
        with its UUID. On any failure nothing of it is left on the GPU."""
        nvml = self.nvml
        prof: MigProfile = self.gpu.profile(inst.profile)
        dev = self._device(inst.gpu)
        step = "nvmlDeviceGetGpuInstanceProfileInfo"
        gi = ci = None
        try:
            gi_info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(dev, gi_profile_id(prof))
            placement = nvml.c_nvmlGpuInstancePlacement_t()
            placement.start = inst.start
            placement.size = prof.size
            step = "nvmlDeviceCreateGpuInstanceWithPlacement"
            gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(dev, gi_info.id, ctypes.byref(placement))
            step = "nvmlGpuInstanceGetComputeInstanceProfileInfo"
            ci_info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, ci_profile_id(prof), nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
            step = "nvmlGpuInstanceCreateComputeInstance"
            ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
            step = "reading the UUID"
            gi_id = int(nvml.nvmlGpuInstanceGetInfo(gi).id)
            ci_id = int(nvml.nvmlComputeInstanceGetInfo(ci).id)
            uuid = self._uuids(dev).get((gi_id, ci_id))
            if not uuid:
                raise nvml.NVMLError(nvml.NVML_ERROR_NOT_FOUND)
        except nvml.NVMLError as exc:
            err = self._err(exc, step, f"creating {inst.name}")
            for handle, destroy in ((ci, nvml.nvmlComputeInstanceDestroy), (gi, nvml.nvmlGpuInstanceDestroy)):
                if handle is not None:
                    try:
                        destroy(handle)
                    except nvml.NVMLError as undo:
                        raise MigError(
                            f"{err}; and undoing it failed: {undo} (left on GPU {inst.gpu})",
                            step=step,
                            code=err.code,
                        ) from None
            raise err from None
        return dataclasses.replace(inst, uuid=uuid)

    def destroy(self, inst: NodeInstance) -> None:
        """Destroys the MIG instance at ``inst``'s GPU and start slot (compute instances first).

        A compute instance that refuses (in use) leaves everything in place: the compute
        instances destroyed before it are created again, so the instance stays usable.
        """
        nvml = self.nvml
        match = [
            (i, gi, cis)
            for i, gi, cis in self._find(inst.gpu)
            if i.start == inst.start and i.profile == inst.profile
        ]
        if not match:
            raise MigError(
                f"destroying {inst.name}: no such MIG instance on GPU {inst.gpu}",
                step="nvmlDeviceGetGpuInstances",
                code=getattr(nvml, "NVML_ERROR_NOT_FOUND", 6),
            )
        _, gi, cis = match[0]
        step = "nvmlComputeInstanceDestroy"
        try:
            for ci in cis:
                nvml.nvmlComputeInstanceDestroy(ci)
            step = "nvmlGpuInstanceDestroy"
            nvml.nvmlGpuInstanceDestroy(gi)
        except nvml.NVMLError as exc:
            err = self._err(exc, step, f"destroying {inst.name}")
            if step == "nvmlGpuInstanceDestroy" and cis:
                # the compute instance is gone: put it back, so the instance is whole again
                try:
                    prof = self.gpu.profile(inst.profile)
                    info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                        gi, ci_profile_id(prof), nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                    )
                    nvml.nvmlGpuInstanceCreateComputeInstance(gi, info.id)
                except nvml.NVMLError as undo:
                    raise MigError(
                        f"{err}; and restoring its compute instance failed: {undo}", step=step, code=err.code
                    ) from None
            raise err from None

    def uuid_of(self, inst: NodeInstance) -> str:
        for info in self.existing(inst.gpu):
            if info.start == inst.start and info.profile == inst.profile and info.uuid:
                return info.uuid
        raise MigError(
            f"{inst.name}: no MIG device at GPU {inst.gpu} start {inst.start}", step="reading the UUID"
        )

    # ---- start-up ------------------------------------------------------------------------

    def adopt(self, num_gpus: int, gpus: Iterable[int] | None = None) -> NodeLayout:
        """What the GPUs hold now, as a node layout of idle instances (with their UUIDs); ``gpus``:
        only those of the node's ``num_gpus`` (one GPU group's, ``gpu.groups``).

        Diffing it against the first desired layout keeps matching instances (their processes are
        started in them, no NVML call) and destroys the others; a GPU instance left without a
        compute instance by an earlier crash gets one first, so it can be used or destroyed.
        """
        indices = list(range(num_gpus) if gpus is None else gpus)
        self.check_mig_mode(indices)
        out = []
        nvml = self.nvml
        for g in indices:
            for info, gi, cis in self._find(g):
                if not cis:
                    prof = self.gpu.profile(info.profile)
                    try:
                        ci_info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                            gi, ci_profile_id(prof), nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                        )
                        nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
                    except nvml.NVMLError as exc:
                        raise self._err(exc, "nvmlGpuInstanceCreateComputeInstance", f"GPU {g}") from None
                    info = next(i for i in self.existing(g) if i.start == info.start)
                out.append(NodeInstance(gpu=g, profile=info.profile, start=info.start, uuid=info.uuid))
        return NodeLayout(self.gpu.name, num_gpus, tuple(out))


@contextlib.contextmanager
def _session(nvml: Any) -> Iterator[None]:
    """One NVML session for a read: ``nvmlInit`` (a ``MigError`` when it fails), then
    ``nvmlShutdown`` whatever happened."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise MigError(f"NVML did not start: {exc}", step="nvmlInit",
                       code=getattr(exc, "value", None)) from None
    try:
        yield
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def gpu_uuids(num_gpus: int, nvml: Any = None) -> list[str]:
    """``GPU-...`` of the node's first ``num_gpus`` GPUs (those used whole: their MPS daemons and
    workers see them by UUID); one NVML session, a clear ``MigError`` naming the step that failed."""
    nvml = load_nvml() if nvml is None else nvml
    step = "nvmlDeviceGetCount"
    with _session(nvml):
        try:
            count = int(nvml.nvmlDeviceGetCount())
            if count < num_gpus:
                raise MigError(f"{count} GPU(s) found, the node config asks for {num_gpus}", step=step)
            out = []
            for g in range(num_gpus):
                step = "nvmlDeviceGetUUID"
                uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(g))
                out.append(uuid.decode() if isinstance(uuid, bytes) else str(uuid))
            return out
        except nvml.NVMLError as exc:
            raise MigError(f"reading the GPUs' UUIDs: NVML {step} failed: {exc}", step=step,
                           code=getattr(exc, "value", None)) from None


_PROFILE_NAMES = {v: k.removeprefix("NVML_GPU_INSTANCE_PROFILE_") for k, v in GI_PROFILE_IDS.items()}
_NOT_OFFERED = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_INVALID_ARGUMENT")


@dataclass(frozen=True)
class DriverTable:
    """What the driver reports for every GPU-instance profile id of one GPU, beside ``jigsaw.mig``'s
    table: ``profiles`` the table's profiles as the driver has them (0 per GPU: not offered),
    ``differences`` one line per figure that differs, ``unknown`` the profiles the driver offers
    that the table has no name for (not used), ``model`` the table with the driver's figures."""

    gpu_name: str
    profiles: tuple[DriverProfile, ...]
    differences: tuple[str, ...]
    unknown: tuple[str, ...]
    model: GpuModel


def read_driver_table(model: GpuModel, nvml: Any = None, gpu: int = 0) -> DriverTable:
    """Every GPU-instance profile id of GPU ``gpu`` (``nvmlDeviceGetGpuInstanceProfileInfo``; the
    driver answers with MIG mode on or off) against ``model``'s table. An NVML failure other than
    "this profile is not offered" is a ``MigError`` naming the call."""
    nvml = load_nvml() if nvml is None else nvml
    count = int(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", max(GI_PROFILE_IDS.values()) + 1))
    not_offered = {int(getattr(nvml, n)) for n in _NOT_OFFERED}
    answers: dict[int, Any] = {}
    with _session(nvml):
        try:
            step = "nvmlDeviceGetHandleByIndex"
            dev = nvml.nvmlDeviceGetHandleByIndex(gpu)
            name = nvml.nvmlDeviceGetName(dev)
            step = "nvmlDeviceGetGpuInstanceProfileInfo"
            for pid in range(count):
                try:
                    answers[pid] = nvml.nvmlDeviceGetGpuInstanceProfileInfo(dev, pid)
                except nvml.NVMLError as exc:
                    if getattr(exc, "value", None) not in not_offered:
                        raise
        except nvml.NVMLError as exc:
            raise MigError(f"GPU {gpu}: NVML {step} failed: {exc}", step=step,
                           code=getattr(exc, "value", None)) from None
    return _driver_table(model, name.decode() if isinstance(name, bytes) else str(name), answers)


def _driver_table(model: GpuModel, gpu_name: str, answers: dict[int, Any]) -> DriverTable:
    ours = {gi_profile_id(p): p for p in model.devices} if model.mig else {}
    profiles = []
    for pid, p in ours.items():
        a = answers.get(pid)
        profiles.append(DriverProfile(p.name, p.compute_slices, 0, 0, 0) if a is None else DriverProfile(
            p.name, int(a.sliceCount), int(a.memorySizeMB), int(a.multiprocessorCount), int(a.instanceCount)))
    unknown = tuple(
        f"{_PROFILE_NAMES.get(pid, pid)}: {a.sliceCount} slices, {a.memorySizeMB} MiB, "
        f"{a.multiprocessorCount} SMs, {a.instanceCount} per GPU (no profile of the table: not used)"
        for pid, a in sorted(answers.items()) if pid not in ours)
    try:
        table = with_driver_profiles(model, profiles)
    except DriverTableError as exc:
        raise MigError(str(exc), step="nvmlDeviceGetGpuInstanceProfileInfo") from None
    return DriverTable(gpu_name, tuple(profiles), tuple(driver_differences(model, profiles)), unknown, table)


def driver_node(node: Node, nvml: Any = None, say: Any = None) -> Node:
    """``node`` with its MIG table as the driver reports it (GPU 0's answers; a node's GPUs are one
    model): what a GPU node plans, packs and serves with, exported to the processes this one starts
    (``jigsaw.mig.export_driver_profiles``: the planner child). Each difference is said (``say``); a
    node without MIG (or a CPU node) is returned as it is."""
    if node.gpu.kind != "gpu" or not node.gpu.mig:
        return node
    if node.is_mixed:
        return _driver_groups(node, nvml, say)
    table = read_driver_table(node.gpu, nvml)
    for line in table.differences:
        if say is not None:
            say(f"MIG table of {node.gpu.name}: {line}: using the driver's")
    export_driver_profiles(node.gpu.name, table.profiles)
    return dataclasses.replace(node, gpu=table.model)


def _driver_groups(node: Node, nvml: Any, say: Any) -> Node:
    """``driver_node`` of a node of several GPU groups: each MIG group's table as the driver
    reports it for the group's first GPU; exported where the node has one MIG group (the export
    names one model)."""
    groups = []
    tables = []
    for g in node.groups:
        if not g.model.mig:
            groups.append(g)
            continue
        table = read_driver_table(g.model, nvml, gpu=g.host_indices[0])
        for line in table.differences:
            if say is not None:
                say(f"MIG table of {g.name} (GPU {g.host_indices[0]}): {line}: using the driver's")
        tables.append(table)
        groups.append(dataclasses.replace(g, model=table.model,
                                          gpu=with_qualified_profiles(table.model, g.name)))
    if len(tables) == 1:
        export_driver_profiles(tables[0].model.name, tables[0].profiles)
    elif say is not None and any(t.differences for t in tables):
        say("several MIG groups: the planner child plans with jigsaw's tables where the driver differs")
    new = tuple(groups)
    return dataclasses.replace(node, groups=new, gpu=composite_model(new))
