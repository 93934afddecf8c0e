"""Paired statistics, hubness correction, reference-space geometry, realistic planted benchmarks,
resumable SAE training and the held-out split (issue 20)."""

import numpy as np
import pytest

from saeot.evaluate import bootstrap_ci, chunk_split
from saeot.geometry import GEOMETRIES, Geometry
from saeot.matching import csls, in_degree_stats, match
from saeot.stats import paired_bootstrap


def test_paired_bootstrap_on_known_differences():
    rng = np.random.default_rng(0)
    item = rng.normal(0, 1.0, 128)  # items differ a lot in difficulty
    y = item + rng.normal(0, 0.05, 128)
    up = paired_bootstrap(y + 0.05 + rng.normal(0, 0.05, 128), y)
    assert up["verdict"] == "win" and up["lo"] < 0.05 < up["hi"] and up["n"] == 128
    assert paired_bootstrap(y - 0.05 + rng.normal(0, 0.05, 128), y)["verdict"] == "loss"
    same = paired_bootstrap(y + rng.normal(0, 0.05, 128), y)
    assert same["verdict"] == "tie" and same["lo"] < 0 < same["hi"]
    # a small shift that separate intervals cannot see (they overlap), the paired interval can
    x = item + 0.1 + rng.normal(0, 0.05, 128)
    a, b = bootstrap_ci(x), bootstrap_ci(y)
    assert a["lo"] < b["hi"]
    assert paired_bootstrap(x, y)["verdict"] == "win"
    # NaN (an unmatched source) drops that item from both sides
    xn = x.copy()
    xn[:10] = np.nan
    assert paired_bootstrap(xn, y)["n"] == 118
    with pytest.raises(ValueError):
        paired_bootstrap(x, y[:5])


def test_csls_removes_a_constructed_hub():
    """Targets = noisy copies of the sources plus one target at the data's centre: plain nearest
    neighbours pile onto the central hub; CSLS penalises it and recovers the true partners."""
    rng = np.random.default_rng(1)
    S = rng.standard_normal((200, 16))
    T = np.vstack([S + rng.normal(0, 0.8, S.shape), S.mean(0, keepdims=True)])  # target 200 = hub
    D = ((S[:, None] - T[None]) ** 2).sum(-1)
    nn, cs = match(D, "nn"), match(csls(D, 10), "nn")
    hub_nn = in_degree_stats(nn.tgt, len(T))
    hub_cs = in_degree_stats(cs.tgt, len(T))
    assert (nn.tgt == 200).sum() >= 20 and hub_nn["max_in_degree"] >= 20
    assert (cs.tgt == 200).sum() <= 2 and hub_cs["max_in_degree"] < hub_nn["max_in_degree"] / 4
    truth = np.arange(200)
    assert (cs.tgt == truth).mean() > (nn.tgt == truth).mean() + 0.1
    Dinf = D.copy()
    Dinf[:, 50:] = np.inf  # not-evaluated entries stay inf and do not poison the means
    C = csls(Dinf, 10)
    assert np.isinf(C[:, 50:]).all() and np.isfinite(C[:, :50]).all()


def _pairwise(Z):
    return np.sqrt(((Z[:, None] - Z[None]) ** 2).sum(-1))


def test_geometry_invariances():
    rng = np.random.default_rng(2)
    H = rng.standard_normal((400, 8)) + rng.standard_normal(8)
    H[:, 0] *= 50  # an outlier dimension
    Hq = H[:60]
    scale, shift = rng.uniform(0.1, 10, 8), rng.standard_normal(8)
    scale[0] = 1 / 50  # undoes the outlier: the scalar control must change
    per_dim = H * scale + shift
    for g in ("standardise", "standardise+unit"):  # per-dimension affine maps
        np.testing.assert_allclose(Geometry.fit(per_dim, g)(per_dim[:60]), Geometry.fit(H, g)(Hq), atol=1e-5)
    M = rng.standard_normal((8, 8)) + 3 * np.eye(8)  # any invertible affine map
    lin = H @ M + shift
    for g in ("whiten", "whiten+unit"):
        np.testing.assert_allclose(_pairwise(Geometry.fit(lin, g)(lin[:60], np.float64)),
                                   _pairwise(Geometry.fit(H, g)(Hq, np.float64)), rtol=1e-4, atol=1e-6)
    tok = np.exp(rng.normal(0, 1, (400, 1)))  # per-token positive rescaling
    np.testing.assert_allclose(Geometry.fit(H * tok, "unit")(Hq * tok[:60]), Geometry.fit(H, "unit")(Hq), atol=1e-5)
    # controls: the old scalar geometry is invariant to none of these, so the tests can fail
    s0 = _pairwise(Geometry.fit(H, "scalar")(Hq, np.float64))
    s1 = _pairwise(Geometry.fit(per_dim, "scalar")(per_dim[:60], np.float64))
    s0, s1 = s0 / s0.mean(), s1 / s1.mean()
    assert np.abs(s0 - s1).max() > 0.1
    for g in GEOMETRIES:  # common units: mean squared norm ~1 on the fit tokens
        Z = Geometry.fit(H, g)(H, np.float64)
        assert 0.5 < (Z ** 2).sum(1).mean() < 1.5, g
    with pytest.raises(ValueError):
        Geometry.fit(H, "zca")


