"""The manifest: what one (model fingerprint, template) offers, validated on read.

A manifest lists the template's shards in the order the forward pass consumes them; each shard
lists its renditions (encodings) with codec name and parameters, byte size, measured distortion and
the content-addressed object that holds the bytes. Shared codec tables and the small template
reference (what the phone needs to compute the KV locally, the ``local`` pseudo-rendition) are
objects too. Every object is named by the sha256 of its bytes, which is also its checksum.

Pure data + validation: no I/O, no dependency on the codec or the model adapter. The JSON's
shape (required and unknown keys, strict types, sizes, string lengths) is a pydantic schema
(`ManifestJSON` and its parts: strict, extra keys forbidden); what spans fields (digests, prefix
within its object, token ranges, distortion consistency, table references) is checked on the
dataclasses built from it. Errors are one `ManifestError` naming the field path.

Encodings (``schema_version``):

* **1**: the JSON as text (indented, sorted keys). Still read; no longer written.
* **2** (written since issue 34): the same JSON tree, compact (no indentation) and zlib-compressed
  behind the 4-byte magic ``SKM2``, with each rendition's ``image_psnr_db`` left out (it is
  10 log10(1 / image_mse), derived on read). A 6-shard manifest went from 14-15 KiB to ~2.5 KiB:
  half of a small template's whole storage was its manifest's whitespace, repeated keys and hex
  digests (docs/storage.md). `manifest_tree` / `encode_manifest_tree` read and write the tree of
  either encoding (tools and tests that edit a manifest by hand).
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass, field
from typing import Annotated, Any, Iterator, Literal, Mapping, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from sakura.util.psnr import psnr_db
from sakura.wire.store.layout import check_name, check_sha256, object_relpath

SCHEMA = "sakura.manifest"
#: The version written. Versions read: `READ_VERSIONS`.
SCHEMA_VERSION = 2
READ_VERSIONS = (1, 2)
#: Leading bytes of a version-2 manifest (then one zlib stream holding the compact JSON).
MAGIC_V2 = b"SKM2"

#: The manifest names `sakura.wire.store` re-exports, listed once: the package star-imports them.
__all__ = ["SCHEMA_VERSION", "READ_VERSIONS", "Manifest", "ManifestError", "ObjectRef", "Prefix", "Rendition", "Shard", "Table",
           "TemplateRef"]
#: Largest manifest accepted on read (bytes): a bound against memory bombs from a bad server.
MAX_MANIFEST_BYTES = 16 * 1024 * 1024


class ManifestError(ValueError):
    """A manifest (or index) is malformed; the message names the offending field path."""


#: Longest integer literal accepted (digits): Python refuses > 4300 with a bare ValueError, and a
#: byte count never needs more than 20.
MAX_INT_DIGITS = 40


def _bounded_int(s: str) -> int:
    if len(s.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer literal of {len(s)} digits")
    return int(s)


def parse_json(data: bytes, source: str, *, error: type[ValueError] | None = None) -> Any:
    """Strict, bounded JSON for untrusted files (manifests, index.json): UTF-8, integers of at
    most ``MAX_INT_DIGITS`` digits, no NaN/Infinity. Raises only ``error`` (default
    ``ManifestError``): deep nesting (the C parser's RecursionError) and 5,000-digit integers
    (a bare ValueError from int()) are reported as malformed JSON."""
    err = error or ManifestError
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise err(f"{source}: not valid UTF-8 JSON ({e})") from None

    def no_const(c: str) -> Any:
        raise ValueError(f"{c} is not JSON")

    try:
        return json.loads(text, parse_int=_bounded_int, parse_constant=no_const)
    except (ValueError, RecursionError, OverflowError) as e:  # JSONDecodeError is a ValueError
        raise err(f"{source}: not valid UTF-8 JSON ({str(e)[:160]})") from None


# --------------------------------------------------------------------------------------- helpers
def _fail(where: str, msg: str) -> "ManifestError":
    return ManifestError(f"manifest field {where}: {msg}")


def _int(v: Any, where: str, lo: int = 0) -> int:
    # bool is an int subclass in Python; a JSON true is not a size.
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise _fail(where, f"expected an integer >= {lo}, got {v!r}")
    return v


# ------------------------------------------------------------------------------ the JSON schema
def _sha256(v: str) -> str:
    check_sha256(v, "sha256")
    return v


def _plain_json(v: dict[str, Any]) -> dict[str, Any]:
    json.dumps(v, allow_nan=False, sort_keys=True)  # only JSON types, no NaN (raises ValueError/TypeError)
    return v


Count = Annotated[StrictInt, Field(ge=0)]
Sha256 = Annotated[StrictStr, AfterValidator(_sha256)]
Name = Annotated[StrictStr, Field(min_length=1, max_length=128)]
CodecName = Annotated[StrictStr, Field(min_length=1, max_length=64)]
PlainJSON = Annotated[dict[StrictStr, Any], AfterValidator(_plain_json)]


class _Schema(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class ObjectRefJSON(_Schema):
    sha256: Sha256
    bytes: Count


class PrefixJSON(_Schema):
    bytes: Annotated[StrictInt, Field(ge=1)]
    sha256: Sha256


class RenditionJSON(_Schema):
    name: Name
    codec: CodecName
    params: PlainJSON
    object: ObjectRefJSON
    distortion: dict[StrictStr, Any]  # metric -> number; semantics in _distortion
    tables: list[Name]
    prefix: PrefixJSON | None = None


class QualityFloorJSON(_Schema):
    reference: Name
    image_mse: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
    #: true when image_mse is predicted by the build's sensitivity model (issue 41), not measured
    predicted: StrictBool | None = None


class ShardJSON(_Schema):
    index: Count
    layer: Count
    tokens: Annotated[list[Count], Field(min_length=2, max_length=2)]
    fp16_bytes: Count
    renditions: Annotated[list[RenditionJSON], Field(min_length=1)]
    quality_floor: QualityFloorJSON | None = None


class TableJSON(_Schema):
    name: Name
    codec: CodecName
    params: PlainJSON
    object: ObjectRefJSON


class TemplateRefJSON(_Schema):
    object: ObjectRefJSON
    media_type: Name


class ManifestJSON(_Schema):
    schema_: Literal["sakura.manifest"] = Field(alias="schema")
    schema_version: Literal[1, 2]
    model_fingerprint: Name
    template_id: Name
    template_ref: TemplateRefJSON
    kv_layout: PlainJSON
    tables: list[TableJSON]
    shards: list[ShardJSON]


S = TypeVar("S", bound=_Schema)


def _path(where: str, loc: tuple) -> str:
    out = where
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def _validate(schema: type[S], d: Any, where: str) -> S:
    """`d` (parsed JSON) checked against `schema`; the first problem as one `ManifestError`."""
    try:
        return schema.model_validate(d)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc, kind = tuple(err["loc"]), err["type"]
        if kind == "extra_forbidden":
            extra = sorted(str(x["loc"][-1]) for x in e.errors() if x["type"] == "extra_forbidden"
                           and tuple(x["loc"][:-1]) == loc[:-1])
            raise _fail(_path(where, loc[:-1]), f"unknown keys {extra} (not in schema v{READ_VERSIONS})") from None
        if kind == "missing":
            raise _fail(_path(where, loc), "missing") from None
        if kind == "too_short" and err.get("ctx", {}).get("min_length") == 1:
            raise _fail(_path(where, loc), "expected a non-empty list") from None
        got = repr(err.get("input"))[:80]
        raise _fail(_path(where, loc), f"{err['msg']} (got {got})") from None


# ------------------------------------------------------------------------------------ data model
@dataclass(frozen=True)
class ObjectRef:
    """A content-addressed immutable object: its sha256 (hex, also the checksum) and size in bytes."""

    sha256: str
    bytes: int

    def __post_init__(self) -> None:
        try:
            check_sha256(self.sha256)
        except ValueError as e:
            raise ManifestError(str(e)) from None
        _int(self.bytes, "bytes")

    @property
    def path(self) -> str:
        """Relative path in the store == URL path without the leading '/'."""
        return object_relpath(self.sha256)

    def to_json(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "bytes": self.bytes}

    @classmethod
    def _from_schema(cls, j: ObjectRefJSON) -> "ObjectRef":
        return cls(sha256=j.sha256, bytes=j.bytes)


#: Image-level distortion keys of a rendition (docs/codec.md): mean per-pixel MSE (pixels in [0, 1])
#: of the calibration edits with only this shard replaced by the rendition, against the lossless-KV
#: edit, and 10 log10(1 / image_mse) (inf when image_mse is 0; null in the JSON).
IMAGE_MSE = "image_mse"
IMAGE_PSNR = "image_psnr_db"


def _distortion(dist: Any, where: str) -> dict[str, float]:
    """Validate a rendition's distortion map: finite numbers >= 0; the image keys come together,
    image_mse in [0, 1] and image_psnr_db = 10 log10(1 / image_mse) (null/inf iff image_mse is 0)."""
    if not isinstance(dist, Mapping):
        raise _fail(where, "expected an object metric -> number")
    out: dict[str, float] = {}
    for k, v in dist.items():
        if k == IMAGE_PSNR and (v is None or (isinstance(v, float) and math.isinf(v) and v > 0)):
            out[k] = math.inf
            continue
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
            raise _fail(f"{where}.{k}", f"expected a finite number >= 0, got {v!r}")
        out[str(k)] = float(v)
    if (IMAGE_MSE in out) != (IMAGE_PSNR in out):
        raise _fail(where, f"{IMAGE_MSE!r} and {IMAGE_PSNR!r} must be given together")
    if IMAGE_MSE in out:
        mse, psnr = out[IMAGE_MSE], out[IMAGE_PSNR]
        if mse > 1.0:
            raise _fail(f"{where}.{IMAGE_MSE}", f"expected a per-pixel MSE in [0, 1], got {mse!r}")
        want = psnr_db(mse)
        if math.isinf(want) != math.isinf(psnr) or (not math.isinf(want) and abs(psnr - want) > 1e-6 * max(1.0, want)):
            raise _fail(f"{where}.{IMAGE_PSNR}", f"{psnr!r} is not 10 log10(1 / {IMAGE_MSE}) = {want!r}")
    return out



@dataclass(frozen=True)
class Prefix:
    """A rendition that is the first ``bytes`` bytes of its object (a progressive/layered codec's
    rung: one object in the store, one HTTP Range per rung), with the sha256 of that prefix."""

    bytes: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "sha256": self.sha256}



@dataclass(frozen=True)
class Rendition:
    """One encoding of one shard.

    Attributes:
        name: ladder rung, unique within the shard (e.g. ``"fp16"``, ``"int8"``, ``"mix4/2"``).
        codec: codec name as the codec registry knows it.
        params: codec parameters (plain JSON) needed to decode.
        object: the object holding the encoded bytes.
        distortion: measured distortion, metric name -> value (e.g. ``{"kv_rel_mse": 1.2e-4}``);
            ``{}`` for lossless.
        tables: names of shared tables (``Manifest.tables``) needed to decode, sent once per model.
        prefix: if set, the rendition is only the first ``prefix.bytes`` of ``object`` (layered
            codecs: rung l of a shard is a prefix of the shard's one object).
    """

    name: str
    codec: str
    object: ObjectRef
    params: dict[str, Any] = field(default_factory=dict)
    distortion: dict[str, float] = field(default_factory=dict)
    tables: tuple[str, ...] = ()
    prefix: Prefix | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of this rendition (what a fetch from scratch moves)."""
        return self.prefix.bytes if self.prefix is not None else self.object.bytes

    @property
    def sha256(self) -> str:
        """Digest of exactly this rendition's bytes."""
        return self.prefix.sha256 if self.prefix is not None else self.object.sha256

    def to_json(self) -> dict[str, Any]:
        d = {
            "name": self.name,
            "codec": self.codec,
            "params": self.params,
            "object": self.object.to_json(),
            # strict JSON has no infinity: a lossless rendition's image_psnr_db (inf) is written as null
            "distortion": {k: (None if k == IMAGE_PSNR and math.isinf(v) else v) for k, v in self.distortion.items()},
            "tables": list(self.tables),
        }
        if self.prefix is not None:
            d["prefix"] = self.prefix.to_json()
        return d

    @classmethod
    def _from_schema(cls, j: RenditionJSON, where: str) -> "Rendition":
        obj = ObjectRef._from_schema(j.object)
        prefix = Prefix(bytes=j.prefix.bytes, sha256=j.prefix.sha256) if j.prefix is not None else None
        if prefix is not None and prefix.bytes > obj.bytes:
            raise _fail(f"{where}.prefix.bytes", f"{prefix.bytes} exceeds the object's {obj.bytes} bytes")
        return cls(name=j.name, codec=j.codec, params=dict(j.params), object=obj,
                   distortion=_distortion(j.distortion, f"{where}.distortion"), tables=tuple(j.tables), prefix=prefix)


@dataclass(frozen=True)
class Shard:
    """The unit of streaming: one layer's K+V (or a token chunk of it), in consumption order.

    Attributes:
        index: position in consumption order (0-based; equals its position in ``Manifest.shards``).
        layer: transformer layer the shard belongs to.
        tokens: ``(start, stop)`` template-token range covered, stop exclusive.
        fp16_bytes: size in bytes of this shard's K+V as one uncompressed fp16 copy (the baseline
            for storage accounting).
        renditions: the ladder, at least one.
        quality_floor: optional ``{"reference": codec spec, "image_mse": x}``: the image MSE (same
            measurement as a rendition's ``image_mse``) of a reference codec on this shard, e.g.
            ``cachegen:level=3``, whether or not that codec is in the stored ladder.
    """

    index: int
    layer: int
    tokens: tuple[int, int]
    fp16_bytes: int
    renditions: tuple[Rendition, ...]
    quality_floor: dict[str, Any] | None = None

    def rendition(self, name: str) -> Rendition:
        for r in self.renditions:
            if r.name == name:
                return r
        raise KeyError(f"shard {self.index} has no rendition {name!r} (has {[r.name for r in self.renditions]})")

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "layer": self.layer,
            "tokens": list(self.tokens),
            "fp16_bytes": self.fp16_bytes,
            "renditions": [r.to_json() for r in self.renditions],
            **({"quality_floor": dict(self.quality_floor)} if self.quality_floor is not None else {}),
        }

    @classmethod
    def from_json(cls, d: Any, where: str) -> "Shard":
        """A shard's JSON, checked (`ShardJSON` and the token range); errors name `where`."""
        return cls._from_schema(_validate(ShardJSON, d, where), where)

    @classmethod
    def _from_schema(cls, j: ShardJSON, where: str) -> "Shard":
        t0, t1 = j.tokens
        if t1 <= t0:
            raise _fail(f"{where}.tokens", f"empty or reversed token range [{t0}, {t1})")
        floor = j.quality_floor
        return cls(index=j.index, layer=j.layer, tokens=(t0, t1), fp16_bytes=j.fp16_bytes,
                   renditions=tuple(Rendition._from_schema(r, f"{where}.renditions[{i}]")
                                    for i, r in enumerate(j.renditions)),
                   quality_floor=({"reference": floor.reference, "image_mse": float(floor.image_mse),
                                   **({"predicted": True} if floor.predicted else {})}
                                  if floor is not None else None))


@dataclass(frozen=True)
class Table:
    """A shared codec table (e.g. a per-layer symbol distribution), sent once, used by many shards."""

    name: str
    codec: str
    object: ObjectRef
    params: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "codec": self.codec, "params": self.params, "object": self.object.to_json()}



