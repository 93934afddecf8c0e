"""The shared reference space that makes features of different layers comparable.

Every feature's support is a set of token positions in one corpus; to compare features of layers
a and b we need an embedding ``Z`` of each token position in a common space.  Modes (design
decision; the paper's abstract does not say which it uses):

- ``reference`` (default): both layers use the same tokens' hidden states at one reference layer
  (by default the later layer of the pair, i.e. the target).  Features that fire on the same or
  similar tokens are close, whichever layer they live in.
- ``linear``: source-layer hidden states mapped into the target layer by a least-squares affine map
  fitted on all corpus tokens; target features use the target layer's own states.
- ``pca``: the reference mode followed by PCA to ``n_components`` dimensions (faster OT; keeps the
  bulk of the variance).

Before that, hidden states are transformed by a ``geometry`` (:mod:`saeot.geometry`; default
:data:`saeot.geometry.DEFAULT_GEOMETRY` = ``standardise+unit``: every dimension standardised,
then every token scaled to unit norm), fitted on the target layer's states.

What ``reference`` mode measures: both features' distributions sit on the *same* embedding of the
tokens they fire on, so two features that fire on the same tokens are at W2 = 0 whatever their
layers; on shared tokens W2 therefore carries co-firing (token identity) as well as geometry.
Only in the disjoint-token setting (``saeot evaluate --settings disjoint``: the two layers'
features are fitted on different chunks) is the geometry of the hidden states the sole signal.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from saeot.geometry import DEFAULT_GEOMETRY, Geometry

Mode = Literal["reference", "linear", "pca"]
MODES = ("reference", "linear", "pca")


def reference_embeddings(H_a: np.ndarray | None, H_b: np.ndarray, mode: Mode = "reference", *,
                         H_ref: np.ndarray | None = None, n_components: int = 64, geometry: str = DEFAULT_GEOMETRY,
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Token embeddings ``(Z_a, Z_b)`` for the features of layers a and b.

    Parameters
    ----------
    H_a : (n_tokens, d_a) array or None
        Source-layer hidden states (needed by ``linear`` only).
    H_b : (n_tokens, d_b) array
        Target-layer hidden states, same tokens.
    mode : {"reference", "linear", "pca"}
    H_ref : (n_tokens, d) array, optional
        Reference-layer states for ``reference``/``pca``; default ``H_b``.
    n_components : int
        ``pca`` only.
    geometry : str
        :data:`saeot.geometry.GEOMETRIES`; fitted on the target (``linear``) or reference states.

    Returns
    -------
    Z_a : (n_tokens, d') float64
    Z_b : (n_tokens, d') float64
    """
    if mode not in MODES:
        raise ValueError(f"unknown reference-space mode {mode!r}; expected one of {MODES}")
    H_b = np.asarray(H_b, dtype=np.float64)
    if mode == "linear":
        if H_a is None:
            raise ValueError("mode 'linear' needs the source hidden states H_a")
        H_a = np.asarray(H_a, dtype=np.float64)
        if H_a.shape[0] != H_b.shape[0]:
            raise ValueError(f"H_a has {H_a.shape[0]} tokens, H_b has {H_b.shape[0]}")
        X = np.concatenate([H_a, np.ones((len(H_a), 1))], 1)  # (n, d_a + 1)
        W, *_ = np.linalg.lstsq(X, H_b, rcond=None)  # (d_a + 1, d_b)
        g = Geometry.fit(H_b, geometry)
        return g(X @ W, np.float64), g(H_b, np.float64)
    R = H_b if H_ref is None else np.asarray(H_ref, dtype=np.float64)
    if R.shape[0] != H_b.shape[0]:
        raise ValueError(f"H_ref has {R.shape[0]} tokens, H_b has {H_b.shape[0]}")
    Z = Geometry.fit(R, geometry)(R, np.float64)
    if mode == "pca":
        n_components = min(n_components, Z.shape[1], Z.shape[0])
        # (d, d) covariance eigenvectors: cheap for d <= a few thousand
        C = Z.T @ Z / len(Z)
        evals, evecs = np.linalg.eigh(C)
        V = evecs[:, ::-1][:, :n_components]  # (d, n_components), by decreasing variance
        Z = Z @ V
    return Z, Z
