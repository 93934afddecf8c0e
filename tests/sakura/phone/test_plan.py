"""The pipeline model and planner: pure functions, exact arithmetic, no clock."""

import itertools
import math

import pytest

from sakura.phone.plan import (LOCAL, ConstantLink, PipelineState, Route, ShardSpec, TraceLink, all_local_s,
                                 evaluate, offline_plan, plan_split, psnr_db)

R = (Route("q1", 1000, 0.001, 4e-4), Route("q2", 2000, 0.002, 1e-4), Route("q3", 3000, 0.003, 1e-5))


def specs(n=4, compute=0.01, local=0.02, floor=None):
    return [ShardSpec(R, compute, local, floor) for _ in range(n)]


def test_evaluate_arithmetic_streamed_and_local():
    sp = specs(2)
    st = PipelineState()
    # all streamed at 1e5 B/s, rtt 0.01: shard 0 bytes flow 0.01..0.02, decoded 0.021;
    # shard 1 bytes 0.02..0.03 (issued ahead: no second RTT), decoded 0.031
    res = evaluate(sp, st, 0, {0: R[0], 1: R[0]}, ConstantLink(1e5), 0.01)
    assert res.ready == pytest.approx({0: 0.021, 1: 0.031})
    # compute: stall until 0.021, layer 0 to 0.031, layer 1 ready at 0.031 -> ends 0.041
    assert res.finish_s == pytest.approx(0.041)
    assert res.stall_s == pytest.approx(0.021)
    assert res.nbytes == 2000 and res.image_mse == pytest.approx(8e-4)
    # all local: (0.02 + 0.01) per layer
    assert evaluate(sp, st, 2, {}, ConstantLink(1e5), 0.01).finish_s == pytest.approx(0.06)
    assert all_local_s(sp) == pytest.approx(0.06)


def test_local_after_streamed_layers_pays_the_catch_up():
    sp = specs(3)
    st = PipelineState(compute_at=2, generator_at=0)  # layers 0, 1 came from the link
    # computing layer 2 locally means running the template through layers 0, 1, 2
    assert evaluate(sp, st, 3, {}, ConstantLink(1.0), 0.0).finish_s == pytest.approx(3 * 0.02 + 0.01)


def test_decode_workers_overlap():
    sp = [ShardSpec((Route("slow", 10, 0.1, 0.0),), 0.0, 1.0) for _ in range(4)]
    one = evaluate(sp, PipelineState(decode_free=(0.0,)), 0, {j: sp[j].routes[0] for j in range(4)}, ConstantLink(1e9), 0.0)
    two = evaluate(sp, PipelineState(decode_free=(0.0, 0.0)), 0, {j: sp[j].routes[0] for j in range(4)},
                   ConstantLink(1e9), 0.0)
    assert one.finish_s == pytest.approx(0.4, rel=1e-3) and two.finish_s == pytest.approx(0.2, rel=1e-3)


def test_slow_link_computes_everything_fast_link_streams():
    sp = specs(4)
    slow = plan_split(sp, PipelineState(), ConstantLink(1e3), 0.01)
    assert slow.k == 4 and slow.local_layers == 4
    fast = plan_split(sp, PipelineState(), ConstantLink(1e9), 0.001)
    assert fast.k == 0 and fast.finish_s < slow.finish_s
    # when the link is far faster than needed, quality costs nothing: the best rung, except where
    # its longer decode would delay the very first layer (the one the forward pass waits on)
    assert all(r.name == "q3" for j, r in fast.routes.items() if j > 0)
    assert fast.routes[0].name == "q1"


def test_quality_floor_is_respected_and_local_is_always_allowed():
    sp = specs(3, floor=1e-4)  # q1 (4e-4) is below the floor
    res = plan_split(sp, PipelineState(), ConstantLink(2e5), 0.0)
    assert all(r.image_mse <= 1e-4 for r in res.routes.values())
    nothing = specs(3, floor=1e-9)  # no rendition is good enough: compute
    assert plan_split(nothing, PipelineState(), ConstantLink(1e9), 0.0).k == 3
    with pytest.raises(ValueError, match="quality floor"):
        plan_split(nothing, PipelineState(), ConstantLink(1e9), 0.0, allow_local=False)


