"""The phone-class decode target (`sakura.codec.target`, SAKURA_DECODE_TARGET=phone): numba code
for x86-64-v2 (128-bit SIMD, no F16C), the 128-bit kernels in place of the AVX-512 ones. Its
kernels must give the reference decoder's bits and the host's; its fp16 conversion is integer
code, checked here against the hardware one on every class of float32."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from numba import njit

from sakura.codec import kernels as K
from sakura.codec import target as TG


@njit(cache=False)
def _soft(x, out):
    for i in range(x.size):
        out[i] = K.f16_bits_integer(x[i])


def _edge_and_random_floats() -> np.ndarray:
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2 ** 32, 400_000, dtype=np.uint64).astype(np.uint32)   # every exponent, both signs
    f16 = np.arange(2 ** 16, dtype=np.uint16).view(np.float16).astype(np.float32)     # every fp16 value
    with np.errstate(invalid="ignore"):   # (the inf / NaN neighbours' midpoints are NaN: kept, also tried)
        mid = (f16[:-1].astype(np.float64) + np.diff(f16.astype(np.float64)) / 2).astype(np.float32)  # ties
    edges = np.array([0.0, -0.0, 65504, 65519.99, 65520, 65536, 1e30, np.inf, -np.inf, 2 ** -24, 2 ** -25,
                      2 ** -25 * 1.0001, 2 ** -14, 2 ** -14 * (1 - 2 ** -11), 1e-45, -1e-45], np.float32)
    return np.concatenate([bits.view(np.float32), f16, mid, -mid, edges,
                           rng.standard_normal(100_000).astype(np.float32) * np.float32(1e-5)])


def test_integer_fp16_conversion_equals_the_hardware_one():
    """Round to nearest even, ties, subnormals, overflow to inf, every fp16 value: the bits of
    torch's `.half()` on every non-NaN float32 tried; a NaN stays a quiet NaN with its sign."""
    x = _edge_and_random_floats()
    got = np.empty(x.size, np.uint16)
    _soft(x, got)
    ref = torch.from_numpy(x).half().numpy().view(np.uint16)
    nan = np.isnan(x)
    assert nan.any() and np.array_equal(got[~nan], ref[~nan])
    assert np.all(got[nan] & 0x7E00 == 0x7E00) and np.array_equal(got[nan] >> 15, ref[nan] >> 15)


def test_targets_are_named_and_the_phone_env_sets_the_jit_cpu(monkeypatch):
    assert TG.current() == "host" and K.VECTOR_LANES in (0, 8, 16)
    env = TG.phone_env({"PATH": "/bin"})
    assert env[TG.ENV] == "phone" and env["NUMBA_CPU_NAME"] == TG.PHONE_CPU == "x86-64-v2"
    assert env["NUMBA_CPU_FEATURES"] == "" and env["ATEN_CPU_CAPABILITY"] == "default" and env["PATH"] == "/bin"
    monkeypatch.setenv(TG.ENV, "tablet")
    with pytest.raises(TG.DecodeTargetError, match="expected one of host, phone"):
        TG.current()


_SPECS = ("progressive:budgets=[0.3,0.8,2.0,3.5]", "cachegen:level=3", "cachegen:level=1")

# Decodes the renditions the parent encoded (a pickle: name -> (spec, data, tables)) with the
# target's default kernels and with the scalar loops (VECTOR_LANES 0) -> per rendition: both equal
# the reference decoder bit for bit, and the SHA-256 of the decoded bits (the parent compares them
# with its own decode on the host path).
_CHILD = r"""
import hashlib, json, pickle, sys
import torch
from sakura.codec import ShardId, codec_from_spec, target, kernels as K
from sakura.codec.progressive import ladder as PG
target.check()
bits = lambda t: t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)
same = lambda a, b: all(x.dtype == y.dtype and torch.equal(bits(x), bits(y))   # bit patterns: -0.0 is not 0.0
                        for x, y in ((a.key, b.key), (a.value, b.value))) and torch.equal(a.keep, b.keep)
lanes = K.VECTOR_LANES
out = {"target": target.current(), "jit": target.jit_cpu(), "lanes": lanes, "equal": {}, "sha": {}}
ident = ShardId("t", "phone", 5)
for name, (spec, data, tables) in pickle.load(open(sys.argv[1], "rb")).items():
    c = codec_from_spec(spec)
    ref = (PG.decode_with(c, data, ident, tables, "reference") if c.supports_layers
           else c.decode_with(data, ident, tables, "reference"))
    got = c.decode(data, ident, tables)
    K.VECTOR_LANES = 0
    scalar = c.decode(data, ident, tables)
    K.VECTOR_LANES = lanes
    out["equal"][name] = same(got, ref) and same(scalar, ref)
    out["sha"][name] = hashlib.sha256(bits(got.key).numpy().tobytes() + bits(got.value).numpy().tobytes()).hexdigest()
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_phone_class_decoders_equal_the_host_and_the_reference_bit_for_bit(tmp_path):
    """A child process on the phone-class target (JIT for x86-64-v2, its 128-bit kernels, integer
    fp16 conversion; the first run compiles every kernel for that CPU, ~1 min) decodes every rung
    of a progressive ladder and CacheGen levels 3 and 1, small and big layouts, encoded here: with
    its kernels and with the scalar loops, each equals the plain reference decoder bit for bit, and
    its bits are this process's (the host path's)."""
    import hashlib
    import pickle

    from sakura.bench.decode_rates import klein_layer
    from sakura.codec import ShardId, codec_from_spec

    ident = ShardId("t", "phone", 5)
    cases, host = {}, {}
    for T in (256, 1024):   # small and big layouts (quads, escapes), sparse and dense refinements
        shard = klein_layer(T, heads=4, head_dim=32)
        for spec in _SPECS:
            c = codec_from_spec(spec)
            tables = c.fit_tables([shard]) if c.uses_tables else None
            data = c.encode(shard, ident, tables)
            for r, e in enumerate(c.level_ends(data) if c.supports_layers else [len(data)]):
                name = f"{spec}#{r}@{T}"
                cases[name] = (spec, data[:e], tables)
                got = c.decode(data[:e], ident, tables)
                b = [t.contiguous().view(torch.int16).numpy().tobytes() for t in (got.key, got.value)]
                host[name] = hashlib.sha256(b[0] + b[1]).hexdigest()
    path = tmp_path / "cases.pkl"
    path.write_bytes(pickle.dumps(cases))
    env = TG.phone_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    r = subprocess.run([sys.executable, "-c", _CHILD, str(path)], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.split("RESULT ", 1)[1])
    assert res["target"] == "phone" and res["lanes"] == 8 and res["jit"].startswith("x86-64-v2"), res
    assert len(res["equal"]) >= 10 and all(res["equal"].values()), res["equal"]
    assert res["sha"] == host
