"""The three template-defined edits of sakura-mini, each with an exact, classical ground truth.

A template is one reference image (3, S, S) plus a fixed instruction id saying which edit it
defines (`MiniDiT` adds that id's embedding to the template tokens, so it is part of the template
and of its KV). Everything the edit needs is in the template: change it and the output changes.

  look     (instruction 1)  colour/look transfer. Template: a graded reference photo. Ground truth:
                            the photo's per-channel RGB mean and std matched to the reference's,
                            out_c = (x_c - mu_c(photo)) / sd_c(photo) * sd_c(ref) + mu_c(ref), clipped.
  texture  (instruction 2)  pattern blend. Template: a tileable pattern (procedural, or a tinted
                            crop of skimage's brick/grass/gravel). Ground truth: 0.5 photo + 0.5 pattern.
  sticker  (instruction 3)  sticker/frame composite. Template: stickers and frames drawn on a pure
                            green key (0, 1, 0). Ground truth: the template's pixels wherever they
                            are not key, the photo elsewhere. It copies template detail (photo
                            crops, stripes, outlines), so template-KV errors show; `region` is the
                            edited (non-key) area, where quality is also measured.

Template generators take a split ("train" or "heldout"): held-out templates come from held-out
source images (look: held-out photos; texture: held-out `gravel` and two pattern families never
drawn in training, plaid and rings; sticker: fills cropped from held-out photos).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from .photos import load_source, photo_sources, random_crop, texture_sources

KEY = (0.0, 1.0, 0.0)          # sticker key colour (pure green)
_KEY_TOL = 0.5 / 255.0          # a pixel is key if every channel is within half an 8-bit step
_CONTENT_LO, _CONTENT_HI = 2 / 255.0, 253 / 255.0  # sticker content never reaches the key exactly
_MIN_COVER = 0.12               # stickers: add shapes until at least this share of pixels is edited
_MAX_STICKERS = 6
_SD_EPS = 1e-4                  # look transfer: sd = sqrt(var + eps), so flat crops stay finite


def _u(gen: torch.Generator, lo: float = 0.0, hi: float = 1.0, shape=()) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(shape, generator=gen)


def _ri(gen: torch.Generator, n: int) -> int:
    return int(torch.randint(n, (1,), generator=gen))


def _grid(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pixel-centre coordinates in [0, 1): yy, xx of shape (S, S)."""
    c = (torch.arange(size, dtype=torch.float32) + 0.5) / size
    return torch.meshgrid(c, c, indexing="ij")


def _colour(gen: torch.Generator) -> torch.Tensor:
    return _u(gen, 0.0, 1.0, (3, 1, 1))


# ---------------------------------------------------------------------------------------------
# Ground truths (exact; batched)
# ---------------------------------------------------------------------------------------------

