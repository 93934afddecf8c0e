"""Quality metrics and the benchmark harness (tiny random model: structure, not quality)."""

import math

import torch

from sakura.models.mini import MiniConfig, MiniDiT
from sakura.cloud.tasks.quality import evaluate_quality, psnr_per_image, quality_grid, ssim_per_image


def test_psnr_known_values_and_region():
    a = torch.zeros(2, 3, 8, 8)
    b = a.clone()
    b[0] += 0.1                                  # mse 0.01 -> 20 dB
    p = psnr_per_image(a, b)
    assert math.isclose(float(p[0]), 20.0, abs_tol=1e-4) and float(p[1]) == math.inf  # exact: inf, no cap
    mask = torch.zeros(2, 1, 8, 8, dtype=torch.bool)
    mask[:, :, :4] = True
    b[1, :, 4:] = 1.0                            # error only outside the region
    pr = psnr_per_image(a, b, mask)
    assert float(pr[1]) == math.inf and float(psnr_per_image(a, b)[1]) < 10


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


# ---------------------------------------------------------------------------------------------
# the one PSNR / SSIM definition, checked against skimage and an independent SSIM


def _pair(seed: int = 3, n: int = 3, size: int = 24):
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(n, 3, size, size, generator=g)
    b = (a + torch.linspace(0.02, 0.2, n).view(n, 1, 1, 1) * torch.randn(a.shape, generator=g)).clamp(0, 1)
    return a, b


def test_psnr_equals_skimage_per_image_and_in_a_region():
    import numpy as np
    from skimage.metrics import peak_signal_noise_ratio

    a, b = _pair()
    ours = psnr_per_image(a, b)
    for i in range(a.shape[0]):
        x, y = a[i].permute(1, 2, 0).double().numpy(), b[i].permute(1, 2, 0).double().numpy()
        assert math.isclose(float(ours[i]), peak_signal_noise_ratio(x, y, data_range=1.0), abs_tol=1e-4)
    mask = torch.zeros(a.shape[0], 1, 24, 24, dtype=torch.bool)
    mask[:, :, 5:17, 2:11] = True
    region = psnr_per_image(a, b, mask)
    for i in range(a.shape[0]):
        m = mask[i, 0].numpy()
        x, y = a[i].permute(1, 2, 0).double().numpy()[m], b[i].permute(1, 2, 0).double().numpy()[m]
        assert math.isclose(float(region[i]), peak_signal_noise_ratio(x, y, data_range=1.0), abs_tol=1e-4)
    assert np.all(np.diff(ours.numpy()) < 0)  # more noise, lower PSNR


def _ssim_reference(x: torch.Tensor, y: torch.Tensor) -> float:
    """Wang et al. (2004) SSIM written out: 11x11 Gaussian window (sigma 1.5), K1 0.01, K2 0.03,
    range 1, population (co)variances, mean over the valid region and the channels. x, y: (3, H, W)."""
    r = torch.arange(11, dtype=torch.float64) - 5
    g1 = torch.exp(-r ** 2 / (2 * 1.5 ** 2))
    w = (g1[:, None] * g1[None, :]) / (g1.sum() ** 2)
    w = w.view(1, 1, 11, 11).expand(3, 1, 11, 11)
    f = lambda t: torch.nn.functional.conv2d(t[None].double(), w, groups=3)[0]   # valid region only
    mx, my = f(x), f(y)
    vx, vy, cxy = f(x * x) - mx ** 2, f(y * y) - my ** 2, f(x * y) - mx * my
    c1, c2 = 0.01 ** 2, 0.03 ** 2
    s = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx ** 2 + my ** 2 + c1) * (vx + vy + c2))
    return float(s.mean())


def test_ssim_equals_the_standard_definition_written_out():
    a, b = _pair()
    ours = ssim_per_image(a, b)
    ref = [_ssim_reference(a[i].double(), b[i].double()) for i in range(a.shape[0])]
    for o, r in zip(ours.tolist(), ref):
        assert math.isclose(o, r, abs_tol=1e-6), (o, r)
    assert ours[0] > ours[1] > ours[2]


def test_no_second_psnr_or_ssim_definition_in_the_package():
    """Image PSNR has one definition, the MSE -> dB conversion in sakura.util.psnr (inf at zero error):
    no other module calls log10 or defines a psnr function; SSIM and skimage's metrics live in
    sakura.cloud.tasks.quality only."""
    import re
    from pathlib import Path

    import sakura

    root = Path(sakura.__file__).parent
    texts = {str(p.relative_to(root)): p.read_text() for p in root.rglob("*.py")}
    db = re.compile(r"(math|torch|np|numpy)\.log10\(")
    assert {f for f, t in texts.items() if db.search(t)} == {"util/psnr.py"}
    psnr = re.compile(r"def psnr\w*\(")  # quality's per-image metric is built on psnr.psnr_db_tensor
    assert {f for f, t in texts.items() if psnr.search(t)} == {"util/psnr.py", "cloud/tasks/quality.py"}
    ssim = re.compile(r"structural_similarity|peak_signal_noise_ratio|def \w*ssim\w*\(")
    assert {f for f, t in texts.items() if ssim.search(t)} == {"cloud/tasks/quality.py"}
