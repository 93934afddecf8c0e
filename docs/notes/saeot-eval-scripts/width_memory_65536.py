"""Issue 44: the 65,536-feature plan's resident inputs, measured: both synthetic layers (d = 2,304,
float16 token pool), their PCA-sliced embeddings and the upper-bound probe's centroids and spreads:
everything all_pairs_nn holds besides the 128 MB search tile and the candidate pairs.  The
candidate search itself (F^2) and the exact stage are not run (hours on 2 loaded cores).  Runnable:

    PYTHONPATH=src OMP_NUM_THREADS=1 python docs/notes/saeot-eval-scripts/width_memory_65536.py 65536 2304

Prints one JSON line (figures in docs/saeot.md's width section)."""
import json
import sys
import time

import numpy as np

from saeot.width import _embed, memory_plan, peak_rss_bytes, synthetic_layers, upper_bound_embedding

F, d = int(sys.argv[1]), int(sys.argv[2])
out = {"n_features": F, "d": d, "peak_rss_start": peak_rss_bytes()}
t = time.perf_counter()
ma, mb = synthetic_layers(F, d=d, seed=0, cover=False, dtype=np.float16)
out["seconds_build"], out["peak_rss_after_layers"] = time.perf_counter() - t, peak_rss_bytes()
t = time.perf_counter()
ea, eb = _embed(ma, mb, "pca-sliced", 64, 16)
out["seconds_embed"], out["peak_rss_after_embed"] = time.perf_counter() - t, peak_rss_bytes()
t = time.perf_counter()
(ca, sa), (cb, sb) = upper_bound_embedding(ma), upper_bound_embedding(mb)
out["seconds_upper_probe_inputs"], out["peak_rss_after_probe_inputs"] = time.perf_counter() - t, peak_rss_bytes()
out["bytes"] = {"token_pool": int(ma.Z.nbytes), "indices_weights_per_layer": int(ma.index.nbytes + ma.w.nbytes),
                "embedding_per_layer": int(ea.nbytes), "centroids_per_layer": int(ca.nbytes)}
out["plan"] = memory_plan(F, d, n_tokens=len(ma.Z))
print(json.dumps(out))
