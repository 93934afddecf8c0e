"""Entropy coding of quantisation indices with `constriction` (ANS, fixed categorical models).

Symbols of one group come as an (n, C) int array over alphabet [0, A). A table is either per
channel, shape (C, A), or pooled, shape (1, A), of symbol *counts*; models use Laplace-smoothed
counts so any symbol stays encodable even with tables fitted on other data. Columns are coded one
channel at a time (one fixed model per channel: ~70-100 M symbols/s decode on one core here).
"""

from __future__ import annotations

import numpy as np
import torch
import constriction

from .bitstream import CorruptError


def _transpose(a: np.ndarray) -> np.ndarray:
    """Contiguous transpose of a 2-D int32 array (torch's blocked kernel: ~4x numpy's here)."""
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).t().contiguous().numpy()


def _constriction():
    return constriction


def counts(sym: np.ndarray, alphabet: int, per_channel: bool) -> np.ndarray:
    """Histogram of an (n, C) symbol array: (C, A) per channel or (1, A) pooled, uint32."""
    n, C = sym.shape
    if not per_channel:
        return np.bincount(sym.reshape(-1), minlength=alphabet).astype(np.uint32)[None, :]
    offs = sym + (np.arange(C, dtype=np.int64) * alphabet)[None, :]
    return np.bincount(offs.reshape(-1), minlength=C * alphabet).reshape(C, alphabet).astype(np.uint32)


def make_models(table: np.ndarray) -> list:
    """One constriction Categorical per row of a (rows, A) counts table."""
    c = _constriction()
    p = table.astype(np.float64) + 1.0
    p /= p.sum(axis=1, keepdims=True)
    return [c.stream.model.Categorical(row, perfect=False) for row in p]


def encode(sym: np.ndarray, models: list) -> np.ndarray:
    """ANS-encode (n, C) symbols with per-channel (len C) or pooled (len 1) models -> uint32 words."""
    c = _constriction()
    n, C = sym.shape
    enc = c.stream.stack.AnsCoder()
    if len(models) == 1:
        enc.encode_reverse(np.ascontiguousarray(sym, dtype=np.int32).reshape(-1), models[0])
    else:
        if len(models) != C:
            raise ValueError(f"{len(models)} models for {C} channels")
        cols = _transpose(sym)  # (C, n)
        for ch in range(C - 1, -1, -1):
            enc.encode_reverse(cols[ch], models[ch])
    return enc.get_compressed().astype("<u4")


def decode(words: np.ndarray, models: list, n: int, C: int) -> np.ndarray:
    """Inverse of `encode`: (n, C) int32. Raises `CorruptError` if the stream does not fit."""
    c = _constriction()
    try:
        dec = c.stream.stack.AnsCoder(np.ascontiguousarray(words, dtype=np.uint32))
        if len(models) == 1:
            out = dec.decode(models[0], n * C).reshape(n, C)
        else:
            if len(models) != C:
                raise CorruptError(f"table has {len(models)} channels, data has {C}")
            out = np.empty((C, n), np.int32)
            for ch in range(C):
                out[ch] = dec.decode(models[ch], n)
            out = _transpose(out)  # (n, C)
    except (ValueError, RuntimeError, AssertionError) as e:
        raise CorruptError(f"entropy-coded data does not decode: {e}") from None
    if not dec.is_empty():
        raise CorruptError("entropy-coded data has leftover bits: wrong tables or corrupt object")
    return np.ascontiguousarray(out, dtype=np.int32)


def pack_counts(cnt: np.ndarray) -> np.ndarray:
    """Counts -> uint8 log-counts round(8 log2(1 + n)) (~9% precision: costs <1% of the coded bytes;
    tables shrink 2-4x against uint32 counts)."""
    return np.minimum(np.round(8.0 * np.log2(1.0 + cnt.astype(np.float64))), 255).astype(np.uint8)


def table_models(table: np.ndarray, count_scale: float = 16.0) -> list:
    """Models of a stored table: uint8 tables hold log-counts (`pack_counts`), scaled by
    `count_scale` so the models' +1 smoothing is small; other integer tables hold counts."""
    if table.dtype == np.uint8:
        return make_models((np.exp2(table.astype(np.float64) / 8.0) - 1.0) * count_scale)
    return make_models(table)
