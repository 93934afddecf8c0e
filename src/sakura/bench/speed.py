"""On-device CPU timings of the bundled models side by side (`sakura bench speed`, docs/model-flux2/speed.md):
template compute, and an edit with KV injected, EXTRACT (template in the sequence at step 0) and
NOCACHE (template at every step); models interleaved per round, median over rounds; then the
runtime's per-layer profile of each model."""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence
from sakura.util.fsutil import write_json
import torch
from sakura.cloud.tasks import get_template, heldout_photos
from sakura.models import load_model
from sakura.phone.live import profile_model

from sakura.bench.harness import get_logger

log = get_logger(__name__)

MODELS = ("sakura-mini", "flux2-mini")


def run(models: Sequence[str] = MODELS, template: str = "sticker-h0", rounds: int = 3, steps: int = 8,
        out: Path | None = None) -> dict:
    """Returns {model: {template_s, injected_s, extract_s, nocache_s (medians), profile_compute_s,
    profile_local_s, template_kv_bytes_fp16}}; written as JSON to `out` if given."""


    loaded = {n: load_model(n) for n in models}
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for n, m in loaded.items():
            size = m.cfg.image_size
            photo, tpl = heldout_photos(size)[:1], get_template(template, size)
            ref = tpl.image[None]
            kv = m.extract_template_kv(ref, tpl.instruction)
            runs = {"template_s": lambda: m.template_stream(ref, tpl.instruction),
                    "injected_s": lambda: m.edit(photo, template_kv=kv, steps=steps),
                    "extract_s": lambda: m.edit(photo, template=ref, instruction=tpl.instruction, mode="extract",
                                                steps=steps),
                    "nocache_s": lambda: m.edit(photo, template=ref, instruction=tpl.instruction, mode="nocache",
                                                steps=steps)}
            with torch.no_grad():
                for k, f in runs.items():
                    t = time.perf_counter()
                    f()
                    times.setdefault((n, k), []).append(time.perf_counter() - t)
    res: dict = {"template": template, "steps": steps, "rounds": rounds, "torch_threads": torch.get_num_threads(),
                 "load_avg_1min": os.getloadavg()[0], "models": {}}
    for n, m in loaded.items():
        p = profile_model(m)
        r = {k: statistics.median(times[(n, k)]) for k in ("template_s", "injected_s", "extract_s", "nocache_s")}
        r.update(profile_compute_s=p.compute_s, profile_local_s=p.local_s,
                 template_kv_bytes_fp16=m.describe()["template_kv_bytes_fp16"])
        res["models"][n] = r
        log.info(f"{n:12s} template {r['template_s'] * 1e3:7.1f} ms | edit {steps} steps: injected "
            f"{r['injected_s'] * 1e3:7.1f} ms, extract {r['extract_s'] * 1e3:7.1f} ms, nocache "
            f"{r['nocache_s'] * 1e3:7.1f} ms | profile per layer: compute {p.compute_s * 1e3:.2f} ms, local "
            f"template {p.local_s * 1e3:.2f} ms")
    log.info(f"(median of {rounds} rounds, load {res['load_avg_1min']:.1f})")
    if out is not None:
        write_json(Path(out), res, indent=1)
    return res
