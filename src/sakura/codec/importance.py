"""`sakura` and `layered`: token-importance-aware, embedded quantisation with ANS entropy coding.

Bit allocation. Each template token t gets a bit width b_t in {0, 2, 3, ..., 8} (0 = dropped and
masked out of attention). A token's error enters the attention output scaled by the attention it
receives, so we minimise  sum_t w_t * e(b_t)  subject to  mean_t b_t <= budget, with
w_t = (importance_t / mean importance)^alpha, e(b) = 3 * 4^-b (the relative MSE of a b-bit
uniform quantiser over a ~6 sigma range) and e(0) = drop_cost (losing the token entirely). The
Lagrangian solution is, per token, argmin_b w_t e(b) + lambda b, with lambda found by bisection:
the most-attended tokens get the most bits (+1 bit per 2^(1/alpha)x more importance), the least
attended are dropped. Without importance every token gets the same width.

Quantisation is the nested quantiser of `quant` with one range per token over all channels for
keys and values (the same absolute step for every channel, which minimum-MSE allocation asks
for; `key_scale="channel"` gives KIVI-style per-channel key ranges instead), keys `key_offset`
bits coarser than values, and per-template centroid reconstruction for widths <= 4. A ladder of budgets b^0 < b^1 < ... is coded as a base layer plus
refinement layers that each add (b^l_t - b^(l-1)_t) low-order bits per token (or bring a dropped
token in): the whole ladder is stored once, at the size of its top rung, and a phone that holds
rung l upgrades by fetching only layer l+1.

Entropy coding: indices of tokens coded from scratch are grouped by bit width and ANS-coded with
one symbol histogram per (layer, K/V, width) - per channel for alphabets <= 32, pooled above -
fitted once per template (`fit_tables`) and shared by all its shards; without tables an object
carries its own histograms. Refinement bits (the low-order bits a rung adds) are near-uniform, so
they are stored bit-packed (ANS saved <0.1% on them and decodes 10x slower).

Calibrated allocation: with `ShardKV.sensitivity` (image MSE per unit relative MSE of this layer's K
and V, measured on public calibration photos by `sakura.capture.sensitivity`), `fit_tables` picks per
(layer, K/V) width offsets (nested quantiser; stored as `alloc` in the tables, in the object header
as `offsets`, format version 2) or per-part ECSQ steps (`quantiser="ecsq"`, see `ecsq`) minimising
sum sensitivity x relative MSE at the entropy-coded bits of the default widths / of `budget`. `layered`
keeps uniform widths by default (`allocate="none"`).

Wire form of a layered shard: the base object (kind shard) followed by one object (kind layer) per
refinement level; every object names its level and the crc32 of its parent, so prefixes decode
to rungs and a mismatched upgrade raises.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from . import bitstream as bs
from . import ecsq as EQ
from . import progressive as PG
from . import entropy as E
from . import quant as Q
from .allocation import ALLOWED_BITS, allocate_offsets, plan_bits  # noqa: F401  (re-exported)
from .base import (Codec, CodecTables, DecodedShard, ShardKV, ShardId, as_f32_2d, check_params, from_f32_2d,
                   register)

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
class _Analysis:
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


class _ImportanceBase(Codec):
    uses_tables = True
    supports_layers = True
    _defaults: dict[str, Any] = {}
    _ladder = False  # True: several budgets (rungs) per rendition

    def __init__(self, **params: Any) -> None:
        p = check_params(params, self._defaults, self.name)
        budgets = self._budgets(p)
        if not budgets or any(not isinstance(b, (int, float)) or not 0.0 <= b <= 8.0 for b in budgets) \
                or any(b2 <= b1 for b1, b2 in zip(budgets, budgets[1:])):
            raise ValueError(f"{self.name}: budgets must be increasing numbers in [0, 8], got {budgets!r}")
        if not isinstance(p["alpha"], (int, float)) or p["alpha"] < 0:
            raise ValueError(f"{self.name}: alpha must be >= 0")
        if not isinstance(p["drop_cost"], (int, float)) or p["drop_cost"] <= 0:
            raise ValueError(f"{self.name}: drop_cost must be > 0")
        if not isinstance(p["key_group"], int) or p["key_group"] < 0:
            raise ValueError(f"{self.name}: key_group must be an int >= 0 (0 = all tokens)")
        if p["key_scale"] not in ("channel", "token"):
            raise ValueError(f"{self.name}: key_scale must be 'channel' or 'token'")
        if p["centroids"] not in ("channel", "pooled", "none"):
            raise ValueError(f"{self.name}: centroids must be 'channel', 'pooled' or 'none'")
        if not isinstance(p["early_bonus"], (int, float)) or not 0 <= p["early_bonus"] <= 4:
            raise ValueError(f"{self.name}: early_bonus must be a number in [0, 4]")
        if not isinstance(p["key_offset"], int) or not -6 <= p["key_offset"] <= 6:
            raise ValueError(f"{self.name}: key_offset must be an int in [-6, 6]")
        if p["quantiser"] not in ("nested", "ecsq"):
            raise ValueError(f"{self.name}: quantiser must be 'nested' or 'ecsq'")
        if p["quantiser"] == "ecsq" and len(budgets) != 1 and not self._ladder:
            raise ValueError(f"{self.name}: one budget per rendition (ladders: the layered codec)")
        if p["transform"] not in ("none", "dct") or (p["transform"] == "dct" and p["quantiser"] != "ecsq"):
            raise ValueError(f"{self.name}: transform must be 'none' or 'dct' (dct needs quantiser='ecsq')")
        if p["allocate"] not in ("sensitivity", "none"):
            raise ValueError(f"{self.name}: allocate must be 'sensitivity' or 'none'")
        if p["value_group"] != "head" and (not isinstance(p["value_group"], int) or p["value_group"] < 0):
            raise ValueError(f"{self.name}: value_group must be 'head' or an int >= 0 (0 = all channels)")
        super().__init__(**p)

    @staticmethod
    def _budgets(p: dict[str, Any]) -> list[float]:
        raise NotImplementedError

    # -- analysis ---------------------------------------------------------------------------
    def _vgroup(self, params: dict[str, Any], D: int) -> int:
        return D if params["value_group"] == "head" else int(params["value_group"])

    def _analyse(self, shard: ShardKV) -> _Analysis:
        shard.validate()
        T, H, D = shard.shape
        C = H * D
        p = self.params
        imp = None
        if shard.importance is not None and p["use_importance"]:
            imp = shard.importance.detach().double().numpy()
            imp = imp.sum(axis=0) if imp.ndim == 2 else imp
        bits, prev = [], None
        # early layers' errors propagate through every later layer (CacheGen gives them more bins)
        bonus = float(p["early_bonus"]) if shard.layer < round(shard.num_layers / 3) else 0.0
        # ecsq: `budget` is entropy-coded bits per value (set by the steps); importance only sets
        # relative per-token steps, planned around a reference width
        for b in (self._budgets(p) if p["quantiser"] != "ecsq" else [EQ.REF_BITS]):
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
        for kv, mode, g in (("k", kmode, p["key_group"]), ("v", "value", self._vgroup(p, D))):
            lo, r = Q.fit_scales(x[kv], mode, g, sdt)
            scales[f"{kv}_lo"], scales[f"{kv}_r"] = lo, r
            u_r[kv] = Q.expand(r, mode, g, T, C)
            u[kv] = Q.unit(x[kv], Q.expand(lo, mode, g, T, C), u_r[kv])
        return _Analysis(u=u, scales=scales, bits=bits, sdt=sdt, u_r=u_r)

    def fit_tables(self, shards: Sequence[ShardKV]) -> CodecTables:
        """Symbol histograms per (layer, K/V, level group) over all of a template's shards; with
        calibrated shard sensitivities (and allocate="sensitivity") also per-layer K/V width offsets."""
        arrays: dict[str, np.ndarray] = {}
        analyses = [self._analyse(shard) for shard in shards]
        if self.params["quantiser"] == "ecsq":
            return self._ecsq_tables(shards, analyses)
        ko = int(self.params["key_offset"])
        offs: dict[int, tuple[int, int]] = {}
        if (self.params["allocate"] == "sensitivity" and shards
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
            for kv in ("k", "v") if self.params["centroids"] != "none" else ():
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
            if self.params["centroids"] == "pooled":
                cnt, ssum = cnt.sum(0, keepdims=True), ssum.sum(0, keepdims=True)
            with np.errstate(invalid="ignore", divide="ignore"):
                c = np.where(cnt > 0, ssum / np.maximum(cnt, 1), 0.5)
            q = np.clip(np.floor(c * CENTROID_LEVELS), 0, CENTROID_LEVELS - 1)  # 16 sub-bins, centre of each
            arrays[name.replace(".csum", ".cent")] = q.astype(np.uint8)
        return CodecTables(codec=self.name, arrays=arrays, meta={"params": self.params})

    # -- ecsq -------------------------------------------------------------------------------
    def _ecsq_plan(self, shards: Sequence[ShardKV], analyses: list[_Analysis]) -> dict[tuple[int, str], tuple]:
        """Per (layer, K/V): (mean, step, floor, nominal) at `budget` entropy-coded bits per value."""
        use_sens = self.params["allocate"] == "sensitivity" and all(s.sensitivity is not None for s in shards)
        points, sens, parts = {}, {}, {}
        budget = float(self.params["budget"]) * sum(s.num_values for s in shards)
        for shard, an in zip(shards, analyses):
            nominal = EQ.REF_BITS
            n = self._grid(shard)
            x = {"k": as_f32_2d(shard.key), "v": as_f32_2d(shard.value)}
            for j, kv in enumerate(("k", "v")):
                c = (shard.layer, kv)
                mu = EQ.part_mean(x[kv], an.sdt)
                if n:
                    points[c] = EQ.rd_points_dct(x[kv], mu, n)
                    coef = EQ.forward(x[kv].astype(np.float64) - mu.astype(np.float64)[None, :], n)
                    fl = max(float(np.abs(coef).max(initial=0.0)) / EQ.MAX_SYM, 1e-30)
                else:
                    points[c] = EQ.rd_points(x[kv], mu)
                    fl = EQ.floor_of(x[kv], mu)
                sens[c] = float(shard.sensitivity[j]) if use_sens else 1.0
                parts[c] = (mu, fl, nominal)
        steps = EQ.allocate(points, sens, budget)
        return {c: (mu, steps[c], fl, nominal) for c, (mu, fl, nominal) in parts.items()}

    def _grid(self, shard: ShardKV) -> int:
        """Side of the token grid the dct transform runs over (0: no transform)."""
        return EQ.grid_side(shard.shape[0]) if self.params["transform"] == "dct" else 0

    def _ecsq_symbols(self, shard: ShardKV, an: _Analysis, plan: tuple, kv: str):
        mu, step, floor, nominal = plan
        bits = self._ecsq_bits(shard, an)
        keep = bits > 0
        x = as_f32_2d(shard.key if kv == "k" else shard.value)
        st = EQ.token_steps(step, floor, bits, nominal)
        n = self._grid(shard)
        if n:  # all tokens kept, one step: quantise the grid's DCT coefficients
            coef = EQ.forward(x.astype(np.float64) - mu.astype(np.float64)[None, :], n)
            return np.rint(coef / np.float64(st[0])).astype(np.int32)
        return EQ.symbols(x[keep], mu, st[keep])

    def _ecsq_bits(self, shard: ShardKV, an: _Analysis) -> np.ndarray:
        if self._grid(shard):
            return np.full(shard.shape[0], EQ.REF_BITS, np.int32)
        return an.bits[0]

    def _ecsq_tables(self, shards: Sequence[ShardKV], analyses: list[_Analysis]) -> CodecTables:
        plan = self._ecsq_plan(shards, analyses)
        arrays: dict[str, np.ndarray] = {}
        for shard, an in zip(shards, analyses):
            for kv in ("k", "v"):
                pl = plan[(shard.layer, kv)]
                sym = self._ecsq_symbols(shard, an, pl, kv)
                m = max(1, int(np.abs(sym).max(initial=0)))  # >= 3 symbols: ANS needs two
                A = 2 * m + 1
                arrays[f"L{shard.layer}.{kv}.mean"] = pl[0]
                arrays[f"L{shard.layer}.{kv}.q"] = np.array([pl[1], pl[2], pl[3]], np.float64)
                # counts x COUNT_SCALE: the +1 smoothing of the ANS models then costs 1/COUNT_SCALE as
                # much (64 tokens per channel against up to 33 symbols: +1 alone cost ~10-20% of bytes)
                arrays[f"L{shard.layer}.{kv}.e"] = self._ecsq_counts(shard, sym + m, A) * np.uint32(EQ.COUNT_SCALE)
        return CodecTables(codec=self.name, arrays=arrays, meta={"params": self.params})

    def _ecsq_counts(self, shard: ShardKV, sym: np.ndarray, A: int) -> np.ndarray:
        n = self._grid(shard)
        if n:
            return EQ.band_counts(sym, EQ.bands(n), A)
        return E.counts(sym, A, per_channel=A <= EQ.PER_CHANNEL_MAX_ALPHABET)

    def _encode_ecsq(self, shard: ShardKV, ident: ShardId, tables: CodecTables | None) -> bytes:
        an = self._analyse(shard)
        T, H, D = shard.shape
        w = bs.Writer()
        n = self._grid(shard)
        w.add("bits", self._ecsq_bits(shard, an).astype(np.uint8), zstd_level=3)
        plan = None if tables is not None else self._ecsq_plan([shard], [an])
        info: dict[str, Any] = {}
        for kv in ("k", "v"):
            if tables is not None:
                mu = tables.get(f"L{shard.layer}.{kv}.mean")
                q = tables.get(f"L{shard.layer}.{kv}.q")
                if mu.shape != (H * D,) or q.shape != (3,):
                    raise bs.IdentityError(f"codec tables for layer {shard.layer} do not fit this shard's shape")
                pl = (mu, float(q[0]), float(q[1]), int(q[2]))
            else:
                pl = plan[(shard.layer, kv)]
                w.add(f"{kv}_mean", pl[0])
            sym = self._ecsq_symbols(shard, an, pl, kv)
            m = max(1, int(np.abs(sym).max(initial=0)))
            models, own = None, True
            if tables is not None:
                tname = f"L{shard.layer}.{kv}.e"
                table = tables.get(tname)
                rows_ok = table.shape[0] == 2 * n - 1 if n else table.shape[0] in (1, H * D)
                if m <= (table.shape[1] - 1) // 2 and rows_ok:
                    m = (table.shape[1] - 1) // 2
                    models, own = tables.cached(tname, lambda t=table: E.make_models(t)), False
            if models is None:  # no tables, or symbols beyond the table's alphabet: carry a histogram
                if m > 1 << 16:
                    raise bs.CodecError(f"{self.name}: ecsq symbols up to {m}; tables do not fit this shard")
                A = 2 * m + 1
                table = self._ecsq_counts(shard, sym + m, A)
                w.add(f"hist.{kv}", table, zstd_level=3)
                models = E.make_models(table)
            if n:
                w.add(f"ans.{kv}", EQ.ans_encode_bands(sym + m, EQ.bands(n), models))
            else:
                w.add(f"ans.{kv}", E.encode(sym + m, models))
            info[kv] = [float(pl[1]), float(pl[2]), int(pl[3]), m, own, n]
        h = self._header(shard, ident, tables, level=0, levels=1, ecsq=info)
        # only what decoding needs (the object is small: the full parameter set was ~1/4 of it)
        h["params"] = {"budget": self.params["budget"], "quantiser": "ecsq", "transform": self.params["transform"]}
        return w.to_bytes(bs.KIND_SHARD, h, 2)

    def _decode_ecsq(self, obj: bs.Object, dtype, shape, tables: CodecTables | None) -> DecodedShard:
        h = obj.header
        T, H, D = shape
        C = H * D
        layer = int(h.get("layer", 0))
        bits = obj.section("bits").astype(np.int32)
        if bits.shape != (T,) or (bits > 8).any():
            raise bs.CorruptError(f"{self.name}: bit widths malformed")
        keep = bits > 0
        info = h.get("ecsq")
        if not isinstance(info, dict):
            raise bs.CorruptError(f"{self.name}: ecsq header missing")
        out = []
        for kv in ("k", "v"):
            e = info.get(kv)
            try:
                step, floor, nominal, m, own = float(e[0]), float(e[1]), int(e[2]), int(e[3]), bool(e[4])
                n = int(e[5]) if len(e) > 5 else 0
            except (TypeError, ValueError, IndexError, KeyError):
                raise bs.CorruptError(f"{self.name}: bad ecsq header {e!r}") from None
            if not (np.isfinite(step) and step > 0 and np.isfinite(floor) and floor > 0 and 1 <= nominal <= 8
                    and 1 <= m <= 1 << 16 and (n == 0 or (n * n == T and bool(keep.all())))):
                raise bs.CorruptError(f"{self.name}: bad ecsq header {e!r}")
            if tables is not None:
                mu = tables.get(f"L{layer}.{kv}.mean")
            else:
                mu = obj.section(f"{kv}_mean")
            if mu.shape != (C,) or mu.dtype.kind != "f":
                raise bs.CorruptError(f"{self.name}: {kv} mean has shape {mu.shape}")
            rows = (2 * n - 1,) if n else (1, C)
            if own or tables is None:
                table = obj.section(f"hist.{kv}")
                if table.ndim != 2 or table.shape[1] != 2 * m + 1 or table.shape[0] not in rows:
                    raise bs.CorruptError(f"{self.name}: histogram {kv} has shape {table.shape}")
                models = E.make_models(table)
            else:
                tname = f"L{layer}.{kv}.e"
                table = tables.get(tname)
                if table.ndim != 2 or table.shape[1] != 2 * m + 1 or table.shape[0] not in rows:
                    raise bs.CorruptError(f"{self.name}: table {tname} does not match the object")
                models = tables.cached(tname, lambda t=table: E.make_models(t))
            st = EQ.token_steps(step, floor, bits, nominal)
            if n:
                sym = EQ.ans_decode_bands(obj.section(f"ans.{kv}"), EQ.bands(n), models, C) - m
                x = EQ.inverse(sym.astype(np.float64) * np.float64(st[0]), n)
                x += mu.astype(np.float32)[None, :]
            else:
                sym = E.decode(obj.section(f"ans.{kv}"), models, int(keep.sum()), C) - m
                x = np.zeros((T, C), np.float32)
                x[keep] = EQ.reconstruct(sym, mu, st[keep])
            out.append(from_f32_2d(x, shape, dtype))
        return DecodedShard(out[0], out[1], torch.from_numpy(keep.copy()))

    # -- encode -----------------------------------------------------------------------------
    def _encode_level(self, an: _Analysis, level: int, shard: ShardKV, ident: ShardId,
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
        offsets = self._table_offsets(shard.layer, tables)
        off = dict(zip(("k", "v"), offsets or (int(self.params["key_offset"]), 0)))
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
            return w.to_bytes(bs.KIND_SHARD, self._header(shard, ident, tables, **extra), version)
        # refinements carry only what identifies them; parameters come from the base they refine
        h = self._header(shard, ident, tables, **extra)
        for k in ("params", "layer", "num_layers", "levels", "scale_dtype", "offsets"):
            h.pop(k, None)
        return w.to_bytes(bs.KIND_LAYER, h, version)

    @staticmethod
    def _table_offsets(layer: int, tables: CodecTables | None) -> tuple[int, int] | None:
        """(key, value) width offsets the tables' allocation gives `layer`, or None."""
        if tables is None or "alloc" not in tables.arrays:
            return None
        a = tables.arrays["alloc"]
        if a.ndim != 2 or a.shape[1] != 2 or not 0 <= layer < a.shape[0] or int(a[layer, 0]) == 127:
            return None
        return int(a[layer, 0]), int(a[layer, 1])

    def encode_levels(self, shard: ShardKV, ident: ShardId, tables: CodecTables | None = None) -> list[bytes]:
        """One object per ladder level: [base, refinement 1, ...]."""
        an = self._analyse(shard)
        out: list[bytes] = []
        for level in range(len(an.bits)):
            parent = zlib.crc32(out[-1]) if out else None
            out.append(self._encode_level(an, level, shard, ident, tables, parent))
        return out

    def encode(self, shard: ShardKV, ident: ShardId, tables: CodecTables | None = None) -> bytes:
        """The whole ladder as back-to-back objects; prefix `level_ends(data)[l]` is rung l."""
        if self.params["quantiser"] == "ecsq":
            return self._encode_ecsq(shard, ident, tables)
        return b"".join(self.encode_levels(shard, ident, tables))

    # -- decode -----------------------------------------------------------------------------
    @staticmethod
    def level_ends(data: bytes) -> list[int]:
        """Byte offsets where each complete level object ends (rung l = data[:ends[l]])."""
        return [end for _start, end in bs.split_objects(data)]

    def decode_state(self, data: bytes, ident: ShardId, tables: CodecTables | None = None) -> "LayeredState":
        """Decode every complete level in `data`; a partial trailing object raises `TruncatedError`."""
        st = None
        at = 0
        mv = memoryview(data)
        while at < len(mv):
            kind, hlen, plen, _ = bs.read_fixed(mv, at)
            end = at + bs.FIXED_SIZE + hlen + plen
            if end > len(mv):
                raise bs.TruncatedError(f"level object at byte {at} truncated: needs {end - at} bytes, "
                                        f"{len(mv) - at} present")
            piece = bytes(mv[at:end])
            st = self._start(piece, ident, tables) if st is None else self.upgrade(st, piece)
            at = end
        if st is None:
            raise bs.TruncatedError("empty object")
        return st

    def decode(self, data: bytes, ident: ShardId, tables: CodecTables | None = None) -> DecodedShard:
        if self.name == "sakura" and bs.read_fixed(memoryview(data), 0)[0] == bs.KIND_SHARD:
            obj, dtype, shape = self._open(data, ident, tables, kind=bs.KIND_SHARD)
            if obj.header.get("ecsq") is not None or obj.header.get("params", {}).get("quantiser") == "ecsq":
                return self._decode_ecsq(obj, dtype, shape, tables)
        return self.decode_state(data, ident, tables).result()

    def _start(self, piece: bytes, ident: ShardId, tables: CodecTables | None) -> "LayeredState":
        obj, dtype, shape = self._open(piece, ident, tables, kind=bs.KIND_SHARD)
        h = obj.header
        if h.get("prog") is not None:
            if h.get("level") != 0:
                raise bs.CorruptError(f"base object has level {h.get('level')!r}")
            return PG.start_state(self, obj, piece, ident, tables, dtype, shape)
        T, H, D = shape
        C = H * D
        if h.get("level") != 0:
            raise bs.CorruptError(f"base object has level {h.get('level')!r}")
        params = h.get("params", {})
        try:
            kg = int(params["key_group"])
            vg = self._vgroup(params, D)
        except (KeyError, TypeError, ValueError):
            raise bs.CorruptError(f"{self.name}: bad params {params!r}") from None
        ko = params.get("key_offset", 0)
        if not isinstance(ko, int) or not -6 <= ko <= 6:
            raise bs.CorruptError(f"{self.name}: bad key_offset {ko!r}")
        offs = h.get("offsets")
        if offs is not None and (not isinstance(offs, list) or len(offs) != 2
                                 or not all(isinstance(o, int) and -6 <= o <= 6 for o in offs)):
            raise bs.CorruptError(f"{self.name}: bad offsets {offs!r}")
        scales = {}
        kscale = params.get("key_scale", "channel")
        if kscale not in ("channel", "token"):
            raise bs.CorruptError(f"{self.name}: bad key_scale {kscale!r}")
        kmode = "key" if kscale == "channel" else "value"
        for kv, mode, g in (("k", kmode, kg), ("v", "value", vg)):
            want = (Q.n_groups(T, g), C) if mode == "key" else (T, Q.n_groups(C, g))
            for part in ("lo", "r"):
                a = obj.section(f"{kv}_{part}")
                if a.shape != want or a.dtype.kind != "f":
                    raise bs.CorruptError(f"{self.name}: {kv}_{part} has shape {a.shape}, expected {want}")
                scales[f"{kv}_{part}"] = Q.expand(a, mode, g, T, C)
        st = LayeredState(codec=self, ident=ident, tables=tables, dtype=dtype, shape=shape, header=h,
                          scales=scales, idx={"k": np.zeros((T, C), np.int32), "v": np.zeros((T, C), np.int32)},
                          bits=np.zeros(T, np.int32), level=-1, last_crc=0)
        st._apply(obj, zlib.crc32(piece))
        return st

    def upgrade(self, state: "LayeredState", piece: bytes) -> "LayeredState":
        """Apply the next refinement object to a decoded state (in place; returns it)."""
        if isinstance(state, PG.ProgressiveState):
            return state.upgrade(piece)
        obj, dtype, shape = self._open(piece, state.ident, state.tables, kind=bs.KIND_LAYER)
        h = obj.header
        if shape != state.shape or h.get("level") != state.level + 1:
            raise bs.IdentityError(f"refinement object is level {h.get('level')!r} of shape {shape}; "
                                   f"expected level {state.level + 1} of shape {state.shape}")
        if h.get("parent_crc") != state.last_crc:
            raise bs.IdentityError("refinement object does not refine this base (parent checksum differs)")
        state._apply(obj, zlib.crc32(piece))
        return state


