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

from sakura.store.layout import check_name


def default_gallery_dir() -> Path:
    """``$SAKURA_GALLERY``, else ``~/.cache/sakura/gallery``."""
    env = os.environ.get("SAKURA_GALLERY")
    return Path(env) if env else Path.home() / ".cache" / "sakura" / "gallery"


def decode_template_ref(data: bytes, media_type: str) -> torch.Tensor:
    """A stored template reference as a (3, S, S) float image in [0, 1] (what `sakura build`
    wrote: an RGB PNG, or the legacy safetensors). Raises ValueError for anything else."""
    from sakura.store.build import decode_template_ref as decode

    try:
        return decode(data, media_type)
    except ValueError:
        raise
    except Exception as e:  # a truncated or corrupt image file
        raise ValueError(f"template reference does not decode ({type(e).__name__}: {e})") from None


class Gallery:
    """Cached manifests and template references, by (model fingerprint, template id)."""

    def __init__(self, root: str | os.PathLike[str] | None = None):
        self.root = Path(root) if root is not None else default_gallery_dir()

    def _base(self, model_fp: str, template_id: str) -> Path:
        return self.root / check_name(model_fp, "model fingerprint") / check_name(template_id, "template id")

    def put(self, model_fp: str, template_id: str, manifest_bytes: bytes | None = None,
            ref: bytes | None = None, ref_media_type: str = "") -> None:
        from sakura.fsutil import atomic_write

        base = self._base(model_fp, template_id)
        base.parent.mkdir(parents=True, exist_ok=True)
        if manifest_bytes is not None:
            atomic_write(base.with_name(base.name + ".manifest.json"), manifest_bytes)
        if ref is not None:
            atomic_write(base.with_name(base.name + ".ref"), ref)
            atomic_write(base.with_name(base.name + ".ref.type"), ref_media_type.encode())

    def manifest(self, model_fp: str, template_id: str):
        """The cached `Manifest`, or None (missing or no longer valid)."""
        from sakura.store.manifest import Manifest, ManifestError

        p = self._base(model_fp, template_id)
        p = p.with_name(p.name + ".manifest.json")
        if not p.is_file():
            return None
        try:
            return Manifest.from_bytes(p.read_bytes(), source=str(p))
        except (ManifestError, ValueError):
            return None

    def template_image(self, model_fp: str, template_id: str) -> torch.Tensor | None:
        """The cached template image (3, S, S) in [0, 1], or None."""
        p = self._base(model_fp, template_id)
        ref = p.with_name(p.name + ".ref")
        if not ref.is_file():
            return None
        tp = p.with_name(p.name + ".ref.type")
        try:
            return decode_template_ref(ref.read_bytes(), tp.read_text() if tp.is_file() else "")
        except ValueError:
            return None
