"""docs/structure.md's duplicates list, generated: the pairs of places under src/ that the
`duplicates` command finds (six or more shared lines, the same or of the same shape), one table row
per pair of files, without line numbers (an edit elsewhere in a file does not make the list stale;
a new or a removed pair does).

    python scripts/structure_duplicates.py            # rewrite the list in docs/structure.md
    python scripts/structure_duplicates.py --check    # exit 1 if the page's list is stale

tests/sakura/test_structure_duplicates.py runs the check (and skips where the command is absent).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "structure.md"
BEGIN, END = "<!-- duplicates:begin (scripts/structure_duplicates.py) -->", "<!-- duplicates:end -->"
COMMAND = ["duplicates", "--repo", "src", "--most", "200", "--seconds", "300"]
ROW = re.compile(r"^D\d+ (?P<a>\S+?):\d+-\d+ ~ (?P<b>\S+?):\d+-\d+(?P<rest>.*)$")


class ScanIncomplete(RuntimeError):
    """The command did not read or pair the whole tree (time ran out on a loaded machine)."""


def scan(root: Path = ROOT) -> list[tuple[str, str, str]]:
    """(file a, file b, kind) per pair of files, sorted; kind: "same lines", "shape" or
    "shape, boilerplate". Raises ScanIncomplete when the command says its scan was incomplete."""
    if shutil.which("duplicates") is None:
        raise FileNotFoundError("the `duplicates` command is not on PATH")
    out = subprocess.run(COMMAND, cwd=root, capture_output=True, text=True, timeout=600).stdout
    if "incomplete:" in out:
        raise ScanIncomplete(next(line for line in out.splitlines() if "incomplete:" in line))
    pairs: dict[tuple[str, str], str] = {}
    for line in out.splitlines():
        m = ROW.match(line.strip())
        if m is None:
            continue
        a, b = sorted((m["a"], m["b"]))
        kind = "shape, boilerplate" if "boilerplate" in m["rest"] else "shape" if "shape" in m["rest"] else "same lines"
        # one row per file pair: "same lines" wins over a shape-only row of the same two files
        if (a, b) not in pairs or kind == "same lines":
            pairs[(a, b)] = kind
    return sorted((a, b, k) for (a, b), k in pairs.items())


def render(pairs: list[tuple[str, str, str]]) -> str:
    rows = [f"| `{a}` | `{b}` | {k} |" for a, b, k in pairs]
    return "\n".join([BEGIN, f"{len(pairs)} pairs of files (`{' '.join(COMMAND)}`):", "",
                      "| file | file | shared |", "|---|---|---|", *rows, END])


def page_with(section: str, page: str) -> str:
    if BEGIN not in page or END not in page:
        raise ValueError(f"{PAGE} has no generated duplicates section ({BEGIN} ... {END})")
    head, rest = page.split(BEGIN, 1)
    return head + section + rest.split(END, 1)[1]


def main(argv: list[str]) -> int:
    page = PAGE.read_text()
    want = page_with(render(scan()), page)
    if "--check" in argv:
        if want != page:
            print(f"{PAGE} duplicates list is stale: run python scripts/structure_duplicates.py", file=sys.stderr)
            return 1
        print(f"{PAGE} duplicates list is current")
        return 0
    if want != page:
        PAGE.write_text(want)
        print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
