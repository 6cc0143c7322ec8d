"""MPS: one ``nvidia-cuda-mps-control -d`` per MIG instance, or per whole GPU, that runs k > 1 processes.

An MPS control daemon serves the clients that share its pipe directory, so each MIG instance (on a
node with ``mig = false``: each GPU) gets its own ``CUDA_MPS_PIPE_DIRECTORY`` and
``CUDA_MPS_LOG_DIRECTORY`` under a private run directory (owner-only, 0700: whoever can reach the
pipe can submit work to the device), and the daemon sees only its device
(``CUDA_VISIBLE_DEVICES=MIG-<uuid>`` or ``GPU-<uuid>``). It is started before the k worker
processes and stopped (``quit`` on its control pipe) after them; the generation manager
(``runtime/mps_daemons.py``) keeps that order. Without a daemon, the k processes of a whole GPU
would time-share it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jigsaw.errors import JigsawError
from jigsaw.gpu.layout import NodeInstance, NodeLayout, Slot
from jigsaw.mig import WHOLE_GPU, GpuModel

MPS_CONTROL = "nvidia-cuda-mps-control"


class MpsError(JigsawError):
    """An MPS control daemon could not be started or stopped; ``step`` says which."""

    def __init__(self, message: str, step: str = "") -> None:
        super().__init__(message)
        self.step = step


def default_run_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    return Path(base) / f"jigsaw-mps-{os.getuid()}"


def private_dir(path: Path) -> Path:
    """Creates ``path`` (and parents) owner-only; refuses one owned by another user."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise MpsError(f"{path}: not a directory", step="run directory")
    if st.st_uid != os.getuid():
        raise MpsError(
            f"{path}: owned by uid {st.st_uid}, not by this user ({os.getuid()}): "
            "choose another MPS run directory",
            step="run directory",
        )
    if stat.S_IMODE(st.st_mode) != 0o700:
        path.chmod(0o700)
    return path


@dataclass(frozen=True)
class MpsDaemon:
    slot: Slot
    directory: Path
    env: Mapping[str, str]  # what the daemon and its clients run with


