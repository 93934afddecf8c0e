"""`sakura bench profile`: every method on named phone workloads, real traces and constant links,
through the same driver the live runtime runs (phone profile: trace-driven simulation,
EXTRAPOLATED, labelled so in every table).

What is real and what is modelled:

* **compute** per layer and the fixed costs (text encoder, VAE) come from `sakura.bench.workloads`
  (published model shapes and phone figures, each cited);
* **renditions** (bits/value, image distortion per shard, the CacheGen-L3 quality floor) are
  measured in this run on the trained model's real template KV (a store built here);
* **decode** rates are measured in this run on Klein-sized layers (1,024 tokens x 3,072 values)
  per core; the phone is given `decode_workers` cores for decoding, every streaming method alike;
* **links** are the measured traces of every family in ../shared/traces (each trace, seeded
  start offsets) and constant rates; RTT as given;
* the **policies and the driver** are the runtime's own (`sakura.phone`), run by the simulated
  executor, closed loop with the estimators.

Image quality of a streamed method is the PSNR vs the lossless-KV output that its renditions
imply (per-shard image MSE measured at build time, summed; the mini model's total distortion of
a uniform plan is spread over the workload's layers, so an all-rung-r plan costs what it costs on
the mini model).

Per run and workload, the *ceiling* (latency ratio with free, instant KV) is printed beside every
ratio, and the offline planner (perfect knowledge of the link) is run as the reference for the
online scheduler.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

# the floor rungs are `sakura build`'s own: its default ladder makes them (where the calibrated ladder
# stays above them, as on sticker-00: one rung at 2.25 bits/value), so the profile measures that store
from sakura.cloud.builder.pipeline import FLOOR_RUNG_LADDER  # noqa: F401
from sakura.util.psnr import psnr_db
from sakura.phone.driver import LOSS_BOUND
from sakura.phone.policies import CACHEGEN_DELTA_LEVELS, CACHEGEN_LEVELS
from sakura.util import fsutil
import numpy as np
from sakura.bench.decode_rates import describe_rates, load_scaling, load_split, load_target
from sakura.bench.workloads import PHONES, WORKLOADS, ceilings, get_phone, get_workload, workload_costs
from sakura.cloud.builder.pipeline import DEFAULT_LADDER, build_store
from sakura.emulation import list_traces, load_trace
from sakura.emulation.traces import constant_trace
from sakura.phone import (
    BandwidthEstimator,
    CacheGenPolicy,
    Route,
    RttEstimator,
    SakuraPolicy,
    ShardSpec,
    TraceLink,
    offline_plan,
)
from sakura.phone.plan import PipelineState, evaluate
from sakura.phone.policies import make_policy as make
from sakura.phone.sim import simulate_edit
from sakura.wire.store.store import Store

from sakura.bench.harness import get_logger, markdown_head
from tqdm import tqdm
import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor

log = get_logger(__name__)

METHODS = ("oracle", "on-device", "on-device-nocache", "raw-stream", "cachegen", "cachegen-fair", "cachegen-L3",
           "cachegen-fair-L3", "sakura", "sakura-meet", "offline")
#: every baseline (the "vs best baseline" column)
BASELINES = ("on-device", "on-device-nocache", "raw-stream", "cachegen", "cachegen-fair")
#: the never-slower check: sakura may not be > 2 % slower than the best of these (a CacheGen run
#: counts when its image quality is equal to or lower than sakura's)
NEVER_SLOWER_THAN = ("on-device", "cachegen", "cachegen-fair")
LOSS_TOLERANCE = 0.02
#: the latency-quality frontier: CacheGen's level cap x latency target (x the template's on-device
#: compute), and sakura's image floor (x CacheGen-L3-on-every-shard's image MSE)
SWEEP_CACHEGEN_LEVELS = (1, 2, 3)
SWEEP_CACHEGEN_TARGET_X = (0.5, 1.0, 2.0)
SWEEP_SAKURA_QUALITY_X = (0.25, 0.5, 1.0, 2.0, 4.0)
DEFAULT_RATES_MBPS = (5, 10, 20, 50, 100, 200, 300, 500, 1000)


def measure_ladder(model_name: str = "sakura-mini", template: str = "sticker-00", *, target: str = "phone") -> dict:
    """Build a store for one template with the default ladder + lossless + CacheGen (both variants);
    returns per rendition {codec, bits_per_value, image_mse (mean per shard)}, the mean quality
    floor, the model's layer count, and the decode rates of each rendition on a Klein-sized layer."""

    ladder = ("lossless",) + tuple(DEFAULT_LADDER) + CACHEGEN_LEVELS + CACHEGEN_DELTA_LEVELS
    with tempfile.TemporaryDirectory(prefix="sakura-profile-") as root:
        build_store(root, model_name=model_name, templates=[template], ladder=ladder, calibration=2, steps=4,
                    log=log.info)
        st = Store(root)
        (fp, tid), = [k for k in st.manifest_keys() if k[1] == template]
        m = st.get_manifest(fp, tid)
    out: dict[str, dict] = {}
    for shard in m.shards:
        for r in shard.renditions:
            d = out.setdefault(r.name, {"codec": r.codec, "mse": []})
            d["mse"].append(float(r.distortion.get("image_mse", 0.0)))
    bpv = mean_bits_per_value(m)
    floors = [s.quality_floor["image_mse"] for s in m.shards if s.quality_floor]
    renditions = {k: {"codec": v["codec"], "bits_per_value": bpv[k],
                      "image_mse": statistics.mean(v["mse"])} for k, v in out.items()}
    ladder = {"model": model_name, "template": template, "layers": len(m.shards), "renditions": renditions,
              "floor_image_mse": statistics.mean(floors) if floors else None}
    return rate_ladder(ladder, target)


def rate_ladder(ladder: dict, target: str = "phone", *, path: str | Path | None = None) -> dict:
    """The ladder with every rendition's per-core decode rate (Klein-sized layer) set from the
    calibration of `target` ("phone": the phone-class proxy; "host": this server's kernels), and
    which rates those are (`decode_target`, `decode_rates`). The renditions' bytes and qualities
    stay: the same measured ladder can be simulated with either target's rates."""

    rs = ladder["renditions"]
    rates = decode_rates(list(rs), path, bits_per_value={k: v["bits_per_value"] for k, v in rs.items()}, target=target)
    desc = describe_rates(path, target)
    log.info(f"decode: {desc} (per core, Klein-sized layer)")
    return {**ladder, "decode_target": target, "decode_rates": desc,
            "renditions": {k: {**v, "decode_fp16_bytes_per_cpu_s": rates[k]} for k, v in rs.items()}}


