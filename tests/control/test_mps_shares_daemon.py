"""The MPS shares of a whole GPU (``jigsaw.shares``): every process of a GPU's shares, whatever
its task, is a client of that GPU's one MPS control daemon, started before them and stopped after
them. The emulated two-L4 node with the stand-in control binary (``mps_standin``)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from dpserver import ROOT
from mps_standin import serve_under_mps


def _node(tmp_path: Path) -> Path:
    """examples/l4x2.toml with workers started by Python, so /proc shows their environment."""
    text = (ROOT / "examples" / "l4x2.toml").read_text()
    text = text.replace('"apps/', f'"{ROOT}/examples/apps/').replace('"../profiles', f'"{ROOT}/profiles')
    path = tmp_path / "l4x2.toml"
    path.write_text(text + "\n[server]\nfork_server = false\n")
    return path


def test_the_shares_of_a_gpu_are_clients_of_its_one_daemon(tmp_path: Path) -> None:
    args = ["--node-config", str(_node(tmp_path)), "--demand", "150", "--no-controller"]
    layout, environ, during, after = serve_under_mps(args, tmp_path)
    shares = [p for p in layout["processes"] if p["profile"].startswith("gpu-1of")]
    tasks_on: dict[int, set[str]] = defaultdict(set)
    for p in shares:
        tasks_on[p["gpu"]].add(p["task"])
    assert shares and max(len(t) for t in tasks_on.values()) >= 2, layout["processes"]
    daemons = layout["mps"]["daemons"]
    assert sorted((d["gpu"], d["start"], d["profile"]) for d in daemons) == \
        [(g, 0, "gpu") for g in sorted({p["gpu"] for p in layout["processes"]})]
    starts = [e for e in during if e["op"] == "start"]
    assert len(starts) == len(daemons) and all(e["clients"] == 0 for e in starts), starts
    pipe_of = {d["gpu"]: d["directory"] + "/pipe" for d in daemons}
    for p in shares:  # processes of different tasks on one GPU reach that GPU's daemon
        pipes = [e.split(b"=", 1)[1].decode() for e in environ[p["pid"]]
                 if e.startswith(b"CUDA_MPS_PIPE_DIRECTORY=")]
        assert pipes == [pipe_of[p["gpu"]]], (p, pipes)
    quits = [e for e in after if e["op"] == "quit"]
    assert sorted(e["pipe"] for e in quits) == sorted(pipe_of.values())
    assert all(e["clients"] == 0 for e in quits), quits
