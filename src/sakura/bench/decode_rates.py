"""`sakura bench decode`: how fast each codec turns bytes back into fp16 KV on Klein-sized layers.

The phone-profile simulator needs decode rates for Klein-sized shards, not for the mini model's
32 KiB ones (per-call overheads dominate there). This benchmark encodes one synthetic layer of
Klein-4B shape (tokens x 24 heads x 128 = 3,072 values, K and V, fp16; 1,024 and 4,096 tokens)
with every codec spec given, then decodes it with 1 and 2 worker threads and reports fp16 KV
bytes produced per second of wall time (aggregate over the workers). Layered specs are measured
per rung (`<spec>#<rung>`, the rendition names the store and the runtime use), since a phone
holding rung l decodes only that prefix.

It also says whether a codec releases the GIL while decoding: a pure-Python counter thread runs
beside one decode and its rate is compared with its rate alone (1.0 = the decode never blocks
other Python threads; ~0 = it holds the GIL throughout). Two worker threads can only add
throughput where the GIL is released.

The synthetic layer has the structure real KV shows (per-channel key offsets, a few outlier key
channels, per-token value scales, heavy-tailed attention importance from random queries).
Entropy-coded sizes depend on the data, so the bits/value here are indicative; decode speed
depends mostly on the symbol count. torch runs one thread per worker. On a shared 2-core machine
the figures are noisy: each is the best of `rounds` rounds, and the 2-worker rows are measured in
the same run as the 1-worker rows.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

KLEIN_HEADS, KLEIN_HEAD_DIM = 24, 128           # FLUX.2-klein-4B: 24 heads x 128 = 3,072 values per token
TOKENS = (1024, 4096)                            # one 512^2 and one 1024^2 reference image
WORKERS = (1, 2)


def default_specs() -> list[str]:
    """Every codec family in `sakura.codec`, with the ladders the store and the benchmarks use now
    (read at call time, so a rerun picks up a changed ladder)."""
    from sakura.codec import available_codecs
    from sakura.store.build import DEFAULT_LADDER

    specs = ["lossless", "uniform:bits=8", "uniform:bits=4",
             "cachegen:level=3", "cachegen:level=2", "cachegen:level=1"]
    try:
        from sakura.bench.e2e import CACHEGEN_LEVELS, SAKURA_LADDER
        specs += list(CACHEGEN_LEVELS) + list(SAKURA_LADDER)
    except ImportError:  # the simulator is being rewritten; the store's ladder is enough
        pass
    specs += list(DEFAULT_LADDER)
    if "sakura" in available_codecs():
        specs.append("sakura:budget=2.0")
    out: list[str] = []
    for s in specs:
        if s not in out:
            out.append(s)
    return out


def klein_layer(tokens: int, *, heads: int = KLEIN_HEADS, head_dim: int = KLEIN_HEAD_DIM, seed: int = 0):
    """A synthetic fp16 layer of Klein shape with real-KV-like structure -> `sakura.codec.Shard`."""
    from sakura.codec import Shard

    g = torch.Generator().manual_seed(seed)
    k = torch.randn(tokens, heads, head_dim, generator=g) + 1.5 * torch.randn(1, heads, head_dim, generator=g)
    k[:, :, torch.randint(0, head_dim, (max(1, head_dim // 32),), generator=g)] *= 8.0   # outlier key channels
    v = torch.randn(tokens, heads, head_dim, generator=g) * (0.5 + torch.rand(tokens, 1, 1, generator=g))
    q = torch.randn(128, heads, head_dim, generator=g) * 0.3
    p = torch.softmax(torch.einsum("qhd,thd->hqt", q, k) / math.sqrt(head_dim), dim=-1)  # (H, q, T)
    return Shard(k.half(), v.half(), importance=p.mean(dim=(0, 1)), layer=5, num_layers=25)


@dataclass
class DecodeRate:
    """One (rendition, layer size, worker count) measurement."""

    rendition: str               # codec spec, `<spec>#<rung>` for a layered rung
    codec: str
    tokens: int
    values_per_token: int        # K + V values per token: 2 x heads x head_dim
    bits_per_value: float
    workers: int
    fp16_bytes_per_s: float      # best round: workers x fp16 bytes of one layer / round wall time
    fp16_bytes_per_s_median: float
    speedup_vs_1_worker: float   # this row's best rate / the 1-worker best rate (same run)
    gil_free_fraction: float     # Python counter rate during one decode / its rate alone


def _gil_free_fraction(decode: Callable[[], object]) -> float:
    """How much a pure-Python thread can run while `decode` runs on this thread (0..~1)."""
    stop = threading.Event()
    count = [0]

    def spin() -> None:
        n = 0
        while not stop.is_set():
            n += 1
        count[0] = n

    def rate(body: Callable[[], object] | None, seconds: float) -> float:
        stop.clear()
        t = threading.Thread(target=spin)
        t0 = time.perf_counter()
        t.start()
        if body is None:
            time.sleep(seconds)
        else:
            body()
        stop.set()
        t.join()
        return count[0] / (time.perf_counter() - t0)

    t0 = time.perf_counter()
    decode()
    dur = max(time.perf_counter() - t0, 0.05)
    # alternate alone / during three times and take the median ratio: the machine is shared
    ratios = []
    for _ in range(3):
        alone = rate(None, dur)
        during = rate(decode, dur)
        if alone > 0:
            ratios.append(during / alone)
    return statistics.median(ratios) if ratios else float("nan")


def gil_verdict(fraction: float) -> str:
    """'releases' (>= 0.7), 'holds' (<= 0.3) or 'partly' the GIL, from `_gil_free_fraction`."""
    return "releases" if fraction >= 0.7 else "holds" if fraction <= 0.3 else "partly"


def _rate_rounds(decode: Callable[[], object], fp16_bytes: int, workers: int, rounds: int,
                 pool: ThreadPoolExecutor) -> list[float]:
    """fp16 bytes/s per round, each round = one decode per worker, all started together."""
    rates = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        futs = [pool.submit(decode) for _ in range(workers)]
        for f in futs:
            f.result()
        rates.append(workers * fp16_bytes / (time.perf_counter() - t0))
    return rates


def measure(specs: Sequence[str] | None = None, *, tokens: Sequence[int] = TOKENS, workers: Sequence[int] = WORKERS,
            rounds: int = 3, heads: int = KLEIN_HEADS, head_dim: int = KLEIN_HEAD_DIM,
            log: Callable[[str], None] = print) -> list[DecodeRate]:
    """Decode rates for every spec (and every layered rung) x layer size x worker count."""
    from sakura.codec import ShardId, codec_from_spec

    specs = list(specs) if specs else default_specs()
    torch.set_num_threads(1)
    rows: list[DecodeRate] = []
    gil_of: dict[str, float] = {}  # GIL behaviour does not depend on the layer size: measured at the first
    pools = {w: ThreadPoolExecutor(max_workers=w) for w in workers}
    try:
        for T in tokens:
            shard = klein_layer(T, heads=heads, head_dim=head_dim)
            ident = ShardId("bench-decode", f"klein-{T}", 5)
            for spec in specs:
                codec = codec_from_spec(spec)
                tables = codec.fit_tables([shard]) if codec.uses_tables else None
                data = codec.encode(shard, ident, tables)
                ends = codec.level_ends(data) if hasattr(codec, "level_ends") else [len(data)]
                named = ([(spec, data)] if len(ends) == 1 and not hasattr(codec, "level_ends")
                         else [(f"{spec}#{r}", data[:e]) for r, e in enumerate(ends)])
                for name, blob in named:
                    def decode(blob=blob):
                        return codec.decode(blob, ident, tables)

                    decode()  # warm caches (tables' decoder models), as a phone holding the tables would be
                    if name not in gil_of:
                        gil_of[name] = _gil_free_fraction(decode)
                    gil = gil_of[name]
                    best1 = None
                    for w in workers:
                        rates = _rate_rounds(decode, shard.fp16_bytes, w, rounds, pools[w])
                        best = max(rates)
                        best1 = best if best1 is None else best1
                        rows.append(DecodeRate(
                            rendition=name, codec=codec.name, tokens=T, values_per_token=2 * heads * head_dim,
                            bits_per_value=8 * len(blob) / shard.num_values, workers=w, fp16_bytes_per_s=best,
                            fp16_bytes_per_s_median=statistics.median(rates), speedup_vs_1_worker=best / best1,
                            gil_free_fraction=gil))
                        log(f"  {name:<44} T={T:<5} {rows[-1].bits_per_value:6.3f} b/v  workers={w}  "
                            f"{best / 1e6:8.1f} MB/s fp16  x{best / best1:.2f}  GIL-free {gil:.2f}")
    finally:
        for p in pools.values():
            p.shutdown()
    return rows


def machine() -> dict:
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "torch_threads_per_worker": 1,
            "processor": platform.processor() or platform.machine(),
            "loadavg_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None}


def markdown(result: dict) -> str:
    rows = [DecodeRate(**r) for r in result["rows"]]
    L = ["# Decode rates on Klein-sized layers", "",
         f"Generated by `sakura bench decode` ({result['date']}; {result['machine']['cpus']} CPUs, "
         f"{result['machine']['platform']}, load average at start {result['machine']['loadavg_at_start']}). "
         "One synthetic fp16 layer of Klein-4B shape (tokens x 24 heads x 128, K and V) per size; fp16 KV bytes "
         "produced per second of wall time, summed over the worker threads; best of "
         f"{result['rounds']} rounds (the machine is shared, so medians are in decode_rates.json). "
         "`GIL-free` = how fast a pure-Python thread runs during one decode relative to alone (1 = the decode "
         "releases the GIL, 0 = it holds it). x2 = 2-worker rate / 1-worker rate in the same run.", "",
         "| rendition | bits/value | tokens | 1 worker MB/s | 2 workers MB/s | x2 | GIL-free |",
         "|---|---:|---:|---:|---:|---:|---:|"]
    by = {}
    for r in rows:
        by.setdefault((r.rendition, r.tokens), {})[r.workers] = r
    for (name, T), ws in by.items():
        r1, r2 = ws.get(1), ws.get(2)
        any_r = r1 or r2
        L.append(f"| `{name}` | {any_r.bits_per_value:.3f} | {T:,} | "
                 f"{r1.fp16_bytes_per_s / 1e6:.1f} | " if r1 else f"| `{name}` | {any_r.bits_per_value:.3f} | {T:,} | - | ")
        L[-1] += (f"{r2.fp16_bytes_per_s / 1e6:.1f} | {r2.speedup_vs_1_worker:.2f} | " if r2 else "- | - | ")
        L[-1] += f"{any_r.gil_free_fraction:.2f} ({gil_verdict(any_r.gil_free_fraction)}) |"
    L += ["", "Reproduce: `sakura bench decode` (all specs: `--spec` repeatable, e.g. `--spec cachegen:level=2`). "
          "The simulator reads decode_rates.json through `sakura.bench.decode_rates.load_rates`.", ""]
    return "\n".join(L)


def run(out_dir: str | Path = "docs", *, specs: Sequence[str] | None = None, tokens: Sequence[int] = TOKENS,
        workers: Sequence[int] = WORKERS, rounds: int = 3, log: Callable[[str], None] = print) -> dict:
    """Measure and write decode_rates.json and decode_rates.md to `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    log(f"decode rates: Klein-sized layers ({', '.join(map(str, tokens))} tokens x {KLEIN_HEADS * KLEIN_HEAD_DIM} "
        f"values, K+V, fp16), workers {list(workers)}, best of {rounds}")
    m = machine()
    rows = measure(specs, tokens=tokens, workers=workers, rounds=rounds, log=log)
    result = {"mode": "measured on this machine (synthetic Klein-sized layers)", "date": time.strftime("%Y-%m-%d %H:%M"),
              "machine": m, "rounds": rounds, "tokens": list(tokens), "workers": list(workers),
              "rows": [asdict(r) for r in rows]}
    (out / "decode_rates.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "decode_rates.md").write_text(markdown(result))
    log(f"wrote {out / 'decode_rates.json'} and {out / 'decode_rates.md'}")
    return result


def load_rates(path: str | Path = "docs/decode_rates.json") -> dict[tuple[str, int, int], float]:
    """{(rendition, tokens, workers): fp16 bytes/s} from a decode_rates.json."""
    res = json.loads(Path(path).read_text())
    return {(r["rendition"], r["tokens"], r["workers"]): r["fp16_bytes_per_s"] for r in res["rows"]}


def rate_for(rates: dict[tuple[str, int, int], float], rendition: str, tokens: int, workers: int = 1) -> float:
    """The measured rate of `rendition` at the nearest measured layer size (log scale) and `workers`."""
    sizes = sorted({t for (n, t, w) in rates if n == rendition and w == workers})
    if not sizes:
        raise KeyError(f"no decode rate for {rendition!r} with {workers} worker(s); measured: "
                       f"{sorted({n for n, _, _ in rates})}")
    nearest = min(sizes, key=lambda t: abs(math.log(t / tokens)))
    return rates[(rendition, nearest, workers)]
