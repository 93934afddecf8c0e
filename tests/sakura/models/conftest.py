import pytest
import torch

from sakura.models.mini import MiniConfig, MiniDiT


def make_tiny_mini(seed: int = 0, **overrides) -> MiniDiT:
    """A small random sakura-mini whose zero-initialised output/gates are randomised, so the
    output really depends on every input (a freshly initialised DiT outputs zeros)."""
    cfg = MiniConfig(**{"image_size": 16, "patch_size": 4, "dim": 32, "depth": 3, "heads": 2, **overrides})
    torch.manual_seed(seed)
    m = MiniDiT(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    m.invalidate_fingerprint()
    return m.eval()


@pytest.fixture
def tiny_mini():
    return make_tiny_mini()


@pytest.fixture
def mini_factory():
    return make_tiny_mini
