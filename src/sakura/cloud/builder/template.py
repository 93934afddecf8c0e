"""One template's build: capture, calibration, the ladder's renditions with their figures, the
quality floor, the manifest (`build_store` calls `build_template` per template).

Two calibrations (`build_store(allocation=)`):

- ``"model"`` (default): a sensitivity model of the template KV (`measure_kv_sensitivity`: one
  differentiable edit per calibration photo and a few backward passes) predicts the image MSE of any KV error. The
  progressive codec allocates its bits by it, the ladder search predicts each budget's PSNR by it
  and confirms with at most `ladder.ACCEPTANCE_EDITS` measured edits, and every rendition's and
  quality floor's ``image_mse`` is predicted by it (``"image_predicted": 1`` in the rendition's
  distortion map; ``"predicted": true`` on the floor) except `FIGURE_CHECKS` measured ones, whose
  prediction error the build reports. 12 calibration edits a template (8 sketch probes, per photo).
- ``"probes"``: every figure and allocation choice measured by image probes (one edit each), the
  build before issue 41 (~200 edits a template), kept to compare against.
"""

from __future__ import annotations

import functools
import hashlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
import json

from sakura.cloud import capture  # its names load torch on first use (a lazy facade): the skip path loads none
from sakura.cloud.builder.defaults import QUALITY_FLOOR_SPEC
from sakura.cloud.builder.ladder import (fit_ladder_by_model, fit_ladder_by_probes, skipped_floor_rungs,
                                        with_floor_rungs)
from sakura.cloud.builder.probes import Probing, many_probe, part_probe
from sakura.cloud.builder.progress import CountingModel, Stages
from sakura.util.psnr import psnr_db
from sakura.wire.store.store import RenditionInput, StoreWriter
from sakura.wire.store.template_ref import TEMPLATE_REF_MEDIA_TYPE, decode_template_ref, encode_template_images, split_template_images

ALLOCATIONS = ("model", "probes")
#: renditions per template whose predicted image MSE is checked by a measured edit (the model
#: allocation): the one with the largest predicted MSE, where a wrong figure would matter most
FIGURE_CHECKS = 1
#: the rendition distortion key that marks a predicted ``image_mse`` (absent: measured, as in
#: every store built before issue 41)
PREDICTED_KEY = "image_predicted"


@dataclass
class Calibration:
    """What a template's renditions are chosen and described by: its shards (with their
    `distortion`: predicted or probed), the all-lossless calibration edit, and either the
    sensitivity model or the distortion probe."""

    model: Any
    kv: Any
    photos: Any
    steps: int
    seed: int
    shards: list
    reference_image: Any
    probing: Probing
    sensitivity: Any = None          # KVSensitivity (allocation "model")
    probe: Any = None                # ShardDistortionProbe over all photos (allocation "probes"; "model": made for the checks)
    closers: list = field(default_factory=list)

    def edit_layers(self, layers) -> Any:
        """The calibration edit (N, 3, S, S) with the template KV's layers replaced by `layers`."""
        from sakura.models.kv import TemplateKV  # lazy: torch, numba; an unchanged store's skip loads none

        kv = self.kv
        return self.model.edit(self.photos, template_kv=TemplateKV(list(layers), kv.model_fingerprint,
                                                                   kv.template_fingerprint, kv.layout),
                               steps=self.steps, seed=self.seed).image

    def measuring_probe(self):
        """A probe of one-layer edits over all calibration photos (made on first use; no
        first-step prefix for the model's few checks)."""
        if self.probe is None:
            self.probe = capture.ShardDistortionProbe(self.model, self.kv, self.photos, steps=self.steps, seed=self.seed,
                                              reference_image=self.reference_image,
                                              use_prefix=self.sensitivity is None)
        return self.probe

    def close(self) -> None:
        for c in [self.probe] + self.closers:
            if c is not None:
                c.close()


def _needs_attention_importance(codecs) -> bool:
    """Whether a codec of the ladder weighs tokens by importance (the nested quantiser's widths,
    progressive weighting); the default ladder does not, and the model path then skips the
    attention-mass edits (its per-token diagonal serves the manifest's `weighted_rel_err`)."""
    for c in codecs:
        p = getattr(c, "params", None) or {}
        if c.name in ("sakura", "layered") and p.get("use_importance", True):
            return True
        if p.get("weighting", "none") != "none":
            return True
    return False


