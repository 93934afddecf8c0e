"""Benchmarks: planted-match recovery vs samples (synthetic), and method comparison on real layers."""

from __future__ import annotations

import importlib.util
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from saeot.collect import load_activations
from saeot.evaluate import bootstrap_ci
from saeot.fsutil import atomic_write
from saeot.geometry import DEFAULT_GEOMETRY, GEOMETRIES, Geometry
from saeot.matching import Matching, csls, in_degree_stats, match
from saeot.methods import METHODS, LayerFeatures, distance_matrix
from saeot.pipeline import compare_methods, layer_pair, top_token_overlap
from saeot.sae import load_sae_for_layer
from saeot.synthetic import planted_pair
from saeot.wasserstein import (
    Measures, _exact_parallel, candidate_pairs, default_jobs, measures, nearest_w2, pairwise_w2, prefilter_matrix,
    sliced_proxy, w2_pairs,
)
from sakura.util.report import report_logger

_LOG = report_logger(__name__, "saeot")


def planted_recovery(ks=(2, 4, 8, 16, 32), seeds=(0, 1, 2), n_features: int = 64, n_tokens: int = 8000,
                     margin: float = 0.5, drift: float = 1.5, progress: bool = True, sweep: str = "k",
                     values=None, k: int = 16) -> dict:
    """Recovery accuracy (NN and Hungarian) of every method vs sample count.

    ``sweep="k"``: samples = top-k support size (``ks``), corpus fixed at ``n_tokens``.
    ``sweep="n_tokens"``: samples = corpus tokens (``values``), support size fixed at ``k``; every
    method (incl. activation correlation) sees only those tokens.

    Returns
    -------
    dict  {"ks": [...x values...], "sweep": ..., "methods": {name: {"nn": [...], "hungarian": [...]}},
    "params": {...}}
    """
    if sweep not in ("k", "n_tokens"):
        raise ValueError(f"sweep must be 'k' or 'n_tokens', got {sweep!r}")
    xs = list(ks) if sweep == "k" else list(values or (250, 500, 1000, 2000, 4000, 8000))
    from tqdm.auto import tqdm  # lazy: tqdm.auto (0.3 s) keeps --help fast

    # xact and the enc+dec SAE-Match reading are for real SAEs (xact needs the target SAE at the source tokens)
    names = ["ot-exact", "ot-sinkhorn", "ot-sliced"] + [m for m in METHODS if m not in ("ot", "xact", "sae-match-folded-encdec")]
    res = {n: {"nn": [], "hungarian": []} for n in names}
    for x in tqdm(xs, disable=not progress, desc=f"planted recovery vs {sweep}"):
        acc = {n: {"nn": [], "hungarian": []} for n in names}
        kk, nt = (x, n_tokens) if sweep == "k" else (k, x)
        for seed in seeds:
            pp = planted_pair(n_features=n_features, n_tokens=nt, k=kk, margin=margin, drift=drift, seed=seed)
            for n in names:
                if n.startswith("ot-"):
                    D = distance_matrix("ot", pp.A, pp.B, solver=n[3:], candidates=None).D
                else:
                    D = distance_matrix(n, pp.A, pp.B).D
                for s in ("nn", "hungarian"):
                    acc[n][s].append(match(D, s).accuracy(pp.perm))
        for n in names:
            for s in ("nn", "hungarian"):
                res[n][s].append(float(np.mean(acc[n][s])))
    return {"ks": xs, "sweep": sweep, "methods": res,
            "params": {"n_features": n_features, "n_tokens": n_tokens, "k": k, "margin": margin, "drift": drift,
                       "seeds": list(seeds), "chance": 1.0 / n_features}}


