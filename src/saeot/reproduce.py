"""``saeot reproduce``: every published saeot table from one command, resumable, no absolute paths.

A preset is a list of steps; each step writes ``OUT/<step>.json`` (atomically) and is skipped when
that file exists, so an interrupted run continues where it stopped (the real-model steps resume
inside too: ``collect`` by shard, ``train-sae`` by checkpoint).  ``OUT/results.md`` is then
generated from the JSON files alone (:func:`tables`), and ``--docs`` copies it into the manual.

Presets (wall times measured on this project's 2-core machine, see docs/saeot.md):

- ``quick`` (minutes, no download, no Gemma): planted recovery vs k, the margin sweep, planted
  recovery on shared and disjoint tokens (every method incl. faithful SAE-Match), the width
  benchmark at 1,024 and 4,096 features, and the whole real pipeline (collect, train SAEs,
  evaluate shared + disjoint at two pairs) on the *tiny random* model: a check that the pipeline
  runs, whose quality columns are near chance by construction (a random model has no meaning).
- ``reduced``: ``quick``'s synthetic steps, width at 4,096 and 16,384, and Gemma-3-270M on a
  reduced corpus (32,768 tokens, 1,024-feature TopK SAEs, k = 32): the six layer pairs in the
  shared and the disjoint-token settings.  About an hour on two cores.
- ``full``: the published recipe (81,920 tokens, 4,096-feature SAEs, k = 64, 600 steps, 256
  judged sources per pair); hours on two cores.

Intervention hit@10 is not run by any preset: on the distant pairs every method, random
included, scored 0 (docs/notes/saeot-history.md), so it carried no signal; ``saeot evaluate
--n-intervene`` still runs interventions for those who want them.
"""

from __future__ import annotations

import json
import time

import numpy as np
from dataclasses import dataclass, field
from pathlib import Path

from saeot import bench
from saeot.api import collect_cache, evaluate_pairs, train_saes
from saeot.bench import write_json
from saeot.fsutil import atomic_write
from saeot.models import resolve_device
from saeot.stats import family_verdicts
from saeot.width import width_bench
from sakura.util.report import markdown_head, report_logger

_LOG = report_logger(__name__, "saeot")


SIX_PAIRS = ((9, 10), (9, 18), (0, 18), (0, 9), (3, 12), (6, 15))


@dataclass(frozen=True)
class RealRun:
    """The real-model part of a preset: which model, corpus size, SAE recipe and pairs."""

    model: str
    n_tokens: int
    layers: tuple[int, ...]
    d_sae: int
    k: int
    steps: int
    batch_size: int
    pairs: tuple[tuple[int, int], ...]
    n_eval: int
    label: str
    text: str | None = None  # a user text file instead of the bundled corpus (saeot collect --text)
    sae_seeds: int = 2  # TopK SAE sets trained with base seeds 0..sae_seeds-1 (every layer its own seed)
    jumprelu: bool = True  # also a JumpReLU SAE set (per-feature thresholds: where SAE-Match differs)
    splits: tuple[str, ...] = ("test",)  # judged splits (val is only for choosing among OT variants)


def sae_sets(r: RealRun) -> list[tuple[str, str, int]]:
    """(suffix, architecture, base seed) of every SAE set: "" = TopK seed 0 (folder ``saes``),
    "_seed1" ... the other TopK seeds, "_jumprelu" the JumpReLU set (folder ``saes<suffix>``)."""
    return ([("", "topk", 0)] + [(f"_seed{s}", "topk", s) for s in range(1, r.sae_seeds)]
            + ([("_jumprelu", "jumprelu", 0)] if r.jumprelu else []))


@dataclass(frozen=True)
class Preset:
    name: str
    seeds: int
    widths: tuple[int, ...]
    real: RealRun
    synthetic: tuple[str, ...] = field(default=("planted_k", "margin_sweep", "planted_disjoint"))


