"""The checks of a bundled model's spec argument that need nothing but the file system (and whether
an optional extra is installed), made before torch or diffusers load: a typo answers in a fraction
of a second, not after the imports. `registry.check_model_spec` runs them by name; the loaders
(`loading`, `flux2mini`, `flux.klein_image`, `flux.kontext`) run them again on a direct call."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from sakura.util.extras import require


class ModelSpecError(ValueError):
    """A model spec names no registered model, or its adapter cannot be loaded (one line)."""


def _local_folder(family: str, what: str, arg: str) -> None:
    if not arg:
        raise ModelSpecError(f"{family} needs a local folder: {family}:/path/to/{what}[@SIZE]")
    head, _, size = arg.rpartition("@")
    folder = head if size.isdigit() else arg  # as the adapters parse it: "@" + digits ends the spec
    if not folder or not Path(folder).is_dir():
        raise FileNotFoundError(f"{folder or '(empty)'}: not a local folder with a {what} pipeline")


def check_mini_arg(arg: str) -> None:
    if arg and not Path(arg).is_file():
        raise FileNotFoundError(f"sakura-mini weights not found at {arg}")


def check_flux2_mini_arg(arg: str) -> None:
    if arg and not Path(arg).is_file():
        raise FileNotFoundError(f"flux2-mini weights not found at {arg}")
    require("diffusers", "model 'flux2-mini'")


def check_klein_arg(arg: str) -> None:
    _local_folder("klein", "FLUX.2 Klein", arg)
    require("diffusers", "model 'klein'")


def check_kontext_arg(arg: str) -> None:
    _local_folder("kontext", "FLUX.1 Kontext", arg)
    require("diffusers", "model 'kontext'")


#: bundled model name -> the check of what follows ``NAME:`` in its spec
BUNDLED_CHECKS: dict[str, Callable[[str], None]] = {
    "sakura-mini": check_mini_arg, "flux2-mini": check_flux2_mini_arg,
    "klein": check_klein_arg, "kontext": check_kontext_arg,
}
