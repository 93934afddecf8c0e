"""Store: manifest validation, atomic/idempotent writes, stats and verify, on a real directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sakura.wire.store import (
    Manifest,
    ManifestError,
    ObjectRef,
    RenditionInput,
    Store,
    StoreWriter,
    put_object,
)
from sakura.wire.store.manifest import manifest_tree
from sakura.wire.store.synthetic import make_synthetic_store


def _tree(root):
    """{relpath: (size, mtime_ns, bytes)} of every served file (excludes .tmp/.lock)."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            rel = os.path.relpath(p, root)
            if rel.startswith("."):
                continue
            st = os.stat(p)
            out[rel] = (st.st_size, st.st_mtime_ns, open(p, "rb").read())
    return out


def test_roundtrip_and_layout(tmp_path):
    ids = make_synthetic_store(tmp_path, templates=2, layers=3)
    st = Store(tmp_path)
    assert st.manifest_keys() == [("synthetic-model", i) for i in ids]
    m = st.get_manifest("synthetic-model", ids[0])
    assert [s.index for s in m.shards] == [0, 1, 2]
    assert [r.name for r in m.shards[0].renditions] == ["fp16", "int8", "mix4/2"]
    # every object is a plain file at objects/<2 hex>/<sha256>, content hashes to its name
    for o in m.objects():
        assert (tmp_path / "objects" / o.sha256[:2] / o.sha256).is_file()
        assert len(st.get_object(o)) == o.bytes
    # manifest bytes are canonical: parse + re-encode is identity
    raw = (tmp_path / "manifests" / "synthetic-model" / f"{ids[0]}.json").read_bytes()
    assert Manifest.from_bytes(raw).to_bytes() == raw
    idx = json.loads((tmp_path / "index.json").read_bytes())
    assert [(e["model_fingerprint"], e["template_id"]) for e in idx["manifests"]] == st.manifest_keys()
    # nothing left in the temp dir but the writers' lock
    assert [p.name for p in (tmp_path / ".tmp").iterdir()] == [".writers.lock"]


def test_rebuild_is_idempotent(tmp_path):
    make_synthetic_store(tmp_path, templates=2, layers=3, seed=7)
    before = _tree(tmp_path)
    make_synthetic_store(tmp_path, templates=2, layers=3, seed=7)
    after = _tree(tmp_path)
    assert after.keys() == before.keys()
    for rel, (size, mtime, data) in before.items():
        assert (after[rel][0], after[rel][2]) == (size, data)
        if not rel.startswith("objects"):
            # manifests and index: same bytes AND same mtimes, nothing rewritten; a reused object
            # only has its mtime refreshed (so gc sees it as young: issue 35, item 2)
            assert after[rel][1] == mtime, rel


def test_damaged_object_is_repaired_on_rebuild_and_caught_by_verify(tmp_path):
    make_synthetic_store(tmp_path, templates=1, layers=2)
    st = Store(tmp_path)
    m = st.get_manifest("synthetic-model", "tpl-000")
    victim = st.object_path(m.shards[1].renditions[0].object)
    data = bytearray(victim.read_bytes())
    data[10] ^= 0xFF
    victim.write_bytes(bytes(data))
    rep = st.verify()
    assert not rep.ok
    assert any(victim.name in p and "checksum mismatch" in p for p in rep.problems), rep.problems
    assert any("is damaged" in p for p in rep.problems)
    with pytest.raises(Exception, match="checksum mismatch"):
        st.get_object(m.shards[1].renditions[0].object)
    make_synthetic_store(tmp_path, templates=1, layers=2)  # rebuild rewrites the damaged object
    assert Store(tmp_path).verify().ok


def test_verify_reports_missing_object_and_orphans(tmp_path):
    make_synthetic_store(tmp_path, templates=1, layers=2)
    st = Store(tmp_path)
    orphan = put_object(tmp_path, b"left behind by a crashed build")
    m = st.get_manifest("synthetic-model", "tpl-000")
    os.unlink(st.object_path(m.template_ref.object))
    rep = st.verify()
    assert rep.orphans == [orphan.sha256]
    assert any("is missing" in p and m.template_ref.object.sha256 in p for p in rep.problems)


