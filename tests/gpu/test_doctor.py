"""``jigsaw doctor``: one clear line per check, non-zero exit when something is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from jigsaw.cli import main
from jigsaw.gpu import emulated_nvml as fake
from jigsaw.gpu.doctor import diagnose, failed, format_checks
from jigsaw.gpu.emulated_nvml import EmulatedNvml
from jigsaw.node import load_node

ROOT = Path(__file__).resolve().parents[2]
H100X4 = ROOT / "examples" / "h100x4.toml"


@pytest.fixture(scope="module")
def node():
    return load_node(H100X4, load_apps=False)


def by_what(checks):
    return {c.what: c for c in checks}


def test_a_ready_node_passes(node, tmp_path):
    cap = tmp_path / "mig-config"
    cap.write_text("")
    checks = diagnose(node, nvml=EmulatedNvml(node.gpu, 4, driver_version="550.54.15"),
                      which=lambda name: f"/usr/bin/{name}", euid=1000, mig_capability=cap,
                      run_dir=tmp_path / "r")
    assert not failed(checks), format_checks(checks)
    c = by_what(checks)
    assert "550.54.15" in c["driver"].detail
    assert [c[f"gpu {g}"].status for g in range(4)] == ["ok"] * 4
    assert "MIG mode on" in c["gpu 0"].detail and "(node config says" not in c["gpu 0"].detail
    assert not (tmp_path / "r").exists()  # read-only: nothing is created


def test_each_missing_piece_is_one_failing_line(node, tmp_path):
    nvml = EmulatedNvml(node.gpu, 3, mig_enabled=[True, False, False])
    nvml._gpus[2].pending_mode = 1
    checks = diagnose(node, nvml=nvml, which=lambda name: None, euid=1000,
                      mig_capability=tmp_path / "absent", run_dir=tmp_path / "r")
    c = by_what(checks)
    assert failed(checks)
    assert c["gpus"].status == "FAIL" and "3 GPU(s) found, the node config asks for 4" in c["gpus"].detail
    assert c["gpu 0"].status == "ok"
    assert c["gpu 1"].status == "FAIL" and "sudo nvidia-smi -i 1 -mig 1" in c["gpu 1"].detail
    assert c["gpu 2"].status == "FAIL" and "pending" in c["gpu 2"].detail
    assert c["mps"].status == "FAIL" and "nvidia-cuda-mps-control not on PATH" in c["mps"].detail
    assert c["permissions"].status == "FAIL" and "needs root" in c["permissions"].detail
    for line in format_checks(checks).splitlines():
        assert line.split()[0] in ("ok", "FAIL", "warn")


def test_no_driver_is_said_plainly(node, tmp_path):
    nvml = EmulatedNvml(node.gpu, 4)
    nvml.inject("nvmlInit", fake.NVML_ERROR_LIBRARY_NOT_FOUND)
    c = by_what(diagnose(node, nvml=nvml, which=lambda n: None, euid=0, run_dir=tmp_path / "r"))
    assert c["driver"].status == "FAIL" and "no NVIDIA driver on this machine" in c["driver"].detail
    assert c["permissions"].status == "ok"


def test_cli_on_this_machine_exits_cleanly(capsys):
    rc = main(["doctor", "--node-config", str(H100X4)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    lines = out.splitlines()
    assert lines and all(line.split()[0] in ("ok", "FAIL", "warn") for line in lines)
    # without the NVML binding the first check is "nvml" (how to install it); with it, "driver"
    first = next(line for line in lines if line.split()[1] in ("nvml", "driver"))
    if first.startswith("FAIL"):  # no GPU here (or no binding): said so, non-zero exit
        assert rc == 1
        assert "no NVIDIA driver" in first or "NVML" in first or "nvidia-ml-py" in first


def test_cli_cpu_node_and_bad_file(capsys, tmp_path):
    assert main(["doctor", "--node-config", str(ROOT / "examples" / "cpu.toml")]) == 0
    assert "CPU node" in capsys.readouterr().out
    assert main(["doctor", "--node-config", str(tmp_path / "nope.toml")]) == 2
    assert "nope.toml: (file): no such file" in capsys.readouterr().err
