"""Matching features across layers from a distance matrix: nearest neighbour or one-to-one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

Strategy = Literal["nn", "hungarian", "mutual"]
STRATEGIES = ("nn", "hungarian", "mutual")


@dataclass
class Matching:
    """Matched pairs, sorted by source index.

    Attributes
    ----------
    src : (M,) int      source feature indices
    tgt : (M,) int      matched target feature indices
    dist : (M,) float   their distances
    """

    src: np.ndarray
    tgt: np.ndarray
    dist: np.ndarray

    def as_dict(self) -> dict[int, int]:
        return dict(zip(self.src.tolist(), self.tgt.tolist()))

    def accuracy(self, truth: np.ndarray) -> float:
        """Fraction of ``len(truth)`` sources matched to ``truth[src]`` (unmatched count as wrong)."""
        truth = np.asarray(truth)
        return float((truth[self.src] == self.tgt).sum() / len(truth))


def match(D: np.ndarray, strategy: Strategy = "nn", threshold: float | None = None) -> Matching:
    """Match every source feature (row) to a target feature (column).

    Parameters
    ----------
    D : (Fa, Fb) float
        Distances, lower = more similar; ``inf`` = not a candidate.
    strategy : {"nn", "hungarian"}
        ``nn``: each source to its nearest target (targets may repeat).  ``hungarian``: one-to-one
        assignment minimising the total distance (scipy ``linear_sum_assignment``).  ``mutual``:
        only pairs that are each other's nearest neighbour (one-to-one, usually fewer pairs).
    threshold : float, optional
        Drop pairs whose distance exceeds it.

    Returns
    -------
    Matching

    Examples
    --------
    >>> import numpy as np
    >>> match(np.array([[0.1, 0.2], [0.1, 0.9]]), "hungarian").tgt.tolist()
    [1, 0]
    """
    D = np.asarray(D, dtype=np.float64)
    if D.ndim != 2:
        raise ValueError(f"D must be 2-D, got shape {D.shape}")
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; expected one of {STRATEGIES}")
    if strategy == "nn":
        tgt = np.argmin(D, axis=1)
        src = np.arange(D.shape[0])
    elif strategy == "hungarian":
        from scipy.optimize import linear_sum_assignment  # lazy: scipy (0.3-3 s) keeps --help fast

        finite = np.isfinite(D)
        big = (np.abs(D[finite]).max() + 1.0) * max(D.shape) if finite.any() else 1.0
        src, tgt = linear_sum_assignment(np.where(finite, D, big))
    elif strategy == "mutual":
        tgt = np.argmin(D, axis=1)
        back = np.argmin(D, axis=0)  # (Fb,) nearest source of every target
        src = np.flatnonzero(back[tgt] == np.arange(D.shape[0]))
        tgt = tgt[src]
    else:
        raise ValueError(f"unknown strategy {strategy!r}; expected one of {STRATEGIES}")
    dist = D[src, tgt]
    keep = np.isfinite(dist)
    if threshold is not None:
        keep &= dist <= threshold
    return Matching(src[keep], tgt[keep], dist[keep])


HUBNESS = ("none", "csls")


def csls(D: np.ndarray, k: int = 10) -> np.ndarray:
    """Hubness-corrected distances (CSLS of Conneau et al., 2018, written for distances).

    ``D'(i, j) = 2 D(i, j) - r_A(i) - r_B(j)``, where ``r_A(i)`` is the mean of source i's ``k``
    smallest distances to targets and ``r_B(j)`` the mean of target j's ``k`` smallest distances
    to sources.  ``r_A`` does not change any row's ranking; ``r_B`` raises the distance to a *hub*
    (a target close to many sources), so nearest-neighbour retrieval stops piling onto it.
    ``inf`` entries (not evaluated, dead) stay ``inf`` and are left out of the means.

    Parameters
    ----------
    D : (Fa, Fb) float
    k : int
        Neighbourhood size.

    Returns
    -------
    (Fa, Fb) float64

    Examples
    --------
    >>> D = np.array([[1.0, 1.1], [1.0, 3.0], [1.0, 3.0]])  # target 0 is everyone's nearest: a hub
    >>> match(csls(D, k=2), "nn").tgt.tolist()
    [1, 0, 0]
    """
    D = np.asarray(D, dtype=np.float64)

    def knn_mean(M: np.ndarray) -> np.ndarray:  # mean of each row's k smallest finite entries
        kk = min(k, M.shape[1])
        part = np.partition(M, kk - 1, axis=1)[:, :kk]
        fin = np.isfinite(part)
        n = fin.sum(1)
        s = np.where(fin, part, 0.0).sum(1)
        return np.divide(s, n, out=np.zeros(len(M)), where=n > 0)

    out = 2 * D - knn_mean(D)[:, None] - knn_mean(D.T)[None, :]
    out[~np.isfinite(D)] = np.inf
    return out


def in_degree_stats(tgt: np.ndarray, n_targets: int) -> dict:
    """How many sources each target receives: max, 99th percentile (over all ``n_targets``
    targets, zeros included), distinct targets."""
    deg = np.bincount(np.asarray(tgt, dtype=np.int64), minlength=n_targets)
    return {"max_in_degree": int(deg.max(initial=0)), "p99_in_degree": float(np.percentile(deg, 99)) if len(deg) else 0.0,
            "distinct_targets": int((deg > 0).sum())}
