"""The `saeot` command line. Heavy imports happen inside each command so `saeot --help` is fast."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(
    help="saeot: semantic optimal transport between SAE features (cross-layer matching, circuit compression).",
    no_args_is_help=True,
    add_completion=False,
)


def _layers(s: str | None) -> list[int] | None:
    return None if s in (None, "", "all") else [int(x) for x in s.split(",")]


@app.command()
def collect(
    out: Path = typer.Option(Path("runs/acts"), help="Cache folder (resumable)."),
    model: str = typer.Option("gemma3-270m", help="gemma3-270m, minilm, tiny-random, or a local HF folder."),
    n_tokens: int = typer.Option(16384, help="Corpus tokens to collect."),
    ctx_len: int = typer.Option(128, help="Tokens per chunk."),
    layers: str = typer.Option("all", help="Comma-separated residual layers (0 = embeddings), or 'all'."),
    batch_size: int = typer.Option(8, help="Chunks per forward pass / shard."),
) -> None:
    """Collect residual-stream activations over the bundled corpus into a safetensors cache."""
    from saeot.collect import collect_activations
    from saeot.corpus import chunk_corpus
    from saeot.models import load_model

    lm = load_model(model)
    chunks = chunk_corpus(lm.tokenizer, n_tokens, ctx_len)
    collect_activations(lm, chunks, out, _layers(layers), batch_size)
    typer.echo(f"cached {len(chunks) * ctx_len} tokens x layers {layers} of {model} in {out}")


@app.command("train-sae")
def train_sae(
    acts: Path = typer.Option(Path("runs/acts"), help="Activation cache from `saeot collect`."),
    layers: str = typer.Option("all", help="Layers to train an SAE for."),
    out: Path = typer.Option(Path("runs/saes"), help="Folder; one SAELens-format SAE per layer (layer_<l>/)."),
    d_sae: int = typer.Option(4096, help="Features per SAE."),
    k: int = typer.Option(32, help="TopK: active features per token."),
    steps: int = typer.Option(1000, help="Adam steps."),
    batch_size: int = typer.Option(1024),
    lr: float = typer.Option(1e-3),
) -> None:
    """Train a TopK SAE per layer; print and save FVU / L0 / dead features per layer."""
    from saeot.collect import load_activations, load_manifest
    from saeot.sae import sae_metadata, sae_report, save_sae, train_topk_sae

    man = load_manifest(acts)
    todo = man["layers"] if _layers(layers) is None else _layers(layers)
    reports = {}
    for l in todo:
        X = load_activations(acts, l)
        n_train = int(0.9 * len(X))  # last 10% held out for the report
        sae = train_topk_sae(X[:n_train], d_sae, k, steps=steps, batch_size=batch_size, lr=lr,
                             cfg=sae_metadata(man["model"], l))
        save_sae(sae, out / f"layer_{l}")
        rep = sae_report(sae, X[n_train:])
        rep["dead_frac_train"] = sae_report(sae, X[:n_train])["dead_frac"]
        reports[l] = rep
        typer.echo(f"layer {l}: FVU {rep['fvu']:.3f}  L0 {rep['l0']:.1f}  dead {rep['dead_frac']:.1%} (held-out "
                   f"{rep['n_tokens']} tokens; dead on train {rep['dead_frac_train']:.1%})")
    (out / "report.json").write_text(json.dumps(reports, indent=1))


@app.command()
def match(
    acts: Path = typer.Option(Path("runs/acts")),
    saes: Path = typer.Option(Path("runs/saes"), help="Folder with layer_<l>/ SAEs (SAELens format)."),
    layer_a: int = typer.Option(0, help="Source layer."),
    layer_b: int = typer.Option(18, help="Target layer."),
    method: str = typer.Option("ot", help="ot, decoder-cosine, sae-match, act-corr, or 'all'."),
    solver: str = typer.Option("exact", help="OT solver: exact, sinkhorn, sliced."),
    strategy: str = typer.Option("nn", help="nn or hungarian."),
    space: str = typer.Option("reference", help="Reference space: reference, linear, pca."),
    k: int = typer.Option(32, help="Top-k support size."),
    candidates: int = typer.Option(32, help="Pre-filter: candidates per feature (0 = all pairs)."),
    out: Path = typer.Option(Path("runs/match.json")),
) -> None:
    """Match features of layer A to layer B with one or all methods; write pairs, scores, timings."""
    from saeot.collect import load_activations
    from saeot.methods import METHODS
    from saeot.pipeline import compare_methods, layer_pair
    from saeot.sae import load_sae

    A, B = layer_pair(acts, load_sae(saes / f"layer_{layer_a}"), load_sae(saes / f"layer_{layer_b}"),
                      layer_a, layer_b, space=space, k=k)
    tokens = load_activations(acts, "tokens")
    methods = METHODS if method == "all" else (method,)
    res = compare_methods(A, B, tokens, methods=methods, strategy=strategy, solver=solver,
                          candidates=candidates or None, progress=True)
    doc = {"layer_a": layer_a, "layer_b": layer_b, "space": space, "k": k, "solver": solver, "strategy": strategy,
           "methods": {n: {"seconds": r.seconds, "evaluated_pairs": r.evaluated, "top_token_jaccard": r.proxy,
                           "n_matched": int(len(r.matching.src)),
                           "src": r.matching.src.tolist(), "tgt": r.matching.tgt.tolist(),
                           "dist": r.matching.dist.tolist()} for n, r in res.items()}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc))
    for n, r in res.items():
        typer.echo(f"{n:>15}: {len(r.matching.src)} matched, top-token Jaccard {r.proxy:.3f}, "
                   f"{r.seconds:.1f} s, {r.evaluated} pairs evaluated")


@app.command()
def bench(
    out: Path = typer.Option(Path("docs/saeot"), help="Folder for JSON results and plots."),
    synthetic: bool = typer.Option(True, help="Planted-match recovery vs samples."),
    acts: Optional[Path] = typer.Option(None, help="Activation cache: also bench real layer pairs."),
    saes: Optional[Path] = typer.Option(None, help="SAEs (layer_<l>/) for --acts."),
    pairs: str = typer.Option("0:18,9:18", help="Real layer pairs a:b."),
) -> None:
    """Planted-match recovery for every method (synthetic) and, with --acts/--saes, every method on
    real layer pairs: top-token proxy, agreement, wall time for all pairs (JSON + plots)."""
    from saeot.bench import planted_recovery, plot_recovery, real_layers_bench, write_json

    if acts is not None:
        if saes is None:
            raise typer.BadParameter("--acts needs --saes")
        prs = [tuple(int(x) for x in p.split(":")) for p in pairs.split(",")]
        r = real_layers_bench(acts, saes, pairs=prs)
        write_json(r, out / "real_layers.json")
        for pr, v in r.items():
            for m, x in v["methods"].items():
                typer.echo(f"{pr} {m:>15}: Jaccard {x['top_token_jaccard']:.3f}  {x['seconds']:.1f} s")
            typer.echo(f"{pr} random-match Jaccard {v['random_jaccard']:.3f}; timing {v['timing']}")

    if synthetic:
        for sweep, name in (("k", "planted_recovery"), ("n_tokens", "planted_recovery_tokens")):
            r = planted_recovery(sweep=sweep)
            write_json(r, out / f"{name}.json")
            plot_recovery(r, out / f"{name}.png")
            for n, v in r["methods"].items():
                typer.echo(f"{n:>15} NN acc vs {sweep}={r['ks']}: " + " ".join(f"{x:.2f}" for x in v["nn"]))


@app.command()
def compress(
    acts: Path = typer.Option(Path("runs/acts")),
    saes: Path = typer.Option(Path("runs/saes")),
    model: str = typer.Option("gemma3-270m"),
    layers: str = typer.Option("9,18", help="Circuit layers (>= 1), each with an SAE in --saes."),
    n_nodes: int = typer.Option(24, help="Circuit features per layer."),
    out: Path = typer.Option(Path("runs/compress")),
) -> None:
    """Circuit compression on single-digit addition: attribution graph -> supernodes -> faithfulness."""
    from saeot.bench import write_json
    from saeot.collect import load_activations
    from saeot.compress import plot_faithfulness, run_compression
    from saeot.models import load_model
    from saeot.sae import load_sae

    lm = load_model(model)
    ls = _layers(layers)
    res = run_compression(lm, {l: load_sae(saes / f"layer_{l}") for l in ls},
                          {l: load_activations(acts, l) for l in ls}, n_nodes=n_nodes)
    write_json(res, out / "compression.json")
    plot_faithfulness(res, out / "faithfulness.png")
    typer.echo(f"unmodified: {res['clean']}")
    for m, r in res["methods"].items():
        typer.echo(f"{m:>15}: " + "  ".join(f"S={S}: acc {x['accuracy']:.2f} ld {x['logit_diff']:.2f}"
                                            for S, x in zip(res["counts"], r)))


@app.command()
def demo(
    out: Path = typer.Option(Path("out/saeot-demo"), help="Folder for caches, SAEs, figures and report.html."),
    model: str = typer.Option("gemma3-270m", help="gemma3-270m (default), tiny-random, or a local HF folder."),
    n_tokens: int = typer.Option(4096, help="Corpus tokens."),
    d_sae: int = typer.Option(1024, help="Features per SAE."),
    steps: int = typer.Option(400, help="SAE training steps per layer."),
    n_nodes: int = typer.Option(16, help="Circuit features per layer for compression."),
) -> None:
    """End to end on the bundled defaults (~10 min on 2 cores): collect, train, match, compress, report."""
    from saeot.demo import run_demo

    run_demo(out, model=model, n_tokens=n_tokens, d_sae=d_sae, steps=steps, n_nodes=n_nodes,
             log=lambda m: typer.echo(m))


@app.command()
def report(
    acts: Path = typer.Option(Path("runs/acts")),
    saes: Path = typer.Option(Path("runs/saes")),
    model: str = typer.Option("gemma3-270m", help="Model whose tokenizer decodes the contexts."),
    pairs: str = typer.Option("0:18,9:18", help="Layer pairs a:b to show."),
    compression: Optional[Path] = typer.Option(None, help="compression.json from `saeot compress`."),
    out: Path = typer.Option(Path("runs/report.html")),
) -> None:
    """Write a static HTML report: matched pairs with top contexts and every method's scores."""
    from transformers import AutoTokenizer  # noqa: F401  (tokenizer comes with the model spec)

    from saeot.collect import load_activations
    from saeot.models import load_model
    from saeot.pipeline import compare_methods, layer_pair
    from saeot.report import pair_rows, write_report
    from saeot.sae import load_sae

    tok = load_model(model).tokenizer
    tokens, chunk = load_activations(acts, "tokens"), load_activations(acts, "chunk")
    sections, summary = [], []
    for pr in pairs.split(","):
        la, lb = (int(x) for x in pr.split(":"))
        A, B = layer_pair(acts, load_sae(saes / f"layer_{la}"), load_sae(saes / f"layer_{lb}"), la, lb)
        res = compare_methods(A, B, tokens)
        for m, r in res.items():
            summary.append({"pair": pr, "method": m, "matched": int(len(r.matching.src)),
                            "top-token Jaccard": r.proxy, "seconds": r.seconds})
        methods, rows = pair_rows(A, B, res)
        sections.append({"title": f"Layer {la} → layer {lb}", "layer_a": la, "layer_b": lb,
                         "methods": methods, "rows": rows})
    comp = json.loads(compression.read_text()) if compression else None
    plots = [compression.parent / "faithfulness.png"] if compression else []
    write_report(out, title=f"saeot report: {model}", tokens=tokens, chunk=chunk, decode=tok.decode,
                 pairs=sections, summary=summary, compression=comp, plots=plots)
    typer.echo(f"wrote {out}")


def main(argv: Optional[list[str]] = None) -> None:  # pragma: no cover - console entry
    app(argv)
