"""The node's GPU groups: ``[gpus]`` (one group) or ``[[gpus]]`` (several GPU models, MIG or whole).

A group is ``count`` GPUs of one model, partitioned one way (MIG profiles, MPS levels, MPS shares
of a whole GPU), planned from its own profile rows. A node of several groups plans them as one:
its segment catalogue is the union of every group's, each profile qualified by its group
(``"A100-40GB:1g.10gb"``, ``"L4:gpu-1of4"``), so a profile row, a column, a plan instance and a
placed instance all name the GPUs they run on, and a lane may cross groups (one task on a MIG
slice, the next on a whole GPU's MPS share). The groups' GPUs are numbered in file order: the
first group's 0..count-1, then the next group's. A node of one group names its profiles plainly
and plans exactly as a node of one GPU model always has.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator

from jigsaw.backends.registry import NAMES as BACKENDS
from jigsaw.errors import ConfigError
from jigsaw.fields import Fields, load_section, reference, section, setting
from jigsaw.mig import (
    GPU_MODELS,
    MIG_SHARE_LEVELS,
    MPS_SHARE_LEVELS,
    GpuModel,
    gpu_model,
    mig_family_model,
    share_host,
    share_level,
    whole_gpu_model,
    with_mig_shares,
)

SEP = ":"
"""Between a group's name and a profile in a qualified profile name (``"L4:gpu-1of4"``)."""

PAPER_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


def qualified(group: str, profile: str) -> str:
    """The segment profile ``profile`` of the GPUs of ``group`` in a node of several groups."""
    return f"{group}{SEP}{profile}"


def plain_profile(name: str) -> str:
    """The profile as its GPU names it (``"L4:gpu-1of4"`` -> ``"gpu-1of4"``; a plain name as is)."""
    return name.rpartition(SEP)[2]


def _array(x: Any) -> Any:
    return tuple(x) if isinstance(x, list) else x


def _levels(levels: tuple[int, ...]) -> tuple[int, ...]:
    if not levels or not all(1 <= k <= 48 for k in levels):
        raise ValueError(f"expected MPS levels between 1 and 48, got {list(levels)!r}")
    return levels


def _batches(sizes: tuple[int, ...]) -> tuple[int, ...]:
    if not sizes or not all(1 <= b <= 4096 for b in sizes):
        raise ValueError(f"expected batch sizes between 1 and 4096, got {list(sizes)!r}")
    return sizes


def _name(name: str) -> str:
    if SEP in name or name != name.strip():
        raise ValueError(f"a group's name has no {SEP!r} and no surrounding spaces, got {name!r}")
    return name


Ints = Annotated[tuple[int, ...], BeforeValidator(_array)]


