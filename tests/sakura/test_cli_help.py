"""Every command's --help, sakura's and saeot's, renders cleanly at 80 columns: no line wider
than the terminal, and no paragraph broken into short ragged lines (a docstring's hard line
breaks kept by rich and wrapped again: "... and edit a / photo with ...")."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from saeot.cli import app as saeot_app
from sakura.cli.main import app as sakura_app
from sakura.util.clihelp import reflow

runner = CliRunner()


def _paths(app: typer.Typer) -> list[list[str]]:
    """Every command path of the app: [], ["bench"], ["bench", "codec"], ..."""
    out: list[list[str]] = []

    def walk(cmd, path: list[str]) -> None:
        out.append(path)
        if isinstance(cmd, typer.core.TyperGroup):
            for name, sub in cmd.commands.items():
                walk(sub, path + [name])
    walk(typer.main.get_command(app), [])
    return out


CASES = [("sakura", sakura_app, p) for p in _paths(sakura_app)] + [("saeot", saeot_app, p) for p in _paths(saeot_app)]


def _paragraphs(text: str) -> list[tuple[int, list[str]]]:
    """(width available, lines) of every wrapped paragraph: the free text between the usage line
    and the first box, and each entry of the Commands box (its description column)."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith("Usage:")) + 1
    # the first box (rich help) or section header such as "Options:" (plain help: click wraps the
    # sections' own columns)
    end = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("╭") or re.fullmatch(r"[A-Z][\w ]*:", ln)),
               len(lines))
    out, cur = [], []
    for ln in lines[start:end] + [""]:
        if ln.strip():
            cur.append(ln.strip())
        elif cur:
            out.append((78, cur))
            cur = []
    box = False
    for ln in lines[end:]:
        if ln.startswith("╭─ Commands"):
            box, col, cur = True, None, []
            continue
        if box and ln.startswith("╰"):
            out.append((width, cur))
            box = False
        elif box:
            inner = ln[2:-2]                          # between "│ " and " │"
            if inner[:1].strip():                     # a new command: name, then its description
                if cur:
                    out.append((width, cur))
                name = inner.split(" ")[0]
                col = len(inner) - len(inner[len(name):].lstrip())   # where the description starts
                width, cur = len(inner) - col, []
            cur.append(inner[col:].strip())
    return out


@pytest.mark.parametrize("prog, app, path", CASES, ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_help_renders_cleanly_at_80_columns(prog, app, path):
    res = runner.invoke(app, path + ["--help"], env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"}, terminal_width=80)
    assert res.exit_code == 0, res.output
    wide = [ln for ln in res.output.splitlines() if len(ln) > 80]
    assert not wide, wide
    for width, para in _paragraphs(res.output):
        # wrapped once, greedily, at the width: the next line's first word did not fit on this one
        # (else the break is a docstring's hard line break that rich kept)
        for ln, nxt in zip(para, para[1:]):
            if not nxt.startswith("- "):
                assert len(ln) + 1 + len(nxt.split(" ")[0]) > width, f"{prog} {' '.join(path)}: break after {ln!r}"


def test_reflow_joins_lines_and_keeps_paragraphs_and_items():
    text = """First line
        continues here.

        Second paragraph:
        - item one
          wrapped
        - item two"""
    assert reflow(text) == "First line continues here.\n\nSecond paragraph:\n- item one wrapped\n- item two"
