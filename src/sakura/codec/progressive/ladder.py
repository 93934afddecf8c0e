"""The progressive transform ladder: `layered:quantiser="ecsq"[,transform="dct"]`.

The same representation as `sakura:quantiser="ecsq",transform="dct"` (per-channel mean removed,
orthonormal 2-D DCT over the n x n token grid, one step per (layer, K/V) part, band-context ANS),
coded by successive refinement so that every rung refines the previous one and rung l is a byte
prefix of the shard's one object.

Quantiser: a dead-zone uniform quantiser, magnitude index q = floor(|c| / step), reconstruction
sign(c) (q + 1/2) step for q > 0, else 0. Steps halve from rung to rung per part
(step_l = step_0 2^-k_l, k_l >= k_(l-1) planes), and floor(|c| 2^m / step) >> m == floor(|c| / step)
exactly in floating point, so the indices are nested: a rung that adds m planes to a part sends,
per coefficient,

- already significant (q > 0): its m new low-order magnitude bits, bit-packed (near-uniform: ANS
  would gain ~nothing and decode 10x slower);
- not yet significant (q = 0): its new index in [0, 2^m) with ANS, one histogram per DCT band
  u+v (2n-1 contexts; the histogram tables are per template, fitted once), plus one raw sign bit
  if it became significant.

Rung 0 codes the signed index of every coefficient with band-context ANS (the ECSQ path's coder).
Error bound in the coefficient domain at rung l: |c - c^| <= step_l / 2 where q > 0, < step_l where
q = 0; the transform is orthonormal, so the squared error of the KV is the coefficients'.

Rate allocation, `allocate="image"` (default; every shard has a `ShardKV.distortion` probe): as
below, then rung 0's steps and every rung's planes re-chosen by the same Lagrangian on the *measured*
image MSE of each part alone around the proxy's choice (`_image_steps`, `_image_planes`), and each
part's per-rung reconstruction offset by the probe (`_image_offsets`, `OFFSETS`; wire version 5).
Proxy (`allocate="sensitivity"`, or no probes; `allocation.allocate_steps`): `budgets` are entropy-coded bits per value at each
rung, over the whole template. Rung 0's steps are chosen per part in half-bit steps by the
Lagrangian that minimises sum sensitivity x relative MSE at budget 0 (sensitivities from
`ShardKV.sensitivity` with `allocate="sensitivity"`, else 1); rung l adds whole planes per part by
the same Lagrangian, never fewer than rung l-1 had. Token importance is not used (all tokens kept).
"""

from __future__ import annotations

import math
import zlib
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence
import os

import numpy as np
import torch

from .. import bitstream as bs
from .. import ecsq as EQ
from .. import entropy as E
from .. import quant as Q
from .. import kernels as K
from . import fastdct, fitkernels
from .. import rans as R
from ..allocation import allocate_steps, allocate_planes
from ..base import (Codec, CodecTables, LadderState, LayerKV, ShardKV, ShardId, as_f32_2d, check_params, finite,
                    from_f32_2d, register)
from .. import native as NV

FORMAT_VERSION = 5      # 3: constriction ANS (no longer read); 4: interleaved rANS streams (`rans`);
                        # 5: 4 plus per-rung reconstruction offsets (header prog[kv]["off"])
READ_VERSIONS = (4, 5)  # version-4 objects (no "off": the midpoint) still decode, as they did
#: reconstruction offsets (sign (q + off) step for q > 0) the image allocation chooses among per part
#: and rung; binary fractions, exact in float32 and in the JSON header
OFFSETS = (0.5, 0.625, 0.75, 0.875)
MAX_PLANES = 12         # refinement planes beyond rung 0's step, per part
PARTS = ("k", "v")


@dataclass
class PartPlan:
    """Per (layer, K/V) part: channel mean (C,), rung-0 step, cumulative planes per rung."""

    mean: np.ndarray
    step0: float
    planes: list[int]          # planes[0] == 0, non-decreasing
    offsets: list[float] | None = None   # per rung reconstruction offset (None: the midpoint, 1/2)

    def offs(self) -> list[float]:
        return list(self.offsets) if self.offsets is not None else [0.5] * len(self.planes)


# ---------------------------------------------------------------------------------------------
# analysis

def _grid(T: int, transform: str) -> int:
    return EQ.grid_side(T) if transform == "dct" else 0


def _bands(T: int, n: int) -> np.ndarray:
    return EQ.bands(n) if n else np.zeros(T, np.int64)


def coefficients(x: np.ndarray, mean: np.ndarray, n: int, scale: np.ndarray | None = None) -> np.ndarray:
    """(T, C) values -> (T, C) float64 coefficients (DCT over the token grid if n, else identity);
    `scale` (T,) multiplies each token's mean-removed values first (importance weighting)."""
    y = x.astype(np.float64) - mean.astype(np.float64)[None, :]
    if scale is not None:
        y *= scale.astype(np.float64)[:, None]
    return EQ.forward(y, n) if n else y


SCALE_STEPS_PER_OCTAVE = 16
MAX_SCALE_OCTAVES = 3


def token_scales(shard: ShardKV, kv: str, weighting: str, gamma: float) -> np.ndarray | None:
    """uint8 codes of per-token weights s_t = (w_t / geomean w)^(gamma/2), w = the shard's importance
    for K (row 0) or V (row 1) (or its one row), clipped to 2^+-3, 1/16 octave steps; None without
    weighting. Coding s_t y_t makes token t's error ~ 1/s_t^2: minimum sum_t w_t MSE_t at gamma = 1."""
    if weighting == "none" or shard.importance is None:
        return None
    imp = shard.importance.detach().double().numpy()
    w = imp[0 if kv == "k" else 1] if imp.ndim == 2 else imp
    lw = np.log2(np.maximum(w, 1e-30))
    lw -= lw[w > 0].mean() if (w > 0).any() else 0.0
    oct_ = np.clip(0.5 * gamma * lw, -MAX_SCALE_OCTAVES, MAX_SCALE_OCTAVES)
    return (np.round(oct_ * SCALE_STEPS_PER_OCTAVE) + 128).astype(np.uint8)


def scales_of(codes: np.ndarray | None) -> np.ndarray | None:
    if codes is None:
        return None
    return np.exp2((codes.astype(np.float64) - 128.0) / SCALE_STEPS_PER_OCTAVE)


def _deadzone_rd(c: np.ndarray, band: np.ndarray, step: float, energy: float) -> tuple[float, float]:
    """(relative MSE, band-context entropy bits) of the dead-zone quantiser at `step` (one native
    pass: `fitkernels.deadzone_rd`; `_deadzone_rd_numpy` is its reference)."""
    return fitkernels.deadzone_rd(c, band, step, energy)


def _deadzone_rd_numpy(c: np.ndarray, band: np.ndarray, step: float, energy: float) -> tuple[float, float]:
    """`_deadzone_rd` in numpy (the reference the native kernel is tested against)."""
    a = np.abs(c)
    q = np.floor(a / step)
    rec = np.where(q > 0, (q + 0.5) * step, 0.0)
    err = float(((a - rec) ** 2).sum())
    s = (np.sign(c) * q).astype(np.int64)
    return err / energy, EQ.band_entropy_bits(s, band)


#: image allocation (`allocate="image"`): grid points measured around the proxy's choice, each side
#: (half-bit steps; a window of 1 measured -1.1 dB at the same budget on texture-00: docs/scale.md)
IMAGE_WINDOW = 3
#: ... and how many times a window is widened where the choice lands on its edge
IMAGE_WIDEN = 3
#: refinement planes measured beyond the proxy's top rung (and added per widening)
IMAGE_PLANES_AHEAD = 1


#: a part of more values than this has its rate-distortion points (the step grid's and the planes'
#: sweeps: ~45 passes) measured on a stratified sample of its channels of about this many values:
#: a Klein-4B 1024^2 part (12.6 M values) on ~1/12 of its channels. Smaller parts (every bundled
#: model's) are swept whole: their stores are bit for bit as before. Tolerance, measured on
#: real-shape layers (`sakura bench fit-sample`, docs/scale.md): bytes and KV PSNR per rung.
FIT_SAMPLE_VALUES = 1 << 20


def sample_channels(c: np.ndarray, heads: int, max_values: int = FIT_SAMPLE_VALUES
                    ) -> tuple[np.ndarray, float] | None:
    """A stratified sample of the channels (columns) of a part's coefficients `c` (T, C), the same
    number from every head (C = heads x head_dim), drawn with a fixed seed: (c[:, cols] contiguous,
    C / len(cols)), or None when `c` has at most `max_values` values (swept whole). Columns, not
    rows: every DCT band keeps all its rows, so each band's histogram is sampled at the same rate
    and the weight is one number."""
    T, C = c.shape
    if T * C <= max_values or heads < 1 or C % heads:
        return None
    D = C // heads
    per_head = max(1, math.ceil(D * max_values / (T * C)))
    if per_head >= D:
        return None
    rng = np.random.default_rng(0)
    cols = np.sort(np.concatenate([h * D + rng.choice(D, per_head, replace=False) for h in range(heads)]))
    return np.ascontiguousarray(c[:, cols]), C / cols.size


def _part_rd(c: np.ndarray, band: np.ndarray, step: float, energy: float,
             sample: tuple[np.ndarray, float] | None) -> tuple[float, float]:
    """(relative MSE, bits) of the dead-zone quantiser at `step` on a part (`_deadzone_rd`), from
    its channel `sample` when it has one: the sample's squared error and bits scaled by C / its
    channels (the part's `energy` is exact)."""
    if sample is None:
        return _deadzone_rd(c, band, step, energy)
    cs, w = sample
    rel, bits = _deadzone_rd(cs, band, step, energy / w)
    return rel, bits * w


def _decoded_part(c: np.ndarray, step: float, n: int, mean: np.ndarray, scale: np.ndarray | None,
                  shape: tuple[int, int, int], dtype: torch.dtype, off: float = 0.5) -> torch.Tensor:
    """What a decoder reconstructs from the indices at `step` (sign (q + off) step, inverse DCT,
    token scales, mean), as a (T, H, D) tensor of `dtype`: the probe's input."""
    a = np.abs(c)
    q = np.floor(a / step)
    rec = np.where(q > 0, np.copysign((q + off) * step, c), 0.0)
    y = EQ.inverse(rec, n).astype(np.float64) if n else rec
    if scale is not None:
        y = y / scale[:, None]
    y = y + mean.astype(np.float64)[None, :]
    return torch.from_numpy(y.astype(np.float32)).reshape(shape).to(dtype)


