"""Shapes of FLUX.2 Klein transformers (no torch, no diffusers): the one table the image-level
Klein model (`sakura.models.flux.klein_image`) and the phone-profile workloads (`sakura.bench.workloads`)
both read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import FluxShape

DEFAULT_IMAGE_SIZE = 512


@dataclass(frozen=True)
class KleinConfig(FluxShape):
    """The shapes of a Klein transformer run at one resolution (one source of truth: the image
    model and the phone-profile workloads both read them from here; fields and derived sizes in
    `FluxShape`, with Klein's defaults below).

    double_layers / single_layers: diffusers' num_layers / num_single_layers; heads x head_dim =
    the hidden width; pixels_per_token: VAE factor x 2 (patchify); text_tokens: the padded prompt.
    """

    in_channels: int = 128
    joint_attention_dim: int = 7680
    image_size: int = DEFAULT_IMAGE_SIZE
    pixels_per_token: int = 16
    text_tokens: int = 512

    @classmethod
    def from_transformer(cls, config: Any, *, image_size: int, pixels_per_token: int,
                         text_tokens: int) -> "KleinConfig":
        return cls(double_layers=config.num_layers, single_layers=config.num_single_layers,
                   heads=config.num_attention_heads, head_dim=config.attention_head_dim,
                   in_channels=config.in_channels, joint_attention_dim=config.joint_attention_dim,
                   image_size=image_size, pixels_per_token=pixels_per_token, text_tokens=text_tokens)


#: Published Klein transformer configs (InvokeAI's flux2 presets / diffusers-format configs; see
#: sakura.bench.workloads SOURCES["klein-configs"]): 4B = 24 x 128 heads, 5 double + 20 single
#: blocks; 9B = 32 x 128, 8 double + 24 single.
KLEIN_4B = KleinConfig(double_layers=5, single_layers=20, heads=24, head_dim=128)
KLEIN_9B = KleinConfig(double_layers=8, single_layers=24, heads=32, head_dim=128, joint_attention_dim=12288)
