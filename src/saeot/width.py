"""All-pairs W2 at SAE width (16,384 features and more) in memory that grows with the features, not
with their square: a blocked candidate search on embeddings (on an accelerator when there is one),
exact W2 on the candidates only, and the recall of the exact nearest neighbour on a sample.

Never an (Fa, Fb) matrix: the pre-filter embeds every feature once (sliced W2 cells along random
or principal directions: Euclidean distances between the embeddings are lower bounds on W2,
:func:`saeot.wasserstein.sliced_embedding`), then :func:`candidate_search` walks the sources in
row blocks on ``device`` (torch), keeping each source's ``candidates`` nearest targets and a
running top-``candidates`` of sources for every target.  Exact W2 (network simplex) runs on
those pairs only, on the CPU cores (:func:`saeot.wasserstein.w2_pairs`).  The nearest neighbour
of a source is its best evaluated candidate; the recall is checked against the exact nearest
neighbour of a random sample of sources (:func:`saeot.wasserstein.nearest_w2`, lower-bound
pruning, equal to brute force; its relaxed-marginal bound makes 512 sources at 16,384 features a
matter of minutes).

:func:`synthetic_layers` builds two layers of F features over a shared token pool with the
shapes of a real run (k-point supports in a d-dimensional reference space, concept clusters,
near-duplicate features) for benchmarks at widths no local SAE has.
"""

from __future__ import annotations

import os
import resource
import time

import numpy as np

from saeot.distributions import FeatureDistributions
from saeot.wasserstein import (
    Measures, default_jobs, measures, nearest_w2, principal_directions, random_directions, sliced_embedding,
    spread, w2_pairs,
)
from sakura.util.report import report_logger

_LOG = report_logger(__name__, "saeot")


