"""`sakura bench faults`' issue-43 probes at small scale, for real on 127.0.0.1: a non-store refused,
a foreign object refused and reported, the load figure with the hash check off and on."""

from __future__ import annotations

import pytest

from sakura.bench.reliability import (INTERRUPTED, floor_error_summary, hash_check_load, reliability_table,
                                      run_reliability)
from sakura.cli.build import INTERRUPTED as CLI_INTERRUPTED

pytestmark = pytest.mark.timeout(600)


def test_the_bench_expects_what_the_build_says():
    assert INTERRUPTED == CLI_INTERRUPTED


def test_non_store_and_foreign_object_probes(tmp_path):
    res = run_reliability(tmp_path, probes=("verify on a non-store", "foreign file under objects/"))
    rows = res["rows"]
    assert len(rows) == 7 and all(r["ok"] for r in rows), rows
    assert all(r["outcome"].startswith("rc 2, 1 line(s): error:") for r in rows[:6])
    assert "GET -> 500" in rows[6]["outcome"] and "verify rc 1" in rows[6]["outcome"]
    assert (tmp_path / "reliability.md").read_text() == reliability_table(res)


def test_hash_check_load_figure_small(tmp_path):
    res = hash_check_load(tmp_path, clients=4, seconds=0.5, rounds=1)
    for mode in ("off", "on"):
        assert res[mode]["rss_peak_mib"] > 10
        for phase in ("cold", "warm"):
            r = res[mode][phase]
            assert r["errors"] == 0 and r["requests"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
    assert 0 < res["per_request_us"] < 1000 and res["hash_MBps"] > 1


def test_floor_error_summary_counts_edits_below_their_floor():
    rows = [{"floor_db": 30.0, "actual_db": 31.0}, {"floor_db": 30.0, "actual_db": 29.0},
            {"floor_db": float("inf"), "actual_db": 50.0}]
    s = floor_error_summary(rows, photos=1, steps=1)
    assert s["edits"] == 2 and s["below_floor"] == 1 and s["max_shortfall_db"] == pytest.approx(1.0)
    assert s["median_margin_db"] == pytest.approx(0.0)
