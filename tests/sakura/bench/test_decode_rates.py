"""Decode-rate benchmark: real codecs on a small layer (the Klein-sized run is `sakura bench decode`)."""

from __future__ import annotations

import json

import pytest

from sakura.bench.decode_rates import default_specs, gil_verdict, klein_layer, load_rates, rate_for, run


def test_default_specs_cover_every_codec_family_and_the_store_ladder():
    from sakura.codec import available_codecs
    from sakura.cloud.builder.pipeline import DEFAULT_LADDER

    specs = default_specs()
    families = {s.split(":")[0] for s in specs}
    assert {"lossless", "uniform", "cachegen", "progressive"} <= families
    assert set(families) <= set(available_codecs())
    assert all(s in specs for s in DEFAULT_LADDER) and len(specs) == len(set(specs))


def test_klein_layer_shape_and_importance():
    s = klein_layer(64, heads=4, head_dim=16)
    assert s.shape == (64, 4, 16) and str(s.key.dtype) == "torch.float16"
    assert abs(float(s.importance.sum()) - 1.0) < 1e-4 and float(s.importance.max()) > 1.2 / 64  # not flat


def test_run_writes_rows_for_every_rung_and_worker_on_both_targets(tmp_path):
    """Host and phone-class measured in one run (the phone-class side in a child process on the
    x86-64-v2 JIT, 128-bit kernels): every rung x worker count on each, the side-by-side table,
    and the readers pick a target."""
    res = run(tmp_path, specs=["lossless", "cachegen:level=1", "layered:budgets=[1.0,2.0]"], tokens=[32],
              workers=(1, 2), rounds=1, log=lambda s: None)
    assert set(res["targets"]) == {"host", "phone"}
    ph = res["targets"]["phone"]
    assert ph["target"] == "phone" and ph["vector_lanes"] == 8 and ph["jit_cpu"].startswith("x86-64-v2")
    assert res["targets"]["host"]["target"] == "host"
    names = {"lossless", "cachegen:level=1", "layered:budgets=[1.0,2.0]#0", "layered:budgets=[1.0,2.0]#1"}
    for t in ("host", "phone"):
        rows = res["targets"][t]["rows"]
        # native (libsakura_decode) and numba side by side, each on every rung x worker count
        impls = {r["implementation"] for r in rows}
        assert impls == {"native", "numba"}, impls
        assert {r["rendition"] for r in rows} == names and len(rows) == 2 * len(names) * len(impls)
        by = {(r["rendition"], r["workers"]): r for r in rows if r["implementation"] == "numba"}
        # lossless stores fp16 as is (plus a header); the layered rungs grow; every rate is a real measurement
        assert 16.0 <= by[("lossless", 1)]["bits_per_value"] < 17.0
        assert by[("layered:budgets=[1.0,2.0]#0", 1)]["bits_per_value"] < by[("layered:budgets=[1.0,2.0]#1", 1)]["bits_per_value"]
        assert all(r["fp16_bytes_per_s"] > 0 and r["fp16_bytes_per_s_median"] <= r["fp16_bytes_per_s"] for r in rows)
        assert all(by[(n, 1)]["speedup_vs_1_worker"] == 1.0 and by[(n, 1)]["fp16_bytes_per_cpu_s"] > 0 for n in names)
        assert all(0.0 <= r["gil_free_fraction"] <= 1.0 for r in rows)
    # the same bytes on both targets (one encoder): the same bits/value
    assert ({(r["rendition"], r["bits_per_value"]) for r in res["targets"]["host"]["rows"]}
            == {(r["rendition"], r["bits_per_value"]) for r in ph["rows"]})
    saved = json.loads((tmp_path / "decode_rates.json").read_text())
    assert saved["targets"]["phone"]["rows"] == ph["rows"]
    md = (tmp_path / "decode_rates.md").read_text()
    assert "## Side by side" in md and "phone-class MB/s per core" in md and "phone-class / host" in md
    assert "`layered:budgets=[1.0,2.0]#1`" in md and "per core MB/s" in md and "x86-64-v2" in md
    host, phone = (load_rates(tmp_path / "decode_rates.json", target=t) for t in ("host", "phone"))
    # the readers take the native library's rows (what the phone path decodes with), never a mix
    hby = {(r["rendition"], r["workers"]): r for r in res["targets"]["host"]["rows"] if r["implementation"] == "native"}
    pby = {(r["rendition"], r["workers"]): r for r in ph["rows"] if r["implementation"] == "native"}
    assert rate_for(host, "lossless", 4096, 2) == hby[("lossless", 2)]["fp16_bytes_per_s"]
    assert rate_for(phone, "lossless", 4096, 2) == pby[("lossless", 2)]["fp16_bytes_per_s"]
    with pytest.raises(KeyError):
        rate_for(phone, "uniform:bits=3", 32)