def mean_bits_per_value(manifest) -> dict[str, float]:
    """Rendition name -> its bits per fp16 value, the mean over the manifest's shards (a layered
    rung counts its prefix: cumulative)."""
    per: dict[str, list[float]] = {}
    for shard in manifest.shards:
        for r in shard.renditions:
            per.setdefault(r.name, []).append(8 * r.nbytes / (shard.fp16_bytes / 2))
    return {k: statistics.mean(v) for k, v in per.items()}


def decode_rates(names: Sequence[str], path: str | Path | None = None, tokens: int = 1024,
                 bits_per_value: dict[str, float] | None = None, target: str = "phone") -> dict[str, float]:
    """Per-core decode rate (fp16 KV bytes per CPU second, one worker) of each rendition name on a
    Klein-sized layer, from the decode-rate calibration (`decode_rates.load_target`: the package's
    shipped one unless `path` or $SAKURA_DECODE_RATES says otherwise), for `target` ("phone": the
    phone-class proxy, what a phone's figures use; "host": this server's kernels): the one place
    the phone profile, the dilated bench and the demo get decode rates from. A layered rung without its own row takes its
    spec's row, a CacheGen delta level without one its plain level's (the same decoder and a
    prefix sum), a rendition with its own parameters its codec's rung row; a name with no row at all is an error (rerun `sakura bench decode`).

    `bits_per_value` (name -> bits per value of that rendition, cumulative for a rung): a
    progressive rung then takes the measured progressive row of the same rung index nearest in
    bits/value (log scale), not the row of the bench's own ladder that shares its name. Why: a
    store's ladder is calibrated per template (sticker-00's single rung sits at ~2.25 bits/value,
    the bench ladder's rung 0 at ~0.22), and a rung's decode cost grows with its bits/value
    (2.0 bits/value decodes at ~0.4x the rate of 0.22)."""

    cal = load_target(path, target)
    rows = cal["rows"]
    table: dict[str, dict[int, float]] = {}
    bpv_of: dict[str, float] = {}
    for r in rows:
        if r["workers"] == 1:
            table.setdefault(r["rendition"], {})[r["tokens"]] = r["fp16_bytes_per_cpu_s"]
            bpv_of.setdefault(r["rendition"], r.get("bits_per_value", 0.0))
    out = {}
    for n in names:
        base, _, rung = n.partition("#")
        want = (bits_per_value or {}).get(n)
        same_rung = [k for k in table if k.split(":")[0].split("#")[0] == "progressive"
                     and k.partition("#")[2] == rung and bpv_of.get(k, 0.0) > 0] \
            if want and rung and base.split(":")[0] == "progressive" else []
        if same_rung:
            row = table[min(same_rung, key=lambda k: abs(math.log(bpv_of[k] / want)))]
        else:
            # a rendition with its own parameters (`progressive:budgets=[1.2]#0`) takes its codec's
            # rung row: the same decoder (its rate by rung, as the default ladder's rungs are looked up)
            row = (table.get(n) or table.get(base) or table.get(n.replace(",delta=true", ""))
                   or table.get(base.split(":")[0] + (f"#{rung}" if rung else "")))
        if row is None:
            raise KeyError(f"no {cal['target']} decode rate for {n!r} in {cal['source']}; run `sakura bench decode`")
        out[n] = row[min(row, key=lambda t: abs(math.log(t / tokens)))]
    return out


def with_measured_pool(ladder: dict, decode_workers: int | None = None):
    """(ladder with every rendition's decode rate scaled to one worker of the measured pool, the
    pool): `decode_workers` threads at the scaling `sakura bench decode` measured for the ladder's
    decode target (`rate_ladder`; phone-class if unsaid), not an assumed count of perfectly
    parallel cores."""

    pool = load_scaling(decode_workers, target=ladder.get("decode_target", "phone"))
    out = {**ladder, "renditions": {k: {**r, "decode_fp16_bytes_per_cpu_s": r["decode_fp16_bytes_per_cpu_s"] * pool.per_worker}
                                    for k, r in ladder["renditions"].items()}}
    rates = sorted(r["decode_fp16_bytes_per_cpu_s"] for r in ladder["renditions"].values())
    if rates:
        log.info(f"decode: per-core rates {rates[0] / 1e6:.0f}-{rates[-1] / 1e6:.0f} MB/s of fp16 KV; {pool.describe()}")
    return out, pool


def workload_specs(costs, ladder: dict, allowed: Sequence[str], *, decode_scale: float = 1.0):
    """`ShardSpec`s for a workload: per layer its first-pass compute (the user's photo KV and the
    live tokens, both attending to the template), local template compute, and the allowed
    renditions scaled to the workload's layer size."""

    B = costs.kv_fp16_bytes_per_layer
    spread = ladder["layers"] / costs.layers  # the mini model's total distortion over the workload's layers
    routes = []
    for name in allowed:
        r = ladder["renditions"].get(name)
        if r is None:
            continue
        routes.append(Route(name, int(B * r["bits_per_value"] / 16), B / (r["decode_fp16_bytes_per_cpu_s"] * decode_scale),
                            r["image_mse"] * spread))
    floor = ladder["floor_image_mse"] * spread if ladder.get("floor_image_mse") else None
    spec = ShardSpec(tuple(routes), costs.photo_layer_s + costs.live_layer_s, costs.template_layer_s, floor)
    return [spec] * costs.layers


def sakura_renditions(ladder: dict) -> tuple[str, ...]:
    """What sakura may fetch: every progressive rendition the ladder was measured with (the store's
    default ladder's rungs and its floor rungs). By codec, not by today's `FLOOR_RUNG_LADDER` names:
    a ladder measured before the floor rungs changed (the regression fixtures hold session 6-8
    ladders with `budgets=[1.2]`) replays with the rungs its store had."""
    return tuple(n for n in ladder["renditions"] if n.split("#")[0].split(":")[0] == "progressive")


