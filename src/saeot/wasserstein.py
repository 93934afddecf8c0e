r"""Wasserstein-2 distances between feature distributions in a shared reference space.

A feature's distribution (see :mod:`saeot.distributions`) puts weight ``w_i`` on the reference-space
embedding ``Z[index_i]`` of token position ``index_i``.  Between two such measures

.. math::
    W_2(\mu, \nu) = \Big(\min_{T \in U(a, b)} \sum_{ij} T_{ij} \|x_i - y_j\|^2\Big)^{1/2}

Three solvers, one interface (:func:`w2_pairs`):

- ``exact``: network simplex (POT ``ot.emd2``), one problem at a time; k <= ~64.
- ``sinkhorn``: batched log-domain entropic OT (:func:`sinkhorn_batch`, torch); returns the
  transport cost of the entropic plan, square-rooted; ``reg`` is relative to each problem's mean
  cost.
- ``sliced``: sliced W2 with ``n_proj`` random directions; each feature's 1-D quantile functions
  are sampled at ``n_quantiles`` midpoints, which turns SW2 into a Euclidean distance between
  per-feature vectors, so *all* pairs cost one matrix product.

:func:`pairwise_w2` computes the (Fa, Fb) matrix between two layers with candidate pre-filtering:
the centroid distance is an exact lower bound (:math:`W_2 \ge \|m_\mu - m_\nu\|`), the sliced
distance a cheap proxy; only each feature's ``candidates`` best targets (and each target's best
sources) get the expensive solver.  Unevaluated pairs are ``inf``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from saeot.distributions import FeatureDistributions

Solver = Literal["exact", "sinkhorn", "sliced"]
SOLVERS = ("exact", "sinkhorn", "sliced")


@dataclass
class Measures:
    """F discrete measures with padded supports, in one embedding space.

    Attributes
    ----------
    X : (F, k, d) float64
        Support points (padding rows are copies of the first point, weight 0).
    w : (F, k) float64
        Weights; each row sums to 1 (all-zero rows = dead features).
    """

    X: np.ndarray
    w: np.ndarray

    @property
    def centroid(self) -> np.ndarray:
        """(F, d) weighted means."""
        return np.einsum("fk,fkd->fd", self.w, self.X)

    @property
    def alive(self) -> np.ndarray:
        return self.w.sum(axis=1) > 0


def measures(dist: FeatureDistributions, Z: np.ndarray) -> Measures:
    """Place each feature's distribution in the reference space.

    Parameters
    ----------
    dist : FeatureDistributions
        Supports ``index`` (F, k) of token positions and weights (F, k).
    Z : (n_tokens, d) array
        Reference-space embedding of every token position.

    Returns
    -------
    Measures
        ``X`` of shape (F, k, d).
    """
    Z = np.asarray(Z, dtype=np.float64)
    if Z.ndim != 2:
        raise ValueError(f"Z must be (n_tokens, d), got shape {Z.shape}")
    if dist.index.max(initial=-1) >= Z.shape[0]:
        raise ValueError(f"distribution indexes token {dist.index.max()} but Z has {Z.shape[0]} rows")
    idx = dist.index.copy()
    first = np.where(idx[:, :1] >= 0, idx[:, :1], 0)  # (F, 1)
    idx = np.where(idx >= 0, idx, first)  # pad with the first support point
    return Measures(X=Z[idx], w=dist.weight.astype(np.float64))


def _sqdist(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(n, d), (m, d) -> (n, m) squared Euclidean distances, clipped at 0."""
    M = (x * x).sum(1)[:, None] + (y * y).sum(1)[None, :] - 2.0 * x @ y.T
    return np.maximum(M, 0.0)


