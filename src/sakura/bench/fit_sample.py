"""The progressive table fit on a channel sample vs the whole part, on real-shape layers.

For each layer (random KV with image KV's structure at FLUX.2 Klein-4B 1024^2's shape: 4096
tokens x 24 heads x 128, a blurred field over the 64 x 64 token grid with log-normal channel
scales, a few outlier channels and heavy-tailed noise), the ladder's tables are fitted twice, once
with every value swept (`FIT_SAMPLE_VALUES` raised past the part) and once on the channel sample
(`progressive.ladder.sample_channels`), then every shard is encoded and decoded at every rung.
Reported per rung: bytes and KV PSNR of both, and the fit's CPU seconds per layer.

    python -m sakura.bench.fit_sample [--layers 2] [--tokens 4096] [--out docs/fit_sample.json]
"""

from __future__ import annotations

import argparse
import time
from typing import Any
from pathlib import Path

import numpy as np
import torch

from sakura.util.psnr import psnr_db  # the one MSE -> dB conversion (KV PSNR: MSE over the peak squared)
from sakura.bench.harness import markdown_table, publish
from sakura.codec import ShardId, ShardKV, codec_from_spec
from sakura.codec.progressive import ladder as PG

#: the ladder spec measured: the default ladder's shape with the allocation by sensitivities (the
#: model allocation's image distortion needs a model; the grid sweep is the same)
SPEC = "progressive:budgets=[0.25,0.5,1.0],allocate=sensitivity"


def klein_like_layer(tokens: int = 4096, heads: int = 24, head_dim: int = 128, layer: int = 0, num_layers: int = 2,
                     seed: int = 0) -> ShardKV:
    """Random fp16 K and V (tokens, heads, head_dim) with image KV's structure (see module doc)."""
    g = torch.Generator().manual_seed(1000 * seed + layer)
    n = int(round(tokens ** 0.5))
    C = heads * head_dim
    out = []
    for kv in range(2):
        rank = 32
        basis = torch.nn.functional.avg_pool2d(torch.randn(1, rank, n, n, generator=g), 5, 1, 2)[0] * 4
        mix = torch.randn(rank, C, generator=g) / rank ** 0.5
        field = basis.reshape(rank, n * n).T @ mix                              # (T, C), smooth in tokens
        # heavy-tailed: a Gaussian scale mixture (log-normal scales), every draw from `g`
        noise = torch.randn(tokens, C, generator=g) * torch.exp(0.5 * torch.randn(tokens, C, generator=g)) * 0.2
        scale = torch.exp(torch.randn(C, generator=g) * 0.7)
        scale[torch.randperm(C, generator=g)[:8]] *= 8.0 if kv == 0 else 1.0    # keys' outlier channels
        x = (field + noise) * scale + (torch.randn(C, generator=g) * 0.5 if kv == 0 else 0.0)
        out.append(x[:tokens].reshape(tokens, heads, head_dim).to(torch.float16))
    return ShardKV(out[0], out[1], layer=layer, num_layers=num_layers, sensitivity=(1.0 + layer, 0.5 + layer))


def _measure(shards: list[ShardKV], sample_values: int) -> dict[str, Any]:
    """Fit (timed) with `FIT_SAMPLE_VALUES` = `sample_values`, then encode / decode every rung."""
    old = PG.FIT_SAMPLE_VALUES
    PG.FIT_SAMPLE_VALUES = sample_values
    try:
        for s in shards:
            s.fit_cache.clear()
        codec = codec_from_spec(SPEC)
        c0, t0 = time.process_time(), time.perf_counter()
        tables = codec.fit_tables(shards)
        fit_cpu, fit_wall = time.process_time() - c0, time.perf_counter() - t0
    finally:
        PG.FIT_SAMPLE_VALUES = old
    rungs: list[dict[str, float]] = []
    for s in shards:
        ident = ShardId("m", "t", s.layer)
        data = codec.encode(s, ident, tables)
        for r, end in enumerate(codec.level_ends(data)):
            dec = codec.decode(data[:end], ident, tables)
            x = torch.cat([s.key.reshape(-1), s.value.reshape(-1)])
            y = torch.cat([dec.key.reshape(-1), dec.value.reshape(-1)])
            if len(rungs) <= r:
                rungs.append({"bytes": 0.0, "sq": 0.0, "peak": 0.0, "n": 0.0})
            rungs[r]["bytes"] += end
            rungs[r]["sq"] += float(((x.double() - y.double()) ** 2).sum())
            rungs[r]["peak"] = max(rungs[r]["peak"], float(x.double().abs().max()))
            rungs[r]["n"] += x.numel()
    out = [{"bytes": int(r["bytes"]), "psnr_db": psnr_db(max(r["sq"] / r["n"], 1e-30) / r["peak"] ** 2)}
           for r in rungs]
    return {"fit_cpu_s_per_layer": fit_cpu / len(shards), "fit_wall_s_per_layer": fit_wall / len(shards),
            "rungs": out, "plans": {k: v.tolist() for k, v in tables.arrays.items() if k.endswith(".plan")}}


def run(layers: int = 2, tokens: int = 4096, heads: int = 24, head_dim: int = 128, seed: int = 0) -> dict[str, Any]:
    shards = [klein_like_layer(tokens, heads, head_dim, layer=i, num_layers=layers, seed=seed) for i in range(layers)]
    PG._deadzone_rd(np.zeros((1, 1)), np.zeros(1, np.int64), 1.0, 1.0)  # compile outside the timings
    full = _measure(shards, 1 << 62)
    sampled = _measure(shards, PG.FIT_SAMPLE_VALUES)
    rows = []
    for r, (a, b) in enumerate(zip(full["rungs"], sampled["rungs"])):
        rows.append({"rung": r, "bytes_full": a["bytes"], "bytes_sampled": b["bytes"],
                     "bytes_change_pct": 100.0 * (b["bytes"] / a["bytes"] - 1.0), "psnr_full_db": a["psnr_db"],
                     "psnr_sampled_db": b["psnr_db"], "psnr_change_db": b["psnr_db"] - a["psnr_db"]})
    return {"layers": layers, "shape": [tokens, heads, head_dim], "spec": SPEC, "sample_values": PG.FIT_SAMPLE_VALUES,
            "fit_cpu_s_per_layer": {"full": full["fit_cpu_s_per_layer"], "sampled": sampled["fit_cpu_s_per_layer"]},
            "fit_wall_s_per_layer": {"full": full["fit_wall_s_per_layer"],
                                     "sampled": sampled["fit_wall_s_per_layer"]},
            "rows": rows, "plans": {"full": full["plans"], "sampled": sampled["plans"]}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    res = run(a.layers, a.tokens, seed=a.seed)
    table = markdown_table(["rung", "bytes full", "bytes sampled", "bytes %", "PSNR full", "PSNR sampled", "PSNR dB"],
                           [[r["rung"], r["bytes_full"], r["bytes_sampled"], f"{r['bytes_change_pct']:+.2f}",
                             f"{r['psnr_full_db']:.2f}", f"{r['psnr_sampled_db']:.2f}", f"{r['psnr_change_db']:+.3f}"]
                            for r in res["rows"]])
    f = res["fit_cpu_s_per_layer"]
    md = f"fit CPU s per layer: full {f['full']:.2f}, sampled {f['sampled']:.2f}\n\n{table}\n"
    print(md)
    if a.out:
        out = Path(a.out)
        publish(out.parent, out.stem, res, md)
    return res


if __name__ == "__main__":
    main()
