"""Small figures both the demo and `sakura edit` write (matplotlib, imported only when called)."""

from __future__ import annotations

from pathlib import Path

import torch


def save_grid(path: Path, images: list[torch.Tensor], titles: list[str]) -> None:
    """One row of images (each (1, 3, H, W) in [0, 1]) with a title above each, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(images), figsize=(2.2 * len(images), 2.6))
    for ax, img, title in zip(axes, images, titles):
        ax.imshow(img[0].permute(1, 2, 0).clamp(0, 1).numpy(), interpolation="nearest")
        ax.set_title(title, fontsize=8)
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
