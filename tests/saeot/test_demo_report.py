"""`saeot demo` end to end on a tiny random model, and the HTML report in headless Chromium."""

import json
import os
import shutil
import subprocess

import pytest
from typer.testing import CliRunner

from saeot.cli import app


@pytest.fixture(scope="module")
def demo_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    r = CliRunner().invoke(app, ["demo", "--out", str(out), "--model", "tiny-random", "--n-tokens", "1536",
                                 "--d-sae", "64", "--steps", "80", "--n-nodes", "6"])
    assert r.exit_code == 0, r.output
    return out


def test_demo_writes_report_and_figures(demo_out):
    fig = json.loads((demo_out / "figures.json").read_text())
    assert fig["layers"] == [0, 2, 4]
    assert set(fig["pairs"]) == {"0->4", "2->4"}
    for pf in fig["pairs"].values():
        assert set(pf) == {"ot", "decoder-cosine", "sae-match", "sae-match-folded", "act-corr", "random_match_jaccard"}
    # OT matches features whose top contexts share tokens far more often than a random match does
    # (this proxy is circular for OT -- see docs -- so it checks the plumbing, not the method)
    for pf in fig["pairs"].values():
        assert pf["ot"]["top_token_jaccard"] > 2 * pf["random_match_jaccard"] + 0.02, pf
    for l, rep in fig["sae"].items():
        assert 0 <= rep["fvu"] < 1.0 and rep["l0"] <= 16
    comp = fig["compression"]
    for r in comp["methods"].values():  # identity grouping reproduces the model
        assert r[0]["logit_diff"] == pytest.approx(comp["clean"]["logit_diff"], abs=1e-4)
    html = (demo_out / "report.html").read_text()
    assert html.count("class='pair'") >= 10 and "<svg" in html and "Circuit compression" in html
    # the report explains itself: the graph's legend, what higher means, and why zeros are zeros
    assert "Legend: one column per layer" in html and "higher = the compressed circuit" in html
    assert ("Why the accuracies are 0" in html) == (comp["clean"]["accuracy"] == 0 or max(
        x["accuracy"] for r in comp["methods"].values() for x in r) == 0)


def _chromium():
    for c in ("/usr/bin/chromium", "/usr/bin/chromium-browser", shutil.which("chromium") or ""):
        if c and os.path.exists(c):
            return c
    return None


