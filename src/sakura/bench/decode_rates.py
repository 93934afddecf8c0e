"""`sakura bench decode`: how fast each codec turns bytes back into fp16 KV on Klein-sized layers.

The phone-profile simulator needs decode rates for Klein-sized shards, not for the mini model's
32 KiB ones (per-call overheads dominate there). This benchmark encodes one synthetic layer of
Klein-4B shape (tokens x 24 heads x 128 = 3,072 values, K and V, fp16; 1,024 and 4,096 tokens)
with every codec spec given, then decodes it with 1 and 2 worker threads and reports fp16 KV
bytes produced per second of wall time (aggregate over the workers). Layered specs are measured
per rung (`<spec>#<rung>`, the rendition names the store and the runtime use), since a phone
holding rung l decodes only that prefix.

Two figures per row: the per-core rate (fp16 bytes per thread-CPU second of one decode: what a
phone core sustains, and robust to other processes on a shared machine) and the aggregate wall
rate with 1 and 2 workers. The 2-worker speedup says whether a codec releases the GIL: the worker
counts alternate round by round and the speedup is taken pairwise, so a steady background load
hits both alike (each thread gets its own OS share); a decode that holds the GIL gets ~1x, one
that releases it ~2x. `gil_free_fraction` = speedup - 1.

The synthetic layer has the structure real KV shows (per-channel key offsets, a few outlier key
channels, per-token value scales, heavy-tailed attention importance from random queries).
Entropy-coded sizes depend on the data, so the bits/value here are indicative; decode speed
depends mostly on the symbol count. torch runs one thread per worker. Wall rates on a shared
2-core machine are noisy (best and median of `rounds` are both kept); the per-core rates are not.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from importlib.resources import files
from pathlib import Path
from typing import Callable, Sequence

import llvmlite.binding as llvm
import numba
import torch
from tqdm import tqdm

import sakura
from sakura.bench.e2e import CACHEGEN_LEVELS, SAKURA_LADDER
from sakura.bench.results import _table
from sakura.cloud.builder.pipeline import DEFAULT_LADDER
from sakura.codec import ShardId, ShardKV, available_codecs, codec_from_spec, kernels, native, rans, warm_up
from sakura.codec import kernels as K
from sakura.codec import native as NV
from sakura.codec import target as TG
from sakura.codec.kernels import _host_has
from sakura.codec.progressive import _lee
from sakura.codec.progressive import ladder as PG
from sakura.codec.target import phone_env
from sakura.util.fsutil import atomic_write
from sakura.bench.harness import get_logger, markdown_head

_LOG = get_logger(__name__)

KLEIN_HEADS, KLEIN_HEAD_DIM = 24, 128           # FLUX.2-klein-4B: 24 heads x 128 = 3,072 values per token
TOKENS = (1024, 4096)                            # one 512^2 and one 1024^2 reference image
WORKERS = tuple(sorted({1, 2, os.cpu_count() or 1}))   # 1, 2 and all cores
#: The shipped calibration (package data: read through importlib.resources, never from a source
#: tree); `SAKURA_DECODE_RATES` or a `path=` argument points the readers at another file.
RATES_ASSET = "decode_rates.json"
RATES_ENV = "SAKURA_DECODE_RATES"
#: The decode targets (`sakura.codec.target`): this host's JIT and vector kernels, or the
#: phone-class proxy (128-bit SIMD and kernels). Phone figures use "phone".
HOST, PHONE = "host", "phone"
TARGETS = (HOST, PHONE)
PHONE_CPU_NAME = "x86-64-v2"   # = sakura.codec.target.PHONE_CPU (not imported here: it would load the codecs)
#: the decoder implementations measured side by side: the C library (`sakura.codec.native`, the
#: phone path's default) and the numba kernels (its reference and fallback)
IMPLEMENTATIONS = ("native", "numba")
#: codecs whose decoder is a native (C or numba, GIL-free) one; the pool scaling is theirs
NATIVE_CODECS = ("progressive", "layered", "cachegen")


#: single-rung progressive specs measured beside the default ladder (see default_specs)
PROGRESSIVE_SINGLE_RUNGS = ("progressive:budgets=[0.8]", "progressive:budgets=[1.0]", "progressive:budgets=[1.2]",
                            "progressive:budgets=[2.0]")


def default_specs() -> list[str]:
    """Every codec family in `sakura.codec`, with the ladders the store and the benchmarks use now
    (read at call time, so a rerun picks up a changed ladder)."""
    specs = ["lossless", "uniform:bits=8", "uniform:bits=4",
             "cachegen:level=3", "cachegen:level=2", "cachegen:level=1"]
    specs += list(CACHEGEN_LEVELS) + list(SAKURA_LADDER)
    specs += list(DEFAULT_LADDER)
    # single-rung progressive renditions across the bits/value a store's calibrated ladder reaches
    # (the profile's template lands at ~1.3-2.3): benches look rates up by the nearest bits/value
    specs += list(PROGRESSIVE_SINGLE_RUNGS)
    if "sakura" in available_codecs():
        specs.append("sakura:budget=2.0")
    try:  # CacheGen's token-delta variant, where the codec has it
        codec_from_spec("cachegen:level=3,delta=true")
        specs.append("cachegen:level=3,delta=true")
    except Exception:
        pass
    out: list[str] = []
    for s in specs:
        if s not in out:
            out.append(s)
    return out


def klein_layer(tokens: int, *, heads: int = KLEIN_HEADS, head_dim: int = KLEIN_HEAD_DIM, seed: int = 0):
    """A synthetic fp16 layer of Klein shape with real-KV-like structure -> `sakura.codec.ShardKV`."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(tokens, heads, head_dim, generator=g) + 1.5 * torch.randn(1, heads, head_dim, generator=g)
    k[:, :, torch.randint(0, head_dim, (max(1, head_dim // 32),), generator=g)] *= 8.0   # outlier key channels
    v = torch.randn(tokens, heads, head_dim, generator=g) * (0.5 + torch.rand(tokens, 1, 1, generator=g))
    q = torch.randn(128, heads, head_dim, generator=g) * 0.3
    p = torch.softmax(torch.einsum("qhd,thd->hqt", q, k) / math.sqrt(head_dim), dim=-1)  # (H, q, T)
    return ShardKV(k.half(), v.half(), importance=p.mean(dim=(0, 1)), layer=5, num_layers=25)


@dataclass
class DecodeRate:
    """One (rendition, layer size, worker count) measurement."""

    rendition: str               # codec spec, `<spec>#<rung>` for a layered rung
    codec: str
    tokens: int
    values_per_token: int        # K + V values per token: 2 x heads x head_dim
    bits_per_value: float
    workers: int
    fp16_bytes_per_cpu_s: float  # per core: fp16 bytes of one layer / thread CPU seconds of one decode (best)
    fp16_bytes_per_s: float      # aggregate: workers x fp16 bytes of one layer / round wall time (best round)
    fp16_bytes_per_s_median: float
    speedup_vs_1_worker: float   # median over interleaved rounds of this wall rate / the 1-worker wall rate
    gil_free_fraction: float     # 2-worker speedup - 1, clipped to [0, 1]: the share of a decode that runs in parallel
    reference_fp16_bytes_per_cpu_s: float | None = None  # the plain reference decoder of the same bytes (one run)
    split_speedup: float | None = None   # one shard decoded by SPLIT_THREADS threads (`pool=`) / serial, wall (median)
    implementation: str = "numba"  # the decoder that ran: "native" (libsakura_decode) or "numba" (older files: numba)
    native_path: str | None = None   # native: its vector path (scalar / sse4 / avx2 / neon)


def gil_verdict(fraction: float) -> str:
    """'releases' (>= 0.6), 'holds' (<= 0.2) or 'partly' the GIL, from the 2-worker speedup - 1."""
    return "releases" if fraction >= 0.6 else "holds" if fraction <= 0.2 else "partly"


def _interleaved_rounds(decode: Callable[[], object], workers: Sequence[int], rounds: int,
                        pools: dict[int, ThreadPoolExecutor]) -> dict[int, tuple[list[float], list[float]]]:
    """Per worker count: wall seconds of each round (one decode per worker, started together) and
    thread CPU seconds of each decode. The worker counts alternate round by round, so a change in
    the machine's load hits them alike (the wall-time speedup is taken round by round)."""
    def timed() -> float:
        c0 = time.thread_time()
        decode()
        return time.thread_time() - c0

    out: dict[int, tuple[list[float], list[float]]] = {w: ([], []) for w in workers}
    for _ in range(rounds):
        for w in workers:
            t0 = time.perf_counter()
            futs = [pools[w].submit(timed) for _ in range(w)]
            out[w][1].extend(f.result() for f in futs)
            out[w][0].append(time.perf_counter() - t0)
    return out


SPLIT_THREADS = 2


def _split_speedup(decode: Callable[..., object], pool: ThreadPoolExecutor, rounds: int) -> float:
    """Median over rounds of serial wall time / wall time of the same decode split over `pool`
    (rounds alternate the two, so a change in the machine's load hits both alike)."""
    ratios = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        decode()
        t1 = time.perf_counter()
        decode(pool)
        ratios.append((t1 - t0) / max(time.perf_counter() - t1, 1e-9))
    return statistics.median(ratios)


def splits_a_shard(codec) -> bool:
    """Whether `codec.decode` takes a `pool` that threads share one shard with."""
    return "pool" in inspect.signature(codec.decode).parameters


def reference_decoder(codec) -> Callable | None:
    """The plain reference decoder of `codec`'s bitstream (progressive ladders, CacheGen), or None."""
    if codec.name == "cachegen":
        return lambda data, ident, tables: codec.decode_with(data, ident, tables, "reference")
    if codec.name == "progressive" or (codec.supports_layers and codec.params.get("quantiser") == "ecsq"):
        return lambda data, ident, tables: PG.decode_with(codec, data, ident, tables, "reference")
    return None


_WARM: list[float] = []
_ENCODED: dict[tuple, tuple] = {}   # the last (spec, tokens, heads, head_dim) encoded: (codec, tables, bytes)


@functools.lru_cache(maxsize=2)
def _klein_layer_cached(tokens: int, heads: int, head_dim: int):
    return klein_layer(tokens, heads=heads, head_dim=head_dim)


def measure(specs: Sequence[str] | None = None, *, tokens: Sequence[int] = TOKENS, workers: Sequence[int] = WORKERS,
            rounds: int = 3, heads: int = KLEIN_HEADS, head_dim: int = KLEIN_HEAD_DIM, reference: bool = True,
            implementation: str | None = None, log: Callable[[str], None] | None = None) -> list[DecodeRate]:
    """Decode rates for every spec (and every layered rung) x layer size x worker count; with
    `reference`, the reference decoder's rate too (one run, at the smallest layer size: it decodes
    ~5 MB/s). `implementation`: "native" or "numba" (`SAKURA_DECODER` for the measurement; None:
    as this process has it); no rows for "native" where the library is not built."""
    log = log or _LOG.info  # the module's logger unless the caller gives a sink
    if implementation is None:
        return _measure(specs, tokens=tokens, workers=workers, rounds=rounds, heads=heads, head_dim=head_dim,
                        reference=reference, log=log)
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation {implementation!r}: expected one of {IMPLEMENTATIONS}")
    old = os.environ.get(NV.ENV_DECODER)
    os.environ[NV.ENV_DECODER] = implementation
    try:
        if implementation == "native" and not NV.available():
            log(f"  native decoder not available ({NV.decoder()}): no native rows")
            return []
        return _measure(specs, tokens=tokens, workers=workers, rounds=rounds, heads=heads, head_dim=head_dim,
                        reference=reference, log=log)
    finally:
        if old is None:
            os.environ.pop(NV.ENV_DECODER, None)
        else:
            os.environ[NV.ENV_DECODER] = old


def _measure(specs: Sequence[str] | None = None, *, tokens: Sequence[int] = TOKENS, workers: Sequence[int] = WORKERS,
             rounds: int = 3, heads: int = KLEIN_HEADS, head_dim: int = KLEIN_HEAD_DIM, reference: bool = True,
             log: Callable[[str], None] | None = None) -> list[DecodeRate]:
    log = log or _LOG.info  # the module's logger unless the caller gives a sink
    impl = "native" if NV.available() else "numba"
    npath = NV.path_name() if impl == "native" else None

    if not _WARM:
        _WARM.append(warm_up())
        log(f"  JIT warm-up (compile or load the disk cache): {_WARM[0]:.2f} s")

    specs = list(specs) if specs else default_specs()
    workers = tuple(sorted(set(workers)))
    torch.set_num_threads(1)
    rows: list[DecodeRate] = []
    pools = {w: ThreadPoolExecutor(max_workers=w) for w in workers}
    split_pool = ThreadPoolExecutor(max_workers=SPLIT_THREADS, thread_name_prefix="split")

    bar = tqdm(total=len(tokens) * len(specs), desc="decode rates", unit="spec", disable=None)
    try:
        for T in tokens:
            shard = _klein_layer_cached(T, heads, head_dim)
            ident = ShardId("bench-decode", f"klein-{T}", 5)
            for spec in specs:
                bar.set_description_str(f"{spec} @ {T} tokens")
                bar.update()
                key = (spec, T, heads, head_dim)
                if key not in _ENCODED:   # one encode per (spec, size): both implementations decode the same bytes
                    codec = codec_from_spec(spec)
                    tables = codec.fit_tables([shard]) if codec.uses_tables else None
                    _ENCODED.clear()
                    _ENCODED[key] = (codec, tables, codec.encode(shard, ident, tables))
                codec, tables, data = _ENCODED[key]
                ends = codec.level_ends(data) if codec.supports_layers else [len(data)]
                named = ([(spec, data)] if not codec.supports_layers
                         else [(f"{spec}#{r}", data[:e]) for r, e in enumerate(ends)])
                for name, blob in named:
                    def decode(pool=None, blob=blob):
                        if pool is None:
                            return codec.decode(blob, ident, tables)
                        return codec.decode(blob, ident, tables, pool=pool)

                    decode()  # warm caches (tables' decoder models), as a phone holding the tables would be
                    ref_rate = None
                    ref = reference_decoder(codec) if reference and T == min(tokens) else None
                    if ref is not None:
                        c0 = time.thread_time()
                        ref(blob, ident, tables)
                        ref_rate = shard.fp16_bytes / max(time.thread_time() - c0, 1e-9)
                    timing = _interleaved_rounds(decode, workers, rounds, pools)
                    split = _split_speedup(decode, split_pool, rounds) if splits_a_shard(codec) else None
                    walls1 = timing[workers[0]][0]
                    per_w = {}
                    for w in workers:
                        walls, cpu = timing[w]
                        rates = [w * shard.fp16_bytes / t for t in walls]
                        speed = statistics.median((w / t) / (workers[0] / t1) for t, t1 in zip(walls, walls1))
                        per_w[w] = (rates, cpu, speed)
                    gil = (min(1.0, max(0.0, per_w[2][2] - 1.0)) if 2 in per_w and workers[0] == 1
                           else float("nan"))
                    for w, (rates, cpu, speed) in per_w.items():
                        rows.append(DecodeRate(
                            rendition=name, codec=codec.name, tokens=T, values_per_token=2 * heads * head_dim,
                            bits_per_value=8 * len(blob) / shard.num_values, workers=w,
                            fp16_bytes_per_cpu_s=shard.fp16_bytes / max(min(cpu), 1e-9), fp16_bytes_per_s=max(rates),
                            fp16_bytes_per_s_median=statistics.median(rates), speedup_vs_1_worker=speed,
                            gil_free_fraction=gil, reference_fp16_bytes_per_cpu_s=ref_rate,
                            split_speedup=split, implementation=impl, native_path=npath))
                        log(f"  {impl:<6} {name:<38} T={T:<5} {rows[-1].bits_per_value:6.3f} b/v  workers={w}  "
                            f"{rows[-1].fp16_bytes_per_cpu_s / 1e6:8.1f} MB/CPU-s  {max(rates) / 1e6:8.1f} MB/s wall  "
                            f"x{speed:.2f}" + (f"  (reference {ref_rate / 1e6:.1f} MB/CPU-s)" if ref_rate else "")
                            + (f"  one shard on {SPLIT_THREADS} threads x{split:.2f}" if split else ""))
    finally:
        bar.close()
        for p in pools.values():
            p.shutdown()
        split_pool.shutdown()
    return rows


def cpu_model() -> str:
    """The host CPU as the OS and LLVM name it (e.g. "AMD EPYC (znver5, AVX-512 VBMI2)"): decode
    rates move 1.5x between the VMs this project runs on, and the host's vector kernels depend on
    VBMI2."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), name)
    except OSError:
        pass
    try:
        name += f" ({llvm.get_host_cpu_name()}, {'AVX-512 VBMI2' if _host_has('avx512vbmi2') else 'no AVX-512 VBMI2'})"
    except Exception:
        pass
    return name


def machine() -> dict:
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "cpu": cpu_model(), "torch": torch.__version__, "torch_threads_per_worker": 1,
            "processor": platform.processor() or platform.machine(),
            "loadavg_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None}


def target_info() -> dict:
    """What this process's decoders run as (`sakura.codec.target`): the target, the CPU numba
    generates code for, the vector kernels' lanes (16: AVX-512 VBMI2, 8: 128-bit byte-shuffle
    tables, 0: scalar loops) and torch's CPU kernels."""
    TG.check()
    try:
        cap = torch.backends.cpu.get_cpu_capability()
    except Exception:   # (an older torch)
        cap = os.environ.get("ATEN_CPU_CAPABILITY", "?")
    return {"target": TG.current(), "jit_cpu": TG.jit_cpu(), "vector_lanes": K.VECTOR_LANES,
            "torch_cpu_capability": cap}


def target_label(info: dict) -> str:
    """One line naming how a target's rates were produced."""
    kern = {16: "AVX-512 VBMI2 vector kernels",
            8: "128-bit table-shuffle kernels (SSSE3 `pshufb`, the NEON `tbl` kind)"}.get(
        info.get("vector_lanes"), "portable scalar kernels (no vector intrinsics)")
    return (f"{'phone-class proxy' if info.get('target') == PHONE else 'host'}: numba code for "
            f"`{info.get('jit_cpu', '?')}`, {kern}, torch CPU kernels `{info.get('torch_cpu_capability', '?')}`")


def scaling(rows: Sequence[DecodeRate]) -> dict:
    """Worker scaling of the real pool (threads, one decode each, started together): per worker
    count the median speedup over the native decoders' renditions and sizes, and per rendition."""
    per: dict[str, dict[int, list[float]]] = {}
    for r in rows:
        if r.codec in NATIVE_CODECS:
            per.setdefault(r.rendition, {}).setdefault(r.workers, []).append(r.speedup_vs_1_worker)
    ws = sorted({w for d in per.values() for w in d})
    overall = {w: statistics.median([x for d in per.values() for x in d.get(w, [])]) for w in ws}
    return {"codecs": list(NATIVE_CODECS), "speedup_by_workers": {str(w): overall[w] for w in ws},
            "per_rendition": {n: {str(w): statistics.median(v) for w, v in d.items()} for n, d in per.items()}}


def default_rows(rows: Sequence[DecodeRate]) -> list[DecodeRate]:
    """The rows of the decoder the phone path uses: native where measured, else numba."""
    impl = "native" if any(r.implementation == "native" for r in rows) else "numba"
    return [r for r in rows if r.implementation == impl]


def implementation_table(result: dict) -> str:
    """Native and numba per-core rates side by side, per target, rendition and size (with the
    native / numba ratio and the native 2-worker scaling)."""
    tg = result["targets"]
    names = [t for t in TARGETS if t in tg]
    head = ["rendition", "tokens"]
    for t in names:
        lab = "phone-class" if t == PHONE else t
        head += [f"{lab} native MB/s", f"{lab} numba MB/s", f"{lab} native / numba", f"{lab} native x2"]
    keys: list[tuple[str, int]] = []
    by: dict[tuple[str, str], dict] = {}
    for t in names:
        for impl in IMPLEMENTATIONS:
            rs = [DecodeRate(**r) for r in tg[t]["rows"] if r.get("implementation", "numba") == impl]
            by[(t, impl)] = _by_size(rs)
            keys += [k for k in by[(t, impl)] if k not in keys]
    out = []
    for k in keys:
        cells = [f"`{k[0]}`", f"{k[1]:,}"]
        for t in names:
            n, b = by[(t, "native")].get(k), by[(t, "numba")].get(k)
            cn, cb = (_core(n) if n else None), (_core(b) if b else None)
            cells += [f"{cn / 1e6:.0f}" if cn else "-", f"{cb / 1e6:.0f}" if cb else "-",
                      f"{cn / cb:.2f}" if cn and cb else "-",
                      f"{n[2].speedup_vs_1_worker:.2f}" if n and 2 in n else "-"]
        out.append(cells)
    return _table(head, out)


def _by_size(rows: Sequence[DecodeRate]) -> dict[tuple[str, int], dict[int, DecodeRate]]:
    by: dict[tuple[str, int], dict[int, DecodeRate]] = {}
    for r in rows:
        by.setdefault((r.rendition, r.tokens), {})[r.workers] = r
    return by


def _core(d: dict[int, DecodeRate]) -> float:
    return max(r.fp16_bytes_per_cpu_s for r in d.values())   # every decode is one thread: the best of all


def _target_table(rows: Sequence[DecodeRate]) -> str:
    ws = sorted({r.workers for r in rows})
    head = (["rendition", "bits/value", "tokens", "per core MB/s", "reference MB/s"]
            + [f"wall, {w} worker{'s' if w > 1 else ''} MB/s" for w in ws] + [f"x{w}" for w in ws if w > 1]
            + ["GIL", f"split, one shard on {SPLIT_THREADS} threads"])
    out = []
    for (name, T), d in _by_size(rows).items():
        any_r = next(iter(d.values()))
        ref = any_r.reference_fp16_bytes_per_cpu_s
        cells = [f"`{name}`", f"{any_r.bits_per_value:.3f}", f"{T:,}", f"{_core(d) / 1e6:.1f}",
                 f"{ref / 1e6:.1f}" if ref else "-"]
        cells += [f"{d[w].fp16_bytes_per_s / 1e6:.1f}" if w in d else "-" for w in ws]
        cells += [f"{d[w].speedup_vs_1_worker:.2f}" if w in d else "-" for w in ws if w > 1]
        cells.append(gil_verdict(any_r.gil_free_fraction) if not math.isnan(any_r.gil_free_fraction) else "-")
        cells.append(f"x{any_r.split_speedup:.2f}" if any_r.split_speedup else "-")
        out.append(cells)
    return _table(head, out, "lrrrr" + "r" * len(ws) + "r" * (len(ws) - 1) + "lr")


def _summary(rows: Sequence[DecodeRate], sc: dict) -> str:
    fams: dict[str, list[float]] = {}
    for (_name, _T), d in _by_size(rows).items():
        fams.setdefault(next(iter(d.values())).codec, []).append(_core(d))
    line = ("Per-core rate, median over renditions and sizes: "
            + ", ".join(f"{c} {statistics.median(v) / 1e6:.0f} MB/s" for c, v in sorted(fams.items())) + ".")
    if sc["speedup_by_workers"]:
        line += (" Worker scaling of the native decoders (" + ", ".join(sc["codecs"]) + "; median over renditions "
                 "and sizes): " + ", ".join(f"{w} workers {x:.2f}x" for w, x in sc["speedup_by_workers"].items()
                                            if w != "1") + (f" ({sc['source']}; see the note)" if sc.get("source") else "")
                 + ".")
    return line


def side_by_side_table(result: dict) -> str:
    """Host and phone-class per-core rates (and 2-worker scaling) of every rendition, one row per
    rendition and size."""
    tg = result["targets"]
    names = [t for t in TARGETS if t in tg]
    by = {t: _by_size(default_rows([DecodeRate(**r) for r in tg[t]["rows"]])) for t in names}
    keys = list(dict.fromkeys(k for t in names for k in by[t]))
    head = ["rendition", "bits/value", "tokens"] + [f"{'phone-class' if t == PHONE else t} MB/s per core"
                                                    for t in names]
    if len(names) == 2:
        head.append("phone-class / host")
    head += [f"{'phone-class' if t == PHONE else t} x2" for t in names]
    rows = []
    for k in keys:
        ds = [by[t].get(k) for t in names]
        any_r = next(iter(next(d for d in ds if d).values()))
        cells = [f"`{k[0]}`", f"{any_r.bits_per_value:.3f}", f"{k[1]:,}"]
        cores = [_core(d) if d else None for d in ds]
        cells += [f"{c / 1e6:.0f}" if c else "-" for c in cores]
        if len(names) == 2:
            cells.append(f"{cores[1] / cores[0]:.2f}" if all(cores) else "-")
        cells += [f"{d[2].speedup_vs_1_worker:.2f}" if d and 2 in d else "-" for d in ds]
        rows.append(cells)
    return _table(head, rows)


def markdown(result: dict) -> str:
    m = result["machine"]
    tg = result["targets"]
    load = m.get("loadavg_at_start") or [0.0]
    L = ["# Decode rates: this host and a phone-class core", "",
         "How fast each codec turns its bytes back into fp16 KV, per CPU core, on one layer of "
         "FLUX.2-klein-4B's shape (tokens x 24 heads x 128, K and V; synthetic values with real KV's structure). "
         "The phone profile (`sakura bench profile`), the demo (`sakura demo`) and the dilated runs "
         "(`sakura bench dilated`) simulate a phone's decode with the **phone-class** rates; the host rates are "
         "published beside them.", "",
         "- **host**: the decoders as they run on this machine: numba compiles for the host CPU and the "
         "AVX-512 VBMI2 vector kernels (`vpexpandw`, `vpcompressd`) run where the CPU has them (on other "
         "x86 CPUs the 128-bit kernels below).",
         "- **phone-class**: a phone core has 128-bit SIMD (Arm NEON). The proxy runs the same decoders in a "
         "child process with `SAKURA_DECODE_TARGET=phone` (`sakura.codec.target`): numba generates code for "
         f"`{PHONE_CPU_NAME}` (SSE4.2, 128-bit vectors, no AVX, no F16C), the AVX-512 kernels are off and "
         "their 128-bit versions run (`kernels.VECTOR_LANES` = 8: the refinement merge's expanding loads and "
         "the significant positions' compressing stores as one byte shuffle by a 256-entry table row per "
         "8-lane mask, SSSE3 `pshufb`, the instruction NEON has as `tbl`; the fp16 conversion in integer "
         "operations, fused with the inverse DCT's last step), torch runs its baseline CPU kernels "
         "(`ATEN_CPU_CAPABILITY=default`). "
         "A proxy, not a phone: same vector width, not the same instructions (an Arm core converts to fp16 "
         "in one instruction, x86-64-v2 in a short integer sequence) nor the same clock or caches.", "",
         f"Measured {result['date']} on {m['cpus']} CPUs **{m.get('cpu', '?')}** ({m['platform']}), load "
         f"average at start {', '.join(f'{x:.1f}' for x in load)}; host and phone-class measured in one run, "
         "alternating spec by spec, so a change in the machine's load hits both alike: compare the ratio "
         "more than the rates (they move ~1.5x between VMs).", "",
         "**Per core** = fp16 KV bytes per thread-CPU second of one decode (the best over "
         f"{result['rounds']} rounds at every worker count; each decode runs on one thread), less sensitive to "
         "other processes than wall time (not insensitive: a loaded machine's shared caches and memory bandwidth "
         "slow it too). **x2** = 2-worker / 1-worker wall rate, median of rounds that alternate the worker counts "
         "(a decode holding the GIL gets ~1x, one releasing it ~2x on 2 free cores).", "",
         "## Native and numba", "",
         "The phone path decodes with **native** = libsakura_decode, the C library in `native/` "
         "([native.md](native.md); the host target runs its best vector path, `avx2` on this CPU, the "
         "phone-class target its 128-bit `sse4` path, x86-64-v2), by default; **numba** = the numba kernels, "
         "its bit-exact reference and fallback (`SAKURA_DECODER=numba`), on the targets described above. "
         "Both measured in one run, alternating spec by spec.", "", implementation_table(result), "",
         "## Side by side (the phone path's decoder)", "", side_by_side_table(result), ""]
    if result.get("note"):   # what a run left out or how its file was made, in its own words
        L += [f"**Note**: {result['note']}", ""]
    for t in TARGETS:
        if t not in tg:
            continue
        rows = default_rows([DecodeRate(**r) for r in tg[t]["rows"]])
        L += [f"## {'Phone-class' if t == PHONE else 'Host'} in full ({rows[0].implementation if rows else '-'})", "",
              target_label(tg[t]) + ".", "",
              _target_table(rows), "", _summary(rows, tg[t].get("scaling") or scaling(rows)), ""]
    L += ["**Reference** = the plain-Python reference decoder of the same bytes (`engine=\"reference\"`, host, "
          "one run at the smallest size; the native decoders equal it bit for bit on both targets). **Wall** = "
          "fp16 bytes per wall second summed over the workers (best round; medians in the JSON), noisy on a "
          f"shared machine. **Split** = one shard decoded by {SPLIT_THREADS} threads that share its rANS pieces "
          "and channel blocks (`decode(..., pool=)`) / the serial decode, wall time, median of alternating rounds "
          "(- where the codec cannot split a shard).", ""]
    if load[0] >= m["cpus"]:
        L += [f"**Caveat**: the load average ({load[0]:.1f}) was at or above the CPU count ({m['cpus']}) when "
              "this ran: the machine had no free core, so the x2 columns measure the share of a saturated machine "
              "a second thread gets, not whether a decoder releases the GIL (that the native decoders release it "
              "is tested directly: tests/sakura/codec/test_decode_pool.py). The simulator uses the scaling "
              "measured here (no more than measured is assumed).", ""]
    L += ["## Reproduce and use", "",
          "`sakura bench decode` measures both targets and writes `decode_rates.json` and this page to `out/decode/` "
          "(`--target host` or `--target phone` for one; `--spec` repeatable, e.g. `--spec cachegen:level=2`; "
          "`--tokens`, `--rounds`). `--publish` also replaces the calibration the package ships "
          "(`sakura/assets/decode_rates.json`, package data) and this page (docs/decode_rates.md).", "",
          "The simulator's readers (`sakura.bench.decode_rates.load_target`, `load_rates`, `load_scaling`, "
          "`load_split`; `sakura.bench.profile.decode_rates`) read the shipped calibration, or the file "
          f"`{RATES_ENV}` names; `target=\"phone\"` is their default. To run your own decoder code on the "
          "phone-class path: `SAKURA_DECODE_TARGET=phone` in the environment before Python starts.", ""]
    return "\n".join(L)


class _PhoneSide:
    """A child process whose decoders run on the phone-class path (`target.phone_env`: the JIT's
    CPU is fixed when numba starts, so it cannot change inside this process), measuring on request
    over a line protocol (JSON in on stdin, log lines and one `ROWS <json>` line out on stdout)."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self.p = subprocess.Popen([sys.executable, "-c", "from sakura.bench.decode_rates import _serve; _serve()"],
                                  env=phone_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  bufsize=1)

    def measure(self, **kw) -> tuple[list[DecodeRate], dict]:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write(json.dumps(kw) + "\n")
        self.p.stdin.flush()
        for line in self.p.stdout:
            if line.startswith("ROWS "):
                d = json.loads(line[5:])
                return [DecodeRate(**r) for r in d["rows"]], d["info"]
            self.log(line.rstrip("\n"))
        raise RuntimeError(f"the phone-class child exited (status {self.p.wait()})")

    def close(self) -> None:
        if self.p.stdin:
            self.p.stdin.close()
        try:
            self.p.wait(timeout=30)
        except Exception:
            self.p.kill()


def _serve() -> None:
    """The phone-class child's loop (`_PhoneSide`)."""
    for line in sys.stdin:
        kw = json.loads(line)
        rows = measure(kw["specs"], tokens=kw["tokens"], workers=kw["workers"], rounds=kw["rounds"],
                       reference=False, implementation=kw.get("implementation"),
                       log=lambda s: print("  [phone-class]" + s, flush=True))
        print("ROWS " + json.dumps({"rows": [asdict(r) for r in rows], "info": target_info()}), flush=True)


def write_json(obj: dict, path: str | Path) -> None:
    """JSON through the atomic writer (a reader never sees half a calibration)."""
    atomic_write(path, (json.dumps(obj, indent=2) + "\n").encode())


def asset_path() -> Path:
    """Where the shipped calibration lives in this (source or installed) package."""
    return Path(sakura.__file__).resolve().parent / "assets" / RATES_ASSET


def run(out_dir: str | Path = "out/decode", *, specs: Sequence[str] | None = None, tokens: Sequence[int] = TOKENS,
        workers: Sequence[int] = WORKERS, rounds: int = 3, targets: Sequence[str] = TARGETS, publish: bool = False,
        docs_dir: str | Path = "docs", implementations: Sequence[str] = IMPLEMENTATIONS,
        log: Callable[[str], None] | None = None) -> dict:
    """Measure every target in `targets` (host in this process, phone-class in a child; the two
    alternate spec by spec) and write decode_rates.json and decode_rates.md to `out_dir`; with
    `publish`, also the package's shipped calibration (`asset_path()`) and docs_dir/decode_rates.md."""
    log = log or _LOG.info  # the module's logger unless the caller gives a sink
    targets = [t for t in TARGETS if t in targets]
    if not targets or len(targets) != len(set(targets)):
        raise ValueError(f"targets must be some of {TARGETS}")
    if HOST in targets and TG.current() != HOST:
        raise TG.DecodeTargetError(f"{TG.ENV}={TG.current()} in this process: unset it for `sakura bench decode` "
                                   "(it runs the phone-class side in a child of its own)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specs = list(specs) if specs else default_specs()
    log(f"decode rates: Klein-sized layers ({', '.join(map(str, tokens))} tokens x {KLEIN_HEADS * KLEIN_HEAD_DIM} "
        f"values, K+V, fp16), workers {list(workers)}, best of {rounds}; targets {', '.join(targets)}")
    m = machine()
    rows: dict[str, list[DecodeRate]] = {t: [] for t in targets}
    infos: dict[str, dict] = {}
    phone = _PhoneSide(log) if PHONE in targets else None
    try:
        for T in tokens:
            for spec in specs:
                for impl in implementations:   # native and numba side by side, spec by spec
                    if HOST in targets:
                        rows[HOST] += measure([spec], tokens=[T], workers=workers, rounds=rounds, implementation=impl,
                                              reference=T == min(tokens) and impl == implementations[0],
                                              log=log)   # (the reference: ~5 MB/s, smallest size, once)
                    if phone is not None:
                        got, infos[PHONE] = phone.measure(specs=[spec], tokens=[T], workers=list(workers),
                                                          rounds=rounds, implementation=impl)
                        rows[PHONE] += got
    finally:
        if phone is not None:
            phone.close()
    if HOST in targets:
        infos[HOST] = target_info()
    result = {"mode": "measured on this machine (synthetic Klein-sized layers)", "date": time.strftime("%Y-%m-%d %H:%M"),
              "machine": m, "rounds": rounds, "tokens": list(tokens), "workers": list(workers),
              "implementations": list(implementations),
              "targets": {t: {**infos[t], "rows": [asdict(r) for r in rows[t]],
                              "scaling": scaling(default_rows(rows[t]))} for t in targets}}
    md = markdown(result)
    write_json(result, out / "decode_rates.json")
    (out / "decode_rates.md").write_text(md)
    log(f"wrote {out / 'decode_rates.json'} and {out / 'decode_rates.md'}")
    if publish:
        write_json(result, asset_path())
        Path(docs_dir).mkdir(parents=True, exist_ok=True)
        (Path(docs_dir) / "decode_rates.md").write_text(md)
        log(f"published {asset_path()} and {Path(docs_dir) / 'decode_rates.md'}")
    log("\n" + side_by_side_table(result))
    return result


def rates_file(path: str | Path | None = None):
    """The calibration to read: `path`, else the file $SAKURA_DECODE_RATES names, else the one the
    package ships (package data, never the source tree's docs/)."""
    if path is not None:
        return Path(path)
    if os.environ.get(RATES_ENV):
        return Path(os.environ[RATES_ENV])

    return files("sakura.assets").joinpath(RATES_ASSET)


def load_target(path: str | Path | None = None, target: str = PHONE) -> dict:
    """One target's measurement from a calibration file -> {"target", "rows", "scaling", "machine",
    "date", "jit_cpu", "source"}. A file of one target only (an older `sakura bench decode`'s, a
    test's) is that target as it stands ("target" says which: "host" unless the file names one).
    Raises OSError / ValueError (bad JSON) / KeyError (no such target)."""
    if target not in TARGETS:
        raise ValueError(f"decode target {target!r}: expected one of {TARGETS}")
    src = rates_file(path)
    d = json.loads(src.read_text())
    if "targets" in d:
        if target not in d["targets"]:
            raise KeyError(f"no {target} decode rates in {src} (it has {sorted(d['targets'])}); "
                           "run `sakura bench decode`")
        t, name = d["targets"][target], target
    else:
        t, name = d, d.get("target", HOST)
    rows = t["rows"]
    impl = "native" if any(r.get("implementation") == "native" for r in rows) else "numba"
    rows = [r for r in rows if r.get("implementation", "numba") == impl]
    return {"target": name, "rows": rows, "implementation": impl, "scaling": t.get("scaling"), "split": t.get("split"),
            "machine": d.get("machine", {}),
            "date": d.get("date"), "jit_cpu": t.get("jit_cpu"), "vector_lanes": t.get("vector_lanes"),
            "source": str(src)}


def describe_rates(path: str | Path | None = None, target: str = PHONE) -> str:
    """One line for a benchmark's log and report: which decode rates it simulates with."""
    try:
        t = load_target(path, target)
    except (OSError, KeyError, ValueError) as e:
        return f"no {target} decode rates ({e})"
    if t.get("implementation") == "native":
        path = next((r.get("native_path") for r in t["rows"] if r.get("native_path")), "?")
        kind = (f"{'phone-class' if t['target'] == PHONE else 'host'} decode rates of the native decoder "
                f"(libsakura_decode, {path} path)")
    else:
        kind = ("phone-class decode rates of the numba decoder (128-bit proxy: numba code for " + str(t["jit_cpu"])
                + ", 128-bit kernels)" if t["target"] == PHONE
                else f"host decode rates of the numba decoder (numba code for {t['jit_cpu'] or 'the host CPU'})")
    return f"{kind}, measured {t['date']} on {t['machine'].get('cpu', '?')}, from {_short(t['source'])}"


def _short(src: str) -> str:
    """A rates file's name for reports: the shipped one as `sakura/assets/...`, others as given."""
    p = Path(src)
    return f"sakura/assets/{p.name}" if p.parent.name == "assets" and p.parent.parent.name == "sakura" else src


def load_rates(path: str | Path | None = None, target: str = PHONE) -> dict[tuple[str, int, int], float]:
    """{(rendition, tokens, workers): fp16 bytes/s (wall, aggregate)} of one target."""
    return {(r["rendition"], r["tokens"], r["workers"]): r["fp16_bytes_per_s"] for r in load_target(path, target)["rows"]}


@dataclass(frozen=True)
class PoolScaling:
    """The phone's decode pool as `sakura bench decode` measured it: `workers` threads give
    `speedup` x one worker's rate (aggregate), so each worker runs at `per_worker` x the per-core
    rate. The simulator gives every streaming method `workers` decode slots at that rate."""

    workers: int
    speedup: float
    source: str

    @property
    def per_worker(self) -> float:
        return self.speedup / self.workers

    def describe(self) -> str:
        return (f"{self.workers} decode worker(s), measured scaling {self.speedup:.2f}x one worker "
                f"({self.per_worker:.2f} of the per-core rate each; {self.source})")


def load_scaling(workers: int | None = None, path: str | Path | None = None, target: str = PHONE) -> PoolScaling:
    """The measured pool: `workers` (default: the most the bench measured) and its speedup. Beyond
    the measured counts no further gain is assumed (the speedup of the largest measured count);
    without a calibration file (or one without scaling): one worker, 1x."""
    try:
        t = load_target(path, target)
        sc = t["scaling"]["speedup_by_workers"]
        measured = {int(w): float(x) for w, x in sc.items()} | {1: 1.0}
    except (OSError, KeyError, TypeError, ValueError):
        return PoolScaling(max(1, workers or 1), 1.0,
                           f"no measured scaling in {rates_file(path)}: no parallel gain assumed")
    w = workers or max(measured)
    at = max(k for k in measured if k <= w)
    return PoolScaling(w, measured[at], f"{_short(t['source'])} [{t['target']}], {at} worker(s) measured")


def load_split(path: str | Path | None = None, tokens: int | None = None, target: str = PHONE) -> float:
    """The measured intra-shard split of the live decode pool: the median `split` speedup (one
    shard on SPLIT_THREADS threads / serial, wall) over the native decoders' renditions (at the
    size nearest `tokens`, else all sizes), never below 1; 1.0 without a measurement. For
    `runtime.sim.simulate_edit(decode_split=)`, so that the simulator's decode matches the live
    pool's."""
    try:
        t = load_target(path, target)
    except (OSError, KeyError, TypeError, ValueError):
        return 1.0
    if t.get("split") is not None:   # a calibration that states its split (measured apart, see its scaling note)
        return max(1.0, float(t["split"]))
    rows = [r for r in t["rows"] if r.get("codec") in NATIVE_CODECS and r.get("split_speedup") and r.get("workers") == 1]
    if tokens is not None and rows:
        sizes = sorted({r["tokens"] for r in rows})
        near = min(sizes, key=lambda t: abs(math.log(t / tokens)))
        rows = [r for r in rows if r["tokens"] == near]
    return max(1.0, statistics.median(r["split_speedup"] for r in rows)) if rows else 1.0



def rate_for(rates: dict[tuple[str, int, int], float], rendition: str, tokens: int, workers: int = 1) -> float:
    """The measured rate of `rendition` at the nearest measured layer size (log scale) and `workers`."""
    sizes = sorted({t for (n, t, w) in rates if n == rendition and w == workers})
    if not sizes:
        raise KeyError(f"no decode rate for {rendition!r} with {workers} worker(s); measured: "
                       f"{sorted({n for n, _, _ in rates})}")
    nearest = min(sizes, key=lambda t: abs(math.log(t / tokens)))
    return rates[(rendition, nearest, workers)]


# ---------------------------------------------------------------------------------------------
# old vs new decoder, side by side (a loaded machine slows both alike: compare ratios, not rates)

# Deliberately standalone: this script runs inside another source tree (the "old" side), so it may
# import only what every tree has; gil_held() below encodes the renditions the same way in this tree.
_SIDE_SNIPPET = r"""
import json, sys, time
import torch
torch.set_num_threads(1)
from sakura.bench.decode_rates import klein_layer
from sakura.codec import ShardId, codec_from_spec
from sakura.codec.rans import warm_up
warm_up()
specs, T, reps = json.loads(sys.argv[1])
shard = klein_layer(T)
ident = ShardId("bench", "klein", 5)
res = {}
for spec in specs:
    c = codec_from_spec(spec)
    tables = c.fit_tables([shard]) if c.uses_tables else None
    data = c.encode(shard, ident, tables)
    ends = c.level_ends(data) if c.supports_layers else [len(data)]
    for rung, end in enumerate(ends):
        name = f"{spec}#{rung}" if c.supports_layers else spec
        c.decode(data[:end], ident, tables)
        best = float("inf")
        for _ in range(reps):
            t = time.thread_time()
            c.decode(data[:end], ident, tables)
            best = min(best, time.thread_time() - t)
        res[name] = [8 * end / shard.num_values, shard.fp16_bytes / best]
print("RESULT " + json.dumps(res))
"""


def side_by_side(old_src: str | Path, specs: Sequence[str] = ("progressive", "cachegen:level=3", "cachegen:level=2",
                                                               "cachegen:level=1"),
                 tokens: Sequence[int] = TOKENS, rounds: int = 3, reps: int = 3,
                 log: Callable[[str], None] | None = None) -> list[dict]:
    """Per-core decode rate of the decoder in `old_src` (a `src` directory, e.g. `git archive` of
    main) against this tree's, one process per tree, the two alternating `rounds` times (best per
    rendition), so that a changing background load hits both alike. -> rows with both rates,
    bits/value and the ratio; logs a markdown table with the load average."""
    log = log or _LOG.info  # the module's logger unless the caller gives a sink
    new_src = Path(__file__).resolve().parents[2]
    rows = []
    for T in tokens:
        best: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
        load0 = os.getloadavg()
        for _ in range(rounds):
            for tag, src in (("old", Path(old_src)), ("new", new_src)):
                env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1")
                out = subprocess.run([sys.executable, "-c", _SIDE_SNIPPET, json.dumps([list(specs), T, reps])],
                                     env=env, capture_output=True, text=True, check=True).stdout
                res = json.loads(out.split("RESULT ", 1)[1])
                for name, (bpv, rate) in res.items():
                    prev = best[tag].get(name)
                    best[tag][name] = [bpv, max(rate, prev[1] if prev else 0.0)]
        load1 = os.getloadavg()
        log(f"\nside by side, {T} tokens, load average {load0[0]:.1f} -> {load1[0]:.1f} ({os.cpu_count()} CPUs)")
        for line in markdown_head(["rendition", "bits/value old", "bits/value new", "old MB/s per core",
                                   "new MB/s per core", "new / old"]):
            log(line)
        for name, (bpv, rate) in best["new"].items():
            ob, orate = best["old"].get(name, [float("nan"), float("nan")])
            rows.append({"rendition": name, "tokens": T, "old_bits_per_value": ob, "new_bits_per_value": bpv,
                         "old_fp16_bytes_per_cpu_s": orate, "new_fp16_bytes_per_cpu_s": rate,
                         "speedup": rate / orate, "load": [load0[0], load1[0]]})
            log(f"| `{name}` | {ob:.4f} | {bpv:.4f} | {orate / 1e6:.0f} | {rate / 1e6:.0f} | {rate / orate:.2f}x |")
    return rows


def _klein_renditions(specs: Sequence[str], tokens: int):
    """-> (ident, [(name, codec, blob, tables)]): every rung of every spec encoded from one Klein
    layer of `tokens` tokens, each decoded once so that nothing compiles while it is timed."""
    warm_up()
    # Alike to _SIDE_SNIPPET's encode loop, which must stay standalone (see there).
    shard = klein_layer(tokens)
    ident = ShardId("bench-decode", f"klein-{tokens}", 5)
    blobs = []
    for spec in specs:
        codec = codec_from_spec(spec)
        tables = codec.fit_tables([shard]) if codec.uses_tables else None
        data = codec.encode(shard, ident, tables)
        ends = codec.level_ends(data) if codec.supports_layers else [len(data)]
        for r, e in enumerate(ends):
            name = f"{spec}#{r}" if codec.supports_layers else spec
            codec.decode(data[:e], ident, tables)
            blobs.append((name, codec, data[:e], tables))
    return ident, blobs


@contextlib.contextmanager
def _timed_kernels(record: Callable[[str, float], None]):
    """While inside, every numba entry point of `rans`, `kernels` and `_lee`, and every function of
    the native library (`sakura.codec.native`), reports
    record("module.name", thread-CPU seconds) after each call (timed from Python); restored after."""
    def timed(label, f):
        def w(*a, **k):
            c0 = time.thread_time()
            try:
                return f(*a, **k)
            finally:
                record(label, time.thread_time() - c0)
        return w

    saved = []
    for mod in (rans, kernels, _lee):
        for name in dir(mod):
            f = getattr(mod, name)
            if isinstance(f, numba.core.registry.CPUDispatcher):
                saved.append((mod, name, f))
                setattr(mod, name, timed(f"{mod.__name__.rsplit('.', 1)[-1]}.{name}", f))
    lib = native._load()   # libsakura_decode's entry points (ctypes releases the GIL in them)
    wrapped = []
    if lib is not None:
        for name in native._SIGS:
            f = getattr(lib, name)
            wrapped.append((name, f))
            setattr(lib, name, timed(f"native.{name}", f))
    try:
        yield
    finally:
        for mod, name, f in saved:
            setattr(mod, name, f)
        for name, f in wrapped:
            setattr(lib, name, f)   # the foreign function itself again (restype / argtypes set)


def gil_held(specs: Sequence[str] = ("progressive", "cachegen:level=3"), tokens: int = 1024, reps: int = 7,
             log: Callable[[str], None] | None = None) -> dict[str, float]:
    """Share of one decode's thread CPU spent outside the native (numba, nogil) kernels, i.e.
    with the GIL held (Python glue, numpy and torch calls; an upper bound: a few numpy copies and
    zlib's checksum release it too), per rendition of a Klein layer -> {rendition: share}; logs
    the ms and the Amdahl bound on the 2-worker speedup it implies, 1 / (f + (1 - f) / 2). CPU
    time, so robust to other processes. Every numba entry point of `rans`, `kernels` and `_lee`
    is timed from Python while it runs; decoded once before, so that nothing compiles then."""
    log = log or _LOG.info  # the module's logger unless the caller gives a sink
    ident, blobs = _klein_renditions(specs, tokens)
    inside = [0.0]

    def record(_label, seconds):
        inside[0] += seconds

    out = {}
    with _timed_kernels(record):
        for name, codec, blob, tables in blobs:
            best = None
            for _ in range(reps):
                inside[0] = 0.0
                c0 = time.thread_time()
                codec.decode(blob, ident, tables)
                tot = time.thread_time() - c0
                if best is None or tot - inside[0] < best[0]:
                    best = (tot - inside[0], tot)
            f = best[0] / best[1]
            out[name] = f
            log(f"  {name:<24} T={tokens}: CPU {best[1] * 1e3:.1f} ms, GIL held {best[0] * 1e3:.2f} ms = {f:.1%} "
                f"(2 workers at most {1 / (f + (1 - f) / 2):.2f}x)")
    return out


def stage_profile(specs: Sequence[str] = ("progressive", "progressive:budgets=[2.0]", "cachegen:level=3"),
                  tokens: int = 1024, reps: int = 7,
                  log: Callable[[str], None] | None = None) -> dict[str, dict[str, float]]:
    """Where one decode's thread CPU goes, per native kernel (`rans`, `kernels`, `_lee` entry
    points, timed from Python while they run) and the rest ("glue": Python, numpy, zlib), per
    rendition of a Klein layer -> {rendition: {stage: seconds}} of the fastest of `reps` decodes.
    Same wrapping as `gil_held`; CPU time, so robust to other processes.
    `python -c "from sakura.bench.decode_rates import stage_profile; stage_profile()"`."""
    log = log or _LOG.info  # the module's logger unless the caller gives a sink
    ident, blobs = _klein_renditions(specs, tokens)
    acc: dict[str, float] = collections.defaultdict(float)

    def record(label, seconds):
        acc[label] += seconds

    out: dict[str, dict[str, float]] = {}
    with _timed_kernels(record):
        for name, codec, blob, tables in blobs:
            best = None
            for _ in range(reps):
                acc.clear()
                c0 = time.thread_time()
                codec.decode(blob, ident, tables)
                tot = time.thread_time() - c0
                if best is None or tot < best[0]:
                    best = (tot, dict(acc))
            tot, stages = best
            stages["glue"] = tot - sum(stages.values())
            out[name] = stages
            rate = 2 * tokens * KLEIN_HEADS * KLEIN_HEAD_DIM * 2 / tot
            log(f"{name} T={tokens}: {tot * 1e3:.1f} ms CPU = {rate / 1e6:.0f} MB/s per core")
            for k, v in sorted(stages.items(), key=lambda kv: -kv[1]):
                log(f"    {k:<28} {v * 1e3:6.2f} ms")
    return out


if __name__ == "__main__":   # python -m sakura.bench.decode_rates OLD_SRC [TOKENS...]
    import sys

    side_by_side(sys.argv[1], tokens=[int(t) for t in sys.argv[2:]] or TOKENS)


def per_core_side_by_side(specs: Sequence[str] = ("progressive", "cachegen:level=3", "cachegen:level=2",
                                                  "cachegen:level=1"),
                          tokens: Sequence[int] = TOKENS, reps: int = 3, targets: Sequence[str] = TARGETS,
                          log: Callable[[str], None] | None = None) -> list[dict]:
    """The light form of `run` for a loaded machine: per-core rates only (thread CPU time of one
    decode, the best of `reps`), native and numba alternating decode by decode on the same bytes,
    host in this process and phone-class in a child (`target.phone_env`); no wall-time rounds, no
    split or reference columns. -> rows {rendition, tokens, target, implementation, native_path,
    fp16_bytes_per_cpu_s}. `python -c "from sakura.bench.decode_rates import per_core_side_by_side as f; f()"`."""
    log = log or _LOG.info  # the module's logger unless the caller gives a sink
    rows: list[dict] = []
    if PHONE in targets:
        code = ("import json, sys; from sakura.bench.decode_rates import _per_core; "
                f"print('ROWS ' + json.dumps(_per_core({list(specs)!r}, {list(tokens)!r}, {reps}, 'phone')))")
        child = subprocess.Popen([sys.executable, "-c", code], env=phone_env(), stdout=subprocess.PIPE, text=True)
    if HOST in targets:
        rows += _per_core(specs, tokens, reps, HOST, log)
    if PHONE in targets:
        out, _ = child.communicate()
        rows += json.loads(next(ln[5:] for ln in out.splitlines() if ln.startswith("ROWS ")))
    return rows


def _per_core(specs: Sequence[str], tokens: Sequence[int], reps: int, target: str,
              log: Callable[[str], None] | None = None) -> list[dict]:
    log = log or _LOG.info  # the module's logger unless the caller gives a sink
    warm_up()
    torch.set_num_threads(1)
    rows = []
    for T in tokens:
        shard = _klein_layer_cached(T, KLEIN_HEADS, KLEIN_HEAD_DIM)
        ident = ShardId("bench-decode", f"klein-{T}", 5)
        for spec in specs:
            codec = codec_from_spec(spec)
            tables = codec.fit_tables([shard]) if codec.uses_tables else None
            data = codec.encode(shard, ident, tables)
            ends = codec.level_ends(data) if codec.supports_layers else [len(data)]
            for r, e in enumerate(ends):
                blob = data[:e]
                name = f"{spec}#{r}" if codec.supports_layers else spec

                def dec(engine: str, blob=blob, codec=codec, tables=tables):
                    if codec.supports_layers:
                        return PG.decode_with(codec, blob, ident, tables, engine)
                    return codec.decode_with(blob, ident, tables, engine)

                impls = [i for i in IMPLEMENTATIONS if i == "numba" or NV.available()]
                best = {i: math.inf for i in impls}
                for i in impls:
                    dec(i)
                for _ in range(reps):
                    for i in impls:   # alternating: a change in the machine's load hits both alike
                        c0 = time.thread_time()
                        dec(i)
                        best[i] = min(best[i], time.thread_time() - c0)
                for i in impls:
                    rows.append({"rendition": name, "tokens": T, "target": target, "implementation": i,
                                 "native_path": NV.path_name() if i == "native" else None,
                                 "bits_per_value": 8 * len(blob) / shard.num_values,
                                 "fp16_bytes_per_cpu_s": shard.fp16_bytes / best[i]})
                log(f"  [{target}] {name:<24} T={T:<5} " + "  ".join(f"{i} {shard.fp16_bytes / best[i] / 1e6:7.1f} MB/CPU-s"
                                                                  for i in impls))
    return rows
