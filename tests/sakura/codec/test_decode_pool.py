"""The decode pool as measured: `sakura bench decode` writes the worker scaling, `load_scaling`
reads it back for the simulator / profile / dilated demo, and the native decoders release the GIL
(two threads decode a layer each in about the time of one, measured by CPU time, not asserted on
wall time)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from sakura.bench.decode_rates import PoolScaling, load_scaling, run


def test_bench_writes_scaling_and_reference_rates(tmp_path):
    res = run(tmp_path, specs=["progressive", "cachegen:level=2", "lossless"], tokens=[64], workers=(1, 2),
              rounds=1, targets=("host",), log=lambda s: None)
    saved = json.loads((tmp_path / "decode_rates.json").read_text())["targets"]["host"]
    sc = saved["scaling"]["speedup_by_workers"]
    assert set(sc) == {"1", "2"} and sc["1"] == 1.0 and sc["2"] > 0
    assert "lossless" not in saved["scaling"]["per_rendition"]
    from sakura.codec import native as NV

    rows = res["targets"]["host"]["rows"]   # native and numba side by side, each row naming its decoder
    assert {r["implementation"] for r in rows} == ({"native", "numba"} if NV.available() else {"numba"})
    by = {(r["rendition"], r["workers"]): r for r in rows if r["implementation"] == rows[0]["implementation"]}
    assert by[("progressive#0", 1)]["reference_fp16_bytes_per_cpu_s"] > 0
    assert by[("cachegen:level=2", 1)]["reference_fp16_bytes_per_cpu_s"] > 0
    assert by[("lossless", 1)]["reference_fp16_bytes_per_cpu_s"] is None
    md = (tmp_path / "decode_rates.md").read_text()
    assert "reference MB/s" in md and "split, one shard on 2 threads" in md
    # the codecs that split one shard over threads get the split column; lossless cannot split
    assert by[("progressive#0", 1)]["split_speedup"] > 0 and by[("cachegen:level=2", 2)]["split_speedup"] > 0
    assert by[("lossless", 1)]["split_speedup"] is None
    pool = load_scaling(path=tmp_path / "decode_rates.json", target="host")
    assert pool.workers == 2 and pool.speedup == sc["2"] and abs(pool.per_worker - sc["2"] / 2) < 1e-12
    # more workers than measured: no gain beyond the largest measured count is assumed
    big = load_scaling(8, path=tmp_path / "decode_rates.json", target="host")
    assert big.workers == 8 and big.speedup == sc["2"]
    assert load_scaling(1, path=tmp_path / "decode_rates.json", target="host").per_worker == 1.0


def test_missing_rates_assume_no_parallel_gain(tmp_path):
    p = load_scaling(4, path=tmp_path / "none.json")
    assert p == PoolScaling(4, 1.0, p.source) and p.per_worker == 0.25 and "no measured scaling" in p.describe()


def test_native_decode_releases_the_gil():
    """During ONE native decode call (a single call into numba, ~0.1 s), a pure-Python thread keeps
    running: it can only if the call released the GIL (a GIL-holding C call freezes every other
    Python thread until it returns, whatever the machine's load)."""
    import numpy as np

    from sakura.codec import rans as R

    rng = np.random.default_rng(0)
    n = 4_000_000
    model = R.Model.from_counts(rng.integers(0, 100, (1, 64)))
    sc, sl = R.segments_of(np.array([n]))
    sym = rng.integers(0, 64, n).astype(np.int32)
    words, counts = R.encode(sym, sc, sl, model)
    R.decode(words[:0], counts[:0], sc[:0], sl[:0], model)   # compiled already; nothing to do
    ticks: list[float] = []
    started = threading.Event()
    stop = threading.Event()

    def spin():
        started.set()
        while not stop.is_set():
            ticks.append(time.perf_counter())

    th = threading.Thread(target=spin)
    th.start()
    started.wait()
    time.sleep(0.01)
    for _ in range(3):
        t0 = time.perf_counter()
        R.decode(words, counts, sc, sl, model)
        t1 = time.perf_counter()
        inside = sum(t0 < t < t1 for t in ticks)
        if inside:
            break
    stop.set()
    th.join()
    assert inside > 0, f"no Python progress during a {t1 - t0:.3f} s native decode: the GIL was held"


def test_live_pool_splits_a_shard_over_idle_workers_bit_exactly(monkeypatch):
    """The live runtime's decode pool (`runtime.live.DecodePool`): a real progressive decode that
    starts while the other worker is idle shares the shard with it (ranges run on both threads)
    and equals the unsplit decode bit for bit; a job that starts while every worker is busy keeps
    its shard to itself."""
    import torch

    from sakura.codec import ShardId, ShardKV, get_codec
    from sakura.codec import rans as R
    from sakura.phone.live import DecodePool

    g = torch.Generator().manual_seed(3)
    shard = ShardKV((torch.randn(1024, 2, 64, generator=g) * 2).half(), torch.randn(1024, 2, 64, generator=g).half(),
                    layer=0, num_layers=1)
    ident = ShardId("m", "t", 0)
    codec = get_codec("progressive", budgets=[0.3, 1.0, 2.0])
    tables = codec.fit_tables([shard])
    data = codec.encode(shard, ident, tables)
    serial = codec.decode(data, ident, tables)
    ran_on: set[str] = set()
    real = R.run_split

    def spy(pool, fn, n, per_worker=4):
        def rec(lo, hi):
            ran_on.add(threading.current_thread().name)
            return fn(lo, hi)
        return real(pool, rec, n, per_worker)

    monkeypatch.setattr(R, "run_split", spy)
    pool = DecodePool(2)
    release = threading.Event()
    try:
        split = pool.submit(pool.decode, data, ident, tables).result(timeout=120)
        assert pool.split_jobs == 1 and len(ran_on) == 2, ran_on   # both workers ran ranges of the one shard
        assert torch.equal(split.key, serial.key) and torch.equal(split.value, serial.value)
        blocker = pool.submit(release.wait, 60)
        while pool._running < 1:
            time.sleep(0.001)
        busy = pool.submit(pool.share).result(timeout=60)
        release.set()
        blocker.result(timeout=60)
        assert busy is None and pool.split_jobs == 1   # every worker busy: no split
    finally:
        release.set()
        pool.shutdown()


def test_gil_held_share_is_measured_and_the_kernels_restored():
    """`decode_rates.gil_held`: a share in (0, 1) per rendition (every decode has some Python glue
    and spends most of its CPU in the kernels at Klein width), and the numba entry points it timed
    are the original dispatchers again afterwards."""
    import numba

    from sakura.bench.decode_rates import gil_held
    from sakura.codec import kernels, rans

    res = gil_held(["progressive", "cachegen:level=2"], tokens=256, reps=2, log=lambda s: None)
    assert set(res) == {"progressive#0", "progressive#1", "progressive#2", "cachegen:level=2"}
    assert all(0.0 < f < 1.0 for f in res.values()), res
    assert isinstance(rans._decode_pieces, numba.core.registry.CPUDispatcher)
    assert isinstance(kernels.refine, numba.core.registry.CPUDispatcher)


def test_simulator_models_the_live_pool_split_from_the_measured_factor(tmp_path):
    """Shards that arrive one at a time (a slow link) on a 2-worker pool: with the measured split
    x1.5 each decode takes decode_s / 1.5 on the idle pool, so the first step ends earlier; shards
    that all arrive at once leave no worker idle to share: as without a split; one worker:
    unchanged; the split factor is the median of the measured ones."""
    import json

    from sakura.bench.decode_rates import load_split
    from sakura.phone import BandwidthEstimator, ConstantLink, FixedPolicy, Route, RttEstimator, ShardSpec
    from sakura.phone.sim import simulate_edit

    route = Route("r", 100_000, 0.030, 1e-4)
    specs = [ShardSpec((route,), compute_s=0.001, local_s=0.5) for _ in range(4)]

    def run(split, workers=2, bps=2e6):   # 2 MB/s: a shard every 50 ms, decoded in 30 ms
        return simulate_edit(specs, FixedPolicy("r"), link=ConstantLink(bps), rtt_s=0.0,
                             bandwidth=BandwidthEstimator(prior_bps=bps), rtt=RttEstimator(prior_s=0.0),
                             decode_workers=workers, decode_split=split).first_step_s

    assert run(1.5) == pytest.approx(run(1.0) - 0.010, abs=1e-9)   # the last decode: 30 ms -> 20 ms
    assert run(1.5, bps=1e12) == pytest.approx(run(1.0, bps=1e12), abs=0.011)
    assert run(1.5, workers=1) == run(1.0, workers=1)
    rows = [{"codec": "progressive", "workers": 1, "tokens": 1024, "split_speedup": x} for x in (1.2, 1.4, 1.9)]
    (tmp_path / "r.json").write_text(json.dumps({"rows": rows + [{"codec": "lossless", "workers": 1, "tokens": 1024,
                                                                  "split_speedup": None}]}))
    assert load_split(tmp_path / "r.json") == 1.4
    assert load_split(tmp_path / "missing.json") == 1.0
