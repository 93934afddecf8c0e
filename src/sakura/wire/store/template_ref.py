"""The template reference's wire format: R reference images side by side in one lossless 8-bit
RGB PNG (S x R*S pixels), the ``local`` pseudo-rendition a phone computes the KV from.

Both sides use it: ``sakura build`` encodes (sakura.cloud.builder), the phone's gallery and ``sakura
edit`` decode (sakura.phone), so it lives with the store's format, not with either side.
"""

from __future__ import annotations

import io

from PIL import Image
import numpy as np
import torch

TEMPLATE_REF_MEDIA_TYPE = "image/png"


def encode_template_ref(image) -> bytes:
    """(3, S, S) float image in [0, 1] -> lossless 8-bit RGB PNG bytes (deterministic: no metadata).

    Pixels are rounded to 8 bits; the library's templates already are 8-bit, so this is exact for
    them (``decode_template_ref(encode_template_ref(x)) == x``)."""
    if image.ndim != 3 or image.shape[0] != 3:
        raise ValueError(f"template image must be (3, S, S), got {tuple(image.shape)}")
    px = (image.detach().float().clamp(0, 1).permute(1, 2, 0).numpy() * 255.0).round().astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(px, mode="RGB").save(buf, format="PNG", optimize=True, compress_level=9)
    return buf.getvalue()


def encode_template_images(images) -> bytes:
    """(R, 3, S, S) reference image(s) -> one PNG: the R images side by side (S x R*S)."""
    return encode_template_ref(torch.cat(list(images), dim=2))


def split_template_images(image):
    """A decoded template reference (3, S, R*S) -> (R, 3, S, S) (R = 1 for a square one)."""
    s, w = image.shape[1], image.shape[2]
    if w % s:
        raise ValueError(f"template reference is {s}x{w}: not a row of square images")
    return image.reshape(3, s, w // s, s).permute(2, 0, 1, 3).contiguous()


def decode_template_ref(data: bytes, media_type: str = TEMPLATE_REF_MEDIA_TYPE):
    """Template reference bytes -> (3, S, R*S) float32 image in [0, 1]: R reference images side by
    side. Raises ValueError for another media type or anything but an RGB PNG."""
    if media_type != TEMPLATE_REF_MEDIA_TYPE:
        raise ValueError(f"unknown template reference media type {media_type!r}")

    with Image.open(io.BytesIO(data)) as im:
        if im.format != "PNG" or im.mode != "RGB":
            raise ValueError(f"template reference is {im.format} {im.mode}, expected an RGB PNG")
        px = np.asarray(im, dtype=np.uint8)
    return torch.from_numpy(px.astype(np.float32) / np.float32(255.0)).permute(2, 0, 1).contiguous()
