"""`sakura bench codec`: every codec setting on the same template KV, photos and metric; tables and plots.

Per task of the model, on every held-out library template (4 per task) and 6 held-out photos:
  1. capture the template KV (stored as fp16: the reference every codec starts from);
  2. on public calibration photos (crops of training sources, `sakura.cloud.capture`): per-layer K/V
     sensitivities, per-token K/V gradient sensitivity, attention-mass importance;
  3. the lossless-KV edit of the test photos (the reference) and the exact ground truth;
  4. every codec setting: fit tables (per template, or per model for the shared-table variant),
     encode + decode every layer, edit the test photos with the decoded KV; bytes (shards, tables),
     PSNR/SSIM against the lossless-KV output (`sakura.cloud.tasks.quality.psnr_per_image` /
     `ssim_per_image`, mean over photos) and PSNR against the ground truth.
Plus: the whole store a template costs (`sakura build` + `Store.stats`), decode throughput of fp16
KV per CPU-second on a Klein-sized layer (1024 tokens x 24 heads x 128) and its scaling with 1, 2, 4
decode workers (processes), and a tiny random FLUX.2 (diffusers) for shape coverage.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from sakura.codec import ShardId, ShardKV, codec_from_spec
from sakura.util.psnr import psnr_db
from sakura.util.fsutil import write_json
import sakura.cloud.builder.pipeline as B
from sakura.cloud.builder.pipeline import build_store
from sakura.cloud.capture import calibration_photos, layer_sensitivity, template_importance, token_sensitivity
from sakura.cloud.tasks import TASK_NAMES, get_task, heldout_photos, library_templates
from sakura.cloud.tasks.quality import psnr_per_image, ssim_per_image
from sakura.codec import CodecTables, decode_any
from sakura.codec.metrics import rel_error
from sakura.models import MINI_WEIGHTS, load_model
from sakura.models.kv import LayerKV, TemplateKV
from sakura.models.mini import MiniDiT
from sakura.wire.store import Store

from sakura.bench.harness import get_logger, markdown_head
import sakura.cloud.builder.pipeline  # noqa: F401  (loaded at start: a long run must not pick up later edits halfway)
from tqdm import tqdm

log = get_logger(__name__)


def _cpu() -> float:
    """CPU seconds of this process (single-threaded work): on a shared machine wall time measures
    the neighbours, CPU time what one core spends on the work."""
    return time.process_time()


CACHEGEN = [f"cachegen:level={l}" for l in (3, 2, 1)] + [f"cachegen:level={l},delta=true" for l in (3, 2, 1)]
SAKURA = [f'sakura:budget={b},quantiser="ecsq",transform="dct"' for b in (0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5, 0.7, 1.0)]
LADDERS = {  # name -> (spec, importance source for ShardKV.importance, tables: "template" | "model")
    "progressive": ("progressive", None, "template"),
    "progressive, low budgets": ("progressive:budgets=[0.07,0.15,0.3,0.6]", None, "template"),
    "progressive+sensitivity": ('progressive:weighting="importance"', "sensitivity", "template"),
    "progressive+attention": ('progressive:weighting="importance"', "attention", "template"),
    "progressive, per-model tables": ("progressive", None, "model"),
}
QUICK_CACHEGEN = ["cachegen:level=3", "cachegen:level=1,delta=true"]
QUICK_SAKURA = ['sakura:budget=0.3,quantiser="ecsq",transform="dct"']
QUICK_LADDERS = {"progressive": LADDERS["progressive"]}


# ----------------------------------------------------------------------------------------------
# model side

def load_bench_model(name: str):
    """Any model `load_model` knows. The bundled mini model without trained weights gets its
    zero-initialised adaLN gates randomised, so the output depends on the template at all."""

    model = load_model(name)
    label = name
    if isinstance(model, MiniDiT) and name == "sakura-mini" and not MINI_WEIGHTS.is_file():
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for mod in [b.ada for b in model.blocks] + [model.ada_out, model.out]:
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=g) * 0.02)
                mod.bias.copy_(torch.randn(mod.bias.shape, generator=g) * 0.1)
        model.invalidate_fingerprint()
        label = "sakura-mini (UNTRAINED: random init, adaLN gates randomised)"
    return model.eval(), label


def image_metrics(img: torch.Tensor, ref: torch.Tensor, gt: torch.Tensor) -> dict[str, float]:

    return {"psnr_vs_lossless_db": float(psnr_per_image(img, ref).mean()),
            "ssim_vs_lossless": float(ssim_per_image(img, ref).mean()),
            "psnr_vs_gt_db": float(psnr_per_image(img, gt).mean())}


# ----------------------------------------------------------------------------------------------
# one template

def run_template(model, tpl, photos: torch.Tensor, gt: torch.Tensor, calib: torch.Tensor, *, steps: int,
                 seed: int, cachegen: list[str], sakura: list[str], ladders: dict, model_tables: dict) -> dict[str, Any]:

    kv = model.extract_template_kv(tpl.image[None], tpl.instruction).to(torch.float16)
    L = kv.num_layers

    def edit(layers, imgs=photos):
        return model.edit(imgs, template_kv=TemplateKV(layers, kv.model_fingerprint, kv.template_fingerprint,
                                                       kv.layout), steps=steps, seed=seed).image

    ref = edit(list(kv.layers))
    sens = layer_sensitivity([(l.key, l.value) for l in kv.layers],
                             lambda ls: edit([LayerKV(k, v) for k, v in ls], calib), seed=seed)
    tok = token_sensitivity(model, kv, calib, steps=steps, seed=seed)             # (L, 2, T)
    att = template_importance(model, kv, calib, steps=steps, seed=seed)          # (L, T)
    imps = {None: [None] * L, "sensitivity": [tok[i] for i in range(L)], "attention": [att[i] for i in range(L)]}
    fp16 = sum(2 * 2 * l.key.numel() for l in kv.layers)
    ident = lambda i: ShardId(kv.model_fingerprint, kv.template_fingerprint, i)  # noqa: E731
    rows: list[dict[str, Any]] = []

    def shards_with(imp_src):
        return [ShardKV(l.key, l.value, importance=imps[imp_src][i], layer=i, num_layers=L, sensitivity=sens[i])
                for i, l in enumerate(kv.layers)]

    def evaluate(name, codec, family, datas, tables, table_bytes, rung=None):
        t0 = _cpu()
        decs = [codec.decode(d, ident(i), tables) for i, d in enumerate(datas)]
        dec_s = _cpu() - t0
        img = edit([d.for_attention() for d in decs])
        nbytes = sum(len(d) for d in datas)
        row = {"setting": name, "family": family, "codec": codec.name, "rung": rung, "bytes": nbytes,
               "table_bytes": table_bytes, "bytes_with_tables": nbytes + table_bytes,
               "bits_per_value": 16.0 * nbytes / fp16, "decode_MBps": fp16 / 1e6 / max(dec_s, 1e-9),
               **image_metrics(img, ref, gt)}
        rows.append(row)
        return row

    bar = tqdm(total=len(cachegen) + len(sakura) + len(ladders), desc=tpl.name, unit="codec", disable=None)
    for spec in cachegen + sakura:
        bar.set_description_str(f"{tpl.name}: {spec}")
        bar.update()
        c = codec_from_spec(spec)
        shards = shards_with(None)
        tables = c.fit_tables(shards) if c.uses_tables else None
        datas = [c.encode(s, ident(i), tables) for i, s in enumerate(shards)]
        fam = "cachegen+delta" if "delta" in spec else c.name
        evaluate(spec, c, fam, datas, tables, tables.nbytes if tables is not None else 0)
    for lname, (spec, imp_src, tbl) in ladders.items():
        bar.set_description_str(f"{tpl.name}: {lname}")
        bar.update()
        c = codec_from_spec(spec)
        shards = shards_with(imp_src)
        tables = model_tables[spec] if tbl == "model" else c.fit_tables(shards)
        full = [c.encode(s, ident(i), tables) for i, s in enumerate(shards)]
        ends = [c.level_ends(d) for d in full]
        for r in range(len(ends[0])):
            row = evaluate(f"{lname}#{r}", c, lname, [d[:e[r]] for d, e in zip(full, ends)], tables,
                           tables.nbytes, rung=r)
            row["ladder_total_bytes"] = sum(len(d) for d in full)
    bar.close()
    zero = edit([LayerKV(torch.zeros_like(l.key), torch.zeros_like(l.value)) for l in kv.layers])

    out = {"template": tpl.name, "instruction": tpl.instruction, "fp16_bytes": fp16, "rows": rows,
           "lossless_psnr_vs_gt_db": float(psnr_per_image(ref, gt).mean()),
           "zero_kv_psnr_vs_gt_db": float(psnr_per_image(zero, gt).mean()),
           "zero_kv_psnr_vs_lossless_db": float(psnr_per_image(zero, ref).mean()),
           "sensitivity_calibration": [list(x) for x in sens],
           "token_sensitivity_top10pct_share": _top_share(tok.reshape(-1, tok.shape[-1])),
           "attention_top10pct_share": _top_share(att)}
    for r in rows:
        r["delta_psnr_vs_gt_db"] = r["psnr_vs_gt_db"] - out["lossless_psnr_vs_gt_db"]
    for r in rows:
        log.info(_fmt_row(r))
    return out


def _top_share(x: torch.Tensor) -> float:
    """Mean over rows of the share the top 10% of entries hold."""
    k = max(1, x.shape[-1] // 10)
    s = torch.sort(x, dim=-1, descending=True)[0]
    return float((s[..., :k].sum(-1) / s.sum(-1).clamp_min(1e-30)).mean())


def _fmt_row(r: dict[str, Any]) -> str:
    return (f"  {r['setting']:<52} {r['bits_per_value']:6.3f} b/v {r['bytes']:>7} B +tab {r['table_bytes']:>6} "
            f"psnr {r['psnr_vs_lossless_db']:5.1f} dB  vsGT {r['delta_psnr_vs_gt_db']:+.2f}")


# ----------------------------------------------------------------------------------------------
# comparisons

def frontier(rows: list[dict[str, Any]], key: str = "bytes_with_tables", metric: str = "psnr_vs_lossless_db"):
    """Pareto frontier (bytes ascending, quality strictly increasing)."""
    out = []
    for r in sorted(rows, key=lambda r: r[key]):
        if not out or r[metric] > out[-1][metric]:
            out.append(r)
    return out


def bytes_at_quality(front: list[dict[str, Any]], want: float, key: str = "bytes_with_tables",
                     metric: str = "psnr_vs_lossless_db") -> float | None:
    """Bytes the frontier needs for quality `want` (log-bytes interpolation); None if out of reach."""
    if not front:
        return None
    if front[0][metric] >= want:
        return float(front[0][key])
    for a, b in zip(front, front[1:]):
        if a[metric] < want <= b[metric]:
            f = (want - a[metric]) / (b[metric] - a[metric])
            return math.exp(math.log(a[key]) + f * (math.log(b[key]) - math.log(a[key])))
    return None


def quality_at_bytes(front: list[dict[str, Any]], nbytes: float, key: str = "bytes_with_tables",
                     metric: str = "psnr_vs_lossless_db") -> float | None:
    """Quality of the frontier at `nbytes` (interpolated in log-bytes); None outside its range."""
    for a, b in zip(front, front[1:]):
        if a[key] <= nbytes <= b[key]:
            f = (math.log(nbytes) - math.log(a[key])) / max(math.log(b[key]) - math.log(a[key]), 1e-12)
            return a[metric] + f * (b[metric] - a[metric])
    return None


def compare(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Sakura (every sakura family together) vs each CacheGen family at equal image PSNR, tables
    included; importance on vs off and per-model vs per-template tables at equal bytes."""
    sak = [r for r in rows if r["codec"] in ("sakura", "progressive")]
    res: dict[str, Any] = {"vs": {}}
    sfront = frontier(sak)
    for fam in ("cachegen", "cachegen+delta"):
        out = []
        for cg in sorted([r for r in rows if r["family"] == fam], key=lambda r: r["bytes_with_tables"]):
            need = bytes_at_quality(sfront, cg["psnr_vs_lossless_db"])
            out.append({"cachegen": cg["setting"], "psnr_db": cg["psnr_vs_lossless_db"],
                        "cachegen_bytes": cg["bytes_with_tables"], "sakura_bytes": need,
                        "ratio": need / cg["bytes_with_tables"] if need is not None else None})
        res["vs"][fam] = out
    pfront = frontier([r for r in rows if r["family"] == "progressive"])
    for fam in {r["family"] for r in rows if r["family"].startswith("progressive") and r["family"] != "progressive"}:
        pts = []
        for r in [x for x in rows if x["family"] == fam]:
            q = quality_at_bytes(pfront, r["bytes_with_tables"])
            pts.append({"setting": r["setting"], "bytes": r["bytes_with_tables"], "psnr_db": r["psnr_vs_lossless_db"],
                        "progressive_psnr_at_equal_bytes": q,
                        "gain_db": r["psnr_vs_lossless_db"] - q if q is not None else None})
        res[f"{fam} vs progressive"] = pts
    return res


