"""`sakura serve`: an aiohttp server for a store directory.

Routes (raw request path must match exactly; everything else is 404, or 400 if it looks like an
escape attempt): ``/index.json``, ``/manifests/<fp>/<template>.json``, ``/objects/<xx>/<sha256>``.
GET and HEAD only (405 otherwise). Objects are streamed from disk in ``chunk_bytes`` pieces, so
memory per request is bounded; ETag of an object is its sha256 (strong, identical on every
replica), of a manifest the sha256 of its current bytes. Single byte Range (206/416), If-Range,
If-None-Match (304). The access log (logger ``sakura.wire.server.access``) holds method, resource kind,
public object/template id, status, bytes and duration: no client address, no headers, no query.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import stat
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable, Iterator, Protocol

from aiohttp import web, web_protocol, web_server

from sakura.wire.server.ranges import RangeError, RangeNotSatisfiable, byte_range, if_none_match_hits, if_range_allows
from sakura.wire.store.layout import INDEX_URL, MANIFEST_URL_RE, OBJECT_URL_RE
from sakura.wire.store.store import open_in_store, store_format
import socket
from sakura.util.aiothread import running_in_thread

log = logging.getLogger("sakura.wire.server")
access_log = logging.getLogger("sakura.wire.server.access")

#: Bytes read from disk and written per step when streaming an object.
DEFAULT_CHUNK_BYTES = 256 * 1024
#: Manifests/index are read whole (they are small); anything larger is refused as corrupt.
MAX_SMALL_FILE_BYTES = 16 * 1024 * 1024
#: Largest request line / single header field accepted (bytes); larger -> 400 from aiohttp.
MAX_FIELD_BYTES = 8190

_OBJECT_CACHE_CONTROL = "public, max-age=31536000, immutable"  # content-addressed: never changes
_MANIFEST_CACHE_CONTROL = "no-cache"  # may be rebuilt: revalidate with the ETag every time

class _RedactFilter(logging.Filter):
    """aiohttp's protocol errors name the client address and echo the bad request bytes; keep
    the event, drop the details, so no log line holds user data."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        record.msg, record.args = "protocol error (%s); client details withheld", (type(exc).__name__ if exc else "-",)
        record.exc_info = record.exc_text = None
        return True


protocol_log = logging.getLogger("sakura.wire.server.protocol")
protocol_log.addFilter(_RedactFilter())


class _RateLimitFilter(logging.Filter):
    """At most ``burst`` records per message template per ``window_s``; the next one let through
    says how many were dropped. Under fd exhaustion asyncio and aiohttp log a traceback per
    failed accept/request (194,529 in 6 s, 86 MB); one line per template per window is enough."""

    def __init__(self, window_s: float = 10.0, burst: int = 5) -> None:
        super().__init__()
        self.window_s, self.burst = window_s, burst
        self._seen: dict[tuple[str, object], list] = {}  # key -> [window start, count, dropped]
        self._lock = threading.Lock()

    def reset(self) -> None:
        with self._lock:
            self._seen.clear()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.msg)
        now = time.monotonic()
        with self._lock:
            st = self._seen.get(key)
            if st is None or now - st[0] >= self.window_s:
                dropped = st[2] if st is not None else 0
                if len(self._seen) > 1024:
                    self._seen.clear()
                self._seen[key] = [now, 1, 0]
                if dropped:
                    record.msg = f"{record.msg} [{dropped} similar message(s) suppressed in the last {self.window_s:.0f} s]"
                return True
            st[1] += 1
            if st[1] <= self.burst:
                return True
            st[2] += 1
            return False


#: Loggers that repeat one line per connection under load or attack; all rate-limited.
_NOISY_LOGGERS = ("asyncio", "aiohttp.server", "aiohttp.web", "sakura.wire.server", "sakura.wire.server.protocol")
_rate_limit = _RateLimitFilter()
for _name in _NOISY_LOGGERS:
    logging.getLogger(_name).addFilter(_rate_limit)


