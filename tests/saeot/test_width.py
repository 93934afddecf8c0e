"""Width: the blocked candidate search equals brute force, all-pairs NN with every pair a candidate
equals the exact NN, and the GPU benchmark script runs (reduced, on CPU)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from saeot.width import all_pairs_nn, candidate_search, synthetic_layers


def _brute(ea, eb, c):
    D = ((ea[:, None, :] - eb[None]) ** 2).sum(-1)
    rows = {(i, j) for i in range(len(ea)) for j in np.argsort(D[i], kind="stable")[:c]}
    cols = {(i, j) for j in range(len(eb)) for i in np.argsort(D[:, j], kind="stable")[:c]}
    return rows | cols


@pytest.mark.parametrize("block", [7, 1000])
def test_candidate_search_is_brute_force_top_c(block):
    rng = np.random.default_rng(0)
    ea, eb = rng.standard_normal((90, 5)).astype(np.float32), rng.standard_normal((70, 5)).astype(np.float32)
    got = {tuple(p) for p in candidate_search(ea, eb, 4, block=block).tolist()}
    assert got == _brute(ea, eb, 4)


def test_dead_features_are_never_candidates():
    rng = np.random.default_rng(1)
    ea, eb = rng.standard_normal((30, 4)).astype(np.float32), rng.standard_normal((20, 4)).astype(np.float32)
    alive_a, alive_b = np.arange(30) % 3 > 0, np.arange(20) % 4 > 0
    p = candidate_search(ea, eb, 3, alive_a=alive_a, alive_b=alive_b)
    assert alive_a[p[:, 0]].all() and alive_b[p[:, 1]].all() and len(p) > 0


def test_all_candidates_give_the_exact_nearest_neighbour():
    from saeot.wasserstein import nearest_w2

    ma, mb = synthetic_layers(96, k=8, d=16, seed=3, cover=False)
    r = all_pairs_nn(ma, mb, candidates=96, n_jobs=1)
    nn, dist, _ = nearest_w2(ma, mb)
    np.testing.assert_allclose(r["dist"], dist, rtol=1e-6)  # float32 cost matrices, batched differently
    r16 = all_pairs_nn(ma, mb, candidates=16, n_jobs=1)
    assert (r16["dist"] >= dist * (1 - 1e-6)).all()  # a candidate NN is never nearer than the exact one


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_candidate_search_on_cuda_equals_cpu():
    rng = np.random.default_rng(2)
    ea, eb = rng.standard_normal((500, 32)).astype(np.float32), rng.standard_normal((400, 32)).astype(np.float32)
    a = candidate_search(ea, eb, 8, device="cpu")
    b = candidate_search(ea, eb, 8, device="cuda")
    assert len({tuple(x) for x in a.tolist()} ^ {tuple(x) for x in b.tolist()}) <= 0.01 * len(a)


def test_gpu_script_runs_reduced_on_cpu(tmp_path):
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OUT": str(tmp_path), "WIDTHS": "64,128", "DEVICE": "cpu", "PYTHON": sys.executable}
    p = subprocess.run(["bash", str(root / "scripts/gpu/saeot_width.sh")], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads((tmp_path / "saeot_width.json").read_text())
    assert set(r["widths"]) == {"64", "128"} and r["params"]["device"] == "cpu"
    for w in r["widths"].values():
        assert 0.0 <= w["recall"] <= 1.0 and w["seconds"]["total"] > 0 and w["pairs_evaluated"] > 0
    assert "width 128" in (tmp_path / "saeot_width.log").read_text()


def test_supports_are_gathered_not_stored_and_float16_tokens_give_the_same_nearest_neighbours():
    """Issue 44: the (F, k, d) support array (4.8 GB per layer at 16,384 features, d = 2,304) is never
    built: a layer holds its (F, k) indices and shares one token array, here in float16."""
    from saeot.wasserstein import GatheredSupports, w2_pairs

    ma, mb = synthetic_layers(256, k=8, d=48, seed=2)
    ha, hb = synthetic_layers(256, k=8, d=48, seed=2, dtype=np.float16)
    assert isinstance(ma.X, GatheredSupports) and ma.X.shape == (256, 8, 48) and ma.X[3].dtype == np.float32
    assert ma.Z is mb.Z and ha.Z.dtype == np.float16 and ha.Z.nbytes * 2 == ma.Z.nbytes
    assert ma.X.nbytes == 256 * 8 * 8  # indices only
    np.testing.assert_array_equal(ma.X[5:7], ma.Z[ma.index[5:7]])
    pairs = np.stack([np.repeat(np.arange(40), 40), np.tile(np.arange(40), 40)], 1)
    full, half = w2_pairs(ma, mb, pairs, "exact"), w2_pairs(ha, hb, pairs, "exact")
    np.testing.assert_allclose(half, full, rtol=2e-3)
    r32 = all_pairs_nn(ma, mb, candidates=256, prefilter="sliced")
    r16 = all_pairs_nn(ha, hb, candidates=256, prefilter="sliced")
    assert (r32["nn"] == r16["nn"]).mean() > 0.95


def test_certified_search_is_the_exact_nearest_neighbour_on_the_hard_case():
    """--certify: few candidates miss true neighbours on uncovered layers; the certification pass
    (lower-bound pruning started from the best candidate) recovers every one of them."""
    from saeot.wasserstein import nearest_w2

    ma, mb = synthetic_layers(192, k=6, d=24, seed=4, cover=False)
    _, true_d, _ = nearest_w2(ma, mb)
    plain = all_pairs_nn(ma, mb, candidates=2, prefilter="sliced", upper_probe=False)
    cert = all_pairs_nn(ma, mb, candidates=2, prefilter="sliced", certify=True, upper_probe=False)
    assert np.isclose(plain["dist"], true_d).mean() < 1.0  # the pre-filter alone misses some
    np.testing.assert_allclose(cert["dist"], true_d, rtol=1e-9)
    assert cert["pairs"] > plain["pairs"] and "certify" in cert["seconds"]
    # the second probe (targets nearest by the independent-coupling upper bound) finds neighbours
    # the lower-bound embedding misses, at a fraction of the certification's exact problems
    probe = all_pairs_nn(ma, mb, candidates=2, prefilter="sliced", upper_probe=True)
    assert np.isclose(probe["dist"], true_d).mean() > np.isclose(plain["dist"], true_d).mean()
    assert (probe["dist"] >= true_d * (1 - 1e-9)).all() and probe["pairs"] < cert["pairs"]


def test_candidate_search_with_offsets_ranks_by_the_upper_bound():
    """offset_a / offset_b add per-row constants to the squared distances: with centroids and squared
    spreads that is the independent coupling's cost, an upper bound on W2^2 (checked against exact W2)."""
    from saeot.wasserstein import spread, w2_pairs
    from saeot.width import upper_bound_embedding

    rng = np.random.default_rng(2)
    ea, eb = rng.standard_normal((40, 3)).astype(np.float32), rng.standard_normal((30, 3)).astype(np.float32)
    oa, ob = rng.uniform(0, 2, 40).astype(np.float32), rng.uniform(0, 2, 30).astype(np.float32)
    got = {tuple(p) for p in candidate_search(ea, eb, 3, block=7, offset_a=oa, offset_b=ob).tolist()}
    D = ((ea[:, None, :] - eb[None]) ** 2).sum(-1) + oa[:, None] + ob[None, :]
    rows = {(i, j) for i in range(40) for j in np.argsort(D[i], kind="stable")[:3]}
    cols = {(i, j) for j in range(30) for i in np.argsort(D[:, j], kind="stable")[:3]}
    assert got == rows | cols
    ma, mb = synthetic_layers(24, k=5, d=6, seed=1, cover=False)
    (ca, sa), (cb, sb) = upper_bound_embedding(ma), upper_bound_embedding(mb)
    pairs = np.array([(i, j) for i in range(24) for j in range(24)])
    ub2 = ((ca[pairs[:, 0]] - cb[pairs[:, 1]]) ** 2).sum(1) + sa[pairs[:, 0]] + sb[pairs[:, 1]]
    w2 = w2_pairs(ma, mb, pairs, "exact")
    assert (w2 ** 2 <= ub2 * (1 + 1e-4) + 1e-6).all() and np.allclose(sa, spread(ma) ** 2, rtol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_relaxed_bound_is_below_exact_w2_and_its_pruned_search_equals_brute_force(dtype):
    """The recall's ground truth at 16,384 features (issue 44): the relaxed-marginal bound is a lower
    bound on every pair's exact W2 (dead and padded supports included), and the search it prunes
    returns brute force's nearest neighbours while solving a fraction of the problems."""
    from saeot.distributions import FeatureDistributions
    from saeot.wasserstein import measures, nearest_w2, relaxed_lower_bound, w2_pairs

    ma, mb = synthetic_layers(160, k=8, d=32, seed=5, cover=False, dtype=dtype)
    w = mb.w.copy()
    w[3] = 0.0  # a dead target
    idx = mb.index.copy()
    idx[7, 5:] = -1  # a target with 5 of 8 support points (padded)
    w[7, 5:] = 0.0
    mb = measures(FeatureDistributions(idx, w, w.copy()), mb.Z, dtype=dtype)
    assert mb.Z is ma.Z
    pairs = np.stack([np.repeat(np.arange(160), 160), np.tile(np.arange(160), 160)], 1)
    alive = mb.alive[pairs[:, 1]]
    exact = np.full(len(pairs), np.inf)
    exact[alive] = w2_pairs(ma, mb, pairs[alive], "exact", n_jobs=1)
    lb = relaxed_lower_bound(ma, mb, block=7, token_block=100, target_block=33, n_jobs=2)
    np.testing.assert_allclose(lb, relaxed_lower_bound(ma, mb), rtol=1e-6)  # blocking changes nothing
    assert (lb.ravel()[alive] <= exact[alive]).all()
    assert np.median(lb.ravel()[alive] / exact[alive]) > 0.9  # tight: that is what lets it prune
    W = exact.reshape(160, 160)
    nn, dist, evaluated = nearest_w2(ma, mb, relaxed=True)
    np.testing.assert_allclose(dist, W.min(1), rtol=1e-6)
    assert (W[np.arange(160), nn] <= W.min(1) * (1 + 1e-6)).all() and nn[0] != 3
    _, _, evaluated_unrelaxed = nearest_w2(ma, mb, relaxed=False)
    assert evaluated < evaluated_unrelaxed / 2


@pytest.mark.parametrize("cover", [True, False])
def test_pruned_candidate_evaluation_equals_solving_every_candidate(cover):
    """all_pairs_nn(prune=True) solves exact W2 only where a pair's lower bound is below the source's
    best so far: the same nearest-neighbour distances as solving every candidate, fewer problems."""
    from saeot.wasserstein import w2_pairs
    from saeot.width import pair_bounds, upper_bound_embedding, _embed

    ma, mb = synthetic_layers(200, k=8, d=24, seed=6, cover=cover)
    full = all_pairs_nn(ma, mb, candidates=12, prefilter="pca-sliced", prune=False, n_jobs=1)
    pruned = all_pairs_nn(ma, mb, candidates=12, prefilter="pca-sliced", prune=True, n_jobs=1)
    np.testing.assert_allclose(pruned["dist"], full["dist"], rtol=1e-6)
    assert pruned["candidate_pairs"] == full["pairs"] and pruned["pairs"] < 0.75 * full["pairs"]
    # the bounds it prunes by hold on every pair
    rng = np.random.default_rng(0)
    pairs = np.stack([rng.integers(0, 200, 3000), rng.integers(0, 200, 3000)], 1)
    ea, eb = _embed(ma, mb, "pca-sliced", 64, 16)
    (ca, sa), (cb, sb) = upper_bound_embedding(ma), upper_bound_embedding(mb)
    lb, ub2 = pair_bounds(ea, eb, ca, sa, cb, sb, pairs, block=97)
    w = w2_pairs(ma, mb, pairs, "exact", n_jobs=1)
    assert (lb <= w).all() and (w ** 2 <= ub2 * (1 + 1e-5)).all()
