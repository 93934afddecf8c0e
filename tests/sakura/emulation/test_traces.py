"""Trace parsers on the real files in ../shared/traces, and the pure capacity functions."""

from __future__ import annotations

import numpy as np
import pytest

from sakura.emulation import Trace, TraceError, list_traces, load_trace

MM = "mahimahi_cellular/Verizon-LTE-short.down"
NORWAY = "norway_hsdpa_3g/bus.ljansbakken-oslo-report.2010-09-28_1407CEST.log"
FCC = "fcc_broadband/trace_7289_http---www.yahoo.com"
DRIVE = "umn_5gophers/All-Carriers/03-User-Mobility/car-driving-trace-1.csv"
RUNS = "umn_5gophers/All-Carriers/01-Throughput/data.csv"
WALK = "umn_5gophers/All-Carriers/03-User-Mobility/walking-trace.csv"


def test_mahimahi_matches_readme_stats(troot):
    tr = load_trace(MM, troot)
    lines = (troot / MM).read_text().split()
    assert tr.period_s == int(lines[-1]) / 1000
    # every line is one 1500-byte opportunity per loop; README: pkts=58655, 5.03 Mbit/s overall
    assert tr.bytes_per_period == pytest.approx(58655 * 1500)
    assert tr.mean_mbps == pytest.approx(5.03, abs=0.005)
    # bytes in the first 10 ms == 1500 x the lines with timestamp < 10 (bin 0 also holds ts == period)
    ts = np.array([int(x) for x in lines])
    want = 1500 * (np.sum(ts < 10) + np.sum(ts == ts[-1]))
    assert tr.bytes_between(0, 0.010) == pytest.approx(want)


def test_cooked_semantics(troot):
    tr = load_trace(NORWAY, troot)
    rows = [tuple(map(float, l.split())) for l in (troot / NORWAY).read_text().splitlines() if l.strip()]
    # line i's rate holds on (t[i-1], t[i]]
    (t0, _), (t1, bw1), (t2, bw2) = rows[:3]
    assert tr.rate_at((t0 + t1) / 2) == pytest.approx(bw1 * 1e6 / 8)
    assert tr.rate_at((t1 + t2) / 2) == pytest.approx(bw2 * 1e6 / 8)
    assert tr.period_s == pytest.approx(rows[-1][0] - rows[0][0])
    fcc = load_trace(FCC, troot)
    assert np.allclose(np.diff(fcc.edges), 5.0)  # FCC: exact 5 s steps
    assert 0.9 < fcc.mean_mbps < 1.2              # README: mean 1.07 (per sample)


def test_5gophers_selectors_and_gaps(troot):
    tr = load_trace(f"{DRIVE}#Verizon", troot)
    import csv
    rows = {int(r["seq_num"]): float(r["Verizon_throughput_mbps"]) for r in csv.DictReader(open(troot / DRIVE))}
    assert 103 not in rows and 102 in rows
    assert tr.rate_at(50.5) == pytest.approx(rows[50] * 1e6 / 8)
    assert tr.rate_at(105.5) == pytest.approx(rows[102] * 1e6 / 8)  # the gap holds the last value
    assert tr.period_s == 126.0
    run = load_trace(f"{RUNS}#SPRINT/1/US-West/11", troot)
    assert 55 <= run.period_s <= 65 and 10 < run.mean_mbps < 100
    walk = load_trace(WALK, troot)
    assert walk.mean_mbps == pytest.approx(332.89, abs=0.01)  # README
    with pytest.raises(TraceError, match="carrier selector"):
        load_trace(DRIVE, troot)
    with pytest.raises(TraceError, match="SPRINT/1/US-West/11..20"):
        load_trace(f"{RUNS}#SPRINT/1/US-West/1", troot)
    with pytest.raises(TraceError, match="does not exist"):
        load_trace("nope.down", troot)


def test_every_trace_loads(troot):
    """Every trace under the root in use loads: the full collection (../shared/traces or
    SAKURA_TRACES) where there is one, else the subset bundled in the package (a plain clone)."""
    specs = list_traces(troot)
    fams = {s.split("/")[0] for s in specs}
    assert fams == {"mahimahi_cellular", "norway_hsdpa_3g", "fcc_broadband", "umn_5gophers"}
    for s in specs:
        tr = load_trace(s, troot)
        assert tr.period_s > 50 and tr.mean_mbps > 0.1, s


def test_the_full_collection_is_complete(troot):
    from sakura.emulation.traces import BUNDLED_TRACES

    if troot == BUNDLED_TRACES:
        pytest.skip("the full trace collection is not beside this checkout (../shared/traces) and SAKURA_TRACES "
                    "is unset: only the bundled subset is here")
    assert len(list_traces(troot)) == 7 + 12 + 11 + 3 * 2 + 1 + 120


