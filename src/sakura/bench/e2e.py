"""End-to-end benchmark: every method on the same model, task, photo and trace, in one run.

Two modes, and every number says which one it comes from:

* **live** (`run_live`): real execution on this machine. A store is built for the template, served
  by our HTTP server on 127.0.0.1, and reached through the trace-replaying pacing proxy (fresh
  link at the same trace offset for every method). The bundled sakura-mini runs the edit for
  real. Its template KV is small (~200 kB fp16) and its compute fast, so this mode measures the
  machinery (pipelining, stalls, bytes, quality), not the phone-scale trade-off. The manifest is
  taken as already on the phone (apps fetch manifests with the template gallery); shared codec
  tables and shards are fetched inside the timed edit.
* **phone profile** (`run_profile`): a trace-driven simulation of the same pipeline and the same
  policies with Klein-4B-sized KV (25 layers x 1,024 tokens x 2 x 3,072 values, 315 MB fp16) and
  per-step compute scaled from a published phone number (SD1.5 UNet, 62 ms/eval on Snapdragon 8
  Elite, Qualcomm AI Hub) by FLOPs. Rendition sizes (bits/value), distortions and decode
  throughputs are the ones measured on the mini model's real KV in this run. It is an
  extrapolation and is labelled as such everywhere.
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

METHODS = ("oracle", "on-device", "on-device-nocache", "raw-stream", "cachegen", "sakura")
CACHEGEN_LEVELS = ("cachegen:level=3", "cachegen:level=2", "cachegen:level=1")
SAKURA_LADDER = ("lossless", "uniform:bits=8", "layered:budgets=[1.0,2.0,3.0]")
LIVE_LADDER = SAKURA_LADDER + CACHEGEN_LEVELS


def sakura_renditions() -> tuple[str, ...]:
    """The rendition names the sakura policy may use (layered rungs are `<spec>#<rung>`)."""
    return ("lossless", "uniform:bits=8") + tuple(f"layered:budgets=[1.0,2.0,3.0]#{i}" for i in range(3))


# ---------------------------------------------------------------------------------------------
# live mode


def _quality(img: torch.Tensor, reference: torch.Tensor, truth: torch.Tensor, region: torch.Tensor | None) -> dict:
    from sakura.tasks.quality import psnr_per_image, ssim_per_image

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
             log: Callable[[str], None] = print) -> dict:
    """Run every method once on the same template, photo and trace segment; write JSON + table.

    Returns {"mode": "live", "rows": [per-method dict], ...}.
    """
    from sakura.link import load_trace
    from sakura.link.pacer import pacer_in_thread
    from sakura.models import load_model
    from sakura.runtime import BandwidthEstimator, CacheGenPolicy, FixedPolicy, RttEstimator, SakuraPolicy
    from sakura.runtime.live import profile_model, streamed_edit
    from sakura.server import serve_in_thread
    from sakura.store.build import build_store
    from sakura.tasks import get_task, get_template, heldout_photos

    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; expected some of {list(METHODS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    tr = load_trace(trace)
    model = load_model("sakura-mini")
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
    log(f"building store for {template} ({len(LIVE_LADDER)} codec settings) ...")
    build_store(store, templates=[template], ladder=LIVE_LADDER, calibration=2, steps=4, log=log)
    profile = profile_model(model)
    # the phone's estimate before the edit: mean rate over the 10 s of trace before the start
    prior = max(1.0, (tr.cumulative(offset_s) - tr.cumulative(max(0.0, offset_s - 10.0))) / min(10.0, max(offset_s, 1e-9))) \
        if offset_s > 0 else float(tr.rate[0]) or 1e5

    kv = model.extract_template_kv(timg, tpl.instruction).to(torch.float16)
    reference = model.edit(photo, template_kv=kv, steps=steps, seed=seed).image
    t0 = time.perf_counter()
    model.template_stream(timg, tpl.instruction)
    local_template_s = time.perf_counter() - t0

    from sakura.store.store import Store

    manifest = Store(store).get_manifest(model.fingerprint(), template)  # fetched with the gallery, untimed
    rows, images = [], {}
    with serve_in_thread(store) as url:
        for method in methods:
            log(f"  {method} ...")
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
                policy = {"raw-stream": FixedPolicy("lossless", name="raw-stream"),
                          "cachegen": CacheGenPolicy(CACHEGEN_LEVELS, target_s=local_template_s),
                          "sakura": SakuraPolicy()}[method]
                allowed = {"raw-stream": None, "cachegen": CACHEGEN_LEVELS, "sakura": sakura_renditions()}[method]
                with pacer_in_thread(url, tr, offset_s, rtt_ms / 1000) as purl:
                    res = streamed_edit(model, photo, base_url=purl, template_id=template, template_image=timg,
                                        instruction=tpl.instruction, policy=policy, profile=profile,
                                        bandwidth=BandwidthEstimator(prior_bps=prior),
                                        rtt=RttEstimator(prior_s=rtt_ms / 1000), steps=steps, seed=seed,
                                        manifest=manifest, renditions=allowed)
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
    result = {"mode": "live", "template": template, "photo_index": photo_index, "trace": trace, "offset_s": offset_s,
              "rtt_ms": rtt_ms, "steps": steps, "prior_bps": prior, "fp16_kv_bytes": kv.nbytes,
              "profile": asdict(profile), "rows": rows, "latency_ratios": ratios}
    (out_dir / "e2e_live.json").write_text(json.dumps(result, indent=2, default=float))
    table = live_table(result)
    (out_dir / "e2e_live.md").write_text(table)
    log(table)
    _plot_timelines(result, out_dir / "e2e_live_timeline.png")
    result["images"] = {"photo": photo, "template": timg, "truth": truth, **images}  # not in the JSON
    return result


def live_table(result: dict) -> str:
    lines = [f"Live (real execution on this machine, CPU, 1 thread): sakura-mini, template `{result['template']}`, "
             f"held-out photo {result['photo_index']}, trace `{result['trace']}` from {result['offset_s']} s, "
             f"RTT {result['rtt_ms']} ms, {result['steps']} steps; fp16 template KV {result['fp16_kv_bytes']} B.", "",
             "| method | latency (ms) | stall (ms) | bytes | local shards | PSNR vs lossless (dB) | PSNR vs truth (dB) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['method']} | {1000 * r['latency_s']:.1f} | {1000 * r['stall_s']:.1f} | {r['bytes']} | "
                     f"{r['local_shards']} | {_db(r['psnr_vs_lossless_db'])} | {_db(r['psnr_vs_truth_db'])} |")
    lines += ["", "Latency ratios (same run): " + ", ".join(f"{k} = {v:.2f}x" for k, v in result["latency_ratios"].items())]
    return "\n".join(lines) + "\n"


def _db(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.1f}"


def _plot_timelines(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if "timeline" in r]
    if not rows:
        return
    fig, axes = plt.subplots(len(rows), 1, figsize=(8, 1.6 * len(rows) + 0.6), sharex=True, squeeze=False)
    for ax, r in zip(axes[:, 0], rows):
        for s in r["timeline"]:
            y = s["index"]
            if s["source"] == "local":
                ax.barh(y, s["local_s"] * 1000, left=s["needed"] * 1000, color="tab:green", height=0.8)
                continue
            ax.barh(y, (s["fetch_end"] - s["t_request"]) * 1000, left=s["t_request"] * 1000, color="tab:blue", height=0.8)
            ax.barh(y, (s["decode_end"] - s["fetch_end"]) * 1000, left=s["fetch_end"] * 1000, color="tab:orange", height=0.8)
            if s["delivered"] > s["needed"]:
                ax.barh(y, (s["delivered"] - s["needed"]) * 1000, left=s["needed"] * 1000, color="tab:red",
                        height=0.3)
        ax.set_ylabel(r["method"], fontsize=8)
        ax.invert_yaxis()
    axes[-1, 0].set_xlabel("ms since photo in (blue fetch, orange decode, green local compute, red stall)")
    fig.suptitle("per-shard timeline, live mode", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# phone profile mode (trace-driven simulation, labelled extrapolation)


@dataclass(frozen=True)
class PhoneProfile:
    """Klein-4B-sized edit on a Snapdragon-8-Elite-class phone (extrapolated, see module doc).

    FLOPs model: 2 x params x tokens per forward pass (attention adds ~10 %, included below).
    Phone throughput: SD1.5 UNet, 62 ms/eval at 512x512 (Qualcomm AI Hub) and ~0.68 TFLOP per
    eval -> ~11 TFLOP/s effective. Klein-4B (4e9 params), 512x512 output: 1,024 image tokens,
    1,024 template tokens, ~512 text tokens.
    """

    name: str = "klein-4b-512px @ snapdragon-8-elite (extrapolated)"
    layers: int = 25
    template_tokens: int = 1024
    kv_values_per_token_layer: int = 2 * 3072
    params: float = 4e9
    step_tokens: int = 1024 + 512
    phone_flops: float = 0.68e12 / 0.062
    attention_overhead: float = 1.10
    steps: int = 4

    @property
    def fp16_bytes_per_layer(self) -> int:
        return self.template_tokens * self.kv_values_per_token_layer * 2

    @property
    def step_s(self) -> float:
        """One cached denoising step (template KV resident)."""
        return 2 * self.params * self.step_tokens * self.attention_overhead / self.phone_flops

    @property
    def template_s(self) -> float:
        """Computing the template's KV on the phone (its tokens through every layer once)."""
        return 2 * self.params * self.template_tokens * self.attention_overhead / self.phone_flops


