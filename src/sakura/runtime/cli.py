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
        raise ValueError(f"{path}: not a readable image ({e})") from None
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


def edit_command(*, photo: Path, server: str, template: str, out: Path, policy: str, steps: int, seed: int,
                 prior_mbps: float, echo: Callable[[str], None] = print) -> None:
    from sakura.client import TemplateClient
    from sakura.demo import _save_grid
    from sakura.models import load_model
    from sakura.runtime import BandwidthEstimator
    from sakura.store.build import decode_template_ref
    from sakura.runtime.stream import FixedPolicy, MPCPolicy, profile_model, streamed_edit

    model = load_model("sakura-mini")
    img = load_photo(photo, model.cfg.image_size)
    policies = {"sakura": MPCPolicy(), "raw-stream": FixedPolicy("lossless", name="raw-stream")}
    if policy not in policies:
        raise ValueError(f"policy must be one of {sorted(policies)}, got {policy!r}")

    async def gallery():  # what the template gallery already holds: manifest + template image
        async with TemplateClient(server) as c:
            m = await c.fetch_manifest(model.fingerprint(), template)
            ref = await c.fetch_object(m.template_ref.object)
            return m, decode_template_ref(ref.data, m.template_ref.media_type)

    manifest, timage = asyncio.run(gallery())
    instruction = int(manifest.kv_layout.get("instruction", 0))
    res = streamed_edit(model, img, base_url=server, template_id=template, template_image=timage[None],
                        instruction=instruction, policy=policies[policy], profile=profile_model(model),
                        estimator=BandwidthEstimator(prior_bps=prior_mbps * 1e6 / 8), steps=steps, seed=seed,
                        manifest=manifest)
    out.parent.mkdir(parents=True, exist_ok=True)
    from skimage import io as skio

    skio.imsave(str(out), (res.image[0].permute(1, 2, 0).numpy() * 255).round().astype("uint8"), check_contrast=False)
    side = out.with_name(out.stem + ".compare.png")
    _save_grid(side, [img, timage[None], res.image], ["photo", "template", "edit"])
    b = res.breakdown()
    echo(f"edited in {1000 * b['latency_s']:.0f} ms: {int(b['bytes'])} B fetched, {int(b['local_shards'])} of "
         f"{len(res.records)} shards computed locally, stall {1000 * b['stall_s']:.0f} ms")
    echo("choices: " + ", ".join(r.choice for r in res.records))
    echo(f"wrote {out} and {side}")
