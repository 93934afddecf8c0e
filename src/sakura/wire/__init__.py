"""The wire: the content-addressed store and its manifest format (`store`), the HTTP server
(`server`), the phone-side client (`client`). Public entry points: `open_store`, `serve`,
`serve_forever`."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

from sakura.wire import server  # a lazy facade: the aiohttp server loads on first use (0.12 s off every build)
from sakura.wire.store import Store, store_format

__all__ = ["Store", "open_store", "serve", "serve_forever"]


def __getattr__(name: str):
    # the HTTP server on first use: writing a store (`sakura build`) never serves, and importing
    # the server cost every build 0.12 s
    if name in ("serve_forever", "serve_in_thread"):
        return getattr(server, name)
    raise AttributeError(f"module 'sakura.wire' has no attribute {name!r}")


def open_store(path: str | os.PathLike[str]) -> Store:
    """A store folder (written by `sakura.build`) for reading: ``.stats()`` (storage accounting per
    template), ``.verify()`` (every object's hash, every manifest's references), ``.manifest_keys()``.
    Raises `sakura.wire.store.NotAStore` (one line) when ``path`` is not a store: missing, a file,
    or a folder without the store's marker (build one with sakura.build or `sakura build`)."""
    return Store(path)


@contextlib.contextmanager
def serve(store: str | os.PathLike[str], *, host: str = "127.0.0.1", port: int = 0, **options) -> Iterator[str]:
    """Serve ``store`` over HTTP in a background thread for the ``with`` block; yields the base
    URL (``port=0`` picks a free port). ``options`` go to the server (``chunk_bytes``, ``limits``).
    For a long-running server use `serve_forever` or ``sakura serve``; in production, stock nginx
    serves the same folder (docs/serving.md)."""
    p = Path(store)
    store_format(p)  # NotAStore before a thread starts
    with server.serve_in_thread(p, host=host, port=port, **options) as url:
        yield url
