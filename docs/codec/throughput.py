"""Decode throughput on Klein-sized layers: iid tokens (pessimistic) and a spatially smooth field.

Run: PYTHONPATH=src python docs/codec/throughput.py docs/codec/throughput.json
"""
import json, sys, torch
torch.set_num_threads(1)
from sakura.codec import ShardKV
from sakura.bench.codec import synthetic_layer, throughput, worker_scaling

def smooth_layer(seed=0):
    g = torch.Generator().manual_seed(seed)
    n, C = 32, 24 * 128
    f = torch.randn(2, C, n, n, generator=g)
    for _ in range(3):
        f = torch.nn.functional.avg_pool2d(f, 3, 1, 1)
    f = f / f.std() + 0.3 * torch.randn(2, C, n, n, generator=g)
    kv = f.reshape(2, C, n * n).permute(0, 2, 1).reshape(2, n * n, 24, 128)
    off = 1.5 * torch.randn(1, 24, 128, generator=g)
    return ShardKV((kv[0] + off).half(), kv[1].half(), layer=5, num_layers=25)

out = {}
for name, layer in (("iid", synthetic_layer(1024, 24, 128)), ("smooth", smooth_layer())):
    out[name] = throughput(["progressive", 'sakura:budget=0.5,quantiser="ecsq",transform="dct"', "cachegen:level=3",
                            "cachegen:level=3,delta=true"], layer, repeats=3)
    for r in out[name]:
        print(name, json.dumps(r), flush=True)
out["workers_smooth"] = worker_scaling("progressive", smooth_layer(), workers=(1, 2, 4), layers=8)
print(json.dumps(out["workers_smooth"]))
json.dump(out, open(sys.argv[1], "w"), indent=1)
