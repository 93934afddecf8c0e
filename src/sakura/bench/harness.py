"""The benchmarks' one harness: progress lines through stdlib logging, one table writer, atomic output.

Every benchmark module does the same three things, so they are done once, here::

    from sakura.bench.harness import get_logger, markdown_table, publish, terminal_table

    log = get_logger(__name__)           # "sakura.bench.faults": a line per step, to stdout
    log.info("  %s: %.1f ms", case, ms)
    md = markdown_table(["case", "ms"], [[case, f"{ms:.1f}"]], align="lr")   # for docs/*.md
    log.info("%s", terminal_table(["case", "ms"], rows, align="lr"))          # fits the terminal
    publish(out_dir, "faults", result, md)   # faults.json + faults.md, each written atomically

Why logging and not a ``log=print`` parameter: a caller that wants the lines elsewhere (a test, a
quiet run, a log file) configures the ``sakura.bench`` logger once instead of threading a callable
through every function; ``sakura bench ... -q`` is one ``setLevel``. The handler is installed on
the first `get_logger` and writes plain messages (no timestamps: these are a report, not a server
log) to the *current* ``sys.stdout`` (looked up per line, so pytest's capsys sees them).

Why one table writer: 43 hand-written ``|---|---:|`` separators drifted from their headers (a
column added to the header, not to the separator, renders as a broken table). Here the separator is
derived from the header and the alignment string, and a row of the wrong width is an error.
"""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

from sakura.util.fsutil import write_json, write_text

__all__ = ["get_logger", "set_verbosity", "markdown_table", "markdown_head", "terminal_table", "write_json", "write_text", "publish"]

ROOT_LOGGER = "sakura.bench"


class _StdoutHandler(logging.StreamHandler):
    """A StreamHandler bound to whatever ``sys.stdout`` is when a line is written (never to a
    stream captured earlier and since closed)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:
        pass


def _root() -> logging.Logger:
    root = logging.getLogger(ROOT_LOGGER)
    if not any(isinstance(h, _StdoutHandler) for h in root.handlers):
        h = _StdoutHandler()
        h.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(h)
        root.setLevel(logging.INFO)
        root.propagate = False  # a server's basicConfig (timestamps, stderr) would print every line twice
    return root


def get_logger(name: str) -> logging.Logger:
    """The logger of one benchmark module (``get_logger(__name__)``), under ``sakura.bench``."""
    _root()
    if name != ROOT_LOGGER and not name.startswith(ROOT_LOGGER + "."):
        name = f"{ROOT_LOGGER}.{name.rsplit('.', 1)[-1]}"
    return logging.getLogger(name)


def set_verbosity(quiet: bool = False) -> None:
    """``quiet``: only warnings and errors from the benchmarks (the results files are still written)."""
    _root().setLevel(logging.WARNING if quiet else logging.INFO)


# ------------------------------------------------------------------------------------- tables
def _check(head: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None) -> str:
    al = align or "l" + "r" * (len(head) - 1)
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
    or ``c`` (default: first column left, the rest right, as figures are). ``|`` inside a cell is
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


# ------------------------------------------------------------------------------------- output
def publish(out_dir: str | Path | None, name: str, result: dict, markdown: str) -> dict:
    """Write ``out_dir/name.json`` (``result``, indented) and ``out_dir/name.md`` (``markdown``),
    each atomically (a run killed mid-write leaves the previous files). ``out_dir=None``: nothing is
    written. Returns ``result``."""
    if out_dir is not None:
        out = Path(out_dir)
        write_json(out / f"{name}.json", result, indent=1)
        write_text(out / f"{name}.md", markdown if markdown.endswith("\n") else markdown + "\n")
    return result