def stronger_cachegen(ladder: dict) -> tuple[str, ...]:
    """CacheGen's levels, from the variant with fewer bytes at level 3 (delta coding or not)."""
    r = ladder["renditions"]
    if all(n in r for n in CACHEGEN_DELTA_LEVELS) and \
            r[CACHEGEN_DELTA_LEVELS[0]]["bits_per_value"] < r[CACHEGEN_LEVELS[0]]["bits_per_value"]:
        return CACHEGEN_DELTA_LEVELS
    return CACHEGEN_LEVELS


def make_policy(method: str, ladder: dict, costs):
    """The runtime policy of a streaming method (a fresh object: policies hold per-edit state),
    from the one registry (`sakura.phone.policies`), with this ladder's stronger CacheGen variant."""

    if method not in ("raw-stream", "sakura", "sakura-meet") and not method.startswith("cachegen"):
        raise KeyError(f"unknown streaming method {method!r}")
    return make(method, target_s=costs.template_s, cachegen_levels=stronger_cachegen(ladder))


def run_methods(costs, ladder: dict, link, *, prior_bps: float, rtt_s: float, decode_workers: int,
                methods: Sequence[str] = METHODS, sweep: bool = False, decode_split: float = 1.0) -> dict[str, dict]:
    """Every method on one link. Latency = work before the transformer (text encoder, VAE
    encode; fetching starts at once and overlaps with it) + the first pass (where template KV is
    consumed) + the other passes + VAE decode. sweep: also the latency-quality frontier points
    (`out["sweep"]`: CacheGen's level cap x target, sakura's quality floor). decode_split: the live
    decode pool's measured intra-shard split (`simulate_edit(decode_split=)`), for every simulated
    streaming method alike (the offline planner's open-loop evaluation does not model it)."""

    pre = costs.text_encoder_s + costs.vae_encode_s
    post = (costs.passes - 1) * costs.layers * costs.live_layer_s + costs.vae_decode_s
    out: dict[str, dict] = {}
    cg = stronger_cachegen(ladder)
    spec_cache: dict[tuple, list] = {}

    def specs_for(allowed: tuple[str, ...]):
        if allowed not in spec_cache:
            spec_cache[allowed] = workload_specs(costs, ladder, allowed)
        return spec_cache[allowed]

    def sim(policy, allowed) -> dict:
        res = simulate_edit(specs_for(allowed), policy, link=link, rtt_s=rtt_s,
                            bandwidth=BandwidthEstimator(prior_bps=prior_bps), rtt=RttEstimator(prior_s=rtt_s),
                            decode_workers=decode_workers, compute_start_s=pre, post_s=post,
                            decode_split=decode_split)
        return {"latency_s": res.first_step_s + post, "bytes": res.bytes, "image_mse": res.image_mse,
                "local_layers": res.local_layers, "stall_s": res.stall_s}

    for m in methods:
        if m == "oracle":
            out[m] = {"latency_s": costs.oracle_s, "bytes": 0, "image_mse": 0.0, "local_layers": 0}
            continue
        if m == "on-device":
            out[m] = {"latency_s": costs.on_device_s, "bytes": 0, "image_mse": 0.0, "local_layers": costs.layers}
            continue
        if m == "on-device-nocache":
            out[m] = {"latency_s": costs.on_device_nocache_s, "bytes": 0, "image_mse": 0.0,
                      "local_layers": costs.layers}
            continue
        allowed = ("lossless",) if m == "raw-stream" else cg if m.startswith("cachegen") else sakura_renditions(ladder)
        if m == "offline":
            specs = specs_for(allowed)
            st = PipelineState(now=0.0, compute_free=pre, decode_free=(0.0,) * decode_workers)
            res = offline_plan(specs, link, rtt_s, decode_workers, start=st)
            # open loop on the same link model: the plan's own evaluation is exact
            ev = evaluate(specs, st, res.k, res.routes, link, rtt_s)
            out[m] = {"latency_s": ev.finish_s + post, "bytes": ev.nbytes, "image_mse": ev.image_mse,
                      "local_layers": ev.local_layers}
            continue
        out[m] = sim(make_policy(m, ladder, costs), allowed)
    if sweep:
        points = []
        for published in (True, False):
            name = "cachegen" if published else "cachegen-fair"
            for n in SWEEP_CACHEGEN_LEVELS:
                for x in SWEEP_CACHEGEN_TARGET_X:
                    same = {(3, 1.0): name, (1, 1.0): f"{name}-L3"}.get((n, x))
                    p = dict(out[same]) if same in out else sim(
                        CacheGenPolicy(cg[:n], target_s=x * costs.template_s, published=published, name=name), cg)
                    points.append({"method": name, "levels": n, "target_x": x, **p})
        sk = sakura_renditions(ladder)
        for q in SWEEP_SAKURA_QUALITY_X:
            p = dict(out["sakura"]) if q == 1.0 and "sakura" in out else sim(SakuraPolicy(quality_scale=q), sk)
            points.append({"method": "sakura", "quality_x": q, **p})
        for p in points:
            p["psnr_db"] = psnr_db(p["image_mse"])
        out["sweep"] = points  # type: ignore[assignment]
    for k, v in out.items():
        if k != "sweep":
            v["psnr_db"] = psnr_db(v["image_mse"])
    return out


