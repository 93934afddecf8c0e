"""Importance on vs off (`sakura bench importance`): the nested `layered` ladder and the plain ECSQ
`sakura` rendition, each with no importance, attention mass or gradient sensitivity, on the
trained sakura-mini's first held-out template per task (docs/codec.md, "Importance on the nested
ladder"). Per rung: bytes of all shards (tables not counted) and the image PSNR vs the
lossless-KV edit on held-out photos.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable, Sequence

from sakura.cloud.tasks import TASK_NAMES
import torch
from sakura.cloud.capture import calibration_photos, template_importance, token_sensitivity
from sakura.cloud.tasks import heldout_photos, library_templates
from sakura.cloud.tasks.quality import psnr_per_image
from sakura.codec import ShardId, ShardKV, codec_from_spec
from sakura.models import LayerKV, load_model

from sakura.bench.harness import get_logger

log = get_logger(__name__)

SPECS = ("layered:budgets=[1.0,2.0,3.0]", 'sakura:budget=1.0,quantiser="ecsq"')
SOURCES = ("none", "attention", "sensitivity")


def run(out: Path | None = None, tasks: Sequence[str] = TASK_NAMES, photos: int = 6, calibration: int = 2,
        steps: int = 8, model_name: str = "sakura-mini") -> list[dict]:
    """One row per (task, importance source, codec spec): [(bytes, PSNR dB) per rung]; written as
    text (one row a line, as docs/codec/importance_nested.txt) to `out` if given."""


    m = load_model(model_name)
    size = m.cfg.image_size
    cal = calibration_photos(size, calibration)
    test = heldout_photos(size, n_per_source=2)[:photos]
    rows = []
    for task in tasks:
        tpl = library_templates(size, task=task, held_out=True)[0]
        kv = m.extract_template_kv(tpl.image[None], tpl.instruction).to(torch.float16)
        L = kv.num_layers

        def edit(layers):
            return m.edit(test, template_kv=dataclasses.replace(kv, layers=layers), steps=steps).image

        ref = edit(list(kv.layers))
        tok = token_sensitivity(m, kv, cal, steps=steps)
        att = template_importance(m, kv, cal, steps=steps)
        imps = {"none": [None] * L, "attention": [att[i] for i in range(L)],
                "sensitivity": [tok[i] for i in range(L)]}
        for source in SOURCES:
            for spec in SPECS:
                c = codec_from_spec(spec)
                shards = [ShardKV(lk.key, lk.value, importance=imps[source][i], layer=i, num_layers=L)
                          for i, lk in enumerate(kv.layers)]
                tables = c.fit_tables(shards)
                ids = [ShardId("m", "t", i) for i in range(L)]
                data = [c.encode(s, i, tables) for s, i in zip(shards, ids)]
                ends = [c.level_ends(d) if c.supports_layers else [len(d)] for d in data]
                rungs = []
                for r in range(len(ends[0])):
                    decs = [c.decode(d[:e[r]], i, tables) for d, e, i in zip(data, ends, ids)]
                    img = edit([d.for_attention() for d in decs])
                    rungs.append((sum(e[r] for e in ends), round(float(psnr_per_image(img, ref).mean()), 1)))
                row = {"task": task, "importance": source, "spec": spec, "rungs": rungs}
                rows.append(row)
                log.info(f"{task} {source} {spec} {rungs}")
    if out is not None:
        head = (f"# sakura bench importance  ({model_name}, first held-out template per task, {photos} held-out photos, "
                f"{steps} steps)\n# task, importance source, codec spec, [(bytes of all shards without tables, image "
                "PSNR vs lossless-KV output dB) per rung]\n")
        Path(out).write_text(head + "".join(f"{r['task']} {r['importance']} {r['spec']} {json.dumps(r['rungs'])}\n"
                                            for r in rows))
    return rows