@dataclass(frozen=True)
class TemplateRef:
    """The small template reference the phone needs to compute the KV itself (``local``):
    e.g. the template's encoded reference latent or image; ``media_type`` says which."""

    object: ObjectRef
    media_type: str

    def to_json(self) -> dict[str, Any]:
        return {"object": self.object.to_json(), "media_type": self.media_type}



@dataclass(frozen=True)
class Manifest:
    """Everything one (model fingerprint, template id) offers. See the module docstring.

    ``kv_layout`` is free-form plain JSON from the model adapter (e.g. layers, tokens, heads,
    head_dim, dtype) so the store needs nothing from the adapter to be written or read.
    """

    model_fingerprint: str
    template_id: str
    template_ref: TemplateRef
    shards: tuple[Shard, ...]
    tables: tuple[Table, ...] = ()
    kv_layout: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        self.validate()

    # -- consistency checks that span fields (each names what is wrong)
    def validate(self) -> None:
        try:
            check_name(self.model_fingerprint, "model fingerprint")
            check_name(self.template_id, "template id")
        except ValueError as e:
            raise ManifestError(str(e)) from None
        if self.schema_version not in READ_VERSIONS:
            raise _fail("schema_version", f"this reader understands versions {list(READ_VERSIONS)}, "
                                          f"got {self.schema_version!r}")
        if not self.shards:
            raise _fail("shards", "a manifest needs at least one shard")
        table_names = [t.name for t in self.tables]
        dup = {n for n in table_names if table_names.count(n) > 1}
        if dup:
            raise _fail("tables", f"duplicate table names {sorted(dup)}")
        for i, s in enumerate(self.shards):
            if s.index != i:
                raise _fail(f"shards[{i}].index", f"expected {i} (shards are listed in consumption order), got {s.index}")
            names = [r.name for r in s.renditions]
            if len(set(names)) != len(names):
                raise _fail(f"shards[{i}].renditions", f"duplicate rendition names {names}")
            for j, r in enumerate(s.renditions):
                missing = [t for t in r.tables if t not in table_names]
                if missing:
                    raise _fail(f"shards[{i}].renditions[{j}].tables", f"refers to unknown tables {missing}")

    # -- derived quantities
    def objects(self) -> list[ObjectRef]:
        """Every object this manifest refers to, each once (template ref, tables, renditions)."""
        seen: dict[str, ObjectRef] = {}
        for ref in self._all_refs():
            seen.setdefault(ref.sha256, ref)
        return list(seen.values())

    def _all_refs(self) -> Iterator[ObjectRef]:
        yield self.template_ref.object
        for t in self.tables:
            yield t.object
        for s in self.shards:
            for r in s.renditions:
                yield r.object

    def table(self, name: str) -> Table:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(f"manifest has no table {name!r}")

    @property
    def fp16_bytes(self) -> int:
        """Bytes of one uncompressed fp16 copy of the template KV (sum over shards)."""
        return sum(s.fp16_bytes for s in self.shards)

    # -- (de)serialisation
    def to_json(self, version: int = SCHEMA_VERSION) -> dict[str, Any]:
        """The JSON tree of `version` (2: without the derived ``image_psnr_db``)."""
        shards = [s.to_json() for s in self.shards]
        if version >= 2:
            for sh in shards:
                for r in sh["renditions"]:
                    r["distortion"].pop(IMAGE_PSNR, None)
        return {
            "schema": SCHEMA,
            "schema_version": version,
            "model_fingerprint": self.model_fingerprint,
            "template_id": self.template_id,
            "template_ref": self.template_ref.to_json(),
            "kv_layout": self.kv_layout,
            "tables": [t.to_json() for t in self.tables],
            "shards": shards,
        }

    def to_bytes(self) -> bytes:
        """Canonical encoding (version `SCHEMA_VERSION`): sorted keys, fixed separators and a
        fixed compression level, so equal manifests are equal bytes (an idempotent rebuild
        rewrites nothing)."""
        return encode_manifest_tree(self.to_json())

    @classmethod
    def from_json(cls, d: Any) -> "Manifest":
        """Parsed manifest JSON, checked against `ManifestJSON`, then across fields (`validate`)."""
        if isinstance(d, Mapping) and d.get("schema") != SCHEMA:  # say first what the file is not
            raise _fail("schema", f"expected {SCHEMA!r}, got {d.get('schema')!r} (not a sakura manifest?)")
        if isinstance(d, Mapping) and "schema_version" in d and d["schema_version"] not in READ_VERSIONS:
            raise _fail("schema_version", f"this reader understands versions {list(READ_VERSIONS)}, "
                                          f"got {d['schema_version']!r} (a newer sakura wrote it?)")
        if isinstance(d, Mapping) and d.get("schema_version") == 2:
            d = _with_derived_psnr(d)
        j = _validate(ManifestJSON, d, "")
        return cls(
            model_fingerprint=j.model_fingerprint,
            template_id=j.template_id,
            template_ref=TemplateRef(object=ObjectRef._from_schema(j.template_ref.object),
                                     media_type=j.template_ref.media_type),
            shards=tuple(Shard._from_schema(s, f"shards[{i}]") for i, s in enumerate(j.shards)),
            tables=tuple(Table(name=t.name, codec=t.codec, params=dict(t.params), object=ObjectRef._from_schema(t.object))
                         for t in j.tables),
            kv_layout=dict(j.kv_layout),
            schema_version=j.schema_version,
        )

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str = "manifest") -> "Manifest":
        """Parse and validate; errors name ``source`` and the offending field."""
        if len(data) > MAX_MANIFEST_BYTES:
            raise ManifestError(f"{source}: {len(data)} bytes exceeds the {MAX_MANIFEST_BYTES}-byte manifest limit")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ManifestError(f"{source}: expected bytes, got {type(data).__name__}")
        d = manifest_tree(bytes(data), source)
        try:
            return cls.from_json(d)
        except ManifestError as e:
            raise ManifestError(f"{source}: {e}") from None
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError, OverflowError) as e:
            # the field checks above should catch everything; this keeps a missed case typed
            raise ManifestError(f"{source}: malformed ({type(e).__name__}: {str(e)[:120]})") from None