PRESETS = {
    "quick": Preset("quick", 2, (1024, 4096),
                    RealRun("tiny-random", 4096, (0, 1, 2, 4), 256, 8, 200, 256, ((1, 4), (0, 4)), 64,
                            "tiny random Llama (4 layers, hidden 64, built in code): no semantics, a pipeline check")),
    "reduced": Preset("reduced", 4, (4096, 16384),
                      RealRun("gemma3-270m", 32768, (0, 3, 6, 9, 10, 12, 15, 18), 1024, 32, 600, 256, SIX_PAIRS, 128,
                              "Gemma-3-270M, reduced corpus (32,768 tokens), 1,024-feature TopK SAEs (k = 32)")),
    "full": Preset("full", 4, (4096, 16384),
                   RealRun("gemma3-270m", 81920, (0, 3, 6, 9, 10, 12, 15, 18), 4096, 64, 600, 256, SIX_PAIRS, 256,
                           "Gemma-3-270M, 81,920 tokens, 4,096-feature TopK SAEs (k = 64): the published recipe")),
}


def steps_of(p: Preset) -> list[str]:
    r = p.real
    sets = sae_sets(r)
    return (list(p.synthetic) + ["width", "collect"] + [f"train{x}" for x, _, _ in sets]
            + [f"eval_{a}_{b}{x}" for a, b in r.pairs for x, _, _ in sets] + ["summary"])


def run_step(step: str, p: Preset, out: Path, log=None) -> dict:
    """Run one step and return what goes into ``OUT/<step>.json``."""
    log = log or _LOG.info  # the module's logger unless the caller gives a sink
    r = p.real
    seeds = range(p.seeds)
    t0 = time.perf_counter()
    if step == "planted_k":
        res = bench.planted_recovery(seeds=seeds, progress=False)
    elif step == "margin_sweep":
        res = bench.margin_sweep(seeds=seeds, progress=False)
    elif step == "planted_disjoint":
        res = bench.disjoint_recovery(seeds=seeds, progress=False)
    elif step == "width":
        res = width_bench(p.widths, device=resolve_device("auto"), log=log)
    elif step == "collect":
        res = collect_cache(out / "acts", model=r.model, n_tokens=r.n_tokens, layers=r.layers, device="auto",
                            text=None if r.text is None else Path(r.text), log=log)
    elif step.startswith("train"):
        x, arch, seed = next(t for t in sae_sets(r) if f"train{t[0]}" == step)
        train_saes(out / "acts", out / f"saes{x}", layers=r.layers, d_sae=r.d_sae, k=r.k, steps=r.steps,
                   batch_size=r.batch_size, seed=seed, architecture=arch, log=log)
        res = json.loads((out / f"saes{x}" / "report.json").read_text())
    elif step.startswith("eval_"):
        a, b, *rest = step[5:].split("_", 2)
        x = f"_{rest[0]}" if rest else ""
        res = evaluate_pairs(out / "acts", out / f"saes{x}", [(int(a), int(b))], model=r.model, n_eval=r.n_eval,
                             n_intervene=0, settings=("shared", "disjoint"), splits=r.splits,
                             strategies=("nn", "hungarian"), log=log)  # the verdicts use these two
        res["sae_set"] = x or "_seed0"
    elif step == "summary":
        res = {"preset": p.name, "real": r.label, "steps": {s: json.loads((out / f"{s}.json").read_text()).get(
            "_seconds") for s in steps_of(p) if s != "summary" and (out / f"{s}.json").exists()}}
    else:
        raise ValueError(f"unknown reproduce step {step!r}; expected one of {steps_of(p)}")
    res["_seconds"] = time.perf_counter() - t0
    return res


