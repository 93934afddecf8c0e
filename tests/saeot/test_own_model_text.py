"""saeot on a model and text that are not bundled: a tiny random Llama saved as a local folder,
text files written here (plain, folder, JSONL), end to end through the CLI: collect, train-sae,
match (from the cache and from exported arrays, by explicit SAE paths), report."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from saeot.cli import app


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    from saeot.models import tiny_random_model

    root = tmp_path_factory.mktemp("own")
    model, tok = tiny_random_model(seed=3, n_layers=3, d_model=48)
    model.save_pretrained(root / "my-model")
    tok.save_pretrained(root / "my-model")
    rng = np.random.default_rng(0)
    words = ["river", "stone", "quietly", "seven", "lantern", "the", "a", "of", "moves", "bright", "under", "and"]
    paras = [" ".join(rng.choice(words, 400)) + "." for _ in range(6)]
    (root / "notes.txt").write_text("\n\n".join(paras))
    (root / "docs.jsonl").write_text("\n".join(json.dumps({"id": i, "body": p}) for i, p in enumerate(paras)))
    return root


def test_collect_train_match_report_on_own_model_and_text(own, tmp_path):
    run = CliRunner().invoke
    acts, saes = tmp_path / "acts", tmp_path / "saes"
    r = run(app, ["collect", "--model", str(own / "my-model"), "--text", str(own / "notes.txt"), "--n-tokens", "768",
                  "--ctx-len", "32", "--layers", "1,3", "--device", "auto", "--out", str(acts)])
    assert r.exit_code == 0, r.output
    man = json.loads((acts / "manifest.json").read_text())
    assert man["text"] == str(own / "notes.txt") and man["layers"] == [1, 3] and man["d_model"] == 48
    assert man["n_chunks"] * man["ctx_len"] == 768
    r = run(app, ["train-sae", "--acts", str(acts), "--out", str(saes), "--d-sae", "32", "--k", "4", "--steps", "40",
                  "--batch-size", "64"])
    assert r.exit_code == 0, r.output
    out = tmp_path / "m.json"
    # layers named by hook: resid_post.0 = residual layer 1, resid_post.2 = residual layer 3
    r = run(app, ["match", "--acts", str(acts), "--saes", str(saes), "--layer-a", "resid_post.0", "--layer-b",
                  "blocks.2.hook_resid_post", "--method", "all", "--candidates", "0", "--out", str(out)])
    assert r.exit_code == 0, r.output
    m = json.loads(out.read_text())
    assert (m["layer_a"], m["layer_b"]) == (1, 3)
    assert m["methods"]["sae-match-folded"]["strategy"] == "hungarian"
    tg = m["methods"]["sae-match-folded"]["tgt"]
    assert len(tg) == len(set(tg)) > 0  # one-to-one, as published
    # the same match from arrays (a user's own activations) and explicit SAE paths: identical pairs
    from saeot.collect import load_activations

    for l, name in ((1, "a"), (3, "b")):
        np.save(tmp_path / f"{name}.npy", load_activations(acts, l))
    np.save(tmp_path / "tok.npy", load_activations(acts, "tokens"))
    out2 = tmp_path / "m2.json"
    r = run(app, ["match", "--sae-a", str(saes / "layer_1"), "--sae-b", str(saes / "layer_3"), "--layer-a", "1",
                  "--layer-b", "3", "--acts-a", str(tmp_path / "a.npy"), "--acts-b", str(tmp_path / "b.npy"),
                  "--tokens", str(tmp_path / "tok.npy"), "--method", "all", "--candidates", "0", "--out", str(out2)])
    assert r.exit_code == 0, r.output
    m2 = json.loads(out2.read_text())
    for meth in m["methods"]:
        assert m2["methods"][meth]["tgt"] == m["methods"][meth]["tgt"], meth
        assert m2["methods"][meth]["top_token_jaccard"] == pytest.approx(m["methods"][meth]["top_token_jaccard"])
    r = run(app, ["report", "--acts", str(acts), "--saes", str(saes), "--model", str(own / "my-model"),
                  "--pairs", "1:3", "--n-pairs", "5", "--out", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    html = (tmp_path / "r.html").read_text()
    assert html.count("class='pair'") >= 5 and "river" in html  # contexts decoded from the user's own text
    assert "higher = the matches fire on the same words" in html and "act-corr and OT share that signal" in html
    assert "<ul class='verdict'><li>1:3: " in html  # one plain sentence per pair about who has the best Jaccard


def test_report_says_when_a_baseline_beats_ot_and_why_zeros():
    from saeot.report import summary_verdict

    rows = [{"pair": "9:18", "method": "ot", "top-token Jaccard": 0.175, "seconds": 120.0},
            {"pair": "9:18", "method": "act-corr", "top-token Jaccard": 0.190, "seconds": 0.6},
            {"pair": "0:4", "method": "ot", "top-token Jaccard": 0.004, "seconds": 1.0},
            {"pair": "0:4", "method": "decoder-cosine", "top-token Jaccard": 0.0, "seconds": 0.1}]
    v = summary_verdict(rows)
    assert v[0] == ("9:18: act-corr has a higher Jaccard than OT (0.190 vs 0.175) at 200x less time "
                    "(it shares OT's co-firing signal).")
    assert v[1].startswith("0:4: every method's Jaccard is below 0.02") and "tiny random model" in v[1]


def test_jsonl_field_and_folder_give_the_same_text(own):
    from saeot.corpus import user_documents

    plain = user_documents(own / "notes.txt")[0]
    from_jsonl = user_documents(own / "docs.jsonl", "body")
    assert "\n\n".join(from_jsonl) == plain and len(from_jsonl) == 6
    folder = own / "folder"
    folder.mkdir(exist_ok=True)
    (folder / "b.txt").write_text("second")
    (folder / "a.md").write_text("first")
    assert user_documents(folder) == ["first", "second"]


@pytest.mark.parametrize("content, args, words", [
    ('{"body": "x"}\nnot json\n', ["--text-field", "body"], "docs.jsonl:2: not a JSON line"),
    ('{"text": "x"}\n', ["--text-field", "body"], "docs.jsonl:1: no field 'body'"),
    ('{"body": 3}\n', ["--text-field", "body"], "field 'body' is int"),
    ("   \n", [], "no text"),
])
def test_bad_text_is_one_line_before_the_model_loads(tmp_path, content, args, words):
    p = tmp_path / "docs.jsonl"
    p.write_text(content)
    r = CliRunner().invoke(app, ["collect", "--model", str(tmp_path / "no-such-model"), "--text", str(p),
                                 "--out", str(tmp_path / "acts"), *args])
    assert r.exit_code == 2 and words in r.output and len(r.output.strip().splitlines()) == 1


def test_device_auto_picks_an_available_device():
    import torch

    from saeot.models import resolve_device

    want = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    assert resolve_device("auto") == want
    with pytest.raises(ValueError, match="--device 'tpu'"):
        resolve_device("tpu")


def test_collect_text_reports_the_tail_it_leaves_out(own, tmp_path):
    """Issue 44: `collect --text` kept 384 of 476 tokens and said nothing; every chunk has the same
    length, so each document's last partial chunk is left out, and now the command says how much."""
    from transformers import AutoTokenizer

    from saeot.corpus import chunk_documents, user_documents

    tok = AutoTokenizer.from_pretrained(own / "my-model")
    docs = user_documents(own / "notes.txt")
    n_text = sum(len(tok(d, add_special_tokens=False)["input_ids"]) for d in docs)
    stats: dict = {}
    chunks = chunk_documents(tok, docs, 10 ** 9, 100, stats=stats)
    assert stats["text_tokens"] == n_text and stats["text_tokens_kept"] == 100 * len(chunks)
    assert 0 < stats["tail_tokens_dropped"] == n_text - 100 * len(chunks)
    r = CliRunner().invoke(app, ["collect", "--model", str(own / "my-model"), "--text", str(own / "notes.txt"),
                                 "--n-tokens", "100000", "--ctx-len", "100", "--layers", "1",
                                 "--out", str(tmp_path / "acts")])
    assert r.exit_code == 0, r.output
    assert (f"kept {stats['text_tokens_kept']:,} of {n_text:,} text tokens: {stats['tail_tokens_dropped']:,} tokens"
            in r.output)
