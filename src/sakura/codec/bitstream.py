"""The codec's wire format: one self-describing, checksummed object per encoded shard or table.

Layout of one object (all integers little-endian, explicitly):

    offset  size  field
    0       4     magic  b"SKKV"
    4       2     format version (u16), 1, 2 for `sakura`/`layered` objects with per-layer K/V width
                                offsets (header `offsets`), 3 for progressive ladders (header `prog`) coded
                                with constriction's ANS (no longer read), 4 for progressive ladders and
                                `cachegen` objects coded with the interleaved rANS of `rans.py`, 5 for
                                progressive ladders with reconstruction offsets (header `off`); a newer
                                one raises `VersionError`, and so does an older one where its codec's
                                bitstream changed (progressive v3, cachegen v1)
    6       1     kind (u8): 1 = shard rendition, 2 = codec tables, 3 = layered refinement
    7       1     flags (u8): bit 0 = header is zstd-compressed; bit 1 = zstd with the frozen header
                  dictionary `HEADER_DICT_1` (version >= 5 writers; not with bit 0); others must be 0
                  (version-5 progressive/CacheGen shard objects also write the identity compactly:
                  {"mt": `ShardId.digest()`, "shard": i})
    8       4     header length H (u32)
    12      8     payload length P (u64)
    20      4     crc32 of bytes [0, 20) + bytes [24, 24 + H + P)
    24      H     header: UTF-8 JSON object (sorted keys; zstd-compressed when that is smaller,
                  which matters for small shards): codec name and parameters, identity
                  (model fingerprint, template id, shard index), tensor dtype and shape, and the
                  section table [{name, dtype, shape, nbytes, zstd?}] in payload order
    24+H    P     payload: the sections, back to back (the section table's byte counts must
                  add up to P exactly)

No pickle, no native byte order: every array section is written and read as an explicit
little-endian numpy dtype from a small whitelist. Decoding checks, in order: length, magic,
version, lengths, checksum, header schema, identity; each failure raises a subclass of
`CodecError` naming what is wrong, so a truncated, corrupt, mismatched or future object never
turns into tensors.

Objects can be concatenated (the layered codec stores a shard's whole ladder as one file of
back-to-back objects); `split_objects` walks such a file using only the fixed headers.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterator
import hashlib

import numpy as np
import zstandard

MAGIC = b"SKKV"
FORMAT_VERSION = 5  # highest version this build reads; writers use the lowest version that can say what they wrote
_FIXED = struct.Struct("<4sHBBIQI")  # magic, version, kind, flags, H, P, crc
FLAG_HEADER_ZSTD = 1
FLAG_HEADER_DICT = 2    # header zstd-compressed with the frozen header dictionary below (version >= 5 writers)
#: Header dictionary 1 (frozen: objects depend on it byte for byte; a new one needs a new flag):
#: the JSON keys and typical values of progressive and CacheGen headers, fingerprints zeroed. A
#: mini-model shard's header is ~650 bytes of JSON, 415 after plain zstd, ~115 with this
#: dictionary and the compact identity; what remains is mostly the fingerprints and step floats.
HEADER_DICT_1 = (
    b'{"level":1,"own":[0],"parent_crc":1814452301,"sections":[{"dtype":"|u1","name":"p","nbytes":843,"shape":[843]}]}'
    b'{"codec":"cachegen","dtype":"float16","id":{"mt":"00000000000000000000000000000000","shard":2},'
    b'"key_bins":16,"layer":2,'
    b'"num_layers":6,"params":{"level":3},"scale_dtype":"<f2","sections":[{"dtype":"<f2","name":"k_amax","nbytes":128,'
    b'"shape":[64]},{"dtype":"<u2","name":"rans.k","nbytes":3356,"shape":[1678]},{"dtype":"<u4","name":"pieces.k","nbytes":4,'
    b'"shape":[1]},{"dtype":"<f2","name":"v_amax","nbytes":128,"shape":[64]},{"dtype":"<u2","name":"rans.v","nbytes":3382,'
    b'"shape":[1691]},{"dtype":"<u4","name":"pieces.v","nbytes":4,"shape":[1]}],"shape":[64,4,32],'
    b'"tables":"00000000000000000000000000000000","value_bins":16}'
    b'{"codec":"progressive","dtype":"float16","id":{"mt":"00000000000000000000000000000000","shard":2},'
    b'"layer":2,"level":0,'
    b'"levels":1,"num_layers":6,"own":[0,0],"params":{"allocate":"image","budgets":[1.0],"transform":"dct"},'
    b'"prog":{"k":{"grid":8,"m0":2,"mean":"<f2","off":[0.5],"planes":[0],"scaled":false,"step":1.405645728111267},'
    b'"v":{"grid":8,"m0":2,"mean":"<f2","off":[0.625],"planes":[0],"scaled":false,"step":1.4121193885803223}},'
    b'"sections":[{"dtype":"|u1","name":"p","nbytes":1750,"shape":[1750]}],"shape":[64,4,32],'
    b'"tables":"00000000000000000000000000000000"}')
_ZDICT: list = []


def _header_dict():
    if not _ZDICT:
        _ZDICT.append(zstandard.ZstdCompressionDict(HEADER_DICT_1, dict_type=zstandard.DICT_TYPE_RAWCONTENT))
    return _ZDICT[0]
FIXED_SIZE = _FIXED.size  # 24 bytes

KIND_SHARD = 1
KIND_TABLES = 2
KIND_LAYER = 3
_KIND_NAMES = {KIND_SHARD: "shard", KIND_TABLES: "tables", KIND_LAYER: "layer"}

# Section dtypes accepted on read: explicit little-endian only.
_DTYPES = {"<u1", "<u2", "<u4", "<u8", "<i1", "<i2", "<i4", "<i8", "<f2", "<f4", "<f8", "|u1", "|i1"}
MAX_HEADER = 1 << 24  # 16 MiB of JSON is far beyond any honest header


class CodecError(ValueError):
    """Base class: an encoded object cannot be decoded (or a shard cannot be encoded)."""


class TruncatedError(CodecError):
    """The object is shorter than its header says."""


class CorruptError(CodecError):
    """Bad magic, bad checksum or malformed header/sections."""


class VersionError(CodecError):
    """The object was written by a newer (or unknown) format version, or by an older one this build
    no longer reads (re-encode it)."""


def require_version(obj: "Object", want: "int | tuple[int, ...]", codec: str) -> None:
    """Raise `VersionError` unless `obj` has format version `want` (or one of them: a codec whose
    bitstream changed)."""
    ok = want if isinstance(want, tuple) else (want,)
    if obj.version not in ok:
        said = " or ".join(str(v) for v in ok)
        raise VersionError(f"{codec} object has format version {obj.version}; this build reads {codec} objects of "
                           f"version {said} only (older ones: re-encode with this build, e.g. `sakura build`)")


class IdentityError(CodecError):
    """The object belongs to another model, template, shard, codec or table set."""


@dataclass(frozen=True)
class ShardId:
    """Who an encoded object belongs to; decode refuses an object whose identity differs.

    Args:
        model: the model fingerprint (hex string).
        template: the template id / fingerprint.
        shard: the shard index in consumption order (a layer, or a token chunk of one);
            -1 for per-template objects such as codec tables.
    """

    model: str
    template: str
    shard: int = -1

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "template": self.template, "shard": int(self.shard)}

    def digest(self) -> str:
        """128-bit hex digest of (model, template): what version-5 shard objects carry instead of
        the two fingerprints (~130 hex characters, most of a mini shard's compressed header)."""
        return hashlib.sha256(json.dumps([self.model, self.template]).encode()).hexdigest()[:32]

    def to_compact_json(self) -> dict[str, Any]:
        """The identity as version-5 objects write it: {"mt": digest, "shard": i}."""
        return {"mt": self.digest(), "shard": int(self.shard)}


@dataclass
class Object:
    """A parsed object: kind, JSON header and the raw payload (sections still packed)."""

    kind: int
    header: dict[str, Any]
    payload: memoryview
    nbytes: int  # total bytes of this object including the fixed header
    version: int = 1  # format version from the fixed header (codecs whose bitstream changed check it)
    fixed: bytes = b""  # the fixed header's 24 bytes as read (`parse`), checksum field included

    def whole_crc(self) -> int:
        """``zlib.crc32`` of the whole object's bytes, what a refinement object names as its
        ``parent_crc``: derived from the checksum `parse` verified (which covers every byte but the
        checksum field itself) in O(log size), not from a second pass over the object."""
        if len(self.fixed) != FIXED_SIZE:
            raise ValueError("whole_crc needs an object read by parse")
        stored = int.from_bytes(self.fixed[20:24], "little")
        return stored ^ crc32_shift(zlib.crc32(self.fixed[:20]) ^ zlib.crc32(self.fixed), self.nbytes - FIXED_SIZE)

    def section(self, name: str) -> np.ndarray:
        """Return section `name` as a numpy array of its declared dtype and shape (a copy)."""
        off = 0
        for s in self.header["sections"]:
            if not isinstance(s, dict) or not isinstance(s.get("nbytes"), int) or s["nbytes"] < 0:
                raise CorruptError(f"malformed section entry {s!r}")
            if s.get("name") == name:
                return _read_section(self.payload, s, off)
            off += s["nbytes"]
        raise CorruptError(f"object has no section {name!r}")

    def has(self, name: str) -> bool:
        return any(s["name"] == name for s in self.header["sections"])


@dataclass
class Writer:
    """Builds one object: add sections, then `to_bytes(kind, header)`."""

    sections: list[dict[str, Any]] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    offset: int = 0

    def add(self, name: str, arr: np.ndarray | bytes, *, zstd_level: int | None = None) -> None:
        """Add an array (stored little-endian) or raw bytes (dtype |u1) under `name`."""
        if isinstance(arr, (bytes, bytearray, memoryview)):
            arr = np.frombuffer(bytes(arr), dtype=np.uint8)
        arr = np.ascontiguousarray(arr)
        dt = arr.dtype.newbyteorder("<") if arr.dtype.itemsize > 1 else arr.dtype
        raw = arr.astype(dt, copy=False).tobytes()
        if zstd_level is not None:
            raw = zstandard.ZstdCompressor(level=zstd_level).compress(raw)
        entry = {"name": name, "dtype": dt.str, "shape": [int(s) for s in arr.shape], "nbytes": len(raw)}
        if zstd_level is not None:
            entry["zstd"] = True
        self.sections.append(entry)  # sections are back to back: offsets are implied by order
        self.chunks.append(raw)
        self.offset += len(raw)

    def to_bytes(self, kind: int, header: dict[str, Any], version: int = 1, header_dict: bool = False) -> bytes:
        """`header_dict`: also try the frozen header dictionary (`FLAG_HEADER_DICT`; version >= 5
        objects only, so that builds before it answer `VersionError`, not a flags error)."""
        if header_dict and version < 5:
            raise ValueError("the header dictionary needs format version >= 5")
        header = dict(header)
        header["sections"] = self.sections
        hbytes = json.dumps(header, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
        flags = 0

        packed = zstandard.ZstdCompressor(level=19).compress(hbytes)
        if len(packed) < len(hbytes):
            hbytes, flags = packed, FLAG_HEADER_ZSTD
        if header_dict:
            packed = zstandard.ZstdCompressor(level=19, dict_data=_header_dict(), write_content_size=False,
                                              write_checksum=False, write_dict_id=False).compress(
                json.dumps(header, sort_keys=True, separators=(",", ":"), allow_nan=False).encode())
            if len(packed) < len(hbytes):
                hbytes, flags = packed, FLAG_HEADER_DICT
        payload = b"".join(self.chunks)
        fixed_wo_crc = _FIXED.pack(MAGIC, version, kind, flags, len(hbytes), len(payload), 0)[:20]
        crc = zlib.crc32(payload, zlib.crc32(hbytes, zlib.crc32(fixed_wo_crc)))
        return fixed_wo_crc + struct.pack("<I", crc) + hbytes + payload


def _read_section(payload: memoryview, s: dict[str, Any], off: int) -> np.ndarray:
    try:
        dt = np.dtype(s["dtype"])
        shape = tuple(int(x) for x in s["shape"])
        n = int(s["nbytes"])
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptError(f"malformed section entry {s!r}: {e}") from None
    if s["dtype"] not in _DTYPES or any(x < 0 for x in shape) or off < 0 or n < 0:
        raise CorruptError(f"section {s.get('name')!r} has an unsupported dtype or negative size")
    if off + n > len(payload):
        raise CorruptError(f"section {s['name']!r} runs past the payload")
    raw = bytes(payload[off:off + n])
    want = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if s.get("zstd"):
        try:
            raw = zstandard.ZstdDecompressor().decompress(raw, max_output_size=max(want, 1))
        except zstandard.ZstdError as e:
            raise CorruptError(f"section {s['name']!r}: zstd: {e}") from None
    if len(raw) != want:
        raise CorruptError(f"section {s['name']!r} holds {len(raw)} bytes, its shape needs {want}")
    return np.frombuffer(raw, dtype=dt).reshape(shape).copy()


def read_fixed(data: bytes | memoryview, at: int = 0) -> tuple[int, int, int, int]:
    """Parse the fixed header at `at`: returns (kind, header_len, payload_len, crc).

    Raises `TruncatedError`, `CorruptError` (magic) or `VersionError`.
    """
    mv = memoryview(data)
    if len(mv) - at < FIXED_SIZE:
        raise TruncatedError(f"object truncated: {len(mv) - at} bytes, the fixed header alone is {FIXED_SIZE}")
    magic, version, kind, flags, hlen, plen, crc = _FIXED.unpack_from(mv, at)
    if magic != MAGIC:
        raise CorruptError(f"not a sakura codec object (magic {bytes(magic)!r}, expected {MAGIC!r})")
    if version > FORMAT_VERSION:
        raise VersionError(f"object has format version {version}; this build reads up to {FORMAT_VERSION}. "
                           "Upgrade sakura.")
    if version < 1:
        raise VersionError(f"object has invalid format version {version}")
    if kind not in _KIND_NAMES:
        raise CorruptError(f"unknown object kind {kind}")
    if flags & ~(FLAG_HEADER_ZSTD | FLAG_HEADER_DICT) or flags == FLAG_HEADER_ZSTD | FLAG_HEADER_DICT:
        raise CorruptError(f"unknown flags {flags:#04x}")
    if hlen > MAX_HEADER:
        raise CorruptError(f"header length {hlen} is implausible")
    return kind, hlen, plen, crc


def parse(data: bytes | memoryview, at: int = 0, *, whole: bool = True) -> Object:
    """Parse and verify one object starting at `at`.

    With `whole=True` the object must end exactly at the end of `data` (trailing bytes raise
    `CorruptError`); with `whole=False` trailing bytes are left for the caller.
    """
    mv = memoryview(data)
    kind, hlen, plen, crc = read_fixed(mv, at)
    end = at + FIXED_SIZE + hlen + plen
    if end > len(mv):
        raise TruncatedError(f"object truncated: header says {end - at} bytes, only {len(mv) - at} present")
    if whole and end != len(mv):
        raise CorruptError(f"{len(mv) - end} unexpected trailing bytes after the object")
    got = zlib.crc32(mv[at + FIXED_SIZE:end], zlib.crc32(mv[at:at + 20]))
    if got != crc:
        raise CorruptError(f"checksum mismatch (crc32 {got:08x}, header says {crc:08x}): object is corrupt")
    hraw = bytes(mv[at + FIXED_SIZE:at + FIXED_SIZE + hlen])
    if mv[at + 7] & (FLAG_HEADER_ZSTD | FLAG_HEADER_DICT):
        dec = zstandard.ZstdDecompressor(dict_data=_header_dict()) if mv[at + 7] & FLAG_HEADER_DICT \
            else zstandard.ZstdDecompressor()
        try:
            hraw = dec.decompress(hraw, max_output_size=MAX_HEADER)
        except zstandard.ZstdError as e:
            raise CorruptError(f"compressed header does not decompress: {e}") from None
    try:
        header = json.loads(hraw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptError(f"header is not valid JSON: {e}") from None
    if not isinstance(header, dict) or not isinstance(header.get("sections"), list):
        raise CorruptError("header lacks a section table")
    try:
        total = sum(int(s["nbytes"]) for s in header["sections"])
    except (KeyError, TypeError, ValueError):
        raise CorruptError("malformed section table") from None
    if total != plen:
        raise CorruptError(f"section table covers {total} bytes, payload has {plen}")
    return Object(kind=kind, header=header, payload=mv[at + FIXED_SIZE + hlen:end], nbytes=end - at,
                  version=int(mv[at + 4]) | int(mv[at + 5]) << 8, fixed=bytes(mv[at:at + FIXED_SIZE]))


_SHIFTS: list[list[int]] = []   # _SHIFTS[k][i]: the crc32 register bit i advanced over 2^k zero bytes


def crc32_shift(x: int, n: int) -> int:
    """The crc32 register ``x`` (no pre/post inversion) advanced over ``n`` zero bytes: the linear
    map zlib's ``crc32_combine`` rests on. crc32 is affine in its start value, so for one byte
    string B, ``crc32(B, a) ^ crc32(B, b) == crc32_shift(a ^ b, len(B))``. O(log n): the maps for
    1, 2, 4, ... zero bytes are built once (32 columns each)."""
    if not _SHIFTS:
        one = [zlib.crc32(b"\0", (1 << i) ^ 0xFFFFFFFF) ^ 0xFFFFFFFF for i in range(32)]  # 1 zero byte
        _SHIFTS.append(one)
        for _ in range(63):
            m = _SHIFTS[-1]
            _SHIFTS.append([_apply(m, c) for c in m])   # 2^(k+1) bytes: the 2^k map twice
    k = 0
    while n:
        if n & 1:
            x = _apply(_SHIFTS[k], x)
        n >>= 1
        k += 1
    return x


def _apply(m: list[int], x: int) -> int:
    out = 0
    i = 0
    while x:
        if x & 1:
            out ^= m[i]
        x >>= 1
        i += 1
    return out


def split_objects(data: bytes | memoryview) -> Iterator[tuple[int, int]]:
    """Yield (start, end) of each complete object in a concatenation; stops at a partial tail.

    Only fixed headers are read (no checksum), so this is cheap; `parse` verifies each object.
    """
    mv = memoryview(data)
    at = 0
    while at < len(mv):
        if len(mv) - at < FIXED_SIZE:
            return
        _kind, hlen, plen, _crc = read_fixed(mv, at)
        end = at + FIXED_SIZE + hlen + plen
        if end > len(mv):
            return
        yield at, end
        at = end


def check_identity(obj: Object, expected: ShardId, *, codec: str | None = None,
                   kind: int | None = None) -> None:
    """Raise `IdentityError` if `obj` was not written for `expected` (and `codec`, `kind`)."""
    if kind is not None and obj.kind != kind:
        raise IdentityError(f"object is a {_KIND_NAMES.get(obj.kind)} object, expected {_KIND_NAMES.get(kind)}")
    ident = obj.header.get("id")
    if not isinstance(ident, dict):
        raise CorruptError("header lacks the identity fields")
    if "mt" in ident:   # compact form (version >= 5): a digest of model and template, the shard index
        if obj.version < 5:
            raise VersionError(f"object of format version {obj.version} with a compact identity (version 5 "
                               f"writes it): re-encode with this build")
        if set(ident) != {"mt", "shard"}:
            raise CorruptError(f"malformed compact identity {ident!r}")
        if ident["mt"] != expected.digest():
            raise IdentityError(f"object belongs to another model or template (identity digest {ident['mt']!r}, "
                                f"expected {expected.digest()!r} for model={expected.model!r}, "
                                f"template={expected.template!r})")
        if ident["shard"] != int(expected.shard):
            raise IdentityError(f"object belongs to shard={ident['shard']!r}, expected {int(expected.shard)!r}")
        ident = None
    for k, want in ([] if ident is None else expected.to_json().items()):
        if ident.get(k) != want:
            raise IdentityError(f"object belongs to {k}={ident.get(k)!r}, expected {want!r}")
    if codec is not None and obj.header.get("codec") != codec:
        raise IdentityError(f"object was written by codec {obj.header.get('codec')!r}, not {codec!r}")
