"""Feature -> activation-weighted empirical distribution over token positions.

A feature f of an SAE is represented by the k token positions (in a fixed corpus) where it fires
most strongly, with weights ``w_i = a_i / sum_j a_j`` over those positions.  Only positive
activations count, so a feature that fires on fewer than k positions has a shorter support
(padded with index -1 and weight 0).  Because the support is chosen by rank and the weights are a
ratio, multiplying a feature's activations by any c > 0 leaves the distribution unchanged
(exactly for c a power of two, to the last bit or two of float64 otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class FeatureDistributions:
    """Top-k supports and weights of F features.

    Attributes
    ----------
    index : (F, k) int64
        Token positions (rows of the activation matrix), -1 where padded.  Sorted by
        decreasing activation.
    weight : (F, k) float64
        ``a / sum(a)`` over the support; 0 where padded.  Each alive row sums to 1.
    value : (F, k) float64
        The raw activations at ``index`` (0 where padded); kept for reports.
    """

    index: np.ndarray
    weight: np.ndarray
    value: np.ndarray

    @property
    def n_features(self) -> int:
        return self.index.shape[0]

    @property
    def k(self) -> int:
        return self.index.shape[1]

    @property
    def alive(self) -> np.ndarray:
        """(F,) bool: the feature fired (positive activation) at least once."""
        return self.index[:, 0] >= 0

    def subset(self, features: np.ndarray) -> "FeatureDistributions":
        return FeatureDistributions(self.index[features], self.weight[features], self.value[features])


def _finish(vals: np.ndarray, idx: np.ndarray) -> FeatureDistributions:
    # vals, idx : (F, k) sorted by decreasing value; non-positive entries are padding.
    vals = np.asarray(vals, dtype=np.float64)
    idx = np.asarray(idx, dtype=np.int64).copy()
    pos = vals > 0
    vals = np.where(pos, vals, 0.0)
    idx[~pos] = -1
    tot = vals.sum(axis=1, keepdims=True)  # (F, 1)
    weight = np.divide(vals, tot, out=np.zeros_like(vals), where=tot > 0)
    return FeatureDistributions(index=idx, weight=weight, value=vals)


def feature_distributions(acts, k: int = 32) -> FeatureDistributions:
    """Top-k activation-weighted distributions of every feature (column) of ``acts``.

    Parameters
    ----------
    acts : (n_tokens, F) array-like, float
        Feature activations: numpy array, torch tensor or scipy sparse matrix.
    k : int
        Support size (top-k positions per feature).

    Returns
    -------
    FeatureDistributions
        ``index`` and ``weight`` of shape (F, min(k, n_tokens)).

    Examples
    --------
    >>> import numpy as np
    >>> d = feature_distributions(np.array([[1.0, 0.0], [3.0, 2.0], [0.0, 0.0]]), k=2)
    >>> d.index.tolist(), d.weight.tolist()
    ([[1, 0], [1, -1]], [[0.75, 0.25], [1.0, 0.0]])
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    try:
        import scipy.sparse as sp  # lazy: scipy (0.3-3 s) keeps --help fast
    except ImportError:  # pragma: no cover
        sp = None
    if sp is not None and sp.issparse(acts):
        acts = sp.csc_matrix(acts)
        n, F = acts.shape
        kk = min(k, n)
        vals = np.zeros((F, kk))
        idx = np.full((F, kk), -1, dtype=np.int64)
        for f in range(F):
            lo, hi = acts.indptr[f], acts.indptr[f + 1]
            v, r = acts.data[lo:hi], acts.indices[lo:hi]
            if len(v) == 0:
                continue
            order = np.lexsort((r, -v))[:kk]  # by value desc, ties by position
            vals[f, : len(order)] = v[order]
            idx[f, : len(order)] = r[order]
        return _finish(vals, idx)
    a = np.asarray(acts.detach().cpu().numpy() if hasattr(acts, "detach") else acts, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"acts must be 2-D (n_tokens, F), got shape {a.shape}")
    acc = TopKAccumulator(a.shape[1], k)
    acc.update(a, 0)
    return acc.result()


class TopKAccumulator:
    """Streaming top-k per feature over batches of tokens (for corpora that do not fit in memory).

    Parameters
    ----------
    n_features : int
    k : int

    Examples
    --------
    >>> import numpy as np
    >>> acc = TopKAccumulator(1, 2)
    >>> acc.update(np.array([[1.0], [5.0]]), offset=0)
    >>> acc.update(np.array([[3.0]]), offset=2)
    >>> acc.result().index.tolist()
    [[1, 2]]
    """

    def __init__(self, n_features: int, k: int):
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.k = k
        self.vals = np.full((n_features, 0), -np.inf)  # (F, <=k)
        self.idx = np.zeros((n_features, 0), dtype=np.int64)

    def update(self, acts, offset: int) -> None:
        """Merge a batch. ``acts`` : (b, F) activations of tokens ``offset .. offset+b-1``."""
        a = np.asarray(acts.detach().cpu().numpy() if hasattr(acts, "detach") else acts, dtype=np.float64)
        b, F = a.shape
        if F != self.vals.shape[0]:
            raise ValueError(f"batch has {F} features, accumulator has {self.vals.shape[0]}")
        vals = np.concatenate([self.vals, a.T], axis=1)  # (F, m + b)
        idx = np.concatenate([self.idx, np.broadcast_to(np.arange(offset, offset + b), (F, b))], axis=1)
        m = vals.shape[1]
        kk = min(self.k, m)
        # Order by value desc, ties broken by earlier position (deterministic, batch-split independent).
        if m > 2 * kk:  # cheap preselection, then an exact ordered sort of the survivors
            part = np.argpartition(-vals, kk - 1, axis=1)[:, :kk]  # (F, kk)
            vals = np.take_along_axis(vals, part, axis=1)
            idx = np.take_along_axis(idx, part, axis=1)
        order = np.lexsort((idx, -vals), axis=-1)[:, :kk]  # (F, kk)
        self.vals = np.take_along_axis(vals, order, axis=1)
        self.idx = np.take_along_axis(idx, order, axis=1)

    def result(self) -> FeatureDistributions:
        return _finish(np.where(np.isfinite(self.vals), self.vals, 0.0), self.idx)
