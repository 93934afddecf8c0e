"""Issue 35: gc racing a rebuild (item 2), a FIFO in the store (item 4), a full disk (item 7)."""

from __future__ import annotations

import errno
import os
import time

import pytest

from sakura.wire.store import Store
from sakura.wire.store.store import StoreError, StoreWriter, open_in_store, put_object
from sakura.wire.store.synthetic import make_synthetic_store


def _writer(root, tid="t"):
    w = StoreWriter(root, model_fingerprint="fp", template_id=tid)
    from sakura.wire.store.store import RenditionInput

    w.set_template_ref(b"ref-bytes", media_type="application/x-test")
    w.add_shard(layer=0, tokens=(0, 1), fp16_bytes=4, renditions=[RenditionInput("raw", "raw-fp16", b"kv" + tid.encode())])
    w.set_kv_layout({"layers": 1})
    return w


def test_reused_object_is_not_collected_before_its_manifest_lands(tmp_path):
    """A crashed build left an object two hours ago; the rebuild reuses it while gc runs: gc must
    keep it, and the committed manifest must verify (main: gc deleted it, verify said 'missing')."""
    ref = put_object(tmp_path, b"ref-bytes")  # the killed build's first object
    p = tmp_path / ref.path
    old = time.time() - 7200
    os.utime(p, (old, old))
    w = _writer(tmp_path)  # the rebuild: put_object reuses the old file
    assert Store(tmp_path).gc(min_age_s=3600) == []
    w.commit()
    rep = Store(tmp_path).verify()
    assert rep.ok, rep.problems


def test_commit_refuses_when_gc_took_an_object_meanwhile(tmp_path):
    w = _writer(tmp_path)
    ref = w._template_ref.object
    (tmp_path / ref.path).unlink()  # what a gc between put_object and commit would do
    with pytest.raises(StoreError, match="vanished"):
        w.commit()
    assert not (tmp_path / "manifests" / "fp" / "t.json").exists()
    assert Store(tmp_path).verify().ok


def _fifo_object(root):
    sha = "ff" * 32
    d = root / "objects" / "ff"
    d.mkdir(parents=True, exist_ok=True)
    os.mkfifo(d / sha)
    return f"objects/ff/{sha}"


def test_fifo_is_refused_without_blocking_and_named_by_verify(tmp_path):
    make_synthetic_store(tmp_path, templates=1, layers=1, tokens=8, width=8)
    rel = _fifo_object(tmp_path)
    t0 = time.monotonic()
    with pytest.raises(OSError):
        open_in_store(tmp_path, rel)  # main: blocked until a writer opened the FIFO
    assert time.monotonic() - t0 < 1.0
    rep = Store(tmp_path).verify()
    assert not rep.ok and any(rel in p and "not a regular file" in p for p in rep.problems), rep.problems


def test_fifo_object_does_not_freeze_the_server(tmp_path):
    import asyncio

    import aiohttp

    from sakura.wire.server import running_server

    make_synthetic_store(tmp_path, templates=1, layers=1, tokens=8, width=8)
    rel = _fifo_object(tmp_path)

    async def go():
        async with running_server(tmp_path) as url, aiohttp.ClientSession() as s:
            async def get(path):
                async with s.get(f"{url}/{path}") as r:
                    await r.read()
                    return r.status
            return await asyncio.wait_for(asyncio.gather(get(rel), get("index.json")), 5.0)

    assert asyncio.run(go()) == [404, 200]


def _fail_fsync_of(monkeypatch, needle: str):
    """ENOSPC from fsync for files whose temp name contains `needle`: the OS boundary of a full disk."""
    real = os.fsync

    def fsync(fd):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if needle in os.path.basename(target):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_full_disk_at_the_index_leaves_the_store_as_it_was(tmp_path, monkeypatch):
    """main: the manifest was committed and index.json never written (verify passed, listing failed)."""
    make_synthetic_store(tmp_path, templates=1, layers=1, tokens=8, width=8)
    before = (tmp_path / "index.json").read_bytes()
    manifests = sorted(p.name for p in (tmp_path / "manifests").rglob("*.json"))
    _fail_fsync_of(monkeypatch, "index.json")
    with pytest.raises(OSError) as ei:
        _writer(tmp_path, "new").commit()
    assert ei.value.errno == errno.ENOSPC and ei.value.filename.endswith("index.json")
    monkeypatch.undo()
    assert (tmp_path / "index.json").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "manifests").rglob("*.json")) == manifests
    assert [p.name for p in (tmp_path / ".tmp").iterdir()] == [".writers.lock"]  # no temp file, the lock only
    assert Store(tmp_path).verify().ok


def test_full_disk_is_one_line_from_sakura_build(tmp_path, monkeypatch):
    """`sakura build` on a full disk: one line naming the path and the cause, no traceback."""
    from typer.testing import CliRunner

    from sakura.cli.main import app

    _fail_fsync_of(monkeypatch, "")  # every durable write fails
    r = CliRunner().invoke(app, ["build", str(tmp_path / "store"), "--template", "look-00", "--calibration", "1",
                                 "--steps", "1", "--ladder", "uniform:bits=8"])
    monkeypatch.undo()
    out = r.output.strip().splitlines()
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and len([l for l in out if l.startswith("error:")]) == 1, r.output
    assert "No space left on device" in out[-1] and str(tmp_path / "store") in out[-1], out[-1]
    assert not (tmp_path / "store" / "manifests").exists() or not list((tmp_path / "store" / "manifests").rglob("*.json"))
