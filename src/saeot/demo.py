"""`saeot demo`: collect -> train SAEs -> match layer pairs with every method -> circuit compression ->
HTML report, on the bundled defaults (Gemma-3-270M, small corpus, three layers)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from saeot.collect import collect_activations, load_activations
from saeot.compress import plot_faithfulness, run_compression
from saeot.corpus import chunk_corpus
from saeot.matching import Matching
from saeot.models import load_model
from saeot.pipeline import compare_methods, layer_pair, top_token_overlap
from saeot.report import pair_rows, write_report
from saeot.sae import load_sae, sae_metadata, sae_report, save_sae, train_topk_sae
from sakura.util.report import report_logger

_LOG = report_logger(__name__, "saeot")


def run_demo(out: Path, model: str = "gemma3-270m", n_tokens: int = 4096, ctx_len: int = 128,
             layers: list[int] | None = None, d_sae: int = 1024, k_sae: int = 16, steps: int = 400,
             k: int = 32, n_nodes: int = 16, compress: bool = True, log=None, solver: str = "exact",
             candidates: int | None = 32, counts=None, task: str = "addition") -> dict:
    """Run the whole pipeline; returns a dict of measured figures and writes ``out/report.html``.

    ``layers`` default: [0, L // 2, L] for a model with residual layers 0..L; pairs matched are
    (0 -> L) and (L // 2 -> L), like the paper's 0->11 and 5->11 on GPT-2.
    """
    log = log or _LOG.info  # the module's logger unless the caller gives a sink
    out = Path(out)
    t_all = time.perf_counter()
    fig: dict = {"model": model, "n_tokens": n_tokens, "d_sae": d_sae, "k_sae": k_sae, "k": k}
    lm = load_model(model)
    L = lm.n_layers - 1
    layers = layers or [0, L // 2, L]
    fig["layers"] = layers
    log(f"[1/5] collecting {n_tokens} tokens of {model} at layers {layers}")
    t0 = time.perf_counter()
    chunks = chunk_corpus(lm.tokenizer, n_tokens, ctx_len)
    acts = collect_activations(lm, chunks, out / "acts", layers, batch_size=8)
    fig["collect_s"] = time.perf_counter() - t0
    log(f"[2/5] training TopK SAEs (d_sae={d_sae}, k={k_sae}, {steps} steps) per layer")
    saes, sae_rep = {}, {}
    for l in layers:
        folder = out / "saes" / f"layer_{l}"
        X = load_activations(acts, l)
        if (folder / "cfg.json").exists():
            sae = load_sae(folder, layer=l)
        else:
            sae = train_topk_sae(X, d_sae, k_sae, steps=steps, batch_size=512, lr=1e-3,
                                 cfg=sae_metadata(model, l))
            save_sae(sae, folder)
        saes[l] = sae
        sae_rep[l] = sae_report(sae, X)
        log(f"    layer {l}: FVU {sae_rep[l]['fvu']:.3f}  L0 {sae_rep[l]['l0']:.1f}  dead {sae_rep[l]['dead_frac']:.1%}")
    fig["sae"] = sae_rep
    tokens = load_activations(acts, "tokens")
    chunk_ids = load_activations(acts, "chunk")
    sections, summary = [], []
    pairs = [(layers[0], layers[-1])] + ([(layers[1], layers[-1])] if len(layers) > 2 else [])
    log(f"[3/5] matching layer pairs {pairs} with every method")
    fig["pairs"] = {}
    for la, lb in pairs:
        A, B = layer_pair(acts, saes[la], saes[lb], la, lb, k=k)
        res = compare_methods(A, B, tokens, solver=solver, candidates=candidates)
        ot_nn = res["ot"].matching.as_dict()
        rng = np.random.default_rng(0)
        alive_a, alive_b = np.flatnonzero(A.dists.alive), np.flatnonzero(B.dists.alive)
        rand = Matching(alive_a, rng.choice(alive_b, len(alive_a)), np.zeros(len(alive_a)))
        pf = {"random_match_jaccard": float(top_token_overlap(A, B, tokens, rand).mean())}
        for m, r in res.items():
            agree = np.mean([ot_nn.get(i) == j for i, j in zip(r.matching.src.tolist(), r.matching.tgt.tolist())])
            summary.append({"pair": f"{la}->{lb}", "method": m, "matched": int(len(r.matching.src)),
                            "top-token Jaccard": r.proxy, "agree with ot": float(agree), "seconds": r.seconds})
            pf[m] = {"top_token_jaccard": r.proxy, "agree_with_ot": float(agree), "seconds": r.seconds,
                     "matched": int(len(r.matching.src)), "evaluated_pairs": r.evaluated}
            log(f"    {la}->{lb} {m:>15}: Jaccard {r.proxy:.3f}  agree-with-ot {agree:.2f}  {r.seconds:.1f} s")
        fig["pairs"][f"{la}->{lb}"] = pf
        methods, rows = pair_rows(A, B, res, n_pairs=15)
        sections.append({"title": f"Layer {la} → layer {lb}: closest OT matches", "layer_a": la, "layer_b": lb,
                         "methods": methods, "rows": rows})
    comp = None
    if compress and lm.causal and len(layers) >= 2:
        log(f"[4/5] circuit compression on {task}, layers {layers[-2:]}")
        cl = layers[-2:] if layers[-2] >= 1 else layers[-1:]
        comp = run_compression(lm, {l: saes[l] for l in cl}, {l: load_activations(acts, l) for l in cl},
                               n_nodes=n_nodes, k=k, solver=solver, counts=counts, task=task)
        plot_faithfulness(comp, out / "faithfulness.png")
        fig["compression"] = {kk: comp[kk] for kk in ("task", "clean", "counts", "methods", "layers", "n_nodes",
                                                      "paired")}
    log("[5/5] writing the report")
    fig["total_s"] = time.perf_counter() - t_all
    write_report(out / "report.html", title=f"saeot demo: {model}", tokens=tokens, chunk=chunk_ids,
                 decode=lm.tokenizer.decode, pairs=sections, summary=summary, compression=comp,
                 plots=[out / "faithfulness.png"] if comp else [],
                 notes=(f"{len(tokens)} corpus tokens (Shakespeare + Python docstrings); TopK SAEs d_sae={d_sae}, "
                        f"k={k_sae}; OT: {solver} W2 over top-{k} distributions in the target layer's hidden-state "
                        f"space, {candidates or 'all'} pre-filtered candidates per feature. Agreement proxy: Jaccard overlap of top-10 "
                        f"context tokens (offline stand-in for the paper's LLM judge)."))
    (out / "figures.json").write_text(json.dumps(fig, indent=1, default=float))
    log(f"done in {fig['total_s']:.0f} s: {out / 'report.html'}")
    return fig
