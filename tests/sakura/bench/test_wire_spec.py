"""docs/wire-format.md is enough to decode: a decoder written from the page alone (struct, zlib,
zstandard, numpy; nothing from sakura.codec) reads the committed lossless, uniform and CacheGen
vectors (versions 1, 4 and 5, plain, zstd and dictionary headers) to the recorded digests, and the
progressive ladders (every rung, with and without tables, versions 4 and 5) to within the page's
stated tolerance (its inverse DCT here is float64, the native one float32)."""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import zstandard

VECTORS = Path(__file__).resolve().parents[3] / "docs" / "wire-format" / "vectors"


def parse(data: bytes) -> tuple[int, dict, bytes]:
    """Section 4.1: (version, header, payload) of one whole object."""
    magic, version, kind, flags, h, p = struct.unpack_from("<4sHBBIQ", data)
    (crc,) = struct.unpack_from("<I", data, 20)
    assert magic == b"SKKV" and len(data) == 24 + h + p
    assert crc == zlib.crc32(data[24:], zlib.crc32(data[:20]))
    raw = data[24:24 + h]
    if flags == 1:
        raw = zstandard.ZstdDecompressor().decompress(raw, max_output_size=1 << 24)
    elif flags == 2:
        d = zstandard.ZstdCompressionDict((VECTORS / "header-dict-1.bin").read_bytes(),
                                          dict_type=zstandard.DICT_TYPE_RAWCONTENT)
        raw = zstandard.ZstdDecompressor(dict_data=d).decompress(raw, max_output_size=1 << 24)
    return version, json.loads(raw), data[24 + h:]


def sections(header: dict, payload: bytes) -> dict[str, np.ndarray]:
    out, at = {}, 0
    for s in header["sections"]:
        raw = payload[at:at + s["nbytes"]]
        at += s["nbytes"]
        if s.get("zstd"):
            raw = zstandard.ZstdDecompressor().decompress(raw, max_output_size=1 << 30)
        out[s["name"]] = np.frombuffer(raw, np.dtype(s["dtype"])).reshape(s["shape"])
    assert at == len(payload)
    return out