def test_stats_accounting(tmp_path):
    make_synthetic_store(tmp_path, templates=2, layers=4, tokens=64, width=128)
    s = Store(tmp_path).stats()
    fp16 = 2 * 64 * 128 * 2
    t = s.templates[0]
    assert t.fp16_bytes == 4 * fp16
    assert t.ladder_bytes == 4 * (fp16 + fp16 // 2 + int(fp16 * 0.19))
    assert t.table_bytes == 4096
    assert t.total_bytes == t.ladder_bytes + t.table_bytes + t.template_ref_bytes
    assert t.ratio_vs_fp16 == pytest.approx(t.total_bytes / t.fp16_bytes)
    # the shared table is stored once for both templates
    assert s.object_bytes == sum(x.total_bytes for x in s.templates) - 4096
    assert s.orphan_count == 0


def test_writer_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="template id"):
        StoreWriter(tmp_path, model_fingerprint="m", template_id="../etc")
    with pytest.raises(ValueError, match="model fingerprint"):
        StoreWriter(tmp_path, model_fingerprint="a/b", template_id="t")
    w = StoreWriter(tmp_path, model_fingerprint="m", template_id="t")
    with pytest.raises(ManifestError, match="unknown tables"):
        w.set_template_ref(b"x", media_type="image/png")
        w.add_shard(layer=0, tokens=(0, 4), fp16_bytes=32,
                    renditions=[RenditionInput("q", "c", b"abc", tables=["nope"])])
        w.commit()
    with pytest.raises(ManifestError, match=r"shards\[0\].renditions\[0\].distortion.mse"):
        w.add_shard(layer=0, tokens=(0, 4), fp16_bytes=32,
                    renditions=[RenditionInput("q", "c", b"abc", distortion={"mse": float("nan")})])
    with pytest.raises(ManifestError, match="reversed token range"):
        w.add_shard(layer=0, tokens=(4, 4), fp16_bytes=32, renditions=[RenditionInput("q", "c", b"a")])


def test_failed_build_leaves_no_manifest(tmp_path):
    with pytest.raises(RuntimeError):
        with StoreWriter(tmp_path, model_fingerprint="m", template_id="t") as w:
            w.set_template_ref(b"ref", media_type="image/png")
            w.add_shard(layer=0, tokens=(0, 4), fp16_bytes=32, renditions=[RenditionInput("q", "c", b"abc")])
            raise RuntimeError("encoder crashed")
    assert not (tmp_path / "manifests").exists()
    rep = Store(tmp_path).verify()
    assert rep.ok and len(rep.orphans) == 2  # objects written, unreferenced, reported as orphans


@pytest.mark.parametrize("mutate, msg", [
    (lambda d: d.update(schema_version=3), "schema_version"),
    (lambda d: d.update(schema="other"), "schema"),
    (lambda d: d.update(surprise=1), "unknown keys"),
    (lambda d: d["shards"][1].update(index=5), r"shards\[1\].index"),
    (lambda d: d["shards"][0]["renditions"][0]["object"].update(sha256="ABC"), r"shards\[0\].renditions\[0\].object.sha256"),
    (lambda d: d["shards"][0]["renditions"][0]["object"].update(bytes=-1), r"object.bytes"),
    (lambda d: d["shards"][0]["renditions"][0]["object"].update(bytes=True), r"object.bytes"),
    (lambda d: d["shards"][0].update(renditions=[]), "non-empty"),
    (lambda d: d.update(template_id="../x"), "template id"),
    (lambda d: d.pop("template_ref"), "template_ref: missing"),
])
def test_manifest_validation_names_the_field(tmp_path, mutate, msg):
    make_synthetic_store(tmp_path, templates=1, layers=2)
    raw = (tmp_path / "manifests/synthetic-model/tpl-000.json").read_bytes()
    d = Manifest.from_bytes(raw).to_json(version=1)  # the version-1 tree: what the v1 reader checks
    mutate(d)
    with pytest.raises(ManifestError, match=msg):
        Manifest.from_bytes(json.dumps(d).encode(), source="test")


