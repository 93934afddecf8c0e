"""Load benchmark: N concurrent phones fetching different templates from one server on 127.0.0.1.

    sakura bench load                       # 1, 8, 32 phones against `sakura serve`
    sakura bench load --server nginx        # the same store served by stock nginx
    sakura bench load --out docs/net_load.json
    sakura bench load --trace mahimahi_cellular/TMobile-LTE-driving.down --rtt-ms 50

The server runs as its own process (`sakura serve`, or nginx), so its memory is measured apart
from the clients: RSS is sampled from /proc every 50 ms (peak reported). Each phone is a
`TemplateClient` (own connection pool) that fetches its template's manifest, then every shard in
consumption order, rotating through the ladder's renditions round by round, verifying sha256.
Shard latency = request sent -> last byte verified. Bounded: ``--rounds`` per phone and
``--max-seconds`` per concurrency level, whichever ends first. All clients share one Python
process and the machine's cores with the server, so on a 2-core box the numbers are a floor for
the server, not its ceiling. With ``--trace`` each phone sits behind its own ``PacingProxy``
(seeded start offset in the trace), so the server holds many slow streams at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from sakura.wire.client import TemplateClient
from sakura.wire.store import Store
from sakura.wire.store.synthetic import make_synthetic_store
from sakura.util.fsutil import write_json

from sakura.bench.harness import get_logger
from sakura.emulation import Link, PacingProxy, load_trace
from sakura.wire.server.nginx import nginx_config

log = get_logger(__name__)

FP = "bench-model"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pids(pid: int) -> list[int]:
    try:
        return [pid] + [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return [pid]


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its children (nginx workers)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in _pids(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)
        except (OSError, IndexError, ValueError):
            pass
    return total / tick


def _rss_kib(pid: int) -> int:
    """Resident set of ``pid`` and its children (nginx workers), KiB."""
    total = 0
    for p in _pids(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


class RssSampler:
    def __init__(self, pid: int, every_s: float = 0.05) -> None:
        self.pid, self.every, self.peak, self._stop = pid, every_s, 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_kib(self.pid))
            self._stop.wait(self.every)

    def __enter__(self) -> "RssSampler":
        self.peak = _rss_kib(self.pid)
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()


def start_server(kind: str, store: Path, workdir: Path, *, verify_objects: bool = True) -> tuple[subprocess.Popen, str]:
    """`sakura serve` (or nginx) on a free port as its own process; ``verify_objects=False`` (sakura
    only) turns off the check that objects hash to their names, to measure what it costs."""
    port = _free_port()
    if kind == "sakura" and not verify_objects:
        cmd = [sys.executable, "-c", "import sys; from sakura.wire.server.app import serve_forever; "
               "serve_forever(sys.argv[1], port=int(sys.argv[2]), verify_objects=False)", str(store), str(port)]
    elif kind == "sakura":
        cmd = [sys.executable, "-c", "from sakura.cli.main import app; app()", "serve", str(store),
               "--port", str(port), "--quiet"]
    elif kind == "nginx":
        exe = shutil.which("nginx") or "/usr/sbin/nginx"
        if not os.path.exists(exe):
            raise SystemExit("nginx is not installed (apt-get install nginx-light)")
        conf = workdir / "nginx.conf"
        conf.write_text(nginx_config(store, port=port, prefix=workdir, user="root" if os.geteuid() == 0 else None))
        cmd = [exe, "-p", str(workdir), "-e", str(workdir / "error.log"), "-c", str(conf)]
    else:
        raise SystemExit(f"unknown server {kind!r}")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {proc.stderr.read().decode()[-800:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise SystemExit("server did not start within 30 s")
            time.sleep(0.05)


async def phone(url: str, template: str, rounds: int, deadline: float, lat: list, counters: dict) -> None:
    async with TemplateClient(url, max_connections=2, read_timeout=30) as c:
        for rnd in range(rounds):
            if time.monotonic() > deadline:
                return
            try:
                m = await c.get_manifest(FP, template)
                counters["manifests"] += 1
                for s in m.shards:
                    if time.monotonic() > deadline:
                        return
                    r = s.renditions[(rnd + s.index) % len(s.renditions)]
                    t0 = time.monotonic()
                    res = await c.fetch_object(r.object)
                    lat.append(time.monotonic() - t0)
                    counters["bytes"] += res.nbytes
                    counters["shards"] += 1
                    counters["resumes"] += res.resumes
            except Exception as e:  # counted, not fatal: the benchmark reports errors (must be 0)
                counters["errors"] += 1
                counters.setdefault("first_error", repr(e))


async def level(url: str, templates: list[str], n: int, rounds: int, max_s: float,
                trace_spec: str | None = None, rtt_s: float = 0.0, seed: int = 0) -> dict:
    lat: list[float] = []
    counters = {"bytes": 0, "shards": 0, "errors": 0, "resumes": 0, "manifests": 0}
    proxies = []
    urls = [url] * n
    capacity = None
    if trace_spec is not None:
        # every phone behind its own emulated link, each starting at its own seeded trace offset

        tr = load_trace(trace_spec)
        rng = np.random.default_rng(seed)
        host, port = url.removeprefix("http://").rsplit(":", 1)
        links = [Link(tr, offset_s=float(rng.uniform(0, tr.period_s))) for _ in range(n)]
        proxies = [await PacingProxy((host, int(port)), lk, rtt_s=rtt_s).start() for lk in links]
        urls = [p.url for p in proxies]
    t0 = time.monotonic()
    deadline = t0 + max_s
    try:
        await asyncio.gather(*(phone(urls[i], templates[i % len(templates)], rounds, deadline, lat, counters)
                               for i in range(n)))
    finally:
        wall = time.monotonic() - t0
        for p in proxies:
            await p.close()
    if trace_spec is not None:
        # what the n links could have carried in that time (upper bound for the throughput)
        capacity = sum(lk.trace.bytes_between(lk.offset_s, lk.offset_s + wall) for lk in links) / wall / 1e6
    a = np.array(lat) if lat else np.array([float("nan")])
    return {"clients": n, "wall_s": wall, "bytes": counters["bytes"], "shards": counters["shards"],
            "throughput_MBps": counters["bytes"] / wall / 1e6, "throughput_Gbps": counters["bytes"] * 8 / wall / 1e9,
            "shard_p50_ms": float(np.percentile(a, 50) * 1e3), "shard_p99_ms": float(np.percentile(a, 99) * 1e3),
            "errors": counters["errors"], "resumes": counters["resumes"], "manifests": counters["manifests"],
            "latencies_s": lat,
            **({"link_capacity_MBps": capacity} if capacity is not None else {}),
            **({"first_error": counters["first_error"]} if "first_error" in counters else {})}


def run(clients: Sequence[int] = (1, 8, 32), server: str = "sakura", templates: int = 32, layers: int = 8,
        tokens: int = 512, width: int = 256, rounds: int = 1000, max_seconds: float = 8.0, trace: str | None = None,
        rtt_ms: float = 0.0, store: Path | None = None, out: Path | None = None) -> dict:
    """One concurrency level per entry of `clients` against `server` (sakura or nginx) serving a
    synthetic store; returns (and writes to `out`) the results."""
    config = dict(clients=list(clients), server=server, templates=templates, layers=layers, tokens=tokens, width=width,
                  rounds=rounds, max_seconds=max_seconds, trace=trace, rtt_ms=rtt_ms,
                  store=None if store is None else str(store), out=None if out is None else str(out))
    with tempfile.TemporaryDirectory(prefix="sakura-load-") as tmp:
        store = store or Path(tmp) / "store"
        t = time.monotonic()
        names = make_synthetic_store(store, templates=templates, layers=layers, tokens=tokens,
                                     width=width, model_fingerprint=FP)
        st = Store(store).stats()
        log.info(f"store: {templates} templates x {layers} shards, {st.object_bytes / 1e6:.1f} MB of objects "
              f"(built in {time.monotonic() - t:.1f} s)")
        proc, url = start_server(server, store, Path(tmp))
        results = []
        try:
            idle_kib = _rss_kib(proc.pid)
            for n in clients:
                cpu0 = _cpu_s(proc.pid)
                with RssSampler(proc.pid) as rss:
                    r = asyncio.run(level(url, names, n, rounds, max_seconds, trace, rtt_ms / 1e3))
                r.pop("latencies_s")  # the percentiles are kept, not every sample
                r["server_cpu_s"] = _cpu_s(proc.pid) - cpu0
                # server CPU per GB served: a figure the client-side bottleneck does not distort
                r["server_cpu_s_per_GB"] = r["server_cpu_s"] / (r["bytes"] / 1e9) if r["bytes"] else float("nan")
                r["server_rss_peak_MiB"] = rss.peak / 1024
                r["server_rss_idle_MiB"] = idle_kib / 1024
                results.append(r)
                cap = f" (links: {r['link_capacity_MBps']:.1f})" if "link_capacity_MBps" in r else ""
                log.info(f"{server:6s} clients={n:3d}  {r['throughput_MBps']:8.1f} MB/s{cap}  "
                      f"p50={r['shard_p50_ms']:7.1f} ms  p99={r['shard_p99_ms']:7.1f} ms  shards={r['shards']:5d}  "
                      f"errors={r['errors']}  server CPU {r['server_cpu_s_per_GB']:.2f} s/GB  RSS peak={r['server_rss_peak_MiB']:.1f} MiB "
                      f"(idle {r['server_rss_idle_MiB']:.1f})")
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    result = {"server": server, "config": config,
           "object_bytes": st.object_bytes, "cpus": os.cpu_count(), "results": results}
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        write_json(Path(out), result, indent=1)
    return result