def w2_exact(x: np.ndarray, a: np.ndarray, y: np.ndarray, b: np.ndarray) -> float:
    """Exact W2 between two discrete measures (network simplex, POT ``emd2``).

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
    import ot

    ka, kb = a > 0, b > 0
    x, a, y, b = x[ka], a[ka], y[kb], b[kb]
    if len(a) == 0 or len(b) == 0:
        return float("nan")
    # Renormalise in float64 so POT's marginal check sees sums of exactly ~1.
    a = a / a.sum()
    b = b / b.sum()
    M = _sqdist(x, y)
    val = ot.emd2(a, b, M, numItermax=200_000)
    return float(np.sqrt(max(val, 0.0)))


def sliced_embedding(m: Measures, n_proj: int = 64, n_quantiles: int = 32, seed: int = 0,
                     directions: np.ndarray | None = None) -> np.ndarray:
    """Per-feature vectors whose Euclidean distances approximate sliced W2.

    For directions :math:`\\theta_1..\\theta_L` (uniform on the sphere) and quantile levels
    :math:`t_q = (q + 1/2)/Q`, row f is :math:`(F^{-1}_{f,\\theta_l}(t_q))_{l,q} / \\sqrt{LQ}`, so
    ``||E_f - E_g||`` is the midpoint-rule estimate of :math:`SW_2(\\mu_f, \\mu_g)`.

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
    (F, L * Q) float64
    """
    F, k, d = m.X.shape
    if directions is None:
        rng = np.random.default_rng(seed)
        directions = rng.standard_normal((d, n_proj))
        directions /= np.linalg.norm(directions, axis=0, keepdims=True)
    L = directions.shape[1]
    P = m.X @ directions  # (F, k, L)
    order = np.argsort(P, axis=1, kind="stable")  # (F, k, L)
    Ps = np.take_along_axis(P, order, axis=1)  # (F, k, L) sorted projections
    ws = np.take_along_axis(np.broadcast_to(m.w[:, :, None], P.shape), order, axis=1)
    cw = np.cumsum(ws, axis=1)  # (F, k, L) cumulative weights
    cw /= np.maximum(cw[:, -1:, :], 1e-300)
    t = (np.arange(n_quantiles) + 0.5) / n_quantiles  # (Q,)
    # quantile index per (f, l, q): first position where cw >= t
    E = np.empty((F, L, n_quantiles))
    for f in range(F):
        for l in range(L):
            j = np.searchsorted(cw[f, :, l], t, side="left")
            E[f, l] = Ps[f, np.minimum(j, k - 1), l]
    return E.reshape(F, L * n_quantiles) / np.sqrt(L * n_quantiles)


def _sliced_embedding_fast(m: Measures, directions: np.ndarray, n_quantiles: int) -> np.ndarray:
    """Vectorised :func:`sliced_embedding` (same result), via torch.searchsorted on batches."""
    import torch

    F, k, d = m.X.shape
    L = directions.shape[1]
    out = np.empty((F, L, n_quantiles))
    t = torch.from_numpy((np.arange(n_quantiles) + 0.5) / n_quantiles)
    for s in range(0, F, 512):
        X = m.X[s:s + 512]
        w = m.w[s:s + 512]
        P = X @ directions  # (f, k, L)
        order = np.argsort(P, axis=1, kind="stable")
        Ps = np.take_along_axis(P, order, axis=1)
        ws = np.take_along_axis(np.broadcast_to(w[:, :, None], P.shape), order, axis=1)
        cw = np.cumsum(ws, axis=1)
        cw /= np.maximum(cw[:, -1:, :], 1e-300)
        cwt = torch.from_numpy(np.ascontiguousarray(cw.transpose(0, 2, 1)))  # (f, L, k)
        j = torch.searchsorted(cwt, t.expand(cwt.shape[0], L, n_quantiles).contiguous(), side="left")
        j = j.clamp_max(k - 1).numpy()  # (f, L, Q)
        out[s:s + 512] = np.take_along_axis(Ps.transpose(0, 2, 1), j, axis=2)
    return out.reshape(F, L * n_quantiles) / np.sqrt(L * n_quantiles)


def random_directions(d: int, n_proj: int, seed: int = 0) -> np.ndarray:
    """(d, n_proj) unit directions, deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    th = rng.standard_normal((d, n_proj))
    return th / np.linalg.norm(th, axis=0, keepdims=True)