def look_transfer(photo: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per-channel RGB mean/std transfer. photo: (B, 3, H, W); ref: (B or 1, 3, H', W'). -> (B, 3, H, W)."""
    mu_p = photo.mean(dim=(-2, -1), keepdim=True)                                  # (B, 3, 1, 1)
    sd_p = (photo.var(dim=(-2, -1), unbiased=False, keepdim=True) + _SD_EPS).sqrt()
    mu_r = ref.mean(dim=(-2, -1), keepdim=True)
    sd_r = (ref.var(dim=(-2, -1), unbiased=False, keepdim=True) + _SD_EPS).sqrt()
    return ((photo - mu_p) / sd_p * sd_r + mu_r).clamp(0.0, 1.0)


def texture_blend(photo: torch.Tensor, pattern: torch.Tensor) -> torch.Tensor:
    """0.5 photo + 0.5 pattern. photo: (B, 3, H, W); pattern: (B or 1, 3, H, W)."""
    return 0.5 * photo + 0.5 * pattern


def key_mask(template: torch.Tensor) -> torch.Tensor:
    """True where a template pixel is the key colour. template: (B, 3, H, W) -> (B, 1, H, W) bool."""
    key = torch.tensor(KEY, dtype=template.dtype).view(1, 3, 1, 1)
    return ((template - key).abs() <= _KEY_TOL).all(dim=1, keepdim=True)


def sticker_composite(photo: torch.Tensor, template: torch.Tensor) -> torch.Tensor:
    """Template pixels where not key, photo elsewhere. photo: (B, 3, H, W); template: (B or 1, 3, H, W)."""
    return torch.where(key_mask(template), photo, template.expand_as(photo))


# ---------------------------------------------------------------------------------------------
# Template generators: (split, size, gen) -> (3, size, size) in [0, 1]
# ---------------------------------------------------------------------------------------------

def grade(img: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A random strong colour grade (per-channel gain and offset, saturation, contrast). img: (3, S, S)."""
    gain = torch.exp(_u(gen, -0.5, 0.5, (3, 1, 1)))
    offset = _u(gen, -0.2, 0.2, (3, 1, 1))
    sat = float(_u(gen, 0.0, 1.4))
    con = float(torch.exp(_u(gen, -0.5, 0.4)))
    grey = img.mean(dim=0, keepdim=True)
    x = grey + sat * (img - grey)
    x = (x - 0.5) * con + 0.5
    return (x * gain + offset).clamp(0.0, 1.0)


def make_look_template(split: str, size: int, gen: torch.Generator) -> torch.Tensor:
    names = photo_sources(split)
    crop = random_crop(load_source(names[_ri(gen, len(names))]), size, gen)
    return grade(crop, gen)


TRAIN_PATTERNS = ("stripes", "checker", "dots", "waves")
HELDOUT_PATTERNS = ("plaid", "rings")


def _pattern(kind: str, size: int, gen: torch.Generator) -> torch.Tensor:
    """A scalar pattern (S, S) in [0, 1], tileable by construction (integer cycles per image)."""
    yy, xx = _grid(size)
    if kind == "stripes":
        a = float(_u(gen, 0, math.pi))
        k = 2 + _ri(gen, 7)
        u = (math.cos(a) * xx + math.sin(a) * yy) * k
        soft = float(_u(gen)) < 0.5
        return 0.5 + 0.5 * torch.sin(2 * math.pi * u) if soft else (u % 1.0 < float(_u(gen, 0.3, 0.7))).float()
    if kind == "checker":
        k = 2 + _ri(gen, 7)
        return ((torch.floor(xx * k) + torch.floor(yy * k)) % 2).float()
    if kind == "dots":
        k = 2 + _ri(gen, 6)
        r = float(_u(gen, 0.15, 0.42))
        d = ((xx * k) % 1.0 - 0.5) ** 2 + ((yy * k) % 1.0 - 0.5) ** 2
        return (d < r * r).float()
    if kind == "waves":
        p = torch.zeros(size, size)
        for _ in range(3):
            kx, ky = _ri(gen, 5) - 2, _ri(gen, 5) - 2
            p = p + torch.sin(2 * math.pi * (kx * xx + ky * yy + float(_u(gen))))
        return (p - p.min()) / (p.max() - p.min() + 1e-6)
    if kind == "plaid":
        k1, k2 = 2 + _ri(gen, 5), 2 + _ri(gen, 5)
        return 0.5 * ((xx * k1) % 1.0 < 0.4).float() + 0.5 * ((yy * k2) % 1.0 < 0.4).float()
    if kind == "rings":
        k = 2 + _ri(gen, 6)
        d = (((xx - 0.5) ** 2 + (yy - 0.5) ** 2).sqrt() * k) % 1.0
        return (d < 0.5).float()
    raise ValueError(f"unknown pattern {kind!r}")


def make_texture_template(split: str, size: int, gen: torch.Generator) -> torch.Tensor:
    c1, c2 = _colour(gen), _colour(gen)
    if float(_u(gen)) < 0.3:
        names = texture_sources(split)
        t = random_crop(load_source(names[_ri(gen, len(names))]), size, gen)[0]
        t = (t - t.min()) / (t.max() - t.min() + 1e-6)
    else:
        kinds = TRAIN_PATTERNS if split == "train" else HELDOUT_PATTERNS
        if split not in ("train", "heldout"):
            raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
        t = _pattern(kinds[_ri(gen, len(kinds))], size, gen)
    return (c1 * (1 - t) + c2 * t).clamp(0.0, 1.0)


SHAPES = ("circle", "ellipse", "rect", "ring", "star", "diamond", "triangle", "frame")


def _shape_mask(kind: str, size: int, gen: torch.Generator) -> torch.Tensor:
    """(S, S) bool mask of one sticker shape at a random place and scale."""
    yy, xx = _grid(size)
    cy, cx = float(_u(gen, 0.2, 0.8)), float(_u(gen, 0.2, 0.8))
    r = float(_u(gen, 0.12, 0.3))
    dy, dx = yy - cy, xx - cx
    if kind == "circle":
        return dx ** 2 + dy ** 2 < r * r
    if kind == "ellipse":
        a, b = r * float(_u(gen, 0.6, 1.5)), r * float(_u(gen, 0.6, 1.5))
        return (dx / a) ** 2 + (dy / b) ** 2 < 1
    if kind == "rect":
        a, b = r * float(_u(gen, 0.6, 1.4)), r * float(_u(gen, 0.6, 1.4))
        return (dx.abs() < a) & (dy.abs() < b)
    if kind == "ring":
        d = (dx ** 2 + dy ** 2).sqrt()
        return (d < r) & (d > r * float(_u(gen, 0.4, 0.75)))
    if kind == "star":
        th = torch.atan2(dy, dx) + float(_u(gen, 0, 2 * math.pi))
        rad = r * (0.55 + 0.45 * torch.cos(5 * th))
        return (dx ** 2 + dy ** 2).sqrt() < rad
    if kind == "diamond":
        return dx.abs() + dy.abs() < r
    if kind == "triangle":
        return (dy < r * 0.6) & (dy > -r + 2 * dx.abs())
    if kind == "frame":
        w = float(_u(gen, 0.06, 0.16))
        return (xx < w) | (xx > 1 - w) | (yy < w) | (yy > 1 - w)
    raise ValueError(f"unknown shape {kind!r}")


def _fill(split: str, size: int, gen: torch.Generator) -> torch.Tensor:
    """Sticker content (3, S, S): a solid colour, a gradient, stripes, or a crop of a photo."""
    yy, xx = _grid(size)
    kind = _ri(gen, 4)
    if kind == 0:
        return _colour(gen).expand(3, size, size)
    if kind == 1:
        a = float(_u(gen, 0, 2 * math.pi))
        t = (math.cos(a) * (xx - 0.5) + math.sin(a) * (yy - 0.5) + 0.71) / 1.42
        return _colour(gen) * (1 - t) + _colour(gen) * t
    if kind == 2:
        t = _pattern("stripes", size, gen)
        return _colour(gen) * (1 - t) + _colour(gen) * t
    names = photo_sources(split)
    return random_crop(load_source(names[_ri(gen, len(names))]), size, gen)


def make_sticker_template(split: str, size: int, gen: torch.Generator) -> torch.Tensor:
    out = torch.tensor(KEY).view(3, 1, 1).repeat(1, size, size)
    n = 1 + _ri(gen, 3)
    for i in range(_MAX_STICKERS):
        if i >= n and float((~key_mask(out[None])).float().mean()) >= _MIN_COVER:
            break
        kind = SHAPES[_ri(gen, len(SHAPES))]
        mask = _shape_mask(kind, size, gen)
        content = _fill(split, size, gen).clamp(_CONTENT_LO, _CONTENT_HI)
        if float(_u(gen)) < 0.4:  # an outline: the mask's boundary in another colour
            inner = mask.clone()
            inner[1:-1, 1:-1] = mask[1:-1, 1:-1] & mask[:-2, 1:-1] & mask[2:, 1:-1] & mask[1:-1, :-2] & mask[1:-1, 2:]
            edge = mask & ~inner
            content = torch.where(edge, _colour(gen).clamp(_CONTENT_LO, _CONTENT_HI), content)
        out = torch.where(mask, content, out)
    return out


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Task:
    """One template-defined edit.

    instruction: the fixed instruction id its templates carry (1..3; 0 means none).
    ground_truth(photo (B,3,H,W), template (B or 1,3,H,W)) -> (B,3,H,W).
    make_template(split, size, gen) -> (3, size, size).
    local: True when the edit touches only part of the image (`region` gives where).
    """

    name: str
    instruction: int
    ground_truth: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    make_template: Callable[[str, int, torch.Generator], torch.Tensor]
    local: bool = False

    def region(self, template: torch.Tensor) -> torch.Tensor | None:
        """(B, 1, H, W) bool: pixels the edit changes (local tasks only), else None."""
        return ~key_mask(template) if self.local else None


TASKS: dict[str, Task] = {
    "look": Task("look", 1, look_transfer, make_look_template),
    "texture": Task("texture", 2, texture_blend, make_texture_template),
    "sticker": Task("sticker", 3, sticker_composite, make_sticker_template, local=True),
}


def get_task(name: str) -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; expected one of {sorted(TASKS)}") from None
