"""Attention-mass importance of template tokens (cloud side, public calibration photos).

Importance of template token j in layer l = the attention probability that the model's photo and
target queries give key j, averaged over heads, queries, denoising steps and calibration photos.
Calibration photos are public images chosen by the operator, never a user's photo.
"""

from __future__ import annotations

import torch

from sakura.models.kv import TemplateKV


@torch.no_grad()
def template_importance(model, template_kv: TemplateKV, calibration_photos: torch.Tensor, *,
                        steps: int = 8, seed: int = 0) -> torch.Tensor:
    """Per-layer, per-token attention mass received by template tokens.

    Args:
        model: the model the KV belongs to.
        template_kv: the template's lossless KV (`model.extract_template_kv`).
        calibration_photos: (N, 3, H, W) in [0, 1], public images.
        steps, seed: the sampler run that produces the queries (same as at edit time).

    Returns:
        (num_layers, template_tokens) float32. Row l sums to the share of layer l's photo/target
        attention that goes to the template (in (0, 1]); larger = more important.
    """
    if calibration_photos.ndim != 4 or calibration_photos.shape[0] < 1:
        raise ValueError(f"calibration_photos must be (N, 3, H, W) with N >= 1, got {tuple(calibration_photos.shape)}")
    mass = torch.zeros(model.num_layers, template_kv.num_tokens)
    calls = torch.zeros(model.num_layers)

    def probe(layer: int, p: torch.Tensor) -> None:  # p: (B, heads, main_tokens, template_tokens)
        mass[layer] += p.mean(dim=(0, 1, 2)).float().cpu()  # the model's device and dtype -> host fp32
        calls[layer] += 1

    for i in range(calibration_photos.shape[0]):
        model.edit(calibration_photos[i:i + 1], template_kv=template_kv, steps=steps, seed=seed + i, probe=probe)
    return mass / calls[:, None]
