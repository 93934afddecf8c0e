"""libsakura_decode, the C decoder (native/, docs/native.md): bit for bit the numba decoder and the
plain reference on every wire-format vector and on random renditions (hypothesis), on every vector
path this machine runs, from Python (ctypes) and from its own C runner; the aarch64 build under
qemu with the NEON path named; damaged payloads end in an error code."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sakura.codec import CodecError, ShardId, ShardKV, codec_from_spec, get_codec
from sakura.codec import bitstream as bs
from sakura.codec import native as NV
from sakura.codec.progressive import ladder as PG

ROOT = Path(__file__).resolve().parents[3]
VECTORS = ROOT / "docs" / "wire-format" / "vectors"
NATIVE = ROOT / "native"
ID = ShardId("m", "t", 1)

needs_lib = pytest.mark.skipif(not NV.available(), reason=f"native decoder not in use: {NV.decoder()}")


def _sha(d) -> str:
    return hashlib.sha256(d.key.contiguous().view(torch.int16).numpy().astype("<i2").tobytes()
                          + d.value.contiguous().view(torch.int16).numpy().astype("<i2").tobytes()).hexdigest()


def test_generated_tables_are_up_to_date():
    sys.path.insert(0, str(NATIVE / "tools"))
    try:
        import gen_tables
    finally:
        sys.path.pop(0)
    assert (NATIVE / "src" / "gen_tables.h").read_text() == gen_tables.source(), \
        "native/src/gen_tables.h is stale: run python native/tools/gen_tables.py"


# ---------------------------------------------------------------------------------------------
# the vectors, from Python, on every path

def _vector_pieces():
    import json

    from sakura.codec import CodecTables

    doc = json.loads((VECTORS / "vectors.json").read_text())
    for e in doc["objects"]:
        if e.get("kind") == "tables" or e["codec"] not in ("progressive", "cachegen", "lossless"):
            continue
        data = (VECTORS / e["path"]).read_bytes()
        ident = ShardId(e["identity"]["model"], e["identity"]["template"], e["identity"]["shard"])
        tables = None
        if e["tables"] is not None:
            tables = CodecTables.from_bytes((VECTORS / e["tables"]).read_bytes(), ShardId(ident.model, ident.template, -1))
        cuts = [(e.get("prefix_bytes"), e["decoded"])] + [(r["prefix_bytes"], r["decoded"]) for r in e.get("rungs", [])]
        for end, want in cuts:
            yield e, (data if end is None else data[:end]), ident, tables, want["sha256_key_value"]


@needs_lib
@pytest.mark.parametrize("path", NV.paths_available() or ["scalar"])
def test_every_vector_decodes_natively_to_its_digest(path):
    """Every progressive rung (small and big layouts, token scales, versions 4 and 5, with and
    without tables), CacheGen and lossless vector: the native decode's SHA-256 is the recorded
    one, and the progressive ones ran in the C library (not a fallback)."""
    NV.set_path(path)
    try:
        n = 0
        for e, piece, ident, tables, want in _vector_pieces():
            codec = codec_from_spec(e.get("spec", e["codec"]))
            if e["codec"] == "progressive":
                spans = list(bs.split_objects(piece))
                obj, dtype, shape = codec._open(piece[:spans[0][1]], ident, tables)
                state = PG.start_state(codec, obj, piece[:spans[0][1]], ident, tables, dtype, shape)
                assert isinstance(state, NV.ProgState), e["name"]
                for a, b in spans[1:]:
                    state.upgrade(piece[a:b])
                got = state.result()
            else:
                got = codec.decode(piece, ident, tables)
            assert _sha(got) == want, (e["name"], path)
            n += 1
        assert n >= 30
    finally:
        NV.set_path("auto")


@needs_lib
def test_native_numba_and_reference_agree_on_the_big_vectors():
    for e, piece, ident, tables, want in _vector_pieces():
        if "big" not in e["name"]:
            continue
        codec = codec_from_spec(e["spec"])
        got = {eng: _sha(PG.decode_with(codec, piece, ident, tables, eng)) for eng in ("native", "numba", "reference")}
        assert set(got.values()) == {want}, (e["name"], got)


def test_phone_target_runs_the_128_bit_path():
    """SAKURA_DECODE_TARGET=phone picks the 128-bit path (sse4 on x86-64, neon on aarch64), and
    the package says which decoder it uses."""
    env = {**os.environ, "SAKURA_DECODE_TARGET": "phone", "PYTHONPATH": str(ROOT / "src")}
    env.pop("SAKURA_NATIVE_PATH", None)
    out = subprocess.run([sys.executable, "-c", "from sakura.codec import native; print(native.decoder())"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    if not NV.available():
        assert out.stdout.startswith("numba")
        return
    import platform
    want = "neon" if platform.machine().lower() in ("aarch64", "arm64") else "sse4"
    assert out.stdout.strip() == f"native ({want})"
    env["SAKURA_DECODER"] = "numba"
    out = subprocess.run([sys.executable, "-c", "from sakura.codec import native; print(native.decoder())"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("numba (SAKURA_DECODER=numba)")


# ---------------------------------------------------------------------------------------------
# random renditions: native (every path) == numba == reference

@st.composite
def renditions(draw):
    T = draw(st.sampled_from([16, 64, 20]))            # 4 x 4 and 8 x 8 grids; 20: no grid (transform none)
    H = draw(st.sampled_from([1, 2, 3]))
    D = draw(st.sampled_from([8, 16, 40, 64]))
    big = draw(st.booleans()) and T == 16
    if big:                                              # >= 16,384 coefficients per band: grouped coding
        H, D = 56, 128
    budgets = sorted(draw(st.sets(st.sampled_from([0.3, 0.6, 1.0, 1.7, 2.5, 4.0]), min_size=1, max_size=3)))
    weighting = draw(st.sampled_from(["none", "importance"]))
    tables = draw(st.booleans()) or weighting == "importance"   # scales without tables: see wire-format 4.8
    seed = draw(st.integers(0, 2 ** 16))
    return T, H, D, budgets, weighting, tables, seed


@needs_lib
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(renditions())
def test_random_progressive_renditions_native_numba_reference(r):
    T, H, D, budgets, weighting, with_tables, seed = r
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(T, H, D, generator=g) * 2 + torch.randn(1, H, D, generator=g)
    v = torch.randn(T, H, D, generator=g) * (0.5 + torch.rand(T, 1, 1, generator=g))
    shard = ShardKV(k.half(), v.half(), importance=torch.rand(T, generator=g) + 0.1, layer=0, num_layers=1)
    transform = "dct" if T in (16, 64) else "none"
    c = get_codec("progressive", budgets=budgets, transform=transform, weighting=weighting, allocate="none")
    tables = c.fit_tables([shard]) if with_tables else None
    data = c.encode(shard, ID, tables)
    for e in c.level_ends(data):
        want = _sha(PG.decode_with(c, data[:e], ID, tables, "reference"))
        assert _sha(PG.decode_with(c, data[:e], ID, tables, "numba")) == want
        for path in NV.paths_available():
            NV.set_path(path)
            try:
                assert _sha(PG.decode_with(c, data[:e], ID, tables, "native")) == want, path
            finally:
                NV.set_path("auto")


@needs_lib
@settings(max_examples=8, deadline=None, derandomize=True)
@given(st.sampled_from([1, 2, 3]), st.sampled_from([1, 7, 64, 300]), st.sampled_from([8, 24]), st.booleans(),
       st.integers(0, 2 ** 16))
def test_random_cachegen_native_numba_reference(level, T, C, with_tables, seed):
    g = torch.Generator().manual_seed(seed)
    shard = ShardKV((torch.randn(T, 1, C, generator=g) * 3).half(), torch.randn(T, 1, C, generator=g).half(),
                    layer=1, num_layers=4)
    c = codec_from_spec(f"cachegen:level={level}")
    tables = c.fit_tables([shard]) if with_tables else None
    data = c.encode(shard, ID, tables)
    want = _sha(c.decode_with(data, ID, tables, "reference"))
    assert _sha(c.decode_with(data, ID, tables, "numba")) == want
    assert _sha(c.decode_with(data, ID, tables, "native")) == want


@needs_lib
@settings(max_examples=20, deadline=None, derandomize=True)
@given(st.integers(2, 300), st.integers(1, 4), st.integers(0, 2 ** 16))
def test_rans_models_and_streams_equal_numba(A, rows, seed):
    """The C model (numpy's pairwise float64 sums, first-argmax remainder) and stream decoder on
    random tables and symbols: the numba decoder's symbols."""
    from sakura.codec import rans as R

    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 60, (rows, A)) ** 2
    lens = rng.integers(1, 900, rows * 2)
    ctx = rng.integers(0, rows, lens.size)
    sc, sl = R.segments_of(lens, ctx)
    model = R.Model.from_counts(counts)
    p = model.freq / float(1 << model.bits)
    sym = np.concatenate([rng.choice(A, size=int(n), p=p[c]) for c, n in zip(sc, sl)]).astype(np.int32)
    piece = int(rng.choice([100, 1000, R.PIECE]))
    words, cnt = R.encode(sym, sc, sl, model, piece)
    assert np.array_equal(NV.rans_decode(words, cnt, sc, sl, counts, piece), sym)
    if words.size > 2:
        bad = words.copy()
        bad[rng.integers(0, bad.size)] ^= np.uint16(1 << int(rng.integers(0, 16)))
        try:
            out = NV.rans_decode(bad, cnt, sc, sl, counts, piece)
        except CodecError:
            return
        assert out.shape == sym.shape   # (a flip the checks cannot see still yields symbols, no crash)


