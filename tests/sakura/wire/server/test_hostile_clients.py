"""The server against hostile clients and a hostile store, on 127.0.0.1: slow-header
connections are closed at the header timeout, a connection cap evicts idle ones so a normal
client is still served, repeated errors are logged a bounded number of times, and no symlink
leads out of the store (serve and `store verify` agree). Counting, not timing."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil

import pytest

from sakura.wire.server.app import ConnectionLimits, connection_counts, start_server
from sakura.wire.store import Store

pytestmark = pytest.mark.timeout(120)


def run(coro, timeout=90):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def _slow_header_conns(port: int, n: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    conns = []
    for _ in range(n):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET /index.json HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # never finished
        await w.drain()
        conns.append((r, w))
    return conns


async def _get_index(port: int) -> int:
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        async with s.get(f"http://127.0.0.1:{port}/index.json") as r:
            await r.read()
            return r.status


async def _closed_by_server(conns, within_s: float) -> int:
    """How many of `conns` the server has closed (EOF) within `within_s` seconds."""
    async def eof(r):
        try:
            return await asyncio.wait_for(r.read(), within_s) == b"" or True
        except (asyncio.TimeoutError, ConnectionError):
            return False
    res = await asyncio.gather(*(eof(r) for r, _ in conns))
    return sum(bool(x) for x in res)


def test_slow_header_connections_are_closed_and_a_normal_client_is_served(store):
    async def go():
        runner, url = await start_server(store, limits=ConnectionLimits(header_timeout_s=1.0, idle_timeout_s=5.0))
        port = int(url.rsplit(":", 1)[1])
        try:
            conns = await _slow_header_conns(port, 60)
            await asyncio.sleep(0.2)
            assert connection_counts(runner)["open"] >= 60
            assert await _get_index(port) == 200  # served while the slow ones are held
            closed = await _closed_by_server(conns, within_s=15.0)
            for _, w in conns:
                w.close()
            await asyncio.sleep(0.2)
            return closed, connection_counts(runner)
        finally:
            await runner.cleanup()
    closed, counts = run(go())
    assert closed == 60
    assert counts["header_timeouts"] >= 60 and counts["open"] == 0


def test_connection_cap_evicts_idle_connections_so_real_requests_get_in(store):
    async def go():
        runner, url = await start_server(store, limits=ConnectionLimits(header_timeout_s=60.0, max_connections=20))
        port = int(url.rsplit(":", 1)[1])
        try:
            conns = await _slow_header_conns(port, 50)
            await asyncio.sleep(0.3)
            held = connection_counts(runner)["open"]
            statuses = [await _get_index(port) for _ in range(5)]
            counts = connection_counts(runner)
            for _, w in conns:
                w.close()
            return held, statuses, counts
        finally:
            await runner.cleanup()
    held, statuses, counts = run(go())
    assert held <= 21  # never more than the cap (+ the one being admitted)
    assert statuses == [200] * 5
    assert counts["evicted"] >= 30


def test_repeated_errors_are_rate_limited(caplog):
    log = logging.getLogger("sakura.wire.server")
    with caplog.at_level(logging.WARNING, logger="sakura.wire.server"):
        for _ in range(5000):
            log.warning("refusing to open %s (symlink or unreadable)", "objects/aa/x")
    n = sum(r.name == "sakura.wire.server" for r in caplog.records)
    assert 1 <= n <= 10


def test_event_loop_errors_are_one_line_each_rate_limited(caplog):
    from sakura.wire.server.app import _exception_handler

    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.ERROR, logger="sakura.wire.server"):
            for _ in range(2000):
                _exception_handler(loop, {"message": "socket.accept() out of system resource",
                                          "exception": OSError(24, "Too many open files")})
    finally:
        loop.close()
    recs = [r for r in caplog.records if r.name == "sakura.wire.server"]
    assert 1 <= len(recs) <= 10 and all(r.exc_info is None for r in recs)
    assert "Too many open files" in recs[0].getMessage()


def _serve_status(root, path: str) -> int:
    async def go():
        runner, url = await start_server(root)
        port = int(url.rsplit(":", 1)[1])
        import aiohttp

        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
                async with s.get(f"http://127.0.0.1:{port}{path}") as r:
                    await r.read()
                    return r.status
        finally:
            await runner.cleanup()
    return run(go())


def test_symlinks_never_leave_the_store_and_verify_agrees_with_serve(store, manifest, tmp_path):
    root = tmp_path / "s"
    shutil.copytree(store, root)
    outside = tmp_path / "outside"
    outside.mkdir()
    ref = manifest.shards[0].renditions[0].object
    assert _serve_status(root, "/" + ref.path) == 200 and Store(root).verify().ok
    # 1. the object file is a symlink to a copy outside the store
    p = root / ref.path
    shutil.copy(p, outside / p.name)
    p.unlink()
    p.symlink_to(outside / p.name)
    assert _serve_status(root, "/" + ref.path) == 404
    rep = Store(root).verify()
    assert not rep.ok and any("symlink" in x for x in rep.problems)
    assert any("symlink" in x or "damaged" in x or "not a regular file" in x
               for x in Store(root).verify_manifest("synthetic-model", "tpl-000"))
    # 2. a whole objects/xx directory is a symlink out of the store
    p.unlink()
    shutil.copy(outside / p.name, p)
    d = p.parent
    shutil.move(str(d), str(outside / d.name))
    os.symlink(outside / d.name, d)
    assert (root / ref.path).is_file()  # following the link would find it...
    assert _serve_status(root, "/" + ref.path) == 404  # ...serve does not follow it
    rep = Store(root).verify()
    assert not rep.ok and any(x.startswith(f"objects/{d.name}: is a symlink") for x in rep.problems)
    from sakura.wire.store.store import ObjectDamaged

    with pytest.raises(ObjectDamaged, match="not a regular file inside the store"):
        Store(root).get_object(ref)
