"""MPS shares of MIG instances (``jigsaw.shares``): processes of different tasks and apps in one MIG
instance are clients of that instance's one MPS control daemon (started with the instance's UUID
before them, stopped after them); the node serves. The
emulated one-H100 node with ``mig_shares``, the stand-in control binary (``mps_standin``)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from dpserver import ROOT, Server, http, image
from mps_standin import fake_mps, mps_log


def _node(tmp_path: Path) -> Path:
    """examples/h100x4.toml on one GPU with 1g.10gb shares, workers started by Python (so /proc
    shows their environment)."""
    text = (ROOT / "examples" / "h100x4.toml").read_text()
    text = text.replace('"apps/', f'"{ROOT}/examples/apps/').replace('"../profiles', f'"{ROOT}/profiles')
    text = text.replace("count = 4\n", 'count = 1\nmig_shares = ["1g.10gb-1of2", "1g.10gb-1of4"]\n')
    path = tmp_path / "node.toml"
    path.write_text(text.replace("[server]\n", "[server]\nfork_server = false\n"))
    return path


def test_the_shares_of_a_mig_instance_are_clients_of_its_one_daemon(tmp_path: Path) -> None:
    args = ["--node-config", str(_node(tmp_path)), "--apps", "social_media,traffic_analysis",
            "--demand", "20", "--no-controller"]
    with Server(args, tmp_path / "jigsawd.log", env=fake_mps(tmp_path)) as server:
        status, layout, _ = http("GET", f"{server.url}/admin/layout")
        assert status == 200, layout
        for app in ("social_media", "traffic_analysis"):
            status, body, _ = http("POST", f"{server.url}/v2/models/{app}/infer", image())
            assert status == 200, body
        environ = {p["pid"]: Path(f"/proc/{p['pid']}/environ").read_bytes().split(b"\0")
                   for p in layout["processes"]}
        during = mps_log(tmp_path)
    after = mps_log(tmp_path)
    shares = [i for i in layout["instances"] if "-1of" in i["profile"]]
    tasks_in: dict[tuple[int, int], set[tuple[str, str]]] = defaultdict(set)
    for i in shares:
        tasks_in[(i["gpu"], i["start"])].add((i["app"], i["task"]))
    assert shares and max(len(t) for t in tasks_in.values()) >= 2, shares
    for key in tasks_in:  # one share profile per instance, at most k, on distinct seats 0..k-1
        mine = [i for i in shares if (i["gpu"], i["start"]) == key]
        assert len({i["profile"] for i in mine}) == 1
        k = int(mine[0]["profile"].rsplit("-1of", 1)[1])
        assert sorted({i["seat"] for i in mine}) == sorted(i["seat"] for i in mine) and \
            all(0 <= i["seat"] < k for i in mine), mine
    # NVML holds one MIG instance per shared one, of the host profile, with its UUID
    existing = {(i["gpu"], i["start"]): i for i in layout["mig"]["existing"]}
    assert {k: existing[k]["profile"] for k in tasks_in} == {k: "1g.10gb" for k in tasks_in}
    daemons = {(d["gpu"], d["start"]): d for d in layout["mps"]["daemons"]}
    assert set(tasks_in) <= set(daemons) and all(daemons[k]["profile"] == "1g.10gb" for k in tasks_in)
    starts = [e for e in during if e["op"] == "start"]
    assert len(starts) == len(daemons) and all(e["clients"] == 0 for e in starts), starts
    assert sorted(e["visible"] for e in starts) == sorted(existing[k]["uuid"] for k in daemons)
    for p in layout["processes"]:  # every process of a shared instance reaches its daemon, its device
        if "-1of" not in p["profile"]:
            continue
        env = dict(e.split(b"=", 1) for e in environ[p["pid"]] if b"=" in e)
        key = (p["gpu"], p["start"])
        assert env[b"CUDA_MPS_PIPE_DIRECTORY"].decode() == daemons[key]["directory"] + "/pipe", p
    quits = [e for e in after if e["op"] == "quit"]
    assert sorted(e["pipe"] for e in quits) == sorted(d["directory"] + "/pipe" for d in daemons.values())
    assert all(e["clients"] == 0 for e in quits), quits
