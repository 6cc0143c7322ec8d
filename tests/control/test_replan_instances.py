"""A daemon re-plan goes per instance: unchanged instances keep their processes (same pids), only
the changed ones are started, MIG changes only on the changed GPUs (the emulated NVML's call log),
one MPS control daemon per instance of MPS level k > 1 (a stand-in control binary), and a failing
step rolls back while the running plan serves on."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from dpserver import EXAMPLE_NODE, Load, Server, http
from mps_standin import fake_mps as _fake_mps
from mps_standin import mps_log as _mps_log

from jigsaw.gpu.emulated_nvml import NVML_ERROR_INSUFFICIENT_RESOURCES
from jigsaw.mig import gpu_model, share_host
from jigsaw.planner.layouts import slot_mask

APP = "traffic_analysis"
# a generous solver limit: the plans (optimal, found in about a second) must not depend on the load;
# exact plans only (no anytime quick plan first), so what each re-plan keeps is the planner's optimum
ARGS = ["--node-config", str(EXAMPLE_NODE), "--apps", APP, "--demand", "60", "--bin-seconds", "3600",
        "--plan-time-limit", "30", "--anytime", "off"]
REPLAN_RPS = 100  # from 60: the planner keeps some instances and changes others
SCALE_UP_RPS = 150  # a new MIG instance (MPS level 2) on GPU 0

def _layout(url: str) -> dict[str, Any]:
    status, doc, _ = http("GET", f"{url}/admin/layout")
    assert status == 200, doc
    return doc


def _instance(p: dict[str, Any]) -> tuple[Any, ...]:
    return (p["task"], p["variant"], p["profile"], p["mps"], p["max_batch"], p["gpu"], p["start"])


def _serving(doc: dict[str, Any], gen: int) -> dict[int, tuple[Any, ...]]:
    return {p["pid"]: _instance(p) for p in doc["processes"] if gen in p["generations"]}


def _alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return False


def _wait_drained(url: str, gen: int, timeout_s: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        doc = _layout(url)
        done = all(p["generations"] == [gen] for p in doc["processes"])
        mig = doc["mig"]
        if mig is not None:  # and the instances nothing runs on are destroyed
            done = done and _slots(mig["existing"]) == _slots(doc["instances"])
        if done or time.monotonic() > deadline:
            return doc
        time.sleep(0.2)


def _slots(instances: list[dict[str, Any]]) -> set[tuple[int, int, str]]:
    """The MIG instances (GPU, start, profile): the shares of one instance are that instance."""
    return {(i["gpu"], i["start"], share_host(i["profile"]) or i["profile"]) for i in instances}


def _with_daemon(i: dict[str, Any]) -> bool:
    """An instance or process under an MPS daemon: of MPS level k > 1, or a MIG-instance share."""
    return i["mps"] > 1 or bool(share_host(i["profile"]))


def _replan(server: Server, rps: float) -> dict[str, Any]:
    """Re-plan under load; what served before and during, and the layout once the old one drained."""
    gen0 = http("GET", f"{server.url}/admin/plan")[1][APP]["generation"]
    before = _layout(server.url)
    with Load(server.url, APP) as load:
        time.sleep(0.5)
        status, doc, _ = http("POST", f"{server.url}/admin/control", {"app": APP, "replan_rps": rps},
                              timeout_s=90)
        assert status == 200, doc
        gen1 = doc["generation"]
        middle = _layout(server.url)
        time.sleep(0.5)
    after = _wait_drained(server.url, gen1)
    alive = {p: _alive(p) for p in {p["pid"] for p in before["processes"] + middle["processes"]}}
    assert load.sent == load.answered, load.statuses  # every accepted request answered once
    assert load.statuses.get(200, 0) >= 0.98 * load.sent, load.statuses
    assert gen1 > gen0
    old = _serving(before, gen0)
    new = _serving(middle, gen1)
    old_instances = set(old.values())
    # same pids for unchanged instances: every process of an instance both plans run is kept
    kept = {pid for pid in new if pid in old}
    assert all(new[pid] == old[pid] for pid in kept)
    assert {new[pid] for pid in kept} == {i for i in new.values() if i in old_instances}
    # processes started = exactly the changed instances'
    started = set(new) - kept
    assert all(new[pid] not in old_instances for pid in started)
    # removed ones were drained, then stopped; the kept ones serve only the new generation now
    assert all(not alive[pid] for pid in set(old) - kept)
    assert all(alive[pid] for pid in new)
    assert set(_serving(after, gen1)) == set(new)
    assert {pid for i in after["instances"] for pid in i["pids"]} == set(new)  # pids per instance

    # NVML: no call on GPUs whose partition did not change; new instances made before old ones go
    changed_gpus = {s[0] for s in _slots(after["instances"]) ^ _slots(before["instances"])}
    calls = after["mig"]["calls"][len(before["mig"]["calls"]):]
    assert {c[1] for c in calls} <= changed_gpus, (calls, changed_gpus)
    kinds = [c[0] for c in calls]
    made = _slots(after["instances"]) - _slots(before["instances"])
    assert kinds.count("nvmlDeviceCreateGpuInstanceWithPlacement") == len(made)
    assert kinds.count("nvmlGpuInstanceCreateComputeInstance") == len(made)
    gone = _slots(before["instances"]) - _slots(after["instances"])
    assert kinds.count("nvmlGpuInstanceDestroy") == len(gone)
    creates = [k for k, c in enumerate(kinds) if "Create" in c]
    destroys = [k for k, c in enumerate(kinds) if "Destroy" in c]
    gpu = gpu_model(after["gpu_model"])

    def overlap(a: tuple[int, int, str], b: tuple[int, int, str]) -> bool:
        return a[0] == b[0] and bool(slot_mask(gpu.profile(a[2]), a[1]) & slot_mask(gpu.profile(b[2]), b[1]))
    if creates and destroys and not any(overlap(m, g) for m in made for g in gone):
        assert max(creates) < min(destroys), kinds  # make before break: created, then destroyed
    assert _slots(after["mig"]["existing"]) == _slots(after["instances"])
    return {"kept": kept, "started": started, "calls": calls, "changed_gpus": changed_gpus, "after": after}


def _exec_node(tmp_path: Path) -> list[str]:
    """ARGS on a copy of the example node whose workers start with exec, not from the fork server:
    the MPS stand-in and this test read each client's environment from /proc/<pid>/environ, which
    shows what a process was executed with (a forked worker sets its environment in-process)."""
    import tomllib

    from jigsaw.node import load_node
    doc = tomllib.loads(EXAMPLE_NODE.read_text())
    base = EXAMPLE_NODE.resolve().parent
    apps = ", ".join(f'"{(base / a).resolve()}"' for a in doc["apps"])
    text = EXAMPLE_NODE.read_text().replace("[server]\n", "[server]\nfork_server = false\n", 1)
    text = re.sub(r"^apps = .*$", f"apps = [{apps}]", text, count=1, flags=re.M)
    profiles = load_node(EXAMPLE_NODE, load_apps=False).profiles_dir
    text = re.sub(r"^profiles_dir = .*$", f'profiles_dir = "{profiles}"', text, count=1, flags=re.M)
    path = tmp_path / "node.toml"
    path.write_text(text)
    assert not load_node(path).server.fork_server
    return [a if a != str(EXAMPLE_NODE) else str(path) for a in ARGS]


def test_replan_keeps_unchanged_instances_and_touches_only_changed_gpus(tmp_path: Path) -> None:
    with Server(_exec_node(tmp_path), tmp_path / "jigsawd.log", env=_fake_mps(tmp_path)) as server:
        started_mps = {e["pipe"] for e in _mps_log(tmp_path) if e["op"] == "start"}
        first = _replan(server, REPLAN_RPS)
        second = _replan(server, SCALE_UP_RPS)
        after = second["after"]
        metrics = str(http("GET", f"{server.url}/metrics")[1])
        log = server.log()
        events = _mps_log(tmp_path)
        environ = {p["pid"]: Path(f"/proc/{p['pid']}/environ").read_bytes().split(b"\0")
                   for p in after["processes"]}
    # the first re-plan keeps some instances and changes others (else this test shows nothing)
    assert first["kept"] and first["started"], first
    assert f"{len(first['kept'])} processes kept, {len(first['started'])} started" in log
    assert second["calls"] and second["changed_gpus"], second  # the scale-up repartitions a GPU
    kept_total = len(first["kept"]) + len(second["kept"])
    assert re.search(rf"jigsaw_reconfig_processes_kept_total {kept_total}\b", metrics)

    # MPS: one daemon per instance of level k > 1 or shared by processes of different tasks, private
    # directories, started before its processes (no client yet) and stopped after them (no client left)
    starts = [e for e in events if e["op"] == "start"]
    quits = [e for e in events if e["op"] == "quit"]
    assert started_mps and all(e["mode"] == "0o700" and e["clients"] == 0 for e in starts), starts
    assert all(e["visible"].startswith("MIG-") for e in starts)
    assert quits and all(e["clients"] == 0 for e in quits), quits
    instances_k = {(i["gpu"], i["start"]) for i in after["instances"] if _with_daemon(i)}
    running: set[str] = set()
    for e in events:
        (running.add if e["op"] == "start" else running.discard)(e["pipe"])
    assert len(running) == len(instances_k)
    assert len(after["mps"]["daemons"]) == len(instances_k)
    for p in after["processes"]:  # each worker reaches its own instance's daemon
        if _with_daemon(p):
            pipes = [e.split(b"=", 1)[1].decode() for e in environ[p["pid"]]
                     if e.startswith(b"CUDA_MPS_PIPE_DIRECTORY=")]
            assert len(pipes) == 1 and pipes[0] in running, (p, pipes)
            assert f"gpu{p['gpu']}-start{p['start']}-" in pipes[0], (p, pipes)


def test_keep_all_replan_switches_without_new_processes(tmp_path: Path) -> None:
    # the same demand again with a new lane mix keeps every process: at most a routing change
    with Server(ARGS, tmp_path / "jigsawd.log") as server:
        before = _layout(server.url)
        gen0 = http("GET", f"{server.url}/admin/plan")[1][APP]["generation"]
        with Load(server.url, APP) as load:
            status, doc, _ = http("POST", f"{server.url}/admin/control", {"app": APP, "replan_rps": 60},
                                  timeout_s=90)
            assert status == 200, doc
            time.sleep(0.5)
        after = _layout(server.url)
        calls = after["mig"]["calls"][len(before["mig"]["calls"]):]
    assert load.sent == load.answered, load.statuses
    assert {p["pid"] for p in before["processes"]} == {p["pid"] for p in after["processes"]}
    assert doc["generation"] >= gen0
    assert calls == []  # no GPU changed: no NVML call at all


@pytest.mark.parametrize("fault", [
    f"nvmlGpuInstanceCreateComputeInstance:{NVML_ERROR_INSUFFICIENT_RESOURCES}:0",
    "mps",
])
def test_failing_step_rolls_back_and_keeps_serving(tmp_path: Path, fault: str) -> None:
    env = _fake_mps(tmp_path)
    if fault != "mps":
        env["JIGSAW_EMULATED_NVML_FAULT"] = fault
    server = Server(ARGS, tmp_path / "jigsawd.log", env=env)
    with server:
        if fault == "mps":  # the next MPS daemon start fails (after the start-up ones)
            (tmp_path / "fail_next").write_text("1")
        gen0 = http("GET", f"{server.url}/admin/plan")[1][APP]["generation"]
        before = _layout(server.url)
        with Load(server.url, APP) as load:
            time.sleep(0.3)
            status, doc, _ = http("POST", f"{server.url}/admin/control",
                                  {"app": APP, "replan_rps": SCALE_UP_RPS},
                                  timeout_s=90)
            assert status == 200, doc
            time.sleep(0.5)
            failed = _wait_drained(server.url, gen0, timeout_s=10)
        hist = http("GET", f"{server.url}/admin/history?current=1")[1][APP]
        metrics = str(http("GET", f"{server.url}/metrics")[1])
        log = server.log()
    assert load.sent == load.answered, load.statuses
    assert load.statuses.get(200, 0) >= 0.98 * load.sent, load.statuses
    assert doc["generation"] == gen0  # rolled back: the running plan serves on
    # the same processes serve, nothing half-created: the MIG instances and MPS daemons are as before
    assert {p["pid"] for p in failed["processes"]} == {p["pid"] for p in before["processes"]}
    assert all(p["generations"] == [gen0] for p in failed["processes"])
    assert failed["instances"] == before["instances"]
    slots = {(i["gpu"], i["start"], i["profile"]) for i in before["mig"]["existing"]}
    assert {(i["gpu"], i["start"], i["profile"]) for i in failed["mig"]["existing"]} == slots
    assert failed["mps"]["daemons"] == before["mps"]["daemons"]
    errors = [e for r in hist for e in r["reconfiguration_errors"]]
    assert errors, hist
    if fault == "mps":
        assert any("MPS" in e for e in errors)
        assert re.search(r"jigsaw_mps_failures_total 1\b", metrics)
        assert re.search(r"jigsaw_reconfig_failures_total 1\b", metrics)
        assert "failed (MPS" in log
    else:
        assert any("nvmlGpuInstanceCreateComputeInstance" in e for e in errors)
        step = "nvmlGpuInstanceCreateComputeInstance"
        assert re.search(rf'jigsaw_mig_failures_total\{{step="{step}"\}} 1', metrics)
        assert "MIG reconfiguration failed" in log
