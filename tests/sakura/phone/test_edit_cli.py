"""`sakura edit` and the end-to-end benchmarks, on loopback with real parts (smoke scale)."""

import json

import numpy as np
import pytest
from skimage import io as skio
from typer.testing import CliRunner

from sakura.bench.e2e import METHODS, run_live
from sakura.bench.profile import run_profile
from sakura.cli.main import app
from sakura.emulation import traces_root
from sakura.wire.server import serve_in_thread
from sakura.cloud.builder.pipeline import build_store

runner = CliRunner()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    from sakura.bench.e2e import LIVE_LADDER

    build_store(root, templates=["sticker-00"], ladder=LIVE_LADDER, calibration=1, steps=1)
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
        good = tmp_path / "photo.png"   # (the photo is checked before the policy: a readable one here)
        from PIL import Image

        Image.new("RGB", (64, 64), (200, 120, 40)).save(good)
        res = runner.invoke(app, ["edit", str(good), "--server", url, "--template", "sticker-00", "--policy", "fastest"])
        assert res.exit_code == 2 and "policy must be one of" in res.output


def test_live_bench_runs_every_method(store, tmp_path, need_trace):
    import inspect

    need_trace(inspect.signature(run_live).parameters["trace"].default)  # the bench's default (not bundled)
    r = run_live(tmp_path, steps=1, store=store)
    assert [row["method"] for row in r["rows"]] == list(METHODS)
    by = {row["method"]: row for row in r["rows"]}
    assert by["raw-stream"]["bytes"] >= r["fp16_kv_bytes"]  # lossless moves at least the fp16 KV
    assert by["oracle"]["bytes"] == 0
    assert (tmp_path / "e2e_live.md").is_file() and (tmp_path / "e2e_live_timeline.png").is_file()
    saved = json.loads((tmp_path / "e2e_live.json").read_text())
    assert set(saved["latency_ratios"]) >= {"on-device/sakura", "cachegen/sakura"}
    # raw-stream moves lossless KV: its image is the oracle's up to nothing at all
    assert by["raw-stream"]["bit_exact_vs_lossless"] and by["oracle"]["bit_exact_vs_lossless"]