@section
class GpuGroupSettings:
    """``[gpus]``, or each ``[[gpus]]`` group: GPUs of one model and how they are partitioned."""

    model: str = setting(..., "GPU model: H100-80GB, H200, A100-80GB, A100-40GB, a CPU-<k>C, or any "
                              "GPU described by its figures", min_length=1)
    count: int = setting(..., "GPUs of this group", ge=1, le=100_000)
    name: Annotated[str, AfterValidator(_name)] = setting(
        "", "the group's name, which qualifies its segments in a node of several groups (default: "
            "the model)")
    devices: Ints | None = setting(
        None, "a node of several groups: the host's GPU indices (NVML, nvidia-smi -i) of this "
              "group's GPUs (default: the node's GPUs in file order)", toml_type="array")
    mig: bool = setting(True, "partition the GPUs with MIG (false: each GPU used whole)")
    mig_profiles: Annotated[tuple[str, ...], BeforeValidator(_array)] | None = setting(
        None, "the MIG profiles the planner may use (default: the GPU's table; `gpu`, `gpu-1of<k>` "
              "for a GPU used whole)", toml_type="array")
    mps_levels: Annotated[Ints, AfterValidator(_levels)] = setting(
        (1, 2, 3, 4), "MPS processes per segment the planner may use (1-48)", toml_type="array")
    batch_sizes: Annotated[Ints, AfterValidator(_batches)] = setting(
        PAPER_BATCH_SIZES, "max batch sizes the planner may use (1-4096)", toml_type="array")
    profiles_dir: str = setting("", "profile rows of this group's GPUs, relative to the node file "
                                    "(default: ../profiles/<model>, -whole for a GPU used whole)")
    backend: str = setting("tensorrt", "the workers' backend (one for the node: every group names "
                                       "the same)")
    memory_gb: float | None = setting(None, "framebuffer of one GPU, GB (a GPU jigsaw has no "
                                            "table of)", gt=0)
    sm_count: int | None = setting(None, "streaming multiprocessors of one GPU (a GPU jigsaw has "
                                         "no table of)", ge=1)
    fp16_tflops: float = setting(0.0, "dense FP16 tensor peak of one GPU, TFLOPS (what jigsaw "
                                      "modeled needs; 0: not given)", ge=0)
    memory_tb_s: float = setting(0.0, "memory bandwidth of one GPU, TB/s (what jigsaw modeled "
                                      "needs; 0: not given)", ge=0)
    mps_shares: int | None = setting(
        None, "k MPS processes of any (task, variant)s may share one whole GPU (2, 4 or 8; 0: off; "
              "default: the largest of mps_levels that is 2, 4 or 8)", ge=0, le=max(MPS_SHARE_LEVELS))
    mig_memory_gb: Ints | None = setting(
        None, "a MIG GPU jigsaw has no table of (A100/H100 geometry): the GB of a 1-, 2- and "
              "4-memory-slice instance, e.g. [10, 20, 40]", toml_type="array")
    mig_sm_counts: Ints | None = setting(
        None, "... and the SMs of a 1g, 2g, 3g, 4g and 7g instance, e.g. [16, 32, 60, 64, 132]",
        toml_type="array")
    mig_shares: Annotated[tuple[str, ...], BeforeValidator(_array)] | None = setting(
        None, "MIG instances k processes of any (task, variant)s may share, `<profile>-1of<k>` (k in 2, "
              "3, 4 and one of mps_levels; []: none; default: the group's smallest instance at each "
              "such k), used where they free slices", toml_type="array")


WHOLE_GPU_KEYS = ("memory_gb", "sm_count", "fp16_tflops", "memory_tb_s", "mps_shares")
"""The ``[gpus]`` keys of a GPU jigsaw has no table of (or used whole)."""
MIG_FIGURE_KEYS = ("mig_memory_gb", "mig_sm_counts")
"""The ``[gpus]`` keys that describe a MIG GPU jigsaw has no table of."""


def groups_reference() -> str:
    """The ``[gpus]`` part of docs/node-settings.md."""
    return reference(GpuGroupSettings, "gpus").replace(
        "## `[gpus]`\n", "## `[gpus]` / `[[gpus]]`\n\nOne table, or an array of tables: one group per "
        "GPU model (or way of partitioning); several groups plan as one node, their GPUs numbered "
        "in file order and their segments named `<group>:<profile>`.\n", 1)


@dataclass(frozen=True)
class GpuGroup:
    """One group of a loaded node: its GPUs, how the planner may partition them, its rows."""

    name: str
    model: GpuModel  # the GPU as it is: plain profile names (NVML, MPS, profile files)
    gpu: GpuModel  # the planner's view: its profiles qualified in a node of several groups
    count: int
    first: int  # the node's index of its first GPU
    mig_profiles: tuple[str, ...]  # the planner's names (qualified like ``gpu``'s)
    mps_levels: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    profiles_dir: Path
    backend: str
    devices: tuple[int, ...] = ()  # the host's index of each of its GPUs (default: first, first + 1, ...)

    @property
    def host_indices(self) -> tuple[int, ...]:
        """The host's GPU index (NVML, ``nvidia-smi -i``) of each of the group's GPUs."""
        return self.devices or tuple(self.gpus)

    @property
    def gpus(self) -> range:
        return range(self.first, self.first + self.count)

    @property
    def slices(self) -> int:
        return self.count * self.gpu.compute_slices


