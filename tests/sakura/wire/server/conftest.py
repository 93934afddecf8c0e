from __future__ import annotations

import asyncio

import pytest

from sakura.wire.store import Store
from sakura.wire.store.synthetic import make_synthetic_store


@pytest.fixture(autouse=True)
def _fresh_log_rate_limit():
    """Each test sees the server's rate-limited loggers afresh (a test counting log lines must
    not find its line suppressed because an earlier test logged the same one)."""
    from sakura.wire.server.app import _rate_limit

    _rate_limit.reset()
    yield


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A synthetic store: 2 templates x 3 shards; fp16 renditions are 2*256*256*2 = 256 KiB."""
    root = tmp_path_factory.mktemp("store")
    make_synthetic_store(root, templates=2, layers=3, tokens=256, width=256)
    return root


@pytest.fixture(scope="module")
def manifest(store):
    return Store(store).get_manifest("synthetic-model", "tpl-000")


async def raw_request(host: str, port: int, data: bytes, *, read_limit: int = 1 << 22, timeout: float = 5.0) -> bytes:
    """Send raw bytes on a fresh TCP connection and read the reply until EOF (or ``timeout`` s)."""
    r, w = await asyncio.open_connection(host, port)
    try:
        w.write(data)
        await w.drain()
        out = bytearray()
        async def _read():
            while len(out) < read_limit:
                b = await r.read(65536)
                if not b:
                    break
                out.extend(b)
        try:
            await asyncio.wait_for(_read(), timeout)
        except asyncio.TimeoutError:
            pass
        return bytes(out)
    finally:
        w.close()
