"""Robustness of the wire format: every way an object can be wrong raises a clear CodecError."""

from __future__ import annotations

import struct
import zlib

import pytest

from sakura.codec import (CodecError, CorruptError, IdentityError, ShardId, TruncatedError, UnknownCodecError,
                          VersionError, available_codecs, codec_from_spec, decode_any, get_codec)
from sakura.codec import bitstream as bs

SPECS = ["lossless", "lossless:zstd=true", "uniform:bits=4", "sakura:budget=2", "layered:budgets=[1,2,3]",
         "cachegen:level=2", 'sakura:budget=1.0,quantiser="ecsq"',
         'sakura:budget=1.0,quantiser="ecsq",transform="dct"']


def _encode(spec, shard, ident, shared_tables=True):
    c = codec_from_spec(spec)
    tables = c.fit_tables([shard]) if (c.uses_tables and shared_tables) else None
    return c, tables, c.encode(shard, ident, tables)


def test_registry_knows_all_and_rejects_unknown():
    assert {"lossless", "uniform", "sakura", "layered", "cachegen"} <= set(available_codecs())
    with pytest.raises(UnknownCodecError, match="unknown codec 'nope'"):
        get_codec("nope")
    with pytest.raises(ValueError, match="unknown parameter"):
        get_codec("uniform", bitz=4)
    with pytest.raises(ValueError):
        get_codec("uniform", bits=9)
    with pytest.raises(ValueError):
        get_codec("cachegen", level=4)
    with pytest.raises(ValueError):
        get_codec("layered", budgets=[3, 2])


