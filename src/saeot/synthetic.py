"""Synthetic ground truth: two "layers" of features with planted one-to-one correspondences.

Generative model (all seeded):

- F concepts with centres ``mu_c`` in R^d, pairwise distances about ``margin`` (the margin in
  the reference space; units of the within-concept noise ``sigma = 1``).
- ``n_tokens`` tokens, each with a concept ``c_t`` uniform over the F concepts; reference-space
  embedding ``Z_t = mu_{c_t} + N(0, I/d)`` (so within-concept noise has norm ~1).
- Layer A feature i fires on tokens of concept i with activation ``g_i * U(0.5, 1.5)``; layer B
  feature ``perm[i]`` fires on the same concept's tokens with probability ``keep`` and its own
  gain and noise.  Both layers also fire *spuriously*: each token triggers one random feature of
  each layer with probability ``spurious`` at ``g * U(0, 1.5)``, so with few tokens the top-k of a
  feature is mostly noise and recovery is hard; with more tokens the concept firings dominate.
- Decoders: ``W_dec_B[perm[i]] = normalise(W_dec_A[i] + drift * N(0, I/d))``: the residual
  direction drifts between layers (``drift`` = 0: identical; 2: barely related).

- Realistic geometry (optional, both default off): ``outlier_dims`` coordinates get meaning-free
  noise of standard deviation ``outlier_scale`` (independent of the concept: the "massive
  activation" dimensions of real residual streams), and every token's embedding *and* its
  activations are multiplied by a log-normal norm factor ``exp(norm_sigma * N(0, 1))`` (real
  per-token norms vary by large factors, and high-norm tokens fire features harder, so top-k
  supports drift towards them: the source of hubs).

The truth is ``perm``: feature i of A corresponds to feature perm[i] of B.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from saeot.methods import LayerFeatures


@dataclass
class PlantedPair:
    A: LayerFeatures
    B: LayerFeatures
    perm: np.ndarray  # (F,) truth: A's feature i <-> B's feature perm[i]
    concept: np.ndarray  # (n_tokens,) concept of each token


def planted_pair(n_features: int = 64, n_tokens: int = 2000, d: int = 32, *, margin: float = 1.0,
                 spurious: float = 0.5, keep: float = 0.8, drift: float = 1.0, k: int = 16,
                 seed: int = 0, disjoint: bool = False, outlier_dims: int = 0, outlier_scale: float = 10.0,
                 norm_sigma: float = 0.0) -> PlantedPair:
    """Generate a :class:`PlantedPair` (see module docstring for the model).

    Parameters
    ----------
    n_features : int          F, features per layer (= concepts)
    n_tokens : int            corpus size: the "sample count" the recovery claim is about
    d : int                   reference-space dimension (also the residual dimension)
    margin : float            typical distance between concept centres (noise norm = 1)
    spurious : float          per-token probability of one spurious firing per layer
    keep : float              probability that layer B's feature fires on its concept's tokens
    drift : float             decoder drift between the layers
    k : int                   top-k support size for the OT distributions
    seed : int
    disjoint : bool
        Layer B sees its own ``n_tokens`` fresh tokens (same concepts, new draws), so no token is
        seen by both layers; ``B.Z`` embeds B's tokens.  Activation correlation is then undefined.
    outlier_dims, outlier_scale : int, float
        Meaning-free high-variance coordinates (first ``outlier_dims`` of the d) and their std.
    norm_sigma : float
        Log-normal per-token norm factor (applied to the embedding and to both layers' activations).

    Returns
    -------
    PlantedPair
    """
    if n_features < 2 or n_tokens < 1 or d < 1:
        raise ValueError("need n_features >= 2, n_tokens >= 1, d >= 1")
    rng = np.random.default_rng(seed)
    F = n_features
    mu = rng.standard_normal((F, d)) * (margin / np.sqrt(2 * d))  # pairwise dist ~ margin
    concept = rng.integers(0, F, n_tokens)  # (n,)
    if not 0 <= outlier_dims <= d:
        raise ValueError(f"outlier_dims must be in 0..d={d}, got {outlier_dims}")

    def embed(conc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        Z = mu[conc] + rng.standard_normal((len(conc), d)) / np.sqrt(d)  # (n, d)
        Z[:, :outlier_dims] += outlier_scale * rng.standard_normal((len(conc), outlier_dims))
        s = np.exp(norm_sigma * rng.standard_normal(len(conc))) if norm_sigma > 0 else np.ones(len(conc))
        return Z * s[:, None], s

    Z, scale_a = embed(concept)
    perm = rng.permutation(F)

    def layer_acts(target_of_concept: np.ndarray, p_keep: float, tok_scale: np.ndarray) -> np.ndarray:
        acts = np.zeros((n_tokens, F))
        gain = rng.uniform(0.5, 2.0, F)  # per-feature scale (OT must not care)
        fire = rng.random(n_tokens) < p_keep
        f = target_of_concept[concept]
        acts[np.flatnonzero(fire), f[fire]] = gain[f[fire]] * rng.uniform(0.5, 1.5, fire.sum())
        spur = np.flatnonzero(rng.random(n_tokens) < spurious)
        sf = rng.integers(0, F, len(spur))
        val = gain[sf] * rng.uniform(0.0, 1.5, len(spur))
        acts[spur, sf] = np.maximum(acts[spur, sf], val)
        return acts * tok_scale[:, None]

    acts_a = layer_acts(np.arange(F), 1.0, scale_a)
    concept_a, Z_b, scale_b = concept, Z, scale_a
    if disjoint:  # fresh tokens for layer B: same concept centres, new concepts and noise draws
        concept = rng.integers(0, F, n_tokens)
        Z_b, scale_b = embed(concept)
    acts_b = layer_acts(perm, keep, scale_b)
    W_a = rng.standard_normal((F, d))
    W_a /= np.linalg.norm(W_a, axis=1, keepdims=True)
    W_b = np.empty_like(W_a)
    W_b[perm] = W_a + drift * rng.standard_normal((F, d)) / np.sqrt(d)
    W_b /= np.linalg.norm(W_b, axis=1, keepdims=True)
    A = LayerFeatures(W_dec=W_a, acts=acts_a, Z=Z, W_enc=W_a.T.copy(), k=k)
    B = LayerFeatures(W_dec=W_b, acts=acts_b, Z=Z_b, W_enc=W_b.T.copy(), k=k)
    return PlantedPair(A=A, B=B, perm=perm, concept=concept_a)