def calibrate_by_model(model, kv, calib, codecs, *, steps, seed, probing, probes, stages) -> Calibration:
    """The sensitivity model (2 + `probes` edits with two photos), the shards it predicts for, and importance
    (attention mass where a codec needs it, else the model's per-token diagonal)."""
    from sakura.codec import ShardKV  # lazy: torch, numba; an unchanged store's skip loads none

    with stages.stage("sensitivity"):
        sens = capture.measure_kv_sensitivity(model, kv, calib, steps=steps, seed=seed, probes=probes)
        model.add(sens.backward_edits)  # the backward passes (its forward edits were counted by the model)
    with stages.stage("importance"):
        imp = (capture.template_importance(model, kv, calib, steps=steps, seed=seed) if _needs_attention_importance(codecs)
               else sens.token_importance())
    L = kv.num_layers
    shards = [ShardKV(l.key, l.value, importance=imp[i], layer=i, num_layers=L,
                      sensitivity=sens.relative_sensitivity(i, l.key, l.value),
                      distortion=capture.PredictedDistortion(sens, i, l.key, l.value)) for i, l in enumerate(kv.layers)]
    return Calibration(model, kv, calib, steps, seed, shards, sens.reference_image, probing, sensitivity=sens)


def calibrate_by_probes(model, kv, calib, *, steps, seed, probing, stages) -> Calibration:
    """Attention-mass importance, layer sensitivities by perturbation edits, and image probes for
    every allocation choice and figure (the build before issue 41)."""
    from sakura.codec import ShardKV  # lazy: torch, numba; an unchanged store's skip loads none
    from sakura.models.kv import LayerKV, TemplateKV  # lazy: torch, numba; an unchanged store's skip loads none

    with stages.stage("importance"):
        # token importance for codecs that use it (the nested ladder's widths): attention mass
        imp = capture.template_importance(model, kv, calib, steps=steps, seed=seed)  # (layers, tokens)

    def calib_edit(layers, photos):
        return model.edit(photos, template_kv=TemplateKV([LayerKV(k, v) for k, v in layers], kv.model_fingerprint,
                                                        kv.template_fingerprint, kv.layout),
                          steps=steps, seed=seed).image

    with stages.stage("sensitivity"):  # the allocation's proxy weights: on the allocation's photos
        alloc_calib = calib[:probing.photos] if probing.photos else calib
        # the allocation's probe first: its reference edit is the sensitivities' and its first-step
        # prefix serves their one-layer edits (the same images, faster)
        alloc_probe = capture.ShardDistortionProbe(model, kv, alloc_calib, steps=steps, seed=seed)
        sens = capture.layer_sensitivity([(l.key, l.value) for l in kv.layers],
                                 lambda layers: calib_edit(layers, alloc_calib), seed=seed,
                                 workers=probing.workers, reference=alloc_probe.reference_image,
                                 edit_one=lambda i, kv_: alloc_probe.edit_replacing(i, LayerKV(*kv_)))
    with stages.stage("probe reference"):
        probe = alloc_probe if len(alloc_calib) == len(calib) else capture.ShardDistortionProbe(model, kv, calib, steps=steps,
                                                                                        seed=seed)
        many = many_probe(alloc_probe, kv, probing)
    L = kv.num_layers
    shards = [ShardKV(l.key, l.value, importance=imp[i], layer=i, num_layers=L, sensitivity=sens[i],
                      distortion=part_probe(i, many)) for i, l in enumerate(kv.layers)]
    cal = Calibration(model, kv, calib, steps, seed, shards, probe.reference_image, probing, probe=probe)
    if alloc_probe is not probe:
        cal.closers.append(alloc_probe)
    return cal


