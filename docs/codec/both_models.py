"""Per-shard renditions on both trained models: bits/value, one-shard image PSNR, decode rate.

Run: OMP_NUM_THREADS=1 .venv/bin/python docs/codec/both_models.py  (writes both_models.md/.json here)
"""
import json, math
from sakura.bench.profile import measure_ladder
rows=[]
out={}
for model in ("sakura-mini","flux2-mini"):
    for tpl in ("look-00","texture-00","sticker-00"):
        lad=measure_ladder(model, tpl, log=lambda s: None)
        out[f"{model}/{tpl}"]=lad
        for name,r in lad["renditions"].items():
            if name.endswith("delta=true"): continue
            ps = math.inf if r["image_mse"]<=0 else 10*math.log10(1/r["image_mse"])
            rows.append((model,tpl,name,r["bits_per_value"],ps,r["decode_fp16_bytes_per_cpu_s"]/1e6))
        print(model, tpl, "done", flush=True)
json.dump(out, open("docs/codec/both_models.json","w"), indent=1, default=float)
lines=["Per-shard renditions on both trained models (`docs/codec/both_models.py`, built on `sakura.bench.profile.measure_ladder`), training templates `*-00`, public calibration photos; image PSNR = the edit with ONE shard replaced by the rendition vs the lossless-KV edit, mean over the model's 6 shards (so it is far above an all-shards figure); bits/value count every byte of the object; decode = fp16 MB per CPU-second on a Klein-sized layer.","",
       "| model | template | rendition | bits/value | one-shard image PSNR (dB) | decode MB/s |","|---|---|---|---:|---:|---:|"]
for m,t,n,b,p,d in rows:
    lines.append(f"| {m} | {t} | `{n}` | {b:.2f} | {'inf' if math.isinf(p) else f'{p:.1f}'} | {d:.0f} |")
open("docs/codec/both_models.md","w").write("\n".join(lines)+"\n")
print("\n".join(lines))
