"""Ctrl-C during `sakura build` ends it with one line and rc 130; the store stays consistent, and
the next build removes temp files a killed build left (real builds of the bundled model)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sakura.bench.children import build_signalled
from sakura.cli.build import INTERRUPTED
from sakura.wire.store import Store
from sakura.wire.store.layout import TMP_DIR

BUILD = ["--template", "look-00", "--template", "sticker-00", "--calibration", "1", "--steps", "1", "--workers", "2"]


def _build(store: Path, *, stop_at: str | None = None, sig: int = signal.SIGINT, timeout_s: float = 240.0):
    """`sakura build` in its own process group; with ``stop_at``, ``sig`` goes to the whole group
    (as Ctrl-C does) once the progress bar shows that text. Returns (rc, stderr text)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.Popen([sys.executable, "-m", "sakura", "build", str(store), *BUILD], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env, start_new_session=True)
    err = b""
    deadline = time.monotonic() + timeout_s
    try:
        if stop_at is not None:
            os.set_blocking(p.stderr.fileno(), False)
            while stop_at.encode() not in err and p.poll() is None and time.monotonic() < deadline:
                err += p.stderr.read() or b""
                time.sleep(0.05)
            os.killpg(p.pid, sig)
            os.set_blocking(p.stderr.fileno(), True)
        out, rest = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return p.returncode, (err + rest).decode(errors="replace")


def test_sigint_says_one_line_and_exits_130_then_a_rebuild_finishes(tmp_path):
    store = tmp_path / "store"
    k = build_signalled(store, BUILD, signal.SIGINT, stop_at=("ladder search", "fit tables", "encode"))
    assert k["signalled"], k  # the build was still running
    assert k["rc"] == 130, k
    # one line says so, last; no "Process ForkPoolWorker-1:", no traceback (a template that finished
    # before the signal has printed its summary above it)
    assert k["lines"][-1] == INTERRUPTED and k["lines"].count(INTERRUPTED) == 1, k
    assert not any(w in ln for ln in k["lines"] for w in ("Traceback", "Process ", "KeyboardInterrupt")), k
    if (store / "manifests").exists():  # a template that finished before the signal is committed whole
        assert Store(store).verify().ok
    (store / TMP_DIR).mkdir(exist_ok=True)
    (store / TMP_DIR / "left-by-a-sigkill.tmp").write_bytes(b"partial")  # what a SIGKILLed writer leaves
    rc, err = _build(store)
    assert rc == 0, err
    rep = Store(store).verify()
    assert rep.ok and rep.stale_temps == [] and len(rep.orphans) == 0
    assert os.listdir(store / TMP_DIR) == [".writers.lock"]  # the live writers' lock, nothing else
    assert len(Store(store).manifest_keys()) == 2


def _children(pid: int) -> list[int]:
    """The child processes of `pid` (/proc: its children list, else every process's parent field)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN
        kids = []
        for d in Path("/proc").iterdir():
            try:
                if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(d.name))
            except (OSError, IndexError, ValueError):
                continue
        return kids


def test_a_killed_template_process_ends_the_build_in_one_line_not_a_hang(tmp_path):
    """A template process that dies (the OOM killer, a crash below Python) ends the build with one
    error line (rc 2, as every "error:") within seconds: the parent reads its pipe's EOF; it does not wait on a
    lock the dead process held (a `multiprocessing.Pool` build hung so after Ctrl-C)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-m", "sakura", "build", str(tmp_path / "store"), *BUILD],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    out, t, kids = b"", time.monotonic(), []
    try:
        os.set_blocking(p.stdout.fileno(), False)
        while not kids and p.poll() is None and time.monotonic() - t < 240:  # until it forks
            out += p.stdout.read() or b""
            kids = _children(p.pid)
            time.sleep(0.01)
        assert kids, out  # the build was running its template processes
        os.kill(kids[0], signal.SIGKILL)
        os.set_blocking(p.stdout.fileno(), True)
        rest, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    lines = [ln for ln in (out + rest).decode(errors="replace").replace("\r", "\n").splitlines()
             if ln.strip() and "stages [" not in ln and not ln.startswith("  ")]
    assert p.returncode == 2, lines  # the CLI's "error:" status
    assert any("template process ended without a result" in ln and "exit code -9" in ln for ln in lines), lines
    assert not any("Traceback" in ln for ln in lines), lines
    if (tmp_path / "store" / "manifests").exists():  # a template that finished first is committed whole
        assert Store(tmp_path / "store").verify().ok
