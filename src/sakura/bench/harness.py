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

The logger and the table writer are `sakura.util.report`'s (every wing writes reports; `cloud`
cannot import `bench`); they are re-exported here. Why one table writer: 43 hand-written ``|---|---:|`` separators drifted from their headers (a
column added to the header, not to the separator, renders as a broken table). Here the separator is
derived from the header and the alignment string, and a row of the wrong width is an error.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sakura.util.fsutil import write_json, write_text
from sakura.util.report import markdown_head, markdown_table, report_logger, set_verbosity as _set_verbosity, terminal_table

__all__ = ["get_logger", "set_verbosity", "markdown_table", "markdown_head", "terminal_table", "write_json", "write_text", "publish"]

ROOT_LOGGER = "sakura.bench"


def get_logger(name: str) -> logging.Logger:
    """The logger of one benchmark module (``get_logger(__name__)``), under ``sakura.bench``."""
    return report_logger(name, ROOT_LOGGER)


def set_verbosity(quiet: bool = False) -> None:
    """``quiet``: only warnings and errors from the benchmarks (the results files are still written)."""
    _set_verbosity(ROOT_LOGGER, quiet)


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