def test_manifest_rejects_non_json_and_oversize():
    with pytest.raises(ManifestError, match="not a sakura manifest"):
        Manifest.from_bytes(b"\xff{", source="x")
    with pytest.raises(ManifestError, match="not valid UTF-8 JSON"):
        Manifest.from_bytes(b"{\xff", source="x")
    with pytest.raises(ManifestError, match="exceeds"):
        Manifest.from_bytes(b" " * (16 * 1024 * 1024 + 1))


def test_objectref_path():
    ref = ObjectRef("ab" + "0" * 62, 3)
    assert ref.path == "objects/ab/ab" + "0" * 62
    with pytest.raises(ManifestError):
        ObjectRef("../" + "0" * 61, 3)


def test_layered_prefix_renditions(tmp_path):
    from sakura.wire.store import RenditionInput

    data = bytes(range(256)) * 40  # 10240 bytes: one layered object, three rungs
    with StoreWriter(tmp_path, model_fingerprint="m", template_id="t") as w:
        w.set_template_ref(b"ref", media_type="x/y")
        w.add_shard(layer=0, tokens=(0, 4), fp16_bytes=20000, renditions=[
            RenditionInput(f"layered#{i}", "layered", data, prefix_bytes=n) for i, n in enumerate((1000, 4000, 10240))])
        with pytest.raises(ManifestError, match="prefix_bytes=20000 outside"):
            w.add_shard(layer=1, tokens=(0, 4), fp16_bytes=1, renditions=[RenditionInput("x", "c", data, prefix_bytes=20000)])
    st = Store(tmp_path)
    m = st.get_manifest("m", "t")
    rs = m.shards[0].renditions
    assert len({r.object.sha256 for r in rs}) == 1            # stored once
    assert [r.nbytes for r in rs] == [1000, 4000, 10240]
    assert rs[2].sha256 == rs[2].object.sha256
    import hashlib
    assert rs[0].sha256 == hashlib.sha256(data[:1000]).hexdigest()
    assert st.stats().templates[0].ladder_bytes == 10240      # counted once, not 1000+4000+10240
    assert st.verify().ok
    # a manifest whose prefix digest is wrong is caught by verify
    p = tmp_path / "manifests/m/t.json"
    d = manifest_tree(p.read_bytes())
    d["shards"][0]["renditions"][1]["prefix"]["sha256"] = "0" * 64
    p.write_bytes(Manifest.from_json(d).to_bytes())
    rep = Store(tmp_path).verify()
    assert any("prefix of 4000 bytes does not match" in x for x in rep.problems), rep.problems
    d["shards"][0]["renditions"][1]["prefix"]["bytes"] = 99999
    with pytest.raises(ManifestError, match="exceeds the object"):
        Manifest.from_json(d)


def test_gc_removes_only_old_orphans(tmp_path):
    make_synthetic_store(tmp_path, templates=1, layers=2)
    st = Store(tmp_path)
    old = put_object(tmp_path, b"orphan from a crashed build")
    young = put_object(tmp_path, b"object of a build in progress")
    past = os.stat(st.object_path(old)).st_mtime - 7200
    os.utime(st.object_path(old), (past, past))
    assert st.gc(min_age_s=3600, dry_run=True) == [old.sha256]
    assert st.object_path(old).exists()
    assert st.gc(min_age_s=3600) == [old.sha256]
    assert not st.object_path(old).exists() and st.object_path(young).exists()
    rep = st.verify()
    assert rep.ok and rep.orphans == [young.sha256]
    (tmp_path / "manifests/synthetic-model/tpl-000.json").write_text("{broken")
    with pytest.raises(Exception, match="gc refused"):
        st.gc(min_age_s=0)
    assert st.object_path(young).exists()


