"""The driver is the truth: the GPU-instance profiles NVML reports, answered by the emulated NVML as
the binding answers them, reported by ``jigsaw doctor`` and used by the daemon where they differ
from ``jigsaw.mig``'s table. The real H200's answers (``../shared/data/gpu/``) are fed through."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jigsaw.gpu import emulated_nvml as fake
from jigsaw.gpu.doctor import diagnose, failed, format_checks
from jigsaw.gpu.emulated_nvml import EmulatedNvml, answers_from_dump
from jigsaw.gpu.nvml import MigError, driver_node, read_driver_table
from jigsaw.mig import DRIVER_TABLE_ENV, DriverTableError, gpu_model
from jigsaw.node import load_node

ROOT = Path(__file__).resolve().parents[2]
# ../shared/data beside the checkout (a worktree one level deeper finds it one level up)
GPU_DATA = next((d / "shared" / "data" / "gpu" for d in (ROOT.parent, ROOT.parent.parent)
                 if (d / "shared" / "data" / "gpu").is_dir()), ROOT.parent / "shared" / "data" / "gpu")
H200_DUMP = GPU_DATA / "h200-nvml-gi-profiles.json"
needs_dump = pytest.mark.skipif(not H200_DUMP.exists(),
                                reason=f"the real H200's NVML answers are not at {H200_DUMP}")


def _node(tmp_path: Path, mig: bool) -> Path:
    path = tmp_path / f"h200-{'mig' if mig else 'whole'}.toml"
    path.write_text(f"""