def build_template(store, model, model_fp, name, images, instruction, calib, names, codecs, floor_codec, *,
                   steps, seed, base_psnr_db, probing, stages: Stages, log, allocation: str = "model",
                   sketch_probes: int | None = None, build_keys: dict | None = None) -> Path:
    """One template's manifest (see `build_store`); `stages` times each step, moves the bar and
    keeps the template's facts (calibration edits, the figure checks)."""
    t0, c0 = time.perf_counter(), time.process_time()
    model = CountingModel(model, len(calib))
    with stages.stage("capture"):
        images = images() if callable(images) else images  # a library entry's files: decoded now, one at a time
        ref_png = encode_template_images(images)
        images = split_template_images(decode_template_ref(ref_png))  # capture from exactly what the phone will have
        kv = _fp16_in_place(model.extract_template_kv(images, instruction))
    if allocation == "model":
        cal = calibrate_by_model(model, kv, calib, codecs, steps=steps, seed=seed, probing=probing,
                                 probes=sketch_probes or capture.SKETCH_PROBES, stages=stages)
    else:
        cal = calibrate_by_probes(model, kv, calib, steps=steps, seed=seed, probing=probing, stages=stages)
    facts = stages.facts.setdefault(name, {})
    try:
        with StoreWriter(store, model_fingerprint=model_fp, template_id=name) as w:
            w.set_template_ref(ref_png, media_type=TEMPLATE_REF_MEDIA_TYPE)
            encoded = _renditions(w, cal, names, codecs, model_fp, base_psnr_db, stages, log, facts)
            if cal.sensitivity is not None:
                with stages.stage("rendition probes"):
                    facts["figure_checks"] = _check_figures(cal, encoded, FIGURE_CHECKS)
            with stages.stage("quality floor"):
                floors = _quality_floor(cal, floor_codec, model_fp)
            if cal.sensitivity is not None:
                facts["prediction_correction"] = _correct_predictions(encoded, floors, facts)
            with stages.stage("write"):
                _write(w, cal, encoded, floors, model, images, instruction, (build_keys or {}).get(name))
    finally:
        cal.close()
    facts.update(status="built", calibration_edits=round(model.edits, 3), allocation=allocation,
                 wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0)
    ladder_b = sum({hashlib.sha256(f["data"]).digest(): len(f["data"]) for rs in encoded for f, _d, _r in rs}.values())
    fp16 = sum(s.fp16_bytes for s in cal.shards)
    log(f"{name}: {kv.num_layers} shards x {len(encoded[0])} renditions, ladder {ladder_b / 1e3:.1f} kB + template PNG "
        f"{len(ref_png) / 1e3:.1f} kB vs fp16 {fp16 / 1e3:.1f} kB, {model.edits:.3g} calibration edits"
        + (f", predicted image MSEs x{facts['prediction_correction']:.2f} by its measured edits"
           if facts.get("prediction_correction", 1.0) > 1.005 else "")
        + f" ({time.perf_counter() - t0:.1f} s)")
    return w.committed_path


def _renditions(w, cal: Calibration, names, codecs, model_fp, base_psnr_db, stages: Stages, log, facts) -> list[list]:
    """Every rendition of every shard: [[(RenditionInput fields, distortion)]] per shard, the
    tables written to `w`; the progressive ladder fitted to the template first."""
    from sakura.codec import ShardId  # lazy: torch, numba; an unchanged store's skip loads none
    from sakura.codec.base import parse_spec  # lazy: torch, numba; an unchanged store's skip loads none

    kv, shards = cal.kv, cal.shards
    ident = lambda i: ShardId(model_fp, kv.template_fingerprint, i)  # noqa: E731
    encoded: list[list] = [[] for _ in shards]
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
                    codec, params = _fit_ladder(cal, codec, base_psnr_db, log, facts)
                codec, params = with_floor_rungs(codec, params, names, log)
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
        figures = _Figures(cal, stages)
        for i, s in enumerate(shards):
            with stages.stage("encode"):
                data = codec.encode(s, ident(i), tables)
            # A layered codec's object holds every rung; rung l is the prefix ends[l]
            # (one object in the store, one Range per rung). Others: one whole object.
            ends = codec.level_ends(data) if codec.supports_layers else [None]
            for rung, end in enumerate(ends):
                with stages.stage("encode"):
                    piece = data if end is None else data[:end]
                    dec = codec.decode(piece, ident(i), tables)  # once: for describe and the image figure
                    d = codec.describe(s, piece, ident(i), tables, decoded=dec)
                dist = {"expected": d.expected_distortion, "weighted_rel_err": d.weighted_rel_err,
                        "key_rel_err": d.key_rel_err, "value_rel_err": d.value_rel_err,
                        "dropped_fraction": 1.0 - d.keep_fraction}
                fields = dict(name=rname if end is None else f"{rname}#{rung}", codec=codec.name, data=data,
                              params=params if not table_names else {}, prefix_bytes=end, tables=table_names)
                redecode = functools.partial(codec.decode, piece, ident(i), tables)  # for a figure check
                encoded[i].append((fields, dist, redecode))
                figures.add(i, dist, dec.for_attention())
                del dec
        figures.flush()
    return encoded


