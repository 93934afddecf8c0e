"""The native decoder: libsakura_decode (C11, `native/` at the repository root) through ctypes.

The phone's decode path runs here by default: progressive ladders (every rung), CacheGen (levels
1-3, not the token-delta variant) and lossless, into fp16. The numba kernels (`rans`, `kernels`,
`fastdct`) stay as the reference the C library is tested against bit for bit, and as the fallback
where the library is missing (an install without a C compiler), where it does not cover an object
(float32 / bfloat16 output, a DCT grid that is not a power of two, CacheGen's delta variant), or
where `SAKURA_DECODER=numba` asks for it. `decoder()` says which one is in use.

Why ctypes: the library has no Python C API in it, so the very same files link into an iOS or
Android app; ctypes releases the GIL for the length of every foreign call, so the decode pool's
threads decode shards in parallel (as the numba kernels, `nogil=True`, did).

The library is the setuptools extension `sakura._sakura_decode` (built by `pip install .`; see
setup.py), or the file `SAKURA_NATIVE_LIB` names (a `make -C native` build). Its vector path is
the best this CPU runs (`avx2` / `sse4` on x86-64, `neon` on aarch64, else `scalar`), the 128-bit
one (`sse4`, the x86-64-v2 proxy) under `SAKURA_DECODE_TARGET=phone`, or `SAKURA_NATIVE_PATH`.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
import platform
import threading
from pathlib import Path
from concurrent.futures import Executor
from typing import Any

import numpy as np
import torch

from . import bitstream as bs, target
from .base import LayerKV
from . import rans as R  # R.run_split at call time: the decode pool (and its tests) may swap it

ENV_DECODER = "SAKURA_DECODER"        # "native" (default) or "numba"
ENV_LIB = "SAKURA_NATIVE_LIB"         # path of a libsakura_decode shared library to load instead
ENV_PATH = "SAKURA_NATIVE_PATH"       # vector path: scalar / sse4 / avx2 / neon (default: best, or phone's)
MAX_LEVELS = 16
PARTS = ("k", "v")

OK = 0
E_NONFINITE = -11
E_UNSUPPORTED = -13


class NativeError(bs.CorruptError):
    """A status from libsakura_decode (the object is malformed for the decoder)."""


class _Part(ctypes.Structure):
    _fields_ = [("step", ctypes.c_double), ("m0", ctypes.c_int32), ("grid", ctypes.c_int32),
                ("mean_f32", ctypes.c_int32), ("scaled", ctypes.c_int32), ("planes", ctypes.c_int32 * MAX_LEVELS),
                ("off", ctypes.c_double * MAX_LEVELS), ("has_off", ctypes.c_int32)]


class _Header(ctypes.Structure):
    _fields_ = [("tokens", ctypes.c_int32), ("heads", ctypes.c_int32), ("head_dim", ctypes.c_int32),
                ("levels", ctypes.c_int32), ("part", _Part * 2), ("max_values", ctypes.c_uint64)]


class _U8Table(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("rows", ctypes.c_uint32), ("cols", ctypes.c_uint32)]


class _Tables(ctypes.Structure):
    _fields_ = [("mean", ctypes.c_void_p * 2), ("hist", (_U8Table * (MAX_LEVELS + 1)) * 2)]


_P = ctypes.c_void_p
_SZ = ctypes.c_size_t
_I32 = ctypes.c_int32
_SIGS = {
    "skn_strerror": (ctypes.c_char_p, [ctypes.c_int]),
    "skn_version": (ctypes.c_char_p, []),
    "skn_path_name": (ctypes.c_char_p, []),
    "skn_set_path": (ctypes.c_int, [ctypes.c_char_p]),
    "skn_paths_available": (ctypes.c_char_p, []),
    "skn_prog_open": (ctypes.c_int, [ctypes.POINTER(_P), ctypes.POINTER(_Header)]),
    "skn_prog_start": (ctypes.c_int, [_P, _P, _SZ, _P, _SZ, ctypes.POINTER(_Tables)]),
    "skn_prog_upgrade": (ctypes.c_int, [_P, _I32, _P, _SZ, _P, _SZ, ctypes.POINTER(_Tables)]),
    "skn_prog_level": (_I32, [_P]),
    "skn_prog_reset": (ctypes.c_int, [_P, ctypes.POINTER(_Header)]),
    "skn_prog_result_f16": (ctypes.c_int, [_P, _P, _P]),
    "skn_prog_free": (None, [_P]),
    "skn_prog_blocks": (_I32, [_P]),
    "skn_prog_result_part_f16": (ctypes.c_int, [_P, _I32, _I32, _I32, _P]),
    "skn_prog_check_f16": (ctypes.c_int, [_P, _P, _P]),
    "skn_cachegen_f16": (ctypes.c_int, [_I32, _I32, _I32, _P, _P, _P, _SZ, _P, _SZ, _P]),
    "skn_lossless_f16": (ctypes.c_int, [_P, _SZ, _I32, _P]),
    "skn_rans_decode": (ctypes.c_int, [_P, _SZ, _P, _SZ, _P, _P, _SZ, _P, ctypes.c_uint32, ctypes.c_uint32,
                                       ctypes.c_int64, _P, ctypes.c_int64]),
}

_LIB: list[Any] = []          # [the loaded library or None]
_THREAD = threading.local()   # .prog: this thread's borrowed decoder (one-shot decodes)
_WHY: list[str] = []          # why it is not loaded


def library_file() -> Path | None:
    """The shared library this process would load (`SAKURA_NATIVE_LIB`, else the package's extension)."""
    env = os.environ.get(ENV_LIB)
    if env:
        return Path(env)
    pkg = Path(__file__).resolve().parents[1]
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        f = pkg / f"_sakura_decode{suffix}"
        if f.exists():
            return f
    return None


def _load() -> Any:
    if _LIB:
        return _LIB[0]
    lib = None
    f = library_file()
    if f is None:
        _WHY.append("libsakura_decode not built (an install without a C compiler): numba decodes")
    else:
        try:
            lib = ctypes.CDLL(str(f))
            for name, (res, args) in _SIGS.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = res, args
            want = os.environ.get(ENV_PATH) or _default_path(lib)
            if want and lib.skn_set_path(want.encode()) != OK:
                raise OSError(f"{ENV_PATH}={want!r}: this build or CPU has only "
                              f"{lib.skn_paths_available().decode()}")
        except (OSError, AttributeError) as e:
            _WHY.append(f"libsakura_decode at {f} did not load ({e}): numba decodes")
            lib = None
    _LIB.append(lib)
    return lib


def _default_path(lib: Any) -> str | None:
    """The phone-class target (`SAKURA_DECODE_TARGET=phone`) runs the 128-bit path."""
    if target.current() != "phone":
        return None
    return "neon" if platform.machine().lower() in ("aarch64", "arm64") else "sse4"


def available() -> bool:
    """Whether the native library is loaded and chosen (`SAKURA_DECODER` is not "numba")."""
    if os.environ.get(ENV_DECODER, "native").strip().lower() == "numba":
        return False
    return _load() is not None


def decoder() -> str:
    """Which decoder the phone path uses: "native (<path>)" or "numba (<why>)"."""
    if os.environ.get(ENV_DECODER, "native").strip().lower() == "numba":
        return f"numba ({ENV_DECODER}=numba)"
    lib = _load()
    if lib is None:
        return f"numba ({_WHY[0] if _WHY else 'native library unavailable'})"
    return f"native ({lib.skn_path_name().decode()})"


def path_name() -> str | None:
    lib = _load()
    return lib.skn_path_name().decode() if lib is not None else None


def set_path(name: str) -> None:
    """Switch the vector path (tests and benchmarks; not while decodes run)."""
    lib = _lib()
    if lib.skn_set_path(name.encode()) != OK:
        raise ValueError(f"native path {name!r} not available here (have {lib.skn_paths_available().decode()})")


def paths_available() -> list[str]:
    lib = _load()
    return lib.skn_paths_available().decode().split(",") if lib is not None else []


def _lib() -> Any:
    lib = _load()
    if lib is None:
        raise RuntimeError(_WHY[0] if _WHY else "native library unavailable")
    return lib


def _check(rc: int, what: str) -> None:
    if rc != OK:
        raise NativeError(f"{what}: {_lib().skn_strerror(rc).decode()} (native status {rc})")


def _empty_lines(shape: tuple[int, int]) -> np.ndarray:
    """np.empty(shape, uint16) whose data starts on a 64-byte cache line. The decoders write an
    output a channel block of every token row at a time, rows C values apart: numpy's large arrays
    start 16 bytes past a page, so each row's 64 or 128 bytes straddled one line more, a store
    miss more per row (the inverse DCT's writes at 4,096 tokens: 35 -> 29 ms per Klein part)."""
    n = shape[0] * shape[1]
    raw = np.empty(2 * n + 64, np.uint8)
    at = -raw.ctypes.data % 64
    return raw[at:at + 2 * n].view(np.uint16).reshape(shape)


def _ptr(a: np.ndarray | bytes | None) -> int | None:
    if a is None:
        return None
    if isinstance(a, (bytes, bytearray, memoryview)):
        a = np.frombuffer(a, np.uint8)
    return a.ctypes.data if a.size else None


# ---------------------------------------------------------------------------------------------
# progressive

def prog_supported(header: dict[str, Any], dtype: torch.dtype, shape: tuple[int, int, int]) -> bool:
    """Whether the native decoder takes this progressive base header (fp16 output, one grid for
    both parts, a power-of-two grid up to 64 or none)."""
    if dtype != torch.float16 or not available():
        return False
    prog = header.get("prog")
    if not isinstance(prog, dict) or set(prog) != set(PARTS):
        return False
    try:
        grids = {int(prog[kv]["grid"]) for kv in PARTS}
        levels = int(header.get("levels"))
    except (KeyError, TypeError, ValueError):
        return False
    if len(grids) != 1 or not 1 <= levels <= MAX_LEVELS:
        return False
    n = grids.pop()
    return n == 0 or n in (2, 4, 8, 16, 32, 64)


def _own(own: Any, need: int) -> np.ndarray:
    if not isinstance(own, list) or len(own) < need or not all(isinstance(o, int) and not isinstance(o, bool)
                                                                   and o in (0, 1) for o in own):
        raise bs.CorruptError("progressive: object does not say where its histograms are")
    return np.asarray(own, np.int32)


class ProgState:
    """A progressive ladder's decode state in libsakura_decode (the native twin of
    `progressive.ProgressiveState`: `start`, `upgrade` with the next rung's object, `result`)."""

    def __init__(self, codec: Any, header: dict[str, Any], version: int, shape: tuple[int, int, int],
                 tables: Any, layer: int, pool: Executor | None = None, borrow: bool = False) -> None:
        self.codec, self.header, self.version, self.shape = codec, header, version, shape
        self.tables, self.layer, self.pool = tables, layer, pool
        self.level = -1
        self._h = self._header()
        self._keep: list[Any] = []
        self._tab = self._tables() if tables is not None else None
        lib = _lib()
        # borrow (one-shot decodes, `decode_with`): this thread's decoder of the last shape, reset,
        # so that its buffers are not fresh pages again (numba's scratch memory did the same)
        held = getattr(_THREAD, "prog", None) if borrow else None
        if held is not None and lib.skn_prog_reset(held, ctypes.byref(self._h)) == OK:
            self._s, self._borrowed = held, True
            return
        p = _P()
        _check(lib.skn_prog_open(ctypes.byref(p), ctypes.byref(self._h)), codec.name)
        self._s, self._borrowed = p, False
        if borrow:   # the next one-shot decode in this thread reuses it (the old one is freed)
            if held is not None:
                lib.skn_prog_free(held)
            _THREAD.prog = p
            self._borrowed = True

    def __del__(self) -> None:
        s = getattr(self, "_s", None)
        if s and not getattr(self, "_borrowed", False) and _LIB and _LIB[0] is not None:
            _LIB[0].skn_prog_free(s)
            self._s = None

    def _header(self) -> _Header:
        T, H, D = self.shape
        prog = self.header["prog"]
        h = _Header(tokens=T, heads=H, head_dim=D)
        try:
            levels = self.header["levels"]
            if not isinstance(levels, int) or isinstance(levels, bool):
                raise TypeError
            h.levels = levels
            for i, kv in enumerate(PARTS):
                e = prog[kv]
                planes = [int(x) for x in e["planes"]]
                off = e.get("off")
                if (off is not None) != (self.version == 5) or (off is not None and (
                        not isinstance(off, list) or len(off) != len(planes)
                        or not all(isinstance(o, float) for o in off))):
                    raise bs.CorruptError(f"{self.codec.name}: bad reconstruction offsets {off!r} "
                                          f"(format version {self.version})")
                mean = np.dtype(e["mean"]).str
                scaled = e.get("scaled", False)
                if len(planes) != levels or mean not in ("<f2", "<f4") or not isinstance(scaled, bool):
                    raise ValueError
                p = h.part[i]
                p.step, p.m0, p.grid = float(e["step"]), int(e["m0"]), int(e["grid"])
                p.mean_f32, p.scaled = int(mean == "<f4"), int(scaled)
                for l, k in enumerate(planes):
                    p.planes[l] = k
                p.has_off = int(off is not None)
                for l, o in enumerate(off or []):
                    p.off[l] = o
        except bs.CorruptError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, OverflowError):
            raise bs.CorruptError(f"{self.codec.name}: bad progressive header {prog!r}") from None
        return h

    def _tables(self) -> _Tables:
        """The layer's shared tables as the C struct, memoised on the table set (with the arrays
        it points into)."""
        return self.tables.cached(f"native:L{self.layer}:{int(self._h.levels)}", self._make_tables)[0]

    def _make_tables(self) -> tuple[_Tables, list[np.ndarray]]:
        t, keep = _Tables(), []
        C = self.shape[1] * self.shape[2]
        arrays = self.tables.arrays
        for i, kv in enumerate(PARTS):
            mu = arrays.get(f"L{self.layer}.{kv}.mean")
            if mu is not None:
                if mu.shape != (C,) or mu.dtype.kind != "f" or not np.isfinite(mu).all():
                    raise bs.CorruptError(f"{self.codec.name}: {kv} mean has shape {mu.shape} or is not finite")
                mu = np.ascontiguousarray(mu, np.float32)
                keep.append(mu)
                t.mean[i] = mu.ctypes.data
            slots = [("e0q", 0), ("e0", 1)] + [(f"e{l}", 1 + l) for l in range(1, int(self._h.levels))]
            for nm, slot in slots:
                a = arrays.get(f"L{self.layer}.{kv}.{nm}")
                if a is None:
                    continue
                if a.dtype != np.uint8 or a.ndim != 2:
                    raise bs.CorruptError(f"{self.codec.name}: table L{self.layer}.{kv}.{nm} has dtype {a.dtype}")
                a = np.ascontiguousarray(a)
                keep.append(a)
                t.hist[i][slot] = _U8Table(a.ctypes.data, a.shape[0], a.shape[1])
        return t, keep

    def start(self, obj: bs.Object, crc: int) -> "ProgState":
        own = _own(obj.header.get("own"), 2)
        p = np.ascontiguousarray(obj.section("p"))
        _check(_lib().skn_prog_start(self._s, _ptr(p), p.size, own.ctypes.data, own.size,
                                     ctypes.byref(self._tab) if self._tab is not None else None), self.codec.name)
        self.level, self.last_crc = 0, crc
        return self

    def upgrade(self, piece: bytes) -> "ProgState":
        """Apply the next rung's object (in place; returns self). Mismatches raise `IdentityError`."""
        obj = bs.parse(piece)
        if obj.kind != bs.KIND_LAYER:
            raise bs.IdentityError(f"expected a refinement object, got kind {obj.kind}")
        bs.require_version(obj, self.version, self.codec.name)   # a refinement has its base's version
        h = obj.header
        if h.get("level") != self.level + 1:
            raise bs.IdentityError(f"refinement object is level {h.get('level')!r}; expected {self.level + 1}")
        if h.get("parent_crc") != self.last_crc:
            raise bs.IdentityError("refinement object does not refine this base (parent checksum differs)")
        l = self.level + 1
        if l >= int(self._h.levels):
            raise bs.CorruptError(f"{self.codec.name}: refinement level {l} beyond the ladder's {int(self._h.levels)}")
        grow = sum(1 for i in range(2) if self._h.part[i].planes[l] != self._h.part[i].planes[l - 1])
        own = _own(h.get("own"), grow)
        p = np.ascontiguousarray(obj.section("p"))
        _check(_lib().skn_prog_upgrade(self._s, l, _ptr(p), p.size, _ptr(own), own.size,
                                       ctypes.byref(self._tab) if self._tab is not None else None), self.codec.name)
        self.level, self.last_crc = l, obj.whole_crc()  # (derived from the checksum parse verified)
        return self

    def result(self) -> Any:
        k, v = self.result_f16()
        return LayerKV(k, v, torch.ones(self.shape[0], dtype=torch.bool))

    def result_f16(self) -> tuple[torch.Tensor, torch.Tensor]:
        T, H, D = self.shape

        lib = _lib()
        k = _empty_lines((T, H * D))
        v = _empty_lines((T, H * D))
        blocks = int(lib.skn_prog_blocks(self._s))
        for part, out in ((0, k), (1, v)):   # channel blocks split over `pool` (the GIL is released)
            errs = R.run_split(self.pool, lambda lo, hi, part=part, out=out: lib.skn_prog_result_part_f16(
                self._s, part, lo, hi, out.ctypes.data), blocks)
            _check(next((e for e in errs if e), OK), self.codec.name)
        rc = lib.skn_prog_check_f16(self._s, k.ctypes.data, v.ctypes.data)
        if rc == E_NONFINITE:
            raise bs.CorruptError(f"{self.codec.name}: object decodes to non-finite values (corrupt scales or payload)")
        _check(rc, self.codec.name)
        return (torch.from_numpy(k.view(np.float16)).reshape(self.shape),
                torch.from_numpy(v.view(np.float16)).reshape(self.shape))


