"""`sakura edit` against bad inputs and hostile servers on 127.0.0.1: one clear line, the right
kind of message, fallbacks to the gallery, and bounded time (generous bounds: "it did not hang")."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from skimage import io as skio
from typer.testing import CliRunner

from sakura.cli.main import app
from sakura.emulation.faults import hostile_in_thread
from sakura.wire.server import serve_in_thread
from sakura.cloud.builder.pipeline import build_store

pytestmark = pytest.mark.timeout(300)
runner = CliRunner()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("estore")
    build_store(root, templates=["sticker-00"], calibration=1, steps=1, log=lambda s: None)
    return root


@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    p = tmp_path_factory.mktemp("photo") / "me.png"
    skio.imsave(str(p), (np.random.default_rng(0).random((70, 70, 3)) * 255).astype("uint8"), check_contrast=False)
    return p


def edit(photo, url, out, gallery, *extra):
    return runner.invoke(app, ["edit", str(photo), "--server", url, "--template", "sticker-00", "--out", str(out),
                               "--steps", "1", "--gallery", str(gallery), *extra])


@pytest.fixture(scope="module")
def warm_gallery(store, photo, tmp_path_factory):
    d = tmp_path_factory.mktemp("warm")
    g = d / "gallery"
    with serve_in_thread(store) as url:
        r = edit(photo, url, d / "warm.png", g)
    assert r.exit_code == 0, r.output
    return g


def test_bad_out_is_refused_before_any_work(store, photo, tmp_path):
    (tmp_path / "adir.png").mkdir()
    (tmp_path / "afile").write_text("x")
    cases = [(tmp_path / "adir.png", "is a directory"), (tmp_path / "afile" / "e.png", "is a file, not a directory"),
             (tmp_path / "x.txt", "must end in"), ("/proc/sakura-edit.png", "cannot write in")]
    with serve_in_thread(store) as url:
        for out, msg in cases:
            r = edit(photo, url, out, tmp_path / "g")
            assert r.exit_code == 2 and msg in r.output, (out, r.output)
            assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
    assert not (tmp_path / "g").exists()  # nothing fetched, nothing written


def test_unwritable_gallery_is_reported_as_such_and_the_edit_proceeds(store, photo, tmp_path):
    g = tmp_path / "gallery-is-a-file"
    g.write_text("not a directory")
    with serve_in_thread(store) as url:
        r = edit(photo, url, tmp_path / "o.png", g)
    assert r.exit_code == 0, r.output
    assert "is not writable" in r.output and "without caching" in r.output
    assert "cannot get template" not in r.output and (tmp_path / "o.png").is_file()


def _corrupt_copy(store, tmp_path):
    from sakura.wire.store import Store

    root = tmp_path / "corrupt"
    shutil.copytree(store, root)
    (fp, tid), = Store(root).manifest_keys()
    Store(root).manifest_path(fp, tid).write_text('{"schema": "sakura.manifest", "schema_version": ' + "9" * 5000 + "}")
    return root


def test_corrupt_manifest_is_not_called_server_unavailable(store, photo, tmp_path, warm_gallery):
    bad = _corrupt_copy(store, tmp_path)
    with serve_in_thread(bad) as url:
        r = edit(photo, url, tmp_path / "o.png", tmp_path / "empty-gallery")
        assert r.exit_code == 2 and "server sent a corrupt manifest" in r.output, r.output
        assert "server unavailable" not in r.output
        r = edit(photo, url, tmp_path / "o2.png", warm_gallery)
    assert r.exit_code == 0 and "server sent a corrupt manifest" in r.output and "gallery's copy" in r.output


@pytest.mark.timeout(120)  # the hang was infinite: a hang guard for the harness, not a timing check
def test_dripping_server_falls_back_to_the_gallery_in_bounded_time(store, photo, tmp_path, warm_gallery):
    with serve_in_thread(store) as up, hostile_in_thread(up, "drip", drip_s=1.0) as (url, _):
        r = edit(photo, url, tmp_path / "o.png", warm_gallery)
    # "server too slow" is the refresh deadline firing (DeadlineExceeded), not a read timeout
    assert r.exit_code == 0 and "server too slow" in r.output and "gallery's copy" in r.output, r.output


def test_huge_template_ref_is_refused_before_it_is_fetched(store, photo, tmp_path, warm_gallery):
    with serve_in_thread(store) as up, hostile_in_thread(up, "huge", huge_bytes=1_500_000_000) as (url, srv):
        r = edit(photo, url, tmp_path / "o.png", warm_gallery)
        objects = [q.path for q in srv.requests if q.path.startswith("/objects/")]
    assert r.exit_code == 0 and "over this model's limits" in r.output, r.output
    assert srv.huge_sha is not None and not any(p.endswith(srv.huge_sha) for p in objects)


def test_redirect_elsewhere_is_a_fetch_failure_and_never_followed(store, photo, tmp_path, warm_gallery):
    with serve_in_thread(store) as up, hostile_in_thread(up, "record") as (far, rec), \
            hostile_in_thread(up, "redirect", redirect_to=far) as (url, _):
        r = edit(photo, url, tmp_path / "o.png", warm_gallery)
    assert r.exit_code == 0 and "redirected elsewhere" in r.output and "gallery's copy" in r.output, r.output
    assert rec.requests == []


def test_manifest_with_impossible_shard_shapes_goes_on_device(store, photo, tmp_path, warm_gallery):
    """A manifest whose shards claim another model's KV shape: refused before any shard fetch."""
    import json

    from sakura.wire.store import Store

    root = tmp_path / "shapes"
    shutil.copytree(store, root)
    (fp, tid), = Store(root).manifest_keys()
    p = Store(root).manifest_path(fp, tid)
    from sakura.wire.store.manifest import manifest_tree

    d = manifest_tree(p.read_bytes())
    d["kv_layout"]["heads"] = 64
    d["kv_layout"]["head_dim"] = 1024
    p.write_text(json.dumps(d))
    with serve_in_thread(root) as up, hostile_in_thread(up, "record") as (url, rec):
        r = edit(photo, url, tmp_path / "o.png", tmp_path / "g2", "--policy", "raw-stream")
        shard_reqs = [q for q in rec.requests if q.path.startswith("/objects/")][1:]  # after the template ref
    assert r.exit_code == 0, r.output
    assert "64 heads x 1024" in r.output and "6 of 6 layers computed on the device" in r.output
    assert shard_reqs == []


