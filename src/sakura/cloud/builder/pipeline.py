"""`sakura build` (cloud side): capture template KV, measure what each rendition does to the image, write the store.

Cloud side, for any model with the bundled models' image-level API (``load_model(name)``:
``extract_template_kv(image[None], instruction)``, ``edit(photos, template_kv=, steps=, seed=)``,
``fingerprint()``, ``cfg.image_size``). For each template:

1. the template image is stored as a lossless 8-bit PNG (the template reference the phone computes
   the KV from, ``local``); the KV is captured from exactly that PNG's pixels, stored as fp16 (what
   every codec starts from);
2. on public calibration photos (``sakura.cloud.capture``): per-layer K/V sensitivities (the codec splits
   bits across layers and K/V by them) and attention-mass token importance (the nested ladder's
   per-token widths; the default progressive ladder does not use it);
3. every codec setting of the ladder: fit shared tables once, encode every layer's shard (a layered
   codec gives one rendition per rung, each a byte prefix of the shard's one object) and record
   its distortion: the codec's KV errors plus the manifest contract's ``image_mse`` /
   ``image_psnr_db``: the calibration edits with only that shard replaced by the decoded
   rendition, all other shards lossless, against the all-lossless edit (docs/codec.md);
4. per shard the same image measurement for CacheGen level 3 (``quality_floor``), whether or not
   CacheGen is in the ladder;
5. ``StoreWriter``: objects, tables, template reference, manifest last.

Codec objects are tagged with ``ShardId(model_fingerprint, template_fingerprint, shard)``; the
manifest's ``kv_layout`` carries ``template_fingerprint`` so the runtime can rebuild that id.
"""

from __future__ import annotations

import functools

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from sakura.util.psnr import psnr_db
from sakura.wire.store.store import RenditionInput, StoreWriter
from sakura.wire.store.template_ref import TEMPLATE_REF_MEDIA_TYPE, decode_template_ref, encode_template_images, split_template_images

#: Floor rungs: single-rung progressive renditions at about CacheGen level 3's quality, below the
#: calibrated ladder's 38 dB. The runtime holds sakura to the *image* floor (CacheGen-L3 on every
#: shard), not to 38 dB; on a hard template (sticker-00) the calibrated ladder is one rung at 2.25
#: bits/value (~51 dB a shard; since session 8's image allocation one rung at budget 1.4, 1.50 bits/value), and with nothing cheaper inside the floor link-bound runs lost to
#: CacheGen's levels 2 and 1. Budget 1.2 gives 1.46 bits/value at a mean shard image MSE of 4.0e-5
#: (under CacheGen-L3's 5.8e-5), budget 1.0 1.26 bits/value at 1.0e-4 (session 8, image allocation,
#: offsets and compact headers: 1.28 / 3.1e-5 and 1.09 / 4.6e-5, both under the floor; budget 0.8
#: 0.90 / 6.9e-5, docs/codec.md "Session 8"). Since session 8 the floor rungs are budgets 0.8 and 1.0:
#: [1.2] is no longer needed to get under the floor, and [0.8] sits just over it, so the planner can
#: mix the two shard by shard to land on the floor with fewer bytes; the planner takes them
#: only where the link makes them faster and the image floor allows (docs/notes/runtime-history.md: 81 -> 47
#: losing profile runs). Made only where the calibrated ladder has no rung as cheap
#: (`skipped_floor_rungs`): an easy template's ladder already reaches down to 0.15-1.0 bits/value,
#: and there they would add ~2.2x the ladder's storage for renditions the planner never picks.
#: Since issue 34 they are made as the lowest rungs of the calibrated ladder's one object
#: (`_with_floor_rungs`: byte prefixes, one table) instead of separate objects and tables:
#: sticker-00 0.393 -> 0.148 of one fp16 copy whole (docs/storage.md).
FLOOR_RUNG_LADDER = ("progressive:budgets=[0.8]", "progressive:budgets=[1.0]")
#: Default ladder: the progressive transform coder (``progressive`` = ECSQ + token-grid DCT coded by
#: successive refinement, top rung 1.0 bit per value, the lowest fitted per template to
#: ``BASE_RUNG_PSNR_DB``; docs/codec.md), its rungs stored as one object per shard (rung l = a byte
#: prefix: one Range per rung, upgrades fetch only the missing bytes), and the floor rungs where the
#: calibrated ladder stays above them. The profile, the dilated bench and the demo build this same
#: ladder. The exact fallback is computing the KV on the phone from the template reference, so the
#: store keeps no lossless copy. Add "lossless" / "uniform:bits=8" with --ladder when raw streaming
#: is wanted; ``--ladder progressive`` alone leaves the floor rungs out.
DEFAULT_LADDER = ("progressive",) + FLOOR_RUNG_LADDER
#: The lowest rung of the default ladder must reach this image PSNR vs the lossless-KV edit on the
#: calibration photos. On the 12 held-out templates (docs/codec.md) >= 36-37 dB vs lossless kept the
#: edit within 0.5 dB of the lossless edit's PSNR against ground truth; 38 leaves a margin.
BASE_RUNG_PSNR_DB = 38.0
#: Calibration photos the rate allocation's image probes edit (`build_store(allocation_photos=)`):
#: None, all of them. 1 costs ~0.7x the CPU but measured -2.2 dB on look-00's top rung on held-out
#: photos (docs/scale.md).
ALLOCATION_PHOTOS: int | None = None
#: Candidate lowest-rung budgets (entropy-coded bits per value), tried cheapest first.
BASE_RUNG_BUDGETS = (0.15, 0.2, 0.3, 0.4, 0.5, 0.65, 0.8, 1.0)
#: Single-rung budgets tried when even the top budget misses the target (hard templates: sticker).
MAX_SINGLE_RUNG_BUDGETS = (1.4, 2.0)
#: The reference codec of every shard's ``quality_floor`` (measured even when not in the ladder).
QUALITY_FLOOR_SPEC = "cachegen:level=3"


