"""A synthetic store (random bytes standing in for encoded KV) for tests and the load benchmark.

It exercises every manifest feature (ladder, shared tables, template reference) without the codec
or the model adapter. The bytes are seeded random, so two calls with the same arguments produce
byte-identical stores.
"""

from __future__ import annotations

import os
import random

from sakura.wire.store.store import RenditionInput, StoreWriter

#: Ladder used by the synthetic store: (name, codec, fraction of the fp16 size, distortion).
LADDER = (
    ("fp16", "raw-fp16", 1.0, 0.0),
    ("int8", "synthetic-q8", 0.5, 1e-4),
    ("mix4/2", "synthetic-mix", 0.19, 2e-3),
)


def make_synthetic_store(root: str | os.PathLike[str], *, templates: int = 2, layers: int = 4,
                         tokens: int = 64, width: int = 128, model_fingerprint: str = "synthetic-model",
                         seed: int = 0) -> list[str]:
    """Write ``templates`` templates of ``layers`` shards each; returns the template ids.

    Shard ``l`` stands for layer ``l``'s K+V of ``tokens`` x ``width`` values, so its fp16 size is
    ``2 * tokens * width * 2`` bytes; renditions are random bytes of the ladder's fractions of it.
    """
    rng = random.Random(seed)
    table = rng.randbytes(4096)  # shared by every template: stored once (dedup by content)
    ids = []
    for t in range(templates):
        tid = f"tpl-{t:03d}"
        with StoreWriter(root, model_fingerprint=model_fingerprint, template_id=tid) as w:
            w.set_template_ref(rng.randbytes(1024 + t), media_type="application/x-synthetic-latent")
            w.add_table("ans/shared", codec="synthetic-ans", data=table, params={"symbols": 256})
            fp16 = 2 * tokens * width * 2
            for layer in range(layers):
                w.add_shard(layer=layer, tokens=(0, tokens), fp16_bytes=fp16, renditions=[
                    RenditionInput(name=name, codec=codec, data=rng.randbytes(max(1, int(fp16 * frac))),
                                   params={"bits": 16 if frac == 1.0 else 8}, distortion={"kv_rel_mse": d} if d else {},
                                   tables=("ans/shared",) if name == "mix4/2" else ())
                    for name, codec, frac, d in LADDER])
            w.set_kv_layout({"layers": layers, "tokens": tokens, "width": width, "dtype": "fp16"})
        ids.append(tid)
    return ids
