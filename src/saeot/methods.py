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
``sae-match-folded`` SAE-Match's defining cost (Balagansky et al., ICLR 2025, arXiv 2410.07656 v3):
                   every feature's activation threshold theta folded into its parameters (their
                   eq. 4: encoder column and encoder bias / theta, decoder row * theta: an exact
                   reparametrisation whose threshold is 1), then the permutation minimising the
                   squared error between the *folded decoder* rows, theta_i W_dec[i] (their eq. 3,
                   a linear assignment problem); matched one-to-one (Hungarian,
                   :data:`ONE_TO_ONE`) whatever the strategy asked for.
``sae-match-folded-encdec`` the same fold, MSE of the concatenated folded [encoder column,
                   encoder bias, decoder row]: the cost of the paper's experiments (their sec. 4:
                   "MSE from both decoder and encoder layers"; sec. 6: "all weights of the SAE
                   (encoder, decoder, and biases)"; b_dec does not depend on the feature order).
                   Eq. 3 says "the same logic applies to the encoder weights, provided they are
                   transposed" and does not say how the terms are weighted; this is their mean
                   over all 2 d + 1 entries (kept beside the decoder-only reading).
                   JumpReLU: theta = its threshold.  TopK has no per-feature threshold: the decision is "among the k
                   largest", a data-dependent threshold shared by all features of a token, so the
                   fold uses one theta per layer, the mean over tokens of the smallest active
                   activation (BatchTopK's global threshold, as dictionary_learning tracks it);
                   without activations (or standard ReLU SAEs, threshold 0) theta = 1.
``act-corr``       1 - Pearson correlation of their activations over the same corpus tokens
``xact``           co-firing on OT's own inputs: 1 - Pearson correlation of source feature i's
                   activations at the source's support tokens with target feature j's
                   activations at *the same tokens as OT's reference space sees them*
                   (``LayerFeatures.target_acts``: the target SAE applied to the reference
                   states of the source's tokens).  On shared tokens this is act-corr; on
                   disjoint tokens it is the cheap baseline that reads everything OT reads.
=================  ===========================================================================

``sae-match`` (the variant above it) folds decoder norms instead of thresholds and is matched by
whatever strategy the caller picks; with unit-norm decoders (saeot's TopK trainer) its folding is
the identity.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from saeot.distributions import FeatureDistributions, feature_distributions
from saeot.wasserstein import (
    PairwiseResult, _sqdist, measures, pairwise_w2, random_directions, sliced_embedding_all_firing,
)

METHODS = ("ot", "decoder-cosine", "sae-match", "sae-match-folded", "sae-match-folded-encdec", "act-corr", "xact")
# the default set of compare_methods (demo, report, bench): on shared tokens xact equals act-corr, and
# the enc+dec reading of SAE-Match is kept for comparison only
CORE_METHODS = ("ot", "decoder-cosine", "sae-match", "sae-match-folded", "act-corr")
# methods whose published matching is one-to-one: compare_methods matches them by Hungarian
ONE_TO_ONE = ("sae-match-folded", "sae-match-folded-encdec")


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
    b_enc : (F,) float, optional
        Encoder bias (``sae-match-folded``; default 0).
    threshold : (F,) float, optional
        Per-feature activation threshold folded by ``sae-match-folded`` (JumpReLU's threshold);
        None = :func:`effective_threshold` of ``acts`` (TopK).
    target_acts : (n_tokens, F_target) array or scipy.sparse matrix, optional
        Source layers only (``xact``): the *target* SAE's activations at this layer's tokens, as
        OT's reference space sees those tokens; None = the target's own ``acts`` (shared tokens).
    """

    W_dec: np.ndarray
    acts: object
    Z: np.ndarray
    W_enc: np.ndarray | None = None
    k: int = 32
    b_enc: np.ndarray | None = None
    threshold: np.ndarray | None = None
    target_acts: object | None = None
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
    import scipy.sparse as sp  # lazy: scipy (0.3-3 s) keeps --help fast

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


def effective_threshold(acts) -> float:
    """One threshold for a TopK layer: the mean over tokens (with any active feature) of the smallest
    active activation, i.e. the level below which a feature did not make the token's top k
    (BatchTopK's global threshold).  1.0 if nothing fires."""
    import scipy.sparse as sp  # lazy: scipy (0.3-3 s) keeps --help fast

    x = sp.csr_matrix(acts)
    x.eliminate_zeros()
    if x.nnz == 0:
        return 1.0
    x.data = np.where(x.data > 0, x.data, np.inf)
    mins = np.asarray(x.min(axis=1, explicit=True).toarray()).ravel()  # (n,) inf where nothing fired
    mins = mins[np.isfinite(mins) & (mins > 0)]
    return float(mins.mean()) if len(mins) else 1.0


def folded_parameters(L: LayerFeatures) -> np.ndarray:
    """(F, 2 d + 1) SAE-Match folded parameters [W_enc column / theta, b_enc / theta, W_dec row * theta]."""
    dec = np.asarray(L.W_dec, dtype=np.float64)  # (F, d)
    enc = np.asarray(L.W_enc if L.W_enc is not None else L.W_dec.T, dtype=np.float64)  # (d, F)
    b = np.zeros(len(dec)) if L.b_enc is None else np.asarray(L.b_enc, dtype=np.float64)  # (F,)
    th = np.full(len(dec), effective_threshold(L.acts)) if L.threshold is None else \
        np.asarray(L.threshold, dtype=np.float64)
    th = np.where(th > 0, th, 1.0)  # theta = 0 (plain ReLU) folds nothing
    return np.concatenate([enc.T / th[:, None], (b / th)[:, None], dec * th[:, None]], axis=1)


def _folded_decoder_mse(A: LayerFeatures, B: LayerFeatures) -> np.ndarray:
    """(Fa, Fb) mean squared error between folded decoder rows theta_i W_dec[i] (SAE-Match's eq. 3 on eq. 4)."""
    fa, fb = (folded_parameters(L)[:, -L.W_dec.shape[1]:] for L in (A, B))
    D = (fa * fa).sum(1)[:, None] + (fb * fb).sum(1)[None, :] - 2 * fa @ fb.T
    return np.maximum(D, 0.0) / fa.shape[1]


def _folded_mse(A: LayerFeatures, B: LayerFeatures) -> np.ndarray:
    fa, fb = folded_parameters(A), folded_parameters(B)
    D = (fa * fa).sum(1)[:, None] + (fb * fb).sum(1)[None, :] - 2 * fa @ fb.T
    return np.maximum(D, 0.0) / fa.shape[1]


def distance_matrix(method: str, A: LayerFeatures, B: LayerFeatures, *, solver: str = "exact",
                    candidates: int | None = 32, prefilter: str = "sliced", progress: bool = False,
                    **solver_kw) -> PairwiseResult:
    """(Fa, Fb) distances between two layers' features under one method.

    Parameters
    ----------
    method : one of :data:`METHODS`
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
    elif method == "sae-match-folded":
        D = _folded_decoder_mse(A, B)
    elif method == "sae-match-folded-encdec":
        D = _folded_mse(A, B)
    elif method == "xact":
        D = _activation_correlation_distance(A.acts, B.acts if A.target_acts is None else A.target_acts)
    else:
        D = _activation_correlation_distance(A.acts, B.acts)
    Fa, Fb = D.shape
    return PairwiseResult(D, Fa * Fb, {"solve": time.perf_counter() - t0})
