"""The progressive transform ladder (`layered:quantiser="ecsq"[,transform="dct"]`): every rung refines
the previous one's coefficients, rung l is a byte prefix, upgrades equal full decodes, the per-
coefficient error bound holds at every rung, and damaged or mismatched objects raise."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sakura.codec import CodecError, IdentityError, ShardId, ShardKV, get_codec
from sakura.codec import ecsq as EQ
from sakura.codec.progressive import ladder as PG

from .conftest import make_shard

ID = ShardId("m", "t", 3)


def _smooth_shard(T=64, H=4, D=16, seed=0, dtype=torch.float32, layer=0, num_layers=2) -> ShardKV:
    """Neighbouring tokens correlate (a blurred random field over the token grid), as image KV does."""
    g = torch.Generator().manual_seed(seed)
    n = int(round(T ** 0.5))
    field = torch.randn(2, H * D, n, n, generator=g)
    field = torch.nn.functional.avg_pool2d(field, 3, 1, 1) * 3 + 0.3 * torch.randn(2, H * D, n, n, generator=g)
    kv = field.reshape(2, H * D, T).permute(0, 2, 1).reshape(2, T, H, D)
    return ShardKV((kv[0] + 2.0).to(dtype), kv[1].to(dtype), layer=layer, num_layers=num_layers)


def _coef(x: torch.Tensor, mean: np.ndarray, n: int) -> np.ndarray:
    flat = x.float().reshape(x.shape[0], -1).numpy()
    return PG.coefficients(flat, mean, n)


@pytest.mark.parametrize("transform", ["dct", "none"])
@pytest.mark.parametrize("with_tables", [True, False])
def test_rungs_are_prefixes_nested_and_bounded(transform, with_tables):
    shard = _smooth_shard()
    c = get_codec("layered", budgets=[0.3, 0.6, 1.2, 2.4], quantiser="ecsq", transform=transform)
    tables = c.fit_tables([shard]) if with_tables else None
    data = c.encode(shard, ID, tables)
    ends = c.level_ends(data)
    assert len(ends) == 4 and ends[-1] == len(data) and ends == sorted(ends)
    state, prev, errs = None, 0, []
    for l, e in enumerate(ends):
        full = c.decode(data[:e], ID, tables)
        state = c.decode_state(data[:e], ID, tables) if state is None else c.upgrade(state, data[prev:e])
        inc = state.result()
        assert torch.equal(full.key, inc.key) and torch.equal(full.value, inc.value) and bool(full.keep.all())
        prev = e
        # per-coefficient bound: |c - c^| <= step_l / 2 where significant, < step_l where not
        for kv, x, xh in (("k", shard.key, full.key), ("v", shard.value, full.value)):
            step0, planes, _m0, n = state._part(kv) if l == len(ends) - 1 else c.decode_state(
                data[:e], ID, tables)._part(kv)
            st = step0 * 2.0 ** -planes[l]
            mean = state.mean[kv].astype(np.float64)
            err = np.abs(_coef(x, mean, n) - _coef(xh, mean, n))
            assert err.max() <= st * (1 + 1e-4) + 1e-5, (l, kv, err.max(), st)
        errs.append(float(((full.key - shard.key) ** 2).sum() + ((full.value - shard.value) ** 2).sum()))
    assert all(b < a for a, b in zip(errs, errs[1:])), errs


def test_rate_follows_budgets_and_dct_helps_smooth_kv():
    shard = _smooth_shard(T=256, H=4, D=16)
    sizes = {}
    for tr in ("dct", "none"):
        c = get_codec("layered", budgets=[0.5, 1.0, 2.0], quantiser="ecsq", transform=tr)
        tables = c.fit_tables([shard])
        data = c.encode(shard, ID, tables)
        ends = c.level_ends(data)
        bpv = [8 * e / shard.num_values for e in ends]
        assert bpv == sorted(bpv) and bpv[-1] < 2.0 * 1.6, bpv
        dec = c.decode(data, ID, tables)
        sizes[tr] = (len(data), float(((dec.value - shard.value) ** 2).mean()))
    # at equal budgets the transform ladder is at least as accurate (smooth field)
    assert sizes["dct"][1] < sizes["none"][1]


def test_big_layout_groups_symbols_and_escapes():
    """A layout with >= BIG_BAND coefficients per band codes rung 0 in quads (with escapes for
    |index| > 1) and refinements several bits per symbol; it decodes exactly like the rest."""
    g = torch.Generator().manual_seed(3)
    T, H, D = 16, 7, 1024
    assert PG.Layout.of(T, H * D, 4).big
    k = torch.randn(T, H, D, generator=g)
    k[:, 0, :8] *= 40.0  # escapes
    v = torch.randn(T, H, D, generator=g)
    shard = ShardKV(k, v, layer=0, num_layers=1)
    c = get_codec("layered", budgets=[0.5, 1.0, 2.0], quantiser="ecsq", transform="dct")
    tables = c.fit_tables([shard])
    data = c.encode(shard, ID, tables)
    ends = c.level_ends(data)
    state = c.decode_state(data[:ends[0]], ID, tables)
    for a, b in zip(ends, ends[1:]):
        c.upgrade(state, data[a:b])
    full = c.decode(data, ID, tables)
    assert torch.equal(state.result().key, full.key)
    rel = float(((full.key - k) ** 2).sum() / (k ** 2).sum())
    assert rel < 0.2  # iid Gaussian at ~2 bits per value (the bound below is the real check)
    st = c.decode_state(data, ID, tables)
    step0, planes, _m0, n = st._part("k")
    err = np.abs(_coef(k, st.mean["k"].astype(np.float64), n) - _coef(full.key, st.mean["k"].astype(np.float64), n))
    assert err.max() <= step0 * 2.0 ** -planes[-1] * (1 + 1e-4) + 1e-5


def test_damaged_or_mismatched_objects_raise():
    shard = _smooth_shard(dtype=torch.float16)
    c = get_codec("layered", budgets=[0.3, 1.0], quantiser="ecsq", transform="dct")
    tables = c.fit_tables([shard])
    data = c.encode(shard, ID, tables)
    ends = c.level_ends(data)
    for n in range(0, len(data), max(1, len(data) // 60)):
        if n in ends:
            continue
        with pytest.raises(CodecError):
            c.decode(data[:n], ID, tables)
    rng = np.random.default_rng(0)
    for _ in range(40):
        bad = bytearray(data)
        i = int(rng.integers(0, len(bad)))
        bad[i] ^= 1 << int(rng.integers(0, 8))
        with pytest.raises(CodecError):
            c.decode(bytes(bad), ID, tables)
    with pytest.raises(IdentityError):
        c.decode(data, ShardId("m", "other", 3), tables)
    other = _smooth_shard(seed=9, dtype=torch.float16)
    with pytest.raises(CodecError):
        c.decode(data, ID, c.fit_tables([other]))
    od = c.encode(other, ID, tables)
    state = c.decode_state(data[:ends[0]], ID, tables)
    with pytest.raises(IdentityError, match="parent"):
        c.upgrade(state, od[c.level_ends(od)[0]:])
    assert struct_version(data) == PG.FORMAT_VERSION == 5


def struct_version(data: bytes) -> int:
    import struct

    return struct.unpack_from("<H", data, 4)[0]


def test_sensitivity_allocation_protects_the_sensitive_part():
    """Two layers alike; layer 1's values are 100x as sensitive: they get the smaller error."""
    a = _smooth_shard(seed=1, layer=0)
    b = _smooth_shard(seed=1, layer=1)
    a.sensitivity, b.sensitivity = (1.0, 1.0), (1.0, 100.0)
    c = get_codec("layered", budgets=[0.3, 0.8], quantiser="ecsq", transform="dct", allocate="sensitivity")
    tables = c.fit_tables([a, b])
    da = c.decode(c.encode(a, ShardId("m", "t", 0), tables), ShardId("m", "t", 0), tables)
    db = c.decode(c.encode(b, ShardId("m", "t", 1), tables), ShardId("m", "t", 1), tables)
    ea = float(((da.value - a.value) ** 2).mean())
    eb = float(((db.value - b.value) ** 2).mean())
    assert eb < ea / 2, (ea, eb)
    assert EQ.grid_side(64) == 8


