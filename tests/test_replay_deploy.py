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
