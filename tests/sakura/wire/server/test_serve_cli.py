"""`sakura serve` as a real subprocess, plain and behind the emulated link."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from sakura.emulation import traces_root
from sakura.wire.store.synthetic import make_synthetic_store


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: connection attempts, 0.05 s apart, before `sakura serve` counts as not started (it imports torch)
_START_POLLS = 600


def _serve(store, *extra):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", "from sakura.cli.main import app; app()", "serve", str(store),
                             "--port", str(port), *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # bounded by a count of polls (the harness timeout guards a hang), not by the clock
    for _ in range(_START_POLLS):
        assert proc.poll() is None, proc.stderr.read().decode()[-500:]
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"sakura serve did not listen within {_START_POLLS} polls")


def _get_time(url):
    t0 = time.monotonic()
    with urllib.request.urlopen(url, timeout=10) as r:  # new connection each time
        body = r.read()
    return time.monotonic() - t0, body


@pytest.mark.timeout(180)  # a hang guard for the harness
def test_serve_plain_and_with_emulated_link(tmp_path):
    if traces_root() is None:
        pytest.skip("SAKURA_TRACES names no folder (unset, the bundled traces serve)")
    make_synthetic_store(tmp_path, templates=1, layers=1)
    want = (tmp_path / "index.json").read_bytes()
    proc, url = _serve(tmp_path, "--quiet")
    try:
        _, body = _get_time(f"{url}/index.json")
        assert body == want
    finally:
        proc.terminate()
        proc.wait(10)
    proc, url = _serve(tmp_path, "--quiet", "--trace", "fcc_broadband/trace_7289_http---www.yahoo.com",
                       "--trace-offset", "100", "--rtt-ms", "150")
    try:
        dt, body = _get_time(f"{url}/index.json")
        assert body == want
        # the emulated RTT is in the path: a new connection pays the handshake RTT and the request RTT
        # (a lower bound, which load cannot break; how close the emulation is is `sakura bench link`'s)
        assert dt >= 2 * 0.150
    finally:
        proc.terminate()
        proc.wait(10)
    r = subprocess.run([sys.executable, "-c", "from sakura.cli.main import app; app()", "serve", str(tmp_path / "nope")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "does not exist" in r.stderr
