"""HTTP conditional and Range headers (RFC 9110) on aiohttp's own parsers.

aiohttp parses the conditional headers (`request.if_none_match`, `request.if_range`); the Range
header is parsed here (`byte_range`);
this module keeps only the decisions the server makes with them: which bytes of an object of
known size to send (or why not: 400 / 416), whether an If-None-Match hits (304) and whether an
If-Range lets a Range through. No I/O.
"""

from __future__ import annotations

import re

from aiohttp import hdrs, web

#: Largest offset a Range may name (an object is far smaller; bigger numbers are malformed, not
#: merely unsatisfiable, and are not worth turning into huge ints)
MAX_OFFSET = 2**63 - 1
#: The one range form served (RFC 9110 14.1.1, one range, no spaces): first-last, first-, -suffix.
#: Parsed here, not by aiohttp: its ``http_range`` reads "bytes=-0" as "from byte 0" and fails on
#: offsets of more than 4,300 digits (Python's int() limit) while taking 4,000.
_RANGE_RE = re.compile(r"(?i)bytes=(?:(\d+)-(\d*)|-(\d+))")


class RangeError(ValueError):
    """Malformed or unsupported ``Range`` header -> 400, message says why."""


class RangeNotSatisfiable(ValueError):
    """Well-formed range that selects no byte of the representation -> 416."""


def byte_range(request: web.BaseRequest, size: int) -> tuple[int, int] | None:
    """The single byte range ``request`` asks of a ``size``-byte object: ``(start, stop)``, stop
    exclusive, clamped to ``size``; None without a Range header.

    Accepts ``bytes=a-b``, ``bytes=a-`` and ``bytes=-n`` (the last n bytes), whitespace-free.
    Raises ``RangeError`` for anything else (other units, multiple ranges, ``b < a``, a first
    offset past 2**63; a last offset past the end is clamped, however large) and ``RangeNotSatisfiable`` when ``a >= size``, ``n == 0`` or the object is empty.
    """
    header = request.headers.get(hdrs.RANGE)
    if header is None:
        return None
    if "," in header:
        # One range per request keeps responses simple (no multipart/byteranges); our client
        # never asks for more, and a resume needs exactly one.
        raise RangeError("multiple ranges are not supported: request one range per request")
    m = _RANGE_RE.fullmatch(header.strip())
    if m is None:
        raise RangeError(f"malformed range {header[:40]!r}: expected bytes=FIRST-LAST, bytes=FIRST- or bytes=-SUFFIX")
    first, last, suffix = m.groups()
    if suffix is not None:
        n = _offset(suffix, clamp=True)
        if n == 0 or size == 0:
            raise RangeNotSatisfiable(f"suffix range of {n} bytes selects nothing of a {size}-byte object")
        return max(0, size - n), size
    start = _offset(first, clamp=False)
    if start is None:
        raise RangeError(f"malformed range {header[:40]!r}: offsets past 2**63")
    # a last-byte-pos past the end, however large (and however many digits), is clamped (RFC 9110
    # 14.1.2: "bytes=0-<huge>" is the whole object), so only the first-byte-pos is bounded
    end = _offset(last, clamp=True) if last else None
    if end is not None and end < start:
        raise RangeError(f"malformed range {header[:40]!r}: the last byte is before the first")
    if start >= size:
        raise RangeNotSatisfiable(f"range starts at byte {start} but the object has {size} bytes")
    return start, size if end is None else min(end + 1, size)


def _offset(digits: str, *, clamp: bool) -> int | None:
    """A Range offset's value; past 2**63 (by its digit count first: int() of 5,000 digits raises,
    of 4,000 does not, which made the answer depend on the length) `MAX_OFFSET` + 1 with ``clamp``,
    else None."""
    digits = digits.lstrip("0") or "0"
    if len(digits) > len(str(MAX_OFFSET)) or int(digits) > MAX_OFFSET:
        return MAX_OFFSET + 1 if clamp else None
    return int(digits)


def if_none_match_hits(request: web.BaseRequest, etag: str) -> bool:
    """True if the request's If-None-Match matches ``etag`` (a quoted strong tag; weak comparison,
    ``*`` matches) -> 304."""
    tags = request.if_none_match
    if not tags:
        return False
    bare = etag.strip('"')
    return any(t.value in ("*", bare) for t in tags)


def if_range_allows(request: web.BaseRequest, etag: str) -> bool:
    """True if a Range may be honoured under the request's If-Range: absent, or a strong match of
    ``etag``. A date (aiohttp's ``if_range``: objects carry no Last-Modified to compare it with),
    a weak or another tag means "send the whole thing" (RFC 9110 13.1.5)."""
    header = request.headers.get(hdrs.IF_RANGE)
    if header is None:
        return True
    return request.if_range is None and header.strip() == etag
