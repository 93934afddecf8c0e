"""A static, self-contained HTML report: matched feature pairs with their top contexts side by side,
scores from every method, the supernode graph and the benchmark plots (embedded)."""

from __future__ import annotations

import base64
import html
from pathlib import Path

import numpy as np

from saeot.fsutil import atomic_write

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1200px;color:#222}
h1{font-size:1.4em} h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;font-size:.9em} td,th{border:1px solid #ddd;padding:3px 7px;text-align:right}
th{background:#f4f4f4} td.l{text-align:left}
.pair{display:grid;grid-template-columns:1fr 1fr;gap:10px;border:1px solid #ccc;border-radius:6px;
 padding:8px;margin:10px 0} .pair h3{font-size:.95em;margin:.2em 0}
.ctx{font-family:ui-monospace,monospace;font-size:.8em;white-space:pre-wrap;background:#fafafa;
 margin:2px 0;padding:2px 4px;border-left:3px solid #9bc} mark{background:#fd6;font-weight:bold}
.scores{grid-column:1 / span 2;font-size:.85em}
"""


def _context(tokens: np.ndarray, chunk: np.ndarray, p: int, decode, before: int = 10, after: int = 3) -> str:
    lo, hi = p, p
    while lo > 0 and p - lo < before and chunk[lo - 1] == chunk[p]:
        lo -= 1
    while hi + 1 < len(tokens) and hi - p < after and chunk[hi + 1] == chunk[p]:
        hi += 1
    parts = []
    for q in range(lo, hi + 1):
        t = html.escape(decode([int(tokens[q])]))
        parts.append(f"<mark>{t}</mark>" if q == p else t)
    return "".join(parts)


def _img(path: Path | None) -> str:
    if path is None or not Path(path).exists():
        return ""
    b = base64.b64encode(Path(path).read_bytes()).decode()
    return f'<p><img alt="{html.escape(Path(path).name)}" src="data:image/png;base64,{b}" style="max-width:100%"></p>'


def supernode_svg(graph: dict, width: int = 900, height: int = 420) -> str:
    """Layered SVG drawing of a supernode graph ({"nodes": [...], "edges": [...]})."""
    nodes = graph.get("nodes", [])
    if not nodes:
        return "<p>(no supernode graph)</p>"
    layers = sorted({n["layer"] for n in nodes})
    pos = {}
    for li, l in enumerate(layers):
        col = [n for n in nodes if n["layer"] == l]
        for r, n in enumerate(col):
            x = 80 + li * (width - 160) / max(1, len(layers) - 1)
            y = 40 + r * (height - 80) / max(1, len(col) - 1) if len(col) > 1 else height / 2
            pos[n["id"]] = (x, y)
    wmax = max([abs(e["weight"]) for e in graph["edges"]] + [1e-12])
    smax = max(abs(n["score"]) for n in nodes) or 1.0
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="supernode graph">']
    for e in sorted(graph["edges"], key=lambda e: abs(e["weight"]))[-60:]:
        (x1, y1), (x2, y2) = pos[e["src"]], pos[e["dst"]]
        w = 0.5 + 5 * abs(e["weight"]) / wmax
        col = "#c33" if e["weight"] > 0 else "#36c"
        out.append(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{col}" '
                   f'stroke-width="{w:.2f}" opacity="0.5"><title>{e["src"]}→{e["dst"]}: {e["weight"]:.3g}</title></line>')
    for n in nodes:
        x, y = pos[n["id"]]
        r = 5 + 14 * abs(n["score"]) / smax
        col = "#e85" if n["score"] > 0 else "#58c"
        mem = ", ".join(str(m) for m in n["members"])
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" fill="{col}" stroke="#333">'
                   f'<title>{n["id"]} (layer {n["layer"]}): features {mem}; attribution {n["score"]:.3g}</title></circle>')
        out.append(f'<text x="{x + r + 3:.1f}" y="{y + 4:.1f}" font-size="10">{html.escape(n["id"])} '
                   f'({len(n["members"])})</text>')
    for li, l in enumerate(layers):
        x = 80 + li * (width - 160) / max(1, len(layers) - 1)
        out.append(f'<text x="{x:.1f}" y="16" font-size="12" text-anchor="middle">layer {l}</text>')
    out.append("</svg>")
    return "".join(out)


CO_FIRING = {"act-corr": "activation correlation: needs the same tokens, rewards co-firing",
             "ot": "OT in the reference space: both distributions sit on the same tokens' embeddings, so on "
                   "shared tokens two features that fire on the same tokens are at W2 = 0 (co-firing), and only "
                   "the disjoint-token setting of `saeot evaluate` isolates the geometry"}
WEIGHTS_ONLY = ("decoder-cosine", "sae-match", "sae-match-folded")

METHODS_EXPLAINED = (
    "What the columns mean: <b>top-token Jaccard</b> = overlap (0 to 1) of the token ids at the two matched "
    "features' 10 most activating positions, averaged over matched pairs: <b>higher = the matches fire on the "
    "same words</b>. It is measured on the same tokens the distances were computed from, so it favours methods "
    "that see co-firing: <b>act-corr and OT share that signal</b>; decoder-cosine, sae-match and "
    "sae-match-folded (SAE-Match as published: folded thresholds, one-to-one) see only SAE weights. "
    "<b>seconds</b> = wall time to compute the method's distances and match (lower = cheaper). For held-out "
    "judgements and the disjoint-token setting use <code>saeot evaluate</code> / <code>saeot reproduce</code>.")

GRAPH_LEGEND = (
    "Legend: one column per layer; a circle is a supernode (a group of circuit features merged by OT distance), "
    "labelled id (number of member features); circle area grows with |attribution| (gradient x activation "
    "toward the answer); orange = positive attribution (supports the answer), blue = negative. A line is the "
    "attribution from one supernode to a later one: red = positive, blue = negative, width grows with |weight| "
    "(the 60 strongest are drawn). Hover for members and values.")


def summary_verdict(summary: list[dict]) -> list[str]:
    """Plain sentences about the methods table: per pair, which method has the highest Jaccard and at
    what time relative to OT, and why a table of near-zero Jaccards is near zero."""
    out = []
    for pair in dict.fromkeys(r["pair"] for r in summary):
        rows = [r for r in summary if r["pair"] == pair and r.get("top-token Jaccard") == r.get("top-token Jaccard")]
        if not rows:
            continue
        best = max(rows, key=lambda r: r["top-token Jaccard"])
        ot = next((r for r in rows if r["method"] == "ot"), None)
        if max(r["top-token Jaccard"] for r in rows) < 0.02:
            out.append(f"{pair}: every method's Jaccard is below 0.02, i.e. no matched pair shares its top tokens. "
                       "That is what a model without learned features gives (the tiny random model), or too few "
                       "tokens per feature; it says nothing about which method is better.")
            continue
        if ot is None:
            continue
        if best["method"] == "ot":
            out.append(f"{pair}: OT has the highest Jaccard ({ot['top-token Jaccard']:.3f}).")
        else:
            ratio = ot["seconds"] / max(best["seconds"], 1e-9)
            out.append(f"{pair}: {best['method']} has a higher Jaccard than OT ({best['top-token Jaccard']:.3f} vs "
                       f"{ot['top-token Jaccard']:.3f}) at {ratio:.0f}x less time"
                       + (" (it shares OT's co-firing signal)" if best["method"] in CO_FIRING else "") + ".")
    return out


def write_report(path: Path, *, title: str, tokens: np.ndarray, chunk: np.ndarray, decode,
                 pairs: list[dict], summary: list[dict], compression: dict | None = None,
                 plots: list[Path] = (), notes: str = "") -> Path:
    """Write the HTML report atomically.

    Parameters
    ----------
    tokens, chunk : (n_tokens,) corpus token ids and chunk ids (from the activation cache)
    decode : callable(list[int]) -> str
    pairs : list of dict
        One section per layer pair: {"title", "layer_a", "layer_b", "methods": [names],
        "rows": [{"a": i, "b": j, "ctx_a": [positions], "ctx_b": [positions],
        "scores": {method: distance}, "agree": {method: bool}}]}.
    summary : list of dict   rows of the methods table (keys become columns)
    compression : dict, optional   output of :func:`saeot.compress.run_compression`
    """
    h = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
         f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>"]
    if notes:
        h.append(f"<p>{html.escape(notes)}</p>")
    if summary:
        cols = list(summary[0])
        h.append("<h2>Methods</h2><table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in cols) + "</tr>")
        for r in summary:
            h.append("<tr>" + "".join(
                f"<td class='l'>{html.escape(str(r[c]))}</td>" if isinstance(r[c], str)
                else f"<td>{r[c]:.3f}</td>" if isinstance(r[c], float) else f"<td>{r[c]}</td>" for c in cols) + "</tr>")
        h.append("</table>")
        h.append(f"<p class='explain'>{METHODS_EXPLAINED}</p>")
        verdicts = summary_verdict(summary)
        if verdicts:
            h.append("<ul class='verdict'>" + "".join(f"<li>{html.escape(v)}</li>" for v in verdicts) + "</ul>")
    for sec in pairs:
        h.append(f"<h2>{html.escape(sec['title'])}</h2>")
        for row in sec["rows"]:
            h.append("<div class='pair'>")
            for side, lay in (("a", sec["layer_a"]), ("b", sec["layer_b"])):
                h.append(f"<div><h3>layer {lay} feature {row[side]}</h3>")
                for p in row[f"ctx_{side}"]:
                    h.append(f"<div class='ctx'>{_context(tokens, chunk, int(p), decode)}</div>")
                h.append("</div>")
            sc = " · ".join(f"{html.escape(m)}: {row['scores'][m]:.3f}"
                            + (" ✓" if row["agree"].get(m) else "") for m in sec["methods"])
            h.append(f"<div class='scores'>distances (lower = more similar) — {sc} (✓ = that method's own nearest "
                     "neighbour too)</div></div>")
    if compression:
        h.append(f"<h2>Circuit compression ({html.escape(str(compression.get('task', 'addition')))})</h2>")
        h.append(f"<p>Unmodified model: accuracy {compression['clean']['accuracy']:.3f}, "
                 f"logit difference {compression['clean']['logit_diff']:.3f}. Circuit: "
                 f"{compression['n_nodes']} features per layer at layers {compression['layers']}.</p>")
        h.append("<table><tr><th>supernodes / layer</th>" + "".join(
            f"<th>{html.escape(m)} acc</th><th>{html.escape(m)} logit diff</th>" for m in compression["methods"]) + "</tr>")
        for i, S in enumerate(compression["counts"]):
            h.append(f"<tr><td>{S}</td>" + "".join(
                f"<td>{r[i]['accuracy']:.3f}</td><td>{r[i]['logit_diff']:.3f}</td>"
                for r in compression["methods"].values()) + "</tr>")
        h.append("</table>")
        h.append("<p class='explain'>Accuracy = share of the task's prompts answered correctly when every "
                 "layer's circuit features are replaced by that many supernodes (higher = the compressed circuit "
                 "is more faithful); logit difference = correct answer's logit minus the best wrong digit's "
                 "(higher = more confident).</p>")
        accs = [r[i]["accuracy"] for r in compression["methods"].values() for i in range(len(compression["counts"]))]
        if compression["clean"]["accuracy"] == 0 or (accs and max(accs) == 0):
            h.append(f"<p class='explain'><b>Why the accuracies are 0</b>: the unmodified model answers "
                     f"{compression['clean']['accuracy']:.0%} of the prompts correctly, so no reduced circuit can do "
                     "better; expected for a model that cannot do the task (the tiny random model). Compare methods "
                     "by logit difference there, or use a model that does the task (Gemma-3-270M: 80% 4-shot).</p>")
        h.append("<h3>Supernode graph (OT grouping)</h3>")
        h.append(f"<p class='explain'>{GRAPH_LEGEND}</p>")
        h.append(supernode_svg(compression.get("graphs", {})))
    for p in plots:
        h.append(_img(p))
    h.append("</body></html>")

    return atomic_write(path, "".join(h).encode("utf-8"))


def pair_rows(A, B, results: dict, n_pairs: int = 20, n_ctx: int = 4) -> tuple[list[str], list[dict]]:
    """Rows for :func:`write_report` from :func:`saeot.pipeline.compare_methods` results: the
    ``n_pairs`` closest OT matches, with every method's distance for the same pair."""
    ot = results["ot"].matching
    order = np.argsort(ot.dist, kind="stable")[:n_pairs]
    nn = {m: dict(zip(r.matching.src.tolist(), r.matching.tgt.tolist())) for m, r in results.items()}
    rows = []
    for o in order:
        i, j = int(ot.src[o]), int(ot.tgt[o])
        rows.append({"a": i, "b": j,
                     "ctx_a": [p for p in A.dists.index[i, :n_ctx] if p >= 0],
                     "ctx_b": [p for p in B.dists.index[j, :n_ctx] if p >= 0],
                     "scores": {m: float(r.D[i, j]) for m, r in results.items()},
                     "agree": {m: nn[m].get(i) == j for m in results}})
    return list(results), rows
