"""Help text that renders cleanly at any terminal width.

typer's rich help keeps every newline of a docstring as a hard line break and then wraps each
line to the terminal, so a docstring wrapped at 100 columns in the source reads "... and edit
a / photo with ..." at 80. `reflow_help` rejoins each paragraph (lines up to a blank line, or up
to the next "- " item) into one line, for every command and group of a typer app, so rich wraps it
once, at the real width. Call it after the last command is registered."""

from __future__ import annotations

import inspect

import typer


def reflow(text: str | None) -> str | None:
    """Paragraphs joined into single lines; blank lines (paragraph breaks) and "- " items kept."""
    if not text:
        return text
    out: list[str] = []
    for para in inspect.cleandoc(text).split("\n\n"):
        items: list[str] = []
        for line in para.splitlines():
            line = line.strip()
            if line.startswith("- ") or not items:
                items.append(line)
            else:
                items[-1] += " " + line
        out.append("\n".join(items))
    return "\n\n".join(out)


def reflow_help(app: typer.Typer) -> typer.Typer:
    """Reflow the help of every command and sub-app of `app` (in place); returns `app`."""
    for cmd in app.registered_commands:
        cmd.help = reflow(cmd.help if cmd.help is not None else inspect.getdoc(cmd.callback))
    if app.info.help is not None:
        app.info.help = reflow(app.info.help)
    for group in app.registered_groups:
        if group.help is not None:
            group.help = reflow(group.help)
        if group.typer_instance is not None:
            reflow_help(group.typer_instance)
    return app
