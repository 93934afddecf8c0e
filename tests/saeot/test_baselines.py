"""Issue 44's baselines and statistics: xact reads OT's own inputs (act-corr on shared tokens),
the disjoint setting uses no target-layer state of a source token, SAE-Match as published differs
from decoder cosine exactly when thresholds differ per feature, a trained JumpReLU SAE has such
thresholds, and Holm / sign-flip statistics."""

import numpy as np
import pytest

from saeot.evaluate import chunk_split, fitted_features
from saeot.matching import match
from saeot.methods import LayerFeatures, distance_matrix
from saeot.sae import SAE, train_jumprelu_sae
from saeot.stats import family_verdicts, holm, sign_flip_p


def _topk(seed, d=12, f=40, k=4):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((f, d)).astype(np.float32)
    W /= np.linalg.norm(W, axis=1, keepdims=True)
    return SAE(W.T.copy(), np.zeros(f, np.float32), W, np.zeros(d, np.float32), "topk", k)


def _layers(n=2048, d=12, seed=0):
    rng = np.random.default_rng(seed)
    Ha = rng.standard_normal((n, d)).astype(np.float32)
    Hb = (Ha @ rng.standard_normal((d, d)) * 0.5 + rng.standard_normal((n, d)) * 0.3).astype(np.float32)
    masks = chunk_split(np.arange(n) // 16)
    return Ha, Hb, masks


def test_xact_is_act_corr_on_shared_tokens():
    Ha, Hb, masks = _layers()
    A, B = fitted_features(_topk(0), _topk(1), Ha, Hb, masks, "shared", k=8)
    np.testing.assert_array_equal(distance_matrix("xact", A, B).D, distance_matrix("act-corr", A, B).D)


def test_disjoint_setting_uses_no_target_state_of_a_source_token():
    """Replacing the target layer's states at the source's tokens (fit_a) changes nothing OT or
    xact sees in the disjoint setting: it is geometry only (issue 44: it used g(Hb[fit_a]))."""
    Ha, Hb, masks = _layers()
    sa, sb = _topk(0), _topk(1)
    A, B = fitted_features(sa, sb, Ha, Hb, masks, "disjoint", k=8)
    Hb2 = Hb.copy()
    Hb2[masks["fit_a"]] = np.random.default_rng(9).standard_normal((int(masks["fit_a"].sum()), Hb.shape[1]))
    A2, B2 = fitted_features(sa, sb, Ha, Hb2, masks, "disjoint", k=8)
    np.testing.assert_array_equal(A.Z, A2.Z)
    np.testing.assert_array_equal(B.Z, B2.Z)
    np.testing.assert_array_equal(distance_matrix("xact", A, B).D, distance_matrix("xact", A2, B2).D)
    np.testing.assert_array_equal(distance_matrix("ot", A, B, candidates=None).D,
                                  distance_matrix("ot", A2, B2, candidates=None).D)
    assert A.target_acts.shape == (int(masks["fit_a"].sum()), sb.d_sae)


def _feats(W_dec, threshold):
    return LayerFeatures(W_dec=W_dec, acts=np.zeros((4, len(W_dec))), Z=np.zeros((4, 2)), threshold=threshold)


def test_sae_match_is_decoder_cosine_with_one_threshold_and_differs_with_per_feature_ones():
    rng = np.random.default_rng(0)
    Wa, Wb = (rng.standard_normal((60, 16)) for _ in range(2))
    Wa /= np.linalg.norm(Wa, axis=1, keepdims=True)
    Wb /= np.linalg.norm(Wb, axis=1, keepdims=True)
    one = lambda: np.full(60, 0.7)  # noqa: E731
    cos = match(distance_matrix("decoder-cosine", _feats(Wa, one()), _feats(Wb, one())).D, "hungarian")
    same = match(distance_matrix("sae-match-folded", _feats(Wa, one()), _feats(Wb, one())).D, "hungarian")
    assert (cos.tgt == same.tgt).all()  # one threshold per layer + unit decoders: the same ranking (issue 44)
    th_a, th_b = rng.uniform(0.2, 2.0, 60), rng.uniform(0.2, 2.0, 60)
    diff = match(distance_matrix("sae-match-folded", _feats(Wa, th_a), _feats(Wb, th_b)).D, "hungarian")
    assert (diff.tgt != cos.tgt).mean() > 0.2
    # the published cost is the folded decoder's MSE: a rescaled, permuted copy is at distance 0
    perm = rng.permutation(60)
    D = distance_matrix("sae-match-folded", _feats(Wa * 3.0, th_a), _feats(Wa[perm] * 1.5, th_a[perm] * 2.0)).D
    assert np.allclose(D[perm, np.arange(60)], 0.0, atol=1e-9) and (match(D, "hungarian").tgt == np.argsort(perm)).all()


def test_jumprelu_training_reaches_its_l0_with_per_feature_thresholds():
    # small shapes (32 features, d = 12, 200 steps: about 1 s of training; it was 64 x 16 x 500 steps, 296 s
    # wall on the loaded machine): the controller still has to bring L0 to its target and spread the thresholds
    rng = np.random.default_rng(0)
    basis = rng.standard_normal((32, 12)).astype(np.float32)
    codes = (rng.random((1500, 32)) < 0.15) * rng.exponential(1.0, (1500, 32))
    X = (codes @ basis + 0.05 * rng.standard_normal((1500, 12))).astype(np.float32)
    sae = train_jumprelu_sae(X, 32, target_l0=5, steps=200, batch_size=128, lr=3e-3, seed=0, progress=False)
    l0 = sae.encode(X).getnnz(axis=1).mean()
    assert sae.architecture == "jumprelu" and 2 < l0 < 9
    assert sae.threshold.std() > 0.05 * sae.threshold.mean() > 0


def test_holm_and_sign_flip_families():
    assert holm([0.01, 0.04, 0.03]).round(3).tolist() == [0.03, 0.06, 0.06]
    assert sign_flip_p(np.ones(12)) < 1e-3 and sign_flip_p([1.0, -1.0] * 6) == 1.0
    rng = np.random.default_rng(0)
    fam = family_verdicts({"strong": rng.normal(0.5, 1, 200), "none": rng.normal(0, 1, 200),
                           "weak": np.r_[rng.normal(0.13, 1, 200)]})
    assert fam["strong"]["verdict"] == "win" and fam["none"]["verdict"] == "tie"
    assert fam["strong"]["p_holm"] >= fam["strong"]["p"]
    # a cell that passes alone can fail in its family: Holm multiplies the smallest p by the family size
    assert all(fam[n]["p_holm"] >= fam[n]["p"] for n in fam)


@pytest.mark.parametrize("mask", [False, True])
def test_masked_judge_hides_the_activating_token(mask):
    from saeot.evaluate import ContextJudge

    tokens = np.arange(40)
    judge = ContextJudge(tokens, np.zeros(40, int), lambda ids: " ".join(f"t{i}" for i in ids), np.ones(40, bool),
                         model=object(), mask_token=mask)
    text = judge._text(20)
    assert ("t20" in text) != mask and "t19" in text and ("[MASK]" in text) == mask
