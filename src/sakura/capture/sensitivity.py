"""Per-layer K/V sensitivity calibration (the cloud's job, on public calibration photos).

`layer_sensitivity` perturbs one layer's keys (or values) at a time with Gaussian noise of a known
relative MSE eps^2 (noise std per token = eps x that token's RMS, like a per-token quantiser's
error) and measures how much the edited image moves: sensitivity = image MSE / eps^2. On the
trained sakura-mini the sensitivities of the 12 (layer, K/V) parts span ~3 orders of magnitude,
and image MSE from several perturbed parts adds up, so `sakura`/`layered` use them
(`Shard.sensitivity`) to split bits across layers and between K and V.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch


def layer_sensitivity(layers: Sequence[tuple[torch.Tensor, torch.Tensor]],
                      edit: Callable[[list[tuple[torch.Tensor, torch.Tensor]]], torch.Tensor],
                      eps: float = 0.05, seed: int = 0) -> list[tuple[float, float]]:
    """[(key sensitivity, value sensitivity)] per layer. `layers`: [(key, value)] (T, H, D);
    `edit(layers)` returns the edited calibration images (B, 3, S, S) in [0, 1]."""
    ref = edit(list(layers)).double()
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, (k, v) in enumerate(layers):
        sens = []
        for j, x in enumerate((k, v)):
            xf = x.float()
            rms = xf.pow(2).mean(dim=(1, 2), keepdim=True).sqrt()
            noisy = xf + eps * rms * torch.randn(xf.shape, generator=g)
            pert = list(layers)
            pert[i] = (noisy.to(x.dtype), v) if j == 0 else (k, noisy.to(x.dtype))
            mse = float((edit(pert).double() - ref).pow(2).mean())
            sens.append(mse / eps ** 2)
        out.append((sens[0], sens[1]))
    return out
