"""What sakura's template isolation costs on a checkpoint trained without it (`sakura bench isolation`).

Stock FLUX.2 Klein passes the user's photo as a second reference, and reference tokens attend to
each other, so a template's K/V depend on the photo and cannot be cached. sakura computes (and
caches) the template's K/V with the template alone: template queries attend to template keys only.
flux2-mini trained with `--stock-references` is a stock-attention model of the same recipe; this
module runs it both ways on the held-out photos x held-out templates of every task:

  * stock:   the model as trained (template and photo references attend to each other; NOCACHE);
  * cached:  sakura's isolated template KV, extracted from the template alone and injected (the
             photo still attends to the template, as in stock);

and reports PSNR (dB) of both against the exact ground truth, and of cached against stock (how far
the cached edit moves from the model's own output).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from sakura.cloud.tasks import TASK_NAMES, get_task
from sakura.cloud.tasks.library import library_templates
from sakura.cloud.tasks.photos import heldout_photos
from sakura.cloud.tasks.quality import psnr_per_image
from sakura.util.report import markdown_table
from .loop import CHECKPOINT, Recipe, load_checkpoint, load_weights


@dataclass(frozen=True)
class IsolationRow:
    """One task: mean PSNR (dB) over held-out photos x templates; `*_region` over the edited area
    (sticker) or None."""

    task: str
    images: int
    stock_vs_gt: float
    cached_vs_gt: float
    cached_vs_stock: float
    identity_vs_gt: float
    stock_vs_gt_region: float | None = None
    cached_vs_gt_region: float | None = None

    @property
    def cost_db(self) -> float:
        """dB the isolated cached KV loses against ground truth (stock - cached)."""
        return self.stock_vs_gt - self.cached_vs_gt


def load_run_model(path: str | Path) -> tuple[torch.nn.Module, int]:
    """A run folder's latest checkpoint (or a weights file) -> (model in eval mode, steps trained)."""
    path = Path(path)
    if path.is_dir():
        if not (path / CHECKPOINT).is_file():
            raise FileNotFoundError(f"{path}: no {CHECKPOINT} (not a sakura train run folder)")
        ck = torch.load(path / CHECKPOINT, map_location="cpu", weights_only=True)
        recipe = Recipe.from_dict(json.loads(ck["recipe"]))
        state = load_checkpoint(recipe, path)
        model = state.model.eval()
        model.invalidate_fingerprint()
        return model, state.step

    with safe_open(str(path), framework="pt") as f:
        steps = int((f.metadata() or {}).get("steps", "0"))
    return load_weights(path).eval(), steps


@torch.no_grad()
def measure_isolation(model, *, steps: int = 8, seed: int = 0, photos_per_source: int = 4,
                      tasks: tuple[str, ...] = TASK_NAMES) -> list[IsolationRow]:
    """Stock vs cached (isolated) edits of a `photo_reference` flux2-mini, per task."""
    from sakura.models.flux2mini import Flux2MiniConfig  # lazy: diffusers ([flux] extra)

    if not (isinstance(model.cfg, Flux2MiniConfig) and model.cfg.photo_reference):
        raise ValueError("the isolation cost is measured on a flux2-mini trained with --stock-references "
                         "(its photo is a second reference); this model keeps the photo out of the references")
    size = model.cfg.image_size
    photos = heldout_photos(size, photos_per_source)
    trained_mask = model.isolate_template
    rows = []
    try:
        for name in tasks:
            task = get_task(name)
            acc: dict[str, list[torch.Tensor]] = {k: [] for k in ("sg", "cg", "cs", "ig", "sgr", "cgr")}
            for tm in library_templates(size, task=name, held_out=True):
                gt = task.ground_truth(photos, tm.image[None])
                model.isolate_template = False
                stock = model.edit(photos, template=tm.image[None], instruction=tm.instruction, mode="nocache",
                                   steps=steps, seed=seed).image
                kv = model.extract_template_kv(tm.image[None], tm.instruction)
                cached = model.edit(photos, template_kv=kv, steps=steps, seed=seed).image
                acc["sg"].append(psnr_per_image(stock, gt))
                acc["cg"].append(psnr_per_image(cached, gt))
                acc["cs"].append(psnr_per_image(cached, stock))
                acc["ig"].append(psnr_per_image(photos, gt))
                region = task.region(tm.image[None])
                if region is not None:
                    r = region.expand(len(photos), -1, -1, -1)
                    acc["sgr"].append(psnr_per_image(stock, gt, r))
                    acc["cgr"].append(psnr_per_image(cached, gt, r))
            mean = lambda k: float(torch.cat(acc[k]).clamp(max=100.0).mean()) if acc[k] else None  # noqa: E731
            rows.append(IsolationRow(name, sum(len(a) for a in acc["sg"]), mean("sg"), mean("cg"), mean("cs"),
                                     mean("ig"), mean("sgr"), mean("cgr")))
    finally:
        model.isolate_template = trained_mask
    return rows


def isolation_markdown(rows: list[IsolationRow], steps_trained: int, steps_total: int | None) -> str:
    total = f" of {steps_total}" if steps_total else ""
    lines = [f"flux2-mini trained with stock multi-reference attention, checkpoint at step {steps_trained}{total}; "
             "PSNR in dB, mean over held-out photos x held-out templates (capped at 100 dB per image)", ""]
    cells = []
    for r in rows:
        cells.append([r.task, f"{r.stock_vs_gt:.2f}", f"{r.cached_vs_gt:.2f}", f"{r.cost_db:+.2f} dB",
                      f"{r.cached_vs_stock:.2f}", f"{r.identity_vs_gt:.2f}"])
        if r.stock_vs_gt_region is not None:
            cells.append([f"{r.task} (in region)", f"{r.stock_vs_gt_region:.2f}", f"{r.cached_vs_gt_region:.2f}",
                          f"{r.stock_vs_gt_region - r.cached_vs_gt_region:+.2f} dB", "", ""])
    lines.append(markdown_table(["task", "stock vs GT", "cached (isolated) vs GT", "isolation cost vs GT",
                                 "cached vs stock", "identity vs GT"], cells, align="l" * 6))
    return "\n".join(lines)


def isolation_json(rows: list[IsolationRow], steps_trained: int, steps_total: int | None, **extra) -> str:
    def clean(d):
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}

    return json.dumps({"steps_trained": steps_trained, "steps_total": steps_total, **extra,
                       "tasks": [clean({**asdict(r), "cost_db": r.cost_db}) for r in rows]}, indent=1) + "\n"