def test_commit_updates_the_index_incrementally_and_exactly(tmp_path, monkeypatch):
    """A commit hashes only its own manifest (a library of thousands would otherwise re-hash every
    manifest per commit, under the lock), yet the index always lists exactly the manifests on disk."""
    import sakura.wire.store.store as store_mod

    ids = make_synthetic_store(tmp_path, templates=12, layers=1, tokens=8, width=8)
    hashed = []
    real = store_mod.sha256_file
    monkeypatch.setattr(store_mod, "sha256_file", lambda p: (hashed.append(Path(p)), real(p))[1])
    make_synthetic_store(tmp_path, templates=13, layers=2, tokens=8, width=8)  # 12 rewritten + 1 new
    manifests_hashed = [p for p in hashed if "manifests" in p.parts]
    assert len(manifests_hashed) == 13  # each commit: its own manifest only (not 12 x 13 / 2 + ...)
    monkeypatch.setattr(store_mod, "sha256_file", real)

    def listed():
        return [(e["model_fingerprint"], e["template_id"]) for e in json.loads((tmp_path / "index.json").read_bytes())["manifests"]]

    st = Store(tmp_path)
    assert listed() == st.manifest_keys() and len(listed()) == 13
    os.unlink(st.manifest_path("synthetic-model", ids[3]))  # removed by hand: dropped at the next commit
    idx = json.loads((tmp_path / "index.json").read_bytes())
    idx["manifests"] = [e for e in idx["manifests"] if e["template_id"] != ids[5]]  # an entry lost
    (tmp_path / "index.json").write_text(json.dumps(idx))
    make_synthetic_store(tmp_path, templates=1, layers=1, tokens=8, width=8)  # commits tpl-000 only
    assert listed() == st.manifest_keys() and (("synthetic-model", ids[3]) not in listed())
    assert ("synthetic-model", ids[5]) in listed()
    (tmp_path / "index.json").write_text("{not json")  # unreadable: rebuilt from scratch
    make_synthetic_store(tmp_path, templates=1, layers=1, tokens=8, width=8)
    assert listed() == st.manifest_keys()
    rep = st.verify()
    assert rep.ok, rep.problems
    for e in json.loads((tmp_path / "index.json").read_bytes())["manifests"]:  # digests are right
        p = st.manifest_path(e["model_fingerprint"], e["template_id"])
        assert e["manifest"] == {"sha256": real(p), "bytes": p.stat().st_size}


def test_manifest_version_2_is_compact_and_version_1_still_reads(tmp_path):
    """Written: version 2 (`SKM2` + zlib of the compact JSON, no derived PSNR), several times
    smaller than the version-1 text; a version-1 file (as older stores hold) reads to the same
    manifest; a version this reader does not know, a corrupt or truncated stream, a second stream
    after the first and a compression bomb are one-line `ManifestError`s."""
    import zlib

    from sakura.wire.store.manifest import MAGIC_V2, MAX_MANIFEST_BYTES, encode_manifest_tree

    make_synthetic_store(tmp_path, templates=1, layers=6)
    p = tmp_path / "manifests/synthetic-model/tpl-000.json"
    v2 = p.read_bytes()
    m = Manifest.from_bytes(v2)
    v1 = encode_manifest_tree(m.to_json(version=1))
    assert v2.startswith(MAGIC_V2) and m.schema_version == 2 and v1.startswith(b"{")
    assert len(v2) * 3 < len(v1)
    old = Manifest.from_bytes(v1)
    assert old.schema_version == 1 and old.shards == m.shards and old.tables == m.tables
    assert old.to_bytes() == v2                    # rewritten in the current encoding, byte for byte
    p.write_bytes(v1)                              # an older store's file: still served and verified
    assert Store(tmp_path).get_manifest("synthetic-model", "tpl-000").shards == m.shards
    assert Store(tmp_path).verify().ok
    body = json.dumps({**m.to_json(), "schema_version": 3}).encode()
    for bad, msg in [(body, "understands versions \\[1, 2\\], got 3"),
                     (MAGIC_V2 + zlib.compress(body), "compressed encoding is version 2, got 3"),
                     (v2[:-5], "exactly one complete zlib stream|corrupt"),
                     (v2 + zlib.compress(b"{}"), "exactly one complete zlib stream"),
                     (MAGIC_V2 + b"not zlib", "corrupt"),
                     (MAGIC_V2 + zlib.compress(b" " * (MAX_MANIFEST_BYTES + 10)), "past the"),
                     (b"SKM9" + v2[4:], "not a sakura manifest")]:
        with pytest.raises(ManifestError, match=msg):
            Manifest.from_bytes(bad, source="t")
    tree = m.to_json()
    tree["shards"][0]["renditions"][0]["distortion"]["image_psnr_db"] = 1.0  # v2 derives it: stored is refused
    with pytest.raises(ManifestError, match="not stored in version 2"):
        Manifest.from_bytes(encode_manifest_tree(tree))
