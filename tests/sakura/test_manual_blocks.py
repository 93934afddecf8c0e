"""Every shell and Python block of the manual's hands-on pages runs as written.

The pages: docs/quickstart.md and docs/your-own-model.md (the two a new user copies commands
from; the reference pages' blocks are excerpts). A block the reader cannot run as is (it installs
from the index, clones, takes minutes, or is a signature) is marked on the line above it with
``<!-- not run: why -->``, and the test checks the mark gives a reason.

Each runnable block runs in a fresh folder with `sakura` and `python` on PATH meaning this
checkout's, and these stated substitutions only: port 8080 becomes a free port (tests may run
beside a real server), and a photo the page names as the user's own (`my-photo.jpg`) is made.
Python blocks run from the repository root (they read committed files such as the test-vector
store)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("quickstart.md", "your-own-model.md")
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def blocks(page: str) -> list[tuple[str, int, str, str | None]]:
    """(language, line, code, not-run reason or None) of every bash/python block of a page."""
    text = (ROOT / "docs" / page).read_text()
    out = []
    for m in FENCE.finditer(text):
        lang = m.group(1)
        if lang not in ("bash", "python"):
            continue
        before = text[:m.start()].rstrip().splitlines()
        mark = re.fullmatch(r"<!-- not run: (.*) -->", before[-1].strip()) if before else None
        out.append((lang, text[:m.start()].count("\n") + 1, m.group(2), mark.group(1).strip() if mark else None))
    return out


CASES = [pytest.param(page, lang, code, id=f"{page}:{line}") for page in PAGES
         for lang, line, code, why in blocks(page) if why is None]


def test_every_block_not_run_says_why():
    marked = [(page, line, why) for page in PAGES for _, line, _, why in blocks(page) if why is not None]
    assert marked and all(len(why) > 10 for _, _, why in marked), marked
    assert len(CASES) >= 3, "the pages' runnable blocks are what this test is for"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.integration
@pytest.mark.parametrize("page, lang, code", CASES)
def test_block_runs_as_written(page, lang, code, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "SAKURA_GALLERY": str(tmp_path / "gallery")}
    if lang == "python":
        r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        return
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, cmd in (("sakura", f'exec "{sys.executable}" -m sakura "$@"'), ("python", f'exec "{sys.executable}" "$@"')):
        (bin_dir / name).write_text(f"#!/bin/sh\n{cmd}\n")
        (bin_dir / name).chmod(0o755)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    from PIL import Image

    Image.new("RGB", (120, 90), (200, 120, 40)).save(tmp_path / "my-photo.jpg")
    script = code.replace("8080", str(_free_port()))
    r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=1500)
    assert r.returncode == 0, f"{page} block failed:\n{script}\n---\n{(r.stdout + r.stderr)[-3000:]}"
