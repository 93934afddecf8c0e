"""Photos for training and evaluation: real images that ship inside PyPI packages, nothing downloaded.

Sources are `skimage.data` images that load offline and scikit-learn's two sample images. The
split is by SOURCE image, fixed in code: no crop of a held-out source is ever seen in training.
(`skimage.data.cat` and `chelsea` are the same photograph, so only `chelsea` is used, held out.)

Textures (`brick`, `grass`, `gravel`) are not photos here; they feed the texture task's templates
(`gravel` held out).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
import importlib.util

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from sakura.util.extras import require

# name -> how to load it (skimage.data function name, or "sklearn:<file>")
TRAIN_PHOTOS = ("astronaut", "camera", "coffee", "coins", "hubble_deep_field", "immunohistochemistry",
                "retina", "moon", "clock", "stereo_motorcycle", "sklearn:china.jpg")
HELDOUT_PHOTOS = ("chelsea", "rocket", "sklearn:flower.jpg")
TRAIN_TEXTURES = ("brick", "grass")
HELDOUT_TEXTURES = ("gravel",)

_MAX_SIDE = 320  # sources are downscaled once so that crops + resizes stay cheap


def _sklearn_sample_image(file: str) -> np.ndarray:
    """scikit-learn's bundled sample image `file` as (H, W, 3) uint8, read from the installed
    package's data folder: `sklearn.datasets.load_sample_image` gives the same array but imports
    all of scikit-learn first (~1 s of every build)."""
    require("sklearn", "the builder's public photos (scikit-learn's sample images)")
    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.origin).parent / "datasets" / "images" / file
    if not path.is_file():
        raise ValueError(f"scikit-learn has no sample image {file!r} ({path})")
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


@functools.lru_cache(maxsize=None)
def load_source(name: str) -> torch.Tensor:
    """One source image as float32 (3, H, W) in [0, 1], shorter side at most `_MAX_SIDE` pixels.

    Greyscale sources are replicated to three channels.
    """
    if name.startswith("sklearn:"):
        arr = _sklearn_sample_image(name.split(":", 1)[1])
    else:
        require("skimage", "the builder's public photos (scikit-image's data images)")
        import skimage.data  # lazy: skimage ([build] extra)

        if name not in skimage.data.__all__:
            raise ValueError(f"unknown skimage.data image {name!r}")
        arr = getattr(skimage.data, name)()
        if name == "stereo_motorcycle":
            arr = arr[0]  # (left, right, disparity): the left view
    arr = np.asarray(arr)
    if arr.dtype == np.uint8:
        arr = arr.astype(np.float32) / 255.0
    else:
        arr = arr.astype(np.float32)
        arr = (arr - arr.min()) / max(float(arr.max() - arr.min()), 1e-6)
    if arr.ndim == 2:
        arr = np.repeat(arr[..., None], 3, axis=-1)
    arr = arr[..., :3]
    img = torch.from_numpy(np.ascontiguousarray(arr)).permute(2, 0, 1).contiguous()  # (3, H, W)
    h, w = img.shape[1:]
    scale = _MAX_SIDE / min(h, w)
    if scale < 1.0:
        img = F.interpolate(img[None], size=(round(h * scale), round(w * scale)), mode="bilinear",
                            antialias=True, align_corners=False)[0]
    return img.clamp(0.0, 1.0)


def _of_split(split: str, train: tuple[str, ...], heldout: tuple[str, ...]) -> tuple[str, ...]:
    if split == "train":
        return train
    if split == "heldout":
        return heldout
    raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")


def photo_sources(split: str) -> tuple[str, ...]:
    """Source names of a split: "train" or "heldout"."""
    return _of_split(split, TRAIN_PHOTOS, HELDOUT_PHOTOS)


def texture_sources(split: str) -> tuple[str, ...]:
    """Texture names of a split: "train" or "heldout"."""
    return _of_split(split, TRAIN_TEXTURES, HELDOUT_TEXTURES)


def random_crop(img: torch.Tensor, size: int, gen: torch.Generator, *, min_frac: float = 0.3,
                flip: bool = True) -> torch.Tensor:
    """A square crop of random side (min_frac .. 1 of the shorter side), resized to (3, size, size).

    img: (3, H, W). With `flip`, mirrored left-right with probability 1/2.
    """
    _, h, w = img.shape
    short = min(h, w)
    lo = min(short, max(size, int(min_frac * short)))
    side = int(torch.randint(lo, short + 1, (1,), generator=gen))
    y = int(torch.randint(0, h - side + 1, (1,), generator=gen))
    x = int(torch.randint(0, w - side + 1, (1,), generator=gen))
    crop = img[:, y:y + side, x:x + side]
    if side != size:
        crop = F.interpolate(crop[None], size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0]
    if flip and bool(torch.rand((), generator=gen) < 0.5):
        crop = crop.flip(-1)
    return crop.clamp(0.0, 1.0)


def photo_jitter(img: torch.Tensor, gen: torch.Generator, strength: float = 0.15) -> torch.Tensor:
    """Mild augmentation: brightness and contrast around the mean, per image. img: (3, S, S)."""
    b = 1.0 + strength * (2 * torch.rand((), generator=gen) - 1)
    c = 1.0 + strength * (2 * torch.rand((), generator=gen) - 1)
    m = img.mean()
    return ((img - m) * c + m * b).clamp(0.0, 1.0)


@dataclass(frozen=True)
class PhotoSampler:
    """Random augmented crops from one split's sources: `sample(gen)` -> (3, size, size)."""

    split: str
    size: int
    augment: bool = True

    def sample(self, gen: torch.Generator) -> torch.Tensor:
        names = photo_sources(self.split)
        name = names[int(torch.randint(len(names), (1,), generator=gen))]
        crop = random_crop(load_source(name), self.size, gen, flip=self.augment)
        return photo_jitter(crop, gen) if self.augment else crop


def heldout_photos(size: int, n_per_source: int = 4, seed: int = 1000) -> torch.Tensor:
    """A fixed evaluation set: `n_per_source` crops of every held-out source, no augmentation.

    Returns (len(HELDOUT_PHOTOS) * n_per_source, 3, size, size); the same for the same arguments.
    """
    gen = torch.Generator().manual_seed(seed)
    out = [random_crop(load_source(n), size, gen, min_frac=0.4, flip=False)
           for n in HELDOUT_PHOTOS for _ in range(n_per_source)]
    return torch.stack(out)

