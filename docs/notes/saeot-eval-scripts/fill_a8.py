# Regenerate the tables of docs/saeot.md section A8 from the result files (run from the repo root):
#   docs/saeot/eval/sae_report_r5.json (train-sae reports of runs/saes5-k96 and runs/saes5-l9, copied),
#   docs/saeot/eval/sae_report_r3.json (round 3, k = 64), docs/saeot/eval/sae_report.json (round 2),
#   docs/saeot/eval/sae3/eval_9_18.json and docs/saeot/eval/sae5/eval_9_18.json (saeot evaluate).
import json
from pathlib import Path

from docblock import block  # the script's own folder is on sys.path

E = Path("docs/saeot/eval")


# gather the train-sae reports when the SAE folders are here (they are git-ignored; the copy is committed)
R = Path("runs")
if (R / "saes5-l9" / "report.json").exists():
    r5 = {}
    for folder in ("saes5-l9", "saes5-k96", "saes5-k128"):
        if not (R / folder / "report.json").exists():
            continue
        for l, r in json.loads((R / folder / "report.json").read_text()).items():
            cfg = json.loads((R / folder / f"layer_{l}" / "cfg.json").read_text())
            r.setdefault("d_sae", cfg["d_sae"])
            r.setdefault("k", cfg.get("k") or cfg.get("metadata", {}).get("k") or 64)
            r["folder"] = f"runs/{folder}"
            r5[l if folder == "saes5-l9" else f"{l}/k{r['k']}"] = r
    (E / "sae_report_r5.json").write_text(json.dumps(r5, indent=1))

r2 = json.loads((E / "sae_report.json").read_text())
r3 = json.loads((E / "sae_report_r3.json").read_text())
r5 = json.loads((E / "sae_report_r5.json").read_text())
rows = ["| layer | recipe | train tokens | k (L0) | FVU val | FVU test | FVU val + test | FVU train tokens | dead (held-out) | "
        "earlier: k = 64, val + test | <= 0.15 on val? | on test? |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|"]
for key in sorted(r5, key=lambda x: (int(x.split("/")[0]), x)):
    r = r5[key]
    l = key.split("/")[0]
    old = r3.get(l) if r["extra_acts"] else r2.get(l)
    rows.append(f"| {l} | {r['steps']:,} steps, batch {r['batch_size']}, {r['d_sae']:,} features | {r['train_tokens']:,} | "
                f"{r['k']} ({r['l0']:.1f}) | {r['fvu_val']:.4f} | {r['fvu_test']:.4f} | {r['fvu']:.3f} | "
                f"{r['fvu_train']:.3f} | {r['dead_frac']:.1%} | {old['fvu']:.3f} ({'round 3' if r['extra_acts'] else 'round 2'}) | "
                f"{'yes' if r['fvu_val'] <= 0.15 else 'no'} | {'yes' if r['fvu_test'] <= 0.15 else 'no'} |")
block("a8-sae", "\n".join(rows))