def run_profile(out_dir: str | Path, *, workloads: Sequence[str] | None = None, phones: Sequence[str] | None = None,
                families: Sequence[str] | None = None, offsets_per_trace: int = 1, traces_per_family: int | None = None,
                rates_mbps: Sequence[float] = DEFAULT_RATES_MBPS, rtt_ms: float = 40.0, decode_workers: int | None = None,
                seed: int = 0, model_name: str = "sakura-mini", ladder: dict | None = None, sweep: bool = True,
                jobs: int = 1, decode_split: float | None = None, decode_target: str = "phone") -> dict:
    """Every method x workload x phone level x (every trace at seeded offsets + constant links).
    `decode_target`: whose decode rates ("phone": the phone-class proxy, the default; "host": this
    server's AVX-512 kernels, for comparison); a given `ladder` keeps its own rates unless it names
    another target (then it is re-rated, `rate_ladder`).
    `decode_workers`: None = the pool `sakura bench decode` measured for that target.
    `decode_split`: None = the live pool's measured intra-shard split (`decode_rates.load_split`, as
    `sakura bench dilated`; 1.0 with one worker). `jobs`: processes over the independent runs
    (workload x phone x link); the result is the same as with one."""

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    if ladder is None:
        ladder = measure_ladder(model_name, target=decode_target)
    elif ladder.get("decode_target", decode_target) != decode_target:
        ladder = rate_ladder(ladder, decode_target)
    else:   # a given ladder keeps its own rates (a fixture's, a replayed profile's)
        ladder = {**ladder, "decode_target": decode_target,
                  "decode_rates": ladder.get("decode_rates", "the given ladder's own per-core rates")}
    ladder, pool = with_measured_pool(ladder, decode_workers)
    decode_workers = pool.workers
    wls = [get_workload(w) for w in workloads] if workloads else list(WORKLOADS)
    phs = [get_phone(p) for p in phones] if phones else list(PHONES)
    links = profile_links(families=families, offsets_per_trace=offsets_per_trace,
                          traces_per_family=traces_per_family, rates_mbps=rates_mbps, seed=seed)
    if decode_split is None:
        decode_split = load_split(target=decode_target) if decode_workers > 1 else 1.0
    log.info(f"decode: {pool.describe()}; one shard over idle workers x{decode_split:.2f} (every streaming method)")
    link_args = dict(families=families, offsets_per_trace=offsets_per_trace, traces_per_family=traces_per_family,
                     rates_mbps=rates_mbps, seed=seed)
    cells = [(w, ph, i) for w in wls for ph in phs for i in range(len(links))]
    cfg = dict(ladder=ladder, rtt_s=rtt_ms / 1000, decode_workers=decode_workers, sweep=sweep,
               decode_split=decode_split)
    runs = []
    with tqdm(total=len(cells), desc="profile runs", disable=None) as bar:
        if jobs <= 1:
            _init_worker(cfg, None, links)
            for c in cells:
                runs.append(_profile_run(c))
                bar.update()
        else:
            # each worker rebuilds the (deterministic) links once; results come back in cell order
            with ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork"), initializer=_init_worker,
                                     initargs=(cfg, link_args, None)) as ex:
                for r in ex.map(_profile_run, cells, chunksize=4):
                    runs.append(r)
                    bar.update()
    result = {"mode": "phone profile (trace-driven simulation through the runtime's driver; EXTRAPOLATED)",
              "ladder": ladder, "rtt_ms": rtt_ms, "decode_workers": decode_workers, "decode_pool": pool.describe(),
              "offsets_per_trace": offsets_per_trace, "traces_per_family": traces_per_family,
              "families": list(families) if families else None, "rates_mbps": list(rates_mbps),
              "seed": seed, "decode_split": decode_split, "jobs": jobs, "workloads": [asdict(w) for w in wls], "phones": [asdict(p) for p in phs],
              "wall_s": time.perf_counter() - t_start, "decode_target": decode_target,
              "decode_rates": ladder["decode_rates"],
              "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None, "runs": runs}
    result["summary"] = summarize(runs)
    result["family_checks"] = family_checks(runs)
    write_json(result, out / "e2e_profile.json")
    md = profile_markdown(result)
    (out / "e2e_profile.md").write_text(md)
    (out / "e2e_profile_checks.txt").write_text(checks_text(result))
    plot_profile(result, out)
    if sweep:
        plot_frontiers(result, out)
    log.info(md)
    log.info(checks_text(result))
    return result


_WORKER: dict = {}


def _init_worker(cfg: dict, link_args: dict | None, links: list | None) -> None:
    _WORKER.clear()
    _WORKER.update(cfg, links=links if links is not None else profile_links(**link_args))


def _profile_run(cell) -> dict:
    """One profile run (a workload, a phone, the index of a link of `profile_links`)."""

    w, ph, i = cell
    fam, name, link, prior = _WORKER["links"][i]
    costs = workload_costs(w, ph)
    ceil = ceilings(costs)
    res = run_methods(costs, _WORKER["ladder"], link, prior_bps=prior, rtt_s=_WORKER["rtt_s"],
                      decode_workers=_WORKER["decode_workers"], sweep=_WORKER["sweep"],
                      decode_split=_WORKER["decode_split"])
    return {"workload": w.name, "phone": ph.name, "family": fam, "link": name,
            "ceiling_vs_on_device": ceil["vs on-device"], "ceiling_vs_nocache": ceil["vs on-device-nocache"], **res}


def profile_links(*, families: Sequence[str] | None = None, offsets_per_trace: int = 1,
                  traces_per_family: int | None = None, rates_mbps: Sequence[float] = DEFAULT_RATES_MBPS,
                  seed: int = 0) -> list[tuple[str, str, object, float]]:
    """The profile's links, (family, name, link, prior bytes/s): every trace (or a seeded sample per
    family) at seeded start offsets, the prior being what the phone saw in the 10 s before, and the
    constant rates. Deterministic in its arguments, so a run can be replayed (`replay_runs`)."""

    rng = random.Random(seed)
    links: list[tuple[str, str, object, float]] = []
    specs = list_traces()
    if families:
        specs = [s for s in specs if s.split("/")[0] in families]
    by_family: dict[str, list[str]] = {}
    for s in specs:
        by_family.setdefault(s.split("/")[0], []).append(s)
    for fam, names in sorted(by_family.items()):
        if traces_per_family:
            names = sorted(rng.sample(names, min(traces_per_family, len(names))))
        for name in names:
            tr = load_trace(name)
            for _ in range(offsets_per_trace):
                off = rng.uniform(0, max(0.0, tr.period_s - 120.0)) + 10.0
                prior = max(1.0, (tr.cumulative(off) - tr.cumulative(off - 10.0)) / 10.0)  # what the phone saw before
                links.append((fam, name, TraceLink(tr, offset_s=off), prior))
    for r in rates_mbps:
        links.append(("constant", f"constant {r:g} Mbit/s", TraceLink(constant_trace(r), 0.0), r * 1e6 / 8))
    return links


#: the simulated baselines of the never-slower check and the best-cell ratio, re-run by `replay_runs(baselines=True)`
REPLAY_BASELINES = ("cachegen", "cachegen-fair", "cachegen-L3", "cachegen-fair-L3")


def replay_runs(profile_json: str | Path, *, losers_only: bool = True, families: Sequence[str] | None = None,
                jobs: int = 1, baselines: bool = False) -> list[dict]:
    """Re-simulate sakura on the runs of a written profile (its ladder, seed and links; the baselines
    are read from the file: they do not depend on sakura's policy), by default only the losing ones
    (losers_only=False: every run, so a policy change's new losers show; it prints the runs that lose now or lost).
    families: only the runs of these trace families. jobs: processes over the runs (the same result as 1).
    For checking a policy change against the published losers in seconds, not the full profile's
    minutes. Returns per run: workload, phone, family, link, the ratio before (in the file) and now,
    sakura's latency and PSNR now and before, and the run's cachegen-L3 latency. baselines: also re-simulate the
    simulated baselines (`REPLAY_BASELINES`) instead of reading them from the file, for a change to the simulator
    or to what every policy shares (with no change, the same figures as the file's)."""
    d = json.loads(Path(profile_json).read_text())
    if d.get("offsets_per_trace") is None:
        raise ValueError(f"{profile_json}: not a `sakura bench profile` result")
    link_args = dict(families=d.get("families"), offsets_per_trace=d["offsets_per_trace"],
                     traces_per_family=d.get("traces_per_family"), rates_mbps=d.get("rates_mbps", DEFAULT_RATES_MBPS),
                     seed=d["seed"])
    links = profile_links(**link_args)
    index = {(fam, name): i for i, (fam, name, _, _) in enumerate(links)}
    runs = [r for r in d["runs"] if (not losers_only or loss_ratio(r) > 1 + LOSS_TOLERANCE)
            and (not families or r["family"] in families)]
    for r in runs:
        if (r["family"], r["link"]) not in index:
            raise ValueError(f"{r['link']}: not among this machine's traces (set SAKURA_TRACES)")
    cfg = dict(ladder=d["ladder"], rtt_s=d["rtt_ms"] / 1000, decode_workers=d["decode_workers"],
               decode_split=d.get("decode_split", 1.0), methods=(*REPLAY_BASELINES, "sakura") if baselines else ("sakura",))
    cells = [(r["workload"], r["phone"], index[(r["family"], r["link"])]) for r in runs]
    if jobs <= 1 or len(cells) < 2:
        _init_worker(cfg, None, links)
        results = [_replay_run(c) for c in cells]
    else:
        with ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork"), initializer=_init_worker,
                                 initargs=(cfg, link_args, None)) as ex:
            results = list(ex.map(_replay_run, cells, chunksize=4))
    out = []
    for r, res in zip(runs, results):
        now = {**r, **res}
        sk = res["sakura"]
        out.append({"workload": r["workload"], "phone": r["phone"], "family": r["family"], "link": r["link"],
                    "was": loss_ratio(r), "now": loss_ratio(now), "sakura_latency_s": sk["latency_s"],
                    "vs_on_device": sk["latency_s"] / r["on-device"]["latency_s"], "psnr_db": sk["psnr_db"],
                    "psnr_was_db": r["sakura"]["psnr_db"],
                    "cachegen_L3_latency_s": now["cachegen-L3"]["latency_s"]})
    n = sum(x["now"] > 1 + LOSS_TOLERANCE for x in out)
    shown = out if losers_only else [x for x in out if max(x["now"], x["was"]) > 1 + LOSS_TOLERANCE]
    for x in sorted(shown, key=lambda x: -x["now"]):
        log.info(f"{x['now']:.3f} (was {x['was']:.3f})  {x['workload']:20s} {x['phone'][:13]:13s} {x['link']}")
    log.info(f"{n} of {len(out)} replayed runs lose by > {100 * LOSS_TOLERANCE:.0f} % (worst {max(x['now'] for x in out):.3f}; "
        f"sakura / on-device at worst {max(x['vs_on_device'] for x in out):.4f})" if out else "no runs to replay")
    return out


