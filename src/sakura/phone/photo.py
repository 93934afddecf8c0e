"""The user's photo file, read on the phone: any common format and pixel mode, checked from its
header before anything is decoded, to (1, 3, S, S) float32 in [0, 1]."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
import warnings

if TYPE_CHECKING:
    import numpy as np
    import torch

#: Largest photo accepted, in pixels, checked from the file header before anything is decoded
#: (a 12,000 x 12,000 PNG of 419 KB decoded to 3.7 GB): 64 Mpx is a 48 Mpx phone camera with margin.
MAX_PHOTO_PIXELS = 64 * 1000 * 1000


class PhotoError(ValueError):
    """A photo file cannot be used; the message is one line naming the file and why."""


def load_photo(path, size: int, *, max_pixels: int = MAX_PHOTO_PIXELS) -> torch.Tensor:
    """A photo file as (1, 3, size, size) float32 in [0, 1]: first frame, EXIF orientation applied,
    centre square crop, anti-aliased resize.

    Mode-aware: 1/L/P/RGB/CMYK/YCbCr/LAB/HSV are converted to RGB by Pillow (CMYK with its
    inversion handled by the JPEG decoder); alpha (LA, PA, RGBA, palette transparency) is
    composited over white; 16-bit (I;16*) and 32-bit integer (I) pixels are scaled by 65535, 32-bit
    float (F) pixels are taken as [0, 1]; 8-bit by 255. The scale comes from the pixel type, never
    from the values (an 8-bit photo whose maximum is 1 is nearly black, not white).

    Raises ``PhotoError`` (one line) for a missing/unreadable file or one over ``max_pixels``.
    """
    # deferred: `sakura edit` checks the photo file (check_photo_file) before paying for numpy and torch
    import numpy as np  # lazy: numpy; off --help and argument errors
    import torch  # lazy: torch; off --help and argument errors
    from PIL import Image, ImageOps, UnidentifiedImageError  # lazy: PIL; off --help and argument errors

    path = Path(path)
    if not path.is_file():
        raise PhotoError(f"{path}: no such photo" if not path.exists() else f"{path}: not a file")
    try:
        with warnings.catch_warnings():  # our own cap below says it in one line; Pillow's is a warning
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(path)  # lazy: reads the header only
    except Image.DecompressionBombError as e:  # Pillow refuses > 2 x its own limit at open
        raise PhotoError(f"{path}: over the {max_pixels / 1e6:.0f} Mpx photo limit ({str(e)[:100]})") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise PhotoError(f"{path}: not a readable image ({first[:120]})") from None
    with im:
        w, h = im.size
        if w <= 0 or h <= 0:
            raise PhotoError(f"{path}: image has no pixels ({w} x {h})")
        if w * h > max_pixels:
            raise PhotoError(f"{path}: {w} x {h} = {w * h / 1e6:.0f} Mpx is over the {max_pixels / 1e6:.0f} Mpx "
                             f"photo limit; downscale it first")
        try:
            im.seek(0)  # the first frame of an animation
            if im.format == "JPEG":
                im.draft("RGB" if im.mode != "CMYK" else "CMYK", (size * 2, size * 2))  # DCT-domain downscale: fast
            im.load()
            im = ImageOps.exif_transpose(im) or im
            arr = _to_rgb01(im)
        except PhotoError:
            raise
        except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise PhotoError(f"{path}: image data is corrupt or truncated ({first[:120]})") from None
    from sakura.util.resize import resize_antialiased  # lazy: numpy; off --help and argument errors

    hh, ww = arr.shape[:2]
    s = min(hh, ww)
    arr = arr[(hh - s) // 2:(hh - s) // 2 + s, (ww - s) // 2:(ww - s) // 2 + s]
    if s > 4 * size:  # box-reduce first: an anti-aliased resize of a 50 Mpx float image is slow
        k = s // (2 * size)
        arr = arr[: (s // k) * k, : (s // k) * k].reshape(s // k, k, s // k, k, 3).mean(axis=(1, 3))
    arr = resize_antialiased(arr, (size, size))  # skimage's resize(..., anti_aliasing=True), numpy only
    return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32)).permute(2, 0, 1)[None].clamp(0, 1)


def _to_rgb01(im) -> np.ndarray:
    """(H, W, 3) float32 in [0, 1] from a loaded Pillow image of any mode (see `load_photo`)."""
    import numpy as np  # lazy: numpy; off --help and argument errors
    from PIL import Image  # lazy: PIL; off --help and argument errors

    mode = im.mode
    if mode.startswith("I;16") or mode == "I":
        a = np.asarray(im.convert("I") if mode != "I" else im, dtype=np.float64) / 65535.0
        return np.repeat(np.clip(a, 0, 1)[..., None], 3, -1).astype(np.float32)
    if mode == "F":
        a = np.nan_to_num(np.asarray(im, dtype=np.float32), nan=0.0, posinf=1.0, neginf=0.0)
        return np.repeat(np.clip(a, 0, 1)[..., None], 3, -1)
    has_alpha = mode in ("LA", "La", "PA", "RGBA", "RGBa") or (mode == "P" and "transparency" in im.info)
    if has_alpha:
        rgba = im.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        im = Image.alpha_composite(white, rgba).convert("RGB")
    elif mode != "RGB":
        im = im.convert("RGB")  # 1, L, P, CMYK, YCbCr, LAB, HSV
    a = np.asarray(im)
    if a.dtype != np.uint8 or a.ndim != 3 or a.shape[2] != 3:
        raise PhotoError(f"unsupported pixel layout {a.dtype} {a.shape} (mode {mode})")
    return a.astype(np.float32) / 255.0


def check_photo_file(path, *, max_pixels: int = MAX_PHOTO_PIXELS) -> tuple[int, int]:
    """(width, height) from the file's header, or `PhotoError` (one line) for a missing, unreadable
    or oversized photo: what `load_photo` would refuse first, without decoding pixels (milliseconds)."""
    from PIL import Image, UnidentifiedImageError  # lazy: PIL; off --help and argument errors

    path = Path(path)
    if not path.is_file():
        raise PhotoError(f"{path}: no such photo" if not path.exists() else f"{path}: not a file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                w, h = im.size
    except Image.DecompressionBombError as e:
        raise PhotoError(f"{path}: over the {max_pixels / 1e6:.0f} Mpx photo limit ({str(e)[:100]})") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise PhotoError(f"{path}: not a readable image ({first[:120]})") from None
    if w <= 0 or h <= 0:
        raise PhotoError(f"{path}: image has no pixels ({w} x {h})")
    if w * h > max_pixels:
        raise PhotoError(f"{path}: {w} x {h} = {w * h / 1e6:.0f} Mpx is over the {max_pixels / 1e6:.0f} Mpx "
                         f"photo limit; downscale it first")
    return w, h