def skipped_floor_rungs(ladder: Sequence[str], calibrated_lowest_budget: float | None) -> set[str]:
    """The floor rungs (`FLOOR_RUNG_LADDER` entries of `ladder`) a build leaves out: those whose
    budget is at or above the lowest budget of the ladder's plain ``progressive`` entry (as
    calibrated for the template: `calibrated_lowest_budget`; None: no such entry, every floor rung
    is made)."""
    from sakura.codec.base import parse_spec

    if calibrated_lowest_budget is None:
        return set()
    return {s.strip() for s in ladder if s.strip() in FLOOR_RUNG_LADDER
            and min(parse_spec(s.strip())[1]["budgets"]) >= calibrated_lowest_budget}


def default_templates() -> list[str]:
    """The first training template of each task in the library (e.g. ``look-00``)."""
    from sakura.cloud.tasks import TASK_NAMES

    return [f"{t}-00" for t in TASK_NAMES]


#: The build's stages, in order, as the progress bar and `build_store(profile=...)` name them.
STAGES = ("capture", "importance", "sensitivity", "probe reference", "ladder search", "fit tables", "encode",
          "rendition probes", "quality floor", "write")


class _Stages:
    """Wall and CPU seconds per build stage of the current template, and the progress bar over
    (template, stage) units: the bar names the template and stage and appears before the model loads."""

    def __init__(self, n_templates: int, progress: bool):
        if progress:
            from tqdm import tqdm

            self.bar = tqdm(total=n_templates * len(STAGES), unit="stage", mininterval=0.5,
                            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} stages "
                                       "[{elapsed}<{remaining}]")
        else:  # no tqdm at all: a template process forked from a parent whose bar holds tqdm's locks
            self.bar = _NullBar(total=n_templates * len(STAGES))
        self.template = ""
        self.seconds: dict[str, dict[str, float]] = {}
        #: called with (template, stage, stage units done) as stages start (0) and end: a forked
        #: template process reports its stages to the parent's bar through it
        self.notify: Callable[[str, str, int], None] | None = None

    def start(self, template: str) -> None:
        self.template = template
        self.seconds[template] = {}
        self.done = 0

    def stage(self, name: str):
        import contextlib

        @contextlib.contextmanager
        def run():
            self.bar.set_description_str(f"{self.template}: {name}" if self.template else name, refresh=True)
            if self.notify is not None:
                self.notify(self.template, name, 0)
            t0, c0 = time.perf_counter(), time.process_time()
            yield
            d = self.seconds.setdefault(self.template, {})
            d[name] = d.get(name, 0.0) + time.perf_counter() - t0
            d[name + " cpu"] = d.get(name + " cpu", 0.0) + time.process_time() - c0
            self.advance(name)
        return run()

    def advance(self, name: str) -> None:
        """Mark `name` done for this template (once: encode and the probes repeat per rendition)."""
        idx = STAGES.index(name) + 1
        if idx > self.done:
            self.bar.update(idx - self.done)
            if self.notify is not None:
                self.notify(self.template, name, idx - self.done)
            self.done = idx

    def finish_template(self) -> None:
        self.advance(STAGES[-1])

    def close(self) -> None:
        self.bar.close()


