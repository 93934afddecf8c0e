"""Names a package exports but imports on first use (PEP 562), so that importing the package (or
one of its light submodules) loads no torch or diffusers: `sakura`, `sakura.models` and
`sakura.models.flux` each define their public names this way."""

from __future__ import annotations

import importlib
from typing import Any, Callable

from sakura.util.extras import MissingExtraError, missing_extra_line


def lazy_names(package: str, where: dict[str, str], namespace: dict[str, Any]
               ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """(``__getattr__``, ``__dir__``) for the module ``package`` whose globals are ``namespace``:
    ``where`` maps a public name to the module that defines it (absolute, or relative to
    ``package`` when it starts with "."); the first access imports it and caches it in ``namespace``.
    A missing optional extra (a `ModuleNotFoundError` of diffusers, say) raises the one-line
    `MissingExtraError` that names the extra to install."""
    def __getattr__(name: str) -> Any:
        if name in where:
            try:
                module = importlib.import_module(where[name], package)
            except ModuleNotFoundError as e:  # an optional extra's module (diffusers): its one line
                line = missing_extra_line(e, f"{package}.{name}")
                if line is None:
                    raise
                raise MissingExtraError(line, name=e.name) from e
            value = getattr(module, name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__
