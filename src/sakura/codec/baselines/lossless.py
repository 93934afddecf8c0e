"""`lossless`: keys and values exactly as stored (fp32/fp16/bf16 bit patterns); decode is bit-exact.

Option `zstd=true` splits each value's bytes into planes (high bytes together, low bytes
together) and compresses them with zstd: still bit-exact, typically 10-20% smaller for fp16/bf16
because exponent bytes repeat.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .. import bitstream as bs
from .. import native as NV
from ..base import finite, Codec, CodecTables, LayerKV, ShardKV, ShardId, check_params, register

_INT_VIEW = {torch.float32: (torch.int32, "<u4"), torch.float16: (torch.int16, "<u2"),
             torch.bfloat16: (torch.int16, "<u2")}


def _bits(t: torch.Tensor) -> np.ndarray:
    iv, np_dt = _INT_VIEW[t.dtype]
    return t.detach().contiguous().view(iv).numpy().view(np_dt.replace("<", "=")).astype(np_dt, copy=False)


@register
class LosslessCodec(Codec):
    name = "lossless"

    def __init__(self, **params: Any) -> None:
        p = check_params(params, {"zstd": False}, self.name)
        if not isinstance(p["zstd"], bool):
            raise ValueError("lossless: zstd must be true/false")
        super().__init__(**p)

    def encode(self, shard: ShardKV, ident: ShardId, tables: CodecTables | None = None) -> bytes:
        shard.validate()
        w = bs.Writer()
        for name, t in (("key", shard.key), ("value", shard.value)):
            a = _bits(t).reshape(-1)
            if self.params["zstd"]:
                planes = a.view(np.uint8).reshape(-1, a.dtype.itemsize).T.copy()  # (bytes, n): byte planes
                w.add(name, planes, zstd_level=3)
            else:
                w.add(name, a)
        return w.to_bytes(bs.KIND_SHARD, self._header(shard, ident, None))

    def decode(self, data: bytes, ident: ShardId, tables: CodecTables | None = None,
               parsed: bs.Object | None = None) -> LayerKV:
        obj, dtype, shape = self._open(data, ident, None, parsed=parsed)  # parsed: see `decode_any`
        iv, np_dt = _INT_VIEW[dtype]
        n = shape[0] * shape[1] * shape[2]
        out = []
        planes = bool(obj.header["params"].get("zstd"))
        if dtype == torch.float16 and NV.available():   # the native decoder (libsakura_decode)
            out = []
            for name in ("key", "value"):
                a = obj.section(name)
                if a.shape != ((2, n) if planes else (n,)) or a.dtype != np.dtype("|u1" if planes else "<u2"):
                    raise bs.CorruptError(f"lossless: section {name} has shape {a.shape} and dtype {a.dtype}")
                out.append(NV.lossless_f16(a, n, planes).reshape(shape))
            return LayerKV(out[0], out[1], torch.ones(shape[0], dtype=torch.bool))
        for name in ("key", "value"):
            a = obj.section(name)
            if obj.header["params"].get("zstd"):
                if a.shape != (np.dtype(np_dt).itemsize, n):
                    raise bs.CorruptError(f"lossless: section {name} has shape {a.shape}")
                a = np.ascontiguousarray(a.T).view(np_dt).reshape(-1)
            if a.size != n or a.dtype != np.dtype(np_dt):
                raise bs.CorruptError(f"lossless: section {name} holds {a.size} {a.dtype} values, expected {n} {np_dt}")
            t = torch.from_numpy(a.astype(np_dt.replace("<", "="), copy=False).view(
                np.int32 if iv == torch.int32 else np.int16).copy()).view(dtype).reshape(shape)
            out.append(t)
        return finite(LayerKV(out[0], out[1], torch.ones(shape[0], dtype=torch.bool)), self.name)
