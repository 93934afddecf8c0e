"""docs/results.md, generated from the JSON the benchmarks write (`sakura bench results`).

Every table of the results page is read from a benchmark's own output file under docs/ and printed
with the command that reproduces it, so a figure changes only when the benchmark is rerun: nothing
in results.md is typed by hand. `sakura bench ...` regenerates the page after every benchmark run
from the repository root (sakura/cli/main.py); `sakura bench results --check` fails when the committed
page differs from what the committed JSON gives (a test runs it).

A section whose file is missing says which command writes it; one whose file no longer has the
fields read here says so (a benchmark changed its output: update the section below).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from sakura.util.psnr import psnr_db as _psnr  # dependency-free (math only)
from sakura.bench.workloads import PHONES, WORKLOADS, ceilings, workload_costs
from sakura.emulation.traces import describe_trace

MODES = ("Every figure says where it comes from: **live** = real execution on the machine that ran the bench "
         "(CPU, shared, 1 torch thread); **live, time-dilated** = the real runtime at a phone workload's times "
         "divided by D; **phone profile** = the runtime's own driver on a virtual clock with published model "
         "shapes and phone speeds (an EXTRAPOLATION). Ratios are taken pair by pair in one run; the load average "
         "of the run is in its JSON. Context, caveats and what each figure means: the linked docs.")


@dataclass
class Section:
    title: str
    command: str                 # what reproduces the table (run from the repository root)
    sources: tuple[str, ...]     # files under docs/ the table is read from
    body: Callable[[Path], str]  # docs folder -> markdown
    see: str = ""                # where the discussion lives


def _load(docs: Path, rel: str) -> Any:
    return json.loads((docs / rel).read_text())


def _f(x: Any, fmt: str = ".2f", suffix: str = "") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:{fmt}}{suffix}"


def _range(xs, fmt: str = ".2f") -> str:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    if not xs:
        return "-"
    lo, hi = min(xs), max(xs)
    return _f(lo, fmt) if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{_f(lo, fmt)}..{_f(hi, fmt)}"


def _table(head: list[str], rows: list[list[str]], align: str = "") -> str:
    al = align or "l" + "r" * (len(head) - 1)
    sep = ["---:" if a == "r" else "---" for a in al]
    return "\n".join(["| " + " | ".join(head) + " |", "| " + " | ".join(sep) + " |"]
                     + ["| " + " | ".join(r) + " |" for r in rows])


# ------------------------------------------------------------------------------------ sections
def quality(docs: Path) -> str:
    models = {"sakura-mini": "model/quality.json", "flux2-mini": "model-flux2/quality.json"}
    data = {m: {t["task"]: t for t in _load(docs, p)["tasks"]} for m, p in models.items()}
    rows = []
    for task in data["sakura-mini"]:
        cells = [task]
        for m in models:
            t = data[m].get(task)
            cells.append("-" if t is None else f"{t['psnr']['model']:.1f} dB ({t['gain_db']:+.1f})")
        t = data["sakura-mini"][task]
        cells += [f"{t['psnr']['identity']:.1f} dB",
                  " / ".join(_f(data[m][task]["psnr"]["swapped"], ".1f", " dB") for m in models if task in data[m])]
        rows.append(cells)
    return ("Held-out photos x held-out templates, lossless KV, PSNR vs exact ground truth (in brackets: gain over "
            "the identity edit).\n\n"
            + _table(["task", "sakura-mini (gain)", "flux2-mini (gain)", "identity", "swapped template (mini / flux2)"],
                     rows))


def isolation(docs: Path) -> str:
    stock = {t["task"]: t for t in _load(docs, "model-flux2/isolation.json")["tasks"]}
    ft_path = docs / "model-flux2" / "isolation_finetuned.json"
    ft = {t["task"]: t for t in json.loads(ft_path.read_text())["tasks"]} if ft_path.is_file() else {}
    rows = []
    for task, t in stock.items():
        f = ft.get(task)
        rows.append([task, _f(t["stock_vs_gt"], ".1f", " dB"), _f(t["cached_vs_gt"], ".1f", " dB"),
                     _f(t["cost_db"], ".1f", " dB"),
                     "-" if f is None else _f(f["cached_vs_gt"], ".1f", " dB"),
                     "-" if f is None else _f(t["stock_vs_gt"] - f["cached_vs_gt"], ".1f", " dB"),
                     _f(t["identity_vs_gt"], ".1f", " dB")])
    return ("flux2-mini trained with stock (non-isolated) multi-reference attention (the photo as a second reference, "
            "as in stock Klein), edited with sakura's cached, isolated template KV; PSNR vs ground truth. The cost is "
            "against the stock checkpoint's own (non-isolated) edit, before and after a 200-step isolation fine-tune "
            "(model-flux2/isolation_finetuned.json).\n\n"
            + _table(["task", "stock: own edit", "stock: cached isolated KV", "cost", "fine-tuned: cached isolated KV",
                      "cost", "identity"], rows))


def codec(docs: Path) -> str:
    res = _load(docs, "codec/results.json")
    rows = []
    for task, s in res["summary"].items():
        cg, cgd = s["cachegen"], s["cachegen+delta"]
        rows.append([task, f"{_f(cg['median_ratio'])} ({_f(cg['max_ratio'])}), n={cg['points']}",
                     f"{_f(cgd['median_ratio'])} ({_f(cgd['max_ratio'])}), n={cgd['points']}",
                     _range(s["rung0_delta_psnr_vs_gt_db"], "+.2f") + " dB",
                     _range(s.get("whole_ratio_vs_fp16", []))])
    return (f"`{res['model']}`, held-out templates x {res['photos']} held-out photos, {res['steps']} steps, tables "
            "always counted. Byte ratios sakura (`progressive`) / CacheGen at equal image PSNR, median (worst).\n\n"
            + _table(["task", "vs CacheGen (levels 1-3)", "vs CacheGen with token deltas",
                      "lowest rung vs lossless, PSNR vs ground truth", "whole template / one fp16 copy"], rows, "lllll"))


def both_models(docs: Path) -> str:
    data = _load(docs, "codec/both_models.json")
    rows = []
    for key, lad in data.items():
        r = lad["renditions"]
        l3 = r["cachegen:level=3"]
        p3 = _psnr(l3["image_mse"])
        prog = sorted(((n, x) for n, x in r.items() if n.startswith("progressive")), key=lambda nx: nx[1]["bits_per_value"])
        reach = next(((n, x) for n, x in prog if _psnr(x["image_mse"]) >= p3), prog[-1] if prog else None)
        model, tpl = key.split("/", 1)
        if reach is None:
            continue
        n, x = reach
        rows.append([model, tpl, f"{l3['bits_per_value']:.2f} b/v at {p3:.1f} dB",
                     f"`{n}`: {x['bits_per_value']:.2f} b/v at {_psnr(x['image_mse']):.1f} dB",
                     f"{x['bits_per_value'] / l3['bits_per_value']:.2f}x"])
    return ("One shard at a time (the edit with ONE shard replaced by the rendition vs the lossless-KV edit, mean over "
            "the shards), training templates `*-00`: CacheGen level 3 and the cheapest progressive rung that reaches "
            "its PSNR (or the top rung). Every rendition: docs/codec/both_models.md.\n\n"
            + _table(["model", "template", "CacheGen L3", "progressive", "bits vs L3"], rows, "llllr"))


#: the decode-rate calibration the package ships (package data), as a path from docs/
DECODE_RATES_REL = "../src/sakura/assets/decode_rates.json"


def decode(docs: Path) -> str:
    d = _load(docs, DECODE_RATES_REL)
    tg = d["targets"]
    names = [t for t in ("host", "phone") if t in tg]
    by = {t: {(r["rendition"], r["tokens"], r["workers"]): r for r in tg[t]["rows"]} for t in names}
    rows = []
    for (name, tokens, workers), r in by[names[0]].items():
        if workers != 1:
            continue
        cells = [f"`{name}`", str(tokens), _f(r["bits_per_value"])]
        for t in names:
            x = by[t].get((name, tokens, 1))
            cells.append(_f(x["fp16_bytes_per_cpu_s"] / 1e6 if x else None, ".0f"))
        cells.append(_f(None if r.get("reference_fp16_bytes_per_cpu_s") is None
                        else r["reference_fp16_bytes_per_cpu_s"] / 1e6, ".1f"))
        for t in names:
            two = by[t].get((name, tokens, 2))
            cells.append(_f(two["speedup_vs_1_worker"] if two else None))
        rows.append(cells)
    label = {"host": "host", "phone": "phone-class"}
    load = d["machine"].get("loadavg_at_start")
    sp = "; ".join(f"{label[t]} **{_f(tg[t]['scaling']['speedup_by_workers'].get('2'))}x**" for t in names)
    return (f"Klein-sized layers (K and V, tokens x 24 x 128), {d['date']}, {d['machine']['cpus']} CPUs "
            f"{d['machine'].get('cpu', '')}, load {_f(load[0], '.1f') if load else '-'} at start. MB/s = fp16 KV per "
            "CPU-second of one decode worker; **host** = numba code for this CPU with its AVX-512 vector kernels, "
            "**phone-class** = the 128-bit proxy every phone figure uses (numba code for x86-64-v2, portable "
            f"kernels), measured side by side in one run. Two workers vs one (median over the native renditions): {sp}."
            "\n\n" + _table(["rendition", "tokens", "bits/value"] + [f"{label[t]} MB/s per core" for t in names]
                             + ["reference decoder MB/s"] + [f"{label[t]}: 2 workers vs 1" for t in names], rows))


def workloads(docs: Path) -> str:

    rows = []
    for w in WORKLOADS:
        c = ceilings(workload_costs(w, PHONES[1]))
        rows.append([w.name, f"{c['vs on-device']:.2f}x", f"{c['vs on-device-nocache']:.2f}x"])
    return (f"Ceilings: the speedup with free, instant template KV (phone {PHONES[1].name}); pure arithmetic on cited "
            "figures (sakura.bench.workloads), text encoder and VAE counted for every method.\n\n"
            + _table(["workload", "vs on-device", "vs on-device-nocache"], rows))


PROFILE_ROWS = (("style3x1024-out512", 0), ("style3x1024-out512", 1), ("style3x1024-out512", 2),
                ("template1024-out512", 1), ("klein4b-1024", 1), ("klein4b-base-1024", 1))


def profile(docs: Path) -> str:
    p = _load(docs, "e2e/e2e_profile.json")
    phones = [ph["name"] for ph in p["phones"]]
    rows = []
    for w, i in PROFILE_ROWS:
        s = p["summary"].get(f"{w} | {phones[i]} | umn_5gophers")
        if s is None:
            continue
        m = lambda k: s[f"speedup_vs_{k}"]["median"]  # noqa: E731
        ps = s["psnr_median_db"]
        rows.append([w, phones[i].split(" (")[0],
                     f"{m('on-device'):.2f}x ({s['ceiling_vs_on_device']:.2f})",
                     f"{m('on-device-nocache'):.2f}x ({s['ceiling_vs_nocache']:.2f})",
                     f"{m('cachegen-L3'):.2f}x / {m('cachegen-fair-L3'):.2f}x",
                     f"{m('cachegen'):.2f}x / {m('cachegen-fair'):.2f}x",
                     " / ".join(_f(ps.get(k), ".1f") for k in ("sakura", "cachegen", "cachegen-L3")) + " dB"])
    al = p["summary"]
    losing = sum(v.get("losing_runs", 0) for k, v in al.items() if k.endswith("| all"))
    worst_od = max(v.get("worst_vs_on_device", 0) for k, v in al.items() if k.endswith("| all"))
    text = (f"EXTRAPOLATED. {len(p['runs']):,} runs ({len(p['workloads'])} workloads x {len(phones)} phone levels x "
            f"every trace of every family + constant rates), RTT {p['rtt_ms']:.0f} ms, {p['decode_pool']}, one shard over "
            f"idle workers x{p.get('decode_split', 1.0):.2f} (every streaming method). Median over "
            "the 5G family; ceilings in brackets; equal quality holds CacheGen to level 3 on every chunk.\n\n"
            + _table(["workload", "phone", "vs on-device", "vs on-device-nocache",
                      "equal quality: vs cachegen-L3 / -fair-L3", "defaults: vs cachegen / -fair",
                      "PSNR sakura / cachegen / cachegen-L3"], rows, "lllllll")
            + f"\n\nOver all runs: **{losing}** runs more than 2 % slower than the best baseline at equal or lower "
            f"quality; worst vs on-device **{worst_od:.4f}x**.")
    checks = docs / "e2e" / "e2e_profile_checks.txt"
    if checks.is_file():
        text += "\n\nThe bench's own checks (docs/e2e/e2e_profile_checks.txt):\n\n```\n" + checks.read_text().strip() + "\n```"
    return text


def dilated(docs: Path) -> str:

    d = _load(docs, "e2e/dilated.json")
    methods = ["on-device", "cachegen", "cachegen-fair", "cachegen-L3", "sakura"]
    by: dict[str, dict[str, dict]] = {}
    for r in d["rows"]:
        by.setdefault(r["trace"], {})[r["method"]] = r
    rows = []
    for trace, ms in by.items():
        path, _, sel = trace.partition("#")
        cells = [f"{describe_trace(trace)} (`{path.split('/')[-1]}{'#' + sel if sel else ''}`)"]
        for m in methods:
            r = ms.get(m)
            cells.append("-" if r is None else f"{_f(r['live_phone_s'], '.1f')} s (sim {_f(r['sim_phone_s'], '.1f')})")
        cells.append(" / ".join("-" if ms.get(m) is None else _f(_psnr(ms[m]["image_mse"]), ".1f")
                                for m in ("cachegen", "sakura")) + " dB")
        rows.append(cells)
    agree = d["agreement"].get("sakura", {})
    return (f"Live, time-dilated (D = {d['D']:.0f}): `{d['workload']}` on {d['phone']}, `{d['model']}`'s real KV and "
            f"forward pass; phone seconds, live beside the simulator on the same inputs (sakura: median live/sim "
            f"difference {_f(agree.get('median_abs_rel_diff', math.nan) * 100, '.1f')} %). Ceiling vs on-device "
            f"{d['ceilings']['vs on-device']:.2f}x.\n\n"
            + _table(["trace"] + methods + ["implied PSNR vs lossless KV, cachegen / sakura"], rows, "llllllr"))


def e2e_live(docs: Path) -> str:
    rows = []
    for label, rel in (("sakura-mini", "e2e/e2e_live.json"), ("flux2-mini", "e2e/flux2-mini/e2e_live.json")):
        if not (docs / rel).is_file():
            continue
        d = _load(docs, rel)
        for r in d["rows"]:
            rows.append([label, r["method"], _f(r["latency_s"] * 1e3, ".0f", " ms"), f"{r['bytes']:,}",
                         str(r["local_shards"]), _f(r["psnr_vs_lossless_db"], ".1f", " dB")])
    return ("Live at the mini models' own scale (192 KiB of template KV, milliseconds per layer): computing the "
            "template locally is the right plan here; differences of tens of ms are machine noise.\n\n"
            + _table(["model", "method", "latency", "bytes", "local shards", "PSNR vs lossless KV"], rows, "llrrrr"))


def link(docs: Path) -> str:
    d = _load(docs, "e2e/link.json")
    rows = [[f"{r['mbps']:,} Mbit/s", _f(r["idle_share"] * 100, ".1f", " %"),
             f"{_f(r['estimate_after_3_mbps'], '.1f')} Mbit/s ({r['estimate_error'] * 100:+.1f} %)",
             _f(r["delivered_mbps"], ".0f"), _f(r["naive_first_shard_mbps"], ".1f")] for r in d["rows"]]
    r0 = d["rows"][0]
    return (f"The runtime's fetch stage alone through the pacer, {r0['rtt_ms']:.0f} ms RTT, {r0['shards']} shards "
            f"(load {_f(r0['loadavg'][0], '.1f')}).\n\n"
            + _table(["rate", "link idle (share of streaming)", "estimate after 3 shards", "delivered Mbit/s",
                      "request-to-last-byte would read"], rows))


def faults(docs: Path) -> str:
    d = _load(docs, "faults/faults.json")
    rows = [[r["fault"], _f(r["latency_s"] * 1e3, ".0f", " ms"), _f(r["on_device_s"] * 1e3, ".0f", " ms"), r["path"],
             f"{r['local_layers']} of {r['layers']}",
             "bit-exact" if r["bit_exact_on_device"] else _f(r["psnr_vs_on_device_db"], ".1f", " dB")]
            for r in d["rows"]]
    text = ("Every fault injected for real on loopback; the edit must complete with the on-device image.\n\n"
            + _table(["fault", "latency", "on-device", "path", "layers computed here", "image vs on-device"], rows,
                     "lrrlrr"))
    if (docs / "faults" / "hostile.json").is_file():
        h = _load(docs, "faults/hostile.json")
        hr = [[r["case"], r.get("outcome", "-"), f"exit {r['rc']}", _f(r["wall_s"], ".1f", " s"),
               _f(r.get("peak_rss_mib"), ".0f", " MiB")] for r in h["rows"]]
        text += ("\n\nHostile servers against a real `sakura edit` subprocess:\n\n"
                 + _table(["server", "outcome", "status", "time to outcome", "peak RSS"], hr, "lllrr"))
    return text


def load(docs: Path) -> str:
    rows = []
    for p in sorted(docs.glob("net_load_*.json")):
        d = json.loads(p.read_text())
        trace = d["config"].get("trace")
        for r in d["results"]:
            rows.append([p.name, d["server"] + (f", {trace}" if trace else ""), str(r["clients"]),
                         _f(r["throughput_MBps"], ".0f"), _f(r["shard_p50_ms"], ".1f"), _f(r["shard_p99_ms"], ".1f"),
                         str(r["errors"]), _f(r.get("server_cpu_s_per_GB"), ".2f"), _f(r["server_rss_peak_MiB"], ".0f")])
    return ("N concurrent phones fetching different templates from one server on 127.0.0.1 (clients and server "
            "share the machine's cores: a floor for the server).\n\n"
            + _table(["file", "server", "phones", "MB/s", "shard p50 ms", "p99 ms", "errors", "server CPU-s/GB",
                      "RSS peak MiB"], rows, "llrrrrrrr"))


def scale(docs: Path) -> str:
    b = _load(docs, "scale_build.json")
    m = _load(docs, "scale_model.json")
    med, sp = b["median_build_s"], b["speedup_vs_first"]
    loads = [r["loadavg_1min_before"] for r in b["runs"]]
    e = m["edge"]
    rows = [["Ray build, workers " + " vs ".join(med), " vs ".join(f"{float(v):.1f} s" for v in med.values())
             + f" for {len(b['templates'])} templates: " + ", ".join(f"{float(v):.2f}x" for v in sp.values())
             + f"; same bytes in every store: {b['same_bytes_in_every_store']} (load {_range(loads, '.1f')})"],
            ["edge CPU, cache hits / misses", f"{e['hot']['edge_cpu_s_per_GB']:.2f} / {e['cold']['edge_cpu_s_per_GB']:.2f}"
             f" CPU-s per GB (load {_f(e['loadavg_1min'], '.1f')})"],
            ["origin requests, cold pass / hot phase", f"{e['cold']['origin_requests']} for {e['objects']} objects / "
             f"{e['hot']['origin_requests']}"],
            ["crowd through one edge", f"{m['crowd']['phones']} phones: {m['crowd']['errors']} errors, at most "
             f"{m['crowd']['origin_requests_per_object_max']} origin request per object"],
            ["encode, Klein-sized layer", f"{m['encode']['cpu_s_per_layer']:.2f} CPU-s "
             f"(rungs {', '.join(f'{x:.2f}' for x in m['encode']['rung_bits_per_value'])} bit/value)"]]
    return "Build, edge and encode cost (docs/scale.md has the capacity model).\n\n" + _table(["measured", "figure"], rows,
                                                                                              "ll")

#: the per-template table's cells: the best cell (the 1.8x target's) and the bundled-size template workload
TEMPLATE_ROWS = (("style3x1024-out512", 2), ("style3x1024-out512", 1), ("template1024-out512", 2))


def templates(docs: Path) -> str:
    d = _load(docs, "e2e/templates.json")
    per = d["per_template"]
    rows = []
    for t, p in per.items():
        f = p["floor"]
        sb = f["sakura_bits_per_value_at_floor"]
        cells = [t, _f(f["cachegen_L3_bits_per_value"], ".2f"), "-" if sb is None else f"{sb:.2f}"]
        for w, i in TEMPLATE_ROWS:
            s = p["summary"].get(f"{w} | {d['phones'][i]} | umn_5gophers")
            if s is None:
                cells.append("-")
                continue
            eq = s["speedup_vs_cachegen-L3"]
            cells.append(f"{eq['median']:.2f}x ({eq['p10']:.2f}; ceiling {s['ceiling_vs_cachegen_L3']:.2f}), "
                         f"{s['psnr_median_db']['sakura']:.1f} dB")
        c = p["family_checks"]["all"]
        cells.append(f"{c['losing_runs']} of {p['runs']}, worst {c['worst_loss_ratio']:.3f}")
        rows.append(cells)
    heads = [f"{w} {d['phones'][i].split(' (')[0]}" for w, i in TEMPLATE_ROWS]
    return (f"EXTRAPOLATED. The phone profile once per template ({', '.join(d['families'] or ['all'])} + constant "
            "links), each template's renditions measured on its own real KV; median (p10; ceiling = cachegen-L3 / "
            "oracle) of cachegen-L3 / sakura over the 5G runs, sakura's median PSNR beside.\n\n"
            + _table(["template", "CacheGen-L3 bits/value", "sakura bits/value under the floor"] + heads
                     + ["losing runs"], rows))


SECTIONS = (
    Section("Two bundled models", "./dev sakura bench quality --model sakura-mini --out docs/model  "
            "(and --model flux2-mini --out docs/model-flux2)", ("model/quality.json", "model-flux2/quality.json"),
            quality, "docs/model-card.md, docs/model-card-flux2.md"),
    Section("What template isolation costs", "./dev sakura bench isolation --run runs/flux2-stock "
            "--out docs/model-flux2/isolation.json", ("model-flux2/isolation.json",), isolation,
            "docs/model-flux2/klein.md"),
    Section("Codec rate-distortion (live)", "./dev sakura bench codec", ("codec/results.json",), codec,
            "docs/codec.md, docs/codec/table.md"),
    Section("Codec on both models, one shard at a time", "./dev sakura bench both-models", ("codec/both_models.json",),
            both_models, "docs/codec/both_models.md"),
    Section("Decode rates (live)", "./dev sakura bench decode --publish", (DECODE_RATES_REL,), decode,
            "docs/decode_rates.md"),
    Section("Where streaming can pay: workload ceilings", "./dev sakura bench workloads", (), workloads,
            "docs/workloads.md"),
    Section("End to end, phone profile (EXTRAPOLATED)", "./dev sakura bench profile --traces-per-family 0 --jobs 2",
            ("e2e/e2e_profile.json",), profile, "docs/e2e/e2e_profile.md, docs/runtime.md"),
    Section("End to end per template, phone profile (EXTRAPOLATED)", "./dev sakura bench templates --jobs 2",
            ("e2e/templates.json",), templates, "docs/e2e/templates.md"),
    Section("End to end, live and time-dilated", "./dev sakura bench dilated", ("e2e/dilated.json",), dilated,
            "docs/e2e/dilated.md, docs/e2e/demo.md"),
    Section("End to end, live", "./dev sakura bench e2e  (and --model flux2-mini --out docs/e2e/flux2-mini)",
            ("e2e/e2e_live.json",), e2e_live, "docs/e2e/e2e_live.md"),
    Section("Link check (live)", "./dev sakura bench link", ("e2e/link.json",), link, "docs/e2e/link.md"),
    Section("Faults and hostile servers (live)", "./dev sakura bench faults", ("faults/faults.json",), faults,
            "docs/faults/README.md"),
    Section("Server load (live)", "./dev sakura bench load --out docs/net_load_sakura.json  (--server nginx, "
            "--trace ...)", (), load, "docs/net.md"),
    Section("Scale out: Ray build, caching edge", "./dev sakura bench build-scale --out docs/scale_build.json && "
            "./dev sakura bench scale-model --out docs/scale_model.json --plots docs/scale",
            ("scale_build.json", "scale_model.json"), scale, "docs/scale.md"),
)


def render(docs: Path = Path("docs")) -> tuple[str, list[str]]:
    """The page, and the titles of sections that could not be read (missing file or changed fields)."""
    docs = Path(docs)
    parts = ["# Results", "",
             "Generated by `./dev sakura bench results` from the JSON each benchmark writes under docs/; do not "
             "edit by hand (every `sakura bench` run from the repository root regenerates it).", "", MODES]
    problems = []
    for s in SECTIONS:
        parts += ["", f"## {s.title}", "", f"Reproduce: `{s.command}`" + (f"; details: {s.see}" if s.see else ""), ""]
        missing = [p for p in s.sources if not (docs / p).is_file()]
        if missing:
            parts.append(f"Not measured yet: {', '.join('docs/' + p for p in missing)} missing (run the command above).")
            problems.append(s.title)
            continue
        try:
            parts.append(s.body(docs))
        except (KeyError, IndexError, TypeError, ValueError) as e:
            parts.append(f"Could not read {', '.join('docs/' + p for p in s.sources)}: {type(e).__name__}: {e} (the "
                         "benchmark's output changed; update sakura/bench/results.py).")
            problems.append(s.title)
    parts += ["", "## saeot", "", "saeot's results (paired verdicts of OT against its baselines, speed, SAEs) are its "
              "own report: docs/saeot.md, tables in docs/saeot/eval/*.md (`./dev saeot summarize "
              "docs/saeot/eval/*.json`)."]
    return "\n".join(parts) + "\n", problems


def write(docs: Path = Path("docs"), out: Path | None = None) -> tuple[bool, list[str]]:
    """Write the page if it changed; returns (changed, problems)."""
    text, problems = render(docs)
    out = Path(out) if out is not None else Path(docs) / "results.md"
    changed = not out.is_file() or out.read_text() != text
    if changed:
        out.write_text(text)
    return changed, problems
