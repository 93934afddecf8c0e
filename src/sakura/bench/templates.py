"""`sakura bench templates`: the phone profile once per template, to show how much the template's
content moves the equal-quality ratio (EXTRAPOLATED, like `sakura bench profile`).

`sakura bench profile` measures its renditions on one template (sticker-00, the hardest of the three
tasks for the transform codec: sharp copied edges that the DCT spreads). The bytes a layer costs at
the image floor (CacheGen level 3 on every shard) depend on the template: per task, the first
training template's real KV on the trained mini model gives each rendition's bits/value and image
MSE, and the same workloads, phones, traces, decode rates and policies run on them. Nothing else
changes between the templates, so the differences are the codec's (sakura's and CacheGen's bytes at
the template's own floor).

Writes `<out>/templates.json` (the per-template ladders and summaries), `<out>/templates.md` and
`<out>/templates.png` (equal-quality ratio per template and workload x phone, beside the ceiling).
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence
from sakura.util.fsutil import write_json
import statistics
from sakura.bench.profile import measure_ladder, run_profile

from sakura.bench.harness import get_logger, markdown_head

log = get_logger(__name__)

#: one template per task (the first training template of each; sticker-00 is the profile's own)
DEFAULT_TEMPLATES = ("look-00", "texture-00", "sticker-00")
#: the family where the equal-quality ratio is open (the slower families are link-bound at every
#: template: sakura computes most layers on the phone, so the ratio is ~1 there)
DEFAULT_FAMILIES = ("umn_5gophers",)


def floor_bits(ladder: dict) -> dict:
    """The bits/value each side pays at the template's image floor, as the ladder reports them: the
    CacheGen-L3 bits/value, and the cheapest sakura rendition whose per-shard image MSE is at or under
    the floor (None if none is; the runtime then mixes renditions and local layers)."""
    floor = ladder["floor_image_mse"]
    rs = ladder["renditions"]
    ok = [v["bits_per_value"] for k, v in rs.items()
          if k.startswith("progressive") and v["image_mse"] <= floor]
    return {"floor_image_mse": floor, "cachegen_L3_bits_per_value": rs["cachegen:level=3"]["bits_per_value"],
            "sakura_bits_per_value_at_floor": min(ok) if ok else None}


def run_templates(out_dir: str | Path, *, templates: Sequence[str] = DEFAULT_TEMPLATES,
                  families: Sequence[str] | None = DEFAULT_FAMILIES, workloads: Sequence[str] | None = None,
                  phones: Sequence[str] | None = None, traces_per_family: int = 0, jobs: int = 1,
                  rates_mbps: Sequence[float] | None = None,
                  model_name: str = "sakura-mini") -> dict:
    """`run_profile` once per template (renditions measured on that template); returns and writes the
    per-template summaries. The runs themselves are not kept (each template's full profile is
    `sakura bench profile` with that ladder)."""

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    per: dict[str, dict] = {}
    phone_names: list[str] = []
    for t in templates:
        log.info(f"== template {t}: measuring its renditions")
        ladder = measure_ladder(model_name, t)
        with tempfile.TemporaryDirectory(prefix="sakura-templates-") as tmp:
            r = run_profile(tmp, workloads=workloads, phones=phones, families=families,
                            traces_per_family=traces_per_family or None, model_name=model_name, ladder=ladder,
                            jobs=jobs,
                            **({} if rates_mbps is None else {"rates_mbps": tuple(rates_mbps)}))
        add_l3_ceiling(r["summary"], r["runs"])
        phone_names = [ph["name"] for ph in r["phones"]]
        per[t] = {"ladder": r["ladder"], "floor": floor_bits(r["ladder"]), "summary": r["summary"],
                  "family_checks": r["family_checks"], "runs": len(r["runs"])}
        c = r["family_checks"]["all"]
        log.info(f"   {len(r['runs'])} runs, {c['losing_runs']} losing, worst {c['worst_loss_ratio']:.3f}")
    result = {"mode": "phone profile per template (trace-driven simulation; EXTRAPOLATED)", "model": model_name,
              "templates": list(templates), "families": list(families) if families else None,
              "traces_per_family": traces_per_family, "phones": phone_names, "wall_s": time.perf_counter() - t0, "per_template": per}
    write_json((out / "templates.json"), result, indent=1, default=float)
    md = templates_markdown(result)
    (out / "templates.md").write_text(md)
    plot_templates(result, out / "templates.png")
    log.info(md)
    return result


def add_l3_ceiling(summary: dict, runs: list[dict]) -> None:
    """Adds `ceiling_vs_cachegen_L3` (median cachegen-L3 / oracle latency: the ratio with free, instant
    template KV) to every workload x phone x family entry of a profile summary, in place."""

    for s in summary.values():
        rs = [r for r in runs if r["workload"] == s["workload"] and r["phone"] == s["phone"]
              and s["family"] in ("all", r["family"])]
        s["ceiling_vs_cachegen_L3"] = statistics.median(r["cachegen-L3"]["latency_s"] / r["oracle"]["latency_s"]
                                                        for r in rs)


def _cells(result: dict) -> list[tuple[str, str, str]]:
    """(workload, phone, family) keys present for every template, in the first template's order."""
    first = next(iter(result["per_template"].values()))["summary"]
    keys = [(s["workload"], s["phone"], s["family"]) for s in first.values() if s["family"] != "all"]
    return [k for k in keys if all(f"{k[0]} | {k[1]} | {k[2]}" in p["summary"]
                                   for p in result["per_template"].values())]


