"""``jigsaw profile`` on a GPU node: every MIG profile x MPS level, measured inside a real instance.

A node of whole GPUs (``mig = false``) has one segment profile, the GPU: its MPS levels are
measured the same way on a GPU with MIG off (no instance is created; the copies see the GPU).

For each profile the orchestrator creates one MIG instance on a GPU that has none
(``nvidia-smi mig -cgi <profile> -C``), and for each MPS level k starts an MPS control daemon
private to that instance and runs k measuring copies of ``jigsaw profile --inside`` at once,
each seeing only the instance (``CUDA_VISIBLE_DEVICES=MIG-<uuid>``). The copies time every row
together (a file barrier); the segment's row has the sum of their throughputs and the worst of
their p95 latencies. The daemon is stopped and the instance destroyed whatever happens, so an
interrupted run leaves the GPU as it found it; rows already in the profile files are skipped, so
a rerun resumes. Needs the NVIDIA driver tools, root (MIG) and MIG mode enabled on the GPU.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jigsaw.errors import JigsawError
from jigsaw.profiling import (
    Progress,
    append_row,
    copy_argv,
    host_description,
    merge_copies,
    read_done,
    report_skipped,
    run_copies,
)

Run = Callable[..., str]
"""``run(argv, env=None, stdin=None) -> stdout``; raises JigsawError when the command fails."""

COMMAND_TIMEOUT_S = 120.0


def run_command(argv: Sequence[str], env: dict[str, str] | None = None, stdin: str | None = None) -> str:
    try:
        done = subprocess.run(list(argv), env=env, input=stdin, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise JigsawError(f"{argv[0]} not found: profiling GPU segments needs the NVIDIA driver tools "
                          "on a machine with the GPU") from None
    except subprocess.TimeoutExpired:
        raise JigsawError(f"`{' '.join(argv)}` did not finish within {COMMAND_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise JigsawError(f"`{' '.join(argv)}` failed (exit {done.returncode}): {why[-1] if why else ''}")
    return done.stdout


@dataclass(frozen=True)
class MigInstance:
    gpu: int
    gpu_instance: int
    compute_instance: int
    uuid: str


def create_instance(run: Run, gpu: int, profile: str) -> MigInstance:
    """A GPU instance of ``profile`` with its default compute instance, on a GPU that has none."""
    try:
        listing = run(["nvidia-smi", "mig", "-lgi", "-i", str(gpu)])
    except JigsawError as exc:  # nvidia-smi exits non-zero when there are none
        if "No GPU instances found" not in str(exc):
            raise
        listing = ""
    if re.search(r"MIG\s+\d+g", listing):
        raise JigsawError(f"GPU {gpu} already has MIG instances: profile on a GPU without any "
                          "(--gpu N), so no other work shares the measurement")
    out = run(["nvidia-smi", "mig", "-i", str(gpu), "-cgi", profile, "-C"])
    gi = re.search(r"created GPU instance ID\s+(\d+)", out)
    ci = re.search(r"created compute instance ID\s+(\d+)", out)
    if not gi or not ci:
        raise JigsawError(f"nvidia-smi did not report the instance it created: {out.strip()!r}")
    instance = MigInstance(gpu, int(gi.group(1)), int(ci.group(1)), "")
    try:
        uuid = _mig_uuid(run(["nvidia-smi", "-L"]), gpu, profile)
    except JigsawError:
        destroy_instance(run, instance)
        raise
    return MigInstance(gpu, instance.gpu_instance, instance.compute_instance, uuid)


def _mig_uuid(listing: str, gpu: int, profile: str) -> str:
    """The UUID of GPU ``gpu``'s (only) MIG device of ``profile`` in ``nvidia-smi -L`` output."""
    current = None
    for line in listing.splitlines():
        m = re.match(r"GPU (\d+):", line.strip())
        if m:
            current = int(m.group(1))
            continue
        m = re.search(r"MIG\s+(\S+)\s+Device\s+\d+:\s+\(UUID:\s*(MIG-[^)\s]+)\)", line)
        if m and current == gpu and m.group(1) == profile:
            return m.group(2)
    raise JigsawError(f"nvidia-smi -L lists no {profile} MIG device on GPU {gpu}")


def whole_gpu(run: Run, gpu: int) -> MigInstance:
    """GPU ``gpu`` used whole (a node with ``mig = false``): its UUID; refused while it has MIG
    devices, whose work would share the measurement (turn MIG off: ``nvidia-smi -i N -mig 0``)."""
    current, uuid, mig = None, "", False
    for line in run(["nvidia-smi", "-L"]).splitlines():
        m = re.match(r"GPU (\d+):.*\(UUID:\s*(GPU-[^)\s]+)\)", line.strip())
        if m:
            current = int(m.group(1))
            if current == gpu:
                uuid = m.group(2)
            continue
        if current == gpu and re.search(r"\bMIG\b", line):
            mig = True
    if not uuid:
        raise JigsawError(f"nvidia-smi -L lists no GPU {gpu}")
    if mig:
        raise JigsawError(f"GPU {gpu} has MIG devices: a whole-GPU node is measured on a GPU with MIG "
                          "off (destroy its instances and run nvidia-smi -i N -mig 0), or pick another --gpu")
    return MigInstance(gpu, -1, -1, uuid)


