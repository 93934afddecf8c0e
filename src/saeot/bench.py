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
                     margin: float = 0.5, drift: float = 1.5, progress: bool = True) -> dict:
    """Recovery accuracy (NN and Hungarian) of every method vs top-k sample count.

    Returns
    -------
    dict  {"ks": [...], "methods": {name: {"nn": [mean acc per k], "hungarian": [...]}}, "params": {...}}
    """
    from tqdm.auto import tqdm

    names = ["ot-exact", "ot-sinkhorn", "ot-sliced"] + [m for m in METHODS if m != "ot"]
    res = {n: {"nn": [], "hungarian": []} for n in names}
    for k in tqdm(ks, disable=not progress, desc="planted recovery"):
        acc = {n: {"nn": [], "hungarian": []} for n in names}
        for seed in seeds:
            pp = planted_pair(n_features=n_features, n_tokens=n_tokens, k=k, margin=margin, drift=drift, seed=seed)
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
    return {"ks": list(ks), "methods": res,
            "params": {"n_features": n_features, "n_tokens": n_tokens, "margin": margin, "drift": drift,
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
    ax.set_xlabel("samples per feature (top-k support size)")
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


def timing_all_pairs(A, B, candidates: int = 32, progress: bool = True) -> dict:
    """Wall time for all pairs between two layers with every OT solver (exact: pre-filtered)."""
    out = {}
    for solver, cand in (("sliced", None), ("exact", candidates), ("sinkhorn", candidates)):
        t0 = time.perf_counter()
        r = distance_matrix("ot", A, B, solver=solver, candidates=cand, progress=progress)
        out[f"ot-{solver}"] = {"seconds": time.perf_counter() - t0, "evaluated_pairs": r.evaluated,
                               "stages": r.seconds}
    return out
