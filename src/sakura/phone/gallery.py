"""The phone's template gallery: manifests and template images it has seen, kept on disk.

An app that showed the user a template has its image; so with the server down an edit still
completes by computing the template's KV locally. Files are written atomically (a crash leaves
the old copy or none), and a cached manifest is validated on read like a fetched one.

Layout: ``<root>/<model_fingerprint>/<template_id>.manifest.json`` and ``.ref`` (the template
reference object's bytes, with its media type in ``.ref.type``).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from sakura.wire.store.layout import check_name


def default_gallery_dir() -> Path:
    """``$SAKURA_GALLERY``, else ``~/.cache/sakura/gallery``."""
    env = os.environ.get("SAKURA_GALLERY")
    return Path(env) if env else Path.home() / ".cache" / "sakura" / "gallery"


def decode_template_ref(data: bytes, media_type: str, *, image_size: int | None = None) -> torch.Tensor:
    """A stored template reference as a (3, S, R*S) float image in [0, 1]: R reference images
    side by side (what `sakura build` wrote: an RGB PNG). Raises ValueError for anything else.

    With ``image_size``, the bytes are capped (``limits.max_template_ref_bytes``) and a PNG's
    header must say (R*S) x S before it is decoded (a 419 KB PNG can declare 144 Mpx)."""
    from sakura.wire.store.template_ref import TEMPLATE_REF_MEDIA_TYPE
    from sakura.wire.store.template_ref import decode_template_ref as decode

    if image_size is not None:
        from sakura.phone.limits import MAX_TEMPLATE_REFERENCES, max_template_ref_bytes

        if len(data) > max_template_ref_bytes(image_size):
            raise ValueError(f"template reference is {len(data)} bytes, over the limit for a {image_size}-pixel template")
        if media_type == TEMPLATE_REF_MEDIA_TYPE:
            import io

            from PIL import Image

            try:
                with Image.open(io.BytesIO(data)) as im:  # header only
                    dims = im.size
            except Exception as e:
                raise ValueError(f"template reference does not decode ({type(e).__name__})") from None
            w, h = dims  # R reference images side by side: (R*S) x S
            if h != image_size or w % image_size or not 1 <= w // image_size <= MAX_TEMPLATE_REFERENCES:
                raise ValueError(f"template reference is {w} x {h}; the model takes a row of 1-"
                                 f"{MAX_TEMPLATE_REFERENCES} images of {image_size} x {image_size}")
    try:
        img = decode(data, media_type)
    except ValueError:
        raise
    except Exception as e:  # a truncated or corrupt image file
        raise ValueError(f"template reference does not decode ({type(e).__name__}: {str(e)[:120]})") from None
    if image_size is not None:
        from sakura.phone.limits import MAX_TEMPLATE_REFERENCES

        ok = (isinstance(img, torch.Tensor) and img.ndim == 3 and img.shape[0] == 3 and img.shape[1] == image_size
              and img.shape[2] % image_size == 0 and 1 <= img.shape[2] // image_size <= MAX_TEMPLATE_REFERENCES)
        if not ok or not bool(torch.isfinite(img).all()):
            raise ValueError(f"template reference is not a finite (3, {image_size}, R*{image_size}) image")
    return img


class Gallery:
    """Cached manifests and template references, by (model fingerprint, template id)."""

    def __init__(self, root: str | os.PathLike[str] | None = None):
        self.root = Path(root) if root is not None else default_gallery_dir()

    def _base(self, model_fp: str, template_id: str) -> Path:
        return self.root / check_name(model_fp, "model fingerprint") / check_name(template_id, "template id")

    def put(self, model_fp: str, template_id: str, manifest_bytes: bytes | None = None,
            ref: bytes | None = None, ref_media_type: str = "") -> None:
        from sakura.util.fsutil import atomic_write

        base = self._base(model_fp, template_id)
        base.parent.mkdir(parents=True, exist_ok=True)
        if manifest_bytes is not None:
            atomic_write(base.with_name(base.name + ".manifest.json"), manifest_bytes)
        if ref is not None:
            atomic_write(base.with_name(base.name + ".ref"), ref)
            atomic_write(base.with_name(base.name + ".ref.type"), ref_media_type.encode())

    def manifest(self, model_fp: str, template_id: str):
        """The cached `Manifest`, or None (missing or no longer valid)."""
        from sakura.wire.store.manifest import Manifest, ManifestError

        p = self._base(model_fp, template_id)
        p = p.with_name(p.name + ".manifest.json")
        try:
            if not p.is_file():
                return None
            return Manifest.from_bytes(p.read_bytes(), source=str(p))
        except (ManifestError, ValueError, OSError):  # unreadable gallery = no cached copy
            return None

    def template_image(self, model_fp: str, template_id: str, *, image_size: int | None = None) -> torch.Tensor | None:
        """The cached template image (3, S, S) in [0, 1], or None (missing, unreadable, or not
        ``image_size`` square when given)."""
        p = self._base(model_fp, template_id)
        ref = p.with_name(p.name + ".ref")
        tp = p.with_name(p.name + ".ref.type")
        try:
            if not ref.is_file():
                return None
            return decode_template_ref(ref.read_bytes(), tp.read_text() if tp.is_file() else "", image_size=image_size)
        except (ValueError, OSError):
            return None
