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
from . import entropy as E
from . import quant as Q
from .base import (Codec, CodecTables, DecodedShard, Shard, ShardId, as_f32_2d, check_params, from_f32_2d,
                   register)

ALLOWED_BITS = np.array([0, 2, 3, 4, 5, 6, 7, 8], dtype=np.int32)
CENTROID_MAX_BITS = 4  # wider bins are small enough that their midpoints are (nearly) unbiased
CENTROID_LEVELS = 16   # a bin's reconstruction point is stored to 1/16 of the bin (error <= 1/32 bin)
PER_CHANNEL_MAX_BITS = 5


def plan_bits(importance: np.ndarray | None, T: int, budget: float, *, prev: np.ndarray | None = None,
              alpha: float = 1.0, drop_cost: float = 1.0, allow_drop: bool = True,
              max_bits: int = 8) -> np.ndarray:
    """Per-token bit widths (T,) int32 with mean <= budget (when feasible), >= prev token-wise."""
    allowed = ALLOWED_BITS[(ALLOWED_BITS <= max_bits) & ((ALLOWED_BITS > 0) | allow_drop)]
    e = np.where(allowed == 0, drop_cost, 3.0 * np.power(4.0, -allowed.astype(np.float64)))  # (J,)
    if importance is None:
        w = np.ones(T)
    else:
        imp = np.asarray(importance, dtype=np.float64)
        m = imp.mean()
        w = (imp / m) ** alpha if m > 0 else np.ones(T)
    # deterministic tie-break so equal weights split at a budget between two widths
    w = w * (1.0 + 1e-9 * np.arange(T)[::-1] / max(T, 1)) + 1e-30
    lo_bits = prev if prev is not None else np.zeros(T, np.int32)
    invalid = allowed[None, :] < lo_bits[:, None]  # (T, J)

    def assign(lam: float) -> np.ndarray:
        cost = w[:, None] * e[None, :] + lam * allowed[None, :]
        cost[invalid] = np.inf
        return allowed[np.argmin(cost, axis=1)]

    lo, hi = -40.0, 40.0  # log2 lambda; small lambda -> most bits
    best = assign(2.0 ** hi)
    if best.mean() > budget:
        return best  # even the cheapest feasible plan exceeds the budget (e.g. no drops allowed)
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        b = assign(2.0 ** mid)
        if b.mean() <= budget:
            best, hi = b, mid
        else:
            lo = mid
    return best.astype(np.int32)


def kind_bits(bits: np.ndarray, kv: str, key_offset: int) -> np.ndarray:
    """Per-token widths for K or V: keys get `key_offset` more (or fewer) bits, never below 2 or
    above 8; dropped tokens stay dropped. Monotone in `bits`, so ladders stay nested."""
    if kv == "v" or key_offset == 0:
        return bits
    return np.where(bits > 0, np.clip(bits + key_offset, 2, 8), 0).astype(np.int32)


@dataclass
class _Analysis:
    u: dict[str, np.ndarray]          # "k"/"v": (T, C) unit coordinates
    scales: dict[str, np.ndarray]     # "k_lo", "k_r", "v_lo", "v_r"
    bits: list[np.ndarray]            # per level (T,) int32, monotone
    sdt: np.dtype


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


