"""One store API: the local Store and the phone's TemplateClient answer the same calls with the
same bytes and the same errors (the client against a real server on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import inspect
import os
import shutil

import pytest

from sakura.util import fsutil
from sakura.wire.client import TemplateClient
from sakura.wire.server import serve_in_thread
from sakura.wire.store import (
    AsyncTemplateStore,
    ObjectRef,
    RenditionInput,
    Store,
    StoreIntegrityError,
    StoreNotFound,
    StoreWriter,
    TemplateStore,
    put_object,
)
from sakura.wire.store.api import STORE_API_METHODS
from sakura.wire.store.synthetic import make_synthetic_store

FP = "synthetic-model"


def _params(fn):
    """(name, kind) of the parameters after self."""
    return [(p.name, p.kind) for p in list(inspect.signature(fn).parameters.values())[1:]]


@pytest.mark.parametrize("name", STORE_API_METHODS)
def test_same_method_names_and_parameters(name):
    proto_sync, proto_async = getattr(TemplateStore, name), getattr(AsyncTemplateStore, name)
    local, remote = getattr(Store, name), getattr(TemplateClient, name)
    assert not inspect.iscoroutinefunction(local) and inspect.iscoroutinefunction(remote)
    want = _params(proto_sync)
    assert _params(proto_async) == want
    # implementations may add keyword-only options with defaults (Store.get_object(verify=))
    for impl in (local, remote):
        got = inspect.signature(impl).parameters
        assert _params(impl)[: len(want)] == want, (impl, want)
        extra = list(got.values())[1 + len(want):]
        assert all(p.kind is p.KEYWORD_ONLY and p.default is not p.empty for p in extra), extra


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("apistore")
    make_synthetic_store(root, templates=2, layers=2, tokens=64, width=64, model_fingerprint=FP)
    data = os.urandom(30_000)
    with StoreWriter(root, model_fingerprint=FP, template_id="lay") as w:
        w.set_template_ref(b"ref", media_type="x/y")
        w.add_shard(layer=0, tokens=(0, 8), fp16_bytes=40_000, renditions=[
            RenditionInput(f"layered#{i}", "layered", data, prefix_bytes=n) for i, n in enumerate((5_000, 12_000, 30_000))])
    assert w.committed_path == root / "manifests" / FP / "lay.json"  # public, set on leaving the block
    return root


def test_local_and_remote_give_the_same_answers(store):
    st = Store(store)
    assert isinstance(st, TemplateStore)

    async def remote(url):
        async with TemplateClient(url) as c:
            assert isinstance(c, AsyncTemplateStore)
            keys = await c.manifest_keys()
            out = {"keys": keys, "manifests": {}, "objects": {}, "rungs": {}}
            for k in keys:
                m = await c.get_manifest(*k)
                out["manifests"][k] = m.to_bytes()
                for o in m.objects():
                    out["objects"][o.sha256] = await c.get_object(o)
            r0, r1, r2 = (await c.get_manifest(FP, "lay")).shards[0].renditions
            a = await c.get_rendition(r0)
            b = await c.get_rendition(r1, have=a)
            out["rungs"] = (a, b, await c.get_rendition(r2, have=b))
            with pytest.raises(StoreNotFound):
                await c.get_manifest(FP, "no-such-template")
            with pytest.raises(StoreNotFound):
                await c.get_object(ObjectRef("0" * 64, 10))
            with pytest.raises(StoreIntegrityError):
                await c.get_rendition(r1, have=b"x" * 10)
            return out

    with serve_in_thread(store) as url:
        got = asyncio.run(asyncio.wait_for(remote(url), 60))

    assert got["keys"] == st.manifest_keys() and len(got["keys"]) == 3
    for k, mb in got["manifests"].items():
        m = st.get_manifest(*k)
        assert m.to_bytes() == mb
        for o in m.objects():
            assert st.get_object(o) == got["objects"][o.sha256]
    r0, r1, r2 = st.get_manifest(FP, "lay").shards[0].renditions
    a = st.get_rendition(r0)
    b = st.get_rendition(r1, have=a)
    assert (a, b, st.get_rendition(r2, have=b)) == got["rungs"]
    assert [len(x) for x in got["rungs"]] == [5_000, 12_000, 30_000]
    with pytest.raises(StoreNotFound):
        st.get_manifest(FP, "no-such-template")
    with pytest.raises(KeyError):  # StoreNotFound is a KeyError (old callers catch that)
        st.get_manifest(FP, "no-such-template")
    with pytest.raises(StoreNotFound):
        st.get_object(ObjectRef("0" * 64, 10))
    with pytest.raises(StoreIntegrityError, match="wrong `have`"):
        st.get_rendition(r1, have=b"x" * 10)


def test_damaged_object_is_an_integrity_error_on_both_sides(tmp_path):
    make_synthetic_store(tmp_path, templates=1, layers=2, model_fingerprint=FP)
    st = Store(tmp_path)
    ref = st.get_manifest(FP, "tpl-000").shards[0].renditions[1].object
    p = st.object_path(ref)
    raw = bytearray(p.read_bytes())
    raw[-1] ^= 1
    p.write_bytes(bytes(raw))
    with pytest.raises(StoreIntegrityError, match="checksum mismatch"):
        st.get_object(ref)

    async def remote(url):
        async with TemplateClient(url) as c:
            with pytest.raises(StoreIntegrityError, match="hash to"):
                await c.get_object(ref)

    # the client's own check, against a server that sends the bytes as they are on disk (ours
    # refuses them: test_object_names.py)
    with serve_in_thread(tmp_path, verify_objects=False) as url:
        asyncio.run(asyncio.wait_for(remote(url), 30))


def test_the_removed_old_names_are_gone(store):
    st = Store(store)
    for old in ("load_manifest", "read_object"):
        assert not hasattr(st, old)
    for old in ("fetch_index", "fetch_manifest"):
        assert not hasattr(TemplateClient, old)


# ----------------------------------------------------------------------- one atomic-write helper
def test_atomic_write_fsyncs_file_and_folder_and_leaves_nothing_on_error(tmp_path, monkeypatch):
    synced_dirs = []
    real = fsutil.fsync_dir
    monkeypatch.setattr(fsutil, "fsync_dir", lambda p: (synced_dirs.append(os.fspath(p)), real(p)))
    dest = tmp_path / "a" / "b.bin"
    fsutil.atomic_write(dest, b"hello")
    assert dest.read_bytes() == b"hello" and (dest.stat().st_mode & 0o777) == 0o644
    assert synced_dirs == [os.fspath(dest.parent)]  # the rename itself is made durable

    def boom(f):
        f.write(b"partial")
        raise RuntimeError("disk full")
    with pytest.raises(RuntimeError):
        fsutil.atomic_write(dest, boom)
    assert dest.read_bytes() == b"hello"  # old content intact
    assert sorted(os.listdir(dest.parent)) == ["b.bin"]  # no temp file left

    # the store writes through the same helper: temp in .tmp/, folder fsync after the rename
    synced_dirs.clear()
    ref = put_object(tmp_path / "store", b"object bytes")
    assert synced_dirs == [os.fspath((tmp_path / "store" / ref.path).parent)]
    assert os.listdir(tmp_path / "store" / ".tmp") == []


def test_atomic_folder_replaces_whole_folder(tmp_path, monkeypatch):
    from saeot.fsutil import atomic_folder  # saeot uses the same helper

    assert atomic_folder is fsutil.atomic_folder
    dst = tmp_path / "cache"
    with atomic_folder(dst) as tmp:
        (tmp / "x").write_bytes(b"1")
    with pytest.raises(RuntimeError):
        with atomic_folder(dst) as tmp:
            (tmp / "y").write_bytes(b"2")
            raise RuntimeError("interrupted")
    assert sorted(os.listdir(dst)) == ["x"]
    assert [p for p in os.listdir(tmp_path) if p != "cache"] == []  # temp folder removed
    shutil.rmtree(dst)
