import os

import pytest
import torch
from hypothesis import settings

# One thread per test process: CI machines have 2 cores and the suite must not oversubscribe.
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

# Hypothesis: in CI every run draws the same examples (derandomize, no example database), so a red
# CI run is reproducible and a green one is not luck; locally it keeps exploring new examples.
# Examples it finds that fail are pinned with @example next to the property. Select another
# profile with HYPOTHESIS_PROFILE=dev|ci (hypothesis also detects CI itself; this makes it explicit).
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("dev", derandomize=False, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE")
                      or ("ci" if os.environ.get("CI", "").lower() in ("true", "1") else "dev"))


@pytest.fixture
def rng():
    return torch.Generator().manual_seed(1234)


@pytest.fixture(scope="session")
def klein_folder(tmp_path_factory):
    """A complete tiny FLUX.2 Klein pipeline written with save_pretrained, once per test run."""
    from sakura.models.klein_tiny import write_tiny_klein_folder

    return write_tiny_klein_folder(tmp_path_factory.mktemp("klein"))
