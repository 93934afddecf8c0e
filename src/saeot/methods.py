"""Every feature-similarity method behind one interface: ``distance_matrix(name, A, B) -> (Fa, Fb)``.

Lower is more similar for every method, so matching code is shared.

=================  ===========================================================================
name               distance between feature i of layer A and feature j of layer B
=================  ===========================================================================
``ot``             W2 between their activation-weighted top-k distributions in the reference
                   space (ours); solver via ``solver=`` (exact / sinkhorn / sliced)
``decoder-cosine`` 1 - cos(W_dec_A[i], W_dec_B[j])
``sae-match``      SAE-Match-style parameter distance (Balagansky et al., 2024): fold each
                   feature's decoder norm into its encoder (unit decoder rows, encoder column
                   times the norm), then squared Euclidean distance of the concatenated
                   [encoder column, decoder row]
``act-corr``       1 - Pearson correlation of their activations over the same corpus tokens
=================  ===========================================================================
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from saeot.distributions import FeatureDistributions, feature_distributions
from saeot.wasserstein import PairwiseResult, measures, pairwise_w2

METHODS = ("ot", "decoder-cosine", "sae-match", "act-corr")


@dataclass
class LayerFeatures:
    """One layer's SAE features, as every method needs them.

    Attributes
    ----------
    W_dec : (F, d) float
        Decoder rows (feature directions in the residual stream).
    acts : (n_tokens, F) array or scipy.sparse matrix
        Feature activations over the shared corpus tokens.
    Z : (n_tokens, d') float
        Reference-space embedding of every token (see :mod:`saeot.space`).
    W_enc : (d, F) float, optional
        Encoder (for ``sae-match``; defaults to ``W_dec.T``).
    k : int
        Top-k support size for the OT distributions; 0 = all firing tokens (sliced solver only).
    """

    W_dec: np.ndarray
    acts: object
    Z: np.ndarray
    W_enc: np.ndarray | None = None
    k: int = 32
    _dists: FeatureDistributions | None = field(default=None, repr=False)

    @property
    def n_features(self) -> int:
        return self.W_dec.shape[0]

    @property
    def dists(self) -> FeatureDistributions:
        if self._dists is None:
            self._dists = feature_distributions(self.acts, self.k)
        return self._dists


def _cosine_distance(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    An = A / np.maximum(np.linalg.norm(A, axis=1, keepdims=True), 1e-12)
    Bn = B / np.maximum(np.linalg.norm(B, axis=1, keepdims=True), 1e-12)
    return 1.0 - An @ Bn.T


def _activation_correlation_distance(acts_a, acts_b) -> np.ndarray:
    import scipy.sparse as sp

    def stats(x):
        if sp.issparse(x):
            x = sp.csc_matrix(x, dtype=np.float64)
            n = x.shape[0]
            mean = np.asarray(x.mean(0)).ravel()
            sq = np.asarray(x.multiply(x).sum(0)).ravel()
        else:
            x = np.asarray(x, dtype=np.float64)
            n = x.shape[0]
            mean = x.mean(0)
            sq = (x * x).sum(0)
        std = np.sqrt(np.maximum(sq / n - mean ** 2, 0.0))
        return x, n, mean, std

    a, n, ma, sa = stats(acts_a)
    b, nb, mb, sb = stats(acts_b)
    if n != nb:
        raise ValueError(f"act-corr needs the same tokens: {n} vs {nb} rows")
    cross = a.T @ b  # (Fa, Fb)
    cross = cross.toarray() if hasattr(cross, "toarray") else np.asarray(cross)
    cov = cross / n - np.outer(ma, mb)
    denom = np.outer(sa, sb)
    corr = np.divide(cov, denom, out=np.zeros_like(cov), where=denom > 0)
    D = 1.0 - corr
    D[sa == 0] = np.inf
    D[:, sb == 0] = np.inf
    return D


def _sae_match_distance(A: LayerFeatures, B: LayerFeatures) -> np.ndarray:
    def folded(L: LayerFeatures) -> np.ndarray:
        dec = np.asarray(L.W_dec, dtype=np.float64)  # (F, d)
        enc = np.asarray(L.W_enc if L.W_enc is not None else L.W_dec.T, dtype=np.float64)  # (d, F)
        norm = np.maximum(np.linalg.norm(dec, axis=1), 1e-12)  # (F,)
        return np.concatenate([enc.T * norm[:, None], dec / norm[:, None]], axis=1)  # (F, 2d)

    fa, fb = folded(A), folded(B)
    D = (fa * fa).sum(1)[:, None] + (fb * fb).sum(1)[None, :] - 2 * fa @ fb.T
    return np.maximum(D, 0.0)


def distance_matrix(method: str, A: LayerFeatures, B: LayerFeatures, *, solver: str = "exact",
                    candidates: int | None = 32, prefilter: str = "sliced", progress: bool = False,
                    **solver_kw) -> PairwiseResult:
    """(Fa, Fb) distances between two layers' features under one method.

    Parameters
    ----------
    method : {"ot", "decoder-cosine", "sae-match", "act-corr"}
    A, B : LayerFeatures
        Source and target layer.
    solver, candidates, prefilter, **solver_kw
        ``ot`` only; see :func:`saeot.wasserstein.pairwise_w2`.

    Returns
    -------
    PairwiseResult
        ``D`` of shape (Fa, Fb); lower = more similar; ``inf`` = not evaluated / dead feature.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    t0 = time.perf_counter()
    if method == "ot" and (A.k == 0 or B.k == 0):
        from saeot.wasserstein import _sqdist, random_directions, sliced_embedding_all_firing

        if solver != "sliced":
            raise ValueError("k = 0 (all firing tokens) is supported by the sliced solver only")
        th = random_directions(A.Z.shape[1], solver_kw.get("n_proj", 64), solver_kw.get("seed", 0))
        nq = solver_kw.get("n_quantiles", 32)
        ea = sliced_embedding_all_firing(A.acts, A.Z, th, nq)
        eb = sliced_embedding_all_firing(B.acts, B.Z, th, nq)
        D = np.sqrt(_sqdist(ea, eb)).astype(np.float64)
        fa = np.asarray((A.acts > 0).sum(0)).ravel() > 0
        fb = np.asarray((B.acts > 0).sum(0)).ravel() > 0
        D[~fa] = np.inf
        D[:, ~fb] = np.inf
        return PairwiseResult(D, int(fa.sum() * fb.sum()), {"solve": time.perf_counter() - t0})
    if method == "ot":
        Za = np.ascontiguousarray(A.Z, dtype=np.float32)
        ma = measures(A.dists, Za)
        mb = measures(B.dists, Za if B.Z is A.Z else B.Z)  # one shared array: equal tokens cost exactly 0
        return pairwise_w2(ma, mb, solver, candidates=candidates, prefilter=prefilter,
                           progress=progress, **solver_kw)
    if method == "decoder-cosine":
        D = _cosine_distance(np.asarray(A.W_dec, np.float64), np.asarray(B.W_dec, np.float64))
    elif method == "sae-match":
        D = _sae_match_distance(A, B)
    else:
        D = _activation_correlation_distance(A.acts, B.acts)
    Fa, Fb = D.shape
    return PairwiseResult(D, Fa * Fb, {"solve": time.perf_counter() - t0})
