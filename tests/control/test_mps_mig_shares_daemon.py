"""MPS shares of MIG instances (``jigsaw.shares``): processes of different tasks and apps in one MIG
instance are clients of that instance's one MPS control daemon (started with the instance's UUID
before them, stopped after them); the node serves, and re-plans keep what stays. The emulated
one-H100 node with ``mig_shares`` and with the default shares, the stand-in control binary
(``mps_standin``)."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

from dpserver import ROOT, Server, http, image
from mps_standin import fake_mps, mps_log

from jigsaw.gpu.layout import NodeInstance, NodeLayout, validate_node_layout
from jigsaw.mig import share_host
from jigsaw.node import load_node


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


def test_replans_with_default_shares_keep_what_stays_and_serve_throughout(tmp_path: Path) -> None:
    """The default node (the share pass's shares) re-planned twice under load for other small
    demands: every request answered; each time the layout valid with its seats, the MIG instances
    and one MPS daemon per shared instance as the new layout says; a shared instance whose shares
    all stay (the other app's, planned the same) keeps its MIG instance and its processes."""
    from dpserver import Load

    text = (ROOT / "examples" / "h100x4.toml").read_text()
    text = text.replace('"apps/', f'"{ROOT}/examples/apps/').replace('"../profiles', f'"{ROOT}/profiles')
    path = tmp_path / "node.toml"
    path.write_text(text.replace("count = 4\n", "count = 1\n"))
    args = ["--node-config", str(path), "--apps", "social_media,traffic_analysis", "--demand", "20",
            "--bin-seconds", "3600", "--plan-time-limit", "5"]
    with Server(args, tmp_path / "jigsawd.log", env=fake_mps(tmp_path)) as server:
        first = _settled(server.url)
        assert any("-1of" in i["profile"] for i in first["instances"]), first["instances"]
        laid = []
        with Load(server.url, "traffic_analysis", threads=3, pause_s=0.02) as load:
            for rps in (45.0, 40.0):
                status, doc, _ = http("POST", f"{server.url}/admin/control",
                                      {"app": "traffic_analysis", "replan_rps": rps}, timeout_s=120)
                assert status == 200, doc
                laid.append(_settled(server.url))
    assert load.sent == load.answered and load.statuses.get(200, 0) >= 0.95 * load.sent, load.statuses
    for doc in laid:
        _check_layout(doc, load_node(path).gpu)
    mid, last = laid
    kept = [key for key in _shared(mid) & _shared(last) if _seats(mid, key) == _seats(last, key)]
    assert kept, (mid["instances"], last["instances"])  # social_media's shares, planned the same
    uuid = [{(i["gpu"], i["start"]): i["uuid"] for i in d["mig"]["existing"]} for d in (mid, last)]
    pids = [{(i["gpu"], i["start"], i["seat"]): i["pids"] for i in d["instances"]} for d in (mid, last)]
    for key in kept:
        assert uuid[0][key] == uuid[1][key], key
        assert all(pids[0][(*key, s)] == pids[1][(*key, s)] for *_, s in _seats(last, key)), key


def _devices(doc: dict) -> dict[tuple[int, int], str]:
    return {(i["gpu"], i["start"]): share_host(i["profile"]) or i["profile"] for i in doc["instances"]}


def _settled(url: str, timeout_s: float = 30.0) -> dict:
    """The layout once the MIG instances that exist are the layout's."""
    deadline = time.monotonic() + timeout_s
    while True:
        doc = http("GET", f"{url}/admin/layout")[1]
        if {(i["gpu"], i["start"]): i["profile"] for i in doc["mig"]["existing"]} == _devices(doc) or \
                time.monotonic() > deadline:
            return doc
        time.sleep(0.2)


def _shared(doc: dict) -> set[tuple[int, int]]:
    return {(i["gpu"], i["start"]) for i in doc["instances"] if "-1of" in i["profile"]}


def _seats(doc: dict, key: tuple[int, int]) -> set[tuple]:
    return {(i["app"], i["task"], i["variant"], i["profile"], i["seat"]) for i in doc["instances"]
            if (i["gpu"], i["start"]) == key}


def _check_layout(doc: dict, gpu) -> None:
    """Valid with its seats, its MIG instances those that exist, an MPS daemon per shared instance."""
    assert {(i["gpu"], i["start"]): i["profile"] for i in doc["mig"]["existing"]} == _devices(doc)
    placed = NodeLayout(doc["gpu_model"], doc["num_gpus"], tuple(
        NodeInstance(gpu=i["gpu"], profile=i["profile"], start=i["start"], app=i["app"], task=i["task"],
                     variant=i["variant"], mps=i["mps"], max_batch=i["max_batch"], index=i["index"],
                     seat=i["seat"]) for i in doc["instances"]))
    assert validate_node_layout(placed, gpu) == []
    assert _shared(doc) <= {(d["gpu"], d["start"]) for d in doc["mps"]["daemons"]}
