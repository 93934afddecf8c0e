"""Attention pieces the Flux family shares (FLUX.2 Klein and flux2-mini through `klein.py`, FLUX.1
Kontext through `kontext.py`): one copy each, imported by both instead of copied.

- `joint_qkv`: the joint (text + image) query/key/value of a double-stream block, after QK-norm and
  RoPE, text tokens first: diffusers' ``FluxAttnProcessor`` / ``Flux2KVAttnProcessor`` compute
  exactly this before their attention call; both families' attention modules have the same
  projections and norms (``to_q``..., ``add_q_proj``..., ``norm_q``..., ``norm_added_q``...);
- `_attend`: attention on (B, S, H, D) tensors with an optional key mask (diffusers' own dispatch
  when there is none, so an unmasked layer is bit for bit diffusers');
- `_attend_probed`: the same as an explicit softmax, handing the probabilities on the template
  keys to a probe (the build's token importance);
- `_ref_mask`: the keep mask of a lossy rendition over [before | template | after] keys.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from diffusers.models.attention_dispatch import dispatch_attention_fn


def joint_qkv(attn, x: torch.Tensor, enc: torch.Tensor, rope, get_qkv_projections, apply_rotary_emb):
    """(query, key, value), each (B, S_text + S_image, H, D): projections of the image tokens ``x``
    and the text tokens ``enc``, QK-normed, concatenated text first, RoPE applied to query and key.
    ``get_qkv_projections`` / ``apply_rotary_emb``: the family's own diffusers functions (FLUX.1 and
    FLUX.2 each have theirs, with the same contract)."""
    query, key, value, eq, ek, ev = get_qkv_projections(attn, x, enc)
    query = attn.norm_q(query.unflatten(-1, (-1, attn.head_dim)))
    key = attn.norm_k(key.unflatten(-1, (-1, attn.head_dim)))
    value = value.unflatten(-1, (-1, attn.head_dim))
    eq = attn.norm_added_q(eq.unflatten(-1, (-1, attn.head_dim)))
    ek = attn.norm_added_k(ek.unflatten(-1, (-1, attn.head_dim)))
    ev = ev.unflatten(-1, (-1, attn.head_dim))
    query, key, value = torch.cat([eq, query], 1), torch.cat([ek, key], 1), torch.cat([ev, value], 1)
    return apply_rotary_emb(query, rope, sequence_dim=1), apply_rotary_emb(key, rope, sequence_dim=1), value


def _ref_mask(keep: torch.Tensor | None, n_before: int, n_after: int, device) -> torch.Tensor | None:
    """Bool key mask (1, 1, 1, S) over [n_before | template | n_after], or None when nothing is dropped."""
    if keep is None or bool(keep.all()):
        return None
    ones = lambda n: torch.ones(n, dtype=torch.bool, device=device)  # noqa: E731
    return torch.cat([ones(n_before), keep.to(device), ones(n_after)]).view(1, 1, 1, -1)


def _attend(q, k, v, mask):
    """Attention on (B, S, H, D) tensors; the same dispatch diffusers uses when there is no mask."""
    if mask is None:
        return dispatch_attention_fn(q, k, v)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
    return out.transpose(1, 2)


def _attend_probed(q, k, v, mask, t0: int, t1: int, report) -> torch.Tensor:
    """Explicit softmax attention that hands the probabilities on keys [t0, t1) to `report`."""
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)       # (B, H, S, D)
    logits = (qh @ kh.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    p = logits.softmax(-1)
    report(p[..., t0:t1])
    return (p @ vh).transpose(1, 2)


