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
from concurrent.futures import ThreadPoolExecutor

import torch

from sakura.models.base import DifferentiableEditModel
from sakura.models.kv import LayerKV, TemplateKV


def layer_sensitivity(layers: Sequence[tuple[torch.Tensor, torch.Tensor]],
                      edit: Callable[[list[tuple[torch.Tensor, torch.Tensor]]], torch.Tensor],
                      eps: float = 0.05, seed: int = 0, workers: int = 1,
                      edit_one: Callable[[int, tuple[torch.Tensor, torch.Tensor]], torch.Tensor] | None = None,
                      reference: torch.Tensor | None = None) -> list[tuple[float, float]]:
    """[(key sensitivity, value sensitivity)] per layer. `layers`: [(key, value)] (T, H, D);
    `edit(layers)` returns the edited calibration images (B, 3, S, S) in [0, 1]. `workers` > 1:
    the perturbed edits run in that many threads (the perturbations are drawn first, in order:
    the same values for any worker count).

    edit_one(i, (key, value)): the same images as `edit` with only layer i changed, when the
    caller can compute that faster (the build: `ShardDistortionProbe.edit_replacing`);
    reference: `edit(layers)` when the caller has it."""
    ref = (reference if reference is not None else edit(list(layers))).double()
    g = torch.Generator().manual_seed(seed)
    perturbed = []
    for i, (k, v) in enumerate(layers):
        for j, x in enumerate((k, v)):
            xf = x.float()
            rms = xf.pow(2).mean(dim=(1, 2), keepdim=True).sqrt()
            noisy = xf + eps * rms * torch.randn(xf.shape, generator=g)
            perturbed.append((i, (noisy.to(x.dtype), v) if j == 0 else (k, noisy.to(x.dtype))))

    def edited(i: int, kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if edit_one is not None:
            return edit_one(i, kv)
        pert = list(layers)
        pert[i] = kv
        return edit(pert)

    def mse(item) -> float:
        return float((edited(*item).double() - ref).pow(2).mean()) / eps ** 2

    if workers > 1:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sensitivity") as pool:
            sens = list(pool.map(mse, perturbed))
    else:
        sens = [mse(p) for p in perturbed]
    return [(sens[2 * i], sens[2 * i + 1]) for i in range(len(layers))]


def token_sensitivity(model, template_kv, photos: torch.Tensor, *, steps: int = 4, seed: int = 0,
                      probes: int = 8, probe_seed: int = 0) -> torch.Tensor:
    """Per layer, K/V and token: how much the edited images move per unit squared error of that
    token's keys (values), i.e. the squared Frobenius norm of the Jacobian d image / d KV_t, divided
    by the image's pixel count (so it is image MSE per unit of squared KV error of token t).

    Hutchinson estimate: for random image-space probes r ~ N(0, I), E ||J^T r||^2 = ||J||_F^2, and
    J^T r is one backward pass of <r, image> through the edit. `probes` backward passes give every
    token of every layer at once, through the model's `differentiable_edit` (its `edit` runs under
    no_grad).

    Args:
        model: a `DifferentiableEditModel` (the bundled sakura-mini and flux2-mini are).
        template_kv: the template's lossless KV (`TemplateKV`).
        photos: (N, 3, S, S) public calibration photos in [0, 1].

    Returns:
        (layers, 2, tokens) float32 >= 0; [:, 0] keys, [:, 1] values.
    """
    if not isinstance(model, DifferentiableEditModel):
        raise TypeError(f"token sensitivity needs a model with differentiable_edit (a DifferentiableEditModel), "
                        f"got {type(model).__name__}")
    leaves = [(l.key.detach().float().clone().requires_grad_(True), l.value.detach().float().clone().requires_grad_(True))
              for l in template_kv.layers]
    kv = TemplateKV([LayerKV(k, v) for k, v in leaves], template_kv.model_fingerprint,
                    template_kv.template_fingerprint, template_kv.layout)
    g = torch.Generator().manual_seed(probe_seed)
    acc = torch.zeros(len(leaves), 2, template_kv.num_tokens)
    with torch.enable_grad():
        img = model.differentiable_edit(photos, template_kv=kv, steps=steps, seed=seed).image  # (N, 3, S, S)
        for p in range(probes):
            r = torch.randn(img.shape, generator=g)
            grads = torch.autograd.grad((img * r).sum(), [t for pair in leaves for t in pair],
                                        retain_graph=p < probes - 1)
            for i in range(len(leaves)):
                for j in range(2):
                    acc[i, j] += grads[2 * i + j].pow(2).sum(dim=(1, 2))  # (T,)
    return acc / (probes * img.numel())
