# val FVU of a train-sae checkpoint mid-run (early signal only; the lr decay of the last 20% is not done yet)
import sys, numpy as np, torch
from saeot.collect import load_activations
from saeot.evaluate import chunk_split
l, ck = int(sys.argv[1]), sys.argv[2]
X = load_activations("runs/acts80k", l)
sp = chunk_split(load_activations("runs/acts80k", "chunk"))
Xf = np.concatenate([X[sp["fit"]], load_activations("runs/acts-extra", l)], 0).astype(np.float32)
scale = float(np.sqrt((Xf.astype(np.float64) ** 2).sum(1).mean() / Xf.shape[1]))
st = torch.load(ck, weights_only=False)
We, be, Wd, bd = st["params"]
k = st["meta"]["k"]
for part in ("val", "test") if len(sys.argv) > 3 else ("val",):
    x = torch.from_numpy(X[sp[part]] / scale)
    pre = (x - bd) @ We + be
    v, i = torch.topk(pre, k, dim=-1)
    a = torch.zeros_like(pre).scatter_(-1, i, torch.relu(v))
    xh = a @ Wd + bd
    fvu = float(((x - xh) ** 2).sum() / ((x - x.mean(0)) ** 2).sum())
    print(f"layer {l} step {st['step']} k {k} {part} FVU {fvu:.4f}")
