"""`sakura build`: capture template KV, score token importance, encode the ladder, write the store.

Cloud side, for the bundled sakura-mini model (the Klein adapter's templates are a different
type; building them is not wired yet). For each template:

1. ``model.extract_template_kv`` -> fp32 KV, stored reference is fp16 (what every codec starts from);
2. ``sakura.capture.template_importance`` over public calibration photos -> (layers, tokens);
3. every codec setting of the ladder: fit shared tables once (if the codec uses them), encode
   every layer's shard, measure its distortion with ``Codec.describe`` (a layered codec gives
   one rendition per rung, each a byte prefix of the shard's one object);
4. ``StoreWriter``: one object per rendition, tables as objects, the template reference
   (image + instruction, safetensors) so the phone can compute the KV itself, manifest last.

Codec objects are tagged with ``ShardId(model_fingerprint, template_fingerprint, shard)``; the
manifest's ``kv_layout`` carries ``template_fingerprint`` so the runtime can rebuild that id.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from sakura.store.store import RenditionInput, StoreWriter

#: Default ladder: the importance-aware layered codec alone, four rungs (~1.5/2.5/3.5/4.5 bits/value
#: budgets) stored as one object per shard (rung l = a byte prefix: one Range per rung, upgrades
#: fetch only the missing bytes). The exact fallback is computing the KV on the phone, so the
#: store need not keep a lossless copy: this ladder costs about 1/3 of one fp16 copy, tables
#: included. Add "lossless" / "uniform:bits=8" with --ladder when raw streaming is wanted.
DEFAULT_LADDER = ("layered:budgets=[1.5,2.5,3.5,4.5]",)
TEMPLATE_REF_MEDIA_TYPE = "application/x-sakura-mini-template+safetensors"


def default_templates() -> list[str]:
    """The first training template of each task in the library (e.g. ``look-00``)."""
    from sakura.tasks import TASK_NAMES

    return [f"{t}-00" for t in TASK_NAMES]


def build_store(store: str | Path, *, model_name: str = "sakura-mini", templates: Sequence[str] | None = None,
                ladder: Sequence[str] = DEFAULT_LADDER, calibration: int = 2, steps: int = 4, seed: int = 0,
                log: Callable[[str], None] = print) -> list[Path]:
    """Build (or idempotently rebuild) one manifest per template; returns the manifest paths.

    Args:
        store: store directory (created if missing).
        model_name: ``sakura-mini`` / ``flux2-mini``, optionally ``:/path/weights.safetensors``.
        templates: library template names (``sakura.tasks.template_library``); default one per task.
        ladder: codec specs (``sakura.codec.codec_from_spec``), one rendition each.
        calibration: number of public calibration photos (held-out sources) for importance.
        steps, seed: sampler run that produces the calibration queries.
    """
    import torch
    from safetensors.torch import save as st_save

    from sakura.capture import template_importance
    from sakura.codec import Shard, ShardId, codec_from_spec
    from sakura.models import ImageTemplateEditModel, load_model
    from sakura.tasks import get_template, heldout_photos

    torch.set_num_threads(1)  # shared small machines: one thread is faster than two contending
    codecs = [codec_from_spec(s) for s in ladder]  # bad specs fail before the model runs
    names = [s.strip() for s in ladder]  # rendition names as the operator wrote them
    if len(set(names)) != len(names):
        raise ValueError(f"ladder has duplicate settings: {names}")
    model = load_model(model_name)
    if not isinstance(model, ImageTemplateEditModel):  # sakura-mini, flux2-mini; not yet klein:/folder
        raise NotImplementedError(f"sakura build supports image-level models (sakura-mini, flux2-mini) only so far, "
                                  f"not {model_name!r}")
    size = model.cfg.image_size
    model_fp = model.fingerprint()
    calib = heldout_photos(size)[:calibration]
    if calib.shape[0] < 1:
        raise ValueError("need at least one calibration photo")
    names_in = list(templates) if templates else default_templates()
    tpls = [get_template(n, size) for n in names_in]  # unknown names fail before any work
    out = []
    for name, tpl in zip(names_in, tpls):
        t0 = time.perf_counter()
        kv = model.extract_template_kv(tpl.image[None], tpl.instruction).to(torch.float16)
        imp = template_importance(model, kv, calib, steps=steps, seed=seed)  # (layers, tokens)
        L = kv.num_layers
        shards = [Shard(l.key, l.value, importance=imp[i], layer=i, num_layers=L) for i, l in enumerate(kv.layers)]
        ident = lambda i: ShardId(model_fp, kv.template_fingerprint, i)  # noqa: E731
        with StoreWriter(store, model_fingerprint=model_fp, template_id=name) as w:
            # One tensor, no metadata: safetensors orders a metadata map nondeterministically,
            # which would break idempotent rebuilds. Instruction etc. live in kv_layout.
            ref = st_save({"image": tpl.image.contiguous().to(torch.float32)})  # (3, S, S) in [0, 1]
            w.set_template_ref(ref, media_type=TEMPLATE_REF_MEDIA_TYPE)
            encoded: list[list[RenditionInput]] = [[] for _ in shards]
            for rname, codec in zip(names, codecs):
                tables = codec.fit_tables(shards) if codec.uses_tables else None
                table_names: tuple[str, ...] = ()
                if tables is not None:
                    w.add_table(rname, codec=codec.name, data=tables.to_bytes(ShardId(model_fp, kv.template_fingerprint, -1)),
                                params=dict(codec.params))
                    table_names = (rname,)
                for i, s in enumerate(shards):
                    data = codec.encode(s, ident(i), tables)
                    # A layered codec's object holds every rung; rung l is the prefix ends[l]
                    # (one object in the store, one Range per rung). Others: one whole object.
                    ends = codec.level_ends(data) if hasattr(codec, "level_ends") else [None]
                    for rung, end in enumerate(ends):
                        d = codec.describe(s, data if end is None else data[:end], ident(i), tables)
                        encoded[i].append(RenditionInput(
                            name=rname if end is None else f"{rname}#{rung}", codec=codec.name, data=data,
                            params=_jsonable(codec.params), prefix_bytes=end, tables=table_names,
                            distortion={"expected": d.expected_distortion, "weighted_rel_err": d.weighted_rel_err,
                                        "key_rel_err": d.key_rel_err, "value_rel_err": d.value_rel_err,
                                        "dropped_fraction": 1.0 - d.keep_fraction}))
            for i, s in enumerate(shards):
                w.add_shard(layer=i, tokens=(0, kv.num_tokens), fp16_bytes=s.fp16_bytes, renditions=encoded[i])
            w.set_kv_layout({"layers": L, "tokens": kv.num_tokens, "heads": kv.heads, "head_dim": kv.head_dim,
                             "dtype": "float16", "template_fingerprint": kv.template_fingerprint,
                             "layout": _jsonable(kv.layout), "instruction": tpl.instruction})
        out.append(w._committed)  # set by commit() on leaving the block
        total = sum({hashlib.sha256(r.data).digest(): len(r.data) for rs in encoded for r in rs}.values())
        fp16 = sum(s.fp16_bytes for s in shards)
        log(f"{name}: {L} shards x {len(encoded[0])} renditions, ladder {total / 1e6:.2f} MB vs fp16 "
            f"{fp16 / 1e6:.2f} MB ({time.perf_counter() - t0:.1f} s)")
    return out


def _jsonable(d: Any) -> Any:
    import json

    return json.loads(json.dumps(d, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))