def test_profile_bench_smoke(tmp_path):
    if traces_root() is None:
        pytest.skip("SAKURA_TRACES names no folder (unset, the bundled traces serve)")
    # a small measured ladder stand-in: two renditions with the shape the measurement produces
    ladder = {"model": "sakura-mini", "template": "t", "layers": 6, "floor_image_mse": 1e-4,
              "renditions": {"lossless": {"codec": "lossless", "bits_per_value": 16.0, "image_mse": 0.0,
                                          "decode_fp16_bytes_per_cpu_s": 2e9},
                             "progressive#0": {"codec": "progressive", "bits_per_value": 0.5, "image_mse": 5e-4,
                                               "decode_fp16_bytes_per_cpu_s": 1e8},
                             "progressive#1": {"codec": "progressive", "bits_per_value": 1.5, "image_mse": 5e-5,
                                               "decode_fp16_bytes_per_cpu_s": 1e8},
                             **{f"cachegen:level={i}": {"codec": "cachegen", "bits_per_value": 1.0 + i,
                                                        "image_mse": 1e-4 / i, "decode_fp16_bytes_per_cpu_s": 1e8}
                                for i in (1, 2, 3)}}}
    r = run_profile(tmp_path, workloads=["klein4b-1024"], phones=["11"], families=["mahimahi_cellular"],
                    traces_per_family=2, rates_mbps=(10, 1000), ladder=ladder)
    assert len(r["runs"]) == 4 and (tmp_path / "e2e_profile.md").is_file()
    for row in r["runs"]:
        # sakura can always fall back to computing locally: never much worse than on-device
        assert row["sakura"]["latency_s"] <= row["on-device"]["latency_s"] * 1.02
        assert row["sakura"]["latency_s"] >= row["oracle"]["latency_s"] - 1e-9
        # within the image quality floor: CacheGen level 3 on every shard (the mini model's 6 x 1e-4 in all)
        assert row["sakura"]["image_mse"] <= 6 * 1e-4 * (1 + 1e-6)
    fast = [r_ for r_ in r["runs"] if r_["link"] == "constant 1000 Mbit/s"][0]
    assert fast["sakura"]["latency_s"] < fast["on-device"]["latency_s"]  # streaming pays on a fast link
    assert (tmp_path / "e2e_profile_heatmap.png").is_file() and (tmp_path / "e2e_profile_cdf.png").is_file()
    assert (tmp_path / "e2e_frontier_klein4b-1024.png").is_file()
    from sakura.phone.driver import LOSS_BOUND

    for row in r["runs"]:
        assert row["sakura"]["latency_s"] <= row["on-device"]["latency_s"] * (1 + LOSS_BOUND) + 1e-9
        # the sweep holds each method's points; its default points are the methods' own runs
        sw = {(p["method"], p.get("levels"), p.get("target_x"), p.get("quality_x")): p for p in row["sweep"]}
        assert sw[("cachegen", 3, 1.0, None)]["latency_s"] == row["cachegen"]["latency_s"]
        assert sw[("cachegen-fair", 1, 1.0, None)]["latency_s"] == row["cachegen-fair-L3"]["latency_s"]
        assert sw[("sakura", None, None, 1.0)]["latency_s"] == row["sakura"]["latency_s"]
        # held to level 3: every streamed chunk at level 3, so at least level 3's quality
        assert row["cachegen-L3"]["image_mse"] <= 6 * 1e-4 / 3 * (1 + 1e-6)
    fc = r["family_checks"]
    assert fc["all"]["runs"] == 4 and fc["all"]["worst_vs_on_device"] <= 1 + LOSS_BOUND + 1e-9
    md = (tmp_path / "e2e_profile.md").read_text()
    assert "## Never slower" in md and "equal quality vs cachegen-L3" in md
    assert "losing runs" in (tmp_path / "e2e_profile_checks.txt").read_text()
    # the written profile replays: the same links, ladder and policy give every run's sakura latency again
    from sakura.bench.profile import replay_runs

    again = replay_runs(tmp_path / "e2e_profile.json", losers_only=False)
    assert len(again) == 4
    by_link = {row["link"]: row["sakura"]["latency_s"] for row in r["runs"]}
    for x in again:
        assert x["sakura_latency_s"] == pytest.approx(by_link[x["link"]], rel=1e-12) and x["now"] == pytest.approx(x["was"])
    # ... and with the CacheGen baselines re-simulated too (`--rerun-baselines`), every run's verdict again
    cg = {row["link"]: row["cachegen-L3"]["latency_s"] for row in r["runs"]}
    for x in replay_runs(tmp_path / "e2e_profile.json", losers_only=False, baselines=True):
        assert x["now"] == pytest.approx(x["was"], rel=1e-12)
        assert x["cachegen_L3_latency_s"] == pytest.approx(cg[x["link"]], rel=1e-12)


def test_server_unavailable_names_the_root_cause_not_the_fingerprint():
    from sakura.wire.client.client import FetchError
    from sakura.phone.editor import refresh_failure

    try:
        try:
            raise ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 9)")
        except ConnectionRefusedError as cause:
            raise FetchError(f"manifest {'ab' * 32}/sticker-00: gave up after 4 attempts ({cause!r})") from cause
    except FetchError as e:
        msg = refresh_failure(e, "sticker-00")
    assert msg.startswith("server unavailable (ConnectionRefusedError") and "Connect call failed" in msg
    assert "ab" * 32 not in msg


def test_refresh_failure_names_each_kind():
    """Each failure kind gets its own line; the ValueError subclasses are not read as a bad image."""
    from sakura.wire.client import DeadlineExceeded, IntegrityError, NotFound, RedirectRefused
    from sakura.phone.editor import refresh_failure
    from sakura.phone.limits import LimitError
    from sakura.wire.store.manifest import ManifestError

    said = {kind.__name__: refresh_failure(kind("why"), "sticker-00") for kind in
            (ManifestError, LimitError, NotFound, IntegrityError, DeadlineExceeded, RedirectRefused, ValueError)}
    assert said["ManifestError"] == "server sent a corrupt manifest for sticker-00 (ManifestError: why)"
    assert said["LimitError"].startswith("server's manifest for sticker-00 is over this model's limits (")
    assert said["NotFound"] == "server has no template sticker-00"
    assert said["IntegrityError"].startswith("server sent damaged bytes for sticker-00 (")
    assert said["DeadlineExceeded"] == "server too slow (DeadlineExceeded: why)"
    assert said["RedirectRefused"] == "server redirected elsewhere (RedirectRefused: why)"
    assert said["ValueError"] == "server's template image for sticker-00 is unusable (ValueError: why)"
    assert refresh_failure(OSError("down"), "sticker-00") == "server unavailable (OSError: down)"