def test_raw_stream_on_a_store_without_a_lossless_rung_says_so_in_one_line(store, photo, tmp_path):
    """The default ladder has no lossless rung: raw-stream (the uncompressed baseline) says so and
    computes every layer on the device, instead of marking all layers "failed" unexplained."""
    with serve_in_thread(store) as url:
        r = edit(photo, url, tmp_path / "o.png", tmp_path / "g", "--policy", "raw-stream")
    assert r.exit_code == 0, r.output
    said = [ln for ln in r.output.splitlines() if "lossless rendition" in ln]
    assert len(said) == 1 and "this store's ladder lacks" in said[0], r.output
    assert "0 B fetched" in r.output


def test_the_reported_floor_is_named_an_estimate_with_its_held_out_error(store, photo, tmp_path):
    """Issue 43 item 6: the floor is estimated on the build's calibration photos; the record says so
    and carries the error `sakura bench faults` measured on held-out photos (sakura/assets)."""
    import json

    from sakura.phone.editor import FLOOR_BASIS, floor_heldout_error

    with serve_in_thread(store) as url:
        r = edit(photo, url, tmp_path / "o.png", tmp_path / "g", "--json")
    assert r.exit_code == 0, r.output
    rec = json.loads(r.output[r.output.index("{"):])
    est = rec["floor_estimate"]
    assert est["basis"] == FLOOR_BASIS and "calibration photos" in est["basis"]
    assert est["psnr_db"] == rec["floor_psnr_db"]
    held = floor_heldout_error()
    assert held is not None, "sakura/assets/floor_heldout.json is missing: `sakura bench faults --publish`"
    assert est["heldout_error_db"] == held and held["edits"] > 0 and held["max_shortfall_db"] >= 0
