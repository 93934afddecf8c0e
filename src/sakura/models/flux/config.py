"""The shape fields every Flux-family adapter config has (FLUX.2 Klein's `KleinConfig`, FLUX.1
Kontext's `KontextConfig`) and the sizes derived from them: one definition, no torch, no diffusers
(the phone-profile workloads read Klein's shapes without either)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FluxShape:
    """A Flux transformer's shapes at one resolution (`ImageModelConfig`): double_layers /
    single_layers (diffusers' num_layers / num_single_layers), heads x head_dim = the hidden width,
    in_channels and joint_attention_dim as in diffusers' config, image_size pixels per side,
    pixels_per_token (VAE factor x 2: the 2x2 latent packing), text_tokens (the padded prompt).
    The field order is part of every fingerprint (`asdict`): append, never reorder."""

    double_layers: int
    single_layers: int
    heads: int
    head_dim: int
    in_channels: int
    joint_attention_dim: int
    image_size: int
    pixels_per_token: int
    text_tokens: int

    # Alike in shape only to sakura.models.base.PatchGridConfig's properties (grid, tokens_per_image):
    # kept separate because this module imports no torch (the phone-profile workloads read it) and a
    # Flux token spans pixels_per_token pixels (VAE factor x 2), a bundled model's one patch_size patch.
    @property
    def depth(self) -> int:
        return self.double_layers + self.single_layers

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim

    @property
    def grid(self) -> int:
        return self.image_size // self.pixels_per_token

    @property
    def tokens_per_image(self) -> int:
        return self.grid * self.grid

    def tokens_for(self, pixels: int) -> int:
        """Tokens of a square image `pixels` per side."""
        return (pixels // self.pixels_per_token) ** 2
