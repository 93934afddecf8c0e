"""Small figures both the demo and `sakura edit` write: `save_grid` with Pillow alone (the phone's
`sakura edit` needs no plotting library), `save_panels` with matplotlib (the [bench] extra)."""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image, ImageDraw


def save_grid(path: Path, images: list[torch.Tensor], titles: list[str], *, cell: int = 256) -> None:
    """One row of images (each (1, 3, H, W) in [0, 1]) with a title above each, as a PNG: each
    image scaled to ``cell`` pixels per side with nearest-neighbour (pixels stay visible)."""
    pad, head = 8, 18
    sheet = Image.new("RGB", (len(images) * (cell + pad) + pad, cell + head + pad), "white")
    draw = ImageDraw.Draw(sheet)
    for i, (img, title) in enumerate(zip(images, titles)):
        arr = (img[0].detach().float().clamp(0, 1).permute(1, 2, 0).cpu().numpy() * 255).round().astype("uint8")
        x = pad + i * (cell + pad)
        sheet.paste(Image.fromarray(arr).resize((cell, cell), Image.Resampling.NEAREST), (x, head))
        draw.text((x, 3), title[:48], fill="black")
    sheet.save(path)


def save_panels(path: Path, rows: list[list[tuple[torch.Tensor, str]]], title: str = "") -> None:
    """Images in rows (each (1, 3, H, W) in [0, 1]) with a title above each: `rows` is a list of rows
    of (image, title); shorter rows leave their last cells empty. A PNG."""
    import matplotlib  # lazy: matplotlib ([bench] extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib ([bench] extra)

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
