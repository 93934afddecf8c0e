"""The manifest: what one (model fingerprint, template) offers, validated on read.

A manifest lists the template's shards in the order the forward pass consumes them; each shard
lists its renditions (encodings) with codec name and parameters, byte size, measured distortion and
the content-addressed object that holds the bytes. Shared codec tables and the small template
reference (what the phone needs to compute the KV locally, the ``local`` pseudo-rendition) are
objects too. Every object is named by the sha256 of its bytes, which is also its checksum.

Pure data + validation: no I/O, no dependency on the codec or the model adapter.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from sakura.psnr import psnr_db
from sakura.store.layout import check_name, check_sha256, object_relpath

SCHEMA = "sakura.manifest"
SCHEMA_VERSION = 1
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


def _get(d: Mapping[str, Any], key: str, where: str) -> Any:
    if not isinstance(d, Mapping):
        raise _fail(where, f"expected an object, got {type(d).__name__}")
    if key not in d:
        raise _fail(f"{where}.{key}" if where else key, "missing")
    return d[key]


def _int(v: Any, where: str, lo: int = 0) -> int:
    # bool is an int subclass in Python; a JSON true is not a size.
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise _fail(where, f"expected an integer >= {lo}, got {v!r}")
    return v


def _str(v: Any, where: str, *, max_len: int = 256) -> str:
    if not isinstance(v, str) or not v or len(v) > max_len:
        raise _fail(where, f"expected a non-empty string of at most {max_len} chars, got {v!r}")
    return v


def _params(v: Any, where: str) -> dict[str, Any]:
    if not isinstance(v, Mapping):
        raise _fail(where, f"expected an object of codec parameters, got {type(v).__name__}")
    try:  # must round-trip through strict JSON (no NaN, only JSON types)
        json.dumps(v, allow_nan=False, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise _fail(where, f"not plain JSON: {e}") from None
    return dict(v)


def _known_keys(d: Mapping[str, Any], allowed: set[str], where: str) -> None:
    extra = set(d) - allowed
    if extra:
        raise _fail(where or "<root>", f"unknown keys {sorted(extra)} (schema v{SCHEMA_VERSION} allows {sorted(allowed)})")


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
    def from_json(cls, d: Any, where: str) -> "ObjectRef":
        _known_keys(_require_obj(d, where), {"sha256", "bytes"}, where)
        sha = _get(d, "sha256", where)
        try:
            check_sha256(sha, f"{where}.sha256")
        except ValueError as e:
            raise _fail(f"{where}.sha256", str(e)) from None
        return cls(sha256=sha, bytes=_int(_get(d, "bytes", where), f"{where}.bytes"))


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


def _quality_floor(d: Any, where: str) -> dict[str, Any]:
    """A shard's quality floor: {"reference": codec spec, "image_mse": MSE in [0, 1]}."""
    _known_keys(_require_obj(d, where), {"reference", "image_mse"}, where)
    mse = _get(d, "image_mse", where)
    if not isinstance(mse, (int, float)) or isinstance(mse, bool) or not math.isfinite(mse) or not 0 <= mse <= 1:
        raise _fail(f"{where}.image_mse", f"expected a per-pixel MSE in [0, 1], got {mse!r}")
    return {"reference": _str(_get(d, "reference", where), f"{where}.reference", max_len=128), "image_mse": float(mse)}


def _require_obj(d: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(d, Mapping):
        raise _fail(where or "<root>", f"expected an object, got {type(d).__name__}")
    return d


@dataclass(frozen=True)
class Prefix:
    """A rendition that is the first ``bytes`` bytes of its object (a progressive/layered codec's
    rung: one object in the store, one HTTP Range per rung), with the sha256 of that prefix."""

    bytes: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "sha256": self.sha256}

    @classmethod
    def from_json(cls, d: Any, where: str) -> "Prefix":
        _known_keys(_require_obj(d, where), {"bytes", "sha256"}, where)
        sha = _get(d, "sha256", where)
        try:
            check_sha256(sha, f"{where}.sha256")
        except ValueError as e:
            raise _fail(f"{where}.sha256", str(e)) from None
        return cls(bytes=_int(_get(d, "bytes", where), f"{where}.bytes", lo=1), sha256=sha)


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
    def from_json(cls, d: Any, where: str) -> "Rendition":
        _known_keys(_require_obj(d, where), {"name", "codec", "params", "object", "distortion", "tables", "prefix"},
                    where)
        dist = _distortion(_get(d, "distortion", where), f"{where}.distortion")
        tables = _get(d, "tables", where)
        if not isinstance(tables, list):
            raise _fail(f"{where}.tables", "expected a list of table names")
        obj = ObjectRef.from_json(_get(d, "object", where), f"{where}.object")
        prefix = Prefix.from_json(d["prefix"], f"{where}.prefix") if d.get("prefix") is not None else None
        if prefix is not None and prefix.bytes > obj.bytes:
            raise _fail(f"{where}.prefix.bytes", f"{prefix.bytes} exceeds the object's {obj.bytes} bytes")
        return cls(
            name=_str(_get(d, "name", where), f"{where}.name", max_len=128),
            codec=_str(_get(d, "codec", where), f"{where}.codec", max_len=64),
            params=_params(_get(d, "params", where), f"{where}.params"),
            object=obj,
            distortion=dist,
            tables=tuple(_str(t, f"{where}.tables[{i}]", max_len=128) for i, t in enumerate(tables)),
            prefix=prefix,
        )


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
        _known_keys(_require_obj(d, where), {"index", "layer", "tokens", "fp16_bytes", "renditions", "quality_floor"},
                    where)
        tok = _get(d, "tokens", where)
        if not (isinstance(tok, list) and len(tok) == 2):
            raise _fail(f"{where}.tokens", f"expected [start, stop], got {tok!r}")
        t0, t1 = _int(tok[0], f"{where}.tokens[0]"), _int(tok[1], f"{where}.tokens[1]")
        if t1 <= t0:
            raise _fail(f"{where}.tokens", f"empty or reversed token range [{t0}, {t1})")
        rends = _get(d, "renditions", where)
        if not isinstance(rends, list) or not rends:
            raise _fail(f"{where}.renditions", "expected a non-empty list")
        return cls(
            index=_int(_get(d, "index", where), f"{where}.index"),
            layer=_int(_get(d, "layer", where), f"{where}.layer"),
            tokens=(t0, t1),
            fp16_bytes=_int(_get(d, "fp16_bytes", where), f"{where}.fp16_bytes"),
            renditions=tuple(Rendition.from_json(r, f"{where}.renditions[{i}]") for i, r in enumerate(rends)),
            quality_floor=(_quality_floor(d["quality_floor"], f"{where}.quality_floor")
                           if d.get("quality_floor") is not None else None),
        )