def test_readers_take_the_shipped_calibration_and_name_the_target(tmp_path, monkeypatch):
    """Without a path the readers use the package's shipped file (package data), $SAKURA_DECODE_RATES
    overrides it, a file of one target is that target, and a missing target is a KeyError naming
    the file."""
    from sakura.bench.decode_rates import RATES_ENV, describe_rates, load_target, rates_file

    monkeypatch.delenv(RATES_ENV, raising=False)
    shipped = rates_file()
    assert shipped.is_file() and shipped.name == "decode_rates.json" and "docs" not in str(shipped).split("/")
    assert {load_target(target=t)["target"] for t in ("host", "phone")} == {"host", "phone"}
    assert "phone-class" in describe_rates() and "sakura/assets/decode_rates.json" in describe_rates()
    row = {"rendition": "progressive#0", "tokens": 1024, "workers": 1, "fp16_bytes_per_cpu_s": 5e8, "fp16_bytes_per_s": 1.0}
    (tmp_path / "one.json").write_text(json.dumps({"rows": [row]}))
    (tmp_path / "two.json").write_text(json.dumps({"targets": {"host": {"rows": [row]}}}))
    monkeypatch.setenv(RATES_ENV, str(tmp_path / "one.json"))
    assert load_target(target="phone")["target"] == "host"   # an old one-target file says what it is
    with pytest.raises(KeyError, match="no phone decode rates in .*two.json"):
        load_target(tmp_path / "two.json", "phone")
    with pytest.raises(ValueError, match="decode target"):
        load_target(tmp_path / "two.json", "tablet")


def test_gil_verdict_thresholds():
    assert [gil_verdict(x) for x in (0.0, 0.2, 0.4, 0.6, 1.0)] == ["holds", "holds", "partly", "releases", "releases"]


def test_interleaved_speedup_tells_a_gil_holding_decode_from_a_releasing_one():
    """The x2 measure itself: a pure-Python loop (holds the GIL) gains nothing from a second worker,
    a decode that waits outside the GIL (sleep) doubles."""
    import statistics
    import time
    from concurrent.futures import ThreadPoolExecutor

    from sakura.bench.decode_rates import _interleaved_rounds

    def holds():  # a fixed amount of bytecode work (~30-60 ms)
        n = 0
        for i in range(600_000):
            n += i

    def releases():  # long enough that a loaded machine's thread wake-up jitter (ms) stays small beside it
        time.sleep(0.15)

    pools = {1: ThreadPoolExecutor(1), 2: ThreadPoolExecutor(2)}
    try:
        x2 = {}
        for name, fn in (("holds", holds), ("releases", releases)):
            t = _interleaved_rounds(fn, (1, 2), 7, pools)
            x2[name] = statistics.median((2 / a) / (1 / b) for a, b in zip(t[2][0], t[1][0]))
    finally:
        for p in pools.values():
            p.shutdown()
    assert x2["holds"] < 1.35 and x2["releases"] > 1.6, x2


def test_the_profile_reads_per_core_rates_from_the_rates_file(tmp_path):
    """The one place benchmarks read decode rates: per-core rows of decode_rates.json."""
    import json

    from sakura.bench.profile import decode_rates

    rows = [{"rendition": "progressive", "tokens": t, "workers": w, "fp16_bytes_per_cpu_s": 1e8 * w + t,
             "fp16_bytes_per_s": 1.0} for t in (1024, 4096) for w in (1, 2)]
    rows.append({"rendition": "cachegen:level=2", "tokens": 1024, "workers": 1, "fp16_bytes_per_cpu_s": 7e7,
                 "fp16_bytes_per_s": 1.0})
    (tmp_path / "r.json").write_text(json.dumps({"rows": rows}))
    got = decode_rates(["progressive#1", "cachegen:level=2,delta=true"], tmp_path / "r.json", tokens=3000)
    (tmp_path / "t.json").write_text(json.dumps({"targets": {"host": {"rows": rows[:1]}, "phone": {"rows": rows[1:]}}}))
    assert decode_rates(["progressive#1", "cachegen:level=2,delta=true"], tmp_path / "t.json", tokens=3000,
                        target="phone") == got
    assert got == {"progressive#1": 1e8 + 4096, "cachegen:level=2,delta=true": 7e7}
    with pytest.raises(KeyError, match="sakura bench decode"):
        decode_rates(["uniform:bits=4"], tmp_path / "r.json")


