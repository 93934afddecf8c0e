"""`sakura:quantiser="ecsq"` and calibrated per-layer K/V allocation (`ShardKV.sensitivity`)."""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest
import torch
from hypothesis import given

from sakura.codec import CodecError, ShardId, codec_from_spec, get_codec
from sakura.codec import bitstream as bs
from sakura.codec import ecsq as EQ
from sakura.codec.nested.ladder import widths

from .conftest import make_shard
from .test_roundtrip import SETTINGS, _out_tol, shards

ID = ShardId("m", "t", 3)


def _ecsq_bound(data: bytes, shard, kv: str) -> np.ndarray:
    """Per-token bound step_t / 2 from the object's header (plus fp32 slack)."""
    h = bs.parse(data).header
    step, floor, nominal = h["ecsq"][kv][:3]
    bits = bs.parse(data).section("bits").astype(np.int32)
    return EQ.token_steps(step, floor, bits, nominal).astype(np.float64) / 2 * (1 + 1e-5), bits > 0


@SETTINGS
@given(shard=shards(), budget=pytest.importorskip("hypothesis.strategies").sampled_from([0.3, 1.0, 2.5]),
       with_tables=pytest.importorskip("hypothesis.strategies").booleans())
def test_ecsq_error_bound(shard, budget, with_tables):
    c = get_codec("sakura", budget=budget, quantiser="ecsq")
    tables = c.fit_tables([shard]) if with_tables else None
    data = c.encode(shard, ID, tables)
    out = c.decode(data, ID, tables)
    for kv, x, xh in (("k", shard.key, out.key), ("v", shard.value, out.value)):
        bound, keep = _ecsq_bound(data, shard, kv)
        T = x.shape[0]
        xf = x.double().reshape(T, -1)
        err = (xh.double().reshape(T, -1) - xf).abs()
        # output-dtype rounding is relative to the decoded value (can be a half step from x)
        mag = torch.maximum(xf.abs(), xh.double().reshape(T, -1).abs())
        tol = torch.from_numpy(bound)[:, None] + _out_tol(mag, x.dtype) + mag * 1e-6
        assert bool((err[torch.from_numpy(keep)] <= tol[torch.from_numpy(keep)]).all())
        assert bool((xh.reshape(T, -1)[~torch.from_numpy(keep)] == 0).all())
    assert out.key.dtype == shard.key.dtype and torch.equal(out.keep, torch.from_numpy(_ecsq_bound(data, shard, "k")[1]))