@dataclass
class LayeredState:
    """Decoded indices of a shard at some ladder level; `upgrade` adds the next level in place."""

    codec: _ImportanceBase
    ident: ShardId
    tables: CodecTables | None
    dtype: torch.dtype
    shape: tuple[int, int, int]
    header: dict[str, Any]
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

    def _offsets(self) -> dict[str, int]:
        """Width offsets of K and V: the header's per-layer allocation (v2), else key_offset / 0."""
        offs = self.header.get("offsets")
        if offs is None:
            offs = (int(self.header["params"].get("key_offset", 0)), 0)
        return {"k": int(offs[0]), "v": int(offs[1])}

    def _low(self) -> int:
        """Narrowest width: 1 under a calibrated allocation (v2), else 2."""
        return 1 if self.header.get("offsets") is not None else 2

    def result(self) -> DecodedShard:
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
        return DecodedShard(out[0], out[1], torch.from_numpy(keep.copy()))


_COMMON = {"alpha": 1.0, "drop_cost": 1.0, "allow_drop": True, "use_importance": True,
           "key_group": 0, "value_group": 0, "key_offset": -1, "early_bonus": 0.0, "centroids": "channel",
           "key_scale": "token", "allocate": "sensitivity",
           "quantiser": "nested",
           "transform": "none"}


