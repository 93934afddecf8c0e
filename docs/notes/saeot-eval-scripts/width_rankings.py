"""Issue 44: how well each cheap score ranks the exact W2 nearest neighbour on the hard (uncovered)
synthetic case; the figures in docs/saeot.md's width section.  Runnable:

    PYTHONPATH=src python docs/notes/saeot-eval-scripts/width_rankings.py 4096 640 512

(F features per layer, reference dimension d, R sources: the same layers and sources as
`saeot bench-width --widths F --d d --recall-sources R --uncovered`; ~10 min at F = 4,096 on a loaded
2-core VM, most of it the exact nearest neighbours by pruned search.)"""
import sys
import time

import numpy as np

from saeot.wasserstein import _sqdist, nearest_w2, pca_bound_embedding, principal_directions, spread
from saeot.width import _embed, synthetic_layers

F, d, R = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
ma, mb = synthetic_layers(F, d=d, seed=0, cover=False)
rows = np.sort(np.random.default_rng(1).choice(F, R, replace=False))
ea, eb = _embed(ma, mb, "pca-sliced", 64, 16)
t = time.perf_counter()
nn, dist, ev = nearest_w2(ma.subset(rows), mb)
print(f"exact NN of {R} sources: {time.perf_counter() - t:.0f} s, {ev} exact problems", flush=True)
th = principal_directions(ma, mb, 64)
lb2 = _sqdist(pca_bound_embedding(ma, th, 16)[rows], pca_bound_embedding(mb, th, 16))
ub2 = _sqdist(ma.centroid[rows], mb.centroid) + spread(ma)[rows, None] ** 2 + spread(mb)[None, :] ** 2
for name, P in [("pca-sliced embedding (the candidate search's lower bound)", _sqdist(ea[rows], eb)),
                ("pca-bound (lower bound on W2)", lb2), ("bound-mid (LB^2 + UB^2)", lb2 + ub2),
                ("independent-coupling upper bound", ub2)]:
    rank = (P < P[np.arange(R), nn][:, None]).sum(1)  # targets ranked before the exact NN
    print(name, {c: round(float((rank < c).mean()), 3) for c in (8, 16, 32, 64, 128)}, flush=True)
