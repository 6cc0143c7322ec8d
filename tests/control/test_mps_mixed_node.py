"""A node of several GPU groups (``examples/a100x2_l4x2.toml``, smaller) runs one MPS control daemon per MIG
instance of MPS level k > 1 on its A100s and one per L4 whose shares hold processes, the workers
pointed at their own, and at a small demand shares one MIG instance between tasks by default: the
emulated node with the stand-in control binary (``mps_standin``)."""

from __future__ import annotations

from pathlib import Path

from dpserver import ROOT, Server, http
from mps_standin import fake_mps, mps_log, serve_under_mps


def _node(tmp_path: Path) -> Path:
    """The example, one GPU of each group, the A100's 1g.5gb at MPS 1 or 2: at 700 req/s the plan
    runs 13 processes on both (a few seconds to start)."""
    text = (ROOT / "examples" / "a100x2_l4x2.toml").read_text()
    text = text.replace('"apps/', f'"{ROOT}/examples/apps/').replace('"../profiles', f'"{ROOT}/profiles')
    text = text.replace('model = "A100-40GB"\ncount = 2\nmps_levels = [1, 2, 4]',
                        'model = "A100-40GB"\ncount = 1\nmig_profiles = ["1g.5gb"]\nmps_levels = [1, 2]')
    text = text.replace('model = "L4"\nmig = false\ncount = 2', 'model = "L4"\nmig = false\ncount = 1')
    path = tmp_path / "node.toml"
    path.write_text(text + "\n[server]\nfork_server = false\n")
    return path


def test_mig_instances_and_whole_gpus_each_get_their_daemons(tmp_path: Path) -> None:
    args = ["--node-config", str(_node(tmp_path)), "--demand", "700", "--no-controller"]
    layout, environ, during, after = serve_under_mps(args, tmp_path)
    daemons = layout["mps"]["daemons"]
    whole = [d for d in daemons if d["gpu"] >= 1]
    assert whole and all((d["start"], d["profile"]) == (0, "gpu") for d in whole)
    mig = [d for d in daemons if d["gpu"] < 1]
    assert mig and all(d["profile"].startswith("A100-40GB:") for d in mig)
    starts = {e["pipe"]: e for e in during if e["op"] == "start"}
    pipe_of = {(d["gpu"], d["start"]): d["directory"] + "/pipe" for d in daemons}
    uuid = {(i["gpu"], i["start"]): i["uuid"] for i in layout["instances"]}
    for d in whole:  # an L4's daemon sees the GPU (its segments' device), a MIG instance's its instance
        assert starts[pipe_of[(d["gpu"], 0)]]["visible"] == f"GPU-emulated-{d['gpu']:04d}"
        assert {u for (g, _), u in uuid.items() if g == d["gpu"]} == {f"GPU-emulated-{d['gpu']:04d}"}
    for d in mig:
        assert starts[pipe_of[(d["gpu"], d["start"])]]["visible"].startswith("MIG-")
    shared = [p for p in layout["processes"] if p["gpu"] is not None and (p["gpu"] >= 1 or p["mps"] > 1)]
    assert any(p["gpu"] >= 1 for p in shared) and any(p["gpu"] == 0 for p in shared)
    for p in shared:  # each process reaches its GPU's (L4) or its instance's (A100) daemon
        want = pipe_of[(p["gpu"], 0 if p["gpu"] >= 1 else p["start"])]
        pipes = [e.split(b"=", 1)[1].decode() for e in environ[p["pid"]]
                 if e.startswith(b"CUDA_MPS_PIPE_DIRECTORY=")]
        assert pipes == [want], (p, pipes)
    quits = [e for e in after if e["op"] == "quit"]
    assert sorted(e["pipe"] for e in quits) == sorted(pipe_of.values())


def test_a_small_demand_shares_one_mig_instance_under_its_daemon_and_serves(tmp_path: Path) -> None:
    """The default MIG shares of the A100 group (``1g.5gb-1of2``): at 20 req/s the plan puts two
    tasks in one 1g.5gb instance; NVML holds that one instance, one daemon serves it, both
    processes are its clients, and the app answers."""
    args = ["--node-config", str(_node(tmp_path)), "--demand", "20", "--no-controller"]
    body = {"inputs": [{"name": "audio", "datatype": "UINT8", "shape": [4], "data": [1, 2, 3, 4]}]}
    with Server(args, tmp_path / "jigsawd.log", env=fake_mps(tmp_path)) as server:
        status, layout, _ = http("GET", f"{server.url}/admin/layout")
        assert status == 200, layout
        status, answer, _ = http("POST", f"{server.url}/v2/models/voice_intent/infer", body)
        assert status == 200 and answer["parameters"]["emulated"] is True, answer
        environ = {p["pid"]: Path(f"/proc/{p['pid']}/environ").read_bytes().split(b"\0")
                   for p in layout["processes"]}
    after = mps_log(tmp_path)
    shares = [i for i in layout["instances"] if i["profile"] == "A100-40GB:1g.5gb-1of2"]
    assert len({i["task"] for i in shares}) == 2 and {i["gpu"] for i in shares} == {0}, layout["instances"]
    assert len({i["start"] for i in shares}) == 1 and sorted(i["seat"] for i in shares) == [0, 1]
    start = shares[0]["start"]
    existing = [i for i in layout["mig"]["existing"] if (i["gpu"], i["start"]) == (0, start)]
    assert len(existing) == 1 and existing[0]["profile"].endswith("1g.5gb"), layout["mig"]["existing"]
    daemons = [d for d in layout["mps"]["daemons"] if (d["gpu"], d["start"]) == (0, start)]
    assert len(daemons) == 1, layout["mps"]["daemons"]
    pipe = daemons[0]["directory"] + "/pipe"
    mine = [p for p in layout["processes"] if p["profile"] == "A100-40GB:1g.5gb-1of2"]
    assert len(mine) == 2, layout["processes"]
    for p in mine:
        assert [e.split(b"=", 1)[1].decode() for e in environ[p["pid"]]
                if e.startswith(b"CUDA_MPS_PIPE_DIRECTORY=")] == [pipe], p
    assert pipe in {e["pipe"] for e in after if e["op"] == "quit"}
