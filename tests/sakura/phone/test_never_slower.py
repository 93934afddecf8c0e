"""Never slower than on-device (by construction) and the losing runs of the phone profile, replayed
deterministically in the simulator. Each regression names the cause found on its timeline."""

import json
from pathlib import Path
import math
import random

import numpy as np
import pytest

from sakura.emulation.traces import Trace, constant_trace
from sakura.phone import (BandwidthEstimator, CacheGenPolicy, ConstantLink, Route, RttEstimator, SakuraPolicy,
                            ShardSpec, TraceLink, offline_plan)
from sakura.phone.driver import LOSS_BOUND
from sakura.phone.plan import PipelineState, all_local_s
from sakura.phone.sim import simulate_edit


def run(specs, policy, link, *, prior_bps, rtt=0.04, workers=4, pre=0.0):
    return simulate_edit(specs, policy, link=link, rtt_s=rtt, bandwidth=BandwidthEstimator(prior_bps=prior_bps),
                         rtt=RttEstimator(prior_s=rtt), decode_workers=workers, compute_start_s=pre)


def on_device_first_step(specs, pre=0.0):
    return pre + all_local_s(specs)


def random_case(rng: random.Random):
    """A random workload and a hostile link: rates that swing by 100x and a link that may die."""
    L = rng.randint(4, 24)
    local, compute = rng.uniform(0.01, 2.0), rng.uniform(0.005, 1.0)
    B = rng.choice([2e5, 2e6, 2e7])
    routes = tuple(Route(f"r{i}", int(B * f), rng.uniform(0.0, 3.0) * compute, m)
                   for i, (f, m) in enumerate([(0.05, 4e-4), (0.15, 1e-4), (0.3, 2e-5)]))
    specs = [ShardSpec(routes, compute, local, floor_mse=rng.choice([None, 1e-4, 4e-4]))] * L
    n = rng.randint(2, 12)
    edges = np.cumsum([0.0] + [rng.uniform(0.05, 5.0) * local for _ in range(n)])
    rate = np.array([B / local * rng.choice([0.0, 0.01, 0.1, 1.0, 10.0]) for _ in range(n)])
    rate[0] = max(rate[0], 1.0)
    tail = rng.choice([0.0, 1e-3 * B])  # the link dies, or crawls, after the trace
    tr = Trace("hostile", np.append(edges, edges[-1] + 1e4), np.append(rate, tail))
    prior = B / local * rng.choice([0.01, 1.0, 100.0])  # the phone's estimate: way off, or right
    return specs, TraceLink(tr), prior, rng.uniform(0.0, 3.0) * local


@pytest.mark.parametrize("seed", range(40))
def test_sakura_is_never_more_than_the_loss_bound_slower_than_on_device(seed):
    """sakura <= (1 + e) x on-device for any link (docs/runtime.md: the slack invariant). The
    reference is on-device's whole time (here: the work before the transformer and its first step)."""
    specs, link, prior, pre = random_case(random.Random(seed))
    res = run(specs, SakuraPolicy(), link, prior_bps=prior, pre=pre)
    bound = (1 + LOSS_BOUND) * (pre + all_local_s(specs))
    assert res.first_step_s <= bound * (1 + 1e-9), res.events


def test_without_the_loss_bound_a_dying_link_costs_more():
    """The bound is what holds: on a link that dies after carrying a little, the deadline rule
    alone (no bound) loses more than 1 % to on-device; with the bound it does not."""
    rng = random.Random(3)
    worst_free, worst_bound = 0.0, 0.0
    for _ in range(60):
        specs, link, prior, pre = random_case(rng)
        od = pre + all_local_s(specs)
        worst_free = max(worst_free, run(specs, SakuraPolicy(loss_bound=None), link, prior_bps=prior, pre=pre).first_step_s / od)
        worst_bound = max(worst_bound, run(specs, SakuraPolicy(), link, prior_bps=prior, pre=pre).first_step_s / od)
    assert worst_free > 1 + LOSS_BOUND
    assert worst_bound <= 1 + LOSS_BOUND + 1e-9


# ---------------------------------------------------------------------------------- regressions

L = 25
B = 50_000_000  # fp16 bytes of a 4,096-token Klein-4B layer


def klein_specs(local_s, compute_s, decode_s, floor=None):
    routes = (Route("progressive#0", int(B * 2.2 / 16), decode_s, 7.8e-6 / L * 6),)
    return [ShardSpec(routes, compute_s, local_s, floor)] * L


def test_decode_bound_pipeline_plans_the_decode_queue_of_shards_in_flight():
    """Profile loser (template1024-out512, ~11 TFLOP/s, 5G): decoding was the bottleneck and the
    planner let shards in flight skip the decode queue, so plans stalled more than predicted, the
    loss bound ran out and the last layer went local with an 18-layer catch-up (1.27x CacheGen)."""
    specs = klein_specs(local_s=0.111, compute_s=0.075, decode_s=0.566)
    link = ConstantLink(600e6 / 8)
    res = run(specs, SakuraPolicy(), link, prior_bps=330e6 / 8, pre=0.44)
    st = PipelineState(compute_free=0.44, decode_free=(0.0,) * 4)
    off = offline_plan(specs, link, 0.04, 4, start=st)
    assert not any("deadline" in e or "loss bound" in e for e in res.events), res.events
    assert res.first_step_s <= off.finish_s * 1.02


