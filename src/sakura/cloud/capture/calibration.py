"""The public calibration photos the cloud measures templates with (never a user's photo)."""

from __future__ import annotations

import torch

from sakura.cloud.tasks.photos import load_source, random_crop

#: Public *training* photo sources (scikit-image): calibration never uses the held-out test photos.
CALIBRATION_SOURCES = ("camera", "coffee", "astronaut", "coins")


def calibration_photos(size: int, n: int = 2, seed: int = 0) -> torch.Tensor:
    """(n, 3, size, size) crops in [0, 1], one per source in `CALIBRATION_SOURCES` order (cycling)."""
    if n < 1:
        raise ValueError(f"need at least one calibration photo, got n={n}")
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([random_crop(load_source(CALIBRATION_SOURCES[i % len(CALIBRATION_SOURCES)]), size, gen)
                        for i in range(n)])