def templates_markdown(result: dict) -> str:
    per = result["per_template"]
    lines = [f"Phone profile per template: {result['mode']}. Model `{result['model']}`; families "
             f"{', '.join(result['families'] or ['all'])} and the constant links; "
             f"{'every trace' if not result['traces_per_family'] else str(result['traces_per_family']) + ' traces per family'}; "
             f"{result['wall_s']:.0f} s. Each template's "
             "renditions (bits/value, per-shard image MSE) are measured on its own real KV; everything else is "
             "`sakura bench profile`'s.", "",
             "## Bytes at the image floor", "",
             *markdown_head(['template', 'floor (per-shard image MSE)', 'CacheGen-L3 bits/value', 'cheapest sakura rendition under the floor, bits/value', 'ratio', 'runs', 'losing runs', 'worst ratio'], 'lrrrrrrr')]
    for t, p in per.items():
        f = p["floor"]
        sb = f["sakura_bits_per_value_at_floor"]
        cg = f["cachegen_L3_bits_per_value"]
        c = p["family_checks"]["all"]
        lines.append(f"| {t} | {f['floor_image_mse']:.3g} | {f['cachegen_L3_bits_per_value']:.3f} | "
                     f"{'-' if sb is None else format(sb, '.3f')} | "
                     f"{'-' if sb is None else format(sb / cg, '.2f')} | {p['runs']} | "
                     f"{c['losing_runs']} | {c['worst_loss_ratio']:.3f} |")
    lines += ["", "## Equal quality per template", "",
              "cachegen-L3 / sakura latency, median (p10) over the family's runs (sakura at its default image floor, "
              "CacheGen held to level 3 on every shard, else recompute); the ceiling (cachegen-L3 / oracle with free, "
              "instant KV, median) beside; sakura's median PSNR vs the lossless-KV edit.", "",
              *markdown_head(["workload", "phone", "family", *per], "lll" + "l" * len(per))]
    for w, ph, fam in _cells(result):
        k = f"{w} | {ph} | {fam}"
        cells = []
        for p in per.values():
            s = p["summary"][k]
            eq = s["speedup_vs_cachegen-L3"]
            cells.append(f"{eq['median']:.2f} ({eq['p10']:.2f}), ceiling {s.get('ceiling_vs_cachegen_L3', math.nan):.2f}, "
                         f"{s['psnr_median_db']['sakura']:.1f} dB")
        lines.append(f"| {w} | {ph.split(' (')[0]} | {fam} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_templates(result: dict, path: Path) -> None:
    """Grouped bars: equal-quality ratio (median, p10 whisker) per workload x phone cell, one bar per
    template, the ceiling as a tick above each bar."""
    import matplotlib  # lazy: plots only: not imported by a run that draws nothing

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: plots only: not imported by a run that draws nothing

    per = result["per_template"]
    cells = _cells(result)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(cells) * len(per) / 2), 4.2))
    width = 0.8 / max(1, len(per))
    for j, (t, p) in enumerate(per.items()):
        xs = [i + (j - (len(per) - 1) / 2) * width for i in range(len(cells))]
        med = [p["summary"][f"{w} | {ph} | {fam}"]["speedup_vs_cachegen-L3"]["median"] for w, ph, fam in cells]
        p10 = [p["summary"][f"{w} | {ph} | {fam}"]["speedup_vs_cachegen-L3"]["p10"] for w, ph, fam in cells]
        ceil = [p["summary"][f"{w} | {ph} | {fam}"].get("ceiling_vs_cachegen_L3", math.nan) for w, ph, fam in cells]
        ax.bar(xs, med, width, label=t, yerr=[[m - q for m, q in zip(med, p10)], [0] * len(med)], capsize=2)
        ax.scatter(xs, ceil, marker="_", s=120, color="black", zorder=3)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(1.82, color="tab:red", lw=0.8, ls="--", label="seed's 1.82x")
    ax.set_xticks(range(len(cells)))
    ax.set_xticklabels([f"{w}\n{ph.split(' (')[0]}" for w, ph, _ in cells], fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("cachegen-L3 / sakura latency (median; p10 whisker)")
    ax.set_title("Equal quality per template (black tick: ceiling with free, instant KV)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