def measured_ladder(store: str | Path, template: str) -> dict[str, dict]:
    """Per rendition: mean bits/value, mean expected distortion, over the shards of one template."""
    from sakura.store.store import Store

    st = Store(store)
    (fp, tid), = [k for k in st.manifest_keys() if k[1] == template]
    m = st.get_manifest(fp, tid)
    out: dict[str, dict] = {}
    for shard in m.shards:
        for r in shard.renditions:
            d = out.setdefault(r.name, {"codec": r.codec, "bpv": [], "image_mse": []})
            d["bpv"].append(8 * r.nbytes / (shard.fp16_bytes / 2))
            d["image_mse"].append(float(r.distortion.get("image_mse", 0.0)))
    return {k: {"codec": v["codec"], "bits_per_value": statistics.mean(v["bpv"]),
                "image_mse": statistics.mean(v["image_mse"])} for k, v in out.items()}


def measure_decode_throughput(store: str | Path, template: str, repeats: int = 3) -> dict[str, float]:
    """fp16-KV bytes produced per second of decode, per rendition, on one core of this machine."""
    from sakura.codec import CodecTables, ShardId, decode_any
    from sakura.store.store import Store

    st = Store(store)
    (fp, tid), = [k for k in st.manifest_keys() if k[1] == template]
    m = st.get_manifest(fp, tid)
    tfp = m.kv_layout["template_fingerprint"]
    tables = {t.name: CodecTables.from_bytes(st.object_path(t.object).read_bytes(), ShardId(fp, tfp, -1))
              for t in m.tables}
    out: dict[str, float] = {}
    for r_i, r in enumerate(m.shards[0].renditions):
        total_s, total_b = 0.0, 0
        for i, shard in enumerate(m.shards):
            rend = shard.renditions[r_i]
            data = st.object_path(rend.object).read_bytes()[:rend.nbytes]
            tbl = tables[rend.tables[0]] if rend.tables else None
            best = float("inf")
            for _ in range(repeats):
                t = time.process_time()
                decode_any(data, ShardId(fp, tfp, i), tbl)
                best = min(best, time.process_time() - t)
            total_s += max(best, 1e-6)
            total_b += shard.fp16_bytes
        out[r.name] = total_b / total_s
    return out


