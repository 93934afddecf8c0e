"""Tiny run of `sakura bench scale-model`: every measurement path (encode, edge CPU, crowd) and the
model + plots, on small sizes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]


def test_scale_model_smoke(tmp_path):
    if shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists():
        pytest.skip("nginx is not installed (Debian: apt-get install nginx-light; .ci/run installs it)")
    import json

    from typer.testing import CliRunner

    from sakura.cli.main import app
    cli = CliRunner().invoke(app, ["bench", "scale-model", "--encode-tokens", "64", "--edge-objects", "8",
                                   "--edge-seconds", "0.5", "--edge-clients", "2", "--crowd-phones", "4",
                                   "--build-json", str(tmp_path / "none.json"), "--out", str(tmp_path / "m.json"),
                                   "--plots", str(tmp_path / "scale")])
    assert cli.exit_code == 0, cli.output
    res = json.loads((tmp_path / "m.json").read_text())
    assert res["crowd"]["errors"] == 0 and res["crowd"]["origin_requests_per_object_max"] == 1
    assert res["edge"]["cold"]["origin_requests"] == 8 and res["edge"]["hot"]["origin_requests"] == 0
    assert 1 <= len(res["encode"]["rung_bits_per_value"]) <= 4  # the progressive ladder: 1-3 rungs per template
    assert res["encode"]["rung_bits_per_value"] == sorted(res["encode"]["rung_bits_per_value"])
    w = res["model"]["workloads"][0]
    assert [e["bytes_per_edit"] for e in w["edits"]] == sorted(e["bytes_per_edit"] for e in w["edits"])
    assert all((tmp_path / Path(p).name).is_file() for p in res["plots"])
