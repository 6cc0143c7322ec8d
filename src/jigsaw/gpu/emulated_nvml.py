"""An NVML for nodes without GPUs: the ``pynvml`` functions MIG reconfiguration uses, in memory.

Same function names, argument conventions (``byref`` placements, ctypes arrays and count
references), return types (ctypes structures with pynvml's field names) and ``NVMLError`` codes
as ``nvidia-ml-py``. It enforces what the driver enforces for MIG on the A100/H100/H200 tables
(allowed start slots, no overlap, per-profile and compute-slice limits; a GPU instance with
compute instances, or a compute instance a process uses, cannot be destroyed: ``IN_USE``). The
emulated node applies its layouts through it, so a replay runs the exact sequence of calls a
real node makes; tests use its call log and its fault injection (``inject``).

``nvmlDeviceGetGpuInstanceProfileInfo`` answers as the driver does, MIG mode on or off (a real H200
with MIG off reported every profile): from the GPU model's table, or from a real driver's answers
(``profile_answers``, ``EmulatedNvml.from_driver_dump``: the figures and error codes read on a GPU
machine, ``h200-nvml-gi-profiles.json``), so a test can run the project against the real driver's
figures.
"""

from __future__ import annotations

import ctypes
import json
import threading
import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jigsaw.mig import GpuModel, MigProfile
from jigsaw.planner.layouts import placement_violations

# ---- constants: the values of nvidia-ml-py (pynvml) ----------------------------------------

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_UNKNOWN = 999

NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1

NVML_GPU_INSTANCE_PROFILE_1_SLICE = 0x0
NVML_GPU_INSTANCE_PROFILE_2_SLICE = 0x1
NVML_GPU_INSTANCE_PROFILE_3_SLICE = 0x2
NVML_GPU_INSTANCE_PROFILE_4_SLICE = 0x3
NVML_GPU_INSTANCE_PROFILE_7_SLICE = 0x4
NVML_GPU_INSTANCE_PROFILE_8_SLICE = 0x5
NVML_GPU_INSTANCE_PROFILE_6_SLICE = 0x6
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 = 0x7  # 1g with media extensions (1g.10gb+me)
NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1 = 0x8
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2 = 0x9  # 1g with two memory slices (1g.20gb)
NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX = 0xA
NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX = 0xB
NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX = 0xC
NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME = 0xD
NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME = 0xE
NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME = 0xF
NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME = 0x10
NVML_GPU_INSTANCE_PROFILE_3_SLICE_GFX = 0x11
NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12

nvmlGpuInstanceProfileInfo_v2 = 0x02000098

NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE = 0x0
NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE = 0x1
NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE = 0x2
NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE = 0x3
NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE = 0x4
NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0x0

