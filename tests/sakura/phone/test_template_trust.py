"""Issue 35 items 1, 5, 6 and the listing part of 10, on 127.0.0.1 with real servers and edits:
an edit reads only the manifest it needs; listing has one deadline and names what it skips;
server strings never reach the terminal raw; the gallery pins each template id."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
from skimage import io as skio
from typer.testing import CliRunner

from sakura.cli.main import app
from sakura.emulation.faults import hostile_in_thread
from sakura.phone.discovery import format_templates, list_templates
from sakura.phone.gallery import Gallery, GalleryError, TemplateChanged
from sakura.util.fsutil import atomic_write
from sakura.wire.server import serve_in_thread
from sakura.wire.store import Store
from sakura.wire.store.layout import manifest_relpath
from sakura.wire.store.store import _locked, _write_index
from sakura.wire.store.synthetic import make_synthetic_store

pytestmark = pytest.mark.timeout(300)
runner = CliRunner()


def _put(root, m, *, as_id=None, as_fp=None):
    """Write manifest ``m`` at the path of (as_fp, as_id) and re-index: what a broken or hostile
    store serves."""
    fp, tid = as_fp or m.model_fingerprint, as_id or m.template_id
    atomic_write(root / manifest_relpath(fp, tid), m.to_bytes())
    with _locked(root):
        _write_index(root)


# ----------------------------------------------------------------------- listing (no model)
def test_listing_skips_and_names_a_stale_entry(tmp_path):
    """main: one stale manifest in the index made the whole listing fail."""
    make_synthetic_store(tmp_path, templates=3, layers=1, tokens=8, width=8)
    (tmp_path / "manifests" / "synthetic-model" / "tpl-001.json").unlink()  # index still lists it
    with serve_in_thread(tmp_path) as url:
        got = list_templates(url)
    assert [t.template_id for t in got] == ["tpl-000", "tpl-002"]
    assert len(got.skipped) == 1 and "tpl-001" in got.skipped[0]
    assert "skipped" in format_templates(got) and "tpl-001" in format_templates(got)


def test_listing_has_one_overall_deadline(tmp_path):
    """Three listed manifests dripping one byte a second: the listing ends at its deadline and
    names them (main: waited for each in turn)."""
    make_synthetic_store(tmp_path, templates=4, layers=1, tokens=8, width=8)
    honest = {"/index.json", "/" + manifest_relpath("synthetic-model", "tpl-000")}
    with serve_in_thread(tmp_path) as up, hostile_in_thread(up, "drip", drip_s=1.0, honest_paths=honest) as (url, _):
        t0 = time.monotonic()
        got = list_templates(url, deadline_s=2.0)
        took = time.monotonic() - t0
    assert took < 8.0, took  # a hang guard: 2 s deadline plus teardown
    assert [t.template_id for t in got] == ["tpl-000"]
    assert sorted(s.split(":")[0].split("/")[-1] for s in got.skipped) == ["tpl-001", "tpl-002", "tpl-003"]


def test_lookup_asks_for_one_manifest_only(tmp_path):
    """What an edit asks before its template image: one manifest, by id (main listed the index and
    fetched all of them, one by one). A 404 lists what is offered instead."""
    import asyncio

    from sakura.phone.discovery import TemplateNotOffered, offered_manifest
    from sakura.wire.client import TemplateClient

    make_synthetic_store(tmp_path, templates=30, layers=1, tokens=8, width=8)

    async def look(url, tid):
        async with TemplateClient(url, max_retries=1) as c:
            return await offered_manifest(c, "synthetic-model", tid, "synthetic", deadline_s=5.0)

    with serve_in_thread(tmp_path) as up, hostile_in_thread(up, "record") as (url, srv):
        m = asyncio.run(look(url, "tpl-007"))
        assert m.template_id == "tpl-007"
        assert [q.path for q in srv.requests] == ["/" + manifest_relpath("synthetic-model", "tpl-007")]
        with pytest.raises(TemplateNotOffered, match="offers no template 'nope'.*it offers 30"):
            asyncio.run(look(url, "nope"))


def test_server_strings_are_sanitised_in_the_listing(tmp_path):
    """A manifest's kv_layout.model with escapes and a newline: shown escaped, on one line."""
    make_synthetic_store(tmp_path, templates=1, layers=1, tokens=8, width=8)
    m = Store(tmp_path).get_manifest("synthetic-model", "tpl-000")
    evil = "\x1b[2J\x1b]0;pwned\x07mini\nerror: your photo was uploaded"
    _put(tmp_path, dataclasses.replace(m, kv_layout={**m.kv_layout, "model": evil, "instruction": "\x1b[31mred"}))
    with serve_in_thread(tmp_path) as url:
        r = runner.invoke(app, ["templates", "--server", url])
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.output and "\x07" not in r.output
    assert not any(line.startswith("error:") for line in r.output.splitlines()), r.output
    assert "\\x1b[2J" in r.output and len(r.output.strip().splitlines()) == 2


