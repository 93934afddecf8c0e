"""`sakura bench codec`: every codec setting on the same template KV; table, JSON and RD plots.

Per template ("task") of the mini model:
  1. capture the template KV (stored as fp16: the reference every codec starts from),
  2. score token importance with public calibration photos (`sakura.capture.template_importance`),
  3. run the lossless-KV edit of a test photo, recording every layer's photo/target queries and
     own keys/values at every step,
  4. for every codec setting: fit tables (once per template), encode + decode every layer,
     measure bytes, attention-output relative error per layer (the model's full attention over
     [template | photo | target] tokens, queries from step 3, dropped tokens masked), and the
     edited image's PSNR/SSIM against the lossless-KV output.
Throughput (MB/s of fp16 KV, one thread) is measured on a Klein-4B-sized synthetic layer
(1024 tokens x 24 heads x 128) and on the mini layers; a tiny random FLUX.2 (diffusers) covers
Klein's shapes. Every number says which model it came from.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .base import Codec, ShardKV, ShardId, codec_from_spec
from .metrics import attention_importance, psnr

def _cpu() -> float:
    """CPU seconds of this process: on a shared 2-core machine wall time measures the neighbours;
    CPU time measures what one core spends on the work (single-threaded: torch/OMP threads = 1)."""
    return time.process_time()


SETTINGS_FULL = (["lossless", "lossless:zstd=true", "uniform:bits=8", "uniform:bits=4", "uniform:bits=3",
                  "uniform:bits=2", "cachegen:level=3", "cachegen:level=2", "cachegen:level=1"]
                 + [f"sakura:budget={b}" for b in (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0)]
                 + [f"sakura:budget={b},key_offset=-2" for b in (3.0, 4.0, 5.0, 6.0)]
                 + [f"sakura:budget={b},key_scale=\"channel\"" for b in (3.0, 4.0, 5.0)]
                 + [f"sakura:budget={b},use_importance=false" for b in (2.0, 3.0, 4.0)]
                 + [f"sakura:budget={b},quantiser=\"ecsq\"" for b in (0.3, 0.4, 0.5, 0.7, 0.85, 1.0, 1.2, 1.4, 1.7, 2.0, 2.5)]
                 + [f"sakura:budget={b},quantiser=\"ecsq\",allocate=\"none\"" for b in (0.7, 1.0, 1.4, 2.0)]
                 + [f"sakura:budget={b},quantiser=\"ecsq\",transform=\"dct\""
                    for b in (0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7, 0.85, 1.0, 1.2, 1.4, 1.7, 2.0)]
                 + [f"sakura:budget={b},quantiser=\"ecsq\",transform=\"dct\",allocate=\"none\""
                    for b in (0.2, 0.5, 1.0)])
SETTINGS_QUICK = ["lossless", "uniform:bits=4", "cachegen:level=3", "cachegen:level=1", "sakura:budget=2.0",
                  "sakura:budget=4.0", "sakura:budget=1.0,quantiser=\"ecsq\"",
                  "sakura:budget=0.5,quantiser=\"ecsq\",transform=\"dct\""]
LADDER = "layered:budgets=[1.5,2.5,3.5,4.5]"
LADDER_QUICK = "layered:budgets=[1.0,2.0]"

# The mini model's three tasks (sakura.tasks): a held-out library template each, held-out test
# photos (one crop per held-out source), calibration crops of public *training* photos.
TASK_NAMES = ("look", "texture", "sticker")
CALIBRATION = ("camera", "coffee")


# ----------------------------------------------------------------------------------------------
# model side

def load_bench_model(name: str):
    """The mini model; if it has no trained weights, randomise its zero-initialised adaLN gates
    and output layer so the output depends on the template (else every codec scores inf dB)."""
    from sakura.models import MINI_WEIGHTS, load_mini

    model = load_mini(None if name == "sakura-mini" else name.partition(":")[2] or None)
    trained = MINI_WEIGHTS.is_file() or name != "sakura-mini"
    label = (f"sakura-mini (weights: {name.partition(':')[2] or MINI_WEIGHTS.name})" if trained
             else "sakura-mini (UNTRAINED: random init, adaLN gates randomised)")
    if not trained:
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for mod in [b.ada for b in model.blocks] + [model.ada_out, model.out]:
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=g) * 0.02)
                mod.bias.copy_(torch.randn(mod.bias.shape, generator=g) * 0.1)
        model.invalidate_fingerprint()
    return model.eval(), label, trained


@dataclass
class Capture:
    """Per layer, per step: photo/target queries and own keys/values (B=1 squeezed): (Tm, H, D)."""

    q: list[list[torch.Tensor]]
    k: list[list[torch.Tensor]]
    v: list[list[torch.Tensor]]


def capture_queries(model, photo: torch.Tensor, kv, steps: int, seed: int):
    """Run the injected edit once, recording each block's main-stream q/k/v (every photo of the
    batch, every step). Returns (image, Capture)."""
    cap = Capture([[] for _ in model.blocks], [[] for _ in model.blocks], [[] for _ in model.blocks])
    originals = []
    for i, block in enumerate(model.blocks):
        orig = block.main_forward

        def wrapped(x_m, temb, rope, k_t, v_t, keep, probe, _i=i, _b=block, _orig=orig):
            mod = _b.ada(temb)[:, None].chunk(6, dim=-1)
            q, k, v = _b._qkv(x_m, mod, rope)
            for j in range(q.shape[0]):
                cap.q[_i].append(q[j].clone())
                cap.k[_i].append(k[j].clone())
                cap.v[_i].append(v[j].clone())
            return _orig(x_m, temb, rope, k_t, v_t, keep, probe)

        originals.append(orig)
        block.main_forward = wrapped  # instance attribute: this model object only, removed below
    try:
        out = model.edit(photo, template_kv=kv, steps=steps, seed=seed)
    finally:
        for block in model.blocks:
            del block.main_forward
    return out.image, cap


def full_attention_rel_error(cap: Capture, layer: int, k_t: torch.Tensor, v_t: torch.Tensor,
                             k_hat: torch.Tensor, v_hat: torch.Tensor, keep: torch.Tensor) -> float:
    """Relative error of the layer's attention output over [template | own] tokens, all steps."""
    num = den = 0.0
    for q, km, vm in zip(cap.q[layer], cap.k[layer], cap.v[layer]):
        qh = q.transpose(0, 1)  # (H, Tm, D)
        d = q.shape[-1]

        def attn(kt, vt, mask):
            k = torch.cat([kt.float(), km]).transpose(0, 1)  # (H, Tt+Tm, D)
            v = torch.cat([vt.float(), vm]).transpose(0, 1)
            logits = qh @ k.transpose(1, 2) / math.sqrt(d)
            if mask is not None:
                full = torch.cat([mask, torch.ones(km.shape[0], dtype=torch.bool)])
                logits = logits.masked_fill(~full.view(1, 1, -1), float("-inf"))
            return torch.softmax(logits, -1) @ v

        ref = attn(k_t, v_t, None)
        got = attn(k_hat, v_hat, keep)
        num += float(((got - ref) ** 2).sum())
        den += float((ref ** 2).sum())
    return math.sqrt(num / max(den, 1e-30))


