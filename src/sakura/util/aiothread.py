"""One helper to run an asyncio service on its own event loop in a daemon thread, for synchronous
callers (tests, benchmarks, tools): the cache server (`sakura.wire.server.serve_in_thread`) and the
pacing proxies (`sakura.emulation.pacer.proxy_in_thread`) both start through it."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any, Awaitable, Callable, Iterator, TypeVar

T = TypeVar("T")


@contextlib.contextmanager
def running_in_thread(start: Callable[[], Awaitable[T]], stop: Callable[[T], Awaitable[Any]], *, name: str,
                      timeout_s: float = 30.0,
                      exception_handler: Callable[[asyncio.AbstractEventLoop, dict], None] | None = None
                      ) -> Iterator[T]:
    """``with running_in_thread(start, stop, name=...) as service:``: a new event loop in a daemon
    thread runs ``await start()`` (its result is yielded), then serves until the block ends, then
    runs ``await stop(service)`` and closes. A failure to start is raised here, in the caller's
    thread; a start slower than `timeout_s` seconds raises RuntimeError."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    def main() -> None:
        asyncio.set_event_loop(loop)
        if exception_handler is not None:
            loop.set_exception_handler(exception_handler)
        try:
            box["service"] = loop.run_until_complete(start())
        except BaseException as e:  # surfaced in the caller's thread
            box["error"] = e
            ready.set()
            loop.close()
            return
        ready.set()
        loop.run_forever()
        try:
            loop.run_until_complete(stop(box["service"]))
        finally:
            loop.close()

    th = threading.Thread(target=main, name=name, daemon=True)
    th.start()
    if not ready.wait(timeout_s):
        raise RuntimeError(f"{name}: did not start within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    try:
        yield box["service"]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        th.join(timeout_s)
