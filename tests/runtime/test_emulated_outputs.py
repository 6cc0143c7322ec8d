"""The emulated backend's items carry the outputs the real backends declare
(``pipeline.output_specs``), of their datatypes and ranks, without a model runtime installed; a
detector's boxes are its children's (``tests/models/test_emulation_parity.py`` runs the real one
beside it)."""

from __future__ import annotations

import numpy as np

from jigsaw.backends.base import Downstream
from jigsaw.backends.emulated import EmulatedBackend
from jigsaw.backends.pipeline import output_specs
from jigsaw.tensors import decode_tensors


def _check(kind: str, downstream: list[Downstream], payload: bytes = b"x", skip: tuple[str, ...] = ()):
    b = EmulatedBackend("t", kind, downstream)
    (item,) = b.execute([11], [payload])
    want = [(s.name, s.datatype, len(s.shape)) for s in output_specs(kind, [d.task for d in downstream])
            if s.name not in skip]
    assert [(t.name, t.datatype, len(t.shape)) for t in item.outputs] == want
    return item


def test_each_kind_answers_the_real_outputs():
    det = _check("detector", [Downstream("car", 3.0), Downstream("person", 1.0)])
    out = {t.name: t for t in det.outputs}
    n = len(det.children["car"]) + len(det.children["person"])
    assert (len(det.children["car"]), len(det.children["person"])) == (3, 1)  # whole factors are exact
    assert out["boxes"].shape == (n, 4) and out["scores"].shape == out["labels"].shape == (n,)
    boxes = np.frombuffer(out["boxes"].data, "<f4").reshape(n, 4)
    crops = [np.asarray(next(t for t in decode_tensors(c) if t.name == "box").data).reshape(4)
             for c in det.children["car"] + det.children["person"]]
    assert np.array_equal(boxes, np.stack(crops))
    cls = _check("classifier", [], det.children["car"][0])  # a crop: its box echoed
    assert bytes(next(t for t in cls.outputs if t.name == "box").data) == boxes[0].tobytes()
    _check("classifier", [], b"an image", skip=("box",))  # a root classifier: no box, as the real one
    cap = _check("captioner", [Downstream("speak", 1.0)])
    assert len(cap.children["speak"]) == 1
    tts = {t.name: t for t in _check("tts", []).outputs}
    assert tts["audio"].shape[1] == int(np.frombuffer(tts["audio_samples"].data, "<i8")[0])
    _check("generic", [])
