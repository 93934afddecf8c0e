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
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from . import bitstream as bs
from . import entropy as E
from . import quant as Q
from .base import (Codec, CodecTables, DecodedShard, ShardKV, ShardId, as_f32_2d, check_params, from_f32_2d,
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


@register
class CacheGenCodec(Codec):
    name = "cachegen"
    uses_tables = True

    def __init__(self, **params: Any) -> None:
        p = check_params(params, {"level": 3}, self.name)
        if p["level"] not in LEVELS:
            raise ValueError(f"cachegen: level must be one of {sorted(LEVELS)}, got {p['level']!r}")
        super().__init__(**p)

    def _symbols(self, shard: ShardKV):
        shard.validate()
        kb, vb = layer_bins(self.params["level"], shard.layer, shard.num_layers)
        x = {"k": as_f32_2d(shard.key), "v": as_f32_2d(shard.value)}
        sdt = Q.scale_dtype(np.array([np.abs(x["k"]).max(), np.abs(x["v"]).max()]))
        out = {}
        for kv, bins in (("k", kb), ("v", vb)):
            out[kv] = (*_quantise(x[kv], bins, sdt), bins)
        return out, sdt

    def fit_tables(self, shards: Sequence[ShardKV]) -> CodecTables:
        """Symbol counts per (layer, channel) for K and V over all of a template's shards."""
        arrays: dict[str, np.ndarray] = {}
        for shard in shards:
            syms, _ = self._symbols(shard)
            for kv, (sym, _amax, bins) in syms.items():
                name = f"L{shard.layer}.{kv}.b{bins}"
                cnt = E.counts(sym, bins - 1, per_channel=True)
                arrays[name] = arrays[name] + cnt if name in arrays else cnt
        return CodecTables(codec=self.name, arrays=arrays, meta={"params": self.params})

    def encode(self, shard: ShardKV, ident: ShardId, tables: CodecTables | None = None) -> bytes:
        syms, sdt = self._symbols(shard)
        w = bs.Writer()
        for kv, (sym, amax, bins) in syms.items():
            w.add(f"{kv}_amax", amax)
            tname = f"L{shard.layer}.{kv}.b{bins}"
            if tables is not None:
                table = tables.get(tname)
                models = tables.cached(tname, lambda t=table: E.make_models(t))
            else:
                table = E.counts(sym, bins - 1, per_channel=True)
                w.add(f"hist.{kv}", table, zstd_level=3)
                models = E.make_models(table)
            if len(models) != sym.shape[1]:
                raise bs.IdentityError(f"codec table {tname} has {len(models)} channels, shard has {sym.shape[1]}")
            w.add(f"ans.{kv}", E.encode(sym, models))
        kb, vb = syms["k"][2], syms["v"][2]
        return w.to_bytes(bs.KIND_SHARD, self._header(shard, ident, tables, key_bins=kb, value_bins=vb,
                                                      scale_dtype=sdt.str))

    def decode(self, data: bytes, ident: ShardId, tables: CodecTables | None = None) -> DecodedShard:
        obj, dtype, shape = self._open(data, ident, tables)
        h = obj.header
        T, H, D = shape
        C = H * D
        layer = int(h.get("layer", 0))
        out = []
        for kv, bins in (("k", h.get("key_bins")), ("v", h.get("value_bins"))):
            if not isinstance(bins, int) or not 4 <= bins <= 256:
                raise bs.CorruptError(f"cachegen: bad bins {bins!r}")
            mx = bins // 2 - 1
            amax = obj.section(f"{kv}_amax")
            if amax.shape != (T,):
                raise bs.CorruptError(f"cachegen: {kv}_amax has shape {amax.shape}, expected ({T},)")
            if tables is not None:
                tname = f"L{layer}.{kv}.b{bins}"
                table = tables.get(tname)
                models = tables.cached(tname, lambda t=table: E.make_models(t))
            else:
                table = obj.section(f"hist.{kv}")
                if table.shape != (C, bins - 1):
                    raise bs.CorruptError(f"cachegen: histogram {kv} has shape {table.shape}")
                models = E.make_models(table)
            sym = E.decode(obj.section(f"ans.{kv}"), models, T, C)
            x = (sym - mx).astype(np.float32)
            x *= (amax.astype(np.float32) / np.float32(mx))[:, None]
            out.append(from_f32_2d(x, shape, dtype))
        return DecodedShard(out[0], out[1], torch.ones(T, dtype=torch.bool))