def _simulate_method(method: str, prof: PhoneProfile, ladder: dict, decode_bps: dict, link, prior_bps: float,
                     rtt_s: float, decode_workers: int = 2) -> dict:
    """One method on one simulated link through the same driver the live runtime uses."""
    from sakura.runtime import BandwidthEstimator, CacheGenPolicy, FixedPolicy, Route, RttEstimator, SakuraPolicy, ShardSpec
    from sakura.runtime.sim import simulate_edit

    steps = prof.steps
    if method == "oracle":
        return {"latency_s": steps * prof.step_s, "bytes": 0, "stall_s": 0.0, "image_mse": 0.0, "local_shards": 0}
    if method == "on-device":
        return {"latency_s": prof.template_s + steps * prof.step_s, "bytes": 0, "stall_s": 0.0, "image_mse": 0.0,
                "local_shards": prof.layers}
    if method == "on-device-nocache":
        return {"latency_s": steps * (prof.template_s + prof.step_s), "bytes": 0, "stall_s": 0.0, "image_mse": 0.0,
                "local_shards": prof.layers}
    B = prof.fp16_bytes_per_layer
    allowed = {"raw-stream": ("lossless",), "cachegen": CACHEGEN_LEVELS, "sakura": sakura_renditions()}[method]
    routes = tuple(Route(name, int(B * v["bits_per_value"] / 16), B / decode_bps.get(name, 50e6), v["image_mse"])
                   for name, v in ladder.items() if name in allowed)
    specs = [ShardSpec(routes, prof.step_s / prof.layers, prof.template_s / prof.layers)] * prof.layers
    policy = {"raw-stream": FixedPolicy("lossless"),
              "cachegen": CacheGenPolicy(CACHEGEN_LEVELS, target_s=prof.template_s),
              "sakura": SakuraPolicy()}[method]
    res = simulate_edit(specs, policy, link=link, rtt_s=rtt_s, bandwidth=BandwidthEstimator(prior_bps=prior_bps),
                        rtt=RttEstimator(prior_s=rtt_s), decode_workers=decode_workers)
    return {"latency_s": res.first_step_s + (steps - 1) * prof.step_s, "bytes": res.bytes, "stall_s": res.stall_s,
            "image_mse": res.image_mse, "local_shards": res.local_layers}


