"""Circuit compression on a tiny random Llama: exactness of the reduction and graph bookkeeping."""

import numpy as np
import pytest

from saeot.collect import collect_activations, load_activations
from saeot.compress import (attribution_graph, cluster, faithfulness, make_task, merge_edges, random_groups,
                            run_compression, within_layer_distances)
from saeot.corpus import chunk_corpus
from saeot.models import load_model
from saeot.sae import train_topk_sae


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    lm = load_model("tiny-random:1")
    chunks = chunk_corpus(lm.tokenizer, n_tokens=40 * 32, ctx_len=32)
    d = collect_activations(lm, chunks, tmp_path_factory.mktemp("acts"), layers=[2, 4], batch_size=8, progress=False)
    H = {l: load_activations(d, l) for l in (2, 4)}
    saes = {l: train_topk_sae(H[l], 96, 8, steps=150, batch_size=256, lr=3e-3, progress=False) for l in (2, 4)}
    return lm, saes, H


def test_task_prompts():
    from saeot.compress import addition_prompts, successor_prompts

    p, a = addition_prompts()
    assert len(p) == 55 and all(0 <= x <= 9 for x in a)
    assert p[0].endswith("0+0=") and p[0].count("\n") == 4
    p, a = successor_prompts()
    assert len(p) == 45 and len(set(p)) == 45 and all(1 <= x <= 9 for x in a)
    for q, x in zip(p, a):  # the queried digit is never one of its own examples
        assert q.endswith(f"{x - 1}->") and f"\n{x - 1}->" not in q[:-4] and not q.startswith(f"{x - 1}->")


def test_paired_tests_detect_a_consistent_difference():
    from saeot.compress import paired_tests

    rng = np.random.default_rng(0)
    base = rng.standard_normal(50)
    a = {"per_prompt_logit_diff": (base + 0.5).tolist(), "per_prompt_correct": [1] * 30 + [0] * 20}
    b = {"per_prompt_logit_diff": base.tolist(), "per_prompt_correct": [1] * 15 + [0] * 35}
    t = paired_tests(a, b)
    assert t["p_logit_diff_wilcoxon"] < 1e-6 and t["p_accuracy_mcnemar"] < 1e-3
    assert t["a_only_correct"] == 15 and t["b_only_correct"] == 0
    assert t["logit_diff_paired"]["verdict"] == "win" and t["accuracy_paired"]["verdict"] == "win"
    assert t["logit_diff_paired"]["mean"] == pytest.approx(0.5)
    assert paired_tests(b, a)["logit_diff_paired"]["verdict"] == "loss"
    same = paired_tests(a, a)
    assert same["p_logit_diff_wilcoxon"] == 1.0 and same["p_accuracy_mcnemar"] == 1.0


def test_identity_supernodes_reproduce_the_model_and_merging_changes_it(setup):
    lm, saes, H = setup
    task = make_task(lm.tokenizer)
    assert task.start == 1 and task.ids.shape[0] == 55  # [CLS] is left out of the circuit
    circ = attribution_graph(lm, saes, task, n_nodes=10, progress=False)
    assert set(circ.nodes) == {2, 4} and circ.edges[(2, 4)].shape == (10, 10)
    # nodes are the largest |attribution| and attributions are not all zero
    assert np.abs(circ.scores[2]).max() > 0 and (np.diff(np.abs(circ.scores[4])) <= 1e-12).all()
    clean = faithfulness(lm, saes, task, circ, None)
    ident = faithfulness(lm, saes, task, circ, {l: np.arange(10) for l in (2, 4)})
    assert ident["logit_diff"] == pytest.approx(clean["logit_diff"], abs=1e-4)
    assert ident["accuracy"] == clean["accuracy"]
    one = faithfulness(lm, saes, task, circ, {l: np.zeros(10, dtype=int) for l in (2, 4)})
    assert one["logit_diff"] != pytest.approx(clean["logit_diff"], abs=1e-4)


def test_grouping_helpers(setup):
    lm, saes, H = setup
    rng = np.random.default_rng(0)
    E = rng.standard_normal((6, 5))
    l1, l2 = np.array([0, 0, 1, 2, 2, 1]), np.array([0, 1, 1, 0, 1])
    M = merge_edges(E, l1, l2)
    assert M.shape == (3, 2) and M.sum() == pytest.approx(E.sum())
    assert M[0, 0] == pytest.approx(E[0, 0] + E[1, 0] + E[0, 3] + E[1, 3])
    lab = random_groups(12, 5, seed=3)
    assert sorted(set(lab.tolist())) == list(range(5))
    nodes = np.arange(12)
    D = within_layer_distances(saes[2], H[2], H[2][:50], nodes, "ot", k=8)
    assert D.shape == (12, 12) and np.allclose(np.diag(D)[np.isfinite(np.diag(D))], 0, atol=1e-6)
    lab = cluster(D, 4)
    assert len(set(lab.tolist())) == 4
    C = within_layer_distances(saes[2], H[2], H[2][:50], nodes, "co-activation")
    fin = np.isfinite(np.diag(C))
    assert C.shape == (12, 12) and np.allclose(np.diag(C)[fin], 0, atol=1e-9) and (C[np.ix_(fin, fin)] <= 2 + 1e-9).all()
    with pytest.raises(ValueError, match="n_clusters"):
        cluster(D, 0)


def test_run_compression_end_to_end(setup):
    lm, saes, H = setup
    res = run_compression(lm, saes, H, n_nodes=8, counts=[8, 4, 1], seeds=(0, 1), k=8, progress=False,
                          task="successor")
    assert set(res["methods"]) == {"ot", "decoder-cosine", "co-activation", "random"} and res["n_prompts"] == 45
    for r in res["methods"].values():
        assert r[0]["logit_diff"] == pytest.approx(res["clean"]["logit_diff"], abs=1e-4)  # S = n: exact
        assert len(r[0]["per_prompt_logit_diff"]) == 45
    from saeot.compress import markdown_table

    md = markdown_table(res)
    assert "OT - random" in md and md.count("\n| ") == 1 + len(res["counts"])
    # S = n: identical per-prompt results, so the paired tests find nothing
    for b, tests in res["paired"].items():
        assert tests[0]["p_logit_diff_wilcoxon"] > 0.5 and tests[0]["a_only_correct"] == tests[0]["b_only_correct"] == 0
        assert tests[0]["logit_diff_paired"]["verdict"] == "tie" and tests[0]["logit_diff_paired"]["n"] == 45
    assert res["graphs"]["nodes"] and res["graphs"]["edges"]
