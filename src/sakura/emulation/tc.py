"""Optional kernel shaping: Linux ``tc tbf`` between two private network namespaces.

Needs root and ``ip``/``tc``; the user-space ``PacingProxy`` is the default and needs neither.
``netem`` (delay) does not work on these machines, so this mode shapes rate only.

Topology (``NetnsPair``): two namespaces this process creates, ``server`` (10.77.0.1) and
``phone`` (10.77.0.2), joined by a veth pair. The tbf qdisc sits on the server side's veth, so it
shapes only server->phone data; the phone's ACKs and requests travel unshaped (shaping ``lo``
would queue the ACKs behind the data and starve TCP). Nothing on the host's interfaces changes;
both namespaces are deleted on exit.

``TbfShaper`` replays a trace by changing the tbf rate every ``step_s`` seconds to the trace's
mean rate over that step (``Trace.bytes_between``), so over windows of whole steps the kernel's
budget equals the trace's bytes, counted as TCP payload like the user-space pacer
(``WIRE_PER_PAYLOAD`` adds the header bytes tbf sees).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

from sakura.emulation.traces import Trace, load_trace

SERVER_IP, PHONE_IP = "10.77.0.1", "10.77.0.2"
#: tbf counts frames on the veth (14-byte Ethernet + 20 IP + 32 TCP-with-timestamps headers per
#: 1448 payload bytes); the user-space pacer and the throughput traces count payload, so rates are
#: scaled by this to make the kernel deliver the trace's bytes as payload.
WIRE_PER_PAYLOAD = 1514 / 1448


def _run(*argv: str) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, timeout=10)


class NetnsPair:
    """Two named network namespaces joined by a veth pair; deleted again on exit."""

    def __init__(self) -> None:
        pid = os.getpid()
        self.server, self.phone = f"sakura-{pid}-srv", f"sakura-{pid}-ph"
        self.server_dev, self.phone_dev = f"sks{pid % 100000}", f"skp{pid % 100000}"  # <= 15 chars

    @staticmethod
    def remove_stale() -> list[str]:
        """Delete ``sakura-<pid>-*`` namespaces whose creating process is gone (a killed test)."""
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
        gone = []
        for line in out.splitlines():
            m = re.match(r"(sakura-(\d+)-(?:srv|ph))\b", line.strip())
            if m and not os.path.exists(f"/proc/{m.group(2)}"):
                subprocess.run(["ip", "netns", "del", m.group(1)], capture_output=True, timeout=10)
                gone.append(m.group(1))
        return gone

    def exec(self, ns: str, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", ns, *argv]

    def __enter__(self) -> "NetnsPair":
        self.remove_stale()
        try:
            _run("ip", "netns", "add", self.server)
            _run("ip", "netns", "add", self.phone)
            _run("ip", "link", "add", self.server_dev, "type", "veth", "peer", "name", self.phone_dev)
            _run("ip", "link", "set", self.server_dev, "netns", self.server)
            _run("ip", "link", "set", self.phone_dev, "netns", self.phone)
            for ns, dev, ip in ((self.server, self.server_dev, SERVER_IP), (self.phone, self.phone_dev, PHONE_IP)):
                _run(*self.exec(ns, "ip", "addr", "add", f"{ip}/24", "dev", dev))
                _run(*self.exec(ns, "ip", "link", "set", dev, "up"))
                _run(*self.exec(ns, "ip", "link", "set", "lo", "up"))
            # No GSO/TSO super-packets on the shaped side: tbf must see wire-sized packets, or a
            # 64 KiB segment needs a 64 KiB bucket (and every rate change refills the bucket).
            _run(*self.exec(self.server, "ip", "link", "set", "dev", self.server_dev, "gso_max_segs", "1"))
            _run(*self.exec(self.server, "ip", "link", "set", "dev", self.server_dev, "gso_max_size", "1500"))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for ns in (self.server, self.phone):  # deleting a namespace destroys its veth end too
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


def unavailable_reason() -> str | None:
    """None if the tc/netns mode can run here, else why not (for a test's skip message)."""
    if not sys.platform.startswith("linux"):
        return "tc/netns need Linux"
    if os.geteuid() != 0:
        return "tc tbf between network namespaces needs root"
    for tool in ("tc", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    try:
        with NetnsPair() as p:
            _run(*p.exec(p.server, "tc", "qdisc", "add", "dev", p.server_dev, "root", "tbf", "rate", "1mbit",
                         "burst", "16kb", "latency", "50ms"))
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        err = getattr(e, "stderr", b"") or b""
        return f"cannot set up namespaces with tbf: {err.decode(errors='replace').strip()[:200] or e}"
    return None


class TbfShaper:
    """Drive ``tc qdisc ... tbf`` on ``dev`` (in namespace ``netns``) from a trace.

    Args:
        trace: capacity over time. offset_s: trace time at start (seconds).
        step_s: how often the rate is changed (seconds). latency_ms: tbf queue limit as delay.
    """

    def __init__(self, trace: Trace, *, dev: str, netns: str, offset_s: float = 0.0, step_s: float = 0.5,
                 latency_ms: int = 400) -> None:
        self.trace, self.dev, self.netns = trace, dev, netns
        self.offset_s, self.step_s, self.latency_ms = offset_s, step_s, latency_ms
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tbf-shaper", daemon=True)
        self.start_time = float("nan")
        self.changes = 0

    @staticmethod
    def burst_bytes(rate_Bps: float) -> int:
        """tbf bucket: two full packets, or 2 ms of rate if larger."""
        return max(3_100, int(rate_Bps * 0.002))

    def _set(self, verb: str, rate_Bps: float) -> None:
        bits = max(8_000, int(rate_Bps * 8))            # tbf wants a positive rate
        _run("ip", "netns", "exec", self.netns, "tc", "qdisc", verb, "dev", self.dev, "root", "tbf",
             "rate", f"{bits}bit", "burst", str(self.burst_bytes(rate_Bps)), "latency", f"{self.latency_ms}ms")
        self.changes += 1

    def _rate(self, k: int) -> float:
        """Rate for step k (bytes/s): the trace's bytes in the step, less the full bucket that
        ``tc qdisc change`` hands out at the start of every step (tbf resets its tokens)."""
        t0 = self.offset_s + k * self.step_s
        budget = self.trace.bytes_between(t0, t0 + self.step_s)
        wire = budget * WIRE_PER_PAYLOAD
        return max(0.0, wire - self.burst_bytes(wire / self.step_s)) / self.step_s

    def start(self) -> "TbfShaper":
        self._set("add", self._rate(0))
        self.start_time = time.monotonic()
        self._thread.start()
        return self

    def _loop(self) -> None:
        k = 1
        while not self._stop.wait(max(0.0, self.start_time + k * self.step_s - time.monotonic())):
            self._set("change", self._rate(k))
            k += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


_SOURCE = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 0)); s.listen(1); print(s.getsockname()[1], flush=True)
c, _ = s.accept(); blob = bytes(65536)
try:
    while True: c.sendall(blob)
