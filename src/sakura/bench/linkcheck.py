"""`sakura bench link`: does the runtime keep the link busy, and does it measure it right? Live.

The runtime's fetch stage (`sakura.phone.live.FetchStage`, the same object an edit uses) pulls
every shard of a synthetic store through the pacing proxy at a constant rate with a 40 ms RTT,
as raw-stream would (every shard, in order, requests issued ahead). Shards are sized so each
takes ~`shard_ms` of link time at that rate. Reported per rate:

* **link idle**: the time between the first and the last byte during which no transfer was
  carrying a body (the union of every shard's body interval, subtracted from the span), as a share
  of the streaming time: gaps between shards, or waiting on requests. A body interval runs from
  its first byte to its last; the client stamps a chunk when it has arrived, so the first chunk's
  own transfer time (its bytes at the rate measured on the rest of that shard) is counted before
  the stamp;
* **delivered rate**: bytes / busy time. On this shared 2-core machine the Python pacer and client
  cannot always carry 1,000 Mbit/s; the estimate is compared with the nominal and the delivered
  rate;
* **estimate after three shards**: the runtime's throughput estimate (first byte to last byte,
  link level) vs the true rate, and beside it what the old estimate (request to last byte, one
  shard at a time, RTT included) would read;
* **lost at the pacer**: the capacity the link offered while streaming (after its first byte)
  that nobody booked in time (`Link.lost_bytes`), as a share of the bytes carried: the pacer's
  side of the idle figure, plus whatever a late proxy (a loaded machine) let pass.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Sequence
from sakura.util.fsutil import write_json
from sakura.emulation.pacer import pacing_proxy_in_thread
from sakura.emulation.traces import constant_trace
from sakura.phone import BandwidthEstimator, FixedPolicy, Route, RttEstimator, ShardSpec
from sakura.phone.driver import EditDriver
from sakura.phone.live import FetchStage
from sakura.wire.server import serve_in_thread
from sakura.wire.store.store import Store
from sakura.wire.store.synthetic import make_synthetic_store

from sakura.bench.harness import get_logger, markdown_head

log = get_logger(__name__)


def run_link_check(rates_mbps: Sequence[float] = (10, 100, 1000), *, rtt_ms: float = 40.0, shards: int = 12,
                   shard_ms: float = 50.0, out_dir: str | Path | None = None) -> dict:

    rows = []
    for mbps in rates_mbps:
        rate = mbps * 1e6 / 8
        width = 256
        tokens = max(16, int(rate * shard_ms / 1000 / (2 * width * 2)))
        with tempfile.TemporaryDirectory(prefix="sakura-link-") as root:
            make_synthetic_store(root, templates=1, layers=shards, tokens=tokens, width=width)
            st = Store(root)
            (fp, tid), = st.manifest_keys()
            m = st.get_manifest(fp, tid)
            specs = [ShardSpec(tuple(Route(r.name, r.nbytes, 0.0, 0.0) for r in s.renditions), 0.0, 1e9) for s in m.shards]
            prior = 20e6 / 8  # a stale estimate from another network
            driver = EditDriver(specs, FixedPolicy("fp16"), bandwidth=BandwidthEstimator(prior_bps=prior),
                                rtt=RttEstimator(prior_s=0.1), max_inflight=8)
            cond = threading.Condition()
            done = threading.Event()
            seen: list[tuple[int, float]] = []
            est_after: dict[int, float] = {}

            def on_fetched(j, data, rend):
                seen.append((j, len(data)))
                if len(seen) == 3:
                    est_after[3] = driver.bw.predict_bps() or float("nan")
                    est_after["samples"] = [x * 8 / 1e6 for x in driver.bw._samples]
                if len(seen) == shards:
                    done.set()

            with serve_in_thread(root) as url, pacing_proxy_in_thread(url, constant_trace(mbps), 0.0, rtt_ms / 1000) as px:
                t0 = time.monotonic()
                stage = FetchStage(px.url, m, driver, cond, lambda: time.monotonic() - t0, t0, on_fetched=on_fetched)
                stage.start()
                ok = done.wait(timeout=120)
                stage.stop()
                lost = px.link.lost_bytes - px.link.lost_before_first_bytes  # while streaming
            recs = [r for r in driver.records if r.fetch_end == r.fetch_end]
            last = max(r.fetch_end for r in recs)
            total = sum(r.nbytes for r in recs)
            # A shard's first chunk is stamped when it has *arrived*: the link carried it during
            # the chunk's own transfer time before that, so each busy interval starts that much
            # earlier (at the rate measured on the rest of the same shard).
            def body(r):
                rest_s = r.fetch_end - r.t_first_byte
                rate = (r.nbytes - r.first_chunk_bytes) / rest_s if rest_s > 0 else 0.0
                return (r.t_first_byte - (r.first_chunk_bytes / rate if rate > 0 else 0.0), r.fetch_end)

            busy, cur_a, cur_b = 0.0, None, None
            first = min(body(r)[0] for r in recs)
            span = last - first
            for a, b in sorted(body(r) for r in recs):
                if cur_b is None or a > cur_b:
                    if cur_b is not None:
                        busy += cur_b - cur_a
                    cur_a, cur_b = a, b
                else:
                    cur_b = max(cur_b, b)
            busy += (cur_b - cur_a) if cur_b is not None else 0.0
            idle = max(0.0, span - busy)
            delivered = total / busy if busy else float("nan")
            r0 = driver.records[0]
            naive = r0.nbytes / (r0.fetch_end - r0.t_request)  # request to last byte, one shard
            row = {"mbps": mbps, "rtt_ms": rtt_ms, "shards": shards, "shard_bytes": recs[0].nbytes if recs else 0,
                   "completed": ok, "streaming_s": span, "idle_s": idle, "idle_share": idle / span if span else float("nan"),
                   "estimate_after_3_mbps": est_after.get(3, float("nan")) * 8 / 1e6,
                   "estimate_error": est_after.get(3, float("nan")) / rate - 1,
                   "delivered_mbps": delivered * 8 / 1e6,
                   "estimate_error_vs_delivered": est_after.get(3, float("nan")) / delivered - 1,
                   "naive_first_shard_mbps": naive * 8 / 1e6, "rtt_estimate_ms": driver.rtt.rtt_s() * 1000,
                   "lost_bytes": lost, "lost_share": lost / total if total else float("nan"),
                   "loadavg": list(os.getloadavg()), "samples_after_3_mbps": est_after.get("samples"),
                   "timeline_ms": [[r.index, round(1000 * r.t_request, 1), round(1000 * r.t_first_byte, 1),
                                    round(1000 * r.fetch_end, 1), r.first_chunk_bytes] for r in recs]}
            rows.append(row)
            log.info(f"  {mbps:6g} Mbit/s: idle {100 * row['idle_share']:.1f} % of {1000 * span:.0f} ms streaming; estimate after "
                f"3 shards {row['estimate_after_3_mbps']:.1f} Mbit/s ({100 * row['estimate_error']:+.1f} % vs nominal, "
                f"{100 * row['estimate_error_vs_delivered']:+.1f} % vs delivered {row['delivered_mbps']:.0f}); request-to-last-"
                f"byte would read {row['naive_first_shard_mbps']:.1f}; RTT estimate {row['rtt_estimate_ms']:.1f} ms; "
                f"lost at the pacer {lost / 1e3:.0f} kB ({100 * row['lost_share']:.1f} % of the bytes carried)")
    result = {"mode": "live (real sockets and pacer on this machine)", "rows": rows}
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "link.json", result, indent=1, default=float)
        (out / "link.md").write_text(link_markdown(result))
    return result


def link_markdown(result: dict) -> str:
    lines = [f"Link check, {result['mode']}: raw-stream's fetch stage alone, constant rate through the pacer. "
             "Reproduce: `./dev sakura bench link --out docs/e2e` (per-shard timelines in link.json).", "",
             *markdown_head(['rate (Mbit/s)', 'RTT (ms)', 'shards x bytes', 'link idle (share of streaming)', 'delivered (Mbit/s)', 'estimate after 3 shards (Mbit/s)', 'error vs nominal', 'error vs delivered', 'request-to-last-byte reading (Mbit/s)', 'lost at the pacer (kB, share of carried)', 'load average (1 min)'], 'rrlrrrrrrrr')]
    for r in result["rows"]:
        lines.append(f"| {r['mbps']:g} | {r['rtt_ms']:g} | {r['shards']} x {r['shard_bytes']} | {100 * r['idle_share']:.1f} % | "
                     f"{r['delivered_mbps']:.0f} | {r['estimate_after_3_mbps']:.1f} | {100 * r['estimate_error']:+.1f} % | "
                     f"{100 * r['estimate_error_vs_delivered']:+.1f} % | {r['naive_first_shard_mbps']:.1f} | "
                     f"{_lost(r)} | "
                     f"{(r.get('loadavg') or [float('nan')])[0]:.1f} |")
    return "\n".join(lines) + "\n"


def _lost(row: dict) -> str:
    """The lost-capacity cell (rows written before it was measured show '-')."""
    if "lost_bytes" not in row:
        return "-"
    return f"{row['lost_bytes'] / 1e3:.0f} ({100 * row['lost_share']:.1f} %)"
