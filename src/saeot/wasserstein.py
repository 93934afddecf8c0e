r"""Wasserstein-2 distances between feature distributions in a shared reference space.

A feature's distribution (see :mod:`saeot.distributions`) puts weight ``w_i`` on the reference-space
embedding ``Z[index_i]`` of token position ``index_i``.  Between two such measures

.. math::
    W_2(\mu, \nu) = \Big(\min_{T \in U(a, b)} \sum_{ij} T_{ij} \|x_i - y_j\|^2\Big)^{1/2}

Three solvers, one interface (:func:`w2_pairs`):

- ``exact``: network simplex, POT's C solver (``ot.lp.emd_wrap.emd_c``) called directly on cost
  matrices built in float32 batches, pairs split over one process per core; k <= ~64.
- ``sinkhorn``: batched log-domain entropic OT (:func:`sinkhorn_batch`, torch); returns the
  transport cost of the entropic plan, square-rooted; ``reg`` is relative to each problem's mean
  cost.  Iterates until the marginal error is below ``tol`` (problems that do not get there are
  counted and reported in :attr:`PairwiseResult.info`, and a warning says so).
- ``sinkhorn-debiased``: the Sinkhorn divergence
  :math:`S_\epsilon(\mu,\nu) = OT_\epsilon(\mu,\nu) - \tfrac12 OT_\epsilon(\mu,\mu) - \tfrac12 OT_\epsilon(\nu,\nu)`
  (Feydy et al., 2019; same epsilon for the three terms), square-rooted: zero for identical
  measures, unlike the entropic cost.
- ``sliced``: sliced W2 with ``n_proj`` random directions; each feature's 1-D quantile function
  is averaged over ``n_quantiles`` equal cells, which turns SW2 into a Euclidean distance between
  per-feature vectors, so *all* pairs cost one matrix product.  By Jensen's inequality on each
  cell the result is a lower bound on SW2 (hence on W2), tight as the cells shrink.

:func:`pairwise_w2` computes the (Fa, Fb) matrix between two layers with candidate pre-filtering:
the centroid distance is an exact lower bound (:math:`W_2 \ge \|m_\mu - m_\nu\|`), the sliced
distance a cheap proxy; only each feature's ``candidates`` best targets (and each target's best
sources) get the expensive solver.  Unevaluated pairs are ``inf``.
"""

from __future__ import annotations

import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from saeot.distributions import FeatureDistributions
from saeot.transport import quantile_cells, transport_costs

Solver = Literal["exact", "sinkhorn", "sinkhorn-debiased", "sliced"]
SOLVERS = ("exact", "sinkhorn", "sinkhorn-debiased", "sliced")


class GatheredSupports:
    """(F, k, d) support points read on demand as ``Z[index[key]]`` (float32), never stored whole.

    Every feature's k support points are rows of one token array ``Z`` (n_tokens, d), so a layer
    needs ``index`` (F, k) and the shared ``Z`` instead of F x k x d floats: at 16,384 features,
    k = 32, d = 2,304 that is 4 MB + Z instead of 4.8 GB.  ``Z`` may be float16 (half the bytes;
    points are widened to float32 when gathered, so costs are still computed in float32).
    Indexing with an int, a slice or an index array returns a float32 array, as a stored X would.
    """

    ndim = 3
    dtype = np.dtype(np.float32)

    def __init__(self, Z: np.ndarray, index: np.ndarray):
        self.Z, self.index = Z, index

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.index.shape[0], self.index.shape[1], self.Z.shape[1])

    def __len__(self) -> int:
        return self.index.shape[0]

    def __getitem__(self, key):
        rest = ()
        if isinstance(key, tuple):
            key, rest = key[0], key[1:]
        out = self.Z[self.index[key]].astype(np.float32, copy=False)
        if rest:
            out = out[rest] if out.ndim == 2 else out[(slice(None),) + rest]
        return out

    def __array__(self, dtype=None, copy=None):
        out = self[:]
        return out if dtype is None else out.astype(dtype)

    def astype(self, dtype, copy: bool = True):
        return self[:].astype(dtype)

    def reshape(self, *shape):
        return self[:].reshape(*shape)

    @property
    def nbytes(self) -> int:
        return int(self.index.nbytes)  # Z is shared between the layers that index it


def project_tokens(Z: np.ndarray, directions: np.ndarray, block: int = 32768) -> np.ndarray:
    """(n, d) @ (d, L) in float32 blocks of rows (a float16 Z is never widened whole)."""
    th = np.asarray(directions, dtype=np.float32)
    out = np.empty((len(Z), th.shape[1]), dtype=np.float32)
    for s in range(0, len(Z), block):
        out[s:s + block] = Z[s:s + block].astype(np.float32, copy=False) @ th
    return out


@dataclass
class Measures:
    """F discrete measures with padded supports, in one embedding space.

    Attributes
    ----------
    X : (F, k, d) float32 or float64
        Support points (padding rows are copies of the first point, weight 0).
    w : (F, k) float64
        Weights; each row sums to 1 (all-zero rows = dead features).
    Z, index : optional
        The token embeddings (n, d) and support indices (F, k) that ``X = Z[index]`` came from;
        lets the sliced embedding project the n tokens once instead of F * k support points.
    """

    X: np.ndarray
    w: np.ndarray
    Z: np.ndarray | None = None
    index: np.ndarray | None = None

    @property
    def centroid(self) -> np.ndarray:
        """(F, d) weighted means (float64; computed in X's precision, 1,024 features at a time)."""
        F, _, d = self.X.shape
        out = np.empty((F, d))
        for s in range(0, F, 1024):
            X = self.X[s:s + 1024]
            out[s:s + 1024] = np.matmul(self.w[s:s + 1024, None, :].astype(X.dtype), X)[:, 0]
        return out

    @property
    def alive(self) -> np.ndarray:
        return self.w.sum(axis=1) > 0

    def subset(self, rows) -> "Measures":
        if isinstance(self.X, GatheredSupports):
            return Measures(GatheredSupports(self.X.Z, self.index[rows]), self.w[rows], self.Z, self.index[rows])
        return Measures(self.X[rows], self.w[rows], self.Z, None if self.index is None else self.index[rows])


def measures(dist: FeatureDistributions, Z: np.ndarray, dtype=np.float32) -> Measures:
    """Place each feature's distribution in the reference space.

    Parameters
    ----------
    dist : FeatureDistributions
        Supports ``index`` (F, k) of token positions and weights (F, k).
    Z : (n_tokens, d) array
        Reference-space embedding of every token position.
    dtype : numpy dtype
        Of the stored token embeddings (float32 by default; float16 halves them).  Cost matrices
        are built in float32 either way (about 1e-6 relative, far below any difference that
        changes a match; the solvers run in float64).

    Returns
    -------
    Measures
        ``X`` of shape (F, k, d), a :class:`GatheredSupports` view of ``Z``.
    """
    Z = np.asarray(Z)
    if Z.ndim != 2:
        raise ValueError(f"Z must be (n_tokens, d), got shape {Z.shape}")
    if dist.index.max(initial=-1) >= Z.shape[0]:
        raise ValueError(f"distribution indexes token {dist.index.max()} but Z has {Z.shape[0]} rows")
    idx = dist.index.copy()
    first = np.where(idx[:, :1] >= 0, idx[:, :1], 0)  # (F, 1)
    idx = np.where(idx >= 0, idx, first)  # pad with the first support point
    Zc = np.ascontiguousarray(Z, dtype=dtype)  # no copy if Z already is: layers that share Z share Zc
    # supports are gathered from Zc when used (GatheredSupports), never stored as (F, k, d)
    return Measures(X=GatheredSupports(Zc, idx), w=dist.weight.astype(np.float64), Z=Zc, index=idx)


