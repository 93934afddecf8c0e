"""`sakura build` (cloud side): capture template KV, fit the rendition ladder to it, write the store.

Cloud side, for any model with the bundled models' image-level API (``load_model(name)``:
``extract_template_kv(image[None], instruction)``, ``edit(photos, template_kv=, steps=, seed=)``,
``fingerprint()``, ``cfg.image_size``). For each template (`template.build_template`):

1. the template image is stored as a lossless 8-bit PNG (the template reference the phone computes
   the KV from, ``local``); the KV is captured from exactly that PNG's pixels, stored as fp16 (what
   every codec starts from);
2. on public calibration photos (``sakura.cloud.capture``) a sensitivity model of the KV
   (``allocation="model"``, default: a sketch of the calibration edits' Gauss-Newton matrix from a
   few backward passes, `measure_kv_sensitivity`) or, with ``allocation="probes"``, per-layer K/V
   sensitivities and image probes (one edit per measured choice: the build before issue 41);
3. every codec setting of the ladder: the progressive ladder's lowest rung searched to the
   template's image target (predicted, then confirmed by at most three measured edits:
   `ladder.fit_ladder_by_model`), shared tables fitted once, every layer's shard encoded (a
   layered codec gives one rendition per rung, each a byte prefix of the shard's one object) with
   its distortion: the codec's KV errors plus the manifest contract's ``image_mse`` /
   ``image_psnr_db`` (the calibration edits with only that shard replaced, against the
   all-lossless edit, docs/codec.md): predicted by the model (``image_predicted`` in the
   distortion map) but for a measured check, or measured by probes;
4. per shard the same image figure for CacheGen level 3 (``quality_floor``, ``predicted`` when so);
5. ``StoreWriter``: objects, tables, template reference, manifest last (its ``kv_layout`` records
   the `build_key`: an unchanged template is skipped next time).

Codec objects are tagged with ``ShardId(model_fingerprint, template_fingerprint, shard)``; the
manifest's ``kv_layout`` carries ``template_fingerprint`` so the runtime can rebuild that id.
Rooms: `progress` (stages, bar, edit count), `template` (one template), `ladder` (the budget
search, floor rungs), `probes` (the probe allocation), `processes` (template processes).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, Sequence
import time

from sakura.cloud import capture, tasks  # lazy facades: their names load torch on first use, the skip path none
from sakura.cloud.builder import incremental
from sakura.cloud.builder.defaults import (ALLOCATION_PHOTOS, BASE_RUNG_PSNR_DB, DEFAULT_LADDER,  # noqa: F401
                                           QUALITY_FLOOR_SPEC, default_templates)
from sakura.cloud.builder.ladder import (BASE_RUNG_BUDGETS, FLOOR_RUNG_LADDER, MAX_SINGLE_RUNG_BUDGETS,  # noqa: F401
                                         SEARCH_PRIOR_GAP_DB, fit_ladder_by_probes, search_budget, skipped_floor_rungs,
                                         with_floor_rungs)
from sakura.cloud.builder.probes import Probing, cpu_count, many_probe  # noqa: F401
from sakura.cloud.builder.processes import _build_in_processes, _template_processes  # noqa: F401
from sakura.cloud.builder.progress import MODEL_STAGES, STAGES, Stages  # noqa: F401
from sakura.cloud.builder.template import ALLOCATIONS, build_template
from sakura.cloud.builder.template_files import (TemplateSpec, TemplateSpecError, spec_images, spec_instruction,
                                                 validate_specs)
from sakura.wire.store.store import Store, StoreError
from sakura.util.device import device_options
from sakura.util.report import report_logger

#: the names tests and benchmarks knew these by before the builder was split (issue 41)
_Probing, _many_probe, _with_floor_rungs, _Stages = Probing, many_probe, with_floor_rungs, Stages
_fit_ladder_to_template = fit_ladder_by_probes
#: the build's lines (one per template: built, skipped, failed), plain on stdout
REPORT = report_logger(__name__, root="sakura.cloud.builder")


def build_store(store: str | Path, *, model_name: str = "sakura-mini", templates: Sequence[Any] | None = None,
                ladder: Sequence[str] = DEFAULT_LADDER, calibration: int = 2, steps: int = 4, seed: int = 0,
                base_psnr_db: float | None = BASE_RUNG_PSNR_DB, log: Callable[[str], None] | None = None,
                device: Any = "auto", dtype: Any = "auto", probe_batch: int | None = None,
                probe_workers: int | None = None, allocation_photos: int | None = ALLOCATION_PHOTOS,
                template_workers: int | None = None, progress: bool = False,
                profile: dict[str, dict[str, float]] | None = None, model: Any = None,
                allocation: str = "model", sketch_probes: int | None = None,
                facts: dict[str, dict[str, Any]] | None = None, force: bool = False) -> list[Path]:
    """Build (or idempotently rebuild) one manifest per template; returns the manifest paths.

    Callable per template (``templates=["look-00"]``): templates are independent.

    Args:
        store: store directory (created if missing).
        model_name: ``sakura-mini`` / ``flux2-mini``, optionally ``:/path/weights.safetensors``
            (any model with the image-level edit API, ``sakura.models.ImageTemplateEditModel``).
        templates: library template names (``sakura.cloud.tasks.template_library``) and/or
            ``TemplateSpec``s (a provider's own image files + task or prompt,
            ``sakura.cloud.builder.template_files``); default one library template per task. Everything
            is validated before any work (``TemplateSpecError``: one line per problem).
        ladder: codec specs (``sakura.codec.codec_from_spec``), one rendition each (a layered
            codec: one per rung).
        calibration: number of public calibration photos (crops of training sources,
            ``sakura.cloud.capture.calibration_photos``) for token and layer sensitivities and the image
            distortion of every rendition.
        steps, seed: sampler run of the calibration edits.
        base_psnr_db: for a ``progressive`` ladder without explicit budgets, the lowest rung's
            budget is the smallest (of ``BASE_RUNG_BUDGETS``, the top, then
            ``MAX_SINGLE_RUNG_BUDGETS``) whose calibration edits reach this image PSNR against the
            lossless-KV edits; rungs run geometrically from it to the top budget (``progressive``'s
            default 1.0 bit per value, which sets the storage), or it is the only rung when it is
            the top or above. None keeps the codec's default budgets.
        device, dtype: where the model runs (``sakura.util.device.resolve``: auto = cuda, mps,
            cpu; bf16 on cuda, fp32 on cpu). The stored KV is fp16 whatever the compute dtype.
        probe_batch: image-distortion probes per batched forward (models with ``edit_many``);
            default 1 on the CPU (every probe on its own: the stores are bit for bit those of
            one-at-a-time probing) and 16 on an accelerator, where one small forward is
            launch-bound. A batch > 1 may move a recorded image MSE in its ~5th digit (matmul
            rounding depends on the rows per call).
        probe_workers: probes measured at once in threads (each probe computes exactly as alone:
            the stores do not depend on it); default one per CPU core (up to 4) on the CPU, 1 on
            an accelerator (one device runs one forward at a time).
        allocation_photos: the rate allocation's image probes (hundreds per template: the
            rung-0 steps, the refinement planes and the reconstruction offsets of every part) and
            its layer sensitivities edit the first this many calibration photos (None: all); the
            ladder search's acceptance
            edits, every rendition's recorded distortion and the quality floor use all
            `calibration` photos. 1 halves the probes' cost (the build ~0.7x the CPU) but fits the
            allocation to one photo: on held-out photos the default templates' lowest rungs moved
            -0.1 to +0.1 dB and look-00's top rung -2.2 dB (docs/scale.md). Default: all.
        template_workers: templates built at once, each in a process forked after the model
            loads (the weights shared, copy on write; each process holds its own template's KV
            and probes). Default: one per CPU core up to the template count on the CPU where
            processes fork (Linux), else 1. > 1 needs both (`ValueError` otherwise: an
            accelerator runs one template at a time; `--executor ray` spreads over machines).
            The stores do not depend on it. On 2 cores ~1.1x over one process with probe
            threads: a template's serial stretches (allocation between probe rounds, encoding,
            the acceptance edits) overlap another's probes.
        progress: a tqdm bar (stderr) naming the template and stage, with an ETA.
        log: where the per-template lines go; default the ``sakura.cloud.builder`` logger (plain lines on
            stdout: `sakura.util.report`). A sink is for a caller that routes them itself: the CLI
            above its progress bar, a template process back over its pipe.
        profile: filled with {template: {stage: wall seconds, "stage cpu": CPU seconds}}.
        model: an already-loaded model to build with (then `model_name`, `device`, `dtype` are unused).
        allocation: "model" (default): bits, ladder and figures by the template's sensitivity model
            (`sakura.cloud.capture.measure_kv_sensitivity`: 12 calibration edits a template, every
            ``image_mse`` predicted but `template.FIGURE_CHECKS` measured ones; a model without
            ``differentiable_edit`` falls back to "probes"); "probes": every allocation choice and
            figure measured by image probes (~200 edits a template; the build before issue 41).
        sketch_probes: the sensitivity model's backward passes (default `SKETCH_PROBES`).
        facts: filled with {template: {"status": "built" / "skipped", "wall_s", "cpu_s",
            "calibration_edits", "allocation", "processes", "threads", "figure_checks": [...],
            "ladder_trials": [...]}}.
        force: rebuild templates that are current (a verified manifest built from the same
            image, settings and model: `build_key`), which are otherwise skipped.
    """
    log = log or REPORT.info
    if allocation not in ALLOCATIONS:
        raise ValueError(f"allocation must be one of {list(ALLOCATIONS)}, got {allocation!r}")
    settings = incremental.request_settings(ladder=ladder, calibration=calibration, steps=steps, seed=seed,
                                            base_psnr_db=base_psnr_db, allocation=allocation,
                                            sketch_probes=sketch_probes, allocation_photos=allocation_photos)
    src_keys = incremental.source_keys(model_name, templates, settings) if model is None else {}
    if not force and model is None and (done := _all_current(store, templates, src_keys, log, facts)):
        return done
    # the bar first: importing torch and loading the model take seconds on a loaded machine
    stages = Stages(len(templates) if templates else 1, progress)  # the total is set once templates resolve
    stages.bar.set_description_str("starting", refresh=True)
    try:
        job, tpls = _setup(stages, model_name=model_name, templates=templates, ladder=ladder, calibration=calibration,
                           steps=steps, seed=seed, base_psnr_db=base_psnr_db, device=device, dtype=dtype,
                           probe_batch=probe_batch, probe_workers=probe_workers, allocation_photos=allocation_photos,
                           model=model, allocation=allocation, sketch_probes=sketch_probes)
        job["store"] = store
        out, todo = _skip_current(store, tpls, job, stages, log, force, settings, src_keys)
        processes = _template_processes(template_workers, getattr(job["model"], "device", _cpu_device()),
                                        max(1, len(todo)))
        if processes > 1:
            built = _build_in_processes(processes, todo, job, stages, log)
        else:
            built = []
            for name, images, instruction in todo:
                stages.start(name)
                built.append(build_template(name=name, images=images, instruction=instruction, stages=stages,
                                            log=log, **job))
                stages.finish_template()
        for name, _i, _x in todo:
            stages.facts[name].update(processes=processes, threads=job["probing"].workers)
        paths = dict(out)
        paths.update({n: p for (n, _i, _x), p in zip(todo, built)})
        out = [paths[n] for n, _i, _x in tpls]
    finally:
        stages.close()
    if profile is not None:
        profile.update(stages.seconds)
    if facts is not None:
        facts.update(stages.facts)
    return out


def _all_current(store, templates, src_keys: dict[str, str], log, facts) -> list[Path] | None:
    """The manifests of all `templates` if every one is current by its source key (checked before
    torch and the model load: `incremental.skip_before_load`), their facts in `facts`; else None."""
    ids = [t if isinstance(t, str) else t.id for t in templates] if templates else default_templates()
    found = incremental.skip_before_load(store, src_keys, ids, log) if len(set(ids)) == len(ids) else None
    if found is None:
        return None
    if facts is not None:
        facts.update({t: {"status": "skipped", "wall_s": w, "cpu_s": c, "calibration_edits": 0.0, "processes": 1,
                          "threads": 1} for t, (_p, w, c) in found.items()})
    return [p for p, _w, _c in found.values()]


def _cpu_device():
    import torch  # lazy: torch; an unchanged store's skip and --help load none

    return torch.device("cpu")


def _setup(stages: Stages, *, model_name, templates, ladder, calibration, steps, seed, base_psnr_db, device, dtype,
           probe_batch, probe_workers, allocation_photos, model, allocation, sketch_probes) -> tuple[dict, list]:
    """Everything `build_template` needs for every template (the `job`), and the resolved
    templates: specs, names and settings checked, the model loaded, before any work."""
    import torch  # lazy: torch; an unchanged store's skip and --help load none

    from sakura.codec import codec_from_spec  # lazy: torch, numba; an unchanged store's skip loads none
    from sakura.models import load_model  # lazy: torch, numba; an unchanged store's skip loads none

    torch.set_num_threads(1)  # shared small machines: one thread is faster than two contending
    codecs = [codec_from_spec(s) for s in ladder]  # bad specs fail before the model runs
    names = [s.strip() for s in ladder]  # rendition names as the operator wrote them
    if len(set(names)) != len(names):
        raise ValueError(f"ladder has duplicate settings: {names}")
    floor_codec = codec_from_spec(QUALITY_FLOOR_SPEC)
    if model is None:
        stages.bar.set_description_str(f"loading {model_name}", refresh=True)
        model = load_model(model_name, **device_options(device, dtype))  # every adapter has the image-level API
    dev = getattr(model, "device", torch.device("cpu"))
    if probe_batch is None:
        probe_batch = 1 if dev.type == "cpu" else 16
    if probe_workers is None:
        probe_workers = min(4, cpu_count()) if dev.type == "cpu" else 1
    if probe_batch < 1 or probe_workers < 1 or (allocation_photos is not None and allocation_photos < 1):
        raise ValueError(f"probe_batch, probe_workers and allocation_photos must be >= 1, got {probe_batch}, "
                         f"{probe_workers}, {allocation_photos}")
    if sketch_probes is not None and sketch_probes < 1:
        raise ValueError(f"sketch_probes must be >= 1, got {sketch_probes}")
    size = int(model.cfg.image_size)
    model_fp = model.fingerprint()
    if not templates and model.template_conditioning != "task":
        raise TemplateSpecError([f"{model_name} has no bundled templates: give --library FILE or "
                                 f"--template ID=IMAGE --prompt P"])
    stages.bar.set_description_str("resolving templates", refresh=True)
    tpls = resolve_templates(model, list(templates) if templates else default_templates())  # fails before any work
    stages.bar.total = len(tpls) * len(STAGES)
    calib = capture.calibration_photos(size, calibration)  # public training photos, never the held-out test ones
    # a model without autograd through its edit cannot be sketched: its build measures by probes
    allocation = allocation if hasattr(model, "differentiable_edit") else "probes"
    job = dict(model=model, model_fp=model_fp, calib=calib, names=names, codecs=codecs,
               floor_codec=floor_codec, steps=steps, seed=seed, base_psnr_db=base_psnr_db,
               probing=Probing(probe_batch, probe_workers, allocation_photos), sketch_probes=sketch_probes,
               allocation=allocation)
    return job, tpls


def _skip_current(store, tpls, job: dict, stages: Stages, log, force: bool, settings: dict,
                  src_keys: dict[str, str]) -> tuple[list, list]:
    """Split `tpls` into those skipped ([(id, manifest path)]: unchanged image, settings and model,
    manifest verified) and those to build (their images resolved; their `build_key` and
    `source_key` in ``job["build_keys"]``, for the manifest)."""
    settings = dict(settings, allocation=job["allocation"])  # the allocation that runs

    skipped, todo = [], []
    job["build_keys"] = keys = {}
    for name, images, instruction in tpls:
        t0, c0 = time.perf_counter(), time.process_time()
        # a spec's files are decoded for the key and again when built: never all held at once
        key = incremental.build_key(job["model_fp"], settings, images() if callable(images) else images, instruction)
        keys[name] = {"build_key": key, **({"source_key": src_keys[name]} if name in src_keys else {})}
        current = False
        if not force and incremental.manifest_is_current(store, job["model_fp"], name, job["names"]):
            try:
                layout = Store(store).get_manifest(job["model_fp"], name).kv_layout
                current = layout.get("build_key") == key
            except (StoreError, KeyError, ValueError):
                current = False
        if current:
            path = Path(store) / "manifests" / job["model_fp"] / f"{name}.json"
            stages.facts[name] = {"status": "skipped", "wall_s": time.perf_counter() - t0,
                                  "cpu_s": time.process_time() - c0, "calibration_edits": 0.0}
            stages.start_skipped(name)
            log(f"{name}: skipped, unchanged (template image, settings and model as built; "
                f"{time.perf_counter() - t0:.2f} s to check; --force rebuilds)")
            skipped.append((name, path))
        else:
            todo.append((name, images, instruction))
    return skipped, todo


def resolve_templates(model: Any, templates: Sequence[Any]) -> list[tuple[str, Any, Any]]:
    """Library names and `TemplateSpec`s -> [(id, images (R, 3, S, S) or a callable returning
    them (a spec's files, decoded when built), instruction)], every problem found first (one line each, `TemplateSpecError`) so a bad entry writes nothing."""

    size = int(model.cfg.image_size)
    conditioning = model.template_conditioning
    problems, lib = [], []
    for t in templates:
        if isinstance(t, TemplateSpec):
            continue
        if conditioning != "task":
            problems.append(f"--template {t}: library templates are for the bundled models; this model's templates "
                            f"need images and a prompt (--template ID=IMAGE --prompt P, or --library FILE)")
            continue
        try:
            lib.append(tasks.get_template(t, size))
        except ValueError as e:
            problems.append(f"--template {t}: {e} (or give ID=IMAGE for your own image)")
    specs = [t for t in templates if isinstance(t, TemplateSpec)]
    try:
        validate_specs(specs, conditioning=conditioning, max_images=model.max_template_images,
                       tasks=tasks.TASK_NAMES, existing_ids=[t.name for t in lib])
    except TemplateSpecError as e:
        problems += e.problems
    names = [t.name for t in lib]
    problems += [f"--template {n}: given twice" for n in sorted({n for n in names if names.count(n) > 1})]
    if problems:
        raise TemplateSpecError(problems)
    out = [(t.name, t.image[None], t.instruction) for t in lib]
    # a spec's images are decoded when its template is built (a callable here), not all up front:
    # 10,000 library entries held every image in memory at once (901 MB)
    return out + [(s.id, functools.partial(spec_images, s, size), spec_instruction(s)) for s in specs]