def test_clean_bounds_and_escapes():
    from sakura.util.text import clean

    assert clean("a\x1bb\nc\u202ed\x9b") == "a\\x1bb\\x0ac\\u202ed\\x9b"
    assert len(clean("x" * 10_000, 50)) == 50 and clean("x" * 10_000, 50).endswith("...")
    assert clean("plain é 東京") == "plain é 東京"


# -------------------------------------------------------------------- gallery trust (no model)
def _synthetic_pair(tmp_path):
    make_synthetic_store(tmp_path, templates=2, layers=1, tokens=8, width=8)
    st = Store(tmp_path)
    out = []
    for tid in ("tpl-000", "tpl-001"):
        m = st.get_manifest("synthetic-model", tid)
        out.append((m, st.get_object(m.template_ref.object)))
    return out


def test_gallery_pins_the_first_template_under_an_id(tmp_path):
    (a, ra), (b, rb) = _synthetic_pair(tmp_path / "s")
    g = Gallery(tmp_path / "g")
    g.put("fp", "t", a.to_bytes(), ra, "x")
    assert g.pinned("fp", "t") == a.template_ref.object.sha256
    b_as_a = dataclasses.replace(b, template_id=a.template_id)
    with pytest.raises(TemplateChanged, match="--accept-new-template"):
        g.put("fp", "t", b_as_a.to_bytes(), rb, "x")
    assert g.manifest("fp", "t") == a  # the gallery's copy is not overwritten
    Gallery(tmp_path / "g", accept_new=True).put("fp", "t", b_as_a.to_bytes(), rb, "x")
    assert g.pinned("fp", "t") == b.template_ref.object.sha256


def test_gallery_refuses_a_reference_its_manifest_does_not_name(tmp_path):
    (a, ra), (b, rb) = _synthetic_pair(tmp_path / "s")
    g = Gallery(tmp_path / "g")
    with pytest.raises(GalleryError, match="sha256"):
        g.put("fp", "t", a.to_bytes(), rb, "x")
    # planted on disk (main: the edit printed "template fingerprint differs" and used it, rc 0)
    g.put("fp", "t", a.to_bytes(), ra, "x")
    (tmp_path / "g" / "fp" / "t.ref").write_bytes(rb)
    with pytest.raises(GalleryError, match="inconsistent"):
        g.template_image("fp", "t")


