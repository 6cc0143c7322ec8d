"""VITS text-to-speech as two graphs and a little numpy, so onnxruntime and TensorRT can run it.

VITS's output length depends on the durations it predicts, so one static graph cannot hold it.
``encoder`` maps symbol ids (and the stochastic duration predictor's noise, an input rather than
drawn inside) to the prior's means and log-variances and the log durations per symbol. The numpy
driver (``VitsSpeaker``) turns durations into frame counts, repeats each symbol's prior over its
frames, pads the batch to its longest item and samples the prior. ``decoder`` runs the flow in
reverse and the HiFi-GAN vocoder over the padded frames; each waveform is then cut to its own
length. Every step follows ``VitsModel.forward``; the modules are transformers' own.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from jigsaw.models.graphs import GraphSpec, Runner

MAX_FRAMES = 1000
"""Default cap on an item's frames (hop samples each): random weights can predict very long durations."""

_RANDN_LOCK = threading.Lock()


def _single_speaker(config: Any) -> None:
    if config.num_speakers > 1:
        raise ValueError(f"VITS graphs support a single speaker; the config has {config.num_speakers}")


def hop_length(config: Any) -> int:
    """Waveform samples per frame: the HiFi-GAN's total upsampling."""
    return int(np.prod(config.upsample_rates))


