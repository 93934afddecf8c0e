"""The scheduler is a pure function of estimates, sizes and deadlines: tested without a clock."""

import itertools

import pytest

from sakura.runtime import (LOCAL, BandwidthEstimator, Option, PipelineState, ShardSpec, constant_rate, plan_next,
                            simulate)

MB = 1_000_000


def ladder(n=6, compute_s=0.02, local_s=0.05):
    opts = (Option("lossless", 4 * MB, 0.002, 0.0), Option("q8", 2 * MB, 0.01, 0.01),
            Option("q4", 1 * MB, 0.01, 0.05), Option("q2", MB // 2, 0.01, 0.2))
    return [ShardSpec(opts, compute_s, Option(LOCAL, local_s=local_s)) for _ in range(n)]


def test_simulate_arithmetic():
    spec = ShardSpec((Option("a", 1000, 0.5, 0.0),), compute_s=1.0)
    tl = simulate([spec, spec], [spec.options[0]] * 2, constant_rate(1000.0, rtt_s=0.25))
    a, b = tl.shards
    assert (a.fetch_end, a.ready, a.compute_start, a.compute_end, a.stall_s) == (1.25, 1.75, 1.75, 2.75, 1.75)
    # second fetch starts when the link is free (1.25), ready at 3.0, compute waits 0.25 for it
    assert (b.fetch_start, b.fetch_end, b.ready, b.compute_start, b.stall_s) == (1.25, 2.5, 3.0, 3.0, 0.25)
    assert tl.finish_s == 4.0 and tl.bytes == 2000


def test_local_only_as_a_prefix():
    specs = ladder(3)
    with pytest.raises(ValueError, match="prefix"):
        simulate(specs, [specs[0].options[0], specs[1].local, specs[2].local], constant_rate(MB))
    tl = simulate(specs, [specs[0].local, specs[1].local, specs[2].options[0]], constant_rate(MB))
    assert [s.option for s in tl.shards] == [LOCAL, LOCAL, "lossless"]


def test_fast_link_prefers_exact_rendition():
    specs = ladder()
    choice = plan_next(specs, PipelineState(), bytes_per_s=10_000 * MB)
    assert choice.name == "lossless"


def test_slow_link_computes_locally():
    specs = ladder()
    choice = plan_next(specs, PipelineState(), bytes_per_s=0.1 * MB)
    assert choice.is_local


def test_quality_budget_is_respected():
    specs = ladder()
    # a link where q2 would be fastest among fetches, but the budget forbids it
    for _ in range(3):
        c = plan_next(specs, PipelineState(all_local_so_far=False), bytes_per_s=5 * MB, max_distortion=0.06)
        assert c.name in ("lossless", "q8", "q4")


def _closed_loop(specs, bw, horizon, **kw):
    state, chosen = PipelineState(), []
    from sakura.runtime.scheduler import step
    for i in range(len(specs)):
        c = plan_next(specs[i:], state, bw, horizon=horizon, **kw)
        state, _ = step(state, specs[i], c, constant_rate(bw))
        chosen.append(c)
    return simulate(specs, chosen, constant_rate(bw)), chosen


@pytest.mark.parametrize("bw_mb", [0.3, 3.0, 30.0, 300.0])
def test_full_horizon_mpc_is_optimal_among_prefix_plans(bw_mb):
    specs = ladder(4)
    bw = bw_mb * MB
    tl, _ = _closed_loop(specs, bw, horizon=4)
    best = float("inf")
    for combo in itertools.product(*[s.choices() for s in specs]):
        if any(c.is_local and not all(p.is_local for p in combo[:i]) for i, c in enumerate(combo)):
            continue
        best = min(best, simulate(specs, combo, constant_rate(bw)).finish_s)
    assert tl.finish_s == pytest.approx(best, rel=1e-9)


@pytest.mark.parametrize("bw_mb", [0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0])
def test_short_horizon_beats_static_policies(bw_mb):
    specs = ladder(8)
    bw = bw_mb * MB
    tl, chosen = _closed_loop(specs, bw, horizon=2)
    all_local = simulate(specs, [s.local for s in specs], constant_rate(bw)).finish_s
    all_lossless = simulate(specs, [s.options[0] for s in specs], constant_rate(bw)).finish_s
    assert tl.finish_s <= min(all_local, all_lossless) + 1e-9


def test_plan_errors():
    with pytest.raises(ValueError, match="no shards"):
        plan_next([], PipelineState(), MB)
    spec = ShardSpec((Option("q2", 10, 0.0, 0.5),), 0.01)
    with pytest.raises(ValueError, match="quality budget"):
        plan_next([spec], PipelineState(), MB, max_distortion=0.1)
    with pytest.raises(ValueError, match="bytes_per_s"):
        plan_next([spec], PipelineState(), 0.0)


def test_estimator_harmonic_mean_and_robust_discount():
    est = BandwidthEstimator(window=3, min_sample_bytes=1)
    assert est.predict_bps() is None and est.robust_bps() is None
    est.observe(1000, 1.0)     # 1000 B/s
    est.observe(3000, 1.0)     # 3000 B/s, predicted 1000: error 2/3
    assert est.predict_bps() == pytest.approx(2 / (1 / 1000 + 1 / 3000))
    assert est.robust_bps() == pytest.approx(est.predict_bps() / (1 + 2 / 3))
    # the harmonic mean is pulled towards the slow sample
    assert est.predict_bps() < 2000


def test_estimator_merges_small_samples_and_validates():
    est = BandwidthEstimator(min_sample_bytes=10_000, prior_bps=500.0)
    est.observe(4000, 1.0)
    assert est.predict_bps() == 500.0  # not enough bytes yet: prior
    est.observe(6000, 1.0)
    assert est.predict_bps() == pytest.approx(5000.0)
    with pytest.raises(ValueError):
        est.observe(-1, 1.0)
    with pytest.raises(ValueError):
        BandwidthEstimator(window=0)