def destroy_instance(run: Run, instance: MigInstance) -> None:
    if instance.gpu_instance < 0:  # a whole GPU: nothing was created
        return
    gpu, gi = str(instance.gpu), str(instance.gpu_instance)
    run(["nvidia-smi", "mig", "-dci", "-i", gpu, "-gi", gi, "-ci", str(instance.compute_instance)])
    run(["nvidia-smi", "mig", "-dgi", "-i", gpu, "-gi", gi])


def mps_env(instance: MigInstance, directory: Path) -> dict[str, str]:
    """The environment of an MPS daemon and its clients, private to one instance."""
    (directory / "pipe").mkdir(parents=True, exist_ok=True)
    (directory / "log").mkdir(parents=True, exist_ok=True)
    return {**os.environ, "CUDA_VISIBLE_DEVICES": instance.uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(directory / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(directory / "log")}


def profile_gpu(node: Any, app_path: str | Path | None, kinds: dict[str, str], wanted: list[str],
                batch_list: list[int], out_dir: Path, *, seconds: float = 2.0, max_iters: int = 50,
                gpu: int = 0, segments: Sequence[str] = (), mps_levels: Sequence[int] = (),
                backend: str | None = None, run: Run = run_command,
                python: Sequence[str] = (sys.executable, "-m", "jigsaw.cli")) -> list[Path]:
    """Measures the node's missing (segment, MPS level, batch) rows of ``wanted`` into ``out_dir``."""
    # MPS shares are not measured alone: their rows derive from their host's (``jigsaw.shares``)
    segs = list(segments) or [p for p in node.mig_profiles if not node.gpu.profile(p).share_of]
    levels = sorted(set(mps_levels or node.mps_levels))
    bad = [s for s in segs if s not in node.mig_profiles]
    if bad:
        raise JigsawError(f"--segments: {', '.join(bad)} not among the node's MIG profiles")
    out_dir.mkdir(parents=True, exist_ok=True)
    done = {key for v in wanted for key in read_done(out_dir / f"{v}.csv")}
    groups = []
    for seg in segs:
        for k in levels:
            todo = [v for v in wanted for b in batch_list if (v, seg, k, b) not in done]
            if todo:
                groups.append((seg, k, list(dict.fromkeys(todo))))
    if not groups:
        print("jigsaw profile: every row is already measured", file=sys.stderr)
        return [out_dir / f"{v}.csv" for v in wanted]
    host = f"{host_description()} {node.gpu.name} {'MIG' if node.gpu.mig else 'whole GPU'}"
    date = dt.date.today().isoformat()
    progress = Progress(len(groups))
    skipped: list[str] = []
    try:
        for seg in dict.fromkeys(s for s, _, _ in groups):
            instance = create_instance(run, gpu, seg) if node.gpu.mig else whole_gpu(run, gpu)
            try:
                for s, k, todo in groups:
                    if s != seg:
                        continue
                    with tempfile.TemporaryDirectory(prefix="jigsaw-profile-") as tmp:
                        rows = _measure_level(run, node, app_path, instance, seg, k, todo, batch_list,
                                              Path(tmp), backend, seconds, max_iters, python, skipped)
                    for (v, sg, mps, b), (lat, thr, mem, backend_name, described) in sorted(rows.items()):
                        if (v, sg, mps, b) not in done:
                            append_row(out_dir / f"{v}.csv", [v, sg, mps, b, lat, thr, mem, "measured", host,
                                                              backend_name, date, described])
                    progress.step(f"{seg} mps{k}: {len(rows)} rows")
            finally:
                destroy_instance(run, instance)
    finally:
        progress.close()
    report_skipped(skipped)
    return [out_dir / f"{v}.csv" for v in wanted]


def _measure_level(run: Run, node: Any, app_path: str | Path | None, instance: MigInstance, seg: str, k: int,
                   variants: list[str], batch_list: list[int], tmp: Path, backend: str | None,
                   seconds: float, max_iters: int, python: Sequence[str],
                   skipped: list[str] | None = None) -> dict[Any, list[str]]:
    env = mps_env(instance, tmp)
    run(["nvidia-cuda-mps-control", "-d"], env=env)
    try:
        argvs = [copy_argv(python, node, app_path, seg, k, rank, tmp, variants, batch_list, backend,
                           seconds, max_iters) for rank in range(k)]
        run_copies(argvs, env, f"{seg} at MPS level {k}")
    finally:
        run(["nvidia-cuda-mps-control"], env=env, stdin="quit\n")
    rows: dict[Any, list[str]] = {}
    for v in variants:
        rows.update(merge_copies([tmp / f"rank-{r}" / f"{v}.csv" for r in range(k)], throughput="sum",
                                 skipped=skipped))
    return rows
