"""Model adapters: DiTs whose template KV can be captured (extract) or injected (cached).

`load_model(spec)` resolves a spec through the registry (`sakura.models.registry`: entry points of
the ``sakura.models`` group, plus `register_model`). Bundled: "sakura-mini" (the bundled model; its
shipped weights when present), "flux2-mini" (the bundled FLUX.2-architecture model: diffusers'
`Flux2Transformer2DModel` trained here, same image-level API as sakura-mini),
"klein:/path/to/local/folder[@S]" (FLUX.2 Klein through diffusers at S px per side, weights from
disk; the same image-level API) and "kontext:/path/to/local/folder[@S]" (FLUX.1 Kontext, likewise;
docs/your-own-model.md walks through it).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any
import warnings

from sakura.util.extras import require
from sakura.util.lazy import lazy_names

from .registry import ModelSpecError, available_models, load_model, register_model, unregister_model
from sakura.util.device import resolve

if TYPE_CHECKING:
    from .mini import MiniDiT

log = logging.getLogger(__name__)

#: public name -> the submodule it lives in, imported on first use: `import sakura.models.registry`
#: (the CLI's spec checks) and `sakura.models.load_model` of an unknown name do not load torch
_LAZY = {
    "EditOutput": ".base", "ImageTemplateEditModel": ".base", "KVMode": ".base", "TemplateEditModel": ".base",
    "KVSourceDefaults": ".kv", "LayerKV": ".kv", "TemplateKV": ".kv", "TemplateKVError": ".kv", "TemplateKVSource": ".kv",
    "MiniConfig": ".mini", "MiniDiT": ".mini",
}


#: modules moved into the Flux family (0.1.0): the old path still imports, with a DeprecationWarning,
#: until 0.2 (docs/api.md, "Stability")
MOVED_MODULES = {f"{__name__}.{old}": f"{__name__}.flux.{old}" for old in
                 ("klein", "klein_image", "klein_config", "klein_random", "klein_tiny", "kontext", "kontext_tiny")}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import sakura.models.klein` -> the module `sakura.models.flux.klein`, under both names."""

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED_MODULES else None

    def create_module(self, spec):
        warnings.warn(f"{spec.name} moved to {MOVED_MODULES[spec.name]}; the old path goes in sakura-kv 0.2",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(MOVED_MODULES[spec.name])

    def exec_module(self, module):
        pass  # already executed under its new name


if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())

ASSETS = Path(__file__).resolve().parent.parent / "assets"
MINI_WEIGHTS = ASSETS / "sakura-mini.safetensors"
FLUX2_MINI_WEIGHTS = ASSETS / "flux2-mini.safetensors"
MODEL_NAMES = ("sakura-mini", "flux2-mini")

__all__ = ["EditOutput", "ImageTemplateEditModel", "KVMode", "KVSourceDefaults", "LayerKV", "MiniConfig", "MiniDiT", "TemplateEditModel", "TemplateKV",
           "TemplateKVError", "TemplateKVSource", "ModelSpecError", "available_models", "load_flux2_mini", "load_mini",
           "load_model", "register_model", "unregister_model"]


def _load_bundled(name: str, default: Path, weights: str | Path | None, allow_random: bool, read, build,
                  device="auto", dtype="auto"):
    """`read(path)` of `weights` (default: the shipped file); with no file there and
    `allow_random`, `build()` under seed 0 with a warning (the untrained model still exercises
    every KV path exactly; its edits are noise). Then moved to `device` in `dtype`
    (`sakura.util.device.resolve`: auto = cuda, mps, cpu; bf16 / fp16 / fp32), fingerprinted
    first: the shipped fp32 weights name the model on every device and in every precision."""
    dev, dt = resolve(device, dtype)  # a bad --device fails before the weights are read
    path = Path(weights) if weights is not None else default
    if path.is_file():
        model = read(path)
    elif weights is not None or not allow_random:
        raise FileNotFoundError(f"{name} weights not found at {path}")
    else:
        log.warning("no bundled %s weights at %s; using a seeded random init", name, path)
        import torch  # lazy: torch; off --help and argument errors

        torch.manual_seed(0)
        model = build().eval()
    if (dev.type, dt) != ("cpu", next(model.parameters()).dtype):
        model.fingerprint()  # cached: computed on the weights as shipped, before the cast
        model.to(dev, dt)
    return model


