"""`jigsaw profile` on a GPU node, with stand-ins for nvidia-smi and the MPS control daemon.

The stand-ins keep the MIG and MPS state in files and log every call, so the tests check what
the orchestrator asks of the driver (one instance per profile, one daemon per MPS level, all torn
down even when a copy fails) while the measuring copies are real processes running a real model
with onnxruntime on the CPU.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
H100 = ROOT / "examples" / "h100x4.toml"
APP = ROOT / "examples" / "apps" / "traffic_analysis.toml"

FAKE_SMI = r'''
import json, os, sys
state_path = os.path.join(os.environ["FAKE_GPU_DIR"], "state.json")
state = json.load(open(state_path)) if os.path.exists(state_path) else {}
with open(os.path.join(os.environ["FAKE_GPU_DIR"], "calls.log"), "a") as log:
    log.write("nvidia-smi " + " ".join(sys.argv[1:]) + "\n")
a = sys.argv[1:]
if a == ["-L"]:
    print("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0000)")
    if state:
        print(f"  MIG {state['profile']}     Device  0: (UUID: MIG-fake-{state['gi']})")
elif a[:2] == ["mig", "-lgi"]:
    if not state:
        print("No GPU instances found: Not Found")
        sys.exit(6)
    print(f"|   0  MIG {state['profile']}   19   {state['gi']}   0:1 |")
elif "-cgi" in a:
    state = {"profile": a[a.index("-cgi") + 1], "gi": 9}
    print(f"Successfully created GPU instance ID  9 on GPU  0 using profile MIG {state['profile']} (ID 19)")
    print(f"Successfully created compute instance ID  0 on GPU  0 GPU instance ID  9 using profile MIG "
          f"{state['profile']} (ID  0)")
elif "-dci" in a:
    print("Successfully destroyed compute instance ID  0 from GPU  0 GPU instance ID  9")
elif "-dgi" in a:
    state = {}
    print("Successfully destroyed GPU instance ID  9 from GPU  0")
json.dump(state, open(state_path, "w"))
'''

FAKE_MPS = r'''
import os, sys
control = os.path.join(os.environ["CUDA_MPS_PIPE_DIRECTORY"], "control")
with open(os.path.join(os.environ["FAKE_GPU_DIR"], "calls.log"), "a") as log:
    log.write("mps " + " ".join(sys.argv[1:]) + " " + os.environ["CUDA_VISIBLE_DEVICES"] + "\n")
if sys.argv[1:] == ["-d"]:
    open(control, "w").close()
    open(os.path.join(os.environ["FAKE_GPU_DIR"], "mps-running"), "a").write(control + "\n")
elif sys.stdin.read().strip() == "quit":
    os.unlink(control)
'''


@pytest.fixture
def fake_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir, state = tmp_path / "bin", tmp_path / "gpu"
    bin_dir.mkdir()
    state.mkdir()
    for name, body in (("nvidia-smi", FAKE_SMI), ("nvidia-cuda-mps-control", FAKE_MPS)):
        exe = bin_dir / name
        exe.write_text(f"#!{sys.executable}\n{body}")
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_GPU_DIR", str(state))
    return state


def _args(out: Path, *extra: str) -> list[str]:
    return ["profile", "--node", str(H100), "--app", str(APP), "--variants", "efficientnet-b0",
            "--batches", "1,2", "--segments", "1g.10gb", "--mps-levels", "1,2", "--out", str(out),
            "--seconds", "0.05", "--max-iters", "3", *extra]


def _calls(state: Path) -> list[str]:
    return (state / "calls.log").read_text().splitlines()


def _torn_down(state: Path) -> None:
    assert json.loads((state / "state.json").read_text()) == {}  # no MIG instance left
    for control in (state / "mps-running").read_text().split():
        assert not Path(control).exists()  # every MPS daemon told to quit


def test_segments_are_measured_by_concurrent_copies_in_an_instance(fake_gpu: Path, tmp_path: Path) -> None:
    from jigsaw.cli import main
    from jigsaw.profiles import load_profiles
    out = tmp_path / "prof"
    assert main(_args(out, "--backend", "onnxruntime")) == 0
    calls = _calls(fake_gpu)
    assert sum("-cgi 1g.10gb" in c for c in calls) == 1
    assert [c for c in calls if c.startswith("mps")] == [
        "mps -d MIG-fake-9", "mps  MIG-fake-9", "mps -d MIG-fake-9", "mps  MIG-fake-9"]
    assert calls[-1].startswith("nvidia-smi mig -dgi")
    _torn_down(fake_gpu)
    table = load_profiles(out)
    rows = {(r.mps, r.batch) for r in table.rows("efficientnet-b0")}
    assert rows == {(1, 1), (1, 2), (2, 1), (2, 2)}
    assert table.sources == {"measured"}
    text = (out / "efficientnet-b0.csv").read_text()
    assert "H100" in text and "onnxruntime" in text
    # resuming: nothing left to measure, so no instance is created
    assert main(_args(out, "--backend", "onnxruntime")) == 0
    assert sum("-cgi" in c for c in _calls(fake_gpu)) == 1


def test_a_failing_copy_still_tears_the_instance_down(fake_gpu: Path, tmp_path: Path) -> None:
    from jigsaw.cli import main
    # the tensorrt backend cannot load here: the copy exits with an error
    assert main(_args(tmp_path / "prof", "--backend", "tensorrt")) == 2
    _torn_down(fake_gpu)
    assert not (tmp_path / "prof" / "efficientnet-b0.csv").exists()


def test_a_gpu_with_instances_is_refused(fake_gpu: Path, tmp_path: Path) -> None:
    from jigsaw.cli import main
    (fake_gpu / "state.json").write_text(json.dumps({"profile": "3g.40gb", "gi": 2}))
    assert main(_args(tmp_path / "prof", "--backend", "onnxruntime")) == 2
    assert not any("-cgi" in c for c in _calls(fake_gpu))


def test_merge_sums_throughput_and_keeps_the_worst_latency(tmp_path: Path) -> None:
    from jigsaw.profiles import COLUMNS
    from jigsaw.profiling import merge_copies
    files = []
    for rank, (lat, thr) in enumerate([(10.0, 100.0), (14.0, 80.0)]):
        f = tmp_path / f"r{rank}.csv"
        row = f"v,1g.10gb,2,4,{lat},{thr},500,measured,h,tensorrt,2026-01-01\n"
        f.write_text(",".join(COLUMNS) + "\n" + row)
        files.append(f)
    merged = merge_copies(files)
    assert merged == {("v", "1g.10gb", 2, 4): ["14.0000", "180.000", "1000.0", "tensorrt", ""]}
    # CPU shares measured together: each copy is a share of its own
    assert merge_copies(files, throughput="mean")[("v", "1g.10gb", 2, 4)] == ["14.0000", "90.000", "500.0",
                                                                                "tensorrt", ""]
    files[1].write_text(",".join(COLUMNS) + "\n")
    from jigsaw.errors import JigsawError
    with pytest.raises(JigsawError, match="different rows"):
        merge_copies(files)
    skipped: list[str] = []  # a row one copy could not run (its batch failed there): left out, named
    assert merge_copies(files, skipped=skipped) == {}
    assert skipped == ["v 1g.10gb mps2 batch 4: failed in 1 of 2 copies"]


def test_a_whole_gpu_node_is_measured_without_mig(fake_gpu: Path, tmp_path: Path) -> None:
    from jigsaw.cli import main
    from jigsaw.profiles import load_profiles
    node = tmp_path / "whole.toml"
    node.write_text(H100.read_text().replace('model = "H100-80GB"', 'model = "H100-80GB"\nmig = false')
                    .replace("mig_profiles", "# mig_profiles"))
    args = _args(tmp_path / "prof", "--backend", "onnxruntime")
    args[args.index("--node") + 1] = str(node)
    args[args.index("--segments") + 1] = "gpu"
    assert main(args) == 0
    calls = _calls(fake_gpu)
    assert not any("-cgi" in c or "-dgi" in c for c in calls)  # nothing to partition
    assert [c for c in calls if c.startswith("mps")] == [
        "mps -d GPU-0000", "mps  GPU-0000", "mps -d GPU-0000", "mps  GPU-0000"]
    table = load_profiles(tmp_path / "prof")
    assert {(r.mig_profile, r.mps, r.batch) for r in table.rows("efficientnet-b0")} == {
        ("gpu", k, b) for k in (1, 2) for b in (1, 2)}
    assert "whole GPU" in (tmp_path / "prof" / "efficientnet-b0.csv").read_text()
    (fake_gpu / "state.json").write_text(json.dumps({"profile": "3g.40gb", "gi": 2}))
    args[args.index("--out") + 1] = str(tmp_path / "prof2")
    assert main(args) == 2  # MIG devices on the GPU: refused
