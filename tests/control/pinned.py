"""A tiny two-task app (``a`` feeds ``b``) on a one-GPU node, started from a hand-made plan whose
MIG layout is pinned.

The reconfiguration tests need to know which slots the running instances hold before a re-plan,
and profiles that force the planner's choices; ``dpserver.write_tiny`` leaves the layout to the
packer and gives every task one 1g.10gb profile, so these tests write their node here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dpserver import PROFILE_HEADER

APP = "tiny"


def instance(task: str, profile: str, count: int, latency_ms: float, rps: float) -> dict[str, Any]:
    """One row of the plan's instances: ``count`` x ``profile`` of ``<task>-v`` at MPS 1, batch 1."""
    return {"task": task, "variant": f"{task}-v", "mig_profile": profile, "mps": 1, "max_batch": 1,
            "count": count, "latency_ms": latency_ms, "throughput_rps": rps, "slices": 1}


def write_pinned(tmp_path: Path, *, latency_slo_ms: float, profiles: str, mps_levels: str,
                 node_extra: str, demand_rps: float, instances: list[dict[str, Any]],
                 placed: list[dict[str, Any]], slices_used: int) -> list[str]:
    """Write the app, its profiles (CSV rows after the header), the node (``node_extra``: more of its
    TOML after ``[planner]``) and the plan with ``placed`` as GPU 0's layout; return the daemon's
    arguments (controller on, one long bin, exact plans only)."""
    d = tmp_path / "tiny"
    (d / "profiles").mkdir(parents=True)
    (d / "app.toml").write_text(f"""name = "tiny"
latency_slo_ms = {latency_slo_ms}
staleness_ms = 1000.0
[[inputs]]
name = "image"
datatype = "UINT8"
shape = [-1]
[[tasks]]
name = "a"
kind = "classifier"
variants = [{{ name = "a-v", accuracy = 1.0 }}]
[[tasks]]
name = "b"
kind = "classifier"
variants = [{{ name = "b-v", accuracy = 1.0 }}]
[[edges]]
from = "a"
to = "b"
factor = 1.0
""")
    (d / "profiles" / "tiny.csv").write_text(PROFILE_HEADER + profiles)
    (d / "node.toml").write_text(f"""name = "tiny-node"
apps = ["app.toml"]
[gpus]
model = "H100-80GB"
count = 1
mps_levels = {mps_levels}
batch_sizes = [1]
profiles_dir = "profiles"
backend = "emulated"
[planner]
hop_latency_ms = 0.0
""" + node_extra)
    plan = {"app": APP, "space": "ast", "demand_rps": demand_rps, "planned_rps": demand_rps, "feasible": True,
            "max_demand_plan": False, "status": "optimal", "objective": 0.0, "accuracy": 1.0,
            "slices_used": slices_used, "slices_available": 7, "solve_seconds": 0.0, "gap": 0.0,
            "instances": instances,
            "lanes": [{"variants": {"a": "a-v", "b": "b-v"}, "rate_rps": demand_rps}],
            "task_latency_ms": {i["task"]: i["latency_ms"] for i in instances},
            "gpu_model": "H100-80GB", "layout": [{"gpu": 0, "instances": placed}]}
    (d / "plan.json").write_text(json.dumps(plan))
    return ["--node-config", str(d / "node.toml"), "--plan", str(d / "plan.json"), "--controller",
            "--bin-seconds", "3600", "--plan-time-limit", "30", "--anytime", "off"]
