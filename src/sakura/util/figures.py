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


def save_panels(path: Path, rows: list[list[tuple[torch.Tensor, str]]], title: str = "") -> None:
    """Images in rows (each (1, 3, H, W) in [0, 1]) with a title above each: `rows` is a list of rows
    of (image, title); shorter rows leave their last cells empty. A PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncols = max(len(r) for r in rows)
    fig, axes = plt.subplots(len(rows), ncols, figsize=(2.3 * ncols, 2.75 * len(rows) + (0.3 if title else 0)),
                             squeeze=False)
    for i, row in enumerate(rows):
        for j in range(ncols):
            ax = axes[i, j]
            ax.axis("off")
            if j < len(row):
                img, name = row[j]
                ax.imshow(img[0].permute(1, 2, 0).clamp(0, 1).numpy(), interpolation="nearest")
                ax.set_title(name, fontsize=7.5)
    if title:
        fig.suptitle(title, fontsize=8.5)
    fig.tight_layout(h_pad=1.5)
    fig.savefig(path, dpi=120)
    plt.close(fig)
