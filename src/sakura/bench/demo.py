"""`sakura demo`: the main job on the bundled defaults, end to end, where streaming can pay.

1. Cloud: build a store for one template of the bundled library (capture the KV with the bundled
   model, encode the rendition ladder, measure each rendition's image distortion).
2. Check that injected template KV reproduces the in-sequence edit bit for bit (`torch.equal`).
3. Phone, live and time-dilated: serve the store on 127.0.0.1 behind a pacing proxy replaying a
   real 5G trace (bundled with the package), and edit a held-out photo with on-device, CacheGen
   (three variants) and sakura, each at the named workload's times divided by D (a three-image
   style template on a ~3.6 TFLOP/s phone: the kind of edit where streaming can pay), `repeats`
   times each, interleaved, with the simulator's prediction beside each.
4. Write the edits side by side, the per-layer timeline, the latency-quality frontier and the
   regime map (sakura vs the best baseline over link rate x phone, simulated on the same measured
   renditions); every file is listed in `OUTPUTS` (and in docs/demo.md).

D = 20 rather than the dilated bench's 40: a time-dilated run multiplies every real millisecond the
runtime spends outside the workload's times (a thread waking late on a loaded 2-core machine, a
request's handling) by D; at 20 the live runs stay within a few per cent of the simulator in every
run here, at twice the wall time (about 40 s of live runs).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import torch

from sakura.util.figures import save_panels
from sakura.util.fsutil import write_json
import numpy as np
from sakura.bench.dilated import equal_psnr_ratios, run_dilated
from sakura.bench.e2e import plot_timelines
from sakura.bench.profile import BASELINES, DEFAULT_RATES_MBPS, run_methods, with_measured_pool
from sakura.bench.workloads import PHONES, ceilings, get_phone, get_workload, workload_costs
from sakura.cloud.tasks import get_template, heldout_photos
from sakura.emulation.traces import constant_trace, describe_trace, load_trace
from sakura.models import TemplateKV, load_model
from sakura.phone import TraceLink
from sakura.wire.store.store import Store

from sakura.bench.harness import get_logger, markdown_head

log = get_logger(__name__)

#: every file `run_demo` writes into its folder, with what it shows (docs/demo.md lists the same)
OUTPUTS = {
    "demo.md": "the method table (live median [min-max] over the runs, simulated, on-device / method, layers "
               "computed here, PSNR) and the equal-quality ratio with its spread: what the demo printed",
    "summary.json": "the same figures as JSON, every run's latency included (for scripts and tests)",
    "demo.png": "the edited photo by every method, each titled with its live latency and PSNR, beside the photo, "
                "the template, the ground truth and the lossless-KV edit",
    "timeline.png": "per layer and method (first run): fetch, decode, computed here, forward compute and stalls "
                    "against phone seconds since the photo came in; the dashed line is the end of the edit",
    "dilated_frontier.png": "latency vs quality on the demo's trace: each method's simulated sweep (level caps, "
                            "quality floors) and the live runs",
    "regimes.png": "where streaming pays: best baseline / sakura, simulated on this store's measured renditions, "
                   "over constant link rates x phone compute (>1: sakura faster)",
    "dilated.json": "every live run and simulation in full (per-layer timelines, choices, bytes)",
    "dilated.md": "the per-method table of the time-dilated run (as `sakura bench dilated` writes it)",
    "store/": "the store the demo built and served (manifest, renditions, codec tables)",
    "<template>.kv.safetensors": "the template's KV as the model computed it (the injected-KV check's input)",
}


def _ratio_runs(by: dict, num: str, den: str) -> list[float]:
    """num / den per run (run i of each: interleaved, so they saw the same machine)."""
    a, b = by[num].get("live_runs_phone_s") or [], by[den].get("live_runs_phone_s") or []
    return [x / y for x, y in zip(a, b)]


def _med(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.median(xs):.2f}" + (f" [{min(xs):.2f}-{max(xs):.2f}]" if len(xs) > 1 else "")


def run_demo(out_dir: Path, seed: int = 0, steps: int = 8, template: str = "sticker-00",
             workload: str = "style3x1024-out512", phone: str = "3", D: float = 20.0, repeats: int = 3,
             trace: str = "umn_5gophers/All-Carriers/01-Throughput/data.csv#VERIZON/8/US-East/102",
             model_name: str = "sakura-mini") -> dict:

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    model = load_model(model_name)
    tpl = get_template(template, model.cfg.image_size)
    kv = model.extract_template_kv(tpl.image[None], tpl.instruction)
    loaded = TemplateKV.load(kv.save(out_dir / f"{template}.kv.safetensors"), model_fingerprint=model.fingerprint(),
                             template_fingerprint=kv.template_fingerprint)
    photo = heldout_photos(model.cfg.image_size)[:1]
    same = torch.equal(model.edit(photo, template_kv=loaded, steps=steps, seed=seed).image,
                       model.edit(photo, template=tpl.image[None], instruction=tpl.instruction, steps=steps,
                                  seed=seed).image)
    log.info(f"injected KV == in-sequence edit (torch.equal): {same}")

    words = describe_trace(trace)
    mbps = load_trace(trace).mean_mbps
    res = run_dilated(workload, phone, D=D, traces=(trace,), template=template, store=out_dir / "store",
                      out_dir=out_dir, image_steps=steps, model_name=model_name, repeats=repeats)
    im = res.pop("images")
    c = workload_costs(get_workload(workload), get_phone(phone))
    ceil = ceilings(c)
    by = {r["method"]: r for r in res["rows"] if r["trace"] == trace}
    # latency: the live median; the oracle has no live run (free, instant KV is not a runtime)
    lat = lambda m: by[m]["live_phone_s"] if not math.isnan(by[m]["live_phone_s"]) else by[m]["sim_phone_s"]  # noqa: E731

    _pictures(out_dir, res, by, im, trace, words, mbps, lat)
    _regimes(out_dir, res, template, workload, phone, mbps)

    names = {"cachegen": "cachegen (as published)", "cachegen-fair": "cachegen-fair (ours)",
             "cachegen-L3": "cachegen-L3 (held to level 3)"}
    runs = len(by["sakura"].get("live_runs_phone_s") or [])
    lines = [f"sakura demo ({model_name}): {workload} on {c.phone}, live time-dilated /{D:g}, {runs} runs per method "
             f"(interleaved), on {words} (`{trace}`, {mbps:,.0f} Mbit/s mean; real sockets, threads, decoding, model; "
             f"times in phone seconds). Ceilings with free, instant KV: {ceil['vs on-device']:.2f}x vs on-device, "
             f"{ceil['vs on-device-nocache']:.2f}x vs on-device-nocache. Decode times: "
             f"{res.get('decode_rates', '?')}.", "",
             *markdown_head(['method', 'live (s), median [min-max]', 'simulated (s)', 'live / sim, every run', 'on-device / method (ceiling)', 'layers computed here', 'PSNR vs lossless KV (dB)'], 'lrrrrrr')]
    for m in ("oracle", "on-device", "cachegen", "cachegen-fair", "cachegen-L3", "sakura"):
        r = by[m]
        xs = r.get("live_runs_phone_s") or []
        ls = r.get("live_over_sim_runs") or []
        ps = r.get("psnr_vs_lossless_db")
        if m == "oracle":  # simulated only: its ratio is the ceiling by definition (simulated on-device / oracle)
            vs = f"{by['on-device']['sim_phone_s'] / r['sim_phone_s']:.2f} (= ceiling; simulated)"
        elif m == "on-device":
            vs = "1 (the reference)"
        else:  # live / live, each run paired with the on-device run of the same round
            vs = f"{_med(_ratio_runs(by, 'on-device', m))} ({ceil['vs on-device']:.2f})"
        lines.append(f"| {names.get(m, m)} | {_fmt_runs(xs)} | "
                     f"{r['sim_phone_s']:.1f} | {'-' if not ls else ', '.join(f'{x:.3f}' for x in ls)} | {vs} | "
                     f"{r.get('local_layers', 0)} | {'-' if ps is None else f'{ps:.1f}'} |")
    fr = equal_psnr_ratios(res, trace)
    streamed = ("cachegen", "cachegen-fair", "cachegen-L3", "sakura")
    oracle = by["oracle"]["sim_phone_s"]
    sim = lambda m: by[m]["sim_phone_s"]  # noqa: E731
    eq_runs = {"cachegen-L3 / sakura": _ratio_runs(by, "cachegen-L3", "sakura"),
               "cachegen / sakura": _ratio_runs(by, "cachegen", "sakura"),
               "cachegen-fair / sakura": _ratio_runs(by, "cachegen-fair", "sakura")}
    worst = max((abs(x - 1) for r in by.values() for x in r.get("live_over_sim_runs") or []), default=math.nan)
    lines += ["", f"**Equal quality, live: cachegen-L3 / sakura {_med(eq_runs['cachegen-L3 / sakura'])}** (median "
              f"[min-max] over the {runs} runs; >1: sakura faster) at {by['cachegen-L3'].get('psnr_vs_lossless_db', 0):.1f} "
              f"vs {by['sakura'].get('psnr_vs_lossless_db', 0):.1f} dB; cachegen / sakura "
              f"{_med(eq_runs['cachegen / sakura'])}; cachegen-fair / sakura {_med(eq_runs['cachegen-fair / sakura'])}"
              + "".join(f"; frontier at L3 PSNR (simulated): {m} / sakura {v:.2f}" for m, v in fr.items())
              + f". The oracle (all KV resident) bounds every method at {oracle:.1f} s; the streaming methods are "
              f"{min(lat(m) for m in streamed) / oracle - 1:.0%}-{max(lat(m) for m in streamed) / oracle - 1:.0%} above "
              f"it live (median; simulated {min(sim(m) for m in streamed) / oracle - 1:.0%}-"
              f"{max(sim(m) for m in streamed) / oracle - 1:.0%}), so no ratio between them can exceed that gap. "
              f"Live vs simulated: worst |live/sim - 1| {worst:.1%} over every run of every method.", "",
              "cachegen-L3 holds CacheGen's level 3 on every chunk (else recomputes it); sakura's default floor is the "
              "same image quality (CacheGen-L3's summed image MSE), and the PSNR column shows what each delivered. "
              "on-device / method pairs each run with the on-device run of the same round; a live ratio can pass the "
              "ceiling (simulated on-device / oracle) only by that round's noise, and the oracle row is the ceiling "
              "itself. Frontier: the simulated sweep on the same inputs (dilated_frontier.png)."]
    table = "\n".join(lines) + "\n"
    (out_dir / "demo.md").write_text(table)
    log.info(table)
    summary = {"injected_kv_equals_in_sequence_torch_equal": same, "workload": workload, "phone": c.phone, "D": D,
               "repeats": runs, "trace": trace, "trace_words": words, "trace_mean_mbps": mbps, "ceilings": ceil,
               "latency_phone_s": {m: by[m]["live_phone_s"] for m in by},
               "latency_runs_phone_s": {m: by[m].get("live_runs_phone_s", []) for m in by},
               "simulated_phone_s": {m: by[m]["sim_phone_s"] for m in by},
               "live_over_sim_runs": {m: by[m].get("live_over_sim_runs", []) for m in by},
               "worst_abs_live_over_sim_minus_1": worst,
               "psnr_vs_lossless_db": {m: by[m].get("psnr_vs_lossless_db") for m in by},
               "equal_quality_ratio_runs": eq_runs,
               "equal_quality_ratios": {k: statistics.median(v) for k, v in eq_runs.items() if v},
               "frontier_ratios_at_L3_psnr": fr, "decode_rates": res.get("decode_rates"), "outputs": OUTPUTS}
    write_json(out_dir / "summary.json", summary, indent=2, default=float)
    log.info("wrote " + ", ".join(str(out_dir / f.replace("<template>", template)) for f in OUTPUTS))
    if not same:
        raise SystemExit("injected KV did not reproduce the in-sequence edit")
    return summary


def _fmt_runs(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.median(xs):.1f}" + (f" [{min(xs):.1f}-{max(xs):.1f}]" if len(xs) > 1 else "")


def _pictures(out_dir: Path, res: dict, by: dict, im: dict, trace: str, words: str, mbps: float, lat) -> None:
    """demo.png (every method's edit, titled) and timeline.png (first run of every method)."""

    shown = [m for m in ("on-device", "cachegen", "cachegen-fair", "cachegen-L3", "sakura") if m in im]
    label = {"sakura": "sakura (streamed)", "cachegen": "cachegen (published)", "cachegen-fair": "cachegen-fair (ours)",
             "cachegen-L3": "cachegen-L3"}

    def title(m: str) -> str:
        ps = by[m].get("psnr_vs_lossless_db")
        return f"{label.get(m, m)}\n{lat(m):.1f} s, {'-' if ps is None else f'{ps:.1f}'} dB"

    oracle_s = by["oracle"]["sim_phone_s"]
    save_panels(out_dir / "demo.png",
                [[(im["photo"], "photo (held out)"), (im["template"], "template (style)"),
                  (im["truth"], "ground truth"), (im["lossless"], f"lossless KV (oracle)\n{oracle_s:.1f} s simulated")],
                 [(im[m], title(m)) for m in shown]],
                title=f"{res['workload']} on {res['phone']}, {words}\n"
                      "each edit: latency (phone seconds, live median) and PSNR vs the lossless-KV edit")
    rows = []
    for m in ("on-device", "cachegen", "cachegen-fair", "cachegen-L3", "sakura"):
        r = by.get(m)
        if r and r.get("timeline"):
            first = (r.get("live_runs_phone_s") or [r["live_phone_s"]])[0] / res["D"]
            rows.append({"method": m, "timeline": r["timeline"], "latency_s": first, "post_s": res["dilation"]["post_s"],
                         "label": f"{m}: live run 1, {first * res['D']:.1f} s (simulated {r['sim_phone_s']:.1f} s)"})
    plot_timelines(rows, out_dir / "timeline.png", scale=res["D"], unit="phone seconds",
                   title=f"per-layer timeline of each method's first live run (time-dilated /{res['D']:g}), "
                         f"{res['workload']} on {res['phone']}\n{words}, {mbps:,.0f} Mbit/s mean")


def _regimes(out_dir: Path, res: dict, template: str, workload: str, phone: str, mbps: float) -> None:
    """regimes.png: the same measured renditions, simulated over constant link rate x phone."""
    import matplotlib  # lazy: plots only: not imported by a run that draws nothing

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: plots only: not imported by a run that draws nothing


    ladder = _ladder_from_result(out_dir / "store", template, res)
    ladder, pool = with_measured_pool(ladder)   # the measured pool, not an assumed 4 cores
    w = get_workload(workload)
    grid = np.full((len(PHONES), len(DEFAULT_RATES_MBPS)), np.nan)
    for i, ph in enumerate(PHONES):
        costs = workload_costs(w, ph)
        for j, r in enumerate(DEFAULT_RATES_MBPS):
            m = run_methods(costs, ladder, TraceLink(constant_trace(r)), prior_bps=r * 1e6 / 8, rtt_s=0.04,
                            decode_workers=pool.workers, methods=("on-device", "on-device-nocache", "raw-stream",
                                                                  "cachegen", "cachegen-fair", "sakura"))
            grid[i, j] = min(m[b]["latency_s"] for b in BASELINES) / m["sakura"]["latency_s"]
    fig, ax = plt.subplots(figsize=(9.6, 4.2))
    imh = ax.imshow(grid, aspect="auto", cmap="RdYlGn", vmin=0.8, vmax=max(2.0, float(np.nanmax(grid))))
    for (a, b), v in np.ndenumerate(grid):
        ax.text(b, a, f"{v:.2f}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(DEFAULT_RATES_MBPS)), [f"{x:g}" for x in DEFAULT_RATES_MBPS], fontsize=7)
    ax.set_yticks(range(len(PHONES)), [p.name for p in PHONES], fontsize=7)
    ax.set_xlabel("link rate (Mbit/s, constant; the demo's trace averages "
                  f"{mbps:,.0f})", fontsize=8)
    ax.set_ylabel("phone compute", fontsize=8)
    here = [p.name for p in PHONES].index(get_phone(phone).name)
    near = min(range(len(DEFAULT_RATES_MBPS)), key=lambda j: abs(math.log(DEFAULT_RATES_MBPS[j] / mbps)))
    ax.add_patch(plt.Rectangle((near - 0.5, here - 0.5), 1, 1, fill=False, lw=1.5, ec="k"))
    fig.colorbar(imh, ax=ax, fraction=0.03, label="best baseline / sakura")
    ax.set_title(f"Where streaming pays, {workload}: SIMULATED on this store's measured renditions and decode rates\n"
                 "latency of the best baseline (the fastest of on-device, on-device-nocache, raw-stream, cachegen, "
                 "cachegen-fair) / sakura's; >1: sakura faster\n1.00: a tie (a slow link: every method computes on the "
                 "device; a fast link and a slow phone: every streaming method is at the oracle)\nbox: the cell nearest "
                 "the live run (phone and mean link rate)", fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "regimes.png", dpi=110)
    plt.close(fig)


def _ladder_from_result(store: Path, template: str, res: dict) -> dict:
    """The measured ladder (bits/value, image MSE, decode rate) in the form `sakura.bench.profile` takes."""

    st = Store(store)
    (fp, tid), = [k for k in st.manifest_keys() if k[1] == template]
    m = st.get_manifest(fp, tid)
    out: dict = {}
    for s in m.shards:
        for r in s.renditions:
            d = out.setdefault(r.name, {"codec": r.codec, "bpv": [], "mse": []})
            d["bpv"].append(8 * r.nbytes / (s.fp16_bytes / 2))
            d["mse"].append(float(r.distortion.get("image_mse", 0.0)))
    D = res["D"]

    c = workload_costs(get_workload(res["workload"]), get_phone(res["phone"].split(" (")[0]))
    f = c.layers / len(m.shards)
    rend = {}
    for k, v in out.items():
        pad = res["decode_pad_s"].get(k, 0.0)
        rate = c.kv_fp16_bytes_per_layer * f / (pad * D) if pad else 2e9
        rend[k] = {"codec": v["codec"], "bits_per_value": statistics.mean(v["bpv"]),
                   "image_mse": statistics.mean(v["mse"]), "decode_fp16_bytes_per_cpu_s": rate}
    floors = [s.quality_floor["image_mse"] for s in m.shards if s.quality_floor]
    return {"model": "sakura-mini", "template": template, "layers": len(m.shards), "renditions": rend,
            "floor_image_mse": statistics.mean(floors) if floors else None}
