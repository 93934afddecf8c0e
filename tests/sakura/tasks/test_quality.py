"""Quality metrics and the benchmark harness (tiny random model: structure, not quality)."""

import math

import torch

from sakura.models.mini import MiniConfig, MiniDiT
from sakura.tasks.quality import evaluate_quality, psnr_per_image, quality_grid, ssim_per_image


def test_psnr_known_values_and_region():
    a = torch.zeros(2, 3, 8, 8)
    b = a.clone()
    b[0] += 0.1                                  # mse 0.01 -> 20 dB
    p = psnr_per_image(a, b)
    assert math.isclose(float(p[0]), 20.0, abs_tol=1e-4) and float(p[1]) == 100.0
    mask = torch.zeros(2, 1, 8, 8, dtype=torch.bool)
    mask[:, :, :4] = True
    b[1, :, 4:] = 1.0                            # error only outside the region
    pr = psnr_per_image(a, b, mask)
    assert float(pr[1]) == 100.0 and float(psnr_per_image(a, b)[1]) < 10


def test_ssim_identical_is_one_and_noise_lowers_it():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(1, 3, 16, 16, generator=g)
    assert math.isclose(float(ssim_per_image(a, a)[0]), 1.0, abs_tol=1e-6)
    assert float(ssim_per_image(a, (a + 0.3 * torch.randn(a.shape, generator=g)).clamp(0, 1))[0]) < 0.9


def test_evaluate_quality_on_a_tiny_model(tmp_path):
    torch.manual_seed(0)
    m = MiniDiT(MiniConfig(image_size=16, patch_size=4, dim=32, depth=2, heads=2)).eval()
    r = evaluate_quality(m, steps=1, photos_per_source=1)
    assert [t.task for t in r.tasks] == ["look", "texture", "sticker"]
    for t in r.tasks:
        assert set(t.psnr) == {"model", "identity", "swapped"} and all(math.isfinite(v) for v in t.psnr.values())
    assert r.tasks[2].psnr_region is not None and r.tasks[0].psnr_region is None
    # an untrained model (zero output layer) does not pass the target
    assert not r.passes(6.0)
    assert "| sticker (in region) |" in r.markdown()
    quality_grid(m, tmp_path / "g.png", steps=1, per_task=1)
    assert (tmp_path / "g.png").stat().st_size > 1000
