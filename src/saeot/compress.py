r"""Circuit compression on single-digit addition: attribution graph over SAE features -> supernodes.

Task: 4-shot prompts ``"3+5=8\n...\n{a}+{b}="`` for every a, b in 0..9 with a + b <= 9; the metric
is the logit difference ``logit(answer) - mean(logit(other digits))`` at the last position.

1. **Attribution graph** (gradient x activation).  SAE features at the chosen residual layers,
   summed over positions and prompts.  Node score of feature i at layer l:
   :math:`\sum_{b,t} a_i(b,t)\, d_i \cdot \partial m / \partial h_l(b,t)` (exact decomposition of
   the residual into features + SAE error, so no splicing is needed).  Edge i (layer l1) -> j
   (layer l2 > l1): :math:`\sum_{b,t} a_i(b,t)\, d_i \cdot \partial P_j / \partial h_{l1}(b,t)`
   with :math:`P_j = \sum_{b,t} 1[a_j > 0]\,(h_{l2} - b_{dec}) \cdot W_{enc}[:, j]`.  The circuit
   is the ``n_nodes`` features with largest :math:`|score|` per layer.
2. **Supernodes**: per layer, average-linkage agglomerative clustering of the circuit's features
   by a distance (ours: W2 between their activation-weighted distributions over corpus + task
   tokens in the reference space; baselines: decoder cosine; random groups of equal count).
   Edge weights of a supernode pair are the sums of their members' edges.
3. **Faithfulness**: run the model with each layer's circuit reduced to its supernodes: the
   members' contributions :math:`\sum_{i \in S} a_i d_i` are replaced by one supernode with
   activation :math:`\sum_{i \in S} a_i` along the members' mean-activation-weighted average
   direction.  Everything else (other features, SAE error) is untouched, so with one supernode
   per feature the model is exactly the original.  Reported: accuracy (argmax over the vocabulary
   is the answer digit) and mean logit difference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from saeot.distributions import feature_distributions
from saeot.geometry import DEFAULT_GEOMETRY
from saeot.space import reference_embeddings
from saeot.stats import paired_bootstrap
from saeot.wasserstein import measures, pairwise_w2

FEWSHOT = ((3, 5), (2, 4), (7, 1), (0, 6))


TASKS = ("addition", "successor")


def successor_prompts() -> tuple[list[str], list[int]]:
    """Next digit, 4-shot: ``"3->4\n7->8\n1->2\n5->6\n{a}->"`` for a in 0..8, with five different
    example sets (45 prompts); the answer is a + 1."""
    prompts, answers = [], []
    rng = np.random.default_rng(0)
    for v in range(5):
        for a in range(9):
            shots = [int(x) for x in rng.choice([d for d in range(9) if d != a], 4, replace=False)]
            head = "".join(f"{x}->{x + 1}\n" for x in shots)
            prompts.append(f"{head}{a}->")
            answers.append(a + 1)
    return prompts, answers


def task_prompts(task: str = "addition") -> tuple[list[str], list[int]]:
    if task == "addition":
        return addition_prompts()
    if task == "successor":
        return successor_prompts()
    raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")


def addition_prompts(shots=FEWSHOT) -> tuple[list[str], list[int]]:
    """All single-digit problems a + b <= 9 (55), 4-shot; returns (prompts, answers)."""
    head = "".join(f"{a}+{b}={a + b}\n" for a, b in shots)
    prompts, answers = [], []
    for a in range(10):
        for b in range(10 - a):
            prompts.append(f"{head}{a}+{b}=")
            answers.append(a + b)
    return prompts, answers


@dataclass
class Task:
    ids: "object"  # (B, T) torch.long
    answer_ids: np.ndarray  # (B,) token id of the answer digit
    digit_ids: np.ndarray  # (10,) token ids of "0".."9"
    start: int = 0  # first position that belongs to the prompt text (1 when a BOS is prepended)

    def position_mask(self):
        """(B, T, 1) float: 1 at prompt positions, 0 at the BOS (an attention sink with huge norm,
        whose features are left out of the circuit and untouched by the reduction)."""
        import torch  # lazy: torch (seconds) keeps --help fast

        m = torch.ones(self.ids.shape + (1,))
        m[:, :self.start] = 0.0
        return m


def make_task(tokenizer, task: str = "addition") -> Task:
    import torch  # lazy: torch (seconds) keeps --help fast

    prompts, answers = task_prompts(task)
    enc = [tokenizer(p)["input_ids"] for p in prompts]
    if len({len(e) for e in enc}) != 1:
        raise ValueError(f"{task} prompts tokenise to different lengths; this tokenizer is unsupported")
    digit_ids = []
    for d in range(10):
        t = tokenizer(str(d), add_special_tokens=False)["input_ids"]
        if len(t) != 1:
            raise ValueError(f"digit {d} is not a single token for this tokenizer")
        digit_ids.append(t[0])
    digit_ids = np.array(digit_ids)
    bos = getattr(tokenizer, "bos_token_id", None)
    cls = getattr(tokenizer, "cls_token_id", None)
    start = 1 if enc[0][0] in {t for t in (bos, cls) if t is not None} else 0
    return Task(torch.tensor(enc), digit_ids[np.array(answers)], digit_ids, start)


def _block_for(lm, layer: int):
    if layer < 1:
        raise ValueError("circuit layers must be >= 1 (block outputs)")
    return lm.blocks[layer - 1]


def _out_tensor(out):
    return out[0] if isinstance(out, tuple) else out


def _replace_out(out, h):
    return (h,) + tuple(out[1:]) if isinstance(out, tuple) else h


def _last_logits(lm, task: Task):
    """(B, V) logits at the last position; asks the model for the last position only (the LM head
    over a 262k vocabulary at every position would dominate the cost)."""
    import torch  # lazy: torch (seconds) keeps --help fast

    mask = torch.ones_like(task.ids)
    try:
        out = lm.model(input_ids=task.ids, attention_mask=mask, logits_to_keep=1)
    except TypeError:  # models without logits_to_keep
        out = lm.model(input_ids=task.ids, attention_mask=mask)
    return out.logits[:, -1, :]


def logit_metric(logits, task: Task):
    """(B, V) last-position logits -> (B,) logit(answer) - mean logit(other digits)."""
    import torch  # lazy: torch (seconds) keeps --help fast

    ans = torch.as_tensor(task.answer_ids)
    dig = logits[:, torch.as_tensor(task.digit_ids)]  # (B, 10)
    la = logits[torch.arange(len(ans)), ans]
    return la - (dig.sum(1) - la) / 9.0


@dataclass
class Circuit:
    layers: list[int]
    nodes: dict[int, np.ndarray]  # layer -> (n,) feature ids
    scores: dict[int, np.ndarray]  # layer -> (n,) attribution (summed over prompts and positions)
    mean_act: dict[int, np.ndarray]  # layer -> (n,) mean activation over task tokens
    edges: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)  # (l1, l2) -> (n1, n2)
    task_hidden: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> (B*T, d) states


def attribution_graph(lm, saes: dict, task: Task, n_nodes: int = 24, progress: bool = True) -> Circuit:
    """Build the attribution graph (see module docstring) over ``saes`` = {layer: SAE}."""
    import torch  # lazy: torch (seconds) keeps --help fast
    from tqdm.auto import tqdm  # lazy: tqdm.auto (0.3 s) keeps --help fast

    layers = sorted(saes)
    store: dict[int, torch.Tensor] = {}

    def make_hook(l):
        def hook(_m, _i, out):
            store[l] = _out_tensor(out)  # kept in the autograd graph (parameters require grad)
        return hook

    hs = [_block_for(lm, l).register_forward_hook(make_hook(l)) for l in layers]
    try:
        logits = _last_logits(lm, task)
    finally:
        for h in hs:
            h.remove()
    m = logit_metric(logits, task).sum()
    grads = torch.autograd.grad(m, [store[l] for l in layers], retain_graph=True)
    circuit = Circuit(layers, {}, {}, {})
    acts_full = {}
    for l, g in zip(layers, grads):
        sae = saes[l]
        h = store[l].detach()  # (B, T, d)
        B, T, d = h.shape
        a = torch.from_numpy(sae.encode(h.reshape(-1, d).numpy()).toarray())  # (B*T, F)
        a = a * task.position_mask().reshape(-1, 1)  # BOS features are not circuit nodes
        Wd = torch.from_numpy(sae.W_dec)  # (F, d)
        score = (a * (g.reshape(-1, d) @ Wd.T)).sum(0).numpy()  # (F,)
        top = np.argsort(-np.abs(score), kind="stable")[:n_nodes]
        circuit.nodes[l] = top
        circuit.scores[l] = score[top]
        circuit.mean_act[l] = a[:, top].mean(0).numpy()
        circuit.task_hidden[l] = h.reshape(-1, d).numpy()
        acts_full[l] = a
    # edges between consecutive circuit layers: one backward pass per downstream node
    for l1, l2 in zip(layers[:-1], layers[1:]):
        n1, n2 = len(circuit.nodes[l1]), len(circuit.nodes[l2])
        E = np.zeros((n1, n2))
        sae2 = saes[l2]
        D1 = torch.from_numpy(saes[l1].W_dec[circuit.nodes[l1]])  # (n1, d)
        A1 = acts_full[l1][:, circuit.nodes[l1]]  # (B*T, n1)
        h2 = store[l2]  # (B, T, d), depends on store[l1]
        for jj, j in enumerate(tqdm(circuit.nodes[l2], disable=not progress, desc=f"edges {l1}->{l2}")):
            pre = sae2.pre_activations(h2.reshape(-1, h2.shape[-1]), [j])[:, 0].reshape(h2.shape[:2])  # (B, T)
            active = (acts_full[l2][:, j] > 0).reshape(pre.shape).float()
            (g1,) = torch.autograd.grad((pre * active).sum(), [store[l1]], retain_graph=True)
            E[:, jj] = (A1 * (g1.reshape(-1, g1.shape[-1]) @ D1.T)).sum(0).numpy()
        circuit.edges[(l1, l2)] = E
    return circuit


def cluster(D: np.ndarray, n_clusters: int) -> np.ndarray:
    """Average-linkage agglomerative clustering of a (n, n) distance matrix into ``n_clusters``
    groups; returns (n,) labels 0..n_clusters-1.  Non-finite distances count as the max finite x 2."""
    from scipy.cluster.hierarchy import fcluster, linkage  # lazy: scipy (0.3-3 s) keeps --help fast
    from scipy.spatial.distance import squareform  # lazy: scipy (0.3-3 s) keeps --help fast

    n = D.shape[0]
    if not 1 <= n_clusters <= n:
        raise ValueError(f"n_clusters must be in 1..{n}, got {n_clusters}")
    if n_clusters == n:
        return np.arange(n)
    D = np.array(D, dtype=np.float64)
    fin = np.isfinite(D)
    D[~fin] = (D[fin].max() if fin.any() else 1.0) * 2 + 1
    D = 0.5 * (D + D.T)
    np.fill_diagonal(D, 0.0)
    Zl = linkage(squareform(D, checks=False), method="average")
    lab = fcluster(Zl, n_clusters, criterion="maxclust") - 1
    return lab


def random_groups(n: int, n_clusters: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    lab = np.concatenate([np.arange(n_clusters), rng.integers(0, n_clusters, n - n_clusters)])
    return rng.permutation(lab)


def merge_edges(E: np.ndarray, lab1: np.ndarray, lab2: np.ndarray) -> np.ndarray:
    """Supernode edge weights: (S1, S2) sums of member edges."""
    S1, S2 = lab1.max() + 1, lab2.max() + 1
    out = np.zeros((S1, S2))
    np.add.at(out, (lab1[:, None].repeat(len(lab2), 1), lab2[None, :].repeat(len(lab1), 0)), E)
    return out


def faithfulness(lm, saes: dict, task: Task, circuit: Circuit, labels: dict[int, np.ndarray] | None) -> dict:
    """Accuracy and mean logit difference with each layer's circuit reduced to supernodes.

    ``labels`` = {layer: (n_nodes,) supernode id}; None = the unmodified model.
    """
    import torch  # lazy: torch (seconds) keeps --help fast

    hooks = []
    if labels is not None:
        for l in circuit.layers:
            sae = saes[l]
            nodes = circuit.nodes[l]
            lab = labels[l]
            S = int(lab.max()) + 1
            Wd = torch.from_numpy(sae.W_dec[nodes])  # (n, d)
            w = torch.from_numpy(np.maximum(circuit.mean_act[l], 1e-8))  # (n,)
            onehot = torch.zeros(len(nodes), S, dtype=torch.float32)
            onehot[torch.arange(len(nodes)), torch.from_numpy(lab)] = 1.0
            dirs = (onehot * w[:, None]).T @ Wd / (onehot * w[:, None]).sum(0)[:, None]  # (S, d)

            def hook(_m, _i, out, nodes=nodes, Wd=Wd, onehot=onehot, dirs=dirs, sae=sae, pm=task.position_mask()):
                h = _out_tensor(out)  # (B, T, d)
                a = sae.encode_torch(h)[..., nodes]  # as the SAE's config encodes (b_dec, normalisation)
                h2 = h + pm * (-(a @ Wd) + (a @ onehot) @ dirs)
                return _replace_out(out, h2)

            hooks.append(_block_for(lm, l).register_forward_hook(hook))
    try:
        with torch.no_grad():
            logits = _last_logits(lm, task)
    finally:
        for h in hooks:
            h.remove()
    pred = logits.argmax(-1).numpy()
    ld = logit_metric(logits, task).numpy()
    correct = pred == task.answer_ids
    return {"accuracy": float(correct.mean()), "logit_diff": float(ld.mean()),
            "per_prompt_logit_diff": ld.astype(float).tolist(), "per_prompt_correct": correct.astype(int).tolist()}


GROUPINGS = ("ot", "decoder-cosine", "co-activation", "random")


def within_layer_distances(sae, H_corpus: np.ndarray, H_task: np.ndarray, nodes: np.ndarray, method: str,
                           k: int = 32, solver: str = "exact", geometry: str = DEFAULT_GEOMETRY) -> np.ndarray:
    """(n, n) distances between a layer's circuit features.

    ``ot``: W2 between their top-k distributions over corpus + task tokens, in the layer's own
    (normalised) hidden-state space (both features live in the same layer, so the reference
    layer is the layer itself).  ``decoder-cosine``: 1 - cosine of decoder rows.
    ``co-activation``: 1 - Pearson correlation of their activations over the same corpus + task
    tokens (groups features that fire together; merging is exact when members fire in fixed
    proportion).  ``geometry`` (:mod:`saeot.geometry`) transforms the layer's hidden states for ``ot``.
    """
    if method == "decoder-cosine":
        Wd = sae.W_dec[nodes].astype(np.float64)
        Wd = Wd / np.linalg.norm(Wd, axis=1, keepdims=True)
        return 1.0 - Wd @ Wd.T
    if method not in ("ot", "co-activation"):
        raise ValueError(f"unknown within-layer distance {method!r}; expected 'ot', 'decoder-cosine' or 'co-activation'")
    H = np.concatenate([H_corpus, H_task], 0).astype(np.float32)  # (n_tok, d)
    acts = sae.encode(H)[:, nodes]  # (n_tok, n) sparse
    if method == "co-activation":
        a = acts.toarray().astype(np.float64)
        sd = a.std(0)
        C = np.corrcoef(a, rowvar=False) if (sd > 0).all() else np.nan_to_num(np.corrcoef(a, rowvar=False))
        D = 1.0 - C
        D[sd == 0] = np.inf
        D[:, sd == 0] = np.inf
        return D
    Z, _ = reference_embeddings(None, H, "reference", geometry=geometry)
    m = measures(feature_distributions(acts, k), Z)
    return pairwise_w2(m, m, solver, candidates=None).D


def paired_tests(a: dict, b: dict) -> dict:
    """Paired comparison across prompts of two faithfulness results (same prompts, same count):
    Wilcoxon signed-rank on per-prompt logit difference, exact McNemar (binomial) on correctness.
    Returns mean differences (a - b) and two-sided p-values (1.0 where the two are identical), and
    paired bootstrap intervals with verdicts (:func:`saeot.stats.paired_bootstrap`, over prompts)."""
    from scipy.stats import binomtest, wilcoxon  # lazy: scipy (0.3-3 s) keeps --help fast

    la, lb = np.asarray(a["per_prompt_logit_diff"]), np.asarray(b["per_prompt_logit_diff"])
    ca, cb = np.asarray(a["per_prompt_correct"]), np.asarray(b["per_prompt_correct"])
    # two circuits that compute the same thing in another summation order (S = n: every method keeps
    # every node) differ by float32 rounding only; a signed-rank test would read a consistent sign
    # in that noise as significant, so differences at rounding level count as ties (zeros: dropped)
    d = np.where(np.isclose(la, lb, rtol=1e-5, atol=1e-6), 0.0, la - lb)
    p_ld = float(wilcoxon(d).pvalue) if np.count_nonzero(d) else 1.0
    n01, n10 = int(((ca == 1) & (cb == 0)).sum()), int(((ca == 0) & (cb == 1)).sum())
    p_acc = float(binomtest(n01, n01 + n10, 0.5).pvalue) if n01 + n10 else 1.0
    return {"logit_diff_delta": float(d.mean()), "p_logit_diff_wilcoxon": p_ld,
            "accuracy_delta": float(ca.mean() - cb.mean()), "a_only_correct": n01, "b_only_correct": n10,
            "p_accuracy_mcnemar": p_acc, "logit_diff_paired": paired_bootstrap(la, lb),
            "accuracy_paired": paired_bootstrap(ca.astype(float), cb.astype(float))}


def _mean_runs(runs: list[dict]) -> dict:
    """Average of several faithfulness results (random seeds), per prompt too; plus the seed spread."""
    out = {kk: float(np.mean([r[kk] for r in runs])) for kk in ("accuracy", "logit_diff")}
    out["per_prompt_logit_diff"] = np.mean([r["per_prompt_logit_diff"] for r in runs], 0).tolist()
    # a prompt counts as correct for the average of seeds when most seeds get it right
    out["per_prompt_correct"] = (np.mean([r["per_prompt_correct"] for r in runs], 0) > 0.5).astype(int).tolist()
    out["seed_std_accuracy"] = float(np.std([r["accuracy"] for r in runs]))
    out["seed_std_logit_diff"] = float(np.std([r["logit_diff"] for r in runs]))
    out["seeds"] = [{kk: r[kk] for kk in ("accuracy", "logit_diff")} for r in runs]
    return out


def run_compression(lm, saes: dict, corpus_hidden: dict, n_nodes: int = 24, counts=None,
                    seeds=(0, 1, 2), k: int = 32, progress: bool = True, solver: str = "exact",
                    task: str = "addition", groupings=GROUPINGS, geometry: str = DEFAULT_GEOMETRY) -> dict:
    """Attribution graph, supernodes by every grouping, faithfulness vs supernode count, paired tests.

    Parameters
    ----------
    saes : {layer: SAE};  corpus_hidden : {layer: (n_tokens, d) corpus hidden states}
    counts : supernodes per layer to evaluate (default n, 3n/4, n/2, n/4, n/8, 1)
    solver : OT solver for the within-layer W2 distances
    task : "addition" or "successor"

    Returns
    -------
    dict with ``clean`` (unmodified model), ``counts``, per-method lists of
    {accuracy, logit_diff, per-prompt values} per count, ``paired`` tests of OT against every
    baseline per count, the circuit, and supernode graphs for the report.
    """
    the_task = make_task(lm.tokenizer, task)
    circuit = attribution_graph(lm, saes, the_task, n_nodes=n_nodes, progress=progress)
    n = n_nodes
    counts = counts or sorted({n, max(1, 3 * n // 4), max(1, n // 2), max(1, n // 4), max(1, n // 8), 1}, reverse=True)
    dist_methods = [m for m in groupings if m != "random"]
    dists = {m: {l: within_layer_distances(saes[l], corpus_hidden[l], circuit.task_hidden[l], circuit.nodes[l], m, k,
                                           solver=solver, geometry=geometry)
                 for l in circuit.layers} for m in dist_methods}
    out = {"task": task, "clean": faithfulness(lm, saes, the_task, circuit, None), "counts": counts, "n_nodes": n,
           "layers": circuit.layers, "n_prompts": int(the_task.ids.shape[0]), "solver": solver, "k": k,
           "geometry": geometry,
           "seeds": list(seeds), "methods": {}, "graphs": {}}
    from tqdm.auto import tqdm  # lazy: tqdm.auto (0.3 s) keeps --help fast

    for name in groupings:
        res = []
        for S in tqdm(counts, disable=not progress, desc=f"faithfulness {name}"):
            if name == "random":
                runs = [faithfulness(lm, saes, the_task, circuit,
                                     {l: random_groups(n, S, seed + 97 * l) for l in circuit.layers}) for seed in seeds]
                res.append(_mean_runs(runs))
            else:
                labels = {l: cluster(dists[name][l], S) for l in circuit.layers}
                res.append(faithfulness(lm, saes, the_task, circuit, labels))
                if name == "ot" and S == counts[len(counts) // 2]:
                    out["graphs"] = supernode_graph(circuit, labels)
        out["methods"][name] = res
    if "ot" in out["methods"]:
        out["paired"] = {b: [paired_tests(o, r) for o, r in zip(out["methods"]["ot"], out["methods"][b])]
                         for b in out["methods"] if b != "ot"}
    out["circuit"] = {str(l): {"nodes": circuit.nodes[l].tolist(), "scores": circuit.scores[l].tolist()}
                      for l in circuit.layers}
    return out


def supernode_graph(circuit: Circuit, labels: dict[int, np.ndarray]) -> dict:
    """Supernodes (members, summed attribution) and merged edges, JSON-ready."""
    nodes = []
    for l in circuit.layers:
        lab = labels[l]
        for s in range(int(lab.max()) + 1):
            mem = np.flatnonzero(lab == s)
            nodes.append({"id": f"L{l}S{s}", "layer": l, "members": circuit.nodes[l][mem].tolist(),
                          "score": float(circuit.scores[l][mem].sum())})
    edges = []
    for (l1, l2), E in circuit.edges.items():
        M = merge_edges(E, labels[l1], labels[l2])
        for s1 in range(M.shape[0]):
            for s2 in range(M.shape[1]):
                edges.append({"src": f"L{l1}S{s1}", "dst": f"L{l2}S{s2}", "weight": float(M[s1, s2])})
    return {"nodes": nodes, "edges": edges}


def plot_faithfulness(res: dict, path) -> None:
    import matplotlib  # lazy: matplotlib loads only when a figure is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib loads only when a figure is drawn

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for name, r in res["methods"].items():
        for ax, key in zip(axes, ("accuracy", "logit_diff")):
            ax.plot(res["counts"], [x[key] for x in r], marker="o", label=name)
    for ax, key in zip(axes, ("accuracy", "logit_diff")):
        ax.axhline(res["clean"][key], color="grey", lw=0.8, ls="--", label="unmodified")
        ax.set_xlabel(f"supernodes per layer (of {res['n_nodes']} circuit features)")
        ax.set_ylabel(key)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Circuit compression, single-digit addition, layers {res['layers']}")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown_table(res: dict) -> str:
    """Faithfulness per supernode count for every grouping, with OT's paired tests against each
    baseline (Wilcoxon on per-prompt logit difference, exact McNemar on correctness)."""
    names = list(res["methods"])
    head = "| supernodes / layer | " + " | ".join(f"{n} acc / logit diff" for n in names) + " | " + " | ".join(
        f"OT - {b}: d logit diff [paired 95%] verdict (Wilcoxon p) ; d acc (McNemar p)" for b in res.get("paired", {})) + " |"
    lines = [f"Task {res.get('task', 'addition')}, {res.get('n_prompts', '?')} prompts, unmodified accuracy "
             f"{res['clean']['accuracy']:.3f}, logit diff {res['clean']['logit_diff']:.2f}; circuit "
             f"{res['n_nodes']} features at each of layers {res['layers']}.", "", head,
             "|" + "---|" * (1 + len(names) + len(res.get("paired", {})))]
    for c, S in enumerate(res["counts"]):
        cells = []
        for n in names:
            x = res["methods"][n][c]
            sd = f" (seed sd {x['seed_std_accuracy']:.3f})" if "seed_std_accuracy" in x else ""
            cells.append(f"{x['accuracy']:.3f} / {x['logit_diff']:.2f}{sd}")
        for b, tests in res.get("paired", {}).items():
            t = tests[c]
            pb = t.get("logit_diff_paired")
            ci = f" [{pb['lo']:+.2f}, {pb['hi']:+.2f}] {pb['verdict']}" if pb and pb["n"] else ""
            cells.append(f"{t['logit_diff_delta']:+.2f}{ci} ({t['p_logit_diff_wilcoxon']:.2g}) ; "
                         f"{t['accuracy_delta']:+.3f} ({t['p_accuracy_mcnemar']:.2g})")
        lines.append(f"| {S} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
