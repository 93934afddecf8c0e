"""`sakura bench e2e`: every method on the same model, task, photo and trace, live, in one run.

**live** (`run_live`): real execution on this machine. A store is built for the template, served
by our HTTP server on 127.0.0.1, and reached through the trace-replaying pacing proxy (fresh link
at the same trace offset for every method). The bundled sakura-mini runs the edit for real. Its
template KV is small (~200 kB fp16) and its compute fast, so this mode measures the machinery
(pipelining, stalls, bytes, quality, fallbacks), not the phone-scale trade-off: that is
`sakura bench profile` (`sakura.bench.profile`), which runs the same driver on a virtual clock.
The manifest is taken as already on the phone (apps fetch manifests with the template gallery);
shared codec tables and shards are fetched inside the timed edit.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

import torch
from sakura.phone.policies import CACHEGEN_LEVELS, make_policy
from sakura.util.fsutil import write_json
from sakura.cloud.builder.pipeline import build_store
from sakura.cloud.tasks import get_task, get_template, heldout_photos
from sakura.cloud.tasks.quality import psnr_per_image, ssim_per_image
from sakura.emulation import load_trace
from sakura.emulation.pacer import pacer_in_thread
from sakura.models import load_model
from sakura.phone import BandwidthEstimator, CacheGenPolicy, FixedPolicy, RttEstimator, SakuraPolicy
from sakura.phone.live import Emulation, profile_model, streamed_edit
from sakura.wire.server import serve_in_thread
from sakura.wire.store.store import Store

from sakura.bench.harness import get_logger, markdown_head
from tqdm import tqdm

log = get_logger(__name__)

METHODS = ("oracle", "on-device", "on-device-nocache", "raw-stream", "cachegen", "sakura")
#: What the live benchmark's store holds: raw-stream's lossless copy, the default (progressive)
#: ladder sakura streams, and CacheGen's levels.
SAKURA_LADDER = ("lossless", "progressive")
LIVE_LADDER = SAKURA_LADDER + CACHEGEN_LEVELS


def sakura_renditions(manifest=None) -> tuple[str, ...] | None:
    """The rendition names the sakura policy may use: the progressive ladder's rungs
    (`progressive#<rung>`, 1-3 per template, so read from the manifest when given)."""
    if manifest is None:
        return tuple(f"progressive#{i}" for i in range(8))
    return tuple(r.name for r in manifest.shards[0].renditions if r.name.split("#")[0] == "progressive")


# ---------------------------------------------------------------------------------------------
# live mode


def _quality(img: torch.Tensor, reference: torch.Tensor, truth: torch.Tensor, region: torch.Tensor | None) -> dict:

    q = {"bit_exact_vs_lossless": bool(torch.equal(img, reference)),
         "psnr_vs_lossless_db": float(psnr_per_image(img, reference).mean()),
         "ssim_vs_lossless": float(ssim_per_image(img, reference).mean()),
         "psnr_vs_truth_db": float(psnr_per_image(img, truth).mean()),
         "ssim_vs_truth": float(ssim_per_image(img, truth).mean())}
    if region is not None:
        q["psnr_vs_truth_in_region_db"] = float(psnr_per_image(img, truth, region).mean())
    return q


def run_live(out_dir: str | Path, *, template: str = "sticker-00", photo_index: int = 0,
             trace: str = "mahimahi_cellular/TMobile-LTE-short.down", offset_s: float = 10.0, rtt_ms: float = 40.0,
             steps: int = 8, seed: int = 0, methods: Sequence[str] = METHODS, store: str | Path | None = None,
             model_name: str = "sakura-mini") -> dict:
    """Run every method once on the same template, photo and trace segment; write JSON + table.

    Returns {"mode": "live", "rows": [per-method dict], ...}.
    """

    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; expected some of {list(METHODS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    tr = load_trace(trace)
    model = load_model(model_name)
    size = model.cfg.image_size
    tpl = get_template(template, size)
    task = get_task(tpl.task)
    photos = heldout_photos(size)
    if not 0 <= photo_index < photos.shape[0]:
        raise ValueError(f"photo_index must be in [0, {photos.shape[0]}), got {photo_index}")
    photo = photos[photo_index:photo_index + 1]
    timg = tpl.image[None]
    truth = task.ground_truth(photo, timg)
    region = task.region(timg)

    tmp = None
    if store is None:
        tmp = tempfile.TemporaryDirectory(prefix="sakura-e2e-")
        store = tmp.name
    log.info(f"building store for {template} ({len(LIVE_LADDER)} codec settings) ...")
    build_store(store, model_name=model_name, templates=[template], ladder=LIVE_LADDER, calibration=2, steps=4, log=log.info)
    profile = profile_model(model)
    # the phone's estimate before the edit: mean rate over the 10 s of trace before the start
    prior = max(1.0, (tr.cumulative(offset_s) - tr.cumulative(max(0.0, offset_s - 10.0))) / min(10.0, max(offset_s, 1e-9))) \
        if offset_s > 0 else float(tr.rate[0]) or 1e5

    kv = model.extract_template_kv(timg, tpl.instruction).to(torch.float16)
    reference = model.edit(photo, template_kv=kv, steps=steps, seed=seed).image
    t0 = time.perf_counter()
    model.template_stream(timg, tpl.instruction)
    local_template_s = time.perf_counter() - t0


    manifest = Store(store).get_manifest(model.fingerprint(), template)  # fetched with the gallery, untimed
    rows, images = [], {}
    with serve_in_thread(store) as url, tqdm(total=len(methods), desc="methods", unit="edit", disable=None) as bar:
        for method in methods:
            bar.set_description_str(method)
            bar.update()
            log.info(f"  {method} ...")
            row: dict = {"method": method, "mode": "live (real execution on this machine, CPU)"}
            if method in ("oracle", "on-device", "on-device-nocache"):
                kw = ({"template_kv": kv} if method == "oracle" else
                      {"template": timg, "instruction": tpl.instruction,
                       "mode": "extract" if method == "on-device" else "nocache"})
                t = time.perf_counter()
                out = model.edit(photo, steps=steps, seed=seed, **kw)
                row.update(latency_s=time.perf_counter() - t, bytes=0, stall_s=0.0, local_shards=0,
                           template_compute_s=out.timings_s.get("template", 0.0))
                img = out.image
            else:
                policy = make_policy(method, target_s=local_template_s)
                allowed = {"raw-stream": None, "cachegen": CACHEGEN_LEVELS, "sakura": sakura_renditions(manifest)}[method]
                with pacer_in_thread(url, tr, offset_s, rtt_ms / 1000) as purl:
                    res = streamed_edit(model, photo, base_url=purl, template_id=template, template_image=timg,
                                        instruction=tpl.instruction, policy=policy, profile=profile,
                                        bandwidth=BandwidthEstimator(prior_bps=prior),
                                        rtt=RttEstimator(prior_s=rtt_ms / 1000), steps=steps, seed=seed,
                                        manifest=manifest, emulate=Emulation(renditions=allowed))
                b = res.breakdown()
                row.update(latency_s=res.latency_s, bytes=int(b["bytes"]), stall_s=b["stall_s"],
                           local_shards=int(b["local_shards"]), fetch_s=b["fetch_s"],
                           choices=res.choices(), path=res.path, events=res.events,
                           timeline=[asdict(r) for r in res.records])
                img = res.image
            row.update(_quality(img, reference, truth, region))
            rows.append(row)
            images[method] = img
    if tmp is not None:
        tmp.cleanup()
    by = {r["method"]: r for r in rows}
    ratios = {}
    for a, b in (("sakura", "cachegen"), ("sakura", "raw-stream"), ("sakura", "on-device-nocache"),
                 ("sakura", "on-device"), ("sakura", "oracle")):
        if a in by and b in by:
            ratios[f"{b}/{a}"] = by[b]["latency_s"] / by[a]["latency_s"]
    result = {"mode": "live", "model": model_name, "template": template, "photo_index": photo_index, "trace": trace, "offset_s": offset_s,
              "rtt_ms": rtt_ms, "steps": steps, "prior_bps": prior, "fp16_kv_bytes": kv.nbytes,
              "profile": asdict(profile), "rows": rows, "latency_ratios": ratios}
    write_json(out_dir / "e2e_live.json", result, indent=2, default=float)
    table = live_table(result)
    (out_dir / "e2e_live.md").write_text(table)
    log.info(table)
    plot_timelines(result["rows"], out_dir / "e2e_live_timeline.png")
    result["images"] = {"photo": photo, "template": timg, "truth": truth, **images}  # not in the JSON
    return result


# Alike in shape only to sakura.bench.faults.hostile_table: other columns, other result.
def live_table(result: dict) -> str:
    lines = [f"Live (real execution on this machine, CPU, 1 thread): {result.get('model', 'sakura-mini')}, template `{result['template']}`, "
             f"held-out photo {result['photo_index']}, trace `{result['trace']}` from {result['offset_s']} s, "
             f"RTT {result['rtt_ms']} ms, {result['steps']} steps; fp16 template KV {result['fp16_kv_bytes']} B.", "",
             *markdown_head(['method', 'latency (ms)', 'stall (ms)', 'bytes', 'local shards', 'PSNR vs lossless (dB)', 'PSNR vs truth (dB)'], 'lrrrrrr')]
    for r in result["rows"]:
        lines.append(f"| {r['method']} | {1000 * r['latency_s']:.1f} | {1000 * r['stall_s']:.1f} | {r['bytes']} | "
                     f"{r['local_shards']} | {_db(r['psnr_vs_lossless_db'])} | {_db(r['psnr_vs_truth_db'])} |")
    lines += ["", "Latency ratios (same run): " + ", ".join(f"{k} = {v:.2f}x" for k, v in result["latency_ratios"].items())]
    return "\n".join(lines) + "\n"


def _db(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.1f}"


def plot_timelines(rows: list[dict], path: Path, *, scale: float = 1000.0, unit: str = "ms",
                   title: str = "per-shard timeline, live mode") -> None:
    """One panel per method, one bar row per layer: fetch (blue: request to last byte), decode
    (orange: last byte to decoded, queueing included), computed here (green: the template layer
    computed on the device), the layer's forward compute (grey: from getting its KV to asking for
    the next layer's), stall (red, thin: the forward pass waiting for this layer's KV). A dashed line
    marks the end of the edit when a row gives ``latency_s``. rows: per method {"method",
    "timeline": [ShardRecord as dict], optional "latency_s", "label", "post_s" (the work after the
    first pass, shaded before the end)}; times (s) are multiplied by
    `scale` for the axis (1000: ms; D: phone seconds of a time-dilated run)."""
    import matplotlib  # lazy: plots only: not imported by a run that draws nothing

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: plots only: not imported by a run that draws nothing
    from matplotlib.patches import Patch  # lazy: plots only: not imported by a run that draws nothing

    rows = [r for r in rows if r.get("timeline")]
    if not rows:
        return
    colours = {"fetch": "tab:blue", "decode": "tab:orange", "computed here": "tab:green",
               "forward compute": "0.6", "stall": "tab:red"}
    if any(r.get("post_s") for r in rows):
        colours["later passes + VAE decode"] = "0.9"
    fig, axes = plt.subplots(len(rows), 1, figsize=(9.5, 1.45 * len(rows) + 1.0), sharex=True, squeeze=False)
    ok = lambda x: x == x  # noqa: E731  (not NaN)
    for ax, r in zip(axes[:, 0], rows):
        tl = sorted(r["timeline"], key=lambda t: t["index"])
        for k, t in enumerate(tl):
            y = t["index"]
            if t["source"] == "local" and ok(t["delivered"]):
                ax.barh(y, t["local_s"] * scale, left=(t["delivered"] - t["local_s"]) * scale,
                        color=colours["computed here"], height=0.8)
            else:
                if ok(t["t_request"]) and ok(t["fetch_end"]):
                    ax.barh(y, (t["fetch_end"] - t["t_request"]) * scale, left=t["t_request"] * scale,
                            color=colours["fetch"], height=0.8)
                if ok(t["decode_end"]) and ok(t["fetch_end"]):
                    ax.barh(y, (t["decode_end"] - t["fetch_end"]) * scale, left=t["fetch_end"] * scale,
                            color=colours["decode"], height=0.8)
                if ok(t["delivered"]) and ok(t["needed"]) and t["delivered"] > t["needed"]:
                    ax.barh(y, (t["delivered"] - t["needed"]) * scale, left=t["needed"] * scale,
                            color=colours["stall"], height=0.3)
            # the layer's forward compute: from getting its KV to asking for the next layer's
            nxt = tl[k + 1]["needed"] if k + 1 < len(tl) else (t["delivered"] + t["compute_s"] if "compute_s" in t
                                                                 else math.nan)
            if ok(t["delivered"]) and ok(nxt) and nxt > t["delivered"]:
                ax.barh(y, (nxt - t["delivered"]) * scale, left=t["delivered"] * scale,
                        color=colours["forward compute"], height=0.45)
        if r.get("post_s") and r.get("latency_s") is not None:  # the work after the first pass, all layers
            ax.axvspan((r["latency_s"] - r["post_s"]) * scale, r["latency_s"] * scale, color="0.9", zorder=0)
        if r.get("latency_s") is not None and ok(r["latency_s"]):
            ax.axvline(r["latency_s"] * scale, color="k", ls="--", lw=0.8)
            ax.text(r["latency_s"] * scale, 0.97, f" edit done {r['latency_s'] * scale:.1f}", fontsize=6, va="top",
                    transform=ax.get_xaxis_transform())
        ax.set_title(r.get("label", r["method"]), fontsize=8, loc="left")
        ax.set_ylabel("layer", fontsize=7)
        ax.set_yticks([t["index"] for t in tl])
        ax.tick_params(labelsize=6)
        ax.invert_yaxis()
    axes[-1, 0].set_xlabel(f"{unit} since the photo came in", fontsize=8)
    fig.legend(handles=[Patch(color=c, label=k) for k, c in colours.items()], loc="upper left",
               bbox_to_anchor=(0.785, 0.90), fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0, 0.78, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