def _fit_ladder(cal: Calibration, codec, base_psnr_db, log, facts):
    """The progressive ladder's budgets for this template: by the model or by probes."""
    if cal.sensitivity is not None:
        codec, params, trials = fit_ladder_by_model(codec, cal.shards, cal.edit_layers, base_psnr_db, log,
                                                    ref=cal.reference_image)
        facts["ladder_trials"] = [{"budget": b, "predicted_psnr_db": round(p, 3), "measured_psnr_db": round(m, 3)}
                                  for b, p, m in trials]
        return codec, params
    return fit_ladder_by_probes(codec, cal.shards, cal.edit_layers, base_psnr_db, log, ref=cal.reference_image)


class _Figures:
    """Each rendition's ``image_mse``: predicted by the sensitivity model (a decoded layer that
    drops tokens, which the model does not describe, is measured), or measured by image probes
    `probing.at_once` at a time, so that at most that many decoded layers wait on the host."""

    def __init__(self, cal: Calibration, stages: Stages) -> None:
        self.cal, self.stages, self.pending = cal, stages, []

    def add(self, i: int, dist: dict, decoded) -> None:
        cal = self.cal
        if cal.sensitivity is not None and decoded.keep_mask is None:
            s = cal.shards[i]
            mse = cal.sensitivity.layer_mse(i, decoded.key.float() - s.key.float(),
                                            decoded.value.float() - s.value.float())
            dist.update({"image_mse": mse, "image_psnr_db": psnr_db(mse), PREDICTED_KEY: 1.0})
            return
        self.pending.append((i, dist, decoded))
        if len(self.pending) >= cal.probing.at_once:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        probing = self.cal.probing
        with self.stages.stage("rendition probes"):
            mses = self.cal.measuring_probe().image_mse_many([(i, lkv) for i, _d, lkv in self.pending],
                                                             batch=probing.batch, workers=probing.workers)
            for (_i, dist, _lkv), mse in zip(self.pending, mses):
                dist.update({"image_mse": mse, "image_psnr_db": psnr_db(mse)})
        self.pending.clear()


def _quality_floor(cal: Calibration, floor_codec, model_fp) -> list[dict]:
    """Per shard the quality floor's codec (CacheGen level 3) image MSE: predicted, or probed."""
    from sakura.codec import ShardId  # lazy: torch, numba; an unchanged store's skip loads none

    shards, probing = cal.shards, cal.probing
    ident = lambda i: ShardId(model_fp, cal.kv.template_fingerprint, i)  # noqa: E731
    floor_tables = floor_codec.fit_tables(shards) if floor_codec.uses_tables else None
    mses: list[float] = []
    predicted = cal.sensitivity is not None
    for a in range(0, len(shards), probing.at_once):  # that many decoded layers on the host at a time
        reqs = []
        for i in range(a, min(a + probing.at_once, len(shards))):
            dec = floor_codec.decode(floor_codec.encode(shards[i], ident(i), floor_tables), ident(i), floor_tables)
            reqs.append((i, dec.for_attention()))
        if predicted:
            mses += [cal.sensitivity.layer_mse(i, d.key.float() - shards[i].key.float(),
                                               d.value.float() - shards[i].value.float()) for i, d in reqs]
        else:
            mses += cal.measuring_probe().image_mse_many(reqs, batch=probing.batch, workers=probing.workers)
    return [{"reference": QUALITY_FLOOR_SPEC, "image_mse": _rounded({"image_mse": m})["image_mse"],
             **({"predicted": True} if predicted else {})} for m in mses]


def _check_figures(cal: Calibration, encoded: list[list], n: int) -> list[dict]:
    """Measure the `n` predicted renditions with the largest predicted image MSE (one edit each)
    and record the measurement in their place: -> [{shard, rendition, predicted, measured}]."""
    cands = [(d["image_mse"], i, k) for i, rs in enumerate(encoded) for k, (_f, d, _r) in enumerate(rs)
             if d.get(PREDICTED_KEY)]
    out = []
    for pred, i, k in sorted(cands, reverse=True)[:n]:
        fields, dist, redecode = encoded[i][k]
        mse = cal.measuring_probe().image_mse(i, redecode().for_attention())
        dist.pop(PREDICTED_KEY)
        dist.update({"image_mse": mse, "image_psnr_db": psnr_db(mse)})
        out.append({"shard": i, "rendition": fields["name"], "predicted_image_mse": float(f"{pred:.6g}"),
                    "measured_image_mse": float(f"{mse:.6g}")})
    return out