def _replay_run(cell) -> dict:
    """sakura (and the baselines, `replay_runs(baselines=True)`) on one run of a written profile (a workload name, a
    phone name, a link index): {method: result}."""

    w, ph, i = cell
    _, _, link, prior = _WORKER["links"][i]
    return run_methods(workload_costs(get_workload(w), get_phone(ph)), _WORKER["ladder"], link, prior_bps=prior,
                       rtt_s=_WORKER["rtt_s"], decode_workers=_WORKER["decode_workers"], methods=_WORKER["methods"],
                       decode_split=_WORKER["decode_split"])


def write_json(result: dict, path: Path) -> None:
    """The profile's JSON without the per-run sweep points (30 per run: tens of MB for every trace);
    the frontier's per-group medians, which the plots and tables use, are kept."""
    groups: dict[str, list[dict]] = {}
    for r in result["runs"]:
        groups.setdefault(f"{r['workload']} | {r['phone']} | {r['family']}", []).append(r)
    slim = {**result, "frontier_medians": {k: sweep_medians(rs) for k, rs in groups.items()},
            "runs": [{k: v for k, v in r.items() if k != "sweep"} for r in result["runs"]]}
    fsutil.write_json(path, slim, indent=None, separators=(",", ":"), default=float)


def _rel(p: Path) -> str:
    try:
        return str(p.relative_to(Path.cwd()))
    except ValueError:
        return str(p)