def _with_derived_psnr(d: Mapping[str, Any]) -> dict[str, Any]:
    """A version-2 tree with every rendition's ``image_psnr_db`` put back (derived from its
    ``image_mse``) so one validation serves both versions; a v2 tree that stores it is refused."""
    out = dict(d)
    shards = d.get("shards")
    if not isinstance(shards, list):
        return out
    new_shards = []
    for i, sh in enumerate(shards):
        if not isinstance(sh, Mapping) or not isinstance(sh.get("renditions"), list):
            new_shards.append(sh)
            continue
        rs = []
        for k, r in enumerate(sh["renditions"]):
            dist = r.get("distortion") if isinstance(r, Mapping) else None
            if isinstance(dist, Mapping):
                if IMAGE_PSNR in dist:
                    raise _fail(f"shards[{i}].renditions[{k}].distortion.{IMAGE_PSNR}",
                                "not stored in version 2 (derived from image_mse)")
                mse = dist.get(IMAGE_MSE)
                if isinstance(mse, (int, float)) and not isinstance(mse, bool) and math.isfinite(mse) and mse >= 0:
                    p = psnr_db(float(mse))
                    r = {**r, "distortion": {**dist, IMAGE_PSNR: None if math.isinf(p) else p}}
            rs.append(r)
        new_shards.append({**sh, "renditions": rs})
    out["shards"] = new_shards
    return out