def with_qualified_profiles(model: GpuModel, group: str) -> GpuModel:
    return dataclasses.replace(model, profiles=tuple(
        dataclasses.replace(p, name=qualified(group, p.name), host=qualified(group, p.host) if p.host else "")
        for p in model.profiles))


def composite_model(groups: tuple[GpuGroup, ...]) -> GpuModel:
    """The node's GPU as the planner sees a node of several groups: every group's (qualified)
    profiles, named after the groups. Per-GPU figures are each group's (``group_of_gpu``)."""
    if len(groups) == 1:
        return groups[0].gpu
    return GpuModel("+".join(g.name for g in groups), max(g.model.memory_gb for g in groups),
                    max(g.model.sm_count for g in groups),
                    tuple(p for g in groups for p in g.gpu.profiles),
                    total_slices=max(g.gpu.compute_slices for g in groups),
                    mig=any(g.model.mig for g in groups), parts=tuple((g.gpu, g.count) for g in groups))


def group_of_gpu(groups: tuple[GpuGroup, ...], index: int) -> GpuGroup:
    for g in groups:
        if index in g.gpus:
            return g
    raise KeyError(index)


def group_of_profile(groups: tuple[GpuGroup, ...], profile: str) -> GpuGroup:
    """The group whose GPUs run segments of ``profile`` (the planner's name)."""
    if len(groups) == 1:
        return groups[0]
    name = profile.rpartition(SEP)[0]
    for g in groups:
        if g.name == name:
            return g
    raise KeyError(profile)


def load_gpu_groups(f: Fields, base: Path) -> tuple[GpuGroup, ...]:
    """The node file's ``[gpus]`` table or ``[[gpus]]`` groups (``f`` is the whole file)."""
    raw = f.raw("gpus")
    tables = f.tables("gpus") if isinstance(raw, list) else [f.sub("gpus")]
    if not tables:
        raise f.error("gpus", "expected at least one GPU group")
    several = len(tables) > 1
    groups: list[GpuGroup] = []
    first = 0
    for g in tables:
        s = load_section(GpuGroupSettings, g)
        group = _group(g, s, base, first, several)
        for other in groups:
            if other.name == group.name:
                raise g.error("name", f"two groups are named {group.name!r}: give each group a "
                                      "name (gpus.name)")
        if groups and group.backend != groups[0].backend:
            raise g.error("backend", f"{group.backend!r}, but the node's first group runs "
                                     f"{groups[0].backend!r}: a node runs one backend")
        if several and group.model.kind == "cpu":
            raise g.error("model", f"{group.model.name} is a CPU device: a CPU node has one group")
        if g.has("devices") and (not several or len(group.devices) != group.count
                                 or len(set(group.devices)) != group.count or min(group.devices) < 0):
            raise g.error("devices", f"expected {group.count} distinct GPU indices >= 0 (a node of "
                                     f"several groups only), got {list(group.devices)}")
        groups.append(group)
        first += group.count
    for i, group in enumerate(groups):
        taken = {d for other in groups[:i] for d in other.host_indices} & set(group.host_indices)
        if taken:
            raise tables[i].error("devices", f"GPU {min(taken)} of the host is another group's too: give "
                                             "each group's devices")
    return tuple(groups)