class _NullBar:
    """What `_Stages` calls on a bar, doing nothing."""

    def __init__(self, total: int) -> None:
        self.total, self.n = total, 0

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_description_str(self, desc: str, refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


def build_store(store: str | Path, *, model_name: str = "sakura-mini", templates: Sequence[Any] | None = None,
                ladder: Sequence[str] = DEFAULT_LADDER, calibration: int = 2, steps: int = 4, seed: int = 0,
                base_psnr_db: float | None = BASE_RUNG_PSNR_DB, log: Callable[[str], None] = print,
                device: Any = "auto", dtype: Any = "auto", probe_batch: int | None = None,
                probe_workers: int | None = None, allocation_photos: int | None = ALLOCATION_PHOTOS,
                template_workers: int | None = None, progress: bool = False,
                profile: dict[str, dict[str, float]] | None = None, model: Any = None) -> list[Path]:
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
        profile: filled with {template: {stage: wall seconds, "stage cpu": CPU seconds}}.
        model: an already-loaded model to build with (then `model_name`, `device`, `dtype` are unused).
    """
    # the bar first: importing torch and loading the model take seconds on a loaded machine
    stages = _Stages(len(templates) if templates else 1, progress)  # the total is set once templates resolve
    stages.bar.set_description_str("starting", refresh=True)
    try:
        import torch

        from sakura.cloud.capture import calibration_photos
        from sakura.codec import codec_from_spec
        from sakura.models import load_model
        from sakura.util.device import device_options

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
            probe_workers = min(4, _cpu_count()) if dev.type == "cpu" else 1
        if probe_batch < 1 or probe_workers < 1 or (allocation_photos is not None and allocation_photos < 1):
            raise ValueError(f"probe_batch, probe_workers and allocation_photos must be >= 1, got {probe_batch}, "
                             f"{probe_workers}, {allocation_photos}")
        size = int(model.cfg.image_size)
        model_fp = model.fingerprint()
        if not templates and model.template_conditioning != "task":
            from sakura.cloud.builder.template_files import TemplateSpecError

            raise TemplateSpecError([f"{model_name} has no bundled templates: give --library FILE or "
                                     f"--template ID=IMAGE --prompt P"])
        stages.bar.set_description_str("resolving templates", refresh=True)
        tpls = resolve_templates(model, list(templates) if templates else default_templates())  # fails before any work
        stages.bar.total = len(tpls) * len(STAGES)
        calib = calibration_photos(size, calibration)  # public training photos, never the held-out test ones
        processes = _template_processes(template_workers, dev, len(tpls))
        job = dict(store=store, model=model, model_fp=model_fp, calib=calib, names=names, codecs=codecs,
                   floor_codec=floor_codec, steps=steps, seed=seed, base_psnr_db=base_psnr_db,
                   probing=_Probing(probe_batch, probe_workers, allocation_photos))
        if processes > 1:
            out = _build_in_processes(processes, tpls, job, stages, log)
        else:
            out = []
            for name, images, instruction in tpls:
                stages.start(name)
                out.append(_build_template(name=name, images=images, instruction=instruction, stages=stages,
                                           log=log, **job))
                stages.finish_template()
    finally:
        stages.close()
    if profile is not None:
        profile.update(stages.seconds)
    return out


def _template_processes(requested: int | None, device: Any, templates: int) -> int:
    """How many template processes `build_store` forks (see its `template_workers`)."""
    import multiprocessing as mp
    import sys

    can_fork = sys.platform == "linux" and "fork" in mp.get_all_start_methods() and device.type == "cpu"
    if requested is None:
        return min(_cpu_count(), templates) if can_fork else 1
    if requested < 1:
        raise ValueError(f"template_workers must be >= 1, got {requested}")
    if requested > 1 and not can_fork:
        raise ValueError("template_workers > 1 builds templates in processes forked after the model loads: on "
                         f"the CPU under Linux only (here: {device.type} on {sys.platform}); an accelerator "
                         "builds one template at a time (--executor ray spreads templates over machines)")
    return min(requested, templates)


#: what a forked template process reads: set by `_build_in_processes` just before it forks
_FORK_JOB: dict[str, Any] = {}


def _build_in_processes(processes: int, tpls, job: dict, stages: "_Stages", log) -> list[Path]:
    """`_build_template` of every template in `processes` forked processes (they inherit the
    model and `job`; only an index goes over and (path, stage seconds, log lines) come back). Each
    process reports its stages through a queue to the parent's bar; a template's log lines print
    when it is done."""
    import multiprocessing as mp
    import threading

    ctx = mp.get_context("fork")
    events = ctx.Queue()
    _FORK_JOB.update(job, tpls=tpls, events=events)

    def show() -> None:  # the parent's bar, moved by the processes' stage events
        for template, stage, done in iter(events.get, None):
            stages.bar.set_description_str(f"{template}: {stage}", refresh=False)
            stages.bar.update(done)

    shower = threading.Thread(target=show, name="build-progress", daemon=True)
    shower.start()
    out: list[Path | None] = [None] * len(tpls)
    pool = ctx.Pool(processes)
    try:
        for i, path, seconds, lines in pool.imap_unordered(_forked_template, range(len(tpls))):
            for line in lines:
                log(line)
            out[i] = Path(path)
            stages.seconds.update(seconds)
        pool.close()
    finally:
        pool.terminate()
        pool.join()
        events.put(None)
        shower.join()
        _FORK_JOB.clear()
    return [p for p in out if p is not None]


def _forked_template(i: int) -> tuple[int, str, dict, list[str]]:
    job = dict(_FORK_JOB)
    name, images, instruction = job.pop("tpls")[i]
    events = job.pop("events")
    lines: list[str] = []
    stages = _Stages(1, progress=False)
    stages.notify = lambda template, stage, done: events.put((template, stage, done))
    stages.start(name)
    path = _build_template(name=name, images=images, instruction=instruction, stages=stages, log=lines.append,
                           **job)
    stages.finish_template()
    return i, str(path), stages.seconds, lines


def _build_template(store, model, model_fp, name, images, instruction, calib, names, codecs, floor_codec, *,
                    steps, seed, base_psnr_db, probing, stages, log) -> Path:
    """One template's manifest (see `build_store`); `stages` times each step and moves the bar."""
    from sakura.cloud.capture import ShardDistortionProbe, layer_sensitivity, template_importance
    from sakura.codec import ShardId, ShardKV
    from sakura.codec.base import parse_spec
    from sakura.models.kv import LayerKV, TemplateKV

    t0 = time.perf_counter()
    with stages.stage("capture"):
        images = images() if callable(images) else images  # a library entry's files: decoded now, one at a time
        ref_png = encode_template_images(images)
        images = split_template_images(decode_template_ref(ref_png))  # capture from exactly what the phone will have
        kv = _fp16_in_place(model.extract_template_kv(images, instruction))
    with stages.stage("importance"):
        # token importance for codecs that use it (the nested ladder's widths): attention mass. The
        # gradient sensitivity (sakura.cloud.capture.token_sensitivity) measured no better there and worse
        # as progressive-ladder weighting (docs/codec.md), so the default ladder ignores importance.
        imp = template_importance(model, kv, calib, steps=steps, seed=seed)  # (layers, tokens)

    def calib_edit(layers, kv=kv, photos=calib):
        return model.edit(photos, template_kv=TemplateKV([LayerKV(k, v) for k, v in layers], kv.model_fingerprint,
                                                        kv.template_fingerprint, kv.layout),
                          steps=steps, seed=seed).image

    with stages.stage("sensitivity"):  # the allocation's proxy weights: on the allocation's photos
        alloc_calib = calib[:probing.photos] if probing.photos else calib
        # the allocation's probe first: its reference edit is the sensitivities' and its first-step
        # prefix serves their one-layer edits (the same images, faster)
        alloc_probe = ShardDistortionProbe(model, kv, alloc_calib, steps=steps, seed=seed)
        sens = layer_sensitivity([(l.key, l.value) for l in kv.layers],
                                 lambda layers: calib_edit(layers, photos=alloc_calib), seed=seed,
                                 workers=probing.workers, reference=alloc_probe.reference_image,
                                 edit_one=lambda i, kv_: alloc_probe.edit_replacing(i, LayerKV(*kv_)))

    def calib_edit_layers(layers, kv=kv):
        return model.edit(calib, template_kv=TemplateKV(layers, kv.model_fingerprint, kv.template_fingerprint,
                                                        kv.layout), steps=steps, seed=seed).image

    with stages.stage("probe reference"):
        probe = alloc_probe if len(alloc_calib) == len(calib) else ShardDistortionProbe(model, kv, calib, steps=steps,
                                                                                        seed=seed)
        many = _many_probe(alloc_probe, kv, probing)
    L = kv.num_layers
    shards = [ShardKV(l.key, l.value, importance=imp[i], layer=i, num_layers=L, sensitivity=sens[i],
                      distortion=_part_probe(i, many)) for i, l in enumerate(kv.layers)]
    ident = lambda i: ShardId(model_fp, kv.template_fingerprint, i)  # noqa: E731
    with StoreWriter(store, model_fingerprint=model_fp, template_id=name) as w:
        w.set_template_ref(ref_png, media_type=TEMPLATE_REF_MEDIA_TYPE)
        encoded: list[list[RenditionInput]] = [[] for _ in shards]
        calibrated_lowest = None  # lowest budget of the calibrated progressive entry, once fitted
        for rname, codec in zip(names, codecs):
            params = _jsonable(parse_spec(rname)[1])
            if rname in skipped_floor_rungs([rname], calibrated_lowest):
                log(f"  {rname}: not made (the calibrated ladder's lowest rung, budget {calibrated_lowest:g}, "
                    f"is already as cheap)")
                continue
            if codec.name == "progressive" and "budgets" not in params:
                if base_psnr_db is not None:
                    with stages.stage("ladder search"):
                        codec, params = _fit_ladder_to_template(codec, shards, calib_edit_layers, base_psnr_db, log,
                                                                ref=probe.reference_image)
                    codec, params = _with_floor_rungs(codec, params, names, log)
                calibrated_lowest = min(codec.params["budgets"])
            with stages.stage("fit tables"):
                tables = codec.fit_tables(shards) if codec.uses_tables else None
            table_names: tuple[str, ...] = ()
            if tables is not None:
                # the parameters as the operator wrote them, plus what the build chose (objects carry
                # everything decoding needs; all defaults spelled out made the manifest larger than the ladder)
                w.add_table(rname, codec=codec.name, data=tables.to_bytes(ShardId(model_fp, kv.template_fingerprint, -1)),
                            params=params)
                table_names = (rname,)
            # (shard, rendition fields, distortion, decoded): image probes `probing.at_once` at a
            # time, so at most that many decoded layers wait on the host (never a whole template twice)
            pending: list = []

            def flush(pending=pending) -> None:
                with stages.stage("rendition probes"):
                    mses = probe.image_mse_many([(i, lkv) for i, _f, _d, lkv in pending], batch=probing.batch,
                                                workers=probing.workers)
                    for (i, fields, dist, _lkv), mse in zip(pending, mses):
                        dist.update({"image_mse": mse, "image_psnr_db": psnr_db(mse)})
                        encoded[i].append(RenditionInput(**fields, distortion=_rounded(dist)))
                    pending.clear()

            for i, s in enumerate(shards):
                with stages.stage("encode"):
                    data = codec.encode(s, ident(i), tables)
                # A layered codec's object holds every rung; rung l is the prefix ends[l]
                # (one object in the store, one Range per rung). Others: one whole object.
                ends = codec.level_ends(data) if codec.supports_layers else [None]
                for rung, end in enumerate(ends):
                    with stages.stage("encode"):
                        piece = data if end is None else data[:end]
                        dec = codec.decode(piece, ident(i), tables)  # once: for describe and the image probe
                        d = codec.describe(s, piece, ident(i), tables, decoded=dec)
                    dist = {"expected": d.expected_distortion, "weighted_rel_err": d.weighted_rel_err,
                            "key_rel_err": d.key_rel_err, "value_rel_err": d.value_rel_err,
                            "dropped_fraction": 1.0 - d.keep_fraction}
                    pending.append((i, dict(name=rname if end is None else f"{rname}#{rung}", codec=codec.name,
                                            data=data, params=params if not table_names else {}, prefix_bytes=end,
                                            tables=table_names), dist, dec.for_attention()))
                    del dec
                    if len(pending) >= probing.at_once:
                        flush()
            if pending:
                flush()
        with stages.stage("quality floor"):
            floor_tables = floor_codec.fit_tables(shards) if floor_codec.uses_tables else None
            mses: list[float] = []
            for a in range(0, len(shards), probing.at_once):  # that many decoded layers on the host at a time
                reqs = []
                for i in range(a, min(a + probing.at_once, len(shards))):
                    dec = floor_codec.decode(floor_codec.encode(shards[i], ident(i), floor_tables), ident(i),
                                             floor_tables)
                    reqs.append((i, dec.for_attention()))
                mses += probe.image_mse_many(reqs, batch=probing.batch, workers=probing.workers)
            floors = [{"reference": QUALITY_FLOOR_SPEC, "image_mse": _rounded({"image_mse": m})["image_mse"]}
                      for m in mses]
        with stages.stage("write"):
            for i, s in enumerate(shards):
                w.add_shard(layer=i, tokens=(0, kv.num_tokens), fp16_bytes=s.fp16_bytes, renditions=encoded[i],
                            quality_floor=floors[i])
            w.set_kv_layout({"layers": L, "tokens": kv.num_tokens, "heads": kv.heads, "head_dim": kv.head_dim,
                             "dtype": "float16", "template_fingerprint": kv.template_fingerprint,
                             "layout": _jsonable(kv.layout), "instruction": instruction,
                             **_depends_on(model, images, kv)})
    probe.close()
    alloc_probe.close()
    ladder_b = sum({hashlib.sha256(r.data).digest(): len(r.data) for rs in encoded for r in rs}.values())
    fp16 = sum(s.fp16_bytes for s in shards)
    log(f"{name}: {L} shards x {len(encoded[0])} renditions, ladder {ladder_b / 1e3:.1f} kB + template PNG "
        f"{len(ref_png) / 1e3:.1f} kB vs fp16 {fp16 / 1e3:.1f} kB ({time.perf_counter() - t0:.1f} s)")
    return w.committed_path


def _fp16_in_place(kv):
    """`kv` with every layer cast to fp16 on the host, one layer at a time (the compute-dtype copy
    of a layer is released as its fp16 copy is made: a 1024^2 Klein template is never held twice)."""
    import torch

    from sakura.models.kv import LayerKV

    for i, l in enumerate(kv.layers):
        kv.layers[i] = LayerKV(l.key.to("cpu", torch.float16), l.value.to("cpu", torch.float16), l.keep)
    return kv


def resolve_templates(model: Any, templates: Sequence[Any]) -> list[tuple[str, Any, Any]]:
    """Library names and `TemplateSpec`s -> [(id, images (R, 3, S, S) or a callable returning
    them (a spec's files, decoded when built), instruction)], every problem found first (one line each, `TemplateSpecError`) so a bad entry writes nothing."""
    from sakura.cloud.builder.template_files import TemplateSpec, TemplateSpecError, spec_images, spec_instruction, validate_specs
    from sakura.cloud.tasks import TASK_NAMES, get_template

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
            lib.append(get_template(t, size))
        except ValueError as e:
            problems.append(f"--template {t}: {e} (or give ID=IMAGE for your own image)")
    specs = [t for t in templates if isinstance(t, TemplateSpec)]
    try:
        validate_specs(specs, conditioning=conditioning, max_images=model.max_template_images,
                       tasks=TASK_NAMES, existing_ids=[t.name for t in lib])
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


def _depends_on(model: Any, images, kv) -> dict[str, Any]:
    """What the KV is a function of, for the manifest: the model, each reference image's 8-bit
    pixels, the resolution and the RoPE positions (the prompt's fingerprint is in kv.layout)."""
    import numpy as np
    import torch

    px = [hashlib.sha256((im.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8).tobytes()).hexdigest()
          for im in images]
    d = {"model": str(model.describe().get("model", type(model).__name__)), "image_size": int(images.shape[-1]),
         "images_sha256": px}
    if kv.positions is not None:
        pos = kv.positions.to(torch.int64).contiguous()
        d["rope"] = {"axes": int(pos.shape[1]), "tokens": int(pos.shape[0]),
                     "slots_t": sorted({int(t) for t in pos[:, 0].tolist()}),
                     "positions_sha256": hashlib.sha256(pos.numpy().tobytes()).hexdigest()}
    return d


def _fit_ladder_to_template(codec, shards, edit, base_psnr_db: float, log, ref=None):
    """A progressive ladder whose lowest rung reaches `base_psnr_db` on the calibration edits:
    -> (codec with budgets, manifest params). The candidates are `BASE_RUNG_BUDGETS` below the
    codec's top budget, then the top, then `MAX_SINGLE_RUNG_BUDGETS` (one rung); the answer is the
    cheapest candidate that reaches the target, found by `search_budget` (the image PSNR grows with
    the budget, so a pass above a miss brackets it: 3-4 trials where trying them cheapest first took
    up to 10). `ref`: the all-lossless calibration edit when the caller has it (the distortion
    probe's reference)."""
    import numpy as np

    from sakura.codec import ShardId, get_codec
    from sakura.codec.progressive.ladder import proxy_image_mse
    from sakura.models.kv import LayerKV

    top = float(codec.params["budgets"][-1])
    rungs = len(codec.params["budgets"])
    ref = (ref if ref is not None else edit([LayerKV(s.key, s.value) for s in shards])).double()
    ident = lambda i: ShardId("calibration", "ladder", i)  # noqa: E731
    # a template the top budget cannot serve at the target gets a single rung above it (up to
    # MAX_SINGLE_RUNG_BUDGETS[-1]: storage stays under 1/4 of fp16, docs/codec.md)
    cands = [x for x in BASE_RUNG_BUDGETS if x < top] + [top] + [x for x in MAX_SINGLE_RUNG_BUDGETS if x > top]

    def trial(b: float) -> float:  # the calibration edits' PSNR vs lossless with one rung at budget b
        t = get_codec(codec.name, **{**codec.params, "budgets": [b]})
        tables = t.fit_tables(shards)
        decs = [t.decode(t.encode(s, ident(i), tables), ident(i), tables) for i, s in enumerate(shards)]
        return psnr_db(float((edit([d.for_attention() for d in decs]).double() - ref).pow(2).mean()))

    def proxy(b: float) -> float:  # the sensitivity allocation's own PSNR estimate: no edit, no probe
        p = codec.params
        return psnr_db(proxy_image_mse(shards, b, p["transform"], p.get("weighting", "none"), float(p.get("gamma", 1.0))))

    # an image-allocation trial costs ~100 image probes cold: steered by the proxy's estimate the
    # first trial is usually the answer (7 -> 5 trials on the default templates)
    image = codec.params.get("allocate") == "image" and all(s.sensitivity is not None for s in shards)
    base, got = search_budget(cands, trial, base_psnr_db, prior_at=proxy if image else None)
    n = rungs if base <= top / 2 else (2 if base < top else 1)
    budgets = [float(f"{x:.3g}") for x in np.geomspace(base, top, n)] if n > 1 else [base]
    log(f"  ladder budgets {budgets} (lowest rung: {got:.1f} dB vs lossless "
        f"on the calibration photos at budget {base}, target {base_psnr_db} dB)")
    return get_codec(codec.name, **{**codec.params, "budgets": budgets}), {"budgets": budgets}


#: where `search_budget` starts (a typical template's answer: docs/scale.md), and the PSNR slope it
#: assumes until it has measured two budgets (dB per bit per value; ~6 at high rate, steeper here)
SEARCH_START_BUDGET = 0.3
SEARCH_SLOPE_DB_PER_BIT = 10.0
#: with a prior (the sensitivity allocation's PSNR estimate, `progressive.proxy_image_mse`), what
#: the image allocation's measured PSNR is assumed to differ from it by until a trial has measured
#: it (the default templates: -5 dB at the lowest budgets to +2 dB at 2 bits per value, docs/scale.md)
SEARCH_PRIOR_GAP_DB = -2.0


def search_budget(candidates: Sequence[float], psnr_at: Callable[[float], float],
                  target_db: float, prior_at: Callable[[float], float] | None = None) -> tuple[float, float]:
    """The cheapest of `candidates` (ascending budgets, bits per value) whose `psnr_at(budget)` (dB)
    reaches `target_db`, else the last: -> (budget, its PSNR). A pure function of `psnr_at` and
    `prior_at`.

    PSNR grows with the budget, so the answer is the candidate that passes while the one below it
    misses. Each trial is predicted and kept strictly between the highest miss and the lowest pass,
    so it ends after at most as many trials as candidates (a linear scan's worst case), usually
    2-4, on the same answer whatever the predictions. Were the PSNR not monotone in the budget,
    the answer is still a pass whose cheaper neighbour misses, not always the cheapest pass.

    The prediction: without `prior_at`, linear in the budget between the PSNRs measured so far,
    the secant slope beyond them, `SEARCH_SLOPE_DB_PER_BIT` with one point. With `prior_at` (a
    cheap estimate of the PSNR at any budget, e.g. the proxy allocation's own; memoised), the
    cheapest candidate whose prior plus the difference measured at the nearest trial
    (`SEARCH_PRIOR_GAP_DB` before any) reaches the target: a good prior makes the first trial the
    answer, and the second its cheaper neighbour's miss."""
    import numpy as np

    cands = [float(c) for c in candidates]
    if not cands:
        raise ValueError("search_budget: no candidate budgets")
    seen: dict[int, float] = {}
    priors: dict[int, float] = {}
    miss, ok = -1, len(cands)  # highest index known to miss, lowest known to pass

    def prior(i: int) -> float:
        if i not in priors:
            priors[i] = float(prior_at(cands[i]))
        return priors[i]

    def expected(i: int) -> float:  # the prior plus the difference measured nearest (in log budget)
        if not seen:
            return prior(i) + SEARCH_PRIOR_GAP_DB
        j = min(seen, key=lambda j: (abs(np.log(cands[j] / cands[i])), j))
        return prior(i) + (seen[j] - prior(j))

    def predict_with_prior() -> int:
        a, b = miss + 1, ok  # the cheapest in [a, b) expected to pass (bisection: it grows with the budget)
        while a < b:
            m = (a + b) // 2
            if expected(m) >= target_db:
                b = m
            else:
                a = m + 1
        return min(a, ok - 1)  # none expected to pass: the dearest untried

    def predict() -> int:
        lo, hi = miss + 1, ok - 1
        if prior_at is not None:
            return predict_with_prior()
        if not seen:
            return min(range(lo, hi + 1), key=lambda i: abs(cands[i] - SEARCH_START_BUDGET))
        pts = sorted((cands[i], p) for i, p in seen.items())
        if len(pts) == 1:
            (b0, p0), slope = pts[0], SEARCH_SLOPE_DB_PER_BIT
            need = b0 + (target_db - p0) / slope
        else:
            xs, ys = np.array([b for b, _ in pts]), np.array([p for _, p in pts])
            if target_db <= ys[0]:    # below every measured point: the first secant
                slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
                need = xs[0] + (target_db - ys[0]) / slope if slope > 0 else xs[0]
            elif target_db >= ys[-1]:  # above every measured point: the last secant
                slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
                need = xs[-1] + (target_db - ys[-1]) / (slope if slope > 0 else SEARCH_SLOPE_DB_PER_BIT)
            else:                      # between two: interpolate (in PSNR order: it need not be monotone)
                order = np.argsort(ys, kind="stable")
                need = float(np.interp(target_db, ys[order], xs[order]))
        # the candidate nearest the predicted budget (in log: the candidates are roughly geometric)
        return min(range(lo, hi + 1), key=lambda k: abs(np.log(cands[k] / max(need, 1e-6))))

    while ok - miss > 1:
        i = predict()
        seen[i] = float(psnr_at(cands[i]))
        if seen[i] >= target_db:
            ok = i
        else:
            miss = i
    if ok < len(cands):
        return cands[ok], seen[ok]
    last = len(cands) - 1  # nothing reaches the target: the largest budget (measured: it was the last miss)
    return cands[last], seen[last]


def _with_floor_rungs(codec, params: dict, ladder: Sequence[str], log):
    """The calibrated progressive ladder with the ladder's floor rungs (`FLOOR_RUNG_LADDER` entries
    whose budget is below its lowest rung) as its lowest rungs: one object per shard whose byte
    prefixes are the floor rungs, instead of a separate object and table per floor rung. On a hard
    template (sticker-00: one calibrated rung at budget 1.4, floor rungs 0.8 and 1.0) the separate
    objects stored the same shard three times, ~2.2x the bytes of the ladder alone, and three
    tables (docs/storage.md); as rungs they cost the refinement's overhead only, and an upgrade
    fetches only the missing bytes. The floor entries are then not made (`skipped_floor_rungs`)."""
    from sakura.codec import get_codec
    from sakura.codec.base import parse_spec

    budgets = [float(b) for b in codec.params["budgets"]]
    floor = sorted({float(b) for s in ladder if s.strip() in FLOOR_RUNG_LADDER
                    for b in parse_spec(s.strip())[1]["budgets"] if float(b) < budgets[0]})
    if not floor:
        return codec, params
    merged = floor + budgets
    log(f"  floor rungs {floor} made as the lowest rungs of this ladder: budgets {merged}")
    return get_codec(codec.name, **{**codec.params, "budgets": merged}), {**params, "budgets": merged}


@dataclass(frozen=True)
class _Probing:
    """How image probes run: `batch` edits per model call, `workers` threads at once, the rate
    allocation's on the first `photos` calibration photos (None: all)."""

    batch: int = 1
    workers: int = 1
    photos: int | None = None

    @property
    def at_once(self) -> int:
        """Probes (decoded layers) handed over together: a few per thread, so that the threads
        are not idle while the caller decodes the next ones (one per model call when alone)."""
        return self.batch * (self.workers * 4 if self.workers > 1 else 1)


def _cpu_count() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))  # the cores this process may use (a container's, a taskset's)
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _many_probe(probe, kv, probing: "_Probing"):
    """The probe every shard's `_part_probe` shares (``distortion.many``, which the progressive
    codec's image allocation calls with all of a round's probes): [(layer, "k"/"v", decoded part)]
    -> image MSEs, memoised on (layer, part, decoded bytes).

    With one edit per model call (the CPU default) it also has ``many.submit(layer, part, make)
    -> Future``: `make()` decodes the part in one of `probing.workers` threads, which then probes
    it (`ShardDistortionProbe.image_mse`) unless the memo has it. The codec hands a round's
    probes over at once and the threads take them one by one, decoding included: handed over in
    batches of 8 decoded on the caller's thread, the memo's hits left the threads a few probes a
    call and the decoding ran alone (1.5x on two cores). Else `batch` edits per model call,
    ``many.batch`` parts at a time."""
    import threading
    from concurrent.futures import Future

    from sakura.models.kv import LayerKV

    memo: dict[tuple[int, str, bytes], Future] = {}
    lock = threading.Lock()

    def replacement(layer: int, part: str, decoded):
        lossless = kv.layers[layer]
        return LayerKV(decoded, lossless.value) if part == "k" else LayerKV(lossless.key, decoded)

    def measure(layer: int, part: str, make) -> float:
        decoded = make()
        key = (layer, part, _digest(decoded))
        with lock:
            known = memo.get(key)
            if known is None:
                memo[key] = mine = Future()
        if known is not None:  # measured, or being measured by a task that is running (no deadlock)
            return known.result()
        try:
            mine.set_result(probe.image_mse(layer, replacement(layer, part, decoded)))
        except BaseException as e:
            mine.set_exception(e)
        return mine.result()

    def submit(layer: int, part: str, make) -> Future:
        if probing.workers > 1:
            return probe.pool(probing.workers).submit(measure, layer, part, make)
        return _done(measure, layer, part, make)

    def many(items) -> list[float]:
        if probing.batch <= 1:
            return [f.result() for f in [submit(layer, part, lambda d=decoded: d) for layer, part, decoded in items]]
        keys = [(layer, part, _digest(decoded)) for layer, part, decoded in items]
        todo: dict[tuple[int, str, bytes], Any] = {}
        for key, (layer, part, decoded) in zip(keys, items):
            if key not in memo and key not in todo:
                todo[key] = (layer, replacement(layer, part, decoded))
        for key, mse in zip(todo, probe.image_mse_many(list(todo.values()), batch=probing.batch,
                                                       workers=probing.workers)):
            memo[key] = _done(lambda m=mse: m)
        return [memo[k].result() for k in keys]

    many.batch = probing.at_once  # what the codec hands over per call (`progressive._probe_many`)
    if probing.batch <= 1:
        many.submit = submit
    return many