def test_a_calibrated_rung_takes_the_measured_row_nearest_its_bits_per_value(tmp_path):
    """A store's rung named like the bench ladder's (`progressive#0`) but at 10x its bits/value
    decodes at that bits/value's rate, not at the cheap bench rung's."""
    import json

    from sakura.bench.profile import decode_rates

    def row(name, bpv, rate):
        return {"rendition": name, "tokens": 1024, "workers": 1, "bits_per_value": bpv,
                "fp16_bytes_per_cpu_s": rate, "fp16_bytes_per_s": 1.0}
    rows = [row("progressive#0", 0.22, 9e8), row("progressive#1", 0.8, 4e8),
            row("progressive:budgets=[1.2]#0", 1.18, 5e8), row("progressive:budgets=[2.0]#0", 2.04, 3.5e8),
            row("cachegen:level=3", 2.1, 6e8)]
    (tmp_path / "r.json").write_text(json.dumps({"rows": rows}))
    names = ["progressive#0", "progressive:budgets=[1.2]#0", "progressive#1", "cachegen:level=3"]
    by_name = decode_rates(names, tmp_path / "r.json")
    assert by_name["progressive#0"] == 9e8
    by_bpv = decode_rates(names, tmp_path / "r.json",
                          bits_per_value={"progressive#0": 2.25, "progressive:budgets=[1.2]#0": 1.46,
                                          "progressive#1": 0.9, "cachegen:level=3": 2.77})
    assert by_bpv == {"progressive#0": 3.5e8, "progressive:budgets=[1.2]#0": 5e8, "progressive#1": 4e8,
                      "cachegen:level=3": 6e8}


def test_rate_ladder_takes_one_targets_rates_and_says_which(tmp_path):
    """The same measured ladder simulated with either target's per-core rates (nearest bits/value
    per rung, as `decode_rates`): bytes and qualities stay, the rates and the label change."""
    from sakura.bench.profile import rate_ladder

    def row(name, bpv, rate):
        return {"rendition": name, "tokens": 1024, "workers": 1, "bits_per_value": bpv,
                "fp16_bytes_per_cpu_s": rate, "fp16_bytes_per_s": 1.0}
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"date": "d", "machine": {"cpu": "c"}, "targets": {
        "host": {"jit_cpu": "znver5", "rows": [row("progressive#0", 0.2, 9e8), row("cachegen:level=3", 2.1, 7e8)]},
        "phone": {"jit_cpu": "x86-64-v2", "rows": [row("progressive#0", 0.2, 5e8), row("cachegen:level=3", 2.1, 6e8)]}}}))
    ladder = {"renditions": {"progressive#0": {"bits_per_value": 0.3, "image_mse": 1e-4, "decode_fp16_bytes_per_cpu_s": 1.0},
                             "cachegen:level=3": {"bits_per_value": 2.6, "image_mse": 2e-4}}}
    host, phone = (rate_ladder(ladder, t, path=f) for t in ("host", "phone"))
    assert [r["decode_fp16_bytes_per_cpu_s"] for r in host["renditions"].values()] == [9e8, 7e8]
    assert [r["decode_fp16_bytes_per_cpu_s"] for r in phone["renditions"].values()] == [5e8, 6e8]
    assert phone["decode_target"] == "phone" and "phone-class" in phone["decode_rates"] and "x86-64-v2" in phone["decode_rates"]
    assert phone["renditions"]["progressive#0"]["image_mse"] == 1e-4 and ladder["renditions"]["progressive#0"][
        "decode_fp16_bytes_per_cpu_s"] == 1.0   # the given ladder is not changed
