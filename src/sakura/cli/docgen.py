"""The generated reference pages of the user manual: docs/cli.md (every `sakura` command and option,
from the typer app) and docs/api.md (the public Python API, from signatures and docstrings of what
`sakura.__all__` and each wing's public package export).

Generated, never hand-edited, so they cannot go stale: `tests/sakura/test_docgen.py` compares the
committed pages with a fresh generation. Regenerate:

    python -m sakura.cli.docgen --docs        # rewrites docs/cli.md and docs/api.md
    python -m sakura.cli.docgen               # writes out/docs/ (default: never touches docs/)

It lives with the CLI because the CLI page needs the typer app (the top floor); the API page
imports only what it documents.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import typer

from sakura.bench.results import _table
from sakura.cli.main import app

#: The packages whose `__all__` is the public API, in the order the page lists them: the facade
#: first, then each wing's public package (the user's view: models, codec, store/server/client,
#: build, phone). A package without `__all__` is listed as such.
PUBLIC_MODULES = ("sakura", "sakura.models", "sakura.models.adapter", "sakura.models.flux", "sakura.codec",
                  "sakura.wire.store", "sakura.wire.server", "sakura.wire.client", "sakura.cloud.builder", "sakura.phone")
DOCS = Path("docs")
DEFAULT_OUT = Path("out/docs")
_ADDR = re.compile(r" at 0x[0-9a-fA-F]+")
_QUOTED_ANN = re.compile(r"(: |-> )'([^']*)'")


def _cell(text: str) -> str:
    """One markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


# ------------------------------------------------------------------------------------------- CLI
def _type_name(p: Any) -> str:
    ann = getattr(getattr(p, "type_descriptor", None), "annotation", None)
    if ann is None:
        return ""
    name = ann.__name__ if isinstance(ann, type) else str(ann)
    return re.sub(r"\b(typing|pathlib)\.", "", name).replace("Optional[", "").rstrip("]") if "Optional[" in name \
        else re.sub(r"\b(typing|pathlib)\.", "", name)


def _param_row(p: Any) -> list[str]:
    # typer vendors its own click (typer._click): duck typing, not isinstance
    flag = bool(getattr(p, "is_flag", False))
    if getattr(p, "param_type_name", "") == "argument":
        name, kind = f"`{p.name.upper()}`", f"argument, {_type_name(p)}"
    else:
        name = " / ".join(f"`{o}`" for o in list(p.opts) + list(p.secondary_opts))
        kind = "flag" if flag else _type_name(p)
    default = p.default
    if callable(default) or default is None or (isinstance(default, (tuple, list)) and not default):
        shown = ""
    elif flag and p.secondary_opts:
        shown = p.opts[0] if default else p.secondary_opts[0]
    else:
        shown = str(default)
    req = " (required)" if p.required else ""
    return [name, _cell(kind), _cell(f"`{shown}`" if shown else ""), _cell((getattr(p, "help", None) or "") + req)]


def _command_md(cmd: Any, path: list[str], level: int) -> list[str]:
    out = [f"{'#' * level} `{' '.join(path)}`", ""]
    out += ["```", f"Usage: {' '.join(path + _usage(cmd))}", "```", ""]
    if cmd.help:
        out += [inspect.cleandoc(cmd.help), ""]
    params = [p for p in cmd.params if not getattr(p, "hidden", False) and p.name != "help"]
    if params:
        out += [_table(["option", "type", "default", "meaning"], [_param_row(p) for p in params], "llll"), ""]
    if hasattr(cmd, "commands"):
        subs = list(cmd.commands.items())   # the order the app registers them (its --help order)
        out += [_table(["command", "what"], [[f"[`{' '.join(path + [n])}`](#{_anchor(path + [n])})",
                                              _cell((c.help or "").split("\n\n")[0])] for n, c in subs], "ll"), ""]
        for n, c in subs:
            out += _command_md(c, path + [n], min(level + 1, 4))
    return out


def _usage(cmd: Any) -> list[str]:
    """The usage pieces after the command's path: [OPTIONS], its arguments, COMMAND [ARGS]..."""
    out = ["[OPTIONS]"]
    for p in cmd.params:
        if getattr(p, "param_type_name", "") == "argument":
            name = p.name.upper() + ("..." if p.nargs != 1 else "")
            out.append(name if p.required else f"[{name}]")
    return out + (["COMMAND [ARGS]..."] if hasattr(cmd, "commands") else [])


def _anchor(path: list[str]) -> str:
    """GitHub's heading anchor of `` `sakura bench codec` ``."""
    return re.sub(r"[^a-z0-9 -]", "", " ".join(path).lower()).replace(" ", "-")


def cli_markdown() -> str:
    """docs/cli.md: every command of `sakura`, its usage, help and options."""
    root = typer.main.get_command(app)
    head = ["# CLI reference", "",
            "Every `sakura` command with its options, generated from the command line's own definitions "
            "(`python -m sakura.cli.docgen --docs`; a test fails when this page and the CLI differ). "
            "`sakura COMMAND --help` prints the same.", ""]
    return "\n".join(head + _command_md(root, ["sakura"], 2)).rstrip() + "\n"


# ------------------------------------------------------------------------------------------- API
def _signature(obj: Any) -> str:
    try:
        sig = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"
    # postponed annotations (`from __future__ import annotations`) print as quoted strings
    return _QUOTED_ANN.sub(r"\1\2", _ADDR.sub("", sig))


