"""Synthetic shards with the structure real template KV has: outlier key channels, per-head
offsets, heavy-tailed importance (a few tokens get most of the attention)."""

from __future__ import annotations

import pytest
import torch

from sakura.codec import ShardKV, ShardId
from sakura.codec.metrics import attention_importance


def make_shard(T: int = 64, H: int = 4, D: int = 16, *, seed: int = 0, dtype=torch.float16,
               layer: int = 0, num_layers: int = 4, n_queries: int = 48) -> tuple[ShardKV, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(T, H, D, generator=g) + 2.0 * torch.randn(1, H, D, generator=g)
    k[:, :, 1] *= 10.0  # outlier channel
    v = torch.randn(T, H, D, generator=g) * (1 + torch.rand(T, 1, 1, generator=g))
    q = torch.randn(n_queries, H, D, generator=g) * 0.5
    imp = attention_importance(q, k)
    return ShardKV(k.to(dtype), v.to(dtype), importance=imp, layer=layer, num_layers=num_layers), q


@pytest.fixture
def shard_q():
    return make_shard()


@pytest.fixture
def ident():
    return ShardId(model="m" * 64, template="tmpl-1", shard=0)
