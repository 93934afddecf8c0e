"""The model registry: a model spec ``NAME[:ARG]`` names a factory that returns a DiT adapter.

Adapters come from two places, both resolved only when a spec names them:

- the entry-point group ``sakura.models`` of every installed distribution: an installed package
  adds ``--model NAME:...`` to every command without touching sakura. In its ``pyproject.toml``::

      [project.entry-points."sakura.models"]
      my-dit = "my_package.sakura_adapter:load"

  where ``load(arg: str, **options) -> ImageTemplateEditModel`` receives what follows ``NAME:``
  ("" when nothing does). The three bundled adapters are declared the same way in sakura's own
  ``pyproject.toml``;
- `register_model` at run time (tests, notebooks, an app that ships its adapter in-process).

What an adapter must provide is the `ImageTemplateEditModel` Protocol (sakura.models.base); the
guide with a worked example is docs/your-own-model.md.

A plugin whose module fails to import is named with the cause when a spec asks for it (and in
`available_models`), never swallowed, and never breaks the other models.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable

from sakura.models.spec_checks import BUNDLED_CHECKS, ModelSpecError
from sakura.util.extras import missing_extra_line

ENTRY_POINT_GROUP = "sakura.models"

#: ``factory(arg, **options) -> model``: ``arg`` is what follows ``NAME:`` in the spec ("" if nothing).
ModelFactory = Callable[..., Any]


@dataclass(frozen=True)
class ModelEntry:
    """One registered model name: where it comes from (``module:attr``) and how to load it."""

    name: str
    target: str                            # "module:attr" of the factory
    origin: str                            # "entry point (<distribution>)" or "register_model"
    factory: ModelFactory | None = None    # set for register_model; entry points load lazily

    def load(self) -> ModelFactory:
        if self.factory is not None:
            return self.factory
        module, _, attr = self.target.partition(":")
        try:
            obj: Any = __import__(module, fromlist=["_"])
            for part in attr.split("."):
                obj = getattr(obj, part)
        except Exception as e:  # a plugin's own bug: say whose and why, in one line

            extra = missing_extra_line(e, f"model {self.name!r} ({self.target})")
            if extra is not None:  # an optional dependency of sakura's that the plugin imports
                raise ModelSpecError(extra) from e
            raise ModelSpecError(f"model {self.name!r} ({self.target}, {self.origin}) failed to load: "
                                 f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
        if not callable(obj):
            raise ModelSpecError(f"model {self.name!r}: {self.target} is not callable")
        return obj


_registered: dict[str, ModelEntry] = {}


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not name or ":" in name or name != name.strip():
        raise ValueError(f"model name must be a non-empty string without ':' or surrounding spaces, got {name!r}")
    return name


def register_model(name: str, factory: ModelFactory | None = None, *, replace: bool = False):
    """Register ``factory(arg, **options) -> model`` under ``name``; usable as a decorator::

        @sakura.register_model("my-dit")
        def load(arg: str, **options):
            return MyAdapter.from_folder(arg, **options)

    A name already registered (here or by an entry point) raises ValueError unless ``replace``.
    """
    _check_name(name)

    def add(f: ModelFactory) -> ModelFactory:
        if not callable(f):
            raise TypeError(f"register_model({name!r}): factory must be callable, got {type(f).__name__}")
        if not replace and (name in _registered or name in _entry_points()):
            raise ValueError(f"model {name!r} is already registered ({_lookup(name).origin}); pass replace=True")
        _registered[name] = ModelEntry(name, f"{f.__module__}:{getattr(f, '__qualname__', f)}", "register_model", f)
        return f

    return add(factory) if factory is not None else add


def unregister_model(name: str) -> None:
    """Remove a `register_model` registration (entry points stay: uninstall their package)."""
    _registered.pop(name, None)


def _entry_points() -> dict[str, ModelEntry]:
    out: dict[str, ModelEntry] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist is not None else "?"
        if ep.name in out and out[ep.name].target != ep.value:
            # two installed packages claim one name: refuse to guess which the user meant
            out[ep.name] = ModelEntry(ep.name, ep.value, f"conflict: {out[ep.name].origin} and entry point ({dist})")
            continue
        out.setdefault(ep.name, ModelEntry(ep.name, ep.value, f"entry point ({dist})"))
    for name, target in _BUNDLED.items():  # a source checkout run without installing has no metadata
        out.setdefault(name, ModelEntry(name, target, "bundled"))
    return out


#: sakura's own adapters; the same targets its pyproject.toml declares as entry points.
_BUNDLED = {
    "sakura-mini": "sakura.models:load_mini_spec",
    "flux2-mini": "sakura.models:load_flux2_mini_spec",
    "klein": "sakura.models:load_klein_spec",
    "kontext": "sakura.models:load_kontext_spec",
}


def _lookup(name: str) -> ModelEntry:
    if name in _registered:
        return _registered[name]
    eps = _entry_points()
    if name in eps:
        if eps[name].origin.startswith("conflict"):
            raise ModelSpecError(f"model {name!r} is claimed by more than one installed package ({eps[name].origin})")
        return eps[name]
    raise ModelSpecError(f"unknown model {name!r}; available: {', '.join(sorted(available_models()))} "
                         f"(install a plugin that declares it in the {ENTRY_POINT_GROUP!r} entry-point group, "
                         f"or sakura.register_model)")


def available_models() -> dict[str, str]:
    """Every model name a spec may use -> where it comes from (entry point / bundled / register_model)."""
    out = {n: f"{e.target} [{e.origin}]" for n, e in _entry_points().items()}
    out.update({n: f"{e.target} [{e.origin}]" for n, e in _registered.items()})
    return out


def check_model_spec(spec: str) -> None:
    """What can be checked of a spec before torch or the model loads, in a fraction of a second:
    the name is registered (`ModelSpecError`, one line) and, for sakura's own adapters, the
    argument (klein/kontext: the local folder exists; flux2-mini and Klein: diffusers is
    installed). An entry-point plugin's module is not imported here (that may be slow); a factory
    given to `register_model` may carry the same kind of check as a ``check_arg(arg)`` attribute."""
    if not isinstance(spec, str) or not spec.strip():
        raise ModelSpecError(f"model spec must be NAME or NAME:ARG, got {spec!r}")
    name, _, arg = spec.strip().partition(":")
    entry = _lookup(name)
    if entry.factory is not None:  # in-process: cheap
        check = getattr(entry.factory, "check_arg", None)
    else:  # sakura's own: its check without importing the loader (torch, diffusers)
        check = BUNDLED_CHECKS.get(name) if entry.target == _BUNDLED.get(name) else None
    if callable(check):
        check(arg)


def load_model(spec: str = "sakura-mini", **options: Any) -> Any:
    """The model a spec names: ``NAME`` or ``NAME:ARG`` (e.g. ``sakura-mini``,
    ``flux2-mini:/path/weights.safetensors``, ``klein:/path/to/FLUX.2-klein@1024``, or a plugin's
    own name). ``options`` (e.g. ``device=``, ``dtype=``) go to the factory as keyword arguments.

    Raises `ModelSpecError` (a ValueError, one line) for an unknown name or a plugin that fails to
    import; the factory's own errors (a missing weights file, a bad argument) pass through."""
    if not isinstance(spec, str) or not spec.strip():
        raise ModelSpecError(f"model spec must be NAME or NAME:ARG, got {spec!r}")
    name, _, arg = spec.strip().partition(":")
    return _lookup(name).load()(arg, **options)