class _ImportanceBase(Codec):
    uses_tables = True
    supports_layers = True
    _defaults: dict[str, Any] = {}

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
        if p["value_group"] != "head" and (not isinstance(p["value_group"], int) or p["value_group"] < 0):
            raise ValueError(f"{self.name}: value_group must be 'head' or an int >= 0 (0 = all channels)")
        super().__init__(**p)

    @staticmethod
    def _budgets(p: dict[str, Any]) -> list[float]:
        raise NotImplementedError

    # -- analysis ---------------------------------------------------------------------------
    def _vgroup(self, params: dict[str, Any], D: int) -> int:
        return D if params["value_group"] == "head" else int(params["value_group"])

    def _analyse(self, shard: Shard) -> _Analysis:
        shard.validate()
        T, H, D = shard.shape
        C = H * D
        p = self.params
        imp = None
        if shard.importance is not None and p["use_importance"]:
            imp = shard.importance.detach().double().numpy()
        bits, prev = [], None
        # early layers' errors propagate through every later layer (CacheGen gives them more bins)
        bonus = float(p["early_bonus"]) if shard.layer < round(shard.num_layers / 3) else 0.0
        for b in self._budgets(p):
            cur = plan_bits(imp, T, min(b + bonus, 8.0), prev=prev, alpha=p["alpha"], drop_cost=p["drop_cost"],
                            allow_drop=p["allow_drop"])
            if not (cur > 0).any():  # keep at least the most important token
                cur = cur.copy()
                cur[int(np.argmax(imp)) if imp is not None else 0] = 2
            bits.append(cur)
            prev = cur
        x = {"k": as_f32_2d(shard.key), "v": as_f32_2d(shard.value)}
        sdt = Q.scale_dtype(np.array([np.abs(x["k"]).max(), np.abs(x["v"]).max()]))
        u, scales = {}, {}
        kmode = "key" if p["key_scale"] == "channel" else "value"  # "token": one range per token
        for kv, mode, g in (("k", kmode, p["key_group"]), ("v", "value", self._vgroup(p, D))):
            lo, r = Q.fit_scales(x[kv], mode, g, sdt)
            scales[f"{kv}_lo"], scales[f"{kv}_r"] = lo, r
            u[kv] = Q.unit(x[kv], Q.expand(lo, mode, g, T, C), Q.expand(r, mode, g, T, C))
        return _Analysis(u=u, scales=scales, bits=bits, sdt=sdt)

    def fit_tables(self, shards: Sequence[Shard]) -> CodecTables:
        """Symbol histograms per (layer, K/V, level group) over all of a template's shards."""
        arrays: dict[str, np.ndarray] = {}
        for shard in shards:
            an = self._analyse(shard)
            prev = np.zeros(shard.shape[0], np.int32)
            ko = int(self.params["key_offset"])
            for cur in an.bits:
                for kv in ("k", "v"):
                    for gname, sel, sym, A in _groups(an.u[kv], kind_bits(prev, kv, ko), kind_bits(cur, kv, ko)):
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
                widths = set()
                for cur in an.bits:
                    widths.update(int(b) for b in np.unique(kind_bits(cur, kv, ko)))
                for b in sorted(w for w in widths if 0 < w <= CENTROID_MAX_BITS):
                    tok = np.zeros(0, np.int64)
                    for cur in an.bits:
                        tok = np.union1d(tok, np.nonzero(kind_bits(cur, kv, ko) == b)[0])
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

    # -- encode -----------------------------------------------------------------------------
    def _encode_level(self, an: _Analysis, level: int, shard: Shard, ident: ShardId,
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
        ko = int(self.params["key_offset"])
        for kv in ("k", "v"):
            for gname, sel, sym, A in _groups(an.u[kv], kind_bits(prev, kv, ko), kind_bits(cur, kv, ko)):
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
        if parent_crc is not None:
            extra["parent_crc"] = parent_crc
        if level == 0:
            return w.to_bytes(bs.KIND_SHARD, self._header(shard, ident, tables, **extra))
        # refinements carry only what identifies them; parameters come from the base they refine
        h = self._header(shard, ident, tables, **extra)
        for k in ("params", "layer", "num_layers", "levels", "scale_dtype"):
            h.pop(k)
        return w.to_bytes(bs.KIND_LAYER, h)

    def encode_levels(self, shard: Shard, ident: ShardId, tables: CodecTables | None = None) -> list[bytes]:
        """One object per ladder level: [base, refinement 1, ...]."""
        an = self._analyse(shard)
        out: list[bytes] = []
        for level in range(len(an.bits)):
            parent = zlib.crc32(out[-1]) if out else None
            out.append(self._encode_level(an, level, shard, ident, tables, parent))
        return out

    def encode(self, shard: Shard, ident: ShardId, tables: CodecTables | None = None) -> bytes:
        """The whole ladder as back-to-back objects; prefix `level_ends(data)[l]` is rung l."""
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
        return self.decode_state(data, ident, tables).result()

    def _start(self, piece: bytes, ident: ShardId, tables: CodecTables | None) -> "LayeredState":
        obj, dtype, shape = self._open(piece, ident, tables, kind=bs.KIND_SHARD)
        h = obj.header
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
        ko = int(self.header["params"].get("key_offset", 0))
        for kv in ("k", "v"):
            for gname, sel, m, fresh, A in _group_names(kind_bits(prev, kv, ko), kind_bits(cur, kv, ko)):
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

    def result(self) -> DecodedShard:
        T = self.shape[0]
        keep = self.bits > 0
        out = []
        ko = int(self.header["params"].get("key_offset", 0))
        layer = int(self.header.get("layer", 0))
        for kv in ("k", "v"):
            kb = kind_bits(self.bits, kv, ko)
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
           "key_scale": "token"}


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
    _defaults = {"budgets": [1.0, 2.0, 3.0, 4.0], **_COMMON}

    @staticmethod
    def _budgets(p: dict[str, Any]) -> list[float]:
        b = p["budgets"]
        return list(b) if isinstance(b, (list, tuple)) else [b]
