"""The replay's decision-to-deployment figures: per re-plan from the controller's records, their
median and max in the summary, and the flat CSV still written beside them."""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import replay  # noqa: E402


def test_deploy_seconds_take_each_replans_first_and_last_deployment() -> None:
    replans = [{"quick": {"deployed_after_s": 0.2}, "exact": {"deployed_after_s": 1.5}},
               {"quick": None, "exact": {"deployed_after_s": 0.9}},
               {"quick": {"status": "heuristic"}, "exact": {"status": "optimal"}}]  # nothing deployed
    assert replay.deploy_seconds(replans) == [[0.2, 1.5], [0.9, 0.9]]
    rows = [{k: 0 for k in replay.CSV_FIELDS} | {"slices_used_pct": 10.0, "accuracy_drop_pct": 0.0,
                                                  "deploy_s": replay.deploy_seconds(replans)}]
    got = replay._deploy_summary([d for r in rows for d in r["deploy_s"]])
    assert got["replans_deployed"] == 2
    assert got["deploy_first_median_s"] == pytest.approx(0.55) and got["deploy_first_max_s"] == 0.9
    assert got["deploy_last_max_s"] == 1.5
    f = io.StringIO()
    w = csv.DictWriter(f, fieldnames=replay.CSV_FIELDS, extrasaction="ignore")
    w.writerows(rows)
    assert "deploy_s" not in replay.CSV_FIELDS and f.getvalue()


def test_deploy_phases_split_each_replans_first_deployment() -> None:
    replans = [{"quick": {"seconds": 0.01, "deployed_after_s": 0.5,
                          "phases_s": {"mig": 0.05, "spawn": 0.2, "ready": 0.1}},
                "exact": {"seconds": 0.3, "deployed_after_s": 2.0, "phases_s": {"drain_first": 1.5}}},
               {"exact": {"seconds": 0.2, "deployed_after_s": 3.0, "phases_s": {"drains": 2.5}}},
               {"exact": {"seconds": 0.2, "deployed": False}}]  # nothing deployed: no row
    got = replay.deploy_phases(replans)
    assert len(got) == 2
    # the first plan deployed (the quick one): its own solve and phases, the rest counted as other
    assert got[0] == pytest.approx({"total": 0.5, "solve": 0.01, "mig": 0.05, "spawn": 0.2, "ready": 0.1,
                                    "ahead": 0.0, "other": 0.14})
    assert got[1]["drains"] == 2.5 and got[1]["other"] == pytest.approx(0.3)
    # a routine re-plan decided 2 s ahead of its bin: the wait for the bin hides its solve
    routine = replay.deploy_phases([{"ahead_s": 2.0, "exact": {"seconds": 0.4, "deployed_after_s": 2.3,
                                                               "phases_s": {"spawn": 0.25}}}])
    assert routine == [pytest.approx({"total": 2.3, "spawn": 0.25, "ahead": 2.0, "solve": 0.05,
                                      "other": 0.0})]
    s = replay._phase_summary(got)
    assert s["deploy_phases_s"]["drains"] == {"median": 1.25, "max": 2.5, "sum": 2.5}
    assert s["deploy_slowest_s"]["total"] == 3.0 and s["deploy_slowest_s"]["drains"] == 2.5
    assert replay._phase_summary([]) == {"deploy_phases_s": {}, "deploy_slowest_s": {}}


def test_a_kept_replan_is_no_deployment_and_is_counted_apart() -> None:
    # the spike rule turned the exact plan down ("no drain-first, nothing changed"): its record
    # says kept, with why, and only its decision's seconds; a second re-plan deployed
    kept = {"trigger": "bin", "quick": {"deployed": False, "seconds": 0.01},
            "exact": {"deployed": False, "outcome": "kept", "seconds": 0.3, "decided_after_s": 4.1,
                      "why_kept": {"ar_assistant": "no drain-first, nothing changed"}}}
    moved = {"trigger": "rate", "exact": {"deployed": True, "outcome": "deployed", "seconds": 0.2,
                                          "deployed_after_s": 0.8, "phases_s": {"spawn": 0.4}}}
    replans = [kept, moved]
    assert replay.deploy_seconds(replans) == [[0.8, 0.8]]
    assert [d["total"] for d in replay.deploy_phases(replans)] == [0.8]
    assert replay.kept_replans(replans) == 1
    # a plan marked not deployed is no deployment even where its record holds a time
    assert replay.deploy_seconds([{"exact": {"deployed": False, "deployed_after_s": 4.1}}]) == []
    # a skipped plan (the deployment policy pushed nothing) is neither
    assert replay.kept_replans([{"exact": {"deployed": False}}]) == 0
    row = {k: 0 for k in replay.CSV_FIELDS} | {
        "slices_used_pct": 10.0, "accuracy_drop_pct": 0.0, "slo_violation_pct": 0.0,
        "slo_violation_paper_pct": 0.0, "deploy_s": replay.deploy_seconds(replans),
        "deploy_phases_s": replay.deploy_phases(replans), "replans_kept": replay.kept_replans(replans)}
    got = replay.summarize([row])
    assert got["replans_deployed"] == 1 and got["replans_kept"] == 1
    assert got["deploy_first_max_s"] == 0.8 and got["deploy_phases_s"]["other"]["max"] < 0.5
