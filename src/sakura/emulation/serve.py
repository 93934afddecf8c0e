"""`sakura serve --trace/--rtt-ms`: the store's server behind one emulated phone downlink (a
measured bandwidth trace replayed by a pacing proxy, plus a round-trip time)."""

from __future__ import annotations

import logging

from sakura.emulation.pacer import Link, PacingProxy
from sakura.emulation.traces import load_trace
from sakura.wire.server.app import FrontFactory

log = logging.getLogger("sakura.emulation")


def pacing_front(trace: str | None, *, trace_offset_s: float = 0.0, rtt_s: float = 0.0, host: str = "127.0.0.1",
                 port: int = 8080) -> FrontFactory:
    """A `sakura.wire.server.serve_forever(front=...)` factory: a `PacingProxy` on ``host:port``
    replaying ``trace`` (a `load_trace` spec; None: no bandwidth limit) from ``trace_offset_s``
    seconds, with ``rtt_s`` seconds of round trip. Every client shares that one link (one phone at
    a time). The trace is parsed here, so a bad spec raises `TraceError` before anything binds."""
    tr = load_trace(trace) if trace is not None else None

    async def start(server_host: str, server_port: int) -> PacingProxy:
        proxy = await PacingProxy((server_host, server_port), Link(tr, offset_s=trace_offset_s), rtt_s=rtt_s,
                                  listen_host=host, listen_port=port).start()
        log.info("emulated link: trace=%s, offset=%.1f s, rtt=%.0f ms%s", trace, trace_offset_s, rtt_s * 1e3,
                 f", mean {tr.mean_mbps:.2f} Mbit/s" if tr is not None else "")
        return proxy

    return start
