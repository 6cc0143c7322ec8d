"""App and node files: loading, derived structure, and errors that name file and field."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jigsaw.app import load_app
from jigsaw.errors import ConfigError
from jigsaw.node import load_node, load_node_profiles

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

GOOD_APP = """
name = "x"
latency_slo_ms = 100
[[tasks]]
name = "a"
variants = [{ name = "va", accuracy = 1.0 }, { name = "vb", accuracy = 2.0 }]
[[tasks]]
name = "b"
variants = [{ name = "vc", accuracy = 1.0 }]
[[edges]]
from = "a"
to = "b"
factor = { va = 2.0, vb = 3.0 }
"""


def write(tmp_path: Path, text: str, name: str = "f.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_examples_load() -> None:
    node = load_node(EXAMPLES / "h100x4.toml")
    assert node.num_gpus == 4 and node.slices_available == 28
    assert len(node.segment_types) == 7 * 4
    assert {a.name for a in node.apps} == {"social_media", "traffic_analysis", "ar_assistant"}
    assert {a.name: a.depth for a in node.apps} == {"social_media": 1, "traffic_analysis": 2,
                                                     "ar_assistant": 3}
    profiles = load_node_profiles(node)
    assert profiles.sources == {"modeled"}


def test_traffic_multipliers_and_path_shares() -> None:
    app = load_app(EXAMPLES / "apps" / "traffic_analysis.toml")
    lane = ("yolov5n", "efficientnet-b0", "vgg11")
    m = app.multipliers(lane)
    assert m == {"detect": 1.0, "car": pytest.approx(1.985), "person": pytest.approx(0.599)}
    shares = app.path_shares(lane)
    assert shares == pytest.approx([1.985 / 2.584, 0.599 / 2.584])
    acc = app.lane_accuracy(lane)
    expected = (28 / 51) * (shares[0] * 77.1 / 84.3 + shares[1] * 69.0 / 72.4)
    assert acc == pytest.approx(expected)
    assert app.max_accuracy() == pytest.approx(1.0)
    assert len(app.lanes()) == 5 * 8 * 4


def test_measured_factors_override_the_file() -> None:
    app = load_app(EXAMPLES / "apps" / "traffic_analysis.toml")
    lane = app.best_lane
    m = app.multipliers(lane, {("detect", "yolov5x", "car"): 10.0})
    assert m["car"] == 10.0 and m["person"] == pytest.approx(1.079)


def test_a_variant_serves_several_tasks(tmp_path: Path) -> None:
    app = load_app(write(tmp_path, GOOD_APP.replace('name = "vc"', 'name = "va"')))
    assert app.task("b").variants[0].name == "va" and app.task("a").variants[0].name == "va"
    assert app.lanes()[0] == ("va", "va")


@pytest.mark.parametrize(("change", "field", "words"), [
    (("latency_slo_ms = 100", "latency_slo_ms = -3"), "latency_slo_ms", "> 0"),
    (("latency_slo_ms = 100", "latency_slo_ms = 100\naccuracy_slo = 1.5"), "accuracy_slo", "<= 1"),
    (("latency_slo_ms = 100", "latency_slo_ms = 100\naccuracy_slo = 0"), "accuracy_slo", "> 0"),
    (('to = "b"', 'to = "nope"'), "edges[0].to", "unknown task 'nope'"),
    (('name = "x"', 'name = "x"\nbogus = 1'), "bogus", "unknown field"),
    (("accuracy = 2.0", "accuracy = \"high\""), "tasks[0].variants[1].accuracy", "expected a number"),
    (("factor = { va = 2.0, vb = 3.0 }", "factor = { va = 2.0 }"), "edges[0].factor.vb", "missing"),
    (('name = "vc"', 'name = "va", model = "resnet18"'), "tasks[1].variants[0].model",
     "a variant is one model"),
    (('name = "vc"', 'name = "vc", model = "nothing-here.onnx"'), "tasks[1].variants[0].model",
     "no such file"),
    (('name = "vc"', 'name = "vc", model = "lenet"'), "tasks[1].variants[0].model",
     "neither a zoo network nor a file"),
    (("factor = { va = 2.0, vb = 3.0 }", 'factor = 1\ntransform = "not a path"'), "edges[0].transform",
     "module:function"),
])
def test_app_errors_name_the_field(tmp_path: Path, change: tuple[str, str], field: str, words: str) -> None:
    path = write(tmp_path, GOOD_APP.replace(*change))
    with pytest.raises(ConfigError) as err:
        load_app(path)
    assert err.value.path == str(path)
    assert err.value.field == field
    assert words in err.value.message


def test_cyclic_graph_is_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_APP + '\n[[edges]]\nfrom = "b"\nto = "a"\n')
    with pytest.raises(ConfigError, match="cyclic"):
        load_app(path)


def test_bad_toml_syntax_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "name = \n")
    with pytest.raises(ConfigError, match="not valid TOML") as err:
        load_app(path)
    assert str(path) in str(err.value)


def _node_text(**over: str) -> str:
    text = (EXAMPLES / "h100x4.toml").read_text()
    text = text.replace('"apps/', f'"{EXAMPLES}/apps/').replace('"../profiles', f'"{ROOT}/profiles')
    for old, new in over.items():
        text = text.replace(old, new)
    return text


def test_node_mig_profile_not_in_table(tmp_path: Path) -> None:
    path = write(tmp_path, _node_text(**{"mps_levels = [1, 2, 3, 4]":
                                         'mps_levels = [1, 2, 3, 4]\nmig_profiles = ["1g.10gb", "5g.50gb"]'}))
    with pytest.raises(ConfigError) as err:
        load_node(path)
    assert err.value.field == "gpus.mig_profiles[1]" and "5g.50gb" in err.value.message


def test_node_unknown_gpu(tmp_path: Path) -> None:
    path = write(tmp_path, _node_text(**{'model = "H100-80GB"': 'model = "V100"'}))
    with pytest.raises(ConfigError, match="unknown GPU model 'V100'"):
        load_node(path)


def test_missing_profile_rows_for_a_variant(tmp_path: Path) -> None:
    app = write(tmp_path, GOOD_APP, "app.toml")
    node = write(tmp_path, _node_text(**{'apps = ["': f'apps = ["{app}", "'}), "node.toml")
    with pytest.raises(ConfigError) as err:
        load_node_profiles(load_node(node))
    assert err.value.field == "variant va" and "no profile rows" in err.value.message


def test_cli_check_reports_errors_without_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_APP.replace("latency_slo_ms = 100", "latency_slo_ms = -3"))
    proc = subprocess.run([sys.executable, "-m", "jigsaw.cli", "check", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert f"{path}: latency_slo_ms: expected a number > 0" in proc.stderr
    ok = subprocess.run([sys.executable, "-m", "jigsaw.cli", "check", str(EXAMPLES / "h100x4.toml")],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "ok: node h100x4" in ok.stdout


def test_server_http_front_end_is_checked(tmp_path: Path) -> None:
    node = load_node(write(tmp_path, _node_text()))
    assert node.server.http == "fast" and node.server.header_timeout_s == 10.0
    path = write(tmp_path, _node_text(**{"[server]": '[server]\nhttp = "nginx"'}))
    with pytest.raises(ConfigError) as err:
        load_node(path)
    assert err.value.field == "server.http" and "fast, aiohttp" in err.value.message


def test_server_fork_server_is_a_bool(tmp_path: Path) -> None:
    assert load_node(write(tmp_path, _node_text())).server.fork_server  # on by default
    off = load_node(write(tmp_path, _node_text(**{"[server]": "[server]\nfork_server = false"})))
    assert not off.server.fork_server
    with pytest.raises(ConfigError) as err:
        load_node(write(tmp_path, _node_text(**{"[server]": '[server]\nfork_server = "yes"'})))
    assert err.value.field == "server.fork_server"
