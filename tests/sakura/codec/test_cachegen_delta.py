"""`cachegen:delta=true`: anchors at 8 bits, other tokens as deltas to their group's decoded anchor."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sakura.codec import CodecError, ShardId, get_codec
from sakura.codec.baselines.cachegen import layer_bins

from .conftest import make_shard

ID = ShardId("m", "t", 1)


@pytest.mark.parametrize("group", [2, 10, 64])
@pytest.mark.parametrize("with_tables", [True, False])
def test_delta_roundtrip_bounds(group, with_tables):
    shard, _ = make_shard(T=40, H=2, D=8, dtype=torch.float32, layer=1, num_layers=4)
    c = get_codec("cachegen", level=2, delta=True, group=group)
    tables = c.fit_tables([shard]) if with_tables else None
    out = c.decode(c.encode(shard, ID, tables), ID, tables)
    assert bool(out.keep.all())
    kb, vb = layer_bins(2, 1, 4)
    for x, xh, bins in ((shard.key, out.key, kb), (shard.value, out.value, vb)):
        x, xh = x.reshape(40, -1).numpy(), xh.reshape(40, -1).numpy()
        anchors = np.arange(0, 40, group)
        amax_a = np.abs(x[anchors]).max(1, keepdims=True)
        assert (np.abs(x[anchors] - xh[anchors]) <= amax_a / (2 * 127) * (1 + 1e-3) + 1e-6).all()
        ref = xh[anchors][np.arange(40) // group]
        delta = x - ref
        amax_d = np.abs(delta).max(1, keepdims=True)
        rows = np.setdiff1d(np.arange(40), anchors)
        mx = bins // 2 - 1
        err = np.abs(x[rows] - xh[rows])
        assert (err <= amax_d[rows] / (2 * mx) * (1 + 1e-3) + 1e-5).all()


def test_delta_spec_and_errors():
    assert get_codec("cachegen", level=3).spec == "cachegen:level=3"  # the plain codec is unchanged
    c = get_codec("cachegen", level=3, delta=True)
    assert "delta=true" in c.spec and "group=10" in c.spec
    for bad in ({"delta": "yes"}, {"group": 1}, {"group": True}):
        with pytest.raises(ValueError):
            get_codec("cachegen", **bad)
    shard, _ = make_shard(T=24, H=2, D=8)
    tables = c.fit_tables([shard])
    data = c.encode(shard, ID, tables)
    for n in range(0, len(data), max(1, len(data) // 30)):
        with pytest.raises(CodecError):
            c.decode(data[:n], ID, tables)