except OSError: pass
"""

_SINK = """
import json, socket, sys, time
end = float(sys.argv[3]); c = socket.create_connection((sys.argv[1], int(sys.argv[2]))); c.settimeout(0.2)
out = []
while time.monotonic() < end:
    try: b = c.recv(1 << 20)
    except socket.timeout: continue
    if not b: break
    out.append((time.monotonic(), len(b)))
print(json.dumps(out))
"""


def measure_tbf(spec: str, *, offset_s: float, seconds: float, step_s: float = 0.5) -> dict:
    """Saturating TCP transfer server->phone through tbf replaying ``spec``; returns
    ``{"start": monotonic start of the trace, "arrivals": [(monotonic t, bytes)], "changes": n}``.
    (CLOCK_MONOTONIC is shared by every namespace of one kernel, so times compare directly.)"""
    tr = load_trace(spec)
    with NetnsPair() as p:
        src = subprocess.Popen(p.exec(p.server, sys.executable, "-c", _SOURCE, SERVER_IP),
                               stdout=subprocess.PIPE, text=True)
        try:
            port = int(src.stdout.readline())
            shaper = TbfShaper(tr, dev=p.server_dev, netns=p.server, offset_s=offset_s, step_s=step_s).start()
            try:
                sink = subprocess.run(p.exec(p.phone, sys.executable, "-c", _SINK, SERVER_IP, str(port),
                                             str(shaper.start_time + seconds)),
                                      capture_output=True, text=True, timeout=seconds + 30)
            finally:
                shaper.stop()
            if sink.returncode != 0:
                raise RuntimeError(f"sink failed: {sink.stderr[-500:]}")
            return {"start": shaper.start_time, "arrivals": json.loads(sink.stdout), "changes": shaper.changes}
        finally:
            src.kill()
            src.wait(5)
