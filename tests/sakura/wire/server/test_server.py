"""The aiohttp cache server on a real 127.0.0.1 socket: semantics, bad requests, concurrency."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from urllib.parse import urlsplit

import aiohttp
import pytest

from sakura.wire.server import running_server
from sakura.wire.store import Store

from .conftest import raw_request


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def _obj(manifest, shard=0, rend=0):
    return manifest.shards[shard].renditions[rend].object


def test_get_head_and_headers(store, manifest):
    ref = _obj(manifest)
    want = (store / ref.path).read_bytes()

    async def go():
        async with running_server(store) as url, aiohttp.ClientSession() as s:
            async with s.get(f"{url}/{ref.path}") as r:
                body = await r.read()
                assert r.status == 200
                assert r.headers["ETag"] == f'"{ref.sha256}"'
                assert int(r.headers["Content-Length"]) == ref.bytes
                assert r.headers["Accept-Ranges"] == "bytes"
                assert "immutable" in r.headers["Cache-Control"]
                assert r.content_type == "application/octet-stream"
            assert body == want
            async with s.head(f"{url}/{ref.path}") as r:
                assert r.status == 200 and int(r.headers["Content-Length"]) == ref.bytes
                assert await r.read() == b""
            async with s.get(f"{url}/{ref.path}", headers={"If-None-Match": f'"{ref.sha256}"'}) as r:
                assert r.status == 304 and await r.read() == b""
                assert r.headers["ETag"] == f'"{ref.sha256}"'
            mpath = "manifests/synthetic-model/tpl-000.json"
            async with s.get(f"{url}/{mpath}") as r:
                raw = await r.read()
                assert r.status == 200 and r.content_type == "application/json"
                etag = r.headers["ETag"]
                assert etag == '"' + hashlib.sha256(raw).hexdigest() + '"'
                assert r.headers["Cache-Control"] == "no-cache"
            assert raw == (store / mpath).read_bytes()
            async with s.get(f"{url}/{mpath}", headers={"If-None-Match": etag}) as r:
                assert r.status == 304
            async with s.get(f"{url}/index.json") as r:
                assert r.status == 200 and b"tpl-001" in await r.read()
    run(go())


@pytest.mark.parametrize("sendfile", [True, False])
def test_ranges(store, manifest, sendfile):
    ref = _obj(manifest)
    want = (store / ref.path).read_bytes()
    n = ref.bytes

    async def go():
        async with running_server(store, sendfile=sendfile) as url, aiohttp.ClientSession() as s:
            u = f"{url}/{ref.path}"
            for hdr, (a, b) in [("bytes=0-9", (0, 10)), (f"bytes={n - 7}-", (n - 7, n)), ("bytes=-100", (n - 100, n)),
                                (f"bytes=1000-{n + 50}", (1000, n))]:
                async with s.get(u, headers={"Range": hdr}) as r:
                    body = await r.read()
                    assert r.status == 206, hdr
                    assert r.headers["Content-Range"] == f"bytes {a}-{b - 1}/{n}"
                    assert int(r.headers["Content-Length"]) == b - a
                    assert body == want[a:b]
            async with s.get(u, headers={"Range": f"bytes={n}-"}) as r:
                assert r.status == 416 and r.headers["Content-Range"] == f"bytes */{n}"
            for bad in ["bytes=abc", "bytes=9-3", "bytes=0-1,5-6", "lines=1-2"]:
                async with s.get(u, headers={"Range": bad}) as r:
                    text = await r.text()
                    assert r.status == 400, bad
                    assert "Range" in text
            # If-Range with a stale ETag: whole object, 200
            async with s.get(u, headers={"Range": "bytes=0-9", "If-Range": '"stale"'}) as r:
                assert r.status == 200 and await r.read() == want
            async with s.get(u, headers={"Range": "bytes=0-9", "If-Range": f'"{ref.sha256}"'}) as r:
                assert r.status == 206 and await r.read() == want[:10]
            # ranges on a manifest too
            async with s.get(f"{url}/index.json", headers={"Range": "bytes=0-0"}) as r:
                assert r.status == 206 and await r.read() == b"{"
    run(go())


@pytest.mark.parametrize("path, status", [
    ("/objects/00/" + "0" * 64, 404),                         # well-formed, unknown id
    ("/objects/ab/" + "0" * 64, 404),                         # prefix does not match the id
    ("/objects/00/" + "0" * 63, 404),                         # malformed id
    ("/objects/00/" + "G" * 64, 404),
    ("/manifests/synthetic-model/nope.json", 404),
    ("/manifests/other-model/tpl-000.json", 404),
    ("/manifests/synthetic-model/tpl-000", 404),
    ("/.tmp/x", 404),
    ("/.lock", 404),
    ("/", 404),
    ("/objects/../index.json", 400),
    ("/objects/..%2f..%2fetc/passwd", 400),
    ("/%2e%2e/%2e%2e/etc/passwd", 400),
    ("/manifests/..%2F..%2Fsecret.txt", 400),
    ("/manifests/synthetic-model/..%5c..%5csecret.json", 400),
    ("/objects//etc/passwd", 400),
    ("/index.json%00", 400),
])
def test_bad_paths(store, path, status):
    secret = store.parent / "secret.txt"
    secret.write_text("TOP-SECRET-OUTSIDE-STORE")

    async def go():
        async with running_server(store) as url:
            u = urlsplit(url)
            # raw socket: no client library normalises the path for us
            reply = await raw_request(u.hostname, u.port, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            return reply
    reply = run(go())
    assert reply.startswith(f"HTTP/1.1 {status}".encode()), reply[:200]
    assert b"TOP-SECRET" not in reply


def test_method_not_allowed(store):
    async def go():
        async with running_server(store) as url, aiohttp.ClientSession() as s:
            for m in ("POST", "PUT", "DELETE", "PATCH"):
                async with s.request(m, f"{url}/index.json", data=b"x") as r:
                    assert r.status == 405 and r.headers["Allow"] == "GET, HEAD"
    run(go())


@pytest.mark.parametrize("sendfile", [True, False])
def test_oversized_headers_and_disconnects_do_not_hurt_others(store, manifest, sendfile):
    """Abuse on some connections; the server keeps serving everybody else, and the store is intact."""
    refs = [r.object for s in manifest.shards for r in s.renditions]

    async def go():
        async with running_server(store, chunk_bytes=16 * 1024, sendfile=sendfile) as url:
            u = urlsplit(url)
            big = "X" * 20000
            reply = await raw_request(u.hostname, u.port,
                                      f"GET /index.json HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n".encode())
            assert re.match(rb"HTTP/1\.[01] (400|431)", reply), reply[:100]
            reply = await raw_request(u.hostname, u.port, f"GET /{'a' * 20000} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert re.match(rb"HTTP/1\.[01] (400|414)", reply), reply[:100]
            reply = await raw_request(u.hostname, u.port, b"GARBAGE\r\n\r\n")
            assert re.match(rb"HTTP/1\.[01] 400", reply), reply[:100]

            async def disconnect_mid_transfer(ref):
                r, w = await asyncio.open_connection(u.hostname, u.port)
                w.write(f"GET /{ref.path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                await w.drain()
                await r.readexactly(2048)  # headers + some body, then vanish
                w.transport.abort()

            async def good(s, ref):
                async with s.get(f"{url}/{ref.path}") as r:
                    body = await r.read()
                    assert r.status == 200
                    assert hashlib.sha256(body).hexdigest() == ref.sha256

            async with aiohttp.ClientSession() as s:
                tasks = [disconnect_mid_transfer(refs[i % len(refs)]) for i in range(30)]
                tasks += [good(s, refs[i % len(refs)]) for i in range(30)]
                await asyncio.gather(*tasks)
                await asyncio.gather(*(good(s, r) for r in refs))  # still serving after the abuse
    run(go())
    assert Store(store).verify().ok


def test_many_concurrent_clients(store):
    st = Store(store)
    refs = [o for k in st.manifest_keys() for o in st.get_manifest(*k).objects()]

    async def go():
        async with running_server(store) as url:
            async def phone(i):
                async with aiohttp.ClientSession() as s:  # one connection pool per phone
                    for ref in refs[i % 5::5]:
                        async with s.get(f"{url}/{ref.path}") as r:
                            assert hashlib.sha256(await r.read()).hexdigest() == ref.sha256
            await asyncio.gather(*(phone(i) for i in range(64)))
    run(go())


def test_access_log_holds_no_user_data(store, manifest, caplog):
    ref = _obj(manifest)

    async def go():
        async with running_server(store) as url, aiohttp.ClientSession() as s:
            hdrs = {"User-Agent": "MARKER-UA", "Cookie": "MARKER-COOKIE=1", "Referer": "http://MARKER-REF/"}
            async with s.get(f"{url}/{ref.path}?prompt=MARKER-PROMPT", headers=hdrs) as r:
                assert r.status == 200
                await r.read()
            async with s.get(f"{url}/MARKER-PATH") as r:
                assert r.status == 404
    async def abuse():
        async with running_server(store) as url:
            u = urlsplit(url)
            await raw_request(u.hostname, u.port, b"GET /x HTTP/1.1\r\nX-MARKER: " + b"M" * 9000 + b"\r\n\r\n")
    with caplog.at_level(logging.DEBUG):
        run(go())
        run(abuse())
    lines = [r.getMessage() for r in caplog.records if r.name == "sakura.wire.server.access"]
    assert len(lines) == 2, lines
    assert any(r.name == "sakura.wire.server.protocol" for r in caplog.records)  # the abuse was logged...
    assert lines[0].startswith(f"GET object {ref.sha256[:12]} 200 {ref.bytes} ")
    assert lines[1].startswith("GET - - 404 0 ")
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "MARKER" not in text and "127.0.0.1" not in text  # ...without the client's data
