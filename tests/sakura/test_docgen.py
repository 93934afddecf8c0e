"""The generated manual pages (docs/cli.md, docs/api.md) are what the code generates today: a
command, option or public docstring changed without `python -m sakura.cli.docgen --docs` fails here."""

from __future__ import annotations

from pathlib import Path

import typer

from sakura.cli import docgen
from sakura.cli.main import app

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_committed_pages_are_current() -> None:
    assert docgen.stale(DOCS) == [], "regenerate: python -m sakura.cli.docgen --docs"


def test_every_command_and_option_is_on_the_cli_page() -> None:
    page = docgen.cli_markdown()

    def walk(cmd, path: list[str]) -> None:
        assert f"`{' '.join(path)}`" in page
        for p in cmd.params:
            for opt in getattr(p, "opts", []):
                if opt.startswith("-") and opt != "--help":
                    assert f"`{opt}`" in page, (path, opt)
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, path + [name])
    walk(typer.main.get_command(app), ["sakura"])


def test_api_page_lists_every_exported_name() -> None:
    import importlib

    page = docgen.api_markdown()
    for mod in docgen.PUBLIC_MODULES:
        for name in getattr(importlib.import_module(mod), "__all__", []):
            assert f"### `{mod}.{name}`" in page


def test_default_output_is_out_not_docs(tmp_path: Path) -> None:
    written = docgen.write(tmp_path / "o")
    assert sorted(p.name for p in written) == ["api.md", "cli.md"]
    assert docgen.DEFAULT_OUT == Path("out/docs")


def test_api_page_follows_the_facade(monkeypatch) -> None:
    """Whatever `sakura.__all__` names when the generator runs is documented (the lead's facade)."""
    import sakura
    from sakura.codec import get_codec

    monkeypatch.setattr(sakura, "__all__", ["get_codec", "codec"], raising=False)
    monkeypatch.setattr(sakura, "get_codec", get_codec, raising=False)
    page = docgen.api_markdown(("sakura",))
    assert "### `sakura.get_codec`" in page and "get_codec(name: str, **params: Any) -> Codec" in page
    assert "*module* `sakura.codec`" in page and "/work" not in page
