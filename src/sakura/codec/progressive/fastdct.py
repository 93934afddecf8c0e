"""The fast inverse DCT of the progressive ladder: Lee's (1984) recursive factorisation of the
orthonormal DCT-III, unrolled into straight-line float32 code per power-of-two size.

Why: the inverse 2-D DCT was a pair of float32 matmuls per channel block, n multiply-adds per
output and pass (32 at 1,024 tokens, 64 at 4,096), 8-11 ms per Klein K or V, about half of a
progressive decode. Lee's factorisation needs (n/2) log2 n multiplies and ~(3n/2) log2 n adds per
n outputs: ~9 flops per output and pass at n = 32 against 64.

How it stays exact: the generated module `_lee` holds one function `idct<n>(c0, ..., c<n-1>) ->
(x0, ..., x<n-1>)` per size, made only of float32 `+`, `-` and `*` by float32 constants in a fixed
order. The native kernels (`_lee.idct2_<n>`) inline it over scalars, LLVM
vectorising across channels; the reference decoder calls the very same Python function with numpy
rows (`inverse_rows`). IEEE float32 arithmetic op for op is the same in both (numba does not
contract to FMA or reorder without fastmath), so native == reference bit for bit. Sizes outside
`SIZES` (non-power-of-two grids) keep the matmul inverse in both decoders.

Regenerate with `python -m sakura.codec.progressive.lee_gen` (the generator, `lee_gen`, is apart so that it runs
whatever state `_lee.py` is in) (a test checks `_lee.py` is up to date).
"""

from __future__ import annotations

import numpy as np

from . import _lee
from .lee_gen import GENERATED, PREFETCH_ROWS, SIZES, block_channels, row_stride, source, write  # noqa: F401 (re-exported)


def fits(n: int, C: int) -> bool:
    """Whether grid side n and C channels take the fast inverse (else both decoders use the matmul)."""
    return n in SIZES and C % block_channels(n) == 0


def kernel(n: int):
    """The native fused kernel `idct2_<n>` (see `_KERNEL`)."""
    return getattr(_lee, f"idct2_{n}")


def inverse_2d(c: np.ndarray, n: int) -> np.ndarray:
    """The reference decoder's 2-D inverse: (T, C) float32 coefficients (token-grid order) ->
    (T, C) float32 tokens, pass 1 over u then pass 2 over v, the native kernel's operations."""
    T, C = c.shape
    g = np.ascontiguousarray(c, dtype=np.float32).reshape(n, n, C)
    t = np.stack(inverse_rows([g[u] for u in range(n)]))               # (i, v, C)
    return np.stack(inverse_rows([t[:, v] for v in range(n)]), axis=1).reshape(T, C)   # (i, j, C)


def inverse_rows(rows: list[np.ndarray]) -> list[np.ndarray]:
    """The reference decoder's 1-D inverse DCT over n float32 arrays (one per frequency), the same
    generated code as the native kernels: the result's x_i = sum_u D[u, i] rows[u]."""
    fn = getattr(_lee, f"idct{len(rows)}").py_func
    return list(fn(*rows))


def warm_up() -> None:
    """Compile or load every size's fused kernel (tiny inputs: one block, both output kinds)."""
    for n in SIZES:
        cb = block_channels(n)
        T = n * n
        neg, perm = np.zeros(T * cb, np.uint8), np.arange(T, dtype=np.int64)
        fn = kernel(n)
        for mdt in (np.int32, np.int16):   # both magnitude dtypes (`progressive.magnitude_dtype`)
            mag = np.zeros(T * cb, mdt)
            fn(mag, neg, perm, 0.5, 0.5, 0, 1, np.ones(T, np.float32), np.zeros(cb, np.float32),
               np.empty((T, cb), np.uint16), np.empty((0, 0), np.float32))
            fn(mag, neg, perm, 0.5, 0.5, 0, 1, np.empty(0, np.float32), np.zeros(cb, np.float32),
               np.empty((0, 0), np.uint16), np.empty((T, cb), np.float32))


if __name__ == "__main__":
    write()  # `python -m sakura.codec.progressive.lee_gen` runs even when _lee.py is broken