@register
class SakuraCodec(_ImportanceBase):
    """Importance-aware single rendition at `budget` mean bits per value (before entropy coding)."""

    name = "sakura"
    _defaults = {"budget": 2.0, **_COMMON}

    @staticmethod
    def _budgets(p: dict[str, Any]) -> list[float]:
        return [p["budget"]]


@register
class LayeredCodec(_ImportanceBase):
    """A ladder of importance-aware rungs at `budgets`, stored once as base + refinement layers."""

    name = "layered"
    _ladder = True
    # nested quantiser: rungs share one set of per-layer offsets; fitted at the base budget they inflate
    # the upper rungs (measured: whole 4-rung ladder 0.35-0.41 of fp16 instead of 0.32-0.38), so nested
    # ladders keep uniform widths. quantiser="ecsq": the progressive transform ladder (`progressive`).
    _defaults = {"budgets": [1.0, 2.0, 3.0, 4.0], **_COMMON, "allocate": "none", "weighting": "none", "gamma": 1.0}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        p = self.params
        if p["weighting"] not in ("none", "importance"):
            raise ValueError(f"{self.name}: weighting must be 'none' or 'importance'")
        if p["weighting"] != "none" and p["quantiser"] != "ecsq":
            raise ValueError(f"{self.name}: weighting needs quantiser='ecsq' (the nested ladder uses importance itself)")
        if not isinstance(p["gamma"], (int, float)) or isinstance(p["gamma"], bool) or not 0 <= p["gamma"] <= 2:
            raise ValueError(f"{self.name}: gamma must be a number in [0, 2]")

    @staticmethod
    def _budgets(p: dict[str, Any]) -> list[float]:
        b = p["budgets"]
        return list(b) if isinstance(b, (list, tuple)) else [b]

    @property
    def progressive(self) -> bool:
        return self.params["quantiser"] == "ecsq"

    def fit_tables(self, shards: Sequence[ShardKV]) -> CodecTables:
        if self.progressive:
            return PG.fit_tables(self.name, self.params, shards)
        return super().fit_tables(shards)

    def fit_library_tables(self, templates: Sequence[Sequence[ShardKV]]) -> CodecTables:
        """One table set for a whole template library (per model), progressive ladders only."""
        if not self.progressive:
            raise ValueError(f"{self.name}: per-model tables need quantiser='ecsq'")
        return PG.fit_library_tables(self.name, self.params, templates)

    def encode_levels(self, shard: ShardKV, ident: ShardId, tables: CodecTables | None = None) -> list[bytes]:
        if self.progressive:
            return PG.encode_levels(self, shard, ident, tables)
        return super().encode_levels(shard, ident, tables)

    def encode(self, shard: ShardKV, ident: ShardId, tables: CodecTables | None = None) -> bytes:
        return b"".join(self.encode_levels(shard, ident, tables))

    def decode(self, data: bytes, ident: ShardId, tables: CodecTables | None = None) -> DecodedShard:
        return self.decode_state(data, ident, tables).result()


@register
class ProgressiveCodec(LayeredCodec):
    """The progressive transform ladder (`progressive`): `layered` with quantiser="ecsq",
    transform="dct" and sensitivity allocation as defaults, four rungs at 0.15/0.3/0.6/1.2 bits per
    value (entropy-coded, over the template). See `sakura.codec.progressive`."""

    name = "progressive"
    _defaults = {**LayeredCodec._defaults, "budgets": [0.15, 0.3, 0.6, 1.2], "quantiser": "ecsq",
                 "transform": "dct", "allocate": "sensitivity"}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        if self.params["quantiser"] != "ecsq":
            raise ValueError("progressive: quantiser must be 'ecsq' (the nested ladder is `layered`)")