def w2_pairs(ma: Measures, mb: Measures, pairs: np.ndarray, solver: Solver = "exact", *,
             reg: float = 0.05, n_proj: int = 64, n_quantiles: int = 32, seed: int = 0,
             batch_size: int = 4096, progress: bool = False) -> np.ndarray:
    """W2 for a list of (source, target) feature pairs.

    Parameters
    ----------
    ma, mb : Measures
        Source (Fa, k, d) and target (Fb, k', d) measures in the same space.
    pairs : (P, 2) int array
        Rows ``(i, j)``: source feature i, target feature j.
    solver : {"exact", "sinkhorn", "sliced"}
    reg : float
        Sinkhorn only: entropic regularisation relative to the mean cost of each batch.
    n_proj, n_quantiles, seed : int
        Sliced only.
    batch_size : int
        Pairs per Sinkhorn / sliced batch.

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
    from tqdm.auto import tqdm

    if solver == "exact":
        it = np.flatnonzero(alive)
        for p in tqdm(it, disable=not progress, desc="exact W2", unit="pair", mininterval=2):
            i, j = pairs[p]
            out[p] = w2_exact(ma.X[i], ma.w[i], mb.X[j], mb.w[j])
        return out
    if solver == "sliced":
        th = random_directions(ma.X.shape[2], n_proj, seed)
        ea = _sliced_embedding_fast(ma, th, n_quantiles)
        eb = _sliced_embedding_fast(mb, th, n_quantiles)
        diff = ea[pairs[:, 0]] - eb[pairs[:, 1]]
        out = np.sqrt((diff * diff).sum(1))
        out[~alive] = np.nan
        return out
    # sinkhorn, batched
    it = np.flatnonzero(alive)
    for s in tqdm(range(0, len(it), batch_size), disable=not progress, desc="sinkhorn W2", unit="batch"):
        sel = it[s:s + batch_size]
        i, j = pairs[sel, 0], pairs[sel, 1]
        Xa, Xb = ma.X[i], mb.X[j]  # (B, k, d), (B, k', d)
        M = ((Xa * Xa).sum(-1)[:, :, None] + (Xb * Xb).sum(-1)[:, None, :]
             - 2 * np.einsum("bkd,bld->bkl", Xa, Xb))  # (B, k, k') squared distances
        M = np.maximum(M, 0.0)
        val = sinkhorn_batch(M, ma.w[i], mb.w[j], reg=reg)
        out[sel] = np.sqrt(np.maximum(val, 0.0))
    return out


def sinkhorn_batch(M: np.ndarray, a: np.ndarray, b: np.ndarray, reg: float = 0.05, max_iter: int = 100,
                   tol: float = 1e-3) -> np.ndarray:
    r"""Batched log-domain Sinkhorn; returns the transport cost of the entropic plan.

    Parameters
    ----------
    M : (B, n, m) costs;  a : (B, n), b : (B, m) weights (zeros allowed: those points are dropped)
    reg : float
        Entropic regularisation relative to each problem's mean cost.
    max_iter : int;  tol : float
        Stop when the max row-marginal error is below ``tol``; a ``UserWarning`` if it never is.

    Returns
    -------
    (B,) float64
        :math:`\langle P, M \rangle` for the entropic plan P (its column marginals are exact).
    """
    import warnings

    import torch

    M = torch.from_numpy(np.ascontiguousarray(M, dtype=np.float64))
    scale = M.mean(dim=(1, 2), keepdim=True) + 1e-12  # (B, 1, 1)
    Mr = M / (scale * reg)  # (B, n, m) cost in units of the regulariser
    with np.errstate(divide="ignore"):  # -inf for zero weights (padding): those points drop out
        la = torch.from_numpy(np.log(np.asarray(a, dtype=np.float64)))
        lb = torch.from_numpy(np.log(np.asarray(b, dtype=np.float64)))
    f = torch.zeros_like(la)
    g = torch.zeros_like(lb)
    err = float("inf")
    for it in range(max_iter):
        f = la - torch.logsumexp(g[:, None, :] - Mr, dim=2)  # (B, n)
        f = torch.where(torch.isfinite(la), f, torch.full_like(f, -torch.inf))
        g = lb - torch.logsumexp(f[:, :, None] - Mr, dim=1)  # (B, m)
        g = torch.where(torch.isfinite(lb), g, torch.full_like(g, -torch.inf))
        if it % 10 == 9:
            logP = f[:, :, None] + g[:, None, :] - Mr
            row = torch.exp(torch.logsumexp(logP, dim=2))  # (B, n)
            err = float((row - la.exp()).abs().sum(1).max())
            if err < tol:
                break
    else:
        warnings.warn(f"sinkhorn_batch: not converged after {max_iter} iterations (err {err:.2e})",
                      UserWarning, stacklevel=2)
    P = torch.exp(f[:, :, None] + g[:, None, :] - Mr)
    return (P * M).sum(dim=(1, 2)).numpy()


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
    """

    D: np.ndarray
    evaluated: int
    seconds: dict = field(default_factory=dict)