class Interrupted(KeyboardInterrupt):
    """An interrupt (Ctrl-C) during a step: which step, after how long, and where the finished ones are."""

    def __init__(self, step: str, seconds: float, out: Path):
        super().__init__(step)
        self.step, self.seconds, self.out = step, seconds, Path(out)

    def __str__(self) -> str:
        return (f"interrupted during step {self.step} after {self.seconds:.0f} s; the finished steps are kept in "
                f"{self.out} (one JSON each) and the same command resumes from {self.step}")


def reproduce(preset: str, out: Path, *, only: list[str] | None = None, log=None) -> Path:
    """Run the preset's missing steps (all, or ``only``), then write ``OUT/results.md``."""
    log = log or _LOG.info  # the module's logger unless the caller gives a sink
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {', '.join(PRESETS)}")
    p = PRESETS[preset]
    out = Path(out)
    todo = steps_of(p)
    if only:
        bad = [s for s in only if s not in todo]
        if bad:
            raise ValueError(f"unknown steps {bad}; the {preset} preset has {', '.join(todo)}")
        todo = [s for s in todo if s in only]
    for s in todo:
        path = out / f"{s}.json"
        if path.exists():
            log(f"[{preset}] {s}: done before ({path})")
            continue
        log(f"[{preset}] {s} ...")
        t0 = time.perf_counter()
        try:
            res = run_step(s, p, out, log=log)
        except KeyboardInterrupt:
            raise Interrupted(s, time.perf_counter() - t0, out) from None
        write_json(res, path)
        log(f"[{preset}] {s}: {res['_seconds']:.0f} s -> {path}")
    md = tables(out, preset)

    atomic_write(out / "results.md", md.encode("utf-8"))
    return out / "results.md"


# ---------------------------------------------------------------------------------------------
# tables, from the JSON files alone

CO_FIRING = ("act-corr",)  # baselines that see which tokens a feature fires on, as OT's default space does
HIGHER = {"judge": "MiniLM judge: cosine similarity of the two features' held-out top contexts (higher = "
                   "more alike in meaning, by a sentence embedder; an offline proxy for the paper's LLM judge)",
          "judge_masked": "masked judge: the same with the activating token replaced by [MASK] in every context "
                          "(does not reward firing on the same word by itself)",
          "jaccard": "held-out Jaccard: overlap of the token ids at the two features' top held-out activations "
                     "(higher = fire on the same words)"}


def _load(out: Path, step: str) -> dict | None:
    p = out / f"{step}.json"
    return json.loads(p.read_text()) if p.exists() else None


def _ci(x: dict | None) -> str:
    return "n/a" if not x or not x.get("n", 1) else f"{x['mean']:.2f} [{x['lo']:.2f}, {x['hi']:.2f}]"


BASELINES = ("decoder-cosine", "sae-match", "sae-match-folded", "act-corr", "xact")
FAMILY_METRICS = ("judge", "judge_masked", "jaccard")  # one family: they score the same matches
ONE_TO_ONE_BASELINES = ("sae-match-folded", "sae-match-folded-encdec")


def _ot_name(st: dict, ev: dict) -> str:
    return st["configs"][0] if "configs" in st else ev["configs"][0]


def paired_cells(evals_by_set: dict, setting: str, baseline: str, sets, split: str = "test") -> dict:
    """{(pair, metric): per-source OT - baseline differences pooled over the SAE sets ``sets``} of the
    default OT configuration; against a one-to-one baseline both sides match one-to-one (Hungarian),
    else nearest neighbour.  Sources of different SAE seeds are different features: pooled as items."""
    strat = "hungarian" if baseline in ONE_TO_ONE_BASELINES else "nn"
    cells: dict = {}
    for x in sets:
        for pair, ev in evals_by_set.get(x, {}).items():
            st = ev["settings"].get(setting)
            if not st or baseline not in st["scores"]:
                continue
            so, sb = st["scores"][_ot_name(st, ev)].get(strat, {}).get(split, {}), \
                st["scores"][baseline].get(strat, {}).get(split, {})
            for m in FAMILY_METRICS:
                if m in so and m in sb:
                    d = np.asarray(so[m], np.float64) - np.asarray(sb[m], np.float64)
                    cells.setdefault((pair, m), []).extend(d.tolist())
    return cells


