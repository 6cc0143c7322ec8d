"""A process a re-plan kept dies while the old generation drains: the old generation's requests
that had work on it are settled at once (dispatched again on the new generation, or answered 503
with a message), not left to their deadline; the process is restarted on the new generation.

The app is tiny: ``a`` (fast) feeds ``b`` (one second per item, so items queue in each ``b``
process). The node starts from a hand-made plan (a x1, b x2); at 3.5 rps the planner keeps all
three processes and adds two of ``b``. The SLO is 30 s: a request left to its deadline would hang
far past the bound the test sets.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from dpserver import Load, Server, http
from pinned import APP, instance, write_pinned

PROFILES = """a-v,1g.10gb,1,1,1.0,1000.000,100,modeled,,,
b-v,1g.10gb,1,1,1000.0,1.000,100,modeled,,,
"""
NODE_EXTRA = """[control]
replan_on_rate = false
replan_violation_rate = 1.0
"""
BOUND_S = 10.0  # from the kill until every request sent is answered and the old generation is gone


def slow_b_args(tmp_path: Path, node_extra: str = "") -> list[str]:
    """The daemon arguments of the node (``node_extra``: more of its TOML, e.g. a ``[server]``)."""
    placed = [{"profile": "1g.10gb", "start": 0, "task": "a", "variant": "a-v", "index": 0},
              *({"profile": "1g.10gb", "start": s, "task": "b", "variant": "b-v", "index": s - 1}
                for s in (1, 2))]
    return write_pinned(tmp_path, latency_slo_ms=30000.0, profiles=PROFILES, mps_levels="[1]",
                        node_extra=NODE_EXTRA + node_extra, demand_rps=2.0,
                        instances=[instance("a", "1g.10gb", 1, 1.0, 1000.0),
                                   instance("b", "1g.10gb", 2, 1000.0, 1.0)],
                        placed=placed, slices_used=3)


def test_kept_worker_dying_during_the_drain_settles_the_old_generation_at_once(tmp_path: Path) -> None:
    with Server(slow_b_args(tmp_path), tmp_path / "jigsawd.log") as server:
        gen0 = http("GET", f"{server.url}/admin/plan")[1][APP]["generation"]
        load = Load(server.url, APP, threads=4, pause_s=0.01)
        with load:
            time.sleep(1.5)  # every b process holds items of generation 0
            status, doc, _ = http("POST", f"{server.url}/admin/control", {"app": APP, "replan_rps": 3.5},
                                  timeout_s=120)
            assert status == 200, doc
            gen1 = doc["generation"]
            layout = http("GET", f"{server.url}/admin/layout")[1]
            kept = [p for p in layout["processes"] if p["task"] == "b" and gen0 in p["generations"]
                    and gen1 in p["generations"]]
            assert kept, layout["processes"]
            victim = kept[0]["pid"]
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()
            time.sleep(0.5)
        answered_s = time.monotonic() - killed_at  # the clients' last requests were answered by now
        deadline = killed_at + BOUND_S
        while True:  # the old generation drains (nothing of it left unsettled) and retires
            layout = http("GET", f"{server.url}/admin/layout")[1]
            if all(p["generations"] == [gen1] for p in layout["processes"]) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        retired_s = time.monotonic() - killed_at
        events = http("GET", f"{server.url}/admin/workers")[1]["events"]
        log = server.log()
    assert gen1 > gen0
    assert load.sent == load.answered, load.statuses  # every accepted request answered once
    assert set(load.statuses) <= {200, 503}, load.statuses  # no deadline (504), no hang (-1)
    assert answered_s < BOUND_S and retired_s < BOUND_S, (answered_s, retired_s, log)
    assert all(p["generations"] == [gen1] for p in layout["processes"]), layout["processes"]
    # the failure settled the old generation's requests too, and the process serves again
    event = next(e for e in events if e["pid"] == victim)
    assert event["generation"] == gen1 and event["older_generations"] == [gen0], event
    assert event["retried_requests"] + event["failed_requests"] >= 1, event
    assert victim not in {p["pid"] for p in layout["processes"]}
    assert len([p for p in layout["processes"] if p["task"] == "b"]) == 4
    assert "unsettled after drain" not in log
