"""`sakura bench ...`: every benchmark is a subcommand; the workloads report runs in a second."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from sakura.cli.main import app

runner = CliRunner()


@pytest.mark.parametrize("cmd", ["quality", "codec", "e2e", "profile", "load", "decode", "workloads"])
def test_every_benchmark_has_help(cmd):
    res = runner.invoke(app, ["bench", cmd, "--help"])
    assert res.exit_code == 0, res.output
    assert "usage" in res.output.lower()


def test_bench_workloads_writes_the_report(tmp_path):
    res = runner.invoke(app, ["bench", "workloads", "--out", str(tmp_path), "--no-plots"])
    assert res.exit_code == 0, res.output
    md = (tmp_path / "workloads.md").read_text()
    for name in ("klein4b-512", "klein9b-1024", "klein4b-base-1024", "style3x1024-out512"):
        assert f"| {name} |" in md
    assert "ceiling vs on-device" in md and "b=16" in md and "BK-SDM" in md
    assert not (tmp_path / "workloads_ceilings.png").exists()


def test_ceilings_plot_draws(tmp_path):
    from sakura.bench.workloads import plot_ceilings

    plot_ceilings(tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 10_000