def test_ecsq_objects_are_version_2_and_robust():
    shard, _ = make_shard()
    c = codec_from_spec('sakura:budget=1.0,quantiser="ecsq"')
    tables = c.fit_tables([shard])
    data = c.encode(shard, ID, tables)
    assert struct.unpack_from("<H", data, 4)[0] == 2
    for n in range(0, len(data), max(1, len(data) // 50)):
        with pytest.raises(CodecError):
            c.decode(data[:n], ID, tables)
    with pytest.raises(CodecError):
        c.decode(data, ShardId("m", "other", 3), tables)
    other = c.fit_tables([make_shard(seed=5)[0]])
    with pytest.raises(CodecError):
        c.decode(data, ID, other)
    with pytest.raises(ValueError):  # one budget per sakura rendition; ladders are `layered`
        get_codec("sakura", budget=[1.0, 2.0], quantiser="ecsq")


def test_ecsq_rate_follows_budget():
    shard, _ = make_shard(T=128, H=4, D=32)
    sizes = []
    for b in (0.5, 1.0, 2.0):
        c = get_codec("sakura", budget=b, quantiser="ecsq")
        t = c.fit_tables([shard])
        sizes.append(len(c.encode(shard, ID, t)))
    assert sizes[0] < sizes[1] < sizes[2]


def _layers(n=4):
    out = []
    for i in range(n):
        s, _ = make_shard(seed=i, layer=i, num_layers=n)
        out.append(dataclasses.replace(s, sensitivity=(10.0 ** (i - 2), 10.0 ** (1 - i))))
    return out


@pytest.mark.parametrize("spec", ["sakura:budget=3.0", 'layered:budgets=[1.5,2.5,3.5],allocate="sensitivity"',
                                  'sakura:budget=1.0,quantiser="ecsq"',
                                  'sakura:budget=1.0,quantiser="ecsq",transform="dct"'])
def test_sensitivity_allocation_roundtrips(spec):
    layers = _layers()
    c = codec_from_spec(spec)
    tables = c.fit_tables(layers)
    ids = [ShardId("m", "t", i) for i in range(len(layers))]
    errs = []
    for s, i in zip(layers, ids):
        data = c.encode(s, i, tables)
        assert struct.unpack_from("<H", data, 4)[0] == 2
        if c.supports_layers and c.name == "layered":
            ends = c.level_ends(data)
            st = c.decode_state(data[: ends[0]], i, tables)
            for a, b in zip(ends, ends[1:]):
                c.upgrade(st, data[a:b])
            full = c.decode(data, i, tables)
            assert torch.equal(st.result().key, full.key) and torch.equal(st.result().value, full.value)
        out = c.decode(data, i, tables)
        errs.append([float((out.key.float() - s.key.float()).pow(2).sum() / s.key.float().pow(2).sum()),
                     float((out.value.float() - s.value.float()).pow(2).sum() / s.value.float().pow(2).sum())])
    errs = np.array(errs)
    # more sensitive parts get smaller errors: keys of the last layer vs the first, values the other way
    assert errs[-1, 0] < errs[0, 0] and errs[0, 1] < errs[-1, 1]
    if c.name != "sakura" or "ecsq" not in spec:
        assert "alloc" in tables.arrays


def test_widths_monotone_and_bad_sensitivity():
    b = np.array([0, 2, 3, 5, 8])
    for off in range(-6, 7):
        w = widths(b, off, 1)
        assert (w[b == 0] == 0).all() and (np.diff(w[1:]) >= 0).all() and (w[b > 0] >= 1).all()
    s, _ = make_shard()
    with pytest.raises(CodecError):
        dataclasses.replace(s, sensitivity=(1.0, float("nan"))).validate()
    with pytest.raises(CodecError):
        dataclasses.replace(s, sensitivity=(1.0,)).validate()


@SETTINGS
@given(shard=shards(), budget=pytest.importorskip("hypothesis.strategies").sampled_from([0.3, 1.0, 2.5]),
       with_tables=pytest.importorskip("hypothesis.strategies").booleans())
def test_ecsq_dct_mse_bound(shard, budget, with_tables):
    """transform="dct": orthonormal 2-D DCT over a square token grid, so the squared error is at
    most T*C*(step/2)^2 (each coefficient within step/2), plus output-dtype rounding."""
    c = get_codec("sakura", budget=budget, quantiser="ecsq", transform="dct")
    tables = c.fit_tables([shard]) if with_tables else None
    data = c.encode(shard, ID, tables)
    out = c.decode(data, ID, tables)
    h = bs.parse(data).header
    T = shard.shape[0]
    assert bool(out.keep.all())
    for kv, x, xh in (("k", shard.key, out.key), ("v", shard.value, out.value)):
        step, floor, _nom, _m, _own, n = h["ecsq"][kv]
        assert n == EQ.grid_side(T)
        xf = x.double().reshape(T, -1)
        err = (xh.double().reshape(T, -1) - xf)
        if n:
            st = max(step, floor)
            mag = torch.maximum(xf.abs(), xh.double().reshape(T, -1).abs())
            rnd = float((_out_tol(mag, x.dtype) + mag * 1e-6).pow(2).sum())
            bound = xf.numel() * (st / 2) ** 2 * (1 + 1e-4)
            assert float(err.pow(2).sum()) <= (bound ** 0.5 + rnd ** 0.5) ** 2
        else:
            bound, keep = _ecsq_bound(data, shard, kv)
            mag = torch.maximum(xf.abs(), xh.double().reshape(T, -1).abs())
            tol = torch.from_numpy(bound)[:, None] + _out_tol(mag, x.dtype) + mag * 1e-6
            assert bool((err.abs()[torch.from_numpy(keep)] <= tol[torch.from_numpy(keep)]).all())


def test_dct_transform_is_orthonormal_and_square_only():
    g = np.random.default_rng(0).normal(size=(64, 5))
    c = EQ.forward(g, 8)
    assert np.allclose((c ** 2).sum(), (g ** 2).sum()) and np.allclose(EQ.inverse(c, 8), g, atol=1e-5)
    assert EQ.grid_side(64) == 8 and EQ.grid_side(63) == 0 and EQ.grid_side(1) == 0
    with pytest.raises(ValueError):
        get_codec("sakura", transform="dct")  # needs quantiser="ecsq"


def test_band_entropy_bits_equals_the_dense_formula():
    """The sparse computation (logs of nonzero counts only) against -sum n log2(n / N_band) over
    the dense (bands, alphabet) table, for small and thousands-wide alphabets."""
    import numpy as np

    from sakura.codec import ecsq as E

    rng = np.random.default_rng(0)
    for A in (1, 3, 50, 3000):
        sym = rng.integers(-A, A, size=(64, 48))
        band = rng.integers(0, 15, size=64)
        lo = int(sym.min())
        cnt = E.band_counts(sym - lo, band, int(sym.max()) - lo + 1).astype(np.float64)
        p = cnt / np.maximum(cnt.sum(1, keepdims=True), 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            dense = float(-(cnt * np.where(p > 0, np.log2(p), 0.0)).sum())
        assert E.band_entropy_bits(sym, band) == pytest.approx(dense, rel=1e-12, abs=1e-9)
    assert E.band_entropy_bits(np.zeros((8, 4), np.int64), np.zeros(8, np.int64)) == 0.0
