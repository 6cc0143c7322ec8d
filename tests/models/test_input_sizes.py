"""The node serves its zoo models at the image sizes their profile rows were measured at."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from jigsaw.app import load_app
from jigsaw.errors import JigsawError
from jigsaw.models.input_sizes import serve_at_measured_sizes
from jigsaw.profiles import ProfileTable, load_profiles

ROOT = Path(__file__).resolve().parents[2]


def test_the_example_cpu_node_serves_at_its_measured_sizes() -> None:
    app = load_app(ROOT / "examples" / "apps" / "traffic_cpu.toml")
    profiles = load_profiles(ROOT / "profiles" / "cpu-2c")
    lines: list[str] = []
    env: dict[str, str] = {}
    serve_at_measured_sizes([app], profiles, lines.append, env)
    assert env == {"JIGSAW_DETECTOR_SIZE": "320", "JIGSAW_CLASSIFIER_SIZE": "96"}
    assert any("at 320px" in line and "yolov5n" in line for line in lines)
    lines.clear()
    env = {"JIGSAW_DETECTOR_SIZE": "640", "JIGSAW_CLASSIFIER_SIZE": "96"}  # asked for another size
    serve_at_measured_sizes([app], profiles, lines.append, env)
    assert env["JIGSAW_DETECTOR_SIZE"] == "640"
    assert len(lines) == 1 and "warning" in lines[0] and "measured at 320px" in lines[0]
    # rows measured at two sizes cannot both hold
    rows = [r if r.variant != "yolov5s" else replace(r, input="640px") for r in profiles.rows()]
    with pytest.raises(JigsawError, match="different image sizes"):
        serve_at_measured_sizes([app], ProfileTable(rows), lines.append, {})