def _python_int(size: Any) -> int:
    """A size as a plain int for a choice made in Python while tracing; the graph keeps its own size."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return int(size)


@contextlib.contextmanager
def _randn_returns(noise: torch.Tensor) -> Iterator[None]:
    """``torch.randn`` of ``noise``'s shape returns ``noise``, so tracing records it as an input.

    Other shapes still draw: only the duration predictor's draw is replaced.
    """
    original = torch.randn

    def randn(*size: Any, **kwargs: Any) -> torch.Tensor:
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], tuple | list) else size
        same = [_python_int(s) for s in shape] == [_python_int(s) for s in noise.shape]
        return noise if same else original(*size, **kwargs)

    with _RANDN_LOCK:
        torch.randn = randn
        try:
            yield
        finally:
            torch.randn = original


@contextlib.contextmanager
def _convs_see_zero_padding(module: nn.Module, frame_mask: torch.Tensor) -> Iterator[None]:
    """Zero each item's padding before every convolution of ``module``.

    The HiFi-GAN is not masked: its biases make the padding frames non-zero, and convolutions near
    an item's end would read them where that item alone would read zero padding. Masking every
    convolution's input at its own resolution (a whole multiple of the frame rate) keeps each item
    exactly as when run alone.
    """
    frames = frame_mask.shape[-1]
    lengths = frame_mask.sum(-1, keepdim=True)  # (batch, 1, 1)
    masks: dict[int, torch.Tensor] = {}  # one per resolution, shared by its convolutions

    def mask_input(_: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        x = args[0]
        n = x.shape[-1]
        key = _python_int(n)
        if key not in masks:
            positions = torch.arange(n, dtype=x.dtype, device=x.device)
            masks[key] = (positions < lengths * (n // frames)).to(x.dtype)
        return (x * masks[key], *args[1:])

    handles = [m.register_forward_pre_hook(mask_input) for m in module.modules()
               if isinstance(m, nn.Conv1d | nn.ConvTranspose1d)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


class VitsEncoder(nn.Module):
    """(ids, duration noise) -> (prior means, prior log-variances, log durations).

    Means and log-variances are (batch, tokens, flow_size); log durations (batch, tokens). The
    duration noise is (batch, 2, tokens), already scaled by ``noise_scale_duration``.
    """

    def __init__(self, vits: Any) -> None:
        super().__init__()
        _single_speaker(vits.config)
        self.vits = vits

    def forward(self, input_ids: torch.Tensor,
                duration_noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        vits = self.vits
        mask = torch.ones_like(input_ids).unsqueeze(-1).to(vits.text_encoder.embed_tokens.weight.dtype)
        out = vits.text_encoder(input_ids=input_ids, padding_mask=mask, return_dict=True)
        hidden, mask = out.last_hidden_state.transpose(1, 2), mask.transpose(1, 2)
        if vits.config.use_stochastic_duration_prediction:
            with _randn_returns(duration_noise.to(hidden.dtype)):
                log_duration = vits.duration_predictor(hidden, mask, None, reverse=True, noise_scale=1.0)
        else:
            log_duration = vits.duration_predictor(hidden, mask, None)
        return out.prior_means, out.prior_log_variances, log_duration[:, 0]


class VitsDecoder(nn.Module):
    """(prior latents (batch, flow_size, frames), frame mask (batch, 1, frames)) -> waveform.

    The waveform is (batch, frames * hop); samples past an item's frames are padding.
    """

    def __init__(self, vits: Any) -> None:
        super().__init__()
        _single_speaker(vits.config)
        self.vits = vits

    def forward(self, latents: torch.Tensor, frame_mask: torch.Tensor) -> torch.Tensor:
        latents = self.vits.flow(latents * frame_mask, frame_mask, None, reverse=True)
        with _convs_see_zero_padding(self.vits.decoder, frame_mask):
            waveform = self.vits.decoder(latents * frame_mask, None)
        return waveform[:, 0]


def vits_graphs(vits: Any, tokens: int = 16) -> dict[str, GraphSpec]:
    """The ``encoder`` and ``decoder`` graphs of an eval-mode ``VitsModel``.

    Batch is dynamic everywhere and frames on the decoder; the token axis is fixed at ``tokens``
    (the relative attention's padding is computed from the length in Python and traced as a constant).
    """
    vits = vits.eval()
    cfg = vits.config
    _single_speaker(cfg)
    ids = torch.randint(0, cfg.vocab_size, (2, tokens))
    frames = 3 * tokens
    mask = (torch.arange(frames) < torch.tensor([[frames], [frames - 5]])).float()[:, None]
    return {
        "encoder": GraphSpec(VitsEncoder(vits).eval(), (ids, torch.randn(2, 2, tokens)),
                             ("input_ids", "duration_noise"),
                             ("prior_means", "prior_log_variances", "log_duration"),
                             {"input_ids": {0: "batch"}, "duration_noise": {0: "batch"},
                              "prior_means": {0: "batch"}, "prior_log_variances": {0: "batch"},
                              "log_duration": {0: "batch"}}),
        "decoder": GraphSpec(VitsDecoder(vits).eval(),
                             (torch.randn(2, cfg.flow_size, frames) * mask, mask),
                             ("latents", "frame_mask"), ("waveform",),
                             {"latents": {0: "batch", 2: "frames"}, "frame_mask": {0: "batch", 2: "frames"},
                              "waveform": {0: "batch", 1: "samples"}}),
    }


def axis_ranges(max_batch: int, max_frames: int = MAX_FRAMES) -> dict[str, tuple[int, int, int]]:
    """(min, opt, max) of the decoder's frame axis; 16 symbols of a random model give ~20-70 frames."""
    del max_batch  # the frame range does not depend on the batch
    return {"frames": (1, min(64, max_frames), max_frames)}


class VitsSpeaker:
    """Batched VITS synthesis over the two graphs: one waveform (float32, 1-D) per row of ids.

    The encoder and the decoder each run once per batch; the decoder sees the batch padded to its
    longest item and each waveform is cut to ``frames * hop`` samples. Noise (the duration
    predictor's and the prior's) comes from the speaker's own ``np.random.default_rng(seed)``, scaled
    by the config's ``noise_scale_duration`` and ``noise_scale``; ``speaking_rate`` sets the length
    scale. An item is cut at ``max_frames`` frames (``max_frames * hop`` samples), so a random-weight
    model cannot produce an unbounded waveform.
    """

    def __init__(self, config: Any, runners: dict[str, Runner], seed: int = 0,
                 max_frames: int = MAX_FRAMES) -> None:
        _single_speaker(config)
        self.encoder, self.decoder = runners["encoder"], runners["decoder"]
        self.rng = np.random.default_rng(seed)
        self.vocab = int(config.vocab_size)
        self.noise_scale = np.float32(config.noise_scale)
        self.noise_scale_duration = np.float32(config.noise_scale_duration)
        self.length_scale = 1.0 / config.speaking_rate
        self.hop = hop_length(config)
        self.max_frames = int(max_frames)

    def frames(self, log_duration: np.ndarray) -> np.ndarray:
        """Frames per symbol, ``ceil(exp(log_duration) * length_scale)`` as ``VitsModel`` computes it."""
        return np.ceil(np.exp(log_duration.astype(np.float32)) * np.float32(self.length_scale))

    def expand(self, durations: np.ndarray, prior: np.ndarray, frames: int) -> np.ndarray:
        """(batch, tokens, channels) -> (batch, channels, frames): each symbol fills its run of frames.

        Frames past the last symbol's run are zero, as ``VitsModel``'s alignment matmul leaves them.
        """
        ends = np.cumsum(durations.astype(np.float64), axis=1)
        token = np.stack([np.searchsorted(e, np.arange(frames), side="right") for e in ends])
        valid = token < durations.shape[1]
        picked = np.take_along_axis(prior, np.minimum(token, durations.shape[1] - 1)[..., None], axis=1)
        return np.where(valid[..., None], picked, np.float32(0)).transpose(0, 2, 1)

    def __call__(self, token_ids: np.ndarray) -> list[np.ndarray]:
        ids = np.ascontiguousarray(token_ids, np.int64) % self.vocab
        batch, tokens = ids.shape
        if batch == 0:
            return []
        noise = self.rng.standard_normal((batch, 2, tokens), np.float32) * self.noise_scale_duration
        means, log_vars, log_duration = self.encoder({"input_ids": ids, "duration_noise": noise})
        durations = self.frames(log_duration)
        total = np.nan_to_num(durations.sum(1, dtype=np.float64), nan=1.0, posinf=self.max_frames)
        lengths = np.clip(total, 1, self.max_frames).astype(np.int64)
        frames = int(lengths.max())
        mask = (np.arange(frames) < lengths[:, None]).astype(np.float32)[:, None]  # (batch, 1, frames)
        means = self.expand(durations, means, frames)
        log_vars = self.expand(durations, log_vars, frames)
        prior_noise = self.rng.standard_normal(means.shape, np.float32) * mask
        latents = (means + prior_noise * np.exp(log_vars) * self.noise_scale).astype(np.float32)
        (waveform,) = self.decoder({"latents": latents, "frame_mask": mask})
        return [np.ascontiguousarray(waveform[i, :n * self.hop], np.float32) for i, n in enumerate(lengths)]