def test_first_plan_knows_compute_starts_after_the_text_encoder():
    """Profile loser (style3x1024-out512, ~1 TFLOP/s, fast 5G): the first plan assumed the forward
    pass reached layer 0 at once, so it computed layer 0 locally (5.2 s) while the shard would
    have arrived during the 5.1 s of text encoder + VAE encode (1.06x CacheGen)."""
    specs = klein_specs(local_s=5.18, compute_s=1.14, decode_s=1.70)
    res = run(specs, SakuraPolicy(), ConstantLink(500e6 / 8), prior_bps=250e6 / 8, pre=5.14)
    assert res.local_layers == 0
    assert res.first_step_s == pytest.approx(5.14 + L * 1.14, rel=0.01)


def test_a_layer_already_passed_is_not_planned_again():
    """Found on the 50 Mbit/s unit case: the plan counted the current layer's compute twice, so
    it thought the last shard had a layer more of slack than it had, upgraded it, and missed."""
    routes = (Route("r1", 1_000_000 // 8, 0.004, 4e-4), Route("r2", 1_000_000 // 5, 0.005, 1e-4),
              Route("r3", 1_000_000 // 3, 0.006, 2e-5))
    specs = [ShardSpec(routes, compute_s=0.030, local_s=0.020)] * 12
    res = run(specs, SakuraPolicy(), ConstantLink(50e6 / 8), prior_bps=50e6 / 8, workers=2)
    off = offline_plan(specs, ConstantLink(50e6 / 8), 0.04, decode_workers=2)
    assert not any("deadline" in e for e in res.events)
    assert res.first_step_s <= off.finish_s * 1.02


@pytest.mark.parametrize("mbps", [5, 20, 50, 100, 300, 1000])
def test_never_slower_than_on_device_or_either_cachegen_on_constant_links(mbps):
    levels = ("c3", "c2", "c1")
    routes = (Route("progressive#0", int(B * 2.2 / 16), 0.3, 2e-6), Route("progressive#1", int(B * 1.2 / 16), 0.2, 8e-6),
              Route("c3", int(B * 2.7 / 16), 0.25, 6e-6), Route("c2", int(B * 2.2 / 16), 0.23, 1e-5),
              Route("c1", int(B * 1.8 / 16), 0.21, 3e-5))
    sk = [ShardSpec(tuple(r for r in routes if r.name.startswith("p")), 0.3, 0.5, 6e-6)] * L
    cg = [ShardSpec(tuple(r for r in routes if r.name.startswith("c")), 0.3, 0.5, 6e-6)] * L
    link, prior = ConstantLink(mbps * 1e6 / 8), mbps * 1e6 / 8
    s = run(sk, SakuraPolicy(), link, prior_bps=prior, pre=1.0)
    best = on_device_first_step(sk, 1.0)
    for published in (True, False):
        c = run(cg, CacheGenPolicy(levels, target_s=L * 0.5, published=published), link, prior_bps=prior, pre=1.0)
        if c.image_mse >= s.image_mse:  # at equal or lower quality than sakura's
            best = min(best, c.first_step_s)
    assert s.first_step_s <= best * 1.02


def test_cachegen_as_published_fetches_one_chunk_at_a_time_and_recomputes_anywhere():
    specs = [ShardSpec((Route("c3", 300_000, 0.0, 1e-5), Route("c1", 100_000, 0.0, 3e-5)), 0.01, 0.02)] * 8
    link = TraceLink(Trace("drop", np.array([0.0, 0.1, 1e4]), np.array([10e6, 1e3])))  # 80 Mbit/s, then ~nothing
    pub = run(specs, CacheGenPolicy(("c3", "c1"), target_s=0.16, published=True), link, prior_bps=10e6, workers=1)
    assert pub.records[0].source != "local"  # the link was fast at first
    assert max(len([1 for r in pub.records if r.t_request <= t < r.fetch_end]) for t in
               [r.t_request for r in pub.records if r.t_request == r.t_request]) <= 1
    assert pub.local_layers > 0 and any(r.source == "local" for r in pub.records[1:])  # recomputed after a fetch
    assert math.isfinite(pub.first_step_s)


def test_a_shard_late_past_the_slack_is_hedged_and_still_used():
    """The link pauses for 3 s after carrying 7 of 10 shards. The forward pass reaches layer 7 with
    the generator 7 layers behind; the slack runs out long before the shard comes. Computing the
    layer then costs an 8-layer catch-up (8 s); hedging (one template layer at a time, each the
    first step of the loss bound's fallback) uses the shard once it is here, and the loss bound
    still holds."""
    n, compute, local, pre = 10, 0.1, 1.0, 0.5
    specs = [ShardSpec((Route("r", 1_000_000, 0.01, 0.0),), compute, local)] * n
    tr = Trace("pause", np.array([0.0, 0.75, 3.75, 1e4]), np.array([10e6, 0.0, 10e6]))
    res = run(specs, SakuraPolicy(), TraceLink(tr), prior_bps=10e6, workers=2, pre=pre)
    assert any("meanwhile" in e for e in res.events), res.events
    assert res.local_layers == 0  # every shard used, the late one too
    assert res.first_step_s < 5.0  # the shard at ~3.9 s, rounded up to a template layer, then 3 layers
    assert res.first_step_s <= (1 + LOSS_BOUND) * (pre + n * (compute + local))


def test_loss_bound_reference_is_on_devices_whole_latency():
    """The slack at layer 0 is e x (on-device's whole latency: the work before and after the first
    pass too), so work every method pays alike widens it: a shard 0.6 s late at layer 0 is waited
    for when the edit's other work is long enough, and computed when it is not."""
    n, compute, local = 10, 0.1, 1.0
    specs = [ShardSpec((Route("r", 6_000_000 if j == 0 else 500_000, 0.0, 0.0),), compute, local) for j in range(n)]
    link = ConstantLink(10e6)  # shard 0 arrives at 0.64 s, the pass reaches layer 0 at 0.04 s; the rest keep up
    short = simulate_edit(specs, SakuraPolicy(), link=link, rtt_s=0.04, bandwidth=BandwidthEstimator(prior_bps=10e6),
                          compute_start_s=0.04, post_s=0.0)
    long = simulate_edit(specs, SakuraPolicy(), link=link, rtt_s=0.04, bandwidth=BandwidthEstimator(prior_bps=10e6),
                         compute_start_s=0.04, post_s=30.0)
    assert short.records[0].source == "local" and long.records[0].source == "r"


# ------------------------------------------------------- phone-profile losers on their real 5G traces

# The workload as the phone profile ran it (docs/e2e, `sakura bench profile`): style3x1024-out512, 25
# layers, renditions measured on the mini model and scaled (sakura's one rung; CacheGen's three
# levels), 2 decode workers, 40 ms RTT; per phone level: forward compute and template compute per
# layer, the work before the first pass (text encoder, VAE encode) and after it (later passes, VAE decode).
STYLE3X_PHONES = {"~1 TFLOP/s": dict(compute=1.1435493083946855, local=5.1767860906969005, pre=5.143860499727193,
                                      post=55.05836994324181),
                  "~3.6 TFLOP/s": dict(compute=0.29521615768140375, local=1.3364276359709055, pre=1.3279276383021459,
                                        post=14.213746887453999)}
STYLE3X_SAKURA = (Route("progressive#0", 21240576, 0.3904556920627872, 1.8825864e-06),)
STYLE3X_CACHEGEN = (Route("cachegen:level=3", 26094336, 0.3487906509512628, 1.402464032e-05),
                    Route("cachegen:level=2", 21385728, 0.35143454225172926, 2.36121448e-05),
                    Route("cachegen:level=1", 16948224, 0.37913766432414425, 6.592579879999999e-05))
STYLE3X_FLOOR = 1.402464032e-05


def profile_run(phone: str, trace: str, offset_s: float, prior_bps: float):
    """sakura, on-device and both CacheGens (every level) on one profile run: (sakura's result, its
    latency, the best baseline's latency at equal or lower quality than sakura's)."""
    from sakura.emulation import load_trace

    try:
        tr = load_trace(trace)
    except Exception as e:  # noqa: BLE001 - no traces on this machine
        pytest.skip(f"trace not available here (not bundled; set SAKURA_TRACES): {e}")
    p = STYLE3X_PHONES[phone]
    link = TraceLink(tr, offset_s=offset_s)
    n = 25

    def sim(routes, policy):
        specs = [ShardSpec(routes, p["compute"], p["local"], STYLE3X_FLOOR)] * n
        return simulate_edit(specs, policy, link=link, rtt_s=0.04, bandwidth=BandwidthEstimator(prior_bps=prior_bps),
                             rtt=RttEstimator(prior_s=0.04), decode_workers=2, compute_start_s=p["pre"],
                             post_s=p["post"])

    s = sim(STYLE3X_SAKURA, SakuraPolicy())
    best = p["pre"] + n * (p["compute"] + p["local"]) + p["post"]  # on-device
    for published in (True, False):
        c = sim(STYLE3X_CACHEGEN, CacheGenPolicy(tuple(r.name for r in STYLE3X_CACHEGEN), target_s=n * p["local"],
                                                 published=published))
        if c.image_mse >= s.image_mse:
            best = min(best, c.first_step_s + p["post"])
    return s, s.first_step_s + p["post"], best


def test_a_late_last_shard_is_hedged_one_template_layer_at_a_time():
    """Profile loser (style3x1024-out512, ~1 TFLOP/s, 5G car-driving-trace-1 Verizon): 1.78x CacheGen.
    Shard 22 was a few seconds late when the loss bound's slack ran out, and the layer went local
    with a 20-layer catch-up (104 s) while the shard arrived 3 s later. Now the catch-up runs one
    template layer at a time (ADVANCE, which spends no slack) and the shard is used once it is here."""
    s, lat, best = profile_run("~1 TFLOP/s", "umn_5gophers/All-Carriers/03-User-Mobility/car-driving-trace-1.csv#Verizon",
                               10.348305662958992, 10562653.009852719)
    assert max(r.local_s for r in s.records) < 5 * STYLE3X_PHONES["~1 TFLOP/s"]["local"]  # no 20-layer catch-up
    assert lat <= 1.02 * best


def test_a_deadline_at_the_last_layer_no_longer_costs_an_18_layer_catch_up():
    """Profile loser (style3x1024-out512, ~1 TFLOP/s, 5G SPRINT/1/US-East/4): 1.49x CacheGen, slower
    than on-device; the last shard missed its deadline and the layer caught up 18 template layers."""
    s, lat, best = profile_run("~1 TFLOP/s", "umn_5gophers/All-Carriers/01-Throughput/data.csv#SPRINT/1/US-East/4",
                               10.0, 4650609.013831785)
    assert lat <= 1.02 * best


def test_a_link_faster_than_the_prior_is_not_discounted():
    """Profile loser (style3x1024-out512, ~3.6 TFLOP/s, 5G VERIZON/8/US-West/112): 1.06x CacheGen.
    The first sample (580 Mbit/s) beat the 317 Mbit/s prior; scored as an error, it discounted the
    estimate to 400 and the plan computed layer 0 (1.3 s) rather than stall on it. Only
    over-estimates are errors now, and layer 0 streams."""
    s, lat, best = profile_run("~3.6 TFLOP/s", "umn_5gophers/All-Carriers/01-Throughput/data.csv#VERIZON/8/US-West/112",
                               10.0, 39677139.737040594)
    assert s.records[0].source != "local"
    assert lat <= 1.02 * best


def test_a_dead_start_is_measured_again_by_a_probe():
    """Profile loser (style3x1024-out512, ~3.6 TFLOP/s, 5G car-driving-trace-2 Verizon): 1.50x
    CacheGen-fair, as slow as on-device. The link carried nothing for 8 s, the first samples read
    13-45 Mbit/s, the plan computed every layer locally and, fetching nothing, never saw the link
    reach 1 Gbit/s. A probe (the latest unrequested layer, when the link is idle) measures it.
    Still 4-5 % behind CacheGen-fair, whose lowest-level chunks kept measuring the link."""
    s, lat, best = profile_run("~3.6 TFLOP/s", "umn_5gophers/All-Carriers/03-User-Mobility/car-driving-trace-2.csv#Verizon",
                               12.053875246471504, 10329126.95879352)
    assert s.local_layers < 20  # it streams once the link is back
    assert lat <= 1.06 * best


# ------------------------------------- the floor rung: losers where CacheGen's cheaper levels won

# The phone profile's measured ladder (docs/e2e/e2e_profile.json "ladder", sakura-mini sticker-00; decode
# rates per worker of the measured 2-worker pool): sakura's default rung, the two floor rungs the profile's
# store now holds (`profile.FLOOR_RUNG_LADDER`) and CacheGen's three levels. Per rendition: bits per value,
# mean per-shard image MSE on the mini model, decode rate (fp16 bytes per worker-second).
PROFILE_LADDER = {
    "model": "sakura-mini", "template": "sticker-00", "layers": 6, "floor_image_mse": 5.8436001333333333e-05,
    "renditions": {
        "progressive#0": {"codec": "progressive", "bits_per_value": 2.250732421875, "image_mse": 7.844101666666667e-06,
                          "decode_fp16_bytes_per_cpu_s": 559997188.8926525},
        "progressive:budgets=[1.2]#0": {"codec": "progressive", "bits_per_value": 1.4580078125, "image_mse": 4.018395e-05,
                                        "decode_fp16_bytes_per_cpu_s": 559997188.8926525},
        "progressive:budgets=[1.0]#0": {"codec": "progressive", "bits_per_value": 1.2583821614583333,
                                        "image_mse": 0.00010105283333333334, "decode_fp16_bytes_per_cpu_s": 559997188.8926525},
        "cachegen:level=3": {"codec": "cachegen", "bits_per_value": 2.7650553385416665, "image_mse": 5.8436001333333333e-05,
                             "decode_fp16_bytes_per_cpu_s": 506893568.494962},
        "cachegen:level=2": {"codec": "cachegen", "bits_per_value": 2.26611328125, "image_mse": 9.838393666666667e-05,
                             "decode_fp16_bytes_per_cpu_s": 561729097.1539494},
        "cachegen:level=1": {"codec": "cachegen", "bits_per_value": 1.7958984375, "image_mse": 0.0002746908283333333,
                             "decode_fp16_bytes_per_cpu_s": 510273298.8198158}}}


def run_profile(ladder: dict, workload: str, phone: str, trace: str, offset_s: float, prior_bps: float) -> dict:
    """One phone-profile run through the profile's own per-run code (`run_methods`: the same workload
    costs, ladder scaling and policies) on a real trace, on-device, both CacheGens and sakura."""
    from sakura.bench.profile import run_methods
    from sakura.bench.workloads import get_phone, get_workload, workload_costs
    from sakura.emulation import load_trace

    try:
        tr = load_trace(trace)
    except Exception as e:  # noqa: BLE001 - no traces on this machine
        pytest.skip(f"trace not available here (not bundled; set SAKURA_TRACES): {e}")
    return run_methods(workload_costs(get_workload(workload), get_phone(phone)), ladder, TraceLink(tr, offset_s=offset_s),
                       prior_bps=prior_bps, rtt_s=0.04, decode_workers=2,
                       methods=("on-device", "cachegen", "cachegen-fair", "sakura"))


def profile_loss(workload: str, phone: str, trace: str, offset_s: float, prior_bps: float, *, floor_rungs: bool):
    """One phone-profile run replayed (`run_profile`): (sakura / best baseline at equal or lower
    quality, the results)."""
    from sakura.bench.profile import loss_ratio

    ladder = PROFILE_LADDER if floor_rungs else {**PROFILE_LADDER, "renditions": {
        k: v for k, v in PROFILE_LADDER["renditions"].items() if "budgets" not in k}}
    res = run_profile(ladder, workload, phone, trace, offset_s, prior_bps)
    return loss_ratio(res), res


FLOOR_RUNG_LOSERS = [  # (workload, phone, trace, offset, prior bytes/s): the profile's seeded draw
    ("style3x1024-out512", "~3.6", "umn_5gophers/All-Carriers/01-Throughput/data.csv#SPRINT/1/US-West/19",
     10.0, 5449539.569237886),   # was 1.171 (the worst run): the link halved mid-edit
    ("style3x1024-out512", "~11", "umn_5gophers/All-Carriers/01-Throughput/data.csv#SPRINT/1/US-East/6",
     10.0, 10926754.442760888),  # was 1.157: 136 -> 5 Mbit/s over 20 s
    ("template1024-out512", "~3.6", "umn_5gophers/All-Carriers/01-Throughput/data.csv#TMOBILE/1/US-East/49",
     10.0, 6736391.440965371),   # was 1.086
]


@pytest.mark.parametrize("workload,phone,trace,offset_s,prior_bps", FLOOR_RUNG_LOSERS)
def test_a_rung_at_cachegen_l3s_quality_wins_the_link_bound_runs(monkeypatch, workload, phone, trace, offset_s,
                                                                  prior_bps):
    """Profile losers on swinging or collapsing 5G links: sakura's only rung (2.25 bits/value, ~51 dB a
    shard) cost more bytes than CacheGen's levels 2 and 1 (2.27 and 1.80 bits/value), which won at lower
    quality. With the floor rungs (1.26 and 1.46 bits/value, the runtime's image floor still holding the
    image to CacheGen-L3's quality) the planner spends fewer bytes where the link is the bottleneck.
    (Evaluation7's rescue and error-widened plan tolerance are off for the one-rung run: with them the
    SPRINT/1/US-East/6 run no longer loses even with one rung.)"""
    import sakura.phone.driver as driver

    with monkeypatch.context() as m:
        m.setattr(driver, "RESCUE", False)
        m.setattr(driver, "PLAN_TOL_GAIN", None)
        before, _ = profile_loss(workload, phone, trace, offset_s, prior_bps, floor_rungs=False)
    after, res = profile_loss(workload, phone, trace, offset_s, prior_bps, floor_rungs=True)
    assert before > 1.02  # the run lost with the one rung
    assert after <= 1.02, (before, after)
    assert res["sakura"]["psnr_db"] >= 34.0  # the image floor: CacheGen-L3 on every shard (~34.6 dB here)


# ------------------------- round 4: links that fall mid-edit (docs/notes/runtime-history.md, "This round (evaluation4)")

# The ladder of the published profile (docs/e2e/e2e_profile.json "ladder": sakura-mini sticker-00, decode
# rates per worker of the measured 2-worker pool, bits/value-matched): sakura's rungs and CacheGen's levels.
PROFILE_LADDER_R4 = {
    "model": "sakura-mini", "template": "sticker-00", "layers": 6, "floor_image_mse": 5.8436001333333333e-05,
    "renditions": {
        "progressive#0": {"codec": "progressive", "bits_per_value": 2.250732421875, "image_mse": 7.844101666666667e-06,
                          "decode_fp16_bytes_per_cpu_s": 429182443.8342947},
        "progressive:budgets=[1.0]#0": {"codec": "progressive", "bits_per_value": 1.2583821614583333,
                                        "image_mse": 0.00010105283333333334, "decode_fp16_bytes_per_cpu_s": 464411463.9675453},
        "progressive:budgets=[1.2]#0": {"codec": "progressive", "bits_per_value": 1.4580078125, "image_mse": 4.018395e-05,
                                        "decode_fp16_bytes_per_cpu_s": 464411463.9675453},
        "cachegen:level=3": {"codec": "cachegen", "bits_per_value": 2.7650553385416665, "image_mse": 5.8436001333333333e-05,
                             "decode_fp16_bytes_per_cpu_s": 377687914.86315954},
        "cachegen:level=2": {"codec": "cachegen", "bits_per_value": 2.26611328125, "image_mse": 9.838393666666667e-05,
                             "decode_fp16_bytes_per_cpu_s": 521218389.2007768},
        "cachegen:level=1": {"codec": "cachegen", "bits_per_value": 1.7958984375, "image_mse": 0.0002746908283333333,
                             "decode_fp16_bytes_per_cpu_s": 374165318.2446052}}}


def replayed_run(monkeypatch, workload, phone, trace, offset_s, prior_bps, **driver_constants):
    """One published profile run (`run_profile` on the published ladder), with some of the driver's
    policy constants set (`driver_constants`, e.g. ROBUST_SHARE=None: the fix off): (sakura / the
    best of on-device and both CacheGens at equal or lower quality, sakura / on-device, the results)."""
    import sakura.phone.driver as driver
    from sakura.bench.profile import loss_ratio

    with monkeypatch.context() as m:
        for k, v in driver_constants.items():
            assert hasattr(driver, k), k
            m.setattr(driver, k, v)
        res = run_profile(PROFILE_LADDER_R4, workload, phone, trace, offset_s, prior_bps)
    return loss_ratio(res), res["sakura"]["latency_s"] / res["on-device"]["latency_s"], res


#: evaluation7's fixes (the rescue, the error-widened plan tolerance), off where a regression of an earlier
#: round shows its run losing without that round's fix: with them several such runs no longer lose at all
OFF7 = dict(RESCUE=False, PLAN_TOL_GAIN=None)


def test_bytes_free_at_the_estimate_are_not_spent_where_the_link_may_halve(monkeypatch):
    """Profile loser (template1024-out512, ~1 TFLOP/s, 5G car-driving-trace-2 TMobile): 1.135, the worst
    run. The link carried ~70 Mbit/s and died at 20 s. The plan was compute-bound, so upgrading every
    shard to the 7.1 MB rung was free at the estimate; the last shard was still on the link when it died
    and layer 24 cost a 24-layer catch-up (ADVANCE, to the loss bound). Plans must now also be near-fastest
    on a link at half the estimate (`ROBUST_SHARE`): the shards come at 4.6 MB and are all here by 14 s."""
    args = ("template1024-out512", "~1", "umn_5gophers/All-Carriers/03-User-Mobility/car-driving-trace-2.csv#TMobile",
            15.0725475622097, 24943611.832345475)
    before, _, _ = replayed_run(monkeypatch, *args, ROBUST_SHARE=None, **OFF7)
    after, vs_od, res = replayed_run(monkeypatch, *args)
    assert before > 1.13
    assert after <= 1.02 and vs_od < 0.8, (before, after)
    assert res["sakura"]["psnr_db"] >= 34.0  # the image floor (CacheGen-L3 on every shard, ~34.6 dB)


def test_a_wait_the_generator_can_hedge_is_not_charged_to_the_slack(monkeypatch):
    """Profile loser (style3x1024-out512, ~3.6 TFLOP/s, 5G VERIZON/1/US-East/87): 1.065 (1.095 with the robust
    plan alone). The link fell from 257 to 16 Mbit/s at 6 s; waiting on shards 14-16 spent the slack, and the
    planner then refused every plan with a predicted stall, so it computed layer 17 with a 13-layer catch-up
    (17 s) rather than wait ~6 s for its shard. A wait with the local generator behind is hedged (ADVANCE) and
    spends no slack; the planner now plays plans with the hedge (`evaluate(hedged=True)`)."""
    args = ("style3x1024-out512", "~3.6", "umn_5gophers/All-Carriers/01-Throughput/data.csv#VERIZON/1/US-East/87",
            10.0, 26878749.97156923)
    before, _, _ = replayed_run(monkeypatch, *args, PLAN_HEDGE=False, **OFF7)
    after, _, _ = replayed_run(monkeypatch, *args)
    assert before > 1.02
    assert after <= 1.02, (before, after)


def test_a_transfer_that_never_ends_lowers_the_estimate(monkeypatch):
    """Profile loser (klein9b-1024, ~1 TFLOP/s, mahimahi ATT-LTE-driving): 1.040. A 9 Mbit/s prior on a link at
    1-6 Mbit/s: no shard arrived in time, every one was given up, so no fetch completed and the estimate
    never fell; each next shard was requested one layer ahead at the prior's rate and was late too (sakura =
    on-device, CacheGen-fair 4 % faster at 32.9 dB). The transfers in flight now bound the rate the planner
    uses (`EditDriver.inflight_bound_bps`), a shard given up mid-transfer is a sample
    (`BandwidthEstimator.observe_bound`), and the plan is redone when that bound falls below
    `REPLAN_BELOW` of its rate: sakura streams the upper layers early enough."""
    args = ("klein9b-1024", "~1", "mahimahi_cellular/ATT-LTE-driving-2016.down", 10.001009373711632, 1154088.751546068)
    before, _, _ = replayed_run(monkeypatch, *args, BOUND_BY_INFLIGHT=False, **OFF7)
    after, _, res = replayed_run(monkeypatch, *args)
    # 1.016 without the bound since the simulator aborts a given-up transfer as the live runtime does
    # (1.040 while it kept it on the link): the late shards no longer delay the next ones
    assert before > 1.01
    assert after <= 1.0, (before, after)
    assert res["sakura"]["local_layers"] < 32


def test_a_run_that_spends_its_whole_slack_is_within_the_check(monkeypatch):
    """Profile loser (style3x1024-out512, ~3.6 TFLOP/s, TMobile-LTE-short): sakura spent its whole slack and
    ended at 1.0200000000000002 x on-device with e = 2 %, the check's own tolerance (float rounding). The bound
    is now 1.99 %. (This round's other fixes are off here: with them the run no longer spends its slack.)"""
    args = ("style3x1024-out512", "~3.6", "mahimahi_cellular/TMobile-LTE-short.down", 22.35872276755317,
            1481250.0000000335)
    off = dict(ROBUST_SHARE=None, PLAN_HEDGE=False, BOUND_BY_INFLIGHT=False, **OFF7)
    _, before, _ = replayed_run(monkeypatch, *args, LOSS_BOUND=0.02, **off)
    _, after, _ = replayed_run(monkeypatch, *args, **off)
    assert before > 1.02
    assert after <= 1.0199 + 1e-12


# ------------------------- round 5: the simulator aborts a given-up transfer (docs/notes/runtime-history.md, evaluation5)

def test_a_given_up_transfer_leaves_the_link(monkeypatch):
    """Profile loser (klein9b-1024, ~11 TFLOP/s, 5G car-driving-trace-1 TMobile): 1.021 with the current policy
    on the previous simulator, which kept a transfer the driver had given up (its layer computed on the
    device) on the link to its end, while the live runtime cancels the fetch's task and the client closes
    the connection at once (`runtime.live.FetchStage`, `client.TemplateClient`). The shards requested behind
    it waited for bytes nobody used. The simulator now aborts it as live does (`sim.ABORT_CANCELLED`)."""
    import sakura.phone.sim as sim
    from sakura.bench.profile import loss_ratio

    args = ("klein9b-1024", "~11", "umn_5gophers/All-Carriers/03-User-Mobility/car-driving-trace-1.csv#TMobile",
            15.799293418259099, 16408851.184389824)  # the profile's seeded draw (every family)
    # the ladder of the profile this run lost in (docs/e2e/e2e_profile.json before evaluation5's rerun)
    ladder = json.loads((Path(__file__).parent / "profile_ladder_r5.json").read_text())
    import sakura.phone.driver as driver

    # evaluation7's fixes off for both (this tests the abort alone): with them this run, on this older
    # ladder, is 1.012 aborted and 1.021 kept (the widened plan tolerance costs it 1.9 %)
    with monkeypatch.context() as m:
        for k, v in OFF7.items():
            m.setattr(driver, k, v)
        m.setattr(sim, "ABORT_CANCELLED", False)
        kept = run_profile(ladder, *args)
        m.setattr(sim, "ABORT_CANCELLED", True)
        aborted = run_profile(ladder, *args)
    assert loss_ratio(kept) > 1.02
    assert loss_ratio(aborted) <= 1.0, (loss_ratio(kept), loss_ratio(aborted))
    assert aborted["sakura"]["latency_s"] <= 1.0199 * aborted["on-device"]["latency_s"] + 1e-9


# --------------- evaluation7: the 20 losers of session 6's profile (docs/notes/runtime-history.md, "This round (evaluation7)")

LOSERS_R7 = json.loads((Path(__file__).parent / "profile_losers_r7.json").read_text())


def replay_loser(fixture: dict, monkeypatch, trace: str, workload: str, phone: str, **driver_constants):
    """One run of a losers fixture (`profile_losers_r*.json`), sakura re-simulated as `sakura bench profile --replay`
    does (the fixture's ladder, decode pool and split, the run's link draw and prior; the baselines are the
    fixture's: they do not depend on sakura's policy), with some driver constants set: (sakura / the best of
    on-device and both CacheGens at equal or lower PSNR, sakura / on-device, sakura's result, the run)."""
    import sakura.phone.driver as driver
    from sakura.bench.profile import loss_ratio, run_methods
    from sakura.bench.workloads import get_phone, get_workload, workload_costs
    from sakura.emulation import load_trace

    run = next(r for r in fixture["runs"] if r["trace"] == trace and r["workload"] == workload
               and r["phone"].startswith(phone))
    try:
        tr = load_trace(trace)
    except Exception as e:  # noqa: BLE001 - no traces on this machine
        pytest.skip(f"trace not available here (not bundled; set SAKURA_TRACES): {e}")
    with monkeypatch.context() as m:
        for k, v in driver_constants.items():
            assert hasattr(driver, k), k
            m.setattr(driver, k, v)
        res = run_methods(workload_costs(get_workload(workload), get_phone(run["phone"])), fixture["ladder"],
                          TraceLink(tr, offset_s=run["offset_s"]), prior_bps=run["prior_bps"],
                          rtt_s=fixture["rtt_ms"] / 1000, decode_workers=fixture["decode_workers"],
                          methods=("sakura",), decode_split=fixture["decode_split"])["sakura"]
    now = {**run, "sakura": res}
    return loss_ratio(now), res["latency_s"] / run["on-device"]["latency_s"], res, run


def replay_all_within_bound(fixture: dict) -> list[tuple[float, dict, dict]]:
    """Every run of a losers fixture replayed with today's policy; asserts each stays within the loss bound of
    on-device and at or above the image floor (CacheGen-L3 on every shard); returns (loss ratio, result, run)."""
    from sakura.util.psnr import psnr_db

    mp = pytest.MonkeyPatch()
    floor_db = psnr_db(fixture["ladder"]["floor_image_mse"] * fixture["ladder"]["layers"])
    out = []
    for r in fixture["runs"]:
        ratio, vs_od, res, run = replay_loser(fixture, mp, r["trace"], r["workload"], r["phone"][:4])
        assert vs_od <= 1 + LOSS_BOUND + 1e-12, r["trace"]
        assert res["psnr_db"] >= floor_db - 1e-6, r["trace"]
        out.append((ratio, res, run))
    return out


def loser_r7(monkeypatch, trace: str, workload: str, phone: str, **driver_constants):
    """One of session 6's 20 published losers (`replay_loser` on profile_losers_r7.json)."""
    return replay_loser(LOSERS_R7, monkeypatch, trace, workload, phone, **driver_constants)


def test_a_dropped_layer_is_rescued_when_its_catch_up_begins(monkeypatch):
    """Published loser, the worst (style3x1024-out512, ~3.6 TFLOP/s, 5G TMOBILE/1/US-East/49): 1.064. The link dipped
    from ~94 to ~42 Mbit/s at 6-21 s; at 7.8 s the plan was redone at 47 Mbit/s, where every split from 8 to 16 ties
    (link-bound), and the robust tie-break dropped layer 15: it was computed with an 8-layer catch-up (10.7 s) while
    shards 16-24 streamed and the link recovered. Now, when that catch-up begins, the driver asks the planner
    whether requesting the shard meanwhile finishes sooner (at the plain prediction) and, if so, requests it and
    runs the catch-up one template layer at a time (ADVANCE, no slack spent): the shard comes first."""
    args = ("umn_5gophers/All-Carriers/01-Throughput/data.csv#TMOBILE/1/US-East/49", "style3x1024-out512", "~3.6")
    before, _, _, _ = loser_r7(monkeypatch, *args, RESCUE=False)
    after, vs_od, res, _ = loser_r7(monkeypatch, *args)
    assert before > 1.06
    assert after < 0.95 and vs_od <= 1 + LOSS_BOUND, (before, after)


@pytest.mark.parametrize("trace,workload,phone", [
    ("umn_5gophers/All-Carriers/01-Throughput/data.csv#SPRINT/1/US-East/7", "template1024-out512", "~3.6"),
    ("umn_5gophers/All-Carriers/01-Throughput/data.csv#SPRINT/1/US-East/2", "template1024-out512", "~11"),
])
def test_a_link_that_falls_short_of_its_predictions_is_planned_for_half_of_it(monkeypatch, trace, workload, phone):
    """Published losers on SPRINT/1 traces (the link falls steadily, e.g. 36 -> 18 Mbit/s): 1.055 and 1.053. The
    first plans streamed from layer 12 at the prior's rate; every re-plan trailed the fall and dropped a layer
    mid-stream, each costing a catch-up (layers 14 and 22: 3 and 8 template layers), while CacheGen-fair,
    computing a longer prefix, won at 34.5-36.7 dB. The robust choice could only pick among plans within 1 % of
    the fastest at the estimate; it may now give up to 1 % + 0.5 x the largest recent over-estimate (at most
    10 %) at the estimate for a plan that holds at half of it (`EditDriver.estimate_tol`)."""
    before, _, _, _ = loser_r7(monkeypatch, trace, workload, phone, PLAN_TOL_GAIN=None)
    after, vs_od, _, _ = loser_r7(monkeypatch, trace, workload, phone)
    assert before > 1.05
    assert after <= 1.0 + 1e-9 and vs_od <= 1 + LOSS_BOUND, (before, after)


def test_the_published_losers_lose_less():
    """All 20 published losers replayed with this round's policy: at most 10 still lose by > 2 % (10 do), none by
    more than 6.1 % (worst 1.060: template1024-out512 ~3.6 TFLOP/s SPRINT/1/US-East/8, 1.053 before), every one
    within the loss bound of on-device and at or above the image floor (CacheGen-L3 on every shard, 34.56 dB)."""
    ratios = [ratio for ratio, _, _ in replay_all_within_bound(LOSERS_R7)]
    assert all(r["published_loss_ratio"] > 1.02 for r in LOSERS_R7["runs"])
    assert sum(x > 1.02 for x in ratios) <= 10, ratios
    assert max(ratios) <= 1.061, ratios


# --------------- evaluation8: the 15 losers of session 7's profile (docs/notes/runtime-history.md, "This round (evaluation8)")

LOSERS_R8 = json.loads((Path(__file__).parent / "profile_losers_r8.json").read_text())


def loser_r8(monkeypatch, trace: str, workload: str, phone: str, **driver_constants):
    """One run of `profile_losers_r8.json` (`replay_loser`; baselines simulated on this simulator)."""
    return replay_loser(LOSERS_R8, monkeypatch, trace, workload, phone, **driver_constants)


def test_the_published_losers_of_session_7_stay_within_the_bound():
    """All 15 losers of session 7's profile replayed with this round's policy and simulator (baselines re-simulated
    on it: a shard requested on a dead link measures the link from its first byte): every one within the loss bound
    of on-device and at or above the image floor; they still lose (15 of 15 by > 2 %, worst 1.062: klein9b-1024
    ~3.6 TFLOP/s SPRINT/1/US-East/6). Pinned so that a change that makes them worse shows: none may lose by more
    than 6.2 %. What was tried on them this round and not kept: docs/notes/runtime-history.md, evaluation8."""
    ratios = [ratio for ratio, _, _ in replay_all_within_bound(LOSERS_R8)]
    assert all(r["published_loss_ratio"] > 1.02 for r in LOSERS_R8["runs"])
    assert sum(x > 1.02 for x in ratios) <= 15, ratios
    assert max(ratios) <= 1.062, ratios


# --------------- session 8: the 8 losers of the full profile on session 8's code (docs/notes/runtime-history.md)

LOSERS_R9 = json.loads((Path(__file__).parent / "profile_losers_r9.json").read_text())


def test_the_published_losers_of_session_8_stay_within_the_bound():
    """The 8 losers of session 8's published profile (codec v5, floor rungs [0.8]/[1.0], its decode rates), sakura
    re-simulated with the fixture's ladder, pool, split, link draw and prior: the profile is deterministic, so each
    reproduces its published latency; every one within the loss bound of on-device and at or above the image floor.
    Pinned so that a policy change that makes them worse shows: no more than 8 lose, none by more than 8.1 %."""
    replayed = replay_all_within_bound(LOSERS_R9)
    for _, res, run in replayed:
        assert res["latency_s"] == pytest.approx(run["sakura_published"]["latency_s"], rel=1e-9), run["trace"]
    ratios = [ratio for ratio, _, _ in replayed]
    assert {r["family"] for r in LOSERS_R9["runs"]} == {"umn_5gophers", "mahimahi_cellular", "norway_hsdpa_3g"}
    assert sum(x > 1.02 for x in ratios) <= 8, ratios
    assert max(ratios) <= 1.081, ratios
