"""`sakura store stats|verify` through the real typer app."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from sakura.cli.main import app
from sakura.wire.store import Store
from sakura.wire.store.synthetic import make_synthetic_store


def test_stats_and_verify(tmp_path):
    make_synthetic_store(tmp_path, templates=2, layers=2)
    r = CliRunner().invoke(app, ["store", "stats", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "synthetic-model/tpl-001" in r.output and "whole/fp16" in r.output
    r = CliRunner().invoke(app, ["store", "stats", str(tmp_path), "--json"])
    d = json.loads(r.output)
    assert d["templates"][0]["fp16_bytes"] == 2 * 2 * 64 * 128 * 2
    assert d["templates"][0]["ratio_vs_fp16"] > 1  # the synthetic ladder holds fp16 + more
    t = d["templates"][0]
    assert t["whole_bytes"] == t["total_bytes"] + t["manifest_bytes"] and t["whole_ratio_vs_fp16"] > t["ratio_vs_fp16"]
    r = CliRunner().invoke(app, ["store", "verify", str(tmp_path)])
    assert r.exit_code == 0 and r.output.startswith("OK"), r.output
    m = Store(tmp_path).get_manifest("synthetic-model", "tpl-000")
    (tmp_path / m.shards[0].renditions[1].object.path).write_bytes(b"tampered")
    r = CliRunner().invoke(app, ["store", "verify", str(tmp_path)])
    assert r.exit_code == 1
    assert "PROBLEM" in r.output and "checksum mismatch" in r.output and "FAILED" in r.output
    r = CliRunner().invoke(app, ["store", "verify", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "does not exist" in r.output


def test_build_rejects_bad_names_cleanly(tmp_path):
    r = CliRunner().invoke(app, ["build", str(tmp_path / "s"), "--ladder", "bogus:x=1"])
    assert r.exit_code == 2 and "unknown codec 'bogus'" in r.output
    r = CliRunner().invoke(app, ["build", str(tmp_path / "s"), "--template", "no-such-template"])
    assert r.exit_code == 2 and "no template named" in r.output
    assert not (tmp_path / "s" / "manifests").exists()


def test_build_executor_options_are_checked_before_any_work(tmp_path):
    r = CliRunner().invoke(app, ["build", str(tmp_path), "--executor", "spark"])
    assert r.exit_code == 2 and "local or ray" in r.output
    r = CliRunner().invoke(app, ["build", str(tmp_path), "--address", "127.0.0.1:6379"])  # local + cluster option
    assert r.exit_code == 2 and "--executor ray" in r.output
    assert not (tmp_path / "manifests").exists()
