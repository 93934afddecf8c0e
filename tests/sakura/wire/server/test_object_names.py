"""The server never serves bytes that do not hash to their name (a real server on 127.0.0.1).

A hard link to a file outside the store, placed under objects/ with a valid-looking name, was
served with 200 and a strong ETag equal to a sha256 the bytes did not have; an edge would have
cached it for a year."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import urllib.error
import urllib.request

import aiohttp
import pytest
from aiohttp import web

from sakura.wire.server import serve_in_thread
from sakura.wire.server.app import VERIFIED_KEY, make_app
from sakura.wire.store import Store
from sakura.wire.store.synthetic import make_synthetic_store


def _get(url: str, headers: dict | None = None) -> tuple[int, bytes, dict]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


@pytest.fixture
def own_store(tmp_path):
    root = tmp_path / "store"
    make_synthetic_store(root, templates=1, layers=2, tokens=256, width=256)  # 256 KiB fp16 objects
    return root


@pytest.mark.parametrize("size", [1000, 600_000])  # hashed inline, and in a worker thread
def test_a_foreign_file_under_objects_is_refused_logged_and_reported(own_store, tmp_path, caplog, size):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(os.urandom(size))
    fake = "ab" + hashlib.sha256(b"some other bytes").hexdigest()[2:]
    (own_store / "objects" / "ab").mkdir(parents=True, exist_ok=True)
    os.link(outside, own_store / "objects" / "ab" / fake)  # a hard link: a regular file, no symlink
    with caplog.at_level(logging.ERROR, logger="sakura.wire.server"), serve_in_thread(own_store) as url:
        for _ in range(2):  # refused the first time and, remembered, every time after
            status, body, headers = _get(f"{url}/objects/ab/{fake}")
            assert status == 500 and b"damaged; not served" in body
            assert headers.get("Cache-Control") == "no-store" and "ETag" not in headers
        status, _, _ = _get(f"{url}/objects/ab/{fake}", {"Range": "bytes=0-9"})
        assert status == 500  # a Range request is no way around it
    assert any("do not hash to its name" in r.getMessage() for r in caplog.records)
    problems = Store(own_store).verify().problems
    assert any(fake in p and "checksum mismatch" in p for p in problems)


def test_good_objects_are_served_and_a_changed_file_is_hashed_again(own_store):
    m = Store(own_store).get_manifest("synthetic-model", "tpl-000")
    ref = m.shards[0].renditions[0].object
    path = own_store / ref.path
    good = path.read_bytes()
    with serve_in_thread(own_store) as url:
        status, body, headers = _get(f"{url}/{ref.path}")
        assert status == 200 and body == good and headers["ETag"] == f'"{ref.sha256}"'
        status, body, _ = _get(f"{url}/{ref.path}", {"Range": "bytes=10-19"})
        assert status == 206 and body == good[10:20]
        # rewritten in place after it was verified, even with its old mtime restored: the ctime moves
        st = path.stat()
        path.chmod(0o644)
        with open(path, "r+b") as f:
            f.write(b"\x00" * 16)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        status, _, _ = _get(f"{url}/{ref.path}")
        assert status == 500
        # put back (a rebuild rewrites a damaged object): served again
        path.write_bytes(good)
        status, body, _ = _get(f"{url}/{ref.path}")
        assert status == 200 and body == good


def test_concurrent_first_requests_share_one_hash(tmp_path):
    own_store = tmp_path / "big"
    make_synthetic_store(own_store, templates=1, layers=1, tokens=512, width=256)  # 512 KiB fp16 objects
    m = Store(own_store).get_manifest("synthetic-model", "tpl-000")
    big = max((r.object for s in m.shards for r in s.renditions), key=lambda o: o.bytes)
    assert big.bytes > 256 * 1024  # hashed in a thread

    async def main():
        app = make_app(own_store)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession() as s:
                async def one():
                    async with s.get(f"http://127.0.0.1:{port}/{big.path}") as r:
                        return r.status, len(await r.read())
                got = await asyncio.gather(*[one() for _ in range(16)])
        finally:
            await runner.cleanup()
        return got, app[VERIFIED_KEY].hashed

    got, hashed = asyncio.run(main())
    assert got == [(200, big.bytes)] * 16
    assert hashed == 1
