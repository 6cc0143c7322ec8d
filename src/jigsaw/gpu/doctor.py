"""``jigsaw doctor``: what a GPU node lacks before ``jigsawd`` can partition and serve on it.

Read-only: it initialises NVML, reads the driver version, the GPUs and their MIG mode, every
GPU-instance profile the driver reports (beside ``jigsaw.mig``'s table: where they differ
``jigsawd`` plans with the driver's figures), looks for the MPS control binary and checks the
permissions MIG needs; it never changes a GPU. Each check is one line (``ok``, ``FAIL`` or
``warn``) saying what was found and, when something is missing, what to do. A node that uses its
GPUs whole (``mig = false``) wants MIG mode off and no MIG permissions.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jigsaw.gpu.mps import MPS_CONTROL, default_run_dir
from jigsaw.gpu.nvml import MigError, read_driver_table
from jigsaw.gpu_groups import group_of_gpu
from jigsaw.mig import GPU_MODELS, GpuModel
from jigsaw.node import Node

MIG_CONFIG_CAPABILITY = Path("/proc/driver/nvidia/capabilities/mig/config")


@dataclass(frozen=True)
class Check:
    status: str  # "ok" | "FAIL" | "warn"
    what: str
    detail: str

    def line(self) -> str:
        return f"{self.status:<5} {self.what:<12} {self.detail}"


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def diagnose(
    node: Node,
    nvml: Any = None,
    which: Callable[[str], str | None] = shutil.which,
    euid: int | None = None,
    mig_capability: Path = MIG_CONFIG_CAPABILITY,
    run_dir: Path | None = None,
) -> list[Check]:
    """The checks of a node (``nvml``: the pynvml module, or a stand-in with its functions)."""
    checks: list[Check] = []
    if node.gpu.kind == "cpu":
        return [
            Check("ok", "node", f"{node.name} is a CPU node ({node.gpu.name}): no GPU, NVML or MPS needed")
        ]
    checks.append(
        Check("ok", "node", f"{node.name}: {node.gpus_text}, backend {node.backend}")
    )
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            checks.append(
                Check(
                    "FAIL",
                    "nvml",
                    "the NVML Python binding is not installed: pip install 'jigsaw[gpu]' (nvidia-ml-py)",
                )
            )
            nvml = None
    if nvml is not None:
        checks += _nvml_checks(node, nvml)
    needs_mps = any(k > 1 for k in node.mps_levels)
    binary = which(MPS_CONTROL)
    if binary:
        checks.append(Check("ok", "mps", f"{MPS_CONTROL} at {binary}"))
    elif needs_mps:
        checks.append(
            Check(
                "FAIL",
                "mps",
                f"{MPS_CONTROL} not on PATH: MPS levels {list(node.mps_levels)} need it "
                "(it ships with the NVIDIA driver; or set gpus.mps_levels = [1])",
            )
        )
    else:
        checks.append(Check("ok", "mps", "not needed (MPS level 1 only)"))
    uid = os.geteuid() if euid is None else euid
    if not node.gpu.mig:
        checks.append(Check("ok", "permissions", "no MIG management needed: the node uses its GPUs whole"))
    elif uid == 0:
        checks.append(
            Check("ok", "permissions", "running as root: MIG instances can be created and destroyed")
        )
    elif os.access(mig_capability, os.R_OK):
        checks.append(
            Check(
                "ok", "permissions", f"not root, but {mig_capability} is readable (MIG management capability)"
            )
        )
    else:
        checks.append(
            Check(
                "FAIL",
                "permissions",
                f"not root and no access to {mig_capability}: creating and destroying MIG instances "
                "needs root (run jigsawd as root, or grant the mig/config capability)",
            )
        )
    directory = run_dir or default_run_dir()
    checks.append(_run_dir_check(directory))
    return checks


def _run_dir_check(directory: Path) -> Check:
    """The MPS run directory must be private to this user (checked, not created)."""
    if directory.exists():
        st = directory.lstat()
        if not directory.is_dir() or directory.is_symlink():
            return Check("FAIL", "run dir", f"{directory} is not a directory")
        if st.st_uid != os.getuid():
            return Check("FAIL", "run dir", f"{directory} is owned by uid {st.st_uid}, not by this user")
        mode = st.st_mode & 0o777
        note = "" if mode == 0o700 else f" (mode {mode:o}: jigsawd makes it 700)"
        return Check("ok", "run dir", f"{directory}: private MPS pipe and log directories go here{note}")
    parent = directory.parent
    if os.access(parent, os.W_OK | os.X_OK):
        return Check(
            "ok", "run dir", f"{directory} will be created owner-only for the MPS pipe and log directories"
        )
    return Check(
        "FAIL", "run dir", f"{parent} is not writable: no place for the MPS run directory {directory.name}"
    )


def _nvml_checks(node: Node, nvml: Any) -> list[Check]:
    checks: list[Check] = []
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        code = getattr(exc, "value", None)
        if code in (
            getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", 12),
            getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", 9),
        ):
            why = (
                "no NVIDIA driver on this machine (libnvidia-ml not found or driver not loaded): "
                "no usable GPU"
            )
        else:
            why = f"NVML did not start: {exc}"
        return [Check("FAIL", "driver", why), Check("FAIL", "gpus", "cannot list GPUs without NVML")]
    try:
        checks.append(
            Check("ok", "driver", f"NVIDIA driver {_text(nvml.nvmlSystemGetDriverVersion())}, NVML loaded")
        )
        count = int(nvml.nvmlDeviceGetCount())
        hosts = [node.host_index(g) for g in range(node.num_gpus)]
        if count < node.num_gpus or max(hosts, default=-1) >= count:
            checks.append(
                Check("FAIL", "gpus", f"{count} GPU(s) found, the node config asks for {node.num_gpus}"
                      + ("" if hosts == list(range(node.num_gpus)) else f" (host indices {hosts})"))
            )
        else:
            checks.append(Check("ok", "gpus", f"{count} GPU(s) found, the node uses {node.num_gpus}"))
        for g in range(node.num_gpus):
            if hosts[g] < count:
                checks.append(_mig_mode_check(node, nvml, g))
        if count:
            checks += _mig_table_checks(node, nvml)
    except nvml.NVMLError as exc:
        checks.append(Check("FAIL", "gpus", f"reading the GPUs failed: {exc}"))
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
    return checks


def _mig_mode_check(node: Node, nvml: Any, g: int) -> Check:
    """GPU ``g``'s MIG mode: on for a partitioned node (or GPU group), off for one that uses its
    GPUs whole; on a node of several GPU groups, against the group GPU ``g`` is in (file order)."""
    h = node.host_index(g)  # its index on the host (a group's devices)
    dev = nvml.nvmlDeviceGetHandleByIndex(h)
    name = _text(nvml.nvmlDeviceGetName(dev))
    model = group_of_gpu(node.gpu_groups, g).model if node.is_mixed else node.gpu
    model_note = "" if _same_model(name, model.name) else f" (node config says {model.name})"
    try:
        current, pending = nvml.nvmlDeviceGetMigMode(dev)
    except nvml.NVMLError as exc:
        if not model.mig:
            return Check("ok", f"gpu {g}", f"{name}{model_note}: no MIG support, used whole")
        return Check("FAIL", f"gpu {g}", f"{name}: no MIG support ({exc})")
    on = nvml.NVML_DEVICE_MIG_ENABLE
    what, gpu = f"gpu {g}", f"{name}{model_note}" + (f" (host GPU {h})" if h != g else "")
    if not model.mig:
        if current == on:
            return Check("FAIL", what, f"{gpu}: MIG mode on, but the node uses its GPUs whole (mig = false): "
                         f"turn it off (`sudo nvidia-smi -i {h} -mig 0`) or set mig = true")
        return Check("ok", what, f"{gpu}: MIG mode off, used whole")
    if current == on:
        return Check("ok", what, f"{gpu}: MIG mode on")
    if pending == on:
        return Check("FAIL", what, f"{gpu}: MIG mode enabled but pending: reset the GPU or reboot")
    return Check("FAIL", what, f"{gpu}: MIG mode off: run `sudo nvidia-smi -i {h} -mig 1`, "
                 "then reset the GPU")


def _mig_table_checks(node: Node, nvml: Any) -> list[Check]:
    """Every GPU-instance profile the driver reports for GPU 0, one line each beside the table's
    figures: a partitioned node plans with the driver's where they differ (``warn``); for a node
    using its GPUs whole the table of its model, where jigsaw has one, is shown for reference."""
    if node.is_mixed:
        return [Check("ok", "mig table", "several GPU groups: jigsawd reads each MIG group's table "
                                         "from its first GPU at start")]
    model: GpuModel | None = node.gpu if node.gpu.mig else GPU_MODELS.get(node.gpu.name)
    if model is None:
        return [Check("ok", "mig table", f"{node.gpu.name}: used whole, no MIG table to check")]
    try:
        table = read_driver_table(model, nvml)
    except MigError as exc:
        status = "FAIL" if node.gpu.mig else "warn"
        return [Check(status, "mig table", f"reading the driver's profiles: {exc}")]
    used = node.gpu.mig
    differs = {line.split(":", 1)[0] for line in table.differences}
    checks = []
    for d in table.profiles:
        what = f"mig {d.name}"
        if d.max_per_gpu == 0:
            said = "not offered by the driver" + (": jigsawd never places it" if used else "")
            checks.append(Check("warn" if used else "ok", what, said))
            continue
        p = model.profile(d.name)
        said = (f"driver: {d.slices} slice(s), {d.memory_mib} MiB, {d.sm_count} SMs, {d.max_per_gpu} per GPU")
        if d.name not in differs:
            checks.append(Check("ok", what, said + " (as the table)"))
            continue
        table_said = f"table: {p.memory_gb:g} GB, {p.sm_count} SMs, {p.max_per_gpu} per GPU"
        tail = ": jigsawd plans with the driver's" if used else " (MIG off: for reference)"
        checks.append(Check("warn" if used else "ok", what, f"{said}; {table_said}{tail}"))
    checks += [Check("ok", "mig table", f"{line}") for line in table.unknown]
    return checks


def _same_model(device_name: str, model: str) -> bool:
    """Loose match of NVML's name ("NVIDIA H100 80GB HBM3") and the table's ("H100-80GB")."""
    tokens = model.lower().replace("-", " ").split()
    name = device_name.lower()
    return all(t in name for t in tokens)


def format_checks(checks: list[Check]) -> str:
    return "\n".join(c.line() for c in checks)


def failed(checks: list[Check]) -> bool:
    return any(c.status == "FAIL" for c in checks)
