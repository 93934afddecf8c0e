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
    assert k["lines"] == [INTERRUPTED], k  # no "Process ForkPoolWorker-1:", no traceback
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
