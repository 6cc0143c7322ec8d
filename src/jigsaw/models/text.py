"""GIT (image to caption) and VITS text-to-speech, built from ``transformers`` configs.

Sizes: ``git-base`` is GitConfig's defaults (ViT-B/16 encoder, 6-layer 768 decoder);
``git-large`` uses a ViT-L/14 encoder (24 x 1024) and a 1024-wide decoder as the published
large model. ``vits`` is VitsConfig's defaults (the MMS English size). Glow-TTS is not in
transformers; ``glow-tts`` is a smaller VITS (hidden 128, 4 encoder layers, narrower HiFi-GAN
decoder) standing in for it. ``*-tiny`` sizes exist for tests only.

``caption`` and ``speak`` are the torch reference (``generate`` and ``VitsModel`` as they are);
the other backends run the same models as ONNX graphs (``git_onnx``, ``vits_onnx``).
"""

from __future__ import annotations

from typing import Any

import torch

CAPTION_TOKENS = 16


def git_config(size: str) -> Any:
    from transformers import GitConfig
    if size == "base":
        cfg = GitConfig()
    elif size == "large":
        cfg = GitConfig(hidden_size=1024, num_attention_heads=16, intermediate_size=4096,
                        vision_config={"hidden_size": 1024, "num_hidden_layers": 24,
                                       "num_attention_heads": 16, "intermediate_size": 4096,
                                       "patch_size": 14, "image_size": 224})
    elif size == "tiny":
        cfg = GitConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                        vocab_size=1000, max_position_embeddings=64,
                        vision_config={"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                                       "intermediate_size": 128, "patch_size": 16, "image_size": 32})
    else:
        raise KeyError(size)
    return cfg


def build_git(size: str) -> Any:
    from transformers import GitForCausalLM
    return GitForCausalLM(git_config(size))


def vits_config(size: str) -> Any:
    from transformers import VitsConfig
    if size == "vits":
        cfg = VitsConfig()
    elif size == "glow-tts":
        cfg = VitsConfig(hidden_size=128, num_hidden_layers=4, num_attention_heads=2, ffn_dim=512,
                         upsample_initial_channel=256, flow_size=128)
    elif size == "tiny":
        cfg = VitsConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, ffn_dim=64,
                         flow_size=32, upsample_initial_channel=32, upsample_rates=[4, 4],
                         upsample_kernel_sizes=[8, 8], resblock_kernel_sizes=[3],
                         resblock_dilation_sizes=[[1, 3]], prior_encoder_num_flows=1,
                         prior_encoder_num_wavenet_layers=1, posterior_encoder_num_wavenet_layers=1,
                         duration_predictor_num_flows=2, depth_separable_num_layers=1)
    else:
        raise KeyError(size)
    return cfg


def build_vits(size: str) -> Any:
    from transformers import VitsModel
    return VitsModel(vits_config(size))


@torch.inference_mode()
def caption(git: Any, pixel_values: torch.Tensor, tokens: int = CAPTION_TOKENS) -> torch.Tensor:
    """Greedy decode of exactly ``tokens`` tokens per image (batch, tokens), int64."""
    bos = git.config.bos_token_id
    ids = torch.full((pixel_values.shape[0], 1), bos, dtype=torch.long, device=pixel_values.device)
    out = git.generate(pixel_values=pixel_values, input_ids=ids, max_new_tokens=tokens,
                       min_new_tokens=tokens, do_sample=False, num_beams=1)
    return out[:, 1:1 + tokens]


@torch.inference_mode()
def speak(vits: Any, token_ids: torch.Tensor) -> list[torch.Tensor]:
    """One waveform (float32, the model's sampling rate) per row of symbol ids."""
    vocab = vits.config.vocab_size
    out = []
    for row in token_ids:  # VITS lengths differ per item: run items one by one
        ids = (row.long() % vocab).view(1, -1)
        out.append(vits(input_ids=ids).waveform[0].float())
    return out
