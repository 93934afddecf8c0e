"""Benchmarks: planted-match recovery vs samples (synthetic), and method comparison on real layers."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from saeot.matching import match
from saeot.methods import METHODS, distance_matrix
from saeot.synthetic import planted_pair


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
    from tqdm.auto import tqdm

    names = ["ot-exact", "ot-sinkhorn", "ot-sliced"] + [m for m in METHODS if m != "ot"]
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=float))
    tmp.replace(path)
    return path


def timing_all_pairs(A, B, candidates: int = 32, progress: bool = True, sinkhorn_sample: int = 8192) -> dict:
    """Wall time for all pairs between two layers with every OT solver.

    sliced: all pairs, measured.  exact: pre-filtered to ``candidates`` per feature, measured.
    Sinkhorn: the same candidate pairs, timed on ``sinkhorn_sample`` of them and extrapolated.
    """
    from saeot.wasserstein import measures, w2_pairs

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
    from saeot.collect import load_activations
    from saeot.matching import Matching
    from saeot.pipeline import compare_methods, layer_pair, top_token_overlap
    from saeot.sae import load_sae
    from saeot.wasserstein import measures, nearest_w2, w2_pairs

    tokens = load_activations(acts_dir, "tokens")
    rng = np.random.default_rng(seed)
    out = {}
    for la, lb in pairs:
        A, B = layer_pair(acts_dir, load_sae(Path(saes_dir) / f"layer_{la}"), load_sae(Path(saes_dir) / f"layer_{lb}"),
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
        from saeot.wasserstein import Measures

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
