"""Count what an origin was asked for, from its access log: how much a caching edge spared it.

Both origins log one line per request without client data: ``sakura serve`` through the logger
``sakura.wire.server.access`` (``GET object <sha256[:12]> 206 <bytes> <ms>``), stock nginx to
``prefix/access.log`` (``GET /objects/xx/<sha256> 206 <bytes> <s>``, the ``sakura`` log format).
Objects are keyed by the first 12 hex digits of their sha256 in both.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sakura.wire.store.layout import INDEX_URL, MANIFEST_URL_RE, OBJECT_URL_RE


@dataclass(frozen=True)
class OriginRequest:
    method: str
    kind: str        # "object", "manifest", "index" or "-"
    label: str       # object: sha256[:12]; manifest: "<fp>/<template>"
    status: int
    bytes: int


def parse_nginx_line(line: str) -> OriginRequest | None:
    """One line of the origin nginx's ``sakura`` log format (``$request_method $uri $status $body_bytes_sent ...``)."""
    parts = line.split()
    if len(parts) < 4:
        return None
    method, uri, status, nbytes = parts[:4]
    if (m := OBJECT_URL_RE.fullmatch(uri)) is not None:
        kind, label = "object", m.group(2)[:12]
    elif (m := MANIFEST_URL_RE.fullmatch(uri)) is not None:
        kind, label = "manifest", f"{m.group(1)}/{m.group(2)}"
    elif uri == INDEX_URL:
        kind, label = "index", "index"
    else:
        kind, label = "-", "-"
    return OriginRequest(method, kind, label, int(status), int(nbytes))


class OriginLog:
    """Requests an origin answered, either ``sakura serve`` in this process (``OriginLog.sakura()``,
    a logging handler) or an nginx origin (``OriginLog.nginx(prefix)``, reads its access log)."""

    def __init__(self, nginx_log: str | os.PathLike[str] | None = None) -> None:
        self._nginx_log = Path(nginx_log) if nginx_log is not None else None
        self._records: list[OriginRequest] = []
        self._lock = threading.Lock()
        self._handler: logging.Handler | None = None
        self._old_level: int | None = None

    @classmethod
    def sakura(cls) -> "OriginLog":
        """Attach to ``sakura serve``'s access logger (servers in this process); ``close()`` detaches."""
        self = cls()
        log = logging.getLogger("sakura.wire.server.access")
        outer = self

        class _H(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                method, kind, label, status, nbytes = (record.args or ("-",) * 5)[:5]  # type: ignore[misc]
                with outer._lock:
                    outer._records.append(OriginRequest(str(method), str(kind), str(label), int(status), int(nbytes)))

        self._handler = _H(level=logging.INFO)
        self._old_level = log.level
        log.setLevel(logging.INFO)
        log.addHandler(self._handler)
        return self

    @classmethod
    def nginx(cls, prefix: str | os.PathLike[str]) -> "OriginLog":
        return cls(Path(prefix) / "access.log")

    def close(self) -> None:
        if self._handler is not None:
            log = logging.getLogger("sakura.wire.server.access")
            log.removeHandler(self._handler)
            log.setLevel(self._old_level or logging.NOTSET)
            self._handler = None

    def requests(self) -> list[OriginRequest]:
        if self._nginx_log is not None:
            if not self._nginx_log.exists():
                return []
            lines = self._nginx_log.read_text().splitlines()
            return [r for r in map(parse_nginx_line, lines) if r is not None]
        with self._lock:
            return list(self._records)

    def object_requests(self, *, ok_only: bool = False) -> collections.Counter[str]:
        """Origin GETs per object (``sha256[:12]`` -> count); ``ok_only``: 200/206 answers only."""
        return collections.Counter(r.label for r in self.requests() if r.kind == "object" and r.method == "GET"
                                   and (not ok_only or r.status in (200, 206)))

    def wait_for_object_requests(self, n: int, timeout_s: float = 5.0) -> bool:
        """Wait until at least `n` origin object GETs are logged, or `timeout_s` passes; -> whether
        they were. A streamed response is logged after its last byte leaves the origin, which can be
        after an edge has already handed that byte to the phone: read the log only once it caught up."""
        end = time.monotonic() + timeout_s
        while sum(self.object_requests().values()) < n:
            if time.monotonic() >= end:
                return False
            time.sleep(0.01)
        return True

    def object_bytes(self) -> int:
        return sum(r.bytes for r in self.requests() if r.kind == "object")
