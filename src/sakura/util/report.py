"""Report lines and tables, for every wing: a command's progress lines through stdlib logging to
stdout, and one table writer (markdown and terminal).

    from sakura.util.report import markdown_table, report_logger, terminal_table

    log = report_logger(__name__, root="sakura.cloud.training")   # lines to stdout, plain
    log.info("trained %d steps", n)
    md = markdown_table(["case", "ms"], rows, align="lr")        # for docs/*.md
    log.info("%s", terminal_table(["case", "ms"], rows))           # fits the terminal

Why logging and not a ``log=print`` parameter: a caller that wants the lines elsewhere (a test, a
quiet run, a file) configures the root logger once instead of threading a callable through every
function. The handler writes plain messages (no timestamps: these are a report, not a server log)
to the *current* ``sys.stdout`` (looked up per line, so pytest's capsys sees them), and the root
does not propagate, so a server's ``basicConfig`` does not print every line twice.

Why one table writer: hand-written ``|---|---:|`` separators drifted from their headers (a column
added to the header, not to the separator, renders as a broken table). Here the separator is
derived from the header and the alignment string, and a row of the wrong width is an error.

Here, in `util` (floor 0), because every wing writes reports: the benchmarks (`sakura.bench.harness`
re-exports all of this), the build, training's model card, the task library's quality table.
"""

from __future__ import annotations

import logging
import shutil
import sys
from typing import Any, Sequence

__all__ = ["report_logger", "set_verbosity", "markdown_table", "markdown_head", "terminal_table"]


class _StdoutHandler(logging.StreamHandler):
    """A StreamHandler bound to whatever ``sys.stdout`` is when a line is written (never to a
    stream captured earlier and since closed)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:
        pass


def _install(root: str) -> logging.Logger:
    logger = logging.getLogger(root)
    if not any(isinstance(h, _StdoutHandler) for h in logger.handlers):
        h = _StdoutHandler()
        h.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(h)
        logger.setLevel(logging.INFO)
        logger.propagate = False  # a server's basicConfig (timestamps, stderr) would print every line twice
    return logger


def report_logger(name: str, root: str) -> logging.Logger:
    """The logger ``name`` (a module's ``__name__``, or any name under ``root``), whose lines reach
    stdout through one plain handler on ``root`` (installed on first use; INFO and up)."""
    _install(root)
    if name != root and not name.startswith(root + "."):
        name = f"{root}.{name.rsplit('.', 1)[-1]}"
    return logging.getLogger(name)


def set_verbosity(root: str, quiet: bool = False) -> None:
    """``quiet``: only warnings and errors under ``root`` (results files are still written)."""
    _install(root).setLevel(logging.WARNING if quiet else logging.INFO)


def _check(head: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None) -> str:
    al = align or "l" + "r" * (len(head) - 1)
    if len(al) == 1:  # one letter: every column
        al *= len(head)
    if len(al) != len(head) or set(al) - set("lrc"):
        raise ValueError(f"align {al!r}: one of l/r/c per column ({len(head)} columns)")
    for i, r in enumerate(rows):
        if len(r) != len(head):
            raise ValueError(f"table row {i} has {len(r)} cells, the header {len(head)}: {list(r)!r}")
    return al


def _cell(x: Any) -> str:
    return str(x).replace("\n", " ")


def markdown_table(head: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A GitHub markdown table (no trailing newline). ``align``: one letter per column, ``l``, ``r``
    or ``c``, or one letter for all (default: first column left, the rest right, as figures are). ``|`` inside a cell is
    escaped, so a free-text cell (an error message) cannot split the row."""
    al = _check(head, rows, align)
    sep = {"l": "---", "r": "---:", "c": ":---:"}

    def line(cells: Sequence[Any]) -> str:
        return "| " + " | ".join(_cell(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(head), "| " + " | ".join(sep[a] for a in al) + " |"] + [line(r) for r in rows])


def markdown_head(head: Sequence[str], align: str | None = None) -> list[str]:
    """The header and separator lines of `markdown_table` alone, for a table whose rows are written
    one by one (``lines += markdown_head([...], "lrr")``, then a line per row)."""
    return markdown_table(head, [], align).splitlines()


def terminal_table(head: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None, *,
                   width: int | None = None) -> str:
    """The same table as aligned plain text that fits ``width`` columns (default: the terminal's,
    100 when not on a terminal). Columns are narrowed widest-first, never below 6 characters; a cell
    cut short ends in ``~``. No trailing newline."""
    al = _check(head, rows, align)
    cells = [[_cell(c) for c in head]] + [[_cell(c) for c in r] for r in rows]
    widths = [max(len(r[j]) for r in cells) for j in range(len(head))]
    width = width or shutil.get_terminal_size((100, 24)).columns
    budget = width - 2 * (len(head) - 1)
    while sum(widths) > budget and max(widths) > 6:
        j = widths.index(max(widths))
        widths[j] -= 1

    def fit(s: str, w: int, a: str) -> str:
        s = s if len(s) <= w else s[: max(w - 1, 0)] + "~"
        return s.rjust(w) if a == "r" else s.center(w) if a == "c" else s.ljust(w)

    lines = ["  ".join(fit(c, w, a) for c, w, a in zip(r, widths, al)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
