"""One node, one layout: a running jigsawd lays every app out against the others, creates the MIG
instances through (emulated) NVML, and an NVML failure mid-way keeps the running plan serving."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from dpserver import EXAMPLE_NODE, Load, Server, http

from jigsaw.gpu.emulated_nvml import NVML_ERROR_INSUFFICIENT_RESOURCES
from jigsaw.gpu.layout import NodeInstance, NodeLayout, validate_node_layout
from jigsaw.mig import share_host
from jigsaw.node import load_node
from jigsaw.plan import Plan

APP = "traffic_analysis"


def _node_layout(doc: dict) -> NodeLayout:
    return NodeLayout(doc["gpu_model"], doc["num_gpus"], tuple(
        NodeInstance(gpu=i["gpu"], profile=i["profile"], start=i["start"], app=i["app"], task=i["task"],
                     variant=i["variant"], mps=i["mps"], max_batch=i["max_batch"], index=i["index"],
                     seat=i.get("seat", 0))
        for i in doc["instances"]))


def _slots(instances: list[dict]) -> set[tuple[int, int, str]]:
    """The MIG instances (GPU, start, profile): the shares of one instance are that instance."""
    return {(i["gpu"], i["start"], share_host(i["profile"]) or i["profile"]) for i in instances}


def test_three_example_apps_share_one_layout(tmp_path: Path) -> None:
    args = ["--node-config", str(EXAMPLE_NODE), "--demand", "5", "--no-controller", "--plan-time-limit", "5"]
    with Server(args, tmp_path / "jigsawd.log", ready_timeout_s=150) as server:
        status, doc, _ = http("GET", f"{server.url}/admin/layout")
        assert status == 200, doc
        plans = http("GET", f"{server.url}/admin/plan")[1]
    layout = _node_layout(doc)
    assert set(layout.apps) == {"social_media", "traffic_analysis", "ar_assistant"}
    assert validate_node_layout(layout, load_node(EXAMPLE_NODE).gpu) == []  # no overlap, no over-commit
    # each app's plan runs on exactly its part of the node layout
    for app, entry in plans.items():
        plan = Plan.from_json_dict(entry["plan"])
        assert plan.layout is not None
        placed = {(g.gpu, p.start, p.profile, p.task, p.variant)
                  for g in plan.layout.gpus for p in g.instances}
        assert placed == {(i.gpu, i.start, i.profile, i.task, i.variant) for i in layout.of_app(app)}
    # the MIG instances that exist (created through the emulated NVML) are the layout's, with UUIDs
    assert _slots(doc["mig"]["existing"]) == _slots(doc["instances"])
    assert all(i["uuid"].startswith("MIG-") for i in doc["instances"])
    # the daemon planned the apps in one decision: what ``jigsaw plan --node`` prints, layout included
    demands = ",".join(f"{app}=5" for app in plans)
    cmd = [sys.executable, "-m", "jigsaw.cli", "plan", "--node", str(EXAMPLE_NODE), "--demand", demands,
           "--time-limit", "5", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    cli = json.loads(out.stdout)["plans"]
    for app, entry in plans.items():
        served, printed = entry["plan"], cli[app]
        assert _instances(served) == _instances(printed), app
        assert served["slices_used"] == printed["slices_used"]
        assert _placed(served) == _placed(printed), app


def _instances(plan: dict) -> list[tuple]:
    return sorted((i["task"], i["variant"], i["mig_profile"], i["mps"], i["max_batch"], i["count"])
                  for i in plan["instances"])


def _placed(plan: dict) -> set[tuple]:
    return {(g["gpu"], p["start"], p["profile"], p["task"], p["variant"]) for g in plan["layout"]
            for p in g["instances"]}


def test_nvml_failure_mid_replan_keeps_serving(tmp_path: Path) -> None:
    # the second GPU-instance creation after start-up fails: the scale-up re-plan is rolled back
    # (180 rps: a plan that keeps the running instances and adds two on free slots)
    fault = f"nvmlDeviceCreateGpuInstanceWithPlacement:{NVML_ERROR_INSUFFICIENT_RESOURCES}:1"
    # (exact plans only: an anytime quick plan first would take the fault, then the exact one land)
    args = ["--node-config", str(EXAMPLE_NODE), "--apps", APP, "--demand", "40", "--bin-seconds", "3600",
            "--plan-time-limit", "5", "--anytime", "off"]
    server = Server(args, tmp_path / "jigsawd.log", env={"JIGSAW_EMULATED_NVML_FAULT": fault})
    with server:
        gen0 = http("GET", f"{server.url}/admin/plan")[1][APP]["generation"]
        before = http("GET", f"{server.url}/admin/layout")[1]
        with Load(server.url, APP) as load:
            time.sleep(0.5)
            status, doc, _ = http("POST", f"{server.url}/admin/control", {"app": APP, "replan_rps": 180},
                                  timeout_s=90)
            assert status == 200, doc
            time.sleep(0.5)
            failed = http("GET", f"{server.url}/admin/layout")[1]
            gen1 = http("GET", f"{server.url}/admin/plan")[1][APP]["generation"]
            # the fault fired once: the same re-plan now goes through
            status, doc, _ = http("POST", f"{server.url}/admin/control", {"app": APP, "replan_rps": 180},
                                  timeout_s=90)
            assert status == 200, doc
            time.sleep(0.5)
        gen2 = http("GET", f"{server.url}/admin/plan")[1][APP]["generation"]
        hist = http("GET", f"{server.url}/admin/history?current=1")[1][APP]
        metrics = http("GET", f"{server.url}/metrics")[1]
        deadline = time.monotonic() + 30  # the old generation drains, then its MIG instances go
        while time.monotonic() < deadline:
            after = http("GET", f"{server.url}/admin/layout")[1]
            if _slots(after["mig"]["existing"]) == _slots(after["instances"]):
                break
            time.sleep(0.2)
    assert load.sent == load.answered, load.statuses  # every accepted request answered
    assert load.statuses.get(200, 0) >= 0.98 * load.sent, load.statuses
    # the failure: running plan kept, nothing half-created, recorded everywhere
    assert gen1 == gen0
    assert failed["instances"] == before["instances"]
    assert _slots(failed["mig"]["existing"]) == _slots(before["mig"]["existing"])
    bad = [e for e in failed["mig"]["events"] if not e["ok"]]
    assert len(bad) == 1 and "nvmlDeviceCreateGpuInstanceWithPlacement" in bad[0]["error"], bad
    assert len(bad[0]["rolled_back"]) == 1 and bad[0]["rollback_errors"] == []
    assert any("MIG" in e or "NVML" in e for r in hist for e in r["reconfiguration_errors"]), hist
    text = metrics if isinstance(metrics, str) else str(metrics)
    assert re.search(r'jigsaw_mig_failures_total\{step="nvmlDeviceCreateGpuInstanceWithPlacement"\} 1', text)
    assert "MIG reconfiguration failed" in server.log()
    # the retry: a new generation on the new instances, the old ones destroyed once it drained
    assert gen2 > gen0
    assert _slots(after["mig"]["existing"]) == _slots(after["instances"])
    assert validate_node_layout(_node_layout(after), load_node(EXAMPLE_NODE).gpu) == []
