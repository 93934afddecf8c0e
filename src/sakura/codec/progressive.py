"""The progressive transform ladder: `layered:quantiser="ecsq"[,transform="dct"]`.

The same representation as `sakura:quantiser="ecsq",transform="dct"` (per-channel mean removed,
orthonormal 2-D DCT over the n x n token grid, one step per (layer, K/V) part, band-context ANS),
coded by successive refinement so that every rung refines the previous one and rung l is a byte
prefix of the shard's one object.

Quantiser: a dead-zone uniform quantiser, magnitude index q = floor(|c| / step), reconstruction
sign(c) (q + 1/2) step for q > 0, else 0. Steps halve from rung to rung per part
(step_l = step_0 2^-k_l, k_l >= k_(l-1) planes), and floor(|c| 2^m / step) >> m == floor(|c| / step)
exactly in floating point, so the indices are nested: a rung that adds m planes to a part sends,
per coefficient,

- already significant (q > 0): its m new low-order magnitude bits, bit-packed (near-uniform: ANS
  would gain ~nothing and decode 10x slower);
- not yet significant (q = 0): its new index in [0, 2^m) with ANS, one histogram per DCT band
  u+v (2n-1 contexts; the histogram tables are per template, fitted once), plus one raw sign bit
  if it became significant.

Rung 0 codes the signed index of every coefficient with band-context ANS (the ECSQ path's coder).
Error bound in the coefficient domain at rung l: |c - c^| <= step_l / 2 where q > 0, < step_l where
q = 0; the transform is orthonormal, so the squared error of the KV is the coefficients'.

Rate allocation (`allocation.allocate_steps`): `budgets` are entropy-coded bits per value at each
rung, over the whole template. Rung 0's steps are chosen per part in half-bit steps by the
Lagrangian that minimises sum sensitivity x relative MSE at budget 0 (sensitivities from
`ShardKV.sensitivity` with `allocate="sensitivity"`, else 1); rung l adds whole planes per part by
the same Lagrangian, never fewer than rung l-1 had. Token importance is not used (all tokens kept).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from . import bitstream as bs
from . import ecsq as EQ
from . import entropy as E
from . import quant as Q
from .allocation import allocate_steps, allocate_planes
from .base import CodecTables, DecodedShard, ShardKV, ShardId, as_f32_2d, from_f32_2d

FORMAT_VERSION = 3      # progressive objects need a reader that knows the `prog` header
MAX_PLANES = 12         # refinement planes beyond rung 0's step, per part
PARTS = ("k", "v")


@dataclass
class PartPlan:
    """Per (layer, K/V) part: channel mean (C,), rung-0 step, cumulative planes per rung."""

    mean: np.ndarray
    step0: float
    planes: list[int]          # planes[0] == 0, non-decreasing


# ---------------------------------------------------------------------------------------------
# analysis

def _grid(T: int, transform: str) -> int:
    return EQ.grid_side(T) if transform == "dct" else 0


def _bands(T: int, n: int) -> np.ndarray:
    return EQ.bands(n) if n else np.zeros(T, np.int64)


def coefficients(x: np.ndarray, mean: np.ndarray, n: int) -> np.ndarray:
    """(T, C) values -> (T, C) float64 coefficients (DCT over the token grid if n, else identity)."""
    y = x.astype(np.float64) - mean.astype(np.float64)[None, :]
    return EQ.forward(y, n) if n else y


def _deadzone_rd(c: np.ndarray, band: np.ndarray, step: float, energy: float) -> tuple[float, float]:
    """(relative MSE, band-context entropy bits) of the dead-zone quantiser at `step`."""
    a = np.abs(c)
    q = np.floor(a / step)
    rec = np.where(q > 0, (q + 0.5) * step, 0.0)
    err = float(((a - rec) ** 2).sum())
    s = (np.sign(c) * q).astype(np.int64)
    return err / energy, EQ.band_entropy_bits(s, band)


def plan_parts(shards: Sequence[ShardKV], budgets: Sequence[float], transform: str,
               use_sensitivity: bool) -> dict[tuple[int, str], PartPlan]:
    """Steps and planes of every (layer, K/V) part for a ladder at `budgets` bits per value."""
    sdt = Q.scale_dtype(np.array([max(float(s.key.abs().max()), float(s.value.abs().max())) for s in shards]))
    total_values = sum(s.num_values for s in shards)
    fine: dict = {}
    coarse_pts: dict = {}
    sens: dict = {}
    means: dict = {}
    for s in shards:
        T = s.shape[0]
        n = _grid(T, transform)
        band = _bands(T, n)
        for j, kv in enumerate(PARTS):
            part = (s.layer, kv)
            x = as_f32_2d(s.key if kv == "k" else s.value)
            mu = EQ.part_mean(x, sdt)
            c = coefficients(x, mu, n)
            energy = float((x.astype(np.float64) ** 2).sum()) + 1e-30
            sigma = math.sqrt(float((c ** 2).mean())) or 1.0
            floor = max(float(np.abs(c).max(initial=0.0)) / EQ.MAX_SYM, 1e-30)
            pts = []
            for jj in EQ.STEP_GRID:
                step = float(np.float32(max(sigma * 2.0 ** (-jj / 2.0), floor)))
                pts.append((step,) + _deadzone_rd(c, band, step, energy))
            fine[part] = pts
            sens[part] = float(s.sensitivity[j]) if use_sensitivity else 1.0
            means[part] = (mu, c, band, energy)
    step0 = allocate_steps(fine, sens, budgets[0] * total_values)
    for part, (mu, c, band, energy) in means.items():
        coarse_pts[part] = [(k,) + _deadzone_rd(c, band, step0[part] * 2.0 ** -k, energy) for k in range(MAX_PLANES + 1)]
    planes = {part: [0] for part in means}
    for b in budgets[1:]:
        prev = {part: planes[part][-1] for part in means}
        ks = allocate_planes(coarse_pts, sens, b * total_values, prev)
        for part in means:
            planes[part].append(ks[part])
    return {part: PartPlan(means[part][0], float(step0[part]), planes[part]) for part in means}


# ---------------------------------------------------------------------------------------------
# symbols per rung

def rung_symbols(c: np.ndarray, step0: float, planes: list[int]):
    """Yield per rung: rung 0 -> ("base", signed q (T, C)); rung l -> ("ref", m, insignificant mask,
    new indices of insignificant coefficients (n_i,), refinement bits of significant ones (n_s,),
    signs of newly significant (n_new,) as 0/1)."""
    a = np.abs(c)
    neg = c < 0
    q = np.floor(a / step0).astype(np.int64)
    yield ("base", np.where(neg, -q, q))
    for l in range(1, len(planes)):
        m = planes[l] - planes[l - 1]
        if m == 0:
            yield ("ref", 0, None, None, None, None)
            continue
        step = step0 * 2.0 ** -planes[l]
        qn = np.floor(a / step).astype(np.int64)
        sig = q > 0
        low = qn[sig] - (q[sig] << m)
        newi = qn[~sig]
        became = newi > 0
        signs = neg[~sig][became].astype(np.uint8)
        yield ("ref", m, ~sig, newi, low, signs)
        q = qn


# ---------------------------------------------------------------------------------------------
# tables

def fit_tables(codec: str, params: dict[str, Any], shards: Sequence[ShardKV]) -> CodecTables:
    budgets = [float(b) for b in params["budgets"]]
    use_sens = params["allocate"] == "sensitivity" and all(s.sensitivity is not None for s in shards)
    plans = plan_parts(shards, budgets, params["transform"], use_sens)
    arrays: dict[str, np.ndarray] = {}
    for s in shards:
        T = s.shape[0]
        n = _grid(T, params["transform"])
        band = _bands(T, n)
        for kv in PARTS:
            p = plans[(s.layer, kv)]
            pre = f"L{s.layer}.{kv}"
            arrays[f"{pre}.mean"] = p.mean
            arrays[f"{pre}.plan"] = np.array([p.step0] + p.planes, np.float64)
            c = coefficients(as_f32_2d(s.key if kv == "k" else s.value), p.mean, n)
            for l, item in enumerate(rung_symbols(c, p.step0, p.planes)):
                if item[0] == "base":
                    m0 = max(1, int(np.abs(item[1]).max(initial=0)))
                    arrays[f"{pre}.e0"] = EQ.band_counts(item[1] + m0, band, 2 * m0 + 1) * np.uint32(EQ.COUNT_SCALE)
                elif item[1] > 0:
                    _, m, insig, newi, _low, _signs = item
                    rows = np.broadcast_to(band[:, None], insig.shape)[insig]
                    arrays[f"{pre}.e{l}"] = _counts_1d(newi, rows, int(band.max()) + 1, 1 << m) * np.uint32(EQ.COUNT_SCALE)
    return CodecTables(codec=codec, arrays=arrays, meta={"params": params})


def _counts_1d(sym: np.ndarray, rows: np.ndarray, nrows: int, A: int) -> np.ndarray:
    return np.bincount(rows.astype(np.int64) * A + sym, minlength=nrows * A).reshape(nrows, A).astype(np.uint32)


def _encode_rows(sym: np.ndarray, rows: np.ndarray, models: list) -> np.ndarray:
    """ANS over a 1-D symbol array whose symbol i uses models[rows[i]] (grouped by row, row 0 first)."""
    enc = E._constriction().stream.stack.AnsCoder()
    order = np.argsort(rows, kind="stable")
    s, r = sym[order], rows[order]
    cuts = np.searchsorted(r, np.arange(len(models) + 1))
    for b in range(len(models) - 1, -1, -1):
        part = np.ascontiguousarray(s[cuts[b]:cuts[b + 1]], dtype=np.int32)
        if part.size:
            enc.encode_reverse(part, models[b])
    return enc.get_compressed().astype("<u4")


def _decode_rows(words: np.ndarray, rows: np.ndarray, models: list) -> np.ndarray:
    out = np.empty(rows.size, np.int64)
    order = np.argsort(rows, kind="stable")
    r = rows[order]
    cuts = np.searchsorted(r, np.arange(len(models) + 1))
    try:
        dec = E._constriction().stream.stack.AnsCoder(np.ascontiguousarray(words, dtype=np.uint32))
        for b in range(len(models)):
            k = cuts[b + 1] - cuts[b]
            if k:
                out[order[cuts[b]:cuts[b + 1]]] = dec.decode(models[b], int(k))
    except (ValueError, RuntimeError, AssertionError) as e:
        raise bs.CorruptError(f"entropy-coded data does not decode: {e}") from None
    if not dec.is_empty():
        raise bs.CorruptError("entropy-coded data has leftover bits: wrong tables or corrupt object")
    return out


# ---------------------------------------------------------------------------------------------
# encode

def encode_levels(codec, shard: ShardKV, ident: ShardId, tables: CodecTables | None) -> list[bytes]:
    """One object per rung: [base, refinement 1, ...] (rung l = the first l+1 objects)."""
    shard.validate()
    p = codec.params
    T, H, D = shard.shape
    C = H * D
    n = _grid(T, p["transform"])
    band = _bands(T, n)
    nb = int(band.max()) + 1
    if tables is None:
        use_sens = p["allocate"] == "sensitivity" and shard.sensitivity is not None
        plans = plan_parts([shard], [float(b) for b in p["budgets"]], p["transform"], use_sens)
    else:
        plans = {}
        for kv in PARTS:
            pre = f"L{shard.layer}.{kv}"
            mu, plan = tables.get(f"{pre}.mean"), tables.get(f"{pre}.plan")
            if mu.shape != (C,) or plan.shape != (1 + len(p["budgets"]),):
                raise bs.IdentityError(f"codec tables for layer {shard.layer} do not fit this shard or ladder")
            plans[(shard.layer, kv)] = PartPlan(mu, float(plan[0]), [int(x) for x in plan[1:]])
    levels = len(p["budgets"])
    writers = [bs.Writer() for _ in range(levels)]
    info: dict[str, Any] = {}
    own: list[dict[str, bool]] = [{} for _ in range(levels)]
    for kv in PARTS:
        pl = plans[(shard.layer, kv)]
        pre = f"L{shard.layer}.{kv}"
        if tables is None:
            writers[0].add(f"{kv}_mean", pl.mean)
        c = coefficients(as_f32_2d(shard.key if kv == "k" else shard.value), pl.mean, n)
        for l, item in enumerate(rung_symbols(c, pl.step0, pl.planes)):
            w = writers[l]
            if item[0] == "base":
                q = item[1]
                m0 = max(1, int(np.abs(q).max(initial=0)))
                table = tables.arrays.get(f"{pre}.e0") if tables is not None else None
                if table is not None and table.shape[0] == nb and m0 <= (table.shape[1] - 1) // 2:
                    m0 = (table.shape[1] - 1) // 2
                    models = tables.cached(f"{pre}.e0", lambda t=table: E.make_models(t))
                    own[0][kv] = False
                else:
                    table = EQ.band_counts(q + m0, band, 2 * m0 + 1)
                    w.add(f"hist.{kv}", table, zstd_level=3)
                    models = E.make_models(table)
                    own[0][kv] = True
                w.add(f"ans.{kv}", EQ.ans_encode_bands((q + m0).astype(np.int32), band, models))
                info[kv] = {"step": pl.step0, "planes": pl.planes, "m0": m0, "grid": n}
                continue
            _, m, insig, newi, low, signs = item
            if m == 0:
                continue
            rows = np.broadcast_to(band[:, None], (T, C))[insig]
            name = f"{pre}.e{l}"
            table = tables.arrays.get(name) if tables is not None else None
            if table is not None and table.shape == (nb, 1 << m):
                models = tables.cached(name, lambda t=table: E.make_models(t))
                own[l][kv] = False
            else:
                table = _counts_1d(newi, rows, nb, 1 << m)
                w.add(f"hist.{kv}", table, zstd_level=3)
                models = E.make_models(table)
                own[l][kv] = True
            w.add(f"ans.{kv}", _encode_rows(newi, rows, models))
            w.add(f"low.{kv}", Q.pack(low, m) if low.size else np.zeros(0, np.uint8))
            w.add(f"sign.{kv}", np.packbits(signs) if signs.size else np.zeros(0, np.uint8))
    out: list[bytes] = []
    for l, w in enumerate(writers):
        extra: dict[str, Any] = {"level": l, "own": own[l]}
        if l == 0:
            h = codec._header(shard, ident, tables, levels=levels, prog=info, **extra)
            h["params"] = {k: p[k] for k in ("budgets", "quantiser", "transform", "allocate")}
            out.append(w.to_bytes(bs.KIND_SHARD, h, FORMAT_VERSION))
        else:
            h = codec._header(shard, ident, tables, parent_crc=zlib.crc32(out[-1]), **extra)
            for k in ("params", "layer", "num_layers"):
                h.pop(k, None)
            out.append(w.to_bytes(bs.KIND_LAYER, h, FORMAT_VERSION))
    return out


# ---------------------------------------------------------------------------------------------
# decode

@dataclass
class ProgressiveState:
    """Decoded magnitudes/signs of a shard at some rung; `upgrade` adds the next rung in place."""

    codec: Any
    ident: ShardId
    tables: CodecTables | None
    dtype: torch.dtype
    shape: tuple[int, int, int]
    header: dict[str, Any]
    level: int = -1
    last_crc: int = 0
    mag: dict[str, np.ndarray] = field(default_factory=dict)
    neg: dict[str, np.ndarray] = field(default_factory=dict)
    mean: dict[str, np.ndarray] = field(default_factory=dict)

    def _part(self, kv: str) -> tuple[float, list[int], int, int]:
        e = self.header["prog"][kv]
        return float(e["step"]), [int(x) for x in e["planes"]], int(e["m0"]), int(e["grid"])

    def _models(self, obj: bs.Object, kv: str, name: str, shape: tuple[int, int]):
        own = obj.header.get("own", {})
        if not isinstance(own, dict) or kv not in own:
            raise bs.CorruptError(f"{self.codec.name}: object does not say where the {kv} histogram is")
        if own[kv] or self.tables is None:
            table = obj.section(f"hist.{kv}")
        else:
            table = self.tables.get(name)
        if table.shape != shape:
            raise bs.CorruptError(f"{self.codec.name}: histogram {name} has shape {table.shape}, expected {shape}")
        if own[kv] or self.tables is None:
            return E.make_models(table)
        return self.tables.cached(name, lambda t=table: E.make_models(t))

    def start(self, obj: bs.Object, crc: int) -> None:
        T, H, D = self.shape
        C = H * D
        prog = self.header.get("prog")
        if not isinstance(prog, dict) or set(prog) != set(PARTS):
            raise bs.CorruptError(f"{self.codec.name}: progressive header missing")
        levels = self.header.get("levels")
        for kv in PARTS:
            try:
                step, planes, m0, n = self._part(kv)
            except (KeyError, TypeError, ValueError):
                raise bs.CorruptError(f"{self.codec.name}: bad progressive header {prog.get(kv)!r}") from None
            if (not (math.isfinite(step) and step > 0) or not 1 <= m0 <= 1 << 16 or len(planes) != levels
                    or planes[0] != 0 or any(b < a for a, b in zip(planes, planes[1:])) or planes[-1] > MAX_PLANES
                    or not (n == 0 or n * n == T)):
                raise bs.CorruptError(f"{self.codec.name}: bad progressive header {prog[kv]!r}")
            band = _bands(T, n)
            mu = self.tables.get(f"L{self.header.get('layer', 0)}.{kv}.mean") if self.tables is not None \
                else obj.section(f"{kv}_mean")
            if mu.shape != (C,) or mu.dtype.kind != "f":
                raise bs.CorruptError(f"{self.codec.name}: {kv} mean has shape {mu.shape}")
            self.mean[kv] = mu
            models = self._models(obj, kv, f"L{self.header.get('layer', 0)}.{kv}.e0", (int(band.max()) + 1, 2 * m0 + 1))
            q = EQ.ans_decode_bands(obj.section(f"ans.{kv}"), band, models, C).astype(np.int64) - m0
            self.neg[kv] = q < 0
            self.mag[kv] = np.abs(q)
        self.level, self.last_crc = 0, crc

    def upgrade(self, piece: bytes) -> "ProgressiveState":
        """Apply the next rung's object (in place; returns self). Mismatches raise `IdentityError`."""
        obj, dtype, shape = self.codec._open(piece, self.ident, self.tables, kind=bs.KIND_LAYER)
        h = obj.header
        if shape != self.shape or h.get("level") != self.level + 1:
            raise bs.IdentityError(f"refinement object is level {h.get('level')!r} of shape {shape}; "
                                   f"expected level {self.level + 1} of shape {self.shape}")
        if h.get("parent_crc") != self.last_crc:
            raise bs.IdentityError("refinement object does not refine this base (parent checksum differs)")
        l = self.level + 1
        T, H, D = self.shape
        C = H * D
        layer = int(self.header.get("layer", 0))
        for kv in PARTS:
            step, planes, _m0, n = self._part(kv)
            m = planes[l] - planes[l - 1]
            if m == 0:
                continue
            band = _bands(T, n)
            mag, neg = self.mag[kv], self.neg[kv]
            sig = mag > 0
            insig = ~sig
            rows = np.broadcast_to(band[:, None], (T, C))[insig]
            models = self._models(obj, kv, f"L{layer}.{kv}.e{l}", (int(band.max()) + 1, 1 << m))
            newi = _decode_rows(obj.section(f"ans.{kv}"), rows, models)
            if newi.size and (newi.min() < 0 or newi.max() >= 1 << m):
                raise bs.CorruptError(f"{self.codec.name}: refinement symbols out of range")
            nsig = int(sig.sum())
            raw = obj.section(f"low.{kv}")
            if raw.dtype != np.uint8 or raw.size * 8 < nsig * m:
                raise bs.CorruptError(f"refinement bits {kv} too short")
            low = Q.unpack(raw, m, nsig).astype(np.int64) if nsig else np.zeros(0, np.int64)
            became = newi > 0
            sraw = obj.section(f"sign.{kv}")
            nb = int(became.sum())
            if sraw.dtype != np.uint8 or sraw.size * 8 < nb:
                raise bs.CorruptError(f"sign bits {kv} too short")
            signs = np.unpackbits(sraw, count=nb).astype(bool) if nb else np.zeros(0, bool)
            new_mag = mag << m
            new_mag[sig] += low
            new_mag[insig] = newi
            nneg = neg.copy()
            sub = np.zeros(newi.size, bool)
            sub[became] = signs
            nneg[insig] = sub
            self.mag[kv], self.neg[kv] = new_mag, nneg
        self.level, self.last_crc = l, zlib.crc32(piece)
        return self

    def result(self) -> DecodedShard:
        T, H, D = self.shape
        out = []
        for kv in PARTS:
            step, planes, _m0, n = self._part(kv)
            st = step * 2.0 ** -planes[self.level]
            mag = self.mag[kv]
            c = np.where(mag > 0, (mag + 0.5) * st, 0.0)
            c = np.where(self.neg[kv], -c, c)
            x = EQ.inverse(c, n) if n else c.astype(np.float32)
            x += self.mean[kv].astype(np.float32)[None, :]
            out.append(from_f32_2d(x, self.shape, self.dtype))
        return DecodedShard(out[0], out[1], torch.ones(T, dtype=torch.bool))


def start_state(codec, obj: bs.Object, piece: bytes, ident: ShardId, tables: CodecTables | None, dtype,
                shape) -> ProgressiveState:
    st = ProgressiveState(codec=codec, ident=ident, tables=tables, dtype=dtype, shape=shape, header=obj.header)
    st.start(obj, zlib.crc32(piece))
    return st
