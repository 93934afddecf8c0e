"""The generator of `_lee.py`, the fast inverse DCT's straight-line code (see `fastdct`): Lee's
(1984) recursive factorisation of the orthonormal DCT-III unrolled per power-of-two size, and the
fused 2-D kernels' source around it.

Its own module, apart from `fastdct` (which imports the generated `_lee` at module top), so that
it runs whatever state `_lee.py` is in: ``python -m sakura.codec.progressive.lee_gen`` rewrites it
(a test checks it is up to date); should `_lee.py` not import at all, ``python
src/sakura/codec/progressive/lee_gen.py`` runs it without the package. Importing this loads only the standard library.
"""

from __future__ import annotations

import math
from pathlib import Path

SIZES = (2, 4, 8, 16, 32, 64)
# The reconstruction reads one channel block (128-256 bytes) of every token row, rows C x 4 bytes
# apart: a stride the hardware prefetchers do not follow, so each row was a DRAM round trip once a
# part outgrows the caches (50 MB of magnitudes at 4,096 tokens). Prefetching the row this many
# ahead cut the fused kernel by ~10 % there (8 and 16 measured alike; 4 too close). The signs' row
# (1 byte per value, C bytes apart) likewise: prefetching it too cut the kernel by another ~7 % at
# 4,096 tokens (27.0 -> 25.1 ms per Klein layer with host code, 42.0 -> 40.2 with x86-64-v2 code).
PREFETCH_ROWS = 8
GENERATED = Path(__file__).with_name("_lee.py")


class _Prog:
    """Straight-line code under construction: every value a fresh local name."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.lines: list[str] = []
        self.consts: dict[str, float] = {}
        self.k = 0

    def emit(self, expr: str) -> str:
        name = f"t{self.k}"
        self.k += 1
        self.lines.append(f"    {name} = {expr}")
        return name

    def const(self, v: float) -> str:
        name = f"_K{self.n}_{len(self.consts)}"
        self.consts[name] = v
        return name


def _lee(p: _Prog, v: list[str]) -> list[str]:
    """x[i] = sum_u v[u] cos(pi (2i+1) u / 2n) (unnormalised DCT-III), Lee's recursion."""
    n = len(v)
    if n == 1:
        return list(v)
    h = n // 2
    alpha = [v[0]] + [v[2 * i] for i in range(1, h)]
    beta = [v[1]] + [p.emit(f"{v[2 * i - 1]} + {v[2 * i + 1]}") for i in range(1, h)]
    a = _lee(p, alpha)
    b = _lee(p, beta)
    out: list[str] = [""] * n
    for i in range(h):
        y = p.emit(f"{b[i]} * {p.const(1.0 / (2.0 * math.cos((i + 0.5) * math.pi / n)))}")
        out[i] = p.emit(f"{a[i]} + {y}")
        out[n - 1 - i] = p.emit(f"{a[i]} - {y}")
    return out


def source() -> str:
    """The text of `_lee.py`."""
    parts = [_HEAD.replace("@PF@", str(PREFETCH_ROWS))]
    for n in SIZES:
        p = _Prog(n)
        args = [f"c{i}" for i in range(n)]
        # orthonormal weights folded into the inputs: sqrt(1/n) for u = 0, sqrt(2/n) otherwise
        w0, w = p.const(math.sqrt(1.0 / n)), p.const(math.sqrt(2.0 / n))
        scaled = [p.emit(f"{a} * {w0 if i == 0 else w}") for i, a in enumerate(args)]
        outs = _lee(p, scaled)
        consts = "".join(f"{k} = np.float32({v!r})\n" for k, v in p.consts.items())
        body = "\n".join(p.lines)
        parts.append(f"\n{consts}\n@njit(nogil=True, cache=True)\n"
                     f"def idct{n}({', '.join(args)}):\n{body}\n    return ({', '.join(outs)},)\n")
        # the kernels paste the same lines inline (numba's own inliner rejects a 64-tuple call)
        body1 = "\n".join("        " + ln for ln in p.lines)
        body2 = "\n".join("            " + ln for ln in p.lines)
        cb = block_channels(n)
        rs = row_stride(n)
        parts.append(_KERNEL.format(n=n, cb=cb, T=n * n, rs=rs, lg=n.bit_length() - 1, body1=body1, body2=body2,
                                    load1="\n".join(f"            c{u} = fl[o + np.uint64({u * rs})]" for u in range(n)),
                                    store1="\n".join(f"            fl[o + np.uint64({u * rs})] = {o}"
                                                      for u, o in enumerate(outs)),
                                    load2="\n".join(f"                c{v} = fl[o + np.uint64({v * cb})]" for v in range(n)),
                                    store2="\n".join(f"                fl[o + np.uint64({v * cb})] = {o}"
                                                      for v, o in enumerate(outs))))
    return "\n".join(parts)