def _sqdist(x: np.ndarray, y: np.ndarray, block: int = 512) -> np.ndarray:
    """(n, d), (m, d) -> (n, m) squared Euclidean distances, clipped at 0.

    Large products run in blocks of ``block`` rows on :func:`default_jobs` threads (the matrix
    product releases the GIL; BLAS itself runs one thread under OMP_NUM_THREADS=1); the blocks
    are fixed, so the result does not depend on the thread count."""
    yy = (y * y).sum(1)[None, :]
    if len(x) * len(y) * x.shape[1] < 1 << 26:
        return np.maximum((x * x).sum(1)[:, None] + yy - 2.0 * x @ y.T, 0.0)

    out = np.empty((len(x), len(y)), dtype=np.result_type(x, y))

    def run(s):
        xb = x[s:s + block]
        out[s:s + block] = np.maximum((xb * xb).sum(1)[:, None] + yy - 2.0 * xb @ y.T, 0.0)

    with ThreadPoolExecutor(default_jobs()) as pool:
        list(pool.map(run, range(0, len(x), block)))
    return out


def _batch_costs(Xa: np.ndarray, Xb: np.ndarray, ia: np.ndarray | None = None, ib: np.ndarray | None = None
                 ) -> np.ndarray:
    """(B, k, d), (B, k', d) -> (B, k, k') squared distances; float32 batched matmul, float64 out.

    ``ia``, ``ib`` (B, k), (B, k'): token indices of the points when both sides index the same
    embedding; equal indices are the same point, so their cost is set to exactly 0 (the float32
    expansion |x|^2 + |y|^2 - 2 x.y leaves ~1e-7 |x|^2 there, i.e. W2 ~ 3e-4 between identical
    measures).
    """
    Xa = Xa.astype(np.float32, copy=False)
    Xb = Xb.astype(np.float32, copy=False)
    M = (np.einsum("bkd,bkd->bk", Xa, Xa)[:, :, None] + np.einsum("bld,bld->bl", Xb, Xb)[:, None, :]
         - 2.0 * np.matmul(Xa, Xb.transpose(0, 2, 1)))
    M = np.maximum(M, 0.0).astype(np.float64)
    if ia is not None and ib is not None:
        M[ia[:, :, None] == ib[:, None, :]] = 0.0
    return M


def _shared_index(ma: "Measures", mb: "Measures"):
    """(index_a, index_b) when both measures index the same token embedding, else (None, None)."""
    if ma.index is not None and mb.index is not None and ma.Z is not None and ma.Z is mb.Z:
        return ma.index, mb.index
    return None, None


def _emd_cost(a: np.ndarray, b: np.ndarray, M: np.ndarray) -> float:
    """Network-simplex OT cost through POT's C solver directly (no input checks, no plan copy-out);
    ``a``, ``b`` strictly positive float64 summing to 1, ``M`` (len(a), len(b)) C-contiguous float64."""
    from ot.lp.emd_wrap import emd_c  # lazy: POT (seconds; imports torch) keeps --help fast

    _, cost, _, _, code = emd_c(a, b, M, 200_000, 1, None, None)
    if code != 1:  # 1 = OPTIMAL in POT's result codes
        raise RuntimeError(f"network simplex did not reach an optimum (POT result code {code})")
    return float(cost)


def w2_exact(x: np.ndarray, a: np.ndarray, y: np.ndarray, b: np.ndarray) -> float:
    """Exact W2 between two discrete measures (network simplex, POT's C solver).

    Parameters
    ----------
    x : (n, d) support of the first measure;  a : (n,) weights summing to 1
    y : (m, d) support of the second;        b : (m,) weights summing to 1

    Returns
    -------
    float
        W2 in the units of the embedding space.

    Examples
    --------
    >>> import numpy as np
    >>> round(w2_exact(np.zeros((1, 2)), np.ones(1), np.array([[3.0, 4.0]]), np.ones(1)), 6)
    5.0
    """
    ka, kb = a > 0, b > 0
    x, a, y, b = x[ka], a[ka], y[kb], b[kb]
    if len(a) == 0 or len(b) == 0:
        return float("nan")
    # Renormalise in float64 so the solver sees marginals of equal mass.
    a = np.ascontiguousarray(a / a.sum(), dtype=np.float64)
    b = np.ascontiguousarray(b / b.sum(), dtype=np.float64)
    M = np.ascontiguousarray(_sqdist(np.asarray(x, np.float64), np.asarray(y, np.float64)))
    return float(np.sqrt(max(_emd_cost(a, b, M), 0.0)))


