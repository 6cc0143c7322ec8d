"""The example apps served (emulated) on one whole H200 through MPS shares, and the three-task
voice app on two whole L4s: each app answers, with processes of several apps' tasks on one GPU."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from dpserver import ROOT, Server, http

EXAMPLES = ROOT / "examples"


def _infer(url: str, app: str, input_name: str) -> dict:
    body = {"inputs": [{"name": input_name, "datatype": "UINT8", "shape": [4], "data": [1, 2, 3, 4]}]}
    status, answer, _ = http("POST", f"{url}/v2/models/{app}/infer", body)
    assert status == 200, (app, answer)
    return answer


def _tasks_per_gpu(url: str) -> dict[int, set[tuple[str, str]]]:
    status, layout, _ = http("GET", f"{url}/admin/layout")
    assert status == 200, layout
    per_gpu: dict[int, set[tuple[str, str]]] = defaultdict(set)
    for p in layout["processes"]:
        per_gpu[p["gpu"]].add((p["app"], p["task"]))
    return per_gpu


def test_the_example_apps_share_one_whole_h200(tmp_path: Path) -> None:
    args = ["--node-config", str(EXAMPLES / "h200x1.toml"), "--no-controller",
            "--demand", "5"]
    with Server(args, tmp_path / "jigsawd.log") as server:
        for app in ("social_media", "traffic_analysis", "ar_assistant"):
            answer = _infer(server.url, app, "image")
            assert answer["outputs"] and all(o["parameters"]["emulated"] for o in answer["outputs"])
        per_gpu = _tasks_per_gpu(server.url)
        assert list(per_gpu) == [0] and len({a for a, _ in per_gpu[0]}) == 3  # three apps, one GPU


def test_the_voice_app_runs_on_two_whole_l4s(tmp_path: Path) -> None:
    args = ["--node-config", str(EXAMPLES / "l4x2.toml"), "--no-controller", "--demand", "150"]
    with Server(args, tmp_path / "jigsawd.log") as server:
        answer = _infer(server.url, "voice_intent", "audio")
        assert answer["outputs"] and all(o["parameters"]["emulated"] for o in answer["outputs"])
        per_gpu = _tasks_per_gpu(server.url)
        assert set(per_gpu) <= {0, 1} and max(len(t) for t in per_gpu.values()) >= 2
