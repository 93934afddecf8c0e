"""Time-dilated live runs: the real runtime (sockets, threads, decoding, the mini model) on a
phone workload's time scale divided by D, and the simulator on the same inputs, side by side.

Why: sakura-mini's template KV is ~200 kB and its layers take milliseconds, so a plain live run
on this CPU says nothing about a phone streaming Klein-sized KV. Here every ratio of the named
workload is kept while the clock runs D times faster:

* each of the mini model's 6 layers stands for L_w / 6 of the workload's layers: a template
  layer computed on the device takes ``template_layer_s x L_w/6 / D`` (the real mini compute,
  then a sleep for the rest); the first pass's forward compute per layer likewise;
* the text encoder and VAE encode run before the transformer (``pre``), the other passes and
  the VAE decode after it (``post``), as sleeps of their workload time / D;
* the link is the trace with time / D and rate x D x beta, where beta = the mini model's fp16
  bytes per layer / (the workload's x L_w/6): a rendition's real bytes then take as long to
  arrive, relative to compute, as the workload's would; the RTT is divided by D;
* decoding a shard takes at least the workload's decode time (per core, measured on a
  Klein-sized layer) x L_w/6 / D: the real decode, then a sleep.

The simulator (`sakura.phone.sim`) is given exactly these per-layer times, the scaled link and
the real rendition sizes; both run the same driver and policies. `validate` reports, per method
and trace, live vs simulated latency (ratio), in dilated seconds and in phone seconds (x D).
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from tqdm import tqdm

from sakura.emulation.device import Dilation, DilatedDevice, decode_padding, dilate_trace  # noqa: F401
from sakura.util.psnr import psnr_db
from sakura.bench.harness import get_logger, markdown_table, publish
from sakura.bench.decode_rates import PHONE, describe_rates, load_scaling, load_split
from sakura.bench.profile import decode_rates, mean_bits_per_value
from sakura.bench.workloads import ceilings, get_phone, get_workload, workload_costs
from sakura.cloud.builder.pipeline import DEFAULT_LADDER, build_store
from sakura.cloud.tasks import get_task, get_template, heldout_photos
from sakura.cloud.tasks.quality import psnr_per_image
from sakura.emulation import load_trace
from sakura.emulation.pacer import pacing_proxy_in_thread
from sakura.emulation.traces import describe_trace
from sakura.models import TemplateKV, load_model
from sakura.phone import BandwidthEstimator, Route, RttEstimator, ShardSpec, TraceLink, policies
from sakura.phone.live import DeviceProfile, Emulation, streamed_edit
from sakura.phone.policies import CACHEGEN_LEVELS
from sakura.phone.sim import simulate_edit
from sakura.wire.server import serve_in_thread
from sakura.wire.store.store import Store

log = get_logger(__name__)

METHODS = ("oracle", "on-device", "cachegen", "cachegen-fair", "cachegen-L3", "sakura")
#: a fast and a median 5G trace and an LTE one (../shared/traces)
DEFAULT_TRACES = ("umn_5gophers/All-Carriers/01-Throughput/data.csv#VERIZON/8/US-East/102",
                  "umn_5gophers/All-Carriers/03-User-Mobility/car-driving-trace-1.csv#Verizon",
                  "mahimahi_cellular/TMobile-LTE-short.down")


@contextlib.contextmanager
def _gc_frozen():
    """Around the live runs: collect once and freeze what survives (the model, the store, torch,
    matplotlib), so a collection during a run has only that run's garbage to scan. A full
    collection of this process takes 0.6-1.0 s on a loaded 2-core VM and stops every Python thread
    (fetch stage, pacing proxy, server): at D = 40 that reads as 25-40 phone seconds in whichever
    method it lands on (the issue's run that spent ~20 s "fetching layers 0-1"), where a phone's
    own pauses are milliseconds of its seconds."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def _no_gc_pause():
    """One live run with the cyclic collector off (inside `_gc_frozen`; it runs between runs)."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def make_dilation(workload: str, phone: str, D: float, *, mini_layers: int, mini_fp16_bytes_per_layer: int,
                  rtt_ms: float = 40.0) -> Dilation:

    c = workload_costs(get_workload(workload), get_phone(phone))
    f = c.layers / mini_layers
    beta = mini_fp16_bytes_per_layer / (c.kv_fp16_bytes_per_layer * f)
    post = (c.passes - 1) * c.layers * c.live_layer_s + c.vae_decode_s
    return Dilation(workload=workload, phone=c.phone, D=D, layers_per_mini_layer=f, beta=beta,
                    local_s=c.template_layer_s * f / D, compute_s=(c.photo_layer_s + c.live_layer_s) * f / D,
                    pre_s=(c.text_encoder_s + c.vae_encode_s) / D, post_s=post / D, rtt_s=rtt_ms / 1000 / D,
                    oracle_s=c.oracle_s / D, on_device_s=c.on_device_s / D,
                    _klein_layer_bytes=c.kv_fp16_bytes_per_layer)


def run_dilated(workload: str = "style3x1024-out512", phone: str = "3", *, D: float = 40.0,
                traces: Sequence[str] = DEFAULT_TRACES,
                offset_s: float = 30.0, template: str = "sticker-00", rtt_ms: float = 40.0, decode_workers: int | None = None,
                store: str | Path | None = None, out_dir: str | Path | None = None, image_steps: int = 8,
                model_name: str = "sakura-mini", repeats: int = 1, rebuild: bool = True) -> dict:
    """Live (dilated) and simulated runs of every method on each trace; images for the first trace.

    repeats: live runs of every method per trace, interleaved (method by method, round after round,
    so a machine that slows down slows every method alike); each row keeps every run's latency
    (``live_runs_s``) and reports the median. rebuild: False reuses ``store`` when it already holds
    the template (for repeated investigations; the demo and the bench build afresh).

    The steps, top to bottom: `_Run.prepare` (model, store, manifest, the dilation and the phone's
    decode model), then per trace `_trace_rows` (every method live, beside the simulator) and
    `_frontier` (the simulated latency-quality frontier), then `_result` (the record, written)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    torch.set_num_threads(1)
    with contextlib.ExitStack() as stack:
        if store is None:
            store = stack.enter_context(tempfile.TemporaryDirectory(prefix="sakura-dilated-"))
        run = _Run.prepare(workload, phone, D, template=template, store=Path(store), rebuild=rebuild, rtt_ms=rtt_ms,
                           decode_workers=decode_workers, image_steps=image_steps, model_name=model_name)
        rows, images, frontier = [], {}, []
        bar = tqdm(total=len(traces) * repeats * sum(m != "oracle" for m in METHODS), desc="live runs", unit="run",
                   disable=None)
        with serve_in_thread(store) as url, _gc_frozen(), bar:
            for k, tname in enumerate(traces):
                link = _TraceStart.at(tname, offset_s, run.dil)
                rows += _trace_rows(run, tname, link, url, repeats=repeats, bar=bar,
                                    images=images if k == 0 else None)
                frontier += _frontier(run, tname, link)
    return _result(run, rows, frontier, images, out_dir)


@dataclass
class _TraceStart:
    """A trace dilated to the run's time scale, the offset the edit starts at, and the bandwidth
    a phone would have estimated there (the mean over the 10 phone-seconds before)."""

    trace: Any
    offset_s: float
    prior_bps: float

    @classmethod
    def at(cls, name: str, offset_s: float, dil: Dilation) -> "_TraceStart":
        tr = dilate_trace(load_trace(name), dil)
        off = offset_s / dil.D
        prior = max(1.0, (tr.cumulative(off) - tr.cumulative(max(0.0, off - 10.0 / dil.D))) / (10.0 / dil.D))
        return cls(tr, off, prior)


@dataclass
class _Run:
    """Everything a dilated run shares across traces and methods (`prepare` builds it)."""

    model: Any
    tpl: Any
    template: str
    photo: torch.Tensor
    timg: torch.Tensor
    m: Any                      # the template's manifest
    dil: Dilation
    pad: dict                   # rendition -> dilated decode seconds (the phone-class decoder)
    split: float                # one shard over idle workers: the measured speed-up
    decode_workers: int
    rates_desc: str
    allowed: dict               # method -> renditions it may fetch
    held_tables: dict           # codec tables the phone holds with the manifest
    floor: list                 # per shard: the quality floor's image MSE (or None)
    device: DilatedDevice
    kv_exact: Any
    reference: torch.Tensor     # the lossless-KV edit (images are compared with it)
    image_steps: int
    workload: str
    phone: str
    model_name: str

    @classmethod
    def prepare(cls, workload: str, phone: str, D: float, *, template: str, store: Path, rebuild: bool,
                rtt_ms: float, decode_workers: int | None, image_steps: int, model_name: str) -> "_Run":
        model = load_model(model_name)
        size = model.cfg.image_size
        tpl = get_template(template, size)
        photo, timg = heldout_photos(size)[:1], tpl.image[None]
        ladder_specs = ("lossless",) + tuple(DEFAULT_LADDER) + CACHEGEN_LEVELS
        have = Path(store, "index.json").is_file() and any(k[1] == template for k in Store(store).manifest_keys())
        if rebuild or not have:
            log.info("building the store for %s (%s) ...", template, ", ".join(ladder_specs))
            build_store(store, model_name=model_name, templates=[template], ladder=ladder_specs, calibration=2,
                        steps=4, log=lambda s: None)
        st = Store(store)
        (fp, tid), = [k for k in st.manifest_keys() if k[1] == template]
        m = st.get_manifest(fp, tid)
        dil = make_dilation(workload, phone, D, mini_layers=model.num_layers,
                            mini_fp16_bytes_per_layer=m.shards[0].fp16_bytes, rtt_ms=rtt_ms)
        # a phone's decode: the phone-class rates (128-bit proxy), not this server's AVX-512 kernels
        rates_desc = describe_rates(target=PHONE)
        log.info("decode: %s", rates_desc)
        rates = decode_rates([r.name for r in m.shards[0].renditions], bits_per_value=mean_bits_per_value(m),
                             target=PHONE)
        pool = load_scaling(decode_workers, target=PHONE)  # the measured pool, not an assumed count
        rates = {k: v * pool.per_worker for k, v in rates.items()}
        # the live pool beside this simulation splits a shard over idle workers: model that too, at the
        # measured factor, so live and simulated decode the same way (1.0 with one worker)
        split = load_split(target=PHONE) if pool.workers > 1 else 1.0
        log.info("decode: %s; one shard over idle workers x%.2f", pool.describe(), split)
        pad = {r.name: dil.decode_s(rates[r.name]) for r in m.shards[0].renditions}
        kv_exact = model.extract_template_kv(timg, tpl.instruction).to(torch.float16)
        return cls(model=model, tpl=tpl, template=template, photo=photo, timg=timg, m=m, dil=dil, pad=pad,
                   split=split, decode_workers=pool.workers, rates_desc=rates_desc,
                   allowed={"sakura": tuple(n for n in pad if n.split("#")[0] in DEFAULT_LADDER),
                            "cachegen": CACHEGEN_LEVELS, "cachegen-fair": CACHEGEN_LEVELS,
                            "cachegen-L3": CACHEGEN_LEVELS},
                   # dilated, the mini model's tables (7.5-15 kB) would stand for 1/beta times as many
                   # phone bytes, and the planner counts shard bytes only: the phone holds them
                   held_tables={t.name: st.get_object(t.object) for t in m.tables},
                   floor=[s.quality_floor["image_mse"] if s.quality_floor else None for s in m.shards],
                   device=DilatedDevice(model, dil), kv_exact=kv_exact,
                   reference=model.edit(photo, template_kv=kv_exact, steps=image_steps).image,
                   image_steps=image_steps, workload=workload, phone=phone, model_name=model_name)

    def policy(self, method: str, **kw):
        target_s = kw.pop("target_x", 1.0) * self.model.num_layers * self.dil.local_s
        return policies.make_policy(method, target_s=target_s, cachegen_levels=kw.pop("levels", CACHEGEN_LEVELS), **kw)

    def specs(self, method: str) -> list:
        return [ShardSpec(tuple(Route(r.name, r.nbytes, self.pad[r.name], float(r.distortion.get("image_mse", 0.0)))
                                for r in s.renditions if r.name in self.allowed[method]),
                          self.dil.compute_s, self.dil.local_s, f)
                for s, f in zip(self.m.shards, self.floor)]

    def simulate(self, policy, specs, link: _TraceStart):
        return simulate_edit(specs, policy, link=TraceLink(link.trace, link.offset_s), rtt_s=self.dil.rtt_s,
                             bandwidth=BandwidthEstimator(prior_bps=link.prior_bps),
                             rtt=RttEstimator(prior_s=self.dil.rtt_s), decode_workers=self.decode_workers,
                             compute_start_s=self.dil.pre_s, post_s=self.dil.post_s, decode_split=self.split)


def _trace_rows(run: _Run, tname: str, link: _TraceStart, url: str, *, repeats: int, bar, images: dict | None) -> list[dict]:
    """Every method live on one trace, `repeats` rounds interleaved; each row beside the simulator.
    With ``images`` (the first trace), each method's image is made and compared with the lossless one."""
    L = run.model.num_layers
    by_method: dict[str, dict[str, Any]] = {}
    for rep in range(repeats):
        for method in METHODS:
            first = method not in by_method
            row = by_method.setdefault(method, {"trace": tname, "method": method})
            if method == "oracle":
                if first:
                    row.update(live_s=float("nan"), sim_s=run.dil.oracle_s, image_mse=0.0, live_runs_s=[],
                               sim_timeline=_sim_timeline_oracle(L, run.dil))
                continue
            live_s, used = (_on_device_run if method == "on-device" else _streamed_run)(run, row, method, url, link,
                                                                                       first)
            row["live_runs_s"].append(live_s)
            if first and images is not None and used:
                kv = TemplateKV(layers=[used[i] for i in range(L)], model_fingerprint=run.model.fingerprint(),
                                template_fingerprint=run.kv_exact.template_fingerprint, layout=run.kv_exact.layout)
                images[method] = run.model.edit(run.photo, template_kv=kv, steps=run.image_steps).image
                row["psnr_vs_lossless_db"] = float(psnr_per_image(images[method], run.reference).item())
            bar.set_description_str(f"{tname.split('/')[-1][:20]} {method}")
            bar.update()
            log.info("  %-28s %-16s live %7.1f s  sim %7.1f s  (phone seconds; live/sim %.3f)%s",
                     tname.split("/")[-1][:28], method, live_s * run.dil.D, row["sim_s"] * run.dil.D,
                     live_s / row["sim_s"], f"  [run {rep + 1}/{repeats}]" if repeats > 1 else "")
    return [_summarise(by_method[method], run.dil.D) for method in METHODS]


def _on_device_run(run: _Run, row: dict, method: str, url: str, link: _TraceStart, first: bool):
    """The template computed on the (dilated) device: (live seconds, the KV it used or None)."""
    with _no_gc_pause():
        t = time.monotonic()
        run.device.edit(run.photo, template=run.timg, instruction=run.tpl.instruction)
        live_s = time.monotonic() - t
    L, dil = run.model.num_layers, run.dil
    if first:
        row.update(sim_s=dil.pre_s + L * (dil.local_s + dil.compute_s) + dil.post_s, image_mse=0.0, local_layers=L,
                   live_runs_s=[], sim_timeline=_sim_timeline_on_device(L, dil), timeline=run.device.last_timeline)
    row.setdefault("timeline_runs", []).append(run.device.last_timeline)
    return live_s, run.device.last_used if first else None


def _streamed_run(run: _Run, row: dict, method: str, url: str, link: _TraceStart, first: bool):
    """One streamed edit through the pacing proxy on the trace: (live seconds, the KV it used or None)."""
    sp = run.specs(method)
    dil = run.dil
    with pacing_proxy_in_thread(url, link.trace, link.offset_s, dil.rtt_s) as px, _no_gc_pause():
        # the link's trace time starts with the edit's clock, as the simulator's
        link_at = lambda t0, link=px.link: setattr(link, "start", t0)  # noqa: E731
        res = streamed_edit(run.device, run.photo, base_url=px.url, template_id=run.template, template_image=run.timg,
                            instruction=run.tpl.instruction, policy=run.policy(method),
                            profile=DeviceProfile(dil.compute_s, dil.local_s, decode_workers=run.decode_workers,
                                                  pre_s=dil.pre_s, post_s=dil.post_s),
                            bandwidth=BandwidthEstimator(prior_bps=link.prior_bps), rtt=RttEstimator(prior_s=dil.rtt_s),
                            decode_workers=run.decode_workers, steps=1, manifest=run.m, allow_fast_path=True,
                            emulate=Emulation(specs=sp, renditions=run.allowed[method],
                                              after_decode=decode_padding(run.pad, run.split),
                                              tables=run.held_tables, clock_start=link_at))
    if first:
        sim = run.simulate(run.policy(method), sp, link)
        row.update(sim_s=sim.first_step_s + dil.post_s, image_mse=res.image_mse, bytes=res.bytes_fetched,
                   local_layers=sum(r.source == "local" for r in res.records), live_choices=res.choices(),
                   sim_choices=[r.source for r in sim.records], path=res.path, events=res.events, live_runs_s=[],
                   timeline=_timeline(res.records, sp), sim_timeline=_timeline(sim.records, sp))
    row.setdefault("timeline_runs", []).append(_timeline(res.records, sp))
    used = (res.used_kv if res.path == "streamed" else run.device.last_used) if first else None
    return res.latency_s, used


def _summarise(row: dict, D: float) -> dict:
    """A method's row on one trace: the median of its live runs, in run and phone seconds, over the simulator's."""
    if row["live_runs_s"]:
        row["live_s"] = statistics.median(row["live_runs_s"])
        row["live_runs_phone_s"] = [x * D for x in row["live_runs_s"]]
        row["live_over_sim_runs"] = [x / row["sim_s"] for x in row["live_runs_s"]]
    row["live_phone_s"] = row["live_s"] * D
    row["sim_phone_s"] = row["sim_s"] * D
    row["live_over_sim"] = row["live_s"] / row["sim_s"]
    return row


def _frontier(run: _Run, tname: str, link: _TraceStart) -> list[dict]:
    """The latency-quality frontier on one trace, simulated on the same inputs: CacheGen's level sets
    and latency targets, sakura's quality scales."""
    cachegen = [dict(levels=CACHEGEN_LEVELS[:n], target_x=x) for n in (1, 2, 3) for x in (0.5, 1.0, 2.0)]
    out = []
    for method, cfgs in (("cachegen", cachegen), ("cachegen-fair", cachegen),
                         ("sakura", [dict(quality_scale=q) for q in (0.25, 0.5, 1.0, 2.0, 4.0)])):
        for cfg in cfgs:
            sim = run.simulate(run.policy(method, **dict(cfg)), run.specs(method), link)
            out.append({"trace": tname, "method": method,
                        **{k: (len(v) if k == "levels" else v) for k, v in cfg.items()},
                        "sim_phone_s": (sim.first_step_s + run.dil.post_s) * run.dil.D,
                        "psnr_db": psnr_db(sim.image_mse)})
    return out


def _result(run: _Run, rows: list[dict], frontier: list[dict], images: dict, out_dir: str | Path | None) -> dict:
    """The run's record (and, with ``out_dir``, dilated.json, dilated.md and the frontier plot)."""
    dil = run.dil
    result = {"model": run.model_name,
              "mode": f"live, time-dilated /{dil.D:g} (real sockets, threads, decoding and model; compute and decode "
                      f"padded to the workload's times), beside the simulator on the same inputs",
              "workload": run.workload, "phone": dil.phone, "D": dil.D,
              "dilation": {k: getattr(dil, k) for k in ("local_s", "compute_s", "pre_s", "post_s", "rtt_s", "beta")},
              "ceilings": ceilings(workload_costs(get_workload(run.workload), get_phone(run.phone))),
              "decode_pad_s": run.pad, "decode_rates": run.rates_desc, "rows": rows, "frontier": frontier,
              "agreement": _agreement(rows)}
    result["images"] = {"photo": run.photo, "template": run.timg,
                        "truth": get_task(run.tpl.task).ground_truth(run.photo, run.timg), "lossless": run.reference,
                        **images}
    if out_dir is not None:
        out = Path(out_dir)
        publish(out, "dilated", json.loads(json.dumps({k: v for k, v in result.items() if k != "images"},
                                                      default=float)), dilated_markdown(result))
        plot_frontier(result, out / "dilated_frontier.png")
    return result


def _timeline(records, specs=None) -> list[dict]:
    """Per-layer times of one edit (seconds since photo in), as the timeline plot reads them; with
    the simulator's `specs`, also each layer's forward compute (``compute_s``, after ``delivered``)."""
    out = []
    for r in records:
        t = {"index": r.index, "source": r.source, "t_request": r.t_request, "fetch_end": r.fetch_end,
             "decode_end": r.decode_end, "needed": r.needed, "delivered": r.delivered, "local_s": r.local_s}
        if specs is not None:
            t["compute_s"] = specs[r.index].compute_s
        out.append(t)
    return out


def _sim_timeline_on_device(layers: int, dil: Dilation) -> list[dict]:
    """On-device as the simulator has it: each template layer computed here, then the layer's forward."""
    nan, out, t = float("nan"), [], dil.pre_s
    for j in range(layers):
        out.append({"index": j, "source": "local", "t_request": nan, "fetch_end": nan, "decode_end": nan,
                    "needed": t, "delivered": t + dil.local_s, "local_s": dil.local_s, "compute_s": dil.compute_s})
        t += dil.local_s + dil.compute_s
    return out


def _sim_timeline_oracle(layers: int, dil: Dilation) -> list[dict]:
    """The oracle: the KV resident, every layer's forward back to back."""
    nan = float("nan")
    return [{"index": j, "source": "resident", "t_request": nan, "fetch_end": nan, "decode_end": nan,
             "needed": dil.pre_s + j * dil.compute_s, "delivered": dil.pre_s + j * dil.compute_s, "local_s": 0.0,
             "compute_s": dil.compute_s} for j in range(layers)]


def _spread(xs, fmt: str) -> str:
    """`` [min-max]`` of several runs, or nothing for one."""
    if not xs or len(xs) < 2:
        return ""
    return f" [{min(xs):{fmt}}-{max(xs):{fmt}}]"


def _trace_cell(spec: str) -> str:
    """A table's trace cell: the trace in words, then its spec (what `--trace` takes)."""

    return f"{describe_trace(spec)}: `{spec}`"


def _agreement(rows: list[dict]) -> dict:
    out = {}
    for m in METHODS[1:]:
        rs = [abs(r["live_over_sim"] - 1) for r in rows if r["method"] == m and not math.isnan(r["live_s"])]
        if rs:
            out[m] = {"max_abs_rel_diff": max(rs), "median_abs_rel_diff": statistics.median(rs), "runs": len(rs)}
    return out


def dilated_markdown(result: dict) -> str:
    c = result["ceilings"]
    runs = max((len(r.get("live_runs_s", [])) for r in result["rows"]), default=1)
    rows = []
    for r in result["rows"]:
        live = "-" if math.isnan(r["live_s"]) else f"{r['live_phone_s']:.1f}" + _spread(r.get("live_runs_phone_s"), ".1f")
        ratio = "-" if math.isnan(r["live_s"]) else f"{r['live_over_sim']:.3f}" + _spread(r.get("live_over_sim_runs"), ".3f")
        ps = r.get("psnr_vs_lossless_db")
        rows.append([_trace_cell(r["trace"]), r["method"], live, f"{r['sim_phone_s']:.1f}", ratio,
                     r.get("local_layers", "-"), r.get("bytes", 0), f"{psnr_db(r['image_mse']):.1f}",
                     "-" if ps is None else f"{ps:.1f}"])
    equal = []
    for t in dict.fromkeys(r["trace"] for r in result["rows"]):
        by = {r["method"]: r for r in result["rows"] if r["trace"] == t}
        lat = lambda m: by[m]["live_phone_s"] if not math.isnan(by[m]["live_s"]) else by[m]["sim_phone_s"]  # noqa: E731
        fr = equal_psnr_ratios(result, t)
        equal.append([_trace_cell(t), f"{lat('cachegen-L3') / lat('sakura'):.2f}", f"{lat('cachegen') / lat('sakura'):.2f}",
                      f"{lat('cachegen-fair') / lat('sakura'):.2f}",
                      f"{fr['cachegen']:.2f} / {fr['cachegen-fair']:.2f}" if fr else "-",
                      f"{lat('on-device') / lat('sakura'):.2f} ({c['vs on-device']:.2f})"])
    return "\n\n".join([
        f"Workload `{result['workload']}` on {result['phone']}; {result['mode']}. Latencies in phone seconds "
        f"(dilated seconds x {result['D']:g})"
        + (f"; live: the median of {runs} runs per method (interleaved), [min-max] beside it" if runs > 1 else "")
        + f". Ceilings (free, instant KV): {c['vs on-device']:.2f}x vs on-device, "
        f"{c['vs on-device-nocache']:.2f}x vs on-device-nocache. Decode padded to a phone's: "
        f"{result.get('decode_rates', '?')}.",
        "Methods: `cachegen` = CacheGen's own adaptation as published (one chunk at a time; fit test bytes x 8 / "
        "bandwidth vs target / chunks left, else recompute); `cachegen-fair` = ours (sakura's overlapped fetching, "
        "fit test with decode and RTT); `cachegen-L3` = held to level 3 on every chunk, else recompute (the "
        "equal-quality point: sakura's default floor is CacheGen-L3's summed image MSE).",
        markdown_table(["trace", "method", "live (s)", "simulated (s)", "live / sim", "layers local", "bytes",
                        "implied PSNR (dB)", "PSNR vs lossless-KV, measured (dB)"], rows, align="llrrrrrrr"),
        "Agreement, |live/sim - 1| per method: " + ", ".join(
            f"{m}: max {a['max_abs_rel_diff']:.1%}, median {a['median_abs_rel_diff']:.1%} ({a['runs']} traces)"
            for m, a in result["agreement"].items()),
        "## Equal quality",
        "Live latency ratios, the other method / sakura (>1: sakura faster); **frontier**: the simulated sweep "
        "(CacheGen: level cap x latency target; sakura: quality floor) read off at cachegen-L3's implied PSNR "
        "(the fastest configuration that reaches it), CacheGen's / sakura's. Plot: dilated_frontier.png.",
        markdown_table(["trace", "cachegen-L3 / sakura (equal quality)", "cachegen / sakura", "cachegen-fair / sakura",
                        "frontier at L3 PSNR: cachegen / cachegen-fair", "on-device / sakura (ceiling)"], equal,
                       align="lrrrlr")]) + "\n"


def equal_psnr_ratios(result: dict, trace: str) -> dict:
    """From the simulated frontier of one trace: the fastest configuration of each CacheGen variant and
    of sakura whose PSNR reaches cachegen-L3's (target 1x), as CacheGen's / sakura's latency ({} if
    cachegen-L3 computed everything, an exact target no streamed point can meet)."""
    pts = [p for p in result.get("frontier", []) if p["trace"] == trace]
    q = next((p["psnr_db"] for p in pts if p["method"] == "cachegen" and p.get("levels") == 1
              and p.get("target_x") == 1.0), math.inf)
    if not math.isfinite(q):
        return {}
    best = lambda m: min([p["sim_phone_s"] for p in pts if p["method"] == m and p["psnr_db"] >= q - 1e-9],  # noqa: E731
                         default=math.inf)
    sk = best("sakura")
    return {m: best(m) / sk for m in ("cachegen", "cachegen-fair")} if math.isfinite(sk) else {}


def plot_frontier(result: dict, path: Path) -> None:
    """One panel per trace: each method's simulated sweep (latency vs the PSNR its renditions' build-time
    distortion implies), and each live default run on top at the PSNR measured on its image (the
    tables' column), one marker per method in the legend (no labels on the points to overlap)."""
    import matplotlib  # lazy: plots only: not imported by a run that draws nothing

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: plots only: not imported by a run that draws nothing


    top = 90.0  # exact (lossless) points have infinite PSNR: drawn at the top, said in the label
    traces = list(dict.fromkeys(r["trace"] for r in result["rows"]))
    fig, axes = plt.subplots(1, len(traces), figsize=(max(7.5, 5.6 * len(traces)), 4.6), squeeze=False)
    style = {"sakura": ("C3", "o"), "cachegen": ("C0", "s"), "cachegen-fair": ("C2", "^")}
    live_marks = {"on-device": ("k", "D"), "cachegen": ("C0", "X"), "cachegen-fair": ("C2", "P"),
                  "cachegen-L3": ("C9", "v"), "sakura": ("C3", "*")}
    for ax, t in zip(axes[0], traces):
        pts = [p for p in result.get("frontier", []) if p["trace"] == t]
        for m, (col, mk) in style.items():
            xs = sorted((p["sim_phone_s"], min(p["psnr_db"], top)) for p in pts if p["method"] == m)
            front, best = [], -math.inf
            for a, b in xs:
                if b > best:
                    front.append((a, b))
                    best = b
            ax.scatter([a for a, _ in xs], [b for _, b in xs], color=col, marker=mk, s=12, alpha=0.4)
            ax.plot([a for a, _ in front], [b for _, b in front], color=col, lw=1, label=f"{m}: simulated sweep")
        for r in result["rows"]:
            if r["trace"] == t and r["method"] in live_marks and not math.isnan(r["live_s"]):
                ps = r.get("psnr_vs_lossless_db")
                ps = min(top, psnr_db(r["image_mse"]) if ps is None else ps)
                col, mk = live_marks[r["method"]]
                ax.scatter([r["live_phone_s"]], [ps], color=col, marker=mk, s=55, edgecolor="k", linewidth=0.5,
                           zorder=5, label=f"{r['method']}: live {r['live_phone_s']:.1f} s, {ps:.1f} dB")
        oracle = next((r["sim_phone_s"] for r in result["rows"] if r["trace"] == t and r["method"] == "oracle"), None)
        if oracle is not None:
            ax.axvline(oracle, color="0.5", ls=":", lw=1, label=f"oracle (all KV resident, simulated) {oracle:.1f} s")
        lv = [r for r in result["rows"] if r["trace"] == t and r["method"] in live_marks and r["method"] != "on-device"
              and not math.isnan(r["live_s"])]
        if lv:  # the streaming methods sit close together: a zoomed inset, so no marker hides another
            x0 = min([r["live_phone_s"] for r in lv] + [oracle or math.inf]) - 0.5
            x1 = max(r["live_phone_s"] for r in lv) + 0.8
            ins = ax.inset_axes((0.30, 0.40, 0.36, 0.42))
            for r in lv:
                ps = r.get("psnr_vs_lossless_db")
                ps = min(top, psnr_db(r["image_mse"]) if ps is None else ps)
                col, mk = live_marks[r["method"]]
                ins.scatter([r["live_phone_s"]], [ps], color=col, marker=mk, s=45, edgecolor="k", linewidth=0.5)
            for m, (col, mk) in style.items():
                xs = [(p["sim_phone_s"], min(p["psnr_db"], top)) for p in pts if p["method"] == m]
                ins.scatter([a for a, _ in xs], [b for _, b in xs], color=col, marker=mk, s=10, alpha=0.4)
            if oracle is not None:
                ins.axvline(oracle, color="0.5", ls=":", lw=1)
            ins.set_xlim(x0, x1)
            ys = [min(top, r.get("psnr_vs_lossless_db") or psnr_db(r["image_mse"])) for r in lv]
            ins.set_ylim(min(ys) - 2, max(ys) + 2)
            ins.tick_params(labelsize=5)
            ins.set_title("zoom: the streaming methods", fontsize=6)
            ax.indicate_inset_zoom(ins, edgecolor="0.5")
        ax.set_title(f"{describe_trace(t)}", fontsize=8)
        ax.set_xlabel("edit latency (phone seconds)", fontsize=8)
        ax.set_ylabel(f"PSNR vs the lossless-KV edit (dB; {top:g} = exact)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6, loc="lower right")
    fig.suptitle(f"latency vs quality, {result['workload']} on {result['phone']}, time-dilated /{result['D']:g}\n"
                 "lines: simulated sweeps (PSNR implied by build-time distortion); markers: live runs (PSNR measured)",
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
