"""User-space link emulation: a pacing TCP proxy on 127.0.0.1 between phone and server.

``Link`` is one phone's downlink: a token bucket whose fill rate follows a ``Trace`` (so unused
capacity is lost beyond ``burst_bytes``, as on a real link) shared by all of the phone's
connections in FIFO order. ``Link.reserve`` is pure given ``now``, so it tests without a clock.

``PacingProxy`` forwards client->server bytes after ``rtt/2`` and server->client bytes through the
``Link`` and then ``rtt/2``. It reads from the server only a short horizon ahead of the link
(``horizon_s``), so the server feels the bottleneck as TCP backpressure, as behind a real link.
A new connection's first request waits one extra RTT, standing in for the TCP handshake that
happens for real (instantly) on loopback; so connection reuse saves an RTT here as it does on a
phone. Optional fault injection (``cut_after_bytes``) drops each connection after that many
downlink bytes, to test resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Iterator

from sakura.emulation.listener import Listener
from sakura.emulation.traces import Trace
from sakura.util.aiothread import running_in_thread
from urllib.parse import urlsplit

log = logging.getLogger(__name__)


class Link:
    """Trace-driven downlink capacity shared by one phone's connections.

    Args:
        trace: capacity over time; ``None`` means unlimited (delay only).
        offset_s: trace time (seconds) at which the emulation starts.
        burst_bytes: capacity that may accumulate while the link is idle (bytes); like tbf's
            bucket. Anything beyond is lost, as an idle real link's capacity is.
        burst_s: ... and at most what the trace offered in the last ``burst_s`` seconds. The
            bucket is there to absorb the proxy's own late wake-ups (milliseconds); in bytes
            alone, a slow link banked seconds of capacity (15 kB is 5.5 s of the dilated LTE
            trace), which then arrived at once, where the simulator (no bucket) and a mahimahi
            link (an unused delivery opportunity is gone) carry it at the trace's rate.
        start: ``time.monotonic()`` value at which trace time ``offset_s`` begins (default: now).
    """

    def __init__(self, trace: Trace | None, *, offset_s: float = 0.0, burst_bytes: int = 15_000,
                 burst_s: float = 0.005, start: float | None = None) -> None:
        if offset_s < 0:
            raise ValueError(f"offset_s must be >= 0, got {offset_s}")
        self.trace = trace
        self.offset_s = float(offset_s)
        self.burst_bytes = int(burst_bytes)
        self.burst_s = float(burst_s)
        self.start = time.monotonic() if start is None else float(start)
        # Position of the link in the trace's cumulative-bytes axis: everything reserved so far.
        self._served = trace.cumulative(self.offset_s) if trace is not None else 0.0
        self.bytes_reserved = 0
        #: capacity that passed unused beyond the bucket (bytes): what the trace offered and nobody
        #: booked in time (an idle phone, or a proxy that ran late on a loaded machine)
        self.lost_bytes = 0.0
        #: ... of which before the first byte was booked (the link idle before any traffic)
        self.lost_before_first_bytes = 0.0

    def trace_time(self, now: float) -> float:
        """Trace time (seconds) corresponding to monotonic ``now``."""
        return self.offset_s + max(0.0, now - self.start)

    def reserve(self, nbytes: int, now: float) -> float:
        """Book ``nbytes`` on the link at monotonic time ``now``; returns the monotonic time at which
        they have been carried (>= now only if the link is busy; earlier values mean "send now")."""
        self.bytes_reserved += nbytes
        if self.trace is None:
            return now
        t = self.trace_time(now)
        cap_now = self.trace.cumulative(t)
        burst = min(self.burst_bytes, cap_now - self.trace.cumulative(max(0.0, t - self.burst_s)))
        floor = cap_now - burst  # idle capacity beyond the burst is lost
        if floor > self._served:
            self.lost_bytes += floor - self._served
            if self.bytes_reserved == nbytes:  # the first booking: all of it was idle before traffic
                self.lost_before_first_bytes = self.lost_bytes
        base = max(self._served, floor)
        self._served = base + nbytes
        return self.start + (self.trace.time_at(self._served) - self.offset_s)

    def chunk_bytes(self, now: float) -> int:
        """A write size that keeps pacing smooth: ~5 ms of the current rate, 1500..65536 bytes."""
        if self.trace is None:
            return 65536
        r = self.trace.rate_at(self.trace_time(now))
        return int(min(65536, max(1500, r * 0.005)))


@dataclass
class ProxyStats:
    accepted: int = 0          # connections accepted from clients
    active: int = 0            # connections open now
    down_bytes: int = 0        # bytes delivered to clients
    up_bytes: int = 0          # bytes forwarded to the server
    cut: int = 0               # connections dropped by fault injection


class PacingProxy(Listener):
    """TCP proxy on ``listen_host`` that shapes server->client traffic with a ``Link``.

    Args:
        upstream: ``(host, port)`` of the real server.
        link: the phone's downlink (shared by all connections through this proxy).
        rtt_s: round-trip propagation delay (seconds), half on each direction.
        horizon_s: how far ahead of the link the proxy may read from the server (seconds).
        cut_after_bytes: fault injection; drop each connection after this many downlink bytes.
        cut_limit: drop at most this many connections (None: every one), e.g. 1 = only the first.
    Use ``async with PacingProxy(...) as proxy: proxy.url`` (or ``await start()`` / ``close()``).
    """

    def __init__(self, upstream: tuple[str, int], link: Link, *, rtt_s: float = 0.0, listen_host: str = "127.0.0.1",
                 listen_port: int = 0, horizon_s: float = 0.05, cut_after_bytes: int | None = None,
                 cut_limit: int | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if rtt_s < 0:
            raise ValueError(f"rtt_s must be >= 0, got {rtt_s}")
        self.upstream = upstream
        self.link = link
        self.rtt_s = float(rtt_s)
        self.horizon_s = float(horizon_s)
        self.cut_after_bytes = cut_after_bytes
        self.cut_limit = cut_limit
        self.listen = (listen_host, listen_port)
        self.clock = clock
        self.stats = ProxyStats()
        self._conns: set[asyncio.Task] = set()

    @property
    def url(self) -> str:
        return f"http://{self.listen[0]}:{self.port}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for t in list(self._conns):
                t.cancel()
            await asyncio.gather(*self._conns, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> "PacingProxy":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _on_client(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        self.stats.accepted += 1
        self.stats.active += 1
        try:
            await self._relay(cr, cw, self.clock())
        except asyncio.CancelledError:
            pass  # proxy closing; asyncio would log a handler's CancelledError as an error
        finally:
            cw.close()
            self.stats.active -= 1
            self._conns.discard(task)

    async def _relay(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter, accepted_at: float) -> None:
        try:
            ur, uw = await asyncio.open_connection(*self.upstream)
        except OSError as e:
            log.warning("upstream %s:%d unreachable: %s", *self.upstream, e)
            return
        up = asyncio.create_task(self._uplink(cr, uw, accepted_at))
        down = asyncio.create_task(self._downlink(ur, cw))
        try:
            # Either side ending ends the connection. HTTP clients never half-close, so EOF from
            # the client means it is gone (e.g. an abandoned fetch): stop pacing at once instead
            # of feeding a dead socket at trace speed.
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (up, down):
                t.cancel()
            await asyncio.gather(up, down, return_exceptions=True)
            uw.close()

    async def _sleep_until(self, t: float) -> None:
        d = t - self.clock()
        if d > 0:
            await asyncio.sleep(d)

    async def _uplink(self, cr: asyncio.StreamReader, uw: asyncio.StreamWriter, accepted_at: float) -> None:
        first = True
        half = self.rtt_s / 2
        with contextlib.suppress(ConnectionError):
            while data := await cr.read(65536):
                now = self.clock()
                # first request: + one RTT for the handshake loopback did not really pay
                await self._sleep_until((max(now, accepted_at + self.rtt_s) if first else now) + half)
                first = False
                uw.write(data)
                self.stats.up_bytes += len(data)
                await uw.drain()

    async def _downlink(self, ur: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        q: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        half = self.rtt_s / 2
        ahead = [self.clock()]  # link-ready time of the last chunk reserved on this connection

        async def reader() -> None:
            try:
                while True:
                    now = self.clock()
                    if ahead[0] - now > self.horizon_s:  # backpressure: don't run far ahead of the link
                        await asyncio.sleep(ahead[0] - now - self.horizon_s)
                        continue
                    data = await ur.read(self.link.chunk_bytes(now))
                    if not data:
                        break
                    now = self.clock()
                    step = self.link.chunk_bytes(now)
                    for i in range(0, len(data), step):
                        piece = data[i:i + step]
                        ready = self.link.reserve(len(piece), now)
                        ahead[0] = max(ahead[0], ready)
                        q.put_nowait((max(ready, now) + half, piece))
            finally:
                q.put_nowait(None)

        rt = asyncio.create_task(reader())
        sent = 0
        try:
            while (item := await q.get()) is not None:
                t, piece = item
                await self._sleep_until(t)
                if (self.cut_after_bytes is not None and sent + len(piece) > self.cut_after_bytes
                        and (self.cut_limit is None or self.stats.cut < self.cut_limit)):
                    piece = piece[: self.cut_after_bytes - sent]
                    cw.write(piece)
                    self.stats.down_bytes += len(piece)
                    self.stats.cut += 1
                    cw.transport.abort()  # RST mid-body: the client sees a dropped connection
                    return
                cw.write(piece)
                sent += len(piece)
                self.stats.down_bytes += len(piece)
                await cw.drain()
            with contextlib.suppress(OSError):
                cw.write_eof()
        except ConnectionError:
            pass
        finally:
            rt.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await rt


@contextlib.asynccontextmanager
async def paced(upstream_url: str, trace: Trace | None, *, offset_s: float = 0.0, rtt_s: float = 0.0,
                **kw) -> AsyncIterator[PacingProxy]:
    """``async with paced("http://127.0.0.1:8080", trace, rtt_s=0.05) as proxy:`` then fetch via
    ``proxy.url``. The link clock starts when the proxy is up."""

    u = urlsplit(upstream_url)
    link = Link(trace, offset_s=offset_s)
    async with PacingProxy((u.hostname or "127.0.0.1", u.port or 80), link, rtt_s=rtt_s, **kw) as proxy:
        yield proxy


@contextlib.contextmanager
def proxy_in_thread(start, name: str = "sakura-proxy", timeout_s: float = 30.0) -> Iterator:
    """Run an asyncio proxy on its own event loop in a daemon thread, for synchronous callers
    (benchmarks, tests). `start()` is a coroutine returning the started proxy, which must have
    an async `close()`; yields the proxy. A failure to start is raised here."""

    with running_in_thread(start, lambda px: px.close(), name=name, timeout_s=timeout_s) as px:
        yield px


@contextlib.contextmanager
def pacing_proxy_in_thread(upstream_url: str, trace, offset_s: float, rtt_s: float, **kw) -> Iterator[PacingProxy]:
    """The pacing proxy in a daemon thread (see `proxy_in_thread`); yields the proxy (``.url``,
    ``.stats``, ``.link``: read them, from this thread, once its traffic has ended). ``kw``:
    `PacingProxy` options."""

    u = urlsplit(upstream_url)

    async def start() -> PacingProxy:
        return await PacingProxy((u.hostname, u.port), Link(trace, offset_s=offset_s), rtt_s=rtt_s, **kw).start()

    with proxy_in_thread(start, name="sakura-pacer") as px:
        yield px


@contextlib.contextmanager
def pacer_in_thread(upstream_url: str, trace, offset_s: float, rtt_s: float) -> Iterator[str]:
    """The pacing proxy in a daemon thread (see `proxy_in_thread`); yields its URL."""
    with pacing_proxy_in_thread(upstream_url, trace, offset_s, rtt_s) as px:
        yield px.url
