"""Optional dependencies: which extra of the ``sakura-kv`` distribution brings which module, and
the one line that says what to install when one is missing.

``pip install sakura-kv`` is what the phone and the server need (torch, numpy, the codec, aiohttp,
pydantic, ...); the rest comes by use (docs/dependencies.md)::

    sakura-kv[flux]     diffusers, transformers    FLUX.2 Klein, FLUX.1 Kontext, flux2-mini
    sakura-kv[build]    scikit-image, scikit-learn the builder's public photos (calibration, library)
    sakura-kv[bench]    matplotlib (+ the photos)  benchmarks' plots and image metrics
    sakura-kv[cluster]  ray                        sakura build --executor ray
    sakura-kv[saeot]    scipy, pot, ...            the saeot command
    sakura-kv[test]     pytest, hypothesis         the test suite

Two ways in: `require(module, what)` at the entry of a feature (a model factory, `sakura.build`),
so the Python API raises `MissingExtraError` naming the extra before anything heavy loads; and
`missing_extra_line(error)`, which the `sakura` command applies to any ModuleNotFoundError that
escapes a command, so an import deep inside a benchmark still ends in one line, not a traceback.
"""

from __future__ import annotations

import importlib.util

DISTRIBUTION = "sakura-kv"

#: top-level module -> (the distribution that provides it, the extra of sakura-kv that installs it)
EXTRA_OF_MODULE: dict[str, tuple[str, str]] = {
    "diffusers": ("diffusers", "flux"),
    "transformers": ("transformers", "flux"),
    "skimage": ("scikit-image", "build"),
    "sklearn": ("scikit-learn", "build"),
    "matplotlib": ("matplotlib", "bench"),
    "ray": ("ray", "cluster"),
    "scipy": ("scipy", "saeot"),
    "ot": ("pot", "saeot"),
    "gguf": ("gguf", "saeot"),
    "accelerate": ("accelerate", "saeot"),
    "pytest": ("pytest", "test"),
    "hypothesis": ("hypothesis", "test"),
}


class MissingExtraError(ModuleNotFoundError):
    """An optional dependency is not installed; the message is one line naming the extra."""


def install_hint(extra: str) -> str:
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def _line(module: str, what: str | None) -> str | None:
    top = module.split(".")[0]
    if top not in EXTRA_OF_MODULE:
        return None
    dist, extra = EXTRA_OF_MODULE[top]
    return f"{what or 'this'} needs {dist}, which is not installed: {install_hint(extra)}"


def require(module: str, what: str) -> None:
    """Raise `MissingExtraError` (one line naming the extra) unless ``module`` can be imported.
    ``what`` names the feature for the user, e.g. "model 'klein'" or "sakura.build"."""
    if importlib.util.find_spec(module.split(".")[0]) is None:
        raise MissingExtraError(_line(module, what) or f"{what} needs the module {module!r}", name=module)


def missing_extra_line(error: BaseException, what: str | None = None) -> str | None:
    """The one line for a ModuleNotFoundError of an optional dependency (None for anything else:
    a missing core module is a broken install, and its traceback is the useful report)."""
    if isinstance(error, MissingExtraError):
        return str(error)
    if isinstance(error, ModuleNotFoundError) and error.name:
        return _line(error.name, what)
    return None
