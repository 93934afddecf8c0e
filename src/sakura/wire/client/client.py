"""Phone-side fetcher of public template objects (aiohttp), for the runtime's fetch stage.

Privacy by shape: the only requests this class can make are GET/HEAD of ``/index.json``,
``/manifests/<fp>/<template>.json`` and ``/objects/<xx>/<sha256>``, built from regex-validated
names and hex digests. There is no method that takes a body, free-form headers, a query string or
a URL path, so neither the photo nor the prompt can be put on the wire through it. Cookies are
never stored or sent; the User-Agent is a constant.

Timing: every body chunk is reported as ``Chunk(nbytes, t_start, t_end)`` on ``time.monotonic()``
seconds, where ``t_start`` is when the read began waiting and ``t_end`` when the bytes arrived;
``sum(nbytes) / (t_end_last - t_start_first)`` is the delivered rate in bytes/s.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import urlsplit
import contextlib
import threading
import weakref

import aiohttp
from yarl import URL

from sakura.wire.store.api import StoreIntegrityError, StoreNotFound
from sakura.wire.store.layout import INDEX_PATH, check_name, manifest_relpath
from sakura.wire.store.manifest import MAX_MANIFEST_BYTES, Manifest, ManifestError, ObjectRef, Rendition, parse_json
from sakura.util.aiothread import running_in_thread

log = logging.getLogger(__name__)

USER_AGENT = "sakura-client/1"
#: Header names this client ever sends (tests assert the server saw nothing else).
SENT_HEADERS = frozenset({"User-Agent", "Accept", "Accept-Encoding", "Range", "If-Range", "If-None-Match", "Host"})


class FetchError(RuntimeError):
    """A fetch failed for good (after retries); the message says which object and why."""


class NotFound(FetchError, StoreNotFound):
    """The server has no such manifest/object (HTTP 404)."""

    __str__ = StoreNotFound.__str__


class IntegrityError(FetchError, StoreIntegrityError):
    """The bytes received do not match the manifest (size or sha256)."""


class DeadlineExceeded(FetchError):
    """No complete, verified answer within the step's overall deadline (a dripping or stalled
    server): the caller falls back (gallery, local compute) instead of waiting on."""


class WrongManifest(FetchError, ManifestError):
    """The server answered a manifest request with another model's (or template's) manifest."""


class RedirectRefused(FetchError):
    """The server answered with a redirect; this client talks only to the origin it was given."""


#: Slowest delivery (bytes/s) a fetch is allowed before its overall deadline ends it: 256 kbit/s,
#: below which a phone link is no use for streaming KV (local compute wins long before).
DEFAULT_MIN_RATE_BPS = 32_000.0
#: No single fetch may take longer than this (s), whatever its size.
DEFAULT_MAX_DEADLINE_S = 120.0
#: Size assumed for a manifest / index.json when computing its deadline (bytes; real ones are
#: 2-64 KB).
SMALL_FILE_DEADLINE_BYTES = 256 * 1024


@dataclass(frozen=True)
class RetryPolicy:
    """The client's one retry policy, for manifests and objects alike: after a retryable failure
    (connection dropped or refused, read timeout, short body) up to `retries` more attempts, the
    n-th after min(max_delay_s, first_delay_s * 2 ** (n - 1)) seconds (0.04, 0.08, ... 0.64 s).
    The pauses are short because every request also has an overall deadline: a link that keeps
    failing ends as `DeadlineExceeded` (the runtime then computes locally), not a long wait."""

    retries: int = 5
    first_delay_s: float = 0.04
    max_delay_s: float = 1.0

    def delay_s(self, failures: int) -> float:
        """Seconds to wait after the `failures`-th failed attempt (1-based)."""
        return min(self.max_delay_s, self.first_delay_s * 2 ** (failures - 1))


@dataclass(frozen=True)
class Chunk:
    """One body chunk as it arrived: ``nbytes`` bytes between ``t_start`` and ``t_end``
    (``time.monotonic()`` seconds)."""

    nbytes: int
    t_start: float
    t_end: float


@dataclass
class FetchResult:
    """A completed, verified fetch.

    Attributes:
        data: the object bytes (sha256 and size checked against the manifest).
        t_request: when the first request was sent; t_first_byte: first body byte; t_done: last
            byte (monotonic seconds).
        chunks: per-chunk timing, all attempts in order.
        resumes: how many times the transfer was resumed with a Range request.
        restarts: how many times it had to start over (server ignored Range / object changed).
    """

    data: bytes
    t_request: float
    t_first_byte: float
    t_done: float
    chunks: list[Chunk] = field(default_factory=list)
    resumes: int = 0
    restarts: int = 0

    @property
    def nbytes(self) -> int:
        return len(self.data)


_RETRYABLE = (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, asyncio.TimeoutError,
              aiohttp.ServerDisconnectedError)


class TemplateClient:
    """Fetches manifests and objects from one cache server (ours, nginx, a caching edge), reusing
    connections. Implements ``sakura.wire.store.api.AsyncTemplateStore``: ``manifest_keys``,
    ``get_manifest``, ``get_object``, ``get_rendition``, the local ``Store``'s calls, awaited.
    ``fetch_object`` / ``fetch_rendition`` are the timed forms (``FetchResult`` with chunks).

    Args:
        base_url: ``http://host:port`` (optionally with a path prefix); no query, fragment or
            credentials.
        connect_timeout: seconds to establish a connection.
        read_timeout: seconds without any byte arriving before an attempt is abandoned (it is
            then resumed, up to ``max_retries`` attempts).
        max_retries: attempts after the first, per manifest or object (resumes and reconnects
            together), paced by `RetryPolicy`.
        chunk_bytes: largest chunk handed to ``on_chunk`` (bytes).
        max_connections: connection pool size (per host).
        min_rate_bps, max_deadline_s: every request has an overall deadline,
            ``deadline_for(nbytes) = min(max_deadline_s, connect_timeout + read_timeout +
            nbytes / min_rate_bps)``, or the ``deadline_s`` its caller passes (derived from the
            caller's own estimates); past it the fetch raises ``DeadlineExceeded``. Per-read
            timeouts alone let a server that drips one byte per read_timeout hold a fetch for ever.

    Redirects are never followed (``RedirectRefused``): a content-addressed store has no reason
    to send the phone elsewhere, and following one would talk to an origin the user never
    configured. Every read is bounded: a manifest by ``MAX_MANIFEST_BYTES``, an object by the
    size its manifest entry declares (the caller checks that against its own limits first).

    Use as ``async with TemplateClient(url) as c: ...``. Cancel a fetch by cancelling its task:
    the connection is closed at once (not returned to the pool with an unread body). One session
    (one connection pool) serves any number of requests: `sharing` gives a client with other
    timeouts and retries on the same session, and `ClientThread` keeps one open on its own event
    loop for a synchronous caller's whole life (an `Editor`).
    """

    def __init__(self, base_url: str, *, connect_timeout: float = 5.0, read_timeout: float = 10.0,
                 max_retries: int = 5, chunk_bytes: int = 64 * 1024, max_connections: int = 8,
                 min_rate_bps: float = DEFAULT_MIN_RATE_BPS, max_deadline_s: float = DEFAULT_MAX_DEADLINE_S) -> None:
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"base_url must be http(s)://host[:port][/prefix], got {base_url!r}")
        if u.query or u.fragment or u.username or u.password:
            raise ValueError("base_url must not carry a query, fragment or credentials")
        self.base_url = base_url.rstrip("/")
        self.retry = RetryPolicy(retries=int(max_retries))
        self.max_retries = self.retry.retries
        self.chunk_bytes = int(chunk_bytes)
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout, sock_connect=connect_timeout,
                                              sock_read=read_timeout)
        self._limit = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._owner: TemplateClient | None = None   # `sharing`: the client whose session this one uses
        self.sessions_opened = 0                     # aiohttp sessions this client made (tests, logs)
        if not (min_rate_bps > 0 and max_deadline_s > 0):
            raise ValueError("min_rate_bps and max_deadline_s must be > 0")
        self.min_rate_bps, self.max_deadline_s = float(min_rate_bps), float(max_deadline_s)
        self._fixed_s = float(connect_timeout) + float(read_timeout)

    def deadline_for(self, nbytes: int) -> float:
        """Overall seconds allowed to fetch ``nbytes`` (see the class docstring)."""
        return min(self.max_deadline_s, self._fixed_s + max(0, nbytes) / self.min_rate_bps)

    async def _after_failure(self, failures: int, what: str, e: BaseException) -> None:
        """`RetryPolicy`: raise `FetchError` once `failures` exceeds the retries, else pause."""
        if failures > self.retry.retries:
            raise FetchError(f"{what}: gave up after {failures} attempts ({e!r})") from e
        log.debug("%s: attempt %d failed (%r); retrying", what, failures, e)
        await asyncio.sleep(self.retry.delay_s(failures))

    def _check_redirect(self, r: aiohttp.ClientResponse, what: str) -> None:
        if 300 <= r.status < 400 and r.status != 304:
            where = urlsplit(r.headers.get("Location", ""))
            origin = f"{where.scheme}://{where.netloc}" if where.netloc else "the same origin"
            raise RedirectRefused(f"{what}: HTTP {r.status} redirect to {origin} refused (this client talks "
                                  f"only to {self.base_url})")

    async def __aenter__(self) -> "TemplateClient":
        self._ensure_session()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def sharing(self, *, connect_timeout: float | None = None, read_timeout: float | None = None,
                max_retries: int | None = None) -> "TemplateClient":
        """A client on this one's session and connection pool with other timeouts and retries
        (None: this one's): a gallery refresh that must fail fast and the shard fetches of an edit
        share one pool of warm connections. Closing it leaves the session open (its owner closes it)."""
        t = self._timeout
        c = TemplateClient(self.base_url, connect_timeout=t.connect if connect_timeout is None else connect_timeout,
                           read_timeout=t.sock_read if read_timeout is None else read_timeout,
                           max_retries=self.retry.retries if max_retries is None else max_retries,
                           chunk_bytes=self.chunk_bytes, max_connections=self._limit,
                           min_rate_bps=self.min_rate_bps, max_deadline_s=self.max_deadline_s)
        c._owner = self._owner or self
        return c

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._owner is not None:
            return self._owner._ensure_session()
        if self._session is None or self._session.closed:
            self.sessions_opened += 1
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit_per_host=self._limit, ttl_dns_cache=300),
                timeout=self._timeout,
                cookie_jar=aiohttp.DummyCookieJar(),  # never store or send cookies
                headers={"User-Agent": USER_AGENT},
                auto_decompress=False,
                trust_env=False,  # no proxy/credentials picked up from the environment
            )
        return self._session

    async def close(self) -> None:
        if self._owner is not None:
            return  # the owner's session: closed by the owner
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def open_connections(self, n: int) -> int:
        """Open up to ``n`` connections to the server and leave them idle in the pool (a TCP
        handshake each, no request: nothing crosses the downlink). Requests issued later while
        another transfer runs then find a connection ready instead of paying a handshake round
        trip. Returns how many opened; a failure only means the next request connects itself.
        (Warming with a real request, e.g. the index, put its whole answer on the link ahead of
        the first shard: the index grows with the store.)"""
        s = self._ensure_session()
        loop = asyncio.get_running_loop()

        async def one() -> Any:
            req = aiohttp.ClientRequest("GET", URL(self.base_url + "/"), loop=loop)
            return await s.connector.connect(req, [], self._timeout)  # type: ignore[union-attr]

        res = await asyncio.gather(*(one() for _ in range(max(0, int(n)))), return_exceptions=True)
        opened = [c for c in res if not isinstance(c, BaseException)]
        for c in opened:
            c.release()  # back to the pool, idle and keep-alive
        return len(opened)

    def _url(self, relpath: str) -> str:
        return f"{self.base_url}/{relpath}"

    # ------------------------------------------------------------------------------- small files
    async def _get_small(self, relpath: str, what: str, deadline_s: float | None = None) -> bytes:
        limit = deadline_s if deadline_s is not None else self.deadline_for(SMALL_FILE_DEADLINE_BYTES)
        try:
            async with asyncio.timeout(limit):
                return await self._get_small_loop(relpath, what)
        except TimeoutError:
            raise DeadlineExceeded(f"{what}: no complete answer within its {limit:.1f} s deadline") from None

    async def _get_small_loop(self, relpath: str, what: str) -> bytes:
        s = self._ensure_session()
        failures = 0
        while True:
            try:
                async with s.get(self._url(relpath), headers={"Accept": "application/json"},
                                 allow_redirects=False, timeout=self._timeout) as r:
                    self._check_redirect(r, what)
                    if r.status == 404:
                        raise NotFound(f"{what}: server has no {relpath}")
                    if r.status != 200:
                        raise FetchError(f"{what}: HTTP {r.status} for {relpath}")
                    if (r.content_length or 0) > MAX_MANIFEST_BYTES:
                        raise FetchError(f"{what}: {r.content_length} bytes is over the manifest limit")
                    # read() returns whatever has arrived, not the whole body: loop to EOF
                    # (a slow link delivers a manifest in many pieces), capping the size.
                    body = bytearray()
                    while chunk := await r.content.read(65536):
                        body += chunk
                        if len(body) > MAX_MANIFEST_BYTES:
                            raise FetchError(f"{what}: body over the {MAX_MANIFEST_BYTES}-byte manifest limit")
                    if r.content_length is not None and len(body) != r.content_length:
                        raise aiohttp.ClientPayloadError(f"{what}: body ended at {len(body)} of {r.content_length} bytes")
                    return bytes(body)
            except _RETRYABLE as e:
                failures += 1
                await self._after_failure(failures, what, e)

    async def manifest_keys(self, *, deadline_s: float | None = None) -> list[tuple[str, str]]:
        """``(model_fingerprint, template_id)`` pairs the server's ``index.json`` lists (within
        ``deadline_s``, default ``deadline_for(SMALL_FILE_DEADLINE_BYTES)``)."""
        body = await self._get_small(INDEX_PATH, "index", deadline_s)
        try:
            entries = parse_json(body, "index.json")["manifests"]
            return [(check_name(e["model_fingerprint"], "model fingerprint"), check_name(e["template_id"], "template id"))
                    for e in entries]
        except (ValueError, KeyError, TypeError) as e:
            raise FetchError(f"index.json is malformed: {e}") from None

    async def get_manifest(self, model_fingerprint: str, template_id: str, *,
                           deadline_s: float | None = None) -> Manifest:
        """Fetch and validate one template's manifest (raises ``ManifestError`` if malformed,
        ``DeadlineExceeded`` past ``deadline_s``, default ``deadline_for(SMALL_FILE_DEADLINE_BYTES)``)."""
        rel = manifest_relpath(model_fingerprint, template_id)  # validates both names
        body = await self._get_small(rel, f"manifest {model_fingerprint}/{template_id}", deadline_s)
        m = Manifest.from_bytes(body, source=f"{self.base_url}/{rel}")
        if m.model_fingerprint != model_fingerprint:
            raise WrongManifest(f"{rel}: the server's manifest is for another model (fingerprint "
                                f"{m.model_fingerprint[:16]}, this model's {model_fingerprint[:16]})")
        if m.template_id != template_id:
            raise WrongManifest(f"{rel}: the server's manifest is for template {m.template_id!r}, not {template_id!r}")
        return m

    # ---------------------------------------------------------------------------------- objects
    async def get_object(self, ref: ObjectRef) -> bytes:
        """The whole object, size and sha256 checked (``fetch_object`` without the timing)."""
        return (await self.fetch_object(ref)).data

    async def get_rendition(self, rendition: Rendition, *, have: bytes = b"") -> bytes:
        """A rendition's verified bytes; a rung is one Range request, ``have`` a lower rung
        already held (``fetch_rendition`` without the timing)."""
        return (await self.fetch_rendition(rendition, have=have)).data

    async def fetch_object(self, ref: ObjectRef, *, on_chunk: Callable[[Chunk], None] | None = None,
                           deadline_s: float | None = None) -> FetchResult:
        """Fetch one whole object, resuming with ``Range`` after a dropped connection or read
        timeout, and verify its size and sha256 against ``ref``.

        Args:
            ref: the object (from a manifest: a table's, the template ref's, a rendition's).
            on_chunk: called with each ``Chunk`` as it arrives (e.g. the bandwidth estimator).
            deadline_s: overall seconds for the fetch, retries included (default
                ``deadline_for(ref.bytes)``).
        Raises:
            NotFound, IntegrityError, DeadlineExceeded, RedirectRefused, FetchError;
            ``asyncio.CancelledError`` if cancelled.
        """
        if not isinstance(ref, ObjectRef):
            raise TypeError(f"fetch_object takes an ObjectRef from a manifest, got {type(ref).__name__}")
        return await self._deadline(self._fetch(ref, ref.bytes, ref.sha256, b"", on_chunk), ref.bytes, deadline_s,
                                    f"object {ref.sha256}")

    async def fetch_rendition(self, rendition: Rendition, *, have: bytes = b"",
                              on_chunk: Callable[[Chunk], None] | None = None,
                              deadline_s: float | None = None) -> FetchResult:
        """Fetch one rendition's bytes, verified against the rendition's sha256.

        For a layered codec's rung (``rendition.prefix``) only ``bytes=0-(n-1)`` of the object is
        requested; ``have`` may hold a lower rung's bytes (a prefix of the same object), and then
        only the missing tail is fetched: the upgrade path. ``FetchResult.data`` is always the
        whole rendition (``have`` + what was fetched).
        """
        if not isinstance(rendition, Rendition):
            raise TypeError(f"fetch_rendition takes a Rendition from a manifest, got {type(rendition).__name__}")
        if len(have) > rendition.nbytes:
            raise ValueError(f"have ({len(have)} bytes) is longer than rendition {rendition.name!r} ({rendition.nbytes})")
        return await self._deadline(self._fetch(rendition.object, rendition.nbytes, rendition.sha256, bytes(have),
                                                on_chunk), rendition.nbytes - len(have), deadline_s,
                                    f"rendition {rendition.name!r} of object {rendition.object.sha256}")

    async def _deadline(self, coro, nbytes: int, deadline_s: float | None, what: str):
        limit = deadline_s if deadline_s is not None else self.deadline_for(nbytes)
        try:
            async with asyncio.timeout(limit):
                return await coro
        except TimeoutError:
            raise DeadlineExceeded(f"{what}: not complete within its {limit:.1f} s deadline "
                                   f"({nbytes} bytes)") from None

    async def _fetch(self, ref: ObjectRef, stop: int, digest: str, have: bytes,
                     on_chunk: Callable[[Chunk], None] | None) -> FetchResult:
        """Bytes ``[0, stop)`` of object ``ref`` whose sha256 must be ``digest``; ``have`` is a
        prefix already held. Retries resume where the last attempt stopped."""
        s = self._ensure_session()
        url = self._url(ref.path)
        whole = stop == ref.bytes
        buf = bytearray(have)
        h = hashlib.sha256(have)
        etag: str | None = None
        res = FetchResult(data=b"", t_request=time.monotonic(), t_first_byte=float("nan"), t_done=float("nan"))
        attempt = 0  # failed attempts so far
        while len(buf) < stop:
            headers = {"Accept": "application/octet-stream", "Accept-Encoding": "identity"}
            ranged = len(buf) > 0 or not whole
            if ranged:
                headers["Range"] = f"bytes={len(buf)}-" if whole else f"bytes={len(buf)}-{stop - 1}"
                if etag is not None and not etag.startswith("W/"):
                    headers["If-Range"] = etag
            try:
                async with s.get(url, headers=headers, allow_redirects=False, timeout=self._timeout) as r:
                    self._check_redirect(r, f"object {ref.sha256}")
                    if r.status == 404:
                        raise NotFound(f"object {ref.sha256}: server has none (404)")
                    if ranged and r.status == 200:
                        # Server ignored the Range (or the object changed under If-Range): take
                        # the body from byte 0, keep what we need.
                        buf.clear()
                        h = hashlib.sha256()
                        res.restarts += 1
                    elif ranged and r.status == 206:
                        cr = r.headers.get("Content-Range", "")
                        if not cr.startswith(f"bytes {len(buf)}-") or not cr.endswith(f"/{ref.bytes}"):
                            raise IntegrityError(f"object {ref.sha256}: asked for bytes {len(buf)}-{stop - 1}, got "
                                                 f"Content-Range {cr!r} (object has {ref.bytes} bytes)")
                        if attempt > 0:
                            res.resumes += 1
                    elif r.status != 200:
                        raise FetchError(f"object {ref.sha256}: HTTP {r.status}")
                    etag = r.headers.get("ETag", etag)
                    t_wait = time.monotonic()
                    while len(buf) < stop:
                        data = await r.content.read(min(self.chunk_bytes, stop - len(buf)))
                        if not data:
                            break
                        t_end = time.monotonic()
                        if res.t_first_byte != res.t_first_byte:  # NaN: first byte of the fetch
                            res.t_first_byte = t_end
                        buf += data
                        h.update(data)
                        c = Chunk(len(data), t_wait, t_end)
                        res.chunks.append(c)
                        if on_chunk is not None:
                            on_chunk(c)
                        t_wait = t_end
                    if len(buf) == stop:
                        if r.status == 206 or whole:
                            # anything more is a server sending beyond what it announced
                            if not r.content.at_eof() and await r.content.read(1):
                                raise IntegrityError(f"object {ref.sha256}: server sent more than the "
                                                     f"{stop} bytes asked for")
                        break  # (a 200 for a prefix: leaving the block drops the rest of the body)
                # aiohttp flags a short body as ClientPayloadError; this guards servers that don't.
                raise aiohttp.ClientPayloadError(f"body ended at {len(buf)} of {stop} bytes")
            except _RETRYABLE as e:
                attempt += 1
                await self._after_failure(attempt, f"object {ref.sha256} (at byte {len(buf)} of {stop})", e)
        res.t_done = time.monotonic()
        if h.hexdigest() != digest:
            raise IntegrityError(f"object {ref.sha256}: bytes [0, {stop}) hash to {h.hexdigest()}, manifest says "
                                 f"{digest} (corrupt in transit, on the server, or a wrong `have`)")
        res.data = bytes(buf)
        if res.t_first_byte != res.t_first_byte:
            res.t_first_byte = res.t_done  # nothing needed fetching
        return res


class ClientThread:
    """One `TemplateClient` (one HTTP session, one pool of keep-alive connections) on its own
    event loop in a daemon thread, for a synchronous caller that fetches over a long life: an
    `Editor`'s gallery refreshes and every edit's manifest and shard fetches go through it, so
    connections stay warm across edits and no edit opens a session or an event loop of its own.

    ``run(fn)`` runs ``await fn(client)`` on the loop and returns its result in the caller's
    thread; ``submit(coro)`` schedules a coroutine there (a `concurrent.futures.Future`);
    ``close()`` closes the session and ends the thread (also at exit, if the owner never did).
    ``client_options``: `TemplateClient`'s (``max_connections``, timeouts, retries).
    """

    def __init__(self, base_url: str, *, name: str = "sakura-client", **client_options: Any) -> None:
        self.client = client = TemplateClient(base_url, **client_options)   # checks the URL before a thread starts

        async def start() -> asyncio.AbstractEventLoop:   # (closes over the client, not self: see below)
            client._ensure_session()   # made on the loop it is used on
            return asyncio.get_running_loop()

        async def stop(_loop: asyncio.AbstractEventLoop) -> None:
            await client.close()

        stack = contextlib.ExitStack()
        self.loop: asyncio.AbstractEventLoop = stack.enter_context(running_in_thread(start, stop, name=name))
        loop_thread: list[int] = []
        self.loop.call_soon_threadsafe(lambda: loop_thread.append(threading.get_ident()))
        # closed by `close`, when this object is collected, or at exit (nothing it runs refers to it)
        self._closed = weakref.finalize(self, _close_from_outside, stack, loop_thread)

    @property
    def closed(self) -> bool:
        return not self._closed.alive

    def submit(self, coro: Any) -> "Any":
        """Schedule ``coro`` on the client's loop -> a `concurrent.futures.Future` of its result."""
        if self.closed:
            coro.close()
            raise RuntimeError("ClientThread is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, fn: Callable[[TemplateClient], Any], timeout_s: float | None = None) -> Any:
        """``await fn(client)`` on the client's loop; its result (or exception) here."""
        return self.submit(fn(self.client)).result(timeout_s)

    def close(self) -> None:
        self._closed()

    def __enter__(self) -> "ClientThread":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _close_from_outside(stack: Any, loop_thread: list[int]) -> None:
    """End a `ClientThread` (close its session, stop its loop, join its thread): from its own loop
    thread (a collection that ran there) it cannot join itself, so another thread does it."""
    if loop_thread and threading.get_ident() == loop_thread[0]:
        threading.Thread(target=stack.close, name="sakura-client-close", daemon=True).start()
    else:
        stack.close()
