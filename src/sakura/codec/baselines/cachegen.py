"""`cachegen`: CacheGen's KV codec (Liu et al., SIGCOMM'24, as implemented in LMCache), adapted to DiT KV.

Faithful parts: per-token absmax scale over all channels of a layer (K and V separately);
symmetric rounding to `bins` levels, where bins depend on the layer group (keys: first / middle /
last third of the layers, values: first ~1/16 of the layers / rest, LMCache's 10/20/32 and 2/32
split scaled to the model's depth); one symbol histogram per (layer, channel) for K and for V;
arithmetic (here ANS, same rate) coding; quality levels 3..1 (3 = LMCache's default bins).
Adaptation: histograms are fitted once per template and shared by its shards (as `sakura`'s are)
instead of being sent with every chunk, so both codecs pay table bytes once; CacheGen's
token-delta encoding is omitted, as in LMCache's released encoder. All tokens are kept.

Per value: MAX = bins // 2 - 1,  sym = round(x / amax_t * MAX) + MAX  in [0, 2 MAX],
x^ = (sym - MAX) * amax_t / MAX, so |x - x^| <= amax_t / (2 MAX).

`delta=true`: the paper's token-delta variant (CacheGen section 5.1, which LMCache's encoder
leaves out): tokens are split into groups of `group` consecutive tokens (raster order: template
tokens are image patches, so a group is a run of horizontal neighbours); the first token of each
group is an anchor, quantised with 8-bit precision (MAX 127, per-token absmax, one pooled
histogram per (layer, K/V)); every other token is coded as its delta to the *decoded* anchor, with
the layer group's bins as above (per-token absmax of the delta, per-(layer, channel) histograms).
Same bound on deltas: |x - x^| <= amax(delta_t) / (2 MAX).
"""

from __future__ import annotations

from concurrent.futures import Executor
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .. import bitstream as bs
from .. import native as NV
from .. import entropy as E
from .. import kernels as K
from .. import quant as Q
from .. import rans as R
from ..base import (Codec, CodecTables, LayerKV, ShardKV, ShardId, as_f32_2d, check_params, from_f32_2d,
                   register)

# quality level -> (key bins for the three layer groups, value bins for the two groups)
LEVELS: dict[int, tuple[tuple[int, int, int], tuple[int, int]]] = {
    3: ((32, 16, 16), (32, 16)),
    2: ((16, 12, 12), (16, 12)),
    1: ((12, 8, 8), (12, 8)),
}


def layer_bins(level: int, layer: int, num_layers: int) -> tuple[int, int]:
    """(key bins, value bins) for `layer` of `num_layers` at quality `level`."""
    kb, vb = LEVELS[level]
    k1, k2 = round(num_layers * 10 / 32), round(num_layers * 20 / 32)
    v1 = max(1, round(num_layers * 2 / 32))
    key = kb[0] if layer < k1 else kb[1] if layer < k2 else kb[2]
    value = vb[0] if layer < v1 else vb[1]
    return key, value