def _group(g: Fields, s: GpuGroupSettings, base: Path, first: int, several: bool) -> GpuGroup:
    model = _whole_gpu(g, s) if not s.mig else _mig_shares(g, s, _mig_gpu(g, s))
    name = s.name or model.name
    if SEP in name:
        raise g.error("name", f"{name!r} has a {SEP!r}: name the group (gpus.name)")
    gpu = with_qualified_profiles(model, name) if several else model
    # the MILPs' own profiles: MIG-instance shares are chosen after them (``planner/share_merge.py``)
    plain = list(s.mig_profiles) if s.mig_profiles is not None else \
        [p.name for p in model.profiles if not p.host]
    for i, p in enumerate(plain):
        if p not in model.profile_names:
            raise ConfigError(g.path, g.name(f"mig_profiles[{i}]"),
                              f"MIG profile {p!r} is not in the {model.name} table "
                              f"({', '.join(model.profile_names)})")
    if s.backend not in BACKENDS:
        raise g.error("backend", f"expected one of {', '.join(BACKENDS)}, got {s.backend!r}")
    default_dir = f"../profiles/{model.name.lower()}" + ("" if model.mig else "-whole")
    return GpuGroup(
        name=name, model=model, gpu=gpu, count=s.count, first=first,
        mig_profiles=tuple(qualified(name, p) if several else p for p in plain),
        mps_levels=tuple(sorted(set(s.mps_levels))), batch_sizes=tuple(sorted(set(s.batch_sizes))),
        profiles_dir=(base / (s.profiles_dir or default_dir)).resolve(), backend=s.backend,
        devices=s.devices or ())


def _known(name: str) -> GpuModel | None:
    try:
        return gpu_model(name)
    except KeyError:
        return None


def _mig_gpu(g: Fields, s: GpuGroupSettings) -> GpuModel:
    """A MIG GPU: jigsaw's table of it, or one built from the file's figures (``MIG_FIGURE_KEYS``
    with ``memory_gb``, ``sm_count`` and optionally ``fp16_tflops``, ``memory_tb_s``)."""
    known = _known(s.model)
    if known is not None:
        for key in (*WHOLE_GPU_KEYS, *MIG_FIGURE_KEYS):
            if g.has(key):
                raise g.error(key, f"{known.name}'s figures come from its MIG table (the driver's on a "
                                   "GPU node); only a GPU jigsaw has no table of takes them")
        return known
    if s.mig_memory_gb is None:
        raise g.error("model", f"unknown GPU model {s.model!r} (known: {', '.join(GPU_MODELS)}; "
                               "a MIG GPU of the A100/H100 geometry is given by memory_gb, sm_count, "
                               "mig_memory_gb, mig_sm_counts; any other GPU is used whole: mig = false, "
                               "memory_gb, sm_count)")
    if g.has("mps_shares"):
        raise g.error("mps_shares", "only a GPU used whole (mig = false) is split into MPS shares")
    mem = list(s.mig_memory_gb)
    if len(mem) != 3 or not all(x > 0 for x in mem) or mem != sorted(mem):
        raise g.error("mig_memory_gb", f"expected the whole GB of a 1-, 2- and 4-memory-slice instance, "
                                       f"ascending, e.g. [10, 20, 40], got {mem!r}")
    sms = list(s.mig_sm_counts or ())
    if len(sms) != 5 or not all(x > 0 for x in sms) or sms != sorted(sms):
        raise g.error("mig_sm_counts", f"expected the SMs of a 1g, 2g, 3g, 4g and 7g instance, ascending, "
                                       f"e.g. [16, 32, 60, 64, 132], got {sms!r}")
    if s.memory_gb is None or s.sm_count is None:
        raise g.error("memory_gb" if s.memory_gb is None else "sm_count",
                      f"missing: {s.model!r} is described by its figures")
    return mig_family_model(s.model, s.memory_gb, s.sm_count, tuple(mem), tuple(sms),  # type: ignore[arg-type]
                            fp16_tflops=s.fp16_tflops, memory_tb_s=s.memory_tb_s)


