"""The shared driver on the simulated executor: deterministic, so properties are asserted exactly."""

import pytest

from sakura.phone import (BandwidthEstimator, CacheGenPolicy, ConstantLink, FixedPolicy, MeetInMiddlePolicy, Route,
                            RttEstimator, SakuraPolicy, ShardSpec, offline_plan)
from sakura.phone.plan import all_local_s
from sakura.phone.sim import simulate_edit

L = 12
B = 1_000_000  # fp16 bytes of one layer's KV
ROUTES = (Route("r1", B // 8, 0.004, 4e-4), Route("r2", B // 5, 0.005, 1e-4), Route("r3", B // 3, 0.006, 2e-5))


def specs(floor=None):
    return [ShardSpec(ROUTES, compute_s=0.030, local_s=0.020, floor_mse=floor) for _ in range(L)]


def sim(policy, mbps, prior_mbps=None, rtt=0.04, sp=None, workers=2):
    bps = mbps * 1e6 / 8
    return simulate_edit(sp or specs(), policy, link=ConstantLink(bps), rtt_s=rtt,
                         bandwidth=BandwidthEstimator(prior_bps=(prior_mbps or mbps) * 1e6 / 8),
                         rtt=RttEstimator(prior_s=rtt), decode_workers=workers)


@pytest.mark.parametrize("mbps", [1, 10, 50, 100, 300, 1000])
def test_sakura_never_loses_to_local_or_cachegen(mbps):
    local = all_local_s(specs())
    s = sim(SakuraPolicy(), mbps)
    c = sim(CacheGenPolicy(("r3", "r2", "r1"), target_s=L * 0.020), mbps)
    assert s.first_step_s <= min(local, c.first_step_s) * 1.02
    off = offline_plan(specs(), ConstantLink(mbps * 1e6 / 8), 0.04, decode_workers=2)
    assert s.first_step_s <= off.finish_s * 1.10


def test_fast_link_streams_slow_link_computes():
    fast, slow = sim(SakuraPolicy(), 1000), sim(SakuraPolicy(), 1)
    assert fast.local_layers < L // 2 and fast.first_step_s < all_local_s(specs()) * 0.8
    assert slow.local_layers == L and slow.bytes == 0


def test_link_never_idles_between_streamed_shards():
    """Requests go out ahead: once the first byte flowed, the link is busy until the last."""
    res = sim(FixedPolicy("r3"), 100)
    fetched = [r for r in res.records if r.fetch_end == r.fetch_end]
    span = max(r.fetch_end for r in fetched) - min(r.t_first_byte for r in fetched)
    assert res.link_busy_s == pytest.approx(span, rel=1e-9)


def test_overestimated_link_falls_back_to_local_compute():
    """The prior says 1 Gbit/s, the link gives 2 Mbit/s: sakura gives up on late shards."""
    res = sim(SakuraPolicy(), 2, prior_mbps=1000)
    assert res.first_step_s <= all_local_s(specs()) * 1.5
    assert any("late" in e for e in res.events)
    blind = sim(FixedPolicy("r1"), 2, prior_mbps=1000)  # a baseline that waits
    assert res.first_step_s < blind.first_step_s


def test_quality_floor_keeps_low_rungs_out():
    res = sim(SakuraPolicy(), 50, sp=specs(floor=1e-4))
    assert all(r.source in ("local", "r2", "r3") for r in res.records)


def test_meet_in_the_middle_never_stalls_and_uses_both_ends():
    res = sim(MeetInMiddlePolicy(), 100)
    assert res.stall_s == pytest.approx(0.0, abs=1e-9)
    sources = [r.source for r in res.records]
    assert sources[0] == "local" and sources[-1] != "local"
    # computing up and streaming down: once a fetched layer is used, no later layer is local
    first_streamed = next(i for i, s in enumerate(sources) if s != "local")
    assert all(s != "local" for s in sources[first_streamed:])


def test_more_decode_workers_help_when_decode_is_the_bottleneck():
    slow_decode = [ShardSpec((Route("d", B // 8, 0.060, 0.0),), 0.030, 0.050) for _ in range(L)]
    one = sim(SakuraPolicy(), 1000, sp=slow_decode, workers=1)
    four = sim(SakuraPolicy(), 1000, sp=slow_decode, workers=4)
    assert four.first_step_s < one.first_step_s


def test_a_chunk_cachegen_decides_to_compute_after_the_forward_pass_waits_on_it_is_computed():
    """Regression (live hang): the forward pass reached layer 0 before the fetch stage asked
    CacheGen about chunk 0; CacheGen then chose to recompute it. The waiting layer must go local."""
    from sakura.phone.driver import EditDriver

    d = EditDriver(specs(), CacheGenPolicy(("r3", "r2", "r1"), target_s=1e-6), bandwidth=BandwidthEstimator(prior_bps=1e3),
                   rtt=RttEstimator(prior_s=0.04))
    d.start(0.0)
    assert d.at_layer(0, 0.0).kind == "wait"
    reqs, _ = d.next_requests(0.001)   # nothing fits a 1 us target: every chunk is recomputed
    assert reqs == []
    act = d.recheck(0, 0.002)
    assert act is not None and act.kind == "local"


class _DeadThenUp:
    """A link that carries nothing until `up_s`, then `bps` bytes/s."""

    def __init__(self, up_s: float, bps: float):
        self.up_s, self.bps = up_s, bps

    def deliver(self, t_start: float, nbytes: int) -> float:
        return max(t_start, self.up_s) + nbytes / self.bps


def test_a_transfer_started_on_a_dead_link_measures_the_link_once_it_carries_bytes(monkeypatch):
    """The live link meter's window starts at a shard's first chunk (`runtime.live._LinkMeter`): a shard requested
    while the link is dead measures the link from when it came back. The simulator's throughput sample starts at
    the first byte the link delivers (`sim.SAMPLE_FROM_FIRST_BYTE`); it used to start when the transfer could,
    which read a link dead for 10 s and then at 100 Mbit/s as a few Mbit/s."""
    import sakura.phone.sim as simmod

    bps = 100e6 / 8
    link = _DeadThenUp(10.0, bps)

    class Recorder(BandwidthEstimator):
        seen: list

        def observe(self, nbytes: int, seconds: float) -> None:
            self.seen.append(nbytes / seconds)
            super().observe(nbytes, seconds)

    def first_sample() -> float:
        bw = Recorder(prior_bps=bps)
        bw.seen = []
        simulate_edit(specs(), FixedPolicy("r3"), link=link, rtt_s=0.04, bandwidth=bw,
                      rtt=RttEstimator(prior_s=0.04), decode_workers=2)
        return bw.seen[0]

    assert first_sample() == pytest.approx(bps, rel=1e-3)
    monkeypatch.setattr(simmod, "SAMPLE_FROM_FIRST_BYTE", False)
    assert first_sample() < 0.05 * bps


class _OutOfOrder(FixedPolicy):
    """Requests the layers in `order` (then nothing), at rendition r3, waiting for every one: a
    stand-in for a re-plan that moves the split down after higher shards were requested."""

    def __init__(self, order, lower_first):
        super().__init__("r3", name="out-of-order")
        self.order, self.lower_first, self.sent = list(order), lower_first, set()

    def next_fetch(self, d, now):
        for j in self.order:  # these first, once
            if d.records[j].status == "pending" and j not in self.sent:
                self.sent.add(j)
                return j, ROUTES[2]
        for j in range(d.L):  # then whatever is pending, in layer order
            if d.records[j].status == "pending":
                return j, ROUTES[2]
        return None


@pytest.mark.parametrize("lower_first", [False, True])
def test_a_lower_shard_is_not_queued_behind_higher_ones(lower_first):
    """Layers 6-9 requested first, then the rest; a prior 10x the link's rate sends them all ahead
    at once. First in, first out, layer 0 waits behind 6-9; lower first (`driver.LOWER_FIRST`),
    7-9 (queued, not started) are given back when 0 is requested and sent again behind it, so only
    the transfer under way (6) goes before it and the rest follow by layer, with no byte more."""
    res = sim(_OutOfOrder([6, 7, 8, 9], lower_first), 20, prior_mbps=200)
    ends = {r.index: r.fetch_end for r in res.records}
    order = sorted(ends, key=ends.get)
    if lower_first:
        assert order == [6] + [j for j in range(L) if j != 6]
        assert sum("given back" in e for e in res.events) == 3
    else:
        assert order == [6, 7, 8, 9] + [j for j in range(L) if j not in (6, 7, 8, 9)]
    fifo = sim(_OutOfOrder([6, 7, 8, 9], False), 20, prior_mbps=200)
    assert res.bytes == fifo.bytes and res.link_busy_s == pytest.approx(fifo.link_busy_s)  # no idle, no waste
    assert res.first_step_s <= fifo.first_step_s * (1 + 1e-9)


def test_a_request_about_to_start_is_not_given_back():
    """A request whose transfer is due within a round trip stays: a new one could not start sooner,
    and giving it back would only idle the link (same order and latency as first in, first out)."""
    a, b = sim(_OutOfOrder([6, 7, 8, 9], True), 20), sim(_OutOfOrder([6, 7, 8, 9], False), 20)
    assert not any("given back" in e for e in a.events)
    assert [r.fetch_end for r in a.records] == [r.fetch_end for r in b.records]


def test_the_planner_puts_a_new_lower_request_ahead_of_queued_ones():
    """`evaluate` with a queued (not started) request above a new one: the new one goes first, the
    queued one after it (requested again), and its own layer's time moves back accordingly."""
    from sakura.phone.plan import PipelineState, evaluate

    sp = specs()
    link = ConstantLink(B / 3 * 10)  # r3 (B / 3 bytes) takes 0.1 s
    st = PipelineState(now=0.0, link_free=0.0, decode_free=(0.0, 0.0), compute_at=0, compute_free=0.0,
                       queued={5: (ROUTES[2], 0.0)})
    routes = {j: ROUTES[2] for j in range(L) if j != 5}
    res = evaluate(sp, st, 0, routes, link, 0.0)
    order = sorted(res.ready, key=res.ready.get)
    assert order == list(range(L))               # by layer: 5 is served after 0-4, not first
    assert res.nbytes == (L - 1) * ROUTES[2].nbytes  # the queued request's bytes are not new
