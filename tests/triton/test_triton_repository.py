"""Triton's repository load / unload on a node whose controller runs: unload drains the app and
gives its slices back (its name answers NOT_FOUND, the index says why), load serves it again."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import numpy as np
import pytest

grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

from jigsaw.testing import free_port, jigsawd, shm_entries  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _slices(url: str, app: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    m = re.search(rf'^jigsaw_slices_in_use{{app="{app}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else -1.0


def test_unload_then_load_with_the_controller(tmp_path: Path) -> None:
    port = free_port()
    server = jigsawd(["--node-config", str(ROOT / "examples" / "h100x4.toml"), "--demand", "5",
                      "--apps", "traffic_analysis,social_media"], tmp_path / "jigsawd.log", cwd=ROOT,
                     grpc_port=port)
    with server:
        c = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        x = grpcclient.InferInput("image", [8], "UINT8")
        x.set_data_from_numpy(np.arange(8, dtype=np.uint8))
        assert c.infer("social_media", [x]).get_response().model_name == "social_media"
        assert _slices(server.url, "social_media") > 0
        c.unload_model("social_media")  # answers once it drained and retired
        index = {m["name"]: m for m in c.get_model_repository_index(as_json=True)["models"]}
        assert (index["social_media"]["state"], index["social_media"]["reason"]) == \
            ("UNAVAILABLE", "unloaded")
        assert index["traffic_analysis"]["state"] == "READY"
        assert index["ar_assistant"]["reason"].startswith("not served by this daemon")
        with pytest.raises(InferenceServerException) as exc:
            c.infer("social_media", [x])
        assert "NOT_FOUND" in str(exc.value.status())
        assert _slices(server.url, "social_media") == 0
        with pytest.raises(InferenceServerException, match="last served app"):
            c.unload_model("traffic_analysis")
        with pytest.raises(InferenceServerException, match="needs a restart"):
            c.load_model("ar_assistant")
        c.load_model("social_media")  # answers once every process is ready and it is routed
        assert c.is_model_ready("social_media")
        assert c.infer("social_media", [x]).get_response().model_name == "social_media"
        assert _slices(server.url, "social_media") > 0
        c.close()
    assert shm_entries(server.proc.pid) == []