class _TokenGridDCT:
    """The coefficient transform of a part with token grid `n` (0: identity), as a callable over
    (T, C) arrays; `cache_key` names it for a distortion model that caches rows transformed by it."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.cache_key = ("dct", n)

    def __call__(self, y: np.ndarray) -> np.ndarray:
        return EQ.forward(y, self.n) if self.n else np.asarray(y, np.float64)


def _part_maker(s: ShardKV, c: np.ndarray, step: float, n: int, mean: np.ndarray, scale: np.ndarray | None,
                off: float = 0.5) -> Callable[[], torch.Tensor]:
    """``make()`` -> the decoded part at `step` (the probe's input). Without token scales it also
    has ``make.coefficient_error()`` -> (reconstruction - coefficients (T, C), transform): what a
    distortion model with ``coefficient_mse`` predicts from without decoding (no inverse DCT: a
    Klein-4B 1024^2 part is 12.6 M values)."""
    def make() -> torch.Tensor:
        return _decoded_part(c, step, n, mean, scale, s.shape, s.key.dtype, off)
    if scale is None:
        def coefficient_error() -> tuple[np.ndarray, _TokenGridDCT]:
            a = np.abs(c)
            q = np.floor(a / step)
            rec = np.where(q > 0, np.copysign((q + off) * step, c), 0.0)
            return rec - c, _TokenGridDCT(n)
        make.coefficient_error = coefficient_error  # type: ignore[attr-defined]
    return make


#: a sensitivity model predicts from the coefficients' error (no inverse transform, no fp16 cast)
COEFFICIENT_DOMAIN = True


def _probe(s: ShardKV, kv: str, decoded: torch.Tensor) -> float:
    """The shard's `distortion` probe on one decoded part (image MSE, >= 0), checked: a probe that
    returns NaN, inf or a negative number is an error, not a point the allocator may pick."""
    return _checked(float(s.distortion(kv, decoded)), s, kv)


def _checked(mse: float, s: ShardKV, kv: str) -> float:
    if not (math.isfinite(mse) and mse >= 0):
        raise ValueError(f"distortion probe returned {mse!r} for layer {s.layer} {kv}")
    return mse


def _probe_many(items: Sequence[tuple[ShardKV, str, Callable[[], torch.Tensor]]]) -> list[float]:
    """`_probe` of every (shard, part, make_decoded) in `items`, in order. When every shard's
    probe carries the same ``many`` (the build's shared probe: ``many([(layer, kv, decoded)]) ->
    [image MSE]``), the parts go to it together: all at once when it has ``many.submit(layer,
    kv, make) -> Future`` (decoded and measured in its threads), else a batch
    (``many.batch``) at a time, several probes in one batched forward; else one by one. Same
    values either way."""
    if COEFFICIENT_DOMAIN and items and all(hasattr(s.distortion, "coefficient_mse") and hasattr(make, "coefficient_error")
                     for s, _kv, make in items):  # a sensitivity model: predicted in the coefficient domain
        return [_checked(float(s.distortion.coefficient_mse(kv, *make.coefficient_error())), s, kv)
                for s, kv, make in items]
    many = getattr(items[0][0].distortion, "many", None) if items else None
    if many is None or any(getattr(s.distortion, "many", None) is not many for s, _, _ in items):
        return [_probe(s, kv, make()) for s, kv, make in items]
    submit = getattr(many, "submit", None)
    if submit is not None:  # all handed over: decoded and measured in the probe's threads
        futures = [submit(s.layer, kv, make) for s, kv, make in items]
        return [_checked(float(f.result()), s, kv) for f, (s, kv, _) in zip(futures, items)]
    batch = max(1, int(getattr(many, "batch", 8)))
    out: list[float] = []
    for a in range(0, len(items), batch):
        chunk = items[a:a + batch]  # decoded one batch at a time: a Klein part is tens of MB
        got = many([(s.layer, kv, make()) for s, kv, make in chunk])
        out += [_checked(float(m), s, kv) for (s, kv, _), m in zip(chunk, got)]
    return out


def _image_steps(shards: Sequence[ShardKV], fine: dict, means: dict, step0: dict, budget_bits: float,
                 transform: str) -> dict:
    """Rung-0 steps by measured image MSE: per part, the shard's `distortion` probe at grid points
    around the proxy allocation's step (`step0`), then the same Lagrangian with the measured image
    MSE as the distortion (image MSEs of different parts add up: docs/codec.md). The window widens
    where the choice lands on its edge. Costs ~(2 IMAGE_WINDOW + 1) probe calls per part."""
    by_part = {(s.layer, kv): (s, kv) for s in shards for kv in PARTS}
    measured: dict = {part: {} for part in fine}

    def measure(todo):  # [(part, grid index)] not yet measured, all at once (batched probes)
        def make(part, i):
            s, _kv = by_part[part]
            mu, c, _band, _energy, sc = means[part]
            return _part_maker(s, c, fine[part][i][0], _grid(s.shape[0], transform), mu, sc)
        got = _probe_many([(*by_part[part], make(part, i)) for part, i in todo])
        for (part, i), mse in zip(todo, got):
            measured[part][i] = mse

    centre = {part: min(range(len(pts)), key=lambda i: abs(math.log(pts[i][0] / step0[part]))) for part, pts in fine.items()}
    lo = {p: max(0, centre[p] - IMAGE_WINDOW) for p in fine}
    hi = {p: min(len(fine[p]) - 1, centre[p] + IMAGE_WINDOW) for p in fine}
    for _round in range(IMAGE_WIDEN + 1):
        measure([(part, i) for part in fine for i in range(lo[part], hi[part] + 1) if i not in measured[part]])
        pts = {part: [(fine[part][i][0], measured[part][i], fine[part][i][2]) for i in sorted(measured[part])]
               for part in fine}
        chosen = allocate_steps(pts, {p: 1.0 for p in fine}, budget_bits)
        edge = False
        for part in fine:
            i = next(i for i in measured[part] if fine[part][i][0] == chosen[part])
            if i == lo[part] and lo[part] > 0:
                lo[part] = max(0, lo[part] - IMAGE_WINDOW)
                edge = True
            if i == hi[part] and hi[part] < len(fine[part]) - 1:
                hi[part] = min(len(fine[part]) - 1, hi[part] + IMAGE_WINDOW)
                edge = True
        if not edge:
            break
    return chosen


def _image_offsets(shards: Sequence[ShardKV], means: dict, step0: dict, planes: dict, transform: str) -> dict:
    """Per part and rung the reconstruction offset (`OFFSETS`) with the lowest measured image MSE
    at that rung's step: the same indices and bytes, a different point in each bin. The image
    penalises the dead-zone's shrinkage toward zero (an MSE-optimal centroid, below the midpoint,
    measured worse than the midpoint; points above it better), which KV MSE does not see.

    The image MSE over the offsets is unimodal (measured: docs/scale.md), so each (part, step) walks
    up from the midpoint while the next offset measures better, all walks advancing together
    (batched probes): 1-4 probes per (part, step) where measuring every offset took 4, and the
    midpoint's probe is usually the allocation's own (memoised)."""
    walks = {}  # (part, step) -> [measured MSE per offset tried so far]
    shard_of = {(s.layer, kv): s for s in shards for kv in PARTS}
    for part in shard_of:
        for k in planes[part]:
            walks.setdefault((part, float(np.float32(step0[part] * 2.0 ** -k))), [])

    def make(part, st, o):
        s = shard_of[part]
        mu, c, _band, _energy, sc = means[part]
        return _part_maker(s, c, st, _grid(s.shape[0], transform), mu, sc, o)

    while True:
        todo = [(key, len(got)) for key, got in walks.items()
                if len(got) < len(OFFSETS) and (len(got) < 2 or got[-1] < got[-2])]
        if not todo:
            break
        got = _probe_many([(shard_of[part], part[1], make(part, st, OFFSETS[j])) for (part, st), j in todo])
        for (key, _j), mse in zip(todo, got):
            walks[key].append(mse)
    out = {}
    for part in shard_of:
        out[part] = []
        for k in planes[part]:
            tried = walks[(part, float(np.float32(step0[part] * 2.0 ** -k)))]
            out[part].append(OFFSETS[int(np.argmin(tried))])
    return out


def _ladder_planes(coarse_pts: dict, sens: dict, budgets: Sequence[float], total_values: int) -> dict:
    """Planes per part and rung (planes[part][0] == 0) by the Lagrangian over `coarse_pts`
    ({part: [(k, distortion, bits)]}, weights `sens`), never fewer than the rung before."""
    planes = {part: [0] for part in coarse_pts}
    for b in budgets[1:]:
        prev = {part: planes[part][-1] for part in coarse_pts}
        ks = allocate_planes(coarse_pts, sens, b * total_values, prev)
        if all(ks[part] == prev[part] for part in coarse_pts):
            # the budget step is finer than one plane anywhere: refine the part whose next plane
            # buys the most weighted distortion per bit, so that no rung is empty
            def gain(part):
                pts = {t[0]: t for t in coarse_pts[part]}
                k = prev[part]
                if k + 1 not in pts:
                    return -1.0
                return sens[part] * (pts[k][1] - pts[k + 1][1]) / max(pts[k + 1][2] - pts[k][2], 1e-9)
            best = max(coarse_pts, key=gain)
            if gain(best) >= 0:
                ks[best] = prev[best] + 1
        for part in coarse_pts:
            planes[part].append(ks[part])
    return planes


def _image_planes(shards: Sequence[ShardKV], means: dict, step0: dict, proxy: dict, coarse_pts: dict,
                  budgets: Sequence[float], total_values: int, transform: str) -> dict:
    """Refinement planes by measured image MSE: per part the probe at 0..k planes (k: the proxy's
    top rung + `IMAGE_PLANES_AHEAD`, widened while the choice reaches it), the proxy's bits, the
    same Lagrangian."""
    by_part = {(s.layer, kv): (s, kv) for s in shards for kv in PARTS}
    measured: dict = {part: {} for part in proxy}
    top = {part: min(MAX_PLANES, proxy[part][-1] + IMAGE_PLANES_AHEAD) for part in proxy}
    def make(part, k):
        s, _kv = by_part[part]
        mu, c, _band, _energy, sc = means[part]
        st = float(np.float32(step0[part] * 2.0 ** -k))
        return _part_maker(s, c, st, _grid(s.shape[0], transform), mu, sc)

    for _round in range(IMAGE_WIDEN + 1):
        todo = [(part, k) for part in proxy for k in range(top[part] + 1) if k not in measured[part]]
        for (part, k), mse in zip(todo, _probe_many([(*by_part[part], make(part, k)) for part, k in todo])):
            measured[part][k] = mse
        pts = {part: [(k, measured[part][k], coarse_pts[part][k][2]) for k in sorted(measured[part])] for part in proxy}
        planes = _ladder_planes(pts, {part: 1.0 for part in proxy}, budgets, total_values)
        widen = [part for part in proxy if planes[part][-1] == top[part] and top[part] < MAX_PLANES]
        if not widen:
            break
        for part in widen:
            top[part] = min(MAX_PLANES, top[part] + IMAGE_PLANES_AHEAD)
    return planes


def allocation_modes(allocate: str, shards: Sequence[ShardKV]) -> tuple[bool, bool]:
    """(use sensitivities, use image probes) for `allocate`: "image" measures rung 0's steps with the
    shards' `distortion` probes when every shard has one (the proxy underneath, and every later
    rung's planes, use sensitivities when every shard has them); "sensitivity" only the latter;
    "none" neither (every part weighs 1)."""
    use_sens = allocate in ("image", "sensitivity") and all(s.sensitivity is not None for s in shards)
    use_img = allocate == "image" and all(s.distortion is not None for s in shards)
    return use_sens, use_img


#: parts of at least this many values have their rate-distortion grids computed in threads (numpy
#: releases the GIL on such arrays): a Klein-4B 1024^2 part is 12.6 M values and ~15 CPU-s of grid
PARALLEL_PART_VALUES = 1 << 20


def _part_pool(shards: Sequence[ShardKV]):
    """A thread pool over a fit's parts when they are large (one worker per core), else an
    in-line executor: small parts (the bundled models') gain nothing from threads."""
    workers = min(len(shards) * len(PARTS), os.cpu_count() or 1)
    if workers <= 1 or max(s.num_values for s in shards) // 2 < PARALLEL_PART_VALUES:
        return _InlineExecutor()
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="progressive-fit")


