"""Drain first, through ``jigsawd``: a re-plan whose new MIG instances need the slots of running
ones on a full GPU, with an NVML or MPS fault at each step after the drain (the node goes back to
the running plan), and a re-plan that would leave the app without a lane while those drain
(refused; the running plan serves on).

The app is tiny and its profiles make the planner's choices known: ``a`` runs on 1g.10gb, ``b``
on 1g.10gb (50 rps) or 2g.20gb at MPS level 2 (500 rps: an MPS daemon per instance). The node
starts from a hand-made plan that fills the GPU with 1g.10gb instances (a at start 0, b at 1..6).
At 1025 rps the planner keeps a and one b and asks for two 2g.20gb instances of b (starts 2 and
4: b's 1g instances there drain first); at 1500 rps it asks for three 2g.20gb instances, which
need every slot (no lane left to serve).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from dpserver import Load, Server, http
from mps_standin import fake_mps
from pinned import APP, instance, write_pinned

from jigsaw.gpu.emulated_nvml import NVML_ERROR_IN_USE, NVML_ERROR_INSUFFICIENT_RESOURCES

SWAP_RPS = 1025  # a and one b kept, two 2g.20gb instances of b over four of b's 1g.10gb ones
HELD_RPS = 200  # the running plan (300 rps) holds it; the planner's is smaller: b on one 2g.20gb
ALL_RPS = 1500  # three 2g.20gb instances of b: every slot is in the way

PROFILES = """a-v,1g.10gb,1,1,0.2,5000.000,100,modeled,,,
b-v,1g.10gb,1,1,20.0,50.000,100,modeled,,,
b-v,2g.20gb,2,1,4.0,500.000,100,modeled,,,
"""


def _args(tmp_path: Path, node_extra: str = "") -> list[str]:
    placed = [{"profile": "1g.10gb", "start": 0, "task": "a", "variant": "a-v", "index": 0}]
    placed += [{"profile": "1g.10gb", "start": s, "task": "b", "variant": "b-v", "index": s - 1}
               for s in range(1, 7)]
    return write_pinned(tmp_path, latency_slo_ms=2000.0, profiles=PROFILES, mps_levels="[1, 2]",
                        node_extra=node_extra, demand_rps=300.0,
                        instances=[instance("a", "1g.10gb", 1, 0.2, 5000.0),
                                   instance("b", "1g.10gb", 6, 20.0, 50.0)],
                        placed=placed, slices_used=7)


def _layout(url: str) -> dict[str, Any]:
    status, doc, _ = http("GET", f"{url}/admin/layout")
    assert status == 200, doc
    return doc


def _slots(instances: list[dict[str, Any]]) -> set[tuple[int, int, str]]:
    return {(i["gpu"], i["start"], i["profile"]) for i in instances}


def _pids(doc: dict[str, Any]) -> set[int]:
    return {p["pid"] for p in doc["processes"]}


def _settle(url: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """The layout once one generation serves every process and the MIG instances match it."""
    deadline = time.monotonic() + timeout_s
    while True:
        doc = _layout(url)
        gens = {g for p in doc["processes"] for g in p["generations"]}
        if (len(gens) == 1 and _slots(doc["mig"]["existing"]) == _slots(doc["instances"])) \
                or time.monotonic() > deadline:
            return doc
        time.sleep(0.2)


def _replan(server: Server, rps: float) -> tuple[dict[str, Any], dict[str, Any], Load]:
    before = _layout(server.url)
    with Load(server.url, APP, threads=4, pause_s=0.02) as load:
        time.sleep(0.5)
        status, doc, _ = http("POST", f"{server.url}/admin/control", {"app": APP, "replan_rps": rps},
                              timeout_s=120)
        assert status == 200, doc
        time.sleep(0.5)
    return before, doc, load


class Replanned(NamedTuple):
    """What a re-plan under load did: the generation before it, the layouts before and once settled,
    the control call's answer, the load, the current bin's history, ``/metrics`` and the log."""

    gen0: int
    before: dict[str, Any]
    doc: dict[str, Any]
    load: Load
    after: dict[str, Any]
    hist: list[dict[str, Any]]
    metrics: str
    log: str


def _replanned(server: Server, rps: float) -> Replanned:
    gen0 = http("GET", f"{server.url}/admin/plan")[1][APP]["generation"]
    before, doc, load = _replan(server, rps)
    after = _settle(server.url)
    hist = http("GET", f"{server.url}/admin/history?current=1")[1][APP]
    return Replanned(gen0, before, doc, load, after, hist, str(http("GET", f"{server.url}/metrics")[1]),
                     server.log())


def _running(doc: dict[str, Any]) -> dict[tuple[int, int, str], list[int]]:
    """(GPU, start, profile) -> the pids serving on it."""
    return {(i["gpu"], i["start"], i["profile"]): i["pids"] for i in doc["instances"]}


def _mutations(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    calls = after["mig"]["calls"][len(before["mig"]["calls"]):]
    return [c[0] for c in calls if "Create" in c[0] or "Destroy" in c[0]]


CREATE_GI = "nvmlDeviceCreateGpuInstanceWithPlacement"
CREATE_CI = "nvmlGpuInstanceCreateComputeInstance"
DESTROY_GI = "nvmlGpuInstanceDestroy"
FAULTS = {  # the step after the drain that fails -> JIGSAW_EMULATED_NVML_FAULT ("mps": the stand-in's)
    "destroy": f"{DESTROY_GI}:{NVML_ERROR_IN_USE}:1",  # the second instance in the way stays
    "create_gpu_instance": f"{CREATE_GI}:{NVML_ERROR_INSUFFICIENT_RESOURCES}:0",
    "create_compute_instance": f"{CREATE_CI}:{NVML_ERROR_INSUFFICIENT_RESOURCES}:1",  # the second new one
    "mps": "",  # the new instances' MPS daemon does not start
}


@pytest.mark.parametrize("step", sorted(FAULTS))
def test_failure_after_the_drain_restores_the_running_plan(tmp_path: Path, step: str) -> None:
    env = fake_mps(tmp_path)
    if FAULTS[step]:
        env["JIGSAW_EMULATED_NVML_FAULT"] = FAULTS[step]
    with Server(_args(tmp_path), tmp_path / "jigsawd.log", env=env) as server:
        if step == "mps":
            (tmp_path / "fail_next").write_text("1")
        gen0, before, doc, load, after, hist, metrics, log = _replanned(server, SWAP_RPS)
    assert load.sent == load.answered, load.statuses  # every accepted request answered once
    assert load.statuses.get(200, 0) >= 0.98 * load.sent, load.statuses
    assert "draining those first" in log  # the fault came after the drain
    # the running plan serves again: the same instances on the same slots, MIG as before
    assert doc["generation"] > gen0
    assert [(i["start"], i["profile"], i["task"]) for i in after["instances"]] == \
        [(i["start"], i["profile"], i["task"]) for i in before["instances"]]
    assert _slots(after["mig"]["existing"]) == _slots(before["mig"]["existing"])  # nothing half-created
    assert after["mps"]["daemons"] == []  # the new instances' MPS daemons stopped with them
    # the processes the drain kept are the same ones; the drained instances' were started again
    old, now = _running(before), _running(after)
    drained = {(0, s, "1g.10gb") for s in (2, 3, 4, 5)}
    assert all(now[k] == old[k] for k in old if k not in drained), (old, now)
    assert all(len(now[k]) == 1 and now[k] != old[k] for k in drained), (old, now)
    # recorded: the history, the log and /metrics
    errors = [e for r in hist for e in r["reconfiguration_errors"]]
    assert any("rolled back: the running plan serves again" in e for e in errors), errors
    assert "the running plan serves again" in log
    assert re.search(r'jigsaw_reconfig_drain_first_total\{outcome="restored"\} 1\b', metrics), metrics
    if step == "mps":
        assert any("MPS" in e for e in errors), errors
    else:
        assert any(FAULTS[step].split(":")[0] in e for e in errors), errors


def test_restore_that_fails_too_serves_on_the_interim_plan(tmp_path: Path) -> None:
    # the new instance's creation fails after the drain, and so does the first re-creation of a
    # drained one: the interim plan (a and the b instances that did not drain) serves on, loudly
    fault = f"{CREATE_GI}:{NVML_ERROR_INSUFFICIENT_RESOURCES}:0"
    env = {"JIGSAW_EMULATED_NVML_FAULT": f"{fault},{fault}"}
    with Server(_args(tmp_path), tmp_path / "jigsawd.log", env=env) as server:
        gen0 = http("GET", f"{server.url}/admin/plan")[1][APP]["generation"]
        before, doc, load = _replan(server, SWAP_RPS)
        after = _settle(server.url)
        with Load(server.url, APP, threads=2) as again:  # and it serves
            time.sleep(0.5)
        hist = http("GET", f"{server.url}/admin/history?current=1")[1][APP]
        metrics = str(http("GET", f"{server.url}/metrics")[1])
        log = server.log()
    assert load.sent == load.answered, load.statuses
    assert again.sent == again.answered and again.statuses.get(200, 0) == again.sent, again.statuses
    assert doc["generation"] > gen0  # the interim generation
    old, now = _running(before), _running(after)
    assert set(now) == set(old) - {(0, s, "1g.10gb") for s in (2, 3, 4, 5)}
    assert all(now[k] == old[k] for k in now)  # the same processes
    assert _slots(after["mig"]["existing"]) == set(now)  # nothing half-created
    errors = [e for r in hist for e in r["reconfiguration_errors"]]
    assert any("RESTORING THE RUNNING PLAN FAILED TOO" in e for e in errors), errors
    assert "RESTORING THE RUNNING PLAN FAILED TOO" in log
    assert re.search(r'jigsaw_reconfig_drain_first_total\{outcome="restore_failed"\} 1\b', metrics)
    step = CREATE_GI  # counted once per failing call
    assert re.search(rf"jigsaw_mig_failures_total\{{step=\"{step}\"\}} 2\b", metrics), \
        [m for m in metrics.splitlines() if "mig_failures" in m]


def test_drain_first_refused_when_no_lane_would_serve(tmp_path: Path) -> None:
    # three 2g.20gb instances need every slot: a and b would both drain at once, so the re-plan is
    # refused before anything changes; then a re-plan that leaves a lane goes through
    with Server(_args(tmp_path), tmp_path / "jigsawd.log") as server:
        gen0, before, doc, load, after, hist, metrics, log = _replanned(server, ALL_RPS)
        _, swapped, _ = _replan(server, SWAP_RPS)
        done = str(http("GET", f"{server.url}/metrics")[1])
    assert load.sent == load.answered and load.statuses.get(200, 0) == load.sent, load.statuses
    assert doc["generation"] == gen0  # the running plan serves on: same generation, same pids
    assert _pids(after) == _pids(before)
    assert after["instances"] == before["instances"]
    assert _mutations(before, after) == []  # no MIG instance created or destroyed
    errors = [e for r in hist for e in r["reconfiguration_errors"]]
    assert any("drain-first refused" in e and "no lane" in e for e in errors), errors
    assert "re-plan refused" in log
    assert re.search(r'jigsaw_reconfig_drain_first_total\{outcome="refused"\} 1\b', metrics), metrics
    assert swapped["generation"] > gen0
    assert re.search(r'jigsaw_reconfig_drain_first_total\{outcome="done"\} 1\b', done), done


def test_no_drain_first_for_a_better_plan_when_the_running_one_holds(tmp_path: Path) -> None:
    # at 200 rps the running plan (300 rps on 7 slices) holds the demand; the planner's plan runs b
    # on one 2g.20gb instance (3 slices), whose slots b's running 1g.10gb instances hold. That
    # plan is not worth a drain-first: the running plan serves on, nothing is created or destroyed
    with Server(_args(tmp_path), tmp_path / "jigsawd.log") as server:
        gen0, before, doc, load, after, _, metrics, log = _replanned(server, HELD_RPS)
    assert load.sent == load.answered and load.statuses.get(200, 0) == load.sent, load.statuses
    assert "no drain-first" in log and "draining those first" not in log
    assert doc["generation"] == gen0  # the running plan serves on: same generation, same pids
    assert _pids(after) == _pids(before)
    assert after["instances"] == before["instances"]
    assert _mutations(before, after) == []  # no MIG instance created or destroyed
    assert re.search(r'jigsaw_reconfig_drain_first_total\{outcome="skipped"\} 1\b', metrics), metrics
