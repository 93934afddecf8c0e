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
import hashlib
import io

import torch
from PIL import Image

from sakura.wire.store.layout import check_name, SHA256_RE
from sakura.phone.limits import MAX_TEMPLATE_REFERENCES, max_template_ref_bytes
from sakura.util.fsutil import atomic_write, read_capped
from sakura.wire.store.manifest import MAX_MANIFEST_BYTES, Manifest, ManifestError
from sakura.wire.store.template_ref import TEMPLATE_REF_MEDIA_TYPE, decode_template_ref as decode


def default_gallery_dir() -> Path:
    """``$SAKURA_GALLERY``, else ``~/.cache/sakura/gallery``."""
    env = os.environ.get("SAKURA_GALLERY")
    return Path(env) if env else Path.home() / ".cache" / "sakura" / "gallery"


def decode_template_ref(data: bytes, media_type: str, *, image_size: int | None = None) -> torch.Tensor:
    """A stored template reference as a (3, S, R*S) float image in [0, 1]: R reference images
    side by side (what `sakura build` wrote: an RGB PNG). Raises ValueError for anything else.

    With ``image_size``, the bytes are capped (``limits.max_template_ref_bytes``) and a PNG's
    header must say (R*S) x S before it is decoded (a 419 KB PNG can declare 144 Mpx)."""
    if image_size is not None:
        if len(data) > max_template_ref_bytes(image_size):
            raise ValueError(f"template reference is {len(data)} bytes, over the limit for a {image_size}-pixel template")
        if media_type == TEMPLATE_REF_MEDIA_TYPE:
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
        ok = (isinstance(img, torch.Tensor) and img.ndim == 3 and img.shape[0] == 3 and img.shape[1] == image_size
              and img.shape[2] % image_size == 0 and 1 <= img.shape[2] // image_size <= MAX_TEMPLATE_REFERENCES)
        if not ok or not bool(torch.isfinite(img).all()):
            raise ValueError(f"template reference is not a finite (3, {image_size}, R*{image_size}) image")
    return img


class GalleryError(ValueError):
    """The gallery's copy of a template cannot be trusted (its manifest and reference disagree),
    or a server offers a different template under an id the gallery pinned; one line."""


class TemplateChanged(GalleryError):
    """A server serves, under a template id seen before, a template whose reference differs from
    the one pinned on first use (``sakura edit --accept-new-template`` takes it)."""


#: The sakura edit flag that accepts a changed template under a pinned id.
ACCEPT_NEW_FLAG = "--accept-new-template"


def _ref_sha(manifest_bytes: bytes) -> str:
    return Manifest.from_bytes(manifest_bytes).template_ref.object.sha256


class Gallery:
    """Cached manifests and template references, by (model fingerprint, template id).

    Trust: a template id's identity is the sha256 of its reference object (what the user saw),
    pinned on first use in ``<id>.pin``. `put` refuses a manifest whose reference differs from
    the pin (`TemplateChanged`, unless ``accept_new``) and a reference whose sha256 is not the
    manifest's; `template_image` refuses a cached manifest and reference that disagree
    (`GalleryError`). Files are size-checked before they are read."""

    def __init__(self, root: str | os.PathLike[str] | None = None, *, accept_new: bool = False):
        self.root = Path(root) if root is not None else default_gallery_dir()
        self.accept_new = bool(accept_new)

    def _base(self, model_fp: str, template_id: str) -> Path:
        return self.root / check_name(model_fp, "model fingerprint") / check_name(template_id, "template id")

    def _file(self, model_fp: str, template_id: str, suffix: str) -> Path:
        b = self._base(model_fp, template_id)
        return b.with_name(b.name + suffix)

    def pinned(self, model_fp: str, template_id: str) -> str | None:
        """The reference sha256 pinned for this template id, or None (never seen)."""
        try:
            v = read_capped(self._file(model_fp, template_id, ".pin"), 1024, "gallery pin").decode("ascii").strip()
        except (OSError, ValueError):
            return None
        return v if SHA256_RE.fullmatch(v) else None

    def check(self, model_fp: str, template_id: str, manifest) -> None:
        """Raise `TemplateChanged` if ``manifest``'s template reference differs from the one pinned
        for this id (and ``accept_new`` is off)."""
        pin = self.pinned(model_fp, template_id)
        got = manifest.template_ref.object.sha256
        if pin is not None and pin != got and not self.accept_new:
            raise TemplateChanged(
                f"the server's template {template_id!r} is not the one this gallery saw first (reference "
                f"{got[:12]}, pinned {pin[:12]}); pass {ACCEPT_NEW_FLAG} to use it")

    def put(self, model_fp: str, template_id: str, manifest_bytes: bytes | None = None,
            ref: bytes | None = None, ref_media_type: str = "") -> None:
        base = self._base(model_fp, template_id)
        if manifest_bytes is not None:
            m = Manifest.from_bytes(manifest_bytes)
            self.check(model_fp, template_id, m)
            if ref is not None and hashlib.sha256(ref).hexdigest() != m.template_ref.object.sha256:
                raise GalleryError(f"template {template_id!r}: reference bytes do not match the manifest's sha256")
        base.parent.mkdir(parents=True, exist_ok=True)
        if manifest_bytes is not None:
            atomic_write(base.with_name(base.name + ".manifest.json"), manifest_bytes)
        if ref is not None:
            atomic_write(base.with_name(base.name + ".ref"), ref)
            atomic_write(base.with_name(base.name + ".ref.type"), ref_media_type.encode())
        if manifest_bytes is not None:
            atomic_write(base.with_name(base.name + ".pin"), (_ref_sha(manifest_bytes) + "\n").encode())

    def manifest(self, model_fp: str, template_id: str):
        """The cached `Manifest`, or None (missing or no longer valid)."""
        p = self._file(model_fp, template_id, ".manifest.json")
        try:
            if not p.is_file():
                return None
            return Manifest.from_bytes(read_capped(p, MAX_MANIFEST_BYTES, "gallery manifest"), source=str(p))
        except (ManifestError, ValueError, OSError):  # unreadable gallery = no cached copy
            return None

    def template_image(self, model_fp: str, template_id: str, *, image_size: int | None = None) -> torch.Tensor | None:
        """The cached template image (3, S, R*S) in [0, 1], or None (missing, unreadable, or not
        ``image_size`` square when given). Raises `GalleryError` when the cached manifest (or the
        pin) names another reference than the cached one: editing with it would use the wrong image."""
        ref = self._file(model_fp, template_id, ".ref")
        tp = self._file(model_fp, template_id, ".ref.type")
        cap = max_template_ref_bytes(image_size) if image_size is not None else 1 << 30
        try:
            if not ref.is_file():
                return None
            data = read_capped(ref, cap, "gallery reference")  # size checked before the read
            media = read_capped(tp, 256, "gallery media type").decode("ascii", "replace") if tp.is_file() else ""
        except (ValueError, OSError):
            return None
        digest = hashlib.sha256(data).hexdigest()
        m = self.manifest(model_fp, template_id)
        want = m.template_ref.object.sha256 if m is not None else self.pinned(model_fp, template_id)
        if want is not None and digest != want:
            raise GalleryError(f"the gallery's copy of {template_id!r} at {self.root} is inconsistent (its reference "
                               f"is not the one its manifest names); refusing to edit with it")
        try:
            return decode_template_ref(data, media, image_size=image_size)
        except (ValueError, OSError):
            return None
