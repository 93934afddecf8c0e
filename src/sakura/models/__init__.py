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
import sys
from pathlib import Path
from typing import TYPE_CHECKING
import warnings

from sakura.util.lazy import lazy_names

from .registry import ModelSpecError, available_models, load_model, register_model, unregister_model

if TYPE_CHECKING:
    from .mini import MiniDiT

#: public name -> the submodule it lives in, imported on first use: `import sakura.models.registry`
#: (the CLI's spec checks) and `sakura.models.load_model` of an unknown name do not load torch
_LAZY = {
    "EditOutput": ".base", "ImageTemplateEditModel": ".base", "KVMode": ".base", "TemplateEditModel": ".base",
    "KVSourceDefaults": ".kv", "LayerKV": ".kv", "TemplateKV": ".kv", "TemplateKVError": ".kv", "TemplateKVSource": ".kv",
    "MiniConfig": ".mini", "MiniDiT": ".mini",
    # the bundled models' loaders live beside their models (each loads torch, flux2-mini diffusers);
    # the registry's targets (`sakura.models:load_*_spec`, also the installed entry points) resolve here
    "load_mini": ".loading", "load_mini_spec": ".loading",
    "load_flux2_mini": ".flux2mini", "load_flux2_mini_spec": ".flux2mini",
    "load_klein_spec": ".flux.klein_image", "load_kontext_spec": ".flux.kontext",
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