_ERROR_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_IN_USE: "In use by another client",
    NVML_ERROR_INSUFFICIENT_RESOURCES: "Insufficient resources",
    NVML_ERROR_INVALID_STATE: "Invalid state",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """pynvml's error: ``value`` is the NVML return code, ``str()`` its description."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _ERROR_STRINGS.get(self.value, f"NVML error {self.value}")


# ---- structures: pynvml's field names -------------------------------------------------------

c_nvmlGpuInstance_t = ctypes.c_void_p  # opaque handles (here: small integers)
c_nvmlComputeInstance_t = ctypes.c_void_p


class c_nvmlGpuInstancePlacement_t(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class c_nvmlComputeInstancePlacement_t(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class c_nvmlGpuInstanceInfo_t(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.c_void_p),
        ("id", ctypes.c_uint),
        ("profileId", ctypes.c_uint),
        ("placement", c_nvmlGpuInstancePlacement_t),
    ]


class c_nvmlComputeInstanceInfo_t(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.c_void_p),
        ("gpuInstance", ctypes.c_void_p),
        ("id", ctypes.c_uint),
        ("profileId", ctypes.c_uint),
        ("placement", c_nvmlComputeInstancePlacement_t),
    ]


class c_nvmlGpuInstanceProfileInfo_t(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_uint),
        ("isP2pSupported", ctypes.c_uint),
        ("sliceCount", ctypes.c_uint),
        ("instanceCount", ctypes.c_uint),
        ("multiprocessorCount", ctypes.c_uint),
        ("copyEngineCount", ctypes.c_uint),
        ("decoderCount", ctypes.c_uint),
        ("encoderCount", ctypes.c_uint),
        ("jpegCount", ctypes.c_uint),
        ("ofaCount", ctypes.c_uint),
        ("memorySizeMB", ctypes.c_ulonglong),
    ]


class c_nvmlGpuInstanceProfileInfo_v2_t(ctypes.Structure):
    _fields_ = [  # v1's fields between a version and a name, as the binding lays them out
        ("version", ctypes.c_uint),
        *c_nvmlGpuInstanceProfileInfo_t._fields_,
        ("name", ctypes.c_char * 96),
    ]


class c_nvmlComputeInstanceProfileInfo_v2_t(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("id", ctypes.c_uint),
        ("sliceCount", ctypes.c_uint),
        ("instanceCount", ctypes.c_uint),
        ("multiprocessorCount", ctypes.c_uint),
        ("sharedCopyEngineCount", ctypes.c_uint),
        ("sharedDecoderCount", ctypes.c_uint),
        ("sharedEncoderCount", ctypes.c_uint),
        ("sharedJpegCount", ctypes.c_uint),
        ("sharedOfaCount", ctypes.c_uint),
        ("name", ctypes.c_char * 96),
    ]


def gi_profile_id(p: MigProfile) -> int:
    """NVML's GPU instance profile constant of a MIG profile of the A100/H100/H200 tables."""
    if p.name.endswith("+me"):
        return NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1
    if p.compute_slices == 1:
        return NVML_GPU_INSTANCE_PROFILE_1_SLICE if p.size == 1 else NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
    by_slices = {
        2: NVML_GPU_INSTANCE_PROFILE_2_SLICE,
        3: NVML_GPU_INSTANCE_PROFILE_3_SLICE,
        4: NVML_GPU_INSTANCE_PROFILE_4_SLICE,
        7: NVML_GPU_INSTANCE_PROFILE_7_SLICE,
    }
    if p.compute_slices not in by_slices:
        raise ValueError(f"MIG profile {p.name} has no NVML GPU instance profile")
    return by_slices[p.compute_slices]


def ci_profile_id(p: MigProfile) -> int:
    """The compute instance profile spanning the whole GPU instance (``nvidia-smi -C``'s default)."""
    by_slices = {
        1: NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        2: NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
        3: NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        4: NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
        7: NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    }
    return by_slices[p.compute_slices]


GI_PROFILE_IDS: dict[str, int] = {
    name: value for name, value in list(globals().items())
    if name.startswith("NVML_GPU_INSTANCE_PROFILE_") and name != "NVML_GPU_INSTANCE_PROFILE_COUNT"
}
"""Every GPU-instance profile constant by its pynvml name."""

ProfileAnswer = Mapping[str, int] | int
"""What the driver answered for a profile id: ``slices``, ``mem_mb``, ``sms``, ``instances``, or an
NVML error code."""


def answers_from_dump(gi_profiles: Mapping[str, Any]) -> dict[int, ProfileAnswer]:
    """A driver's answers as read on a GPU machine (``{"NVML_GPU_INSTANCE_PROFILE_...": {"slices",
    "mem_mb", "sms", "instances"} or "error <NVML error string>"}``) by profile id."""
    codes = {text: code for code, text in _ERROR_STRINGS.items()}
    out: dict[int, ProfileAnswer] = {}
    for name, answer in gi_profiles.items():
        if name not in GI_PROFILE_IDS:
            raise ValueError(f"{name}: not an NVML GPU-instance profile")
        if isinstance(answer, str):
            text = answer.removeprefix("error").strip()
            if text not in codes:
                raise ValueError(f"{name}: unknown NVML error {answer!r}")
            out[GI_PROFILE_IDS[name]] = codes[text]
        else:
            out[GI_PROFILE_IDS[name]] = {k: int(answer[k]) for k in ("slices", "mem_mb", "sms", "instances")}
    return out


