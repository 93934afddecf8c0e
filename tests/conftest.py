import os

import pytest
import torch

# One thread per test process: CI machines have 2 cores and the suite must not oversubscribe.
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))


@pytest.fixture
def rng():
    return torch.Generator().manual_seed(1234)
