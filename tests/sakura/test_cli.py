"""The CLI: every command has --help, and the demo runs end to end."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sakura.cli.main import app

runner = CliRunner()


def test_help_lists_commands():
    res = subprocess.run([sys.executable, "-m", "sakura", "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    for cmd in ("demo", "build", "serve", "edit", "bench", "train", "info"):
        assert cmd in res.stdout


@pytest.mark.parametrize("cmd", ["demo", "build", "serve", "edit", "bench", "train", "info"])
def test_every_command_has_help(cmd):
    res = runner.invoke(app, [cmd, "--help"])
    assert res.exit_code == 0, res.output
    assert "Usage" in res.output


def test_demo_end_to_end(tmp_path):
    from sakura.emulation import traces_root

    if traces_root() is None:
        pytest.skip("SAKURA_TRACES names no folder (unset, the bundled traces serve)")
    res = runner.invoke(app, ["demo", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["injected_kv_equals_in_sequence_torch_equal"] is True
    for f in summary["outputs"]:  # every file the demo says it writes (docs/demo.md lists the same)
        p = tmp_path / f.replace("<template>", "sticker-00").rstrip("/")
        assert p.is_dir() if f.endswith("/") else p.stat().st_size > 500, f
    listed = set((Path(__file__).parents[2] / "docs/demo.md").read_text().replace("`", " ").replace("|", " ").split())
    assert {f.replace("<template>", "sticker-00") for f in summary["outputs"]} <= listed, "docs/demo.md lists them"
    # the spread: every run of every live method, and the equal-quality ratio per run
    runs = summary["repeats"]
    assert runs >= 2 and all(len(v) == runs for m, v in summary["live_over_sim_runs"].items() if m != "oracle")
    assert len(summary["equal_quality_ratio_runs"]["cachegen-L3 / sakura"]) == runs
    # the oracle row is its ceiling, never above it
    oracle_row = next(line for line in (tmp_path / "demo.md").read_text().splitlines() if line.startswith("| oracle"))
    assert f"{summary['ceilings']['vs on-device']:.2f} (= ceiling" in oracle_row
    lat = summary["latency_phone_s"]
    # the workload's ceiling holds: nothing beats free, instant KV by more than timing noise
    assert lat["sakura"] >= lat["on-device"] / summary["ceilings"]["vs on-device"] * 0.9
    assert summary["psnr_vs_lossless_db"]["sakura"] > 25


def test_info_rejects_unknown_model():
    res = runner.invoke(app, ["info", "--model", "nope"])
    assert res.exit_code != 0
    assert "unknown model" in str(res.exception)


def test_demo_without_traces_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("SAKURA_TRACES", str(tmp_path / "no-such-folder"))
    res = subprocess.run([sys.executable, "-m", "sakura", "demo", "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "SAKURA_TRACES" in res.stderr, res.stderr
    assert not (tmp_path / "out").exists()
