"""A node that uses its GPUs whole (``mig = false``) runs one MPS control daemon per GPU whose
processes share it (MPS level k > 1), as a MIG node runs one per instance: started before the
workers with the GPU's UUID, private directories, the workers pointed at it, stopped after them.
The emulated node with the stand-in control binary (``mps_standin``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from dpserver import ROOT
from mps_standin import serve_under_mps

APP = "traffic_analysis"


def _whole_node(tmp_path: Path) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(textwrap.dedent(f"""
        name = "whole"
        apps = ["{ROOT / 'examples' / 'apps' / 'traffic_analysis.toml'}"]
        [gpus]
        model = "H100-80GB"
        mig = false
        count = 3
        mps_levels = [2]
        batch_sizes = [1, 4, 16]
        profiles_dir = "profiles"
        backend = "tensorrt"
        [server]
        fork_server = false
    """))
    done = subprocess.run([sys.executable, "-m", "jigsaw.cli", "modeled", "--node", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return path


def test_a_whole_gpu_node_runs_one_mps_daemon_per_gpu(tmp_path: Path) -> None:
    args = ["--node-config", str(_whole_node(tmp_path)), "--apps", APP, "--demand", "30", "--no-controller"]
    layout, environ, during, after = serve_under_mps(args, tmp_path)
    gpus = {p["gpu"] for p in layout["processes"]}
    assert layout["mig"] is None and len(gpus) == 3 and all(p["mps"] == 2 for p in layout["processes"])
    daemons = layout["mps"]["daemons"]
    keys = sorted((d["gpu"], d["start"], d["profile"]) for d in daemons)
    assert keys == [(g, 0, "gpu") for g in sorted(gpus)]
    starts = [e for e in during if e["op"] == "start"]
    # one per GPU, its GPU's UUID, owner-only, before any of its workers existed
    assert sorted(e["visible"] for e in starts) == [f"GPU-emulated-{g:04d}" for g in sorted(gpus)], starts
    assert all(e["mode"] == "0o700" and e["clients"] == 0 for e in starts), starts
    pipe_of = {d["gpu"]: d["directory"] + "/pipe" for d in daemons}
    for p in layout["processes"]:  # both processes of a GPU reach that GPU's daemon
        pipes = [e.split(b"=", 1)[1].decode() for e in environ[p["pid"]]
                 if e.startswith(b"CUDA_MPS_PIPE_DIRECTORY=")]
        assert pipes == [pipe_of[p["gpu"]]], (p, pipes)
    quits = [e for e in after if e["op"] == "quit"]
    assert sorted(e["pipe"] for e in quits) == sorted(pipe_of.values())  # stopped at shutdown ...
    assert all(e["clients"] == 0 for e in quits), quits  # ... after its workers
