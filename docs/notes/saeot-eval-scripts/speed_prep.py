# cache the 9->18 measures (standardise+unit, k=32) and brute-force exact NN of 64 sources
import numpy as np, time
from pathlib import Path
from saeot.pipeline import layer_pair
from saeot.sae import load_sae
from saeot.wasserstein import measures, _exact_block
sa, sb = load_sae(Path("runs/saes80k/layer_9")), load_sae(Path("runs/saes80k/layer_18"))
A, B = layer_pair(Path("runs/acts80k"), sa, sb, 9, 18, k=32, geometry="standardise+unit")
assert A.Z is B.Z
np.savez("runs/speed/m.npz", Z=A.Z, ia=A.dists.index, wa=A.dists.weight, ib=B.dists.index, wb=B.dists.weight)
ma, mb = measures(A.dists, A.Z), measures(B.dists, B.Z)
alive_a, alive_b = np.flatnonzero(ma.alive), np.flatnonzero(mb.alive)
src = np.random.default_rng(0).choice(alive_a, 64, replace=False)
t=time.perf_counter()
pairs = np.stack([np.repeat(src, len(alive_b)), np.tile(alive_b, len(src))], 1)
full = _exact_block(ma, mb, pairs).reshape(len(src), len(alive_b))
print("brute", time.perf_counter()-t, "s for", len(pairs))
np.savez("runs/speed/truth.npz", src=src, alive_b=alive_b, full=full)
