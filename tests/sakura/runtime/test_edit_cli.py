"""`sakura edit` and the end-to-end benchmarks, on loopback with real parts (smoke scale)."""

import json

import numpy as np
import pytest
from skimage import io as skio
from typer.testing import CliRunner

from sakura.bench.e2e import METHODS, run_live, run_profile
from sakura.cli import app
from sakura.link import traces_root
from sakura.server import serve_in_thread
from sakura.store.build import build_store

runner = CliRunner()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    from sakura.bench.e2e import LIVE_LADDER

    build_store(root, templates=["sticker-00"], ladder=LIVE_LADDER, calibration=1, steps=1, log=lambda s: None)
    return root


def test_edit_command_writes_image(store, tmp_path):
    photo = tmp_path / "me.png"
    skio.imsave(str(photo), (np.random.default_rng(0).random((90, 120, 3)) * 255).astype("uint8"))
    out = tmp_path / "edited.png"
    with serve_in_thread(store) as url:
            res = runner.invoke(app, ["edit", str(photo), "--server", url, "--template", "sticker-00", "--out", str(out),
                                  "--steps", "2", "--policy", "raw-stream", "--gallery", str(tmp_path / "gallery")])
    assert res.exit_code == 0, res.output
    img = skio.imread(str(out))
    assert img.shape[:2] == (64, 64)
    assert "0 of 6 layers computed on the device" in res.output  # raw-stream fetches every shard
    assert res.output.count(":lossless") == 6
    assert (tmp_path / "edited.compare.png").is_file()
    # the server is gone now: the gallery kept the template, so the edit completes on the device
    out2 = tmp_path / "offline.png"
    res = runner.invoke(app, ["edit", str(photo), "--server", url, "--template", "sticker-00", "--out", str(out2),
                              "--steps", "2", "--gallery", str(tmp_path / "gallery")])
    assert res.exit_code == 0, res.output
    assert "using the gallery's copy" in res.output and "6 of 6 layers computed on the device" in res.output
    # same photo, same seed: the on-device edit differs from the lossless-KV one by fp16 rounding only
    a, b = skio.imread(str(out)).astype(int), skio.imread(str(out2)).astype(int)
    assert np.abs(a - b).max() <= 2
    # and a template the gallery never saw is a clear error, not a traceback
    res = runner.invoke(app, ["edit", str(photo), "--server", url, "--template", "look-00", "--out", str(out2),
                              "--gallery", str(tmp_path / "gallery")])
    assert res.exit_code == 2 and "not in the gallery" in res.output


def test_edit_command_rejects_bad_inputs(store, tmp_path):
    bad = tmp_path / "not-an-image.png"
    bad.write_bytes(b"hello")
    with serve_in_thread(store) as url:
        res = runner.invoke(app, ["edit", str(bad), "--server", url, "--template", "sticker-00"])
        assert res.exit_code == 2 and "not a readable image" in res.output
        res = runner.invoke(app, ["edit", str(tmp_path / "missing.png"), "--server", url, "--template", "sticker-00"])
        assert res.exit_code == 2 and "no such photo" in res.output
        res = runner.invoke(app, ["edit", str(bad), "--server", url, "--template", "sticker-00", "--policy", "fastest"])
        assert res.exit_code == 2 and "policy must be one of" in res.output


def test_live_bench_runs_every_method(store, tmp_path):
    if traces_root() is None:
        pytest.skip("real traces not found (SAKURA_TRACES or ../shared/traces)")
    r = run_live(tmp_path, steps=1, store=store, log=lambda s: None)
    assert [row["method"] for row in r["rows"]] == list(METHODS)
    by = {row["method"]: row for row in r["rows"]}
    assert by["raw-stream"]["bytes"] >= r["fp16_kv_bytes"]  # lossless moves at least the fp16 KV
    assert by["oracle"]["bytes"] == 0
    assert (tmp_path / "e2e_live.md").is_file() and (tmp_path / "e2e_live_timeline.png").is_file()
    saved = json.loads((tmp_path / "e2e_live.json").read_text())
    assert set(saved["latency_ratios"]) >= {"on-device/sakura", "cachegen/sakura"}
    # raw-stream moves lossless KV: its image is the oracle's up to nothing at all
    assert by["raw-stream"]["bit_exact_vs_lossless"] and by["oracle"]["bit_exact_vs_lossless"]


def test_profile_bench_smoke(store, tmp_path):
    if traces_root() is None:
        pytest.skip("real traces not found (SAKURA_TRACES or ../shared/traces)")
    r = run_profile(tmp_path, store=store, offsets_per_trace=1, families=["mahimahi_cellular"], log=lambda s: None)
    runs = r["runs"]
    assert len(runs) == 7
    for row in runs:
        # sakura can always fall back to computing locally: never much worse than on-device
        assert row["sakura"]["latency_s"] <= row["on-device"]["latency_s"] * 1.02
        assert row["sakura"]["latency_s"] >= row["oracle"]["latency_s"] - 1e-9