# ---------------------------------------------------------------------------------------------
# CacheGen and lossless

def cachegen_f16(T: int, C: int, bins: int, amax: np.ndarray, hist: np.ndarray, words: np.ndarray,
                 counts: np.ndarray) -> torch.Tensor:
    """One part of a (non-delta) CacheGen object -> (T, C) fp16. `hist` (C, bins - 1) counts."""
    am = np.ascontiguousarray(amax, np.float32)
    h = np.ascontiguousarray(hist, np.uint32)
    if h.shape != (C, bins - 1):
        raise bs.CorruptError(f"cachegen: histogram has shape {h.shape}, expected {(C, bins - 1)}")
    w = np.ascontiguousarray(words).view(np.uint8)
    c = np.ascontiguousarray(counts).view(np.uint8)
    if w.size % 2 or c.size % 4 or am.shape != (T,):
        raise bs.CorruptError("cachegen: malformed sections")
    out = _empty_lines((T, C))
    rc = _lib().skn_cachegen_f16(T, C, bins, am.ctypes.data, h.ctypes.data, _ptr(w), w.size // 2, _ptr(c),
                                 c.size // 4, out.ctypes.data)
    if rc == E_NONFINITE:
        raise bs.CorruptError("cachegen: amax is not finite")
    _check(rc, "cachegen")
    return torch.from_numpy(out.view(np.float16))


def lossless_f16(section: np.ndarray, n: int, byte_planes: bool) -> torch.Tensor:
    """A lossless float16 section (decompressed) -> (n,) fp16; CorruptError if not finite."""
    a = np.ascontiguousarray(section).view(np.uint8)
    if a.size != 2 * n:
        raise bs.CorruptError(f"lossless: section holds {a.size} bytes, expected {2 * n}")
    out = np.empty(n, np.uint16)
    rc = _lib().skn_lossless_f16(_ptr(a), n, int(byte_planes), out.ctypes.data)
    if rc == E_NONFINITE:
        raise bs.CorruptError("lossless: object decodes to non-finite values (corrupt scales or payload)")
    _check(rc, "lossless")
    return torch.from_numpy(out.view(np.float16))


def rans_decode(words: np.ndarray, counts: np.ndarray, seg_ctx: np.ndarray, seg_len: np.ndarray,
                weights: np.ndarray, piece: int) -> np.ndarray:
    """The C rANS decoder on one stream (tests): (rows, A) weights (counts; + 1 here) -> symbols."""
    w = np.ascontiguousarray(words, "<u2").view(np.uint8)
    c = np.ascontiguousarray(counts, "<u4").view(np.uint8)
    sc = np.ascontiguousarray(seg_ctx, np.int32)
    sl = np.ascontiguousarray(seg_len, np.int64)
    wt = np.ascontiguousarray(weights, np.float64)
    n = int(sl.sum())
    out = np.empty(max(n, 1), np.int32)
    _check(_lib().skn_rans_decode(_ptr(w), w.size // 2, _ptr(c), c.size // 4, _ptr(sc), _ptr(sl), sc.size,
                                  wt.ctypes.data, wt.shape[0], wt.shape[1], piece, out.ctypes.data, n), "rans")
    return out[:n]


def describe() -> dict[str, Any]:
    """What a benchmark records about the decoder."""
    lib = _load()
    return {"decoder": decoder(), "library": str(library_file()) if lib is not None else None,
            "version": lib.skn_version().decode() if lib is not None else None,
            "paths_available": paths_available(), "path": path_name()}

