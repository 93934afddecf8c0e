"""The CLI: every command has --help, and the demo runs end to end."""

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from sakura.cli import app

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
    from sakura.link import traces_root

    if traces_root() is None:
        pytest.skip("real traces not found (SAKURA_TRACES or ../shared/traces)")
    res = runner.invoke(app, ["demo", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["injected_kv_equals_in_sequence_bit_exact"] is True
    assert summary["raw_stream_equals_oracle"] is True
    assert (tmp_path / "demo.png").stat().st_size > 1000
    assert summary["bytes"]["raw-stream"] > 0 and summary["bytes"]["oracle"] == 0


def test_info_rejects_unknown_model():
    res = runner.invoke(app, ["info", "--model", "nope"])
    assert res.exit_code != 0
    assert "unknown model" in str(res.exception)
