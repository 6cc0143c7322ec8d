"""A running jigsawd re-plans under load: nothing lost, only changed GPUs repartitioned; admin access."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from dpserver import EXAMPLE_NODE, Load, Server, http

from jigsaw.plan import Plan
from jigsaw.planner.packer import changed_gpus
from jigsaw.testing import shm_entries

APP = "traffic_analysis"


def _plan(url: str) -> Plan:
    status, doc, _ = http("GET", f"{url}/admin/plan")
    assert status == 200
    return Plan.from_json_dict(doc[APP]["plan"])


def test_reconfiguration_under_load_loses_nothing(tmp_path: Path) -> None:
    # planned well above what the closed-loop clients send, so only a reconfiguration could fail them
    args = ["--node-config", str(EXAMPLE_NODE), "--apps", APP, "--demand", "60", "--bin-seconds", "3600",
            "--plan-time-limit", "5"]
    server = Server(args, tmp_path / "jigsawd.log")
    with server:
        before = _plan(server.url)
        gen0 = http("GET", f"{server.url}/admin/plan")[1][APP]["generation"]
        with Load(server.url, APP) as load:
            time.sleep(1.0)
            status, doc, _ = http("POST", f"{server.url}/admin/control", {"app": APP, "replan_rps": 150},
                                  timeout_s=90)
            assert status == 200, doc
            time.sleep(1.0)
            middle = _plan(server.url)
            status, doc, _ = http("POST", f"{server.url}/admin/control", {"app": APP, "replan_rps": 60},
                                  timeout_s=90)
            assert status == 200, doc
            time.sleep(1.0)
        after = _plan(server.url)
        gen2 = http("GET", f"{server.url}/admin/plan")[1][APP]["generation"]
        assert load.sent == load.answered, load.statuses
        assert load.statuses.get(-1, 0) == 0
        ok = load.statuses.get(200, 0)
        assert ok >= 0.98 * load.sent, load.statuses  # a reconfiguration does not fail requests
        assert gen2 > gen0 and middle.slices_used > before.slices_used
        hist = http("GET", f"{server.url}/admin/history")[1][APP]
        assert isinstance(hist, list)
        # let the old generations drain and be unlinked while the daemon still runs
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            names = shm_entries(server.proc.pid)  # type: ignore[union-attr]
            gens = {m.group(1) for n in names if (m := re.search(r"-g(\d+)-", n))}
            if gens == {str(gen2)}:
                break
            time.sleep(0.2)
        assert gens == {str(gen2)}, names
        layout = http("GET", f"{server.url}/admin/layout")[1]
    assert before.layout is not None and middle.layout is not None and after.layout is not None
    assert changed_gpus(before.layout, middle.layout)  # the scale-up repartitioned some GPU
    # the MIG side went through NVML (emulated), on the changed GPUs only, and what exists is the
    # layout the node runs
    changed = set(changed_gpus(before.layout, middle.layout)) | set(changed_gpus(middle.layout, after.layout))
    events = [e for e in layout["mig"]["events"] if e["reason"] != "start-up"]
    assert events and all(e["ok"] for e in events), events
    touched = {int(m) for e in events for n in e.get("created", []) + e.get("destroyed", [])
               for m in re.findall(r"^gpu(\d+)/", n)}
    assert touched and touched <= changed, (touched, changed)
    assert {(i["gpu"], i["start"], i["profile"]) for i in layout["mig"]["existing"]} == \
        {(i["gpu"], i["start"], i["profile"]) for i in layout["instances"]}
    assert "emulated repartition" not in server.log()


def test_admin_endpoints_loopback_and_token(tmp_path: Path) -> None:
    args = ["--node-config", str(EXAMPLE_NODE), "--apps", APP, "--demand", "5", "--bin-seconds", "3600",
            "--admin-token", "s3cret"]
    with Server(args, tmp_path / "jigsawd.log") as server:
        assert http("GET", f"{server.url}/admin/plan")[0] == 401
        import json
        import urllib.request
        for path in ("/admin/plan", "/admin/history"):
            req = urllib.request.Request(server.url + path, headers={"Authorization": "Bearer s3cret"})
            with urllib.request.urlopen(req, timeout=10) as r:
                assert r.status == 200 and APP in json.loads(r.read())
        req = urllib.request.Request(server.url + "/admin/plan", headers={"Authorization": "Bearer nope"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 401


def test_admin_loopback_without_token_and_static_plans(tmp_path: Path) -> None:
    args = ["--node-config", str(EXAMPLE_NODE), "--apps", APP, "--demand", "5", "--no-controller"]
    with Server(args, tmp_path / "jigsawd.log") as server:
        status, doc, _ = http("GET", f"{server.url}/admin/plan")
        assert status == 200 and doc[APP]["generation"] == 0
        assert http("GET", f"{server.url}/admin/history")[1] == {}
        assert http("POST", f"{server.url}/admin/control", {"app": APP, "replan_rps": 9})[0] == 409


def test_admin_refuses_non_loopback_clients() -> None:
    from jigsaw.control.admin import is_loopback
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("10.0.0.2") and not is_loopback(None) and not is_loopback("example.com")
