"""Old vs new decoder on one Klein-sized synthetic layer, side by side (issue 17).

Run once per source tree, e.g. from the repository root:
    PYTHONPATH=<tree of main before issue 17>/src .venv/bin/python docs/codec/native_side_by_side.py
    PYTHONPATH=src .venv/bin/python docs/codec/native_side_by_side.py
Prints bits/value and fp16 KV MB per thread-CPU second (best of 3) per rung / level.
"""

import time

import torch

from sakura.bench.decode_rates import klein_layer
from sakura.codec import ShardId, codec_from_spec

torch.set_num_threads(1)
T = 1024
shard = klein_layer(T)
ident = ShardId("bench", "klein", 5)
for spec in ("progressive", "cachegen:level=3", "cachegen:level=1"):
    c = codec_from_spec(spec)
    tables = c.fit_tables([shard])
    data = c.encode(shard, ident, tables)
    ends = c.level_ends(data) if c.supports_layers else [len(data)]
    for rung, end in enumerate(ends):
        c.decode(data[:end], ident, tables)
        best = float("inf")
        for _ in range(3):
            t = time.thread_time()
            c.decode(data[:end], ident, tables)
            best = min(best, time.thread_time() - t)
        print(f"{spec} rung {rung}: {8 * end / shard.num_values:.4f} bits/value, "
              f"{shard.fp16_bytes / best / 1e6:.0f} MB/CPU-s")