def _exact_block(ma: Measures, mb: Measures, pairs: np.ndarray, batch: int = 2048, backend: str = "numba"
                 ) -> np.ndarray:
    """W2 of ``pairs`` (P, 2) (all alive): exact transport on per-pair cost matrices.

    Cost matrices are built per source feature: its support (k, d) times the stacked supports of
    all its targets in this block (k' * n_targets, d) is one float32 matrix product, against one
    small product per pair (measured 0.68 ms of CPU per pair for the per-pair batch at d = 640,
    k = 32, mostly the gather and temporaries).  ``backend``: ``numba`` solves each source's
    problems in one compiled call (:func:`saeot.transport.transport_costs`, GIL released; a
    problem it leaves unsolved goes to POT), ``pot`` calls POT's network simplex per pair (the
    reference the numba solver is tested against).
    """
    from ot.lp.emd_wrap import emd_c  # lazy: POT (seconds; imports torch) keeps --help fast

    if backend not in ("numba", "pot"):
        raise ValueError(f"unknown exact backend {backend!r}; expected 'numba' or 'pot'")
    out = np.empty(len(pairs))
    xa, xb = _shared_index(ma, mb)
    Xa_all, Xb_all = ma.X, mb.X
    # weights renormalised in float64 (equal masses for the solver); full = no padding to drop
    Wa = ma.w / np.maximum(ma.w.sum(1, keepdims=True), 1e-300)
    Wb = mb.w / np.maximum(mb.w.sum(1, keepdims=True), 1e-300)
    full_a, full_b = (ma.w > 0).all(1), (mb.w > 0).all(1)
    order = np.argsort(pairs[:, 0], kind="stable")
    src_sorted = pairs[order, 0]
    starts = np.flatnonzero(np.r_[True, src_sorted[1:] != src_sorted[:-1]])
    ends = np.r_[starts[1:], len(order)]

    def pot(i, jr, Mr):  # Mr (k', k): target rows, source columns
        Mr = Mr.astype(np.float64)
        if full_a[i] and full_b[jr]:
            a, b = Wb[jr], Wa[i]
        else:
            ka, kbm = Wa[i] > 0, Wb[jr] > 0
            a, b = Wb[jr, kbm] / Wb[jr, kbm].sum(), Wa[i, ka] / Wa[i, ka].sum()
            Mr = np.ascontiguousarray(Mr[np.ix_(kbm, ka)])
        _, cost, _, _, code = emd_c(a, b, Mr, 200_000, 1, None, None)
        if code != 1:  # 1 = OPTIMAL in POT's result codes
            raise RuntimeError(f"network simplex did not reach an optimum (POT result code {code})")
        return cost

    for s0, e0 in zip(starts, ends):
        i = int(src_sorted[s0])
        Xa = Xa_all[i].astype(np.float32, copy=False)  # (k, d)
        a_sq = np.einsum("kd,kd->k", Xa, Xa)
        for s in range(s0, e0, batch // 8):
            rows = order[s:min(e0, s + batch // 8)]
            j = pairs[rows, 1]
            Xb = Xb_all[j].astype(np.float32, copy=False)  # (c, k', d)
            c, kb, d = Xb.shape
            Xb2 = Xb.reshape(c * kb, d)
            # the transposed problems (target support as rows): W2 is symmetric, and this product's
            # shape and layout need no transposed copy; float32 costs, widened inside the solver
            Mt = np.einsum("nd,nd->n", Xb2, Xb2)[:, None] + a_sq[None, :] - 2.0 * (Xb2 @ Xa.T)  # (c k', k)
            Mt = np.maximum(Mt, 0.0).reshape(c, kb, len(Xa))
            if xa is not None:
                Mt[xb[j][:, :, None] == xa[i][None, None, :]] = 0.0  # the same token: exactly 0
            if backend == "pot":
                out[rows] = [pot(i, j[r], Mt[r]) for r in range(c)]
                continue
            cost, _ = transport_costs(Mt, Wb[j], np.repeat(Wa[i][None], c, 0))
            for r in np.flatnonzero(np.isnan(cost)):  # not solved within the pivot limit
                cost[r] = pot(i, j[r], Mt[r])
            out[rows] = cost
    return np.sqrt(np.maximum(out, 0.0))


def default_jobs() -> int:
    """Worker threads for exact W2: one per core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def _exact_parallel(ma: Measures, mb: Measures, pairs: np.ndarray, n_jobs: int | None,
                    min_pairs_per_job: int = 20_000, backend: str = "numba") -> np.ndarray:
    """Exact W2 for ``pairs`` with one thread per core: the solver and the cost products release
    the GIL, and threads share the measures without the copies or start-up of processes."""
    n_jobs = default_jobs() if n_jobs is None else max(1, int(n_jobs))
    n_jobs = min(n_jobs, max(1, len(pairs) // max(1, min_pairs_per_job)))
    if n_jobs == 1:
        return _exact_block(ma, mb, pairs, backend=backend)
    # whole sources per chunk (each source's cost product is shared by its targets); many chunks
    # so that a slow (shared) core does not leave the others idle at the end
    order = np.argsort(pairs[:, 0], kind="stable")
    src = pairs[order, 0]
    # chunk edges moved to source boundaries: a source's cost product (float32) is then the same
    # matrix product as in one thread, so the result does not depend on the thread count
    cuts = np.searchsorted(src, src[np.linspace(0, len(pairs) - 1, 8 * n_jobs + 1).astype(int)])
    edges = np.unique(np.r_[0, cuts, len(pairs)])
    with ThreadPoolExecutor(n_jobs) as pool:
        parts = list(pool.map(lambda se: _exact_block(ma, mb, pairs[order[se[0]:se[1]]], backend=backend),
                              zip(edges[:-1], edges[1:])))
    out = np.empty(len(pairs))
    out[order] = np.concatenate(parts)
    return out


def random_directions(d: int, n_proj: int, seed: int = 0) -> np.ndarray:
    """(d, n_proj) unit directions, deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    th = rng.standard_normal((d, n_proj))
    return th / np.linalg.norm(th, axis=0, keepdims=True)


def sliced_embedding(m: Measures, n_proj: int = 64, n_quantiles: int = 32, seed: int = 0,
                     directions: np.ndarray | None = None, block: int = 1024) -> np.ndarray:
    r"""Per-feature vectors whose Euclidean distances are a lower bound on sliced W2.

    For directions :math:`\theta_1..\theta_L` (uniform on the sphere) and the cells
    :math:`C_q = [q/Q, (q+1)/Q)`, row f holds :math:`Q \int_{C_q} F^{-1}_{f,\theta_l}(t)\,dt` for
    every (l, q), divided by :math:`\sqrt{LQ}`.  Then
    :math:`\|E_f - E_g\|^2 = \frac1L \sum_l \sum_q \frac1Q (\bar F_f - \bar F_g)^2 \le
    \frac1L\sum_l W_2^2(\theta_l\#\mu_f, \theta_l\#\mu_g) = SW_2^2`, by Jensen on each cell;
    and :math:`SW_2 \le W_2` (projections are 1-Lipschitz).  The slice of row f for one direction,
    times :math:`\sqrt{L}`, likewise bounds that direction's 1-D W2 (:func:`max_sliced_lower_bound`).

    Parameters
    ----------
    m : Measures
        X (F, k, d), w (F, k).
    n_proj, n_quantiles : int
        L and Q.
    directions : (d, L) array, optional
        Fixed directions (must be shared between the two layers being compared).

    Returns
    -------
    (F, L * Q) float32
    """
    F, k, d = m.X.shape
    if directions is None:
        directions = random_directions(d, n_proj, seed)
    L = directions.shape[1]
    Q = n_quantiles
    th = directions.astype(np.float32)
    Pz = None if m.Z is None or m.index is None else project_tokens(m.Z, th)  # (n, L)
    out = np.empty((F, L, Q), dtype=np.float32)
    w_all = np.ascontiguousarray(m.w, dtype=np.float64)

    def run(s):  # one block of features on one thread (the compiled kernel releases the GIL)
        e = min(F, s + block)
        if Pz is not None:
            pz, idx = Pz, np.ascontiguousarray(m.index[s:e], dtype=np.int64)
        else:  # no shared token embedding: project this block's support points
            pz = np.ascontiguousarray(m.X[s:e].astype(np.float32).reshape(-1, d) @ th)
            idx = np.arange((e - s) * k, dtype=np.int64).reshape(e - s, k)
        quantile_cells(pz, idx, w_all[s:e], Q, out[s:e])

    with ThreadPoolExecutor(default_jobs()) as pool:
        list(pool.map(run, range(0, F, block)))
    return out.reshape(F, L * Q) / np.float32(np.sqrt(L * Q))


def sliced_embedding_all_firing(acts, Z: np.ndarray, directions: np.ndarray, n_quantiles: int = 32) -> np.ndarray:
    """:func:`sliced_embedding` of every feature's distribution over *all* its firing tokens
    (support = every token with a positive activation, weights ``a / sum(a)``; "k = all").

    A feature that fires on thousands of tokens would need an (F, k_max, d) support array; here
    each feature's projected support (n_f, L) is sorted on its own, so memory is O(max n_f * L)
    and time O(nnz * L log n_f).

    Parameters
    ----------
    acts : (n_tokens, F) scipy sparse or array
    Z : (n_tokens, d) token embeddings
    directions : (d, L)

    Returns
    -------
    (F, L * Q) float32 (zero rows for features that never fire)
    """
    import scipy.sparse as sp  # lazy: scipy (0.3-3 s) keeps --help fast

    A = sp.csc_matrix(acts)
    Pz = np.asarray(Z, dtype=np.float32) @ directions.astype(np.float32)  # (n, L)
    L, Q = directions.shape[1], n_quantiles
    grid = np.arange(Q + 1) / Q
    out = np.zeros((A.shape[1], L, Q), dtype=np.float32)
    for f in range(A.shape[1]):
        lo, hi = A.indptr[f], A.indptr[f + 1]
        v, r = A.data[lo:hi], A.indices[lo:hi]
        keep = v > 0
        if not keep.any():
            continue
        v, r = v[keep].astype(np.float64), r[keep]
        P = Pz[r].astype(np.float64)  # (m, L)
        order = np.argsort(P, axis=0, kind="stable")
        Ps = np.take_along_axis(P, order, 0)
        ws = (v / v.sum())[order]  # (m, L)
        cw = np.cumsum(ws, 0)
        ci = np.cumsum(ws * Ps, 0)
        m = len(v)
        I = np.empty((Q + 1, L))
        for l in range(L):  # integral of the quantile function up to each cell edge
            j = np.searchsorted(cw[:, l], grid, side="left").clip(0, m - 1)
            pcw = np.where(j > 0, cw[np.maximum(j - 1, 0), l], 0.0)
            pci = np.where(j > 0, ci[np.maximum(j - 1, 0), l], 0.0)
            I[:, l] = pci + Ps[j, l] * (grid - pcw)
        out[f] = (np.diff(I, axis=0) * Q).T.astype(np.float32)
    return out.reshape(A.shape[1], L * Q) / np.float32(np.sqrt(L * Q))


def max_sliced_lower_bound(ea: np.ndarray, eb: np.ndarray, n_proj: int, rows=None) -> np.ndarray:
    r"""(len(rows), Fb) lower bound on W2: :math:`\max_l` of the per-direction bound from
    :func:`sliced_embedding` vectors ``ea`` (Fa, L*Q), ``eb`` (Fb, L*Q) (same directions)."""
    rows = np.arange(len(ea)) if rows is None else np.asarray(rows)
    Q = ea.shape[1] // n_proj
    A = ea[rows].reshape(len(rows), n_proj, Q).astype(np.float32)
    B = eb.reshape(len(eb), n_proj, Q).astype(np.float32)
    best = np.zeros((len(rows), len(eb)), dtype=np.float32)
    for l in range(n_proj):
        a, b = A[:, l], B[:, l]
        d2 = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2 * a @ b.T
        np.maximum(best, d2, out=best)
    # the slice carries 1/sqrt(L Q); one direction's 1-D bound is sqrt(L) times its slice norm
    return np.sqrt(np.maximum(best, 0.0) * n_proj).astype(np.float64) * (1 - 1e-5)  # float32 slack


def w2_pairs(ma: Measures, mb: Measures, pairs: np.ndarray, solver: Solver = "exact", *,
             reg: float = 0.05, n_proj: int = 64, n_quantiles: int = 32, seed: int = 0,
             batch_size: int = 4096, progress: bool = False, n_jobs: int | None = None,
             max_iter: int = 5000, tol: float = 1e-4, info: dict | None = None) -> np.ndarray:
    """W2 for a list of (source, target) feature pairs.

    Parameters
    ----------
    ma, mb : Measures
        Source (Fa, k, d) and target (Fb, k', d) measures in the same space.
    pairs : (P, 2) int array
        Rows ``(i, j)``: source feature i, target feature j.
    solver : {"exact", "sinkhorn", "sinkhorn-debiased", "sliced"}
    reg : float
        Sinkhorn only: entropic regularisation relative to the mean cost of each problem
        (``sinkhorn``), or to the median pair's mean cost, one epsilon for all pairs and the
        self terms (``sinkhorn-debiased``: the divergence needs the same epsilon in its three terms).
    max_iter, tol : Sinkhorn only (see :func:`sinkhorn_batch`).
    n_proj, n_quantiles, seed : int
        Sliced only.
    batch_size : int
        Pairs per Sinkhorn batch.
    n_jobs : int, optional
        Exact only: worker threads (default: one per core; small jobs stay on one thread).
    info : dict, optional
        Filled with solver diagnostics (Sinkhorn: ``not_converged``, ``max_marginal_error``).

    Returns
    -------
    (P,) float64
        Distances; NaN where either feature is dead (no support).
    """
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; expected one of {SOLVERS}")
    if ma.X.shape[2] != mb.X.shape[2]:
        raise ValueError(f"embedding dims differ: {ma.X.shape[2]} vs {mb.X.shape[2]}")
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    out = np.full(len(pairs), np.nan)
    alive = ma.alive[pairs[:, 0]] & mb.alive[pairs[:, 1]]
    from tqdm.auto import tqdm  # lazy: tqdm.auto (0.3 s) keeps --help fast

    if solver == "exact":
        it = np.flatnonzero(alive)
        out[it] = _exact_parallel(ma, mb, pairs[it], n_jobs)
        return out
    if solver == "sliced":
        th = random_directions(ma.X.shape[2], n_proj, seed)
        ea = sliced_embedding(ma, directions=th, n_quantiles=n_quantiles)
        eb = sliced_embedding(mb, directions=th, n_quantiles=n_quantiles)
        diff = ea[pairs[:, 0]].astype(np.float64) - eb[pairs[:, 1]]
        out = np.sqrt((diff * diff).sum(1))
        out[~alive] = np.nan
        return out
    # sinkhorn (optionally debiased), batched
    it = np.flatnonzero(alive)
    xa, xb = _shared_index(ma, mb)
    bad, worst = 0, 0.0

    def solve(Xs, Ws, Ys, Vs, ia, ib, eps):
        nonlocal bad, worst
        M = _batch_costs(Xs, Ys, ia, ib)
        r = sinkhorn_batch(M, Ws, Vs, reg=reg, eps=None if eps is None else np.full(len(M), eps),
                           max_iter=max_iter, tol=tol, warn=False)
        bad += int((~r.converged).sum())
        worst = max(worst, float(r.marginal_error.max(initial=0.0)))
        return r

    def sub(idx, rows):
        return None if idx is None else idx[rows]

    eps_all = None
    if solver == "sinkhorn-debiased" and len(it):
        # One epsilon for the whole call (reg x the median pair's mean cost, from an evenly spaced
        # sample of pairs): the self terms OT(a, a), OT(b, b) then depend on one feature each and are
        # solved once per feature instead of once per pair (a third of the problems instead of 2/3).
        smp = it[np.linspace(0, len(it) - 1, min(len(it), 2048)).astype(int)]
        Ms = _batch_costs(ma.X[pairs[smp, 0]], mb.X[pairs[smp, 1]], sub(xa, pairs[smp, 0]), sub(xb, pairs[smp, 1]))
        eps_all = float(reg * np.median(Ms.mean(axis=(1, 2))))
        self_a, self_b = np.zeros(len(ma.w)), np.zeros(len(mb.w))
        for m_, self_, feats in ((ma, self_a, np.unique(pairs[it, 0])), (mb, self_b, np.unique(pairs[it, 1]))):
            for s in range(0, len(feats), batch_size):
                f = feats[s:s + batch_size]
                sf = None if m_.index is None else m_.index[f]
                r = sinkhorn_symmetric(_batch_costs(m_.X[f], m_.X[f], sf, sf), m_.w[f], np.full(len(f), eps_all),
                                       max_iter=max_iter, tol=tol)
                bad += int((~r.converged).sum())
                worst = max(worst, float(r.marginal_error.max(initial=0.0)))
                self_[f] = r.dual
    for s in tqdm(range(0, len(it), batch_size), disable=not progress, desc=f"{solver} W2", unit="batch"):
        sel = it[s:s + batch_size]
        i, j = pairs[sel, 0], pairs[sel, 1]
        r = solve(ma.X[i], ma.w[i], mb.X[j], mb.w[j], sub(xa, i), sub(xb, j), eps_all)
        if solver == "sinkhorn":
            out[sel] = np.sqrt(np.maximum(r.cost, 0.0))
        else:
            out[sel] = np.sqrt(np.maximum(r.dual - 0.5 * self_a[i] - 0.5 * self_b[j], 0.0))
    if info is not None:
        info.update({"not_converged": bad, "max_marginal_error": worst, "tol": tol, "max_iter": max_iter})
        if eps_all is not None:
            info["eps"] = eps_all
    if bad:
        warnings.warn(f"{solver}: {bad} problem(s) did not reach marginal error {tol:g} in {max_iter} iterations "
                      f"(worst {worst:.2e}); their values are those of the last iterate", UserWarning, stacklevel=2)
    return out


@dataclass
class SinkhornResult:
    """Per problem: ``cost`` = <P, M> of the entropic plan; ``dual`` = the entropic OT value
    <a, f> + <b, g> (what the Sinkhorn divergence debiases); ``marginal_error`` = L1 error of the
    row marginal (columns are exact after the last half-step); ``converged`` = error <= tol."""

    cost: np.ndarray
    dual: np.ndarray
    marginal_error: np.ndarray
    converged: np.ndarray
    iterations: int


def sinkhorn_batch(M: np.ndarray, a: np.ndarray, b: np.ndarray, reg: float = 0.05, max_iter: int = 5000,
                   tol: float = 1e-4, *, eps: np.ndarray | None = None, warn: bool = True,
                   scaling: float = 0.5) -> SinkhornResult:
    r"""Batched log-domain Sinkhorn with epsilon scaling, iterated until every problem's marginal
    error is <= ``tol``.

    Potentials F, G are kept in cost units; epsilon starts at each problem's largest cost and is
    multiplied by ``scaling`` per step (two Sinkhorn iterations each) down to the target, then the
    iterations continue at the target (annealing makes small epsilon converge in tens of
    iterations instead of thousands).

    Parameters
    ----------
    M : (B, n, m) costs;  a : (B, n), b : (B, m) weights (zeros allowed: those points are dropped)
    reg : float
        Entropic regularisation relative to each problem's mean cost (ignored if ``eps`` given).
    eps : (B,) array, optional
        Absolute regularisation per problem.
    max_iter : int;  tol : float
        Stop when every problem's L1 row-marginal error is <= ``tol`` (checked every 5 iterations
        at the target epsilon); problems still above it after ``max_iter`` iterations at the
        target are flagged ``converged=False`` and, with ``warn``, a ``UserWarning`` says how many.

    Returns
    -------
    SinkhornResult
    """
    import torch  # lazy: torch (seconds) keeps --help fast

    M = torch.from_numpy(np.ascontiguousarray(M, dtype=np.float64))
    e_target = (M.mean(dim=(1, 2)) * reg if eps is None else torch.from_numpy(np.asarray(eps, np.float64)))
    e_target = e_target.clamp_min(1e-12)[:, None, None]  # (B, 1, 1)
    with np.errstate(divide="ignore"):  # -inf for zero weights (padding): those points drop out
        la = torch.from_numpy(np.log(np.asarray(a, dtype=np.float64)))
        lb = torch.from_numpy(np.log(np.asarray(b, dtype=np.float64)))
    fa, fb = torch.isfinite(la), torch.isfinite(lb)
    F = torch.zeros_like(la)  # (B, n) potentials in cost units
    G = torch.zeros_like(lb)

    def step(e, idx=None):
        # one Sinkhorn iteration on problems ``idx`` (all if None)
        s = slice(None) if idx is None else idx
        Ms, las, lbs, fas, fbs = M[s], la[s], lb[s], fa[s], fb[s]
        Fs = torch.where(fas, -e[:, :, 0] * torch.logsumexp(lbs[:, None, :] + (G[s][:, None, :] - Ms) / e, 2), 0.0)
        Gs = torch.where(fbs, -e[:, 0, :] * torch.logsumexp(las[:, :, None] + (Fs[:, :, None] - Ms) / e, 1), 0.0)
        F[s], G[s] = Fs, Gs

    e = torch.maximum(M.amax(dim=(1, 2), keepdim=True), e_target)
    while bool((e > e_target).any()):
        step(e)
        step(e)
        e = torch.maximum(e * scaling, e_target)
    e = e_target

    def row_error(idx):
        logP = la[idx][:, :, None] + lb[idx][:, None, :] + (F[idx][:, :, None] + G[idx][:, None, :] - M[idx]) / e[idx]
        row = torch.exp(torch.logsumexp(logP, dim=2))  # (b, n)
        return torch.where(fa[idx], (row - la[idx].exp()).abs(), 0.0).sum(1)

    err = torch.full((M.shape[0],), float("inf"), dtype=torch.float64)
    active = torch.arange(M.shape[0])  # problems not yet within tol: only they keep iterating
    it = 0
    for it in range(1, max_iter + 1):
        step(e[active], active)
        if it % 5 == 0 or it == max_iter:
            err[active] = row_error(active)
            active = active[err[active] > tol]
            if len(active) == 0:
                break
    converged = (err <= tol).numpy()
    if warn and not converged.all():
        warnings.warn(f"sinkhorn_batch: {int((~converged).sum())} of {len(converged)} problems not converged to "
                      f"{tol:g} after {max_iter} iterations (worst {float(err.max()):.2e})", UserWarning, stacklevel=2)
    logP = la[:, :, None] + lb[:, None, :] + (F[:, :, None] + G[:, None, :] - M) / e
    cost = (torch.exp(logP) * M).sum(dim=(1, 2))
    # entropic OT value (KL to a x b) at the optimal potentials: <a, F> + <b, G>
    dual = torch.where(fa, la.exp() * F, 0.0).sum(1) + torch.where(fb, lb.exp() * G, 0.0).sum(1)
    return SinkhornResult(cost.numpy(), dual.numpy(), err.numpy(), converged, it)


def sinkhorn_symmetric(M: np.ndarray, a: np.ndarray, eps: np.ndarray, max_iter: int = 5000, tol: float = 1e-4,
                       scaling: float = 0.5) -> SinkhornResult:
    r"""Batched log-domain Sinkhorn for the self terms OT_eps(a, a) of the Sinkhorn divergence.

    With equal marginals the optimal potentials are equal (F = G); the averaged update
    :math:`F \leftarrow (F + T(F)) / 2` (Feydy et al. 2019) converges in a few iterations where the
    alternating one oscillates for hundreds (measured: 29 s against 1.8 s for the cross terms on
    3,000 real pairs).  Epsilon scaling and the stopping rule are those of :func:`sinkhorn_batch`.

    Parameters
    ----------
    M : (B, n, n) symmetric costs;  a : (B, n) weights (zeros = padding);  eps : (B,) regularisation

    Returns
    -------
    SinkhornResult (``cost`` = <P, M>, ``dual`` = 2 <a, F>)
    """
    import torch  # lazy: torch (seconds) keeps --help fast

    M = torch.from_numpy(np.ascontiguousarray(M, dtype=np.float64))
    e_target = torch.from_numpy(np.asarray(eps, np.float64)).clamp_min(1e-12)[:, None, None]
    with np.errstate(divide="ignore"):
        la = torch.from_numpy(np.log(np.asarray(a, dtype=np.float64)))
    fa = torch.isfinite(la)
    F = torch.zeros_like(la)

    def t_of(Fs, e, s=slice(None)):
        return torch.where(fa[s], -e[:, :, 0] * torch.logsumexp(la[s][:, None, :] + (Fs[:, None, :] - M[s]) / e, 2), 0.0)

    e = torch.maximum(M.amax(dim=(1, 2), keepdim=True), e_target)
    while bool((e > e_target).any()):
        F = 0.5 * (F + t_of(F, e))
        e = torch.maximum(e * scaling, e_target)
    e = e_target

    def row_error(idx):
        logP = la[idx][:, :, None] + la[idx][:, None, :] + (F[idx][:, :, None] + F[idx][:, None, :] - M[idx]) / e[idx]
        return torch.where(fa[idx], (torch.exp(torch.logsumexp(logP, 2)) - la[idx].exp()).abs(), 0.0).sum(1)

    err = torch.full((M.shape[0],), float("inf"), dtype=torch.float64)
    active = torch.arange(M.shape[0])
    it = 0
    for it in range(1, max_iter + 1):
        F[active] = 0.5 * (F[active] + t_of(F[active], e[active], active))
        if it % 5 == 0 or it == max_iter:
            err[active] = row_error(active)
            active = active[err[active] > tol]
            if len(active) == 0:
                break
    logP = la[:, :, None] + la[:, None, :] + (F[:, :, None] + F[:, None, :] - M) / e
    cost = (torch.exp(logP) * M).sum(dim=(1, 2))
    dual = 2.0 * torch.where(fa, la.exp() * F, 0.0).sum(1)
    return SinkhornResult(cost.numpy(), dual.numpy(), err.numpy(), (err <= tol).numpy(), it)


@dataclass
class PairwiseResult:
    """A (Fa, Fb) distance matrix between two layers' features, with how it was computed.

    Attributes
    ----------
    D : (Fa, Fb) float64
        Distances; ``inf`` for pairs pruned by pre-filtering or involving a dead feature.
    evaluated : int
        Number of pairs given to the solver.
    seconds : dict
        Wall time per stage (``prefilter``, ``solve``).
    info : dict
        Solver diagnostics (Sinkhorn: ``not_converged``, ``max_marginal_error``).
    """

    D: np.ndarray
    evaluated: int
    seconds: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)


PREFILTERS = ("centroid", "sliced", "pca-sliced", "pca-bound", "bound-mid")


def candidate_pairs(P: np.ndarray, candidates: int) -> np.ndarray:
    """(n, 2) pairs: each row's ``candidates`` smallest entries of the proxy ``P`` (Fa, Fb) and each
    column's ``candidates`` smallest; non-finite entries are never candidates."""
    Fa, Fb = P.shape
    c, cr = min(candidates, Fb), min(candidates, Fa)
    mask = np.zeros((Fa, Fb), dtype=bool)
    with ThreadPoolExecutor(2) as pool:  # the two partial sorts release the GIL
        by_row = pool.submit(lambda: np.argpartition(P, c - 1, axis=1)[:, :c])
        by_col = pool.submit(lambda: np.argpartition(P, cr - 1, axis=0)[:cr, :])
        np.put_along_axis(mask, by_row.result(), True, axis=1)
        np.put_along_axis(mask, by_col.result(), True, axis=0)
    mask &= np.isfinite(P)
    return np.argwhere(mask)


def sliced_proxy(ma: Measures, mb: Measures, n_proj: int = 64, n_quantiles: int = 16, seed: int = 12345
                 ) -> np.ndarray:
    """(Fa, Fb) sliced-W2 lower bounds for all pairs (float32 matrix product of sliced embeddings)."""
    th = random_directions(ma.X.shape[2], n_proj, seed)
    ea = sliced_embedding(ma, directions=th, n_quantiles=n_quantiles)
    eb = sliced_embedding(mb, directions=th, n_quantiles=n_quantiles)
    return np.sqrt(_sqdist(ea, eb)).astype(np.float64)


def principal_directions(ma: Measures, mb: Measures, n_proj: int = 64) -> np.ndarray:
    """(d, L) orthonormal top principal axes of both layers' support points (weighted, pooled).

    For orthonormal directions the *sum* over directions of the 1-D W2^2 is a lower bound on W2^2
    (the squared norm is at least the sum of squared projections), and the top principal axes
    carry most of the cost, so slicing along them ranks pairs far closer to W2 than random
    directions do in high dimension (measured: candidate recall in docs/saeot.md)."""
    d = ma.X.shape[2]
    C = np.zeros((d, d))
    mean = np.zeros(d)
    tot = 0.0
    rng = np.random.default_rng(0)
    for m in (ma, mb):
        # at most 16k support rows per layer (float32 product): the axes only steer which 1-D
        # projections are taken; every orthonormal set gives a valid bound
        rows = np.arange(m.X.shape[0] * m.X.shape[1])
        if len(rows) > 16384:
            rows = np.sort(rng.choice(rows, 16384, replace=False))
        X = (m.Z[m.index.reshape(-1)[rows]] if m.index is not None and m.Z is not None
             else m.X.reshape(-1, d)[rows]).astype(np.float32)
        w = m.w.reshape(-1)[rows] * (m.X.shape[0] * m.X.shape[1] / len(rows))
        C += ((X * w[:, None].astype(np.float32)).T @ X).astype(np.float64)
        mean += w @ X.astype(np.float64)
        tot += w.sum()
    mean /= max(tot, 1e-300)
    C = C / max(tot, 1e-300) - np.outer(mean, mean)
    ev, V = np.linalg.eigh(C)
    return np.ascontiguousarray(V[:, ::-1][:, :min(n_proj, d)])


def pca_sliced_proxy(ma: Measures, mb: Measures, n_proj: int = 64, n_quantiles: int = 16) -> np.ndarray:
    """(Fa, Fb) sliced-W2 lower bounds along the top principal axes (:func:`principal_directions`)."""
    th = principal_directions(ma, mb, n_proj)
    ea = sliced_embedding(ma, directions=th, n_quantiles=n_quantiles)
    eb = sliced_embedding(mb, directions=th, n_quantiles=n_quantiles)
    return np.sqrt(_sqdist(ea, eb)).astype(np.float64)


def pca_bound_embedding(m: Measures, directions: np.ndarray, n_quantiles: int = 16) -> np.ndarray:
    r"""Per-feature vectors whose Euclidean distances are a lower bound on W2 itself (not only on SW2).

    ``directions`` V (d, L) orthonormal (:func:`principal_directions`).  For any coupling the cost
    splits over orthogonal subspaces, so
    :math:`W_2^2(\mu,\nu) \ge \sum_l W_2^2(\theta_l\#\mu, \theta_l\#\nu) + W_2^2(P_\perp\#\mu, P_\perp\#\nu)`;
    each 1-D term is bounded below by the cell-averaged quantiles (:func:`sliced_embedding`, times
    :math:`\sqrt L` to undo its average), the complement term by the mean and spread there
    (:func:`lower_bound`): :math:`\|m^\perp_\mu - m^\perp_\nu\|^2 + (s^\perp_\mu - s^\perp_\nu)^2`.
    Row f = [quantile cells (L Q), m_perp (d), s_perp (1)].

    Returns
    -------
    (F, L * Q + d + 1) float32
    """
    L = directions.shape[1]
    e = sliced_embedding(m, directions=directions, n_quantiles=n_quantiles) * np.float32(np.sqrt(L))
    c = m.centroid  # (F, d) float64
    V = directions.astype(np.float64)
    m_perp = c - (c @ V) @ V.T
    # spread in the complement = total spread^2 - variance along each principal axis
    Pz = project_tokens(m.Z, V).astype(np.float64) if m.Z is not None else None
    w = m.w / np.maximum(m.w.sum(1, keepdims=True), 1e-300)
    var_in = np.empty(len(c))
    for s in range(0, len(c), 1024):
        P = Pz[m.index[s:s + 1024]] if Pz is not None else m.X[s:s + 1024].astype(np.float64) @ V  # (f, k, L)
        mu = np.einsum("fk,fkl->fl", w[s:s + 1024], P)
        var_in[s:s + 1024] = (np.einsum("fk,fkl->f", w[s:s + 1024], P * P) - (mu * mu).sum(1))
    s_perp = np.sqrt(np.maximum(spread(m) ** 2 - var_in, 0.0))
    return np.concatenate([e, m_perp.astype(np.float32), s_perp[:, None].astype(np.float32)], 1)


def pca_bound(ma: Measures, mb: Measures, n_proj: int = 64, n_quantiles: int = 16) -> np.ndarray:
    """(Fa, Fb) lower bounds on W2 from :func:`pca_bound_embedding` (one matrix product)."""
    th = principal_directions(ma, mb, n_proj)
    ea, eb = pca_bound_embedding(ma, th, n_quantiles), pca_bound_embedding(mb, th, n_quantiles)
    return np.sqrt(_sqdist(ea, eb)).astype(np.float64)


def bound_mid(ma: Measures, mb: Measures, n_proj: int = 64, n_quantiles: int = 16) -> np.ndarray:
    r"""(Fa, Fb) ranking proxy between a lower and an upper bound on W2: :math:`\sqrt{LB^2 + UB^2}`.

    LB = :func:`pca_bound`; UB = the cost of the independent coupling,
    :math:`UB^2 = \|m_a - m_b\|^2 + s_a^2 + s_b^2` (:func:`spread`).  Not a bound itself: the lower
    bound alone is loose in a way that varies with the spreads (median LB / W2 ~0.6 on 9->18), and
    adding the upper bound ranks true nearest neighbours far higher (measured: docs/saeot.md).
    """
    th = principal_directions(ma, mb, n_proj)
    lb2 = _sqdist(pca_bound_embedding(ma, th, n_quantiles), pca_bound_embedding(mb, th, n_quantiles))
    sa, sb = spread(ma), spread(mb)
    # float32 product: a ranking proxy, not a bound, needs no float64 (half the time)
    ub2 = _sqdist(ma.centroid.astype(np.float32), mb.centroid.astype(np.float32)) + (sa[:, None] ** 2 + sb[None, :] ** 2)
    return np.sqrt(lb2.astype(np.float64) + ub2)


def prefilter_matrix(ma: Measures, mb: Measures, prefilter: str) -> np.ndarray:
    """(Fa, Fb) pre-filter scores (smaller = more likely near): ``centroid`` and ``pca-bound`` are
    lower bounds on W2, ``sliced`` and ``pca-sliced`` lower bounds on SW2, ``bound-mid`` between a
    lower and an upper bound."""
    if prefilter == "centroid":
        return lower_bound(ma, mb)
    if prefilter == "sliced":
        return sliced_proxy(ma, mb)
    if prefilter == "pca-sliced":
        return pca_sliced_proxy(ma, mb)
    if prefilter == "pca-bound":
        return pca_bound(ma, mb)
    if prefilter == "bound-mid":
        return bound_mid(ma, mb)
    raise ValueError(f"unknown prefilter {prefilter!r}; expected one of {PREFILTERS}")


def pairwise_w2(ma: Measures, mb: Measures, solver: Solver = "exact", *, candidates: int | None = 32,
                prefilter: str = "sliced", progress: bool = False,
                **solver_kw) -> PairwiseResult:
    """All-pairs W2 between two layers' features, with candidate pre-filtering.

    Parameters
    ----------
    ma, mb : Measures
        (Fa, k, d) and (Fb, k, d).
    solver : {"exact", "sinkhorn", "sinkhorn-debiased", "sliced"}
    candidates : int or None
        Evaluate only, for every source, its ``candidates`` nearest targets under the pre-filter
        (and for every target its ``candidates`` nearest sources).  None = all pairs.
    prefilter : {"centroid", "sliced", "pca-sliced"}
        ``centroid``: :func:`lower_bound` from means and spreads, an exact lower bound on W2.
        ``sliced``: the sliced-W2 lower bound with 64 random directions x 16 cells.
        ``pca-sliced``: the same along the 64 top principal axes of the supports (closer to W2 in rank).
        ``pca-bound``: :func:`pca_bound`, a lower bound on W2 itself: the 1-D bounds along the 64
        principal axes summed, plus mean and spread in their orthogonal complement.
        ``bound-mid``: :func:`bound_mid`, that bound combined with an upper bound (best recall).
    **solver_kw
        Passed to :func:`w2_pairs` (``n_jobs``, ``reg``, ``tol``, ...).

    Returns
    -------
    PairwiseResult
    """
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; expected one of {SOLVERS}")
    if prefilter not in PREFILTERS:
        raise ValueError(f"unknown prefilter {prefilter!r}; expected one of {PREFILTERS}")
    Fa, Fb = ma.X.shape[0], mb.X.shape[0]
    t0 = time.perf_counter()
    D = np.full((Fa, Fb), np.inf)
    alive_a, alive_b = ma.alive, mb.alive
    if solver == "sliced":
        th = random_directions(ma.X.shape[2], solver_kw.get("n_proj", 64), solver_kw.get("seed", 0))
        nq = solver_kw.get("n_quantiles", 32)
        ea = sliced_embedding(ma, directions=th, n_quantiles=nq)
        eb = sliced_embedding(mb, directions=th, n_quantiles=nq)
        D = np.sqrt(_sqdist(ea, eb)).astype(np.float64)
        D[~alive_a] = np.inf
        D[:, ~alive_b] = np.inf
        return PairwiseResult(D, int(alive_a.sum() * alive_b.sum()),
                              {"prefilter": 0.0, "solve": time.perf_counter() - t0})
    if candidates is None or candidates >= Fb:
        ii, jj = np.meshgrid(np.flatnonzero(alive_a), np.flatnonzero(alive_b), indexing="ij")
        pairs = np.stack([ii.ravel(), jj.ravel()], 1)
    else:
        P = prefilter_matrix(ma, mb, prefilter)
        P[~alive_a] = np.inf
        P[:, ~alive_b] = np.inf
        pairs = candidate_pairs(P, candidates)
    t1 = time.perf_counter()
    info: dict = {}
    vals = w2_pairs(ma, mb, pairs, solver, progress=progress, info=info, **solver_kw)
    vals = np.where(np.isnan(vals), np.inf, vals)
    D[pairs[:, 0], pairs[:, 1]] = vals
    return PairwiseResult(D, len(pairs), {"prefilter": t1 - t0, "solve": time.perf_counter() - t1}, info)


def stability_bound(Za: np.ndarray, da: FeatureDistributions, Zb: np.ndarray, db: FeatureDistributions) -> np.ndarray:
    r"""Upper bound on :math:`W_2(\mu_f, \mu'_f)` per feature, for a perturbed pair of inputs.

    ``(Za, da)`` and ``(Zb, db)`` describe the same F features before and after a perturbation
    (of the token embeddings and/or of the activations).  With
    :math:`\epsilon = \max_t \|Z_a[t] - Z_b[t]\|` over the tokens involved, TV the total variation
    between the two weight vectors over token positions and D the diameter of the union of the
    supports (in ``Za``),

    .. math:: W_2(\mu, \mu') \le \epsilon + D \sqrt{\mathrm{TV}}

    (move points: cost <= eps; then re-weight on a fixed support: :math:`W_2^2 \le D^2\,\mathrm{TV}`).
    By the triangle inequality every distance to any third measure moves by at most this much.

    Returns
    -------
    (F,) float64
    """
    F = da.index.shape[0]
    out = np.zeros(F)
    for f in range(F):
        ia, ib = da.index[f], db.index[f]
        wa = dict(zip(ia[ia >= 0].tolist(), da.weight[f][ia >= 0].tolist()))
        wb = dict(zip(ib[ib >= 0].tolist(), db.weight[f][ib >= 0].tolist()))
        toks = sorted(set(wa) | set(wb))
        if not toks:
            continue
        tv = 0.5 * sum(abs(wa.get(t, 0.0) - wb.get(t, 0.0)) for t in toks)
        P = Za[toks]
        diam = float(np.sqrt(_sqdist(P, P).max()))
        eps = float(np.linalg.norm(Za[toks] - Zb[toks], axis=1).max())
        out[f] = eps + diam * np.sqrt(tv)
    return out


def spread(m: Measures) -> np.ndarray:
    """(F,) root of the total variance, sqrt(sum_i w_i ||x_i - centroid||^2)."""
    # sum_i w_i |x_i - c|^2 = sum_i w_i |x_i|^2 - |c|^2 (weights sum to 1); no (F, k, d) temporary
    if m.index is not None and m.Z is not None:  # squared norms of the tokens once, then gathered
        zz = np.empty(len(m.Z))
        for s in range(0, len(m.Z), 32768):
            z = m.Z[s:s + 32768].astype(np.float64)
            zz[s:s + 32768] = np.einsum("nd,nd->n", z, z)
        sq = zz[m.index]  # (F, k)
    else:
        sq = np.einsum("fkd,fkd->fk", m.X, m.X, dtype=np.float64)  # (F, k), accumulated in float64
    c = m.centroid
    w = m.w / np.maximum(m.w.sum(1, keepdims=True), 1e-300)
    return np.sqrt(np.maximum((w * sq).sum(1) - (c * c).sum(1), 0.0))


def lower_bound(ma: Measures, mb: Measures) -> np.ndarray:
    r"""(Fa, Fb) lower bound on W2: :math:`\sqrt{\|m_a - m_b\|^2 + (s_a - s_b)^2}`.

    Means split off exactly (:math:`W_2^2 = \|m_a-m_b\|^2 + W_2^2` of the centred measures) and
    the centred W2 is at least the difference of the spreads (triangle inequality in L2).
    """
    sa, sb = spread(ma), spread(mb)
    return np.sqrt(_sqdist(ma.centroid, mb.centroid) + (sa[:, None] - sb[None, :]) ** 2)


def relaxed_lower_bound(ma: Measures, mb: Measures, *, block: int = 16, token_block: int = 16384,
                        target_block: int | None = None, n_jobs: int | None = None) -> np.ndarray:
    r"""(Fa, Fb) lower bound on W2 by relaxing one marginal at a time (the "relaxed WMD" bound).

    Dropping the target marginal of :math:`W_2^2 = \min_\pi \sum_{ij} \pi_{ij} C_{ij}` lets every
    source point go to its nearest target point: :math:`W_2^2 \ge \sum_i a_i \min_j C_{ij}`;
    dropping the source marginal gives :math:`\sum_j b_j \min_i C_{ij}`; the bound is the larger.
    It sees each point's nearest counterpart, so it separates the near-equidistant strangers of a
    feature with no counterpart that mean and spread (:func:`lower_bound`) cannot.

    Needs both layers to index one token array (``ma.Z is mb.Z``, as :func:`measures` builds
    them): a block of ``block`` sources (fewer if the block would pass 256 MB) has its distinct
    tokens' squared distances to every token computed once, (u, n_tokens) float32, in
    ``token_block`` rows of Z at a time on ``n_jobs`` threads; every target's (k, k') cost matrix
    is then a gather (``target_block`` targets at a time; default: 64 MB of them).  Costs are
    float32 like the exact solver's (the same token is exactly 0, as there); the bound is lowered
    by ``2e-4 * max |z|^2``, two orders above the ~1e-6 relative float32 rounding of either side,
    so rounding does not lift it above the solver's value (tested on every pair).

    Returns
    -------
    (Fa, Fb) float64, 0 for dead sources or targets.
    """
    xa, xb = _shared_index(ma, mb)
    if xa is None:
        raise ValueError("relaxed_lower_bound needs both layers to index one token array (measures() on one Z)")
    Z = ma.Z
    n_tok = len(Z)
    zz = np.empty(n_tok, dtype=np.float32)  # squared norms in float32, as the solver's costs
    for s in range(0, n_tok, token_block):
        z = Z[s:s + token_block].astype(np.float32, copy=False)
        zz[s:s + token_block] = np.einsum("nd,nd->n", z, z)
    tol = 2e-4 * float(zz.max(initial=0.0))
    Wa = ma.w / np.maximum(ma.w.sum(1, keepdims=True), 1e-300)  # (Fa, k)
    Wb = mb.w / np.maximum(mb.w.sum(1, keepdims=True), 1e-300)  # (Fb, k')
    Fa, k = xa.shape
    Fb = len(xb)
    block = max(1, min(block, (1 << 26) // max(1, k * n_tok)))  # the (u, n_tokens) float32 block stays <= 256 MB
    t_step = target_block or max(1, (1 << 24) // max(1, k * xb.shape[1]))  # (k, t, k') float32 <= 64 MB
    out = np.zeros((Fa, Fb))
    jobs = default_jobs() if n_jobs is None else max(1, int(n_jobs))
    with ThreadPoolExecutor(jobs) as pool:
        for s in range(0, Fa, block):
            toks, inv = np.unique(xa[s:s + block], return_inverse=True)
            U = Z[toks].astype(np.float32)  # (u, d)
            D = np.empty((len(toks), n_tok), dtype=np.float32)  # source token x every token

            def fill(t, U=U, D=D, uu=zz[toks]):
                z = Z[t:t + token_block].astype(np.float32, copy=False)
                D[:, t:t + token_block] = uu[:, None] + zz[None, t:t + token_block] - 2.0 * (U @ z.T)

            list(pool.map(fill, range(0, n_tok, token_block)))
            np.maximum(D, 0.0, out=D)
            D[np.arange(len(toks)), toks] = 0.0  # the same token: exactly 0, as in the solver
            inv = inv.reshape(-1, k)
            for r in range(len(inv)):
                Dr = D[inv[r]]  # (k, n_tokens): this source's points to every token
                for t in range(0, Fb, t_step):
                    C = Dr[:, xb[t:t + t_step]]  # (k, t, k') these targets' cost matrices
                    row = np.einsum("kf,k->f", C.min(axis=2), Wa[s + r])  # each source point to its nearest
                    col = np.einsum("fk,fk->f", C.min(axis=0), Wb[t:t + t_step])  # each target point to its nearest
                    out[s + r, t:t + t_step] = np.sqrt(np.maximum(np.maximum(row, col) - tol, 0.0))
    out[~ma.alive] = 0.0
    out[:, ~mb.alive] = 0.0
    return out


def nearest_w2(ma: Measures, mb: Measures, *, block: int = 8, progress: bool = False, max_sliced: bool = True,
               n_proj: int = 32, n_quantiles: int = 16, init: tuple[np.ndarray, np.ndarray] | None = None,
               relaxed: bool | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """Exact W2 nearest neighbour of every source feature, pruned by lower bounds.

    Targets are visited in increasing lower bound: the largest of :func:`lower_bound` (mean and
    spread), with ``max_sliced`` :func:`max_sliced_lower_bound` (``n_proj`` directions), and with
    ``relaxed`` :func:`relaxed_lower_bound` (default: when both layers index one token array;
    the only one of the three that prunes a feature with no counterpart well); once the bound
    reaches the best W2 found, no remaining target can be nearer, so the answer equals brute
    force while evaluating fewer pairs.

    Parameters
    ----------
    ma, mb : Measures
        (Fa, k, d), (Fb, k, d).
    block : int
        Targets evaluated per step.
    init : (nn, dist), optional
        A known target and its exact W2 per source (e.g. the best candidate of a pre-filtered
        search): the search starts from it, so only targets whose bound is below it are visited,
        and the answer is still exact (a certification pass).

    Returns
    -------
    nn : (Fa,) int64
        Index of the nearest target (-1 for dead sources).
    dist : (Fa,) float64
        Its W2 (inf for dead sources).
    evaluated : int
        Number of exact W2 problems solved.
    """
    from tqdm.auto import tqdm  # lazy: tqdm.auto (0.3 s) keeps --help fast

    Fa = ma.X.shape[0]
    P = lower_bound(ma, mb)  # (Fa, Fb)
    if max_sliced:
        th = random_directions(ma.X.shape[2], n_proj, 777)
        ea = sliced_embedding(ma, directions=th, n_quantiles=n_quantiles)
        eb = sliced_embedding(mb, directions=th, n_quantiles=n_quantiles)
        for s in range(0, Fa, 256):
            rows = np.arange(s, min(Fa, s + 256))
            P[rows] = np.maximum(P[rows], max_sliced_lower_bound(ea, eb, n_proj, rows))
    if relaxed is None:
        relaxed = _shared_index(ma, mb)[0] is not None
    if relaxed:
        np.maximum(P, relaxed_lower_bound(ma, mb), out=P)
    P[:, ~mb.alive] = np.inf
    nn = np.full(Fa, -1, dtype=np.int64) if init is None else np.asarray(init[0], dtype=np.int64).copy()
    dist = np.full(Fa, np.inf) if init is None else np.asarray(init[1], dtype=np.float64).copy()
    evaluated = 0
    for i in tqdm(np.flatnonzero(ma.alive), disable=not progress, desc="exact NN", unit="feature",
                  mininterval=2):
        order = np.argsort(P[i], kind="stable")
        for s in range(0, len(order), block):
            cand = order[s:s + block]
            cand = cand[P[i, cand] < dist[i]]
            if len(cand) == 0:
                break
            vals = _exact_block(ma, mb, np.stack([np.full(len(cand), i), cand], 1))
            evaluated += len(cand)
            b = int(np.argmin(vals))
            if vals[b] < dist[i]:
                dist[i], nn[i] = vals[b], cand[b]
    return nn, dist, evaluated
