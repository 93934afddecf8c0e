"""`uniform`: fixed-width int quantisation, keys per channel and values per token, small groups.

bits in 1..8 (int8 and int4 are the usual settings); key_group tokens share a per-channel range,
value_group channels share a per-token range (both 32 by default, as in KIVI). Indices are bit
packed, no entropy coding; every token is kept. Error bound: |x - x^| <= r / 2^(bits+1) per group
range r (see `quant`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .. import bitstream as bs
from .. import quant as Q
from ..base import finite, Codec, CodecTables, LayerKV, ShardKV, ShardId, as_f32_2d, check_params, from_f32_2d, register


def _check_int(p: dict[str, Any], name: str, lo: int, hi: int, codec: str) -> None:
    v = p[name]
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ValueError(f"{codec}: {name} must be an int in [{lo}, {hi}], got {v!r}")


@register
class UniformCodec(Codec):
    name = "uniform"

    def __init__(self, **params: Any) -> None:
        p = check_params(params, {"bits": 8, "key_group": 32, "value_group": 32}, self.name)
        _check_int(p, "bits", 1, 8, self.name)
        _check_int(p, "key_group", 0, 1 << 20, self.name)
        _check_int(p, "value_group", 0, 1 << 20, self.name)
        super().__init__(**p)

    def encode(self, shard: ShardKV, ident: ShardId, tables: CodecTables | None = None) -> bytes:
        shard.validate()
        T, H, D = shard.shape
        b = self.params["bits"]
        w = bs.Writer()
        x_all = {"k": as_f32_2d(shard.key), "v": as_f32_2d(shard.value)}
        sdt = Q.scale_dtype(np.stack([np.abs(x_all["k"]).max(), np.abs(x_all["v"]).max()]))
        bits = np.full(T, b, np.int32)
        for kv, mode, group in (("k", "key", self.params["key_group"]), ("v", "value", self.params["value_group"])):
            x = x_all[kv]
            lo, r = Q.fit_scales(x, mode, group, sdt)
            u = Q.unit(x, Q.expand(lo, mode, group, T, H * D), Q.expand(r, mode, group, T, H * D))
            w.add(f"{kv}_lo", lo)
            w.add(f"{kv}_r", r)
            w.add(f"{kv}_sym", Q.pack(Q.indices(u, bits), b))
        return w.to_bytes(bs.KIND_SHARD, self._header(shard, ident, None, scale_dtype=sdt.str))

    def decode(self, data: bytes, ident: ShardId, tables: CodecTables | None = None,
               parsed: bs.Object | None = None) -> LayerKV:
        obj, dtype, shape = self._open(data, ident, None, parsed=parsed)  # parsed: see `decode_any`
        p = obj.header["params"]
        try:
            b, kg, vg = int(p["bits"]), int(p["key_group"]), int(p["value_group"])
        except (KeyError, TypeError, ValueError):
            raise bs.CorruptError(f"uniform: bad params {p!r}") from None
        if not 1 <= b <= 8:
            raise bs.CorruptError(f"uniform: bits={b} out of range")
        T, H, D = shape
        C = H * D
        bits = np.full(T, b, np.int32)
        out = []
        for kv, mode, group in (("k", "key", kg), ("v", "value", vg)):
            lo, r = obj.section(f"{kv}_lo"), obj.section(f"{kv}_r")
            want = (Q.n_groups(T, group), C) if mode == "key" else (T, Q.n_groups(C, group))
            if lo.shape != want or r.shape != want:
                raise bs.CorruptError(f"uniform: {kv} scales have shape {lo.shape}, expected {want}")
            sym = obj.section(f"{kv}_sym")
            if sym.size * 8 < T * C * b:
                raise bs.CorruptError(f"uniform: {kv} symbols too short")
            idx = Q.unpack(sym, b, T * C).reshape(T, C)
            x = Q.reconstruct(idx, bits, Q.expand(lo, mode, group, T, C), Q.expand(r, mode, group, T, C))
            out.append(from_f32_2d(x, shape, dtype))
        return finite(LayerKV(out[0], out[1], torch.ones(T, dtype=torch.bool)), self.name)