# ---------------------------------------------------------------------------------------------
# damaged payloads: an error code, never a crash or a wrong-sized result

def _big_ladder():
    g = torch.Generator().manual_seed(5)
    shard = ShardKV((torch.randn(16, 56, 128, generator=g) * 2).half(), torch.randn(16, 56, 128, generator=g).half(),
                    layer=0, num_layers=1)
    c = get_codec("progressive", budgets=[0.5, 1.5, 3.0], allocate="none")
    data = c.encode(shard, ID, None)
    return c, data, c.level_ends(data)


def _state(c, base: bytes):
    obj, dtype, shape = c._open(base, ID, None)
    return obj, NV.ProgState(c, obj.header, obj.version, shape, None, 0)


@needs_lib
def test_adversarial_payloads_end_in_error_codes():
    c, data, ends = _big_ladder()
    obj, _ = _state(c, data[:ends[0]])
    p = bytearray(obj.section("p").tobytes())
    own = np.asarray(obj.header["own"], np.int32)
    lib = NV._lib()

    def start(payload: bytes) -> int:
        _o, s = _state(c, data[:ends[0]])
        buf = np.frombuffer(bytes(payload) or b"\0", np.uint8)
        return int(lib.skn_prog_start(s._s, buf.ctypes.data, len(payload), own.ctypes.data, own.size, None))

    assert start(p) == 0
    n = int.from_bytes(p[:4], "little")
    cases = {
        "empty": b"",
        "truncated header": p[:3],
        "truncated": p[:len(p) // 2],
        "one byte short": p[:-1],
        "one byte long": p + b"\0",
        "chunk count 2^32 - 1": b"\xff\xff\xff\xff" + p[4:],
        "chunk count 65": (65).to_bytes(4, "little") + p[4:],
        "chunk length 2^32 - 1": p[:4] + b"\xff\xff\xff\xff" + p[8:],
        "lengths overflowing": p[:4] + b"\xff\xff\xff\xff" * n + p[4 + 4 * n:],
        "no chunks": (0).to_bytes(4, "little"),
    }
    for name, bad in cases.items():
        assert start(bad) < 0, name
    rng = np.random.default_rng(0)
    errors = 0
    for _ in range(200):   # bit flips and byte garbage in the chunks: an error code or some decode
        q = bytearray(p)
        for _ in range(int(rng.integers(1, 8))):
            i = int(rng.integers(0, len(q)))
            q[i] ^= 1 << int(rng.integers(0, 8))
        errors += start(q) < 0
    assert errors > 100   # most flips are caught (rANS final states, coverage, chunk sizes)


@needs_lib
def test_damaged_objects_raise_codec_errors_only():
    """Whole objects through the package's decode: truncation and flips (with the crc recomputed,
    so the damage reaches the decoder) raise CodecError and nothing else."""
    import struct
    import zlib

    c, data, ends = _big_ladder()
    rng = np.random.default_rng(1)
    for _ in range(40):
        b = bytearray(data[:ends[int(rng.integers(0, len(ends)))]])
        _m, _v, _k, _f, hl, _pl = struct.unpack_from("<4sHBBIQ", b, 0)
        lo = 24 + hl
        for _ in range(int(rng.integers(1, 5))):
            i = int(rng.integers(lo, len(b)))
            b[i] ^= 1 << int(rng.integers(0, 8))
        # recompute every object's crc so the decoder sees the damage
        for a, e in bs.split_objects(bytes(b)):
            crc = zlib.crc32(bytes(b[a + 24:e]), zlib.crc32(bytes(b[a:a + 20])))
            b[a + 20:a + 24] = struct.pack("<I", crc)
        try:
            out = c.decode(bytes(b), ID, None)
        except CodecError:
            continue
        assert torch.isfinite(out.key.float()).all() and torch.isfinite(out.value.float()).all()


# ---------------------------------------------------------------------------------------------
# the C runner: natively and for aarch64 under qemu

def _cases(tmp: Path) -> list[Path]:
    from sakura.bench.wirevectors import native_cases

    return native_cases(VECTORS, tmp / "cases")


def _make(build: Path, cc: str, arch: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-C", str(NATIVE), f"CC={cc}", f"ARCH={arch}", f"BUILD={build}"],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(shutil.which("make") is None or shutil.which("cc") is None, reason="no make / cc")
def test_c_runner_decodes_every_vector_on_every_path(tmp_path):
    import platform

    arch = platform.machine().lower()
    res = _make(tmp_path / "build", "cc", arch)
    assert res.returncode == 0, res.stderr[-2000:]
    cases = _cases(tmp_path)
    runner = tmp_path / "build" / "skn_vectors"
    paths = {"x86_64": ["scalar", "sse4", "avx2"], "aarch64": ["scalar", "neon"]}.get(arch, ["scalar"])
    for path in paths:
        out = subprocess.run([str(runner), "--path", path, "--expect-path", path, *map(str, cases)],
                             capture_output=True, text=True, timeout=300)
        if out.returncode == 3:   # this CPU lacks the path
            continue
        assert out.returncode == 0 and f"path: {path}" in out.stdout and f"{len(cases)} cases, 0 failed" in out.stdout, \
            out.stdout[-3000:]


AARCH64_CC = "aarch64-linux-gnu-gcc"


@pytest.mark.skipif(shutil.which(AARCH64_CC) is None or shutil.which("qemu-aarch64") is None or shutil.which("make") is None,
                    reason="no aarch64 cross toolchain / qemu-user (apt-get install gcc-aarch64-linux-gnu qemu-user; "
                           ".ci/run does)")
def test_aarch64_build_decodes_every_vector_under_qemu_with_neon(tmp_path):
    """The library cross-compiled for aarch64 decodes every vector to its digest under
    qemu-aarch64 on the NEON path, and the run names it (--expect-path fails a scalar run)."""
    res = _make(tmp_path / "build-aarch64", AARCH64_CC, "aarch64")
    assert res.returncode == 0, res.stderr[-2000:]
    cases = _cases(tmp_path)
    runner = str(tmp_path / "build-aarch64" / "skn_vectors")
    qemu = ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"]
    out = subprocess.run([*qemu, runner, "--expect-path", "neon", *map(str, cases)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "path: neon" in out.stdout and f"{len(cases)} cases, 0 failed" in out.stdout
    scalar = subprocess.run([*qemu, runner, "--path", "scalar", "--expect-path", "neon", str(cases[0])],
                            capture_output=True, text=True, timeout=600)
    assert scalar.returncode != 0 and "expected path neon, ran scalar" in scalar.stdout


def test_docs_show_the_header_as_it_is():
    """docs/native.md carries native/include/sakura_decode.h verbatim (the app developer's API)."""
    doc = (ROOT / "docs" / "native.md").read_text()
    assert (NATIVE / "include" / "sakura_decode.h").read_text() in doc, \
        "docs/native.md's copy of sakura_decode.h is stale: paste the header again"
