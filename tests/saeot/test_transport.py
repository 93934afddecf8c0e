"""The numba exact transport solver against POT's network simplex: it must give the same W2."""

import numpy as np
from ot.lp.emd_wrap import emd_c

from saeot.distributions import feature_distributions
from saeot.transport import transport_cost, transport_costs
from saeot.wasserstein import _exact_block, _exact_parallel, measures


def _pot_costs(M, A, B):
    out = np.empty(len(M))
    for p in range(len(M)):
        ka, kb = A[p] > 0, B[p] > 0
        a, b = A[p, ka] / A[p, ka].sum(), B[p, kb] / B[p, kb].sum()
        out[p] = emd_c(a, b, np.ascontiguousarray(M[p][np.ix_(ka, kb)]), 200_000, 1, None, None)[1]
    return out


def test_random_problems_equal_pot_including_padding_ties_and_degenerate_marginals():
    rng = np.random.default_rng(0)
    P, k = 400, 24
    M = rng.random((P, k, k)) ** 2 * 10
    A, B = rng.lognormal(size=(P, k)), rng.lognormal(size=(P, k))
    A[:50, 10:] = 0  # padding on one side, the other, both
    B[25:75, 3:] = 0
    A[75:100] = 1.0  # equal weights: many degenerate (zero-flow) basis cells
    B[75:100] = 1.0
    M[100:150] = np.round(M[100:150])  # tied costs
    A[150:160, 1:] = 0  # a single support point
    M[160:170] = 0.0  # all costs equal
    B[170:200, ::2] = A[170:200, 1::2]  # partial sums of both sides coincide
    cost, piv = transport_costs(M, A, B)
    ref = _pot_costs(M, A, B)
    np.testing.assert_allclose(np.sqrt(cost), np.sqrt(ref), rtol=0, atol=1e-9)
    assert (piv < 10_000).all()
    # rectangular problems, and the pivot limit reports failure as NaN instead of a wrong value
    c, _ = transport_cost(np.full(3, 1 / 3), np.full(5, 0.2), M[0, :3, :5].copy())
    assert abs(c - _pot_costs(M[:1, :3, :5], np.ones((1, 3)), np.ones((1, 5)))[0]) < 1e-12
    c0, _ = transport_cost(A[0] / A[0].sum(), B[0] / B[0].sum(), M[0], 0)
    assert np.isnan(c0) or abs(c0 - ref[0]) < 1e-12
    dead, _ = transport_costs(M[:2], np.zeros((2, k)), B[:2])
    assert np.isnan(dead).all()


def test_exact_block_numba_equals_pot_on_measures_with_shared_tokens_and_threads():
    rng = np.random.default_rng(3)
    n, F, d = 600, 40, 9
    Z = rng.standard_normal((n, d)) * rng.lognormal(0, 1, (n, 1))  # log-normal token norms
    acts = rng.exponential(1.0, (n, F)) * (rng.random((n, F)) < 0.15)
    acts[:, -1] = 0.0
    ma = measures(feature_distributions(acts, k=16), Z)
    mb = measures(feature_distributions(acts[:, ::-1] + 0.1 * acts, k=12), Z)  # shared tokens: exact zeros
    al_a, al_b = np.flatnonzero(ma.alive), np.flatnonzero(mb.alive)
    pairs = np.stack(np.meshgrid(al_a, al_b, indexing="ij"), -1).reshape(-1, 2)
    pairs = pairs[rng.permutation(len(pairs))]
    ref = _exact_block(ma, mb, pairs, backend="pot")
    np.testing.assert_allclose(_exact_block(ma, mb, pairs), ref, rtol=0, atol=1e-9)
    two = _exact_parallel(ma, mb, pairs, n_jobs=2, min_pairs_per_job=100)
    np.testing.assert_array_equal(two, _exact_parallel(ma, mb, pairs, n_jobs=1))
    np.testing.assert_allclose(two, ref, rtol=0, atol=1e-9)


def test_quantile_cells_equal_the_exact_cell_integrals_of_the_quantile_function():
    from saeot.transport import quantile_cells

    rng = np.random.default_rng(5)
    n, F, k, L, Q = 200, 30, 9, 4, 5
    Pz = rng.standard_normal((n, L)).astype(np.float32)
    Pz[:20] = np.round(Pz[:20])  # tied values
    index = rng.integers(0, n, (F, k))
    w = rng.exponential(1.0, (F, k))
    w[:8, 5:] = 0.0  # padding
    out = np.empty((F, L, Q), np.float32)
    quantile_cells(Pz, index, w, Q, out)
    edges = np.arange(Q + 1) / Q
    for f in range(F):
        for l in range(L):
            x = Pz[index[f], l].astype(np.float64)
            o = np.argsort(x, kind="stable")
            cw = np.cumsum(w[f, o] / w[f].sum())
            lo = np.r_[0.0, cw[:-1]]
            # F^-1 = x_(j) on (lo_j, cw_j]; integral over each cell by overlap lengths
            ov = np.clip(np.minimum(cw[None, :], edges[1:, None]) - np.maximum(lo[None, :], edges[:-1, None]), 0, None)
            np.testing.assert_allclose(out[f, l], Q * (ov * x[o][None, :]).sum(1), rtol=1e-5, atol=1e-6)