def ssim(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean SSIM over a batch of (B, 3, H, W) images in [0, 1]."""
    from skimage.metrics import structural_similarity

    return float(np.mean([structural_similarity(a[i].permute(1, 2, 0).numpy(), b[i].permute(1, 2, 0).numpy(),
                                                channel_axis=2, data_range=1.0) for i in range(a.shape[0])]))


def batch_psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean over the batch of per-image PSNR (dB, range 1); inf only if every image is identical."""
    vals = [psnr(a[i], b[i], data_range=1.0) for i in range(a.shape[0])]
    return float(np.mean(vals)) if all(np.isfinite(vals)) else (float("inf") if all(np.isinf(vals)) else
                                                                 float(np.mean([v for v in vals if np.isfinite(v)])))


# ----------------------------------------------------------------------------------------------
# running codecs

def _rows_for_setting(spec: str, codec: Codec, shards: list[ShardKV], tables, datas: list[bytes],
                      ident_of: Callable[[int], ShardId], enc_s: float, fit_s: float, *, rung: int | None,
                      evaluate: Callable[[list], dict[str, Any]]) -> dict[str, Any]:
    t0 = _cpu()
    decs = [codec.decode(d, ident_of(i), tables) for i, d in enumerate(datas)]
    dec_s = _cpu() - t0
    fp16 = sum(s.fp16_bytes for s in shards)
    nbytes = sum(len(d) for d in datas)
    row = {"setting": spec if rung is None else f"{spec}#rung{rung}", "codec": codec.name, "rung": rung,
           "bytes": nbytes, "table_bytes": tables.nbytes if tables is not None else 0,
           "bits_per_value": 8.0 * nbytes / sum(s.num_values for s in shards),
           "ratio_vs_fp16": nbytes / fp16, "keep_fraction": float(np.mean([float(d.keep.float().mean()) for d in decs])),
           "encode_s": enc_s, "decode_s": dec_s, "fit_tables_s": fit_s,
           "encode_MBps": fp16 / 1e6 / enc_s if enc_s > 0 else None, "decode_MBps": fp16 / 1e6 / dec_s}
    row.update(evaluate(decs))
    return row


def run_template(spec_list: list[str], ladder: str | None, shards: list[ShardKV], ident_of,
                 evaluate: Callable[[list], dict[str, Any]], log: Callable[[str], None]) -> list[dict[str, Any]]:
    rows = []
    for spec in spec_list:
        codec = codec_from_spec(spec)
        t0 = _cpu()
        tables = codec.fit_tables(shards) if codec.uses_tables else None
        fit_s = _cpu() - t0
        t0 = _cpu()
        datas = [codec.encode(s, ident_of(i), tables) for i, s in enumerate(shards)]
        enc_s = _cpu() - t0
        row = _rows_for_setting(spec, codec, shards, tables, datas, ident_of, enc_s, fit_s, rung=None,
                                evaluate=evaluate)
        rows.append(row)
        log(_fmt_row(row))
    if ladder:
        codec = codec_from_spec(ladder)
        t0 = _cpu()
        tables = codec.fit_tables(shards)
        fit_s = _cpu() - t0
        t0 = _cpu()
        full = [codec.encode(s, ident_of(i), tables) for i, s in enumerate(shards)]
        enc_s = _cpu() - t0
        ends = [codec.level_ends(d) for d in full]
        for r in range(len(ends[0])):
            datas = [d[:e[r]] for d, e in zip(full, ends)]
            row = _rows_for_setting(ladder, codec, shards, tables, datas, ident_of,
                                    enc_s if r == len(ends[0]) - 1 else 0.0, fit_s, rung=r, evaluate=evaluate)
            row["ladder_total_bytes"] = sum(len(d) for d in full)
            rows.append(row)
            log(_fmt_row(row))
    return rows


def _fmt_row(r: dict[str, Any]) -> str:
    p = r.get("psnr_vs_lossless_db")
    ps = "  inf" if p is not None and math.isinf(p) else (f"{p:5.1f}" if p is not None else "    -")
    a = r.get("attn_rel_err_mean")
    return (f"  {r['setting']:<44} {r['bits_per_value']:6.3f} b/v  {r['bytes']:>9} B  keep {r['keep_fraction']:.2f}"
            f"  attn {a if a is None else f'{a:.4f}'}  psnr {ps} dB  dec {r['decode_MBps']:.0f} MB/s")


# ----------------------------------------------------------------------------------------------
# throughput on a Klein-4B-sized layer

def synthetic_layer(T: int, H: int, D: int, seed: int = 0, dtype=torch.float16) -> tuple[ShardKV, torch.Tensor]:
    """Realistic structure: per-channel offsets and a few outlier key channels, per-token value
    scale, heavy-tailed importance from actual softmax attention of random queries."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(T, H, D, generator=g) + 1.5 * torch.randn(1, H, D, generator=g)
    out_ch = torch.randint(0, D, (max(1, D // 32),), generator=g)
    k[:, :, out_ch] *= 8.0
    v = torch.randn(T, H, D, generator=g) * (0.5 + torch.rand(T, 1, 1, generator=g))
    q = torch.randn(256, H, D, generator=g) * 0.3
    imp = attention_importance(q, k)
    return ShardKV(k.to(dtype), v.to(dtype), importance=imp, layer=5, num_layers=25), q


def salient_layers(salience: float, *, layers: int = 4, T: int = 256, H: int = 8, D: int = 32,
                   seed: int = 0) -> list[tuple[ShardKV, torch.Tensor]]:
    """Mini-shaped synthetic layers whose queries share a direction that some keys align with
    (exponentially distributed alignment, scaled by `salience`): salience 0 gives the flat
    importance an untrained model shows, larger values concentrate attention on few tokens."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for layer in range(layers):
        mu = torch.randn(1, H, D, generator=g)
        mu = mu / mu.norm(dim=-1, keepdim=True)
        a = -torch.log(torch.rand(T, generator=g)) * salience  # Exp(1) * salience
        k = torch.randn(T, H, D, generator=g) + 1.5 * torch.randn(1, H, D, generator=g) \
            + a[:, None, None] * mu * math.sqrt(D) * 0.5
        v = torch.randn(T, H, D, generator=g) * (0.5 + torch.rand(T, 1, 1, generator=g))
        q = mu * math.sqrt(D) * 0.7 + torch.randn(128, H, D, generator=g) * 0.5
        imp = attention_importance(q, k)
        out.append((ShardKV(k.half(), v.half(), importance=imp, layer=layer, num_layers=layers), q))
    return out


def salience_sweep(specs: list[str], saliences=(0.0, 0.2, 0.3, 0.5)) -> list[dict[str, Any]]:
    """RD on synthetic layers of growing attention concentration (template-only attention error)."""
    from .metrics import attention_rel_error

    res = []
    for sal in saliences:
        pairs = salient_layers(sal)
        shards = [p[0] for p in pairs]
        imp = torch.stack([s.importance for s in shards])
        top = float((torch.sort(imp, 1, descending=True)[0][:, : imp.shape[1] // 10].sum(1) / imp.sum(1)).mean())
        rows = []
        for spec in specs:
            codec = codec_from_spec(spec)
            tables = codec.fit_tables(shards) if codec.uses_tables else None
            ids = [ShardId("synthetic", f"salience-{sal}", i) for i in range(len(shards))]
            datas = [codec.encode(s, i, tables) for s, i in zip(shards, ids)]
            decs = [codec.decode(d, i, tables) for d, i in zip(datas, ids)]
            err = float(np.mean([attention_rel_error(q, s.key, s.value, d.key, d.value, d.keep)
                                 for (s, q), d in zip(pairs, decs)]))
            nbytes = sum(map(len, datas))
            rows.append({"setting": spec, "codec": codec.name, "bytes": nbytes,
                         "table_bytes": tables.nbytes if tables is not None else 0,
                         "bits_per_value": 8 * nbytes / sum(s.num_values for s in shards), "attn_rel_err_mean": err,
                         "neg_attn": -err, "keep_fraction": float(np.mean([float(d.keep.float().mean()) for d in decs]))})
        res.append({"salience": sal, "importance_top10pct_mass": top, "rows": rows,
                    "equal_quality_attn": equal_quality_ratio(rows, "neg_attn")})
    return res


def throughput(specs: list[str], shard: ShardKV, repeats: int = 3) -> list[dict[str, Any]]:
    """Best-of-`repeats` encode/decode MB/s of fp16 KV (one layer), per CPU-second of one thread."""
    ident = ShardId("bench", "synthetic", 0)
    out = []
    for spec in specs:
        codec = codec_from_spec(spec)
        tables = codec.fit_tables([shard]) if codec.uses_tables else None
        if tables is not None:  # warm the model cache as a phone holding the tables would be
            codec.decode(codec.encode(shard, ident, tables), ident, tables)
        enc, dec = [], []
        for _ in range(repeats):
            t0 = _cpu()
            data = codec.encode(shard, ident, tables)
            enc.append(_cpu() - t0)
            t0 = _cpu()
            codec.decode(data, ident, tables)
            dec.append(_cpu() - t0)
        mb = shard.fp16_bytes / 1e6
        out.append({"setting": spec, "shape": list(shard.shape), "bits_per_value": 8 * len(data) / shard.num_values,
                    "encode_MBps": mb / min(enc), "decode_MBps": mb / min(dec)})
    return out


def klein_tiny_coverage(specs: list[str]) -> dict[str, Any]:
    """Tiny random FLUX.2 (diffusers) template KV through every codec: shapes, bits, rel errors."""
    from diffusers.models.transformers.transformer_flux2 import Flux2Transformer2DModel

    from sakura.models.klein import KleinAdapter, KleinReference

    torch.manual_seed(0)
    tr = Flux2Transformer2DModel(patch_size=1, in_channels=8, num_layers=2, num_single_layers=2,
                                 attention_head_dim=16, num_attention_heads=2, joint_attention_dim=12,
                                 timestep_guidance_channels=32, mlp_ratio=2.0, axes_dims_rope=(4, 4, 4, 4),
                                 guidance_embeds=False).eval()
    adapter = KleinAdapter(tr)
    g = torch.Generator().manual_seed(1)
    ref = KleinReference.from_grid(torch.randn(1, 64, 8, generator=g), 8, 8, slot=0)
    kv = adapter.extract_template_kv(ref)
    shards = [ShardKV(l.key.half(), l.value.half(), layer=i, num_layers=kv.num_layers) for i, l in enumerate(kv.layers)]
    rows = []
    for spec in specs:
        codec = codec_from_spec(spec)
        tables = codec.fit_tables(shards) if codec.uses_tables else None
        datas = [codec.encode(s, ShardId("klein-tiny", "t", i), tables) for i, s in enumerate(shards)]
        decs = [codec.decode(d, ShardId("klein-tiny", "t", i), tables) for i, d in enumerate(datas)]
        from .metrics import rel_error

        rows.append({"setting": spec, "bits_per_value": 8 * sum(map(len, datas)) / sum(s.num_values for s in shards),
                     "key_rel_err": float(np.mean([rel_error(s.key, d.key, d.keep) for s, d in zip(shards, decs)])),
                     "value_rel_err": float(np.mean([rel_error(s.value, d.value, d.keep) for s, d in zip(shards, decs)]))})
    return {"shape": list(shards[0].shape), "layers": len(shards), "rows": rows}


# ----------------------------------------------------------------------------------------------
# targets

def equal_quality_ratio(rows: list[dict[str, Any]], metric: str = "psnr_vs_lossless_db",
                        with_tables: bool = False) -> list[dict[str, Any]]:
    """For each cachegen level, sakura bytes at the same quality (log-bytes interpolation);
    `with_tables` adds each setting's per-template table bytes to its shard bytes."""
    if with_tables:
        rows = [dict(r, bytes=r["bytes"] + r.get("table_bytes", 0)) for r in rows]
    cand = sorted([r for r in rows if r["codec"] == "sakura" and "use_importance" not in r["setting"]
                   and r.get(metric) is not None], key=lambda r: r["bytes"])
    sak = []  # Pareto frontier: each point better than every cheaper one (the cloud picks per template)
    for r in cand:
        if not sak or r[metric] > sak[-1][metric]:
            sak.append(r)
    out = []
    for cg in [r for r in rows if r["codec"] == "cachegen"]:
        want = cg.get(metric)
        if want is None:
            continue
        need = None
        for a, b in zip(sak, sak[1:]):
            qa, qb = a[metric], b[metric]
            if qa >= want:
                need = a["bytes"]
                break
            if qa < want <= qb:
                f = (want - qa) / (qb - qa) if qb > qa else 1.0
                need = math.exp(math.log(a["bytes"]) + f * (math.log(b["bytes"]) - math.log(a["bytes"])))
                break
        if need is None and sak and sak[0][metric] >= want:
            need = sak[0]["bytes"]
        out.append({"cachegen": cg["setting"], "quality": want, "cachegen_bytes": cg["bytes"],
                    "sakura_bytes": need, "ratio": (need / cg["bytes"]) if need is not None else None})
    return out


def gt_target(rows: list[dict[str, Any]], max_drop_db: float) -> dict[str, Any]:
    """The issue's target: cheapest setting of each codec whose image is at most `-max_drop_db` dB
    below the lossless-KV image against ground truth; sakura bytes / cachegen bytes (tables included)."""
    out: dict[str, Any] = {"max_drop_db": -max_drop_db}
    for fam, sel in (("sakura", lambda r: r["codec"] == "sakura" and "use_importance" not in r["setting"]),
                     ("cachegen", lambda r: r["codec"] == "cachegen")):
        ok = [r for r in rows if sel(r) and r.get("delta_psnr_vs_gt_db", -1e9) >= max_drop_db]
        best = min(ok, key=lambda r: r["bytes"] + r["table_bytes"]) if ok else None
        out[fam] = None if best is None else {"setting": best["setting"], "bytes": best["bytes"] + best["table_bytes"]}
    if out["sakura"] and out["cachegen"]:
        out["ratio"] = out["sakura"]["bytes"] / out["cachegen"]["bytes"]
    return out


# ----------------------------------------------------------------------------------------------
# the command

def run(out_dir: Path, *, model_name: str = "sakura-mini", tasks: int = 3, steps: int = 8, quick: bool = False,
        klein: bool = True, throughput_tokens: int = 1024, seed: int = 0,
        log: Callable[[str], None] = print) -> dict[str, Any]:
    torch.set_num_threads(1)
    out_dir.mkdir(parents=True, exist_ok=True)
    from sakura.capture import template_importance

    from sakura.capture import layer_sensitivity
    from sakura.models import LayerKV, TemplateKV

    specs = SETTINGS_QUICK if quick else SETTINGS_FULL
    ladder = LADDER_QUICK if quick else LADDER
    model, model_label, trained = load_bench_model(model_name)
    size = model.cfg.image_size
    log(f"model: {model_label}; KV per template {model.describe()['template_kv_bytes_fp16']} B fp16")
    from sakura.tasks import get_task, heldout_photos, library_templates
    from sakura.tasks.photos import load_source, random_crop

    gen = torch.Generator().manual_seed(seed)
    calib = torch.stack([random_crop(load_source(n), size, gen) for n in CALIBRATION[: 1 if quick else 2]])
    photos = heldout_photos(size, n_per_source=1)[: 1 if quick else 3]  # (P, 3, S, S), held-out sources
    results: dict[str, Any] = {"model": model_label, "trained": trained, "steps": steps, "tasks": {},
                               "settings": specs, "ladder": ladder, "threads": torch.get_num_threads(),
                               "photos": int(photos.shape[0])}
    for name in TASK_NAMES[:tasks]:
        task = get_task(name)
        lib = library_templates(size, task=name, held_out=True)[0]
        log(f"task {name}: template {lib.name} (held out), instruction {lib.instruction}, {photos.shape[0]} photos")
        template = lib.image[None]
        gt = task.ground_truth(photos, template)
        kv32 = model.extract_template_kv(template, lib.instruction)
        kv = kv32.to(torch.float16)  # the stored reference copy
        imp = template_importance(model, kv, calib, steps=min(steps, 4), seed=seed)  # (layers, T)
        ref_img, cap = capture_queries(model, photos, kv, steps, seed)
        fp32_img = model.edit(photos, template_kv=kv32, steps=steps, seed=seed).image
        ref_gt = batch_psnr(ref_img, gt)

        def calib_edit(layers, kv=kv):  # calibration photos only: never the held-out test photos
            return model.edit(calib, template_kv=TemplateKV([LayerKV(k, v) for k, v in layers], kv.model_fingerprint,
                                                            kv.template_fingerprint, kv.layout), steps=steps, seed=seed).image

        sens = layer_sensitivity([(l.key, l.value) for l in kv.layers], calib_edit, seed=seed)
        shards = [ShardKV(l.key, l.value, importance=imp[i], layer=i, num_layers=kv.num_layers, sensitivity=sens[i])
                  for i, l in enumerate(kv.layers)]
        ident_of = lambda i, t=kv.template_fingerprint: ShardId(kv.model_fingerprint, t, i)  # noqa: E731

        def edit_with(layers, kv=kv):
            return model.edit(photos, template_kv=TemplateKV(layers, kv.model_fingerprint, kv.template_fingerprint,
                                                             kv.layout), steps=steps, seed=seed).image

        def evaluate(decs, kv=kv, gt=gt, ref_img=ref_img, ref_gt=ref_gt):
            errs = [full_attention_rel_error(cap, i, kv.layers[i].key, kv.layers[i].value, d.key, d.value, d.keep)
                    for i, d in enumerate(decs)]
            img = edit_with([LayerKV(d.key, d.value, None if bool(d.keep.all()) else d.keep) for d in decs])
            p_gt = batch_psnr(img, gt)
            return {"attn_rel_err_per_layer": errs, "attn_rel_err_mean": float(np.mean(errs)),
                    "psnr_vs_lossless_db": batch_psnr(img, ref_img), "ssim_vs_lossless": ssim(img, ref_img),
                    "psnr_vs_gt_db": p_gt, "delta_psnr_vs_gt_db": p_gt - ref_gt}

        rows = run_template(specs, ladder, shards, ident_of, evaluate, log)
        zero_img = edit_with([LayerKV(torch.zeros_like(l.key), torch.zeros_like(l.value)) for l in kv.layers])
        fp16 = sum(s.fp16_bytes for s in shards)
        lad = [r for r in rows if r["rung"] is not None]
        ladder_bytes = (lad[-1]["ladder_total_bytes"] + lad[-1]["table_bytes"]) if lad else None
        results["tasks"][name] = {
            "template": lib.name, "instruction": lib.instruction, "fp16_bytes": fp16, "rows": rows,
            "importance_top10pct_mass": float(np.mean([torch.sort(imp[i], descending=True)[0][: imp.shape[1] // 10].sum()
                                                       / imp[i].sum() for i in range(imp.shape[0])])),
            "importance_template_share": [float(x) for x in imp.sum(1)],
            "sensitivity_calibration": [list(x) for x in sens],
            "lossless_psnr_vs_gt_db": ref_gt,
            "psnr_fp16_vs_fp32_kv_db": batch_psnr(ref_img, fp32_img),
            "psnr_zero_kv_vs_lossless_db": batch_psnr(zero_img, ref_img),
            "zero_kv_psnr_vs_gt_db": batch_psnr(zero_img, gt),
            "equal_quality_psnr": equal_quality_ratio(rows, "psnr_vs_lossless_db"),
            "equal_quality_attn": equal_quality_ratio(
                [dict(r, neg_attn=-r["attn_rel_err_mean"]) for r in rows], "neg_attn"),
            "equal_quality_psnr_with_tables": equal_quality_ratio(rows, "psnr_vs_lossless_db", with_tables=True),
            "equal_quality_attn_with_tables": equal_quality_ratio(
                [dict(r, neg_attn=-r["attn_rel_err_mean"]) for r in rows], "neg_attn", with_tables=True),
            "gt_target": gt_target(rows, -0.5),
            "ladder_bytes_with_tables": ladder_bytes,
            "ladder_fraction_of_fp16": ladder_bytes / fp16 if ladder_bytes else None,
        }
    # throughput: Klein-4B-sized layer and one mini layer, one thread
    tp_specs = ["lossless", "uniform:bits=8", "uniform:bits=4", "cachegen:level=3", "cachegen:level=1",
                "sakura:budget=2.0", "sakura:budget=4.0", "sakura:budget=1.0,quantiser=\"ecsq\"",
                "sakura:budget=2.0,quantiser=\"ecsq\"", "sakura:budget=0.5,quantiser=\"ecsq\",transform=\"dct\"",
                "sakura:budget=1.0,quantiser=\"ecsq\",transform=\"dct\"", ladder]
    big, _ = synthetic_layer(throughput_tokens, 24, 128)
    log(f"throughput on a synthetic Klein-4B-sized layer {tuple(big.shape)} fp16, 1 thread")
    results["throughput_klein_sized"] = throughput(tp_specs, big, repeats=2 if quick else 3)
    for r in results["throughput_klein_sized"]:
        log(f"  {r['setting']:<44} {r['bits_per_value']:6.3f} b/v  enc {r['encode_MBps']:7.1f} MB/s  "
            f"dec {r['decode_MBps']:7.1f} MB/s")
    sweep_specs = (["cachegen:level=3", "cachegen:level=2", "cachegen:level=1"]
                   + [f"sakura:budget={b}" for b in ((1.0, 2.0, 4.0) if quick else (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0))]
                   + ([] if quick else [f"sakura:budget={b},key_offset=-2" for b in (3.0, 4.0, 5.0)]))
    log("salience sweep (synthetic mini-shaped layers, template-only attention error)")
    results["salience_sweep"] = salience_sweep(sweep_specs, (0.0, 0.3) if quick else (0.0, 0.2, 0.3, 0.5))
    for sw in results["salience_sweep"]:
        log(f"  salience {sw['salience']}: top 10% tokens hold {100 * sw['importance_top10pct_mass']:.0f}% of attention; "
            "sakura/cachegen bytes at equal error: " + ", ".join(
                f"{e['cachegen']} {e['ratio']:.2f}" if e["ratio"] else f"{e['cachegen']} n/a" for e in sw["equal_quality_attn"]))
    if klein:
        results["klein_tiny"] = klein_tiny_coverage(["lossless", "uniform:bits=4", "cachegen:level=2",
                                                     "sakura:budget=2.0", ladder])
    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=float))
    write_table(results, out_dir / "table.md")
    plot(results, out_dir)
    log(f"wrote {out_dir}/results.json, table.md, rd_attn.png, rd_psnr.png")
    return results


def write_table(res: dict[str, Any], path: Path) -> None:
    lines = [f"Model: {res['model']}; {res['steps']} sampling steps; {res['photos']} held-out photos per task; "
             f"MB/s are fp16 KV bytes per CPU-second of one thread (wall time is unreliable on the shared machine).", ""]
    for task, t in res["tasks"].items():
        lines += [f"### task `{task}`: template `{t['template']}` (instruction {t['instruction']}), "
                  f"fp16 KV {t['fp16_bytes']} B", "",
                  f"Lossless-KV image vs ground truth {t['lossless_psnr_vs_gt_db']:.2f} dB (all-zero KV: "
                  f"{t['zero_kv_psnr_vs_gt_db']:.2f} dB); fp16-vs-fp32 KV image {t['psnr_fp16_vs_fp32_kv_db']:.1f} dB; "
                  f"all-zero KV vs lossless {t['psnr_zero_kv_vs_lossless_db']:.1f} dB; top 10% of tokens hold "
                  f"{100 * t['importance_top10pct_mass']:.0f}% of the template's attention.", "",
                  "| setting | bits/value | bytes | tables B | keep | attn rel err | PSNR vs lossless | SSIM | "
                  "ΔPSNR vs GT | dec MB/s |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in t["rows"]:
            lines.append(f"| `{r['setting']}` | {r['bits_per_value']:.3f} | {r['bytes']} | {r['table_bytes']} | "
                         f"{r['keep_fraction']:.2f} | {r['attn_rel_err_mean']:.4f} | {r['psnr_vs_lossless_db']:.1f} | "
                         f"{r['ssim_vs_lossless']:.4f} | {r['delta_psnr_vs_gt_db']:+.2f} | {r['decode_MBps']:.0f} |")
        g = t["gt_target"]
        lines += ["", f"Target (<= 0.5 dB below lossless vs ground truth, tables included): cheapest sakura "
                      f"{g['sakura']}, cheapest cachegen {g['cachegen']}, ratio "
                      f"{g.get('ratio', float('nan')):.2f}"]
        lines += ["", "Equal quality (PSNR vs lossless output): sakura bytes / cachegen bytes:", ""]
        for e in t["equal_quality_psnr"]:
            lines.append(f"- {e['cachegen']} ({e['quality']:.1f} dB, {e['cachegen_bytes']} B): "
                         + (f"sakura {e['sakura_bytes']:.0f} B, ratio {e['ratio']:.2f}" if e["ratio"] else "not reached"))
        lines += ["", "Equal attention-output error: sakura bytes / cachegen bytes:", ""]
        for e in t["equal_quality_attn"]:
            lines.append(f"- {e['cachegen']} (err {-e['quality']:.4f}): "
                         + (f"ratio {e['ratio']:.2f}" if e["ratio"] else "not reached"))
        if "equal_quality_psnr_with_tables" in t:
            fmt = lambda es: ", ".join(f"{e['ratio']:.2f}" if e["ratio"] else "n/a" for e in es)  # noqa: E731
            lines += ["", "Counting each setting's per-template table bytes too (L3, L2, L1): equal PSNR "
                          f"{fmt(t['equal_quality_psnr_with_tables'])}; equal attention error "
                          f"{fmt(t['equal_quality_attn_with_tables'])}"]
        if t["ladder_fraction_of_fp16"]:
            lines += ["", f"Whole ladder ({res['ladder']}, all rungs + tables): {t['ladder_bytes_with_tables']} B = "
                          f"{t['ladder_fraction_of_fp16']:.3f} of one fp16 copy", ""]
    lines += ["### Throughput, Klein-4B-sized synthetic layer, fp16 KV, 1 thread", "",
              "| setting | shape | bits/value | encode MB/s | decode MB/s |", "|---|---|---:|---:|---:|"]
    for r in res["throughput_klein_sized"]:
        lines.append(f"| `{r['setting']}` | {tuple(r['shape'])} | {r['bits_per_value']:.3f} | {r['encode_MBps']:.1f} | "
                     f"{r['decode_MBps']:.1f} |")
    if "salience_sweep" in res:
        lines += ["", "### Salience sweep: synthetic mini-shaped layers (4 x 256 tokens x 8 heads x 32), "
                      "template-only attention error", "",
                  "| salience | top 10% tokens' attention | sakura/cachegen bytes at equal error (L3, L2, L1) |",
                  "|---:|---:|---|"]
        for sw in res["salience_sweep"]:
            lines.append(f"| {sw['salience']} | {100 * sw['importance_top10pct_mass']:.0f}% | " + ", ".join(
                f"{e['ratio']:.2f}" if e["ratio"] else "n/a" for e in sw["equal_quality_attn"]) + " |")
    if "klein_tiny" in res:
        k = res["klein_tiny"]
        lines += ["", f"### Tiny random FLUX.2 (diffusers), layer shape {tuple(k['shape'])} x {k['layers']} layers", "",
                  "| setting | bits/value | key rel err | value rel err |", "|---|---:|---:|---:|"]
        for r in k["rows"]:
            lines.append(f"| `{r['setting']}` | {r['bits_per_value']:.3f} | {r['key_rel_err']:.4f} | {r['value_rel_err']:.4f} |")
    path.write_text("\n".join(lines) + "\n")


def plot(res: dict[str, Any], out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = [("sakura", lambda r: r["codec"] == "sakura" and "use_importance" not in r["setting"]
                 and "key_offset" not in r["setting"] and "key_scale" not in r["setting"], "o-"),
                ("sakura, keys 2 bits below values", lambda r: r["codec"] == "sakura" and "key_offset=-2" in r["setting"],
                 "D-"),
                ("sakura, keys per channel", lambda r: r["codec"] == "sakura" and "key_scale" in r["setting"], "x-"),
                ("sakura, no importance", lambda r: r["codec"] == "sakura" and "use_importance" in r["setting"], "o:"),
                ("layered rungs", lambda r: r["codec"] == "layered", "s--"),
                ("cachegen", lambda r: r["codec"] == "cachegen", "^-"),
                ("uniform", lambda r: r["codec"] == "uniform", "v-")]
    for metric, ylabel, fname, logy in (("attn_rel_err_mean", "attention-output relative error (mean over layers)",
                                         "rd_attn.png", True),
                                        ("psnr_vs_lossless_db", "image PSNR vs lossless-KV output (dB)", "rd_psnr.png",
                                         False)):
        tasks = list(res["tasks"])
        fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
        for ax, task in zip(axes[0], tasks):
            rows = res["tasks"][task]["rows"]
            for label, sel, style in families:
                pts = sorted((r["bits_per_value"], r[metric]) for r in rows if sel(r) and np.isfinite(r[metric]))
                if pts:
                    ax.plot(*zip(*pts), style, label=label)
            ax.set_xscale("log")
            if logy:
                ax.set_yscale("log")
            ax.set_xlabel("bits per value (incl. headers and scales)")
            ax.set_ylabel(ylabel)
            ax.set_title(f"template {task}")
            ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=8)
        fig.suptitle(res["model"], fontsize=9)
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=110)
        plt.close(fig)