@pytest.mark.parametrize("spec", SPECS)
def test_truncated_every_length_raises(spec, shard_q, ident):
    shard, _ = shard_q
    c, tables, data = _encode(spec, shard, ident)
    step = max(1, len(data) // 97)
    for n in list(range(0, 40)) + list(range(40, len(data), step)):
        if c.supports_layers and n in c.level_ends(data):
            continue  # a complete rung is a valid (smaller) rendition
        with pytest.raises(CodecError):
            c.decode(data[:n], ident, tables)
    with pytest.raises(TruncatedError):
        c.decode(data[: len(data) - 1], ident, tables)


@pytest.mark.parametrize("spec", SPECS)
def test_bit_flips_raise(spec, shard_q, ident):
    shard, _ = shard_q
    c, tables, data = _encode(spec, shard, ident)
    step = max(1, len(data) // 61)
    for pos in range(0, len(data), step):
        bad = bytearray(data)
        bad[pos] ^= 0x10
        with pytest.raises(CodecError):
            c.decode(bytes(bad), ident, tables)


@pytest.mark.parametrize("spec", SPECS)
def test_identity_mismatch_raises(spec, shard_q, ident):
    shard, _ = shard_q
    c, tables, data = _encode(spec, shard, ident)
    for other in (ShardId(ident.model, ident.template, 1), ShardId("x" * 64, ident.template, 0),
                  ShardId(ident.model, "other-template", 0)):
        with pytest.raises(IdentityError):
            c.decode(data, other, tables)


def test_wrong_codec_and_wrong_tables_raise(shard_q, ident):
    shard, _ = shard_q
    c, tables, data = _encode("sakura:budget=2", shard, ident)
    with pytest.raises(IdentityError, match="codec"):
        get_codec("cachegen").decode(data, ident, tables)
    with pytest.raises(IdentityError, match="tables"):
        c.decode(data, ident, None)
    other = c.fit_tables([shard, shard])  # different counts -> different fingerprint
    with pytest.raises(IdentityError, match="tables mismatch"):
        c.decode(data, ident, other)


def test_future_version_and_bad_magic(shard_q, ident):
    shard, _ = shard_q
    c, _, data = _encode("uniform:bits=8", shard, ident)
    future = bytearray(data)
    struct.pack_into("<H", future, 4, bs.FORMAT_VERSION + 1)
    with pytest.raises(VersionError, match="version"):
        c.decode(bytes(future), ident)
    with pytest.raises(CorruptError, match="magic"):
        c.decode(b"XXXX" + data[4:], ident)
    with pytest.raises(CorruptError, match="trailing"):
        c.decode(data + b"\0", ident)


def test_valid_crc_but_malformed_header_raises(shard_q, ident):
    """Even a well-checksummed object with nonsense inside raises rather than decoding."""
    shard, _ = shard_q
    w = bs.Writer()
    w.add("key", b"\x00" * 8)
    data = w.to_bytes(bs.KIND_SHARD, {"codec": "lossless", "params": {}, "id": ident.to_json(),
                                      "dtype": "float16", "shape": [2, 1, 2], "tables": None})
    with pytest.raises(CorruptError):
        get_codec("lossless").decode(data, ident)
    data = w.to_bytes(bs.KIND_SHARD, {"codec": "lossless", "params": {}, "id": ident.to_json(),
                                      "dtype": "float64", "shape": [2, 1, 2], "tables": None})
    with pytest.raises(CorruptError):
        get_codec("lossless").decode(data, ident)


def test_tables_roundtrip_and_identity(shard_q, ident):
    shard, _ = shard_q
    c = codec_from_spec("cachegen:level=3")
    tables = c.fit_tables([shard])
    tid = ShardId(ident.model, ident.template, -1)
    blob = tables.to_bytes(tid)
    back = type(tables).from_bytes(blob, tid, codec="cachegen")
    assert back.fingerprint == tables.fingerprint
    data = c.encode(shard, ident, tables)
    assert (c.decode(data, ident, back).key == c.decode(data, ident, tables).key).all()
    with pytest.raises(IdentityError):
        type(tables).from_bytes(blob, ShardId(ident.model, "other", -1))
    with pytest.raises(CodecError):
        type(tables).from_bytes(blob[:-3], tid)


def test_decode_any_dispatches(shard_q, ident):
    shard, _ = shard_q
    for spec in SPECS:
        c, tables, data = _encode(spec, shard, ident)
        a, b = decode_any(data, ident, tables), c.decode(data, ident, tables)
        assert (a.key == b.key).all() and (a.keep == b.keep).all()


def test_header_is_little_endian_and_checksummed(shard_q, ident):
    shard, _ = shard_q
    _, _, data = _encode("lossless", shard, ident)
    magic, version, kind, _, hlen, plen, crc = struct.unpack_from("<4sHBBIQI", data)
    assert magic == b"SKKV" and version == 1 and kind == bs.KIND_SHARD
    assert len(data) == 24 + hlen + plen
    assert crc == zlib.crc32(data[24:], zlib.crc32(data[:20]))


def test_forged_huge_shape_and_bad_params_raise(ident):
    w = bs.Writer()
    w.add("key", b"\x00" * 8)
    huge = w.to_bytes(bs.KIND_SHARD, {"codec": "lossless", "params": {}, "id": ident.to_json(),
                                      "dtype": "float16", "shape": [1 << 20, 1 << 10, 1 << 10], "tables": None})
    with pytest.raises(CorruptError, match="exceeds"):
        get_codec("lossless").decode(huge, ident)
    bad = w.to_bytes(bs.KIND_SHARD, {"codec": "uniform", "params": {"bitz": 3}, "id": ident.to_json(),
                                     "dtype": "float16", "shape": [2, 1, 2], "tables": None})
    with pytest.raises(CorruptError, match="parameters"):
        decode_any(bad, ident)
    unknown = w.to_bytes(bs.KIND_SHARD, {"codec": "zip9", "params": {}, "id": ident.to_json(),
                                         "dtype": "float16", "shape": [2, 1, 2], "tables": None})
    with pytest.raises(UnknownCodecError):
        decode_any(unknown, ident)


def test_header_dictionary_round_trips_and_is_smaller():
    """Version-5 progressive and CacheGen objects compress their headers with the frozen
    dictionary: smaller than plain zstd on a mini-sized shard, and the flags are checked."""
    import torch

    from sakura.codec import ShardKV, ShardId, codec_from_spec

    g = torch.Generator().manual_seed(0)
    shard = ShardKV(torch.randn(64, 4, 32, generator=g).half(), torch.randn(64, 4, 32, generator=g).half(),
                    layer=1, num_layers=6)
    ident = ShardId("a" * 64, "b" * 64, 1)
    for spec in ("progressive:budgets=[1.0]", "cachegen:level=3"):
        c = codec_from_spec(spec)
        t = c.fit_tables([shard])
        data = c.encode(shard, ident, t)
        assert data[7] == bs.FLAG_HEADER_DICT and struct.unpack_from("<H", data, 4)[0] == 5
        obj = bs.parse(data)
        w = bs.Writer()
        for s_ in obj.header["sections"]:
            w.add(s_["name"], obj.section(s_["name"]))
        h = {k: v for k, v in obj.header.items() if k != "sections"}
        plain = w.to_bytes(bs.KIND_SHARD, h, 5)
        assert plain[7] == bs.FLAG_HEADER_ZSTD and len(data) < len(plain) - 150, (len(data), len(plain))
        a, b = c.decode(data, ident, t), c.decode(plain, ident, t)
        assert torch.equal(a.key, b.key) and torch.equal(a.value, b.value)
        bad = bytearray(data)
        bad[7] = bs.FLAG_HEADER_DICT | bs.FLAG_HEADER_ZSTD
        with pytest.raises(CorruptError, match="flags"):
            bs.parse(bytes(bad))
    with pytest.raises(ValueError):
        bs.Writer().to_bytes(bs.KIND_SHARD, {}, 4, header_dict=True)
