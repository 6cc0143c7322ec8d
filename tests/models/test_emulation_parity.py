"""The emulated backend answers as the real one does: the same output names, datatypes and ranks,
item for item, for every task kind of the example apps (run under onnxruntime beside it) and for
a repository model (the ``byom`` example's ONNX graph); and it fans out as the real pipelines
do: one child per item on a plain edge, the edge's declared factor on a transform's edge."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jigsaw.backends.base import Downstream, ItemResult, OutputSpec
from jigsaw.backends.emulated import EmulatedBackend
from jigsaw.tensors import encode_tensors

pytest.importorskip("onnxruntime")
ROOT = Path(__file__).resolve().parents[2]


def _signature(r: ItemResult) -> list[tuple[str, str, int]]:
    assert not r.error, r.error
    return [(t.name, t.datatype, len(t.shape)) for t in r.outputs]


def _image(h: int, w: int, seed: int = 0) -> bytes:
    from jigsaw.models.images import street_scene
    img = street_scene(h, w, seed=seed)
    return bytes(encode_tensors([("image", "UINT8", img.shape, img)]))


def _pair(task: str, kind: str, variant: str, downstream: list[Downstream], payload: bytes
          ) -> tuple[ItemResult, ItemResult]:
    from jigsaw.backends.onnxruntime_backend import OnnxRuntimeBackend
    real = OnnxRuntimeBackend(task, kind, downstream, threads=1)
    real.load(variant, 2)
    emulated = EmulatedBackend(task, kind, downstream)
    emulated.load(variant, 2)
    try:
        return real.execute([7], [payload])[0], emulated.execute([7], [payload])[0]
    finally:
        real.close()


def test_zoo_tasks_answer_with_the_real_names_and_children():
    """The traffic and AR apps' kinds: detector -> classifier (a crop, its box echoed),
    captioner -> tts; each real item beside the emulated one of the same task."""
    det = [Downstream("car", 2.0), Downstream("person", 0.6)]
    real, emu = _pair("detect", "detector", "yolov5n", det, _image(120, 200))
    assert _signature(real) == _signature(emu)
    assert set(real.children) == set(emu.children) == {"car", "person"}
    crop = next(iter(real.children["car"] + real.children["person"]), None)
    if crop is None:  # (a scene without detections: a hand-made crop with a box, as the detector makes)
        img = np.zeros((64, 64, 3), np.uint8)
        crop = bytes(encode_tensors([("image", "UINT8", img.shape, img),
                                     ("box", "FP32", (1, 4), np.ones((1, 4), np.float32))]))
    emu_crop = (emu.children["car"] + emu.children["person"] or [b""])[0]
    real_cls, _ = _pair("car", "classifier", "efficientnet-b0", [], crop)
    emu_cls = EmulatedBackend("car", "classifier").execute([7], [emu_crop])[0] if emu_crop else None
    assert emu_cls is None or _signature(real_cls) == _signature(emu_cls)  # label, score, box
    assert [t.name for t in real_cls.outputs] == ["label", "score", "box"]
    real_root, emu_root = _pair("car", "classifier", "efficientnet-b0", [], _image(64, 64))
    assert _signature(real_root) == _signature(emu_root) == [("label", "INT32", 1), ("score", "FP32", 1)]
    real_cap, emu_cap = _pair("caption", "captioner", "git-tiny", [Downstream("speak", 1.0)], _image(32, 32))
    assert _signature(real_cap) == _signature(emu_cap)
    assert [len(real_cap.children["speak"]), len(emu_cap.children["speak"])] == [1, 1]
    real_tts, emu_tts = _pair("speak", "tts", "vits-tiny", [], real_cap.children["speak"][0])
    assert _signature(real_tts) == _signature(emu_tts)
    out = {t.name: t for t in emu_tts.outputs}
    assert out["audio"].shape[1] == int(np.frombuffer(out["audio_samples"].data, "<i8")[0])


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The byom example with its ONNX model exported (the export needs torch)."""
    pytest.importorskip("torch")
    d = tmp_path_factory.mktemp("byom") / "byom"
    shutil.copytree(ROOT / "examples" / "byom", d, ignore=shutil.ignore_patterns("models", "profiles",
                                                                                   "__pycache__"))
    done = subprocess.run([sys.executable, str(d / "export_digitnet.py")], capture_output=True, text=True,
                          timeout=240, check=False)
    assert done.returncode == 0, done.stderr
    return d / "digits.toml"


def test_a_repository_model_answers_with_its_graph_outputs_and_its_transforms_fan_out(digits: Path):
    from jigsaw.app import load_app
    from jigsaw.backends.onnxruntime_backend import OnnxRuntimeBackend
    from jigsaw.backends.registry import backend_kind
    app = load_app(digits)
    model = app.task("glance").variants[0].resolved
    assert model is not None
    edge = app.edge("glance", "recheck")
    down = [Downstream("recheck", edge.factor("digitnet"), edge.transform, str(digits.parent))]
    real = OnnxRuntimeBackend("glance", "generic", down, threads=1, model=model)
    real.load("digitnet", 4)
    graph = [OutputSpec(o.name, o.datatype, (1, *o.item_shape)) for o in model.outputs]
    emulated = EmulatedBackend("glance", "generic", down, outputs=graph)
    rng = np.random.default_rng(0)
    payloads = [bytes(encode_tensors([("image", "FP32", (1, 28, 28), rng.random((1, 28, 28), np.float32))]))
                for _ in range(8)]
    got_real = real.execute(list(range(8)), payloads)
    got_emu = emulated.execute(list(range(8)), payloads)
    real.close()
    assert {tuple(_signature(r)) for r in got_real} == {tuple(_signature(r)) for r in got_emu} == \
        {(("logits", "FP32", 2),)}
    # the answered names are the same on both backends: the graph's
    assert [s.name for s in backend_kind("emulated").task_output_specs(app, "glance")] == \
        [s.name for s in backend_kind("onnxruntime").task_output_specs(app, "glance")] == ["logits"]
    assert all(len(r.children["recheck"]) in (0, 2) for r in got_real)  # the transform's: none or two
    assert all(len(r.children["recheck"]) == 2 for r in got_emu)  # the declared factor (2.0, whole)
    poisson = EmulatedBackend("glance", "generic", [Downstream("recheck", 0.5, edge.transform)],
                              outputs=graph).execute(list(range(2000)), payloads[:1] * 2000)
    assert abs(np.mean([len(r.children["recheck"]) for r in poisson]) - 0.5) < 0.05
    plain = EmulatedBackend("glance", "generic", [Downstream("recheck", 3.0)], outputs=graph)
    assert [len(r.children["recheck"]) for r in plain.execute([1, 2], payloads[:2])] == [1, 1]
