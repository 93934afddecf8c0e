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
from typing import Any, Callable, Sequence
import resource
import sys

from sakura.cloud.builder.distributed import BuildReport, TemplateBuild, build_templates
from sakura.cloud.builder.pipeline import ALLOCATION_PHOTOS, DEFAULT_LADDER, build_store
from sakura.cloud.builder.template_files import TemplateSpec, TemplateSpecError, load_library_file

log_ = logging.getLogger("sakura.cloud")

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
          address: str | None = None, workers: int | None = None, force: bool = False, progress: bool | None = None,
          probe_workers: int | None = None, allocation_photos: int | None = ALLOCATION_PHOTOS,
          allocation: str = "model", probe_batch: int | None = None, sketch_probes: int | None = None,
          log: Callable[[str], None] | None = None) -> BuildReport:
    """Build templates into ``store`` (created if missing; a template whose image, settings and
    model are unchanged and whose manifest verifies is skipped, in well under a second).

    Args:
        store: the store folder.
        templates: library names ("look-00"), `Template`s (your own image files + task or prompt)
            or dicts with Template's fields; None with no ``library``: one library template per task.
        model: a model spec (`sakura.load_model`), e.g. "sakura-mini", "klein:/folder@1024".
        library: a templates TOML file ([[template]] entries with id, images, task or prompt).
        ladder: codec specs, one rendition each (default: the progressive ladder + floor rungs).
        calibration, steps: public calibration photos and sampler steps of the calibration edits.
        device, dtype: where the model runs: "auto" (cuda, then mps, then cpu), "cpu", "cuda",
            "cuda:N", "mps"; dtype "auto" (bf16 on cuda, fp16 on mps, fp32 on cpu), "fp32",
            "fp16", "bf16". The store holds fp16 KV whatever the compute dtype.
        progress: a progress bar (stderr) naming the template and stage, with an ETA; None (default):
            on when stderr is a terminal, as diffusers' pipelines do. False switches it off.
        allocation: "model" (default; the template's sensitivity model, 12 calibration edits) or
            "probes" (image probes, ~200 edits: the build before issue 41), `build_store`'s;
            `sketch_probes` the model's backward passes (default 8).
        probe_workers, probe_batch, allocation_photos: how image probes run (`build_store`).
        executor: "local" (this machine: ``workers`` templates at once in processes forked after
            the model loads, default one per core on the CPU under Linux, `build_store`'s
            `template_workers`) or "ray" (library templates over a Ray cluster at ``address``,
            ``workers`` at once).
        force: rebuild current templates too.
        log: where the per-template lines go (default: the ``sakura.cloud`` logger at INFO).
    Returns a `BuildReport` (per template: built / skipped / failed, wall and CPU seconds,
    calibration edits; the processes and threads used). Raises `TemplateSpecError` (a ValueError;
    ``.problems`` one line each) before any work when a template or the library is invalid.
    """
    if executor not in ("local", "ray"):
        raise ValueError(f"executor must be 'local' or 'ray', got {executor!r}")
    specs = [_as_spec(t) for t in templates or ()]
    if library is not None:
        specs += load_library_file(Path(library))
    ladder = tuple(ladder) if ladder else DEFAULT_LADDER
    log = log or log_.info
    progress = sys.stderr.isatty() if progress is None else progress
    if executor == "ray":
        if not all(isinstance(t, str) for t in specs):
            raise TemplateSpecError(["executor 'ray' builds library templates only; build Template(...)s locally"])
        return build_templates(store, templates=specs or None, model_name=model, ladder=ladder,
                               calibration=calibration, steps=steps, executor="ray", address=address,
                               workers=workers, force=force, log=log, progress=progress, device=device,
                               dtype=dtype, allocation_photos=allocation_photos, probe_batch=probe_batch,
                               allocation=allocation)
    if address:
        raise ValueError("address applies to executor='ray'")
    t0 = time.perf_counter()
    cpu0 = _cpu_seconds(resource)
    facts: dict[str, dict] = {}
    paths = build_store(store, model_name=model, templates=specs or None, ladder=ladder, calibration=calibration,
                        steps=steps, log=log, device=device, dtype=dtype, progress=progress,
                        probe_workers=probe_workers, template_workers=workers, allocation_photos=allocation_photos,
                        allocation=allocation, probe_batch=probe_batch, facts=facts, force=force,
                        sketch_probes=sketch_probes)
    report = BuildReport(executor="local", workers=1, seconds=time.perf_counter() - t0,
                         cpu_seconds=_cpu_seconds(resource) - cpu0)
    for p in paths:
        f = facts.get(Path(p).stem, {})
        report.builds.append(TemplateBuild(
            template=Path(p).stem, status=f.get("status", "built"), manifest=str(p), seconds=f.get("wall_s", 0.0),
            cpu_seconds=f.get("cpu_s", 0.0), calibration_edits=f.get("calibration_edits", 0.0),
            allocation=f.get("allocation"), figure_checks=f.get("figure_checks", []),
            ladder_trials=f.get("ladder_trials", [])))
    built = [f for f in facts.values() if f.get("status") == "built"]
    report.processes = max((f.get("processes", 1) for f in built), default=1)
    report.threads = max((f.get("threads", 1) for f in built), default=1)
    report.workers = report.processes
    return report


def _cpu_seconds(resource) -> float:
    """CPU seconds of this process and its finished children (the template processes)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