# ---------------------------------------------------------------------------------------------
# image allocation (`allocate="image"`, `ShardKV.distortion`) and reconstruction offsets (v5)

def _probe(shard: ShardKV, weights: dict[str, float], shrink: float = 0.0, calls: list | None = None):
    """A stand-in image probe: weight x relative MSE of the part, plus `shrink` x the squared loss
    of the part's energy (what the real image penalises: dead-zone shrinkage toward zero)."""
    def distortion(kv: str, decoded: torch.Tensor) -> float:
        if calls is not None:
            calls.append(kv)
        x = (shard.key if kv == "k" else shard.value).double()
        y = decoded.double()
        xm, ym = x - x.mean(0), y - x.mean(0)
        e = float(((y - x) ** 2).sum() / (x ** 2).sum())
        loss = 1.0 - float((ym ** 2).sum() / (xm ** 2).sum())
        return weights[kv] * (e + shrink * loss ** 2)
    return distortion


def _image_pair(shrink=0.0, calls=None):
    a, b = _smooth_shard(seed=1, layer=0), _smooth_shard(seed=2, layer=1)
    # the proxy says every part weighs the same; the probe says layer 1's keys weigh 50x
    for s in (a, b):
        s.sensitivity = (1.0, 1.0)
    a.distortion = _probe(a, {"k": 1.0, "v": 1.0}, shrink, calls)
    b.distortion = _probe(b, {"k": 50.0, "v": 1.0}, shrink, calls)
    return [a, b]


