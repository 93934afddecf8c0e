"""Entropy-coded scalar quantisation (ECSQ) for `sakura:quantiser="ecsq"`.

Per (layer, K/V) part of a template: subtract a per-channel mean mu (fp16, fp32 for huge values;
keys carry large per-channel offsets, values a large per-channel DC), then a mid-tread uniform
quantiser with one step Delta for the whole part,  s = rint((x - mu) / Delta_t),  x^ = mu + s Delta_t,
so |x - x^| <= Delta_t / 2; symbols are ANS-coded with one histogram per channel (alphabets <= 33
symbols; pooled above). Token importance scales the step per token, Delta_t = Delta 2^(n - b_t)
(b_t the planned width, n the part's nominal width; b_t = 0 drops the token), floored at
max|x - mu| / 2047 so alphabets stay bounded. Delta is chosen per part, in half-bit steps, by a
Lagrangian allocation: minimise sum_parts sensitivity x relative MSE at the entropy-coded bits the
nested quantiser would spend at the same `budget` (sensitivities from `ShardKV.sensitivity`, else 1).

At ~1 bit per value this beats the min/max-range nested quantiser on keys by 4-6 dB of relative MSE
at equal bits on the trained mini model (mean removal + a mid-tread zero level); values gain less.

`transform="dct"`: template tokens are image patches in raster order, and neighbouring patches'
keys/values correlate strongly (on the trained mini model the residual of predicting a token from the
mean of its left and upper neighbours keeps only 20-30% of the keys' variance, 50-75% of the values').
When T = n*n the part's mean-removed (T, C) block is transformed by an orthonormal 2-D DCT over the
n x n token grid (per channel), the coefficients quantised with one step (all tokens kept; importance
is not used), and ANS-coded with one histogram per frequency band u+v (2n-1 contexts) pooled over
channels. Orthonormal, so the squared error equals the coefficients' (<= T C (step/2)^2); a
per-value bound no longer holds. On the mini model this needs 1/3-1/4 of the plain ECSQ bits at
equal relative error on the smooth texture/look templates and ~0.4 bit less per value on keys of the
sticker template.

Not nested, so `layered` ladders keep the nested quantiser.
"""

from __future__ import annotations

import math

import numpy as np

from .allocation import allocate_steps
from .bitstream import CorruptError
from .entropy import _constriction

REF_BITS = 4            # importance plans widths around this; a token's step is Delta 2^(REF_BITS - b_t)
COUNT_SCALE = 16        # table counts are scaled by this before the ANS models' +1 smoothing
MAX_SYM = 2047          # |symbol| bound: the step is floored at max|x - mu| / MAX_SYM
PER_CHANNEL_MAX_ALPHABET = 33
STEP_GRID = np.arange(-6, 25)  # Delta = sigma * 2^(-j/2)


def part_mean(x: np.ndarray, sdt: np.dtype) -> np.ndarray:
    """Per-channel mean of a (T, C) part, in the scale dtype."""
    return x.astype(np.float64).mean(axis=0).astype(sdt)


def token_steps(step: float, floor: float, bits: np.ndarray, nominal: int) -> np.ndarray:
    """(T,) float32 step per token (dropped tokens: 1.0, unused)."""
    st = np.float64(step) * np.exp2((nominal - bits).astype(np.float64))
    st = np.maximum(st, np.float64(floor))
    return np.where(bits > 0, st, 1.0).astype(np.float32)


