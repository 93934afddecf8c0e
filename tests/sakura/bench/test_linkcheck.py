"""`sakura bench link` on loopback, small: the fetch stage alone through the pacer, every figure
a real measurement (the published run is `./dev sakura bench link`)."""

from __future__ import annotations

import math

from sakura.bench.linkcheck import link_markdown, run_link_check


def test_link_check_reports_the_capacity_lost_at_the_pacer(tmp_path):
    res = run_link_check((10,), rtt_ms=10.0, shards=4, shard_ms=40.0, out_dir=tmp_path)
    row, = res["rows"]
    assert row["completed"]
    carried = row["shards"] * row["shard_bytes"]
    offered = 10e6 / 8 * row["streaming_s"]   # what the link offered between first and last byte (about)
    # lost capacity is capacity the link offered while streaming, never more than it offered, and
    # the shards' bytes plus it cannot exceed it by more than a burst (15 kB), the response heads and
    # the pacer's read-ahead (50 ms of rate)
    assert 0.0 <= row["lost_bytes"] <= offered and math.isclose(row["lost_share"], row["lost_bytes"] / carried)
    assert carried + row["lost_bytes"] <= offered + 15_000 + 4 * 1_000 + 0.05 * 10e6 / 8
    md = link_markdown(res)
    assert "lost at the pacer" in md and (tmp_path / "link.md").read_text() == md