new_p = E / "sae5" / "eval_9_18.json"
if new_p.exists():
    old = json.loads((E / "sae3" / "eval_9_18.json").read_text())["pairs"]["9->18"]["settings"]["shared"]
    new = json.loads(new_p.read_text())["pairs"]["9->18"]["settings"]["shared"]
    cfg = "ot[standardise+unit,exact,k32,c32,none]"
    names = {"judge": "MiniLM judge", "jaccard": "held-out Jaccard", "rel_effect": "intervention rel. effect",
             "hit10": "intervention hit@10"}

    def cell(x):
        return f"{x['mean']:+.3f} [{x['lo']:+.3f}, {x['hi']:+.3f}] {x['verdict']}" if x and "verdict" in x else "n/a"

    def score(s, m, strat):
        x = s["summary"][cfg][strat]["test"][m]
        return f"{x['mean']:.3f} [{x['lo']:.3f}, {x['hi']:.3f}]"

    rows = ["| strategy | metric | OT, round-3 SAEs | OT, round-5 SAEs | baseline | OT - baseline, round-3 SAEs | "
            "OT - baseline, round-5 SAEs | verdict changed? |", "|---|---|---|---|---|---|---|---|"]
    changed = 0
    for strat in ("nn", "mutual"):
        for base in ("decoder-cosine", "sae-match", "act-corr"):
            for m in names:
                a = old["paired"][cfg][base][strat]["test"].get(m)
                b = new["paired"][cfg][base][strat]["test"].get(m)
                va, vb = (a or {}).get("verdict"), (b or {}).get("verdict")
                ch = "**yes**" if va != vb else "no"
                changed += va != vb
                rows.append(f"| {strat} | {names[m]} | {score(old, m, strat)} | {score(new, m, strat)} | {base} | "
                            f"{cell(a)} | {cell(b)} | {ch} |")
    hub_o, hub_n = old["hubs"][cfg]["nn"], new["hubs"][cfg]["nn"]
    rows += ["", f"{changed} of {len(rows) - 2} paired verdicts changed. Hubs (NN, all fit-alive sources): max / p99 in-degree "
             f"{hub_o['max_in_degree']} / {hub_o['p99_in_degree']:.0f} (round 3) -> {hub_n['max_in_degree']} / "
             f"{hub_n['p99_in_degree']:.0f} (round 5); distinct targets {hub_o['distinct_targets']} -> "
             f"{hub_n['distinct_targets']}. Evaluation time {old['seconds']:.0f} s (6 configurations) -> "
             f"{new['seconds']:.0f} s (1)."]
    block("a8-eval", "\n".join(rows))

# the other distant pairs that use the deep layers (eval5_rest.sh): verdicts of the default configuration,
# round-3 SAEs (docs/saeot/eval/sae3/) -> round-5 SAEs (docs/saeot/eval/sae5/), per baseline x strategy x metric
PAIRS = [("0", "18"), ("3", "12"), ("6", "15")]
if all((E / "sae5" / f"eval_{a}_{b}.json").exists() for a, b in PAIRS):
    cfg = "ot[standardise+unit,exact,k32,c32,none]"
    metrics = ("judge", "jaccard", "rel_effect", "hit10")
    arrow = lambda va, vb: (f"{va} -> **{vb}**" if va != vb else f"{vb}")  # noqa: E731
    rows = ["| pair | baseline | strategy | MiniLM judge | held-out Jaccard | intervention rel. effect | intervention hit@10 |",
            "|---|---|---|---|---|---|---|"]
    tally = {"changed": 0, "total": 0, "lost": 0, "gained": 0}
    rank = {"loss": 0, "tie": 1, "win": 2}
    secs = []
    for a, b in PAIRS:
        key = f"{a}->{b}"
        old = json.loads((E / "sae3" / f"eval_{a}_{b}.json").read_text())["pairs"][key]["settings"]["shared"]
        new = json.loads((E / "sae5" / f"eval_{a}_{b}.json").read_text())["pairs"][key]["settings"]["shared"]
        secs.append(f"{key} {new['seconds']:.0f} s")
        for base in ("decoder-cosine", "sae-match", "act-corr"):
            for strat in ("nn", "mutual"):
                cells = []
                for m in metrics:
                    x = old["paired"][cfg][base][strat]["test"].get(m) or {}
                    y = new["paired"][cfg][base][strat]["test"].get(m) or {}
                    va, vb = x.get("verdict", "n/a"), y.get("verdict", "n/a")
                    tally["total"] += 1
                    if va != vb:
                        tally["changed"] += 1
                        if va in rank and vb in rank:
                            tally["gained" if rank[vb] > rank[va] else "lost"] += 1
                    ok = "mean" in y and y["mean"] == y["mean"]  # nan: no source had a match of this kind
                    mean = f" ({y['mean']:+.3f} [{y['lo']:+.3f}, {y['hi']:+.3f}])" if ok else " (no matched sources)"
                    cells.append(arrow(va, vb) + mean)
                rows.append(f"| {key} | {base} | {strat} | " + " | ".join(cells) + " |")
    rows += ["", f"{tally['changed']} of {tally['total']} paired verdicts changed ({tally['gained']} towards OT, "
             f"{tally['lost']} against it); cells: round-3 verdict -> round-5 verdict where it changed, and the round-5 "
             f"OT - baseline interval. Evaluation time (1 configuration): {', '.join(secs)}."]
    block("a8-pairs", "\n".join(rows))
