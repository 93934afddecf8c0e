"""Random-weight FLUX.2 Klein KV pipelines at the published shapes, written with `save_pretrained`:
a folder that loads through ``klein:/folder@SIZE`` exactly as a user's download does, for measuring
what real shapes cost without the checkpoint (`sakura bench realscale`).

Presets (transformer from `KLEIN_4B` / `KLEIN_9B`; the default `AutoencoderKLFlux2`, which is
FLUX.2's; a Qwen3 text encoder of the real width cut to three layers, because the prompt
embedding stacks three hidden states and the layer count changes nothing downstream):

    klein-4b   5 double + 20 single blocks, 24 heads x 128, text width 2560 (Qwen3-4B)
    klein-9b   8 double + 24 single blocks, 32 heads x 128, text width 4096 (Qwen3-8B)
    tiny       2 double + 4 single blocks, 2 heads x 16, a 2-level VAE: the CPU test preset

    python -m sakura.models.flux.klein_random /tmp/klein-4b klein-4b
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from .klein_config import KLEIN_4B, KLEIN_9B, KleinConfig
from .klein_tiny import _byte_tokenizer


def _transformer_kwargs(cfg: KleinConfig) -> dict[str, Any]:
    return dict(patch_size=1, in_channels=cfg.in_channels, num_layers=cfg.double_layers,
                num_single_layers=cfg.single_layers, attention_head_dim=cfg.head_dim,
                num_attention_heads=cfg.heads, joint_attention_dim=cfg.joint_attention_dim,
                timestep_guidance_channels=256, mlp_ratio=3.0, axes_dims_rope=(32, 32, 32, 32),
                guidance_embeds=False)


#: preset -> (transformer kwargs, Qwen3 text-encoder kwargs, VAE kwargs (None: the default, FLUX.2's))
PRESETS: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]] = {
    "klein-4b": (_transformer_kwargs(KLEIN_4B),
                 dict(hidden_size=2560, intermediate_size=9728, num_attention_heads=32, num_key_value_heads=8,
                      head_dim=128), None),
    "klein-9b": (_transformer_kwargs(KLEIN_9B),
                 dict(hidden_size=4096, intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8,
                      head_dim=128), None),
    "tiny": (dict(patch_size=1, in_channels=16, num_layers=2, num_single_layers=4, attention_head_dim=16,
                  num_attention_heads=2, joint_attention_dim=48, timestep_guidance_channels=32, mlp_ratio=2.0,
                  axes_dims_rope=(4, 4, 4, 4), guidance_embeds=False),
             dict(hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=8),
             dict(block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
                  up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, latent_channels=4,
                  norm_num_groups=4, sample_size=16)),
}


def write_random_klein_folder(folder: str | Path, preset: str = "klein-4b", *, dtype: torch.dtype = torch.bfloat16,
                              device: Any = "cpu", seed: int = 0) -> Path:
    """Build the `preset` pipeline with seeded random weights on `device`, cast to `dtype` (bf16:
    what the published checkpoints hold), and `save_pretrained` it to `folder`; returns the folder.

    Every weight gets seeded noise on top of its default init (as the tiny test fixture does), so
    no block starts as the identity and every layer's template KV reaches the image."""
    from diffusers import AutoencoderKLFlux2, Flux2KleinKVPipeline, Flux2Transformer2DModel  # lazy: diffusers ([flux] extra)
    from diffusers.schedulers import FlowMatchEulerDiscreteScheduler  # lazy: diffusers ([flux] extra)
    from transformers import Qwen3Config, Qwen3ForCausalLM  # lazy: transformers ([flux] extra)

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {sorted(PRESETS)}")
    t_kw, text_kw, vae_kw = PRESETS[preset]
    torch.manual_seed(seed)
    tok, n_vocab = _byte_tokenizer()
    dev = torch.device(device)
    with dev:  # weights are made where they will be used: a 9B transformer never sits in fp32 on the host
        transformer = Flux2Transformer2DModel(**t_kw)
        text = Qwen3ForCausalLM(Qwen3Config(vocab_size=n_vocab, num_hidden_layers=3, max_position_embeddings=1024,
                                            **text_kw))
        vae = AutoencoderKLFlux2(**(vae_kw or {}))
    g = torch.Generator(device=dev).manual_seed(seed)
    with torch.no_grad():
        for p in transformer.parameters():
            # relative noise: the width-3072 blocks keep their init's scale (a fixed 0.05 would blow
            # the residual stream up over 25 blocks); zero-initialised tensors get 0.05
            scale = float(p.float().std()) if p.numel() > 1 else 0.0
            p.add_(torch.randn(p.shape, generator=g, device=dev, dtype=p.dtype) * 0.05 * (scale or 1.0))
    transformer, text, vae = transformer.to(dtype), text.to(dtype), vae.to(dtype)
    sched = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, shift_terminal=None)
    pipe = Flux2KleinKVPipeline(scheduler=sched, vae=vae, text_encoder=text, tokenizer=tok, transformer=transformer)
    pipe.to("cpu")  # safetensors writes host tensors; one bf16 copy of the weights on the host, briefly
    pipe.save_pretrained(folder)
    del pipe, transformer, text, vae
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return Path(folder)


def weight_bytes(folder: str | Path) -> int:
    """Bytes of every safetensors file under `folder` (the weights as stored)."""
    return sum(p.stat().st_size for p in Path(folder).rglob("*.safetensors"))


if __name__ == "__main__":  # pragma: no cover
    print(write_random_klein_folder(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "klein-4b"))
