"""Smoke runs, at tiny sizes, of the benchmarks that were scripts in docs/ or argparse modules and
are now `sakura bench` commands: both-models, importance, speed, klein-e2e, build-scale and the
scale model's --replot path (its measuring path: tests/sakura/wire/server/test_scale_smoke.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sakura.cli.main import app

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def invoke(*args: str):
    res = runner.invoke(app, ["bench", *args])
    assert res.exit_code == 0, res.output
    return res


@pytest.mark.slow  # builds a store with 10 renditions and probes each shard's distortion: 1-4 min on 2 busy cores
def test_both_models_one_model_one_template(tmp_path):
    invoke("both-models", "--out", str(tmp_path), "--model", "sakura-mini", "--template", "look-00")
    data = json.loads((tmp_path / "both_models.json").read_text())
    assert list(data) == ["sakura-mini/look-00"]
    rend = data["sakura-mini/look-00"]["renditions"]
    md = (tmp_path / "both_models.md").read_text()
    rows = [ln for ln in md.splitlines() if ln.startswith("| sakura-mini | look-00 |")]
    assert len(rows) == sum(1 for n in rend if not n.endswith("delta=true")) and len(rows) >= 3
    assert "| `lossless` |" in md and rend["lossless"]["image_mse"] == 0.0  # lossless: the edit is exact
    lossy = [r for n, r in rend.items() if n != "lossless"]
    assert all(r["image_mse"] > 0 and r["bits_per_value"] < rend["lossless"]["bits_per_value"] for r in lossy)


def test_importance_one_task(tmp_path):
    out = tmp_path / "imp.txt"
    invoke("importance", "--out", str(out), "--task", "look", "--photos", "1", "--steps", "1")
    rows = [ln for ln in out.read_text().splitlines() if not ln.startswith("#")]
    assert len(rows) == 3 * 2  # (none, attention, sensitivity) x (layered, sakura)
    for ln in rows:
        task, source, spec, rungs = ln.split(" ", 3)
        rungs = json.loads(rungs)
        assert task == "look" and source in ("none", "attention", "sensitivity")
        assert len(rungs) == (3 if spec.startswith("layered") else 1)
        assert [b for b, _ in rungs] == sorted(b for b, _ in rungs) and all(0 < p <= 100 for _, p in rungs)


def test_speed_one_round(tmp_path):
    out = tmp_path / "speed.json"
    invoke("speed", "--model", "sakura-mini", "--rounds", "1", "--steps", "1", "--out", str(out))
    r = json.loads(out.read_text())["models"]["sakura-mini"]
    assert all(r[k] > 0 for k in ("template_s", "injected_s", "extract_s", "nocache_s", "profile_compute_s"))
    assert r["template_kv_bytes_fp16"] == 192 * 1024


def test_klein_e2e_tiny(tmp_path):
    out = tmp_path / "k.json"
    invoke("klein-e2e", "--out", str(out), "--size", "32", "--steps", "2")  # 16 px: one token, no importance
    res = json.loads(out.read_text())
    assert set(res["templates"]) == {"sun", "sun-and-moon"}
    assert res["templates"]["sun-and-moon"]["references"] == 2
    for t in res["templates"].values():
        assert t["rungs"]["lossless"]["bit_exact_with_on_device"]  # streamed lossless KV == on-device, bit for bit
        assert t["ladder_bytes"] < t["whole_bytes"]


@pytest.mark.slow  # a Ray cluster start, warm-up and a build: 5 min at load 13 (test_distributed covers the executor)
def test_build_scale_one_worker_one_template(tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "b.json"
    invoke("build-scale", "--workers", "1", "--rounds", "1", "--templates", "1", "--calibration", "1",
           "--steps", "1", "--out", str(out))
    res = json.loads(out.read_text())
    assert res["same_bytes_in_every_store"] and res["templates"] == ["look-00"]
    assert [r["workers"] for r in res["runs"]] == [1] and res["files_per_store"] > 3


def test_scale_model_replot_recomputes_the_model_from_saved_measurements(tmp_path):
    saved = json.loads((REPO / "docs" / "scale_model.json").read_text())
    src = tmp_path / "m.json"
    src.write_text(json.dumps(saved))
    invoke("scale-model", "--replot", str(src), "--plots", str(tmp_path / "scale"),
           "--build-json", str(REPO / "docs" / "scale_build.json"))
    res = json.loads(src.read_text())
    assert res["encode"] == saved["encode"] and res["edge"] == saved["edge"]  # nothing re-measured
    assert [w["workload"] for w in res["model"]["workloads"]] == [w["workload"] for w in saved["model"]["workloads"]]
    assert all(Path(p).is_file() and Path(p).stat().st_size > 10_000 for p in res["plots"])
    w0 = res["model"]["workloads"][0]
    assert all(math.isfinite(e["edits_per_s_link"]) and e["edits_per_s_link"] > 0 for e in w0["edits"])


def test_bad_task_is_one_line_and_exit_2():
    res = runner.invoke(app, ["bench", "importance", "--task", "nope"])
    assert res.exit_code == 2 and "unknown task 'nope'" in res.output


def test_benchmarks_write_to_out_unless_asked_to_publish(tmp_path, monkeypatch):
    """A bench run never rewrites tracked docs by default: out/bench/...; `--publish` writes docs/."""
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["bench", "workloads", "--no-plots"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "out/bench/workloads.md").is_file() and not (tmp_path / "docs").exists()
    res = runner.invoke(app, ["bench", "--publish", "workloads", "--no-plots"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "docs/workloads.md").is_file()
    res = runner.invoke(app, ["bench", "workloads", "--no-plots"])  # the flag does not stick
    assert res.exit_code == 0 and (tmp_path / "out/bench/workloads.md").stat().st_mtime >= \
        (tmp_path / "docs/workloads.md").stat().st_mtime
