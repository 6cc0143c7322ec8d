"""The captioner and TTS as ONNX graphs: faithful to transformers, and what TensorRT would be given."""

from __future__ import annotations

import numpy as np
import pytest


def test_git_graphs_decode_as_generate() -> None:
    import torch

    from jigsaw.models.git_onnx import GitCaptioner, git_graphs
    from jigsaw.models.graphs import torch_runner
    from jigsaw.models.text import build_git, caption
    torch.manual_seed(1)
    git = build_git("tiny").eval()
    pixels = torch.rand(3, 3, 32, 32)
    specs = git_graphs(git, 32)
    got = GitCaptioner(git.config, {k: torch_runner(s) for k, s in specs.items()})(pixels.numpy())
    want = caption(git, pixels).numpy()
    assert got.shape == (3, 16)
    np.testing.assert_array_equal(got, want)
    # the cached step's logits equal a full forward over image + text without a cache
    with torch.inference_mode():
        ids = torch.cat([torch.full((3, 1), git.config.bos_token_id), torch.from_numpy(want[:, :4])], 1)
        full = git(pixel_values=pixels, input_ids=ids).logits[:, -1]
        logits, keys, values = specs["encode"].module(pixels)
        for t in range(4):
            token, position = ids[:, t + 1:t + 2], torch.tensor([[t + 1]])
            logits, keys, values = specs["step"].module(token, position, keys, values)
    assert float((logits - full).abs().max()) < 1e-4


@pytest.mark.parametrize("variant", ["git-tiny", "vits-tiny"])
def test_graph_exports_run_under_onnxruntime_like_torch(variant: str) -> None:
    from jigsaw.models.export import driver, export, sample_input
    from jigsaw.models.graphs import ort_runner
    from jigsaw.models.zoo import build, model_config
    ex = export(variant, force=True)
    assert set(ex.graphs) == ({"encode", "step"} if variant == "git-tiny" else {"encoder", "decoder"})
    assert all(p.exists() for p in ex.graphs.values()) and ex.max_abs_error < 1e-3
    assert export(variant).seconds == 0.0  # the second call reads the cache
    run = driver(variant, model_config(variant), {g: ort_runner(p) for g, p in ex.graphs.items()})
    batch = sample_input(variant, 3, seed=5)
    out = run(batch)
    if variant == "git-tiny":
        from jigsaw.models.text import caption
        want = caption(build(variant), __import__("torch").from_numpy(batch)).numpy()
        np.testing.assert_array_equal(out, want)
    else:
        assert len(out) == 3 and all(w.ndim == 1 and w.size > 0 for w in out)


@pytest.mark.parametrize("variant", ["git-tiny", "vits-tiny"])
def test_tensorrt_profiles_cover_what_the_driver_feeds(variant: str) -> None:
    """Every shape a graph is fed, at batch 1 and at max_batch, lies inside its TensorRT profile."""
    from jigsaw.backends.tensorrt_backend import graph_profile
    from jigsaw.models.export import axis_ranges, driver, export, sample_input
    from jigsaw.models.graphs import ort_runner
    from jigsaw.models.zoo import model_config
    max_batch = 4
    ex = export(variant)
    profiles = {g: graph_profile(p, axis_ranges(variant, max_batch)) for g, p in ex.graphs.items()}
    seen: list[tuple[str, str, tuple[int, ...]]] = []

    def recording(g: str):
        inner = ort_runner(ex.graphs[g])

        def run(inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
            seen.extend((g, n, a.shape) for n, a in inputs.items() if n in profiles[g])
            return inner(inputs)
        return run

    run = driver(variant, model_config(variant), {g: recording(g) for g in ex.graphs})
    for n in (1, max_batch):
        run(sample_input(variant, n, seed=n))
    assert {g for g, _, _ in seen} == set(ex.graphs)
    for g, name, shape in seen:
        lo, opt, hi = profiles[g][name]
        assert len(shape) == len(lo), (g, name)
        assert all(a <= s <= b for a, s, b in zip(lo, shape, hi)), (g, name, shape, lo, hi)
        assert all(a <= o <= b for a, o, b in zip(lo, opt, hi))