@dataclass(frozen=True)
class Table:
    """A shared codec table (e.g. a per-layer symbol distribution), sent once, used by many shards."""

    name: str
    codec: str
    object: ObjectRef
    params: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "codec": self.codec, "params": self.params, "object": self.object.to_json()}

    @classmethod
    def from_json(cls, d: Any, where: str) -> "Table":
        _known_keys(_require_obj(d, where), {"name", "codec", "params", "object"}, where)
        return cls(
            name=_str(_get(d, "name", where), f"{where}.name", max_len=128),
            codec=_str(_get(d, "codec", where), f"{where}.codec", max_len=64),
            params=_params(_get(d, "params", where), f"{where}.params"),
            object=ObjectRef.from_json(_get(d, "object", where), f"{where}.object"),
        )


@dataclass(frozen=True)
class TemplateRef:
    """The small template reference the phone needs to compute the KV itself (``local``):
    e.g. the template's encoded reference latent or image; ``media_type`` says which."""

    object: ObjectRef
    media_type: str

    def to_json(self) -> dict[str, Any]:
        return {"object": self.object.to_json(), "media_type": self.media_type}

    @classmethod
    def from_json(cls, d: Any, where: str) -> "TemplateRef":
        _known_keys(_require_obj(d, where), {"object", "media_type"}, where)
        return cls(
            object=ObjectRef.from_json(_get(d, "object", where), f"{where}.object"),
            media_type=_str(_get(d, "media_type", where), f"{where}.media_type", max_len=128),
        )


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
        if self.schema_version != SCHEMA_VERSION:
            raise _fail("schema_version", f"this reader understands version {SCHEMA_VERSION}, got {self.schema_version!r}")
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
    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "schema_version": self.schema_version,
            "model_fingerprint": self.model_fingerprint,
            "template_id": self.template_id,
            "template_ref": self.template_ref.to_json(),
            "kv_layout": self.kv_layout,
            "tables": [t.to_json() for t in self.tables],
            "shards": [s.to_json() for s in self.shards],
        }

    def to_bytes(self) -> bytes:
        """Canonical encoding: sorted keys, fixed separators, so equal manifests are equal bytes
        (an idempotent rebuild rewrites nothing)."""
        return (json.dumps(self.to_json(), sort_keys=True, indent=1, allow_nan=False) + "\n").encode()

    @classmethod
    def from_json(cls, d: Any) -> "Manifest":
        _known_keys(
            _require_obj(d, ""),
            {"schema", "schema_version", "model_fingerprint", "template_id", "template_ref", "kv_layout", "tables", "shards"},
            "",
        )
        if d.get("schema") != SCHEMA:
            raise _fail("schema", f"expected {SCHEMA!r}, got {d.get('schema')!r} (not a sakura manifest?)")
        ver = _get(d, "schema_version", "")
        if ver != SCHEMA_VERSION:
            raise _fail("schema_version", f"this reader understands version {SCHEMA_VERSION}, got {ver!r}")
        shards, tables = _get(d, "shards", ""), _get(d, "tables", "")
        if not isinstance(shards, list):
            raise _fail("shards", "expected a list")
        if not isinstance(tables, list):
            raise _fail("tables", "expected a list")
        return cls(
            model_fingerprint=_str(_get(d, "model_fingerprint", ""), "model_fingerprint", max_len=128),
            template_id=_str(_get(d, "template_id", ""), "template_id", max_len=128),
            template_ref=TemplateRef.from_json(_get(d, "template_ref", ""), "template_ref"),
            shards=tuple(Shard.from_json(s, f"shards[{i}]") for i, s in enumerate(shards)),
            tables=tuple(Table.from_json(t, f"tables[{i}]") for i, t in enumerate(tables)),
            kv_layout=_params(_get(d, "kv_layout", ""), "kv_layout"),
        )

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str = "manifest") -> "Manifest":
        """Parse and validate; errors name ``source`` and the offending field."""
        if len(data) > MAX_MANIFEST_BYTES:
            raise ManifestError(f"{source}: {len(data)} bytes exceeds the {MAX_MANIFEST_BYTES}-byte manifest limit")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ManifestError(f"{source}: expected bytes, got {type(data).__name__}")
        d = parse_json(bytes(data), source)
        try:
            return cls.from_json(d)
        except ManifestError as e:
            raise ManifestError(f"{source}: {e}") from None
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError, OverflowError) as e:
            # the field checks above should catch everything; this keeps a missed case typed
            raise ManifestError(f"{source}: malformed ({type(e).__name__}: {str(e)[:120]})") from None
