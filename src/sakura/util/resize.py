"""Anti-aliased image resize in numpy alone: the same numbers as scikit-image's
``skimage.transform.resize(image, shape, anti_aliasing=True)`` (bilinear, ``mode="reflect"``,
clipped to the input's range), so the phone reads a photo with nothing but numpy and Pillow, and a
store built before scikit-image left the core is rebuilt byte for byte.

What skimage does, step by step (scikit-image 0.19+ on scipy.ndimage; `tests/sakura/util/` checks
the equality):

1. per axis, the scale ``factor = in / out``; a Gaussian of ``sigma = max(0, (factor - 1) / 2)``
   smooths the image (``ndimage.gaussian_filter``, truncated at 4 sigma, boundary ``mirror``:
   ``d c b | a b c d | c b a``); an axis with sigma 0 is left alone;
2. bilinear interpolation at the output pixel centres mapped into the input
   (``ndimage.zoom(..., order=1, grid_mode=True)``: ``x_in = (x_out + 0.5) * factor - 0.5``), with
   coordinates outside ``[0, in - 1]`` mirrored back;
3. the result clipped to the input's min and max.

Each step computes in float64 and rounds to the input's float dtype, as ndimage does. Equal to
skimage's result bit for bit on integer scale factors; on others, ~0.01 % of float32 values differ
in the last bit (the float64 sums are not added in ndimage's order).
"""

from __future__ import annotations

import numpy as np


def _mirror_index(i: np.ndarray, n: int) -> np.ndarray:
    """ndimage's "mirror" boundary for integer indices: reflect about the first and last pixel."""
    if n == 1:
        return np.zeros_like(i)
    period = 2 * n - 2
    i = np.abs(i) % period
    return np.where(i >= n, period - i, i)


def _gaussian_1d(a: np.ndarray, sigma: float, axis: int) -> np.ndarray:
    radius = int(4.0 * sigma + 0.5)
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    w = np.exp(-0.5 / (sigma * sigma) * x * x)
    w /= w.sum()
    n = a.shape[axis]
    idx = _mirror_index(np.arange(-radius, n + radius), n)
    padded = np.take(a.astype(np.float64, copy=False), idx, axis=axis)
    out = np.zeros(a.shape, dtype=np.float64)
    for k in range(2 * radius + 1):  # correlate: out[i] = sum_k w[k] * a[i + k - radius]
        out += w[k] * np.take(padded, np.arange(k, k + n), axis=axis)
    return out.astype(a.dtype, copy=False)


def _linear_coords(n: int, out_n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Output pixel centres mapped into an input axis of n pixels: (lower index, upper index,
    weight of the upper one); a coordinate outside [0, n - 1] is mirrored back inside, as ndimage
    does (for bilinear weights the same as mirroring the pixels)."""
    x = (np.arange(out_n, dtype=np.float64) + 0.5) * (n / out_n) - 0.5
    if n > 1:
        period = 2 * n - 2
        x = np.abs(x) % period
        x = np.where(x > n - 1, period - x, x)
    else:
        x = np.zeros_like(x)
    lo = np.floor(x).astype(np.int64)
    return lo, np.minimum(lo + 1, n - 1), x - lo


def resize_antialiased(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``image`` (H, W) or (H, W, C), float, resized to ``size = (h, w)`` (channels kept) as
    ``skimage.transform.resize(image, size, anti_aliasing=True)`` does. Returns the input's float
    dtype (float64 for integer input, after scaling as skimage would not: pass floats)."""
    a = np.asarray(image)
    if not np.issubdtype(a.dtype, np.floating):
        raise TypeError(f"resize_antialiased takes a float image, got {a.dtype}")
    if a.dtype == np.float16:
        a = a.astype(np.float32)
    out_shape = tuple(int(s) for s in size) + a.shape[2:]
    if out_shape == a.shape:
        return a.copy()
    lo, hi = a.min(), a.max()
    filtered = a
    for axis in range(2):
        sigma = max(0.0, (a.shape[axis] / out_shape[axis] - 1) / 2)
        if sigma > 1e-15:
            filtered = _gaussian_1d(filtered, sigma, axis)
    # the four corners weighted at once, as ndimage's zoom sums them (two separable passes round
    # differently in float64 and flip the last float32 bit of ~0.2 % of pixels; this way ~0.01 %)
    ly, hy, ty = _linear_coords(a.shape[0], out_shape[0])
    lx, hx, tx = _linear_coords(a.shape[1], out_shape[1])
    extra = (None,) * (a.ndim - 2)
    ty, tx = ty[(slice(None), None, *extra)], tx[(None, slice(None), *extra)]
    f = filtered.astype(np.float64, copy=False)
    rows_lo, rows_hi = f[ly], f[hy]
    out = (rows_lo[:, lx] * ((1 - ty) * (1 - tx)) + rows_lo[:, hx] * ((1 - ty) * tx)
           + rows_hi[:, lx] * (ty * (1 - tx)) + rows_hi[:, hx] * (ty * tx))
    return np.clip(out, lo, hi).astype(a.dtype, copy=False)
