# Issue 20 speed target: exact W2 on bound-mid candidates (16 per feature, rows + columns), all pairs of 9 -> 18
# (4,096 x 4,096 features, standardise+unit, k = 32, d = 640). The numba transport simplex on 2 and 1 threads
# and POT's network simplex side by side on the same pairs; the recall of the exact NN on the 64 sources
# brute-forced by speed_truth.py. Inputs: runs/speed/m.npz (speed_prep.py), runs/speed/truth.npz.
# Run: OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python docs/saeot/eval/scripts/speed4.py docs/saeot/speed_r4.json
import json, os, sys, time

import numpy as np
import torch  # noqa: F401  (imported before timing: the sliced embedding's searchsorted uses it)

from saeot.distributions import FeatureDistributions
from saeot.wasserstein import _exact_parallel, candidate_pairs, measures, prefilter_matrix

d = np.load("runs/speed/m.npz"); t = np.load("runs/speed/truth.npz"); Z = d["Z"]
ma = measures(FeatureDistributions(d["ia"], d["wa"], d["wa"]), Z)
mb = measures(FeatureDistributions(d["ib"], d["wb"], d["wb"]), Z)
true_nn = t["alive_b"][np.argmin(t["full"], 1)]
_exact_parallel(ma, mb, np.array([[0, 0], [1, 1]]), 1)  # compile (numba disk cache) and imports
out = {"pair": "9->18", "features": [len(ma.w), len(mb.w)], "k": 32, "d": int(Z.shape[1]), "candidates": 16,
       "prefilter": "bound-mid", "recall_sources": len(true_nn), "cores": os.cpu_count(), "runs": []}
t0, c0 = time.perf_counter(), time.process_time()
P = prefilter_matrix(ma, mb, "bound-mid"); P[~ma.alive] = np.inf; P[:, ~mb.alive] = np.inf
pairs = candidate_pairs(P, 16)
out["prefilter_s"] = {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0, "load": os.getloadavg()[0]}
out["pairs"] = len(pairs)
res = {}
for be, jobs in (("numba", 2), ("numba", 1), ("pot", 1)):
    t0, c0 = time.perf_counter(), time.process_time()
    v = _exact_parallel(ma, mb, pairs, jobs, backend=be)
    w, c = time.perf_counter() - t0, time.process_time() - c0
    res[(be, jobs)] = v
    D = np.full(P.shape, np.inf); D[pairs[:, 0], pairs[:, 1]] = v
    rec = float(np.mean(np.argmin(D[t["src"]], 1) == true_nn))
    r = {"solver": be, "threads": jobs, "solve_wall_s": w, "solve_cpu_s": c,
         "total_wall_s": w + out["prefilter_s"]["wall"], "total_cpu_s": c + out["prefilter_s"]["cpu"],
         "recall": rec, "load": os.getloadavg()[0]}
    out["runs"].append(r)
    print(f"{be} x{jobs}: {len(pairs)} pairs, total wall {r['total_wall_s']:.1f} s, CPU {r['total_cpu_s']:.1f} s "
          f"(pre-filter {out['prefilter_s']['cpu']:.1f} s CPU), recall {rec:.3f} on {len(true_nn)} sources, "
          f"load {r['load']:.1f}", flush=True)
out["max_abs_w2_numba_minus_pot"] = float(np.max(np.abs(res[("numba", 1)] - res[("pot", 1)])))
out["numba_2_threads_equals_1"] = bool(np.array_equal(res[("numba", 2)], res[("numba", 1)]))
print(f"max |W2 numba - W2 POT| = {out['max_abs_w2_numba_minus_pot']:.2e}")
from saeot.fsutil import atomic_write
atomic_write(sys.argv[1], json.dumps(out, indent=1).encode())
