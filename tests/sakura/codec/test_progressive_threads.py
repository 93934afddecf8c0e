"""The progressive fit computes large parts' rate-distortion grids in threads: same tables, bit for bit."""

import os
from concurrent.futures import ThreadPoolExecutor

import torch

import sakura.codec.progressive.ladder as prog
from sakura.codec import ShardId, ShardKV, codec_from_spec


def _shards():
    g = torch.Generator().manual_seed(0)
    return [ShardKV((torch.randn(64, 2, 16, generator=g) * (i + 1)).half(), torch.randn(64, 2, 16, generator=g).half(),
                    layer=i, num_layers=3, sensitivity=(1.0 + i, 0.5)) for i in range(3)]


def test_threaded_fit_equals_inline_fit(monkeypatch):
    codec = codec_from_spec("progressive:budgets=[0.25,0.5,1.0],allocate=sensitivity")
    shards = _shards()
    inline = codec.fit_tables(shards).to_bytes(ShardId("m", "t", -1))
    monkeypatch.setattr(prog, "PARALLEL_PART_VALUES", 0)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    assert isinstance(prog._part_pool(shards), ThreadPoolExecutor)
    threaded = codec.fit_tables(shards).to_bytes(ShardId("m", "t", -1))
    assert threaded == inline
    data = [codec.encode(s, ShardId("m", "t", i), codec.fit_tables(shards)) for i, s in enumerate(shards)]
    assert all(len(d) > 0 for d in data)