def encode_manifest_tree(tree: Mapping[str, Any]) -> bytes:
    """A manifest's JSON tree in the encoding its ``schema_version`` names (1: indented text;
    2: `MAGIC_V2` + zlib of the compact JSON). Sorted keys, fixed level: deterministic bytes."""
    if tree.get("schema_version") == 1:
        return (json.dumps(tree, sort_keys=True, indent=1, allow_nan=False) + "\n").encode()
    text = json.dumps(tree, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    return MAGIC_V2 + zlib.compress(text, 9)


def manifest_tree(data: bytes, source: str = "manifest") -> Any:
    """The parsed JSON tree of a manifest in either encoding (bounded: the JSON may not exceed
    `MAX_MANIFEST_BYTES` decompressed). Raises `ManifestError`."""
    if data[:len(MAGIC_V2)] == MAGIC_V2:
        z = zlib.decompressobj()
        try:
            text = z.decompress(data[len(MAGIC_V2):], MAX_MANIFEST_BYTES + 1)
        except zlib.error as e:
            raise ManifestError(f"{source}: a version-2 manifest whose compressed body is corrupt ({e})") from None
        if len(text) > MAX_MANIFEST_BYTES or z.unconsumed_tail:
            raise ManifestError(f"{source}: decompresses past the {MAX_MANIFEST_BYTES}-byte manifest limit")
        if not z.eof or z.unused_data:
            raise ManifestError(f"{source}: a version-2 manifest must be exactly one complete zlib stream")
        d = parse_json(text, source)
        if isinstance(d, Mapping) and d.get("schema_version") != 2:
            raise ManifestError(f"{source}: manifest field schema_version: the compressed encoding is version 2, "
                                f"got {d.get('schema_version')!r}")
        return d
    if data.lstrip()[:1] not in (b"{", b"[", b""):
        head = data[:4]
        raise ManifestError(f"{source}: not a sakura manifest (starts {head!r}: neither JSON, version 1, nor "
                            f"{MAGIC_V2!r}, version 2; written by a newer sakura?)")
    return parse_json(data, source)
