"""The fast inverse DCT (`fastdct`, generated `_lee`): accurate against the float64 DCT matrix,
the native fused kernel equal to the reference decoder's numpy passes bit for bit at the grid
sizes the ladder meets (through whole progressive decodes, with and without token weighting, fp16
and float32 outputs), its fp16 conversion equal to torch's, and `_lee.py` up to date."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sakura.codec import ShardId, ShardKV, get_codec
from sakura.codec.progressive import fastdct
from sakura.codec import ecsq as EQ
from sakura.codec import kernels as K
from sakura.codec.progressive import ladder as PG

ID = ShardId("m", "t", 1)


def test_generated_module_is_up_to_date():
    assert fastdct.GENERATED.read_text() == fastdct.source(), "run `python -m sakura.codec.progressive.lee_gen`"


@pytest.mark.parametrize("n", fastdct.SIZES)
def test_lee_inverse_is_the_orthonormal_dct_iii(n):
    c = np.random.default_rng(n).standard_normal((n, 50)).astype(np.float32)
    x = np.stack(fastdct.inverse_rows(list(c)))
    ref = EQ.dct_matrix(n).T @ c.astype(np.float64)
    assert x.dtype == np.float32
    assert np.abs(x - ref).max() < 2e-6 * np.abs(ref).max()


@pytest.mark.parametrize("n", [4, 16, 32, 64])
@pytest.mark.parametrize("out", ["fp16", "f32"])
@pytest.mark.parametrize("weighted", [False, True])
def test_fused_kernel_equals_reference_passes(n, out, weighted):
    """The fused kernel (reconstruction from band-sorted magnitudes/signs, both passes, scales,
    mean, output dtype) == the reference decoder's numpy steps, on two channel blocks with a
    shuffled row order; the kernel is called per block range as a split decode calls it."""
    rng = np.random.default_rng(n)
    T, cb = n * n, fastdct.block_channels(n)
    C = 2 * cb
    mag = (rng.integers(0, 40, (T, C)) * (rng.random((T, C)) < 0.3)).astype(np.int32)
    neg = ((rng.random((T, C)) < 0.5) & (mag > 0)).astype(np.uint8)
    perm = rng.permutation(T).astype(np.int64)
    st = np.float32(0.37)
    off = np.float32(0.625)                            # a reconstruction offset other than the midpoint
    c = mag.astype(np.float32) + off                   # the reference reconstruction (`coefficients`)
    c[mag == 0] = 0.0
    c *= st
    c[neg > 0] *= -1.0
    coef = np.empty_like(c)
    coef[perm] = c
    mu = rng.standard_normal(C).astype(np.float32)
    inv = np.exp2(rng.integers(-48, 48, T) / 16).astype(np.float32) if weighted else np.empty(0, np.float32)
    x = fastdct.inverse_2d(coef, n)
    if weighted:
        x /= inv[:, None]
    x += mu[None, :]
    o16 = np.empty((T, C) if out == "fp16" else (0, 0), np.uint16)
    o32 = np.empty((0, 0) if out == "fp16" else (T, C), np.float32)
    for lo in range(2):
        fastdct.kernel(n)(mag.reshape(-1), neg.reshape(-1), perm, float(st), float(off), lo, lo + 1, inv, mu, o16, o32)
    if out == "fp16":
        assert np.array_equal(o16.view(np.float16), torch.from_numpy(x).half().numpy())
    else:
        assert np.array_equal(o32, x)


def test_fp16_bits_equal_torch_half_everywhere():
    rng = np.random.default_rng(0)
    v = np.concatenate([
        rng.standard_normal(50_000).astype(np.float32) * np.float32(10.0) ** rng.integers(-9, 6, 50_000).astype(np.float32),
        np.array([65504, 65519.99, 65520, 65536, 1e9, np.inf, -np.inf, 0.0, -0.0, 5.96e-8, 2.9802322e-08, 2.98e-8,
                  6.1035e-5, 6.1e-5, -3e-6, 1e-45], np.float32)])
    o = np.empty(v.size, np.uint16)

    from numba import njit

    @njit
    def conv(x, out):
        K.to_fp16(x, out)

    conv(v, o)
    assert np.array_equal(o, torch.from_numpy(v).half().numpy().view(np.uint16))
    nan = np.array([np.nan], np.float32)
    o1 = np.empty(1, np.uint16)
    conv(nan, o1)
    assert np.isnan(o1.view(np.float16)[0])


@pytest.mark.parametrize("T,H,D", [(256, 2, 64), (1024, 1, 64), (4096, 1, 32)])
def test_progressive_fast_inverse_native_equals_reference(T, H, D, monkeypatch):
    g = torch.Generator().manual_seed(T)
    k = torch.randn(T, H, D, generator=g) + torch.linspace(-2, 2, T)[:, None, None]
    shard = ShardKV(k.half(), (torch.randn(T, H, D, generator=g) * 0.3).half(),
                    importance=torch.rand(T, generator=g), layer=0, num_layers=1)
    assert fastdct.fits(EQ.grid_side(T), H * D)
    for c in (get_codec("progressive", budgets=[0.3, 1.0]),
              get_codec("progressive", budgets=[0.3, 1.0], weighting="importance")):
        tables = c.fit_tables([shard])
        data = c.encode(shard, ID, tables)
        for e in c.level_ends(data):
            ref = PG.decode_with(c, data[:e], ID, tables, "reference")
            nat = c.decode(data[:e], ID, tables)
            assert torch.equal(nat.key, ref.key) and torch.equal(nat.value, ref.value)
            with monkeypatch.context() as mp:   # the same transform as the matmul inverse, to fp16 rounding
                mp.setattr(fastdct, "fits", lambda n, C: False)
                mm = PG.decode_with(c, data[:e], ID, tables, "reference")
            for a, b in ((nat.key, mm.key), (nat.value, mm.value)):
                assert torch.allclose(a.float(), b.float(), rtol=2e-3, atol=1e-3 * float(b.float().abs().max()))