class MpsManager:
    """The MPS control daemons of a node, one per MIG instance with MPS level k > 1."""

    def __init__(
        self, run_dir: Path | None = None, binary: str = MPS_CONTROL, timeout_s: float = 10.0
    ) -> None:
        self.run_dir = Path(run_dir) if run_dir is not None else default_run_dir()
        self.binary = binary
        self.timeout_s = timeout_s
        self.daemons: dict[Slot, MpsDaemon] = {}

    def _dir(self, inst: NodeInstance) -> Path:
        return self.run_dir / f"gpu{inst.gpu}-start{inst.start}-{inst.device_slot[2]}"

    def client_env(self, inst: NodeInstance) -> dict[str, str]:
        """The variables a worker process of ``inst`` needs to reach its instance's daemon (a share
        of a MIG instance: the instance's, ``NodeInstance.device_slot``)."""
        d = self.daemons.get(inst.device_slot)
        if d is None:
            return {}
        return {k: d.env[k] for k in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")}

    def _run(self, env: Mapping[str, str], args: list[str], stdin: str | None, step: str) -> None:
        try:
            done = subprocess.run(
                [self.binary, *args],
                env=dict(env),
                input=stdin,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except FileNotFoundError:
            raise MpsError(
                f"{self.binary} not found: MPS needs the NVIDIA driver's MPS control binary on PATH",
                step=step,
            ) from None
        except subprocess.TimeoutExpired:
            raise MpsError(
                f"`{self.binary} {' '.join(args)}` did not return within {self.timeout_s:g} s", step=step
            ) from None
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip().splitlines()
            raise MpsError(
                f"`{self.binary} {' '.join(args)}` failed (exit {done.returncode})"
                f"{': ' + why[-1] if why else ''}",
                step=step,
            )

    def start(self, inst: NodeInstance) -> MpsDaemon:
        """Starts the daemon of ``inst`` (a MIG instance or a whole GPU, with its UUID) and waits for
        its control pipe."""
        if inst.device_slot in self.daemons:
            return self.daemons[inst.device_slot]
        if not inst.uuid:
            what = "GPU" if inst.profile == WHOLE_GPU else "MIG"
            raise MpsError(f"{inst.name}: no {what} UUID to start an MPS daemon on", step="start_mps")
        private_dir(self.run_dir)
        directory = self._dir(inst)
        if directory.exists():  # a leftover of a daemon that died with its node
            shutil.rmtree(directory, ignore_errors=True)
        pipe, log = private_dir(directory / "pipe"), private_dir(directory / "log")
        directory.chmod(0o700)
        env = {
            **os.environ,
            "CUDA_VISIBLE_DEVICES": inst.uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(log),
        }
        try:
            self._run(env, ["-d"], None, "start_mps")
            deadline = time.monotonic() + self.timeout_s
            while not (pipe / "control").exists():
                if time.monotonic() > deadline:
                    raise MpsError(
                        f"{inst.name}: the MPS daemon made no control pipe in {pipe} within "
                        f"{self.timeout_s:g} s (see {log})",
                        step="start_mps",
                    )
                time.sleep(0.01)
        except MpsError:
            # a daemon that started but did not come up is told to quit; nothing is left behind
            with contextlib.suppress(MpsError):
                self._run(env, [], "quit\n", "stop_mps")
            shutil.rmtree(directory, ignore_errors=True)
            raise
        daemon = MpsDaemon(inst.device_slot, directory, env)
        self.daemons[inst.device_slot] = daemon
        return daemon

    def stop(self, inst: NodeInstance) -> None:
        """Tells the daemon of ``inst`` to quit (its clients must be gone) and removes its directory."""
        daemon = self.daemons.get(inst.device_slot)
        if daemon is None:
            return
        self._run(daemon.env, [], "quit\n", "stop_mps")
        del self.daemons[inst.device_slot]
        shutil.rmtree(daemon.directory, ignore_errors=True)

    def stop_all(self) -> list[str]:
        """Stops every daemon; returns the errors (shutdown goes on past one that fails)."""
        errors = []
        for slot, daemon in list(self.daemons.items()):
            try:
                self._run(daemon.env, [], "quit\n", "stop_mps")
            except MpsError as exc:
                errors.append(str(exc))
            self.daemons.pop(slot, None)
            shutil.rmtree(daemon.directory, ignore_errors=True)
        return errors


class EmulatedMps(MpsManager):
    """The MPS manager of the emulated node: the same private directories, order and checks, with
    the control daemon's start and quit done in-process (there is no driver to run it)."""

    def __init__(self, run_dir: Path | None = None) -> None:
        super().__init__(run_dir, binary="emulated-mps-control")

    def _run(self, env: Mapping[str, str], args: list[str], stdin: str | None, step: str) -> None:
        control = Path(env["CUDA_MPS_PIPE_DIRECTORY"]) / "control"
        if args == ["-d"]:
            control.touch(mode=0o600)
        elif stdin and stdin.strip() == "quit":
            control.unlink(missing_ok=True)


class WholeGpus:
    """The GPUs of a node that uses them whole (``mig = false``) as the instances its MPS daemons are
    keyed by: one per GPU (profile ``gpu``, start 0, as the planner lays a whole GPU out) with the
    GPU's ``GPU-<uuid>`` from NVML, read once, when the first daemon is needed. ``indices``: the
    GPUs used whole on a node of several GPU groups (default: every GPU), ``hosts`` the host's
    index of each (default: the same)."""

    def __init__(self, gpu_model: str, num_gpus: int, nvml: Any = None,
                 indices: tuple[int, ...] | None = None, hosts: tuple[int, ...] | None = None) -> None:
        self.gpu_model = gpu_model
        self.num_gpus = num_gpus
        self._nvml = nvml
        self._layout: NodeLayout | None = None
        self.indices = tuple(range(num_gpus)) if indices is None else indices
        self.hosts = hosts or self.indices

    def has(self, gpu: int) -> bool:
        return gpu in self.indices

    def layout(self) -> NodeLayout:
        if self._layout is None:
            from jigsaw.gpu.nvml import MigError, gpu_uuids

            try:
                uuids = gpu_uuids(max(self.hosts, default=-1) + 1, self._nvml)
            except MigError as exc:
                raise MpsError(f"MPS on whole GPUs: {exc}", step="start_mps") from None
            self._layout = NodeLayout(self.gpu_model, self.num_gpus, tuple(
                NodeInstance(gpu=g, profile=WHOLE_GPU, start=0, uuid=uuids[h])
                for g, h in zip(self.indices, self.hosts, strict=True)))
        return self._layout


def node_mps(gpu: GpuModel, num_gpus: int, run_dir: Path, *, emulated: bool, on_gpus: bool,
             partitioned: bool, binary: str = "", nvml: Any = None, whole_gpus: tuple[int, ...] = (),
             whole_hosts: tuple[int, ...] = ()) -> tuple[MpsManager | None, WholeGpus | None]:
    """The MPS control daemons a node runs: one per MIG instance of MPS level k > 1 on a partitioned
    node, one per GPU that runs k > 1 processes on a node using its GPUs whole (``WholeGpus``, the
    instances to key them by), none on a CPU node or where the backend's workers neither run on the
    GPUs (``on_gpus``) nor emulate them. The driver's control binary (``binary``, else
    ``nvidia-cuda-mps-control``) on a GPU node; on an emulated node a stand-in script when
    ``binary`` names one, else the in-process emulation. ``whole_gpus``: on a partitioned node
    of several GPU groups, the GPUs used whole (one daemon per GPU for those), ``whole_hosts`` the
    host's index of each."""
    whole = gpu.kind == "gpu" and (not gpu.mig or bool(whole_gpus)) and (emulated or on_gpus)
    if not partitioned and not whole:
        return None, None
    manager = EmulatedMps(run_dir) if emulated and not binary else \
        MpsManager(run_dir, binary=binary or MPS_CONTROL)
    if not whole:
        return manager, None
    if nvml is None and emulated:
        from jigsaw.gpu.emulated_nvml import EmulatedNvml

        nvml = EmulatedNvml(gpu, num_gpus, mig_enabled=False)
    return manager, WholeGpus(gpu.name, num_gpus, nvml, whole_gpus or None,
                              None if emulated else whole_hosts or None)
