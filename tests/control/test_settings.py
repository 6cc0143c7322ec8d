"""The node file's settings, declared once (node.py): defaults, bounds, errors naming file and
field, removed keys naming what replaced them, and the reference page generated from them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from pydantic import ValidationError

from jigsaw import node as node_module
from jigsaw.errors import ConfigError
from jigsaw.node import (
    SECTIONS,
    ControlSettings,
    PlannerSettings,
    ServerSettings,
    load_node,
    settings_reference,
)

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = '[gpus]\nmodel = "H100-80GB"\ncount = 1\n'


def _node(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(MINIMAL + extra)
    return path


def test_a_file_without_sections_gets_the_declared_defaults(tmp_path: Path) -> None:
    node = load_node(_node(tmp_path, ""))
    assert node.planner == PlannerSettings() and node.server == ServerSettings()
    assert node.control == ControlSettings()
    assert node.control.bin_seconds == 300.0 and node.server.host == "127.0.0.1"


def test_settings_load_with_toml_types_and_integers_as_numbers(tmp_path: Path) -> None:
    node = load_node(_node(tmp_path, "[control]\nbin_seconds = 5\npredictor = \"mean\"\n"
                                     "[planner]\napp_weights = { b = 2, a = 0.5 }\n"
                                     "[server]\nlane_shift = false\n"), load_apps=False)
    assert node.control.bin_seconds == 5.0 and isinstance(node.control.bin_seconds, float)
    assert node.control.predictor == "mean" and not node.server.lane_shift
    assert node.planner.app_weights == (("a", 0.5), ("b", 2.0)) and node.planner.app_weight("c") == 1.0


@pytest.mark.parametrize(("text", "field", "message"), [
    ("[control]\nbin_seconds = 0", "control.bin_seconds", "expected a number > 0, got 0"),
    ("[control]\nhistory_bins = 2.5", "control.history_bins", "expected an integer, got float 2.5"),
    ("[control]\nreplan_on_rate = 1", "control.replan_on_rate", "expected true or false, got int 1"),
    ("[control]\npredictor = \"oracle\"", "control.predictor",
     "expected one of profile, mean, got 'oracle'"),
    ("[control]\nno_such = 1", "control.no_such", "unknown field (expected one of: "),
    ("[server]\nport = 70000", "server.port", "expected a number <= 65535, got 70000"),
    ("[server]\nhttp = \"nginx\"", "server.http", "expected one of fast, aiohttp"),
    ("[planner]\nspace = \"xyz\"", "planner.space", "expected one of unopt"),
    ("[planner]\napp_weights = { a = -1 }", "planner.app_weights", "app_weights.a: expected a number >= 0"),
    ("[planner]\ntime_limit_s = \"10\"", "planner.time_limit_s", "expected a number, got str '10'"),
    ("[control]\nend_wait_outgrown_above = 0.5", "control.end_wait_outgrown_above",
     "expected 0 (off) or a number >= 1"),
])
def test_a_bad_setting_names_file_field_and_what_was_expected(tmp_path: Path, text: str, field: str,
                                                              message: str) -> None:
    path = _node(tmp_path, text + "\n")
    with pytest.raises(ConfigError) as err:
        load_node(path)
    assert err.value.path == str(path) and err.value.field == field
    assert message in err.value.message


def test_a_removed_key_names_what_replaced_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(node_module.REMOVED_CONTROL, "old_switch", "control.new_setting")
    path = _node(tmp_path, "[control]\nold_switch = true\n")
    with pytest.raises(ConfigError) as err:
        load_node(path)
    assert err.value.field == "control.old_switch" and "control.new_setting" in err.value.message


def test_replace_validates_like_the_file() -> None:
    with pytest.raises(ValidationError):
        dataclasses.replace(ControlSettings(), history_bins=0)
    assert dataclasses.replace(ControlSettings(), history_bins=3).history_bins == 3


def test_every_setting_has_a_one_line_meaning() -> None:
    for _, cls in SECTIONS:
        for name, info in cls.__pydantic_fields__.items():
            assert info.description and "\n" not in info.description, name
            assert len(info.description) <= 160, name


def test_the_reference_page_is_generated_from_the_declarations() -> None:
    page = (ROOT / "docs" / "node-settings.md").read_text()
    assert page == settings_reference(), "regenerate: python -m jigsaw.node > docs/node-settings.md"
    for _, cls in SECTIONS:
        for f in dataclasses.fields(cls):
            assert f"| `{f.name}` |" in page


def test_the_example_nodes_load() -> None:
    for name in ("h100x4.toml", "a100x4.toml", "cpu.toml"):
        load_node(ROOT / "examples" / name)


def test_the_removed_drain_switches_name_what_replaced_them(tmp_path: Path) -> None:
    for key, says in (("wait_drains_when_needed", "making-room policy"), ("cut_drains", "measured worse"),
                      ("drain_first_wait_slo", "control.drain_wait_slo"),
                      ("rate_trigger_z", "control.rate_window_grow_z")):
        path = _node(tmp_path, f"[control]\n{key} = 1\n")
        with pytest.raises(ConfigError) as err:
            load_node(path)
        assert err.value.path == str(path) and err.value.field == f"control.{key}"
        assert err.value.message.startswith("removed: ") and says in err.value.message, err.value.message
