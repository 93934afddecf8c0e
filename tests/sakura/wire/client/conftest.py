"""Shared by the client tests: the synthetic store's model fingerprint, a bounded asyncio runner,
and our own server over each module's `store` fixture (sizes differ per module)."""
import asyncio

import pytest

from sakura.wire.server import serve_in_thread

FP = "synthetic-model"


def run(coro, timeout=60):
    """Run `coro` to completion, failing after `timeout` seconds instead of hanging the suite."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


@pytest.fixture(scope="module")
def ours(store):
    with serve_in_thread(store) as url:
        yield url
