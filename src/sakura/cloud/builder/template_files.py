"""Templates from a provider's own files: `sakura build --library templates.toml` and `--template ID=IMAGE`.

A library file lists templates; image paths are relative to the file:

    [[template]]
    id = "my-sticker"
    images = ["stickers/cat.png"]     # one or more reference images
    task = "sticker"                  # bundled models (sakura-mini, flux2-mini): look, texture, sticker

    [[template]]
    id = "watercolour"
    images = ["refs/wc1.jpg", "refs/wc2.jpg"]
    prompt = "paint the photo in the style of the references"   # Klein: the edit is a prompt

Everything is checked before any work starts (`validate_specs`): every problem is one line, and
the caller writes nothing when there is any. Images are centre-cropped to a square and resized
(anti-aliased) to the model's resolution, then rounded to 8 bits: the store keeps the reference as
a lossless PNG and the KV is captured from exactly those pixels. A transparent image is composited
over the sticker task's pure green key (sticker) or white (anything else).
"""

from __future__ import annotations

import os

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence
import stat
import warnings

import numpy as np

from sakura.cloud import tasks  # a lazy facade: its names load torch on first use, the skip path none
from sakura.util.fsutil import UnreadableFile, read_capped
from sakura.util.resize import resize_antialiased

ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_IMAGE_PIXELS = 64_000_000  # refuse decompression bombs before decoding
MAX_LIBRARY_BYTES = 64 * 1024 * 1024  # a library file of 10,000 entries is ~1.5 MB


