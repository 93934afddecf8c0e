"""`sakura bench profile --jobs N` runs the independent runs in processes: the same result as one."""

import json
from pathlib import Path

import pytest

from sakura.bench.profile import run_profile
from sakura.emulation import traces_root


# traces_root: $SAKURA_TRACES, else <repo>/../shared/traces, else the bundled subset: runs everywhere
@pytest.mark.skipif(traces_root() is None, reason="SAKURA_TRACES names no folder (unset, the bundled traces serve)")
def test_profile_jobs_give_the_same_runs(tmp_path):
    ladder = json.loads((Path(__file__).parents[3] / "docs/e2e/e2e_profile.json").read_text())["ladder"]
    kw = dict(workloads=["style3x1024-out512"], phones=["~3.6"], families=["mahimahi_cellular"],
              traces_per_family=2, rates_mbps=(50.0,), ladder=ladder, decode_workers=2,
              sweep=False)
    one = run_profile(tmp_path / "one", jobs=1, **kw)
    two = run_profile(tmp_path / "two", jobs=2, **kw)
    assert len(one["runs"]) == 3
    assert one["runs"] == two["runs"]
    assert one["decode_split"] == two["decode_split"] >= 1.0


@pytest.mark.skipif(traces_root() is None, reason="SAKURA_TRACES names no folder (unset, the bundled traces serve)")
def test_replay_jobs_and_families_give_the_same_runs(tmp_path):
    """`--replay --all-runs --jobs 2 --families F` re-simulates sakura on F's runs only, in processes, with the
    same results as one process; on the profile's own code it reproduces the profile's sakura exactly."""
    from sakura.bench.profile import replay_runs

    ladder = json.loads((Path(__file__).parents[3] / "docs/e2e/e2e_profile.json").read_text())["ladder"]
    run_profile(tmp_path, workloads=["style3x1024-out512"], phones=["~3.6"], families=["mahimahi_cellular"],
                traces_per_family=2, rates_mbps=(50.0,), ladder=ladder, decode_workers=2, sweep=False)
    path = tmp_path / "e2e_profile.json"
    one = replay_runs(path, losers_only=False, families=["mahimahi_cellular"], jobs=1)
    two = replay_runs(path, losers_only=False, families=["mahimahi_cellular"], jobs=2)
    assert len(one) == 2 and {x["family"] for x in one} == {"mahimahi_cellular"}  # the constant link is left out
    assert one == two
    assert all(x["now"] == x["was"] and x["psnr_db"] == x["psnr_was_db"] for x in one)
