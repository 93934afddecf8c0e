"""`sakura edit`: the phone-side command (photo file in, edited image out, KV streamed)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Callable


def load_photo(path: Path, size: int):
    """A photo file as (1, 3, size, size) float in [0, 1]: centre crop, anti-aliased resize."""
    import numpy as np
    import torch
    from skimage import io
    from skimage.transform import resize

    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such photo")
    try:
        img = io.imread(str(path))
    except Exception as e:  # imageio raises many types for unreadable files
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{path}: not a readable image ({first[:120]})") from None
    if img.ndim == 2:
        img = np.stack([img] * 3, -1)
    img = img[..., :3].astype(np.float32)
    if img.max() > 1.0:
        img /= 255.0
    h, w = img.shape[:2]
    s = min(h, w)
    img = img[(h - s) // 2:(h - s) // 2 + s, (w - s) // 2:(w - s) // 2 + s]
    img = resize(img, (size, size), anti_aliasing=True)
    return torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)[None].float().clamp(0, 1)


def edit_command(*, photo: Path, server: str, template: str | None, out: Path, policy: str, steps: int, seed: int,
                 prior_mbps: float, model_name: str = "sakura-mini", gallery_dir: Path | None = None,
                 decode_workers: int | None = None, echo: Callable[[str], None] = print) -> None:
    """Edit `photo` with `template`, streaming what pays from `server` and computing the rest.

    The manifest and template image are fetched first and kept in the phone's gallery
    (`sakura.runtime.gallery`); with the server down, a template seen before still edits, on the
    device. Raises ValueError / FileNotFoundError with a one-line reason for bad input."""
    from sakura.client import TemplateClient
    from sakura.demo import _save_grid
    from sakura.models import load_model
    from sakura.runtime import BandwidthEstimator, FixedPolicy, MeetInMiddlePolicy, SakuraPolicy
    from sakura.runtime.gallery import Gallery, decode_template_ref
    from sakura.runtime.live import NO_MANIFEST, _short, profile_model, streamed_edit

    policies = {"sakura": SakuraPolicy, "sakura-meet": MeetInMiddlePolicy,
                "raw-stream": lambda: FixedPolicy("lossless", name="raw-stream")}
    if policy not in policies:
        raise ValueError(f"policy must be one of {sorted(policies)}, got {policy!r}")
    from urllib.parse import urlsplit

    if urlsplit(server).scheme not in ("http", "https") or not urlsplit(server).hostname:
        raise ValueError(f"--server must be http(s)://host[:port], got {server!r}")
    model = load_model(model_name)
    img = load_photo(photo, model.cfg.image_size)
    gallery = Gallery(gallery_dir)
    fp = model.fingerprint()
    _check_template_offered(server, fp, template, model_name)

    async def refresh():  # what a gallery screen fetches: manifest + template image
        async with TemplateClient(server, connect_timeout=2.0, read_timeout=5.0, max_retries=1) as c:
            m = await c.get_manifest(fp, template)
            ref = await c.fetch_object(m.template_ref.object)
            return m, ref.data

    manifest, timage = None, None
    try:
        manifest, ref = asyncio.run(refresh())
        gallery.put(fp, template, manifest.to_bytes(), ref, manifest.template_ref.media_type)
        timage = decode_template_ref(ref, manifest.template_ref.media_type)
    except Exception as e:
        manifest, timage = gallery.manifest(fp, template), gallery.template_image(fp, template)
        if timage is None:
            raise ValueError(f"cannot get template {template!r} from {server} ({_short(e)}), and it is not in the "
                             f"gallery at {gallery.root}") from None
        echo(f"server unavailable ({_short(e, 100)}); using the gallery's copy of {template}")
    # a task's instruction id (bundled models) or the prompt (Klein); the model checks its kind
    instruction = manifest.kv_layout.get("instruction", 0) if manifest is not None else 0
    if manifest is None:
        echo("no manifest cached: computing the template on the device")
    prof = profile_model(model, repeats=1)
    if decode_workers:
        prof.decode_workers = decode_workers
    from sakura.store.build import split_template_images

    res = streamed_edit(model, img, base_url=server, template_id=template,
                        template_image=split_template_images(timage),  # (R, 3, S, S): R reference images
                        instruction=instruction, policy=policies[policy](), profile=prof,
                        bandwidth=BandwidthEstimator(prior_bps=prior_mbps * 1e6 / 8), steps=steps, seed=seed,
                        manifest=manifest if manifest is not None else NO_MANIFEST, allow_fast_path=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    from skimage import io as skio

    skio.imsave(str(out), (res.image[0].permute(1, 2, 0).numpy() * 255).round().astype("uint8"), check_contrast=False)
    side = out.with_name(out.stem + ".compare.png")
    _save_grid(side, [img, split_template_images(timage)[:1], res.image], ["photo", "template", "edit"])
    b = res.breakdown()
    echo(f"edited in {1000 * b['latency_s']:.0f} ms ({res.path}): {int(b['bytes'])} B fetched, "
         f"{int(b['local_shards'])} of {len(res.records)} layers computed on the device, stall {1000 * b['stall_s']:.0f} ms")
    echo("layers: " + ", ".join(f"{r.index}:{r.source}" for r in res.records))
    if res.path == "streamed":
        q = f"{res.implied_psnr_db:.1f} dB" if res.quality_known else "unknown (manifest has no image distortions)"
        echo(f"image PSNR vs the lossless-KV edit implied by the renditions used: {q}")
    for e in res.events:
        echo("event: " + e)
    echo(f"wrote {out} and {side}")



def _check_template_offered(server: str, fp: str, template: str | None, model_name: str) -> None:
    """A missing or unknown --template: raise ValueError with what the server offers for this model.
    A server that cannot be reached is left to the edit (the gallery may have the template)."""
    from sakura.runtime.discovery import format_templates, list_templates

    try:
        offered = list_templates(server, fp, timeout_s=3.0)
    except Exception as e:
        if template is None:
            raise ValueError(f"--template is required, and {server} cannot list its templates ({str(e)[:120]})") from None
        return
    if template is not None and any(t.template_id == template for t in offered):
        return
    head = "--template is required" if template is None else f"{server} offers no template {template!r} for {model_name}"
    raise ValueError(f"{head}; it offers {len(offered)} for this model:\n{format_templates(offered)}")
