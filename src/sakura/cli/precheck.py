"""The checks every command makes of its arguments before torch, numba or a model loads: a typo
answers in a fraction of a second with one line and exit status 2, not after seconds of imports
(`sakura bench startup` measures it). Each raises `UsageError` with the line to print.

Only the file system, the package metadata (the model registry's entry points) and Pillow's
header parser are touched here.
"""

from __future__ import annotations

import re
from pathlib import Path

from sakura.phone.photo import PhotoError, check_photo_file
from sakura.util.extras import MissingExtraError, require

#: the library's template names: "<task>-NN" (8 training templates per task) and "<task>-hN" (4 held
#: out), tasks in `sakura.cloud.tasks.TASKS`. Kept here so the name check needs no torch;
#: tests/sakura/test_cli.py checks it against `template_library` itself.
LIBRARY_TASKS = ("look", "texture", "sticker")
LIBRARY_NAME = re.compile(r"(?P<task>[a-z]+)-(?:0[0-7]|h[0-3])")


class UsageError(ValueError):
    """A bad argument, found before anything heavy loaded; the message is the one line to print."""


def library_names() -> list[str]:
    return [f"{t}-{i:02d}" for t in LIBRARY_TASKS for i in range(8)] + \
           [f"{t}-h{i}" for t in LIBRARY_TASKS for i in range(4)]


def model_spec(spec: str, option: str = "--model") -> None:
    """The spec names a registered model and, for sakura's own adapters, its folder or weights
    file exists and its optional dependencies are installed."""
    from sakura.models.registry import check_model_spec  # lazy: importlib.metadata; off --help and argument errors

    try:
        check_model_spec(spec)
    except MissingExtraError as e:
        raise UsageError(str(e)) from None
    except (ValueError, FileNotFoundError) as e:
        raise UsageError(f"{option} {spec}: {e}" if not str(e).startswith(("unknown model", "model ")) else str(e)) \
            from None


def store_to_write(store: Path) -> None:
    """`sakura build STORE`: a folder, or a path that does not exist yet; never a file."""
    store = Path(store)
    if store.exists() and not store.is_dir():
        raise UsageError(f"{store}: is a file, not a store folder (give the folder to build into, "
                         f"e.g. {store.parent / 'store'})")
    anc = store.absolute().parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        raise UsageError(f"{store}: {anc} is a file, not a folder")


def store_to_read(store: Path) -> None:
    """`sakura serve STORE` / `sakura store ... STORE`: an existing folder."""
    store = Path(store)
    if not store.exists():
        raise UsageError(f"{store}: no such store folder (`sakura build {store}` writes one)")
    if not store.is_dir():
        raise UsageError(f"{store}: is a file, not a store folder")


def photo(path: Path, what: str = "photo") -> None:
    """A photo (or template image) file that Pillow can open, from its header only."""
    try:
        check_photo_file(path)
    except PhotoError as e:
        raise UsageError(str(e) if what == "photo" else f"{what}: {e}") from None


def build_templates(templates: list[str] | None) -> None:
    """`--template` values: library names that exist, or ID=IMAGE[,IMAGE...] whose images open."""
    known = set(library_names())
    for t in templates or ():
        if "=" in t:
            ident, _, images = t.partition("=")
            for image in filter(None, images.split(",")):
                photo(Path(image), f"--template {ident.strip()}")
        elif t not in known:
            m = LIBRARY_NAME.fullmatch(t)
            hint = f"; the {m['task']} templates are {m['task']}-00 .. -07 and -h0 .. -h3" if m and \
                m["task"] in LIBRARY_TASKS else f"; the library has {', '.join(LIBRARY_TASKS)} templates " \
                "(look-00 .. look-07, look-h0 .. look-h3, ...)"
            raise UsageError(f"--template {t}: no template named {t!r} in the library (or give ID=IMAGE for "
                             f"your own image){hint}")


def extra(module: str, what: str) -> None:
    """An optional dependency the command needs (`sakura.util.extras`): one line naming the extra."""
    try:
        require(module, what)
    except MissingExtraError as e:
        raise UsageError(str(e)) from None


#: the sticker task's key colour as 8-bit RGB (`sakura.cloud.tasks.edits.KEY`, pure green; a test
#: checks they agree): where a sticker template is key (or transparent), the photo shows through
STICKER_KEY_RGB8 = (0, 255, 0)


def sticker_image_warnings(templates: list[str] | None, task: str | None) -> list[str]:
    """What the sticker task expects of a template image, said when an image does not look like it:
    the sticker drawn on the key colour (pure green) or on transparency. An image with (almost) no
    key and no transparent pixels, e.g. a star drawn on white, builds, and then every edit pastes
    the whole image over the photo. Returns warning lines (empty when nothing looks wrong)."""
    if task != "sticker":
        return []
    import numpy as np  # lazy: numpy; off --help and argument errors
    from PIL import Image  # lazy: PIL; off --help and argument errors

    out = []
    for t in templates or ():
        if "=" not in t:
            continue
        ident, _, images = t.partition("=")
        for image in filter(None, images.split(",")):
            with Image.open(image) as im:
                im.draft("RGB", (256, 256))
                im.thumbnail((256, 256), Image.Resampling.NEAREST)  # enough pixels to judge, exact colours
                px = np.asarray(im.convert("RGBA"))
            see_through = (px[..., 3] < 255) | (px[..., :3] == STICKER_KEY_RGB8).all(-1)
            if see_through.mean() < 0.01:
                corner = "#{:02x}{:02x}{:02x}".format(*px[0, 0, :3])
                out.append(f"--template {ident.strip()}: a sticker template is the sticker drawn on the key colour "
                           f"(pure green, #00ff00) or on transparency, and the photo shows where the template is "
                           f"key; {image} has {100 * see_through.mean():.1f} % key or transparent pixels (its corner "
                           f"is {corner}), so every edit will paste the whole image over the photo")
    return out
