"""A TCP proxy on 127.0.0.1 that breaks the server->phone path on purpose, for fault tests and
`sakura bench faults`.

Faults (one per proxy):

* ``reset``: after ``after_bytes`` downlink bytes (counted over all connections), abort the
  connection carrying them (TCP RST), once; later connections pass.
* ``reset-always``: abort every connection once it has carried ``after_bytes`` bytes.
* ``stall``: after ``after_bytes`` downlink bytes, forward nothing more, on any connection, while
  keeping them open (the link fell to zero).
* ``http500``: answer every request with ``500 Internal Server Error`` without asking the server.

Unreachable servers and corrupt objects need no proxy: a closed port, and a store file with a
flipped byte (the phone's sha256 check must catch it).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Iterator

FAULTS = ("reset", "reset-always", "stall", "http500")


class FaultProxy:
    def __init__(self, upstream: tuple[str, int], fault: str, after_bytes: int = 0):
        if fault not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS}, got {fault!r}")
        self.upstream = upstream
        self.fault = fault
        self.after_bytes = int(after_bytes)
        self.down_bytes = 0
        self.triggered = 0
        self._server: asyncio.base_events.Server | None = None
        self._stalled = asyncio.Event()

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    async def start(self) -> "FaultProxy":
        self._server = await asyncio.start_server(self._on_client, "127.0.0.1", 0)
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._stalled.set()

    async def _on_client(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        if self.fault == "http500":
            try:
                while await _read_request(cr):
                    body = b"injected server error\n"
                    cw.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                    await cw.drain()
            finally:
                cw.close()
            return
        try:
            ur, uw = await asyncio.open_connection(*self.upstream)
        except OSError:
            cw.close()
            return
        conn_bytes = 0

        async def up() -> None:
            while data := await cr.read(65536):
                uw.write(data)
                await uw.drain()
            uw.close()

        async def down() -> None:
            nonlocal conn_bytes
            while data := await ur.read(16384):
                if self.fault == "stall" and self.down_bytes + len(data) > self.after_bytes:
                    keep = max(0, self.after_bytes - self.down_bytes)
                    if keep:
                        cw.write(data[:keep])
                        self.down_bytes += keep
                        await cw.drain()
                    self.triggered += 1
                    await self._stalled.wait()  # hold the connection open, send nothing
                    return
                count = self.down_bytes if self.fault == "reset" else conn_bytes
                if self.fault.startswith("reset") and count + len(data) > self.after_bytes and \
                        (self.fault == "reset-always" or self.triggered == 0):
                    keep = max(0, self.after_bytes - count)
                    cw.write(data[:keep])
                    await cw.drain()
                    self.triggered += 1
                    _abort(cw)
                    return
                cw.write(data)
                self.down_bytes += len(data)
                conn_bytes += len(data)
                await cw.drain()
            cw.close()

        tasks = [asyncio.create_task(up()), asyncio.create_task(down())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            uw.close()
            cw.close()


async def _read_request(r: asyncio.StreamReader) -> bool:
    """Consume one request's head (GET/HEAD have no body); False at EOF."""
    try:
        await r.readuntil(b"\r\n\r\n")
        return True
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return False


def _abort(w: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), as a middlebox or a dying server does."""
    sock = w.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    w.transport.abort()


@contextlib.contextmanager
def fault_proxy_in_thread(upstream_url: str, fault: str, after_bytes: int = 0) -> Iterator[tuple[str, FaultProxy]]:
    """Run a `FaultProxy` in a daemon thread; yields (its URL, the proxy)."""
    from urllib.parse import urlsplit

    from sakura.link.pacer import proxy_in_thread

    u = urlsplit(upstream_url)
    with proxy_in_thread(lambda: FaultProxy((u.hostname, u.port), fault, after_bytes).start(), name="sakura-faults",
                         timeout_s=10.0) as px:
        yield f"http://127.0.0.1:{px.port}", px
