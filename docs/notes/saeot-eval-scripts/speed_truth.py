# brute-force exact W2 of 64 random alive sources against every alive target (9->18, standardise+unit, k=32)
import numpy as np, time
from saeot.wasserstein import measures, _exact_block
from saeot.distributions import FeatureDistributions
d = np.load("runs/speed/m.npz"); Z = d["Z"]
ma = measures(FeatureDistributions(d["ia"], d["wa"], d["wa"]), Z)
mb = measures(FeatureDistributions(d["ib"], d["wb"], d["wb"]), Z)
alive_a, alive_b = np.flatnonzero(ma.alive), np.flatnonzero(mb.alive)
src = np.random.default_rng(0).choice(alive_a, 64, replace=False)
rows = []
t = time.perf_counter()
for s in range(0, 64, 8):
    pairs = np.stack([np.repeat(src[s:s+8], len(alive_b)), np.tile(alive_b, 8)], 1)
    rows.append(_exact_block(ma, mb, pairs).reshape(8, len(alive_b)))
    np.savez("runs/speed/truth.npz", src=src[:s+8], alive_b=alive_b, full=np.concatenate(rows))
    print(s + 8, "sources", time.perf_counter() - t, flush=True)
