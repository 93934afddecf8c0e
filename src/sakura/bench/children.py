"""Commands run as child processes by the reliability benches: each gets its own wall time, exit
code, output lines and peak memory (the child's own VmHWM, reported by the child at exit)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import signal

#: Child prologue: print the process's own peak RSS at exit. VmHWM belongs to the address space
#: the child got at exec; ru_maxrss would also count the parent's pages it was forked with.
PROLOGUE = ("import atexit, sys\n"
            "def _hwm():\n"
            "    for ln in open('/proc/self/status'):\n"
            "        if ln.startswith('VmHWM:'): sys.stderr.write('SAKURA_VMHWM_KIB=' + ln.split()[1] + '\\n')\n"
            "atexit.register(_hwm)\n")
#: The `sakura` command after the prologue.
SAKURA_MAIN = "from sakura.cli.main import app\napp()\n"
_HWM = "SAKURA_VMHWM_KIB="


def vm_hwm_kib(pid: int) -> int | None:
    """Peak resident memory of process ``pid`` so far (KiB), from /proc; None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for ln in f:
                if ln.startswith("VmHWM:"):
                    return int(ln.split()[1])
    except (OSError, ValueError):
        return None
    return None


def run_child(argv: list[str], timeout_s: float, *, code: str | None = None) -> dict:
    """`sakura ARGV` (or python ``code`` with ARGV as sys.argv[1:]) in a child: ``wall_s``, ``rc``,
    ``timed_out``, the last 40 non-empty output ``lines``, the ``raw`` output bytes and
    ``peak_rss_mib`` (the child's VmHWM at exit, else the last value polled). Killed at ``timeout_s``."""
    src = PROLOGUE + (code if code is not None else SAKURA_MAIN)
    with tempfile.TemporaryFile() as out:
        t = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-c", src, *argv], stdout=out, stderr=subprocess.STDOUT,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
        timed_out, polled = False, None
        while p.poll() is None:
            polled = vm_hwm_kib(p.pid) or polled
            if time.perf_counter() - t > timeout_s and not timed_out:
                timed_out = True
                p.kill()
            time.sleep(0.05)
        wall = time.perf_counter() - t
        out.seek(0)
        raw = out.read()
    lines = [ln for ln in raw.decode(errors="replace").splitlines() if ln.strip()]
    hwm = [int(ln.split("=", 1)[1]) for ln in lines if ln.startswith(_HWM)]
    peak = hwm[-1] if hwm else polled
    return {"wall_s": wall, "rc": p.returncode, "timed_out": timed_out,
            "lines": [ln for ln in lines if not ln.startswith(_HWM)][-40:], "raw": raw,
            "peak_rss_mib": None if peak is None else peak / 1024}


def build_signalled(store: str | os.PathLike, args: list[str], sig: int, *, stop_at: tuple[str, ...],
                    timeout_s: float = 300.0) -> dict:
    """`sakura build STORE ARGS` in its own process group; once its progress bar shows one of
    ``stop_at`` (stage names: the bar redraws twice a second, so a short stage may never show),
    ``sig`` goes to the whole group (as Ctrl-C sends SIGINT to every process of the foreground
    job). Returns ``rc``, ``wall_s``, the output ``lines`` without the bar and ``signalled``
    (False if the build ended before any of the texts appeared)."""

    p = subprocess.Popen([sys.executable, "-m", "sakura", "build", str(store), *args], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    t = time.perf_counter()
    os.set_blocking(p.stdout.fileno(), False)
    out = b""
    try:
        while not any(x.encode() in out for x in stop_at) and p.poll() is None and time.perf_counter() - t < timeout_s:
            out += p.stdout.read() or b""
            time.sleep(0.05)
        signalled = p.poll() is None
        if signalled:
            os.killpg(p.pid, sig)
        os.set_blocking(p.stdout.fileno(), True)
        rest, _ = p.communicate(timeout=max(1.0, timeout_s - (time.perf_counter() - t)))
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    text = (out + (rest or b"")).decode(errors="replace").replace("\r", "\n")
    return {"rc": p.returncode, "wall_s": time.perf_counter() - t, "signalled": signalled,
            "lines": [ln for ln in text.splitlines() if ln.strip() and " stages " not in ln and "stages [" not in ln]}
