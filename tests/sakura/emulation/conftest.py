from __future__ import annotations

import pytest

from sakura.emulation import traces_root


@pytest.fixture(scope="session")
def troot():
    root = traces_root()
    if root is None:
        pytest.skip("real traces not found: set SAKURA_TRACES or place ../shared/traces beside the repo")
    return root
