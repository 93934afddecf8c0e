"""Tiny run of benchmarks/load.py: starts the real `sakura serve` CLI as a subprocess."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_load_benchmark_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("sakura_load_bench", REPO / "benchmarks" / "load.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.main(["--clients", "1,4", "--templates", "3", "--layers", "2", "--tokens", "16", "--width", "16",
                    "--rounds", "2", "--max-seconds", "10", "--out", str(tmp_path / "r.json")])
    assert [r["clients"] for r in out["results"]] == [1, 4]
    for r in out["results"]:
        assert r["errors"] == 0, r.get("first_error")
        assert r["shards"] == r["clients"] * 2 * 2
        assert r["server_rss_peak_MiB"] > 0 and r["shard_p99_ms"] >= r["shard_p50_ms"]
    assert (tmp_path / "r.json").is_file()