def run_profile(out_dir: str | Path, *, store: str | Path | None = None, template: str = "sticker-00",
                offsets_per_trace: int = 3, seed: int = 0, rtt_ms: float = 40.0, profile: PhoneProfile = PhoneProfile(),
                methods: Sequence[str] = METHODS, families: Sequence[str] | None = None,
                log: Callable[[str], None] = print) -> dict:
    """Simulate every method on every trace (seeded start offsets) under the phone profile."""
    import random

    from sakura.link import list_traces, load_trace
    from sakura.runtime import TraceLink
    from sakura.store.build import build_store

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = None
    if store is None:
        tmp = tempfile.TemporaryDirectory(prefix="sakura-profile-")
        store = tmp.name
        build_store(store, templates=[template], ladder=LIVE_LADDER, calibration=2, steps=4, log=log)
    ladder = measured_ladder(store, template)
    decode_bps = measure_decode_throughput(store, template)
    if tmp is not None:
        tmp.cleanup()
    rng = random.Random(seed)
    runs = []
    specs = list_traces()
    if families:
        specs = [s for s in specs if s.split("/")[0] in families]
    for spec in specs:
        tr = load_trace(spec)
        for k in range(offsets_per_trace):
            offset = rng.uniform(0, max(0.0, tr.period_s - 60.0))
            prior = max(1.0, (tr.cumulative(offset + 10.0) - tr.cumulative(offset)) / 10.0)  # rate seen before start
            link = TraceLink(tr, offset_s=offset + 10.0)
            row = {"trace": spec, "family": spec.split("/")[0], "offset_s": offset + 10.0}
            for m in methods:
                row[m] = _simulate_method(m, profile, ladder, decode_bps, link, prior, rtt_ms / 1000)
            runs.append(row)
    summary = _profile_summary(runs, methods)
    result = {"mode": "phone profile (trace-driven simulation, extrapolated; see PhoneProfile)",
              "profile": {**asdict(profile), "step_s": profile.step_s, "template_s": profile.template_s,
                          "fp16_kv_bytes": profile.fp16_bytes_per_layer * profile.layers},
              "ladder_measured_on_mini": ladder, "decode_fp16_bytes_per_s_measured_here": decode_bps,
              "rtt_ms": rtt_ms, "offsets_per_trace": offsets_per_trace, "seed": seed,
              "summary": summary, "runs": runs}
    (out_dir / "e2e_profile.json").write_text(json.dumps(result, indent=2, default=float))
    table = profile_table(result, methods)
    (out_dir / "e2e_profile.md").write_text(table)
    log(table)
    _plot_profile(result, methods, out_dir / "e2e_profile.png")
    return result


