"""Capacity model for a template library served through caching edges (docs/scale.md).

Measures on this machine, then extrapolates with stated arithmetic:

1. **Encode cost and rung sizes** of the default ladder on a Klein-4B-sized synthetic layer
   (1024 tokens x 24 heads x 128, fp16; ``sakura.bench.codec.synthetic_layer``): CPU-seconds of
   one thread for table fitting, encoding and the per-rung distortion measurement that
   ``sakura build`` runs, and the bytes of each rung (a byte prefix of the layer's object).
2. **Edge CPU per GB** (stock nginx, proxy_cache + slice): an origin nginx and an edge nginx on
   127.0.0.1, a synthetic store of 1 MiB objects; a cold pass (every slice a miss: proxied and
   written to the cache) and a hot phase (every request a hit) with concurrent clients; CPU of the
   edge's worker processes (``/proc/<pid>/stat``) per GB delivered, origin requests counted.
3. **Model**: bytes per edit per workload and rung, edits/s one edge serves at 10 Gbit/s (link- and
   CPU-bound), origin egress at a byte hit rate, storage for 10,000 templates x 2 models per
   ladder, build time per template and for the library on N workers (efficiency from
   ``docs/scale_build.json``, written by ``sakura bench build-scale``).

    sakura bench scale-model [--out docs/scale_model.json] [--plots docs/scale]
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Callable
from sakura.util.fsutil import write_json
import aiohttp
import shutil
import torch
from sakura.bench.codec import synthetic_layer
from sakura.cloud.builder.pipeline import DEFAULT_LADDER
from sakura.codec import ShardId, codec_from_spec
from sakura.wire.client import TemplateClient
from sakura.wire.server import run_edge, run_nginx, serve_in_thread
from sakura.wire.server.accesslog import OriginLog
from sakura.wire.server.nginx import nginx_worker_pids
from sakura.wire.store import RenditionInput, StoreWriter
from sakura.wire.store.synthetic import make_synthetic_store

from sakura.bench.harness import get_logger

log = get_logger(__name__)

# --------------------------------------------------------------------------- named workloads
#: Template KV shapes (public configs): Klein-4B per SPEC (FLUX.2-klein-4B: 25 attention layers,
#: 24 heads x 128 = 3072 per token, 1,024 tokens per 512x512 image); FLUX.1 [dev]/Kontext
#: transformer config.json: 19 double + 38 single blocks = 57 layers, 24 heads x 128.
WORKLOADS = {
    "Klein-4B 512² template": dict(layers=25, width=3072, tokens=1024),
    "Klein-4B 1024² template": dict(layers=25, width=3072, tokens=4096),
    "Klein-4B 3 x 512² style template": dict(layers=25, width=3072, tokens=3 * 1024),
    "FLUX.1 Kontext (12B) 1024² template": dict(layers=57, width=3072, tokens=4096),
}
LINK_BPS = 10e9          # one edge's NIC, bit/s
EDGE_CORES = 16          # a typical edge box; CPU-bound figures are per core and for this many
TEMPLATES, MODELS = 10_000, 2


def fp16_bytes(w: dict) -> int:
    return w["layers"] * 2 * w["tokens"] * w["width"] * 2


# --------------------------------------------------------------------------- 1. encode on a Klein-sized layer
def measure_encode(tokens: int = 1024, repeats: int = 2) -> dict:


    torch.set_num_threads(1)
    shard = synthetic_layer(tokens, 24, 128)
    ident = ShardId("bench", "synthetic", 0)
    codec = codec_from_spec(DEFAULT_LADDER[0])
    cpu = time.process_time
    best: dict[str, float] = {}
    for _ in range(repeats):  # best of: CPU time of this thread, not the neighbours'
        t0 = cpu()
        tables = codec.fit_tables([shard]) if codec.uses_tables else None
        t1 = cpu()
        data = codec.encode(shard, ident, tables)
        t2 = cpu()
        ends = codec.level_ends(data)
        for e in ends:
            codec.describe(shard, data[:e], ident, tables)
        t3 = cpu()
        for k, v in (("fit_s", t1 - t0), ("encode_s", t2 - t1), ("describe_s", t3 - t2)):
            best[k] = min(best.get(k, math.inf), v)
    table_bytes = len(tables.to_bytes(ShardId("bench", "synthetic", -1))) if tables is not None else 0
    values = shard.num_values
    return {"ladder": DEFAULT_LADDER[0], "shape": list(shard.shape), "fp16_bytes": shard.fp16_bytes, **best,
            "cpu_s_per_layer": sum(best.values()), "rung_bytes": list(ends), "object_bytes": len(data),
            "rung_bits_per_value": [8 * e / values for e in ends], "table_bytes": table_bytes,
            "ladder_fraction_of_fp16": (len(data) + table_bytes) / shard.fp16_bytes}


# --------------------------------------------------------------------------- 2. edge CPU per GB
def _proc_cpu_s(pids: list[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in pids:
        try:
            f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(f[11]) + int(f[12])  # utime + stime
        except (OSError, IndexError):
            pass
    return total / tick


def measure_edge(clients: int = 16, hot_seconds: float = 6.0, objects: int = 256, object_bytes: int = 1 << 20) -> dict:


    work = Path(tempfile.mkdtemp(prefix="sakura-edge-bench-"))
    store = work / "store"
    refs = []
    with StoreWriter(store, model_fingerprint="bench", template_id="t0") as w:
        w.set_template_ref(b"ref", media_type="x/y")
        for i in range(objects):
            sh = w.add_shard(layer=i, tokens=(0, 1), fp16_bytes=object_bytes,
                             renditions=[RenditionInput("r", "raw", os.urandom(object_bytes))])
            refs.append(sh.renditions[0].object)
    paths = [r.path for r in refs]

    async def fetch_all(url: str, order: list[str], stop_at: float | None) -> tuple[int, int]:
        n = got = 0
        conn = aiohttp.TCPConnector(limit=clients)
        async with aiohttp.ClientSession(connector=conn) as s:
            async def one(k: int) -> None:
                nonlocal n, got
                i = k
                while True:
                    if stop_at is None and i >= len(order):
                        return
                    if stop_at is not None and time.monotonic() >= stop_at:
                        return
                    async with s.get(f"{url}/{order[i % len(order)]}") as r:
                        async for chunk in r.content.iter_chunked(1 << 18):
                            got += len(chunk)
                        n += 1
                    i += clients
            await asyncio.gather(*[one(k) for k in range(clients)])
        return n, got

    with run_nginx(store, work / "origin") as origin, run_edge(origin, work / "edge") as edge:
        olog = OriginLog.nginx(work / "origin")
        pids = nginx_worker_pids(work / "edge")
        c0 = _proc_cpu_s(pids)
        t0 = time.monotonic()
        n_cold, b_cold = asyncio.run(fetch_all(edge, paths, None))  # every object once: all misses
        cold_s, cold_cpu = time.monotonic() - t0, _proc_cpu_s(pids) - c0
        origin_after_cold = sum(olog.object_requests().values())
        c1 = _proc_cpu_s(pids)
        t1 = time.monotonic()
        n_hot, b_hot = asyncio.run(fetch_all(edge, paths, time.monotonic() + hot_seconds))
        hot_s, hot_cpu = time.monotonic() - t1, _proc_cpu_s(pids) - c1
        origin_after_hot = sum(olog.object_requests().values())

    shutil.rmtree(work, ignore_errors=True)
    return {"clients": clients, "object_bytes": object_bytes, "objects": objects,
            "cold": {"requests": n_cold, "bytes": b_cold, "seconds": cold_s, "edge_cpu_s": cold_cpu,
                     "edge_cpu_s_per_GB": cold_cpu / (b_cold / 1e9), "origin_requests": origin_after_cold},
            "hot": {"requests": n_hot, "bytes": b_hot, "seconds": hot_s, "edge_cpu_s": hot_cpu,
                    "edge_cpu_s_per_GB": hot_cpu / (b_hot / 1e9), "MB_per_s": b_hot / hot_s / 1e6,
                    "origin_requests": origin_after_hot - origin_after_cold},
            "loadavg_1min": os.getloadavg()[0]}


def measure_crowd(phones: int = 32) -> dict:
    """``phones`` TemplateClients fetch one template through a fresh edge at once (default 1 MiB
    slices, objects < 1 slice): origin requests per object, errors, bytes verified (by the client)."""


    work = Path(tempfile.mkdtemp(prefix="sakura-crowd-bench-"))
    make_synthetic_store(work / "store", templates=1, layers=6, tokens=256, width=256)

    async def phone(url: str) -> int:
        async with TemplateClient(url) as c:
            m = await c.get_manifest("synthetic-model", "tpl-000")
            n = 0
            for o in m.objects():
                n += len(await c.get_object(o))  # sha256-checked by the client
            return n

    log = OriginLog.sakura()
    try:
        with serve_in_thread(work / "store") as origin, run_edge(origin, work / "edge") as edge:
            async def crowd():
                return await asyncio.gather(*[phone(edge) for _ in range(phones)], return_exceptions=True)
            t0 = time.monotonic()
            res = asyncio.run(crowd())
            wall = time.monotonic() - t0
        per_obj = log.object_requests()
    finally:
        log.close()
        shutil.rmtree(work, ignore_errors=True)
    errors = [repr(r) for r in res if isinstance(r, BaseException)]
    return {"phones": phones, "objects": len(per_obj), "origin_requests": sum(per_obj.values()),
            "origin_requests_per_object_max": max(per_obj.values()), "errors": len(errors),
            "first_error": errors[0] if errors else None,
            "bytes_verified": sum(r for r in res if isinstance(r, int)), "seconds": wall}


# --------------------------------------------------------------------------- 3. the model
def model(enc: dict, edge: dict, build: dict | None) -> dict:
    rung_bpv = enc["rung_bits_per_value"]
    table_frac = enc["table_bytes"] / enc["fp16_bytes"]  # tables scale with the layer count
    layer_cpu_per_value = enc["cpu_s_per_layer"] / (enc["fp16_bytes"] / 2)
    hit_cpu, miss_cpu = edge["hot"]["edge_cpu_s_per_GB"], edge["cold"]["edge_cpu_s_per_GB"]
    eff2 = None
    if build:
        # Per-worker efficiency at 2 workers: CPU-s per template alone / side by side. Wall-clock
        # speedup on the shared machine is bounded by the CPU share the session gets (autogroup),
        # not by the build, so it is not used here (docs/scale.md shows both).
        cpu = {r["workers"]: [] for r in build["runs"]}
        for r in build["runs"]:
            cpu[r["workers"]].append(r["task_cpu_s_per_template"])
        if 1 in cpu and 2 in cpu:
            eff2 = min(1.0, (sum(cpu[1]) / len(cpu[1])) / (sum(cpu[2]) / len(cpu[2])))
    rows = []
    for name, w in WORKLOADS.items():
        fp16 = fp16_bytes(w)
        values = fp16 // 2
        per_rung = [values * b / 8 + fp16 * table_frac for b in rung_bpv]  # + the template's tables
        ladder = fp16 * enc["ladder_fraction_of_fp16"]
        edits = [{"rung": k, "bytes_per_edit": b,
                  "edits_per_s_link": LINK_BPS / 8 / b,
                  "edits_per_s_per_core_hit": 1e9 / (hit_cpu * b),
                  "cores_for_10G_hit": LINK_BPS / 8 / 1e9 * hit_cpu}
                 for k, b in enumerate(per_rung)]
        cpu_template = layer_cpu_per_value * values  # one thread, encode + tables + distortion
        rows.append({"workload": name, **w, "fp16_bytes": fp16, "edits": edits,
                     "storage": {"layered ladder": ladder * TEMPLATES * MODELS,
                                 "layered + uniform:bits=8": (ladder + fp16 * 9.17 / 16) * TEMPLATES * MODELS,
                                 "layered + uniform:bits=8 + lossless": (ladder + fp16 * (9.17 + 16.15) / 16)
                                 * TEMPLATES * MODELS},
                     "build_cpu_s_per_template": cpu_template,
                     "library_build_hours": {n: TEMPLATES * MODELS * cpu_template / (n * (eff2 if n > 1 and eff2 else 1.0))
                                             / 3600 for n in (1, 2, 8, 32, 128)}})
    return {"workloads": rows, "link_bps": LINK_BPS, "edge_cores": EDGE_CORES, "two_worker_efficiency": eff2,
            "edge_hit_cpu_s_per_GB": hit_cpu, "edge_miss_cpu_s_per_GB": miss_cpu}


def zipf_top_k_hit(k: int, n: int, s: float) -> float:
    """Request (= byte, equal sizes) hit rate of a cache holding the ``k`` most popular of ``n``
    items under Zipf(s) popularity: an ideal (static top-K / LFU) cache; LRU does somewhat worse."""
    k = max(0, min(k, n))
    weights = [1.0 / (i ** s) for i in range(1, n + 1)]
    return sum(weights[:k]) / sum(weights)


def plots(res: dict, out_prefix: str) -> list[str]:
    import matplotlib  # lazy: plots only: not imported by a run that draws nothing

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: plots only: not imported by a run that draws nothing

    m = res["model"]
    names = [r["workload"] for r in m["workloads"]]
    files = []
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.2))
    for k in range(len(m["workloads"][0]["edits"])):
        ax[0].bar([i + 0.2 * k for i in range(len(names))], [r["edits"][k]["bytes_per_edit"] / 1e6 for r in m["workloads"]],
                  width=0.2, label=f"rung {k} ({res['encode']['rung_bits_per_value'][k]:.2f} bit/value)")
        ax[1].bar([i + 0.2 * k for i in range(len(names))], [r["edits"][k]["edits_per_s_link"] for r in m["workloads"]],
                  width=0.2, label=f"rung {k}")
    for a, t in ((ax[0], "MB per edit (one rung for every shard, + tables)"), (ax[1], "edits/s one edge serves at 10 Gbit/s")):
        a.set_xticks([i + 0.3 for i in range(len(names))], [n.replace(" template", "").replace(" (12B)", "\n(12B)") for n in names],
                     fontsize=7)
        a.set_title(t, fontsize=9)
        a.set_yscale("log")
        a.grid(alpha=0.3, which="both")
    ax[0].legend(fontsize=7)
    fig.tight_layout()
    files.append(f"{out_prefix}_edits.png")
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(1, 2, figsize=(12, 4.2))
    w0 = m["workloads"][0]
    per_template = w0["edits"][1]["bytes_per_edit"]  # rung 1 of the Klein-4B 512² workload
    sizes_tb = [10 ** (-2.5 + 2.5 * i / 60) for i in range(61)]  # 3 GB .. 1 TB
    for s_exp in (0.8, 1.0, 1.2):
        hit = [zipf_top_k_hit(int(c * 1e12 / per_template), TEMPLATES * MODELS, s_exp) for c in sizes_tb]
        ax[0].plot(sizes_tb, [LINK_BPS / 1e9 * (1 - x) for x in hit], label=f"Zipf s={s_exp}")
    ax[0].set_xlabel("edge cache size (TB)")
    ax[0].set_ylabel("origin egress per saturated 10 Gbit/s edge (Gbit/s)")
    ax[0].set_title(f"origin load vs edge cache ({w0['workload']}, rung 1 = {per_template / 1e6:.0f} MB;\n"
                    f"ideal top-K cache over {TEMPLATES * MODELS:,} template-models)", fontsize=9)
    ax[0].set_xscale("log")
    ax[0].grid(alpha=0.3, which="both")
    ax[0].legend(fontsize=7)
    ns = [1, 2, 4, 8, 16, 32, 64, 128]
    eff = m["two_worker_efficiency"] or 1.0
    for r in m["workloads"]:
        ax[1].plot(ns, [TEMPLATES * MODELS * r["build_cpu_s_per_template"] / (n * (eff if n > 1 else 1)) / 3600 for n in ns],
                   marker="o", label=r["workload"])
    ax[1].set_xscale("log", base=2)
    ax[1].set_yscale("log")
    ax[1].set_xlabel("Ray workers (1 CPU each)")
    ax[1].set_ylabel("hours to encode 10,000 templates x 2 models")
    ax[1].set_title(f"library build time (encode only; per-worker efficiency {eff:.2f} measured at 2)", fontsize=9)
    ax[1].grid(alpha=0.3, which="both")
    ax[1].legend(fontsize=7)
    fig.tight_layout()
    files.append(f"{out_prefix}_origin_build.png")
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)
    return files


def run(out: Path | None = None, plots_prefix: str | None = None, build_json: Path = Path("docs/scale_build.json"),
        edge_seconds: float = 6.0, edge_clients: int = 16, edge_objects: int = 256, crowd_phones: int = 32,
        encode_tokens: int = 1024, replot: Path | None = None) -> dict:
    """Measure (encode, edge CPU, crowd), model, plot; with `replot`, recompute the model and plots
    from a saved result JSON without measuring."""
    if replot is not None:  # recompute the model from saved measurements (+ the current build JSON), redraw
        res = json.loads(Path(replot).read_text())
        build = json.loads(Path(build_json).read_text()) if Path(build_json).exists() else None
        res["model"] = model(res["encode"], res["edge"], build)
        res["plots"] = plots(res, plots_prefix or "docs/scale")
        write_json(Path(replot), res, indent=1)
        return res
    enc = measure_encode(tokens=encode_tokens)
    log.info(f"Klein-sized layer {enc['shape']}: {enc['cpu_s_per_layer']:.2f} CPU-s (fit {enc['fit_s']:.2f}, encode "
          f"{enc['encode_s']:.2f}, distortion per rung {enc['describe_s']:.2f}); rungs "
          f"{[round(b, 3) for b in enc['rung_bits_per_value']]} bit/value; ladder {enc['ladder_fraction_of_fp16']:.3f} "
          f"of fp16 with tables")
    edge = measure_edge(clients=edge_clients, hot_seconds=edge_seconds, objects=edge_objects)
    log.info(f"edge: cold pass {edge['cold']['edge_cpu_s_per_GB']:.2f} CPU-s/GB ({edge['cold']['origin_requests']} origin "
          f"requests for {edge['objects']} objects); hot {edge['hot']['edge_cpu_s_per_GB']:.2f} CPU-s/GB at "
          f"{edge['hot']['MB_per_s']:.0f} MB/s, {edge['hot']['origin_requests']} origin requests; load "
          f"{edge['loadavg_1min']:.1f}")
    crowd = measure_crowd(phones=crowd_phones)
    log.info(f"crowd: {crowd['phones']} phones, {crowd['objects']} objects: {crowd['origin_requests']} origin requests "
          f"(max {crowd['origin_requests_per_object_max']} per object), {crowd['errors']} errors, "
          f"{crowd['bytes_verified'] / 1e6:.1f} MB sha256-verified in {crowd['seconds']:.1f} s")
    build = json.loads(Path(build_json).read_text()) if Path(build_json).exists() else None
    res = {"encode": enc, "edge": edge, "crowd": crowd, "model": model(enc, edge, build)}
    for r in res["model"]["workloads"]:
        e = r["edits"]
        log.info(f"{r['workload']}: fp16 {r['fp16_bytes'] / 1e6:.0f} MB; per edit "
              + ", ".join(f"rung {x['rung']} {x['bytes_per_edit'] / 1e6:.1f} MB -> {x['edits_per_s_link']:.0f}/s" for x in e)
              + f"; storage (layered) {r['storage']['layered ladder'] / 1e12:.2f} TB; build {r['build_cpu_s_per_template']:.0f} CPU-s/template")
    if plots_prefix:
        res["plots"] = plots(res, plots_prefix)
    if out is not None:
        write_json(Path(out), res, indent=1)
    return res