# The fused kernel per size, per channel block: the dead-zone reconstruction of the block's
# channels (band-sorted rows scattered to their token-grid rows) into a block buffer that stays in
# L2, pass 1 (over u) in place, pass 2 (over v) in place on each token-grid row's (n, CB) slab,
# then / scale + mean and the output dtype, while the slab is in L1. Flat indices with
# compile-time strides: with a runtime stride LLVM cannot prove the 2n loads and stores of an
# in-place column independent and does not vectorise (measured 4x slower than the matmul); with
# constant strides and trip counts it does. The buffer's grid rows are RS = n CB + 16 floats
# apart, not n CB: pass 1's n column loads were 8 KiB apart, all in one L1 set (8 KiB is a
# multiple of the set stride), so each evicted the last; one cache line of padding spreads them.
# The last step computes x / scale + mean and converts it to fp16 in one loop, straight into the
# output row (a float32 row buffer and a separate conversion loop cost 1-2 ms more per Klein
# decode with host code and 3-8 ms with x86-64-v2 code, erratically: the same float32 values).
# Reconstructing here instead of into a (C / CB, T, CB) array in memory saves a write and a read
# of 4 bytes per value (and, at 4,096 tokens, 50 MB of fresh pages per part).
_KERNEL = '''
CB{n} = {cb}
RS{n} = {rs}


@njit(nogil=True, cache=True)
def idct2_{n}(mag, neg, perm, step, off, lo, hi, inv, mu, out16, out32):
    """Channel blocks [lo, hi) (CB{n} channels each) of one part's band-sorted magnitudes and
    signs (mag, neg (T*C,), row r at token-grid row perm[r]) -> tokens: sign (mag + off) step (0
    where mag is 0), 2-D inverse DCT, then x / inv[t] (if inv.size) + mu[c]; written as fp16 bits
    into out16 (T, C) uint16 if out16.size, else as float32 into out32 (T, C)."""
    C = mu.size
    fl = np.empty({n} * {rs}, np.float32)
    of = np.float32(off)
    st = np.float32(step)
    zero = np.float32(0.0)
    for b in range(lo, hi):
        for r in range({T}):
            gi = np.uint64(perm[r])
            dst = (gi >> np.uint64({lg})) * np.uint64({rs}) + (gi & np.uint64({n} - 1)) * np.uint64({cb})
            src = np.uint64(r) * np.uint64(C) + np.uint64(b * {cb})
            ahead = src + np.uint64(PREFETCH_ROWS * C)
            for pq in range(0, {cb}, 16):
                prefetch(mag, ahead + np.uint64(pq))
            prefetch(neg, ahead)
            prefetch(neg, ahead + np.uint64({cb} - 1))
            for c in range({cb}):
                q = mag[src + np.uint64(c)]
                v = (np.float32(q) + of) * st
                v = -v if neg[src + np.uint64(c)] else v
                fl[dst + np.uint64(c)] = v if q != 0 else zero
        for q in range({n} * {cb}):
            o = np.uint64(q)
{load1}
{body1}
{store1}
        for i in range({n}):
            bi = np.uint64(i * {rs})
            for c in range({cb}):
                o = bi + np.uint64(c)
{load2}
{body2}
{store2}
            m = mu[b * {cb}:(b + 1) * {cb}]
            for j in range({n}):
                t = i * {n} + j
                src = fl[bi + np.uint64(j * {cb}):bi + np.uint64((j + 1) * {cb})]
                if out16.size:
                    o16 = out16[t, b * {cb}:(b + 1) * {cb}]
                    if inv.size:
                        d = inv[t]
                        for c in range({cb}):
                            o16[c] = _f16_bits(src[c] / d + m[c])
                    else:
                        for c in range({cb}):
                            o16[c] = _f16_bits(src[c] + m[c])
                else:
                    o32 = out32[t, b * {cb}:(b + 1) * {cb}]
                    if inv.size:
                        d = inv[t]
                        for c in range({cb}):
                            o32[c] = src[c] / d + m[c]
                    else:
                        for c in range({cb}):
                            o32[c] = src[c] + m[c]
'''


def row_stride(n: int) -> int:
    """RS: floats between grid rows of the fused kernel's block buffer (n CB plus a cache line)."""
    return n * block_channels(n) + 16


def block_channels(n: int) -> int:
    """CB: channels per block of the fused kernel at grid side n: 64 up to n = 32 (a (n, n, 64)
    float32 block is <= 256 KiB, in L2; Klein's 3,072 channels and the mini model's are multiples),
    32 at n = 64 (512 KiB; 16 channels measured ~8 % slower: two vectors per pass-2 row)."""
    return max(32, min(64, (1 << 16) // (n * n)))


_HEAD = '''# @generated by `python -m sakura.codec.progressive.lee_gen` (from sakura/codec/progressive/lee_gen.py): do not edit.
"""Generated by `python -m sakura.codec.progressive.lee_gen`: do not edit. Orthonormal inverse DCT
(DCT-III) per power-of-two size, straight-line float32, and the fused 2-D kernels (see `fastdct`)."""

import numpy as np
from numba import njit

from ..kernels import _f16_bits, prefetch

PREFETCH_ROWS = @PF@   # lee_gen.PREFETCH_ROWS
'''



def write() -> None:
    GENERATED.write_text(source())


if __name__ == "__main__":
    write()
