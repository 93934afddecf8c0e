"""The ECSQ (+ token-grid DCT) coder of one `sakura:quantiser="ecsq"` rendition (maths in `ecsq`).

Per (layer, K/V) part: mean removal, one step per part chosen by `allocation.allocate_steps`
(sensitivity-weighted), importance-planned per-token steps (no transform) or the 2-D DCT over the
token grid (all tokens, one step), ANS with per-channel or per-band histograms shared per template.
Objects are format version 2 (header `ecsq`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch

from .. import bitstream as bs
from .. import ecsq as EQ
from .. import entropy as E
from ..base import finite, CodecTables, LayerKV, ShardKV, ShardId, as_f32_2d, from_f32_2d

if TYPE_CHECKING:  # the `sakura` codec dispatches here; the analysis (`ladder.analyse`) comes in from the caller
    from . import ladder as N


def ecsq_plan(codec, shards: Sequence[ShardKV], analyses: list[N.NestedAnalysis]) -> dict[tuple[int, str], tuple]:
    """Per (layer, K/V): (mean, step, floor, nominal) at `budget` entropy-coded bits per value."""
    use_sens = codec.params["allocate"] == "sensitivity" and all(s.sensitivity is not None for s in shards)
    points, sens, parts = {}, {}, {}
    budget = float(codec.params["budget"]) * sum(s.num_values for s in shards)
    for shard, an in zip(shards, analyses):
        nominal = EQ.REF_BITS
        n = grid_of(codec, shard)
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


def grid_of(codec, shard: ShardKV) -> int:
    """Side of the token grid the dct transform runs over (0: no transform)."""
    return EQ.grid_side(shard.shape[0]) if codec.params["transform"] == "dct" else 0


def ecsq_symbols(codec, shard: ShardKV, an: N.NestedAnalysis, plan: tuple, kv: str):
    mu, step, floor, nominal = plan
    bits = ecsq_bits(codec, shard, an)
    keep = bits > 0
    x = as_f32_2d(shard.key if kv == "k" else shard.value)
    st = EQ.token_steps(step, floor, bits, nominal)
    n = grid_of(codec, shard)
    if n:  # all tokens kept, one step: quantise the grid's DCT coefficients
        coef = EQ.forward(x.astype(np.float64) - mu.astype(np.float64)[None, :], n)
        return np.rint(coef / np.float64(st[0])).astype(np.int32)
    return EQ.symbols(x[keep], mu, st[keep])


def ecsq_bits(codec, shard: ShardKV, an: N.NestedAnalysis) -> np.ndarray:
    if grid_of(codec, shard):
        return np.full(shard.shape[0], EQ.REF_BITS, np.int32)
    return an.bits[0]


def ecsq_tables(codec, shards: Sequence[ShardKV], analyses: list[N.NestedAnalysis]) -> CodecTables:
    plan = ecsq_plan(codec, shards, analyses)
    arrays: dict[str, np.ndarray] = {}
    for shard, an in zip(shards, analyses):
        for kv in ("k", "v"):
            pl = plan[(shard.layer, kv)]
            sym = ecsq_symbols(codec, shard, an, pl, kv)
            m = max(1, int(np.abs(sym).max(initial=0)))  # >= 3 symbols: ANS needs two
            A = 2 * m + 1
            arrays[f"L{shard.layer}.{kv}.mean"] = pl[0]
            arrays[f"L{shard.layer}.{kv}.q"] = np.array([pl[1], pl[2], pl[3]], np.float64)
            # counts x COUNT_SCALE: the +1 smoothing of the ANS models then costs 1/COUNT_SCALE as
            # much (64 tokens per channel against up to 33 symbols: +1 alone cost ~10-20% of bytes)
            arrays[f"L{shard.layer}.{kv}.e"] = E.pack_counts(ecsq_counts(codec, shard, sym + m, A))
    return CodecTables(codec=codec.name, arrays=arrays, meta={"params": codec.params})


def ecsq_counts(codec, shard: ShardKV, sym: np.ndarray, A: int) -> np.ndarray:
    n = grid_of(codec, shard)
    if n:
        return EQ.band_counts(sym, EQ.bands(n), A)
    return E.counts(sym, A, per_channel=A <= EQ.PER_CHANNEL_MAX_ALPHABET)


def encode(codec, shard: ShardKV, an: N.NestedAnalysis, ident: ShardId, tables: CodecTables | None) -> bytes:
    """One shard's object; `an` is `nested.analyse(codec, shard)`."""
    T, H, D = shard.shape
    w = bs.Writer()
    n = grid_of(codec, shard)
    w.add("bits", ecsq_bits(codec, shard, an).astype(np.uint8), zstd_level=3)
    plan = None if tables is not None else ecsq_plan(codec, [shard], [an])
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
        sym = ecsq_symbols(codec, shard, an, pl, kv)
        m = max(1, int(np.abs(sym).max(initial=0)))
        models, own = None, True
        if tables is not None:
            tname = f"L{shard.layer}.{kv}.e"
            table = tables.get(tname)
            rows_ok = table.shape[0] == 2 * n - 1 if n else table.shape[0] in (1, H * D)
            if m <= (table.shape[1] - 1) // 2 and rows_ok:
                m = (table.shape[1] - 1) // 2
                models, own = tables.cached(tname, lambda t=table: E.table_models(t, EQ.COUNT_SCALE)), False
        if models is None:  # no tables, or symbols beyond the table's alphabet: carry a histogram
            if m > 1 << 16:
                raise bs.CodecError(f"{codec.name}: ecsq symbols up to {m}; tables do not fit this shard")
            A = 2 * m + 1
            table = ecsq_counts(codec, shard, sym + m, A)
            w.add(f"hist.{kv}", table, zstd_level=3)
            models = E.make_models(table)
        if n:
            w.add(f"ans.{kv}", EQ.ans_encode_bands(sym + m, EQ.bands(n), models))
        else:
            w.add(f"ans.{kv}", E.encode(sym + m, models))
        info[kv] = [float(pl[1]), float(pl[2]), int(pl[3]), m, own, n]
    h = codec._header(shard, ident, tables, level=0, levels=1, ecsq=info)
    # only what decoding needs (the object is small: the full parameter set was ~1/4 of it)
    h["params"] = {"budget": codec.params["budget"], "quantiser": "ecsq", "transform": codec.params["transform"]}
    return w.to_bytes(bs.KIND_SHARD, h, 2)