def _exception_handler(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """Event-loop errors (e.g. accept() failing with EMFILE) as one rate-limited line, no traceback."""
    exc = context.get("exception")
    log.error("event loop: %s%s", context.get("message", "error"), f" ({type(exc).__name__}: {exc})" if exc else "")


# ------------------------------------------------------------------------ connection guarding
#: Seconds a new connection has to deliver a complete request head (nginx: client_header_timeout).
DEFAULT_HEADER_TIMEOUT_S = 10.0
#: Seconds an idle keep-alive connection is kept between requests (nginx: keepalive_timeout).
DEFAULT_IDLE_TIMEOUT_S = 15.0


#: Connections the server holds at most, whatever the fd limit (nginx: worker_connections).
MAX_CONNECTIONS_CEILING = 16384


def _nofile_soft() -> int:
    try:
        import resource  # lazy: Unix only

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return 65536 if soft == resource.RLIM_INFINITY else int(soft)
    except (ImportError, ValueError, OSError):
        return 1024


def _fds_in_use() -> int:
    """Open fds of this process now (``/proc/self/fd``; elsewhere a guess of 32)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 32


def default_fd_reserve(soft: int | None = None) -> int:
    """fds kept free below the limit for what connections need besides their socket (the file a
    request is being served from, a log file, the loop's own): ``max(16, soft // 8)``."""
    soft = _nofile_soft() if soft is None else soft
    return max(16, soft // 8)


def default_max_connections(fd_reserve: int = 0) -> int:
    """Open connections the server holds at most: the process's fd limit (``RLIMIT_NOFILE``)
    less the fds already open and a reserve (``fd_reserve``, default `default_fd_reserve`),
    at least 4 and at most ``MAX_CONNECTIONS_CEILING``."""
    soft = _nofile_soft()
    reserve = fd_reserve or default_fd_reserve(soft)
    return max(4, min(MAX_CONNECTIONS_CEILING, soft - _fds_in_use() - reserve))


#: Seconds a new connection is safe from eviction: a client must have time to send its request
#: head. Without it, clients churning idle sockets at the cap got a normal request's connection
#: evicted ~15 ms after it was accepted, before its head was read (4 of 20 requests failed).
DEFAULT_EVICT_GRACE_S = 0.5


@dataclass(frozen=True)
class ConnectionLimits:
    """Header-read and idle timeouts (s), the connection cap (0: from the fd limit,
    `default_max_connections`) and the fds kept in reserve below the limit (0: default)."""

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    max_connections: int = 0  # 0: default_max_connections()
    fd_reserve: int = 0  # 0: default_fd_reserve()
    evict_grace_s: float = DEFAULT_EVICT_GRACE_S




def _evict_idle(conns, *, keep=None, grace_s: float = 0.0) -> bool:
    """Close the oldest connection that is not serving a request (a slow, idle or never-speaking
    client) and is older than ``grace_s``; True if one was closed."""
    born_before = time.monotonic() - grace_s
    idle = [c for c in conns if c is not keep and not getattr(c, "_request_in_progress", True)
            and getattr(c, "_born", 0.0) <= born_before
            and c.transport is not None and not c.transport.is_closing()]
    if not idle:
        return False
    victim = min(idle, key=lambda c: getattr(c, "_born", 0.0))
    transport = victim.transport  # force_close() forgets it
    victim.force_close()
    if transport is not None:
        transport.close()
    return True


class _Acceptor:
    """Accepts on the listening socket only while the fd budget has room: asyncio's own accept
    loop takes connections until the process runs out of fds (then logs and retries every accept
    in a tight loop: 109,468 failed accepts in 19.5 s at ``ulimit -n 64``), before any cap can act.

    At the cap (or on EMFILE) it closes the oldest idle connection older than ``grace_s`` and stops
    reading the listening socket; it resumes when a connection closes (or after ``retry_s`` on
    EMFILE). New clients wait in the kernel's backlog meanwhile, instead of being accepted and
    dropped; a new connection has ``grace_s`` to send its request before it can be evicted."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock, srv, cap: int, retry_s: float = 0.05,
                 grace_s: float = DEFAULT_EVICT_GRACE_S) -> None:
        self.loop, self.sock, self.srv, self.cap, self.retry_s = loop, sock, srv, cap, retry_s
        self.grace_s = grace_s
        self.sockets = [sock]  # what aiohttp's runner.addresses reads
        self.pending = 0  # accepted, not yet handed to a protocol
        self.paused = False
        self.closed = False
        self.pauses = 0
        self.fd_errors = 0
        self.evicted = 0
        self._retry: asyncio.TimerHandle | None = None
        loop.add_reader(sock.fileno(), self._on_readable)

    def _room(self) -> int:
        return self.cap - len(self.srv.connections) - self.pending

    def _pause(self, retry_s: float | None = None) -> None:
        if not self.paused and not self.closed:
            self.loop.remove_reader(self.sock.fileno())
            self.paused = True
            self.pauses += 1
        if retry_s is not None and self._retry is None:
            self._retry = self.loop.call_later(retry_s, self.resume)

    def resume(self) -> None:
        """Read the listening socket again (a connection closed: there is room)."""
        self._retry = None
        if self.paused and not self.closed:
            self.paused = False
            self.loop.add_reader(self.sock.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        for _ in range(64):  # bounded per wake-up: the loop serves requests in between
            if self._room() <= 0:
                if _evict_idle(self.srv.connections, grace_s=self.grace_s):
                    self.evicted += 1
                    self._pause(retry_s=1.0)  # resumed at once by that connection's connection_lost
                else:  # every connection busy or new: look again when the youngest may be evictable
                    self._pause(retry_s=max(0.01, self.grace_s / 4))
                return
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # out of fds despite the reserve (something else holds them): make room,
                    # stop reading the socket for a moment instead of spinning on it
                    self.fd_errors += 1
                    if _evict_idle(self.srv.connections, grace_s=self.grace_s):
                        self.evicted += 1
                    log.warning("accept: %s; pausing accepts", e.strerror)
                    self._pause(retry_s=self.retry_s)
                    return
                log.warning("accept: %s", e)
                return
            conn.setblocking(False)
            self.pending += 1
            self.loop.create_task(self._start(conn))

    async def _start(self, conn) -> None:
        try:
            await self.loop.connect_accepted_socket(self.srv, sock=conn)
        except Exception as e:  # the client left already, or fds ran out for the transport
            log.debug("connection setup failed: %r", e)
            conn.close()
        finally:
            self.pending -= 1

    def close(self) -> None:
        if self.closed:
            return
        if not self.paused:
            self.loop.remove_reader(self.sock.fileno())
        if self._retry is not None:
            self._retry.cancel()
        self.closed = True
        self.sock.close()

    async def wait_closed(self) -> None:
        return None


class _GuardedSite(web.BaseSite):
    """A TCP site whose accepting is `_Acceptor`'s (fd-budgeted) rather than asyncio's."""

    __slots__ = ("_host", "_port", "_cap", "_grace_s")

    def __init__(self, runner: web.AppRunner, host: str, port: int, cap: int, grace_s: float,
                 backlog: int = 1024) -> None:
        super().__init__(runner, backlog=backlog)
        self._host, self._port, self._cap, self._grace_s = host, port, cap, grace_s

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:

        await super().start()
        sock = socket.create_server((self._host, self._port), family=socket.AF_INET6 if ":" in self._host
                                    else socket.AF_INET, backlog=self._backlog, reuse_port=False)
        sock.setblocking(False)
        srv = self._runner.server
        acc = _Acceptor(asyncio.get_running_loop(), sock, srv, self._cap, grace_s=self._grace_s)
        srv._sakura_acceptor = acc  # type: ignore[union-attr]
        self._server = acc  # type: ignore[assignment]


class _GuardedHandler(web_protocol.RequestHandler):
    """aiohttp's protocol with a header deadline: a connection that has not delivered a complete
    request head within ``header_timeout_s`` of connecting is closed (aiohttp itself has no
    header timeout; a slow-header client held its fd for ever). Later requests on a keep-alive
    connection are bounded by aiohttp's ``keepalive_timeout`` (= ``idle_timeout_s``), whose
    close fires while no request is complete."""

    __slots__ = ("_header_timer", "_born")

    def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        # aiohttp's 400 body is its parser's message, which quotes the bad request bytes back (a
        # request line, a header): answer with the status alone, as the log does (_RedactFilter)
        if status != 500:
            message = f"{status} {HTTPStatus(status).phrase}: malformed HTTP request (not echoed back)"
        return super().handle_error(request, status, exc, message)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        limits: ConnectionLimits = self._manager._sakura_limits  # type: ignore[union-attr]
        self._born = time.monotonic()
        self._header_timer = None
        super().connection_made(transport)
        mgr = self._manager
        cap = mgr._sakura_cap  # type: ignore[union-attr]
        conns = mgr.connections if mgr is not None else []
        if len(conns) > cap:
            # Over the cap (the acceptor keeps below it; a backstop): drop the oldest connection
            # that has not sent a complete request so a real request still gets in; if every one
            # is busy, this one.
            mgr._sakura_evicted += 1  # type: ignore[union-attr]
            if not _evict_idle(conns, keep=self):
                self.force_close()
                if self.transport is not None:
                    self.transport.close()
                return
        self._header_timer = self._loop.call_later(limits.header_timeout_s, self._header_expired)

    def _header_expired(self) -> None:
        self._header_timer = None
        if getattr(self, "_request_count", 1) == 0 and self._manager is not None:
            self._manager._sakura_timed_out += 1  # type: ignore[attr-defined]
            self.force_close()
            if self.transport is not None:
                self.transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._header_timer is not None and getattr(self, "_request_count", 0) > 0:
            self._header_timer.cancel()
            self._header_timer = None

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        mgr = self._manager
        super().connection_lost(exc)
        acc = getattr(mgr, "_sakura_acceptor", None)
        if acc is not None and acc.paused:
            self._loop.call_soon(acc.resume)  # after the transport closed its socket


class _GuardedServer(web_server.Server):
    def __call__(self) -> web_protocol.RequestHandler:
        return _GuardedHandler(self, loop=self._loop, **self._kwargs)


def _guard(runner: web.AppRunner, limits: ConnectionLimits) -> None:
    srv = runner.server
    assert srv is not None and type(srv) is web_server.Server, "guard after runner.setup()"
    srv.__class__ = _GuardedServer  # same layout (no new slots): only the protocol factory differs
    srv._sakura_limits = limits  # type: ignore[attr-defined]
    budget = default_max_connections(limits.fd_reserve)
    if limits.max_connections > budget:
        log.warning("max_connections %d is over what the fd limit allows (%d, RLIMIT_NOFILE %d less a reserve); "
                    "using %d", limits.max_connections, budget, _nofile_soft(), budget)
    srv._sakura_cap = min(limits.max_connections, budget) if limits.max_connections else budget  # type: ignore[attr-defined]
    srv._sakura_timed_out = 0  # type: ignore[attr-defined]
    srv._sakura_evicted = 0  # type: ignore[attr-defined]


def connection_counts(runner: web.AppRunner) -> dict[str, int]:
    """``open`` connections now, ``header_timeouts`` and ``evicted`` so far (for tests, the bench)."""
    srv = runner.server
    acc = getattr(srv, "_sakura_acceptor", None)
    return {"open": len(srv.connections) if srv is not None else 0,
            "header_timeouts": getattr(srv, "_sakura_timed_out", 0),
            "evicted": getattr(srv, "_sakura_evicted", 0) + (acc.evicted if acc is not None else 0),
            "cap": getattr(srv, "_sakura_cap", 0), "accept_pauses": acc.pauses if acc is not None else 0,
            "accept_fd_errors": acc.fd_errors if acc is not None else 0}

# ------------------------------------------------------------------------ objects match their names
#: Objects up to this size are hashed on the event loop (~0.2 ms); larger ones in a worker thread.
INLINE_HASH_BYTES = 256 * 1024
#: Verified files remembered at most (an entry is ~200 bytes: 50 MB at the cap); beyond it the
#: least recently served are forgotten and hashed again on their next request.
MAX_VERIFIED_OBJECTS = 1 << 18


def _sha256_fd(fd: int, size: int) -> str:
    """sha256 of the first ``size`` bytes of ``fd`` (``os.pread``: the file position is untouched)."""
    h = hashlib.sha256()
    off = 0
    while off < size:
        chunk = os.pread(fd, min(1 << 20, size - off), off)
        if not chunk:
            break
        h.update(chunk)
        off += len(chunk)
    return h.hexdigest()


def _hash_dup(fd: int, size: int) -> str:
    try:
        return _sha256_fd(fd, size)
    finally:
        os.close(fd)


class VerifiedObjects:
    """The server's record of object files whose bytes it hashed to their name.

    An object is served only if its bytes hash to its name (a file placed under ``objects/`` by
    anything but a build, e.g. a hard link to a file outside the store, was served with a strong
    ETag it did not have, and an edge would have cached it for a year). Hashing every request would
    cost the whole file per Range request; instead the first request of a file hashes it and the
    file's identity is remembered: ``(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)``. Any
    change to the file (a rewrite, a replacement by rename, a new hard link, a chmod, even a
    ``touch -d`` that restores the mtime) changes the ctime or the inode, so the next request
    hashes again. What it does not see: bits that rot on disk after the check without a write
    (``sakura store verify`` finds those; a restart re-verifies everything).

    Concurrent first requests of one object share one hash (the others wait for it); a large
    object is hashed in a worker thread, from a duplicate of the fd, so the event loop keeps
    serving. A file found bad is remembered too (by the same identity) and refused at once."""

    def __init__(self, cap: int = MAX_VERIFIED_OBJECTS) -> None:
        self.cap = cap
        self._seen: OrderedDict[str, tuple[tuple[int, ...], bool]] = OrderedDict()
        self._pending: dict[tuple[str, tuple[int, ...]], asyncio.Future] = {}
        self.hashed = 0  # files hashed so far (the bench reports it)
        self.refused = 0  # requests refused because the bytes do not match the name

    @staticmethod
    def identity(st: os.stat_result) -> tuple[int, ...]:
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    async def matches(self, sha256: str, fd: int, st: os.stat_result) -> bool:
        """True if the open file ``fd`` (stat ``st``) holds bytes whose sha256 is ``sha256``."""
        ident = self.identity(st)
        seen = self._seen.get(sha256)
        if seen is not None and seen[0] == ident:
            self._seen.move_to_end(sha256)
            return seen[1]
        key = (sha256, ident)
        task = self._pending.get(key)
        if task is None:
            if st.st_size <= INLINE_HASH_BYTES:
                return self._remember(sha256, ident, _sha256_fd(fd, st.st_size) == sha256)
            # its own task (not the request's): a client that hangs up does not cancel the hash
            # others wait on, and the thread reads a dup of the fd, which the request may close
            task = asyncio.ensure_future(asyncio.to_thread(_hash_dup, os.dup(fd), st.st_size))
            self._pending[key] = task

            def done(t: asyncio.Future) -> None:
                self._pending.pop(key, None)
                if not t.cancelled() and t.exception() is None:
                    self._remember(sha256, ident, t.result() == sha256)

            task.add_done_callback(done)
        return (await asyncio.shield(task)) == sha256

    def _remember(self, sha256: str, ident: tuple[int, ...], ok: bool) -> bool:
        self.hashed += 1
        self._seen[sha256] = (ident, ok)
        self._seen.move_to_end(sha256)
        while len(self._seen) > self.cap:
            self._seen.popitem(last=False)
        return ok


STORE_KEY = web.AppKey("store_root", Path)
CHUNK_KEY = web.AppKey("chunk_bytes", int)
SENDFILE_KEY = web.AppKey("sendfile", bool)
VERIFIED_KEY = web.AppKey("verified_objects", VerifiedObjects)


def _suspicious(raw_path: str) -> bool:
    """Paths that look like traversal/encoding tricks get a 400 (they could never match anyway)."""
    low = raw_path.lower()
    return any(s in low for s in ("..", "%", "\\", "//", "\x00")) or any(ord(c) < 0x20 for c in raw_path)


class _Resource:
    __slots__ = ("kind", "label", "relpath", "immutable")

    def __init__(self, kind: str, label: str, relpath: str, immutable: bool) -> None:
        self.kind, self.label, self.relpath, self.immutable = kind, label, relpath, immutable


def resolve(raw_path: str) -> _Resource | None:
    """Map a raw URL path to a store file, or None. Only regex-validated components reach the
    filesystem path, so the result is always inside the store root."""
    m = OBJECT_URL_RE.fullmatch(raw_path)
    if m is not None:
        prefix, sha = m.groups()
        if sha[:2] != prefix:
            return None
        return _Resource("object", sha[:12], f"objects/{prefix}/{sha}", True)
    m = MANIFEST_URL_RE.fullmatch(raw_path)
    if m is not None:
        fp, tid = m.groups()
        return _Resource("manifest", f"{fp}/{tid}", f"manifests/{fp}/{tid}.json", False)
    if raw_path == INDEX_URL:
        return _Resource("index", "index", "index.json", False)
    return None


def _text(status: int, reason: str, **headers: str) -> web.Response:
    return web.Response(status=status, text=reason + "\n", headers=headers)


async def handle(request: web.Request) -> web.StreamResponse:
    t0 = time.perf_counter()
    raw = request.rel_url.raw_path
    res: _Resource | None = None
    status, sent = 500, 0
    try:
        if request.method not in ("GET", "HEAD"):
            status = 405
            return _text(405, f"method {request.method} not allowed: this server is read-only", Allow="GET, HEAD")
        if _suspicious(raw):
            status = 400
            return _text(400, "bad path: '..', '%', backslash, '//' and control characters are not allowed")
        res = resolve(raw)
        if res is None:
            status = 404
            return _text(404, "not found: expected /index.json, /manifests/<model>/<template>.json or /objects/<xx>/<sha256>")
        root: Path = request.app[STORE_KEY]
        if res.immutable:
            resp, status, sent = await _serve_object(request, root, res)
        else:
            resp, status, sent = await _serve_small(request, root, res)
        return resp
    except _OutOfFds:
        status = 503
        srv = getattr(request.protocol, "_manager", None)
        if srv is not None:
            _evict_idle(srv.connections)  # the next try finds an fd
        return _text(503, "server busy: out of file descriptors; retry", **{"Retry-After": "1"})
    except (ConnectionError, asyncio.CancelledError):
        status = 499  # client went away mid-transfer (nginx's convention); nothing to clean up
        raise
    finally:
        access_log.info("%s %s %s %d %d %.1fms", request.method, res.kind if res else "-",
                        res.label if res else "-", status, sent, (time.perf_counter() - t0) * 1e3)


class _OutOfFds(Exception):
    """No fd left to open the file a request asks for: answered 503 (never a false 404)."""


def _open_regular(root: Path, relpath: str) -> tuple[int, os.stat_result] | None:
    try:
        # No symlink is followed at any step (objects/xx included), the rule `store verify`
        # shares: a symlink planted in the store never leads out of it.
        fd = open_in_store(root, relpath)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except OSError as e:  # ELOOP from O_NOFOLLOW, EACCES, EINVAL (a FIFO or device), EMFILE...
        if e.errno in (errno.EMFILE, errno.ENFILE):
            raise _OutOfFds() from None
        log.warning("refusing to open %s (a symlink, not a regular file, or unreadable)", relpath)
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return None
    return fd, st


def _range_or_error(request: web.Request, size: int, etag: str) -> tuple[int, int, bool] | web.Response:
    """(start, stop, partial) or an error response. Range is ignored under a failing If-Range."""
    if not if_range_allows(request, etag):
        return 0, size, False
    try:
        rng = byte_range(request, size)
    except RangeNotSatisfiable as e:
        return _text(416, f"range not satisfiable: {e}", **{"Content-Range": f"bytes */{size}", "ETag": etag})
    except RangeError as e:
        return _text(400, f"bad Range header: {e}")
    return (0, size, False) if rng is None else (*rng, True)


async def _serve_object(request: web.Request, root: Path, res: _Resource) -> tuple[web.StreamResponse, int, int]:
    path = root / res.relpath
    opened = _open_regular(root, res.relpath)
    if opened is None:
        return _text(404, f"no object {path.name}"), 404, 0
    fd, st = opened
    with os.fdopen(fd, "rb", buffering=0) as f:
        verified = request.app.get(VERIFIED_KEY)
        if verified is not None and not await verified.matches(path.name, fd, st):
            verified.refused += 1
            log.error("object %s: its bytes do not hash to its name; refusing to serve it "
                      "(`sakura store verify %s` names it; rebuild, then purge it from any edge)", path.name, root)
            return _text(500, f"object {path.name[:12]}... on this server is damaged; not served",
                         **{"Cache-Control": "no-store"}), 500, 0
        size = st.st_size
        etag = f'"{path.name}"'
        common = {"ETag": etag, "Accept-Ranges": "bytes", "Cache-Control": _OBJECT_CACHE_CONTROL}
        if if_none_match_hits(request, etag):
            return web.Response(status=304, headers=common), 304, 0
        r = _range_or_error(request, size, etag)
        if isinstance(r, web.Response):
            return r, r.status, 0
        start, stop, partial = r
        resp = web.StreamResponse(status=206 if partial else 200, headers=common)
        resp.content_type = "application/octet-stream"
        resp.content_length = stop - start
        if partial:
            resp.headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
        await resp.prepare(request)
        sent = 0
        if request.method == "GET" and request.app[SENDFILE_KEY] and request.transport is not None:
            try:
                # Kernel sendfile: no copies through Python; asyncio waits for the headers aiohttp
                # already queued on the transport before it starts (as aiohttp's FileResponse does).
                await asyncio.get_running_loop().sendfile(request.transport, f, start, stop - start)
                sent = stop - start
                await resp.write_eof()
                return resp, resp.status, sent
            except NotImplementedError:  # e.g. TLS transports: fall back to the read/write loop
                pass
        if request.method == "GET":
            chunk = request.app[CHUNK_KEY]
            f.seek(start)
            while sent < stop - start:
                # Page-cache reads of <= chunk bytes are ~tens of microseconds; doing them inline
                # avoids a thread hop per chunk. write() awaits the socket (backpressure), so a
                # slow client holds at most ~one chunk plus the transport buffer in memory.
                data = f.read(min(chunk, stop - start - sent))
                if not data:
                    raise RuntimeError(f"object {path.name} shrank while being served")
                await resp.write(data)
                sent += len(data)
            await resp.write_eof()
        return resp, resp.status, sent


async def _serve_small(request: web.Request, root: Path, res: _Resource) -> tuple[web.StreamResponse, int, int]:
    path = root / res.relpath
    opened = _open_regular(root, res.relpath)
    if opened is None:
        return _text(404, f"no manifest {path.parent.name}/{path.name}" if path.name != "index.json" else "no index.json"), 404, 0
    fd, st = opened
    with os.fdopen(fd, "rb", buffering=0) as f:
        if st.st_size > MAX_SMALL_FILE_BYTES:
            log.error("%s is %d bytes, over the %d-byte limit", path, st.st_size, MAX_SMALL_FILE_BYTES)
            return _text(500, "manifest too large"), 500, 0
        body = f.read()  # one snapshot: atomic renames mean we read either old or new, whole
    etag = '"' + hashlib.sha256(body).hexdigest() + '"'
    common = {"ETag": etag, "Accept-Ranges": "bytes", "Cache-Control": _MANIFEST_CACHE_CONTROL}
    if if_none_match_hits(request, etag):
        return web.Response(status=304, headers=common), 304, 0
    r = _range_or_error(request, len(body), etag)
    if isinstance(r, web.Response):
        return r, r.status, 0
    start, stop, partial = r
    resp = web.Response(status=206 if partial else 200, body=body[start:stop], headers=common,
                        content_type="application/json")
    if partial:
        resp.headers["Content-Range"] = f"bytes {start}-{stop - 1}/{len(body)}"
    return resp, resp.status, (stop - start) if request.method == "GET" else 0


def make_app(store_root: str | os.PathLike[str], *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
             sendfile: bool = True, verify_objects: bool = True) -> web.Application:
    """The aiohttp application serving ``store_root`` (a store: `store_format` refuses anything else).

    ``sendfile``: send object bodies with the kernel's sendfile (default); else read ``chunk_bytes``
    at a time and write them (the fallback path, also used where sendfile is unavailable).
    ``verify_objects``: serve an object only if its bytes hash to its name (`VerifiedObjects`);
    False only to measure what the check costs (``sakura bench faults``)."""
    root = Path(store_root).resolve()
    store_format(root)  # NotAStore (one line) for a missing path, a file or a folder that is no store
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be > 0, got {chunk_bytes}")
    app = web.Application()
    app[STORE_KEY] = root
    app[CHUNK_KEY] = chunk_bytes
    app[SENDFILE_KEY] = bool(sendfile)
    if verify_objects:
        app[VERIFIED_KEY] = VerifiedObjects()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


async def start_server(store_root: str | os.PathLike[str], *, host: str = "127.0.0.1", port: int = 0,
                       chunk_bytes: int = DEFAULT_CHUNK_BYTES, sendfile: bool = True,
                       limits: ConnectionLimits | None = None, verify_objects: bool = True) -> tuple[web.AppRunner, str]:
    """Start serving in the running event loop; returns (runner, base URL). ``port=0`` picks a
    free port. Stop with ``await runner.cleanup()``. ``limits``: header/idle timeouts and the
    connection cap (``ConnectionLimits()`` defaults)."""
    limits = limits or ConnectionLimits()
    # access_log=None: aiohttp's default access log records client address and User-Agent.
    runner = web.AppRunner(make_app(store_root, chunk_bytes=chunk_bytes, sendfile=sendfile, verify_objects=verify_objects),
                           access_log=None,
                           handle_signals=False, logger=protocol_log, max_line_size=MAX_FIELD_BYTES,
                           max_field_size=MAX_FIELD_BYTES, keepalive_timeout=limits.idle_timeout_s)
    await runner.setup()
    _guard(runner, limits)
    site = _GuardedSite(runner, host, port, runner.server._sakura_cap, limits.evict_grace_s,  # type: ignore[union-attr]
                        backlog=1024)
    await site.start()
    h, p = runner.addresses[0][:2]  # the real port when port=0
    return runner, f"http://{h if ':' not in h else '[' + h + ']'}:{p}"


@contextlib.asynccontextmanager
async def running_server(store_root: str | os.PathLike[str], **kw) -> AsyncIterator[str]:
    """``async with running_server(store) as base_url:`` for tests and benchmarks."""
    runner, url = await start_server(store_root, **kw)
    try:
        yield url
    finally:
        await runner.cleanup()


@contextlib.contextmanager
def serve_in_thread(store_root: str | os.PathLike[str], **kw) -> Iterator[str]:
    """Run the server on its own event loop in a daemon thread; yields the base URL. For tests
    and tools whose own code is synchronous or runs on another loop."""

    with running_in_thread(lambda: start_server(store_root, **kw), lambda started: started[0].cleanup(),
                           name="sakura-serve", exception_handler=_exception_handler) as (_, url):
        yield url


class Front(Protocol):
    """Something a caller puts in front of the server (the link emulator's pacing proxy): it
    listens where clients connect and forwards to the server's private address."""

    url: str

    async def close(self) -> None: ...


#: Starts a `Front` given the server's private (host, port); what `serve_forever(front=...)` takes.
FrontFactory = Callable[[str, int], Awaitable[Front]]


def serve_forever(store_root: str | os.PathLike[str], *, host: str = "127.0.0.1", port: int = 8080,
                  chunk_bytes: int = DEFAULT_CHUNK_BYTES, limits: ConnectionLimits | None = None,
                  front: FrontFactory | None = None, verify_objects: bool = True) -> None:
    """Blocking entry point for ``sakura serve``; Ctrl-C stops it.

    With ``front`` (e.g. ``sakura.emulation.serve.pacing_front``: a measured trace replayed on one
    phone's downlink), the server listens on a private port and the front on ``host:port``; the
    wire side knows nothing of what the front does.
    """
    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(_exception_handler)
        runner, url = await start_server(store_root, host=host, port=0 if front is not None else port,
                                         chunk_bytes=chunk_bytes, limits=limits, verify_objects=verify_objects)
        proxy = None
        try:
            if front is not None:
                h, p = runner.addresses[0][:2]
                proxy = await front(h, p)
                log.info("serving %s at %s through %s", Path(store_root).resolve(), proxy.url, proxy)
            else:
                log.info("serving %s at %s", Path(store_root).resolve(), url)
            await asyncio.Event().wait()
        finally:
            if proxy is not None:
                await proxy.close()
            await runner.cleanup()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
