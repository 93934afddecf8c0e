"""One sanitiser for every string that came from a server or a file before it reaches the
terminal (issue 35): a manifest's ``kv_layout.model`` holding ``ESC[2J`` cleared the user's
screen, an OSC sequence set the window title, an embedded newline printed a fake ``error:`` line.

`clean` shows such characters escaped (``\\x1b``, ``\\n``, ``\\u202e``) instead of letting the
terminal act on them, and bounds the length.
"""

from __future__ import annotations

import os
import unicodedata
import shutil
import sys

#: Longest server/file string shown (characters, after escaping); the rest is cut with "...".
DEFAULT_MAX_CHARS = 200


def _escape(ch: str) -> str:
    o = ord(ch)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def clean(value: object, max_chars: int = DEFAULT_MAX_CHARS) -> str:
    """``str(value)`` safe to print: control and format characters (C0, DEL, C1, bidi overrides,
    zero-width marks: Unicode categories Cc, Cf, Zl, Zp, Cs) escaped, at most ``max_chars``
    characters (cut ones end in "...")."""
    s = value if isinstance(value, str) else str(value)
    if len(s) > 4 * max_chars:  # bound the work before escaping
        s = s[: 4 * max_chars]
    out = "".join(_escape(c) if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs") else c for c in s)
    return out if len(out) <= max_chars else out[: max(0, max_chars - 3)] + "..."


def connection_error_line(error: BaseException) -> str | None:
    """One human line for a failure to reach a server, found anywhere in ``error``'s chain
    (``__cause__`` / ``__context__``), e.g. "cannot connect to 127.0.0.1:9 (Connection refused)";
    None when no connection error is in it. aiohttp's ClientConnectorError is an OSError that
    carries host and port; its repr dumps a ConnectionKey(...) nobody should have to read."""
    seen = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        host, port = getattr(e, "host", None), getattr(e, "port", None)
        if isinstance(e, OSError) and host is not None:
            inner = getattr(e, "os_error", None) or e
            errno = getattr(inner, "errno", None)
            why = os.strerror(errno) if errno and errno > 0 else getattr(inner, "strerror", None) or type(inner).__name__
            return clean(f"cannot connect to {host}:{port} ({why})")
        if isinstance(e, (ConnectionError, TimeoutError)):
            return clean(f"cannot connect ({e.strerror or type(e).__name__})" if isinstance(e, OSError) and e.strerror
                         else f"cannot connect ({type(e).__name__})")
        e = e.__cause__ or e.__context__
    return None


def fit_to_terminal(text: str, width: int | None = None) -> str:
    """``text`` with every line longer than the terminal cut to fit, ending in "~" (tables whose
    last column is a long URL or fingerprint stay one row per line). Only on a terminal: piped
    output (a script reading it) is left whole. ``width`` overrides the terminal's columns."""
    width = width if width is not None else terminal_columns()
    if width is None:
        return text
    width = max(20, width)
    return "\n".join(line if len(line) <= width else line[: width - 1] + "~" for line in text.splitlines())


def terminal_columns() -> int | None:
    """The terminal's width in columns when stdout is a terminal, else None (output is piped)."""
    return shutil.get_terminal_size((100, 24)).columns if sys.stdout.isatty() else None