# ----------------------------------------------------------------------------------------------
# storage and throughput

def store_whole(model_name: str, templates: list[str]) -> dict[str, Any]:
    """Build a store with the default ladder for `templates`; what `sakura store stats` reports."""

    with tempfile.TemporaryDirectory() as d:
        build_store(d, model_name=model_name, templates=templates, log=log.info)
        out = {}
        for t in Store(d).stats().templates:
            out[t.template_id] = {"ladder": t.ladder_bytes, "tables": t.table_bytes, "template_ref": t.template_ref_bytes,
                                  "manifest": t.manifest_bytes, "whole": t.whole_bytes, "fp16": t.fp16_bytes,
                                  "whole_ratio_vs_fp16": t.whole_ratio_vs_fp16}
        return out


def synthetic_layer(T: int, H: int, D: int, seed: int = 0, layer: int = 5) -> ShardKV:
    """Klein-sized synthetic layer: per-channel offsets, outlier key channels, per-token value scale.
    Tokens are iid (no spatial correlation): a pessimistic case for the token-grid transform."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(T, H, D, generator=g) + 1.5 * torch.randn(1, H, D, generator=g)
    out_ch = torch.randint(0, D, (max(1, D // 32),), generator=g)
    k[:, :, out_ch] *= 8.0
    v = torch.randn(T, H, D, generator=g) * (0.5 + torch.rand(T, 1, 1, generator=g))
    return ShardKV(k.half(), v.half(), layer=layer, num_layers=25)


def throughput(specs: list[str], shard: ShardKV, repeats: int = 3) -> list[dict[str, Any]]:
    """Best-of-`repeats` encode/decode MB/s of fp16 KV per CPU-second of one thread (whole object:
    for a ladder that is its top rung, decoded from scratch)."""
    ident = ShardId("bench", "synthetic", 0)
    out = []
    for spec in specs:
        c = codec_from_spec(spec)
        tables = c.fit_tables([shard]) if c.uses_tables else None
        data = c.encode(shard, ident, tables)
        c.decode(data, ident, tables)  # warm the table models as a phone holding them would be
        enc, dec = [], []
        for _ in range(repeats):
            t0 = _cpu()
            c.encode(shard, ident, tables)
            enc.append(_cpu() - t0)
            t0 = _cpu()
            c.decode(data, ident, tables)
            dec.append(_cpu() - t0)
        row = {"setting": spec, "shape": list(shard.shape), "bits_per_value": 8 * len(data) / shard.num_values,
               "encode_MBps": shard.fp16_bytes / 1e6 / min(enc), "decode_MBps": shard.fp16_bytes / 1e6 / min(dec)}
        if c.supports_layers and len(c.level_ends(data)) > 1:
            rung0 = data[:c.level_ends(data)[0]]
            t0 = _cpu()
            c.decode(rung0, ident, tables)
            row["rung0_decode_MBps"] = shard.fp16_bytes / 1e6 / (_cpu() - t0)
            row["rung0_bits_per_value"] = 8 * len(rung0) / shard.num_values
        out.append(row)
    return out


_WORKER: dict[str, Any] = {}


def _worker_init(spec: str, shard_bytes: bytes, tables_bytes: bytes) -> None:
    torch.set_num_threads(1)

    _WORKER["codec"] = codec_from_spec(spec)
    _WORKER["tables"] = CodecTables.from_bytes(tables_bytes, ShardId("bench", "synthetic", -1))
    _WORKER["data"] = shard_bytes


def _worker_decode(i: int) -> float:
    t0 = time.perf_counter()
    _WORKER["codec"].decode(_WORKER["data"], ShardId("bench", "synthetic", 0), _WORKER["tables"])
    return time.perf_counter() - t0


def worker_scaling(spec: str, shard: ShardKV, workers=(1, 2, 4), layers: int = 8) -> list[dict[str, Any]]:
    """Wall-clock decode throughput of `layers` Klein-sized layers with 1, 2, 4 worker processes
    (processes, not threads: the ANS decoder holds the GIL, so threads serialise on it)."""
    c = codec_from_spec(spec)
    ident = ShardId("bench", "synthetic", 0)
    tables = c.fit_tables([shard])
    data = c.encode(shard, ident, tables)
    tb = tables.to_bytes(ShardId("bench", "synthetic", -1))
    out = []
    for n in workers:
        with ProcessPoolExecutor(n, initializer=_worker_init, initargs=(spec, data, tb)) as ex:
            list(ex.map(_worker_decode, range(n)))  # start-up and warm-up outside the clock
            t0 = time.perf_counter()
            list(ex.map(_worker_decode, range(layers)))
            wall = time.perf_counter() - t0
        out.append({"workers": n, "layers": layers, "wall_s": wall,
                    "MBps": layers * shard.fp16_bytes / 1e6 / wall, "cores_on_machine": os.cpu_count()})
    return out


def klein_tiny_coverage(specs: list[str]) -> dict[str, Any]:
    """Tiny random FLUX.2 (diffusers) template KV through every codec: shapes, bits, rel errors."""
    from diffusers.models.transformers.transformer_flux2 import Flux2Transformer2DModel  # lazy: the Klein path only
    from sakura.models.flux.klein import KleinAdapter, KleinReference  # lazy: diffusers: the [flux] extra, only here


    torch.manual_seed(0)
    tr = Flux2Transformer2DModel(patch_size=1, in_channels=8, num_layers=2, num_single_layers=2,
                                 attention_head_dim=16, num_attention_heads=2, joint_attention_dim=12,
                                 timestep_guidance_channels=32, mlp_ratio=2.0, axes_dims_rope=(4, 4, 4, 4),
                                 guidance_embeds=False).eval()
    adapter = KleinAdapter(tr)
    g = torch.Generator().manual_seed(1)
    kv = adapter.extract_template_kv(KleinReference.from_grid(torch.randn(1, 64, 8, generator=g), 8, 8, slot=0))
    shards = [ShardKV(l.key.half(), l.value.half(), layer=i, num_layers=kv.num_layers) for i, l in enumerate(kv.layers)]
    rows = []
    for spec in specs:
        c = codec_from_spec(spec)
        tables = c.fit_tables(shards) if c.uses_tables else None
        ids = [ShardId("klein-tiny", "t", i) for i in range(len(shards))]
        decs = [c.decode(c.encode(s, i, tables), i, tables) for s, i in zip(shards, ids)]
        datas = [c.encode(s, i, tables) for s, i in zip(shards, ids)]
        rows.append({"setting": spec, "bits_per_value": 8 * sum(map(len, datas)) / sum(s.num_values for s in shards),
                     "key_rel_err": float(np.mean([rel_error(s.key, d.key, d.keep) for s, d in zip(shards, decs)])),
                     "value_rel_err": float(np.mean([rel_error(s.value, d.value, d.keep) for s, d in zip(shards, decs)]))})
    return {"shape": list(shards[0].shape), "layers": len(shards), "rows": rows}


# ----------------------------------------------------------------------------------------------
# the command

def run(out_dir: Path, *, model_name: str = "sakura-mini", tasks: int = 3, templates_per_task: int = 4,
        photos: int = 6, steps: int = 8, quick: bool = False, klein: bool = True, throughput_tokens: int = 1024,
        storage: bool = True, seed: int = 0) -> dict[str, Any]:
    torch.set_num_threads(1)
    out_dir.mkdir(parents=True, exist_ok=True)
    cachegen, sakura, ladders = (QUICK_CACHEGEN, QUICK_SAKURA, QUICK_LADDERS) if quick else (CACHEGEN, SAKURA, LADDERS)
    model, label = load_bench_model(model_name)
    size = int(model.cfg.image_size)
    calib = calibration_photos(size, 2, seed=seed)
    test = heldout_photos(size, n_per_source=max(1, -(-photos // 3)))[:photos]
    log.info(f"model: {label}; {test.shape[0]} held-out photos, {templates_per_task} held-out templates per task, "
        f"{steps} steps")
    # per-model tables (shared by every template of the model): fitted on the library's training templates
    model_tables: dict[str, Any] = {}
    for spec in {s for s, _i, t in ladders.values() if t == "model"}:
        lib = []
        for tpl in library_templates(size, held_out=False):
            kv = model.extract_template_kv(tpl.image[None], tpl.instruction).to(torch.float16)
            lib.append([ShardKV(l.key, l.value, layer=i, num_layers=kv.num_layers) for i, l in enumerate(kv.layers)])
        model_tables[spec] = codec_from_spec(spec).fit_library_tables(lib)
    results: dict[str, Any] = {"model": label, "steps": steps, "photos": int(test.shape[0]), "tasks": {},
                               "calibration": "crops of public training photos (sakura.cloud.capture.calibration_photos)"}
    for name in TASK_NAMES[:tasks]:
        task = get_task(name)
        tpls = library_templates(size, task=name, held_out=True)[:templates_per_task]
        per = []
        for tpl in tpls:
            log.info(f"task {name}: template {tpl.name}")
            gt = task.ground_truth(test, tpl.image[None])
            t = run_template(model, tpl, test, gt, calib, steps=steps, seed=seed, cachegen=cachegen, sakura=sakura,
                             ladders=ladders, model_tables=model_tables)
            t["compare"] = compare(t["rows"])
            per.append(t)
        results["tasks"][name] = {"templates": per}
    if storage:
        names = [t["template"] for task in results["tasks"].values() for t in task["templates"]]
        results["storage"] = store_whole(model_name, names)
    big = synthetic_layer(throughput_tokens, 24, 128)
    tp = ["progressive", SAKURA[6], "cachegen:level=3", "cachegen:level=3,delta=true"]
    log.info(f"throughput on a synthetic Klein-4B-sized layer {tuple(big.shape)} fp16, 1 thread")
    results["throughput_klein_sized"] = throughput(tp[:1] if quick else tp, big, repeats=2 if quick else 3)
    results["decode_workers"] = worker_scaling("progressive", big, workers=(1, 2) if quick else (1, 2, 4),
                                               layers=2 if quick else 8)
    if klein:
        results["klein_tiny"] = klein_tiny_coverage(["lossless", "cachegen:level=2", "progressive", SAKURA[5]])
    results["summary"] = summarise(results)
    write_json(out_dir / "results.json", results, indent=1, default=float)
    write_table(results, out_dir / "table.md")
    plot(results, out_dir)
    log.info(f"wrote {out_dir}/results.json, table.md, rd_psnr.png")
    return results


def summarise(res: dict[str, Any]) -> dict[str, Any]:
    """Per task: worst/median sakura/CacheGen byte ratios at equal PSNR (tables included) against
    each CacheGen family; rung-0 vs lossless against ground truth; importance / table variants."""
    out = {}
    for task, t in res["tasks"].items():
        s: dict[str, Any] = {}
        for fam in ("cachegen", "cachegen+delta"):
            ratios = [e["ratio"] for tt in t["templates"] for e in tt["compare"]["vs"].get(fam, []) if e["ratio"]]
            misses = sum(1 for tt in t["templates"] for e in tt["compare"]["vs"].get(fam, []) if e["ratio"] is None)
            s[fam] = {"max_ratio": max(ratios) if ratios else None, "median_ratio": float(np.median(ratios)) if ratios else None,
                      "points": len(ratios), "not_reached": misses}
        r0 = [r for tt in t["templates"] for r in tt["rows"] if r["family"] == "progressive" and r["rung"] == 0]
        s["rung0_delta_psnr_vs_gt_db"] = [r["delta_psnr_vs_gt_db"] for r in r0]
        s["rung0_psnr_vs_lossless_db"] = [r["psnr_vs_lossless_db"] for r in r0]
        for key in {k for tt in t["templates"] for k in tt["compare"] if k != "vs"}:
            gains = [p["gain_db"] for tt in t["templates"] for p in tt["compare"][key] if p["gain_db"] is not None]
            s[key] = {"mean_gain_db": float(np.mean(gains)) if gains else None, "points": len(gains)}
        if "storage" in res:
            s["whole_ratio_vs_fp16"] = [res["storage"][tt["template"]]["whole_ratio_vs_fp16"] for tt in t["templates"]
                                        if tt["template"] in res["storage"]]
        out[task] = s
    return out


def write_table(res: dict[str, Any], path: Path) -> None:
    lines = [f"Model: {res['model']}; {res['steps']} sampling steps; {res['photos']} held-out photos; "
             "bytes include the per-template (or per-model) tables a phone must fetch; PSNR/SSIM: "
             "`sakura.cloud.tasks.quality` (mean over photos); MB/s: fp16 KV per CPU-second of one thread.", ""]
    lines += ["## Summary", "", *markdown_head(['task', 'sakura/CacheGen bytes at equal PSNR, max (median)', 'vs CacheGen+delta', 'rung 0 ΔPSNR vs GT (dB)', 'whole template / fp16'], 'lllll')]
    for task, s in res["summary"].items():
        f = lambda d: (f"{d['max_ratio']:.2f} ({d['median_ratio']:.2f}), n={d['points']}" + (  # noqa: E731
            f", {d['not_reached']} not reached" if d["not_reached"] else "")) if d["max_ratio"] else "n/a"
        lines.append(f"| {task} | {f(s['cachegen'])} | {f(s['cachegen+delta'])} | "
                     + ", ".join(f"{x:+.2f}" for x in s["rung0_delta_psnr_vs_gt_db"]) + " | "
                     + ", ".join(f"{x:.3f}" for x in s.get("whole_ratio_vs_fp16", [])) + " |")
    lines += ["", "Variants against the plain `progressive` ladder at equal bytes (mean PSNR gain, dB):", ""]
    for task, s in res["summary"].items():
        for k, v in sorted(s.items()):
            if k.endswith("vs progressive") and v["mean_gain_db"] is not None:
                lines.append(f"- {task}, {k}: {v['mean_gain_db']:+.2f} dB over {v['points']} rungs")
    for task, t in res["tasks"].items():
        for tt in t["templates"]:
            lines += ["", f"### `{task}` / `{tt['template']}`: lossless-KV vs GT {tt['lossless_psnr_vs_gt_db']:.2f} dB "
                          f"(all-zero KV {tt['zero_kv_psnr_vs_gt_db']:.2f}); top 10% of tokens hold "
                          f"{100 * tt['token_sensitivity_top10pct_share']:.0f}% of the gradient sensitivity, "
                          f"{100 * tt['attention_top10pct_share']:.0f}% of the attention", "",
                      *markdown_head(['setting', 'bits/value', 'bytes', 'tables', 'PSNR vs lossless', 'SSIM', 'ΔPSNR vs GT', 'dec MB/s'], 'lrrrrrrr')]
            for r in tt["rows"]:
                lines.append(f"| `{r['setting']}` | {r['bits_per_value']:.3f} | {r['bytes']} | {r['table_bytes']} | "
                             f"{r['psnr_vs_lossless_db']:.2f} | {r['ssim_vs_lossless']:.4f} | "
                             f"{r['delta_psnr_vs_gt_db']:+.2f} | {r['decode_MBps']:.0f} |")
    lines += ["", "### Throughput, Klein-4B-sized synthetic layer (iid tokens), fp16 KV, 1 thread", "",
              *markdown_head(['setting', 'bits/value', 'encode MB/s', 'decode MB/s', 'rung 0: bits/value, decode MB/s'], 'lrrrl')]
    for r in res["throughput_klein_sized"]:
        r0 = (f"{r['rung0_bits_per_value']:.3f}, {r['rung0_decode_MBps']:.0f}" if "rung0_decode_MBps" in r else "")
        lines.append(f"| `{r['setting']}` | {r['bits_per_value']:.3f} | {r['encode_MBps']:.1f} | "
                     f"{r['decode_MBps']:.1f} | {r0} |")
    lines += ["", "Decode workers (processes; wall clock, whole ladder per layer): " + ", ".join(
        f"{w['workers']}: {w['MBps']:.0f} MB/s" for w in res["decode_workers"])
        + f" on a {res['decode_workers'][0]['cores_on_machine']}-core machine."]
    if "storage" in res:
        lines += ["", "### Whole template in the store (`sakura build` default ladder, `sakura store stats`)", "",
                  *markdown_head(['template', 'ladder', 'tables', 'template PNG', 'manifest', 'whole', 'whole / fp16'], 'lrrrrrr')]
        for k, v in res["storage"].items():
            lines.append(f"| {k} | {v['ladder']} | {v['tables']} | {v['template_ref']} | {v['manifest']} | {v['whole']} | "
                         f"{v['whole_ratio_vs_fp16']:.3f} |")
    path.write_text("\n".join(lines) + "\n")


def plot(res: dict[str, Any], out_dir: Path) -> None:
    import matplotlib  # lazy: plots only: not imported by a run that draws nothing

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: plots only: not imported by a run that draws nothing

    tasks = list(res["tasks"])
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
    styles = {"cachegen": "^-", "cachegen+delta": "v-", "sakura": "o-", "progressive": "s-",
              "progressive+sensitivity": "s--", "progressive+attention": "s:", "progressive, per-model tables": "D-",
              "progressive, low budgets": "s-."}
    for ax, task in zip(axes[0], tasks):
        tt = res["tasks"][task]["templates"][0]
        for fam, style in styles.items():
            pts = sorted((r["bytes_with_tables"], r["psnr_vs_lossless_db"]) for r in tt["rows"] if r["family"] == fam)
            if pts:
                ax.plot(*zip(*pts), style, label=fam)
        ax.set_xscale("log")
        ax.set_xlabel("bytes incl. tables")
        ax.set_ylabel("image PSNR vs lossless-KV output (dB)")
        ax.set_title(f"{task} / {tt['template']}")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(res["model"], fontsize=9)
    fig.tight_layout()
    fig.savefig(out_dir / "rd_psnr.png", dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# the default ladder as `sakura build` stores it

def ladder_check(out_dir: Path, *, model_name: str = "sakura-mini", templates_per_task: int = 4, photos: int = 6,
                 steps: int = 8, seed: int = 0, tasks: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Build the held-out templates with `sakura build`'s defaults, then read every rung back from
    the store (prefix + shared tables, as a phone would) and edit the held-out photos with it:
    what each template costs whole (`sakura store stats`) and how far each rung's edit is from the
    lossless-KV edit's PSNR against ground truth."""

    torch.set_num_threads(1)
    out_dir.mkdir(parents=True, exist_ok=True)
    model, label = load_bench_model(model_name)
    size = int(model.cfg.image_size)
    test = heldout_photos(size, n_per_source=max(1, -(-photos // 3)))[:photos]
    tpls = [t for task in (tasks or TASK_NAMES) for t in library_templates(size, task=task, held_out=True)[:templates_per_task]]
    res: dict[str, Any] = {"model": label, "ladder": list(B.DEFAULT_LADDER), "base_psnr_db": B.BASE_RUNG_PSNR_DB,
                           "photos": int(test.shape[0]), "steps": steps, "templates": {}}
    with tempfile.TemporaryDirectory() as d:
        B.build_store(d, model_name=model_name, templates=[t.name for t in tpls], log=log.info)
        st = Store(d)
        stats = {t.template_id: t for t in st.stats().templates}
        fp = model.fingerprint()
        for tpl in tpls:
            m = st.get_manifest(fp, tpl.name)
            tfp = m.kv_layout["template_fingerprint"]
            kv = model.extract_template_kv(tpl.image[None], tpl.instruction).to(torch.float16)
            assert kv.template_fingerprint == tfp

            def edit(layers):
                return model.edit(test, template_kv=TemplateKV(layers, fp, tfp, kv.layout), steps=steps, seed=seed).image

            gt = get_task(tpl.task).ground_truth(test, tpl.image[None])
            ref = edit(list(kv.layers))
            ref_gt = float(psnr_per_image(ref, gt).mean())
            tables = {t.name: CodecTables.from_bytes(st.get_object(t.object), ShardId(fp, tfp, -1)) for t in m.tables}
            rungs = []
            for r in range(len(m.shards[0].renditions)):
                layers = []
                nbytes = 0
                for s in m.shards:
                    rend = s.renditions[r]
                    data = st.get_object(rend.object)[:rend.nbytes]
                    nbytes += rend.nbytes
                    dec = decode_any(data, ShardId(fp, tfp, s.index), tables[rend.tables[0]] if rend.tables else None)
                    layers.append(dec.for_attention())
                img = edit(layers)
                rungs.append({"rendition": m.shards[0].renditions[r].name, "bytes": nbytes,
                              "psnr_vs_lossless_db": float(psnr_per_image(img, ref).mean()),
                              "delta_psnr_vs_gt_db": float(psnr_per_image(img, gt).mean()) - ref_gt,
                              "manifest_image_psnr_db_sum": psnr_db(sum(
                                  s.renditions[r].distortion["image_mse"] for s in m.shards))})
            t = stats[tpl.name]
            res["templates"][tpl.name] = {
                "budgets": m.tables[0].params.get("budgets") if m.tables else None, "rungs": rungs,
                "lossless_psnr_vs_gt_db": ref_gt, "ladder": t.ladder_bytes, "tables": t.table_bytes,
                "template_ref": t.template_ref_bytes, "manifest": t.manifest_bytes, "fp16": t.fp16_bytes,
                "objects_ratio_vs_fp16": t.ratio_vs_fp16, "whole_ratio_vs_fp16": t.whole_ratio_vs_fp16}
            log.info(f"{tpl.name}: budgets {res['templates'][tpl.name]['budgets']}, lowest rung "
                f"{rungs[0]['delta_psnr_vs_gt_db']:+.2f} dB vs GT ({rungs[0]['psnr_vs_lossless_db']:.1f} dB vs lossless), "
                f"whole {t.whole_ratio_vs_fp16:.3f} of fp16 (objects {t.ratio_vs_fp16:.3f})")
    write_json(out_dir / "ladder_check.json", res, indent=1, default=float)
    lines = [f"`sakura build` default ladder {res['ladder']} (lowest rung fitted to {res['base_psnr_db']} dB vs lossless "
             f"on the calibration photos), {res['photos']} held-out photos, {steps} steps; rungs read back from the store.", "",
             *markdown_head(['template', 'budgets', 'lowest rung ΔPSNR vs GT (dB)', 'per rung PSNR vs lossless (dB)', 'ladder', 'tables', 'PNG', 'manifest', 'objects / fp16', 'whole / fp16'], 'llrlrrrrrr')]
    for name, t in res["templates"].items():
        lines.append(f"| {name} | {t['budgets']} | {t['rungs'][0]['delta_psnr_vs_gt_db']:+.2f} | "
                     + ", ".join(f"{r['psnr_vs_lossless_db']:.1f}" for r in t["rungs"])
                     + f" | {t['ladder']} | {t['tables']} | {t['template_ref']} | {t['manifest']} | "
                       f"{t['objects_ratio_vs_fp16']:.3f} | {t['whole_ratio_vs_fp16']:.3f} |")
    (out_dir / "ladder_check.md").write_text("\n".join(lines) + "\n")
    return res