def symbols(x: np.ndarray, mu: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """(T, C) int32 rint((x - mu) / step_t)."""
    y = (x - mu.astype(np.float32)[None, :]) / steps[:, None]
    return np.rint(y).astype(np.int32)


def reconstruct(sym: np.ndarray, mu: np.ndarray, steps: np.ndarray) -> np.ndarray:
    out = sym.astype(np.float32)
    out *= steps[:, None]
    out += mu.astype(np.float32)[None, :]
    return out


def floor_of(x: np.ndarray, mu: np.ndarray) -> float:
    """Smallest allowed step: max |x - mu| / MAX_SYM (tiny positive if the part is constant)."""
    m = float(np.abs(x - mu.astype(np.float32)[None, :]).max(initial=0.0))
    return max(m / MAX_SYM, 1e-30)


def entropy_bits(sym: np.ndarray) -> float:
    """Empirical entropy-coded bits of (T, C) symbols with per-channel or pooled histograms."""
    T, C = sym.shape
    lo = int(sym.min(initial=0))
    A = int(sym.max(initial=0)) - lo + 1
    s = sym - lo
    if A <= PER_CHANNEL_MAX_ALPHABET:
        flat = (s + (np.arange(C) * A)[None, :]).reshape(-1)
        cnt = np.bincount(flat, minlength=C * A).reshape(C, A).astype(np.float64)
    else:
        cnt = np.bincount(s.reshape(-1), minlength=A).astype(np.float64)[None, :]
    p = cnt / np.maximum(cnt.sum(1, keepdims=True), 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(-(cnt * np.where(p > 0, np.log2(p), 0.0)).sum())


def rd_points(x: np.ndarray, mu: np.ndarray) -> list[tuple[float, float, float]]:
    """(step, relative MSE, bits) over the step grid for a (T, C) part at nominal width."""
    y = x.astype(np.float64) - mu.astype(np.float64)[None, :]
    energy = float((x.astype(np.float64) ** 2).sum()) + 1e-30
    sigma = math.sqrt(float((y ** 2).mean())) or 1.0
    fl = floor_of(x, mu)
    out = []
    for j in STEP_GRID:
        step = max(sigma * 2.0 ** (-j / 2.0), fl)
        s = np.rint(y / step)
        err = float(((y - s * step) ** 2).sum())
        out.append((float(np.float32(step)), err / energy, entropy_bits(s.astype(np.int64))))
    return out


def allocate(points: dict, sens: dict, budget_bits: float) -> dict:
    """Per part the step minimising sum sens * relMSE subject to total bits <= budget_bits."""
    return allocate_steps(points, sens, budget_bits)


# -- spatial transform over the token grid (template tokens are image patches in raster order) ----

def grid_side(T: int) -> int:
    """n if T == n*n (n >= 2), else 0 (no transform)."""
    n = int(round(math.sqrt(T)))
    return n if n >= 2 and n * n == T else 0


def dct_matrix(n: int) -> np.ndarray:
    """Orthonormal DCT-II matrix (n, n), float64."""
    k = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    d = np.cos(np.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    d[0] /= math.sqrt(2.0)
    return d


def forward(y: np.ndarray, n: int) -> np.ndarray:
    """(T, C) token-domain -> (T, C) 2-D DCT coefficients over the n x n token grid (orthonormal).

    Two plain matrix products (rows, then columns of the grid, every channel at once): the same
    values bit for bit as `forward_einsum` (tested), 12x faster on a Klein-4B 1024^2 part (0.11 s
    against 1.4 s: the einsum's second contraction copied and reshaped the part per batch)."""
    if y.ndim != 2 or y.shape[1] < 2:
        return forward_einsum(y, n)  # one channel: einsum takes another path (last-bit differences)
    d = dct_matrix(n)
    t = (d @ y.astype(np.float64).reshape(n, -1)).reshape(n, n, -1)   # (a, j, c) = sum_i d[a, i] y[i, j, c]
    return np.matmul(d, t).reshape(n * n, -1)                         # (a, b, c) = sum_j d[b, j] t[a, j, c]


def forward_einsum(y: np.ndarray, n: int) -> np.ndarray:
    """`forward` as one einsum: the reference it is tested against."""
    d = dct_matrix(n)
    g = y.astype(np.float64).reshape(n, n, -1)
    return np.einsum("ai,ijc,bj->abc", d, g, d, optimize=True).reshape(n * n, -1)


def inverse(c: np.ndarray, n: int) -> np.ndarray:
    d = dct_matrix(n)
    g = c.astype(np.float64).reshape(n, n, -1)
    return np.einsum("ai,abc,bj->ijc", d, g, d, optimize=True).reshape(n * n, -1).astype(np.float32)


def bands(n: int) -> np.ndarray:
    """(n*n,) frequency band u + v of each coefficient: the entropy-coding context."""
    u, v = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    return (u + v).reshape(-1)


def band_counts(sym: np.ndarray, band: np.ndarray, A: int) -> np.ndarray:
    """(nbands, A) symbol counts per band (sym offset to [0, A))."""
    nb = int(band.max()) + 1
    flat = (sym + (band[:, None] * A)).reshape(-1)
    return np.bincount(flat, minlength=nb * A).reshape(nb, A).astype(np.uint32)


def context_entropy_bits(counts: np.ndarray, contexts: np.ndarray) -> float:
    """Bits of symbols coded with one static model per context: -sum n log2(n / N_context), over
    `counts` (k,) > 0 of the symbols that occur and their `contexts` (k,) int ids."""
    c = counts.astype(np.float64)
    tot = np.bincount(contexts, weights=c)
    return float(-(c * np.log2(c / tot[contexts])).sum())


def band_entropy_bits(sym: np.ndarray, band: np.ndarray) -> float:
    """Bits of `sym` (T, C) coded with one static model per band (`band`: (T,) context of each
    row). Logs are taken of the nonzero counts only: at fine steps the alphabet runs to thousands
    of symbols per band, nearly all unused."""
    lo = int(sym.min(initial=0))
    A = int(sym.max(initial=0)) - lo + 1
    nb = int(band.max()) + 1
    cnt = np.bincount(((sym - lo) + (band[:, None] * A)).reshape(-1), minlength=nb * A)
    nz = np.flatnonzero(cnt)
    return context_entropy_bits(cnt[nz], nz // A)


def rd_points_dct(x: np.ndarray, mu: np.ndarray, n: int) -> list[tuple[float, float, float]]:
    """`rd_points` for the transform path (errors are the same in both domains: orthonormal)."""
    y = x.astype(np.float64) - mu.astype(np.float64)[None, :]
    c = forward(y, n)
    band = bands(n)
    energy = float((x.astype(np.float64) ** 2).sum()) + 1e-30
    sigma = math.sqrt(float((y ** 2).mean())) or 1.0
    fl = max(float(np.abs(c).max(initial=0.0)) / MAX_SYM, 1e-30)
    out = []
    for j in STEP_GRID:
        step = max(sigma * 2.0 ** (-j / 2.0), fl)
        s = np.rint(c / step)
        err = float(((c - s * step) ** 2).sum())
        out.append((float(np.float32(step)), err / energy, band_entropy_bits(s.astype(np.int64), band)))
    return out


def ans_encode_bands(sym: np.ndarray, band: np.ndarray, models: list) -> np.ndarray:
    """One ANS stream: band 0's symbols, then band 1's, ... each with its band's model."""
    enc = _constriction().stream.stack.AnsCoder()
    for b in range(len(models) - 1, -1, -1):
        part = np.ascontiguousarray(sym[band == b], dtype=np.int32).reshape(-1)
        if part.size:
            enc.encode_reverse(part, models[b])
    return enc.get_compressed().astype("<u4")


def ans_decode_bands(words: np.ndarray, band: np.ndarray, models: list, C: int) -> np.ndarray:
    out = np.empty((band.size, C), np.int32)
    try:
        dec = _constriction().stream.stack.AnsCoder(np.ascontiguousarray(words, dtype=np.uint32))
        for b in range(len(models)):
            sel = np.nonzero(band == b)[0]
            if sel.size:
                out[sel] = dec.decode(models[b], sel.size * C).reshape(sel.size, C)
    except (ValueError, RuntimeError, AssertionError) as e:
        raise CorruptError(f"entropy-coded data does not decode: {e}") from None
    if not dec.is_empty():
        raise CorruptError("entropy-coded data has leftover bits: wrong tables or corrupt object")
    return out