@pytest.mark.skipif(_chromium() is None, reason="Debian chromium not installed (apt-get install chromium)")
def test_report_renders_in_headless_chromium(demo_out, tmp_path):
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run",
             f"--user-data-dir={tmp_path / 'profile'}"]
    url = (demo_out / "report.html").as_uri()
    dom = subprocess.run([_chromium(), *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    # the parsed DOM (not just our text) has the pair cards, the graph and the table
    assert dom.stdout.count('class="pair"') >= 10
    assert "<svg" in dom.stdout and "<circle" in dom.stdout and "<table>" in dom.stdout
    shot = tmp_path / "shot.png"
    r = subprocess.run([_chromium(), *flags, f"--screenshot={shot}", "--window-size=1200,900", url],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and shot.exists()
    from PIL import Image
    import numpy as np

    img = np.asarray(Image.open(shot).convert("L"))
    assert img.shape[0] >= 800 and img.std() > 10  # not a blank page


def test_cli_chain_collect_train_match_report(demo_out, tmp_path):
    """The individual commands on the demo's tiny-model cache: match (all methods) and report."""
    run = CliRunner().invoke
    r = run(app, ["collect", "--out", str(tmp_path / "acts"), "--model", "tiny-random", "--n-tokens", "256",
                  "--ctx-len", "32", "--layers", "1,3"])
    assert r.exit_code == 0, r.output
    r = run(app, ["train-sae", "--acts", str(tmp_path / "acts"), "--out", str(tmp_path / "saes"), "--d-sae", "32",
                  "--k", "4", "--steps", "30", "--batch-size", "64"])
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "saes" / "report.json").read_text())
    assert set(rep) == {"1", "3"} and all(v["l0"] <= 4 and (v["k"], v["d_sae"]) == (4, 32) for v in rep.values())
    # held-out FVU also per split (val chooses a recipe, test is reported): val + test = the held-out tokens,
    # and the pooled FVU is at most the worse part's (its total variance is at least the parts' sum)
    assert all(v["n_tokens_val"] + v["n_tokens_test"] == v["n_tokens"] > 0 and
               0 < v["fvu"] <= max(v["fvu_val"], v["fvu_test"]) + 1e-9 for v in rep.values())
    out = tmp_path / "match.json"
    r = run(app, ["match", "--acts", str(demo_out / "acts"), "--saes", str(demo_out / "saes"), "--layer-a", "0",
                  "--layer-b", "4", "--method", "all", "--strategy", "hungarian", "--space", "pca", "--out", str(out)])
    assert r.exit_code == 0, r.output
    m = json.loads(out.read_text())
    assert set(m["methods"]) == {"ot", "decoder-cosine", "sae-match", "sae-match-folded", "sae-match-folded-encdec",
                                 "act-corr", "xact"}
    tg = m["methods"]["ot"]["tgt"]
    assert len(tg) == len(set(tg)) > 0  # Hungarian: one-to-one
    r = run(app, ["report", "--acts", str(demo_out / "acts"), "--saes", str(demo_out / "saes"), "--model",
                  "tiny-random", "--pairs", "2:4", "--out", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "r.html").read_text().count("class='pair'") >= 10


def test_bad_options_fail_fast_with_one_line(tmp_path):
    """A bad option is reported before any data or model is loaded (the folders do not exist)."""
    run = CliRunner().invoke
    missing = str(tmp_path / "nowhere")
    for args, what in ((["match", "--solver", "emd", "--acts", missing], "--solver 'emd'"),
                       (["match", "--strategy", "greedy", "--acts", missing], "--strategy 'greedy'"),
                       (["report", "--pairs", "0-18", "--acts", missing], "--pairs"),
                       (["compress", "--counts", "99", "--n-nodes", "8", "--acts", missing], "--counts"),
                       (["demo", "--task", "poetry", "--out", missing], "--task 'poetry'"),
                       (["match", "--geometry", "zca", "--acts", missing], "--geometry 'zca'"),
                       (["evaluate", "--hubness", "hub", "--acts", missing], "--hubness 'hub'"),
                       (["evaluate", "--k", "0", "--solver", "exact", "--acts", missing], "--k 0"),
                       (["evaluate", "--configs", "scalar,emd", "--acts", missing], "--configs"),
                       (["train-sae", "--stop-after", "-1", "--acts", missing], "--stop-after")):
        r = run(app, args)
        assert r.exit_code == 2, (args, r.output)
        lines = [l for l in r.output.splitlines() if l.strip()]
        assert len(lines) == 1 and what in lines[0] and lines[0].startswith("saeot: error:"), r.output
    assert not (tmp_path / "nowhere").exists()


def test_evaluation_helpers():
    import numpy as np

    from saeot.evaluate import bootstrap_ci, chunk_split, hub_stats
    from saeot.matching import Matching

    ci = bootstrap_ci(np.r_[np.zeros(50), np.ones(50)])
    assert ci["mean"] == 0.5 and 0.38 < ci["lo"] < 0.5 < ci["hi"] < 0.62
    m = Matching(np.arange(6), np.array([3, 3, 3, 3, 1, 2]), np.zeros(6))
    h = hub_stats(m, 100)
    assert h["distinct_targets"] == 3 and h["max_in_degree"] == 4 and h["share_on_top1pct_targets"] == 4 / 6
    s = chunk_split(np.repeat(np.arange(8), 3))
    assert not (s["fit_a"] & s["fit_b"]).any() and not (s["fit"] & s["held"]).any()
    assert ((s["fit_a"] | s["fit_b"]) == s["fit"]).all()


def test_ablating_a_feature_changes_that_feature_most(demo_out):
    """The intervention machinery: ablating feature i at layer l and reading layer l itself must
    change feature i more than any other feature, for most i (reading through hooks, BOS kept)."""
    import numpy as np

    from saeot.collect import load_activations
    from saeot.evaluate import intervention_effects
    from saeot.models import load_model
    from saeot.sae import load_sae

    lm = load_model("tiny-random")
    sae = load_sae(demo_out / "saes" / "layer_2")
    H, tokens, chunk = (load_activations(demo_out / "acts", x) for x in (2, "tokens", "chunk"))
    acts = sae.encode(H)
    fired = np.flatnonzero(np.asarray(acts.getnnz(axis=0)).ravel() > 0)[:8]
    chunks_of = {int(i): sorted(set(chunk[acts[:, i].nonzero()[0]].tolist()))[:2] for i in fired}
    need = sorted({c for v in chunks_of.values() for c in v})
    eff = intervention_effects(lm, sae, sae, 2, 2, fired, chunks_of, {c: tokens[chunk == c] for c in need},
                               {c: H[chunk == c] for c in need})
    assert (np.argmax(eff, 1) == fired).mean() >= 0.75, np.argmax(eff, 1)
    # and a later layer is changed, but less selectively
    sae4 = load_sae(demo_out / "saes" / "layer_4")
    eff4 = intervention_effects(lm, sae, sae4, 2, 4, fired, chunks_of, {c: tokens[chunk == c] for c in need},
                                {c: load_activations(demo_out / "acts", 4)[chunk == c] for c in need})
    assert (eff4.sum(1) > 0).all()


def test_evaluate_command_on_the_demo_cache(demo_out, tmp_path):
    """Two OT variants (a geometry x hubness grid) against the baselines: per-source scores saved for
    both held-out splits, paired intervals with verdicts, a configuration chosen on val."""
    import math

    out = tmp_path / "eval.json"
    r = CliRunner().invoke(app, ["evaluate", "--acts", str(demo_out / "acts"), "--saes", str(demo_out / "saes"),
                                 "--model", "tiny-random", "--pairs", "2:4", "--n-eval", "24", "--n-intervene", "4",
                                 "--k", "16", "--geometry", "scalar,standardise+unit", "--hubness", "none",
                                 "--strategies", "nn,mutual", "--out", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    ev = doc["pairs"]["2->4"]
    assert set(ev["settings"]) == {"shared", "disjoint"}
    assert ev["configs"] == ["ot[scalar,exact,k16,c32,none]", "ot[standardise+unit,exact,k16,c32,none]"]
    assert doc["selection"]["chosen"] in ev["configs"] and doc["selection"]["split"] == "val"
    sh, dj = ev["settings"]["shared"], ev["settings"]["disjoint"]
    assert "act-corr" in sh["scores"] and "act-corr" not in dj["scores"]
    for st in (sh, dj):
        n = len(st["sources"])
        for name, by_s in st["scores"].items():
            for s, by_sp in by_s.items():
                assert set(by_sp) == {"val", "test"}
                for sp, sc in by_sp.items():
                    assert len(sc["judge"]) == n and len(sc["rel_effect"]) == len(st["intervened"][sp])
        nn = st["scores"]["ot[scalar,exact,k16,c32,none]"]["nn"]["test"]["judge"]
        assert sum(not math.isnan(v) for v in nn) > n // 2  # NN matches every alive source
        p = st["paired"]["ot[scalar,exact,k16,c32,none]"]["decoder-cosine"]["nn"]["test"]["judge"]
        assert p["verdict"] in ("win", "tie", "loss") and p["lo"] <= p["mean"] <= p["hi"] and p["n"] > 0
        h = st["hubs"]["decoder-cosine"]["nn"]
        assert h["max_in_degree"] >= h["p99_in_degree"] >= 0
    assert "Paired OT - baseline" in out.with_suffix(".md").read_text()
    r = CliRunner().invoke(app, ["summarize", str(out), "--out", str(tmp_path / "summary.md")])
    assert r.exit_code == 0, r.output
    md = (tmp_path / "summary.md").read_text()
    assert "| 2->4 | distant | MiniLM judge |" in md and "OT - sae-match" in md and "p99" in md
    assert md.count(" win") + md.count(" tie") + md.count(" loss") >= 8


def test_extra_training_acts_exclude_the_judged_chunks(tmp_path):
    """`collect --exclude` skips every chunk already cached; `train-sae --extra-acts` trains on
    fit + extra tokens and refuses an extra cache that holds the evaluation's val/test chunks."""
    from saeot.collect import chunk_token_set, load_activations
    from saeot.evaluate import chunk_split

    run = CliRunner().invoke
    base, extra, leaky = tmp_path / "acts", tmp_path / "extra", tmp_path / "leaky"
    common = ["--model", "tiny-random", "--ctx-len", "32", "--layers", "1"]
    assert run(app, ["collect", "--out", str(base), "--n-tokens", "512", *common]).exit_code == 0
    r = run(app, ["collect", "--out", str(extra), "--n-tokens", "1024", "--exclude", str(base), *common])
    assert r.exit_code == 0, r.output
    assert not chunk_token_set(base) & chunk_token_set(extra)
    assert len(load_activations(extra, "tokens")) == 512  # the corpus prefix is shared: 16 new chunks
    r = run(app, ["train-sae", "--acts", str(base), "--extra-acts", str(extra), "--out", str(tmp_path / "s"),
                  "--d-sae", "32", "--k", "4", "--steps", "20", "--batch-size", "64"])
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "s" / "report.json").read_text())["1"]
    n_fit = int(chunk_split(load_activations(base, "chunk"))["fit"].sum())
    assert rep["train_tokens"] == n_fit + 512 and rep["extra_acts"] == str(extra)
    # a cache with the judged chunks in it (the base collection itself, bigger) is refused, nothing written
    assert run(app, ["collect", "--out", str(leaky), "--n-tokens", "1024", *common]).exit_code == 0
    r = run(app, ["train-sae", "--acts", str(base), "--extra-acts", str(leaky), "--out", str(tmp_path / "s2"),
                  "--d-sae", "32", "--k", "4", "--steps", "20"])
    assert r.exit_code != 0 and "val/test chunks" in r.output
    assert not (tmp_path / "s2" / "report.json").exists()
    r = run(app, ["collect", "--out", str(tmp_path / "none"), "--n-tokens", "512", "--exclude", str(base), *common])
    assert r.exit_code != 0 and "raise --n-tokens" in r.output
    # a second extra cache from the training-only sources; both extras join the fit tokens
    pk = tmp_path / "pk"
    r = run(app, ["collect", "--out", str(pk), "--n-tokens", "256", "--exclude", str(base),
                  "--sources", "stdlib,package-docs", *common])
    assert r.exit_code == 0, r.output
    r = run(app, ["train-sae", "--acts", str(base), "--extra-acts", str(extra), "--extra-acts", str(pk),
                  "--out", str(tmp_path / "s3"), "--d-sae", "32", "--k", "4", "--steps", "5", "--batch-size", "64"])
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "s3" / "report.json").read_text())["1"]
    assert rep["train_tokens"] == n_fit + 512 + 256 and rep["extra_acts"] == [str(extra), str(pk)]
    r = run(app, ["collect", "--out", str(tmp_path / "bad"), "--sources", "shakespeare,wiki", *common])
    assert r.exit_code != 0 and "--sources" in r.output and not (tmp_path / "bad").exists()
