"""PSNR of images in [0, 1]: the one MSE -> dB conversion, 10 log10(1 / mse).

Zero error is +inf dB, never a cap. Why: the manifest's contract (`image_psnr_db` is exactly
10 log10(1 / `image_mse`), null/inf iff the MSE is 0, checked on every read), the planner and the
driver compare these values with quality floors, and a lossless shard must not look like a
merely very good one (a cap of 100 dB also made a mean over images a made-up number: one exact
image lifted a mean of 30 dB images by 70 / n dB). Code that averages PSNR over images gets inf
when one image is exact, which says what happened; average the MSEs first where a finite mean is
wanted.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def psnr_db(mse: float) -> float:
    """10 log10(1 / mse) for pixels in [0, 1]; inf for mse <= 0."""
    return math.inf if mse <= 0.0 else 10.0 * math.log10(1.0 / mse)


def psnr_db_tensor(mse: torch.Tensor) -> torch.Tensor:
    """`psnr_db` elementwise: (...) MSEs -> (...) dB, inf where the MSE is 0."""
    import torch  # lazy: torch; off --help and argument errors

    mse = mse.float()
    return torch.where(mse > 0, -10.0 * torch.log10(mse.clamp_min(torch.finfo(torch.float32).tiny)),
                       torch.full_like(mse, math.inf))
