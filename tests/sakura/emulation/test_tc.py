"""Optional kernel mode: tc tbf between two network namespaces this test creates (root only).

One 10-s window (after 1 s warm-up) of a real 5Gophers run; ~13 s. Skipped with the reason when
not root / no tc / namespaces not permitted.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from sakura.emulation import load_trace
from sakura.emulation.tc import measure_tbf, unavailable_reason


def test_tbf_replays_trace_within_5pct(troot, monkeypatch):
    why = unavailable_reason()
    if why:
        pytest.skip(why)
    monkeypatch.setenv("SAKURA_TRACES", str(troot))  # the namespaced children resolve it too
    spec, off = "umn_5gophers/All-Carriers/01-Throughput/data.csv#SPRINT/1/US-West/11", 5.0
    r = measure_tbf(spec, offset_s=off, seconds=11.3)
    a = np.array(r["arrivals"])
    t, n = a[:, 0] - r["start"], a[:, 1]
    got = n[(t >= 1.0) & (t < 11.0)].sum()
    want = load_trace(spec, troot).bytes_between(off + 1.0, off + 11.0)
    assert r["changes"] >= 20
    assert abs(got / want - 1) < 0.05, f"tbf delivered {got} B, trace allows {want:.0f} B"
    # the namespaces are gone again
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "sakura-" not in ns
