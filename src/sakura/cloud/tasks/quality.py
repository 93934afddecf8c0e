"""The sakura-mini quality benchmark: edits against exact ground truth, per task.

On held-out photos (`heldout_photos`) and held-out library templates, for every task:
  model      the model with the template's lossless KV injected (extract once, inject)
  identity   output = the photo (the do-nothing baseline)
  swapped    the model given another held-out template of the same task, scored against the
             ground truth of the intended one (how much the output depends on the template)
PSNR (dB, mean over images) and SSIM, on the whole image and, for local tasks (sticker), inside
the edited region (the template's non-key pixels).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from sakura.models.mini import MiniDiT
from sakura.util.psnr import psnr_db_tensor
from sakura.util.report import markdown_table

from .edits import TASKS, get_task
from .library import TASK_NAMES, library_templates
from .photos import heldout_photos

METHODS = ("model", "identity", "swapped")


def psnr_per_image(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """PSNR in dB for data range 1. a, b: (B, 3, H, W); mask: (B, 1, H, W) bool or None. -> (B,).

    An image with zero error is inf dB (`sakura.util.psnr`: no cap).
    """
    se = (a.float() - b.float()).pow(2)                                       # (B, 3, H, W)
    if mask is None:
        mse = se.mean(dim=(1, 2, 3))
    else:
        m = mask.expand_as(se).float()
        mse = (se * m).sum(dim=(1, 2, 3)) / m.sum(dim=(1, 2, 3)).clamp_min(1.0)
    return psnr_db_tensor(mse)


def ssim_per_image(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """SSIM (skimage, Gaussian window, data range 1, over RGB). a, b: (B, 3, H, W) -> (B,)."""
    from skimage.metrics import structural_similarity  # lazy: skimage ([build] extra)

    out = [structural_similarity(x.permute(1, 2, 0).numpy().astype(np.float64),
                                 y.permute(1, 2, 0).numpy().astype(np.float64),
                                 data_range=1.0, channel_axis=-1, gaussian_weights=True, sigma=1.5,
                                 use_sample_covariance=False)
           for x, y in zip(a.float(), b.float())]
    return torch.tensor(out)


@dataclass
class TaskQuality:
    """Mean metrics for one task. Keys of each dict: METHODS."""

    task: str
    images: int
    templates: list[str]
    psnr: dict[str, float] = field(default_factory=dict)
    ssim: dict[str, float] = field(default_factory=dict)
    psnr_region: dict[str, float] | None = None   # local tasks: PSNR inside the edited region

    @property
    def gain_db(self) -> float:
        """Model PSNR minus identity PSNR (whole image)."""
        return self.psnr["model"] - self.psnr["identity"]

    @property
    def gain_region_db(self) -> float | None:
        return None if self.psnr_region is None else self.psnr_region["model"] - self.psnr_region["identity"]


@dataclass
class QualityReport:
    tasks: list[TaskQuality]
    steps: int
    seed: int
    photos: int

    def passes(self, margin_db: float = 6.0) -> bool:
        """True when the model beats identity by `margin_db` on every task (and region, where local)."""
        return all(t.gain_db >= margin_db and (t.gain_region_db is None or t.gain_region_db >= margin_db)
                   for t in self.tasks)

    def to_dict(self) -> dict:
        return {"steps": self.steps, "seed": self.seed, "photos": self.photos,
                "tasks": [{**asdict(t), "gain_db": t.gain_db, "gain_region_db": t.gain_region_db} for t in self.tasks]}

    def markdown(self) -> str:
        """The quality table (PSNR dB / SSIM; region PSNR for local tasks)."""
        rows = []
        for t in self.tasks:
            rows.append([t.task, f"{t.psnr['model']:.2f}", f"{t.psnr['identity']:.2f}", f"{t.psnr['swapped']:.2f}",
                         f"{t.ssim['model']:.3f}", f"{t.ssim['identity']:.3f}", f"{t.ssim['swapped']:.3f}",
                         f"{t.gain_db:+.2f} dB"])
            if t.psnr_region is not None:
                r = t.psnr_region
                rows.append([f"{t.task} (in region)", f"{r['model']:.2f}", f"{r['identity']:.2f}", f"{r['swapped']:.2f}",
                             "", "", "", f"{t.gain_region_db:+.2f} dB"])
        return markdown_table(["task", "model PSNR", "identity PSNR", "swapped-template PSNR", "model SSIM",
                               "identity SSIM", "swapped SSIM", "model - identity"], rows, align="l" * 8)


@torch.no_grad()
def edit_with_template(model: MiniDiT, photos: torch.Tensor, template: torch.Tensor, instruction: int,
                       *, steps: int, seed: int) -> torch.Tensor:
    """Lossless-KV edit: extract the template KV once, inject it. photos: (B, 3, S, S) -> (B, 3, S, S)."""
    kv = model.extract_template_kv(template[None] if template.ndim == 3 else template, instruction)
    return model.edit(photos, template_kv=kv, steps=steps, seed=seed).image


def evaluate_quality(model: MiniDiT, *, steps: int = 8, seed: int = 0, photos_per_source: int = 4,
                     tasks: tuple[str, ...] = TASK_NAMES, with_ssim: bool = True) -> QualityReport:
    """Score `model` on held-out photos x held-out templates for every task (see module doc)."""
    size = model.cfg.image_size
    photos = heldout_photos(size, photos_per_source)                          # (N, 3, S, S)
    reports = []
    for name in tasks:
        task = get_task(name)
        tmpls = library_templates(size, task=name, held_out=True)
        if len(tmpls) < 2:
            raise ValueError(f"task {name!r} needs at least two held-out templates to swap")
        acc: dict[str, list[torch.Tensor]] = {f"{k}_{m}": [] for k in ("psnr", "ssim", "region") for m in METHODS}
        for i, tm in enumerate(tmpls):
            other = tmpls[(i + 1) % len(tmpls)]
            gt = task.ground_truth(photos, tm.image[None])
            outs = {
                "model": edit_with_template(model, photos, tm.image, tm.instruction, steps=steps, seed=seed),
                "identity": photos,
                "swapped": edit_with_template(model, photos, other.image, other.instruction, steps=steps, seed=seed),
            }
            region = task.region(tm.image[None])
            for m, out in outs.items():
                acc[f"psnr_{m}"].append(psnr_per_image(out, gt))
                if with_ssim:
                    acc[f"ssim_{m}"].append(ssim_per_image(out, gt))
                if region is not None:
                    acc[f"region_{m}"].append(psnr_per_image(out, gt, region.expand(len(photos), -1, -1, -1)))
        mean = lambda key: float(torch.cat(acc[key]).mean()) if acc[key] else math.nan
        reports.append(TaskQuality(
            task=name, images=len(photos) * len(tmpls), templates=[t.name for t in tmpls],
            psnr={m: mean(f"psnr_{m}") for m in METHODS},
            ssim={m: mean(f"ssim_{m}") for m in METHODS},
            psnr_region={m: mean(f"region_{m}") for m in METHODS} if task.local else None))
    return QualityReport(reports, steps=steps, seed=seed, photos=len(photos))


@torch.no_grad()
def quality_grid(model: MiniDiT, path, *, steps: int = 8, seed: int = 0, per_task: int = 2) -> None:
    """Save a PNG grid: one row per example, columns photo | template | ground truth | model |
    swapped template's output. Held-out photos and held-out templates only."""
    import matplotlib  # lazy: matplotlib ([bench] extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib ([bench] extra)

    size = model.cfg.image_size
    photos = heldout_photos(size, 4)
    rows = []
    for ti, name in enumerate(TASK_NAMES):
        task = TASKS[name]
        tmpls = library_templates(size, task=name, held_out=True)
        for j in range(per_task):
            tm = tmpls[j % len(tmpls)]
            ph = photos[(ti * per_task + j) * 3 % len(photos)][None]
            gt = task.ground_truth(ph, tm.image[None])
            out = edit_with_template(model, ph, tm.image, tm.instruction, steps=steps, seed=seed)
            other = tmpls[(j + 1) % len(tmpls)]
            sw = edit_with_template(model, ph, other.image, other.instruction, steps=steps, seed=seed)
            p = float(psnr_per_image(out, gt)[0])
            rows.append((f"{name} / {tm.name}", [ph[0], tm.image, gt[0], out[0], sw[0]], p))
    cols = ["photo", "template", "ground truth", "model", "model, swapped template"]
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(2.0 * len(cols), 2.0 * len(rows)))
    for r, (label, imgs, p) in enumerate(rows):
        for c, img in enumerate(imgs):
            ax = axes[r, c]
            ax.imshow(img.permute(1, 2, 0).clamp(0, 1).numpy(), interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(cols[c], fontsize=9)
            if c == 0:
                ax.set_ylabel(label, fontsize=8)
            if c == 3:
                ax.set_xlabel(f"{p:.1f} dB", fontsize=8)
    fig.suptitle("sakura-mini on held-out photos and held-out templates", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
