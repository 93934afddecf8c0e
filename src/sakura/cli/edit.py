"""`sakura edit`: the phone-side command (photo file in, edited image out, KV streamed)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Callable


#: File types `sakura edit --out` can write (by suffix).
OUT_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")


def check_out_path(out: Path) -> None:
    """Raise ValueError (one line) unless `out` and its ``.compare.png`` beside it can be written:
    checked before the edit runs. The nearest existing ancestor must be a directory we can write
    in (probed with a temporary file, so read-only mounts are caught too)."""
    import os
    import tempfile

    out = Path(out)
    if out.suffix.lower() not in OUT_SUFFIXES:
        raise ValueError(f"--out {out}: must end in one of {', '.join(OUT_SUFFIXES)}")
    for p in (out, out.with_name(out.stem + ".compare.png")):
        if p.is_dir():
            raise ValueError(f"--out {out}: {p} is a directory")
        if p.exists() and not os.access(p, os.W_OK):
            raise ValueError(f"--out {out}: {p} exists and is not writable")
    anc = out.absolute().parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        raise ValueError(f"--out {out}: {anc} is a file, not a directory")
    try:
        with tempfile.TemporaryFile(dir=anc):
            pass
    except OSError as e:
        raise ValueError(f"--out {out}: cannot write in {anc} ({e.strerror or type(e).__name__})") from None


def refresh_failure(e: BaseException, template: str) -> str:
    """One line saying why the gallery refresh failed, by kind: a corrupt manifest or template
    image is not "server unavailable"."""
    from sakura.wire.client import DeadlineExceeded, IntegrityError, NotFound, RedirectRefused, WrongManifest
    from sakura.phone.limits import LimitError
    from sakura.phone.live import _short
    from sakura.wire.store.manifest import ManifestError

    # (kind, line, add the exception's text): the first kind that matches says it; order matters
    # (ManifestError and LimitError are ValueErrors, which alone mean a bad template image)
    kinds: tuple[tuple[type[BaseException], str, bool], ...] = (
        (WrongManifest, "server's manifest for {t} is for another model or template", True),
        (ManifestError, "server sent a corrupt manifest for {t}", True),
        (LimitError, "server's manifest for {t} is over this model's limits", True),
        (NotFound, "server has no template {t}", False),
        (IntegrityError, "server sent damaged bytes for {t}", True),
        (DeadlineExceeded, "server too slow", True),
        (RedirectRefused, "server redirected elsewhere", True),
        (ValueError, "server's template image for {t} is unusable", True),  # decode_template_ref
    )
    for kind, says, with_why in kinds:
        if isinstance(e, kind):
            line = says.format(t=template)
            return f"{line} ({_short(e, 100)})" if with_why else line
    # the root cause (connection refused, DNS, reset) says more than the retry wrapper, whose
    # message starts with the 64-hex template fingerprint
    cause = e.__cause__ or e
    return f"server unavailable ({_short(cause, 140)})"


def edit_command(*, photo: Path, server: str, template: str | None, out: Path, policy: str, steps: int, seed: int,
                 prior_mbps: float, model_name: str = "sakura-mini", gallery_dir: Path | None = None,
                 decode_workers: int | None = None, echo: Callable[[str], None] = print,
                 accept_new_template: bool = False) -> None:
    """Edit `photo` with `template`, streaming what pays from `server` and computing the rest.

    The manifest and template image are fetched first and kept in the phone's gallery
    (`sakura.phone.gallery`); with the server down, a template seen before still edits, on the
    device. Raises ValueError / FileNotFoundError with a one-line reason for bad input."""
    from sakura.wire.client import TemplateClient
    from sakura.util.figures import save_grid
    from sakura.models import load_model
    from sakura.phone import BandwidthEstimator, FixedPolicy, MeetInMiddlePolicy, SakuraPolicy
    from sakura.phone.gallery import Gallery, decode_template_ref
    from sakura.phone.limits import MANIFEST_DEADLINE_BYTES, check_template_ref, step_deadline_s
    from sakura.phone.live import NO_MANIFEST, profile_model, streamed_edit
    from sakura.phone.discovery import TemplateNotOffered, offered_manifest
    from sakura.phone.photo import load_photo

    policies = {"sakura": SakuraPolicy, "sakura-meet": MeetInMiddlePolicy,
                "raw-stream": lambda: FixedPolicy("lossless", name="raw-stream")}
    if policy not in policies:
        raise ValueError(f"policy must be one of {sorted(policies)}, got {policy!r}")
    from urllib.parse import urlsplit

    if urlsplit(server).scheme not in ("http", "https") or not urlsplit(server).hostname:
        raise ValueError(f"--server must be http(s)://host[:port], got {server!r}")
    check_out_path(out)  # before any work: a bad --out used to fail only after the whole edit
    model = load_model(model_name)
    img = load_photo(photo, model.cfg.image_size)
    gallery = Gallery(gallery_dir, accept_new=accept_new_template)
    fp = model.fingerprint()
    size = model.cfg.image_size
    rate_bps = max(prior_mbps, 0.01) * 1e6 / 8

    async def refresh():  # what a gallery screen fetches: manifest + template image, each under a deadline
        async with TemplateClient(server, connect_timeout=2.0, read_timeout=5.0, max_retries=1) as c:
            # the one manifest this edit needs, by id (no --template / a 404: TemplateNotOffered, listing)
            m = await offered_manifest(c, fp, template, model_name,
                                       deadline_s=step_deadline_s(MANIFEST_DEADLINE_BYTES, rate_bps))
            check_template_ref(m, size)  # before a byte of it is buffered
            ref = await c.fetch_object(m.template_ref.object,
                                       deadline_s=step_deadline_s(m.template_ref.object.bytes, rate_bps))
            return m, ref.data

    manifest, timage, why = None, None, None
    try:
        manifest, ref = asyncio.run(refresh())
        timage = decode_template_ref(ref, manifest.template_ref.media_type, image_size=size)
    except TemplateNotOffered:
        raise
    except Exception as e:  # any failure here falls back to the gallery; the message says which kind
        manifest, why = None, refresh_failure(e, template)
    if manifest is not None:
        try:
            gallery.put(fp, template, manifest.to_bytes(), ref, manifest.template_ref.media_type)
        except OSError as e:  # the server delivered: edit anyway, say the copy was not kept
            echo(f"warning: gallery at {gallery.root} is not writable ({e.strerror or type(e).__name__}); "
                 f"editing without caching {template}")
    else:
        manifest, timage = gallery.manifest(fp, template), gallery.template_image(fp, template, image_size=size)
        if timage is None:
            raise ValueError(f"cannot get template {template!r} from {server}: {why}; and it is not in the "
                             f"gallery at {gallery.root}")
        echo(f"{why}; using the gallery's copy of {template}")
    # a task's instruction id (bundled models) or the prompt (Klein); the model checks its kind
    instruction = manifest.kv_layout.get("instruction", 0) if manifest is not None else 0
    if manifest is None:
        echo("no manifest cached: computing the template on the device")
    prof = profile_model(model, repeats=1)
    if decode_workers:
        prof.decode_workers = decode_workers
    from sakura.wire.store.template_ref import split_template_images

    res = streamed_edit(model, img, base_url=server, template_id=template,
                        template_image=split_template_images(timage),  # (R, 3, S, S): R reference images
                        instruction=instruction, policy=policies[policy](), profile=prof,
                        bandwidth=BandwidthEstimator(prior_bps=prior_mbps * 1e6 / 8), steps=steps, seed=seed,
                        manifest=manifest if manifest is not None else NO_MANIFEST, allow_fast_path=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    from skimage import io as skio

    skio.imsave(str(out), (res.image[0].permute(1, 2, 0).numpy() * 255).round().astype("uint8"), check_contrast=False)
    side = out.with_name(out.stem + ".compare.png")
    save_grid(side, [img, split_template_images(timage)[:1], res.image], ["photo", "template", "edit"])
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