def test_planted_recovery_under_realistic_geometry():
    """Meaning-free outlier dimensions + log-normal token norms break OT in the old scalar geometry;
    the default geometry recovers the planted matches (shared tokens)."""
    from saeot.evaluate import OTConfig
    from saeot.methods import LayerFeatures, distance_matrix
    from saeot.synthetic import planted_pair

    pp = planted_pair(n_features=32, n_tokens=2000, k=32, margin=0.5, drift=1.5, seed=3, outlier_dims=4,
                      outlier_scale=10.0, norm_sigma=0.5)
    acc = {}
    for g in ("scalar", OTConfig().geometry):
        Z = Geometry.fit(pp.B.Z, g)(pp.B.Z)
        A = LayerFeatures(W_dec=pp.A.W_dec, acts=pp.A.acts, Z=Z, k=32)
        B = LayerFeatures(W_dec=pp.B.W_dec, acts=pp.B.acts, Z=Z, k=32)
        acc[g] = match(distance_matrix("ot", A, B, solver="sliced", candidates=None).D, "nn").accuracy(pp.perm)
    assert acc[OTConfig().geometry] >= 0.9 and acc["scalar"] <= acc[OTConfig().geometry] - 0.2, acc
    # the generator's geometry options are real: outlier coordinates dominate the variance
    assert pp.A.Z[:, :4].var(0).mean() > 20 * pp.A.Z[:, 4:].var(0).mean()


def test_chunk_split_balances_sources_and_keeps_held_out_apart():
    c = np.arange(64)  # even chunks = one corpus source, odd = the other
    s = chunk_split(c)
    for name in ("fit", "fit_a", "fit_b", "val", "test"):
        assert (c[s[name]] % 2 == 0).sum() == (c[s[name]] % 2 == 1).sum() > 0, name
    assert not (s["fit"] & s["held"]).any() and not (s["val"] & s["test"]).any()
    assert ((s["val"] | s["test"]) == s["held"]).all() and ((s["fit_a"] | s["fit_b"]) == s["fit"]).all()


def test_sae_training_resumes_to_the_same_weights(tmp_path):
    from saeot.sae import train_topk_sae

    X = np.random.default_rng(4).standard_normal((600, 16)).astype(np.float32)
    kw = dict(d_sae=32, k=4, steps=30, batch_size=64, seed=7, progress=False)
    full = train_topk_sae(X, **kw)
    ck = tmp_path / "ck.pt"
    assert train_topk_sae(X, **kw, checkpoint=ck, checkpoint_every=5, stop_after=12) is None
    resumed = train_topk_sae(X, **kw, checkpoint=ck, checkpoint_every=5)
    np.testing.assert_array_equal(full.W_dec, resumed.W_dec)
    np.testing.assert_array_equal(full.W_enc, resumed.W_enc)
    other = train_topk_sae(X, **{**kw, "seed": 8})
    assert not np.allclose(other.W_dec, full.W_dec)
    with pytest.raises(ValueError, match="another run"):
        train_topk_sae(X, **{**kw, "steps": 40}, checkpoint=ck)


def test_all_firing_tokens_support_equals_padded_top_k():
    """k = all: the per-feature sliced embedding over every firing token equals the padded top-k
    one with k = the largest firing count, and the evaluate option validates it."""
    import scipy.sparse as sp

    from saeot.distributions import feature_distributions
    from saeot.evaluate import OTConfig
    from saeot.methods import LayerFeatures, distance_matrix
    from saeot.wasserstein import measures, random_directions, sliced_embedding, sliced_embedding_all_firing

    rng = np.random.default_rng(5)
    acts = sp.random(500, 40, density=0.05, random_state=1, format="csc")
    Z = rng.standard_normal((500, 8)).astype(np.float32)
    th = random_directions(8, 16, 0)
    kmax = int(np.diff(acts.indptr).max())
    np.testing.assert_allclose(sliced_embedding_all_firing(acts, Z, th, 8),
                               sliced_embedding(measures(feature_distributions(acts, kmax), Z), directions=th,
                                                n_quantiles=8), atol=1e-6)
    A = LayerFeatures(W_dec=np.eye(40, 8), acts=acts, Z=Z, k=0)
    D = distance_matrix("ot", A, A, solver="sliced").D
    fin = np.isfinite(np.diag(D))
    assert fin.sum() > 30 and np.diag(D)[fin].max() < 0.02 * np.median(D[np.isfinite(D)])  # float32 cancellation
    with pytest.raises(ValueError):
        distance_matrix("ot", A, A, solver="exact")
    assert OTConfig(k=0).check() and OTConfig(k=0, solver="sliced").check() is None
    assert OTConfig(k=0, solver="sliced").name.startswith("ot[") and "kall" in OTConfig(k=0, solver="sliced").name