def _total(codec, shards):
    tables = codec.fit_tables(shards)
    bits, dist = 0, 0.0
    for s in shards:
        i = ShardId("m", "t", s.layer)
        data = codec.encode(s, i, tables)
        d = codec.decode(data, i, tables)
        bits += 8 * len(data)
        dist += s.distortion("k", d.key) + s.distortion("v", d.value)
    return bits, dist, data


def test_image_allocation_beats_the_proxy_where_the_probe_disagrees():
    calls: list = []
    shards = _image_pair(calls=calls)
    bi, di, _ = _total(get_codec("progressive", budgets=[1.0]), shards)      # allocate="image", the default
    n = len(calls)
    bp, dp, _ = _total(get_codec("progressive", budgets=[1.0], allocate="sensitivity"), shards)
    assert di < 0.8 * dp and bi <= 1.05 * bp, (di, dp, bi, bp)
    # bounded probe cost: a window per part (plus offsets), widened a few times at most
    assert 0 < n <= 4 * (2 * PG.IMAGE_WINDOW + 1) * (PG.IMAGE_WIDEN + 1) + 4 * len(PG.OFFSETS) + 8, n
    # without probes on every shard, "image" falls back to the proxy (same tables, same bytes)
    shards[0].distortion = None
    c = get_codec("progressive", budgets=[1.0])
    s = get_codec("progressive", budgets=[1.0], allocate="sensitivity")
    assert c.fit_tables(shards).arrays["L1.k.plan"].tolist() == s.fit_tables(shards).arrays["L1.k.plan"].tolist()


@pytest.mark.parametrize("levels", [[1.0], [0.4, 1.2]])
def test_reconstruction_offsets_version_5(levels):
    """A probe that penalises shrinkage picks offsets above the midpoint: the object is version 5,
    decodes natively as the reference does (bit for bit), at every rung, and the decoded
    coefficients are sign (q + off) step."""
    shards = _image_pair(shrink=30.0)
    c = get_codec("progressive", budgets=levels)
    tables = c.fit_tables(shards)
    s = shards[1]
    data = c.encode(s, ShardId("m", "t", 1), tables)
    assert struct_version(data) == 5
    ends = c.level_ends(data)
    st = c.decode_state(data[:ends[0]], ShardId("m", "t", 1), tables)
    offs = {kv: st.header["prog"][kv]["off"] for kv in "kv"}
    assert any(o > 0.5 for kv in "kv" for o in offs[kv]) and all(o in PG.OFFSETS for kv in "kv" for o in offs[kv])
    for l, e in enumerate(ends):
        nat = c.decode(data[:e], ShardId("m", "t", 1), tables)
        ref = PG.decode_with(c, data[:e], ShardId("m", "t", 1), tables, "reference")
        assert torch.equal(nat.key, ref.key) and torch.equal(nat.value, ref.value)
        if l:
            st.upgrade(data[ends[l - 1]:e])
        for kv in "kv":
            step, planes, _m0, n = st._part(kv)
            stp = np.float32(step * 2.0 ** -planes[l])
            mag, neg = st.mag[kv], st.neg[kv]
            want = np.where(mag > 0, (mag.astype(np.float32) + np.float32(offs[kv][l])) * stp, 0).astype(np.float32)
            want[neg > 0] *= -1
            assert np.array_equal(st.coefficients(kv), st.layout.from_flat(want))


