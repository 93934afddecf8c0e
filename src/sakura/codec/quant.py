"""The embedded (nested) uniform quantiser shared by `uniform`, `sakura` and `layered`.

Each scale group g has a lower edge lo_g and a range r_g (stored in fp16, or fp32 when values
exceed fp16 range; lo rounded down and r rounded up so every value lies in [lo, lo + r]).
A value x with u = (x - lo) / r in [0, 1] gets, at b bits, the index

    idx_b = min(floor(u * 2^b), 2^b - 1)        reconstruction  lo + (idx_b + 1/2) * r / 2^b

so |x - x^| <= r / 2^(b+1), and the indices are *nested*: idx_(b+m) >> m == idx_b exactly (the
products u*2^b are exact in float32). That nesting is what lets a refinement layer add m bits to a
token without resending its first b bits. b = 0 means the token is dropped.

Scale groups:
    keys   ("key" mode):   per channel, over groups of `group` consecutive tokens (KIVI-style;
                           outlier channels get their own range); group=0 means all tokens.
    values ("value" mode): per token, over groups of `group` consecutive channels (group=0: all).
A last partial group (when the group size does not divide the count) is padded by edge values.

"""

from __future__ import annotations

import numpy as np

F16_MAX = 60000.0


def n_groups(n: int, group: int) -> int:
    """Number of scale groups along an axis of length n."""
    g = n if group <= 0 else min(group, n)
    return -(-n // g)


def scale_dtype(x: np.ndarray) -> np.dtype:
    """fp16 scales when |x| fits comfortably, else fp32."""
    return np.dtype("<f2") if float(np.abs(x).max(initial=0.0)) < F16_MAX else np.dtype("<f4")


def round_down(a: np.ndarray, dt: np.dtype) -> np.ndarray:
    y = a.astype(dt)
    bad = y.astype(np.float64) > a
    if bad.any():
        y[bad] = np.nextafter(y[bad], dt.type(-np.inf))
    return y


def round_up(a: np.ndarray, dt: np.dtype) -> np.ndarray:
    y = a.astype(dt)
    bad = y.astype(np.float64) < a
    if bad.any():
        y[bad] = np.nextafter(y[bad], dt.type(np.inf))
    return y


def _group_view(x: np.ndarray, mode: str, group: int) -> tuple[np.ndarray, int]:
    """(T, C) -> grouped 3-D array and the token padding added (key mode pads by edge rows)."""
    T, C = x.shape
    if mode == "key":
        g = T if group <= 0 else min(group, T)
        pad = (-T) % g
        if pad:
            x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)], axis=0)
        return x.reshape(-1, g, C), pad  # (T/g, g, C): reduce axis 1
    g = C if group <= 0 else min(group, C)
    pad = (-C) % g
    if pad:
        x = np.concatenate([x, np.repeat(x[:, -1:], pad, axis=1)], axis=1)
    return x.reshape(T, -1, g), 0  # (T, C/g, g): reduce axis 2


def fit_scales(x: np.ndarray, mode: str, group: int, sdt: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Per-group (lo, r) in dtype `sdt`, directed-rounded so [lo, lo + r] covers the group.

    Returns key mode: (ceil(T/g), C) each; value mode: (T, C/g) each.
    """
    xg, _ = _group_view(x, mode, group)
    ax = 1 if mode == "key" else 2
    lo = round_down(xg.min(axis=ax).astype(np.float64), sdt)
    hi = xg.max(axis=ax).astype(np.float64)
    r = round_up(np.maximum(hi - lo.astype(np.float64), 0.0), sdt)
    return lo, r


def expand(s: np.ndarray, mode: str, group: int, T: int, C: int) -> np.ndarray:
    """Broadcast per-group scales back to (T, C) float32."""
    s = s.astype(np.float32)
    if mode == "key":
        g = T if group <= 0 else min(group, T)
        return np.repeat(s, g, axis=0)[:T]
    g = C if group <= 0 else min(group, C)
    return np.repeat(s, g, axis=1)[:, :C]


def unit(x: np.ndarray, lo: np.ndarray, r: np.ndarray) -> np.ndarray:
    """u = clip((x - lo) / r, 0, 1) with r == 0 -> 0; all (T, C) float32."""
    with np.errstate(divide="ignore", invalid="ignore"):
        u = (x - lo) / r
    u[~np.isfinite(u)] = 0.0
    return np.clip(u, 0.0, 1.0, out=u)


def indices(u: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """idx (T, C) int32 at per-token `bits` (T,) (0 bits -> 0)."""
    levels = np.exp2(bits.astype(np.float32))[:, None]  # (T, 1)
    return np.minimum(np.floor(u * levels), levels - 1).astype(np.int32)


def reconstruct(idx: np.ndarray, bits: np.ndarray, lo: np.ndarray, r: np.ndarray) -> np.ndarray:
    """lo + (idx + 1/2) * r / 2^bits, (T, C) float32."""
    inv = np.exp2(-bits.astype(np.float32))[:, None]  # (T, 1)
    out = idx.astype(np.float32)
    out += 0.5
    out *= inv
    out *= r
    out += lo
    return out


# -- fixed-width bit packing (uniform codec) ----------------------------------------------------

def pack(sym: np.ndarray, bits: int) -> np.ndarray:
    """Pack non-negative ints < 2^bits into bytes (little-endian within a byte)."""
    flat = sym.reshape(-1).astype(np.uint8 if bits <= 8 else np.uint16)
    if bits == 8:
        return flat.astype(np.uint8)
    if bits in (1, 2, 4):
        per = 8 // bits
        pad = (-flat.size) % per
        f = np.concatenate([flat, np.zeros(pad, np.uint8)]).reshape(-1, per).astype(np.uint8)
        out = np.zeros(f.shape[0], np.uint8)
        for j in range(per):
            out |= f[:, j] << np.uint8(j * bits)
        return out
    bitsarr = ((flat[:, None] >> np.arange(bits, dtype=np.uint8)) & 1).astype(np.uint8)  # (n, bits)
    return np.packbits(bitsarr.reshape(-1), bitorder="little")


def unpack(buf: np.ndarray, bits: int, n: int) -> np.ndarray:
    """Inverse of `pack`: n ints as int32."""
    if bits == 8:
        return buf[:n].astype(np.int32)
    if bits in (1, 2, 4):
        per = 8 // bits
        mask = np.uint8((1 << bits) - 1)
        out = np.empty((buf.size, per), np.uint8)
        for j in range(per):
            out[:, j] = (buf >> np.uint8(j * bits)) & mask
        return out.reshape(-1)[:n].astype(np.int32)
    b = np.unpackbits(buf, bitorder="little")[: n * bits].reshape(n, bits).astype(np.int32)
    return (b << np.arange(bits, dtype=np.int32)).sum(axis=1, dtype=np.int32)
