"""MPS inside MIG with a stand-in for ``nvidia-cuda-mps-control`` (as tests/models/test_profile_gpu.py
stands in for the driver tools): one daemon per instance, private owner-only directories, the
instance's UUID, quit on stop, nothing left when the daemon fails to come up."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from jigsaw.gpu.layout import NodeInstance
from jigsaw.gpu.mps import EmulatedMps, MpsError, MpsManager

FAKE_MPS = r'''
import os, sys
log = os.path.join(os.environ["FAKE_MPS_DIR"], "calls.log")
mode = open(os.path.join(os.environ["FAKE_MPS_DIR"], "mode")).read().strip() if os.path.exists(
    os.path.join(os.environ["FAKE_MPS_DIR"], "mode")) else "ok"
pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
with open(log, "a") as f:
    f.write(" ".join(["mps", *sys.argv[1:], os.environ["CUDA_VISIBLE_DEVICES"], pipe,
                      os.environ["CUDA_MPS_LOG_DIRECTORY"]]) + "\n")
if sys.argv[1:] == ["-d"]:
    if mode == "fail":
        print("An instance of this daemon is already running", file=sys.stderr)
        sys.exit(1)
    if mode != "silent":
        open(os.path.join(pipe, "control"), "w").close()
elif sys.stdin.read().strip() == "quit":
    with open(log, "a") as f:
        f.write("quit " + pipe + "\n")
    if os.path.exists(os.path.join(pipe, "control")):
        os.unlink(os.path.join(pipe, "control"))
'''


@pytest.fixture
def fake_mps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    exe = bin_dir / "nvidia-cuda-mps-control"
    exe.write_text(f"#!{sys.executable}\n{FAKE_MPS}")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MPS_DIR", str(state))
    return state


def inst(start: int, uuid: str = "MIG-aaaa") -> NodeInstance:
    return NodeInstance(0, "3g.40gb", start, "app", "t", "v", mps=3, uuid=uuid)


def calls(state: Path) -> list[str]:
    p = state / "calls.log"
    return p.read_text().splitlines() if p.exists() else []


def test_one_private_daemon_per_instance(fake_mps, tmp_path):
    run = tmp_path / "run"
    mps = MpsManager(run, timeout_s=5)
    a = mps.start(inst(0, "MIG-aaaa"))
    b = mps.start(inst(4, "MIG-bbbb"))
    assert a.directory != b.directory
    for d in (run, a.directory, a.directory / "pipe", a.directory / "log"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700 and d.stat().st_uid == os.getuid()
    log = calls(fake_mps)
    assert log[0].split()[:3] == ["mps", "-d", "MIG-aaaa"] and log[1].split()[:3] == ["mps", "-d", "MIG-bbbb"]
    assert log[0].split()[3] == str(a.directory / "pipe") and log[0].split()[4] == str(a.directory / "log")
    env = mps.client_env(inst(0))
    assert env == {"CUDA_MPS_PIPE_DIRECTORY": str(a.directory / "pipe"),
                   "CUDA_MPS_LOG_DIRECTORY": str(a.directory / "log")}
    assert mps.start(inst(0)) is a  # idempotent: still one daemon
    assert len([c for c in calls(fake_mps) if " -d " in c]) == 2
    mps.stop(inst(0))
    assert f"quit {a.directory / 'pipe'}" in calls(fake_mps)
    assert not a.directory.exists() and b.directory.exists()
    assert mps.client_env(inst(0)) == {}
    assert mps.stop_all() == []
    assert not b.directory.exists()


def test_a_daemon_that_fails_leaves_nothing(fake_mps, tmp_path):
    (fake_mps / "mode").write_text("fail")
    mps = MpsManager(tmp_path / "run", timeout_s=5)
    with pytest.raises(MpsError, match="already running") as err:
        mps.start(inst(0))
    assert err.value.step == "start_mps"
    assert mps.daemons == {} and list((tmp_path / "run").iterdir()) == []


def test_a_daemon_that_never_makes_its_pipe_is_told_to_quit(fake_mps, tmp_path):
    (fake_mps / "mode").write_text("silent")
    # the whole timeout passes waiting for the pipe; 1.5 s lets the fake binary itself start under load
    mps = MpsManager(tmp_path / "run", timeout_s=1.5)
    with pytest.raises(MpsError, match="no control pipe"):
        mps.start(inst(0))
    assert any(c.startswith("quit ") for c in calls(fake_mps))
    assert list((tmp_path / "run").iterdir()) == []


def test_missing_binary_and_missing_uuid_are_clear(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    mps = MpsManager(tmp_path / "run")
    with pytest.raises(MpsError, match="not found"):
        mps.start(inst(0))
    with pytest.raises(MpsError, match="no MIG UUID"):
        mps.start(inst(0, uuid=""))


def test_a_run_directory_of_another_user_is_refused(tmp_path):
    if os.getuid() != 0:
        pytest.skip("needs root to make a directory owned by another user")
    other = tmp_path / "other"
    other.mkdir()
    os.chown(other, 12345, 12345)
    with pytest.raises(MpsError, match="owned by uid 12345"):
        MpsManager(other).start(inst(0))


def test_a_loose_run_directory_is_made_private(fake_mps, tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o777)
    run.chmod(0o777)
    MpsManager(run, timeout_s=5).start(inst(0))
    assert stat.S_IMODE(run.stat().st_mode) == 0o700


def test_emulated_mps_keeps_the_same_directories_and_order(tmp_path):
    mps = EmulatedMps(tmp_path / "run")
    d = mps.start(inst(0))
    assert (d.directory / "pipe" / "control").exists()
    mps.stop(inst(0))
    assert not d.directory.exists()


def test_a_node_using_its_gpus_whole_gets_one_daemon_per_gpu(fake_mps, tmp_path):
    from jigsaw.gpu.emulated_nvml import NVML_ERROR_DRIVER_NOT_LOADED, EmulatedNvml
    from jigsaw.gpu.mps import node_mps
    from jigsaw.mig import cpu_model, gpu_model, whole_gpu_model

    whole = whole_gpu_model("L4", 24, 58)
    nvml = EmulatedNvml(whole, 2, mig_enabled=False)
    # a real backend on whole GPUs: the driver's binary, the GPUs' UUIDs read from NVML on first use
    mps, gpus = node_mps(whole, 2, tmp_path / "run", emulated=False, on_gpus=True, partitioned=False,
                         nvml=nvml)
    assert type(mps) is MpsManager and mps.binary == "nvidia-cuda-mps-control" and gpus is not None
    assert not nvml.calls
    layout = gpus.layout()
    assert [(i.gpu, i.start, i.profile, i.uuid) for i in layout.instances] == [
        (0, 0, "gpu", "GPU-emulated-0000"), (1, 0, "gpu", "GPU-emulated-0001")]
    assert gpus.layout() is layout  # read once
    d = mps.start(layout.instances[1])
    assert calls(fake_mps)[0].split()[:3] == ["mps", "-d", "GPU-emulated-0001"]
    assert d.directory.name == "gpu1-start0-gpu"
    mps.stop(layout.instances[1])
    assert not d.directory.exists()
    # a node asking for more GPUs than NVML has, or without a driver: a clear error, no daemon
    _, three = node_mps(whole, 3, tmp_path / "run", emulated=False, on_gpus=True, partitioned=False,
                        nvml=EmulatedNvml(whole, 2, mig_enabled=False))
    with pytest.raises(MpsError, match=r"2 GPU.*asks for 3"):
        three.layout()
    broken = EmulatedNvml(whole, 2, mig_enabled=False)
    broken.inject("nvmlInit", NVML_ERROR_DRIVER_NOT_LOADED)
    _, none = node_mps(whole, 2, tmp_path / "run", emulated=False, on_gpus=True, partitioned=False,
                       nvml=broken)
    with pytest.raises(MpsError, match="Driver Not Loaded"):
        none.layout()
    # the emulated node emulates NVML too; a partitioned node keys daemons by MIG instance; a CPU node
    # and a backend that runs nowhere near a GPU have none
    assert node_mps(whole, 1, tmp_path, emulated=True, on_gpus=False, partitioned=False)[1].layout()
    mig_mps, mig_gpus = node_mps(gpu_model("H100-80GB"), 1, tmp_path, emulated=True, on_gpus=False,
                                 partitioned=True)
    assert isinstance(mig_mps, EmulatedMps) and mig_gpus is None
    cpu = node_mps(cpu_model(2), 1, tmp_path, emulated=False, on_gpus=False, partitioned=False)
    assert cpu == (None, None)
    assert node_mps(whole, 1, tmp_path, emulated=False, on_gpus=False, partitioned=False) == (None, None)