def _relabel(obj: bytes, version: int) -> bytes:
    import struct
    import zlib

    b = bytearray(obj)
    b[4:6] = struct.pack("<H", version)
    b[20:24] = struct.pack("<I", zlib.crc32(bytes(b[24:]), zlib.crc32(bytes(b[:20]))))
    return bytes(b)


def test_offsets_header_is_checked_against_the_version():
    import json
    import struct
    import zlib

    from sakura.codec import CorruptError, VersionError
    from sakura.codec import bitstream as bs

    shards = _image_pair(shrink=30.0)
    c = get_codec("progressive", budgets=[1.0])
    tables = c.fit_tables(shards)
    ident = ShardId("m", "t", 1)
    data = c.encode(shards[1], ident, tables)
    obj = bs.parse(data)

    def forge(header, version):
        w = bs.Writer()
        w.add("p", obj.section("p"))
        h = {k: v for k, v in header.items() if k != "sections"}
        if version < 5:   # version 4 spelled the identity out
            h["id"] = ident.to_json()
        return w.to_bytes(bs.KIND_SHARD, h, version)

    h = json.loads(json.dumps(obj.header))
    c.decode(forge(h, 5), ident, tables)                      # the forge itself is faithful
    with pytest.raises(CorruptError, match="offsets"):       # offsets in a version-4 object
        c.decode(forge(h, 4), ident, tables)
    for bad in (None, [0.5, 0.5], [1.0], ["0.5"], [-0.1]):
        hb = json.loads(json.dumps(h))
        if bad is None:
            del hb["prog"]["k"]["off"]
        else:
            hb["prog"]["k"]["off"] = bad
        with pytest.raises(CorruptError, match="offsets"):
            c.decode(forge(hb, 5), ident, tables)
    with pytest.raises(VersionError):
        c.decode(forge(h, 6), ident, tables)
    hc = json.loads(json.dumps(h))
    with pytest.raises(VersionError):                         # a compact identity in a version-4 object
        bs.check_identity(bs.parse(_relabel(forge(hc, 5), 4)), ident)
    with pytest.raises(IdentityError, match="model or template"):
        c.decode(data, ShardId("m", "other", 1), tables)
    with pytest.raises(IdentityError, match="shard"):
        c.decode(data, ShardId("m", "t", 0), tables)
    # a version-4 object (before offsets: no "off", the midpoint) still decodes, as the midpoint
    mid = get_codec("progressive", budgets=[1.0], allocate="sensitivity")
    mt = mid.fit_tables(shards)
    m5 = mid.encode(shards[1], ident, mt)
    o5 = bs.parse(m5)
    assert all(o5.header["prog"][kv]["off"] == [0.5] for kv in "kv")
    h4 = json.loads(json.dumps(o5.header))
    for kv in "kv":
        del h4["prog"][kv]["off"]
    obj = o5
    d4, d5 = mid.decode(forge(h4, 4), ident, mt), mid.decode(m5, ident, mt)
    assert torch.equal(d4.key, d5.key) and torch.equal(d4.value, d5.value)


def test_importance_weighting_without_tables_round_trips():
    """Token scales (weighting="importance") in an object that carries its own means (no shared
    tables): the writer used to put the scales before the mean, which the reader takes first."""
    import torch

    from sakura.codec import ShardId, ShardKV, codec_from_spec

    g = torch.Generator().manual_seed(3)
    k, v = torch.randn(16, 2, 8, generator=g), torch.randn(16, 2, 8, generator=g)
    imp = torch.rand(16, generator=g) + 0.1
    shard = ShardKV(k.half(), v.half(), importance=imp, layer=0, num_layers=1)
    ident = ShardId("a" * 64, "b" * 64, 0)
    weighted_err = {}
    for spec in ("progressive", "progressive:weighting=importance"):
        codec = codec_from_spec(spec)
        out = codec.decode(codec.encode(shard, ident, None), ident, None)
        assert out.key.shape == k.shape and torch.isfinite(out.key.float()).all()
        per_token = (out.key.float() - k).pow(2).mean(dim=(1, 2))
        weighted_err[spec] = float((per_token * imp).sum() / imp.sum())
    # what the weighting is for: less error where the importance is
    assert weighted_err["progressive:weighting=importance"] < weighted_err["progressive"]


