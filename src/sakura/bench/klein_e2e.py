"""Tiny FLUX.2 Klein end to end, as a user would run it (`sakura bench klein-e2e`, docs/model-flux2/klein.md).

A complete tiny Klein KV pipeline (random weights; `sakura.models.flux.klein_tiny`) written with
save_pretrained; a templates.toml with two templates of one's own images + prompts (one with two
reference images); `sakura build --library` (lossless + progressive ladder); the store served on
127.0.0.1; a streamed edit through the live runtime at every rendition, against the on-device edit.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Callable
from sakura.util.fsutil import write_json
import shutil
import torch
from PIL import Image, ImageDraw
from sakura.cloud.builder.pipeline import build_store
from sakura.cloud.builder.template_files import load_library_file
from sakura.cloud.capture import calibration_photos
from sakura.cloud.tasks.quality import psnr_per_image
from sakura.models import load_model
from sakura.models.flux.klein_tiny import write_tiny_klein_folder
from sakura.phone import BandwidthEstimator, FixedPolicy, RttEstimator
from sakura.phone.live import DeviceProfile, streamed_edit
from sakura.wire.server import serve_in_thread
from sakura.wire.store.store import Store
from sakura.wire.store.template_ref import decode_template_ref, split_template_images

from sakura.bench.harness import get_logger

log = get_logger(__name__)

TEMPLATES_TOML = ('[[template]]\nid = "sun"\nimages = ["sun.png"]\nprompt = "add a sun"\n\n'
                  '[[template]]\nid = "sun-and-moon"\nimages = ["sun.png", "moon.png"]\n'
                  'prompt = "add the sun and the moon"\n')


def run(out: Path | None = None, size: int = 32, steps: int = 4) -> dict:
    """Build, serve and stream-edit both templates at `size` px; returns (and writes to `out`) per
    template its bytes and per rendition: bit-exact with on-device?, PSNR vs on-device, bytes fetched."""



    work = Path(tempfile.mkdtemp(prefix="klein-e2e-"))
    try:
        folder = write_tiny_klein_folder(work / "klein")
        for name, colour in (("sun.png", (255, 200, 0)), ("moon.png", (200, 200, 255))):
            im = Image.new("RGB", (120, 100), (20, 60, 160))
            ImageDraw.Draw(im).ellipse((30, 20, 90, 80), fill=colour)
            im.save(work / name)
        (work / "templates.toml").write_text(TEMPLATES_TOML)
        model_name = f"klein:{folder}@{size}"
        store = work / "store"
        t = time.perf_counter()
        build_store(store, model_name=model_name, templates=load_library_file(work / "templates.toml"),
                    ladder=("lossless", "progressive"), calibration=2, steps=steps)
        build_s = time.perf_counter() - t
        model = load_model(model_name)
        st = Store(store)
        stats = {s.template_id: s for s in st.stats().templates}
        photo = calibration_photos(size, 1)
        res = {"image_size": size, "tokens_per_image": model.cfg.tokens_per_image, "layers": model.num_layers,
               "build_s_both_templates": round(build_s, 2), "load_avg_1min": os.getloadavg()[0], "templates": {}}
        with serve_in_thread(store) as url:
            for fp, tid in st.manifest_keys():
                m = st.get_manifest(fp, tid)
                images = split_template_images(decode_template_ref(st.get_object(m.template_ref.object)))
                local = model.extract_template_kv(images, m.kv_layout["instruction"]).to(torch.float16)
                want = model.edit(photo, template_kv=local, steps=steps).image
                rows = {}
                for r in m.shards[0].renditions:
                    got = streamed_edit(model, photo, base_url=url, template_id=tid, template_image=images,
                                        instruction=m.kv_layout["instruction"], policy=FixedPolicy(r.name),
                                        profile=DeviceProfile(compute_s=0.002, local_s=0.05),
                                        bandwidth=BandwidthEstimator(prior_bps=1e9), rtt=RttEstimator(prior_s=0.001),
                                        steps=steps, manifest=m, allow_fast_path=False)
                    rec = sum(s.rendition(r.name).distortion["image_mse"] for s in m.shards)
                    rows[r.name] = {"bit_exact_with_on_device": bool(torch.equal(got.image, want)),
                                    "psnr_vs_on_device_db": float(psnr_per_image(got.image, want).clamp(max=200)),
                                    "bytes_fetched": got.bytes_fetched, "sum_recorded_image_mse": rec,
                                    "mse_vs_on_device": float((got.image.double() - want.double()).pow(2).mean())}
                s = stats[tid]
                res["templates"][tid] = {"references": int(images.shape[0]), "prompt": m.kv_layout["instruction"],
                                         "fp16_kv_bytes": s.fp16_bytes, "whole_bytes": s.whole_bytes,
                                         "ladder_bytes": s.ladder_bytes, "template_png_bytes": s.template_ref_bytes,
                                         "manifest_bytes": s.manifest_bytes, "rungs": rows}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.info(json.dumps(res, indent=1))
    if out is not None:
        write_json(Path(out), res, indent=1)
    return res