class TemplateSpecError(ValueError):
    """One or more problems with template specs; `problems` has one line each."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True)
class TemplateSpec:
    """A template to build: an id, reference image file(s), and a task or a prompt.

    where: what to name in error messages (the library file and entry, or the option).
    """

    id: str
    images: tuple[Path, ...]
    task: str | None = None
    prompt: str | None = None
    where: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        # from Python, a path or a list of str is what people write: store a tuple of Paths
        imgs = (self.images,) if isinstance(self.images, (str, os.PathLike)) else tuple(self.images)
        object.__setattr__(self, "images", tuple(Path(i) for i in imgs))
        if not self.where:
            object.__setattr__(self, "where", f"template {self.id!r}")


def parse_template_option(value: str, *, task: str | None, prompt: str | None) -> TemplateSpec:
    """`--template ID=IMAGE[,IMAGE...]` (+ --task / --prompt) -> a spec (paths as given)."""
    ident, sep, paths = value.partition("=")
    if not sep or not paths:
        raise TemplateSpecError([f"--template {value!r}: expected ID=IMAGE (or a library template name)"])
    return TemplateSpec(ident.strip(), tuple(Path(p) for p in paths.split(",")), task=task, prompt=prompt,
                        where=f"--template {ident.strip()}")


def load_library_file(path: Path) -> list[TemplateSpec]:
    """Parse a templates TOML file; raises `TemplateSpecError` listing every structural problem."""
    path = Path(path)
    try:
        # a regular file under the cap, checked before reading (a FIFO blocked, /dev/zero grew to a MemoryError)
        data = tomllib.loads(read_capped(path, MAX_LIBRARY_BYTES, "library file").decode("utf-8"))
    except FileNotFoundError:
        raise TemplateSpecError([f"{path}: no such library file"]) from None
    except UnreadableFile as e:
        raise TemplateSpecError([str(e)]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise TemplateSpecError([f"{path}: cannot read ({e})"]) from None
    except tomllib.TOMLDecodeError as e:
        raise TemplateSpecError([f"{path}: not valid TOML ({e})"]) from None
    except RecursionError:  # tomllib recurses per nesting level: a 1 KB file can exhaust the stack
        raise TemplateSpecError([f"{path}: not valid TOML (arrays or tables nested too deeply)"]) from None
    unknown = set(data) - {"template"}
    problems = [f"{path}: unknown top-level key(s) {sorted(unknown)}; expected [[template]] entries"] if unknown else []
    entries = data.get("template", [])
    if not isinstance(entries, list) or not entries:
        raise TemplateSpecError(problems + [f"{path}: no [[template]] entries"])
    specs = []
    for n, e in enumerate(entries):
        where = f"{path}: template #{n + 1}"
        if not isinstance(e, dict):
            problems.append(f"{where}: expected a table")
            continue
        if isinstance(e.get("id"), str):
            where = f"{path}: template #{n + 1} {e['id']!r}"
        extra = set(e) - {"id", "images", "task", "prompt"}
        if extra:
            problems.append(f"{where}: unknown key(s) {sorted(extra)} (allowed: id, images, task, prompt)")
        ident, images = e.get("id"), e.get("images")
        if not isinstance(ident, str):
            problems.append(f"{where}: missing 'id' (a string)")
            continue
        if isinstance(images, str):
            images = [images]
        if not isinstance(images, list) or not images or not all(isinstance(i, str) for i in images):
            problems.append(f"{where}: 'images' must be a non-empty list of file paths")
            continue
        task, prompt = e.get("task"), e.get("prompt")
        if task is not None and not isinstance(task, str):
            problems.append(f"{where}: 'task' must be a string")
            continue
        if prompt is not None and not isinstance(prompt, str):
            problems.append(f"{where}: 'prompt' must be a string")
            continue
        specs.append(TemplateSpec(ident, tuple(path.parent / i for i in images), task=task, prompt=prompt,
                                  where=where))
    if problems:
        raise TemplateSpecError(problems)
    return specs


def _open_image(path: Path, *, load: bool = True):
    """The image at `path`; its size is checked from the header first (a few bytes of PNG can
    declare 144 Mpx), and it must be a regular file (a FIFO would block the open). Decoded only
    with ``load``. Pillow's global limit is left alone: other loaders (the photo loader's own cap)
    rely on its default."""
    from PIL import Image  # lazy: pillow; an unchanged store's skip and --help load none

    if not stat.S_ISREG(Path(path).stat().st_mode):
        raise ValueError("not a regular file")
    with warnings.catch_warnings():  # the cap below says it in one line
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        im = Image.open(path)  # lazy: header only
    if im.width * im.height > MAX_IMAGE_PIXELS:
        im.close()
        raise ValueError(f"{im.width} x {im.height} is over the {MAX_IMAGE_PIXELS / 1e6:.0f} Mpx limit")
    if load:
        im.load()
    return im


def _check_image(path: Path) -> None:
    """Raise unless `path` is a readable image under the pixel cap, without decoding its pixels
    (header, then Pillow's ``verify``: chunk structure and CRCs): 10,000 library entries used to be
    decoded whole here, up front (901 MB)."""
    with _open_image(path, load=False) as im:
        if im.width < 1 or im.height < 1:
            raise ValueError("empty image")
        im.verify()


def validate_specs(specs: Sequence[TemplateSpec], *, conditioning: str, max_images: int,
                   tasks: Sequence[str], existing_ids: Sequence[str] = ()) -> None:
    """Check every spec against the model before any work: ids, images, task/prompt.

    conditioning: what the model's templates carry besides images, "task" (bundled models) or
    "prompt" (Klein); max_images: reference images a template may have. Raises
    `TemplateSpecError` with one line per problem.
    """
    problems = []
    seen: dict[str, str] = {i: "the library templates also asked for" for i in existing_ids}
    for s in specs:
        w = s.where or f"template {s.id!r}"
        if not ID_RE.fullmatch(s.id):
            problems.append(f"{w}: bad id {s.id!r} (letters, digits, '.', '_', '-'; at most 128; not starting "
                            f"with '.', '_' or '-')")
        elif s.id in seen:
            problems.append(f"{w}: duplicate id {s.id!r} (also {seen[s.id]})")
        else:
            seen[s.id] = w
        if len(s.images) > max_images:
            problems.append(f"{w}: {len(s.images)} images, but this model takes at most {max_images} per template")
        for p in s.images:
            if not p.is_file():
                problems.append(f"{w}: image {p}: no such file")
                continue
            try:
                _check_image(p)
            except Exception as e:  # PIL raises many types for unreadable files
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                problems.append(f"{w}: image {p}: not a readable image ({first[:120]})")
        if conditioning == "task":
            if s.prompt is not None:
                problems.append(f"{w}: a prompt was given, but this model takes none (give task = one of "
                                f"{', '.join(tasks)})")
            if s.task is None:
                if s.prompt is None:
                    problems.append(f"{w}: no task (one of {', '.join(tasks)})")
            elif s.task not in tasks:
                problems.append(f"{w}: unknown task {s.task!r} (one of {', '.join(tasks)})")
        else:
            if s.task is not None:
                problems.append(f"{w}: a task was given, but this model's templates are defined by a prompt")
            if s.prompt is None or not s.prompt.strip():
                problems.append(f"{w}: no prompt (this model's edit is defined by a prompt)")
    if problems:
        raise TemplateSpecError(problems)


def load_template_image(path: Path, size: int, *, background: tuple[float, float, float] = (1.0, 1.0, 1.0)):
    """An image file as (3, size, size) float32 in [0, 1], 8-bit exact: centre crop, anti-aliased
    resize, transparency composited over `background`.

    Decoded reduced: a JPEG in the DCT domain (Pillow's ``draft``), anything else box-reduced by
    Pillow (``reduce`` with the crop box) to at most 2x ``size`` before any float conversion, so
    a 7999 x 7999 PNG costs its 8-bit decode, not 64 Mpx of float32 RGBA and a float resize
    (94 s and 3.3 GB before)."""
    import torch  # lazy: torch; an unchanged store's skip and --help load none

    with _open_image(path, load=False) as im:
        if im.format == "JPEG" and im.mode in ("RGB", "L", "CMYK"):
            im.draft(im.mode, (2 * size, 2 * size))  # DCT-domain downscale, before decoding
        im.load()
        w, h = im.size
        s = min(w, h)
        box = ((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s)
        k = s // (2 * size)
        if im.mode not in ("RGB", "RGBA", "L", "LA"):
            im = im.convert("RGBA")
        im = im.reduce(k, box=box) if k >= 2 else im.crop(box)  # box average, 8-bit, in C
        im = im.convert("RGBA")
        px = np.asarray(im, dtype=np.float32) / 255.0
    rgb, a = px[..., :3], px[..., 3:4]
    rgb = rgb * a + np.asarray(background, dtype=np.float32) * (1.0 - a)
    s = rgb.shape[0]
    if s != size:
        rgb = resize_antialiased(rgb, (size, size))  # skimage's resize: an upscale is never smoothed
    rgb = np.round(np.clip(rgb, 0.0, 1.0) * 255.0) / 255.0
    return torch.from_numpy(np.ascontiguousarray(rgb, dtype=np.float32)).permute(2, 0, 1).contiguous()


def spec_images(spec: TemplateSpec, size: int):
    """(R, 3, size, size) pixels of a spec's reference images."""
    import torch  # lazy: torch; an unchanged store's skip and --help load none

    bg = (0.0, 1.0, 0.0) if spec.task == "sticker" else (1.0, 1.0, 1.0)  # the sticker task's green key
    return torch.stack([load_template_image(p, size, background=bg) for p in spec.images])


def spec_instruction(spec: TemplateSpec) -> Any:
    """What the model's `extract_template_kv(image, instruction)` takes: a task's instruction id,
    or the prompt text."""
    if spec.task is not None:
        return tasks.get_task(spec.task).instruction
    return spec.prompt


def template_args(templates: Sequence[str] | None, *, library: Path | None = None, task: str | None = None,
                  prompt: str | None = None) -> list[Any] | None:
    """`sakura build`'s --template / --library / --task / --prompt -> what `build_store` takes:
    library names (str) and `TemplateSpec`s. None when nothing was asked (the default set)."""
    out: list[Any] = []
    problems: list[str] = []
    for t in templates or ():
        if "=" in t:
            try:
                out.append(parse_template_option(t, task=task, prompt=prompt))
            except TemplateSpecError as e:
                problems += e.problems
        else:
            out.append(t)
    if (task is not None or prompt is not None) and not any(isinstance(t, TemplateSpec) for t in out):
        problems.append("--task / --prompt apply to --template ID=IMAGE")
    if task is not None and prompt is not None:
        problems.append("give --task (bundled models) or --prompt (Klein), not both")
    if library is not None:
        try:
            out += load_library_file(library)
        except TemplateSpecError as e:
            problems += e.problems
    if problems:
        raise TemplateSpecError(problems)
    return out or None
