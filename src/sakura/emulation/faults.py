"""A TCP proxy on 127.0.0.1 that breaks the server->phone path on purpose, for fault tests and
`sakura bench faults`.

Faults (one per proxy):

* ``reset``: after ``after_bytes`` downlink bytes (counted over all connections), abort the
  connection carrying them (TCP RST), once; later connections pass.
* ``reset-always``: abort every connection once it has carried ``after_bytes`` bytes.
* ``stall``: after ``after_bytes`` downlink bytes, forward nothing more, on any connection, while
  keeping them open (the link fell to zero).
* ``http500``: answer every request with ``500 Internal Server Error`` without asking the server.

`HostileServer` (below) misbehaves at the HTTP level instead: drip, stall after the headers,
huge declared sizes, redirect elsewhere, wrong object, or record every request (privacy tests).

Unreachable servers and corrupt objects need no proxy: a closed port, and a store file with a
flipped byte (the phone's sha256 check must catch it).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass
from typing import Iterator

from sakura.emulation.listener import Listener
from sakura.emulation.pacer import proxy_in_thread
from sakura.wire.store.manifest import encode_manifest_tree, manifest_tree
from urllib.parse import urlsplit

FAULTS = ("reset", "reset-always", "stall", "http500")


class FaultProxy(Listener):
    def __init__(self, upstream: tuple[str, int], fault: str, after_bytes: int = 0):
        if fault not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS}, got {fault!r}")
        self.upstream = upstream
        self.fault = fault
        self.after_bytes = int(after_bytes)
        self.down_bytes = 0
        self.triggered = 0
        self._stalled = asyncio.Event()
        self._conns: set[asyncio.Task] = set()

    async def close(self) -> None:
        """Stop listening and end every connection's task before the loop closes: a connection
        still open (an idle keep-alive one, or one `reset-always` left half-done) otherwise had
        its tasks destroyed pending and cancelled them on a closed loop ("Event loop is closed")."""
        if self._server is not None:
            self._server.close()
            self._stalled.set()
            for t in list(self._conns):
                t.cancel()
            await asyncio.gather(*self._conns, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None

    async def _on_client(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            await self._serve(cr, cw)
        except asyncio.CancelledError:
            pass  # proxy closing; asyncio would log a handler's CancelledError as an error
        finally:
            cw.close()
            self._conns.discard(task)

    async def _serve(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
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
            await asyncio.gather(*tasks, return_exceptions=True)  # ended here, not left to the loop's close
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


    u = urlsplit(upstream_url)
    with proxy_in_thread(lambda: FaultProxy((u.hostname, u.port), fault, after_bytes).start(), name="sakura-faults",
                         timeout_s=10.0) as px:
        yield f"http://127.0.0.1:{px.port}", px


# ---------------------------------------------------------------------------------------------
# hostile HTTP servers: what a malicious or broken origin does at the HTTP level

#: Request-level behaviours of `HostileServer` (one per server):
#:
#: * ``record``: pass every request through unchanged and keep its head (method, path, headers in
#:   order): the recording relay of the privacy test.
#: * ``drip``: the response head at once, then the body one byte every ``drip_s`` seconds.
#: * ``stall-body``: the response head at once, then nothing, connection held open.
#: * ``huge``: manifests are rewritten to declare a ``huge_bytes`` template reference, and that
#:   object is answered with ``huge_bytes`` of zeros (Content-Length and all).
#: * ``redirect``: every request answered ``302`` to the same path on ``redirect_to`` (another
#:   origin, which counts what reaches it).
#: * ``wrong-object``: every object request answered with another object's bytes (``wrong_path``).
HOSTILE = ("record", "drip", "stall-body", "huge", "redirect", "wrong-object")


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: tuple[tuple[str, str], ...]  # in the order sent, names as sent
    raw: bytes  # the request head's bytes


class HostileServer(Listener):
    """An HTTP/1.1 front on 127.0.0.1 for an upstream ``sakura serve`` that misbehaves on purpose
    (`HOSTILE`). Each client request goes upstream on its own connection (``Connection: close``),
    so response bodies are delimited by EOF and the front can rewrite or pace them."""

    def __init__(self, upstream: tuple[str, int], mode: str, *, drip_s: float = 2.0, huge_bytes: int = 1_500_000_000,
                 redirect_to: str = "", wrong_path: str = "", honest_paths: frozenset[str] | set[str] = frozenset()):
        if mode not in HOSTILE:
            raise ValueError(f"mode must be one of {HOSTILE}, got {mode!r}")
        if mode == "redirect" and not redirect_to:
            raise ValueError("mode 'redirect' needs redirect_to (http://host:port)")
        if mode == "wrong-object" and not wrong_path.startswith("/objects/"):
            raise ValueError("mode 'wrong-object' needs wrong_path (/objects/xx/<sha256>)")
        self.upstream, self.mode = upstream, mode
        self.drip_s, self.huge_bytes = float(drip_s), int(huge_bytes)
        self.redirect_to, self.wrong_path = redirect_to.rstrip("/"), wrong_path
        self.honest_paths = frozenset(honest_paths)  # answered honestly (e.g. the manifest, to reach the shards)
        self.requests: list[RecordedRequest] = []
        self.huge_sha: str | None = None
        self._closed = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self._closed.set()
        for t in list(self._tasks):  # end every connection's task before the loop closes
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _on_client(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            while True:
                try:
                    head = await cr.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                req = _parse_head(head)
                self.requests.append(req)
                if not await self._answer(req, cw):
                    return
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            cw.close()

    async def _answer(self, req: RecordedRequest, cw: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection must end."""
        if req.path in self.honest_paths or self.mode == "record":
            status_head, body = await self._upstream(req, req.path)
            cw.write(_set_length(status_head, len(body)) + body)
            await cw.drain()
            return True
        if self.mode == "redirect":
            loc = f"{self.redirect_to}{req.path}"
            cw.write(f"HTTP/1.1 302 Found\r\nLocation: {loc}\r\nContent-Length: 0\r\n\r\n".encode())
            await cw.drain()
            return True
        path = req.path
        if self.mode == "wrong-object" and path.startswith("/objects/"):
            path = self.wrong_path
        if self.mode == "huge" and self.huge_sha is not None and path.endswith("/" + self.huge_sha):
            cw.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n"
                     % self.huge_bytes)
            zeros, sent = bytes(1 << 16), 0
            while sent < self.huge_bytes and not self._closed.is_set():
                n = min(len(zeros), self.huge_bytes - sent)
                cw.write(zeros[:n])
                await cw.drain()
                sent += n
            return True
        status_head, body = await self._upstream(req, path)
        if self.mode == "huge" and path.startswith("/manifests/") and status_head.startswith(b"HTTP/1.1 200"):
            body = self._inflate_manifest(body)
        head = _set_length(status_head, len(body))
        if self.mode in ("drip", "stall-body"):
            cw.write(head)
            await cw.drain()
            if self.mode == "stall-body":
                await self._closed.wait()
                return False
            for i in range(len(body)):
                cw.write(body[i:i + 1])
                await cw.drain()
                await asyncio.sleep(self.drip_s)
            return True
        cw.write(head + body)
        await cw.drain()
        return True

    async def _upstream(self, req: RecordedRequest, path: str) -> tuple[bytes, bytes]:
        ur, uw = await asyncio.open_connection(*self.upstream)
        try:
            lines = [f"{req.method} {path} HTTP/1.1"] + [f"{k}: {v}" for k, v in req.headers
                                                          if k.lower() not in ("connection", "keep-alive")]
            uw.write(("\r\n".join(lines) + "\r\nConnection: close\r\n\r\n").encode("latin-1"))
            await uw.drain()
            head = await ur.readuntil(b"\r\n\r\n")
            body = b"" if req.method == "HEAD" else await ur.read(-1)
            return head, body
        finally:
            uw.close()

    def _inflate_manifest(self, body: bytes) -> bytes:

        try:
            d = manifest_tree(body)
            d["template_ref"]["object"]["bytes"] = self.huge_bytes
            self.huge_sha = d["template_ref"]["object"]["sha256"]
        except (ValueError, KeyError, TypeError):
            return body
        return encode_manifest_tree(d)


