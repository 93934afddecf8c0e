"""The nested quantiser ladder (`sakura`/`layered` with quantiser="nested"): token-importance-aware
embedded quantisation with ANS entropy coding.

Bit allocation (`allocation.plan_bits`): each template token t gets a width b_t in {0, 2..8}
(0 = dropped and masked out of attention), minimising sum_t w_t e(b_t) at mean b_t <= budget.

Quantisation is the nested quantiser of `quant` with one range per token over all channels for
keys and values (`key_scale="channel"` gives KIVI-style per-channel key ranges instead), keys
`key_offset` bits coarser than values, and per-template centroid reconstruction for widths <= 4. A
ladder of budgets b^0 < b^1 < ... is coded as a base layer plus refinement layers that each add
(b^l_t - b^(l-1)_t) low-order bits per token (or bring a dropped token in): stored once, at the size
of its top rung; a phone that holds rung l upgrades by fetching only layer l+1.

Entropy coding: indices of tokens coded from scratch are grouped by bit width and ANS-coded with
one symbol histogram per (layer, K/V, width) - per channel for alphabets <= 32, pooled above -
fitted once per template (`fit_tables`); without tables an object carries its own histograms.
Refinement bits are near-uniform, so they are stored bit-packed.

Calibrated allocation: with `ShardKV.sensitivity`, `fit_tables` picks per (layer, K/V) width offsets
(`allocation.allocate_offsets`; stored as `alloc` in the tables, `offsets` in the object header,
format version 2).

Wire form of a ladder: the base object (kind shard) followed by one object (kind layer) per
refinement level; every object names its level and the crc32 of its parent, so prefixes decode
to rungs and a mismatched upgrade raises.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from .. import bitstream as bs
from .. import ecsq as EQ
from .. import entropy as E
from .. import quant as Q
from ..allocation import allocate_offsets, plan_bits
from ..base import finite, CodecTables, LadderState, LayerKV, ShardKV, ShardId, as_f32_2d, from_f32_2d

CENTROID_MAX_BITS = 4  # wider bins are small enough that their midpoints are (nearly) unbiased
CENTROID_LEVELS = 16   # a bin's reconstruction point is stored to 1/16 of the bin (error <= 1/32 bin)
PER_CHANNEL_MAX_BITS = 5


def widths(bits: np.ndarray, offset: int, low: int = 2) -> np.ndarray:
    """Per-token widths shifted by `offset` bits, never below `low` (2 for `key_offset`, 1 for
    calibrated per-layer offsets) or above 8; dropped tokens stay dropped. Monotone in `bits`, so
    ladders stay nested."""
    if offset == 0:
        return bits
    return np.where(bits > 0, np.clip(bits + offset, low, 8), 0).astype(np.int32)


@dataclass
class NestedAnalysis:
    u: dict[str, np.ndarray]          # "k"/"v": (T, C) unit coordinates
    scales: dict[str, np.ndarray]     # "k_lo", "k_r", "v_lo", "v_r"
    bits: list[np.ndarray]            # per level (T,) int32, monotone
    sdt: np.dtype
    u_r: dict[str, np.ndarray]        # "k"/"v": (T, C) ranges the unit coordinates are relative to


def _groups(u: np.ndarray, prev: np.ndarray, cur: np.ndarray):
    """Yield (group name, token indices, symbols (n, C), alphabet) for one level."""
    m_all = cur - prev
    for fresh in (True, False):
        for m in range(1, 9):
            sel = np.nonzero((m_all == m) & ((prev == 0) == fresh))[0]
            if sel.size == 0:
                continue
            idx = Q.indices(u[sel], cur[sel])  # (n, C)
            sym = idx & ((1 << m) - 1)  # nested: the low m bits are the refinement
            yield f"{'f' if fresh else 'r'}{m}", sel, sym, 1 << m


def _group_names(prev: np.ndarray, cur: np.ndarray) -> list[tuple[str, np.ndarray, int, bool, int]]:
    out = []
    m_all = cur - prev
    for fresh in (True, False):
        for m in range(1, 9):
            sel = np.nonzero((m_all == m) & ((prev == 0) == fresh))[0]
            if sel.size:
                out.append((f"{'f' if fresh else 'r'}{m}", sel, m, fresh, 1 << m))
    return out


def _rd_points(x: np.ndarray, u: np.ndarray, r: np.ndarray, nominal: int) -> list[tuple[int, float, float]]:
    """(offset, relative MSE, entropy-coded bits) of quantising all tokens at each width 2..8.

    x (T, C) values, u (T, C) unit coordinates, r (T, 1) per-token ranges. Widths <= 4 use per-channel
    bin means (what centroid reconstruction approximates); rates are per-channel (<= 5 bits) or pooled
    empirical entropies, i.e. what the per-template ANS tables achieve, without table bytes."""
    T, C = u.shape
    energy = float((x.astype(np.float64) ** 2).sum()) + 1e-30
    out = []
    for w in range(1, 9):
        pos = u * np.float32(1 << w)
        idx = np.minimum(np.floor(pos), (1 << w) - 1).astype(np.int64)
        frac = pos - idx
        flat = (idx + (np.arange(C) * (1 << w))[None, :]).reshape(-1)
        cnt = np.bincount(flat, minlength=C << w).reshape(C, 1 << w).astype(np.float64)
        if w <= CENTROID_MAX_BITS:
            ssum = np.bincount(flat, weights=frac.reshape(-1).astype(np.float64), minlength=C << w).reshape(C, 1 << w)
            cen = np.where(cnt > 0, ssum / np.maximum(cnt, 1), 0.5)
            d = frac - cen.reshape(-1)[flat].reshape(T, C)
        else:
            d = frac - 0.5
        err = float(((d * (r / np.float32(1 << w))) ** 2).sum(dtype=np.float64))
        tab = cnt if w <= PER_CHANNEL_MAX_BITS else cnt.sum(0, keepdims=True)
        p = tab / np.maximum(tab.sum(1, keepdims=True), 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            bits = float(-(tab * np.where(p > 0, np.log2(p), 0.0)).sum())
        out.append((w - nominal, err / energy, bits))
    return out


def vgroup(params: dict[str, Any], D: int) -> int:
    return D if params["value_group"] == "head" else int(params["value_group"])


def analyse(codec, shard: ShardKV) -> NestedAnalysis:
    shard.validate()
    T, H, D = shard.shape
    C = H * D
    p = codec.params
    imp = None
    if shard.importance is not None and p["use_importance"]:
        imp = shard.importance.detach().double().numpy()
        imp = imp.sum(axis=0) if imp.ndim == 2 else imp
    bits, prev = [], None
    # early layers' errors propagate through every later layer (CacheGen gives them more bins)
    bonus = float(p["early_bonus"]) if shard.layer < round(shard.num_layers / 3) else 0.0
    # ecsq: `budget` is entropy-coded bits per value (set by the steps); importance only sets
    # relative per-token steps, planned around a reference width
    for b in (codec._budgets(p) if p["quantiser"] != "ecsq" else [EQ.REF_BITS]):
        cur = plan_bits(imp, T, min(b + bonus, 8.0), prev=prev, alpha=p["alpha"], drop_cost=p["drop_cost"],
                        allow_drop=p["allow_drop"])
        if not (cur > 0).any():  # keep at least the most important token
            cur = cur.copy()
            cur[int(np.argmax(imp)) if imp is not None else 0] = 2
        bits.append(cur)
        prev = cur
    x = {"k": as_f32_2d(shard.key), "v": as_f32_2d(shard.value)}
    sdt = Q.scale_dtype(np.array([np.abs(x["k"]).max(), np.abs(x["v"]).max()]))
    u, scales, u_r = {}, {}, {}
    kmode = "key" if p["key_scale"] == "channel" else "value"  # "token": one range per token
    for kv, mode, g in (("k", kmode, p["key_group"]), ("v", "value", vgroup(p, D))):
        lo, r = Q.fit_scales(x[kv], mode, g, sdt)
        scales[f"{kv}_lo"], scales[f"{kv}_r"] = lo, r
        u_r[kv] = Q.expand(r, mode, g, T, C)
        u[kv] = Q.unit(x[kv], Q.expand(lo, mode, g, T, C), u_r[kv])
    return NestedAnalysis(u=u, scales=scales, bits=bits, sdt=sdt, u_r=u_r)


def fit_tables(codec, shards: Sequence[ShardKV]) -> CodecTables:
    """Symbol histograms per (layer, K/V, level group) over all of a template's shards; with
    calibrated shard sensitivities (and allocate="sensitivity") also per-layer K/V width offsets."""
    arrays: dict[str, np.ndarray] = {}
    analyses = [analyse(codec, shard) for shard in shards]
    ko = int(codec.params["key_offset"])
    offs: dict[int, tuple[int, int]] = {}
    if (codec.params["allocate"] == "sensitivity" and shards
            and all(s.sensitivity is not None for s in shards)
            and len({s.layer for s in shards}) == len(shards)):
        points, sens, base = {}, {}, {}
        for shard, an in zip(shards, analyses):
            nz = an.bits[0][an.bits[0] > 0]
            nominal = int(np.median(nz)) if nz.size else 2
            T, H, D = shard.shape
            x = {"k": as_f32_2d(shard.key), "v": as_f32_2d(shard.value)}
            for j, kv in enumerate(("k", "v")):
                r = an.u_r[kv]
                points[(shard.layer, kv)] = _rd_points(x[kv], an.u[kv], r, nominal)
                sens[(shard.layer, kv)] = float(shard.sensitivity[j])
                base[(shard.layer, kv)] = int(np.clip(nominal + (ko if kv == "k" else 0), 2, 8)) - nominal
                points[(shard.layer, kv)] = [t for t in points[(shard.layer, kv)] if -6 <= t[0] <= 6]
        best = allocate_offsets(points, sens, base)
        L = max(s.layer for s in shards) + 1
        alloc = np.full((L, 2), 127, np.int8)  # 127: no offsets for this layer
        for (layer, kv), o in best.items():
            alloc[layer, 0 if kv == "k" else 1] = o
        arrays["alloc"] = alloc
        offs = {layer: (int(alloc[layer, 0]), int(alloc[layer, 1])) for layer in range(L) if alloc[layer, 0] != 127}
    for shard, an in zip(shards, analyses):
        prev = np.zeros(shard.shape[0], np.int32)
        off = dict(zip(("k", "v"), offs.get(shard.layer, (ko, 0))))
        low = 1 if shard.layer in offs else 2
        for cur in an.bits:
            for kv in ("k", "v"):
                for gname, sel, sym, A in _groups(an.u[kv], widths(prev, off[kv], low), widths(cur, off[kv], low)):
                    if gname.startswith("r"):
                        continue  # refinement bits are near-uniform: stored raw, no table
                    name = f"L{shard.layer}.{kv}.{gname}"
                    cnt = E.counts(sym, A, per_channel=A <= (1 << PER_CHANNEL_MAX_BITS))
                    if name in arrays and arrays[name].shape == cnt.shape:
                        arrays[name] = arrays[name] + cnt
                    else:
                        arrays[name] = cnt
            prev = cur
        # reconstruction points: where values actually sit inside each bin (per channel, or
        # pooled over channels: 1/C of the table bytes)
        for kv in ("k", "v") if codec.params["centroids"] != "none" else ():
            ws = set()
            for cur in an.bits:
                ws.update(int(b) for b in np.unique(widths(cur, off[kv], low)))
            for b in sorted(w for w in ws if 0 < w <= CENTROID_MAX_BITS):
                tok = np.zeros(0, np.int64)
                for cur in an.bits:
                    tok = np.union1d(tok, np.nonzero(widths(cur, off[kv], low) == b)[0])
                if tok.size == 0:
                    continue
                pos = an.u[kv][tok] * np.float32(1 << b)  # (n, C)
                idx = np.minimum(np.floor(pos), (1 << b) - 1).astype(np.int64)
                frac = (pos - idx).astype(np.float64)
                C = pos.shape[1]
                flat = (idx + (np.arange(C) * (1 << b))[None, :]).reshape(-1)
                for part, vals in (("csum", frac.reshape(-1)), ("ccnt", np.ones(flat.size))):
                    name = f"L{shard.layer}.{kv}.{part}{b}"
                    acc = np.bincount(flat, weights=vals, minlength=C << b).reshape(C, 1 << b)
                    arrays[name] = arrays[name] + acc if name in arrays else acc
    for name in [n for n in arrays if ".csum" in n]:
        cnt = arrays.pop(name.replace(".csum", ".ccnt"))
        ssum = arrays.pop(name)
        if codec.params["centroids"] == "pooled":
            cnt, ssum = cnt.sum(0, keepdims=True), ssum.sum(0, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            c = np.where(cnt > 0, ssum / np.maximum(cnt, 1), 0.5)
        q = np.clip(np.floor(c * CENTROID_LEVELS), 0, CENTROID_LEVELS - 1)  # 16 sub-bins, centre of each
        arrays[name.replace(".csum", ".cent")] = q.astype(np.uint8)
    return CodecTables(codec=codec.name, arrays=arrays, meta={"params": codec.params})


def encode_level(codec, an: NestedAnalysis, level: int, shard: ShardKV, ident: ShardId,
                  tables: CodecTables | None, parent_crc: int | None) -> bytes:
    T = shard.shape[0]
    prev = an.bits[level - 1] if level > 0 else np.zeros(T, np.int32)
    cur = an.bits[level]
    w = bs.Writer()
    w.add("bits", cur.astype(np.uint8), zstd_level=3)
    if level == 0:
        for name in ("k_lo", "k_r", "v_lo", "v_r"):
            w.add(name, an.scales[name])
    groups = []
    offsets = table_offsets(shard.layer, tables)
    off = dict(zip(("k", "v"), offsets or (int(codec.params["key_offset"]), 0)))
    low = 1 if offsets is not None else 2
    for kv in ("k", "v"):
        for gname, sel, sym, A in _groups(an.u[kv], widths(prev, off[kv], low), widths(cur, off[kv], low)):
            tname = f"L{shard.layer}.{kv}.{gname}"
            if gname.startswith("r"):  # low-order refinement bits: ANS gains ~0%, raw is 10x faster
                w.add(f"raw.{kv}.{gname}", Q.pack(sym, int(gname[1:])))
                groups.append(gname)
                continue
            if tables is not None:
                table = tables.get(tname)
                models = tables.cached(tname, lambda t=table: E.make_models(t))
            else:
                table = E.counts(sym, A, per_channel=A <= (1 << PER_CHANNEL_MAX_BITS))
                w.add(f"hist.{kv}.{gname}", table, zstd_level=3)
                models = E.make_models(table)
            if len(models) not in (1, sym.shape[1]):
                raise bs.IdentityError(f"codec table {tname} has {len(models)} channels, shard has {sym.shape[1]}")
            w.add(f"ans.{kv}.{gname}", E.encode(sym, models))
            groups.append(gname)
    extra: dict[str, Any] = {"level": level, "levels": len(an.bits), "scale_dtype": an.sdt.str}
    version = 1
    if offsets is not None:  # per-layer K/V widths from the tables' allocation: format version 2
        extra["offsets"] = list(offsets)
        version = 2
    if parent_crc is not None:
        extra["parent_crc"] = parent_crc
    if level == 0:
        return w.to_bytes(bs.KIND_SHARD, codec._header(shard, ident, tables, **extra), version)
    # refinements carry only what identifies them; parameters come from the base they refine
    h = codec._header(shard, ident, tables, **extra)
    for k in ("params", "layer", "num_layers", "levels", "scale_dtype", "offsets"):
        h.pop(k, None)
    return w.to_bytes(bs.KIND_LAYER, h, version)


def table_offsets(layer: int, tables: CodecTables | None) -> tuple[int, int] | None:
    """(key, value) width offsets the tables' allocation gives `layer`, or None."""
    if tables is None or "alloc" not in tables.arrays:
        return None
    a = tables.arrays["alloc"]
    if a.ndim != 2 or a.shape[1] != 2 or not 0 <= layer < a.shape[0] or int(a[layer, 0]) == 127:
        return None
    return int(a[layer, 0]), int(a[layer, 1])


