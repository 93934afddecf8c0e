"""The metric's building blocks: distributions, W2 solvers, pre-filtering, reference spaces."""

import numpy as np
import pytest
import scipy.sparse as sp

from saeot.distributions import TopKAccumulator, feature_distributions
from saeot.space import reference_embeddings
from saeot.wasserstein import (Measures, lower_bound, max_sliced_lower_bound, measures, nearest_w2, pairwise_w2,
                               random_directions, sinkhorn_batch, sliced_embedding, w2_exact, w2_pairs)


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
    skr = pairwise_w2(ma, mb, "sinkhorn", candidates=None, reg=0.02)
    sk = skr.D
    # Sinkhorn reached its stated tolerance on every problem (and says so)
    assert skr.info["not_converged"] == 0 and skr.info["max_marginal_error"] <= skr.info["tol"] == 1e-4
    sl = pairwise_w2(ma, mb, "sliced", n_proj=256, n_quantiles=64).D
    fin = np.isfinite(ex)
    assert fin.sum() == 9 * 8  # dead feature rows/cols are inf
    # the entropic plan's cost is close to the optimum at small reg
    np.testing.assert_allclose(sk[fin], ex[fin], rtol=0.02)
    # the cell-averaged sliced W2 is a lower bound on W2 (Jensen + 1-Lipschitz projections)
    assert (sl[fin] <= ex[fin] * (1 + 1e-5)).all()
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


def test_sinkhorn_reports_non_convergence_and_debiased_divergence_vanishes_on_identical_measures():
    rng = np.random.default_rng(6)
    Z = rng.standard_normal((300, 5))
    d = feature_distributions(_random_acts(rng, n=300, F=8), k=10)
    m = measures(d, Z)
    pairs = np.array([[i, i] for i in range(7)] + [[i, (i + 1) % 7] for i in range(7)])
    info: dict = {}
    with pytest.warns(UserWarning, match="did not reach marginal error"):
        w2_pairs(m, m, pairs, "sinkhorn", reg=0.005, max_iter=5, info=info)
    assert info["not_converged"] > 0 and info["max_marginal_error"] > 1e-4
    ent = w2_pairs(m, m, pairs, "sinkhorn", reg=0.1)
    deb = w2_pairs(m, m, pairs, "sinkhorn-debiased", reg=0.1)
    ex = w2_pairs(m, m, pairs, "exact")
    same, other = slice(0, 7), slice(7, 14)
    assert (ent[same] > 0.05 * ex[other].mean()).all()  # the entropic cost is biased away from 0
    np.testing.assert_allclose(deb[same], 0.0, atol=1e-3 * ex[other].mean())  # the divergence is not
    assert (deb[other] > 0).all() and np.corrcoef(deb[other], ex[other])[0, 1] > 0.9
    # the self terms, solved once per feature, equal the divergence's three problems solved per pair
    info = {}
    deb = w2_pairs(m, m, pairs, "sinkhorn-debiased", reg=0.1, tol=1e-9, info=info)
    i, j = pairs[:, 0], pairs[:, 1]

    def dual(p, q):
        M = ((m.X[p][:, :, None].astype(np.float64) - m.X[q][:, None, :]) ** 2).sum(-1)
        M[m.index[p][:, :, None] == m.index[q][:, None, :]] = 0.0
        return sinkhorn_batch(M, m.w[p], m.w[q], eps=np.full(len(p), info["eps"]), tol=1e-9).dual

    direct = np.sqrt(np.maximum(dual(i, j) - 0.5 * dual(i, i) - 0.5 * dual(j, j), 0.0))
    np.testing.assert_allclose(deb, direct, rtol=1e-4, atol=1e-5)
    # batched result: converged flags and costs are per problem
    M = np.stack([((Z[:3, None] - Z[None, 3:6]) ** 2).sum(-1)] * 2)
    r = sinkhorn_batch(M, np.full((2, 3), 1 / 3), np.full((2, 3), 1 / 3), reg=0.01)
    assert r.converged.all() and (r.marginal_error <= 1e-4).all() and r.cost[0] == pytest.approx(r.cost[1])