def verdicts(evals_by_set: dict, setting: str, sets, split: str = "test") -> dict:
    """{baseline: {"wins", "ties", "losses", "cells": {(pair, metric): result}}}: one Holm family per
    baseline and setting (every pair x {judge, masked judge, Jaccard}), SAE seeds pooled per cell
    (:func:`saeot.stats.family_verdicts`)."""
    out = {}
    for bl in BASELINES:
        cells = paired_cells(evals_by_set, setting, bl, sets, split)
        if not cells:
            continue
        fam = family_verdicts(cells)
        cnt = {"wins": 0, "ties": 0, "losses": 0}
        for r in fam.values():
            cnt[{"win": "wins", "loss": "losses"}.get(r["verdict"], "ties")] += 1
        out[bl] = {**cnt, "cells": fam}
    return out


def verdict_counts(evals: dict, setting: str, strategy: str = "nn", split: str = "test") -> dict:
    """{baseline: {"wins", "ties", "losses"}} of one evaluation ({pair: ...}) under Holm across its cells
    (kept for the committed evaluations of earlier rounds)."""
    return {bl: {k: v for k, v in c.items() if k != "cells"}
            for bl, c in verdicts({"": evals}, setting, [""], split).items()}


def _load_evals(out: Path, p: "Preset") -> dict:
    """{set suffix: {pair: evaluation}} of every eval step present."""
    res: dict = {}
    for a, b in p.real.pairs:
        for x, _, _ in sae_sets(p.real):
            e = _load(out, f"eval_{a}_{b}{x}")
            if e:
                res.setdefault(x, {}).update(e["pairs"])
    return res


def _fmt_cell(r: dict | None) -> str:
    if not r or not r.get("n"):
        return "n/a"
    return f"{r['mean']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}] p={r['p_holm']:.3g} **{r['verdict']}**"


