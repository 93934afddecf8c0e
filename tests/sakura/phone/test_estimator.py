"""Link estimators: pure, fed with timestamps, no clock."""

import pytest

from sakura.phone.estimator import BandwidthEstimator, RttEstimator


def test_first_byte_to_last_byte_excludes_the_round_trip():
    """At 1,000 Mbit/s with a 40 ms RTT a request-to-last-byte sample reads ~13 Mbit/s; ours is exact."""
    rate, rtt, chunk = 125e6, 0.040, 65536
    est = BandwidthEstimator(prior_bps=10e6 / 8)
    t = 0.0
    for _ in range(3):  # three 4 MiB shards, each requested ahead (no idle gap)
        n = 4 * 2**20
        t_first = t + rtt if t == 0 else t + chunk / rate
        t_last = t_first + (n - chunk) / rate
        est.observe_fetch(n, chunk, t_first, t_last)
        t = t_last
    assert est.predict_bps() == pytest.approx(rate, rel=1e-6)
    # the naive sample the old runtime took for the first shard
    assert (4 * 2**20) / (rtt + 4 * 2**20 / rate) < 0.6 * rate


@pytest.mark.parametrize("mbps", [10, 100, 1000])
def test_within_15_percent_after_three_shards(mbps):
    rate = mbps * 1e6 / 8
    est = BandwidthEstimator(prior_bps=20e6 / 8)  # a stale prior from another network
    for _ in range(3):
        est.observe_fetch(200_000, 16384, 1.0, 1.0 + (200_000 - 16384) / rate)
    assert est.robust_bps() == pytest.approx(rate, rel=0.15) or est.predict_bps() == pytest.approx(rate, rel=0.15)
    assert est.predict_bps() == pytest.approx(rate, rel=1e-6)


def test_robust_discount_scores_against_the_prediction_used():
    est = BandwidthEstimator(prior_bps=1000.0, min_sample_bytes=1)
    est.observe(500, 1.0)           # actual 500 vs the prior's 1000: error 1.0
    assert est.predict_bps() == 500 and est.robust_bps() == pytest.approx(250.0)
    est.observe(1000, 2.0)          # actual 500 vs predicted 500: no new error, the old one stays
    assert est.robust_bps() == pytest.approx(250.0)
    est2 = BandwidthEstimator(prior_bps=None, min_sample_bytes=1)
    est2.observe(500, 1.0)          # no prior: nothing to score against
    assert est2.robust_bps() == 500
    est3 = BandwidthEstimator(prior_bps=250.0, min_sample_bytes=1)
    est3.observe(500, 1.0)          # faster than the prior: no stall to guard against, no discount
    assert est3.robust_bps() == 500
    est3.observe(100, 1.0)          # slower than the 500 predicted: error 4 (predicted 500, got 100)
    assert est3.robust_bps() == pytest.approx(est3.predict_bps() / 5.0)


def test_harmonic_mean_and_small_samples_merge():
    est = BandwidthEstimator(min_sample_bytes=1000)
    est.observe(500, 1.0)
    assert est.samples == 0          # merged into the next one
    est.observe(500, 1.0)
    assert est.predict_bps() == pytest.approx(500.0)
    est.observe(3000, 1.0)
    assert est.predict_bps() == pytest.approx(2 / (1 / 500 + 1 / 3000))
    with pytest.raises(ValueError):
        est.observe(-1, 1.0)
    with pytest.raises(ValueError):
        BandwidthEstimator(window=0)


def test_rtt_is_the_minimum_of_recent_samples():
    r = RttEstimator(prior_s=0.1)
    assert r.rtt_s() == 0.1
    r.observe(0.0, 0.045)
    r.observe(1.0, 1.040)   # a clean sample
    r.observe(2.0, 2.300)   # queued behind another transfer
    assert r.rtt_s() == pytest.approx(0.040)
    with pytest.raises(ValueError):
        r.observe(1.0, 0.5)


def test_a_transfer_given_up_is_an_upper_bound_sample():
    """A 1 MB transfer that had not ended after 2 s proves the link slower than 0.5 MB/s: below the
    prediction it is a sample (and an error of the prediction); above it, it says nothing new."""
    est = BandwidthEstimator(prior_bps=5e6)
    est.observe_bound(1_000_000, 2.0)
    assert est.samples == 1 and est.predict_bps() == pytest.approx(5e5)
    assert est.robust_bps() == pytest.approx(5e5 / (1 + (5e6 - 5e5) / 5e5))
    est.observe_bound(10_000_000, 1.0)   # 10 MB/s: no news
    assert est.samples == 1