def _correct_predictions(encoded: list[list], floors: list[dict], facts: dict) -> float:
    """Scale every predicted image MSE (renditions and floors) by how much the model under-predicted
    this template's measured edits (its figure checks and ladder acceptance edits), never down:
    the sketch's few probes make it optimistic (up to ~2 dB on the calibration photos), and a floor
    read as better than it is costs the phone quality it was promised. -> the factor (>= 1)."""
    ratios = [c["measured_image_mse"] / c["predicted_image_mse"] for c in facts.get("figure_checks", [])
              if c["predicted_image_mse"] > 0]
    ratios += [10 ** ((t["predicted_psnr_db"] - t["measured_psnr_db"]) / 10) for t in facts.get("ladder_trials", [])
               if math.isfinite(t["predicted_psnr_db"]) and math.isfinite(t["measured_psnr_db"])]
    factor = max([1.0, *ratios])
    if factor > 1.0:
        for rs in encoded:
            for _f, d, _r in rs:
                if d.get(PREDICTED_KEY):
                    d.update({"image_mse": d["image_mse"] * factor, "image_psnr_db": psnr_db(d["image_mse"] * factor)})
        for fl in floors:
            if fl.get("predicted"):
                fl["image_mse"] = _rounded({"image_mse": fl["image_mse"] * factor})["image_mse"]
    return factor


def _write(w, cal: Calibration, encoded, floors, model, images, instruction, keys: dict | None) -> None:
    """Shards, then the KV layout, whose ``keys`` ({"build_key", "source_key"}: `incremental`) let
    the next build skip this template."""
    kv = cal.kv
    for i, s in enumerate(cal.shards):
        w.add_shard(layer=i, tokens=(0, kv.num_tokens), fp16_bytes=s.fp16_bytes,
                    renditions=[RenditionInput(**f, distortion=_rounded(d)) for f, d, _r in encoded[i]],
                    quality_floor=floors[i])
    w.set_kv_layout({"layers": kv.num_layers, "tokens": kv.num_tokens, "heads": kv.heads, "head_dim": kv.head_dim,
                     "dtype": "float16", "template_fingerprint": kv.template_fingerprint,
                     "layout": _jsonable(kv.layout), "instruction": instruction, **_depends_on(model, images, kv),
                     **(keys or {})})


def _fp16_in_place(kv):
    """`kv` with every layer cast to fp16 on the host, one layer at a time (the compute-dtype copy
    of a layer is released as its fp16 copy is made: a 1024^2 Klein template is never held twice)."""
    import torch  # lazy: torch; an unchanged store's skip and --help load none

    from sakura.models.kv import LayerKV  # lazy: torch, numba; an unchanged store's skip loads none

    for i, l in enumerate(kv.layers):
        kv.layers[i] = LayerKV(l.key.to("cpu", torch.float16), l.value.to("cpu", torch.float16), l.keep)
    return kv


def _depends_on(model: Any, images, kv) -> dict[str, Any]:
    """What the KV is a function of, for the manifest: the model, each reference image's 8-bit
    pixels, the resolution and the RoPE positions (the prompt's fingerprint is in kv.layout)."""
    import numpy as np  # lazy: numpy; an unchanged store's skip and --help load none
    import torch  # lazy: torch; an unchanged store's skip and --help load none

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


def _rounded(dist: dict[str, float]) -> dict[str, float]:
    """Six significant digits (17 made up a tenth of the manifest); image_psnr_db recomputed from
    the rounded image_mse so the manifest's consistency check holds exactly."""
    out = {k: (v if math.isinf(v) else float(f"{v:.6g}")) for k, v in dist.items()}
    if "image_mse" in out:
        mse = out["image_mse"]
        out["image_psnr_db"] = psnr_db(mse)
    return out


def _jsonable(d: Any) -> Any:
    return json.loads(json.dumps(d, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))
