"""Activation collector (tiny random Llama built in code, MiniLM tokenizer) and the TopK SAE."""

import json

import numpy as np
import pytest
import torch

from saeot.collect import collect_activations, load_activations
from saeot.corpus import chunk_corpus
from saeot.models import load_model
from saeot.sae import SAE, load_sae, sae_report, save_sae, train_topk_sae


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny-random")


@pytest.fixture(scope="module")
def chunks(lm):
    return chunk_corpus(lm.tokenizer, n_tokens=6 * 32, ctx_len=32)


def test_chunking_is_deterministic_and_excludes_special_tokens(lm, chunks):
    assert chunks == chunk_corpus(lm.tokenizer, n_tokens=6 * 32, ctx_len=32)
    assert len(chunks) == 6 and all(len(c) == 32 for c in chunks)
    special = set(lm.tokenizer.all_special_ids)
    assert not special & {t for c in chunks for t in c}
    # both sources are present, interleaved
    text = [lm.tokenizer.decode(c) for c in chunks]
    assert any("return" in t or "function" in t or "string" in t for t in text[1::2])


def test_extra_sources_leave_the_default_corpus_alone_and_share_no_text_with_it(lm, chunks):
    from saeot.corpus import EXTRA_SOURCES, _default_source_files, extra_documents

    # the default chunks do not depend on the extra sources existing (cache order and fingerprints stay)
    assert chunks == chunk_corpus(lm.tokenizer, n_tokens=6 * 32, ctx_len=32, sources=("shakespeare", "docstrings"))
    skip_files, skip_dir = _default_source_files()
    assert skip_files and any(p.name == "textwrap.py" for p in skip_files)
    docs = {s: extra_documents(s) for s in EXTRA_SOURCES}
    assert all(len(d) > 0 for d in docs.values())
    extra = chunk_corpus(lm.tokenizer, n_tokens=12 * 32, ctx_len=32, sources=EXTRA_SOURCES)
    assert len(extra) == 12 and all(len(c) == 32 for c in extra)
    assert extra == chunk_corpus(lm.tokenizer, n_tokens=12 * 32, ctx_len=32, sources=EXTRA_SOURCES)
    assert not {tuple(c) for c in extra} & {tuple(c) for c in chunks}
    with pytest.raises(ValueError, match="unknown"):
        extra_documents("wiki")


def test_collector_matches_the_forward_pass_and_resumes(lm, chunks, tmp_path):
    out = collect_activations(lm, chunks, tmp_path / "acts", layers=None, batch_size=4, progress=False)
    man = json.loads((out / "manifest.json").read_text())
    assert man["n_shards"] == 2 and man["layers"] == list(range(lm.n_layers))
    ids = torch.tensor(chunks[4:6])
    with torch.no_grad():
        ref = lm.model(input_ids=ids, output_hidden_states=True)
    for l in range(lm.n_layers):
        H = load_activations(out, l)
        assert H.shape == (6 * 32, lm.d_model)
        if l < lm.n_layers - 1:  # no BOS for this tokenizer: positions line up directly
            np.testing.assert_allclose(H[4 * 32:], ref.hidden_states[l].reshape(-1, lm.d_model).numpy(), atol=1e-5)
    # the last layer is taken before the final norm: the norm of it is the model's last hidden state
    last = torch.from_numpy(load_activations(out, lm.n_layers - 1)[4 * 32:]).reshape(2, 32, -1)
    with torch.no_grad():
        np.testing.assert_allclose(lm.model.model.norm(last).numpy(), ref.hidden_states[-1].numpy(), atol=1e-5)
    np.testing.assert_array_equal(load_activations(out, "tokens"), np.array(chunks).ravel())
    # resume: remove a shard, run again, get identical data; a different collection is refused
    before = load_activations(out, 2)
    (out / "shard_00001.safetensors").unlink()
    collect_activations(lm, chunks, out, layers=None, batch_size=4, progress=False)
    np.testing.assert_array_equal(load_activations(out, 2), before)
    with pytest.raises(ValueError, match="different collection"):
        collect_activations(lm, chunks, out, layers=[0, 1], batch_size=4, progress=False)
    with pytest.raises(ValueError, match="out of range"):
        collect_activations(lm, chunks, tmp_path / "x", layers=[99], progress=False)


