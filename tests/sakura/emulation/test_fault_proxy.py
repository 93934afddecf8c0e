"""`FaultProxy` on loopback: closing it ends every connection's task (no task left pending for the
event loop's close, which then raised "Event loop is closed" from the cancellations)."""

from __future__ import annotations

import asyncio

import pytest

from sakura.emulation.faults import FaultProxy


async def _upstream_that_streams():
    async def on(r, w):
        try:
            await r.readuntil(b"\r\n\r\n")
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
            while True:
                w.write(b"\x00" * 16384)
                await w.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            w.close()

    return await asyncio.start_server(on, "127.0.0.1", 0)


@pytest.mark.parametrize("fault", ["reset-always", "stall", "http500"])
def test_close_ends_every_connection(fault):
    async def main():
        up = await _upstream_that_streams()
        px = await FaultProxy(("127.0.0.1", up.sockets[0].getsockname()[1]), fault, after_bytes=1500).start()
        idle = await asyncio.open_connection("127.0.0.1", px.port)        # a keep-alive connection, no request
        busy_r, busy_w = await asyncio.open_connection("127.0.0.1", px.port)
        busy_w.write(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")
        await busy_w.drain()
        await asyncio.sleep(0.2)
        assert px._conns  # the idle one at least (reset-always has reset the busy one)
        await px.close()
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
        assert not px._conns and not [t for t in pending if "FaultProxy" in repr(t)], pending
        for w in (idle[1], busy_w):
            w.close()
        up.close()
        await up.wait_closed()

    asyncio.run(main())
