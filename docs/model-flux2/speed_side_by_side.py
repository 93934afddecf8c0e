"""Side-by-side CPU timings of the two bundled models (see speed.md). Run from the repo root:
    OMP_NUM_THREADS=1 python docs/model-flux2/speed_side_by_side.py
"""
import time, torch, statistics
torch.set_num_threads(1)
from sakura.models import load_model
from sakura.runtime.stream import profile_model
from sakura.tasks import get_template, heldout_photos
res = {}
models = {n: load_model(n) for n in ("sakura-mini", "flux2-mini")}
photo = heldout_photos(64)[:1]
tpl = get_template("sticker-h0", 64)
for rnd in range(3):
    for n, m in models.items():
        kv = m.extract_template_kv(tpl.image[None], tpl.instruction)
        t = time.perf_counter(); m.template_stream(tpl.image[None], tpl.instruction); tt = time.perf_counter() - t
        t = time.perf_counter(); m.edit(photo, template_kv=kv, steps=8); inj = time.perf_counter() - t
        t = time.perf_counter(); m.edit(photo, template=tpl.image[None], instruction=tpl.instruction, mode="extract", steps=8); ext = time.perf_counter() - t
        t = time.perf_counter(); m.edit(photo, template=tpl.image[None], instruction=tpl.instruction, mode="nocache", steps=8); noc = time.perf_counter() - t
        for k, v in (("template_s", tt), ("injected_8_s", inj), ("extract_8_s", ext), ("nocache_8_s", noc)):
            res.setdefault((n, k), []).append(v)
for (n, k), v in res.items(): print(f"{n:12s} {k:14s} median {statistics.median(v)*1000:7.1f} ms")
for n, m in models.items():
    p = profile_model(m); print(n, "profile per layer: compute", round(p.compute_s*1000, 2), "ms, local template", round(p.local_s*1000, 2), "ms; KV fp16", m.describe()["template_kv_bytes_fp16"], "B")
