"""Atomic, durable file writes: a crash, power loss or Ctrl-C never leaves a half-written file
(or folder) under the final name, and a completed write survives a crash.

The one helper for the whole repository (the store, checkpoints, KV files, saeot's caches):
temp file in the same filesystem + fsync + rename + fsync of the folder. The folder fsync is what
makes the rename itself durable: without it a crash right after ``os.replace`` can leave the old
name (or no name) on disk although the data blocks were synced.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Iterator
import json
import stat


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a directory, so renames and creations inside it are on disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, content: bytes | bytearray | memoryview | Callable[[BinaryIO], None], *,
                 tmp_dir: str | os.PathLike | None = None, mode: int = 0o644) -> Path:
    """Write ``content`` (bytes, or a function that writes to the open file) to ``path`` atomically
    and durably. Returns ``path``.

    Args:
        path: destination; its folder is created if missing.
        content: the bytes, or ``fn(f)`` writing to the open binary file.
        tmp_dir: where the temp file lives (default: ``path``'s folder); must be on the same
            filesystem as ``path`` (rename is atomic only within one). The store uses ``.tmp/`` so
            a static server never sees temp files beside the served ones.
        mode: permission bits of the final file (``mkstemp`` makes 0600; a web server or another
            user may need to read it).

    Readers see either the old file or the complete new one, never a prefix.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tdir = Path(tmp_dir) if tmp_dir is not None else path.parent
    tdir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name[:32] + ".", suffix=".tmp", dir=tdir)
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:
            e.filename = str(path)  # a write/fsync error (ENOSPC) names no file; say which one
        raise
    fsync_dir(path.parent)
    return path


def write_json(path: str | os.PathLike, obj: object, **dumps_kw) -> Path:
    """``json.dumps(obj, **dumps_kw)`` written atomically (`atomic_write`), with a final newline.
    Every JSON result file goes through here: a run killed mid-write leaves the previous file."""
    text = json.dumps(obj, **dumps_kw)
    return atomic_write(path, (text if text.endswith("\n") else text + "\n").encode())


def write_text(path: str | os.PathLike, text: str) -> Path:
    """``text`` (UTF-8) written atomically: markdown pages and other result text files."""
    return atomic_write(path, text.encode())


def os_error_line(e: OSError) -> str:
    """One line for an OS error: the path it concerns and the cause, e.g. ``cannot write
    store/index.json: No space left on device`` (what a command prints instead of a traceback)."""
    if e.strerror is None:  # raised with a message of our own (FileNotFoundError("no store ..."))
        return str(e) or type(e).__name__
    return f"{e.filename}: {e.strerror}" if e.filename else e.strerror


@contextlib.contextmanager
def atomic_folder(target: str | os.PathLike) -> Iterator[Path]:
    """``with atomic_folder(dst) as tmp: write files into tmp``: on success ``tmp`` (files fsynced)
    replaces ``dst`` (an old ``dst`` is removed first) and the parent folder is fsynced; on error
    nothing under ``dst`` changes."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-" + target.name))
    try:
        yield tmp
        for dirpath, _, files in os.walk(tmp):
            for name in files:
                with open(os.path.join(dirpath, name), "rb") as f:
                    os.fsync(f.fileno())
            fsync_dir(dirpath)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
        fsync_dir(target.parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


class UnreadableFile(ValueError):
    """A file that must not be read: not a regular file (a FIFO would block for ever, /dev/zero
    never ends) or larger than its cap. The message is one line naming the file."""


def read_capped(path: str | os.PathLike, max_bytes: int, what: str = "file") -> bytes:
    """The bytes of the regular file ``path``, refused (`UnreadableFile`) before any read if it is
    not a regular file or is over ``max_bytes`` (checked with ``fstat`` on the opened file, so a
    2 GiB sparse file costs nothing). Opened with O_NONBLOCK: a FIFO does not block the open."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnreadableFile(f"{what} {path}: not a regular file")
        if st.st_size > max_bytes:
            raise UnreadableFile(f"{what} {path}: {st.st_size} bytes is over the {max_bytes}-byte limit")
        os.set_blocking(fd, True)
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:  # grew while read
        raise UnreadableFile(f"{what} {path}: over the {max_bytes}-byte limit")
    return data