# ---- state ----------------------------------------------------------------------------------


@dataclass
class _Ci:
    handle: int
    gi: _Gi
    id: int
    profile_id: int
    uuid: str


@dataclass
class _Gi:
    handle: int
    gpu: _Gpu
    id: int
    profile: MigProfile
    start: int
    cis: dict[int, _Ci] = field(default_factory=dict)


@dataclass
class _Gpu:
    handle: int
    index: int
    mig_mode: int
    pending_mode: int
    gis: dict[int, _Gi] = field(default_factory=dict)


@dataclass(frozen=True)
class _MigDevice:
    ci: _Ci


@dataclass
class _Fault:
    function: str
    code: int
    skip: int  # calls of ``function`` let through before the failing one


class EmulatedNvml:
    """One host's NVML in memory. Use the instance where ``pynvml`` (the module) is expected.

    ``calls`` logs every call as ``(function, gpu index or None, detail)``. ``inject`` makes a
    later call of a function fail with an NVML code; ``attach``/``detach`` mark a MIG device
    used by a process (its compute instance then refuses to be destroyed).
    """

    NVMLError = NVMLError

    def __init__(
        self,
        gpu: GpuModel,
        num_gpus: int,
        mig_enabled: bool | Sequence[bool] = True,
        driver_version: str = "emulated",
        profile_answers: Mapping[int, ProfileAnswer] | None = None,
        device_name: str = "",
    ) -> None:
        modes = [mig_enabled] * num_gpus if isinstance(mig_enabled, bool) else list(mig_enabled)
        if len(modes) != num_gpus:
            raise ValueError("mig_enabled: one flag per GPU")
        self.model = gpu
        self.driver_version = driver_version
        self.device_name = device_name or f"NVIDIA {gpu.name} (emulated)"
        self._answers = None if profile_answers is None else dict(profile_answers)
        self._lock = threading.RLock()
        self._next_handle = 1
        self._objects: dict[int, Any] = {}
        self._gpus = [
            self._register(lambda h, i=i, m=m: _Gpu(h, i, int(m), int(m))) for i, m in enumerate(modes)
        ]
        # a GPU model without MIG (used whole) has no GPU-instance profiles
        self._by_profile_id = {gi_profile_id(p): p for p in gpu.devices} if gpu.mig else {}
        self._initialized = 0
        self._faults: list[_Fault] = []
        self._in_use: set[str] = set()
        self.calls: list[tuple[str, int | None, str]] = []
        # constants and structures reachable as attributes, as on the pynvml module
        for name, value in globals().items():
            if name.startswith(("NVML_", "c_nvml")):
                setattr(self, name, value)

    @classmethod
    def from_driver_dump(cls, path: Path | str, gpu: GpuModel) -> EmulatedNvml:
        """The GPU a real driver described (``h200-nvml-gi-profiles.json``: its device name, driver
        version, MIG mode and every GPU-instance profile's answer), on ``gpu``'s placement table."""
        doc = json.loads(Path(path).read_text())
        current, pending = (int(m) for m in doc["mig_mode"])  # nvmlDeviceGetMigMode's pair
        nvml = cls(gpu, 1, current == NVML_DEVICE_MIG_ENABLE, driver_version=str(doc["driver"]),
                   profile_answers=answers_from_dump(doc["gi_profiles"]), device_name=str(doc["name"]))
        nvml._gpus[0].pending_mode = pending
        return nvml

    # ---- test and emulation hooks --------------------------------------------------------

    def inject(self, function: str, code: int, skip: int = 0) -> None:
        """The call of ``function`` after ``skip`` successful ones raises ``NVMLError(code)``."""
        if not hasattr(self, function):
            raise AttributeError(f"no NVML function {function}")
        self._faults.append(_Fault(function, code, skip))

    def attach(self, mig_uuid: str) -> None:
        self._in_use.add(mig_uuid)

    def detach(self, mig_uuid: str) -> None:
        self._in_use.discard(mig_uuid)

    def set_mig_mode(self, gpu: int, enabled: bool) -> None:
        g = self._gpus[gpu]
        g.mig_mode = g.pending_mode = int(enabled)

    def instances(self, gpu: int) -> list[tuple[str, int, int]]:
        """(profile, start, compute instances) of each GPU instance of ``gpu``, by start."""
        return sorted((gi.profile.name, gi.start, len(gi.cis)) for gi in self._gpus[gpu].gis.values())

    def mutations(self) -> list[tuple[str, int | None, str]]:
        """The logged calls that change the partition (creates and destroys)."""
        return [c for c in self.calls if "Create" in c[0] or "Destroy" in c[0]]

    # ---- plumbing ------------------------------------------------------------------------

    def _register(self, make: Callable[[int], Any]) -> Any:
        h = self._next_handle
        self._next_handle += 1
        obj = make(h)
        self._objects[h] = obj
        return obj

    def _get(self, handle: Any, kind: type) -> Any:
        h = handle.value if isinstance(handle, ctypes.c_void_p) else handle
        obj = self._objects.get(h) if isinstance(h, int) else None
        if not isinstance(obj, kind):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return obj

    def _enter(self, function: str, gpu: int | None = None, detail: str = "") -> None:
        self.calls.append((function, gpu, detail))
        if (
            function not in ("nvmlInit", "nvmlShutdown", "nvmlSystemGetDriverVersion")
            and not self._initialized
        ):
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        for f in self._faults:
            if f.function == function:
                if f.skip > 0:
                    f.skip -= 1
                    continue
                self._faults.remove(f)
                raise NVMLError(f.code)

    # ---- library -------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        with self._lock:
            self._enter("nvmlInit")
            self._initialized += 1

    def nvmlShutdown(self) -> None:
        with self._lock:
            self._enter("nvmlShutdown")
            if not self._initialized:
                raise NVMLError(NVML_ERROR_UNINITIALIZED)
            self._initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        if not self._initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return self.driver_version

    # ---- devices -------------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._enter("nvmlDeviceGetHandleByIndex", index)
        if not 0 <= index < len(self._gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self._gpus[index].handle

    def nvmlDeviceGetName(self, handle: Any) -> str:
        g = self._get(handle, _Gpu)
        self._enter("nvmlDeviceGetName", g.index)
        return self.device_name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        obj = self._objects.get(handle.value if isinstance(handle, ctypes.c_void_p) else handle)
        if isinstance(obj, _Gpu):
            self._enter("nvmlDeviceGetUUID", obj.index)
            return f"GPU-emulated-{obj.index:04d}"
        if isinstance(obj, _MigDevice):
            self._enter("nvmlDeviceGetUUID", obj.ci.gi.gpu.index)
            return obj.ci.uuid
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        g = self._get(handle, _Gpu)
        self._enter("nvmlDeviceGetMigMode", g.index)
        return [g.mig_mode, g.pending_mode]

    def _mig_gpu(self, handle: Any) -> _Gpu:
        g = self._get(handle, _Gpu)
        if g.mig_mode != NVML_DEVICE_MIG_ENABLE:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return g

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, handle: Any, profile: int, version: int = 2
    ) -> c_nvmlGpuInstanceProfileInfo_v2_t | c_nvmlGpuInstanceProfileInfo_t:
        """A profile's figures, MIG mode on or off (as the driver answers); NOT_SUPPORTED for a
        profile the GPU does not offer, INVALID_ARGUMENT for an id past the known ones."""
        g = self._get(handle, _Gpu)
        self._enter("nvmlDeviceGetGpuInstanceProfileInfo", g.index, f"profile={profile}")
        if version not in (1, 2):
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        if self._answers is not None:
            answer = self._answers.get(profile, NVML_ERROR_INVALID_ARGUMENT)
            if isinstance(answer, int):
                raise NVMLError(answer)
            p = self._by_profile_id.get(profile)
            slices, mem_mb, sms, count = (answer[k] for k in ("slices", "mem_mb", "sms", "instances"))
        else:
            if not 0 <= profile < NVML_GPU_INSTANCE_PROFILE_COUNT:
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
            p = self._by_profile_id.get(profile)
            if p is None:
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
            slices, mem_mb, sms, count = p.compute_slices, int(p.memory_gb * 1024), p.sm_count, p.max_per_gpu
        info = c_nvmlGpuInstanceProfileInfo_v2_t() if version == 2 else c_nvmlGpuInstanceProfileInfo_t()
        if version == 2:
            info.version = nvmlGpuInstanceProfileInfo_v2
            info.name = f"MIG {p.name if p is not None else f'{slices}g'}".encode()
        info.id = profile  # on real GPUs too, the id of a profile equals its constant
        info.sliceCount = slices
        info.instanceCount = count
        info.multiprocessorCount = sms
        info.memorySizeMB = mem_mb
        return info

    nvmlDeviceGetGpuInstanceProfileInfoV = nvmlDeviceGetGpuInstanceProfileInfo  # pynvml's alias

    def _profile(self, profile_id: int) -> MigProfile:
        p = self._by_profile_id.get(profile_id)
        if p is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return p

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: Any, profileId: int, placement: Any) -> int:
        with self._lock:
            pl = getattr(placement, "_obj", placement)  # byref(...) or the structure itself
            g = self._get(handle, _Gpu)
            self._enter(
                "nvmlDeviceCreateGpuInstanceWithPlacement", g.index, f"profile={profileId} start={pl.start}"
            )
            g = self._mig_gpu(handle)
            p = self._profile(profileId)
            if pl.start not in p.starts or pl.size != p.size:
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
            held = [(gi.profile.name, gi.start) for gi in g.gis.values()]
            if placement_violations(self.model, [*held, (p.name, pl.start)]):
                raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES)
            gi_id = min(set(range(1, 15)) - set(g.gis))
            gi = self._register(lambda h: _Gi(h, g, gi_id, p, pl.start))
            g.gis[gi_id] = gi
            return gi.handle

    def nvmlDeviceGetGpuInstances(
        self, handle: Any, profileId: int, gpuInstancesRef: Any, countRef: Any
    ) -> int:
        g = self._get(handle, _Gpu)
        self._enter("nvmlDeviceGetGpuInstances", g.index, f"profile={profileId}")
        g = self._mig_gpu(handle)
        found = [
            gi for gi in sorted(g.gis.values(), key=lambda x: x.id) if gi_profile_id(gi.profile) == profileId
        ]
        if len(found) > len(gpuInstancesRef):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        for k, gi in enumerate(found):
            gpuInstancesRef[k] = gi.handle
        getattr(countRef, "_obj", countRef).value = len(found)
        return NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, id: int) -> int:
        g = self._get(handle, _Gpu)
        self._enter("nvmlDeviceGetGpuInstanceById", g.index, f"gi={id}")
        if id not in g.gis:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return g.gis[id].handle

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> c_nvmlGpuInstanceInfo_t:
        gi = self._get(gpuInstance, _Gi)
        self._enter("nvmlGpuInstanceGetInfo", gi.gpu.index, f"gi={gi.id}")
        info = c_nvmlGpuInstanceInfo_t()
        info.device = gi.gpu.handle
        info.id = gi.id
        info.profileId = gi_profile_id(gi.profile)
        info.placement.start = gi.start
        info.placement.size = gi.profile.size
        return info

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gpuInstance: Any, profile: int, engProfile: int, version: int = 2
    ) -> c_nvmlComputeInstanceProfileInfo_v2_t:
        gi = self._get(gpuInstance, _Gi)
        self._enter("nvmlGpuInstanceGetComputeInstanceProfileInfo", gi.gpu.index, f"profile={profile}")
        if profile != ci_profile_id(gi.profile) or engProfile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # only the whole-instance compute profile here
        info = c_nvmlComputeInstanceProfileInfo_v2_t()
        info.id = profile
        info.sliceCount = gi.profile.compute_slices
        info.instanceCount = 1
        info.multiprocessorCount = gi.profile.sm_count
        return info

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> int:
        with self._lock:
            gi = self._get(gpuInstance, _Gi)
            self._enter(
                "nvmlGpuInstanceCreateComputeInstance", gi.gpu.index, f"gi={gi.id} profile={profileId}"
            )
            if profileId != ci_profile_id(gi.profile):
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
            if gi.cis:
                raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES)
            ci = self._register(lambda h: _Ci(h, gi, 0, profileId, f"MIG-{uuidlib.uuid4()}"))
            gi.cis[0] = ci
            self._register(lambda h: _MigDevice(ci))
            return ci.handle

    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance: Any, profileId: int, computeInstancesRef: Any, countRef: Any
    ) -> int:
        gi = self._get(gpuInstance, _Gi)
        self._enter("nvmlGpuInstanceGetComputeInstances", gi.gpu.index, f"gi={gi.id} profile={profileId}")
        found = [ci for ci in gi.cis.values() if ci.profile_id == profileId]
        for k, ci in enumerate(found):
            computeInstancesRef[k] = ci.handle
        getattr(countRef, "_obj", countRef).value = len(found)
        return NVML_SUCCESS

    def nvmlComputeInstanceGetInfo(self, computeInstance: Any) -> c_nvmlComputeInstanceInfo_t:
        ci = self._get(computeInstance, _Ci)
        self._enter("nvmlComputeInstanceGetInfo", ci.gi.gpu.index, f"gi={ci.gi.id} ci={ci.id}")
        info = c_nvmlComputeInstanceInfo_t()
        info.device = ci.gi.gpu.handle
        info.gpuInstance = ci.gi.handle
        info.id = ci.id
        info.profileId = ci.profile_id
        info.placement.start = 0
        info.placement.size = ci.gi.profile.compute_slices
        return info

    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:
        with self._lock:
            ci = self._get(computeInstance, _Ci)
            self._enter("nvmlComputeInstanceDestroy", ci.gi.gpu.index, f"gi={ci.gi.id} ci={ci.id}")
            if ci.uuid in self._in_use:
                raise NVMLError(NVML_ERROR_IN_USE)
            del ci.gi.cis[ci.id]
            for h, obj in list(self._objects.items()):
                if obj is ci or (isinstance(obj, _MigDevice) and obj.ci is ci):
                    del self._objects[h]
            return NVML_SUCCESS

    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:
        with self._lock:
            gi = self._get(gpuInstance, _Gi)
            self._enter("nvmlGpuInstanceDestroy", gi.gpu.index, f"gi={gi.id}")
            if gi.cis:
                raise NVMLError(NVML_ERROR_IN_USE)
            del gi.gpu.gis[gi.id]
            del self._objects[gi.handle]
            return NVML_SUCCESS

    # ---- MIG devices (a compute instance as CUDA sees it) ---------------------------------

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        g = self._get(handle, _Gpu)
        self._enter("nvmlDeviceGetMaxMigDeviceCount", g.index)
        return 7 if g.mig_mode == NVML_DEVICE_MIG_ENABLE else 0  # 0 with MIG off, as the driver says

    def _mig_devices(self, g: _Gpu) -> list[tuple[int, _MigDevice]]:
        devs = [(h, o) for h, o in self._objects.items() if isinstance(o, _MigDevice) and o.ci.gi.gpu is g]
        return sorted(devs, key=lambda x: (x[1].ci.gi.id, x[1].ci.id))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> int:
        g = self._get(device, _Gpu)
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", g.index, f"index={index}")
        devs = self._mig_devices(g)
        if not 0 <= index < len(devs):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return devs[index][0]

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        d = self._get(device, _MigDevice)
        self._enter("nvmlDeviceGetGpuInstanceId", d.ci.gi.gpu.index)
        return d.ci.gi.id

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        d = self._get(device, _MigDevice)
        self._enter("nvmlDeviceGetComputeInstanceId", d.ci.gi.gpu.index)
        return d.ci.id