def test_gallery_checks_sizes_before_reading(tmp_path):
    """A 2 GiB sparse reference: refused from its size, nothing read (main: read whole, 2.6 GB)."""
    import os
    import subprocess
    import sys

    (a, ra), _ = _synthetic_pair(tmp_path / "s")
    g = Gallery(tmp_path / "g")
    g.put("fp", "t", a.to_bytes(), ra, "image/png")
    with open(tmp_path / "g" / "fp" / "t.ref", "r+b") as f:
        f.truncate(2 << 30)
    code = ("import sys\nfrom sakura.phone.gallery import Gallery\n"
            "print(Gallery(sys.argv[1]).template_image('fp', 't', image_size=64))\n"
            "print(next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:')))\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "g")], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-1000:]
    got, hwm_kib = r.stdout.split()
    assert got == "None" and int(hwm_kib) < 1024 * 1024, (got, hwm_kib)  # this process's own peak: not 2 GiB


# --------------------------------------------------------------------------- real edits
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from sakura.cloud.builder.pipeline import build_store

    root = tmp_path_factory.mktemp("tstore")
    build_store(root, templates=["sticker-00", "look-00"], calibration=1, steps=1, log=lambda s: None)
    return root


@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    p = tmp_path_factory.mktemp("photo") / "me.png"
    skio.imsave(str(p), (np.random.default_rng(0).random((70, 70, 3)) * 255).astype("uint8"), check_contrast=False)
    return p


def edit(photo, url, out, gallery, *extra, template="sticker-00"):
    args = ["edit", str(photo), "--server", url, "--out", str(out), "--steps", "1", "--gallery", str(gallery)]
    return runner.invoke(app, args + (["--template", template] if template else []) + list(extra))


def _fp(store):
    return Store(store).manifest_keys()[0][0]


@pytest.mark.slow  # real `sakura edit`s on a built store (~1 min each on 2 busy cores)
def test_edit_reads_only_the_manifest_it_needs(store, photo, tmp_path):
    """An index listing 40 templates: the edit asks for one manifest (main: all 42, one by one)."""
    import shutil

    big = tmp_path / "big"
    shutil.copytree(store, big)
    m = Store(big).get_manifest(_fp(big), "look-00")
    for i in range(40):
        _put(big, dataclasses.replace(m, template_id=f"extra-{i:02d}"))
    with serve_in_thread(big) as up, hostile_in_thread(up, "record") as (url, srv):
        r = edit(photo, url, tmp_path / "o.png", tmp_path / "g")
    assert r.exit_code == 0, r.output
    asked = [q.path for q in srv.requests if q.path.startswith("/manifests/")]
    assert asked == ["/" + manifest_relpath(_fp(big), "sticker-00")], asked
    assert not any(q.path == "/index.json" for q in srv.requests)
    # no --template: the list, under the same deadline (index + manifests, no edit)
    with serve_in_thread(big) as url:
        r = edit(photo, url, tmp_path / "o2.png", tmp_path / "g", template=None)
    assert r.exit_code == 2 and "--template is required; it offers 42" in r.output, r.output


def test_edit_refuses_another_template_under_a_pinned_id(store, photo, tmp_path):
    """A server serving look-00's template as sticker-00 after the gallery pinned sticker-00:
    refused, the gallery's copy kept (main: used silently, the gallery overwritten)."""
    import shutil

    g = tmp_path / "g"
    with serve_in_thread(store) as url:
        assert edit(photo, url, tmp_path / "warm.png", g).exit_code == 0
    fp = _fp(store)
    before = (g / fp / "sticker-00.ref").read_bytes()
    evil = tmp_path / "evil"
    shutil.copytree(store, evil)
    _put(evil, dataclasses.replace(Store(evil).get_manifest(fp, "look-00"), template_id="sticker-00"))
    with serve_in_thread(evil) as url:
        r = edit(photo, url, tmp_path / "o.png", g)
        assert r.exit_code == 2 and "not the one this gallery saw first" in r.output, r.output
        assert "--accept-new-template" in r.output
        assert (g / fp / "sticker-00.ref").read_bytes() == before
        r = edit(photo, url, tmp_path / "o.png", g, "--accept-new-template")
    assert r.exit_code == 0, r.output
    assert (g / fp / "sticker-00.ref").read_bytes() != before


@pytest.mark.slow  # real `sakura edit`s on a built store (~1 min each on 2 busy cores)
def test_edit_refuses_an_inconsistent_gallery_copy(store, photo, tmp_path):
    """Sticker's manifest with look-00's reference in the gallery, server down: an error, not an
    edit with the wrong image (main: rc 0)."""
    g = tmp_path / "g"
    with serve_in_thread(store) as url:
        assert edit(photo, url, tmp_path / "a.png", g).exit_code == 0
        assert edit(photo, url, tmp_path / "b.png", g, template="look-00").exit_code == 0
    fp = _fp(store)
    (g / fp / "sticker-00.ref").write_bytes((g / fp / "look-00.ref").read_bytes())
    r = edit(photo, url, tmp_path / "o.png", g)  # the server is gone
    assert r.exit_code == 2 and "inconsistent" in r.output, r.output


def test_manifest_for_another_model_says_so(store, photo, tmp_path):
    import shutil

    other = tmp_path / "other"
    shutil.copytree(store, other)
    fp = _fp(store)
    m = Store(other).get_manifest(fp, "sticker-00")
    _put(other, dataclasses.replace(m, model_fingerprint="0" * 64), as_fp=fp)
    with serve_in_thread(other) as url:
        r = edit(photo, url, tmp_path / "o.png", tmp_path / "g")
    assert r.exit_code == 2 and "another model" in r.output and "server unavailable" not in r.output, r.output