def test_pure_capacity_functions():
    tr = Trace("t", edges=np.array([0.0, 1.0, 3.0, 4.0]), rate=np.array([100.0, 0.0, 50.0]))
    assert tr.period_s == 4.0 and tr.bytes_per_period == 150.0
    assert tr.cumulative(0.5) == 50.0
    assert tr.bytes_between(0.5, 3.5) == 50.0 + 25.0
    assert tr.bytes_between(3.5, 4.5) == 25.0 + 50.0            # wraps around
    assert tr.cumulative(10.0) == 2 * 150.0 + 100.0 + 0 + 0      # 2 loops + 2 s into the third
    assert tr.time_at(100.0) == 1.0                              # earliest time, not inside the zero gap
    assert tr.time_at(100.5) == pytest.approx(3.01)
    assert tr.time_at(150.0) == 4.0
    assert tr.time_at(151.0) == pytest.approx(4.01)
    rng = np.random.default_rng(0)
    for b in rng.uniform(0, 1000, 50):
        assert tr.cumulative(tr.time_at(b)) == pytest.approx(b)
    with pytest.raises(TraceError, match="no bytes"):
        Trace("z", edges=np.array([0.0, 1.0]), rate=np.array([0.0]))
    with pytest.raises(TraceError, match="strictly increase"):
        Trace("z", edges=np.array([0.0, 1.0, 1.0]), rate=np.array([1.0, 1.0]))


def test_bundled_traces_are_the_listed_upstream_files():
    """The subset shipped in the package: every data file its README lists is there, byte-identical
    to the upstream blob id (git's blob hash), and loads; nothing unlisted rides along."""
    import hashlib
    import re

    from sakura.emulation import BUNDLED_TRACES

    listed = dict(re.findall(r"^\| `([^`]+)` \|.*\| `([0-9a-f]{40})` \|", (BUNDLED_TRACES / "README.md").read_text(), re.M))
    assert len(listed) == 8
    for rel, blob in listed.items():
        data = (BUNDLED_TRACES / rel).read_bytes()
        assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == blob, rel
    data_files = {p.relative_to(BUNDLED_TRACES).as_posix() for p in BUNDLED_TRACES.rglob("*")
                  if p.is_file() and not p.name.startswith("UPSTREAM") and p.name != "README.md"}
    assert data_files == set(listed)
    specs = list_traces(BUNDLED_TRACES)
    assert "umn_5gophers/All-Carriers/01-Throughput/data.csv#VERIZON/8/US-East/102" in specs  # the demo's
    for s in specs[:: max(1, len(specs) // 12)]:
        assert load_trace(s, BUNDLED_TRACES).bytes_per_period > 0


def test_a_trace_folder_without_the_file_falls_back_to_the_bundled_one(tmp_path, monkeypatch):
    from sakura.emulation import BUNDLED_TRACES, resolve_trace_path, traces_root

    monkeypatch.setenv("SAKURA_TRACES", str(tmp_path))
    assert traces_root() == tmp_path
    assert resolve_trace_path(MM) == BUNDLED_TRACES / MM
    (tmp_path / "mahimahi_cellular").mkdir()
    (tmp_path / MM).write_text("0\n5\n10\n")  # the user's folder wins where it has the file
    assert load_trace(MM).period_s == 0.010
    with pytest.raises(TraceError, match="SAKURA_TRACES"):
        load_trace("mahimahi_cellular/no-such.down")
    monkeypatch.setenv("SAKURA_TRACES", str(tmp_path / "missing"))
    assert traces_root() is None
    with pytest.raises(TraceError, match="not a folder"):
        load_trace(MM)


def test_every_trace_reads_in_words():
    from sakura.emulation.traces import describe_trace

    assert describe_trace("umn_5gophers/All-Carriers/01-Throughput/data.csv#VERIZON/8/US-East/102") == \
        "5G Verizon, 8 TCP connections to US-East, run 102 (5Gophers 2019)"
    assert describe_trace(f"{DRIVE}#TMobile") == "5G T-Mobile, driving (trace 1; 5Gophers 2019)"
    assert describe_trace("mahimahi_cellular/TMobile-LTE-short.down") == "T-Mobile LTE short (mahimahi cellular)"
    assert describe_trace(NORWAY).startswith("3G HSDPA, bus ")
    for s in list_traces():  # no spec falls through as its bare path
        assert describe_trace(s) != s, s