def real_tables(out: Path, p: "Preset") -> list[str]:
    """The real-model tables: W/T/L under Holm (TopK seeds pooled; JumpReLU apart), per-pair cells,
    seconds per method, SAE-Match vs decoder cosine and the identity-match diagnostic."""
    evs = _load_evals(out, p)
    if not evs:
        return []
    topk = [x for x, arch, _ in sae_sets(p.real) if arch == "topk" and x in evs]
    jr = [x for x, arch, _ in sae_sets(p.real) if arch == "jumprelu" and x in evs]
    pairs = sorted({pr for x in evs for pr in evs[x]})
    L = [f"## {p.real.label}", ""]
    if p.real.model == "tiny-random":
        L += ["*The tiny model is random: what its features share across layers is the token identity that "
              "the residual stream carries from the embeddings, not learned meaning. These rows check that the "
              "pipeline runs end to end; they are not evidence about any method on a real model.*", ""]
    L += ["What higher means: " + "; ".join(HIGHER.values()) + ". Held-out = test chunks outside the SAEs' "
          "and the distances' fit tokens.", "",
          "What each method sees. **Shared** tokens: OT reads both SAEs' activations on the fit tokens and the "
          "target layer's states of those tokens; act-corr and xact (= act-corr here) read the same activations. "
          "**Disjoint** tokens (geometry only): the source's features are fitted on one half of the fit chunks, "
          "the target's on the other; OT places the source tokens in the target's space by an affine map fitted "
          "on the *target's* tokens, so no target-layer state of a source token is used; xact correlates the "
          "source SAE with the target SAE applied to those same mapped states (OT's own inputs); act-corr is "
          "undefined. Decoder cosine reads decoder rows; SAE-Match as published reads decoder rows and "
          "thresholds (TopK: one per layer).", ""]
    for title, sets in (("TopK SAEs, seeds pooled: " + ", ".join(x or "_seed0" for x in topk), topk),
                        ("JumpReLU SAEs (per-feature thresholds)", jr)):
        if not sets:
            continue
        v = {st: verdicts(evs, st, sets) for st in ("shared", "disjoint")}
        L += [f"### {title}", "",
              "OT (default) against each baseline: wins / ties / losses over pairs x {MiniLM judge, masked "
              "judge, Jaccard}, **one Holm family per baseline and setting** (sign-flip p per cell, per-source "
              "differences pooled over the SAE seeds; win / loss = Holm-adjusted p < 0.05). Against "
              "sae-match-folded both sides match one-to-one (Hungarian), else nearest neighbour. Seconds = "
              "mean time to compute the method's distances on the fit tokens per pair.", "",
              *markdown_head(["baseline", "shared W / T / L", "disjoint W / T / L", "seconds shared",
                              "seconds disjoint"], "l")]
        secs = {}
        for st in ("shared", "disjoint"):
            for x in sets:
                for ev in evs[x].values():
                    s_ = ev["settings"].get(st)
                    if s_:
                        for n, t in s_["fit_seconds"].items():
                            secs.setdefault((st, "ot" if n.startswith("ot[") else n), []).append(t)
        def sec(st, n):
            return f"{np.mean(secs[(st, n)]):.2f}" if (st, n) in secs else "-"
        for bl in BASELINES:
            c = [f"{v[st][bl]['wins']} / {v[st][bl]['ties']} / {v[st][bl]['losses']}" if bl in v[st] else "n/a"
                 for st in ("shared", "disjoint")]
            L.append(f"| {bl} | {c[0]} | {c[1]} | {sec('shared', bl)} | {sec('disjoint', bl)} |")
        L.append(f"| (OT itself) | | | {sec('shared', 'ot')} | {sec('disjoint', 'ot')} |")
        L += ["", "Per cell: OT - baseline, mean [95% bootstrap], Holm-adjusted p, verdict:", "",
              *markdown_head(["pair", "setting", "metric", *BASELINES], "l")]
        for pr in pairs:
            for st in ("shared", "disjoint"):
                for m in FAMILY_METRICS:
                    row = [_fmt_cell(v[st].get(bl, {}).get("cells", {}).get((pr, m))) for bl in BASELINES]
                    if any(c != "n/a" for c in row):
                        L.append(f"| {pr} | {st} | {m} | " + " | ".join(row) + " |")
        L.append("")
    # SAE-Match vs decoder cosine, identity-match diagnostic
    L += ["### Diagnostics: does SAE-Match differ from decoder cosine; do SAEs share an initialisation", "",
          "Per SAE set and pair (shared tokens, judged sources): share of sources whose one-to-one SAE-Match "
          "target differs from decoder cosine's one-to-one target; share of sources decoder cosine (NN) matches "
          "to the feature with the *same index*; mean cosine of same-index decoder rows (about 0 for independent "
          "initialisations).", "",
          *markdown_head(["SAE set", "pair", "SAE-Match != decoder cosine (Hungarian)", "decoder cosine NN: same index",
                  "same-index decoder cosine"], "l")]
    for x in evs:
        for pr, ev in evs[x].items():
            st = ev["settings"].get("shared")
            if not st or "targets" not in st:
                continue
            t1, t2 = (np.asarray(st["targets"].get(k, []), dtype=np.int64)
                      for k in ("sae-match-folded/hungarian", "decoder-cosine/hungarian"))
            diff = f"{np.mean(t1 != t2):.2f}" if len(t1) and len(t1) == len(t2) else "-"
            idn = st.get("identity_match", {}).get("decoder-cosine/nn")
            sic = ev.get("same_index_decoder_cosine")
            L.append(f"| {x or '_seed0'} | {pr} | {diff} | {'-' if idn is None else f'{idn:.3f}'} | "
                     f"{'-' if sic is None else f'{sic:.3f}'} |")
    L.append("")
    return L