name = "h200"
apps = []
[gpus]
model = "H200"
{"" if mig else "mig = false"}
count = 1
mps_levels = [1, 2, 4]
batch_sizes = [1, 8, 32]
profiles_dir = "profiles"
backend = "tensorrt"
""")
    return path


@pytest.fixture(autouse=True)
def _no_exported_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DRIVER_TABLE_ENV, "")  # what a test's driver_node exports is undone after it


def test_profile_info_answers_as_the_binding_does() -> None:
    pynvml = pytest.importorskip("pynvml")
    for name, value in vars(fake).items():  # names and codes of nvidia-ml-py
        if name.startswith(("NVML_GPU_INSTANCE_PROFILE_", "NVML_ERROR_", "NVML_DEVICE_MIG_")):
            assert getattr(pynvml, name) == value, name
    for struct in ("c_nvmlGpuInstanceProfileInfo_t", "c_nvmlGpuInstanceProfileInfo_v2_t"):
        assert getattr(fake, struct)._fields_ == [(n, t) for n, t in getattr(pynvml, struct)._fields_], struct
    assert fake.nvmlGpuInstanceProfileInfo_v2 == pynvml.nvmlGpuInstanceProfileInfo_v2

    h100 = gpu_model("H100-80GB")
    nvml = EmulatedNvml(h100, 1, mig_enabled=False)
    dev = nvml._gpus[0].handle
    with pytest.raises(fake.NVMLError) as err:
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(dev, fake.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    assert err.value.value == fake.NVML_ERROR_UNINITIALIZED
    nvml.nvmlInit()
    # MIG off: the driver still describes every profile it offers (the real H200 did)
    info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(dev, fake.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2)
    assert (info.version, info.id, info.sliceCount, info.memorySizeMB, info.multiprocessorCount,
            info.instanceCount, info.name) == (fake.nvmlGpuInstanceProfileInfo_v2, 0x9, 1, 20480, 16, 4,
                                               b"MIG 1g.20gb")
    v1 = nvml.nvmlDeviceGetGpuInstanceProfileInfo(dev, fake.NVML_GPU_INSTANCE_PROFILE_3_SLICE, version=1)
    assert isinstance(v1, fake.c_nvmlGpuInstanceProfileInfo_t) and v1.memorySizeMB == 40960
    for profile, version, code in (
            (fake.NVML_GPU_INSTANCE_PROFILE_6_SLICE, 2, fake.NVML_ERROR_NOT_SUPPORTED),
            (fake.NVML_GPU_INSTANCE_PROFILE_COUNT, 2, fake.NVML_ERROR_INVALID_ARGUMENT),
            (fake.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 3, fake.NVML_ERROR_FUNCTION_NOT_FOUND)):
        with pytest.raises(fake.NVMLError) as err:
            nvml.nvmlDeviceGetGpuInstanceProfileInfo(dev, profile, version)
        assert err.value.value == code
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(dev) == 0  # MIG off: no MIG device slots
    # a table that agrees with itself: nothing differs, nothing changes
    table = read_driver_table(h100, EmulatedNvml(h100, 1))
    assert table.differences == () and table.model == h100 and table.unknown == ()


def test_a_driver_whose_geometry_differs_is_refused_and_a_bad_dump_is_named() -> None:
    h100 = gpu_model("H100-80GB")
    answers = {fake.NVML_GPU_INSTANCE_PROFILE_2_SLICE:
               {"slices": 3, "mem_mb": 20480, "sms": 32, "instances": 3}}
    with pytest.raises(MigError, match=r"2g.20gb: the driver reports 3 compute slices, the table 2"):
        read_driver_table(h100, EmulatedNvml(h100, 1, profile_answers=answers))
    with pytest.raises(ValueError, match="NVML_GPU_INSTANCE_PROFILE_9_SLICE: not an NVML"):
        answers_from_dump({"NVML_GPU_INSTANCE_PROFILE_9_SLICE": "error Not Supported"})
    with pytest.raises(ValueError, match="unknown NVML error"):
        answers_from_dump({"NVML_GPU_INSTANCE_PROFILE_1_SLICE": "error Something"})
    os.environ[DRIVER_TABLE_ENV] = "{not json"
    with pytest.raises(DriverTableError, match=DRIVER_TABLE_ENV):
        gpu_model("H100-80GB")


@needs_dump
def test_the_real_h200s_answers_go_through_the_emulated_nvml() -> None:
    doc = json.loads(H200_DUMP.read_text())
    nvml = EmulatedNvml.from_driver_dump(H200_DUMP, gpu_model("H200"))
    nvml.nvmlInit()
    dev = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetName(dev) == doc["name"] and nvml.nvmlSystemGetDriverVersion() == doc["driver"]
    assert nvml.nvmlDeviceGetMigMode(dev) == doc["mig_mode"]
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(dev) == doc["max_mig_devices"]
    for name, answer in doc["gi_profiles"].items():
        if isinstance(answer, str):
            with pytest.raises(fake.NVMLError) as err:
                nvml.nvmlDeviceGetGpuInstanceProfileInfo(dev, getattr(fake, name))
            assert answer == f"error {err.value}", name  # the binding's message for the code
        else:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(dev, getattr(fake, name))
            assert (info.sliceCount, info.memorySizeMB, info.multiprocessorCount, info.instanceCount) == (
                answer["slices"], answer["mem_mb"], answer["sms"], answer["instances"]), name


@needs_dump
def test_doctor_reports_and_the_daemon_uses_the_real_h200s_table(tmp_path: Path) -> None:
    h200 = gpu_model("H200")
    ready = {"which": lambda name: f"/usr/bin/{name}", "euid": 0, "run_dir": tmp_path / "run"}
    # the machine measured: MIG off, the node uses its GPU whole: ready, the driver's table for reference
    whole = diagnose(load_node(_node(tmp_path, mig=False), load_apps=False),
                     nvml=EmulatedNvml.from_driver_dump(H200_DUMP, h200), **ready)
    assert not failed(whole), format_checks(whole)
    lines = {c.what: c for c in whole}
    assert "MIG mode off, used whole" in lines["gpu 0"].detail
    assert "26 SMs" in lines["mig 1g.35gb"].detail and "table: 35 GB, 16 SMs" in lines["mig 1g.35gb"].detail
    # a MIG node on that GPU: every profile reported, the differing ones said to be the driver's
    node = load_node(_node(tmp_path, mig=True), load_apps=False)
    mig = {c.what: c for c in diagnose(node, nvml=EmulatedNvml.from_driver_dump(H200_DUMP, h200), **ready)}
    assert "MIG mode off: run `sudo nvidia-smi -i 0 -mig 1`" in mig["gpu 0"].detail
    reported = {w.removeprefix("mig "): c for w, c in mig.items() if w.startswith("mig ")}
    assert set(reported) == set(h200.profile_names)
    assert reported["1g.35gb"].status == "warn"
    assert "33280 MiB, 26 SMs, 4 per GPU" in reported["1g.35gb"].detail
    assert "jigsawd plans with the driver's" in reported["1g.35gb"].detail
    for name, mib in (("1g.18gb", 16384), ("3g.71gb", 71424), ("7g.141gb", 143360)):
        assert f"{mib} MiB" in reported[name].detail
    # the daemon's table (jigsawd's one call): the planner's segments carry the driver's figures ...
    said: list[str] = []
    served = driver_node(node, EmulatedNvml.from_driver_dump(H200_DUMP, h200), say=said.append)
    p = served.gpu.profile("1g.35gb")
    assert (p.sm_count, p.memory_gb * 1024, p.max_per_gpu) == (26, 33280, 4)
    assert (p.size, p.starts) == (2, (0, 2, 4, 6))  # the placement geometry stays the table's
    assert {s.mig.name: s.mig.memory_gb * 1024 for s in served.segment_types} == {
        "1g.18gb": 16384, "1g.18gb+me": 16384, "1g.35gb": 33280, "2g.35gb": 33280, "3g.71gb": 71424,
        "4g.71gb": 71424, "7g.141gb": 143360}
    assert any("1g.35gb: 26 SMs (the table says 16)" in line for line in said)
    # ... and so do the processes it starts (its planner child loads the node file again)
    out = subprocess.run(
        [sys.executable, "-c", "import sys; from jigsaw.node import load_node; "
         "g = load_node(sys.argv[1], load_apps=False).gpu.profile('1g.35gb'); print(g.sm_count, g.memory_gb)",
         str(_node(tmp_path, mig=True))], capture_output=True, text=True, timeout=60, check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert out.stdout.split() == ["26", "32.5"]