def plot_recovery(r: dict, path: Path) -> Path:
    import matplotlib  # lazy: matplotlib loads only when a figure is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib loads only when a figure is drawn

    fig, ax = plt.subplots(figsize=(6, 4))
    for n, v in r["methods"].items():
        ax.plot(r["ks"], v["nn"], marker="o", label=n, ls="-" if n.startswith("ot") else "--")
    ax.axhline(r["params"]["chance"], color="grey", lw=0.8, label="chance")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("samples per feature (top-k support size)" if r.get("sweep", "k") == "k"
                  else f"corpus tokens (top-{r['params']['k']} supports)")
    ax.set_ylabel("planted matches recovered (NN)")
    ax.set_title("Synthetic planted matches")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_json(obj, path: Path) -> Path:
    return atomic_write(path, json.dumps(obj, indent=1, default=float).encode("utf-8"))


def timing_all_pairs(A, B, candidates: int = 32, progress: bool = True, sinkhorn_sample: int = 8192) -> dict:
    """Wall time for all pairs between two layers with every OT solver.

    sliced: all pairs, measured.  exact: pre-filtered to ``candidates`` per feature, measured.
    Sinkhorn: the same candidate pairs, timed on ``sinkhorn_sample`` of them and extrapolated.
    """
    out = {}
    for solver, cand in (("sliced", None), ("exact", candidates)):
        t0 = time.perf_counter()
        r = distance_matrix("ot", A, B, solver=solver, candidates=cand, progress=progress)
        out[f"ot-{solver}"] = {"seconds": time.perf_counter() - t0, "evaluated_pairs": r.evaluated,
                               "stages": r.seconds}
        if solver == "exact":
            pairs = np.argwhere(np.isfinite(r.D))
    ma, mb = measures(A.dists, A.Z), measures(B.dists, B.Z)
    sel = pairs[np.random.default_rng(0).choice(len(pairs), min(sinkhorn_sample, len(pairs)), replace=False)]
    t0 = time.perf_counter()
    w2_pairs(ma, mb, sel, "sinkhorn")
    dt = time.perf_counter() - t0
    out["ot-sinkhorn (candidates, extrapolated)"] = {"seconds": dt / len(sel) * len(pairs),
                                                      "measured_pairs": int(len(sel)), "measured_seconds": dt}
    return out


def real_layers_bench(acts_dir: Path, saes_dir: Path, pairs=((0, 18), (9, 18)), k: int = 32, candidates: int = 32,
                      exact_sample: int = 20000, nn_sources: int = 25, seed: int = 0, progress: bool = True) -> dict:
    """Every method on real layer pairs: top-token proxy, agreement between methods, wall times.

    Per pair: NN matching for every method (alive source features), the mean top-10 context-token
    Jaccard of matched pairs (plus a random-match floor), pairwise agreement of methods' matches,
    and OT wall times for all pairs (sliced: all pairs; exact and Sinkhorn: ``candidates`` per
    feature; exact on *all* pairs: extrapolated from ``exact_sample`` random pairs; exact pruned
    NN: measured on ``nn_sources`` sources, evaluated-pair fraction reported).
    """
    tokens = load_activations(acts_dir, "tokens")
    rng = np.random.default_rng(seed)
    out = {}
    for la, lb in pairs:
        A, B = layer_pair(acts_dir, load_sae_for_layer(saes_dir, la), load_sae_for_layer(saes_dir, lb),
                          la, lb, k=k)
        res = compare_methods(A, B, tokens, solver="exact", candidates=candidates, progress=progress)
        alive_a = np.flatnonzero(A.dists.alive)
        alive_b = np.flatnonzero(B.dists.alive)
        rand = Matching(alive_a, rng.choice(alive_b, len(alive_a)), np.zeros(len(alive_a)))
        nn = {m: r.matching.as_dict() for m, r in res.items()}
        agree = {m1: {m2: float(np.mean([nn[m2].get(i) == j for i, j in nn[m1].items()])) for m2 in nn} for m1 in nn}
        ma, mb = measures(A.dists, A.Z), measures(B.dists, B.Z)
        t0 = time.perf_counter()
        pr = np.stack([rng.choice(alive_a, exact_sample), rng.choice(alive_b, exact_sample)], 1)
        w2_pairs(ma, mb, pr, "exact", progress=progress)
        per_pair = (time.perf_counter() - t0) / exact_sample
        srcs = rng.choice(alive_a, min(nn_sources, len(alive_a)), replace=False)

        t0 = time.perf_counter()
        _, _, evaluated = nearest_w2(Measures(ma.X[srcs], ma.w[srcs]), mb)
        nn_s = time.perf_counter() - t0
        timing = timing_all_pairs(A, B, candidates=candidates, progress=progress)
        timing["ot-exact-all-pairs (extrapolated)"] = {"seconds": per_pair * len(alive_a) * len(alive_b),
                                                      "per_pair_ms": per_pair * 1e3}
        timing["ot-exact-pruned-nn"] = {"seconds_per_source": nn_s / len(srcs),
                                        "extrapolated_seconds": nn_s / len(srcs) * len(alive_a),
                                        "evaluated_fraction": evaluated / (len(srcs) * len(alive_b))}
        out[f"{la}->{lb}"] = {
            "n_features": [A.n_features, B.n_features], "alive": [int(len(alive_a)), int(len(alive_b))],
            "methods": {m: {"top_token_jaccard": r.proxy, "seconds": r.seconds, "evaluated_pairs": r.evaluated,
                            "matched": int(len(r.matching.src)),
                            "unique_targets": int(len(set(r.matching.tgt.tolist())))} for m, r in res.items()},
            "random_jaccard": float(top_token_overlap(A, B, tokens, rand).mean()),
            "agreement": agree, "timing": timing}
    return out


