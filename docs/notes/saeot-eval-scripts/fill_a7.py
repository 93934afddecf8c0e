# Regenerate the tables of docs/saeot.md section A7 from the result files (run from the repo root):
#   docs/saeot/speed_r4.json (speed4.py), docs/saeot/eval/sae_report_r{3,4}.json (train-sae reports),
#   docs/saeot/eval/sinkhorn/eval_9_18.md (saeot evaluate), runs/acts-extra*/manifest.json when present.
import json
from pathlib import Path

from docblock import block  # the script's own folder is on sys.path


sp = json.loads(Path("docs/saeot/speed_r4.json").read_text())
pf = sp["prefilter_s"]
rows = ["| solver | threads | pairs | total wall | total CPU | of which pre-filter (CPU) | recall of the exact NN | load |",
        "|---|---|---|---|---|---|---|---|"]
for r in sp["runs"]:
    name = "numba transport simplex" if r["solver"] == "numba" else "POT network simplex"
    rows.append(f"| {name} | {r['threads']} | {sp['pairs']:,} | {r['total_wall_s']:.1f} s | {r['total_cpu_s']:.1f} s | "
                f"{pf['cpu']:.1f} s | {r['recall']:.3f} ({sp['recall_sources']} sources) | {r['load']:.1f} |")
rows += ["", f"max |W2 numba - W2 POT| over the {sp['pairs']:,} pairs: {sp['max_abs_w2_numba_minus_pot']:.1e}; "
         f"2 threads give the same values as 1: {sp['numba_2_threads_equals_1']}."]
block("a7-speed", "\n".join(rows))

r3 = json.loads(Path("docs/saeot/eval/sae_report_r3.json").read_text())
p4 = Path("docs/saeot/eval/sae_report_r4.json")
r4 = json.loads(p4.read_text()) if p4.exists() else {}
rows = ["| layer | round 3: held-out FVU (train tokens) | round 4: held-out FVU | round 4: FVU on train tokens | round 4 train tokens | <= 0.15? |",
        "|---|---|---|---|---|---|"]
for l in sorted(set(r3) | set(r4), key=int):
    a, b = r3.get(l), r4.get(l)
    rows.append(f"| {l} | {a['fvu']:.3f} ({a['train_tokens']:,}) | " + (
        f"{b['fvu']:.3f} | {b['fvu_train']:.3f} | {b['train_tokens']:,} | {'yes' if b['fvu'] <= 0.15 else 'no'} |"
        if b else "not trained: stopped once layer 18 showed no gain | - | - | - |"))
for m in sorted(Path("runs").glob("acts-extra*/manifest.json")):
    man = json.loads(m.read_text())
    rows.append("")
    rows.append(f"`{m.parent}`: {man['n_chunks']} chunks x {man['ctx_len']} = {man['n_chunks'] * man['ctx_len']:,} "
                f"tokens, layers {man['layers']}.")
block("a7-sae", "\n".join(rows))

md = Path("docs/saeot/eval/sinkhorn/eval_9_18.md")
if md.exists():
    block("a7-sinkhorn", md.read_text())

# debiased Sinkhorn - exact W2 on the same candidates, paired over the same judged sources (test split, NN)
ej = Path("docs/saeot/eval/sinkhorn/eval_9_18.json")
if ej.exists():
    from saeot.stats import fmt_paired, paired_bootstrap

    s = json.loads(ej.read_text())["pairs"]["9->18"]["settings"]["shared"]
    deb, ex = s["configs"] if "configs" in s else list(s["scores"])[:2]
    rows = ["| metric (test split, NN) | debiased Sinkhorn | exact W2 | debiased - exact (paired 95% bootstrap) |",
            "|---|---|---|---|"]
    for m, name in (("judge", "MiniLM judge"), ("jaccard", "held-out Jaccard"), ("rel_effect", "intervention rel. effect"),
                    ("hit10", "intervention hit@10")):
        a, b = s["summary"][deb]["nn"]["test"].get(m), s["summary"][ex]["nn"]["test"].get(m)
        if a is None or b is None:
            continue
        pb = paired_bootstrap(s["scores"][deb]["nn"]["test"][m], s["scores"][ex]["nn"]["test"][m])
        rows.append(f"| {name} | {a['mean']:.3f} [{a['lo']:.3f}, {a['hi']:.3f}] | {b['mean']:.3f} [{b['lo']:.3f}, "
                    f"{b['hi']:.3f}] | {fmt_paired(pb)} |")
    info = s["ot_info"][deb]
    rows += ["", f"Distances: debiased Sinkhorn {s['fit_seconds'][deb]:.0f} s, exact {s['fit_seconds'][ex]:.0f} s wall "
             f"for {info['evaluated_pairs']:,} candidate pairs (load ~4-6); epsilon {info['eps']:.3f}, "
             f"{info['not_converged']} problems not converged to marginal error {info['tol']:g}. "
             f"Exact W2's NN equals debiased Sinkhorn's for {s['agree_with_first_ot_nn'][ex]:.1%} of the sources."]
    block("a7-sinkhorn-vs-exact", "\n".join(rows))

# the published bench (saeot bench-speed): exact on 32+32 bound-mid candidates, this round against round 3
rows = ["| `saeot bench-speed` run | exact solver | pairs | wall | CPU | recall (bench's sources) |", "|---|---|---|---|---|---|"]
for f, label, solver in (("docs/saeot/speed_r3.json", "round 3", "POT, 2 processes"),
                         ("docs/saeot/speed_r4_bench.json", "this pass", "numba, 2 threads")):
    r = json.loads(Path(f).read_text())["spaces"]["reference"]
    b = r["by_prefilter"]["bound-mid"]
    n_src = json.loads(Path(f).read_text()).get("recall_sources", 32)
    rows.append(f"| {label} (`{f}`) | {solver} | {b['pairs']:,} (c = {b['timed_candidates']}) | {b['exact_s']:.1f} s | "
                f"{b['exact_cpu_s']:.1f} s | {b['recall']:.2f} |")
block("a7-bench", "\n".join(rows))

# the pairs rerun on the round-3 SAEs (saeot summarize docs/saeot/eval/sae3/eval_*.json --select-pairs 9:18
#   --out docs/saeot/eval/sae3/summary.md)
sm = Path("docs/saeot/eval/sae3/summary.md")
if sm.exists():
    t = "\n".join(l for l in sm.read_text().splitlines() if not l.startswith("Validation means by configuration"))
    block("a7-r3pairs", t)
