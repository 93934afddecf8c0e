"""saeot's workflows as plain functions: collect -> train -> match / evaluate.

The CLI (:mod:`saeot.cli`) checks its options, then calls these; ``saeot reproduce``
(:mod:`saeot.reproduce`) calls them directly, so nothing goes back through the command line.
Every function takes paths and plain values, writes its artefacts where it is told, and returns
what it wrote as a dict; ``log`` receives one line per finished unit of work (``print`` by default).

The names are not ``collect`` / ``evaluate``: those are saeot's modules, and a function of the same
name on the package would be replaced by the module the first time it is imported.

>>> import saeot
>>> [callable(getattr(saeot, n)) for n in ("collect_cache", "train_saes", "match_layers", "evaluate_pairs")]
[True, True, True, True]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from saeot.bench import write_json
from saeot.collect import (
    chunk_token_set, collect_activations, excluding_chunks, load_activations, load_array, load_manifest,
)
from saeot.corpus import chunk_corpus, chunk_documents, user_documents
from saeot.errors import ActivationFileError, TextInputError
from saeot.evaluate import OTConfig, choose_config, chunk_split, evaluate_pair, markdown_summary
from saeot.geometry import DEFAULT_GEOMETRY
from saeot.methods import ONE_TO_ONE
from saeot.models import load_model
from saeot.pipeline import compare_methods, features_from_arrays, layer_pair
from saeot.sae import load_sae_for_layer, sae_metadata, sae_report, save_sae, train_jumprelu_sae, train_topk_sae
from sakura.util.report import report_logger

_LOG = report_logger(__name__, "saeot")

Log = Callable[[str], None]

# default corpus of every evaluation cache
DEFAULT_SOURCES = ("shakespeare", "docstrings")


def layer_seed(seed: int, layer: int) -> int:
    """The initialisation seed of layer ``layer``'s SAE in a run with base ``seed``: distinct per layer
    (independent initialisations; two layers trained from the same random decoder share ~half their
    decoder-cosine nearest neighbours by index alone, docs/saeot.md) and reproducible."""
    return int(seed) * 1009 + int(layer) + 1


def collect_cache(out: Path, *, model: str = "gemma3-270m", n_tokens: int = 16384, ctx_len: int = 128,
            layers: Sequence[int] | None = None, batch_size: int = 8, sources: Sequence[str] = DEFAULT_SOURCES,
            text: Path | None = None, text_field: str | None = None, exclude: Path | None = None,
            device: str = "auto", log: Log | None = None) -> dict:
    """Residual-stream activations of ``model`` over the bundled corpus (``sources``) or the user's
    ``text`` into the resumable cache ``out`` (:mod:`saeot.collect`).

    Returns
    -------
    dict
        The cache's manifest plus ``text_tokens`` / ``tail_tokens_dropped`` / ``documents_with_tail``
        when ``text`` is given: the tokens at the end of each document that do not fill a whole
        ``ctx_len`` chunk are not collected, and this says how many (also in ``log``).
    """
    log = log or _LOG.info  # the module's logger unless the caller gives a sink
    docs = user_documents(text, text_field) if text is not None else None  # bad text fails before the model loads
    lm = load_model(model, device=device)
    stats: dict = {}
    chunks = chunk_documents(lm.tokenizer, docs, n_tokens, ctx_len, stats=stats) if docs is not None else \
        chunk_corpus(lm.tokenizer, n_tokens, ctx_len, tuple(sources))
    if exclude is not None:
        chunks = excluding_chunks(chunks, exclude)
        if not chunks:
            raise TextInputError(f"every chunk of the first {n_tokens} corpus tokens is in {exclude}; raise --n-tokens")
    collect_activations(lm, chunks, out, None if layers is None else list(layers), batch_size,
                        source=None if text is None else text)
    res = dict(load_manifest(out))
    if stats:
        res.update(stats)
        if stats["tail_tokens_dropped"]:
            log(f"kept {stats['text_tokens_kept']:,} of {stats['text_tokens']:,} text tokens: "
                f"{stats['tail_tokens_dropped']:,} tokens at the ends of {stats['documents_with_tail']} "
                f"document(s) do not fill a {ctx_len}-token chunk and were left out (a smaller --ctx-len keeps more)")
    log(f"cached {len(chunks) * ctx_len} tokens x layers {res['layers']} of {model} in {out} (device {lm.device})")
    return res


def train_saes(acts: Path, out: Path, *, layers: Sequence[int] | None = None, d_sae: int = 4096, k: int = 32,
          steps: int = 1000, batch_size: int = 1024, lr: float = 1e-3, aux_k: int = -1, seed: int = 0,
          same_seed_all_layers: bool = False, architecture: str = "topk", stop_after: int = 0,
          extra_acts: Sequence[Path] = (), log: Log | None = None) -> dict:
    """Train one SAE per layer on the *fit* chunks only (:func:`saeot.evaluate.chunk_split`; val and
    test stay outside the training data) and write ``out/layer_<l>/`` (SAELens format) and
    ``out/report.json`` (held-out FVU / L0 / dead features per layer).

    ``architecture``: ``topk`` (TopK + AuxK, :func:`saeot.sae.train_topk_sae`) or ``jumprelu``
    (per-feature thresholds trained with straight-through estimators at the TopK run's L0 = k,
    :func:`saeot.sae.train_jumprelu_sae`).  Layer l's initialisation seed is
    :func:`layer_seed` (seed, l) (independent per layer) unless ``same_seed_all_layers`` (every
    layer from ``seed``, the old behaviour, kept to reproduce older runs).  Resumable: state is
    checkpointed under ``out/checkpoints/``.

    Returns
    -------
    dict
        {layer (str): report} of the layers finished in this call.
    """
    log = log or _LOG.info  # the module's logger unless the caller gives a sink
    if architecture not in ("topk", "jumprelu"):
        raise ValueError(f"architecture {architecture!r} is not one of topk, jumprelu")
    acts, out = Path(acts), Path(out)
    man = load_manifest(acts)
    todo = list(man["layers"]) if layers is None else [int(l) for l in layers]
    split = chunk_split(load_activations(acts, "chunk"))
    extra_acts = [Path(x) for x in extra_acts]
    # the guarantee that judged tokens stay outside training, checked on token content, not on names
    held = chunk_token_set(acts, split["held"]) if extra_acts else set()
    for x in extra_acts:
        shared = held & chunk_token_set(x)
        if shared:
            raise ActivationFileError(f"--extra-acts {x} holds {len(shared)} val/test chunks of --acts {acts}; "
                                      f"collect it with --exclude {acts}")
        man_x = load_manifest(x)
        missing = [l for l in todo if l not in man_x["layers"]]
        if missing or man_x["model"] != man["model"]:
            raise ActivationFileError(f"--extra-acts {x} lacks layers {missing} or is from another model "
                                      f"({man_x['model']})")
    rpath = out / "report.json"
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    done = {}
    for l in todo:
        X = load_activations(acts, l)
        X_fit = X[split["fit"]]
        if extra_acts:
            X_fit = np.concatenate([X_fit] + [load_activations(x, l) for x in extra_acts], 0)
        ck = out / "checkpoints" / f"layer_{l}.pt"
        s_l = int(seed) if same_seed_all_layers else layer_seed(seed, l)
        kw = dict(steps=steps, batch_size=batch_size, lr=lr, seed=s_l, cfg=sae_metadata(man["model"], l),
                  checkpoint=ck, stop_after=stop_after or None)
        if architecture == "topk":
            sae = train_topk_sae(X_fit, d_sae, k, aux_k=None if aux_k < 0 else aux_k, **kw)
        else:
            sae = train_jumprelu_sae(X_fit, d_sae, target_l0=k, **kw)
        if sae is None:
            log(f"layer {l}: checkpointed at {ck} (run again to continue)")
            continue
        save_sae(sae, out / f"layer_{l}")
        rep = sae_report(sae, X[split["held"]])
        # val and test apart too: a recipe is chosen on val, and test is reported once
        for part in ("val", "test"):
            p_rep = sae_report(sae, X[split[part]])
            rep[f"fvu_{part}"], rep[f"n_tokens_{part}"] = p_rep["fvu"], p_rep["n_tokens"]
        fit_rep = sae_report(sae, X_fit[:40960])
        rep["dead_frac_train"], rep["fvu_train"] = fit_rep["dead_frac"], fit_rep["fvu"]
        rep.update({"architecture": architecture, "d_sae": d_sae, "k": k, "steps": steps, "batch_size": batch_size,
                    "seed": s_l, "base_seed": int(seed), "lr": lr, "train_tokens": len(X_fit),
                    "extra_acts": (None if not extra_acts else str(extra_acts[0]) if len(extra_acts) == 1
                                   else [str(x) for x in extra_acts]),
                    "held_out": "val + test chunks (saeot.evaluate.chunk_split), never trained on"})
        log(f"layer {l}: FVU {rep['fvu']:.3f} (val {rep['fvu_val']:.3f}, test {rep['fvu_test']:.3f})  "
            f"L0 {rep['l0']:.1f}  dead {rep['dead_frac']:.1%} (held-out {rep['n_tokens']} tokens; "
            f"dead on train {rep['dead_frac_train']:.1%}; seed {s_l})")
        write_json(rep, out / f"layer_{l}" / "report.json")
        # re-read before writing: another train run may have added layers to the same folder meanwhile
        reports = json.loads(rpath.read_text()) if rpath.exists() else {}
        reports[str(l)] = rep
        write_json(reports, rpath)  # atomic: a crash never leaves a half-written report.json
        done[str(l)] = rep
    return done


def match_layers(out: Path | None, *, layer_a: int, layer_b: int, acts: Path | None = None, saes: Path | None = None,
          sae_a: Path | None = None, sae_b: Path | None = None, acts_a: Path | None = None,
          acts_b: Path | None = None, tokens_file: Path | None = None, methods: Sequence[str] = ("ot",),
          solver: str = "exact", strategy: str = "nn", space: str = "reference", geometry: str = DEFAULT_GEOMETRY,
          hubness: str = "none", k: int = 32, candidates: int | None = 32, n_jobs: int | None = None,
          progress: bool = True, log: Log | None = None) -> dict:
    """Match the features of residual layer ``layer_a`` to ``layer_b`` with every method in ``methods``
    (:data:`saeot.methods.METHODS`): pairs, distances, timings; written to ``out`` (JSON) if given.

    Hidden states come from the cache ``acts`` (``saeot collect``) or from two array files
    ``acts_a`` / ``acts_b`` (the same tokens row by row); SAEs from the folder ``saes`` or the
    single folders ``sae_a`` / ``sae_b``; each SAE's own hook must name the layer it is used for.
    """
    log = log or _LOG.info  # the module's logger unless the caller gives a sink
    SA = load_sae_for_layer(sae_a if sae_a is not None else saes, layer_a)
    SB = load_sae_for_layer(sae_b if sae_b is not None else saes, layer_b)
    if acts_a is not None:
        Ha = load_array(acts_a, d=SA.d_in, what="--acts-a")
        Hb = load_array(acts_b, d=SB.d_in, rows=len(Ha), what="--acts-b")
        tokens = None if tokens_file is None else load_array(tokens_file, rows=len(Ha), integer=True, what="--tokens")
        A, B = features_from_arrays(Ha, Hb, SA, SB, space=space, k=k, geometry=geometry)
    else:
        A, B = layer_pair(acts, SA, SB, layer_a, layer_b, space=space, k=k, geometry=geometry)
        tokens = load_activations(acts, "tokens")
    res = compare_methods(A, B, tokens, methods=tuple(methods), strategy=strategy, solver=solver,
                          candidates=candidates, progress=progress, n_jobs=n_jobs, hubness=hubness)
    doc = {"layer_a": layer_a, "layer_b": layer_b, "space": space, "geometry": geometry, "hubness": hubness,
           "k": k, "solver": solver, "strategy": strategy,
           "methods": {n: {"seconds": r.seconds, "evaluated_pairs": r.evaluated,
                           "top_token_jaccard": None if r.proxy != r.proxy else r.proxy,
                           "strategy": "hungarian" if n in ONE_TO_ONE else strategy,
                           "n_matched": int(len(r.matching.src)),
                           "src": r.matching.src.tolist(), "tgt": r.matching.tgt.tolist(),
                           "dist": r.matching.dist.tolist()} for n, r in res.items()}}
    if out is not None:
        write_json(doc, out)
    for n, r in res.items():
        jac = "n/a (no --tokens)" if r.proxy != r.proxy else f"{r.proxy:.3f}"
        log(f"{n:>16}: {len(r.matching.src)} matched, top-token Jaccard {jac}, "
            f"{r.seconds:.1f} s, {r.evaluated} pairs evaluated")
    return doc




def evaluate_pairs(acts: Path, saes: Path, pairs: Sequence[tuple[int, int]], *, model: str = "gemma3-270m",
             out: Path | None = None, n_eval: int = 128, n_intervene: int = 0, configs=None,
             settings: Sequence[str] = ("shared", "disjoint"), strategies: Sequence[str] = ("nn", "hungarian", "mutual"),
             n_chunks: int = 4, select_metric: str = "judge", saes_b: Path | None = None,
             splits: Sequence[str] = ("val", "test"), log: Log | None = None) -> dict:
    """Non-circular evaluation of every method on each layer pair (:func:`saeot.evaluate.evaluate_pair`):
    held-out judges, shared and disjoint settings, paired OT - baseline intervals.  ``out`` (JSON)
    is rewritten after every pair, so an interruption keeps the finished pairs; ``out``'s ``.md``
    sibling gets the markdown tables.  ``saes_b``: the target layers' SAEs from another folder
    (e.g. another training seed); default ``saes``.

    Returns
    -------
    dict
        ``{"pairs": {"a->b": ...}, "selection": ...}``.
    """
    log = log or _LOG.info  # the module's logger unless the caller gives a sink
    configs = list(configs) if configs else [OTConfig()]
    lm = load_model(model)
    res: dict = {}
    for la, lb in pairs:
        res[f"{la}->{lb}"] = evaluate_pair(acts, load_sae_for_layer(saes, la),
                                           load_sae_for_layer(saes_b if saes_b is not None else saes, lb), la, lb,
                                           lm=lm, n_eval=n_eval, n_intervene=n_intervene, configs=configs,
                                           settings=tuple(settings), strategies=tuple(strategies),
                                           n_chunks=n_chunks, splits=tuple(splits), log=log)
        if out is not None:
            write_json({"pairs": res}, out)  # after every pair: a partial result survives an interruption
    choice = choose_config(res, metric=select_metric, setting=list(settings)[0])
    doc = {"pairs": res, "selection": choice}
    if out is not None:
        write_json(doc, out)
        show = [configs[0].name] + ([choice["chosen"]] if choice["chosen"] not in (None, configs[0].name) else [])
        md = (f"Default: {configs[0].name}; chosen on the val split by {select_metric} (NN): {choice['chosen']}\n"
              + markdown_summary(res, split="test", configs=show))
        Path(out).with_suffix(".md").write_text(md + "\n")
    return doc