def _legacy_wasserstein(rev: str):
    """The wasserstein module as of git revision ``rev`` (for side-by-side timing), or None."""
    try:
        src = subprocess.run(["git", "show", f"{rev}:src/saeot/wasserstein.py"], capture_output=True, text=True,
                             check=True, cwd=Path(__file__).resolve().parents[2]).stdout
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None
    path = Path(tempfile.mkdtemp()) / "legacy_wasserstein.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("legacy_wasserstein", path)
    mod = importlib.util.module_from_spec(spec)

    sys.modules["legacy_wasserstein"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _cpu() -> float:
    """CPU seconds of this process and its finished children (robust to a shared, loaded machine)."""
    return time.process_time() + resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime \
        + resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime


def speed_bench(acts_dir: Path, saes_dir: Path, layer_a: int = 9, layer_b: int = 18, k: int = 32,
                candidates: int = 32, recall_sources: int = 24, legacy_rev: str | None = "0b04a39",
                legacy_exact_sample: int = 20_000, n_jobs: int | None = None, seed: int = 0,
                log=None, geometry: str | None = None, spaces=("reference", "pca"),
                prefilters=("sliced", "pca-sliced", "pca-bound", "bound-mid"), pruned: bool = True) -> dict:
    """All-pairs OT between two layers' SAE features, every variant timed in one run (same load).

    Variants: sliced (all pairs) and exact on pre-filtered candidates, in the full reference
    space and in its PCA-64 projection, on one thread and one per core; the code of
    ``legacy_rev`` (POT ``emd2`` per pair in float64, old sliced embedding) side by side.
    Candidate recall: for ``recall_sources`` random alive sources, the exact W2 nearest neighbour
    over *all* targets (brute force) is in the candidate set or not, for every pre-filter in
    ``prefilters`` and candidate count; then exact W2 on each pre-filter's smallest candidate count
    with recall >= 0.95 (or its largest), timed.
    """
    log = log or _LOG.info  # the module's logger unless the caller gives a sink
    geometry = geometry or DEFAULT_GEOMETRY

    rng = np.random.default_rng(seed)
    sa, sb = load_sae_for_layer(saes_dir, layer_a), load_sae_for_layer(saes_dir, layer_b)
    out: dict = {"layers": [layer_a, layer_b], "k": k, "candidates": candidates, "cores": default_jobs(),
                 "geometry": geometry, "spaces": {}}
    for space in spaces:
        A, B = layer_pair(acts_dir, sa, sb, layer_a, layer_b, space=space, k=k, n_components=64, geometry=geometry)
        ma, mb = measures(A.dists, A.Z), measures(B.dists, B.Z)
        res: dict = {"dim": int(A.Z.shape[1]), "alive": [int(ma.alive.sum()), int(mb.alive.sum())]}
        for solver in ("sliced", "exact"):  # warm-up: imports and first-call costs are not timed
            pairwise_w2(ma.subset(np.arange(8)), mb.subset(np.arange(8)), solver, candidates=None)
        t0, c0 = time.perf_counter(), _cpu()
        pairwise_w2(ma, mb, "sliced")
        res["sliced_all_pairs_s"] = time.perf_counter() - t0
        res["sliced_all_pairs_cpu_s"] = _cpu() - c0
        log(f"[{space}] sliced all pairs: {res['sliced_all_pairs_s']:.1f} s")
        for jobs in sorted({1, n_jobs or default_jobs()}):
            t0, c0 = time.perf_counter(), _cpu()
            r = pairwise_w2(ma, mb, "exact", candidates=candidates, n_jobs=jobs)
            res[f"exact_candidates_s_jobs{jobs}"] = time.perf_counter() - t0
            res[f"exact_candidates_cpu_s_jobs{jobs}"] = _cpu() - c0  # this process + its workers
            res["exact_candidates_stages"] = r.seconds
            res["exact_candidate_pairs"] = r.evaluated
            log(f"[{space}] exact on {r.evaluated} candidate pairs, {jobs} thread(s): "
                f"{res[f'exact_candidates_s_jobs{jobs}']:.1f} s")
        # candidate recall against brute-force exact NN
        alive_a, alive_b = np.flatnonzero(ma.alive), np.flatnonzero(mb.alive)
        src = np.random.default_rng(seed).choice(alive_a, min(recall_sources, len(alive_a)), replace=False)
        pairs = np.stack([np.repeat(src, len(alive_b)), np.tile(alive_b, len(src))], 1)
        t0 = time.perf_counter()
        full = _exact_parallel(ma, mb, pairs, n_jobs).reshape(len(src), len(alive_b))
        res["brute_force_s_per_source"] = (time.perf_counter() - t0) / len(src)
        true_nn = alive_b[np.argmin(full, 1)]
        P = sliced_proxy(ma, mb)
        P[~ma.alive] = np.inf
        P[:, ~mb.alive] = np.inf
        cand = candidate_pairs(P, candidates)
        cset = set(map(tuple, cand.tolist()))
        res["candidate_recall"] = float(np.mean([(int(i), int(j)) in cset for i, j in zip(src, true_nn)]))
        res["candidate_recall_by_c"] = {}
        for c in (8, 16, 32, 64):
            cs = set(map(tuple, candidate_pairs(P, c).tolist()))
            res["candidate_recall_by_c"][c] = {"recall": float(np.mean([(int(i), int(j)) in cs
                                                                         for i, j in zip(src, true_nn)])),
                                               "pairs": len(cs)}
        res["candidate_nn_equals_true_nn"] = float(np.mean(np.argmin(r.D[src], 1) == true_nn))
        res["by_prefilter"] = {}
        for pf in prefilters:
            t0 = time.perf_counter()
            Pp = prefilter_matrix(ma, mb, pf)
            prox_s = time.perf_counter() - t0
            Pp[~ma.alive] = np.inf
            Pp[:, ~mb.alive] = np.inf
            by_c = {}
            for c in (4, 8, 12, 16, 24, 32, 64):
                cs = set(map(tuple, candidate_pairs(Pp, c).tolist()))
                by_c[c] = {"recall": float(np.mean([(int(i), int(j)) in cs for i, j in zip(src, true_nn)])),
                           "pairs": len(cs)}
            ok = [c for c in by_c if by_c[c]["recall"] >= 0.95]
            c_use = min(ok) if ok else max(by_c)
            t0, c0 = time.perf_counter(), _cpu()
            rr = pairwise_w2(ma, mb, "exact", candidates=c_use, prefilter=pf, n_jobs=n_jobs)
            # exact_s includes the pre-filter (pairwise_w2 computes it again): the whole "exact on
            # candidates, all pairs" figure, with all cores
            res["by_prefilter"][pf] = {"proxy_s": prox_s, "recall_by_c": by_c, "timed_candidates": c_use,
                                       "exact_s": time.perf_counter() - t0, "exact_cpu_s": _cpu() - c0,
                                       "stages_s": rr.seconds, "jobs": n_jobs or default_jobs(),
                                       "pairs": int(rr.evaluated), "recall": by_c[c_use]["recall"],
                                       "nn_equals_true_nn": float(np.mean(np.argmin(rr.D[src], 1) == true_nn))}
            log(f"[{space}] prefilter {pf}: recall by c " + " ".join(f"{c}:{v['recall']:.2f}" for c, v in by_c.items())
                + f"; exact on {rr.evaluated} pairs (c={c_use}) {res['by_prefilter'][pf]['exact_s']:.1f} s "
                  f"(recall {by_c[c_use]['recall']:.2f})")
        res["recall_sources"] = int(len(src))
        res["true_nn"] = true_nn.tolist()
        res["recall_src"] = src.tolist()
        if pruned:  # exact NN by lower-bound pruning (the relaxed bound keeps it to a few pairs per source)
            t0 = time.perf_counter()
            nn, _, evaluated = nearest_w2(ma.subset(src), mb)
            res["pruned_exact_nn_s_per_source"] = (time.perf_counter() - t0) / len(src)
            res["pruned_exact_nn_evaluated_fraction"] = evaluated / (len(src) * len(alive_b))
            res["pruned_nn_equals_brute_force"] = float(np.mean(nn == true_nn))
            log(f"[{space}] candidate recall {res['candidate_recall']:.2f} on {len(src)} sources; pruned exact NN "
                f"evaluates {res['pruned_exact_nn_evaluated_fraction']:.0%} of pairs")
        if space == "reference" and legacy_rev:
            leg = _legacy_wasserstein(legacy_rev)
            if leg is not None:
                la, lb = leg.measures(A.dists, A.Z.astype(np.float64)), leg.measures(B.dists, B.Z.astype(np.float64))
                t0, c0 = time.perf_counter(), _cpu()
                leg.pairwise_w2(la, lb, "sliced")
                res["legacy_sliced_all_pairs_s"] = time.perf_counter() - t0
                res["legacy_sliced_all_pairs_cpu_s"] = _cpu() - c0
                sel = cand[rng.choice(len(cand), min(legacy_exact_sample, len(cand)), replace=False)]
                t0, c0 = time.perf_counter(), _cpu()
                leg.w2_pairs(la, lb, sel, "exact")
                dt = time.perf_counter() - t0
                res["legacy_exact_candidates_s_extrapolated"] = dt / len(sel) * len(cand)
                res["legacy_exact_candidates_cpu_s_extrapolated"] = (_cpu() - c0) / len(sel) * len(cand)
                res["legacy_exact_timed_pairs"] = int(len(sel))
                log(f"[legacy {legacy_rev}] sliced {res['legacy_sliced_all_pairs_s']:.1f} s; exact on candidates "
                    f"{res['legacy_exact_candidates_s_extrapolated']:.1f} s (extrapolated from {len(sel)} pairs)")
                del la, lb
        out["spaces"][space] = res
        del ma, mb, A, B
    # does PCA-64 change the nearest neighbours? (same sources, brute force in both spaces)
    if "reference" in out["spaces"] and "pca" in out["spaces"]:
        ref, pca = out["spaces"]["reference"], out["spaces"]["pca"]
        out["pca_true_nn_agreement"] = float(np.mean(np.array(ref["true_nn"]) == np.array(pca["true_nn"])))
    return out


def disjoint_recovery(seeds=range(6), n_features: int = 64, n_tokens: int = 4000, k: int = 32, margin: float = 0.5,
                      drift: float = 1.5, progress: bool = True) -> dict:
    """Planted-match recovery when the two layers see *disjoint* tokens (and, for contrast, the
    same tokens).  Truth is known; per method and matching strategy: accuracy with a bootstrap CI
    over (seed, feature).  Activation correlation needs shared tokens: chance on disjoint ones."""
    from tqdm.auto import tqdm  # lazy: tqdm.auto (0.3 s) keeps --help fast

    names = ["ot-exact", "ot-sinkhorn-debiased", "ot-sliced", "decoder-cosine", "sae-match", "act-corr"]
    out = {"params": {"n_features": n_features, "n_tokens": n_tokens, "k": k, "margin": margin, "drift": drift,
                      "seeds": list(seeds), "chance": 1.0 / n_features}, "settings": {}}
    for disjoint in (False, True):
        hits = {n: {"nn": [], "hungarian": []} for n in names}
        for seed in tqdm(list(seeds), disable=not progress, desc=f"planted, disjoint={disjoint}"):
            pp = planted_pair(n_features=n_features, n_tokens=n_tokens, k=k, margin=margin, drift=drift, seed=seed,
                              disjoint=disjoint)
            for n in names:
                if n == "act-corr" and disjoint:
                    rng = np.random.default_rng(seed)  # undefined without shared tokens: a random match
                    D = rng.random((n_features, n_features))
                elif n.startswith("ot-"):
                    D = distance_matrix("ot", pp.A, pp.B, solver=n[3:], candidates=None).D
                else:
                    D = distance_matrix(n, pp.A, pp.B).D
                for s in ("nn", "hungarian"):
                    m = match(D, s)
                    ok = np.zeros(n_features)
                    ok[m.src] = (pp.perm[m.src] == m.tgt)
                    hits[n][s].extend(ok.tolist())
        out["settings"]["disjoint" if disjoint else "shared"] = {
            n: {s: bootstrap_ci(v) for s, v in hs.items()} for n, hs in hits.items()}
    return out


def planted_geometry(seeds=range(2), geometries=None, n_features: int = 64, n_tokens: int = 4000, k: int = 32,
                     margin: float = 0.5, drift: float = 1.5, outlier_dims: int = 4, outlier_scale: float = 10.0,
                     norm_sigma: float = 0.5, solvers=("exact", "sliced"), hubness=("none", "csls"),
                     progress: bool = True) -> dict:
    """Planted-match recovery under realistic residual-stream geometry (meaning-free outlier
    dimensions, log-normal per-token norms), shared and disjoint tokens, for every geometry
    option x OT solver x hubness correction, with decoder cosine as the geometry-free reference.
    NN and Hungarian accuracy with bootstrap CIs over (seed, feature), and the NN in-degree hubs."""
    from tqdm.auto import tqdm  # lazy: tqdm.auto (0.3 s) keeps --help fast

    geometries = list(geometries or GEOMETRIES)
    out = {"params": {"n_features": n_features, "n_tokens": n_tokens, "k": k, "margin": margin, "drift": drift,
                      "outlier_dims": outlier_dims, "outlier_scale": outlier_scale, "norm_sigma": norm_sigma,
                      "seeds": list(seeds), "chance": 1.0 / n_features}, "settings": {}}
    for disjoint in (False, True):
        hits: dict = {}
        hubs: dict = {}
        for seed in tqdm(list(seeds), disable=not progress, desc=f"planted geometry, disjoint={disjoint}"):
            pp = planted_pair(n_features=n_features, n_tokens=n_tokens, k=k, margin=margin, drift=drift, seed=seed,
                              disjoint=disjoint, outlier_dims=outlier_dims, outlier_scale=outlier_scale,
                              norm_sigma=norm_sigma)
            mats = {"decoder-cosine": distance_matrix("decoder-cosine", pp.A, pp.B).D}
            for g in geometries:
                geo = Geometry.fit(pp.B.Z, g)  # fitted on the target layer's tokens, as in `saeot evaluate`
                Zb = geo(pp.B.Z)
                Za = Zb if pp.A.Z is pp.B.Z else geo(pp.A.Z)
                A = LayerFeatures(W_dec=pp.A.W_dec, acts=pp.A.acts, Z=Za, W_enc=pp.A.W_enc, k=k)
                B = LayerFeatures(W_dec=pp.B.W_dec, acts=pp.B.acts, Z=Zb, W_enc=pp.B.W_enc, k=k)
                for sv in solvers:
                    mats[f"ot-{sv}[{g}]"] = distance_matrix("ot", A, B, solver=sv, candidates=None).D
            for name in list(mats):
                if "csls" in hubness:
                    mats[name + "+csls"] = csls(mats[name])
                if "none" not in hubness and not name.endswith("+csls"):
                    del mats[name]
            for name, D in mats.items():
                for s in ("nn", "hungarian"):
                    m = match(D, s)
                    ok = np.zeros(n_features)
                    ok[m.src] = pp.perm[m.src] == m.tgt
                    hits.setdefault(name, {}).setdefault(s, []).extend(ok.tolist())
                hubs.setdefault(name, []).append(in_degree_stats(match(D, "nn").tgt, n_features)["max_in_degree"])
        out["settings"]["disjoint" if disjoint else "shared"] = {
            n: {**{s: bootstrap_ci(v) for s, v in hs.items()}, "max_in_degree": float(np.mean(hubs[n]))}
            for n, hs in hits.items()}
    return out


MARGIN_METHODS = ("ot-exact", "decoder-cosine", "sae-match", "sae-match-folded", "act-corr")


def margin_sweep(margins=(0.1, 0.2, 0.35, 0.5, 1.0, 2.0), seeds=range(3), n_features: int = 64, n_tokens: int = 4000,
                 k: int = 32, drift: float = 1.5, methods=MARGIN_METHODS, progress: bool = True) -> dict:
    """Planted-match recovery vs the margin between concept centres (units of the within-concept
    noise), shared and disjoint tokens: per method, NN and Hungarian accuracy with a bootstrap
    CI over (seed, feature).  The margin is the only knob: decoder drift, spurious firings and
    corpus size stay fixed, so the curve says how much geometric separation OT needs.
    ``sae-match-folded`` is reported with its published one-to-one matching (its "nn" entry is
    nearest neighbour on the same folded distances, for comparison); act-corr on disjoint tokens
    is undefined and left out."""
    from tqdm.auto import tqdm  # lazy: tqdm.auto (0.3 s) keeps --help fast

    out = {"params": {"margins": list(margins), "n_features": n_features, "n_tokens": n_tokens, "k": k,
                      "drift": drift, "seeds": list(seeds), "chance": 1.0 / n_features}, "settings": {}}
    for disjoint in (False, True):
        per = {}
        for margin in tqdm(list(margins), disable=not progress, desc=f"margin sweep, disjoint={disjoint}"):
            hits = {n: {"nn": [], "hungarian": []} for n in methods if not (disjoint and n == "act-corr")}
            secs = {n: 0.0 for n in hits}
            for seed in seeds:
                pp = planted_pair(n_features=n_features, n_tokens=n_tokens, k=k, margin=margin, drift=drift,
                                  seed=seed, disjoint=disjoint)
                for n in hits:
                    t0 = time.perf_counter()
                    D = distance_matrix("ot" if n.startswith("ot-") else n, pp.A, pp.B,
                                        **({"solver": n[3:], "candidates": None} if n.startswith("ot-") else {})).D
                    secs[n] += time.perf_counter() - t0
                    for s in ("nn", "hungarian"):
                        m = match(D, s)
                        ok = np.zeros(n_features)
                        ok[m.src] = pp.perm[m.src] == m.tgt
                        hits[n][s].extend(ok.tolist())
            per[str(margin)] = {n: {**{s: bootstrap_ci(v) for s, v in hs.items()},
                                    "seconds_per_pair_of_layers": secs[n] / len(list(seeds))}
                                for n, hs in hits.items()}
        out["settings"]["disjoint" if disjoint else "shared"] = per
    return out
