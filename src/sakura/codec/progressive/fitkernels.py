"""The table fit's array kernels (numba, `nogil=True`, `cache=True`): the cloud side's hot loop.

A progressive ladder's fit sweeps every (layer, K/V) part over the step grid (`ecsq.STEP_GRID`, 31
steps) and then over the planes below the chosen step: per step, the dead-zone quantiser's squared
error and each DCT band's symbol histogram (`progressive._deadzone_rd`). In numpy that is six
passes over the part and a bincount (a Klein-4B 1024^2 part: 12.6 M values, ~0.19 s a step); here
it is one pass (~2x less). `nogil`: a large fit runs its parts in threads (`progressive._part_pool`).
"""

from __future__ import annotations

import math

import numpy as np

from .. import target as _target
from ..ecsq import context_entropy_bits

_target.configure()
from numba import njit  # noqa: E402  (numba after the decode target is set)


@njit(nogil=True, cache=True, inline="always")
def _deadzone(x, step):
    """One value through the dead-zone quantiser: (reconstruction error, signed index). Index
    sign(x) floor(|x| / step); reconstruction (q + 1/2) step for q > 0, else 0."""
    a = abs(x)
    q = math.floor(a / step)
    if q > 0:
        return a - (q + 0.5) * step, (int(q) if x > 0 else -int(q))
    return a, 0


@njit(nogil=True, cache=True)
def deadzone_counts(c, band, step, qmax, counts):
    """Squared error of the dead-zone quantiser at `step` over `c` (T, C) float64, and each row
    band's histogram of the signed indices sign(c) floor(|c| / step) into `counts` (nbands,
    2 qmax + 1) int64 (zeroed by the caller; index + qmax). `band`: (T,) int64 band of each row;
    `qmax` >= every |index|. Reconstruction (q + 1/2) step for q > 0, else 0 (as `_deadzone_rd`)."""
    T, C = c.shape
    err = 0.0
    for t in range(T):
        b = band[t]
        for j in range(C):
            d, s = _deadzone(c[t, j], step)
            err += d * d
            counts[b, s + qmax] += 1
    return err


@njit(nogil=True, cache=True)
def deadzone_keys(c, band, step, qmax, keys):
    """`deadzone_counts`' squared error (the same values, the same sum) with each value's (band,
    index) pair written to `keys` (T*C,) int64 as band (2 qmax + 1) + index + qmax, instead of
    counted: the histogram's nonzero entries are then np.unique(keys), in the dense table's order."""
    T, C = c.shape
    width = 2 * qmax + 1
    err = 0.0
    for t in range(T):
        b = band[t]
        for j in range(C):
            d, s = _deadzone(c[t, j], step)
            err += d * d
            keys[t * C + j] = b * width + s + qmax
    return err


def entropy_bits_of_counts(counts: np.ndarray) -> float:
    """Bits of the symbols counted in `counts` (contexts, alphabet), one static model per context
    (`ecsq.context_entropy_bits` over the nonzero counts)."""
    cnt = counts.reshape(counts.shape[0], -1)
    nz = np.flatnonzero(cnt)
    return context_entropy_bits(cnt.reshape(-1)[nz], nz // cnt.shape[1])


def deadzone_rd(c: np.ndarray, band: np.ndarray, step: float, energy: float,
                amax: float | None = None) -> tuple[float, float]:
    """(relative MSE, band-context entropy bits) of the dead-zone quantiser at `step` on `c` (T, C)
    float64 with row bands `band` (T,); `amax`: max |c| when the caller has it."""
    c = np.ascontiguousarray(c, dtype=np.float64)
    band = np.ascontiguousarray(band, dtype=np.int64)
    if amax is None:
        amax = float(np.abs(c).max(initial=0.0))
    qmax = int(math.floor(amax / step)) + 1
    nb = int(band.max(initial=0)) + 1
    if nb * (2 * qmax + 1) > min(MAX_DENSE_COUNTS, SPARSE_COUNTS_PER_VALUE * c.size):
        # fine steps: a table mostly of zeros, whose scan for nonzero counts cost more than the
        # sweep (a bundled part at step0 / 2^12: 0.2 M entries for 8 K values), or that would
        # not fit in memory (a large part's alphabet runs to millions). Sorting the pairs finds
        # the same counts in the same order: the same bits, to the last one.
        keys = np.empty(c.size, np.int64)
        err = deadzone_keys(c, band, float(step), qmax, keys)
        uniq, cnt = np.unique(keys, return_counts=True)
        return err / energy, context_entropy_bits(cnt, uniq // (2 * qmax + 1))
    counts = np.zeros((nb, 2 * qmax + 1), np.int64)
    err = deadzone_counts(c, band, float(step), qmax, counts)
    return err / energy, entropy_bits_of_counts(counts)


#: histogram entries per value of the part beyond which the pairs are sorted instead of counted
#: in a dense table (measured crossover on a bundled part: 2-5 entries per value)
SPARSE_COUNTS_PER_VALUE = 4
#: the dense (bands x alphabet) histogram's size limit, in entries (128 MiB of int64): a fit's planes
#: go down to step0 / 2^12, where a part with a large max |c| would need an alphabet of millions
MAX_DENSE_COUNTS = 1 << 24


def warm_up() -> None:
    """Compile or load both kernels once (tiny input: a coarse step counts densely, a fine one sorts)."""
    for step in (1.0, 1e-3):
        deadzone_rd(np.array([[0.5, -2.0]]), np.zeros(1, np.int64), step, 1.0)
