"""Per-shard renditions on both bundled models (`sakura bench both-models`): bits/value, the image
PSNR of an edit with ONE shard replaced by the rendition, and the decode rate, per template.

Built on `sakura.bench.profile.measure_ladder` (a store with the default ladder, lossless and both
CacheGen variants per template; public calibration photos). Writes both_models.json/.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Sequence
from sakura.util.fsutil import write_json
from sakura.bench.profile import measure_ladder
from sakura.util.psnr import psnr_db

from sakura.bench.harness import get_logger, markdown_table, publish

log = get_logger(__name__)

MODELS = ("sakura-mini", "flux2-mini")
TEMPLATES = ("look-00", "texture-00", "sticker-00")

HEADER = ("Per-shard renditions on both trained models (`sakura bench both-models`, built on "
          "`sakura.bench.profile.measure_ladder`), training templates `*-00`, public calibration photos; image "
          "PSNR = the edit with ONE shard replaced by the rendition vs the lossless-KV edit, mean over the model's "
          "6 shards (so it is far above an all-shards figure); bits/value count every byte of the object; decode = "
          "fp16 MB per CPU-second on a Klein-sized layer.")


def run(out_dir: Path, models: Sequence[str] = MODELS, templates: Sequence[str] = TEMPLATES) -> dict:
    """Measure every (model, template) ladder; write out_dir/both_models.json and .md; return the JSON."""

    out: dict[str, dict] = {}
    rows = []
    for model in models:
        for tpl in templates:
            lad = measure_ladder(model, tpl)
            out[f"{model}/{tpl}"] = lad
            for name, r in lad["renditions"].items():
                if name.endswith("delta=true"):  # the delta variant is weaker here (docs/codec.md)
                    continue
                p = psnr_db(r["image_mse"])
                rows.append([model, tpl, f"`{name}`", f"{r['bits_per_value']:.2f}", "inf" if math.isinf(p) else f"{p:.1f}",
                             f"{r['decode_fp16_bytes_per_cpu_s'] / 1e6:.0f}"])
            log.info(f"{model} {tpl} done")
    md = HEADER + "\n\n" + markdown_table(["model", "template", "rendition", "bits/value", "one-shard image PSNR (dB)",
                                            "decode MB/s"], rows, align="lllrrr")
    publish(out_dir, "both_models", json.loads(json.dumps(out, default=float)), md)
    lines = md.splitlines()
    log.info("\n".join(lines))
    return out