class _InlineExecutor:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    @staticmethod
    def map(fn, items):
        return map(fn, items)


def plan_parts(shards: Sequence[ShardKV], budgets: Sequence[float], transform: str,
               use_sensitivity: bool, weighting: str = "none", gamma: float = 1.0,
               use_image: bool = False) -> dict[tuple[int, str], PartPlan]:
    """Steps and planes of every (layer, K/V) part for a ladder at `budgets` bits per value.
    `use_image`: rung 0's steps by the shards' measured image distortion (`_image_steps`; every
    shard must have a `distortion` probe), the proxy (sensitivity x relative MSE) otherwise."""
    fine, sens, means, total_values, sdt = _step_grids(shards, transform, use_sensitivity, weighting, gamma)
    sampled = {(s.layer, kv): s.fit_cache[("rd-sample", kv, transform, weighting, float(gamma), str(sdt))]
               for s in shards for kv in PARTS}
    coarse_pts: dict = {}
    step0 = allocate_steps(fine, sens, budgets[0] * total_values)
    if use_image:
        step0 = _image_steps(shards, fine, means, step0, budgets[0] * total_values, transform)
    shard_of = {(s.layer, kv): s for s in shards for kv in PARTS}

    def coarse_rd(part, mean):  # (relative MSE, bits) at each plane below step0, memoised per step
        out = []
        for k in range(MAX_PLANES + 1):
            st = step0[part] * 2.0 ** -k
            key = ("dz", part[1], transform, weighting, float(gamma), str(sdt), st)
            cache = shard_of[part].fit_cache
            if key not in cache:
                cache[key] = _part_rd(mean[1], mean[2], st, mean[3], sampled[part])
            out.append((k,) + cache[key])
        return out

    with _part_pool(shards) as pool:
        coarse = list(pool.map(lambda item: coarse_rd(*item), list(means.items())))
    for part, pts in zip(means, coarse):
        coarse_pts[part] = pts
    planes = _ladder_planes(coarse_pts, sens, budgets, total_values)
    if use_image and len(budgets) > 1:
        planes = _image_planes(shards, means, step0, planes, coarse_pts, budgets, total_values, transform)
    offsets = _image_offsets(shards, means, step0, planes, transform) if use_image else {}
    return {part: PartPlan(means[part][0], float(step0[part]), planes[part], offsets.get(part)) for part in means}


def proxy_image_mse(shards: Sequence[ShardKV], budget: float, transform: str = "dct", weighting: str = "none",
                    gamma: float = 1.0) -> float:
    """The sensitivity allocation's own estimate of the calibration edits' image MSE with one rung
    at `budget` bits per value: sum over parts of sensitivity x relative MSE at the steps it picks
    (`ShardKV.sensitivity` is image MSE per unit relative KV MSE: `layer_sensitivity`). No edit,
    no probe (the step grids are memoised on the shards). The budget search's steer: on the
    default templates the image allocation's measured PSNR is 5 dB below to 2 dB above it."""
    if not all(s.sensitivity is not None for s in shards):
        raise ValueError("proxy_image_mse: every shard needs its sensitivity")
    fine, sens, _means, total_values, _sdt = _step_grids(shards, transform, True, weighting, gamma)
    step0 = allocate_steps(fine, sens, budget * total_values)
    return float(sum(sens[part] * next(r for st, r, _b in fine[part] if st == step0[part]) for part in fine))


def model_image_mse(shards: Sequence[ShardKV], budget: float, transform: str = "dct", weighting: str = "none",
                    gamma: float = 1.0) -> float:
    """The calibration edits' image MSE of a one-rung ladder at `budget` bits per value, predicted
    by the shards' `distortion` (a sensitivity model, `sakura.cloud.capture.PredictedDistortion`:
    no edit) at the plan the image allocation makes by the same model: the sum of the parts'
    predictions (the image MSEs of different parts add up, docs/codec.md; the allocation minimises
    that sum). Summing the parts' sketch projections before squaring would count their cross terms
    too, but from one P-probe sketch of the whole template: relative spread sqrt(2/P) however many
    parts, where the sum of the parts' own estimates averages theirs (docs/notes/build-41.md)."""
    use_sens, _ = allocation_modes("image", shards)
    plans = plan_parts(shards, [budget], transform, use_sens, weighting, gamma, use_image=True)
    _fine, _sens, means, _tv, _sdt = _step_grids(shards, transform, use_sens, weighting, gamma)
    shard_of = {(s.layer, kv): s for s in shards for kv in PARTS}
    items = []
    for part, plan in plans.items():
        s = shard_of[part]
        mu, c, _band, _energy, sc = means[part]
        items.append((s, part[1], _part_maker(s, c, plan.step0, _grid(s.shape[0], transform), mu, sc, plan.offs()[0])))
    return float(sum(_probe_many(items)))


def _step_grids(shards: Sequence[ShardKV], transform: str, use_sensitivity: bool, weighting: str, gamma: float):
    """Per part its step grid [(step, relative MSE, bits)], weight and transform arrays (mean,
    coefficients, bands, energy, scales); the values in all; the scale dtype:
    -> (fine, sens, means, total_values, sdt)."""
    sdt = Q.scale_dtype(np.array([max(float(s.key.abs().max()), float(s.value.abs().max())) for s in shards]))
    total_values = sum(s.num_values for s in shards)
    fine: dict = {}
    sens: dict = {}
    means: dict = {}

    def rd_grid(s: ShardKV, kv: str):  # one part's transform and step grid (the same for every budget)
        key = ("rd", kv, transform, weighting, float(gamma), str(sdt))
        if key not in s.fit_cache:
            pts, mean, sample = _rd_grid(s, kv)
            s.fit_cache[key] = pts, mean
            s.fit_cache[("rd-sample",) + key[1:]] = sample  # the planes' sweep (`plan_parts`) reuses it
        return s.fit_cache[key]

    def _rd_grid(s: ShardKV, kv: str):  # parts are independent
        T = s.shape[0]
        n = _grid(T, transform)
        band = _bands(T, n)
        x = as_f32_2d(s.key if kv == "k" else s.value)
        mu = EQ.part_mean(x, sdt)
        sc = scales_of(token_scales(s, kv, weighting, gamma))
        c = coefficients(x, mu, n, sc)
        xs = x if sc is None else x * sc.astype(np.float32)[:, None]
        energy = float((xs.astype(np.float64) ** 2).sum()) + 1e-30
        sigma = math.sqrt(float((c ** 2).mean())) or 1.0
        floor = max(float(np.abs(c).max(initial=0.0)) / EQ.MAX_SYM, 1e-30)
        pts = []
        sample = sample_channels(c, s.shape[1])
        for jj in EQ.STEP_GRID:
            step = float(np.float32(max(sigma * 2.0 ** (-jj / 2.0), floor)))
            pts.append((step,) + _part_rd(c, band, step, energy, sample))
        return pts, (mu, c, band, energy, sc), sample

    jobs = [(s, j, kv) for s in shards for j, kv in enumerate(PARTS)]
    with _part_pool(shards) as pool:  # same arithmetic per part, in threads on large parts (exact)
        results = list(pool.map(lambda job: rd_grid(job[0], job[2]), jobs))
    for (s, j, kv), (pts, mean) in zip(jobs, results):
        part = (s.layer, kv)
        fine[part] = pts
        sens[part] = float(s.sensitivity[j]) if use_sensitivity else 1.0
        means[part] = mean
    return fine, sens, means, total_values, sdt


# ---------------------------------------------------------------------------------------------
# layout: token rows sorted by DCT band, so every band is one contiguous run of the flat (T*C,) array

BIG_BAND = 16384   # coefficients per band (mean) from which symbols are coded several at a time


