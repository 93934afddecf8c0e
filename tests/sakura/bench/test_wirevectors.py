"""The published wire-format vectors (docs/wire-format/vectors): this build decodes every one to
what vectors.json records, regenerating them gives the same bytes, and the fixed header reads as
docs/wire-format.md describes it without the codec's own parser."""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from pathlib import Path

import pytest

from sakura.bench import wirevectors as wv
from sakura.codec import ShardId, decode_any
from sakura.wire.store import Manifest, Store

VECTORS = Path(__file__).resolve().parents[3] / "docs" / "wire-format" / "vectors"


def test_committed_vectors_decode_as_recorded() -> None:
    assert wv.check(VECTORS) == []


def test_regenerating_gives_identical_bytes(tmp_path: Path) -> None:
    wv.generate(tmp_path / "v")
    got = {p.relative_to(tmp_path / "v"): p.read_bytes() for p in (tmp_path / "v").rglob("*") if p.is_file()}
    want = {p.relative_to(VECTORS): p.read_bytes() for p in VECTORS.rglob("*") if p.is_file()}
    assert sorted(got) == sorted(want)
    changed = [str(k) for k in want if got[k] != want[k]]
    assert not changed, f"regenerated vectors differ: {changed} (python -m sakura.bench.wirevectors --docs)"


def test_lossless_vector_is_the_formula() -> None:
    doc = json.loads((VECTORS / "vectors.json").read_text())
    lossless = next(e for e in doc["objects"] if e["name"] == "lossless")
    assert lossless["decoded"] == doc["kv"]["input"][0]
    key, value = wv.layer_kv(0)
    d = decode_any((VECTORS / lossless["path"]).read_bytes(), ShardId(wv.MODEL, wv.TEMPLATE_FP, 0))
    assert bool((d.key == key).all()) and bool((d.value == value).all())


def test_fixed_header_as_documented() -> None:
    """Every object: magic, version, kind, flags, H, P, crc32 exactly as the doc's table says."""
    doc = json.loads((VECTORS / "vectors.json").read_text())
    for e in doc["objects"]:
        data = (VECTORS / e["path"]).read_bytes()
        at = 0
        while at < len(data):
            magic, version, kind, flags, h, p = struct.unpack_from("<4sHBBIQ", data, at)
            (crc,) = struct.unpack_from("<I", data, at + 20)
            assert magic == b"SKKV" and 1 <= version <= 5 and kind in (1, 2, 3) and flags in (0, 1, 2), e["name"]
            end = at + 24 + h + p
            assert crc == zlib.crc32(data[at + 24:end], zlib.crc32(data[at:at + 20])), e["name"]
            if e.get("version") is not None and at == 0:
                assert version == e["version"]
            at = end
        assert at == len(data)


def test_store_vector_is_a_valid_store() -> None:
    store = Store(VECTORS / "store")
    assert store.verify().ok
    m = store.get_manifest(wv.MODEL, wv.TEMPLATE)
    assert isinstance(m, Manifest) and len(m.shards) == wv.LAYERS
    for s in m.shards:
        for r in s.renditions:
            got = hashlib.sha256(store.get_rendition(r)).hexdigest()
            assert got == r.sha256


@pytest.mark.parametrize("flip", [0, 4, 20, 30, -1])
def test_a_damaged_vector_is_refused(flip: int) -> None:
    from sakura.codec import CodecError

    data = bytearray((VECTORS / "objects" / "cachegen-v5.skkv").read_bytes())
    data[flip] ^= 0x01
    with pytest.raises(CodecError):
        decode_any(bytes(data), ShardId(wv.MODEL, wv.TEMPLATE_FP, 0))