def encode_levels(codec, shard: ShardKV, ident: ShardId, tables: CodecTables | None = None) -> list[bytes]:
    """One object per ladder level: [base, refinement 1, ...]."""
    an = analyse(codec, shard)
    out: list[bytes] = []
    for level in range(len(an.bits)):
        parent = zlib.crc32(out[-1]) if out else None
        out.append(encode_level(codec, an, level, shard, ident, tables, parent))
    return out


def start_state(codec, obj: bs.Object, piece: bytes, ident: ShardId, tables: CodecTables | None, dtype,
                shape: tuple[int, int, int]) -> "NestedState":
    """The state of a nested ladder's base object `piece`, opened (header parsed, checksum checked)
    by the caller as `obj` of `dtype` and `shape`."""
    h = obj.header
    T, H, D = shape
    C = H * D
    if h.get("level") != 0:
        raise bs.CorruptError(f"base object has level {h.get('level')!r}")
    params = h.get("params", {})
    try:
        kg = int(params["key_group"])
        vg = vgroup(params, D)
    except (KeyError, TypeError, ValueError):
        raise bs.CorruptError(f"{codec.name}: bad params {params!r}") from None
    ko = params.get("key_offset", 0)
    if not isinstance(ko, int) or not -6 <= ko <= 6:
        raise bs.CorruptError(f"{codec.name}: bad key_offset {ko!r}")
    offs = h.get("offsets")
    if offs is not None and (not isinstance(offs, list) or len(offs) != 2
                             or not all(isinstance(o, int) and -6 <= o <= 6 for o in offs)):
        raise bs.CorruptError(f"{codec.name}: bad offsets {offs!r}")
    scales = {}
    kscale = params.get("key_scale", "channel")
    if kscale not in ("channel", "token"):
        raise bs.CorruptError(f"{codec.name}: bad key_scale {kscale!r}")
    kmode = "key" if kscale == "channel" else "value"
    for kv, mode, g in (("k", kmode, kg), ("v", "value", vg)):
        want = (Q.n_groups(T, g), C) if mode == "key" else (T, Q.n_groups(C, g))
        for part in ("lo", "r"):
            a = obj.section(f"{kv}_{part}")
            if a.shape != want or a.dtype.kind != "f":
                raise bs.CorruptError(f"{codec.name}: {kv}_{part} has shape {a.shape}, expected {want}")
            scales[f"{kv}_{part}"] = Q.expand(a, mode, g, T, C)
    st = NestedState(codec=codec, ident=ident, tables=tables, dtype=dtype, shape=shape, header=h,
                      scales=scales, idx={"k": np.zeros((T, C), np.int32), "v": np.zeros((T, C), np.int32)},
                      bits=np.zeros(T, np.int32), level=-1, last_crc=0)
    st._apply(obj, zlib.crc32(piece))
    return st