def pairwise_w2(ma: Measures, mb: Measures, solver: Solver = "exact", *, candidates: int | None = 32,
                prefilter: Literal["centroid", "sliced"] = "sliced", progress: bool = False,
                **solver_kw) -> PairwiseResult:
    """All-pairs W2 between two layers' features, with candidate pre-filtering.

    Parameters
    ----------
    ma, mb : Measures
        (Fa, k, d) and (Fb, k, d).
    solver : {"exact", "sinkhorn", "sliced"}
    candidates : int or None
        Evaluate only, for every source, its ``candidates`` nearest targets under the pre-filter
        (and for every target its ``candidates`` nearest sources).  None = all pairs.
    prefilter : {"centroid", "sliced"}
        ``centroid``: :func:`lower_bound` from means and spreads, an exact lower bound on W2.  ``sliced``: sliced W2 with
        64 directions (cheap for all pairs; closer to W2 in rank).
    **solver_kw
        Passed to :func:`w2_pairs`.

    Returns
    -------
    PairwiseResult
    """
    Fa, Fb = ma.X.shape[0], mb.X.shape[0]
    t0 = time.perf_counter()
    D = np.full((Fa, Fb), np.inf)
    alive_a, alive_b = ma.alive, mb.alive
    if solver == "sliced" or candidates is None or candidates >= Fb:
        if solver == "sliced":
            th = random_directions(ma.X.shape[2], solver_kw.get("n_proj", 64), solver_kw.get("seed", 0))
            nq = solver_kw.get("n_quantiles", 32)
            ea, eb = _sliced_embedding_fast(ma, th, nq), _sliced_embedding_fast(mb, th, nq)
            D = np.sqrt(_sqdist(ea, eb))
            D[~alive_a] = np.inf
            D[:, ~alive_b] = np.inf
            return PairwiseResult(D, int(alive_a.sum() * alive_b.sum()),
                                  {"prefilter": 0.0, "solve": time.perf_counter() - t0})
        ii, jj = np.meshgrid(np.flatnonzero(alive_a), np.flatnonzero(alive_b), indexing="ij")
        pairs = np.stack([ii.ravel(), jj.ravel()], 1)
    else:
        if prefilter == "centroid":
            P = lower_bound(ma, mb)
        elif prefilter == "sliced":
            th = random_directions(ma.X.shape[2], 64, 12345)
            P = np.sqrt(_sqdist(_sliced_embedding_fast(ma, th, 16), _sliced_embedding_fast(mb, th, 16)))
        else:
            raise ValueError(f"unknown prefilter {prefilter!r}; expected 'centroid' or 'sliced'")
        P[~alive_a] = np.inf
        P[:, ~alive_b] = np.inf
        c = min(candidates, Fb)
        mask = np.zeros((Fa, Fb), dtype=bool)
        rows = np.argpartition(P, c - 1, axis=1)[:, :c]  # (Fa, c)
        np.put_along_axis(mask, rows, True, axis=1)
        cr = min(candidates, Fa)
        cols = np.argpartition(P, cr - 1, axis=0)[:cr, :]  # (cr, Fb)
        np.put_along_axis(mask, cols, True, axis=0)
        mask &= np.isfinite(P)
        pairs = np.argwhere(mask)
    t1 = time.perf_counter()
    vals = w2_pairs(ma, mb, pairs, solver, progress=progress, **solver_kw)
    vals = np.where(np.isnan(vals), np.inf, vals)
    D[pairs[:, 0], pairs[:, 1]] = vals
    return PairwiseResult(D, len(pairs), {"prefilter": t1 - t0, "solve": time.perf_counter() - t1})


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
    c = m.centroid
    return np.sqrt(np.maximum(np.einsum("fk,fk->f", m.w, ((m.X - c[:, None]) ** 2).sum(-1)), 0.0))


def lower_bound(ma: Measures, mb: Measures) -> np.ndarray:
    r"""(Fa, Fb) lower bound on W2: :math:`\sqrt{\|m_a - m_b\|^2 + (s_a - s_b)^2}`.

    Means split off exactly (:math:`W_2^2 = \|m_a-m_b\|^2 + W_2^2` of the centred measures) and
    the centred W2 is at least the difference of the spreads (triangle inequality in L2).
    """
    sa, sb = spread(ma), spread(mb)
    return np.sqrt(_sqdist(ma.centroid, mb.centroid) + (sa[:, None] - sb[None, :]) ** 2)


def nearest_w2(ma: Measures, mb: Measures, *, block: int = 8, progress: bool = False
               ) -> tuple[np.ndarray, np.ndarray, int]:
    """Exact W2 nearest neighbour of every source feature, pruned by the centroid lower bound.

    Targets are visited in increasing :func:`lower_bound` (mean and spread); once it reaches the best W2 found, no remaining target can be nearer, so the
    answer equals brute force while evaluating far fewer pairs.

    Parameters
    ----------
    ma, mb : Measures
        (Fa, k, d), (Fb, k, d).
    block : int
        Targets evaluated per step.

    Returns
    -------
    nn : (Fa,) int64
        Index of the nearest target (-1 for dead sources).
    dist : (Fa,) float64
        Its W2 (inf for dead sources).
    evaluated : int
        Number of exact W2 problems solved.
    """
    from tqdm.auto import tqdm

    Fa = ma.X.shape[0]
    P = lower_bound(ma, mb)  # (Fa, Fb)
    P[:, ~mb.alive] = np.inf
    nn = np.full(Fa, -1, dtype=np.int64)
    dist = np.full(Fa, np.inf)
    evaluated = 0
    for i in tqdm(np.flatnonzero(ma.alive), disable=not progress, desc="exact NN", unit="feature",
                  mininterval=2):
        order = np.argsort(P[i], kind="stable")
        for s in range(0, len(order), block):
            cand = order[s:s + block]
            cand = cand[P[i, cand] < dist[i]]
            if len(cand) == 0:
                break
            for j in cand:
                w = w2_exact(ma.X[i], ma.w[i], mb.X[j], mb.w[j])
                evaluated += 1
                if w < dist[i]:
                    dist[i], nn[i] = w, j
    return nn, dist, evaluated