def _profile_summary(runs: list[dict], methods: Sequence[str]) -> dict:
    fams = sorted({r["family"] for r in runs})
    out = {}
    for fam in fams + ["all"]:
        rs = [r for r in runs if fam == "all" or r["family"] == fam]
        d = {m: statistics.median(r[m]["latency_s"] for r in rs) for m in methods}
        ratio = {}
        for b in methods:
            if b != "sakura" and "sakura" in methods:
                # geometric mean of per-run ratios (pairs taken in the same simulated run)
                ratio[f"{b}/sakura"] = math.exp(statistics.mean(math.log(r[b]["latency_s"] / r["sakura"]["latency_s"])
                                                                for r in rs))
        out[fam] = {"runs": len(rs), "median_latency_s": d, "latency_ratio_geomean": ratio}
    return out


def profile_table(result: dict, methods: Sequence[str]) -> str:
    p = result["profile"]
    lines = [f"Phone profile (trace-driven simulation, EXTRAPOLATED): {p['name']}; fp16 template KV "
             f"{p['fp16_kv_bytes'] / 1e6:.0f} MB; cached step {p['step_s']:.2f} s, template compute "
             f"{p['template_s']:.2f} s, {p['steps']} steps; RTT {result['rtt_ms']} ms; "
             f"{result['offsets_per_trace']} seeded offsets per trace.", "",
             "Median latency (s) per trace family:", "",
             "| family | runs | " + " | ".join(methods) + " |", "|---|---:|" + "---:|" * len(methods)]
    for fam, s in result["summary"].items():
        lines.append(f"| {fam} | {s['runs']} | " + " | ".join(f"{s['median_latency_s'][m]:.2f}" for m in methods) + " |")
    lines += ["", "Latency of each method / sakura (geometric mean of per-run ratios):", "",
              "| family | " + " | ".join(k for k in result["summary"]["all"]["latency_ratio_geomean"]) + " |",
              "|---|" + "---:|" * len(result["summary"]["all"]["latency_ratio_geomean"])]
    for fam, s in result["summary"].items():
        lines.append(f"| {fam} | " + " | ".join(f"{v:.2f}" for v in s["latency_ratio_geomean"].values()) + " |")
    return "\n".join(lines) + "\n"


def _plot_profile(result: dict, methods: Sequence[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = [f for f in result["summary"] if f != "all"]
    fig, ax = plt.subplots(figsize=(8, 3.4))
    w = 0.8 / len(methods)
    for j, m in enumerate(methods):
        ax.bar([i + j * w for i in range(len(fams))], [result["summary"][f]["median_latency_s"][m] for f in fams],
               width=w, label=m)
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(fams))], fams, fontsize=8)
    ax.set_ylabel("median latency (s)")
    ax.set_yscale("log")
    ax.set_title("phone profile (extrapolated): Klein-4B-sized template KV", fontsize=9)
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