def tables(out: Path, preset: str) -> str:
    """Markdown of every table the preset's JSON files hold (missing steps are listed, not invented)."""
    p = PRESETS[preset]
    L = [f"# saeot results: `saeot reproduce --preset {preset}`", "",
         f"Generated from the JSON files in `{out.name}/` by `saeot reproduce --preset {preset} --tables-only`; "
         "every number below is read from them.", ""]
    missing = [s for s in steps_of(p) if not (out / f"{s}.json").exists()]
    if missing:
        L += [f"**Not run yet** (the command above runs them, resuming): {', '.join(missing)}.", ""]
    # 1. planted recovery vs margin
    ms = _load(out, "margin_sweep")
    if ms:
        L += ["## Planted matches vs margin (synthetic ground truth)", "",
              "Fraction of 64 planted features whose true partner is recovered (higher = better; chance "
              f"{ms['params']['chance']:.3f}), 95% bootstrap over (seed, feature), {len(ms['params']['seeds'])} seeds. "
              "Margin = distance between concept centres in units of the within-concept noise. NN = nearest "
              "neighbour; SAE-Match as published (sae-match-folded) is one-to-one, so read it in the Hungarian "
              "table. act-corr shares OT's co-firing signal and is undefined on disjoint tokens. Decoder cosine "
              "and both SAE-Match variants do not use the token geometry: their rows do not depend on the margin "
              "(they depend on the decoder drift, fixed at "
              f"{ms['params']['drift']}).", ""]
        for st, per in ms["settings"].items():
            names = list(next(iter(per.values())))
            for strat in ("nn", "hungarian"):
                L += [f"**{st} tokens, {'nearest neighbour' if strat == 'nn' else 'one-to-one (Hungarian)'}**", "",
                      *markdown_head(["margin", *names], "l")]
                for mg, v in per.items():
                    L.append(f"| {mg} | " + " | ".join(_ci(v[n][strat]) for n in names) + " |")
                L.append("")
    dj = _load(out, "planted_disjoint")
    if dj:
        L += ["## Planted matches, shared vs disjoint tokens", "",
              "Recovery accuracy (higher = better), NN and Hungarian, 95% bootstrap; margin "
              f"{dj['params']['margin']}, drift {dj['params']['drift']}. On disjoint tokens no token is seen by "
              "both layers, so only the geometry of the hidden states can link them.", "",
              *markdown_head(["setting", "method", "NN", "Hungarian"], "l")]
        for st, v in dj["settings"].items():
            for n, x in v.items():
                L.append(f"| {st} | {n} | {_ci(x['nn'])} | {_ci(x['hungarian'])} |")
        L.append("")
    # 2. width
    w = _load(out, "width")
    if w:
        L += ["## Width: all-pairs exact W2 nearest neighbours", "",
              f"Synthetic layers (`saeot.width.synthetic_layers`), k = {w['params']['k']}, d = {w['params']['d']}, "
              f"{w['params']['candidates']} candidates per source and per target ({w['params']['prefilter']} "
              f"pre-filter), candidate search on `{w['params']['device']}`, exact W2 on "
              f"{w['params']['cpu_threads']} CPU threads. Recall = share of {w['params']['recall_sources']} random "
              "sources whose found NN has the exact NN's W2 (exact NN by lower-bound pruning = brute force; "
              "higher = better).", "",
              *markdown_head(["features", "exact W2 pairs", "embed s", "candidates s", "exact s", "total s",
                              "recall"], "l")]
        for F, x in w["widths"].items():
            s = x["seconds"]
            L.append(f"| {int(F):,} | {x['pairs_evaluated']:,} | {s['embed']:.1f} | {s['candidates']:.1f} | "
                     f"{s['exact']:.1f} | {s['total']:.1f} | {x.get('recall', float('nan')):.3f} |")
        L.append("")
    # 3. real model
    L += real_tables(out, p)
    return "\n".join(L) + "\n"