def test_offset_walk_finds_the_best_offset_with_fewer_probes():
    """`_image_offsets` walks up from the midpoint while the image MSE falls: on a probe whose MSE
    over the offsets is unimodal it picks what measuring all four picks, with fewer probes."""
    shards = _image_pair(shrink=30.0)
    budgets = [0.4, 1.2]
    c = get_codec("progressive", budgets=budgets)
    c.fit_tables(shards)                                       # fills the parts' cached transforms
    plans = PG.plan_parts(shards, budgets, "dct", True, use_image=True)
    means, step0 = {}, {}
    for s in shards:
        for kv in PG.PARTS:
            (_pts, mean), = [v for k, v in s.fit_cache.items() if k[0] == "rd" and k[1] == kv]
            means[(s.layer, kv)] = mean
            step0[(s.layer, kv)] = plans[(s.layer, kv)].step0
    planes = {part: p.planes for part, p in plans.items()}
    calls: list = []
    for s in shards:  # count this walk's probes only
        s.distortion = _probe(s, {"k": 1.0 if s.layer == 0 else 50.0, "v": 1.0}, 30.0, calls)
    walked = PG._image_offsets(shards, means, step0, planes, "dct")
    n_walk = len(calls)
    full = {}
    for s in shards:
        for kv in PG.PARTS:
            part = (s.layer, kv)
            mu, coef, _b, _e, sc = means[part]
            full[part] = []
            for k in planes[part]:
                st = float(np.float32(step0[part] * 2.0 ** -k))
                mses = [s.distortion(kv, PG._decoded_part(coef, st, PG._grid(s.shape[0], "dct"), mu, sc, s.shape,
                                                          s.key.dtype, o)) for o in PG.OFFSETS]
                assert all(np.diff(np.sign(np.diff(mses))) >= 0)  # unimodal (falls, then rises)
                full[part].append(PG.OFFSETS[int(np.argmin(mses))])
    distinct_steps = sum(len(set(p)) for p in planes.values())
    assert walked == full
    assert n_walk < len(PG.OFFSETS) * distinct_steps


@pytest.mark.parametrize("step", [0.003, 0.05, 0.4, 3.0])
def test_native_deadzone_rd_equals_the_numpy_reference(step):
    """The fit's one-pass kernel (`fitkernels.deadzone_rd`) against `_deadzone_rd_numpy`: the same
    histograms (so the same entropy), the squared error up to summation order."""
    rng = np.random.default_rng(1)
    c = rng.standard_normal((64, 48)) * np.linspace(4, 0.05, 64)[:, None]
    c[3, 5] = 0.0
    c[7, 1] = -0.0
    band = PG._bands(64, 8)
    e = float((c ** 2).sum())
    rel_n, bits_n = PG._deadzone_rd_numpy(c, band, step, e)
    rel, bits = PG._deadzone_rd(c, band, step, e)
    assert rel == pytest.approx(rel_n, rel=1e-12) and bits == pytest.approx(bits_n, rel=1e-12)


def test_deadzone_rd_counts_sparsely_when_the_alphabet_is_huge(monkeypatch):
    """A fit's planes reach step0 / 2^12: the dense (bands x alphabet) histogram could need
    gigabytes there, and is mostly zeros long before; above `SPARSE_COUNTS_PER_VALUE` entries per
    value (or `MAX_DENSE_COUNTS` in all) the sweep sorts the pairs that occur instead, with the
    same result to the last bit (same counts, same order, the same error loop)."""
    from sakura.codec.progressive import fitkernels as FK

    rng = np.random.default_rng(2)
    c = rng.standard_normal((64, 48)) * 3
    band = PG._bands(64, 8)
    e = float((c ** 2).sum())
    for step in (1e-4, 0.05, 2.0):
        monkeypatch.setattr(FK, "SPARSE_COUNTS_PER_VALUE", 1 << 40)
        dense = FK.deadzone_rd(c, band, step, e)
        monkeypatch.setattr(FK, "SPARSE_COUNTS_PER_VALUE", 0)
        sparse = FK.deadzone_rd(c, band, step, e)
        monkeypatch.setattr(FK, "SPARSE_COUNTS_PER_VALUE", 1 << 40)
        monkeypatch.setattr(FK, "MAX_DENSE_COUNTS", 0)
        capped = FK.deadzone_rd(c, band, step, e)
        monkeypatch.undo()
        assert sparse == dense and capped == dense
