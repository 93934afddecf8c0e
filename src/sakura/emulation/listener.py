"""The one local TCP listener the link's test servers share (`PacingProxy`, `FaultProxy`,
`HostileServer`): an asyncio server on a local address whose port is known once started."""

from __future__ import annotations

import asyncio
from typing import Self


class Listener:
    """Base for a server that handles each connection in `_on_client`. Subclasses set `listen`
    (host, port; port 0 = any free one) before `start()` and write their own `close()` (each
    ends its connections differently)."""

    listen: tuple[str, int] = ("127.0.0.1", 0)
    _server: asyncio.base_events.Server | None = None

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    @property
    def port(self) -> int:
        assert self._server is not None, f"{type(self).__name__} not started"
        return self._server.sockets[0].getsockname()[1]

    async def start(self) -> Self:
        self._server = await asyncio.start_server(self._on_client, *self.listen)
        return self