@dataclass(frozen=True)
class Layout:
    T: int
    C: int
    grid: int
    perm: np.ndarray      # (T,) row order (stable sort by band)
    starts: np.ndarray    # (nb + 1,) flat offsets of each band's run

    @property
    def nbands(self) -> int:
        return self.starts.size - 1

    @property
    def big(self) -> bool:
        """Grouped coding (rung 0: four ternary symbols per ANS symbol, refinements up to 4 bits per
        symbol): 2-4x fewer ANS symbols, which is what decode time is made of at Klein sizes, for
        larger tables (per band 82 / 16 entries), which only pay off on large shards."""
        return self.T * self.C >= BIG_BAND * self.nbands

    @staticmethod
    def of(T: int, C: int, grid: int) -> "Layout":
        band = _bands(T, grid)
        perm = np.argsort(band, kind="stable")
        rows = np.searchsorted(band[perm], np.arange(int(band.max()) + 2))
        return Layout(T, C, grid, perm, rows.astype(np.int64) * C)

    def band_counts(self, mask: np.ndarray) -> np.ndarray:
        """(nb,) number of True in each band's run of a flat (T*C,) mask."""
        return np.array([np.count_nonzero(mask[a:b]) for a, b in zip(self.starts[:-1], self.starts[1:])], np.int64)

    def to_flat(self, c: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(c[self.perm]).reshape(-1)

    def from_flat(self, flat: np.ndarray) -> np.ndarray:
        out = np.empty((self.T, self.C), flat.dtype)
        out[self.perm] = flat.reshape(self.T, self.C)
        return out


_LAYOUTS: dict[tuple[int, int, int], Layout] = {}


def _layout(T: int, C: int, grid: int) -> Layout:
    """`Layout.of`, memoised (nothing writes a layout's arrays; read-only flags would make numba
    compile every kernel again for read-only array types): a decode need not sort the bands again."""
    key = (T, C, grid)
    if key not in _LAYOUTS:
        _LAYOUTS[key] = Layout.of(T, C, grid)
    return _LAYOUTS[key]


def group_size(m: int, big: bool) -> int:
    """Refinement symbols of m bits are coded g at a time (alphabet 2^(m g) <= 16) in big layouts."""
    return max(1, 4 // m) if big and m <= 4 else 1


def group(vals: np.ndarray, m: int, g: int) -> np.ndarray:
    """(n,) ints < 2^m -> (ceil(n/g),) ints < 2^(m g), zero-padded."""
    if g == 1:
        return vals.astype(np.int32)
    pad = (-vals.size) % g
    v = np.concatenate([vals, np.zeros(pad, vals.dtype)]).reshape(-1, g).astype(np.int32)
    return (v << (m * np.arange(g, dtype=np.int32))[None, :]).sum(axis=1, dtype=np.int32)


def ungroup(sym: np.ndarray, m: int, g: int, n: int) -> np.ndarray:
    if g == 1:
        return sym[:n]
    if m == 1 and g <= 8:  # one bit per value: numpy's bit unpacking is ~5x faster than shifts
        return np.unpackbits(sym.astype(np.uint8)[:, None], axis=1, count=g, bitorder="little").reshape(-1)[:n]
    v = (sym[:, None] >> (m * np.arange(g, dtype=np.int32))[None, :]) & ((1 << m) - 1)
    return v.reshape(-1)[:n]


QUAD_ESC = 81  # rung-0 quad symbol: 0..80 = four values in {-1, 0, 1} (base 3), 81 = escape
_QUAD_LUT = ((np.arange(82)[:, None] // 3 ** np.arange(4)[None, :]) % 3 - 1).astype(np.int32)  # (82, 4); row 81: escape


def quads(vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Signed (n,) rung-0 indices -> (ceil(n/4),) quad symbols and the escaped quads' values (4k,)."""
    pad = (-vals.size) % 4
    v = np.concatenate([vals, np.zeros(pad, vals.dtype)]).reshape(-1, 4)
    small = (np.abs(v) <= 1).all(axis=1)
    sym = np.where(small, ((v + 1) * 3 ** np.arange(4)[None, :]).sum(axis=1), QUAD_ESC).astype(np.int32)
    return sym, v[~small].reshape(-1)


# ---------------------------------------------------------------------------------------------
# symbols per rung (encoder side, in the band-sorted flat order)

@dataclass
class Stream:
    """One ANS stream over the bands: per band its symbols; `table` names it ("e0", "e0q", "e2")."""

    table: str
    alphabet: int
    per_band: list[np.ndarray]


@dataclass
class RungSymbols:
    m: int                              # planes added (0: nothing; rung 0: 0)
    streams: list[Stream]
    low: np.ndarray | None = None       # (n_sig,) m-bit refinements of significant coefficients
    signs: np.ndarray | None = None     # (n_new,) 1 = negative, for newly significant ones
    m0: int = 0                         # rung 0: symbol offset (alphabet 2 m0 + 1)


def rung_symbols(flat: np.ndarray, lay: Layout, step0: float, planes: list[int], m0: int | None = None
                 ) -> list[RungSymbols]:
    """Every rung's symbols for one part. m0: rung-0 offset (>= the part's max |index|; default that)."""
    a = np.abs(flat)
    neg = flat < 0
    q = np.floor(a / step0).astype(np.int64)
    m0 = max(1, int(q.max(initial=0))) if m0 is None else m0
    signed = np.where(neg, -q, q)
    bands = [signed[lay.starts[b]:lay.starts[b + 1]] for b in range(lay.nbands)]
    if lay.big:
        qs = [quads(v) for v in bands]
        base = [Stream("e0q", QUAD_ESC + 1, [x[0] for x in qs]), Stream("e0", 2 * m0 + 1, [x[1] + m0 for x in qs])]
    else:
        base = [Stream("e0", 2 * m0 + 1, [v + m0 for v in bands])]
    out = [RungSymbols(0, base, m0=m0)]
    for l in range(1, len(planes)):
        m = planes[l] - planes[l - 1]
        if m == 0:
            out.append(RungSymbols(0, []))
            continue
        qn = np.floor(a / (step0 * 2.0 ** -planes[l])).astype(np.int64)
        sig = q > 0
        insig = ~sig
        newi = qn[insig]
        offs = np.concatenate([[0], np.cumsum(lay.band_counts(insig))])
        g = group_size(m, lay.big)
        per_band = [group(newi[offs[b]:offs[b + 1]], m, g) for b in range(lay.nbands)]
        out.append(RungSymbols(m, [Stream(f"e{l}", 1 << (m * g), per_band)], low=qn[sig] - (q[sig] << m),
                               signs=neg[insig][newi > 0].astype(np.uint8)))
        q = qn
    return out


def _band_hist(per_band: list[np.ndarray], A: int) -> np.ndarray:
    return np.stack([np.bincount(s, minlength=A)[:A] for s in per_band]).astype(np.uint32)


# ---------------------------------------------------------------------------------------------
# tables

def fit_tables(codec: str, params: dict[str, Any], shards: Sequence[ShardKV]) -> CodecTables:
    """Per part: channel mean, plan [step0, planes...], and per rung and stream the band histograms
    (uint8 log-counts), from one template's shards."""
    return fit_library_tables(codec, params, [list(shards)])


def fit_library_tables(codec: str, params: dict[str, Any], templates: Sequence[Sequence[ShardKV]]) -> CodecTables:
    """Tables for a template library (per model; one template: per template). Each template's plan
    is allocated on its own; the library's plan per part takes the median rung-0 step (in log) and
    the median planes, its mean the mean of the templates' means; the histograms are then counted
    over every template coded with that plan (rung-0 alphabet: the widest needed)."""
    budgets = [float(b) for b in params["budgets"]]
    wt, gm = params.get("weighting", "none"), float(params.get("gamma", 1.0))
    per_tpl = []
    for shards in templates:
        use_sens, use_img = allocation_modes(params["allocate"], shards)
        per_tpl.append(plan_parts(shards, budgets, params["transform"], use_sens, wt, gm, use_img))
    plans: dict[tuple[int, str], PartPlan] = {}
    for part in per_tpl[0]:
        ps = [pt[part] for pt in per_tpl if part in pt]
        if len(ps) == 1:
            plans[part] = ps[0]
            continue
        mean = np.mean(np.stack([p.mean.astype(np.float64) for p in ps]), 0).astype(ps[0].mean.dtype)
        step0 = float(np.exp2(np.median(np.log2([p.step0 for p in ps]))))
        planes = [int(x) for x in np.round(np.median(np.array([p.planes for p in ps]), 0))]
        planes = [planes[0]] + [max(a, b) for a, b in zip(planes, planes[1:])]  # keep them non-decreasing
        offs = [min(OFFSETS, key=lambda o: abs(o - x)) for x in np.median(np.array([p.offs() for p in ps]), 0)]
        plans[part] = PartPlan(mean, float(np.float32(step0)), planes, offs)
    counts: dict[str, np.ndarray] = {}
    m0s: dict[tuple[int, str], int] = {}
    rungs_of: dict[tuple[int, str], list] = {}
    for shards in templates:  # pass 1: the rung-0 alphabet every template needs
        for s in shards:
            T, H, D = s.shape
            lay = Layout.of(T, H * D, _grid(T, params["transform"]))
            for kv in PARTS:
                p = plans[(s.layer, kv)]
                c, sample = _fitted_coefficients(s, kv, p.mean, params["transform"], wt, gm)
                if c is None:  # a library's mean: this template's coefficients around it
                    sc = scales_of(token_scales(s, kv, wt, gm))
                    c = coefficients(as_f32_2d(s.key if kv == "k" else s.value), p.mean, lay.grid, sc)
                need = max(1, int(np.floor(np.abs(c).max(initial=0.0) / p.step0)))
                m0s[(s.layer, kv)] = max(m0s.get((s.layer, kv), 1), need)
                if sample is None:
                    rungs_of.setdefault((s.layer, kv), []).append((lay.to_flat(c), lay, 1.0))
                else:  # the histograms counted on the step grid's channel sample, scaled to the part
                    sl = _SampledLayout.of(T, sample[0].shape[1], lay.grid)
                    sl = _SampledLayout(sl.T, sl.C, sl.grid, sl.perm, sl.starts, part_big=lay.big)
                    rungs_of.setdefault((s.layer, kv), []).append((sl.to_flat(sample[0]), sl, sample[1]))
    for part, items in rungs_of.items():  # pass 2: histograms with the library's plan and alphabet
        p = plans[part]
        pre = f"L{part[0]}.{part[1]}"
        for flat, lay, weight in items:
            for rs in rung_symbols(flat, lay, p.step0, p.planes, m0s[part]):
                for st in rs.streams:
                    h = _band_hist(st.per_band, st.alphabet).astype(np.float64) * weight
                    key = f"{pre}.{st.table}"
                    counts[key] = counts[key] + h if key in counts and counts[key].shape == h.shape else h
    arrays: dict[str, np.ndarray] = {}
    for (layer, kv), p in plans.items():
        arrays[f"L{layer}.{kv}.mean"] = p.mean
        arrays[f"L{layer}.{kv}.plan"] = np.array([p.step0] + p.planes, np.float64)
        if any(o != 0.5 for o in p.offs()):
            arrays[f"L{layer}.{kv}.off"] = np.array(p.offs(), np.float64)
    arrays.update({k: pack_counts(v) for k, v in counts.items()})
    meta = {"params": params} if len(templates) == 1 else {"params": params, "library_templates": len(templates)}
    return CodecTables(codec=codec, arrays=arrays, meta=meta)


pack_counts = E.pack_counts


def _fitted_coefficients(s: ShardKV, kv: str, mean: np.ndarray, transform: str, weighting: str,
                         gamma: float) -> tuple[np.ndarray | None, tuple[np.ndarray, float] | None]:
    """The coefficients the plan's step grid computed for this part around `mean` and their
    channel sample (`_step_grids`' cache: the same arrays), or (None, None): the fit of one
    template's tables transforms a part once, not twice, and counts a large part's rung symbols
    on the sample (on a Klein-4B 1024^2 part the symbols of every rung were ~half the fit)."""
    for key, val in s.fit_cache.items():
        if key[:5] == ("rd", kv, transform, weighting, float(gamma)) and val[1][0] is mean:
            return val[1][1], s.fit_cache.get(("rd-sample",) + key[1:])
    return None, None


@dataclass(frozen=True)
class _SampledLayout(Layout):
    """A channel sample's band layout whose symbols are grouped as its whole part's are (`big`
    from the part): its histograms then fill the part's tables."""

    part_big: bool = False

    @property
    def big(self) -> bool:
        return self.part_big


def _models_of(table: np.ndarray) -> R.Model:
    """rANS model of a stored (bands, A) uint8 log-count table (one row per band context): the
    counts x COUNT_SCALE + 1 smoothing as before, quantised to `R.prob_bits(A)` bits."""
    t = np.asarray(table)
    cnt = (np.exp2(t.astype(np.float64) / 8.0) - 1.0) * EQ.COUNT_SCALE if t.dtype == np.uint8 else t
    return R.Model.from_counts(cnt)


# ---------------------------------------------------------------------------------------------
# the payload of one object: byte chunks in a fixed order, behind a u32 length table (one section:
# a section entry in the JSON header costs ~50 bytes, a lot against a mini model's rung objects)

def pack_chunks(chunks: list[bytes]) -> np.ndarray:
    head = np.array([len(chunks)] + [len(c) for c in chunks], "<u4").tobytes()
    return np.frombuffer(head + b"".join(chunks), np.uint8)


class Chunks:
    """Reader over `pack_chunks` output; every read checks bounds and raises `CorruptError`."""

    def __init__(self, buf: np.ndarray) -> None:
        b = buf.tobytes()
        if len(b) < 4:
            raise bs.CorruptError("progressive payload too short")
        n = int(np.frombuffer(b[:4], "<u4")[0])
        if n > 64 or len(b) < 4 + 4 * n:
            raise bs.CorruptError("progressive payload has a bad chunk table")
        lens = np.frombuffer(b[4:4 + 4 * n], "<u4").astype(np.int64)
        if 4 + 4 * n + int(lens.sum()) != len(b):
            raise bs.CorruptError("progressive payload chunk lengths do not add up")
        self._b, self._lens, self._i, self._at = b, lens, 0, 4 + 4 * n

    def next(self, dtype: str = "|u1", shape: tuple[int, ...] | None = None) -> np.ndarray:
        if self._i >= self._lens.size:
            raise bs.CorruptError("progressive payload has too few chunks")
        n = int(self._lens[self._i])
        raw = self._b[self._at:self._at + n]
        self._i += 1
        self._at += n
        dt = np.dtype(dtype)
        if n % dt.itemsize:
            raise bs.CorruptError(f"chunk of {n} bytes is not a whole number of {dtype}")
        a = np.frombuffer(raw, dt)
        if shape is not None:
            if a.size != int(np.prod(shape)):
                raise bs.CorruptError(f"chunk has {a.size} values, expected shape {shape}")
            a = a.reshape(shape)
        return a

    def done(self) -> None:
        if self._i != self._lens.size:
            raise bs.CorruptError("progressive payload has unread chunks")


# ---------------------------------------------------------------------------------------------
# encode

def zero_symbol(table: str, m0: int) -> int:
    """The symbol an all-zero band is made of (such bands are flagged and not coded)."""
    return K.QUAD_ZERO if table == "e0q" else m0 if table == "e0" else 0


def _rans_streams(streams: list[Stream], models: list[R.Model], m0: int) -> list[bytes]:
    """Each stream of one rung of one part as its own rANS stream over the bands (one context per
    band). Flagged streams (all but rung 0's escapes, whose counts follow from the quads) skip
    bands made only of the zero symbol. -> chunks: per stream [flags,] words (<u2), piece word
    counts (<u4)."""
    out: list[bytes] = []
    for st, model in zip(streams, models):
        escapes = st.table == "e0" and streams[0].table == "e0q"
        if escapes:
            lens = np.array([v.size for v in st.per_band], np.int64)
        else:
            z = zero_symbol(st.table, m0)
            nz = np.array([bool(v.size and (v != z).any()) for v in st.per_band], np.uint8)
            lens = np.array([v.size if f else 0 for v, f in zip(st.per_band, nz)], np.int64)
            out.append(np.packbits(nz).tobytes())
        sc, sl = R.segments_of(lens)
        sym = np.concatenate([st.per_band[b] for b in sc] + [np.zeros(0, np.int32)]).astype(np.int32)
        words, counts = R.encode(sym, sc, sl, model)
        out += [words.tobytes(), counts.tobytes()]
    return out


def encode_levels(codec, shard: ShardKV, ident: ShardId, tables: CodecTables | None) -> list[bytes]:
    """One object per rung: [base, refinement 1, ...] (rung l = the first l+1 objects)."""
    shard.validate()
    p = codec.params
    T, H, D = shard.shape
    C = H * D
    lay = Layout.of(T, C, _grid(T, p["transform"]))
    levels = len(p["budgets"])
    wt, gm = p.get("weighting", "none"), float(p.get("gamma", 1.0))
    if tables is None:
        use_sens, use_img = allocation_modes(p["allocate"], [shard])
        plans = plan_parts([shard], [float(b) for b in p["budgets"]], p["transform"], use_sens, wt, gm, use_img)
    else:
        plans = {}
        for kv in PARTS:
            pre = f"L{shard.layer}.{kv}"
            mu, plan = tables.get(f"{pre}.mean"), tables.get(f"{pre}.plan")
            if mu.shape != (C,) or plan.shape != (1 + levels,):
                raise bs.IdentityError(f"codec tables for layer {shard.layer} do not fit this shard or ladder")
            off = tables.arrays.get(f"{pre}.off")
            if off is not None and (off.shape != (levels,) or not all(float(o) in OFFSETS for o in off)):
                raise bs.IdentityError(f"codec tables for layer {shard.layer} have bad reconstruction offsets")
            plans[(shard.layer, kv)] = PartPlan(mu, float(plan[0]), [int(x) for x in plan[1:]],
                                                None if off is None else [float(o) for o in off])
    chunks: list[list[bytes]] = [[] for _ in range(levels)]
    own: list[list[int]] = [[] for _ in range(levels)]
    info: dict[str, Any] = {}
    for kv in PARTS:
        pl = plans[(shard.layer, kv)]
        pre = f"L{shard.layer}.{kv}"
        codes = token_scales(shard, kv, wt, gm)
        flat = lay.to_flat(coefficients(as_f32_2d(shard.key if kv == "k" else shard.value), pl.mean, lay.grid,
                                        scales_of(codes)))
        m0 = None
        if tables is not None and f"{pre}.e0" in tables.arrays:  # use the table's rung-0 alphabet if wide enough
            need = max(1, int(np.floor(np.abs(flat).max(initial=0.0) / pl.step0)))
            width = (tables.arrays[f"{pre}.e0"].shape[1] - 1) // 2
            m0 = width if need <= width else None
        rungs = rung_symbols(flat, lay, pl.step0, pl.planes, m0)
        if tables is None:
            chunks[0].append(np.asarray(pl.mean).astype(pl.mean.dtype.newbyteorder("<")).tobytes())
        if codes is not None:  # after the mean: the order the reader takes them in (docs/wire-format.md)
            chunks[0].append(codes.tobytes())
        for l, rs in enumerate(rungs):
            if l > 0 and rs.m == 0:
                continue
            models, own_here = [], 0
            for st in rs.streams:
                table = tables.arrays.get(f"{pre}.{st.table}") if tables is not None else None
                if table is not None and table.shape == (lay.nbands, st.alphabet):
                    models.append(tables.cached(f"rans:{pre}.{st.table}", lambda t=table: _models_of(t)))
                else:  # no tables, or symbols beyond the table's alphabet: carry the histograms
                    own_here = 1
                    models.append(None)
            if own_here:
                hists = [pack_counts(_band_hist(st.per_band, st.alphabet)) for st in rs.streams]
                chunks[l] += [h.tobytes() for h in hists]
                models = [_models_of(h) for h in hists]
            own[l].append(own_here)
            chunks[l] += _rans_streams(rs.streams, models, rs.m0 if l == 0 else 0)
            if l == 0:
                info[kv] = {"step": pl.step0, "planes": pl.planes, "m0": rs.m0, "grid": lay.grid,
                            "mean": pl.mean.dtype.newbyteorder("<").str, "scaled": codes is not None}
            else:
                chunks[l] += [Q.pack(rs.low, rs.m).tobytes() if rs.low.size else b"",
                              np.packbits(rs.signs).tobytes() if rs.signs.size else b""]
    version = FORMAT_VERSION   # 5: every part says its offsets; the header may use the dictionary
    for kv in PARTS:
        info[kv]["off"] = [float(o) for o in plans[(shard.layer, kv)].offs()]
    out: list[bytes] = []
    for l in range(levels):
        w = bs.Writer()
        w.add("p", pack_chunks(chunks[l]))
        if l == 0:
            h = codec._header(shard, ident, tables, levels=levels, prog=info, level=0, own=own[0])
            h["id"] = ident.to_compact_json()   # version 5
            h["params"] = {k: p[k] for k in ("budgets", "quantiser", "transform", "allocate") if k in p}
            if codec.name == "layered":  # a `layered:quantiser="ecsq"` ladder: its header must say so
                h["params"]["quantiser"] = "ecsq"
            out.append(w.to_bytes(bs.KIND_SHARD, h, version, header_dict=version >= 5))
        else:  # bound to its base by the parent's checksum; the base carries identity and shape
            out.append(w.to_bytes(bs.KIND_LAYER, {"level": l, "own": own[l], "parent_crc": zlib.crc32(out[-1])},
                                  version, header_dict=version >= 5))
    return out


# ---------------------------------------------------------------------------------------------
# decode

#: "native": libsakura_decode (`native`) where it covers the object, else the numba kernels;
#: "numba": the numba kernels (the reference the C library is tested against, and its fallback);
#: "reference": plain Python and numpy
ENGINES = ("native", "numba", "reference")
#: a refinement that changes at most this share of a part's coefficients (significant ones + new
#: ones) runs sparse (`ProgressiveState._refine_sparse`): on the Klein layer, rung 2 refines K at
#: ~2 %; the dense merge (`kernels.refine`) is faster where ~30 % change (V at rung 1: branches)
SPARSE_REFINE = 0.08


def _band_cuts(lay: "Layout", units: int = 16) -> np.ndarray:
    """Band indices cutting [0, nbands) into <= `units` runs of about equal coefficient counts
    (the ranges `run_split` hands to threads; bands differ ~n-fold in size)."""
    key = (lay.T, lay.C, lay.grid, units)
    if key not in _CUTS:
        want = np.linspace(0, lay.starts[-1], units + 1)
        cuts = np.unique(np.searchsorted(lay.starts, want[1:-1]))
        _CUTS[key] = np.unique(np.concatenate([[0], cuts, [lay.nbands]])).astype(np.int64)
    return _CUTS[key]


_CUTS: dict[tuple[int, int, int, int], np.ndarray] = {}


def magnitude_dtype(m0: int, planes: Sequence[int]) -> type:
    """The native decoder's magnitude array dtype for a part: int16 where every rung's magnitudes
    fit (a rung-0 index is <= m0 and each plane appends one bit, so after the last plane a
    magnitude is < (m0 + 1) 2^planes[-1]; true of any stream, damaged or not, since the kernels
    build magnitudes only so), else int32. Every pass over the magnitudes (expansion, refinement,
    the inverse DCT's reconstruction) moves 2 bytes per value instead of 4: at 4,096 tokens a part's
    magnitudes are 25 MB instead of 50, out of cache either way. (The default ladder: m0 <= 30,
    <= 2 planes.)"""
    return np.int16 if (m0 + 1) << int(planes[-1]) <= 1 << 15 else np.int32


@dataclass
class ProgressiveState(LadderState):
    """Decoded magnitudes/signs of a shard at some rung; `upgrade` adds the next rung in place.

    `engine`: "numba" (or "native": numba kernels in `rans` / `kernels`, the GIL released throughout) or
    "reference" (plain Python rANS and numpy, the straightforward decoder the native one is
    tested against bit for bit)."""

    engine: str = "native"
    version: int = FORMAT_VERSION
    level: int = -1
    last_crc: int = 0
    mag: dict[str, np.ndarray] = field(default_factory=dict)   # flat (T*C,) int32, band-sorted
    neg: dict[str, np.ndarray] = field(default_factory=dict)   # flat (T*C,) uint8 (1 = negative)
    mean: dict[str, np.ndarray] = field(default_factory=dict)
    scale: dict[str, np.ndarray | None] = field(default_factory=dict)   # per-token weights (T,) or None
    layout: Layout | None = None
    pool: Executor | None = None   # native: threads that share this one shard (rANS pieces, channel blocks)
    borrow: bool = False           # native, one-shot decodes: magnitudes/signs in the thread's scratch memory
    zeros: dict[str, np.ndarray] = field(default_factory=dict)   # native: (nb,) zero magnitudes per band

    def _part(self, kv: str) -> tuple[float, list[int], int, int]:
        e = self.header["prog"][kv]
        return float(e["step"]), [int(x) for x in e["planes"]], int(e["m0"]), int(e["grid"])

    def _off(self, kv: str) -> float:
        """The reconstruction offset of part `kv` at the current rung (1/2 in version-4 objects)."""
        off = self.header["prog"][kv].get("off")
        return 0.5 if off is None else float(off[self.level])

    def _streams_models(self, rd: Chunks, own: Any, i: int, names: list[tuple[str, int]]) -> list[R.Model]:
        if not isinstance(own, list) or i >= len(own) or own[i] not in (0, 1):
            raise bs.CorruptError(f"{self.codec.name}: object does not say where its histograms are")
        layer = int(self.header.get("layer", 0))
        kv = PARTS[i]
        nb = self.layout.nbands
        out = []
        if own[i] or self.tables is None:
            for _name, A in names:
                out.append(_models_of(rd.next("|u1", (nb, A))))
            return out
        for name, A in names:
            full = f"L{layer}.{kv}.{name}"
            t = self.tables.get(full)
            if t.shape != (nb, A) or t.dtype != np.uint8:
                raise bs.CorruptError(f"{self.codec.name}: table {full} has shape {t.shape}, expected {(nb, A)}")
            out.append(self.tables.cached(f"rans:{full}", lambda t=t: _models_of(t)))
        return out

    def _stream(self, rd: Chunks, model: R.Model, lens: np.ndarray, flagged: bool, name: str = "sym"
                ) -> tuple[np.ndarray, np.ndarray]:
        """Read one rANS stream over the bands (`lens` symbols per band if flagged nonzero) ->
        (symbols of the coded bands, (nb,) uint8 flags). Native: the symbols are in the thread's
        scratch buffer `name`, valid until the next stream of that name."""
        nb = self.layout.nbands
        if flagged:
            raw = rd.next("|u1")
            if raw.size != (nb + 7) // 8:
                raise bs.CorruptError(f"{self.codec.name}: band flags malformed")
            nz = np.unpackbits(raw, count=nb)
        else:
            nz = np.ones(nb, np.uint8)
        sc, sl = R.segments_of(np.where(nz > 0, lens, 0))
        words, counts = rd.next("<u2"), rd.next("<u4")
        if self.engine == "reference":
            return R.decode_reference(words, counts, sc, sl, model), nz
        out = K.scratch(name, int(sl.sum()), np.int32)
        return R.decode(words, counts, sc, sl, model, out=out, pool=self.pool), nz

    def _base_part(self, rd: Chunks, obj: bs.Object, i: int, kv: str) -> tuple[list[R.Model], int]:
        """Check part `kv`'s base header entry, read its mean, token scales and rung-0 models
        (the chunks before its streams) -> (models, m0); sets the layout."""
        T, H, D = self.shape
        C = H * D
        prog = self.header["prog"]
        levels = self.header.get("levels")
        layer = self.header.get("layer", 0)
        try:
            step, planes, m0, n = self._part(kv)
            mean_dt = np.dtype(prog[kv]["mean"])
        except (KeyError, TypeError, ValueError):
            raise bs.CorruptError(f"{self.codec.name}: bad progressive header {prog.get(kv)!r}") from None
        off = prog[kv].get("off")
        if (off is not None) != (self.version == 5) or (off is not None and (
                not isinstance(off, list) or len(off) != len(planes)
                or not all(isinstance(o, float) and 0.0 <= o < 1.0 for o in off))):
            raise bs.CorruptError(f"{self.codec.name}: bad reconstruction offsets {off!r} (format version {self.version})")
        if (not (math.isfinite(step) and step > 0) or not 1 <= m0 <= R.MAX_ALPHABET // 2 - 1
                or not isinstance(levels, int) or len(planes) != levels
                or planes[0] != 0 or any(b < a for a, b in zip(planes, planes[1:])) or planes[-1] > MAX_PLANES
                or not (n == 0 or n * n == T) or mean_dt.str not in ("<f2", "<f4")):
            raise bs.CorruptError(f"{self.codec.name}: bad progressive header {prog[kv]!r}")
        if self.layout is None or self.layout.grid != n:
            self.layout = _layout(T, C, n)
        lay = self.layout
        mu = self.tables.get(f"L{layer}.{kv}.mean") if self.tables is not None else rd.next(mean_dt.str, (C,))
        if mu.shape != (C,) or mu.dtype.kind != "f" or not np.isfinite(mu).all():
            raise bs.CorruptError(f"{self.codec.name}: {kv} mean has shape {mu.shape} or is not finite")
        self.mean[kv] = mu
        scaled = prog[kv].get("scaled", False)
        if not isinstance(scaled, bool):
            raise bs.CorruptError(f"{self.codec.name}: bad progressive header {prog[kv]!r}")
        self.scale[kv] = scales_of(rd.next("|u1", (T,))) if scaled else None
        names = [("e0q", QUAD_ESC + 1), ("e0", 2 * m0 + 1)] if lay.big else [("e0", 2 * m0 + 1)]
        return self._streams_models(rd, obj.header.get("own"), i, names), m0

    def _check_start(self, obj: bs.Object) -> None:
        bs.require_version(obj, READ_VERSIONS, self.codec.name)
        self.version = obj.version
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}")
        prog = self.header.get("prog")
        if not isinstance(prog, dict) or set(prog) != set(PARTS):
            raise bs.CorruptError(f"{self.codec.name}: progressive header missing")

    def start(self, obj: bs.Object, crc: int) -> None:
        self._check_start(obj)
        T, H, D = self.shape
        C = H * D
        rd = Chunks(obj.section("p"))
        for i, kv in enumerate(PARTS):
            models, m0 = self._base_part(rd, obj, i, kv)
            lay = self.layout
            sizes = np.diff(lay.starts)
            if self.engine == "reference":
                self.mag[kv], self.neg[kv] = self._rung0_reference(rd, models, sizes, m0)
                continue
            mdt = magnitude_dtype(m0, self._part(kv)[1])
            if self.borrow:
                mag, neg = K.scratch(f"mag.{kv}", T * C, mdt), K.scratch(f"neg.{kv}", T * C, np.uint8)
            else:
                mag, neg = np.empty(T * C, mdt), np.empty(T * C, np.uint8)
            zeros = np.empty(lay.nbands, np.int64)
            if lay.big:
                qsym, nzq = self._stream(rd, models[0], -(-sizes // 4), True, "qsym")
                esc_count = np.empty(lay.nbands, np.int64)
                ne = K.quad_escape_counts(qsym, nzq, lay.starts, esc_count)
                if ne < 0:
                    raise bs.CorruptError(f"{self.codec.name}: quad symbols do not cover the bands")
                ev, _ = self._stream(rd, models[1], 4 * esc_count, False)
                if ev.size != 4 * ne:
                    raise bs.CorruptError(f"{self.codec.name}: escape symbols do not match the quads")
                # one pass over quads and escapes (the escape stream decoded first; its per-band
                # counts come from a scan of the quad symbols): the escaped quads are written once
                K.expand_quads_escapes(qsym, nzq, lay.starts, m0, ev, mag, neg, zeros)
            else:
                sym, nz = self._stream(rd, models[0], sizes, True)
                if not K.signed_to_mag(sym, nz, lay.starts, m0, mag, neg, zeros):
                    raise bs.CorruptError(f"{self.codec.name}: symbols do not cover the bands")
            self.mag[kv], self.neg[kv], self.zeros[kv] = mag, neg, zeros
        rd.done()
        self.level, self.last_crc = 0, crc

    def _rung0_reference(self, rd: Chunks, models: list[R.Model], sizes: np.ndarray, m0: int
                         ) -> tuple[np.ndarray, np.ndarray]:
        lay = self.layout
        q = np.zeros(lay.T * lay.C, np.int32)
        if lay.big:
            qsym, nzq = self._stream(rd, models[0], -(-sizes // 4), True)
            at, esc_at = 0, []
            for b in range(lay.nbands):
                if not nzq[b]:
                    continue
                a, e = int(lay.starts[b]), int(lay.starts[b + 1])
                nq = -(-(e - a) // 4)
                sym = qsym[at:at + nq]
                if sym.size != nq:
                    raise bs.CorruptError(f"{self.codec.name}: quad symbols do not cover the bands")
                at += nq
                q[a:e] = _QUAD_LUT[np.where(sym == QUAD_ESC, K.QUAD_ZERO, sym)].reshape(-1)[:e - a]
                esc_at.append((b, a + 4 * np.flatnonzero(sym == QUAD_ESC), e))
            if at != qsym.size:
                raise bs.CorruptError(f"{self.codec.name}: quad symbols do not cover the bands")
            counts = np.zeros(lay.nbands, np.int64)
            for b, pos, _e in esc_at:
                counts[b] = pos.size
            ev, _ = self._stream(rd, models[1], 4 * counts, False)
            at = 0
            for _b, pos, e in esc_at:
                for p0 in pos:
                    for i in range(4):
                        if p0 + i < e:
                            q[p0 + i] = ev[at + i] - m0
                    at += 4
        else:
            sym, nz = self._stream(rd, models[0], sizes, True)
            at = 0
            for b in range(lay.nbands):
                if nz[b]:
                    a, e = int(lay.starts[b]), int(lay.starts[b + 1])
                    if at + e - a > sym.size:
                        raise bs.CorruptError(f"{self.codec.name}: symbols do not cover the bands")
                    q[a:e] = sym[at:at + e - a] - m0
                    at += e - a
            if at != sym.size:
                raise bs.CorruptError(f"{self.codec.name}: symbols do not cover the bands")
        return np.abs(q), (q < 0).astype(np.uint8)

    def upgrade(self, piece: bytes) -> "ProgressiveState":
        """Apply the next rung's object (in place; returns self). Mismatches raise `IdentityError`."""
        obj = self._check_refinement(piece, self.level + 1, self.last_crc)
        l = self.level + 1
        lay = self.layout
        rd = Chunks(obj.section("p"))
        own = obj.header.get("own")
        j = 0
        for kv in PARTS:
            step, planes, _m0, _n = self._part(kv)
            if l >= len(planes):
                raise bs.CorruptError(f"{self.codec.name}: refinement level {l} beyond the ladder's {len(planes)}")
            m = planes[l] - planes[l - 1]
            if m == 0:
                continue
            g = group_size(m, lay.big)
            mag, neg = self.mag[kv], self.neg[kv]
            if not isinstance(own, list) or j >= len(own):
                raise bs.CorruptError(f"{self.codec.name}: object does not say where its histograms are")
            models = self._streams_models(rd, [own[j]] * 2, PARTS.index(kv), [(f"e{l}", 1 << (m * g))])
            j += 1
            if self.engine == "reference":
                self._refine_reference(rd, models[0], kv, m, g)
                continue
            counts = self.zeros.get(kv)
            if counts is None:   # (a state whose magnitudes were set otherwise)
                counts = np.empty(lay.nbands, np.int64)
                K.insignificant_counts(mag, lay.starts, counts)
            sym, nz = self._stream(rd, models[0], -(-counts // g), True)
            raw, sraw = rd.next(), rd.next()
            pad = np.zeros(4, np.uint8)  # the kernels read whole 3-byte windows past the last bit
            nins = int(counts.sum())
            nsig = mag.size - nins
            low, signs = np.concatenate([raw, pad]), np.concatenate([sraw, pad])
            sptr = np.empty(lay.nbands + 1, np.int64)
            became = np.empty(lay.nbands, np.int64)
            if not K.refinement_counts(sym, nz, counts, m, g, sptr, became):
                raise bs.CorruptError(f"{self.codec.name}: refinement symbols do not cover the bands")
            nbec = int(became.sum())
            if nsig * m > raw.size * 8 or nbec > sraw.size * 8:
                raise bs.CorruptError(f"refinement or sign bits {kv} too short")
            self.zeros[kv] = counts - became   # the next refinement's counts, without a pass over mag
            if nsig + nbec <= SPARSE_REFINE * mag.size:
                self._refine_sparse(kv, counts, sym, nz, sptr, m, g, low, signs, sraw.size * 8, became)
                continue
            err = K.refine(mag, neg, lay.starts, nz, counts, sym, m, g, low, signs,
                           K.scratch("lowv", nsig + 1 + K.VECTOR_PAD, np.int16),
                           K.scratch("newv", nins + 1 + K.VECTOR_PAD, np.int16),
                           K.scratch("sv", nins + 1 + K.VECTOR_PAD, np.uint8), K.VECTOR_LANES)
            if err == 2:
                raise bs.CorruptError(f"{self.codec.name}: refinement symbols do not cover the bands")
            if err:
                raise bs.CorruptError(f"refinement or sign bits {kv} too short")
        rd.done()
        self.level, self.last_crc = l, obj.whole_crc()
        return self

    def _refine_sparse(self, kv: str, counts: np.ndarray, sym: np.ndarray, nz: np.ndarray, sptr: np.ndarray, m: int,
                       g: int, low: np.ndarray, signs: np.ndarray, nsign: int, became: np.ndarray) -> None:
        """A refinement that changes few coefficients (`SPARSE_REFINE`), touching only those
        (`kernels.refine_sparse`): the positions of the significant ones (one scan), then their
        low bits and the new significant ones, band ranges split over `pool`."""
        lay = self.layout
        mag, neg = self.mag[kv], self.neg[kv]
        sigptr = np.zeros(lay.nbands + 1, np.int64)
        np.cumsum(np.diff(lay.starts) - counts, out=sigptr[1:])
        sigpos = K.scratch("sigpos", int(sigptr[-1]), np.int32)
        if not K.sig_positions(mag, lay.starts, sigptr, sigpos, K.VECTOR_LANES):
            raise bs.CorruptError(f"{self.codec.name}: significant coefficients disagree with their counts")
        sbit0 = np.zeros(lay.nbands, np.int64)
        np.cumsum(became[:-1], out=sbit0[1:])
        cuts = _band_cuts(lay)
        got = np.empty(lay.nbands, np.int64)
        newpos, newval = K.scratch("newpos", nsign + 1, np.int32), K.scratch("newval", nsign + 1, np.int16)
        errs = R.run_split(self.pool, lambda a, b: K.refine_sparse(
            int(cuts[a]), int(cuts[b]), lay.starts, counts, sym, nz, sptr, m, g, low, sigptr[:-1] * m, signs, sbit0,
            nsign, sigpos, sigptr, mag, neg, got, newpos, newval), cuts.size - 1)
        if any(errs):
            raise bs.CorruptError(f"refinement or sign bits {kv} too short")

    def _check_refinement(self, piece: bytes, level: int, parent_crc: int) -> bs.Object:
        obj = bs.parse(piece)
        if obj.kind != bs.KIND_LAYER:
            raise bs.IdentityError(f"expected a refinement object, got kind {obj.kind}")
        bs.require_version(obj, self.version, self.codec.name)   # a refinement has its base's version
        h = obj.header
        if h.get("level") != level:
            raise bs.IdentityError(f"refinement object is level {h.get('level')!r}; expected {level}")
        if h.get("parent_crc") != parent_crc:
            raise bs.IdentityError("refinement object does not refine this base (parent checksum differs)")
        return obj

    def _refine_reference(self, rd: Chunks, model: R.Model, kv: str, m: int, g: int) -> None:
        lay = self.layout
        mag, neg = self.mag[kv], self.neg[kv]
        insig = mag == 0
        counts = lay.band_counts(insig)
        n_ins = int(counts.sum())
        sym, nz = self._stream(rd, model, -(-counts // g), True)
        newi = np.zeros(n_ins, np.int32)
        at, sat = 0, 0
        for b in range(lay.nbands):
            if nz[b]:
                ns = -(-int(counts[b]) // g)
                newi[at:at + counts[b]] = ungroup(sym[sat:sat + ns], m, g, int(counts[b]))
                sat += ns
            at += int(counts[b])
        raw = rd.next()
        nsig = mag.size - n_ins
        if raw.size * 8 < nsig * m:
            raise bs.CorruptError(f"refinement or sign bits {kv} too short")
        became = newi > 0
        nb_new = int(np.count_nonzero(became))
        sraw = rd.next()
        if sraw.size * 8 < nb_new:
            raise bs.CorruptError(f"refinement or sign bits {kv} too short")
        iins = np.flatnonzero(insig)
        add = np.empty(mag.size, np.int32)
        if nsig:
            add[np.flatnonzero(~insig)] = Q.unpack(raw, m, nsig)
        add[iins] = newi
        mag <<= m
        mag |= add
        if nb_new:  # insignificant coefficients had no sign yet
            neg[iins[np.flatnonzero(became)]] = np.unpackbits(sraw, count=nb_new)

    def coefficients(self, kv: str) -> np.ndarray:
        """(T, C) float32 dequantised coefficients of part `kv` at the current rung, token-grid order."""
        T, H, D = self.shape
        lay = self.layout
        step, planes, _m0, _n = self._part(kv)
        st = np.float32(step * 2.0 ** -planes[self.level])
        mag, neg = self.mag[kv], self.neg[kv]
        if self.engine != "reference":
            out = np.empty((T, H * D), np.float32)
            K.reconstruct(mag, neg, lay.perm, H * D, st, self._off(kv), out)
            return out
        # (mag + off) step where mag > 0, else 0; negative where flagged
        c = mag.astype(np.float32)
        c += np.float32(self._off(kv))
        c[mag == 0] = 0.0
        c *= st
        c[neg > 0] *= -1.0
        return lay.from_flat(c)

    def result(self) -> LayerKV:
        T, H, D = self.shape
        out = []
        for kv in PARTS:
            n = self._part(kv)[3]
            if self.engine != "reference" and n and (fastdct.fits(n, H * D) or n not in fastdct.SIZES):
                out.append(self._result_blocked(kv, n))
                continue
            # (the numba engine too where C is no multiple of the fused kernel's block: toy shapes
            # such as the wire-format vectors' 8 channels, so that every decoder uses Lee's inverse
            # on every power-of-two grid and the C library matches it bit for bit)
            x = self.coefficients(kv)
            x = (fastdct.inverse_2d(x, n) if n in fastdct.SIZES else inverse_f32(x, n)) if n else x
            if self.scale.get(kv) is not None:
                x /= self.scale[kv].astype(np.float32)[:, None]
            x += self.mean[kv].astype(np.float32)[None, :]
            out.append(from_f32_2d(x, self.shape, self.dtype))
        res = LayerKV(out[0], out[1], torch.ones(T, dtype=torch.bool))
        if self._bound() >= float(torch.finfo(self.dtype).max):  # only a forged step/mean gets here:
            finite(res, self.codec.name)                          # check every value
        return res

    def _result_blocked(self, kv: str, n: int) -> torch.Tensor:
        if fastdct.fits(n, self.shape[1] * self.shape[2]):
            return self._result_fast(kv, n)
        return self._result_matmul(kv, n)

    def _result_fast(self, kv: str, n: int) -> torch.Tensor:
        """The native path of `result` for one part with the fast inverse DCT (`fastdct`): one
        fused numba kernel per channel block (the reconstruction into an L2-resident block buffer,
        both DCT passes, token scales, mean and fp16 bits). Equal to the reference path
        (`reconstruct`, then `fastdct.inverse_2d`) bit for bit: the same float32 operations."""
        T, H, D = self.shape
        C = H * D
        step, planes, _m0, _n = self._part(kv)
        st = float(np.float32(step * 2.0 ** -planes[self.level]))
        cb = fastdct.block_channels(n)
        mag, neg, perm = self.mag[kv], self.neg[kv], self.layout.perm
        mu = np.ascontiguousarray(self.mean[kv], dtype=np.float32)
        sc = self.scale.get(kv)
        inv = sc.astype(np.float32) if sc is not None else np.empty(0, np.float32)
        half = self.dtype == torch.float16
        out16 = np.empty((T, C) if half else (0, 0), np.uint16)
        out32 = np.empty((0, 0) if half else (T, C), np.float32)
        fn = fastdct.kernel(n)
        off = float(np.float32(self._off(kv)))
        R.run_split(self.pool, lambda lo, hi: fn(mag, neg, perm, st, off, lo, hi, inv, mu, out16, out32), C // cb)
        res = torch.from_numpy(out16.view(np.float16)) if half else torch.from_numpy(out32).to(self.dtype)
        return res.reshape(self.shape)

    def _result_matmul(self, kv: str, n: int) -> torch.Tensor:
        """The native path of `result` for one part, fused per channel block: reconstruction
        straight into (blocks, T, cb), then per block the two inverse-DCT matmuls, the token
        scales, the mean and the conversion to the output dtype while the block is in cache (the
        unfused passes each streamed the whole (T, C) float32 array through memory). Equal to the
        reference path bit for bit: the same float32 operations on the same blocks."""
        T, H, D = self.shape
        C = H * D
        step, planes, _m0, _n = self._part(kv)
        st = np.float32(step * 2.0 ** -planes[self.level])
        cb = _idct_block(n, C)
        blocks = np.empty((C // cb, T, cb), np.float32)
        mag, neg, perm = self.mag[kv], self.neg[kv], self.layout.perm
        # token rows [a, b) each write their own rows of every block: threads split them freely
        off = float(np.float32(self._off(kv)))
        R.run_split(self.pool, lambda a, b: K.reconstruct_blocks(mag[a * C:b * C], neg[a * C:b * C], perm[a:b],
                                                                  C, st, off, cb, blocks), T)
        d = _dct_t(n)
        g = torch.from_numpy(blocks)
        mu = torch.from_numpy(np.ascontiguousarray(self.mean[kv], dtype=np.float32))
        sc = self.scale.get(kv)
        inv = torch.from_numpy(sc.astype(np.float32))[:, None] if sc is not None else None
        res = torch.empty(T, C, dtype=self.dtype)

        def run(lo: int, hi: int) -> None:   # channel blocks [lo, hi): disjoint columns of res
            for b in range(lo, hi):
                t = (d @ g[b].reshape(n, -1)).reshape(n, n, -1)               # (i, v, cb)
                x = torch.matmul(d[None], t).reshape(T, -1)                   # (i j, cb)
                if inv is not None:
                    x /= inv
                x += mu[b * cb:(b + 1) * cb]
                res[:, b * cb:(b + 1) * cb] = x
        R.run_split(self.pool, run, C // cb)
        return res.reshape(self.shape)

    def _bound(self) -> float:
        """An upper bound of |decoded value| over both parts from the header alone (no pass over
        the magnitudes, which cost ~1 ms of GIL-held numpy per Klein decode): a rung-0 index is
        <= m0, so after k planes a magnitude is < (m0 + 1) 2^k and |coefficient| < (m0 + 1) step0;
        the inverse DCT's gain is <= n."""
        b = 0.0
        for kv in PARTS:
            step, _planes, m0, n = self._part(kv)
            sc = self.scale.get(kv)
            inv = 1.0 / float(sc.min()) if sc is not None and sc.size else 1.0
            b = max(b, (m0 + 1.0) * step * max(n, 1) * inv + float(np.abs(self.mean[kv]).max(initial=0.0)))
        return b


def _idct_block(n: int, C: int) -> int:
    """Channels per block of the blocked inverse DCT: a divisor of C with a block's (n, n, cb)
    float32 in L2 (<= 1 MiB; 64 channels at n = 64, 256 at n = 32), or all of C if it has none >= 8."""
    target = max(8, min(256, (1 << 18) // (n * n)))
    for cb in range(min(target, C), 7, -1):
        if C % cb == 0:
            return cb
    return C


_DCT_T: dict[int, torch.Tensor] = {}


def _dct_t(n: int) -> torch.Tensor:
    """D^T (j, u) as float32, cached per grid side."""
    if n not in _DCT_T:
        _DCT_T[n] = torch.from_numpy(np.ascontiguousarray(EQ.dct_matrix(n).T.astype(np.float32)))
    return _DCT_T[n]


def inverse_f32(c: np.ndarray, n: int) -> np.ndarray:
    """(T, C) coefficients -> (T, C) tokens: inverse orthonormal 2-D DCT over the n x n grid where
    the fast inverse does not fit (`fastdct.fits`: non-power-of-two grids), float32
    matmuls over blocks of channels (both passes of a block while it is in cache: 1.1-2.4x faster
    than the two whole-array passes at Klein sizes). The reference decoder's transform; the native
    path runs the same matmuls on the same blocks (`ProgressiveState._result_blocked`)."""
    T, C = c.shape
    d = _dct_t(n)
    g = torch.from_numpy(np.ascontiguousarray(c, dtype=np.float32)).reshape(n, n, C)
    out = torch.empty(T, C, dtype=torch.float32)
    cb = _idct_block(n, C)
    for a in range(0, C, cb):
        gb = g[:, :, a:a + cb].contiguous()                                   # (u, v, cb)
        t = (d @ gb.reshape(n, -1)).reshape(n, n, -1)                        # (i, v, cb)
        out[:, a:a + cb] = torch.matmul(d[None], t).reshape(T, -1)           # (i, j, cb)
    return out.numpy()


def start_state(codec, obj: bs.Object, piece: bytes, ident: ShardId, tables: CodecTables | None, dtype,
                shape, engine: str = "native", pool: Executor | None = None, borrow: bool = False
                ) -> "ProgressiveState | Any":
    """The decode state of a ladder's base object: libsakura_decode's (`native.ProgState`) where it
    covers the object and `engine` is "native", else a `ProgressiveState` (numba or reference)."""
    if engine == "native":
        if NV.prog_supported(obj.header, dtype, shape):
            bs.require_version(obj, READ_VERSIONS, codec.name)
            layer = obj.header.get("layer", 0)
            return NV.ProgState(codec, obj.header, obj.version, shape, tables,
                                layer if isinstance(layer, int) else 0, pool, borrow).start(obj, obj.whole_crc())
        engine = "numba"
    st = ProgressiveState(codec=codec, ident=ident, tables=tables, dtype=dtype, shape=shape, header=obj.header,
                          engine=engine, pool=pool, borrow=borrow and engine != "reference")
    st.start(obj, obj.whole_crc())
    return st


def decode_with(codec, data: bytes, ident: ShardId, tables: CodecTables | None, engine: str = "native",
                pool: Executor | None = None, parsed: bs.Object | None = None) -> LayerKV:
    """Decode every complete rung of `data` with `engine` ("reference": the plain decoder the native
    one is tested against; the bench's reference column). `pool` (native only): threads that share
    this one shard's rANS pieces, token rows and channel blocks; the output is the serial one bit
    for bit. One-shot: the native state's magnitudes live in the calling thread's scratch memory
    (`kernels.scratch`; the result refers to none of it). `parsed`: the base object as the caller
    parsed it (`Codec._open`)."""
    mv = memoryview(data)
    spans = list(bs.split_objects(mv))
    if not spans or spans[-1][1] != len(mv):
        raise bs.TruncatedError("progressive ladder truncated")
    first = bytes(mv[spans[0][0]:spans[0][1]])
    obj, dtype, shape = codec._open(first, ident, tables, parsed=parsed)
    if obj.header.get("prog") is None or obj.header.get("level") != 0:
        raise bs.CorruptError("not the base object of a progressive ladder")
    pieces = [bytes(mv[a:e]) for a, e in spans[1:]]
    st = start_state(codec, obj, first, ident, tables, dtype, shape, engine, pool, borrow=True)
    for piece in pieces:
        st.upgrade(piece)
    return st.result()


# ---------------------------------------------------------------------------------------------
# the codec

@register
class ProgressiveCodec(Codec):
    """`progressive`: the progressive transform ladder, `sakura build`'s default. Parameters (the
    only ones it takes): `budgets` (increasing entropy-coded bits per value per rung, over the
    template), `transform` (dct / none), `allocate` (image / sensitivity / none), `weighting` (none /
    importance), `gamma` ([0, 2]); `quantiser` is accepted only as "ecsq" (older specs name it)."""

    name = "progressive"
    uses_tables = True
    supports_layers = True
    _defaults = {"budgets": [0.25, 0.5, 1.0], "transform": "dct", "allocate": "image", "weighting": "none",
                 "gamma": 1.0}

    def __init__(self, **params: Any) -> None:
        if params.get("quantiser", "ecsq") != "ecsq":
            raise ValueError("progressive: quantiser must be 'ecsq' (the nested ladder is `layered`)")
        params = {k: v for k, v in params.items() if k != "quantiser"}
        p = check_params(params, self._defaults, self.name)
        b = p["budgets"]
        budgets = list(b) if isinstance(b, (list, tuple)) else [b]
        if not budgets or any(not isinstance(x, (int, float)) or isinstance(x, bool) or not 0.0 <= x <= 8.0
                              for x in budgets) or any(y <= x for x, y in zip(budgets, budgets[1:])):
            raise ValueError(f"progressive: budgets must be increasing numbers in [0, 8], got {b!r}")
        p["budgets"] = budgets
        if p["transform"] not in ("none", "dct"):
            raise ValueError("progressive: transform must be 'none' or 'dct'")
        if p["allocate"] not in ("image", "sensitivity", "none"):
            raise ValueError("progressive: allocate must be 'image', 'sensitivity' or 'none'")
        if p["weighting"] not in ("none", "importance"):
            raise ValueError("progressive: weighting must be 'none' or 'importance'")
        if not isinstance(p["gamma"], (int, float)) or isinstance(p["gamma"], bool) or not 0 <= p["gamma"] <= 2:
            raise ValueError("progressive: gamma must be a number in [0, 2]")
        super().__init__(**p)

    def fit_tables(self, shards: Sequence[ShardKV]) -> CodecTables:
        return fit_tables(self.name, self.params, shards)

    def fit_library_tables(self, templates: Sequence[Sequence[ShardKV]]) -> CodecTables:
        """One table set for a whole template library (per model)."""
        return fit_library_tables(self.name, self.params, templates)

    def encode_levels(self, shard: ShardKV, ident: ShardId, tables: CodecTables | None = None) -> list[bytes]:
        """One object per rung: [base, refinement 1, ...]."""
        return encode_levels(self, shard, ident, tables)

    def encode(self, shard: ShardKV, ident: ShardId, tables: CodecTables | None = None) -> bytes:
        return b"".join(self.encode_levels(shard, ident, tables))

    def decode(self, data: bytes, ident: ShardId, tables: CodecTables | None = None,
               pool: Executor | None = None, parsed: bs.Object | None = None) -> LayerKV:
        """`pool`: threads that share this one shard (see `decode_with`); bit-equal to the serial
        decode. `parsed`: the base object's header as the caller parsed it (`decode_any`)."""
        return decode_with(self, data, ident, tables, "native", pool, parsed)

    def start_state(self, piece: bytes, ident: ShardId, tables: CodecTables | None) -> ProgressiveState:
        obj, dtype, shape = self._open(piece, ident, tables, kind=bs.KIND_SHARD)
        if obj.header.get("prog") is None or obj.header.get("level") != 0:
            raise bs.CorruptError("progressive: not the base object of a progressive ladder")
        return start_state(self, obj, piece, ident, tables, dtype, shape)
