"""`sakura bench quality`: a model's quality benchmark (sakura-mini or flux2-mini) (edits against exact ground truth).

The evaluation itself (`evaluate_quality`, the PSNR/SSIM definitions, the example grid) lives in
`sakura.cloud.tasks.quality`, which training also uses for the model card; this module is the command:
load a model, run the evaluation, print the table, write quality.json and grid.png.
"""

from __future__ import annotations

from pathlib import Path

import torch

from sakura.models import ImageTemplateEditModel
from sakura.cloud.tasks.quality import QualityReport, evaluate_quality, quality_grid
from sakura.models import load_model

from sakura.bench.harness import get_logger, write_json

log = get_logger(__name__)


def run_quality_bench(model_name: str = "sakura-mini", *, steps: int = 8, photos_per_source: int = 4,
                      out=None) -> QualityReport:
    """`sakura bench quality`: print the table; with `out`, also write quality.json and grid.png."""

    torch.set_num_threads(1)
    model = load_model(model_name)
    if not isinstance(model, ImageTemplateEditModel):
        raise ValueError(f"the quality benchmark needs an image-level model (sakura-mini, flux2-mini), not {model_name!r}")
    report = evaluate_quality(model, steps=steps, photos_per_source=photos_per_source)
    log.info(report.markdown())
    log.info(f"model beats identity by >= 6 dB on every task: {report.passes(6.0)}")
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "quality.json", {**report.to_dict(), "model": model.describe(),
                                          "passes_6db": report.passes(6.0)}, indent=2)
        quality_grid(model, out / "grid.png", steps=steps)
        log.info(f"wrote {out / 'quality.json'} and {out / 'grid.png'}")
    return report
