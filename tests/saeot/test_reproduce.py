"""`saeot reproduce`: one JSON per step, resumable (a finished step is never rerun), tables
generated from the JSON files alone; on a tiny preset (the real presets run for minutes to hours)."""

import json

import pytest
from typer.testing import CliRunner

from saeot import reproduce as rp
from saeot.cli import app


@pytest.fixture
def tiny_preset(monkeypatch, tmp_path):
    import numpy as np

    words = np.random.default_rng(0).choice(["tide", "ember", "north", "the", "of", "slowly", "nine", "glass"], 4000)
    (tmp_path / "text.txt").write_text(" ".join(words))  # the user-text path (the bundled corpus is slow to tokenise)
    p = rp.Preset("test", 1, (64,), rp.RealRun("tiny-random", 1536, (0, 2), 32, 4, 30, 64, ((0, 2),), 16,
                                                 "tiny random model (test)", text=str(tmp_path / "text.txt")),
                  synthetic=("margin_sweep",))
    monkeypatch.setitem(rp.PRESETS, "test", p)
    return p


def test_reproduce_runs_resumes_and_tables_come_from_json(tiny_preset, tmp_path):
    run = CliRunner().invoke
    out = tmp_path / "rep"
    r = run(app, ["reproduce", "--preset", "test", "--out", str(out), "--docs", str(tmp_path / "results.md")])
    assert r.exit_code == 0, r.output
    steps = rp.steps_of(tiny_preset)
    assert steps == ["margin_sweep", "width", "collect", "train", "train_seed1", "train_jumprelu", "eval_0_2",
                     "eval_0_2_seed1", "eval_0_2_jumprelu", "summary"]
    assert all((out / f"{s}.json").exists() for s in steps)
    md = (out / "results.md").read_text()
    assert md == (tmp_path / "results.md").read_text()
    for heading in ("Planted matches vs margin", "Width: all-pairs exact W2", "tiny random model (test)",
                    "What each method sees", "The tiny model is random", "one Holm family per baseline",
                    "TopK SAEs, seeds pooled: _seed0, _seed1", "JumpReLU SAEs", "same-index decoder cosine"):
        assert heading in md
    w = json.loads((out / "width.json").read_text())
    assert f"| 64 | {w['widths']['64']['pairs_evaluated']:,} |" in md  # a figure read from the JSON
    ev = json.loads((out / "eval_0_2.json").read_text())["pairs"]["0->2"]["settings"]
    assert set(ev) == {"shared", "disjoint"} and "act-corr" not in ev["disjoint"]["summary"]
    assert "sae-match-folded" in ev["shared"]["summary"] and "xact" in ev["disjoint"]["summary"]
    assert "judge_masked" in ev["shared"]["scores"]["xact"]["nn"]["test"]
    # independent seeds: the two TopK sets differ, and no layer shares another's initialisation
    tr0, tr1 = (json.loads((out / f"{s}.json").read_text()) for s in ("train", "train_seed1"))
    assert len({tr0["0"]["seed"], tr0["2"]["seed"], tr1["0"]["seed"], tr1["2"]["seed"]}) == 4
    # JumpReLU: per-feature thresholds, so SAE-Match as published is not decoder cosine there
    from saeot.sae import load_sae

    th = load_sae(out / "saes_jumprelu" / "layer_2").threshold
    assert th is not None and th.std() > 0.05 * th.mean()
    # resume: nothing reruns; a deleted step (only that one) is run again
    r = run(app, ["reproduce", "--preset", "test", "--out", str(out)])
    assert r.exit_code == 0 and r.output.count("done before") == len(steps)
    (out / "width.json").unlink()
    r = run(app, ["reproduce", "--preset", "test", "--out", str(out)])
    assert r.output.count("done before") == len(steps) - 1 and (out / "width.json").exists()
    # tables only: regenerated from the JSON files, same text
    (out / "results.md").unlink()
    r = run(app, ["reproduce", "--preset", "test", "--out", str(out), "--tables-only"])
    assert r.exit_code == 0 and (out / "results.md").exists() and "Not run yet" not in (out / "results.md").read_text()


def test_unknown_preset_or_step_is_one_line(tmp_path):
    r = CliRunner().invoke(app, ["reproduce", "--preset", "huge", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "--preset 'huge'" in r.output
    r = CliRunner().invoke(app, ["reproduce", "--steps", "nope", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "nope" in r.output


def test_interrupted_reproduce_says_so_and_resumes(tiny_preset, tmp_path, monkeypatch):
    """Issue 44: Ctrl-C inside a step used to surface as a missing-file error from the next line;
    now it is one line naming the step, exit status 130, and the finished steps stay done."""
    from saeot import bench

    out = tmp_path / "rep"

    def interrupted_sweep(**_kw):  # a Ctrl-C arriving inside the step's real work
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "margin_sweep", interrupted_sweep)
    r = CliRunner().invoke(app, ["reproduce", "--preset", "test", "--out", str(out), "--steps", "margin_sweep"])
    assert r.exit_code == 130
    lines = [l for l in r.output.splitlines() if l.startswith("saeot:")]
    assert len(lines) == 1 and "interrupted during step margin_sweep" in lines[0] and "resumes" in lines[0]
    assert not (out / "margin_sweep.json").exists()  # nothing half-written


def test_bench_width_without_out_writes_under_runs_not_docs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["bench-width", "--widths", "16", "--k", "4", "--d", "8", "--candidates", "4",
                                 "--recall-sources", "4", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "runs" / "width.json").exists() and not (tmp_path / "docs").exists()