def test_max_sliced_bound_is_a_lower_bound_and_prunes():
    from saeot.synthetic import planted_pair

    pp = planted_pair(n_features=40, n_tokens=3000, k=12, margin=0.5, seed=8)
    ma, mb = measures(pp.A.dists, pp.A.Z), measures(pp.B.dists, pp.B.Z)
    ex = pairwise_w2(ma, mb, "exact", candidates=None).D
    th = random_directions(ma.X.shape[2], 16, 3)
    ea, eb = sliced_embedding(ma, directions=th, n_quantiles=16), sliced_embedding(mb, directions=th, n_quantiles=16)
    lb = max_sliced_lower_bound(ea, eb, 16)
    fin = np.isfinite(ex)
    assert (lb[fin] <= ex[fin] * (1 + 1e-6)).all()
    assert (lb[fin] > 0.1 * ex[fin]).mean() > 0.5  # not vacuous (weak in d = 32: one direction of 32)
    # the projected-tokens path and the projected-support path give the same embedding
    np.testing.assert_allclose(sliced_embedding(Measures(ma.X, ma.w), directions=th, n_quantiles=16), ea, atol=1e-5)
    # pruning with it stays exact (how much it prunes on real features: docs/saeot.md)
    nn1, d1, _ = nearest_w2(ma, mb, max_sliced=False)
    nn2, d2, _ = nearest_w2(ma, mb, max_sliced=True)
    np.testing.assert_array_equal(nn2, np.argmin(ex, 1))
    np.testing.assert_allclose(d2, ex.min(1), rtol=1e-6)


def test_exact_in_worker_threads_equals_one_thread():
    from saeot.wasserstein import _exact_parallel

    rng = np.random.default_rng(9)
    Z = rng.standard_normal((500, 7))
    m = measures(feature_distributions(_random_acts(rng, n=500, F=30), k=8), Z)
    al = np.flatnonzero(m.alive)
    pairs = np.stack(np.meshgrid(al, al, indexing="ij"), -1).reshape(-1, 2)
    one = _exact_parallel(m, m, pairs, n_jobs=1)
    two = _exact_parallel(m, m, pairs, n_jobs=2, min_pairs_per_job=100)
    np.testing.assert_array_equal(one, two)
    ref = np.array([w2_exact(m.X[i].astype(np.float64), m.w[i], m.X[j].astype(np.float64), m.w[j])
                    for i, j in pairs[:50]])
    np.testing.assert_allclose(one[:50], ref, rtol=1e-5, atol=1e-6)


def test_mutual_nearest_neighbours():
    from saeot.matching import match

    D = np.array([[0.1, 0.5, 0.9], [0.2, 0.6, 0.8], [0.9, 0.3, 0.7]])
    m = match(D, "mutual")
    assert m.src.tolist() == [0, 2] and m.tgt.tolist() == [0, 1]


def test_pca_bound_is_a_lower_bound_tighter_than_centroid_and_bound_mid_lies_between_bounds():
    """pca-bound <= exact W2 on every pair (no slack needed beyond float32) and >= the centroid
    bound it refines; bound-mid is sqrt(LB^2 + UB^2) with UB the independent coupling's cost, so
    it lies in [W2, sqrt(2) UB]; per-source cost matrices (unsorted pairs, padded supports, shared
    tokens) give the same W2 as the one-pair solver."""
    from saeot.wasserstein import _exact_block, bound_mid, pca_bound, spread

    rng = np.random.default_rng(5)
    Z = rng.standard_normal((600, 24)) * np.r_[np.full(4, 6.0), np.ones(20)]  # a few dominant axes
    acts = _random_acts(rng, n=600, F=40, density=0.02)  # sparse: some supports shorter than k (padding)
    ma = measures(feature_distributions(acts[:, :20], k=10), Z)
    mb = measures(feature_distributions(acts[:, 20:], k=10), Z)
    assert not (ma.w > 0).all() and not mb.alive.all()
    ex = pairwise_w2(ma, mb, "exact", candidates=None).D
    fin = np.isfinite(ex)
    lb = pca_bound(ma, mb, n_proj=6, n_quantiles=8)
    assert (lb[fin] <= ex[fin] * (1 + 1e-5) + 1e-6).all()
    assert (lb[fin] >= lower_bound(ma, mb)[fin] * (1 - 1e-5) - 1e-6).all()
    assert np.median(lb[fin] / ex[fin]) > np.median(lower_bound(ma, mb)[fin] / ex[fin])  # strictly tighter here
    ub = np.sqrt(((ma.centroid[:, None] - mb.centroid[None]) ** 2).sum(-1) + spread(ma)[:, None] ** 2
                 + spread(mb)[None, :] ** 2)
    assert (ex[fin] <= ub[fin] * (1 + 1e-6)).all()
    mid = bound_mid(ma, mb, n_proj=6, n_quantiles=8)
    assert (mid[fin] >= ex[fin] * (1 - 1e-6)).all() and (mid[fin] <= np.sqrt(2) * ub[fin] * (1 + 1e-6)).all()
    pairs = np.argwhere(fin)
    rng.shuffle(pairs)
    np.testing.assert_allclose(_exact_block(ma, mb, pairs), ex[pairs[:, 0], pairs[:, 1]], rtol=1e-6)
    ref = [w2_exact(ma.X[i].astype(np.float64), ma.w[i], mb.X[j].astype(np.float64), mb.w[j]) for i, j in pairs[:40]]
    np.testing.assert_allclose(ex[pairs[:40, 0], pairs[:40, 1]], ref, rtol=1e-4, atol=1e-5)
