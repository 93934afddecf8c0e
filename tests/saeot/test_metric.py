"""The metric's building blocks: distributions, W2 solvers, pre-filtering, reference spaces."""

import numpy as np
import pytest
import scipy.sparse as sp

from saeot.distributions import TopKAccumulator, feature_distributions
from saeot.space import reference_embeddings
from saeot.wasserstein import (Measures, lower_bound, measures, nearest_w2, pairwise_w2, w2_exact, w2_pairs)


def _random_acts(rng, n=300, F=12, density=0.2):
    a = rng.exponential(1.0, (n, F)) * (rng.random((n, F)) < density)
    a[:, -1] = 0.0  # one dead feature
    return a


def test_distribution_weights_sum_to_one_and_dead_feature_is_empty():
    rng = np.random.default_rng(0)
    d = feature_distributions(_random_acts(rng), k=8)
    assert d.index.shape == (12, 8)
    np.testing.assert_allclose(d.weight[:-1].sum(1), 1.0, rtol=0, atol=1e-15)
    assert not d.alive[-1] and d.alive[:-1].all()
    assert (d.index[-1] == -1).all() and (d.weight[-1] == 0).all()
    # sorted by decreasing activation
    assert (np.diff(d.value, axis=1) <= 0).all()


def test_sparse_dense_and_streaming_agree():
    rng = np.random.default_rng(1)
    a = _random_acts(rng)
    dd = feature_distributions(a, k=10)
    ds = feature_distributions(sp.csr_matrix(a), k=10)
    acc = TopKAccumulator(a.shape[1], 10)
    for s in range(0, len(a), 37):
        acc.update(a[s:s + 37], offset=s)
    dst = acc.result()
    for other in (ds, dst):
        np.testing.assert_array_equal(dd.index, other.index)
        np.testing.assert_array_equal(dd.weight, other.weight)


def test_bad_inputs_raise_valueerror_naming_the_problem():
    with pytest.raises(ValueError, match="k must be"):
        feature_distributions(np.ones((3, 2)), k=0)
    with pytest.raises(ValueError, match="2-D"):
        feature_distributions(np.ones(3), k=1)
    m = Measures(np.zeros((1, 2, 3)), np.array([[0.5, 0.5]]))
    with pytest.raises(ValueError, match="unknown solver"):
        w2_pairs(m, m, np.array([[0, 0]]), "emd")
    with pytest.raises(ValueError, match="embedding dims"):
        w2_pairs(m, Measures(np.zeros((1, 2, 4)), m.w), np.array([[0, 0]]))
    with pytest.raises(ValueError, match="mode"):
        reference_embeddings(None, np.zeros((4, 2)), "umap")


def test_exact_w2_known_values():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((7, 5))
    a = rng.random(7)
    a /= a.sum()
    v = rng.standard_normal(5)
    # a translation moves W2 by exactly |v|; identical measures are at 0
    assert w2_exact(x, a, x + v, a) == pytest.approx(np.linalg.norm(v), rel=1e-9)
    assert w2_exact(x, a, x, a) == pytest.approx(0.0, abs=1e-7)
    # two Diracs
    assert w2_exact(x[:1], np.ones(1), x[1:2], np.ones(1)) == pytest.approx(np.linalg.norm(x[0] - x[1]))


def test_solvers_agree_and_centroid_is_a_lower_bound():
    rng = np.random.default_rng(3)
    Z = rng.standard_normal((400, 6))
    da = feature_distributions(_random_acts(rng, n=400, F=10), k=12)
    db = feature_distributions(_random_acts(rng, n=400, F=9), k=12)
    ma, mb = measures(da, Z), measures(db, Z)
    ex = pairwise_w2(ma, mb, "exact", candidates=None).D
    sk = pairwise_w2(ma, mb, "sinkhorn", candidates=None, reg=0.02).D
    sl = pairwise_w2(ma, mb, "sliced", n_proj=256, n_quantiles=64).D
    fin = np.isfinite(ex)
    assert fin.sum() == 9 * 8  # dead feature rows/cols are inf
    # the entropic plan's cost is close to the optimum at small reg
    np.testing.assert_allclose(sk[fin], ex[fin], rtol=0.02)
    # sliced W2 <= W2 (projection is 1-Lipschitz), up to the quantile-grid error
    assert (sl[fin] <= ex[fin] * 1.03 + 1e-9).all()
    assert np.corrcoef(sl[fin], ex[fin])[0, 1] > 0.8
    lb = lower_bound(ma, mb)
    assert (lb[fin] <= ex[fin] + 1e-9).all()
    assert (lb[fin] > 0.3 * ex[fin]).mean() > 0.5  # and not vacuous


def test_prefiltering_keeps_the_nearest_neighbours():
    from saeot.synthetic import planted_pair

    pp = planted_pair(n_features=80, n_tokens=6000, k=16, margin=0.5, seed=4)
    ma, mb = measures(pp.A.dists, pp.A.Z), measures(pp.B.dists, pp.B.Z)
    full = pairwise_w2(ma, mb, "exact", candidates=None)
    nn_full = np.argmin(full.D, 1)
    for pf in ("sliced", "centroid"):
        r = pairwise_w2(ma, mb, "exact", candidates=8, prefilter=pf)
        assert r.evaluated < full.evaluated / 4
        fin = np.isfinite(r.D)
        np.testing.assert_allclose(r.D[fin], full.D[fin])  # evaluated entries are exact
        assert (np.argmin(r.D, 1) == nn_full).mean() >= 0.9
    # the centroid lower bound makes an exact nearest-neighbour search with pruning
    nn, dist, evaluated = nearest_w2(ma, mb)
    np.testing.assert_array_equal(nn, nn_full)
    np.testing.assert_allclose(dist, full.D.min(1))
    assert evaluated <= full.evaluated


def test_reference_space_modes():
    rng = np.random.default_rng(5)
    Ha = rng.standard_normal((500, 6))
    Hb = Ha @ rng.standard_normal((6, 8)) + 3.0
    Za, Zb = reference_embeddings(Ha, Hb, "linear")
    np.testing.assert_allclose(Za, Zb, atol=1e-8)  # an exact affine relation is recovered
    Z1, Z2 = reference_embeddings(None, Hb, "reference")
    assert Z1 is Z2 and np.sqrt((Z1 ** 2).sum(1).mean()) == pytest.approx(1.0)
    Zp, _ = reference_embeddings(None, Hb, "pca", n_components=3)
    assert Zp.shape == (500, 3)
