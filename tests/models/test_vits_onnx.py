"""VITS as encoder/decoder graphs: faithful to ``VitsModel``, batched without leaks, as torch under ORT."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest


def _vits(noise: bool) -> Any:
    """The tiny VITS with two duration flows (the test size has one).

    With one flow the reverse duration predictor is a fixed affine map of its noise, so with the
    noise scaled to 0 every symbol lasts the same; a second flow runs the spline conditioned on the
    text, so lengths differ between rows and the spline's export is exercised.
    """
    import torch
    from transformers import VitsModel

    from jigsaw.models.text import vits_config
    cfg = vits_config("tiny")
    cfg.duration_predictor_num_flows = 2
    if not noise:
        cfg.noise_scale = cfg.noise_scale_duration = 0.0
    torch.manual_seed(0)
    return VitsModel(cfg).eval()


def _ids(vits: Any, rows: int = 3) -> np.ndarray:
    return np.random.default_rng(0).integers(0, vits.config.vocab_size, (rows, 16))


def _torch_speaker(vits: Any, **kwargs: Any) -> Any:
    from jigsaw.models.graphs import torch_runner
    from jigsaw.models.vits_onnx import VitsSpeaker, vits_graphs
    return VitsSpeaker(vits.config, {k: torch_runner(s) for k, s in vits_graphs(vits).items()}, **kwargs)


def test_speaker_matches_vits_model_item_by_item() -> None:
    import torch
    vits = _vits(noise=False)
    ids = _ids(vits)
    got = _torch_speaker(vits)(ids)
    with torch.inference_mode():
        want = [vits(input_ids=torch.from_numpy(row)[None]).waveform[0].numpy() for row in ids]
    assert len({w.size for w in want}) == 3  # the padding is exercised
    for g, w in zip(got, want):
        assert g.dtype == np.float32 and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=0, atol=2e-5)


def test_batch_items_equal_items_run_alone() -> None:
    vits = _vits(noise=False)
    ids = _ids(vits)
    speaker = _torch_speaker(vits)
    batched = speaker(ids)
    assert len({w.size for w in batched}) == 3
    for row, got in zip(ids, batched):
        (alone,) = speaker(row[None])
        assert got.shape == alone.shape
        np.testing.assert_allclose(got, alone, rtol=0, atol=2e-5)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, Path]]:
    from jigsaw.models.graphs import export_graph
    from jigsaw.models.vits_onnx import vits_graphs
    vits = _vits(noise=True)
    out = tmp_path_factory.mktemp("vits")
    paths = {name: out / f"{name}.onnx" for name in ("encoder", "decoder")}
    specs = vits_graphs(vits)
    assert set(specs) == set(paths)
    for name, spec in specs.items():
        export_graph(spec, paths[name])
    return vits, paths


def test_onnxruntime_speaks_as_torch(exported: tuple[Any, dict[str, Path]]) -> None:
    from jigsaw.models.graphs import ort_runner
    from jigsaw.models.vits_onnx import VitsSpeaker
    vits, paths = exported
    assert vits.config.noise_scale > 0 and vits.config.noise_scale_duration > 0
    ids = _ids(vits, 4)
    ort = VitsSpeaker(vits.config, {k: ort_runner(p) for k, p in paths.items()}, seed=3)
    ref = _torch_speaker(vits, seed=3)
    for _ in range(2):  # the second call draws fresh noise from the same generator state
        got, want = ort(ids), ref(ids)
        assert [g.size for g in got] == [w.size for w in want]
        err = max(float(np.abs(g - w).max()) for g, w in zip(got, want))
        print(f"onnxruntime vs torch: max abs error {err:.2e}")
        assert err < 1e-3


def test_onnxruntime_batch_axes_are_dynamic(exported: tuple[Any, dict[str, Path]]) -> None:
    from jigsaw.models.graphs import ort_runner
    from jigsaw.models.vits_onnx import VitsSpeaker
    vits, paths = exported
    ort = VitsSpeaker(vits.config, {k: ort_runner(p) for k, p in paths.items()})
    for rows in (1, 5):
        out = ort(_ids(vits, rows))
        assert len(out) == rows and all(w.ndim == 1 and w.size % 16 == 0 and w.size > 0 for w in out)


def test_max_frames_caps_every_item() -> None:
    vits = _vits(noise=False)
    hop = int(np.prod(vits.config.upsample_rates))
    out = _torch_speaker(vits, max_frames=40)(_ids(vits))
    assert max(w.size for w in out) == 40 * hop


def test_several_speakers_are_refused() -> None:
    from jigsaw.models.text import vits_config
    from jigsaw.models.vits_onnx import VitsSpeaker
    cfg = vits_config("tiny")
    cfg.num_speakers = 2
    with pytest.raises(ValueError, match="single speaker"):
        VitsSpeaker(cfg, {})
