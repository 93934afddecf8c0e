"""`build`: templates into a store, from Python (what `sakura build` runs).

    from sakura.cloud.builder.api import build, Template
    report = build("store/", [Template("my-look", ["look.png"], task="look"), "sticker-00"])
    assert report.ok, report.by_status("failed")
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Sequence

from sakura.cloud.builder.distributed import BuildReport, TemplateBuild, build_templates
from sakura.cloud.builder.pipeline import ALLOCATION_PHOTOS, DEFAULT_LADDER, build_store
from sakura.cloud.builder.template_files import TemplateSpec, TemplateSpecError, load_library_file

log = logging.getLogger("sakura.cloud")

#: A template to build from your own image file(s): ``Template(id, images, task=... | prompt=...)``.
Template = TemplateSpec


def _as_spec(t: Any) -> Any:
    if isinstance(t, (str, TemplateSpec)):
        return t
    if isinstance(t, dict):
        try:
            return TemplateSpec(**t)
        except TypeError as e:
            raise TemplateSpecError([f"template {t!r}: {e}"]) from None
    raise TemplateSpecError([f"a template is a library name, a Template or a dict, got {type(t).__name__}"])


def build(store: str | os.PathLike[str], templates: Sequence[Any] | None = None, *, model: str = "sakura-mini",
          library: str | os.PathLike[str] | None = None, ladder: Sequence[str] | None = None, calibration: int = 2,
          steps: int = 4, device: str = "auto", dtype: str = "auto", executor: str = "local",
          address: str | None = None, workers: int | None = None, force: bool = False, progress: bool = False,
          probe_workers: int | None = None, allocation_photos: int | None = ALLOCATION_PHOTOS) -> BuildReport:
    """Build templates into ``store`` (created if missing; rebuilds are idempotent).

    Args:
        store: the store folder.
        templates: library names ("look-00"), `Template`s (your own image files + task or prompt)
            or dicts with Template's fields; None with no ``library``: one library template per task.
        model: a model spec (`sakura.load_model`), e.g. "sakura-mini", "klein:/folder@1024".
        library: a templates TOML file ([[template]] entries with id, images, task or prompt).
        ladder: codec specs, one rendition each (default: the progressive ladder + floor rungs).
        calibration, steps: public calibration photos and sampler steps for importance/distortion.
        device, dtype: where the model runs: "auto" (cuda, then mps, then cpu), "cpu", "cuda",
            "cuda:N", "mps"; dtype "auto" (bf16 on cuda, fp16 on mps, fp32 on cpu), "fp32",
            "fp16", "bf16". The store holds fp16 KV whatever the compute dtype.
        progress: a progress bar (stderr) naming the template and stage, with an ETA.
        probe_workers, allocation_photos: how the image probes run (`build_store`); neither
            changes what a store is for (probe_workers not at all: byte-identical stores).
        executor: "local" (this machine: ``workers`` templates at once in processes forked after
            the model loads, default one per core on the CPU under Linux, `build_store`'s
            `template_workers`) or "ray" (library templates over a Ray cluster at ``address``,
            ``workers`` at once; ``force`` rebuilds current ones).
    Returns a `BuildReport` (per template: built / skipped / failed, seconds, manifest path).
    Raises `TemplateSpecError` (a ValueError; ``.problems`` one line each) before any work when a
    template or the library is invalid.
    """
    if executor not in ("local", "ray"):
        raise ValueError(f"executor must be 'local' or 'ray', got {executor!r}")
    specs = [_as_spec(t) for t in templates or ()]
    if library is not None:
        specs += load_library_file(Path(library))
    ladder = tuple(ladder) if ladder else DEFAULT_LADDER
    if executor == "ray":
        if not all(isinstance(t, str) for t in specs):
            raise TemplateSpecError(["executor 'ray' builds library templates only; build Template(...)s locally"])
        return build_templates(store, templates=specs or None, model_name=model, ladder=ladder,
                               calibration=calibration, steps=steps, executor="ray", address=address,
                               workers=workers, force=force, log=log.info, progress=progress, device=device,
                               dtype=dtype, allocation_photos=allocation_photos)
    if address or force:
        raise ValueError("address / force apply to executor='ray'")
    t0 = time.perf_counter()
    paths = build_store(store, model_name=model, templates=specs or None, ladder=ladder, calibration=calibration,
                        steps=steps, log=log.info, device=device, dtype=dtype, progress=progress,
                        probe_workers=probe_workers, template_workers=workers, allocation_photos=allocation_photos)
    report = BuildReport(executor="local", workers=workers or 1, seconds=time.perf_counter() - t0)
    report.builds = [TemplateBuild(template=Path(p).stem, status="built", manifest=str(p)) for p in paths]
    return report
