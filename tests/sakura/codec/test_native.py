"""The numba decoders (`rans` + `kernels`) and the C library (`native`, the default "native" engine
where it is built) against the plain reference decoders of the same
bitstream: bit-for-bit equal on random and real template KV, every rung and every upgrade; the rANS
coder round-trips any symbols and tables (hypothesis); damaged input raises `CodecError` only and
never yields non-finite KV; objects of the old wire version raise `VersionError`."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sakura.codec import CodecError, ShardId, ShardKV, VersionError, get_codec
from sakura.codec import bitstream as bs
from sakura.codec import kernels as K
from sakura.codec.baselines import cachegen as CG
from sakura.codec.progressive import ladder as PG
from sakura.codec import rans as R

from .conftest import make_shard

ID = ShardId("m", "t", 1)
FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ---------------------------------------------------------------------------------------------
# the rANS coder alone

@st.composite
def streams(draw):
    A = draw(st.integers(2, 300))
    rows = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2 ** 31 - 1))
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 50, (rows, A)) ** draw(st.sampled_from([1, 3]))
    lens = rng.integers(0, draw(st.sampled_from([3, 40, 3000])), rows * draw(st.integers(1, 3)))
    ctx = rng.integers(0, rows, lens.size)
    sc, sl = R.segments_of(lens, ctx)
    model = R.Model.from_counts(counts)
    p = model.freq / float(1 << model.bits)
    sym = np.concatenate([rng.choice(A, size=int(n), p=p[c]) for c, n in zip(sc, sl)] + [np.zeros(0)]).astype(np.int32)
    piece = draw(st.sampled_from([8, 100, R.PIECE]))
    return sym, sc, sl, model, piece


@FUZZ
@given(streams())
def test_rans_roundtrip_native_and_reference(s):
    sym, sc, sl, model, piece = s
    words, counts = R.encode(sym, sc, sl, model, piece)
    assert counts.size == R.num_pieces(sym.size, piece)
    out = R.decode(words, counts, sc, sl, model, piece)
    assert np.array_equal(out, sym)
    assert np.array_equal(R.decode_reference(words, counts, sc, sl, model, piece), sym)
    if counts.size > 1:  # pieces decode independently (what several threads do)
        part = np.full(sym.size, -1, np.int32)
        R.decode(words, counts, sc, sl, model, piece, out=part, pieces=(1, counts.size))
        assert np.array_equal(part[piece:], sym[piece:]) and (part[:piece] == -1).all()


@FUZZ
@given(streams(), st.integers(0, 2 ** 31 - 1))
def test_rans_damaged_streams_raise_or_agree(s, seed):
    """A flipped word or a cut stream: both decoders raise CorruptError, or both give the same
    in-range symbols (a flip the final-state check cannot see); never anything else."""
    sym, sc, sl, model, piece = s
    words, counts = R.encode(sym, sc, sl, model, piece)
    if not words.size:
        return
    rng = np.random.default_rng(seed)
    bad = words.copy()
    bad[rng.integers(0, bad.size)] ^= np.uint16(1 << int(rng.integers(0, 16)))
    for w, c in ((bad, counts), (words[:-1], counts)):
        res = []
        for dec in (R.decode, R.decode_reference):
            try:
                res.append(dec(w, c, sc, sl, model, piece))
            except CodecError:
                res.append(None)
        if res[0] is None or res[1] is None:
            assert res[0] is None and res[1] is None
        else:
            assert np.array_equal(res[0], res[1]) and (res[0] >= 0).all() and (res[0] < model.alphabet).all()


def test_rans_costs_little_over_the_entropy():
    rng = np.random.default_rng(0)
    p = np.array([[0.97] + [0.03 / 81] * 81, [0.5, 0.25] + [0.25 / 80] * 80])
    model = R.Model.from_probs(p)
    sc, sl = R.segments_of(np.array([200_000, 200_000]))
    sym = np.concatenate([rng.choice(82, size=200_000, p=p[0]), rng.choice(82, size=200_000, p=p[1])]).astype(np.int32)
    words, _ = R.encode(sym, sc, sl, model)
    ent = -np.log2(np.where(np.arange(sym.size) < 200_000, p[0][sym], p[1][sym])).sum()
    assert 16 * words.size < 1.01 * ent + 2000


def test_rans_model_is_valid_and_deterministic():
    m = R.Model.from_counts(np.array([[0, 0, 10_000_000], [1, 2, 3]]))
    assert (m.freq >= 1).all() and (m.freq.sum(axis=1) == 1 << m.bits).all()
    assert np.array_equal(m.cum[:, -1], m.freq.sum(axis=1))
    with pytest.raises(CodecError):
        R.Model.from_counts(np.ones((1, R.MAX_ALPHABET + 1)))


# ---------------------------------------------------------------------------------------------
# whole codecs: native == reference, every rung and upgrade

def _big_shard(seed=0) -> ShardKV:
    """Big enough for the grouped (quad / multi-bit) layout, with escapes."""
    g = torch.Generator().manual_seed(seed)
    T, H, D = 16, 7, 1024
    k = torch.randn(T, H, D, generator=g)
    k[:, 0, :8] *= 40.0
    return ShardKV(k.half(), (torch.randn(T, H, D, generator=g) * 0.5).half(), layer=0, num_layers=1)


def _equal(a, b) -> bool:
    return torch.equal(a.key, b.key) and torch.equal(a.value, b.value) and torch.equal(a.keep, b.keep)


def _check_ladder(codec, shard, tables):
    data = codec.encode(shard, ID, tables)
    ends = codec.level_ends(data)
    state, prev = None, 0
    for e in ends:
        ref = PG.decode_with(codec, data[:e], ID, tables, "reference")
        state = codec.decode_state(data[:e], ID, tables) if state is None else codec.upgrade(state, data[prev:e])
        prev = e
        assert _equal(state.result(), ref) and _equal(codec.decode(data[:e], ID, tables), ref)
        assert torch.isfinite(ref.key.float()).all() and torch.isfinite(ref.value.float()).all()
    return data


@pytest.mark.parametrize("big", [False, True])
@pytest.mark.parametrize("with_tables", [True, False])
def test_progressive_native_equals_reference(big, with_tables):
    shard = _big_shard() if big else make_shard(T=64, H=4, D=16)[0]
    c = get_codec("progressive", budgets=[0.3, 0.8, 2.0, 3.5])
    assert PG.Layout.of(shard.shape[0], shard.shape[1] * shard.shape[2], 4).big == big
    _check_ladder(c, shard, c.fit_tables([shard]) if with_tables else None)


@pytest.mark.parametrize("mdt", ["auto", "int32"])
@pytest.mark.parametrize("lanes", [0, 8, 16])
@pytest.mark.parametrize("sparse", [0.0, 1.0])
@pytest.mark.parametrize("big", [False, True])
def test_progressive_sparse_and_dense_refinements_equal_reference(big, sparse, lanes, mdt, monkeypatch):
    """Every refinement forced through the dense merge (0) or the sparse one (1), the dense one
    scalar (lanes 0) or vector (16: expanding loads, correct on any CPU, fast with AVX-512
    VBMI2; 8: 128-bit byte-shuffle tables, x86 SSSE3), magnitudes int16 where they fit ("auto")
    or always int32, serial and split over threads: all equal the reference decoder."""
    from concurrent.futures import ThreadPoolExecutor

    if lanes == 8 and not K.BYTE_SHUFFLE:
        pytest.skip("no 128-bit byte shuffle on this CPU")

    monkeypatch.setenv("SAKURA_DECODER", "numba")   # these are the numba kernels' variants
    monkeypatch.setattr(PG, "SPARSE_REFINE", sparse)
    monkeypatch.setattr(K, "VECTOR_LANES", lanes)
    if mdt == "int32":
        monkeypatch.setattr(PG, "magnitude_dtype", lambda m0, planes: np.int32)
    shard = _big_shard(1) if big else make_shard(T=64, H=4, D=16)[0]
    c = get_codec("progressive", budgets=[0.3, 0.8, 2.0, 3.5])
    tables = c.fit_tables([shard])
    data = _check_ladder(c, shard, tables)
    with ThreadPoolExecutor(3) as pool:
        for e in c.level_ends(data):
            ref = PG.decode_with(c, data[:e], ID, tables, "reference")
            assert _equal(c.decode(data[:e], ID, tables, pool=pool), ref)


@pytest.mark.parametrize("seed", range(6))
def test_refine_vector_merge_equals_scalar(seed):
    """The dense merge 16 lanes at a time (`kernels._merge_lanes`) and 8 at a time
    (`_merge_lanes8`, scratch arrays padded as the decoder pads them, and unpadded: the vector
    loop stops short of their ends) against the scalar merge on random refinements: bands of
    lengths that are and are not multiples of 16, every mix of significant / newly significant
    coefficients, m = 1-4 bits."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 70, 12)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    n = int(starts[-1])
    p_sig = rng.uniform(0, 1)
    mag = np.where(rng.random(n) < p_sig, rng.integers(1, 50, n), 0).astype(np.int16 if seed % 2 else np.int32)
    neg = np.where(mag > 0, rng.integers(0, 2, n), 0).astype(np.uint8)
    m, g = int(rng.integers(1, 5)), 1
    counts = np.array([int((mag[starts[b]:starts[b + 1]] == 0).sum()) for b in range(sizes.size)], np.int64)
    nz = (rng.random(sizes.size) < 0.8).astype(np.uint8)
    sym = np.concatenate([rng.integers(0, 1 << m, int(counts[b])) if nz[b] else np.zeros(0, np.int64)
                          for b in range(sizes.size)]).astype(np.int32)
    nsig, nins = n - int(counts.sum()), int(counts.sum())
    low = np.concatenate([rng.integers(0, 256, (nsig * m + 7) // 8), np.zeros(4, np.int64)]).astype(np.uint8)
    signs = np.concatenate([rng.integers(0, 256, (nins + 7) // 8), np.zeros(4, np.int64)]).astype(np.uint8)
    outs = []
    for lanes, pad in ((0, 0), (16, 0), (8, K.VECTOR_PAD), (8, 0)):
        if lanes == 8 and not K.BYTE_SHUFFLE:
            continue
        mg, ng = mag.copy(), neg.copy()
        # scratch full of garbage: the kernels must use only what they unpacked
        lowv, newv = np.full(nsig + 1 + pad, -1, np.int16), np.full(nins + 1 + pad, -1, np.int16)
        err = K.refine(mg, ng, starts, nz, counts, sym, m, g, low, signs, lowv, newv,
                       np.full(nins + 1 + pad, 255, np.uint8), lanes)
        outs.append((err, mg, ng))
    assert all(o[0] == 0 for o in outs)
    assert all(np.array_equal(outs[0][1], o[1]) and np.array_equal(outs[0][2], o[2]) for o in outs[1:])
    assert not np.array_equal(outs[0][1], mag) or n == 0   # the refinement did something


@pytest.mark.parametrize("seed", range(4))
def test_sig_positions_vector_equals_scalar(seed):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 90, 10)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    mag = np.where(rng.random(int(starts[-1])) < rng.uniform(0, 0.5), 3, 0).astype(np.int16 if seed % 2 else np.int32)
    sigptr = np.zeros(sizes.size + 1, np.int64)
    np.cumsum([int((mag[starts[b]:starts[b + 1]] != 0).sum()) for b in range(sizes.size)], out=sigptr[1:])
    lanes_pads = [(0, 0), (16, 0), (8, 0), (8, 3)]   # (8: generic vector IR, any CPU; with spare room too)
    got = []
    for lanes, pad in lanes_pads:
        pos = np.full(int(sigptr[-1]) + pad, -1, np.int32)
        assert K.sig_positions(mag, starts, sigptr, pos, lanes)
        got.append(pos[:int(sigptr[-1])])
    assert np.array_equal(got[0], np.flatnonzero(mag)) and all(np.array_equal(g, got[0]) for g in got[1:])
    b = int(np.flatnonzero(np.diff(sigptr) > 0)[-1])   # a band with nonzero magnitudes
    short = sigptr.copy()
    short[b + 1:] -= 1                                  # ... counted one short: all say so
    for lanes, pad in lanes_pads:
        assert not K.sig_positions(mag, starts, short, np.zeros(int(sigptr[-1]) + pad, np.int32), lanes)


def test_progressive_weighted_and_untransformed_equal_reference():
    shard = make_shard(T=48, H=2, D=16)[0]
    for c in (get_codec("layered", quantiser="ecsq", budgets=[0.5, 1.5], weighting="importance"),
              get_codec("layered", quantiser="ecsq", transform="none", budgets=[0.5, 1.5])):
        _check_ladder(c, shard, c.fit_tables([shard]))


@pytest.mark.parametrize("spec", ["cachegen:level=3", "cachegen:level=2", "cachegen:level=1",
                                  "cachegen:level=3,delta=true"])
@pytest.mark.parametrize("with_tables", [True, False])
def test_cachegen_native_equals_reference(spec, with_tables):
    from sakura.codec import codec_from_spec

    shard = make_shard(T=70, H=4, D=16)[0]
    c = codec_from_spec(spec)
    tables = c.fit_tables([shard]) if with_tables else None
    data = c.encode(shard, ID, tables)
    assert _equal(c.decode(data, ID, tables), c.decode_with(data, ID, tables, "reference"))


@pytest.fixture(scope="module")
def real_layers():
    """Template KV of the bundled sakura-mini model (two layers of one library template)."""
    from sakura.models import MINI_WEIGHTS, load_mini
    from sakura.cloud.tasks import library_templates

    if not MINI_WEIGHTS.is_file():
        pytest.skip("no bundled sakura-mini weights")
    model = load_mini()
    tpl = library_templates(model.cfg.image_size)[0]
    layers = list(model.template_layers(tpl.image[None], tpl.instruction))
    return [ShardKV(k[0], v[0], layer=i, num_layers=len(layers)) for i, (k, v) in enumerate(layers[:2])]


def test_real_template_kv_native_equals_reference(real_layers):
    from sakura.codec import codec_from_spec

    for spec in ("progressive", "cachegen:level=3", "cachegen:level=1"):
        c = codec_from_spec(spec)
        tables = c.fit_tables(real_layers)
        for shard in real_layers:
            if c.supports_layers:
                _check_ladder(c, shard, tables)
            else:
                data = c.encode(shard, ID, tables)
                assert _equal(c.decode(data, ID, tables), c.decode_with(data, ID, tables, "reference"))


# ---------------------------------------------------------------------------------------------
# wire version

def _with_version(obj: bytes, version: int) -> bytes:
    b = bytearray(obj)
    b[4:6] = struct.pack("<H", version)
    crc = zlib.crc32(bytes(b[24:]), zlib.crc32(bytes(b[:20])))
    b[20:24] = struct.pack("<I", crc)
    return bytes(b)


@pytest.mark.parametrize("spec", ["progressive", "cachegen:level=2"])
def test_old_and_future_versions_raise_version_error(spec):
    from sakura.codec import codec_from_spec, decode_any

    shard = make_shard(T=16, H=2, D=8)[0]
    c = codec_from_spec(spec)
    tables = c.fit_tables([shard])
    data = c.encode(shard, ID, tables)
    first = next(bs.split_objects(data))
    for v in (1, 3, 6):
        old = _with_version(data[:first[1]], v) + data[first[1]:]
        with pytest.raises(VersionError):
            decode_any(old, ID, tables)
    if c.supports_layers:  # a refinement of another version, too
        ends = c.level_ends(data)
        state = c.decode_state(data[:ends[0]], ID, tables)
        with pytest.raises(VersionError):
            c.upgrade(state, _with_version(data[ends[0]:ends[1]], 3))


# ---------------------------------------------------------------------------------------------
# fuzz: every codec's decoder, damaged objects -> CodecError only, finite KV otherwise

FUZZ_SPECS = ["lossless", "lossless:zstd=true", "uniform:bits=4", "cachegen:level=3", "cachegen:level=1,delta=true",
              "sakura:budget=2.0", "sakura:budget=1.0,quantiser=\"ecsq\",transform=\"dct\"",
              "layered:budgets=[1.0,2.0]", "progressive"]


@pytest.fixture(scope="module")
def encoded():
    from sakura.codec import codec_from_spec

    shard = make_shard(T=16, H=2, D=8)[0]
    out = {}
    for spec in FUZZ_SPECS:
        c = codec_from_spec(spec)
        tables = c.fit_tables([shard]) if c.uses_tables else None
        out[spec] = (c, tables, c.encode(shard, ID, tables))
    return out


def _decodes_or_raises(c, data, tables):
    from sakura.codec import decode_any

    for dec in (lambda: c.decode(data, ID, tables), lambda: decode_any(data, ID, tables)):
        try:
            out = dec()
        except CodecError:
            continue
        assert torch.isfinite(out.key.float()).all() and torch.isfinite(out.value.float()).all()


@pytest.mark.parametrize("spec", FUZZ_SPECS)
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_damaged_objects_raise_codec_errors_only(encoded, spec, data):
    c, tables, blob = encoded[spec]
    b = bytearray(blob)
    kind = data.draw(st.sampled_from(["flip", "truncate", "header", "payload_crc_fixed"]))
    if kind == "flip":
        i = data.draw(st.integers(0, len(b) - 1))
        b[i] ^= 1 << data.draw(st.integers(0, 7))
    elif kind == "truncate":
        b = b[:data.draw(st.integers(0, len(b) - 1))]
    elif kind == "header":  # a mutated fixed header (version, kind, flags, lengths)
        i = data.draw(st.integers(4, 19))
        b[i] = data.draw(st.integers(0, 255))
    else:  # damage inside the payload with a recomputed checksum: the decoder itself must cope
        first_end = next(bs.split_objects(blob))[1]
        hlen = struct.unpack_from("<I", blob, 8)[0]
        lo = 24 + hlen
        if first_end - lo > 0:
            i = data.draw(st.integers(lo, first_end - 1))
            b[i] = data.draw(st.integers(0, 255))
            crc = zlib.crc32(bytes(b[24:first_end]), zlib.crc32(bytes(b[:20])))
            b[20:24] = struct.pack("<I", crc)
    _decodes_or_raises(c, bytes(b), tables)


def test_magnitude_dtype_bounds_every_rung():
    assert PG.magnitude_dtype(30, [0, 1, 2]) == np.int16          # the default ladder's kind
    assert PG.magnitude_dtype((1 << 15) - 1, [0]) == np.int16      # m0 + 1 = 2^15: magnitudes <= 2^15 - 1
    assert PG.magnitude_dtype(1 << 15, [0]) == np.int32
    assert PG.magnitude_dtype(3, [0, 6, 13]) == np.int16          # 4 << 13 = 2^15: still < 2^15
    assert PG.magnitude_dtype(4, [0, 6, 13]) == np.int32          # 5 << 13 > 2^15


def test_warm_up_compiles_every_kernel():
    from sakura.codec import warm_up

    assert warm_up() >= 0.0


def test_one_class_per_codec_and_only_its_parameters():
    from sakura.codec import codec_from_spec
    from sakura.codec.nested import layered
    from sakura.codec.nested import sakura as S

    p = codec_from_spec("progressive")
    assert type(p) is PG.ProgressiveCodec and type(p).__module__ == PG.__name__
    assert type(codec_from_spec("layered")) is layered.LayeredCodec and type(codec_from_spec("sakura")) is S.SakuraCodec
    assert set(p.params) == {"budgets", "transform", "allocate", "weighting", "gamma"}
    for bad in ("progressive:alpha=5", "progressive:quantiser=\"nested\"", "progressive:budgets=[1.0,0.5]",
                "progressive:key_group=4"):
        with pytest.raises(ValueError):
            codec_from_spec(bad)
    # a layered ladder with the ecsq quantiser writes progressive objects that say what wrote them
    shard = make_shard(T=16, H=2, D=8)[0]
    lc = codec_from_spec('layered:quantiser="ecsq",budgets=[0.5,1.0]')
    tables = lc.fit_tables([shard])
    from sakura.codec import decode_any
    data = lc.encode(shard, ID, tables)
    assert _equal(decode_any(data, ID, tables), lc.decode(data, ID, tables))
