"""HTTP conditional and Range header logic (RFC 9110), pure functions: no I/O, testable alone."""

from __future__ import annotations

import re

_RANGE_RE = re.compile(r"bytes=(\d{0,19})-(\d{0,19})")


class RangeError(ValueError):
    """Malformed or unsupported ``Range`` header -> 400, message says why."""


class RangeNotSatisfiable(ValueError):
    """Well-formed range that selects no byte of the representation -> 416."""


def parse_range(header: str, size: int) -> tuple[int, int]:
    """Parse a single byte range against a representation of ``size`` bytes.

    Returns ``(start, stop)`` with ``stop`` exclusive, clamped to ``size``.
    Accepts ``bytes=a-b``, ``bytes=a-`` and ``bytes=-n`` (last n bytes), whitespace-free.
    Raises ``RangeError`` for anything else (other units, multiple ranges, ``b < a``) and
    ``RangeNotSatisfiable`` when ``a >= size`` or ``n == 0`` or the object is empty.
    """
    h = header.strip()
    if not h.startswith("bytes="):
        raise RangeError(f"unsupported range unit in {header[:40]!r}: only 'bytes=' is supported")
    if "," in h:
        # One range per request keeps responses simple (no multipart/byteranges); our client
        # never asks for more, and a resume needs exactly one.
        raise RangeError("multiple ranges are not supported: request one range per request")
    m = _RANGE_RE.fullmatch(h)
    if m is None:
        raise RangeError(f"malformed range {header[:40]!r}: expected bytes=FIRST-LAST, bytes=FIRST- or bytes=-SUFFIX")
    a, b = m.group(1), m.group(2)
    if a == "" and b == "":
        raise RangeError("malformed range 'bytes=-': needs a first byte or a suffix length")
    if a == "":  # suffix range: the last n bytes
        n = int(b)
        if n == 0 or size == 0:
            raise RangeNotSatisfiable(f"suffix range of {n} bytes selects nothing of a {size}-byte object")
        return max(0, size - n), size
    start = int(a)
    if b != "" and int(b) < start:
        raise RangeError(f"malformed range {header[:40]!r}: last byte before first byte")
    if start >= size:
        raise RangeNotSatisfiable(f"range starts at byte {start} but the object has {size} bytes")
    stop = size if b == "" else min(int(b) + 1, size)
    return start, stop


def _etags(header: str) -> list[str]:
    return [t.strip() for t in header.split(",") if t.strip()]


def if_none_match_hits(header: str | None, etag: str) -> bool:
    """True if ``If-None-Match`` matches ``etag`` (weak comparison, ``*`` matches) -> 304."""
    if header is None:
        return False
    tags = _etags(header)
    if "*" in tags:
        return True
    bare = etag.removeprefix("W/")
    return any(t.removeprefix("W/") == bare for t in tags)


def if_range_allows(header: str | None, etag: str) -> bool:
    """True if a Range may be honoured under ``If-Range`` (absent, or strong match of ``etag``).

    A date in If-Range, or a weak/mismatched tag, means "send the whole thing" (RFC 9110 13.1.5).
    """
    if header is None:
        return True
    h = header.strip()
    return not h.startswith("W/") and h == etag