@pytest.mark.parametrize("bw", [3e4, 1e5, 3e5, 1e6])
def test_planner_is_within_tolerance_of_brute_force(bw):
    """Exhaustive over every split and every per-shard route (3 routes, 4 shards)."""
    sp = specs(4)
    link = ConstantLink(bw)
    best = math.inf
    for k in range(5):
        for combo in itertools.product(R, repeat=4 - k):
            res = evaluate(sp, PipelineState(), k, dict(zip(range(k, 4), combo)), link, 0.005)
            best = min(best, res.finish_s)
    got = plan_split(sp, PipelineState(), link, 0.005)
    assert got.finish_s <= best * 1.01 + 1e-12


def test_trace_link_matches_constant_rate_on_a_flat_trace():
    from sakura.emulation.traces import Trace
    import numpy as np

    tr = Trace(name="flat", edges=np.array([0.0, 100.0]), rate=np.array([1e5]))
    assert TraceLink(tr, offset_s=3.0).deliver(1.0, 50_000) == pytest.approx(ConstantLink(1e5).deliver(1.0, 50_000))


def test_offline_plan_and_psnr():
    sp = specs(4)
    assert offline_plan(sp, ConstantLink(1e9), 0.0, decode_workers=2).k == 0
    assert psnr_db(0.0) == math.inf and psnr_db(1e-3) == pytest.approx(30.0)
    assert LOCAL == "local"


def test_hedged_evaluation_runs_the_generator_while_waiting_and_charges_no_slack():
    """Layer 2's shard is 0.05 s away with the generator two layers behind: hedged, the generator computes
    template layers 0 and 1 (0.02 s each) meanwhile; only the last 0.01 s, with the generator caught up, is
    a stall (what spends the loss bound's slack)."""
    sp = specs(3)
    st = PipelineState(compute_at=2, generator_at=0, ready={2: 0.05})
    plain = evaluate(sp, st, 2, {}, ConstantLink(1e9), 0.0)
    hedged = evaluate(sp, st, 2, {}, ConstantLink(1e9), 0.0, hedged=True)
    assert plain.stall_s == pytest.approx(0.05) and plain.finish_s == pytest.approx(0.06)
    assert hedged.stall_s == pytest.approx(0.01) and hedged.finish_s == pytest.approx(0.06)
    # 0.03 s away: one template layer, then 0.01 s waited with the generator still behind (it could be one
    # more template layer instead, so it need not spend slack): no stall
    near = evaluate(sp, PipelineState(compute_at=2, generator_at=0, ready={2: 0.03}), 2, {}, ConstantLink(1e9), 0.0,
                    hedged=True)
    assert near.stall_s == 0.0 and near.finish_s == pytest.approx(0.04)
    # with the generator caught up there is nothing to hedge with: the wait is a stall
    caught_up = evaluate(sp, PipelineState(compute_at=2, generator_at=2, ready={2: 0.05}), 2, {}, ConstantLink(1e9),
                         0.0, hedged=True)
    assert caught_up.stall_s == pytest.approx(0.05)


def test_robust_link_keeps_the_plan_that_survives_a_halved_link():
    """Compute-bound at the estimate, so the best-quality rung is free there; at half the estimate it
    is not, and with `robust_link` the planner keeps cheaper rungs (the image floor still holds)."""
    sp = [ShardSpec(R, 0.01, 0.05, 1e-4) for _ in range(6)]
    st = PipelineState()
    rate = 3000 / 0.0105   # q3 (3,000 B) arrives just as fast as the forward pass consumes layers
    free = plan_split(sp, st, ConstantLink(rate), 0.0)
    robust = plan_split(sp, st, ConstantLink(rate), 0.0, robust_link=ConstantLink(rate / 2))
    assert free.nbytes > robust.nbytes
    assert all(r.image_mse <= 1e-4 for r in robust.routes.values())
    half = ConstantLink(rate / 2)
    assert evaluate(sp, st, robust.k, robust.routes, half, 0.0).finish_s < \
        evaluate(sp, st, free.k, free.routes, half, 0.0).finish_s