def _doc(obj: Any) -> str:
    """The object's own docstring (a class's, not one inherited from `str` or `Enum`)."""
    if inspect.isclass(obj):
        own = obj.__dict__.get("__doc__")
        return inspect.cleandoc(own).strip() if isinstance(own, str) else ""
    return (inspect.getdoc(obj) or "").strip()


def _members(cls: type) -> list[tuple[str, Any]]:
    """Public methods and properties defined on `cls` itself (not inherited), in source order."""
    out = []
    for name, raw in vars(cls).items():
        if name.startswith("_") and name != "__call__":
            continue
        if isinstance(raw, (staticmethod, classmethod)):
            out.append((name, raw.__func__))
        elif isinstance(raw, property) or inspect.isfunction(raw):
            out.append((name, raw))
    return out


def _entry(qual: str, obj: Any) -> list[str]:
    if inspect.ismodule(obj):   # a submodule in __all__: its summary (its repr holds a machine's path)
        return [f"### `{qual}`", "", f"*module* `{obj.__name__}`" + (f": {_first_para(_doc(obj))}" if _doc(obj) else ""), ""]
    if inspect.isclass(obj):
        bases = [b.__name__ for b in obj.__bases__ if b is not object]
        kind = "exception" if issubclass(obj, BaseException) else ("dataclass" if dataclasses.is_dataclass(obj)
                                                                      else "class")
        out = [f"### `{qual}`", "", f"*{kind}*" + (f" ({', '.join(bases)})" if bases else ""), ""]
        sig = _signature(obj)
        if issubclass(obj, enum.Enum):
            out += ["Members: " + ", ".join(f"`{m.name}` = `{m.value!r}`" for m in obj), ""]
        elif not issubclass(obj, BaseException) and sig not in ("(*args, **kwargs)", "(...)"):
            out += ["```python", f"{qual.rsplit('.', 1)[-1]}{sig}", "```", ""]
        if _doc(obj):
            out += [_doc(obj), ""]
        for name, m in _members(obj):
            if isinstance(m, property):
                out += [f"- **`{name}`** (property)" + (f": {_first_para(_doc(m))}" if _doc(m) else "")]
            else:
                out += [f"- **`{name}{_signature(m)}`**" + (f": {_first_para(_doc(m))}" if _doc(m) else "")]
        return out + ([""] if out[-1] else [])
    if callable(obj):
        return [f"### `{qual}`", "", "```python", f"{qual.rsplit('.', 1)[-1]}{_signature(obj)}", "```", "",
                *([_doc(obj), ""] if _doc(obj) else [])]
    text = _ADDR.sub("", repr(obj))
    return [f"### `{qual}`", "", f"`{text if len(text) <= 120 else text[:117] + '...'}`", ""]


def _first_para(doc: str) -> str:
    return " ".join(doc.split("\n\n")[0].split())


def api_markdown(modules: tuple[str, ...] = PUBLIC_MODULES) -> str:
    """docs/api.md: per public package, what its `__all__` exports, with signatures and docstrings."""
    out = ["# Python API reference", "",
           "What `sakura` and each wing's public package export (their `__all__`), with signatures and "
           "docstrings, generated from the code (`python -m sakura.cli.docgen --docs`; a test fails when "
           "this page and the code differ). Anything not listed here is internal and may change.", "",
           "**Stability.** Every name on this page is public. `sakura.models.adapter` (the contract a model "
           "plugin implements and the helpers it may use) and `sakura.models.flux` (the Flux family's block loop "
           "for Flux-shaped plugins) are **stable**: within a major version a name keeps its meaning and its "
           "signature only grows keyword arguments with defaults. A name or module that has to change or go is "
           "first kept working for one minor release with a `DeprecationWarning` that names its replacement "
           "(e.g. `sakura.models.klein` -> `sakura.models.flux.klein`, moved in 0.1.0, removed in 0.2), and the "
           "change is in the release notes. Before 1.0 the other packages' names may change between minor "
           "releases, with the same one-release warning where we can give one.", "",
           "Packages: " + ", ".join(f"[`{m}`](#{m.replace('.', '')})" for m in modules), ""]
    for name in modules:
        mod = importlib.import_module(name)
        out += [f"## `{name}`", ""]
        if _doc(mod):
            out += [_doc(mod), ""]
        exported = getattr(mod, "__all__", None)
        if exported is None:
            out += ["*(no `__all__`: nothing exported here yet)*", ""]
            continue
        for sym in exported:
            out += _entry(f"{name}.{sym}", getattr(mod, sym))
    return "\n".join(out).rstrip() + "\n"


# ------------------------------------------------------------------------------------------ main
PAGES = {"cli.md": cli_markdown, "api.md": api_markdown}


def write(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, make in PAGES.items():
        (out / name).write_text(make())
        paths.append(out / name)
    return paths


def stale(docs: Path = DOCS) -> list[str]:
    """The committed pages that differ from a fresh generation."""
    return [name for name, make in PAGES.items()
            if not (docs / name).exists() or (docs / name).read_text() != make()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sakura.cli.docgen", description="Generate docs/cli.md and docs/api.md.")
    ap.add_argument("--docs", action="store_true", help="rewrite the published pages in docs/")
    ap.add_argument("--out", type=Path, default=None, help=f"output folder (default {DEFAULT_OUT})")
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/ differs from a fresh generation")
    a = ap.parse_args(argv)
    if a.check:
        bad = stale()
        print("stale: " + ", ".join(bad) if bad else "docs/cli.md and docs/api.md are current")
        return 1 if bad else 0
    for p in write(a.out or (DOCS if a.docs else DEFAULT_OUT)):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