def load_mini(weights: str | Path | None = None, *, allow_random: bool = True, device="auto",
              dtype="auto") -> MiniDiT:
    """The bundled sakura-mini with its shipped weights (or `weights`), in eval mode, on `device`
    in `dtype` (auto: cuda/mps/cpu, bf16/fp16/fp32); a seeded random init (and a warning) when no
    file is there and `allow_random`."""
    from .mini import MiniConfig, MiniDiT  # lazy: torch, numpy; off --help and argument errors
    from .mini_io import load_mini_weights  # lazy: torch, numpy; off --help and argument errors

    return _load_bundled("sakura-mini", MINI_WEIGHTS, weights, allow_random, load_mini_weights,
                         lambda: MiniDiT(MiniConfig()), device, dtype)


def load_flux2_mini(weights: str | Path | None = None, *, allow_random: bool = True, device="auto", dtype="auto"):
    """The bundled flux2-mini (a `Flux2MiniDiT`) with its shipped weights (or `weights`), in eval
    mode, on `device` in `dtype`; a seeded random init (and a warning) when no file is there and
    `allow_random`."""
    require("diffusers", "model 'flux2-mini'")  # diffusers' FLUX.2 transformer: the [flux] extra
    from .flux2mini import Flux2MiniConfig, Flux2MiniDiT, load_flux2_mini_weights  # lazy: torch, diffusers ([flux] extra)

    return _load_bundled("flux2-mini", FLUX2_MINI_WEIGHTS, weights, allow_random, load_flux2_mini_weights,
                         lambda: Flux2MiniDiT(Flux2MiniConfig()), device, dtype)


def load_mini_spec(arg: str = "", **options) -> MiniDiT:
    """Model-registry factory of ``sakura-mini[:/path/weights.safetensors]``."""
    return load_mini(arg or None, **options)


def load_flux2_mini_spec(arg: str = "", **options):
    """Model-registry factory of ``flux2-mini[:/path/weights.safetensors]``."""
    return load_flux2_mini(arg or None, **options)


def _local_folder(family: str, what: str, arg: str) -> None:
    """The checks of ``FAMILY:/folder[@SIZE]`` that need nothing but the file system, made before
    torch or diffusers load (a typo answers in a fraction of a second, not after the imports)."""
    if not arg:
        raise ModelSpecError(f"{family} needs a local folder: {family}:/path/to/{what}[@SIZE]")
    head, _, size = arg.rpartition("@")
    folder = head if size.isdigit() else arg  # as the adapters parse it: "@" + digits ends the spec
    if not folder or not Path(folder).is_dir():
        raise FileNotFoundError(f"{folder or '(empty)'}: not a local folder with a {what} pipeline")


def _check_klein_arg(arg: str) -> None:
    _local_folder("klein", "FLUX.2 Klein", arg)
    require("diffusers", "model 'klein'")


def _check_kontext_arg(arg: str) -> None:
    _local_folder("kontext", "FLUX.1 Kontext", arg)
    require("diffusers", "model 'kontext'")


def load_klein_spec(arg: str = "", **options):
    """Model-registry factory of ``klein:/path/to/local/folder[@SIZE]`` (FLUX.2 Klein at SIZE px per
    side, default 512: a `KleinImageModel`, whose ``.adapter`` is the packed-latent `KleinAdapter`)."""
    _check_klein_arg(arg)
    from .flux.klein_image import KleinImageModel  # lazy: torch, diffusers ([flux] extra)

    return KleinImageModel.from_pretrained(arg, **options)


def load_kontext_spec(arg: str = "", **options):
    """Model-registry factory of ``kontext:/path/to/local/folder[@SIZE]`` (FLUX.1 Kontext at SIZE px
    per side, default 512: a `KontextImageModel`; options: guidance, ref_timestep, max_sequence_length)."""
    _check_kontext_arg(arg)
    from .flux.kontext import KontextImageModel  # lazy: torch, diffusers ([flux] extra); off --help and argument errors

    return KontextImageModel.from_pretrained(arg, **options)


def _check_flux2_mini_arg(arg: str) -> None:
    if arg and not Path(arg).is_file():
        raise FileNotFoundError(f"flux2-mini weights not found at {arg}")
    require("diffusers", "model 'flux2-mini'")


def _check_mini_arg(arg: str) -> None:
    if arg and not Path(arg).is_file():
        raise FileNotFoundError(f"sakura-mini weights not found at {arg}")


# what `sakura.models.registry.check_model_spec` runs before anything heavy loads
load_mini_spec.check_arg = _check_mini_arg
load_flux2_mini_spec.check_arg = _check_flux2_mini_arg
load_klein_spec.check_arg = _check_klein_arg
load_kontext_spec.check_arg = _check_kontext_arg