def synthetic_layers(n_features: int, *, k: int = 32, d: int = 640, tokens_per_concept: int = 16,
                     features_per_concept: int = 2, spurious: float = 0.2, seed: int = 0, cover: bool = True,
                     dtype=np.float32) -> tuple[Measures, Measures]:
    """Two layers' feature measures over one token pool (float32, reference space ``d``).

    ``n_features / features_per_concept`` concepts with centres ~ N(0, I/d) * 2 (distance ~2 apart;
    the within-concept noise has norm ~1); each concept owns ``tokens_per_concept`` tokens.  Each
    layer has ``features_per_concept`` features per concept; a feature draws its k support tokens
    from the concept's
    tokens (a fraction ``spurious`` from anywhere), with weights ~ U(0.5, 1.5) normalised: so every
    feature has near-duplicates in the other layer (the same concept) and the nearest neighbour is
    a fine distinction, as between real features.  ``cover=False``: features pick concepts at
    random instead, so about 13% of a layer's features (Poisson(2) = 0) have no counterpart in
    the other layer and their nearest neighbour is one of many near-equidistant strangers (the
    hard case for any pre-filter).

    Returns
    -------
    ma, mb : Measures
        X (F, k, d) float32 sharing one token array Z (n_tokens, d).
    """
    if n_features < 2 or k < 1 or d < 1:
        raise ValueError(f"need n_features >= 2, k >= 1, d >= 1; got {n_features}, {k}, {d}")
    rng = np.random.default_rng(seed)
    n_conc = max(1, n_features // features_per_concept)
    n_tok = n_conc * tokens_per_concept
    mu = (rng.standard_normal((n_conc, d), dtype=np.float32) * np.float32(2 / np.sqrt(2 * d)))
    # (n_tok, d), token t has concept t // tokens_per_concept; filled in blocks straight into ``dtype``
    # (float16 halves the token array and no float32 copy of it is ever made)
    Z = np.empty((n_tok, d), dtype=dtype)
    for s in range(0, n_conc, 2048):
        blk = np.repeat(mu[s:s + 2048], tokens_per_concept, axis=0)
        blk += rng.standard_normal(blk.shape, dtype=np.float32) / np.float32(np.sqrt(d))
        Z[s * tokens_per_concept:s * tokens_per_concept + len(blk)] = blk

    def layer() -> Measures:
        # every concept gets features_per_concept features in each layer (then the remainder at random):
        # most features have counterparts in the other layer, as across adjacent or distant layers
        if cover:
            conc = np.concatenate([np.repeat(np.arange(n_conc), features_per_concept),
                                   rng.integers(0, n_conc, n_features - n_conc * features_per_concept)])
            conc = rng.permutation(conc)  # (F,)
        else:
            conc = rng.integers(0, n_conc, n_features)
        idx = conc[:, None] * tokens_per_concept + rng.integers(0, tokens_per_concept, (n_features, k))
        spur = rng.random((n_features, k)) < spurious
        idx[spur] = rng.integers(0, n_tok, int(spur.sum()))
        w = rng.uniform(0.5, 1.5, (n_features, k))
        w /= w.sum(1, keepdims=True)
        return measures(FeatureDistributions(idx.astype(np.int64), w, w.copy()), Z, dtype=dtype)

    return layer(), layer()


def _embed(ma: Measures, mb: Measures, prefilter: str, n_proj: int, n_quantiles: int):
    if prefilter == "sliced":
        th = random_directions(ma.X.shape[2], n_proj, 12345)
    elif prefilter == "pca-sliced":
        th = principal_directions(ma, mb, n_proj)
    else:
        raise ValueError(f"unknown width prefilter {prefilter!r}; expected sliced or pca-sliced")
    return (sliced_embedding(ma, directions=th, n_quantiles=n_quantiles),
            sliced_embedding(mb, directions=th, n_quantiles=n_quantiles))


def candidate_search(ea: np.ndarray, eb: np.ndarray, candidates: int, *, device: str = "cpu",
                     block: int = 2048, alive_a=None, alive_b=None, offset_a=None, offset_b=None) -> np.ndarray:
    """(P, 2) distinct (source, target) pairs: every source's ``candidates`` nearest targets and
    every target's ``candidates`` nearest sources, by Euclidean distance between embeddings.

    Parameters
    ----------
    ea : (Fa, e) float32;  eb : (Fb, e) float32
    device : str
        torch device for the blocked distance products and top-k (``cuda`` when present).
    block : int
        Source rows per step: peak memory is block x Fb distances.
    alive_a, alive_b : (Fa,), (Fb,) bool, optional
        Dead features are never candidates.
    offset_a, offset_b : (Fa,), (Fb,) float, optional
        Added to every squared distance of that source / target (the spreads' squares of the
        independent-coupling bound, :func:`upper_bound_embedding`).
    """
    import torch  # lazy: torch (seconds) keeps --help fast

    dev = torch.device(device)
    Fa, Fb = len(ea), len(eb)
    block = max(1, min(block, (1 << 25) // max(1, Fb)))  # a (block, Fb) float32 tile stays <= 128 MB
    c, cr = min(candidates, Fb), min(candidates, Fa)
    B = torch.from_numpy(np.ascontiguousarray(eb, dtype=np.float32)).to(dev)  # (Fb, e)
    bb = (B * B).sum(1)  # (Fb,)
    if offset_b is not None:
        bb = bb + torch.from_numpy(np.asarray(offset_b, dtype=np.float32)).to(dev)
    dead_b = None if alive_b is None else torch.from_numpy(~np.asarray(alive_b)).to(dev)
    col_val = torch.full((cr, Fb), float("inf"), device=dev)  # running best sources of every target
    col_idx = torch.zeros((cr, Fb), dtype=torch.long, device=dev)
    rows = []
    for s in range(0, Fa, block):
        A = torch.from_numpy(np.ascontiguousarray(ea[s:s + block], dtype=np.float32)).to(dev)  # (b, e)
        aa = (A * A).sum(1, keepdim=True)
        if offset_a is not None:
            aa = aa + torch.from_numpy(np.asarray(offset_a[s:s + block], dtype=np.float32)).to(dev)[:, None]
        D = aa + bb[None, :] - 2.0 * A @ B.T  # (b, Fb) squared distances
        if dead_b is not None:
            D[:, dead_b] = float("inf")
        if alive_a is not None:
            D[torch.from_numpy(~np.asarray(alive_a[s:s + block])).to(dev)] = float("inf")
        v, j = torch.topk(D, c, dim=1, largest=False)  # (b, c)
        i = torch.arange(s, s + len(A), device=dev)[:, None].expand_as(j)
        ok = torch.isfinite(v)
        rows.append(torch.stack([i[ok], j[ok]], 1).cpu())
        kk = min(cr, len(A))
        cv, ci = torch.topk(D, kk, dim=0, largest=False)  # (kk, Fb)
        allv = torch.cat([col_val, cv], 0)
        alli = torch.cat([col_idx, ci + s], 0)
        col_val, pick = torch.topk(allv, cr, dim=0, largest=False)
        col_idx = torch.gather(alli, 0, pick)
    ok = torch.isfinite(col_val)
    tgt = torch.arange(Fb, device=dev)[None, :].expand_as(col_idx)
    rows.append(torch.stack([col_idx[ok], tgt[ok]], 1).cpu())
    pairs = torch.cat(rows, 0).numpy().astype(np.int64)
    return np.unique(pairs, axis=0)


def upper_bound_embedding(m: Measures) -> tuple[np.ndarray, np.ndarray]:
    r"""(F, d) float32 centroids and (F,) squared spreads: :math:`\|c_a - c_b\|^2 + s_a^2 + s_b^2` is the
    cost of the independent coupling, an upper bound on :math:`W_2^2` (:func:`candidate_search` with
    these as ``offset_a`` / ``offset_b`` ranks targets by it).

    Why a second probe: lower bounds (the sliced embeddings) rank a feature's nearest neighbour well
    when it has a close counterpart, but a feature with none (the uncovered case) has many
    near-equidistant strangers whose lower bounds say little; the upper bound ranks those by mean
    and spread, which is where their W2 differs.  Measured on 512 uncovered sources at 4,096
    features (d = 640): the exact NN is among the 16 best by the lower bound for 0.88 of sources
    (0.91 at 128) and by the upper bound for 0.98 (docs/saeot.md)."""
    if m.index is None or m.Z is None:
        return m.centroid.astype(np.float32), (spread(m) ** 2).astype(np.float32)
    import scipy.sparse as sp  # lazy: scipy (0.3-3 s) keeps --help fast

    # centroids as (F, n) sparse weights times the token array, token block by token block: no
    # (F, k, d) gather (at 4,096 x 2,304 the gathered form took the process from 0.86 to 1.97 GiB)
    F, k = m.index.shape
    w = m.w / np.maximum(m.w.sum(1, keepdims=True), 1e-300)
    W = sp.csr_matrix((w.ravel(), m.index.ravel(), np.arange(0, F * k + 1, k)), shape=(F, len(m.Z))).tocsc()
    W32 = W.astype(np.float32)  # float32 products: a float64 (F, d) temporary was 1.2 GB at 65,536 features
    c = np.zeros((F, m.Z.shape[1]), dtype=np.float32)
    zz = np.empty(len(m.Z))
    for s in range(0, len(m.Z), 8192):
        z = np.asarray(m.Z[s:s + 8192], dtype=np.float32)
        Ws = W32[:, s:s + 8192].tocsr()
        for f in range(0, F, 8192):  # feature blocks: the product's temporary stays 8,192 x d
            c[f:f + 8192] += Ws[f:f + 8192] @ z
        zz[s:s + 8192] = np.einsum("nd,nd->n", z, z, dtype=np.float64)
    s2 = W @ zz - np.einsum("fd,fd->f", c, c, dtype=np.float64)  # E|x|^2 - |E x|^2
    return c, np.maximum(s2, 0.0).astype(np.float32)


def nearest_from_pairs(pairs: np.ndarray, vals: np.ndarray, n_sources: int) -> tuple[np.ndarray, np.ndarray]:
    """(Fa,) best target per source among evaluated pairs (-1 if none) and its distance (inf)."""
    nn = np.full(n_sources, -1, dtype=np.int64)
    dist = np.full(n_sources, np.inf)
    order = np.lexsort((vals, pairs[:, 0]))  # by source, then distance
    first = order[np.r_[True, pairs[order[1:], 0] != pairs[order[:-1], 0]]]
    nn[pairs[first, 0]] = pairs[first, 1]
    dist[pairs[first, 0]] = vals[first]
    return nn, dist


def pair_bounds(ea: np.ndarray, eb: np.ndarray, ca: np.ndarray, sa: np.ndarray, cb: np.ndarray, sb: np.ndarray,
                pairs: np.ndarray, block: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    r"""(P,) lower bound on W2 and (P,) upper bound on :math:`W_2^2` of each (source, target) pair,
    from what the candidate search already holds: embeddings ``ea``, ``eb``, centroids ``ca``, ``cb``
    (F, d) and squared spreads ``sa``, ``sb`` (F,) (:func:`upper_bound_embedding`).

    Lower: the larger of the sliced-embedding distance :math:`\|E_a - E_b\|` (at most
    :math:`SW_2 \le W_2`, :func:`saeot.wasserstein.sliced_embedding`) and the mean-and-spread bound
    :math:`\sqrt{\|c_a - c_b\|^2 + (s_a - s_b)^2}` (:func:`saeot.wasserstein.lower_bound`), lowered
    by 1e-4 relative (float32 inputs).  Upper: the independent coupling
    :math:`\|c_a - c_b\|^2 + s_a^2 + s_b^2`.  ``block`` pairs at a time (a few tens of MB)."""
    lb, ub2 = np.empty(len(pairs)), np.empty(len(pairs))
    for s in range(0, len(pairs), block):
        i, j = pairs[s:s + block, 0], pairs[s:s + block, 1]
        de = ea[i] - eb[j]
        dc = ca[i] - cb[j]
        e2 = np.einsum("pe,pe->p", de, de, dtype=np.float64)
        c2 = np.einsum("pd,pd->p", dc, dc, dtype=np.float64)
        va, vb = np.maximum(sa[i], 0.0).astype(np.float64), np.maximum(sb[j], 0.0).astype(np.float64)
        lb[s:s + block] = np.sqrt(np.maximum(e2, c2 + (np.sqrt(va) - np.sqrt(vb)) ** 2))
        ub2[s:s + block] = c2 + va + vb
    return lb * (1 - 1e-4), ub2


def nearest_among(ma: Measures, mb: Measures, pairs: np.ndarray, lb: np.ndarray, first: np.ndarray | None = None,
                  *, step: int = 4, n_jobs: int | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """Each source's nearest target among its candidate ``pairs`` (P, 2), solving exact W2 only where
    it can win: the pair with the smallest ``first`` score per source (e.g. the upper bound: often
    the answer), then rounds of ``step`` pairs per source in increasing lower bound ``lb`` (P,),
    skipping every pair whose bound is not below the source's best so far.  A skipped pair's W2
    is at least its bound, so the answer is the minimum over all pairs (ties aside): the same as
    solving every pair, at a fraction of the problems when a feature has a clear counterpart.

    Returns
    -------
    nn : (Fa,) int64 (-1: no pair);  dist : (Fa,) float64 (inf);  evaluated : int exact problems
    """
    Fa = ma.X.shape[0]
    nn, dist = np.full(Fa, -1, dtype=np.int64), np.full(Fa, np.inf)
    if len(pairs) == 0:
        return nn, dist, 0
    order = np.lexsort((lb, pairs[:, 0]))  # by source, then bound
    p, b = pairs[order], lb[order]
    done = np.zeros(len(p), dtype=bool)
    starts = np.flatnonzero(np.r_[True, p[1:, 0] != p[:-1, 0]])
    ends = np.r_[starts[1:], len(p)]
    src = p[starts, 0]
    evaluated = 0

    def solve(idx):
        nonlocal evaluated
        vals = w2_pairs(ma, mb, p[idx], "exact", n_jobs=n_jobs)
        evaluated += len(idx)
        done[idx] = True
        got_nn, got_d = nearest_from_pairs(p[idx], vals, Fa)
        better = got_d < dist
        nn[better], dist[better] = got_nn[better], got_d[better]

    if first is not None:  # each source's most promising pair first: it sets the bar the bounds must pass
        f = first[order]
        seg = np.repeat(np.arange(len(starts)), ends - starts)
        pick = np.lexsort((f, seg))[starts]  # the smallest score within each source's segment
        solve(pick)
    cursor = starts.copy()
    while True:
        live = cursor < ends
        live[live] = b[cursor[live]] < dist[src[live]]  # bounds are sorted: past the bar, nothing can win
        if not live.any():
            break
        idx = (cursor[live, None] + np.arange(step)[None, :]).ravel()
        owner = np.repeat(np.flatnonzero(live), step)
        ok = idx < ends[owner]
        idx, owner = idx[ok], owner[ok]
        keep = (b[idx] < dist[src[owner]]) & ~done[idx]
        cursor[live] += step
        if keep.any():
            solve(idx[keep])
    return nn, dist, evaluated


def all_pairs_nn(ma: Measures, mb: Measures, *, candidates: int = 16, prefilter: str = "pca-sliced",
                 n_proj: int = 64, n_quantiles: int = 16, device: str = "cpu", n_jobs: int | None = None,
                 block: int = 2048, exact: bool = True, certify: bool = False, upper_probe: bool = True,
                 prune: bool = True) -> dict:
    """Exact W2 nearest neighbour of every source among its candidates, timed by stage.

    Candidates: every source's (and target's) ``candidates`` nearest by the ``prefilter`` embedding
    (a lower bound), and with ``upper_probe`` also by the independent-coupling upper bound
    (:func:`upper_bound_embedding`); exact W2 on the union, or with ``prune`` only on the pairs
    that can still win (:func:`nearest_among` with :func:`pair_bounds`: the same answer).

    Returns
    -------
    dict with ``nn`` (Fa,) int64, ``dist`` (Fa,) float64, ``pairs`` (exact problems solved),
    ``candidate_pairs`` and ``seconds`` {embed, candidates, exact, total}.
    """
    t0 = time.perf_counter()
    ea, eb = _embed(ma, mb, prefilter, n_proj, n_quantiles)
    t1 = time.perf_counter()
    pairs = candidate_search(ea, eb, candidates, device=device, block=block, alive_a=ma.alive, alive_b=mb.alive)
    if upper_probe or prune:
        (ca, sa), (cb, sb) = upper_bound_embedding(ma), upper_bound_embedding(mb)
    if upper_probe:
        more = candidate_search(ca, cb, candidates, device=device, block=block, alive_a=ma.alive, alive_b=mb.alive,
                                offset_a=sa, offset_b=sb)
        pairs = np.unique(np.concatenate([pairs, more]), axis=0)
    if device.startswith("cuda"):
        import torch  # lazy: torch (seconds) keeps --help fast

        torch.cuda.synchronize()
    t2 = time.perf_counter()
    if not exact:  # memory / candidate-search runs at widths whose exact stage is only extrapolated
        return {"nn": None, "dist": None, "pairs": int(len(pairs)), "candidate_pairs": int(len(pairs)),
                "seconds": {"embed": t1 - t0, "candidates": t2 - t1, "exact": float("nan"), "total": t2 - t0}}
    if prune:
        lb, ub2 = pair_bounds(ea, eb, ca, sa, cb, sb, pairs)
        nn, dist, n_pairs = nearest_among(ma, mb, pairs, lb, ub2, n_jobs=n_jobs)
    else:
        vals = w2_pairs(ma, mb, pairs, "exact", n_jobs=n_jobs)
        nn, dist = nearest_from_pairs(pairs, vals, ma.X.shape[0])
        n_pairs = int(len(pairs))
    t3 = time.perf_counter()
    secs = {"embed": t1 - t0, "candidates": t2 - t1, "exact": t3 - t2, "total": t3 - t0}
    n_cand = int(len(pairs))
    if certify:  # visit every target whose lower bound is below the best candidate: the exact NN

        nn, dist, extra = nearest_w2(ma, mb, init=(nn, dist))
        secs["certify"] = time.perf_counter() - t3
        secs["total"] = time.perf_counter() - t0
        n_pairs += int(extra)
    return {"nn": nn, "dist": dist, "pairs": int(n_pairs), "candidate_pairs": n_cand, "seconds": secs}


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (Linux ru_maxrss is in kB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def memory_plan(n_features: int, d: int, *, k: int = 32, n_tokens: int, support_bytes: int = 2) -> dict:
    """Bytes one layer's OT inputs take, stored as saeot stores them: the shared token array
    (n_tokens, d) in ``support_bytes`` per value (2 = float16), the supports' token indices
    (F, k) int64 and weights (F, k) float64, against the (F, k, d) float32 supports of before."""
    return {"n_features": n_features, "d": d, "k": k, "n_tokens": n_tokens,
            "token_array_bytes": n_tokens * d * support_bytes, "index_weight_bytes": n_features * k * 16,
            "materialised_float32_bytes": n_features * k * d * 4}


def width_bench(widths=(4096, 16384), *, k: int = 32, d: int = 640, candidates: int = 32,
                prefilter: str = "pca-sliced", recall_sources: int = 64, device: str = "cpu", seed: int = 0,
                n_jobs: int | None = None, cover: bool = True, support_dtype: str = "float32",
                recall: bool = True, exact: bool = True, certify: bool = False, upper_probe: bool = True,
                prune: bool = True, log=None) -> dict:
    """Wall time and nearest-neighbour recall of all-pairs exact W2 at each width, in one run.

    Per width: build :func:`synthetic_layers`, run :func:`all_pairs_nn`, then the exact nearest
    neighbour of ``recall_sources`` random sources by lower-bound pruning (equal to brute force)
    and the recall = fraction whose candidate NN has the exact NN's W2 (ties count as found).
    """
    log = log or _LOG.info  # the module's logger unless the caller gives a sink
    out = {"params": {"k": k, "d": d, "candidates": candidates, "prefilter": prefilter,
                      "recall_sources": recall_sources, "device": device, "seed": seed,
                      "cpu_threads": n_jobs or default_jobs(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                      "support_dtype": support_dtype, "certify": certify, "upper_probe": upper_probe, "prune": prune,
                      "peak_rss_before_bytes": peak_rss_bytes(),
                      "data": "synthetic_layers (saeot.width): concept clusters, 2 features per concept"
                              + ("" if cover else ", concepts at random (uncovered: hard case)")},
           "widths": {}}
    for F in widths:
        tb = time.perf_counter()
        ma, mb = synthetic_layers(F, k=k, d=d, seed=seed, cover=cover, dtype=np.dtype(support_dtype))
        build = time.perf_counter() - tb
        r = all_pairs_nn(ma, mb, candidates=candidates, prefilter=prefilter, device=device, n_jobs=n_jobs,
                         exact=exact, certify=certify, upper_probe=upper_probe, prune=prune)
        res = {"n_features": F, "pairs_evaluated": r["pairs"], "pairs_per_source": r["pairs"] / F,
               "candidate_pairs": r["candidate_pairs"],
               "seconds": {**r["seconds"], "build_data": build},
               "memory": {**memory_plan(F, d, k=k, n_tokens=len(ma.Z), support_bytes=ma.Z.itemsize),
                          "token_array_shared_by_both_layers": ma.Z is mb.Z,
                          "peak_rss_bytes_after_nn": peak_rss_bytes()}}
        msg = ""
        if recall and exact:
            rng = np.random.default_rng(seed + 1)
            rows = np.sort(rng.choice(F, min(recall_sources, F), replace=False))
            tr = time.perf_counter()
            true_nn, true_d, evaluated = nearest_w2(ma.subset(rows), mb)
            res["seconds"]["recall_check"] = time.perf_counter() - tr
            res["memory"]["peak_rss_bytes_after_recall"] = peak_rss_bytes()
            found = np.isclose(r["dist"][rows], true_d, rtol=1e-6, atol=1e-9)
            res.update({"recall": float(found.mean()), "recall_sources": int(len(rows)),
                        "recall_check_pairs": int(evaluated),
                        "recall_check": "nearest_w2: exact W2 in increasing lower bound (mean and spread, max-sliced, "
                                        "relaxed marginals) until the bound passes the best found (= brute force)"})
            msg = (f"; recall of the exact NN {res['recall']:.3f} on {len(rows)} sources (ground truth "
                   f"{res['seconds']['recall_check']:.0f} s, {evaluated} exact problems)")
        out["widths"][str(F)] = res
        solved = f"{r['pairs']} exact W2 problems solved" if exact else "exact stage not run"
        log(f"width {F} (d {d}, supports {support_dtype}): {r['candidate_pairs']} candidate pairs, {solved}, "
            f"all-pairs NN "
            f"{r['seconds']['total']:.1f} s (embed {r['seconds']['embed']:.1f}, candidates "
            f"{r['seconds']['candidates']:.1f} on {device}, exact {r['seconds']['exact']:.1f}); peak RSS "
            f"{res['memory']['peak_rss_bytes_after_nn'] / 2**30:.2f} GiB" + msg)
        del ma, mb
    return out
