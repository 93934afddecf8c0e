"""Tiny run of `sakura bench load`: starts the real `sakura serve` CLI as a subprocess."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from sakura.cli.main import app


def test_load_benchmark_smoke(tmp_path):
    res = CliRunner().invoke(app, ["bench", "load", "--clients", "1,4", "--templates", "3", "--layers", "2",
                                   "--tokens", "16", "--width", "16", "--rounds", "2", "--max-seconds", "10",
                                   "--out", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    out = json.loads((tmp_path / "r.json").read_text())
    assert [r["clients"] for r in out["results"]] == [1, 4]
    for r in out["results"]:
        assert r["errors"] == 0, r.get("first_error")
        assert r["shards"] == r["clients"] * 2 * 2
        assert r["server_rss_peak_MiB"] > 0 and r["shard_p99_ms"] >= r["shard_p50_ms"]


def test_load_help_is_the_benchmarks_own():
    res = CliRunner().invoke(app, ["bench", "load", "--help"])
    assert res.exit_code == 0 and "--clients" in res.output and "--server" in res.output
