"""`sakura bench build-quality`: this checkout's build against another's, on photos no calibration used.

Both checkouts build the same templates into fresh stores (each in its own process, its own
defaults: `build_speed._run_variant`). Then, in this process, for each template and rung (every
shard at that rung, e.g. ``progressive#0``), the held-out photos are edited with the KV decoded
from each store and compared with the edit from the lossless fp16 KV (captured from the store's
template reference, as the phone would): PSNR new vs old, and the rung's bytes (all shards) new vs
old. Rungs are matched by name; a rung one store lacks gets null on that side.

Photos: ``--photos DIR`` (every .png/.jpg/.jpeg in it, centre-cropped and resized to the model's
size), default the held-out crops of `sakura.cloud.tasks.photos.heldout_photos` (sources the
calibration never uses).

    sakura bench build-quality --baseline-src /tmp/base/src [--photos DIR] --out out/build_quality
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Callable, Sequence
import statistics
from PIL import Image
import numpy as np
import torch
from sakura.bench.build_speed import _run_variant
from sakura.cloud.tasks.photos import heldout_photos
from sakura.codec import CodecTables, ShardId, get_codec
from sakura.models import load_model
from sakura.models.kv import TemplateKV
from sakura.util.fsutil import atomic_write
from sakura.util.psnr import psnr_db
from sakura.wire.store.store import Store
from sakura.wire.store.template_ref import decode_template_ref, split_template_images
from sakura.bench.harness import get_logger

_LOG = get_logger(__name__)

DEFAULT_TEMPLATES = ("look-00", "texture-00", "sticker-00")


def load_photos(folder: Path, size: int):
    """Every image file of `folder` (sorted by name) as (N, 3, size, size) in [0, 1]: the
    largest centred square, resized (antialiased)."""
    files = sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg"))
    if not files:
        raise ValueError(f"no .png/.jpg photos in {folder}")
    out = []
    for f in files:
        im = Image.open(f).convert("RGB")
        s = min(im.size)
        left, top = (im.size[0] - s) // 2, (im.size[1] - s) // 2
        im = im.crop((left, top, left + s, top + s)).resize((size, size), Image.LANCZOS)
        out.append(torch.from_numpy(np.asarray(im, dtype=np.float32) / 255.0).permute(2, 0, 1))
    return torch.stack(out)


def rung_edits(model, store: Path, photos, steps: int) -> dict[str, dict[str, dict]]:
    """{template: {rung: {"psnr_db", "bytes"}}} of every manifest in `store`: the photos edited with
    every shard at that rung vs with the lossless KV."""
    st = Store(store)
    out: dict[str, dict[str, dict]] = {}
    for fp, tid in st.manifest_keys():
        m = st.get_manifest(fp, tid)
        images = split_template_images(decode_template_ref(st.get_object(m.template_ref.object)))
        lossless = model.extract_template_kv(images, m.kv_layout["instruction"]).to(torch.float16)
        want = model.edit(photos, template_kv=lossless, steps=steps).image.double()
        tfp = m.kv_layout["template_fingerprint"]
        tables = {t.name: CodecTables.from_bytes(st.get_object(t.object), ShardId(fp, tfp, -1)) for t in m.tables}
        rows = {}
        for r0 in m.shards[0].renditions:
            layers, nbytes = [], 0
            for i, s in enumerate(m.shards):
                r = s.rendition(r0.name)
                data = st.get_rendition(r)
                nbytes += len(data)
                codec = get_codec(r.codec, **r.params) if not r.tables else get_codec(r.codec)
                layers.append(codec.decode(data, ShardId(fp, tfp, i), tables[r.tables[0]] if r.tables else None)
                              .for_attention())
            kv = TemplateKV(layers, lossless.model_fingerprint, lossless.template_fingerprint, lossless.layout,
                            lossless.positions)
            got = model.edit(photos, template_kv=kv, steps=steps).image.double()
            rows[r0.name] = {"psnr_db": psnr_db(float((got - want).pow(2).mean())), "bytes": nbytes}
        out[tid] = rows
    return out


def run(*, baseline_src: Path, photos_dir: Path | None = None, out: Path | None = None,
        templates: Sequence[str] = DEFAULT_TEMPLATES, steps: int = 4, log: Callable[[str], None] | None = None) -> dict:
    """Build with both checkouts, edit the photos from both stores; writes ``build_quality.json``
    (``rows``: one per template and rung) in `out` and returns it."""
    log = log or _LOG.info  # the module's logger unless the caller gives a sink
    model = load_model("sakura-mini", device="cpu")
    size = int(model.cfg.image_size)
    photos = load_photos(photos_dir, size) if photos_dir is not None else heldout_photos(size, n_per_source=2)
    here = Path(__file__).resolve().parents[2]
    res: dict = {"templates": list(templates), "photos": str(photos_dir) if photos_dir else "heldout_photos(n_per_source=2)",
                 "n_photos": int(photos.shape[0]), "steps": steps, "baseline_src": str(baseline_src)}
    with tempfile.TemporaryDirectory(prefix="build-quality-") as tmp:
        figs = {}
        for name, src in (("new", here), ("old", Path(baseline_src).resolve())):
            log(f"building with {name} ({src})")
            store = Path(tmp) / name
            figs[name] = _run_variant(src, store, templates, None, "cpu")
            figs[name]["edits"] = rung_edits(model, store, photos, steps)
    rows = []
    for t in templates:
        new, old = figs["new"]["edits"].get(t, {}), figs["old"]["edits"].get(t, {})
        for rung in sorted(set(new) | set(old)):
            n, o = new.get(rung), old.get(rung)
            rows.append({"template": t, "rung": rung, "psnr_new_db": n and n["psnr_db"], "psnr_old_db": o and o["psnr_db"],
                         "bytes_new": n and n["bytes"], "bytes_old": o and o["bytes"]})
    both = [r for r in rows if r["psnr_new_db"] is not None and r["psnr_old_db"] is not None]
    d_psnr = [r["psnr_new_db"] - r["psnr_old_db"] for r in both]
    res["rows"] = rows
    res["summary"] = {
        "rungs_compared": len(both),
        "median_psnr_change_db": statistics.median(d_psnr) if d_psnr else None,
        "worst_psnr_change_db": min(d_psnr) if d_psnr else None,
        "bytes_new_total": sum(r["bytes_new"] for r in both), "bytes_old_total": sum(r["bytes_old"] for r in both),
        "bytes_change": (sum(r["bytes_new"] for r in both) / max(1, sum(r["bytes_old"] for r in both)) - 1.0),
        "rungs_only_new": [f"{r['template']} {r['rung']}" for r in rows if r["psnr_old_db"] is None],
        "rungs_only_old": [f"{r['template']} {r['rung']}" for r in rows if r["psnr_new_db"] is None],
        "build_cpu_s": {k: round(v["cpu_s"], 2) for k, v in figs.items()},
    }
    for r in rows:
        log(f"{r['template']:>11} {r['rung']:<28} PSNR new {_f(r['psnr_new_db'])} old {_f(r['psnr_old_db'])} dB  "
            f"bytes new {r['bytes_new']} old {r['bytes_old']}")
    log(json.dumps(res["summary"], indent=1))
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        atomic_write(Path(out) / "build_quality.json", (json.dumps(res, indent=1) + "\n").encode())
    return res


def _f(x: float | None) -> str:
    return "   -  " if x is None else f"{x:6.2f}"


#: scikit-image sample images that no calibration, training or held-out list of sakura uses
UNSEEN_SKIMAGE = ("color.png", "logo.png", "cell.png", "microaneurysms.png", "phantom.png", "chessboard_RGB.png")


def write_unseen_photos(folder: Path, size: int = 64, seed: int = 7) -> list[Path]:
    """Photos of our own for ``--photos``: a random square crop of each `UNSEEN_SKIMAGE` image (none
    is in `sakura.cloud.tasks.photos`' lists) and three synthesized ones (smooth colour fields with
    discs and bars), ``size`` px PNGs in `folder`. -> the paths."""
    import skimage  # lazy: skimage ([build] extra)

    rng = np.random.default_rng(seed)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    data = Path(skimage.__file__).parent / "data"
    for name in UNSEEN_SKIMAGE:
        im = Image.open(data / name).convert("RGB")
        s = int(min(im.size) * rng.uniform(0.4, 0.8))
        x, y = int(rng.integers(0, im.size[0] - s + 1)), int(rng.integers(0, im.size[1] - s + 1))
        p = folder / f"crop-{Path(name).stem}.png"
        im.crop((x, y, x + s, y + s)).resize((size, size), Image.LANCZOS).save(p)
        out.append(p)
    yy, xx = np.mgrid[0:size, 0:size] / size
    for k in range(3):
        img = np.stack([0.5 + 0.4 * np.sin(2 * np.pi * (rng.uniform(0.5, 2) * xx + rng.uniform(0.5, 2) * yy + rng.uniform()))
                        for _ in range(3)], -1)
        for _ in range(4):
            cx, cy, r = rng.uniform(0.1, 0.9), rng.uniform(0.1, 0.9), rng.uniform(0.05, 0.2)
            img[(xx - cx) ** 2 + (yy - cy) ** 2 < r * r] = rng.uniform(0, 1, 3)
        img[:, int(rng.uniform(0.2, 0.8) * size):][:, :3] = rng.uniform(0, 1, 3)
        p = folder / f"synth-{k}.png"
        Image.fromarray((np.clip(img, 0, 1) * 255).astype(np.uint8)).save(p)
        out.append(p)
    return out