def model(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Section 4.6's model: (freq, cum, bits) per row."""
    A = weights.shape[1]
    bits = 14 if A <= 2048 else 16
    M = 1 << bits
    p = weights.astype(np.float64) + 1.0
    p = p / p.sum(axis=1, keepdims=True)
    f = 1 + np.floor(p * (M - A)).astype(np.int64)
    f[np.arange(f.shape[0]), np.argmax(p, axis=1)] += M - f.sum(axis=1)
    cum = np.zeros((f.shape[0], A + 1), np.int64)
    np.cumsum(f, axis=1, out=cum[:, 1:])
    return f, cum, bits


def rans(words: np.ndarray, counts: np.ndarray, contexts: list[int], piece: int, mdl) -> list[int]:
    """Section 4.6's decoder: symbols of a stream whose i-th symbol has context contexts[i]."""
    f, cum, bits = mdl
    n, mask = len(contexts), (1 << bits) - 1
    lanes = 8 if n >= 1024 else 1
    out, w0 = [], 0
    for pc, nwords in enumerate(counts.tolist()):
        w = words[w0:w0 + nwords].astype(np.int64).tolist()
        w0 += nwords
        st = [(w[2 * k] << 16) | w[2 * k + 1] for k in range(lanes)]
        p = 2 * lanes
        a = pc * piece
        for j in range(a, min(n, a + piece)):
            lane, c = (j - a) % lanes, contexts[j]
            x = st[lane]
            slot = x & mask
            s = int(np.searchsorted(cum[c], slot, side="right") - 1)
            x = int(f[c, s]) * (x >> bits) + slot - int(cum[c, s])
            if x < 1 << 16:
                x = (x << 16) | w[p]
                p += 1
            st[lane] = x
            out.append(s)
        assert p == len(w) and all(x == 1 << 16 for x in st)
    return out


def decode(data: bytes, tables: dict[str, np.ndarray] | None) -> tuple[np.ndarray, np.ndarray]:
    version, h, payload = parse(data)
    sec = sections(h, payload)
    T, H, D = h["shape"]
    C = T and H * D
    dt = {"float16": np.float16, "float32": np.float32}[h["dtype"]]
    out = []
    if h["codec"] == "lossless":
        for name in ("key", "value"):
            a = sec[name]
            if h["params"].get("zstd"):
                a = np.ascontiguousarray(a.T).view("<u2" if dt == np.float16 else "<u4").reshape(-1)
            out.append(a.view(dt).reshape(T, C))
    elif h["codec"] == "uniform":
        b, kg, vg = h["params"]["bits"], h["params"]["key_group"], h["params"]["value_group"]
        for kv, mode, g in (("k", "key", kg), ("v", "value", vg)):
            bitsarr = np.unpackbits(sec[f"{kv}_sym"], bitorder="little")[:T * C * b].reshape(T * C, b)
            idx = (bitsarr.astype(np.int64) << np.arange(b)).sum(axis=1).reshape(T, C).astype(np.float32)
            lo, r = (sec[f"{kv}_{x}"].astype(np.float32) for x in ("lo", "r"))
            if mode == "key":
                g = min(g, T) if g > 0 else T
                lo, r = np.repeat(lo, g, 0)[:T], np.repeat(r, g, 0)[:T]
            else:
                g = min(g, C) if g > 0 else C
                lo, r = np.repeat(lo, g, 1)[:, :C], np.repeat(r, g, 1)[:, :C]
            x = (((idx + np.float32(0.5)) * np.float32(2.0 ** -b)) * r) + lo
            out.append(x.astype(dt))
    elif h["codec"] == "cachegen":
        assert version in (4, 5) and not h["params"].get("delta")
        for kv, bins in (("k", h["key_bins"]), ("v", h["value_bins"])):
            mx = bins // 2 - 1
            counts = sec[f"hist.{kv}"] if tables is None else tables[f"L{h['layer']}.{kv}.b{bins}"]
            piece = T * max(1, (1 << 16) // T)
            sym = rans(sec[f"rans.{kv}"], sec[f"pieces.{kv}"], [c for c in range(C) for _ in range(T)], piece,
                       model(counts))
            sym = np.array(sym, np.float32).reshape(C, T).T   # channel-major stream
            amax = sec[f"{kv}_amax"].astype(np.float32)
            out.append(((sym - np.float32(mx)) * (amax / np.float32(mx))[:, None]).astype(dt))
    else:
        raise AssertionError(h["codec"])
    return out[0], out[1]


def table_arrays(path: Path) -> dict[str, np.ndarray]:
    _v, h, payload = parse(path.read_bytes())
    return sections(h, payload)


def digest(key: np.ndarray, value: np.ndarray) -> str:
    return hashlib.sha256(key.astype("<f2").tobytes() + value.astype("<f2").tobytes()).hexdigest()


ENTRIES = [e for e in json.loads((VECTORS / "vectors.json").read_text())["objects"]
           if e.get("codec") in ("lossless", "uniform", "cachegen") and "delta" not in e["name"]]


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["name"] for e in ENTRIES])
def test_decoder_from_the_page(entry: dict) -> None:
    data = (VECTORS / entry["path"]).read_bytes()
    tables = table_arrays(VECTORS / entry["tables"]) if entry["tables"] else None
    key, value = decode(data, tables)
    assert digest(key, value) == entry["decoded"]["sha256_key_value"]


def test_every_header_encoding_is_covered() -> None:
    flags = {(VECTORS / e["path"]).read_bytes()[7] for e in ENTRIES}
    versions = {e["version"] for e in ENTRIES}
    assert flags == {0, 1, 2} and {1, 4, 5} <= versions


class Chunks:
    """Section 4.8's chunk table over section `p`."""

    def __init__(self, p: np.ndarray) -> None:
        b = p.tobytes()
        n = struct.unpack_from("<I", b)[0]
        self.lens = struct.unpack_from(f"<{n}I", b, 4)
        self.b, self.i, self.at = b, 0, 4 + 4 * n
        assert self.at + sum(self.lens) == len(b)

    def next(self, dtype: str = "|u1") -> np.ndarray:
        raw = self.b[self.at:self.at + self.lens[self.i]]
        self.at += self.lens[self.i]
        self.i += 1
        return np.frombuffer(raw, np.dtype(dtype))


def hist_model(t: np.ndarray):
    return model((np.exp2(t.astype(np.float64) / 8.0) - 1.0) * 16.0)


