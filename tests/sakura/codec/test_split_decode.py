"""One shard decoded by several threads (`pool=`): the rANS pieces, the token rows of the
reconstruction, the inverse DCT's channel blocks and CacheGen's channels split over a
`ThreadPoolExecutor` give the serial native decode and the reference decode bit for bit, for
every progressive rung and every CacheGen level; a decode run from inside its own pool cannot
deadlock."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from sakura.codec import ShardId, ShardKV, codec_from_spec, get_codec
from sakura.codec.progressive import ladder as PG
from sakura.codec import rans as R

from .conftest import make_shard

ID = ShardId("m", "t", 1)


def _equal(a, b) -> bool:
    return torch.equal(a.key, b.key) and torch.equal(a.value, b.value) and torch.equal(a.keep, b.keep)


@pytest.fixture
def max_pieces(monkeypatch):
    """Records the most pieces any one numba rANS stream had, to show the split had work to share
    (these tests are the numba decoder's: the C library's split is test_decode_pool's)."""
    monkeypatch.setenv("SAKURA_DECODER", "numba")
    seen = [0]
    real = R.decode

    def spy(words, counts, *a, **kw):
        seen[0] = max(seen[0], int(np.asarray(counts).size))
        return real(words, counts, *a, **kw)
    monkeypatch.setattr(R, "decode", spy)
    return seen


@pytest.mark.parametrize("workers", [2, 3])
def test_rans_split_over_threads_equals_serial(workers):
    rng = np.random.default_rng(5)
    n = 5 * R.PIECE + 123
    p = rng.dirichlet(np.ones(40) * 0.3, size=3)
    model = R.Model.from_probs(p)
    seg_len = np.array([R.PIECE + 7, 2 * R.PIECE, n - 3 * R.PIECE - 7], np.int64)
    seg_ctx = np.array([0, 2, 1], np.int64)
    sym = np.concatenate([rng.choice(40, size=int(l), p=p[c]) for c, l in zip(seg_ctx, seg_len)]).astype(np.int32)
    words, counts = R.encode(sym, seg_ctx, seg_len, model)
    assert counts.size == 6
    with ThreadPoolExecutor(workers) as pool:
        got = R.decode(words, counts, seg_ctx, seg_len, model, pool=pool)
        assert np.array_equal(got, sym)
        bad = words.copy()
        bad[words.size // 2:] ^= 0x5A5A   # damage in later pieces: the split decode fails as the serial one
        outcome = []
        for pl in (None, pool):
            try:
                outcome.append(R.decode(bad, counts, seg_ctx, seg_len, model, pool=pl).tobytes())
            except R.CorruptError as e:
                outcome.append(str(e))
        assert outcome[0] == outcome[1]


def _wide_shard() -> ShardKV:
    """64 tokens x 2,048 channels: rung streams of several rANS pieces, 8 inverse-DCT blocks."""
    g = torch.Generator().manual_seed(3)
    T, H, D = 64, 8, 256
    k = torch.randn(T, H, D, generator=g)
    k[:, 0, :8] *= 40.0
    return ShardKV(k.half(), (torch.randn(T, H, D, generator=g) * 0.5).half(), layer=0, num_layers=1)


@pytest.mark.parametrize("with_tables", [True, False])
def test_progressive_split_decode_every_rung_equals_serial_and_reference(with_tables, max_pieces):
    shard = _wide_shard()
    c = get_codec("progressive", budgets=[0.3, 0.8, 2.0])
    tables = c.fit_tables([shard]) if with_tables else None
    data = c.encode(shard, ID, tables)
    ends = c.level_ends(data)
    assert len(ends) == 3
    with ThreadPoolExecutor(2) as pool2, ThreadPoolExecutor(3) as pool3:
        for e in ends:
            ref = PG.decode_with(c, data[:e], ID, tables, "reference")
            serial = c.decode(data[:e], ID, tables)
            assert _equal(serial, ref)
            for pool in (pool2, pool3):
                assert _equal(c.decode(data[:e], ID, tables, pool=pool), ref)
    assert max_pieces[0] > 1


@pytest.mark.parametrize("spec", ["cachegen:level=3", "cachegen:level=2", "cachegen:level=1",
                                  "cachegen:level=3,delta=true"])
def test_cachegen_split_decode_equals_serial_and_reference(spec, max_pieces):
    shard = make_shard(T=256, H=4, D=160)[0]   # 640 channels: 3 pieces of 256 channels (65,536 symbols)
    c = codec_from_spec(spec)
    for tables in (c.fit_tables([shard]), None):
        data = c.encode(shard, ID, tables)
        ref = c.decode_with(data, ID, tables, "reference")
        assert _equal(c.decode(data, ID, tables), ref)
        with ThreadPoolExecutor(2) as pool:
            assert _equal(c.decode(data, ID, tables, pool=pool), ref)
    assert max_pieces[0] > 1


def test_split_decode_from_inside_its_own_pool_does_not_deadlock():
    """Every worker busy with a decode that splits over the same pool: the callers run the
    unstarted ranges themselves."""
    shard = make_shard(T=70, H=4, D=64)[0]
    c = codec_from_spec("cachegen:level=2")
    data = c.encode(shard, ID, None)
    want = c.decode(data, ID, None)
    with ThreadPoolExecutor(2) as pool:
        futs = [pool.submit(c.decode, data, ID, None, pool) for _ in range(4)]
        for f in futs:
            assert _equal(f.result(timeout=120), want)
