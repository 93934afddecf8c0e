"""SAE-Match as published: thresholds folded into the parameters (an exact reparametrisation),
MSE of the folded parameters, one-to-one (Hungarian) matching; and the margin sweep."""

import numpy as np
import torch

from saeot.matching import match
from saeot.methods import LayerFeatures, distance_matrix, folded_parameters
from saeot.sae import SAE


def _jumprelu(seed=0, d=16, f=40):
    rng = np.random.default_rng(seed)
    return SAE(rng.standard_normal((d, f)).astype(np.float32), rng.standard_normal(f).astype(np.float32),
               rng.standard_normal((f, d)).astype(np.float32), np.zeros(d, np.float32), "jumprelu", None,
               np.abs(rng.standard_normal(f)).astype(np.float32) + 0.2, apply_b_dec_to_input=False)


def _feats(s: SAE) -> LayerFeatures:
    return LayerFeatures(W_dec=s.W_dec, acts=np.zeros((4, s.d_sae)), Z=np.zeros((4, 2)), W_enc=s.W_enc,
                         b_enc=s.b_enc, threshold=s.threshold)


def test_folding_is_an_exact_reparametrisation():
    """Folded SAE (encoder and bias / theta, decoder * theta, threshold 1) reconstructs exactly as the original."""
    s = _jumprelu()
    fp = folded_parameters(_feats(s))  # (F, 2d + 1)
    d = s.d_in
    folded = SAE(fp[:, :d].T.astype(np.float32).copy(), fp[:, d].astype(np.float32), fp[:, d + 1:].astype(np.float32),
                 s.b_dec, "jumprelu", None, np.ones(s.d_sae, np.float32), apply_b_dec_to_input=False)
    x = np.random.default_rng(1).standard_normal((300, d)).astype(np.float32) * 2
    a, af = s.encode(x), folded.encode(x)
    assert ((a.toarray() > 0) == (af.toarray() > 0)).all() and (a.toarray() > 0).mean() > 0.05
    np.testing.assert_allclose(s.decode(a), folded.decode(af), rtol=1e-4, atol=1e-4)


def test_rescaled_permuted_copy_is_recovered_one_to_one():
    """B = A with features permuted and each rescaled by c (threshold * c, encoder * c, decoder / c):
    the folded parameters of B's perm[i] equal A's i, so the folded MSE is 0 on the truth (and
    only there) and Hungarian recovers every feature; unfolded parameters are far apart on the truth."""
    a = _jumprelu(2)
    rng = np.random.default_rng(3)
    perm = rng.permutation(a.d_sae)
    c = rng.uniform(0.2, 5.0, a.d_sae)
    inv = np.argsort(perm)  # B's feature j is A's feature inv[j]
    b = SAE((a.W_enc[:, inv] * c[inv]).astype(np.float32), (a.b_enc[inv] * c[inv]).astype(np.float32),
            (a.W_dec[inv] / c[inv, None]).astype(np.float32), a.b_dec, "jumprelu", None,
            (a.threshold[inv] * c[inv]).astype(np.float32), apply_b_dec_to_input=False)
    D = distance_matrix("sae-match-folded", _feats(a), _feats(b)).D
    assert np.allclose(D[np.arange(a.d_sae), perm], 0, atol=1e-8)
    m = match(D, "hungarian")
    assert m.accuracy(perm) == 1.0 and len(set(m.tgt.tolist())) == a.d_sae
    raw = np.concatenate([a.W_enc.T, a.b_enc[:, None], a.W_dec], 1), np.concatenate([b.W_enc.T, b.b_enc[:, None], b.W_dec], 1)
    Draw = ((raw[0][:, None, :] - raw[1][None]) ** 2).mean(-1)
    assert np.median(Draw[np.arange(a.d_sae), perm]) > 0.1  # without the fold the truth is not at distance 0
    off = D.copy()
    off[np.arange(a.d_sae), perm] = np.inf
    assert off.min() > 0.01


def test_topk_folds_one_global_threshold():
    """TopK: one theta per layer (mean smallest active activation), so folding only rescales the layer."""
    from saeot.methods import effective_threshold

    acts = np.array([[0.0, 2.0, 3.0], [1.0, 0.0, 5.0], [0.0, 0.0, 0.0]])
    assert effective_threshold(acts) == 1.5


def test_margin_sweep_smoke():
    """A wide margin lets OT recover the planted matches on disjoint tokens; a tiny one does not."""
    from saeot.bench import margin_sweep

    r = margin_sweep(margins=(0.05, 3.0), seeds=range(1), n_features=32, n_tokens=1500, k=16, progress=False,
                     methods=("ot-exact", "decoder-cosine", "sae-match-folded"))
    d = r["settings"]["disjoint"]
    assert d["3.0"]["ot-exact"]["nn"]["mean"] > 0.9 > d["0.05"]["ot-exact"]["nn"]["mean"]
    # decoder methods do not use the token geometry: the margin leaves them (nearly) unchanged
    assert abs(d["3.0"]["decoder-cosine"]["nn"]["mean"] - d["0.05"]["decoder-cosine"]["nn"]["mean"]) < 0.2
    assert set(r["settings"]["shared"]["3.0"]) == {"ot-exact", "decoder-cosine", "sae-match-folded"}
