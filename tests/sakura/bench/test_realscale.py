"""`sakura bench realscale` on the reduced preset (tiny widths, the CPU): every figure the GPU run
reports is produced, the lossless streamed edit is bit-exact, and the GPU script's reduced form runs."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from sakura.bench.realscale import run

ROOT = Path(__file__).resolve().parents[3]
LADDER = ("lossless", "progressive:budgets=[0.5,1.0],allocate=sensitivity")


def test_realscale_tiny_reports_every_figure(tmp_path):
    res = run("tiny", (32,), device="cpu", dtype="auto", ladder=LADDER, calibration=1, steps=2, reps=1,
              progress=False, out=tmp_path / "r.json", log=lambda s: None)
    on_disk = json.loads((tmp_path / "r.json").read_text())
    assert on_disk["sizes"].keys() == res["sizes"].keys() == {"32"}
    r = res["sizes"]["32"]
    assert res["dtype"] == "float32" and res["device"] == "cpu" and res["weights_bytes_loaded"] > 0
    assert {"capture", "sensitivity", "encode", "rendition probes", "quality floor", "write"} <= set(r["build_stage_s"])
    assert set(r["rendition_bytes"]) == {"lossless", *(f"progressive:budgets=[0.5,1.0],allocate=sensitivity#{i}"
                                                       for i in range(2))}
    assert r["rendition_bytes"]["lossless"] >= r["fp16_kv_bytes"]  # lossless: the fp16 KV plus headers
    assert all(d["fp16_mb_per_s"] > 0 for d in r["decode"].values())
    assert r["lossless_streamed_equals_injected"] is True  # the wire's fp16, cast on arrival: bit for bit
    assert r["streamed_path"] == "streamed" and r["streamed_bytes"] >= r["fp16_kv_bytes"]
    assert r["extract_pass_s"] > 0 and r["cached_pass_s"] > 0 and r["streamed_over_passes"] > 0
    assert r["build_peak"]["host_peak_rss_bytes"] > 0


def test_unknown_preset_is_one_line():
    with pytest.raises(ValueError, match="--preset"):
        run("klein-40b", (32,), device="cpu")


def test_real_presets_are_refused_on_the_cpu():
    with pytest.raises(ValueError, match="--preset tiny"):
        run("klein-9b", (1024,), device="cpu")


@pytest.mark.slow
def test_gpu_script_reduced_form_runs_on_cpu(tmp_path):
    env = {**os.environ, "DEVICE": "cpu", "DTYPE": "fp32", "PRESETS": "tiny", "SIZES": "32", "OUT": str(tmp_path),
           "LADDER": ";".join(LADDER), "PYTHON": os.environ.get("PYTHON", "python")}
    p = subprocess.run(["bash", str(ROOT / "scripts/gpu/realscale.sh")], env=env, capture_output=True, text=True,
                       timeout=1200)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    r = json.loads((tmp_path / "realscale_tiny.json").read_text())
    assert r["sizes"]["32"]["lossless_streamed_equals_injected"] is True
    assert (tmp_path / "env.txt").read_text().count("MISSING") <= 1  # at most the optional ray
