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
    if strategy == "nn":
        tgt = np.argmin(D, axis=1)
        src = np.arange(D.shape[0])
    elif strategy == "hungarian":
        from scipy.optimize import linear_sum_assignment

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