def _quantise(x: np.ndarray, bins: int, sdt: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """x (T, C) -> (symbols (T, C) int32 in [0, bins-2], amax (T,) in sdt)."""
    mx = bins // 2 - 1
    amax = Q.round_up(np.abs(x).max(axis=1).astype(np.float64), sdt)  # (T,)
    a = amax.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.rint(x / a * mx)
    s[~np.isfinite(s)] = 0.0
    return (np.clip(s, -mx, mx) + mx).astype(np.int32), amax


ANCHOR_BINS = 256  # anchors: 8-bit symmetric (MAX 127), per-token absmax
FORMAT_VERSION = 5  # 1: constriction ANS (no longer read); 4: interleaved rANS (`rans`), channel-group pieces;
                    # 5: 4 with the header dictionary (`bitstream.FLAG_HEADER_DICT`), same payload
READ_VERSIONS = (4, 5)


def _piece(rows: int) -> int:
    """Symbols per rANS piece: whole channels (rows symbols each), ~R.PIECE per piece, so that a
    piece is a group of (layer, channel) streams (as CacheGen's GPU decoder's per-thread streams)."""
    return max(1, rows) * max(1, R.PIECE // max(1, rows))


def _segments(rows: int, C: int, pooled: bool) -> tuple[np.ndarray, np.ndarray]:
    """Channel-major order: channel c's `rows` symbols with context c (pooled: one context)."""
    if pooled:
        return R.segments_of(np.array([rows * C], np.int64))
    return R.segments_of(np.full(C, rows, np.int64))


def _rans_encode(sym: np.ndarray, model: R.Model, pooled: bool) -> tuple[np.ndarray, np.ndarray]:
    """(rows, C) symbols -> (words, piece counts), channel by channel."""
    rows, C = sym.shape
    sc, sl = _segments(rows, C, pooled)
    return R.encode(np.ascontiguousarray(sym.T).reshape(-1), sc, sl, model, _piece(rows))


def _rans_decode(words: np.ndarray, counts: np.ndarray, model: R.Model, rows: int, C: int, pooled: bool,
                 engine: str, pool: Executor | None = None) -> np.ndarray:
    """Inverse of `_rans_encode` -> (C, rows) int32 symbols (channel-major, as coded)."""
    sc, sl = _segments(rows, C, pooled)
    if not pooled and model.rows != C:
        raise bs.CorruptError(f"cachegen: table has {model.rows} channels, data has {C}")
    if engine == "reference":
        return R.decode_reference(words, counts, sc, sl, model, _piece(rows)).reshape(C, rows)
    return R.decode(words, counts, sc, sl, model, _piece(rows), pool=pool).reshape(C, rows)


def _dequantise_cm(sym_cm: np.ndarray, amax: np.ndarray, bins: int, engine: str,
                   pool: Executor | None = None) -> np.ndarray:
    """(C, rows) channel-major symbols -> (rows, C) float32 values (`pool`: channels split over threads)."""
    if engine == "reference":
        return _dequantise(sym_cm.T, amax, bins)
    out = np.empty(sym_cm.shape, np.float32)
    am = np.ascontiguousarray(amax, np.float32)
    R.run_split(pool, lambda a, b: K.cachegen_dequant(sym_cm[a:b], am, bins // 2 - 1, out[a:b]), sym_cm.shape[0])
    return torch.from_numpy(out).t().contiguous().numpy()   # torch's blocked transpose releases the GIL


def _fp16_cm(sym_cm: np.ndarray, amax: np.ndarray, bins: int, pool: Executor | None = None) -> torch.Tensor:
    """Native, fp16 output: (C, rows) channel-major symbols -> (rows, C) fp16, dequantised,
    transposed and rounded in one pass (`kernels.cachegen_fp16`); equal to `_dequantise_cm` then
    torch's fp16 conversion bit for bit."""
    C, rows = sym_cm.shape
    out = np.empty((rows, C), np.uint16)
    am = np.ascontiguousarray(amax, np.float32)
    R.run_split(pool, lambda a, b: K.cachegen_fp16(sym_cm, am, bins // 2 - 1, a, b, out), C)
    return torch.from_numpy(out.view(np.float16))


def _anchor_rows(T: int, group: int) -> np.ndarray:
    return np.arange(0, T, group)


def _anchor_of(T: int, group: int) -> np.ndarray:
    """(T,) index into the anchor list of each token's group anchor."""
    return np.arange(T) // group


def _dequantise(sym: np.ndarray, amax: np.ndarray, bins: int) -> np.ndarray:
    mx = bins // 2 - 1
    x = (sym - mx).astype(np.float32)
    x *= (amax.astype(np.float32) / np.float32(mx))[:, None]
    return x


def _encoder_model(w: bs.Writer, tables: CodecTables | None, name: str, section: str,
                   count: Callable[[], np.ndarray]) -> tuple[np.ndarray, R.Model]:
    """(counts, rANS model) of one stream: the template's table `name`, or without tables the
    shard's own counts, which the object then carries as `section`."""
    if tables is not None:
        table = tables.get(name)
        return table, tables.cached(f"rans:{name}", lambda: R.Model.from_counts(table))
    table = count()
    w.add(section, table, zstd_level=3)
    return table, R.Model.from_counts(table)


def _decoder_model(obj: bs.Object, tables: CodecTables | None, name: str, section: str
                   ) -> tuple[np.ndarray, R.Model | None]:
    """The decoder's side of `_encoder_model` (None for a malformed carried histogram; the caller
    checks the shape)."""
    if tables is not None:
        table = tables.get(name)
        return table, tables.cached(f"rans:{name}", lambda: R.Model.from_counts(table))
    table = obj.section(section)
    return table, R.Model.from_counts(table) if table.ndim == 2 and table.shape[1] >= 2 else None


@register
class CacheGenCodec(Codec):
    name = "cachegen"
    uses_tables = True

    def __init__(self, **params: Any) -> None:
        p = check_params(params, {"level": 3, "delta": False, "group": 10}, self.name)
        if p["level"] not in LEVELS:
            raise ValueError(f"cachegen: level must be one of {sorted(LEVELS)}, got {p['level']!r}")
        if not isinstance(p["delta"], bool):
            raise ValueError(f"cachegen: delta must be true or false, got {p['delta']!r}")
        if not isinstance(p["group"], int) or isinstance(p["group"], bool) or not 2 <= p["group"] <= 1024:
            raise ValueError(f"cachegen: group must be an int in [2, 1024], got {p['group']!r}")
        if not p["delta"]:  # objects and specs of the plain codec stay as they were
            p = {"level": p["level"]}
        super().__init__(**p)

    def _symbols(self, shard: ShardKV):
        """Per K/V: (symbols (T, C), amax (T,), bins, anchor symbols or None). With delta, rows of
        anchor tokens in `symbols` are unused (zeros) and `anchor` holds their 8-bit symbols."""
        shard.validate()
        kb, vb = layer_bins(self.params["level"], shard.layer, shard.num_layers)
        x = {"k": as_f32_2d(shard.key), "v": as_f32_2d(shard.value)}
        sdt = Q.scale_dtype(np.array([np.abs(x["k"]).max(), np.abs(x["v"]).max()]))
        out = {}
        for kv, bins in (("k", kb), ("v", vb)):
            if not self.params.get("delta"):
                out[kv] = (*_quantise(x[kv], bins, sdt), bins, None)
                continue
            anchors = _anchor_rows(x[kv].shape[0], int(self.params["group"]))
            a_sym, a_amax = _quantise(x[kv][anchors], ANCHOR_BINS, sdt)
            a_hat = _dequantise(a_sym, a_amax, ANCHOR_BINS)
            ref = a_hat[_anchor_of(x[kv].shape[0], int(self.params["group"]))]  # (T, C) decoded anchor per token
            sym, amax = _quantise(x[kv] - ref, bins, sdt)
            sym[anchors] = bins // 2 - 1  # the zero symbol: anchors carry no delta
            amax[anchors] = 0
            out[kv] = (sym, np.concatenate([amax, a_amax]), bins, a_sym)
        return out, sdt

    def fit_tables(self, shards: Sequence[ShardKV]) -> CodecTables:
        """Symbol counts per (layer, channel) for K and V over all of a template's shards."""
        arrays: dict[str, np.ndarray] = {}
        for shard in shards:
            syms, _ = self._symbols(shard)
            for kv, (sym, _amax, bins, a_sym) in syms.items():
                rows = self._delta_rows(sym.shape[0])
                name = f"L{shard.layer}.{kv}.b{bins}"
                cnt = E.counts(sym[rows], bins - 1, per_channel=True)
                arrays[name] = arrays[name] + cnt if name in arrays else cnt
                if a_sym is not None:
                    name = f"L{shard.layer}.{kv}.anchor"
                    cnt = E.counts(a_sym, ANCHOR_BINS - 1, per_channel=False)
                    arrays[name] = arrays[name] + cnt if name in arrays else cnt
        return CodecTables(codec=self.name, arrays=arrays, meta={"params": self.params})

    def _delta_rows(self, T: int) -> np.ndarray:
        """Rows coded with the layer-group bins: all tokens, or (delta) all but the anchors."""
        if not self.params.get("delta"):
            return np.arange(T)
        return np.setdiff1d(np.arange(T), _anchor_rows(T, int(self.params["group"])))

    def encode(self, shard: ShardKV, ident: ShardId, tables: CodecTables | None = None) -> bytes:
        syms, sdt = self._symbols(shard)
        w = bs.Writer()
        for kv, (sym, amax, bins, a_sym) in syms.items():
            rows = self._delta_rows(sym.shape[0])
            sym = sym[rows]
            w.add(f"{kv}_amax", amax[:shard.shape[0]][rows] if a_sym is not None else amax)
            if a_sym is not None:
                w.add(f"{kv}_anchor_amax", amax[shard.shape[0]:])
                _at, amodel = _encoder_model(w, tables, f"L{shard.layer}.{kv}.anchor", f"ahist.{kv}",
                                             lambda: E.counts(a_sym, ANCHOR_BINS - 1, per_channel=False))
                aw, ac = _rans_encode(a_sym, amodel, pooled=True)
                w.add(f"arans.{kv}", aw)
                w.add(f"apieces.{kv}", ac)
            tname = f"L{shard.layer}.{kv}.b{bins}"
            table, model = _encoder_model(w, tables, tname, f"hist.{kv}",
                                          lambda: E.counts(sym, bins - 1, per_channel=True))
            if model.rows != sym.shape[1] or model.alphabet != bins - 1:
                raise bs.IdentityError(f"codec table {tname} has shape {table.shape}, shard needs "
                                       f"({sym.shape[1]}, {bins - 1})")
            words, counts = _rans_encode(sym, model, pooled=False)
            w.add(f"rans.{kv}", words)
            w.add(f"pieces.{kv}", counts)
        kb, vb = syms["k"][2], syms["v"][2]
        h = self._header(shard, ident, tables, key_bins=kb, value_bins=vb, scale_dtype=sdt.str)
        h["id"] = ident.to_compact_json()   # version 5
        return w.to_bytes(bs.KIND_SHARD, h, FORMAT_VERSION, header_dict=True)

    def decode(self, data: bytes, ident: ShardId, tables: CodecTables | None = None,
               pool: Executor | None = None, parsed: bs.Object | None = None) -> LayerKV:
        return self.decode_with(data, ident, tables, "native", pool, parsed)

    def decode_with(self, data: bytes, ident: ShardId, tables: CodecTables | None = None,
                    engine: str = "native", pool: Executor | None = None, parsed: bs.Object | None = None) -> LayerKV:
        """`engine`: "native" (libsakura_decode, `native`, where it covers the object, else numba), "numba"
        (the numba kernels, releasing the GIL) or "reference" (plain Python rANS + numpy,
        what the native decoder is tested against bit for bit). `pool` (native only): threads that
        share this one shard's rANS pieces (whole channels each); bit-equal to the serial decode.
        `parsed`: the object's header as the caller parsed it (`decode_any`), not parsed again."""
        if engine not in ("native", "numba", "reference"):
            raise ValueError(f"cachegen: unknown engine {engine!r}")
        use_native = engine == "native" and NV.available()
        engine = "native" if engine == "numba" else engine   # below, "native" is the numba kernels
        obj, dtype, shape = self._open(data, ident, tables, parsed=parsed)
        bs.require_version(obj, READ_VERSIONS, self.name)
        h = obj.header
        T, H, D = shape
        C = H * D
        layer = int(h.get("layer", 0)) if isinstance(h.get("layer", 0), int) else -1
        out = []
        params = h.get("params", {})
        if not isinstance(params, dict):
            raise bs.CorruptError("cachegen: malformed parameters")
        delta = params.get("delta") is True
        group = params.get("group") if delta else None
        if delta and (not isinstance(group, int) or isinstance(group, bool) or not 2 <= group <= 1024):
            raise bs.CorruptError(f"cachegen: bad group {group!r}")
        rows = np.setdiff1d(np.arange(T), _anchor_rows(T, group)) if delta else np.arange(T)
        lim = float(torch.finfo(dtype).max) / (2.0 if delta else 1.0)   # |x| <= amax (+ the anchor's)
        for kv, bins in (("k", h.get("key_bins")), ("v", h.get("value_bins"))):
            if not isinstance(bins, int) or isinstance(bins, bool) or not 4 <= bins <= 256:
                raise bs.CorruptError(f"cachegen: bad bins {bins!r}")
            amax = obj.section(f"{kv}_amax")
            if amax.shape != (rows.size,) or amax.dtype.kind != "f" or not np.isfinite(amax).all() or \
                    float(np.abs(amax).max(initial=0.0)) > lim:
                raise bs.CorruptError(f"cachegen: {kv}_amax has shape {amax.shape}, expected ({rows.size},), "
                                      "or is not finite")
            ref = None
            if delta:
                anchors = _anchor_rows(T, group)
                a_amax = obj.section(f"{kv}_anchor_amax")
                if a_amax.shape != (anchors.size,) or a_amax.dtype.kind != "f" or not np.isfinite(a_amax).all() or \
                        float(np.abs(a_amax).max(initial=0.0)) > lim:
                    raise bs.CorruptError(f"cachegen: {kv}_anchor_amax has shape {a_amax.shape} or is not finite")
                at, amodel = _decoder_model(obj, tables, f"L{layer}.{kv}.anchor", f"ahist.{kv}")
                if at.shape != (1, ANCHOR_BINS - 1):
                    raise bs.CorruptError(f"cachegen: anchor histogram {kv} has shape {at.shape}")
                a_sym = _rans_decode(obj.section(f"arans.{kv}"), obj.section(f"apieces.{kv}"), amodel,
                                     anchors.size, C, True, engine, pool)
                a_hat = _dequantise_cm(a_sym, a_amax, ANCHOR_BINS, engine, pool)
                ref = a_hat[_anchor_of(T, group)]  # (T, C)
            table, model = _decoder_model(obj, tables, f"L{layer}.{kv}.b{bins}", f"hist.{kv}")
            if table.shape != (C, bins - 1):
                raise bs.CorruptError(f"cachegen: histogram {kv} has shape {table.shape}, expected {(C, bins - 1)}")
            words, counts = obj.section(f"rans.{kv}"), obj.section(f"pieces.{kv}")
            if not delta and use_native and dtype == torch.float16:
                out.append(NV.cachegen_f16(T, C, bins, amax, table, words, counts).reshape(shape))
                continue
            if not delta and engine == "native" and dtype == torch.float16:
                out.append(_fp16_cm(_rans_decode(words, counts, model, T, C, False, engine, pool), amax, bins,
                                    pool).reshape(shape))
                continue
            if not delta:
                x = _dequantise_cm(_rans_decode(words, counts, model, T, C, False, engine, pool), amax, bins,
                                   engine, pool)
            else:
                x = ref.copy()
                if rows.size:
                    sym = _rans_decode(words, counts, model, rows.size, C, False, engine, pool)
                    x[rows] += _dequantise_cm(sym, amax, bins, engine, pool)
            out.append(from_f32_2d(x, shape, dtype))
        return LayerKV(out[0], out[1], torch.ones(T, dtype=torch.bool))
