from __future__ import annotations

import pytest

from sakura.emulation import traces_root


@pytest.fixture(scope="session")
def troot():
    root = traces_root()
    if root is None:
        pytest.skip("SAKURA_TRACES names no folder (unset, the bundled traces serve)")
    return root