@dataclass
class NestedState(LadderState):
    """Decoded indices of a shard at some ladder level; `upgrade` adds the next level in place."""

    scales: dict[str, np.ndarray]
    idx: dict[str, np.ndarray]
    bits: np.ndarray
    level: int
    last_crc: int

    def _apply(self, obj: bs.Object, crc: int) -> None:
        T, H, D = self.shape
        C = H * D
        cur = obj.section("bits").astype(np.int32)
        if cur.shape != (T,) or (cur < self.bits).any() or (cur > 8).any() or (cur == 1).any():
            raise bs.CorruptError(f"{self.codec.name}: level bit widths malformed")
        layer = int(self.header.get("layer", 0))
        prev = self.bits
        off = self._offsets()
        low = self._low()
        for kv in ("k", "v"):
            for gname, sel, m, fresh, A in _group_names(widths(prev, off[kv], low), widths(cur, off[kv], low)):
                if not fresh:
                    raw = obj.section(f"raw.{kv}.{gname}")
                    if raw.dtype != np.uint8 or raw.size * 8 < sel.size * C * m:
                        raise bs.CorruptError(f"refinement bits {kv}.{gname} too short")
                    sym = Q.unpack(raw, m, sel.size * C).reshape(sel.size, C)
                    self.idx[kv][sel] = (self.idx[kv][sel] << m) | sym
                    continue
                if self.tables is not None:
                    tname = f"L{layer}.{kv}.{gname}"
                    table = self.tables.get(tname)
                    models = self.tables.cached(tname, lambda t=table: E.make_models(t))
                else:
                    table = obj.section(f"hist.{kv}.{gname}")
                    if table.ndim != 2 or table.shape[1] != A or table.shape[0] not in (1, C):
                        raise bs.CorruptError(f"histogram {kv}.{gname} has shape {table.shape}")
                    models = E.make_models(table)
                sym = E.decode(obj.section(f"ans.{kv}.{gname}"), models, sel.size, C)
                if fresh:
                    self.idx[kv][sel] = sym
                else:
                    self.idx[kv][sel] = (self.idx[kv][sel] << m) | sym
        self.bits = cur
        self.level = int(obj.header["level"])
        self.last_crc = crc

    def upgrade(self, piece: bytes) -> "NestedState":
        """Apply the next refinement object (in place; returns self); mismatches raise `IdentityError`."""
        obj, dtype, shape = self.codec._open(piece, self.ident, self.tables, kind=bs.KIND_LAYER)
        h = obj.header
        if shape != self.shape or h.get("level") != self.level + 1:
            raise bs.IdentityError(f"refinement object is level {h.get('level')!r} of shape {shape}; "
                                   f"expected level {self.level + 1} of shape {self.shape}")
        if h.get("parent_crc") != self.last_crc:
            raise bs.IdentityError("refinement object does not refine this base (parent checksum differs)")
        self._apply(obj, zlib.crc32(piece))
        return self

    def _offsets(self) -> dict[str, int]:
        """Width offsets of K and V: the header's per-layer allocation (v2), else key_offset / 0."""
        offs = self.header.get("offsets")
        if offs is None:
            offs = (int(self.header["params"].get("key_offset", 0)), 0)
        return {"k": int(offs[0]), "v": int(offs[1])}

    def _low(self) -> int:
        """Narrowest width: 1 under a calibrated allocation (v2), else 2."""
        return 1 if self.header.get("offsets") is not None else 2

    def result(self) -> LayerKV:
        T = self.shape[0]
        keep = self.bits > 0
        out = []
        off = self._offsets()
        layer = int(self.header.get("layer", 0))
        for kv in ("k", "v"):
            kb = widths(self.bits, off[kv], self._low())
            x = Q.reconstruct(self.idx[kv], kb, self.scales[f"{kv}_lo"], self.scales[f"{kv}_r"])
            if self.tables is not None:  # centroid reconstruction where the tables hold it
                C = x.shape[1]
                for b in np.unique(kb[keep]):
                    name = f"L{layer}.{kv}.cent{int(b)}"
                    if int(b) > CENTROID_MAX_BITS or name not in self.tables.arrays:
                        continue
                    cent = self.tables.arrays[name]
                    if cent.ndim != 2 or cent.shape[0] not in (1, C) or cent.shape[1] != 1 << int(b):
                        raise bs.CorruptError(f"centroid table {name} has shape {cent.shape}")
                    sel = np.nonzero(kb == b)[0]
                    idx = self.idx[kv][sel]
                    rows = np.arange(C)[None, :] if cent.shape[0] == C else np.zeros((1, 1), np.int64)
                    if int(cent.max(initial=0)) >= CENTROID_LEVELS:
                        raise bs.CorruptError(f"centroid table {name} holds values >= {CENTROID_LEVELS}")
                    delta = (cent[rows, idx].astype(np.float32) + np.float32(0.5)) / np.float32(CENTROID_LEVELS)
                    step = self.scales[f"{kv}_r"][sel] * np.float32(2.0 ** -int(b))
                    x[sel] = self.scales[f"{kv}_lo"][sel] + (idx + delta) * step
            x[~keep] = 0.0
            out.append(from_f32_2d(x, self.shape, self.dtype))
        return finite(LayerKV(out[0], out[1], torch.from_numpy(keep.copy())), self.codec.name)
