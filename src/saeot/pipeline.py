"""Glue from on-disk artefacts (activation cache + SAEs) to matched features and their scores."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from saeot.collect import load_activations
from saeot.errors import ActivationFileError
from saeot.geometry import DEFAULT_GEOMETRY
from saeot.matching import HUBNESS, Matching, csls, match
from saeot.methods import CORE_METHODS, ONE_TO_ONE, LayerFeatures, distance_matrix
from saeot.sae import SAE, load_sae
from saeot.space import reference_embeddings


def layer_pair(acts_dir: Path, sae_a: SAE, sae_b: SAE, layer_a: int, layer_b: int, *, space: str = "reference",
               ref_layer: int | None = None, k: int = 32, n_components: int = 64, geometry: str = DEFAULT_GEOMETRY,
               ) -> tuple[LayerFeatures, LayerFeatures]:
    """Load hidden states, encode them with each layer's SAE, embed tokens in the reference space.

    ``ref_layer`` defaults to ``layer_b`` (the target).  Returns (A, B) ready for
    :func:`saeot.methods.distance_matrix`.
    """
    Ha = load_activations(acts_dir, layer_a)
    Hb = load_activations(acts_dir, layer_b)
    Href = Hb if ref_layer is None or ref_layer == layer_b else load_activations(acts_dir, ref_layer)
    return features_from_arrays(Ha, Hb, sae_a, sae_b, space=space, H_ref=Href, k=k, n_components=n_components,
                                geometry=geometry)


def features_from_arrays(Ha: np.ndarray, Hb: np.ndarray, sae_a: SAE, sae_b: SAE, *, space: str = "reference",
                         H_ref: np.ndarray | None = None, k: int = 32, n_components: int = 64,
                         geometry: str = DEFAULT_GEOMETRY) -> tuple[LayerFeatures, LayerFeatures]:
    """:func:`layer_pair` on hidden states given as arrays: ``Ha`` (n, d_a) and ``Hb`` (n, d_b),
    row t of both = the same token (a user's own activations, e.g. from ``saeot match --acts-a``)."""
    if len(Ha) != len(Hb):
        raise ActivationFileError(f"source activations have {len(Ha)} rows, target {len(Hb)}: the rows must be "
                                  "the same tokens")
    for name, H, sae in (("source", Ha, sae_a), ("target", Hb, sae_b)):
        if H.shape[1] != sae.d_in:
            raise ActivationFileError(f"{name} activations have d = {H.shape[1]}, its SAE expects {sae.d_in}")
    Href = Hb if H_ref is None else H_ref
    Za, Zb = reference_embeddings(Ha, Hb, space, H_ref=Href, n_components=n_components, geometry=geometry)
    # float32 once, so that both layers' measures index the very same array when the space is shared
    Za32 = np.ascontiguousarray(Za, dtype=np.float32)
    Za, Zb = Za32, (Za32 if Zb is Za else np.ascontiguousarray(Zb, dtype=np.float32))
    A = LayerFeatures(W_dec=sae_a.W_dec, acts=sae_a.encode(Ha), Z=Za, W_enc=sae_a.W_enc, k=k, b_enc=sae_a.b_enc,
                      threshold=sae_a.threshold)
    B = LayerFeatures(W_dec=sae_b.W_dec, acts=sae_b.encode(Hb), Z=Zb, W_enc=sae_b.W_enc, k=k, b_enc=sae_b.b_enc,
                      threshold=sae_b.threshold)
    return A, B


def top_token_overlap(A: LayerFeatures, B: LayerFeatures, tokens: np.ndarray, m: Matching, top: int = 10) -> np.ndarray:
    """Offline proxy for "do the two features mean the same thing": Jaccard overlap of the token
    ids at each feature's ``top`` most activating positions.  (M,) values in [0, 1]."""
    ia, ib = A.dists.index[:, :top], B.dists.index[:, :top]
    out = np.zeros(len(m.src))
    for r, (i, j) in enumerate(zip(m.src, m.tgt)):
        sa = {int(tokens[p]) for p in ia[i] if p >= 0}
        sb = {int(tokens[p]) for p in ib[j] if p >= 0}
        out[r] = len(sa & sb) / max(1, len(sa | sb))
    return out


@dataclass
class MethodResult:
    method: str
    matching: Matching
    seconds: float
    evaluated: int
    proxy: float  # mean top-token Jaccard over matched pairs
    D: np.ndarray | None = None  # (Fa, Fb) float32 distances (inf = not evaluated)


def compare_methods(A: LayerFeatures, B: LayerFeatures, tokens: np.ndarray, *, methods=CORE_METHODS,
                    strategy: str = "nn", solver: str = "exact", candidates: int | None = 32,
                    only_alive: bool = True, progress: bool = False, hubness: str = "none", csls_k: int = 10,
                    **solver_kw) -> dict[str, MethodResult]:
    """Every method on the same layer pair: matching, wall time and the top-token proxy.
    ``hubness="csls"`` matches on CSLS-corrected distances (:func:`saeot.matching.csls`), for every method."""
    if hubness not in HUBNESS:
        raise ValueError(f"unknown hubness correction {hubness!r}; expected one of {HUBNESS}")
    out = {}
    alive_a = A.dists.alive
    for name in methods:
        t0 = time.perf_counter()
        r = distance_matrix(name, A, B, solver=solver, candidates=candidates, progress=progress, **solver_kw)
        D = r.D.copy()
        if only_alive:
            D[~alive_a] = np.inf
            D[:, ~B.dists.alive] = np.inf
        if hubness == "csls":
            D = csls(D, csls_k)
        mt = match(D, "hungarian" if name in ONE_TO_ONE else strategy)
        if only_alive:
            keep = alive_a[mt.src]
            mt = Matching(mt.src[keep], mt.tgt[keep], mt.dist[keep])
        secs = time.perf_counter() - t0
        proxy = float(top_token_overlap(A, B, tokens, mt).mean()) if len(mt.src) and tokens is not None \
            else float("nan")
        out[name] = MethodResult(name, mt, secs, r.evaluated, proxy, r.D.astype(np.float32))
    return out
