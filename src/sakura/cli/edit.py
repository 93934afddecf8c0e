"""`sakura edit`: the phone-side command, a thin shell over `sakura.phone.editor.Editor`."""

from __future__ import annotations

import math

import os
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

import typer

from sakura.phone.photo import check_photo_file
from sakura.phone.policies import EDIT_POLICIES
from sakura.util.device import device_options

#: File types `sakura edit --out` can write (by suffix).
OUT_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")


def check_out_path(out: Path) -> None:
    """Raise ValueError (one line) unless `out` and its ``.compare.png`` beside it can be written:
    checked before the edit runs. The nearest existing ancestor must be a directory we can write
    in (probed with a temporary file, so read-only mounts are caught too)."""
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


def edit_command(*, photo: Path, server: str, template: str | None, out: Path, policy: str, steps: int, seed: int,
                 prior_mbps: float, model_name: str = "sakura-mini", gallery_dir: Path | None = None,
                 decode_workers: int | None = None, as_json: bool = False,
                 device: str = "auto", dtype: str = "auto",
                 accept_new_template: bool = False) -> None:
    """Edit `photo` with `template`, streaming what pays from `server` and computing the rest;
    write the image and its comparison strip, and report (a summary, or the JSON record).
    Raises ValueError / FileNotFoundError with a one-line reason for bad input."""
    # every argument checked before the heavy imports (torch, the model, numba): an error answers at once
    if policy not in EDIT_POLICIES:
        raise ValueError(f"policy must be one of {', '.join(EDIT_POLICIES)}, got {policy!r}")
    check_out_path(out)
    check_photo_file(photo)
    if urlsplit(server).scheme not in ("http", "https") or not urlsplit(server).hostname:
        raise ValueError(f"--server must be http(s)://host[:port], got {server!r}")
    from sakura.phone.editor import Editor  # lazy: torch and the model: after the arguments are checked
    from sakura.models import load_model  # lazy: torch and the model: after the arguments are checked

    model = load_model(model_name, **device_options(device, dtype))  # a bad --device is a one-line ValueError
    editor = Editor(server, model=model, gallery=gallery_dir, policy=policy, prior_mbps=prior_mbps,
                    decode_workers=decode_workers, accept_new_template=accept_new_template)
    if template is None:
        _missing_template(editor)
    res = editor.edit(photo, template, steps=steps, seed=seed)
    written = res.save(out)
    if as_json:
        typer.echo(res.to_json())
        return
    for m in res.messages:
        typer.echo(m)
    rec = res.to_dict()
    typer.echo(f"edited in {1000 * res.latency_s:.0f} ms ({res.streamed.path}): {rec['bytes_fetched']} B fetched, "
         f"{rec['layers_computed_here']} of {rec['layers_total']} layers computed on the device, "
         f"stall {1000 * rec['stall_s']:.0f} ms")
    typer.echo("layers: " + ", ".join(f"{r.index}:{r.source}" for r in res.streamed.records))
    if res.streamed.path == "streamed":
        q = f"{res.streamed.implied_psnr_db:.1f} dB" if res.streamed.quality_known else \
            "unknown (manifest has no image distortions)"
        held = res.floor_estimate["heldout_error_db"]
        if res.streamed.quality_known and not math.isfinite(res.streamed.implied_psnr_db):
            q += " (every layer exact: lossless or computed on the device)"
        elif res.streamed.quality_known and held:
            q += (f" (an estimate from the build's calibration photos: on held-out photos "
                  f"{100 * held['below_floor_fraction']:.0f} % of edits landed below it, by up to {held['max_shortfall_db']:.1f} dB)")
        typer.echo(f"image PSNR vs the lossless-KV edit implied by the renditions used: {q}")
    for e in res.streamed.events:
        typer.echo("event: " + e)
    typer.echo("wrote " + " and ".join(str(p) for p in written))


def _missing_template(editor) -> None:
    """No --template: raise `TemplateNotOffered` (a ValueError) with what the server offers for this
    model, listed under one deadline."""
    editor.edit_requires_template()
