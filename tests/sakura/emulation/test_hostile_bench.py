"""Smoke of `sakura bench faults`' hostile part: one hostile server against the real `sakura
edit` subprocess, the slow-header measurement and the fuzz counts, at tiny scale."""

from __future__ import annotations

import pytest

from sakura.bench.faults import hostile_table, run_hostile, run_parser_fuzz, run_slow_headers
from sakura.bench.reliability import reliability_table, run_reliability

pytestmark = pytest.mark.timeout(300)


@pytest.mark.slow  # builds a store and runs a real `sakura edit` subprocess: ~1.5 min on 2 busy cores
def test_hostile_bench_smoke(tmp_path):
    res = run_hostile(tmp_path, cases=("huge template ref",), steps=1, timeout_s=120,
                      slow_headers=0, fuzz_cases=0)
    rows = {r["case"]: r for r in res["rows"]}
    for r in rows.values():
        assert not r["timed_out"] and r["rc"] == 2  # no gallery: a one-line failure, not a hang
        assert r["peak_rss_mib"] is not None and r["peak_rss_mib"] < 1500  # the 1.5 GB ref was never buffered
    assert any("over this model's limits" in ln for ln in rows["huge template ref"]["lines"])
    md = (tmp_path / "hostile.md").read_text()
    assert md == hostile_table(res) and "| huge template ref | failed (exit 2) |" in md


def test_slow_headers_and_fuzz_counts_smoke():
    s = run_slow_headers(30, header_timeout_s=1.0, max_connections=10)
    assert s["held_at_start"] <= 11 and s["held_after_timeout"] == 0 and s["normal_client"] == 200
    f = run_parser_fuzz(100)
    assert f["manifest"]["escapes"] == 0 and f["template_kv"]["escapes"] == 0
    assert f["manifest"]["cases"] == 100 and f["manifest"]["typed_error"] > 50


def test_reliability_probes_smoke(tmp_path):
    """`sakura bench faults`' issue-35 probes at tiny scale: gc racing a rebuild, a short fd-pressure run."""
    res = run_reliability(tmp_path, probes=("gc racing a rebuild", "fd pressure"), fd_duration_s=3.0)
    assert [r["item"] for r in res["rows"]] == ["2", "3", "3"]
    assert all(r["ok"] for r in res["rows"]), res["rows"]
    assert (tmp_path / "reliability.md").read_text() == reliability_table(res)