def checks_text(result: dict) -> str:
    """The issue's checks in a few lines (docs/e2e/e2e_profile_checks.txt)."""
    runs, S = result["runs"], result["summary"]
    fc = result.get("family_checks") or family_checks(runs)
    lines = [f"{len(runs)} runs in {result['wall_s']:.0f} s (load average at the end: "
             f"{', '.join(f'{x:.1f}' for x in result.get('loadavg') or [])}; {result.get('jobs', 1)} job(s))",
             f"decode: {result.get('decode_pool', '?')}; one shard over idle workers x{result.get('decode_split', 1.0):.2f} "
             f"for every simulated streaming method (`decode_rates.load_split`, as `sakura bench dilated`)",
             f"never slower (> {100 * LOSS_TOLERANCE:.0f} % slower than the best of {', '.join(NEVER_SLOWER_THAN)} at "
             f"equal or lower quality), per family: losing runs (floor-bound) worst ratio, worst vs on-device"]
    for fam, c in fc.items():
        lines.append(f"  {fam:18s} {c['losing_runs']:4d} of {c['runs']:5d} ({c['losing_runs_floor_bound']} floor-bound)  "
                     f"worst {c['worst_loss_ratio']:.3f}  vs on-device {c['worst_vs_on_device']:.4f}")
    lines.append(f"sakura <= (1 + {LOSS_BOUND:g}) x on-device by construction: worst measured "
                 f"{fc['all']['worst_vs_on_device']:.4f}")
    lines.append("equal quality (cachegen-L3 / sakura, cachegen-fair-L3 / sakura: median (p10)) beside the ceiling "
                 "vs on-device, per workload x phone on 5G (umn_5gophers):")
    for k, s in S.items():
        if s["family"] != "umn_5gophers":
            continue
        a, b = s["speedup_vs_cachegen-L3"], s["speedup_vs_cachegen-fair-L3"]
        lines.append(f"  {s['workload']:20s} {s['phone'][:13]:13s} {a['median']:.2f} ({a['p10']:.2f})  "
                     f"{b['median']:.2f} ({b['p10']:.2f})  ceiling {s['ceiling_vs_on_device']:.2f}  vs on-device "
                     f"{s['speedup_vs_on-device']['median']:.2f}")
    return "\n".join(lines) + "\n"



def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return math.nan
    i = min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))
    return xs[i]


def loss_ratio(r: dict) -> float:
    """sakura's latency / the best of `NEVER_SLOWER_THAN` (a CacheGen run counts when its PSNR is at
    most sakura's); > 1 + LOSS_TOLERANCE is a losing run."""
    s = r["sakura"]
    best = min(r[b]["latency_s"] for b in NEVER_SLOWER_THAN
               if b in r and (b == "on-device" or r[b]["psnr_db"] <= s["psnr_db"] + 1e-9))
    return s["latency_s"] / best


def frontier_latency(points: list[dict], method: str, psnr_db: float) -> float:
    """The fastest median latency among `method`'s sweep configurations whose median PSNR is at least
    `psnr_db` (the latency-quality frontier read off at that PSNR; inf if none reaches it)."""
    lat = [p["latency_s"] for p in points if p["method"] == method and p["psnr_db"] >= psnr_db - 1e-9]
    return min(lat) if lat else math.inf


def sweep_medians(rs: list[dict]) -> list[dict]:
    """Per sweep configuration: median latency and median PSNR over the runs (the frontier's points)."""
    if not rs or "sweep" not in rs[0]:
        return []
    out = []
    for i, p in enumerate(rs[0]["sweep"]):
        pts = [r["sweep"][i] for r in rs]
        out.append({k: v for k, v in p.items() if k in ("method", "levels", "target_x", "quality_x")}
                   | {"latency_s": statistics.median(x["latency_s"] for x in pts),
                      "psnr_db": statistics.median(x["psnr_db"] for x in pts)})
    return out