def decode(codec, obj: bs.Object, dtype, shape, tables: CodecTables | None) -> LayerKV:
    h = obj.header
    T, H, D = shape
    C = H * D
    layer = int(h.get("layer", 0))
    bits = obj.section("bits").astype(np.int32)
    if bits.shape != (T,) or (bits > 8).any():
        raise bs.CorruptError(f"{codec.name}: bit widths malformed")
    keep = bits > 0
    info = h.get("ecsq")
    if not isinstance(info, dict):
        raise bs.CorruptError(f"{codec.name}: ecsq header missing")
    out = []
    for kv in ("k", "v"):
        e = info.get(kv)
        try:
            step, floor, nominal, m, own = float(e[0]), float(e[1]), int(e[2]), int(e[3]), bool(e[4])
            n = int(e[5]) if len(e) > 5 else 0
        except (TypeError, ValueError, IndexError, KeyError):
            raise bs.CorruptError(f"{codec.name}: bad ecsq header {e!r}") from None
        if not (np.isfinite(step) and step > 0 and np.isfinite(floor) and floor > 0 and 1 <= nominal <= 8
                and 1 <= m <= 1 << 16 and (n == 0 or (n * n == T and bool(keep.all())))):
            raise bs.CorruptError(f"{codec.name}: bad ecsq header {e!r}")
        if tables is not None:
            mu = tables.get(f"L{layer}.{kv}.mean")
        else:
            mu = obj.section(f"{kv}_mean")
        if mu.shape != (C,) or mu.dtype.kind != "f":
            raise bs.CorruptError(f"{codec.name}: {kv} mean has shape {mu.shape}")
        rows = (2 * n - 1,) if n else (1, C)
        if own or tables is None:
            table = obj.section(f"hist.{kv}")
            if table.ndim != 2 or table.shape[1] != 2 * m + 1 or table.shape[0] not in rows:
                raise bs.CorruptError(f"{codec.name}: histogram {kv} has shape {table.shape}")
            models = E.make_models(table)
        else:
            tname = f"L{layer}.{kv}.e"
            table = tables.get(tname)
            if table.ndim != 2 or table.shape[1] != 2 * m + 1 or table.shape[0] not in rows:
                raise bs.CorruptError(f"{codec.name}: table {tname} does not match the object")
            models = tables.cached(tname, lambda t=table: E.table_models(t, EQ.COUNT_SCALE))
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
    return finite(LayerKV(out[0], out[1], torch.from_numpy(keep.copy())), codec.name)