def flagged_stream(rd: Chunks, mdl, band_lens: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """(flags, per band its symbols; an unflagged band: None)."""
    nb = band_lens.size
    flags = np.unpackbits(rd.next(), count=nb)            # MSB-first
    coded = [b for b in range(nb) if flags[b] and band_lens[b] > 0]
    ctx = [b for b in coded for _ in range(int(band_lens[b]))]
    words, counts = rd.next("<u2"), rd.next("<u4")
    sym = np.array(rans(words, counts, ctx, 1 << 16, mdl), np.int64)
    out, at = [None] * nb, 0
    for b in coded:
        out[b] = sym[at:at + band_lens[b]]
        at += int(band_lens[b])
    return flags, out


def progressive(data: bytes, tables: dict[str, np.ndarray] | None, rungs: int) -> tuple[np.ndarray, np.ndarray]:
    ends, at = [], 0
    while at < len(data):
        _m, _v, _k, _f, hl, pl = struct.unpack_from("<4sHBBIQ", data, at)
        ends.append((at, at + 24 + hl + pl))
        at += 24 + hl + pl
    version, h, payload = parse(data[:ends[0][1]])
    T, H, D = h["shape"]
    C, layer = H * D, h["layer"]
    n = h["prog"]["k"]["grid"]
    band = (np.add.outer(np.arange(n), np.arange(n)).reshape(-1) if n else np.zeros(T, np.int64))
    perm = np.argsort(band, kind="stable")                  # rows sorted by band
    nb = int(band.max()) + 1
    sizes = np.bincount(band, minlength=nb) * C              # coefficients per band
    starts = np.concatenate([[0], np.cumsum(sizes)])
    big = T * C >= 16384 * nb                                # grouped coding (quads, grouped refinements)
    mag, neg, mean, scale = {}, {}, {}, {}
    rd = Chunks(sections(h, payload)["p"])
    for i, kv in enumerate(("k", "v")):
        e = h["prog"][kv]
        m0 = e["m0"]
        mean[kv] = rd.next(e["mean"]) if tables is None else tables[f"L{layer}.{kv}.mean"]
        scale[kv] = np.exp2((rd.next().astype(np.float64) - 128.0) / 16.0) if e["scaled"] else None
        names = [("e0q", 82), ("e0", 2 * m0 + 1)] if big else [("e0", 2 * m0 + 1)]
        hists = [rd.next().reshape(nb, a) if h["own"][i] or tables is None else tables[f"L{layer}.{kv}.{nm}"]
                 for nm, a in names]
        q = np.zeros(T * C, np.int64)
        if big:   # quads of four ternary values (81: escape), then the escaped quads' values
            _flags, quads = flagged_stream(rd, hist_model(hists[0]), -(-sizes // 4))
            nesc = np.array([0 if qb is None else int((qb == 81).sum()) for qb in quads])
            ctx = [b for b in range(nb) for _ in range(4 * int(nesc[b]))]
            esc = np.array(rans(rd.next("<u2"), rd.next("<u4"), ctx, 1 << 16, hist_model(hists[1])), np.int64)
            at = 0
            for b in range(nb):
                if quads[b] is None:
                    continue
                vals = []
                for sq in quads[b]:
                    if sq == 81:
                        vals += list(esc[at:at + 4] - m0)
                        at += 4
                    else:
                        vals += [(int(sq) // 3 ** k) % 3 - 1 for k in range(4)]
                q[starts[b]:starts[b + 1]] = vals[:starts[b + 1] - starts[b]]
        else:
            _flags, per_band = flagged_stream(rd, hist_model(hists[0]), sizes)
            for b in range(nb):
                if per_band[b] is not None:
                    q[starts[b]:starts[b + 1]] = per_band[b] - m0
        mag[kv], neg[kv] = np.abs(q), q < 0
    for l in range(1, rungs):
        _v, hr, pay = parse(data[ends[l][0]:ends[l][1]])
        assert hr["level"] == l and hr["parent_crc"] == zlib.crc32(data[ends[l - 1][0]:ends[l - 1][1]])
        rd, j = Chunks(sections(hr, pay)["p"]), 0
        for kv in ("k", "v"):
            planes = h["prog"][kv]["planes"]
            m = planes[l] - planes[l - 1]
            if m == 0:
                continue
            insig = mag[kv] == 0
            lens = np.array([insig[starts[b]:starts[b + 1]].sum() for b in range(nb)])
            g = max(1, 4 // m) if big and m <= 4 else 1          # values per symbol
            hist = (rd.next().reshape(nb, 1 << (m * g)) if hr["own"][j] or tables is None
                    else tables[f"L{layer}.{kv}.e{l}"])
            j += 1
            _flags, per_band = flagged_stream(rd, hist_model(hist), -(-lens // g))
            low, signs = rd.next(), rd.next()
            new = np.zeros(int(insig.sum()), np.int64)
            at = 0
            for b in range(nb):
                if per_band[b] is not None:
                    fields = (per_band[b][:, None] >> (m * np.arange(g))[None, :]) & ((1 << m) - 1)
                    new[at:at + lens[b]] = fields.reshape(-1)[:lens[b]]
                at += int(lens[b])
            sig = ~insig
            nsig = int(sig.sum())
            lowbits = np.unpackbits(low, bitorder="little")[:nsig * m].reshape(nsig, m).astype(np.int64)
            mg = mag[kv].copy()
            mg[sig] = (mg[sig] << m) | (lowbits << np.arange(m)).sum(axis=1)
            mg[insig] = new
            became = np.flatnonzero(insig)[new > 0]
            nv = neg[kv].copy()
            nv[became] = np.unpackbits(signs)[:became.size].astype(bool)   # MSB-first
            mag[kv], neg[kv] = mg, nv
    out = []
    for kv in ("k", "v"):
        e = h["prog"][kv]
        level = rungs - 1
        step = e["step"] * 2.0 ** -e["planes"][level]
        off = e["off"][level] if version == 5 else 0.5
        c = np.where(mag[kv] > 0, (mag[kv] + off) * step, 0.0) * np.where(neg[kv], -1.0, 1.0)
        coef = np.empty((T, C))
        coef[perm] = c.reshape(T, C)
        if n:
            k, i_ = np.arange(n)[:, None], np.arange(n)[None, :]
            dm = np.cos(np.pi * (2 * i_ + 1) * k / (2 * n)) * np.sqrt(2.0 / n)
            dm[0] /= np.sqrt(2.0)
            coef = np.einsum("ai,abc,bj->ijc", dm, coef.reshape(n, n, C), dm).reshape(T, C)
        if scale[kv] is not None:
            coef = coef / scale[kv][:, None]
        out.append((coef + mean[kv].astype(np.float64)).astype(np.float16))
    return out[0], out[1]


PROG = [e for e in json.loads((VECTORS / "vectors.json").read_text())["objects"] if e.get("codec") == "progressive"]


@pytest.mark.parametrize("entry", PROG, ids=[e["name"] for e in PROG])
def test_progressive_from_the_page(entry: dict) -> None:
    from sakura.codec import CodecTables, ShardId, decode_any   # the reference values only

    data = (VECTORS / entry["path"]).read_bytes()
    tables = table_arrays(VECTORS / entry["tables"]) if entry["tables"] else None
    ident = ShardId(entry["identity"]["model"], entry["identity"]["template"], entry["identity"]["shard"])
    ctab = None if tables is None else CodecTables.from_bytes((VECTORS / entry["tables"]).read_bytes(),
                                                              ShardId(ident.model, ident.template, -1))
    cuts = [entry["prefix_bytes"]] if entry.get("prefix_bytes") else [r["prefix_bytes"] for r in entry["rungs"]]
    for rung, end in enumerate(cuts):
        ref = decode_any(data[:end], ident, ctab)
        key, value = progressive(data[:end], tables, rung + 1 if entry.get("prefix_bytes") is None else
                                 int(entry["name"].rsplit("#", 1)[1]) + 1)
        for got, want in ((key, ref.key.numpy().reshape(key.shape)), (value, ref.value.numpy().reshape(value.shape))):
            # one fp16 ulp, and at least 2^-20 near zero: there fp16's subnormal steps (2^-24) are
            # finer than a float32 inverse DCT's rounding of values of magnitude ~1 (wire-format 4.8)
            ulp = np.maximum(np.spacing(np.abs(want).astype(np.float16)).astype(np.float32), 2.0 ** -20)
            assert (np.abs(got.astype(np.float32) - want.astype(np.float32)) <= ulp).all(), (entry["name"], rung)