def test_collector_stops_the_forward_after_the_deepest_collected_layer(lm, chunks, tmp_path):
    """Later blocks and the unembedding (most of a causal LM's cost) never run; values are unchanged."""
    full = collect_activations(lm, chunks, tmp_path / "full", layers=None, batch_size=4, progress=False)
    ran = []
    hooks = [m.register_forward_hook(lambda *_a, name=name: ran.append(name))
             for name, m in (("lm_head", lm.model.lm_head), ("norm", lm.model.model.norm),
                             ("block2", lm.blocks[2]), ("block0", lm.blocks[0]))]
    try:
        part = collect_activations(lm, chunks, tmp_path / "part", layers=[0, 2], batch_size=4, progress=False)
        # the deepest layer being the last one skips the final norm and the head only
        collect_activations(lm, chunks, tmp_path / "last", layers=[lm.n_layers - 1], batch_size=4, progress=False)
    finally:
        for h in hooks:
            h.remove()
    assert ran.count("block0") == 4 and ran.count("block2") == 2  # 2 shards per collection; block 2 = layer 3
    assert "lm_head" not in ran and "norm" not in ran
    for l in (0, 2):
        np.testing.assert_array_equal(load_activations(part, l), load_activations(full, l))
    np.testing.assert_array_equal(load_activations(tmp_path / "last", lm.n_layers - 1),
                                  load_activations(full, lm.n_layers - 1))


def _sparse_data(n=6000, d=32, F=64, k=3, seed=0):
    rng = np.random.default_rng(seed)
    D = rng.standard_normal((F, d))
    D /= np.linalg.norm(D, axis=1, keepdims=True)
    A = np.zeros((n, F))
    for i in range(n):
        A[i, rng.choice(F, k, replace=False)] = rng.uniform(1, 3, k)
    return (A @ D + 5.0).astype(np.float32) * 40.0  # offset and large scale, like residual streams


def test_topk_sae_learns_sparse_data_and_round_trips_saelens_format(tmp_path):
    X = _sparse_data()
    sae = train_topk_sae(X, d_sae=128, k=4, steps=600, batch_size=256, lr=3e-3, progress=False)
    rep = sae_report(sae, X)
    assert rep["fvu"] < 0.15, rep
    assert rep["l0"] <= 4.0 and 0 <= rep["dead_frac"] < 1
    baseline = sae_report(SAE(sae.W_enc, sae.b_enc, np.zeros_like(sae.W_dec), sae.b_dec, "topk", 4), X)
    assert baseline["fvu"] > 0.9  # the mean alone explains nothing
    path = save_sae(sae, tmp_path / "sae")
    cfg = json.loads((path / "cfg.json").read_text())
    assert cfg["architecture"] == "topk" and cfg["k"] == 4 and cfg["d_in"] == 32 and cfg["d_sae"] == 128
    back = load_sae(path)
    assert (back.encode(X[:100]) != sae.encode(X[:100])).nnz == 0
    # a SAELens "standard" (ReLU) SAE without architecture field loads too (gpt2-small-res-jb style)
    (path / "cfg.json").write_text(json.dumps({"d_in": 32, "d_sae": 128, "hook_name": "blocks.5.hook_resid_pre"}))
    std = load_sae(path)
    assert std.architecture == "standard" and std.encode(X[:10]).shape == (10, 128)
    (path / "cfg.json").write_text(json.dumps({"architecture": "gated", "d_in": 32, "d_sae": 128}))
    with pytest.raises(ValueError, match="unsupported SAE architecture"):
        load_sae(path)


def test_minilm_collection_matches_hidden_states_and_drops_cls(tmp_path):
    """The bundled MiniLM (BERT encoder): [CLS] is fed but not stored; every layer equals HF's own."""
    m = load_model("minilm")
    ch = chunk_corpus(m.tokenizer, n_tokens=2 * 16, ctx_len=16)
    out = collect_activations(m, ch, tmp_path / "mini", batch_size=2, progress=False)
    ids = torch.tensor([[m.tokenizer.cls_token_id] + c for c in ch])
    with torch.no_grad():
        ref = m.model(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True)
    assert m.n_layers == 7 and m.d_model == 384
    for l in range(m.n_layers):
        np.testing.assert_allclose(load_activations(out, l), ref.hidden_states[l][:, 1:].reshape(-1, 384).numpy(),
                                   atol=1e-5)