def _mig_shares(g: Fields, s: GpuGroupSettings, gpu: GpuModel) -> GpuModel:
    """``gpu`` with the MIG-instance shares ``mig_shares`` names (``<profile>-1of<k>``, e.g.
    ``["1g.10gb-1of2", "1g.10gb-1of4"]``; default ``_default_shares``): k processes of any (task,
    variant)s in one instance (``jigsaw.shares``)."""
    if s.mig_shares is None:
        return _default_shares(gpu, s)
    if not s.mig_shares:
        return gpu
    if gpu.kind != "gpu":
        raise g.error("mig_shares", "a CPU device has no MIG instances to share")
    wanted: dict[str, list[int]] = {}
    for i, name in enumerate(s.mig_shares):
        host, k = share_host(name), share_level(name)
        if not host or host not in gpu.profile_names or k not in MIG_SHARE_LEVELS:
            raise ConfigError(g.path, g.name(f"mig_shares[{i}]"),
                              f"expected '<profile>-1of<k>' with a profile of the {gpu.name} table and k in "
                              f"{list(MIG_SHARE_LEVELS)}, got {name!r}")
        if k not in s.mps_levels:
            raise ConfigError(g.path, g.name(f"mig_shares[{i}]"), f"{name}: {k} is not one of the node's "
                              f"mps_levels {list(s.mps_levels)} (a share's rows are its instance's at "
                              "that level)")
        wanted.setdefault(host, []).append(k)
    for host, ks in wanted.items():
        gpu = with_mig_shares(gpu, ks, [host])
    return gpu


def _default_shares(gpu: GpuModel, s: GpuGroupSettings) -> GpuModel:
    """``gpu`` with its smallest instance (fewest compute slices, then least memory) of those the
    planner may use shared at every k of ``MIG_SHARE_LEVELS`` among ``mps_levels``: the share
    pass uses them only where they free slices (``planner/share_merge.py``). Per group: in a node
    of several groups each MIG group shares its own smallest instance at its own levels (the
    profiles are qualified after this, so a share's host stays in its group). Why the smallest:
    a share is one process; a task that fills more than a small instance's k-th is served as
    well by its own segments."""
    allowed = set(s.mig_profiles) if s.mig_profiles is not None else set(gpu.profile_names)
    plain = [p for p in gpu.profiles if p.name in allowed and not p.host and not p.share_of]
    levels = [k for k in MIG_SHARE_LEVELS if k in s.mps_levels]
    if gpu.kind != "gpu" or not plain or not levels:
        return gpu
    smallest = min(plain, key=lambda p: (p.compute_slices, p.memory_gb))
    return with_mig_shares(gpu, levels, [smallest.name])


def _whole_gpu(g: Fields, s: GpuGroupSettings) -> GpuModel:
    """A GPU without MIG (``mig = false``): a known MIG GPU with MIG off, or any GPU whose
    ``memory_gb`` and ``sm_count`` the file gives (and, to be modeled, its FP16 peak and memory
    bandwidth)."""
    for key in (*MIG_FIGURE_KEYS, "mig_shares"):
        if g.has(key):
            raise g.error(key, "a GPU used whole (mig = false) has no MIG instances (its MPS shares "
                               "are mps_shares)")
    known = _known(s.model)
    if known is not None and known.kind == "cpu":
        raise g.error("mig", f"{s.model} is a CPU device; mig applies to GPUs")
    for key in ("memory_gb", "sm_count"):
        if known is None and getattr(s, key) is None:
            raise g.error(key, f"missing: {s.model!r} is not a GPU jigsaw knows, so a GPU used "
                               "whole gives its memory_gb and sm_count")
    memory_gb = s.memory_gb if s.memory_gb is not None else known.memory_gb  # type: ignore[union-attr]
    sm_count = s.sm_count if s.sm_count is not None else known.sm_count  # type: ignore[union-attr]
    levels = s.mps_levels
    shares = s.mps_shares if s.mps_shares is not None else \
        max((k for k in levels if k in MPS_SHARE_LEVELS), default=0)
    if shares and shares not in MPS_SHARE_LEVELS:
        raise g.error("mps_shares", f"expected 0 (off) or one of {list(MPS_SHARE_LEVELS)}, got {shares}")
    if shares and shares not in levels:
        raise g.error("mps_shares", f"{shares} is not one of the group's mps_levels {list(levels)}: a "
                                    "share's profile rows are the whole GPU's at that level")
    return whole_gpu_model(known.name if known else s.model, memory_gb, sm_count, shares=shares,
                           fp16_tflops=s.fp16_tflops, memory_tb_s=s.memory_tb_s)
