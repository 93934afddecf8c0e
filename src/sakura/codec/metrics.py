"""Distortion measures for decoded shards (all computed in float32). Plain functions of tensors:
imports nothing of the codec (`base.Codec.describe` calls them)."""

from __future__ import annotations

import math

import torch

from sakura.models.kv import LayerKV


def rel_error(ref: torch.Tensor, got: torch.Tensor, keep: torch.Tensor | None = None) -> float:
    """||ref - got|| / ||ref|| over kept tokens (dropped tokens are masked, not reconstructed)."""
    r, g = ref.float(), got.float()
    if keep is not None:
        r, g = r[keep], g[keep]
    den = float(r.norm())
    return float((r - g).norm()) / den if den > 0 else float((r - g).norm())


def weighted_rel_error(key: torch.Tensor, value: torch.Tensor, importance: torch.Tensor | None,
                       dec: LayerKV) -> float:
    """Importance-weighted relative error of K and V, dropped tokens counting as fully lost.

    sqrt( sum_t w_t (|k_t - k^_t|^2 + |v_t - v^_t|^2) / sum_t w_t (|k_t|^2 + |v_t|^2) ),
    with w = importance (uniform when absent). A cheap stand-in for attention error.
    Shapes: key/value (tokens, heads, head_dim), importance (tokens,) or (2, tokens) (keys' and
    values' own), as in `base.ShardKV`.
    """
    T = key.shape[0]
    w = importance.float() if importance is not None else torch.ones(T)
    wk, wv = (w[0], w[1]) if w.ndim == 2 else (w, w)  # (2, T): keys' and values' own weights
    k, v = key.float().reshape(T, -1), value.float().reshape(T, -1)
    keep = dec.keep.reshape(T, 1)
    kh = torch.where(keep, dec.key.float().reshape(T, -1), torch.zeros(()))
    vh = torch.where(keep, dec.value.float().reshape(T, -1), torch.zeros(()))
    num = (wk * ((k - kh) ** 2).sum(1) + wv * ((v - vh) ** 2).sum(1)).sum()
    den = (wk * (k ** 2).sum(1) + wv * (v ** 2).sum(1)).sum()
    return float(torch.sqrt(num / den)) if float(den) > 0 else float(torch.sqrt(num))


def attention_output(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     keep: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v per head, masked to kept tokens.

    Shapes: q (n, heads, d), k/v (tokens, heads, d), keep (tokens,) bool -> (n, heads, d).
    """
    qf, kf, vf = q.float().transpose(0, 1), k.float().transpose(0, 1), v.float().transpose(0, 1)  # (H, *, d)
    logits = qf @ kf.transpose(1, 2) / math.sqrt(q.shape[-1])  # (H, n, tokens)
    if keep is not None:
        logits = logits.masked_fill(~keep.reshape(1, 1, -1), float("-inf"))
    return (torch.softmax(logits, dim=-1) @ vf).transpose(0, 1)  # (n, H, d)


def attention_rel_error(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_hat: torch.Tensor,
                        v_hat: torch.Tensor, keep: torch.Tensor | None) -> float:
    """||attn(q, k^, v^, keep) - attn(q, k, v)|| / ||attn(q, k, v)|| (template tokens only)."""
    ref = attention_output(q, k, v)
    got = attention_output(q, k_hat, v_hat, keep)
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def attention_importance(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Mean attention probability each key token receives from queries q: (tokens,), sums to 1."""
    qf, kf = q.float().transpose(0, 1), k.float().transpose(0, 1)
    p = torch.softmax(qf @ kf.transpose(1, 2) / math.sqrt(q.shape[-1]), dim=-1)  # (H, n, tokens)
    return p.mean(dim=(0, 1))