def summarize(runs: list[dict]) -> dict:
    """Per workload x phone x family: median and p10 of sakura's speedups, the equal-quality ratios,
    the never-slower check, and median PSNRs."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["workload"], r["phone"], r["family"]), []).append(r)
        groups.setdefault((r["workload"], r["phone"], "all"), []).append(r)
    out = {}
    for (w, p, fam), rs in groups.items():
        s = [r["sakura"]["latency_s"] for r in rs]
        best = [min(r[b]["latency_s"] for b in BASELINES) for r in rs]
        sp = lambda m: [r[m]["latency_s"] / r["sakura"]["latency_s"] for r in rs]  # noqa: E731
        gain = [(r["on-device"]["latency_s"] - r["sakura"]["latency_s"]) for r in rs]
        ogain = [(r["on-device"]["latency_s"] - r["offline"]["latency_s"]) for r in rs]
        share = [g / o for g, o in zip(gain, ogain) if o > 1e-9]
        losses = [loss_ratio(r) for r in rs]
        losing = [r for r, x in zip(rs, losses) if x > 1 + LOSS_TOLERANCE]
        # a losing run where even the offline planner (perfect link knowledge, sakura's renditions and
        # floor) is slower than that baseline: the floor, not the policy, is what loses
        floor_bound = sum(1 for r in losing if r["offline"]["latency_s"] > r["sakura"]["latency_s"] / loss_ratio(r)
                          * (1 + LOSS_TOLERANCE))
        med = sweep_medians(rs)
        eq = {}
        if med:
            q = next(x["psnr_db"] for x in med if x["method"] == "cachegen" and x["levels"] == 1 and x["target_x"] == 1.0)
            sk = frontier_latency(med, "sakura", q)
            # an exact target (CacheGen-L3 recomputed every chunk) has no streamed point to compare
            eq = {m: frontier_latency(med, m, q) / sk if math.isfinite(q) and math.isfinite(sk) else math.nan
                  for m in ("cachegen", "cachegen-fair")}
            eq["psnr_db"] = q
        out[f"{w} | {p} | {fam}"] = {
            "workload": w, "phone": p, "family": fam, "runs": len(rs),
            "ceiling_vs_on_device": rs[0]["ceiling_vs_on_device"], "ceiling_vs_nocache": rs[0]["ceiling_vs_nocache"],
            **{f"speedup_vs_{m}": {"median": statistics.median(sp(m)), "p10": _q(sp(m), 0.1)}
               for m in ("on-device", "on-device-nocache", "cachegen", "cachegen-fair", "cachegen-L3",
                         "cachegen-fair-L3", "raw-stream")},
            "vs_best_baseline": {"median": statistics.median(b / x for b, x in zip(best, s)),
                                 "min": min(b / x for b, x in zip(best, s))},
            "runs_slower_than_best_baseline_by_2pct": sum(x > 1.02 * b for b, x in zip(best, s)),
            "losing_runs": len(losing), "losing_runs_floor_bound": floor_bound, "worst_loss_ratio": max(losses),
            "worst_vs_on_device": max(r["sakura"]["latency_s"] / r["on-device"]["latency_s"] for r in rs),
            "frontier_ratio_at_cachegen_L3_psnr": eq,
            "share_of_offline_gain": {"median": statistics.median(share) if share else math.nan,
                                      "p10": _q(share, 0.1) if share else math.nan, "runs": len(share)},
            "vs_offline_p90": _q([r["sakura"]["latency_s"] / r["offline"]["latency_s"] for r in rs], 0.9),
            "meet_vs_sakura_median": statistics.median(r["sakura-meet"]["latency_s"] / r["sakura"]["latency_s"] for r in rs),
            "psnr_median_db": {m: statistics.median(r[m]["psnr_db"] for r in rs)
                               for m in ("sakura", "cachegen", "cachegen-fair", "cachegen-L3", "offline")},
        }
    return out


def family_checks(runs: list[dict]) -> dict:
    """The never-slower check per trace family (every workload and phone): runs, losing runs, those
    where the floor is what loses, the worst ratio, the worst ratio against on-device alone."""
    out: dict[str, dict] = {}
    for fam in sorted({r["family"] for r in runs}) + ["all"]:
        rs = [r for r in runs if fam in ("all", r["family"])]
        losses = [(loss_ratio(r), r) for r in rs]
        losing = [(x, r) for x, r in losses if x > 1 + LOSS_TOLERANCE]
        out[fam] = {"runs": len(rs), "losing_runs": len(losing),
                    "losing_runs_floor_bound": sum(1 for x, r in losing if r["offline"]["latency_s"] >
                                                   r["sakura"]["latency_s"] / x * (1 + LOSS_TOLERANCE)),
                    "worst_loss_ratio": max(x for x, _ in losses),
                    "worst_vs_on_device": max(r["sakura"]["latency_s"] / r["on-device"]["latency_s"] for r in rs),
                    "worst_run": max(losses, key=lambda t: t[0])[1]["link"] if losses else ""}
    return out


def profile_markdown(result: dict) -> str:
    L = result["ladder"]
    fc = result.get("family_checks") or family_checks(result["runs"])
    lines = [f"Phone profile: {result['mode']}. RTT {result['rtt_ms']} ms, {result['decode_workers']} decode workers "
             f"per streaming method, renditions measured in this run on {L['model']} (`{L['template']}`), decode: "
             f"{result.get('decode_rates', 'docs/decode_rates.json (host)')}, {result['offsets_per_trace']} seeded "
             f"offset(s) per trace, {len(result['runs'])} runs in {result['wall_s']:.0f} s.", "",
             "Methods: `cachegen` = CacheGen's own per-chunk adaptation as published (level 3, 2, 1: the first whose "
             "bytes x 8 / bandwidth fits the latency target / chunks left, else recompute; one chunk fetched at a time); "
             "`cachegen-fair` = ours: the same rule with sakura's overlapped fetching and a fit test that counts decode "
             "and RTT; `-L3` = held to level 3 on every chunk (else recompute). Every streaming method gets the same "
             "decode workers. sakura: the default image floor (CacheGen-L3 on every shard's summed image MSE) and the "
             f"{100 * LOSS_BOUND:.0f} % loss bound.", "",
             "## Never slower", "",
             f"A losing run: sakura > {100 * LOSS_TOLERANCE:.0f} % slower than the best of on-device, cachegen and "
             "cachegen-fair (a CacheGen run counts when its PSNR is at most sakura's). *Floor-bound*: losing runs where "
             "even the offline planner (perfect knowledge of the link, sakura's renditions and quality floor) is slower "
             "than that baseline, i.e. the baseline won by dropping below sakura's quality floor.", "",
             *markdown_head(['family', 'runs', 'losing runs', 'of which floor-bound', 'worst ratio', 'worst vs on-device', "worst run's link"], 'lrrrrrl')]
    for fam, c in fc.items():
        lines.append(f"| {fam} | {c['runs']} | {c['losing_runs']} | {c['losing_runs_floor_bound']} | "
                     f"{c['worst_loss_ratio']:.3f} | {c['worst_vs_on_device']:.4f} | {c['worst_run']} |")
    lines += ["", "## Equal quality and the ceilings", "",
              "Ratios are the other method's latency / sakura's (>1: sakura faster), median (p10) over the family's runs. "
              "**Equal quality**: `cachegen-L3` and `cachegen-fair-L3` (held to CacheGen's level-3 quality on every "
              "shard, else recompute) vs sakura at the same image floor (its default). **Frontier**: the fastest "
              "configuration of each method (CacheGen: level cap x latency target; sakura: quality floor) whose median "
              "PSNR reaches cachegen-L3's, CacheGen's / sakura's. **Defaults**: both at their defaults (PSNR beside). "
              "**ceiling**: the ratio with free, instant template KV.", "",
              *markdown_head(['workload', 'phone', 'family', 'runs', 'equal quality vs cachegen-L3', 'vs cachegen-fair-L3', 'frontier at L3 PSNR: cachegen / cachegen-fair', 'defaults: vs cachegen', 'vs cachegen-fair', 'vs on-device (ceiling)', 'vs nocache (ceiling)', 'losing runs', 'sakura/offline p90', 'PSNR sakura / cachegen / cachegen-fair / L3'], 'lllrlllllllrrl')]
    for k, s in result["summary"].items():
        f = lambda d: f"{d['median']:.2f} ({d['p10']:.2f})"  # noqa: E731
        ps = s["psnr_median_db"]
        fr = s.get("frontier_ratio_at_cachegen_L3_psnr") or {}
        frs = (f"{fr['cachegen']:.2f} / {fr['cachegen-fair']:.2f}"
               if fr and not math.isnan(fr["cachegen"]) else "- (L3 exact)" if fr else "-")
        lines.append(
            f"| {s['workload']} | {s['phone'].split(' (')[0]} | {s['family']} | {s['runs']} | "
            f"{f(s['speedup_vs_cachegen-L3'])} | {f(s['speedup_vs_cachegen-fair-L3'])} | {frs} | "
            f"{f(s['speedup_vs_cachegen'])} | {f(s['speedup_vs_cachegen-fair'])} | "
            f"{f(s['speedup_vs_on-device'])} ({s['ceiling_vs_on_device']:.2f}) | "
            f"{f(s['speedup_vs_on-device-nocache'])} ({s['ceiling_vs_nocache']:.2f}) | "
            f"{s['losing_runs']} | {s['vs_offline_p90']:.3f} | "
            f"{_db(ps['sakura'])} / {_db(ps['cachegen'])} / {_db(ps['cachegen-fair'])} / {_db(ps['cachegen-L3'])} |")
    return "\n".join(lines) + "\n"


def _db(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.1f}"


def plot_profile(result: dict, out: Path) -> None:
    """Heatmaps (constant rate x phone: sakura vs best baseline, vs cachegen, vs on-device) per
    workload, and latency CDFs per trace family for one workload and phone."""
    import matplotlib  # lazy: plots only: not imported by a run that draws nothing

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: plots only: not imported by a run that draws nothing

    runs = result["runs"]
    wls = sorted({r["workload"] for r in runs}, key=[w["name"] for w in result["workloads"]].index)
    phones = [p["name"] for p in result["phones"]]
    const = [r for r in runs if r["family"] == "constant"]
    rates = sorted({float(r["link"].split()[1]) for r in const})
    if const:
        comps = (("best baseline", lambda r: min(r[b]["latency_s"] for b in BASELINES)),
                 ("cachegen", lambda r: r["cachegen"]["latency_s"]), ("on-device", lambda r: r["on-device"]["latency_s"]))
        fig, axes = plt.subplots(len(wls), 3, figsize=(13, 2.2 * len(wls) + 0.8), squeeze=False)
        for i, w in enumerate(wls):
            for j, (name, f) in enumerate(comps):
                grid = np.full((len(phones), len(rates)), np.nan)
                for r in const:
                    if r["workload"] == w:
                        grid[phones.index(r["phone"]), rates.index(float(r["link"].split()[1]))] = \
                            f(r) / r["sakura"]["latency_s"]
                ax = axes[i, j]
                im = ax.imshow(grid, aspect="auto", cmap="RdYlGn", vmin=0.8, vmax=max(2.0, np.nanmax(grid)))
                for (a, b), v in np.ndenumerate(grid):
                    ax.text(b, a, f"{v:.2f}", ha="center", va="center", fontsize=6)
                ax.set_xticks(range(len(rates)), [f"{x:g}" for x in rates], fontsize=6)
                ax.set_yticks(range(len(phones)), [p.split(" (")[0] for p in phones], fontsize=6)
                ax.set_title(f"{w}: {name} / sakura", fontsize=8)
                if i == len(wls) - 1:
                    ax.set_xlabel("link (Mbit/s, constant)", fontsize=7)
                fig.colorbar(im, ax=ax, fraction=0.03)
        fig.suptitle("phone profile (EXTRAPOLATED): latency ratio vs sakura (>1 = sakura faster)", fontsize=9)
        fig.tight_layout()
        fig.savefig(out / "e2e_profile_heatmap.png", dpi=110)
        plt.close(fig)
    fams = sorted({r["family"] for r in runs} - {"constant"})
    if fams:
        fig, axes = plt.subplots(1, len(fams), figsize=(3.3 * len(fams), 3.0), squeeze=False)
        w, p = wls[min(len(wls) - 1, 3)], phones[-1]
        for ax, fam in zip(axes[0], fams):
            rs = [r for r in runs if r["family"] == fam and r["workload"] == w and r["phone"] == p]
            for m in ("on-device", "on-device-nocache", "cachegen", "sakura", "offline"):
                xs = sorted(r[m]["latency_s"] for r in rs)
                ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", label=m)
            ax.set_title(f"{fam} ({len(rs)} runs)", fontsize=8)
            ax.set_xlabel("latency (s)", fontsize=7)
            ax.set_xscale("log")
        axes[0, 0].set_ylabel("CDF")
        axes[0, 0].legend(fontsize=6)
        fig.suptitle(f"phone profile (EXTRAPOLATED): {w} on {p.split(' (')[0]}", fontsize=9)
        fig.tight_layout()
        fig.savefig(out / "e2e_profile_cdf.png", dpi=110)
        plt.close(fig)


def plot_frontiers(result: dict, out: Path) -> None:
    """Latency-quality frontiers: per workload one figure, a row per phone and a panel per trace
    family; each method's sweep configurations at their median latency and median PSNR."""
    import matplotlib  # lazy: plots only: not imported by a run that draws nothing

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: plots only: not imported by a run that draws nothing

    runs = result["runs"]
    wls = [w["name"] for w in result["workloads"] if any(r["workload"] == w["name"] for r in runs)]
    phones = [p["name"] for p in result["phones"]]
    fams = sorted({r["family"] for r in runs})
    style = {"sakura": ("C3", "o"), "cachegen": ("C0", "s"), "cachegen-fair": ("C2", "^")}
    for w in wls:
        fig, axes = plt.subplots(len(phones), len(fams), figsize=(3.1 * len(fams), 2.6 * len(phones)), squeeze=False)
        for i, p in enumerate(phones):
            for j, fam in enumerate(fams):
                ax = axes[i, j]
                rs = [r for r in runs if r["workload"] == w and r["phone"] == p and r["family"] == fam]
                med = sweep_medians(rs)
                for m, (c, mk) in style.items():
                    pts = sorted((x["latency_s"], min(x["psnr_db"], 70.0)) for x in med if x["method"] == m)
                    if not pts:
                        continue
                    front, best = [], -math.inf  # Pareto: faster first, keep what raises PSNR
                    for lat, ps in pts:
                        if ps > best:
                            front.append((lat, ps))
                            best = ps
                    ax.scatter([a for a, _ in pts], [b for _, b in pts], color=c, marker=mk, s=10, alpha=0.5)
                    ax.plot([a for a, _ in front], [b for _, b in front], color=c, lw=1, label=m)
                if rs:
                    od = statistics.median(r["on-device"]["latency_s"] for r in rs)
                    ax.axvline(od, color="k", lw=0.6, ls="--")
                    ax.axvline(statistics.median(r["oracle"]["latency_s"] for r in rs), color="0.6", lw=0.6, ls=":")
                ax.set_title(f"{fam} ({len(rs)} runs)", fontsize=7)
                ax.tick_params(labelsize=6)
                if i == len(phones) - 1:
                    ax.set_xlabel("median latency (s); dashed: on-device, dotted: oracle", fontsize=6)
                if j == 0:
                    ax.set_ylabel(f"{p.split(' (')[0]}\nmedian PSNR (dB, 70 = exact)", fontsize=6)
        axes[0, 0].legend(fontsize=6)
        fig.suptitle(f"phone profile (EXTRAPOLATED): latency-quality frontiers, {w}", fontsize=9)
        fig.tight_layout()
        fig.savefig(out / f"e2e_frontier_{w}.png", dpi=100)
        plt.close(fig)
