"""A shard's header parsed once on the phone: the parsed object handed to `decode_any` decodes the
same tensors as the bytes alone; the whole-object crc32 a refinement names as its parent is derived
from the verified checksum exactly; a parsed object that does not cover the bytes is refused."""

import os
import zlib

import numpy as np
import pytest
import torch

from sakura.codec import ShardId, ShardKV, codec_from_spec, decode_any
from sakura.codec import bitstream as bs


def _shard(T=64, H=2, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(T, H, D, generator=g).half()
    v = torch.randn(T, H, D, generator=g).half()
    return ShardKV(k, v, importance=torch.rand(T, generator=g), layer=1, num_layers=4)


@pytest.mark.parametrize("n", [0, 1, 3, 4096, 100_003])
def test_whole_crc_is_the_crc32_of_the_object(n):
    w = bs.Writer()
    w.add("p", np.frombuffer(os.urandom(n), np.uint8) if n else np.zeros(0, np.uint8))
    data = w.to_bytes(bs.KIND_SHARD, {"x": n})
    assert bs.parse(data).whole_crc() == zlib.crc32(data)


def test_crc32_shift_is_the_start_value_map():
    body = os.urandom(777)
    a, b = 0x12345678, 0x9ABCDEF0
    assert zlib.crc32(body, a) ^ zlib.crc32(body, b) == bs.crc32_shift(a ^ b, len(body))


@pytest.mark.parametrize("spec", ["progressive:budgets=[0.5,1.0],allocate=none", "cachegen:level=3",
                                  "lossless", "uniform:bits=4", "layered:budgets=[1.0,2.0]"])
def test_a_parsed_header_decodes_the_same_tensors(spec):
    codec = codec_from_spec(spec)
    shard = _shard()
    ident = ShardId("m", "t", 1)
    tables = codec.fit_tables([shard]) if codec.uses_tables else None
    data = codec.encode(shard, ident, tables)
    ends = codec.level_ends(data) if codec.supports_layers else [len(data)]
    for end in ends:
        blob = data[:end]
        want = decode_any(blob, ident, tables)
        got = decode_any(blob, ident, tables, parsed=bs.parse(blob, whole=False))
        assert torch.equal(got.key, want.key) and torch.equal(got.value, want.value)
        assert torch.equal(got.keep, want.keep)


def test_a_parsed_object_that_does_not_cover_the_bytes_is_refused():
    codec = codec_from_spec("cachegen:level=3")
    shard = _shard()
    ident = ShardId("m", "t", 1)
    tables = codec.fit_tables([shard])
    data = codec.encode(shard, ident, tables)
    parsed = bs.parse(data)
    with pytest.raises(bs.CorruptError, match="trailing"):
        codec.decode(data + b"\0", ident, tables, parsed=parsed)