def _done(fn, *args):
    """`fn(*args)` run here, as a finished Future (its exception kept for .result())."""
    from concurrent.futures import Future

    fut: Future = Future()
    try:
        fut.set_result(fn(*args))
    except Exception as e:  # noqa: BLE001  (raised again where the caller asks for the result)
        fut.set_exception(e)
    return fut


def _digest(t) -> bytes:
    import torch

    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).digest()


def _part_probe(layer: int, many):
    """`ShardKV.distortion` for layer `layer`: the calibration edits' image MSE with this layer's keys
    or values replaced (the progressive codec's image allocation, `allocate="image"`), through
    `many` (`_many_probe`, shared by all shards: memoised on the decoded bytes, since the ladder fit
    and every rendition's tables ask for the same grid points). ``distortion.many`` lets the codec
    batch a round's probes across shards."""

    def distortion(kv: str, decoded) -> float:
        return many([(layer, kv, decoded)])[0]

    distortion.many = many
    return distortion


def _rounded(dist: dict[str, float]) -> dict[str, float]:
    """Six significant digits (17 made up a tenth of the manifest); image_psnr_db recomputed from
    the rounded image_mse so the manifest's consistency check holds exactly."""
    import math

    out = {k: (v if math.isinf(v) else float(f"{v:.6g}")) for k, v in dist.items()}
    if "image_mse" in out:
        mse = out["image_mse"]
        out["image_psnr_db"] = psnr_db(mse)
    return out


def _jsonable(d: Any) -> Any:
    import json

    return json.loads(json.dumps(d, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))
