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
#: only where the link makes them faster and the image floor allows (docs/runtime.md: 81 -> 47
#: losing profile runs). Made only where the calibrated ladder has no rung as cheap
#: (`skipped_floor_rungs`): an easy template's ladder already reaches down to 0.15-1.0 bits/value,
#: and there they would add ~2.2x the ladder's storage for renditions the planner never picks.
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


def build_store(store: str | Path, *, model_name: str = "sakura-mini", templates: Sequence[Any] | None = None,
                ladder: Sequence[str] = DEFAULT_LADDER, calibration: int = 2, steps: int = 4, seed: int = 0,
                base_psnr_db: float | None = BASE_RUNG_PSNR_DB, log: Callable[[str], None] = print) -> list[Path]:
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
    """
    import torch

    from sakura.cloud.capture import ShardDistortionProbe, calibration_photos, layer_sensitivity, template_importance
    from sakura.codec import ShardId, ShardKV, codec_from_spec
    from sakura.codec.base import parse_spec
    from sakura.models import load_model
    from sakura.models.kv import LayerKV, TemplateKV

    torch.set_num_threads(1)  # shared small machines: one thread is faster than two contending
    codecs = [codec_from_spec(s) for s in ladder]  # bad specs fail before the model runs
    names = [s.strip() for s in ladder]  # rendition names as the operator wrote them
    if len(set(names)) != len(names):
        raise ValueError(f"ladder has duplicate settings: {names}")
    floor_codec = codec_from_spec(QUALITY_FLOOR_SPEC)
    model = load_model(model_name)  # every adapter has the image-level API (ImageTemplateEditModel's calls)
    size = int(model.cfg.image_size)
    model_fp = model.fingerprint()
    if not templates and model.template_conditioning != "task":
        from sakura.cloud.builder.template_files import TemplateSpecError

        raise TemplateSpecError([f"{model_name} has no bundled templates: give --library FILE or "
                                 f"--template ID=IMAGE --prompt P"])
    tpls = resolve_templates(model, list(templates) if templates else default_templates())  # fails before any work
    calib = calibration_photos(size, calibration)  # public training photos, never the held-out test ones
    out = []
    for name, images, instruction in tpls:
        t0 = time.perf_counter()
        images = images() if callable(images) else images  # a library entry's files: decoded now, one at a time
        ref_png = encode_template_images(images)
        images = split_template_images(decode_template_ref(ref_png))  # capture from exactly what the phone will have
        kv = model.extract_template_kv(images, instruction).to(torch.float16)
        # token importance for codecs that use it (the nested ladder's widths): attention mass. The
        # gradient sensitivity (sakura.cloud.capture.token_sensitivity) measured no better there and worse
        # as progressive-ladder weighting (docs/codec.md), so the default ladder ignores importance.
        imp = template_importance(model, kv, calib, steps=steps, seed=seed)  # (layers, tokens)

        def calib_edit(layers, kv=kv):
            return model.edit(calib, template_kv=TemplateKV([LayerKV(k, v) for k, v in layers], kv.model_fingerprint,
                                                            kv.template_fingerprint, kv.layout),
                              steps=steps, seed=seed).image

        sens = layer_sensitivity([(l.key, l.value) for l in kv.layers], calib_edit, seed=seed)

        def calib_edit_layers(layers, kv=kv):
            return model.edit(calib, template_kv=TemplateKV(layers, kv.model_fingerprint, kv.template_fingerprint,
                                                            kv.layout), steps=steps, seed=seed).image

        probe = ShardDistortionProbe(model, kv, calib, steps=steps, seed=seed)
        L = kv.num_layers
        shards = [ShardKV(l.key, l.value, importance=imp[i], layer=i, num_layers=L, sensitivity=sens[i],
                          distortion=_part_probe(probe, i, l)) for i, l in enumerate(kv.layers)]
        ident = lambda i: ShardId(model_fp, kv.template_fingerprint, i)  # noqa: E731
        floor_tables = floor_codec.fit_tables(shards) if floor_codec.uses_tables else None
        floors = []
        for i, s in enumerate(shards):
            dec = floor_codec.decode(floor_codec.encode(s, ident(i), floor_tables), ident(i), floor_tables)
            floors.append({"reference": QUALITY_FLOOR_SPEC,
                           "image_mse": _rounded({"image_mse": probe.image_mse(i, LayerKV(dec.key, dec.value, dec.keep_mask))})["image_mse"]})
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
                        codec, params = _fit_ladder_to_template(codec, shards, calib_edit_layers, base_psnr_db, log)
                    calibrated_lowest = min(codec.params["budgets"])
                tables = codec.fit_tables(shards) if codec.uses_tables else None
                table_names: tuple[str, ...] = ()
                if tables is not None:
                    # the parameters as the operator wrote them, plus what the build chose (objects carry
                    # everything decoding needs; all defaults spelled out made the manifest larger than the ladder)
                    w.add_table(rname, codec=codec.name, data=tables.to_bytes(ShardId(model_fp, kv.template_fingerprint, -1)),
                                params=params)
                    table_names = (rname,)
                for i, s in enumerate(shards):
                    data = codec.encode(s, ident(i), tables)
                    # A layered codec's object holds every rung; rung l is the prefix ends[l]
                    # (one object in the store, one Range per rung). Others: one whole object.
                    ends = codec.level_ends(data) if codec.supports_layers else [None]
                    for rung, end in enumerate(ends):
                        piece = data if end is None else data[:end]
                        d = codec.describe(s, piece, ident(i), tables)
                        dec = codec.decode(piece, ident(i), tables)
                        dist = {"expected": d.expected_distortion, "weighted_rel_err": d.weighted_rel_err,
                                "key_rel_err": d.key_rel_err, "value_rel_err": d.value_rel_err,
                                "dropped_fraction": 1.0 - d.keep_fraction, **probe.measure(i, LayerKV(dec.key, dec.value, dec.keep_mask))}
                        encoded[i].append(RenditionInput(
                            name=rname if end is None else f"{rname}#{rung}", codec=codec.name, data=data,
                            params=params if not table_names else {}, prefix_bytes=end, tables=table_names,
                            distortion=_rounded(dist)))  # (a ladder's parameters are on its table entry, once)
            for i, s in enumerate(shards):
                w.add_shard(layer=i, tokens=(0, kv.num_tokens), fp16_bytes=s.fp16_bytes, renditions=encoded[i],
                            quality_floor=floors[i])
            w.set_kv_layout({"layers": L, "tokens": kv.num_tokens, "heads": kv.heads, "head_dim": kv.head_dim,
                             "dtype": "float16", "template_fingerprint": kv.template_fingerprint,
                             "layout": _jsonable(kv.layout), "instruction": instruction,
                             **_depends_on(model, images, kv)})
        out.append(w.committed_path)
        ladder_b = sum({hashlib.sha256(r.data).digest(): len(r.data) for rs in encoded for r in rs}.values())
        fp16 = sum(s.fp16_bytes for s in shards)
        log(f"{name}: {L} shards x {len(encoded[0])} renditions, ladder {ladder_b / 1e3:.1f} kB + template PNG "
            f"{len(ref_png) / 1e3:.1f} kB vs fp16 {fp16 / 1e3:.1f} kB ({time.perf_counter() - t0:.1f} s)")
    return out


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


def _fit_ladder_to_template(codec, shards, edit, base_psnr_db: float, log):
    """A progressive ladder whose lowest rung reaches `base_psnr_db` on the calibration edits:
    -> (codec with budgets, manifest params). Tries `BASE_RUNG_BUDGETS` below the codec's top
    budget cheapest first, then the top, then `MAX_SINGLE_RUNG_BUDGETS` (one rung)."""
    import math

    import numpy as np

    from sakura.codec import ShardId, get_codec
    from sakura.models.kv import LayerKV

    top = float(codec.params["budgets"][-1])
    rungs = len(codec.params["budgets"])
    ref = edit([LayerKV(s.key, s.value) for s in shards]).double()
    ident = lambda i: ShardId("calibration", "ladder", i)  # noqa: E731
    base, got = top, None
    # cheapest first; a template the top budget cannot serve at the target gets a single rung above
    # it (up to MAX_SINGLE_RUNG_BUDGETS[-1]: storage stays under 1/4 of fp16, docs/codec.md)
    for b in [x for x in BASE_RUNG_BUDGETS if x < top] + [top] + [x for x in MAX_SINGLE_RUNG_BUDGETS if x > top]:
        base = b
        trial = get_codec(codec.name, **{**codec.params, "budgets": [b]})
        tables = trial.fit_tables(shards)
        decs = [trial.decode(trial.encode(s, ident(i), tables), ident(i), tables) for i, s in enumerate(shards)]
        mse = float((edit([LayerKV(d.key, d.value, d.keep_mask) for d in decs]).double() - ref).pow(2).mean())
        got = psnr_db(mse)
        if got >= base_psnr_db:
            break
    n = rungs if base <= top / 2 else (2 if base < top else 1)
    budgets = [float(f"{x:.3g}") for x in np.geomspace(base, top, n)] if n > 1 else [base]
    log(f"  ladder budgets {budgets} (lowest rung: {got if got is not None else float('nan'):.1f} dB vs lossless "
        f"on the calibration photos at budget {base}, target {base_psnr_db} dB)")
    return get_codec(codec.name, **{**codec.params, "budgets": budgets}), {"budgets": budgets}


def _part_probe(probe, layer: int, lossless):
    """`ShardKV.distortion` for layer `layer`: the calibration edits' image MSE with this layer's keys
    or values replaced (the progressive codec's image allocation, `allocate="image"`), memoised on
    the decoded bytes (the ladder fit and every rendition's tables ask for the same grid points)."""
    import torch

    from sakura.models.kv import LayerKV

    memo: dict[tuple[str, bytes], float] = {}

    def distortion(kv: str, decoded) -> float:
        key = (kv, hashlib.sha256(decoded.contiguous().view(torch.uint8).numpy().tobytes()).digest())
        if key not in memo:
            layer_kv = LayerKV(decoded, lossless.value) if kv == "k" else LayerKV(lossless.key, decoded)
            memo[key] = probe.image_mse(layer, layer_kv)
        return memo[key]

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