def _parse_head(head: bytes) -> RecordedRequest:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    method, path = (parts[0], parts[1]) if len(parts) >= 2 else ("?", "?")
    headers = tuple((k.strip(), v.strip()) for k, _, v in (ln.partition(":") for ln in lines[1:] if ln))
    return RecordedRequest(method, path, headers, head)


def _set_length(head: bytes, n: int) -> bytes:
    """The upstream response head with Content-Length n and Connection/Transfer-Encoding dropped
    (the front keeps the client's connection alive itself)."""
    lines = head.decode("latin-1").rstrip("\r\n").split("\r\n")
    keep = [ln for ln in lines[1:] if ln.split(":", 1)[0].strip().lower()
            not in ("content-length", "connection", "transfer-encoding", "keep-alive")]
    return ("\r\n".join([lines[0], *keep, f"Content-Length: {n}"]) + "\r\n\r\n").encode("latin-1")


@contextlib.contextmanager
def hostile_in_thread(upstream_url: str, mode: str, **kw) -> Iterator[tuple[str, HostileServer]]:
    """Run a `HostileServer` in a daemon thread; yields (its URL, the server)."""


    u = urlsplit(upstream_url)
    with proxy_in_thread(lambda: HostileServer((u.hostname, u.port), mode, **kw).start(), name="sakura-hostile",
                         timeout_s=10.0) as srv:
        yield f"http://127.0.0.1:{srv.port}", srv
