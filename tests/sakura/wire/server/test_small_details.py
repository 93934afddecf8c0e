"""Issue 43's small items, against a real server on 127.0.0.1: Range offsets of any length get one
answer, aiohttp's 400 bodies do not echo the request, a long name is not echoed whole."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

import pytest

from sakura.wire.server import serve_in_thread
from sakura.wire.store import check_name

from .conftest import raw_request


def _status(url: str, headers: dict) -> tuple[int, int]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return r.status, len(r.read())
    except urllib.error.HTTPError as e:
        return e.code, 0


def test_a_range_end_of_any_length_is_the_whole_object(store, manifest):
    obj = manifest.template_ref.object
    with serve_in_thread(store) as url:
        for digits in (30, 4000, 4400, 5000, 8000):  # 4,000 gave 206 and 5,000 gave 400
            assert _status(f"{url}/{obj.path}", {"Range": "bytes=0-" + "9" * digits}) == (206, obj.bytes), digits
        # a first offset past 2**63 is malformed, whatever its length
        for digits in (20, 4000, 5000):
            assert _status(f"{url}/{obj.path}", {"Range": f"bytes={'9' * digits}-"})[0] == 400, digits
        assert _status(f"{url}/{obj.path}", {"Range": "bytes=5-2"})[0] == 400
        assert _status(f"{url}/{obj.path}", {"Range": "bytes=-0"})[0] == 416


@pytest.mark.parametrize("request_bytes", [
    b"GET /index.json HTTP/1.1\r\nHost: x\r\nX-Secret-\x01Marker: leak\r\n\r\n",
    b"GET /SECRETMARKER\x00 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /index.json HTTP/1.1\r\nHost: x\r\nX-Long: " + b"SECRETMARKER" * 1000 + b"\r\n\r\n",
])
def test_a_malformed_request_is_answered_without_echoing_it(store, request_bytes):
    with serve_in_thread(store) as url:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        reply = asyncio.run(raw_request(host, int(port), request_bytes))
    assert reply.split(b" ", 2)[1].startswith(b"4"), reply[:200]
    assert b"not echoed back" in reply
    assert b"SECRETMARKER" not in reply and b"Marker" not in reply and b"leak" not in reply


def test_a_long_name_is_not_echoed_whole():
    with pytest.raises(ValueError) as e:
        check_name("a" * 10_000, "template id")
    assert len(str(e.value)) < 200 and "(10000 chars)" in str(e.value)
