"""The codec interface: shards in, bytes out, and back; plus renditions, shared tables, a registry.

A *shard* is one layer's template KV (or a token chunk of it):

    key, value : (tokens, heads, head_dim), float32 / float16 / bfloat16
    importance : (tokens,) float >= 0, optional: attention mass the model's photo/target queries
                 give each template token in this layer (averaged over heads, steps, calibration
                 photos). Importance-aware codecs spend bits by it; others ignore it.

Decoding returns key/value in the shard's original dtype plus `keep` (tokens,) bool: tokens a
codec dropped are False and must be masked out of attention (softmax renormalises over the rest).

The codec knows nothing of files, HTTP or models. Per-template shared state (probability tables)
is a separate `CodecTables` object, encoded once per template and passed to encode/decode.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
from abc import ABC, abstractmethod
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Protocol, Sequence

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr, ValidationError, create_model

from . import bitstream as bs
from .bitstream import CodecError, ShardId

from sakura.models.kv import LayerKV  # what every decoder returns: the one layer-K/V type (keep always a tensor)
from .metrics import attention_rel_error, rel_error, weighted_rel_error

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


class UnknownCodecError(CodecError, KeyError):
    """No codec is registered under that name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@dataclass
class ShardKV:
    """One shard of template KV to encode.

    Args:
        key: (tokens, heads, head_dim) tensor, float32/float16/bfloat16.
        value: (tokens, heads, head_dim) tensor, same shape and dtype as `key`.
        importance: optional (tokens,) float tensor >= 0 (need not sum to 1), or (2, tokens): keys'
            and values' own (e.g. `sakura.cloud.capture.token_sensitivity`); codecs with one per-token
            weight use their sum.
        layer: index of the layer this shard belongs to (codecs with per-layer settings or
            tables use it, e.g. CacheGen's bins by layer group).
        num_layers: how many layers the model has (for layer-group rules).
        sensitivity: optional (key, value) floats >= 0: how much the final image's MSE grows per
            unit of relative MSE in this layer's keys / values (calibrated on public photos, see
            `sakura.cloud.capture.sensitivity`); `sakura`/`layered` use it to split bits across layers and K/V.
        distortion: optional image distortion probe, ``distortion(kv, decoded) -> float``: the image
            MSE when this layer's keys (kv = "k") or values ("v") are replaced by `decoded` (a
            (tokens, heads, head_dim) tensor in the shard's dtype), everything else lossless
            (`sakura build` passes `sakura.cloud.capture.ShardDistortionProbe`). `progressive` with
            ``allocate="image"`` (its default) picks its steps by it; the codec never runs a model.
        fit_cache: what table fits derive from this shard alone and may reuse (`progressive`: each
            part's transform and rate-distortion grid, the same for every budget a ladder search
            tries); filled by the codecs. Valid while `key` and `value` are not changed in place.
    """

    key: torch.Tensor
    value: torch.Tensor
    importance: torch.Tensor | None = None
    layer: int = 0
    num_layers: int = 1
    sensitivity: tuple[float, float] | None = None
    distortion: Callable[[str, torch.Tensor], float] | None = field(default=None, repr=False, compare=False)
    fit_cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(int(s) for s in self.key.shape)  # type: ignore[return-value]

    @property
    def num_values(self) -> int:
        """Number of K plus V values."""
        return 2 * self.key.numel()

    @property
    def fp16_bytes(self) -> int:
        """Size of this shard as uncompressed fp16 (the reference for bits per value)."""
        return 2 * self.num_values

    def validate(self) -> None:
        """Raise `CodecError` naming the problem (shape, dtype, NaN/inf, bad importance)."""
        for name, t in (("key", self.key), ("value", self.value)):
            if not isinstance(t, torch.Tensor):
                raise CodecError(f"shard.{name} is {type(t).__name__}, expected a torch.Tensor")
            if t.ndim != 3:
                raise CodecError(f"shard.{name} has shape {tuple(t.shape)}; expected (tokens, heads, head_dim)")
            if t.dtype not in DTYPE_NAMES:
                raise CodecError(f"shard.{name} has dtype {t.dtype}; expected one of {sorted(DTYPES)}")
            if t.numel() == 0:
                raise CodecError(f"shard.{name} is empty {tuple(t.shape)}")
            finite = torch.isfinite(t)
            if not bool(finite.all()):
                raise CodecError(f"shard.{name} holds {int((~finite).sum())} NaN/inf values; refusing to encode")
        if self.key.shape != self.value.shape or self.key.dtype != self.value.dtype:
            raise CodecError(f"key {tuple(self.key.shape)} {self.key.dtype} and value "
                             f"{tuple(self.value.shape)} {self.value.dtype} differ")
        if self.importance is not None:
            imp = self.importance
            T = self.key.shape[0]
            if not isinstance(imp, torch.Tensor) or tuple(imp.shape) not in ((T,), (2, T)):
                raise CodecError(f"shard.importance must be a tensor of shape ({T},) or (2, {T}), "
                                 f"got {getattr(imp, 'shape', type(imp))}")
            if not bool(torch.isfinite(imp).all()) or bool((imp < 0).any()):
                raise CodecError("shard.importance must be finite and >= 0")
        if self.sensitivity is not None:
            sens = self.sensitivity
            if (not isinstance(sens, (tuple, list)) or len(sens) != 2
                    or not all(isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 for x in sens)):
                raise CodecError(f"shard.sensitivity must be two finite floats >= 0, got {sens!r}")
        if self.distortion is not None and not callable(self.distortion):
            raise CodecError("shard.distortion must be callable (kv, decoded) -> image MSE")
        if not (0 <= self.layer < max(self.num_layers, 1)):
            raise CodecError(f"shard.layer={self.layer} outside [0, num_layers={self.num_layers})")


@dataclass(frozen=True)
class RenditionReport:
    """What one encoding of one shard costs and how much it distorts (for manifests and schedulers).

    bits_per_value counts every byte of the object (headers, scales, masks) over 2*T*H*D values;
    table bytes are per template and reported separately by `CodecTables.nbytes`.
    `expected_distortion` is `attn_rel_err` when queries were given, else `weighted_rel_err`.
    """

    codec: str
    params: dict[str, Any]
    nbytes: int
    num_values: int
    bits_per_value: float
    key_rel_err: float
    value_rel_err: float
    weighted_rel_err: float
    keep_fraction: float
    attn_rel_err: float | None
    expected_distortion: float

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


# ----------------------------------------------------------------------------------------------
# shared tables

@dataclass
class CodecTables:
    """Per-template (per model and layer) shared codec state, e.g. symbol histograms.

    `arrays` maps names (codecs choose them, e.g. "L3.K.b4") to small integer arrays. Encoded
    once per template with `to_bytes`; shard objects record `fingerprint` and refuse other tables.
    """

    codec: str
    arrays: dict[str, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)
    _cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def fingerprint(self) -> str:
        h = hashlib.sha256(self.codec.encode())
        h.update(json.dumps(self.meta, sort_keys=True).encode())
        for name in sorted(self.arrays):
            a = np.ascontiguousarray(self.arrays[name])
            h.update(f"{name}|{a.dtype.str}|{a.shape}".encode())
            h.update(a.tobytes())
        return h.hexdigest()[:32]

    def to_bytes(self, ident: ShardId) -> bytes:
        w = bs.Writer()
        for name in sorted(self.arrays):
            w.add(name, self.arrays[name], zstd_level=10)
        return w.to_bytes(bs.KIND_TABLES, {"codec": self.codec, "id": ident.to_json(), "meta": self.meta,
                                           "fingerprint": self.fingerprint})

    @property
    def nbytes(self) -> int:
        """Encoded size (the storage a template pays once for these tables)."""
        return len(self.to_bytes(ShardId("", "", -1)))

    @classmethod
    def from_bytes(cls, data: bytes, ident: ShardId, *, codec: str | None = None) -> "CodecTables":
        obj = bs.parse(data)
        bs.check_identity(obj, ident, codec=codec, kind=bs.KIND_TABLES)
        arrays = {s["name"]: obj.section(s["name"]) for s in obj.header["sections"]}
        t = cls(codec=obj.header["codec"], arrays=arrays, meta=obj.header.get("meta", {}))
        if t.fingerprint != obj.header.get("fingerprint"):
            raise bs.CorruptError("codec tables do not match their recorded fingerprint")
        return t

    def get(self, name: str) -> np.ndarray:
        try:
            return self.arrays[name]
        except KeyError:
            raise bs.IdentityError(f"codec tables have no entry {name!r}; were they fitted for this "
                                   "codec setting and layer?") from None

    def cached(self, key: str, make: Callable[[], Any]) -> Any:
        """Memoise derived objects (entropy models) on this table set."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]


# ----------------------------------------------------------------------------------------------
# the interface

@dataclass
class LadderState:
    """What every ladder's decode state carries: its codec, the shard's identity, the tables, the
    output dtype and shape, and the base object's header (`progressive.ladder.ProgressiveState`,
    `nested.ladder.NestedState`)."""

    codec: Any
    ident: ShardId
    tables: CodecTables | None
    dtype: torch.dtype
    shape: tuple[int, int, int]
    header: dict[str, Any]


class LayerState(Protocol):
    """A layered codec's decoded shard at some rung (`Codec.decode_state`)."""

    level: int

    def upgrade(self, piece: bytes) -> "LayerState": ...

    def result(self) -> LayerKV: ...


class Codec(ABC):
    """Encode shards to self-describing bytes and back.

    Subclasses set `name`, validate their parameters in `__init__`, and implement `encode` and
    `decode`. Codecs that need shared tables set `uses_tables = True` and implement `fit_tables`.
    Layered codecs set `supports_layers = True` and implement `start_state`; `level_ends`,
    `decode_state` and `upgrade` then work on their ladders (other codecs raise NotImplementedError).
    Decoding takes parameters from the object's header, so any instance of a codec decodes any
    object of that codec.
    """

    name: ClassVar[str]
    uses_tables: ClassVar[bool] = False
    supports_layers: ClassVar[bool] = False

    def __init__(self, **params: Any) -> None:
        self.params: dict[str, Any] = params

    @property
    def spec(self) -> str:
        """`name:k=v,...`, parseable by `codec_from_spec`."""
        if not self.params:
            return self.name
        return self.name + ":" + ",".join(f"{k}={json.dumps(v, separators=(',', ':'))}"
                                          for k, v in sorted(self.params.items()))

    def __repr__(self) -> str:
        return f"<codec {self.spec}>"

    def fit_tables(self, shards: Sequence[ShardKV]) -> CodecTables | None:
        """Build the per-template shared tables from all of a template's shards (cloud side)."""
        return None

    @abstractmethod
    def encode(self, shard: ShardKV, ident: ShardId, tables: CodecTables | None = None) -> bytes:
        """Encode `shard` as one object tagged with `ident`. Raises `CodecError` on bad input."""

    @abstractmethod
    def decode(self, data: bytes, ident: ShardId, tables: CodecTables | None = None) -> LayerKV:
        """Decode an object written for `ident`; raises a `CodecError` subclass, never returns garbage."""

    # -- layered codecs (supports_layers): a ladder of rungs in one object, rung l a byte prefix ----
    def level_ends(self, data: bytes) -> list[int]:
        """Byte offsets where each rung's objects end: rung l is ``data[:ends[l]]``."""
        self._require_layers("level_ends")
        return [end for _start, end in bs.split_objects(data)]

    def decode_state(self, data: bytes, ident: ShardId, tables: CodecTables | None = None) -> "LayerState":
        """Decode every complete rung in `data` into a state that `upgrade` can refine; a partial
        trailing object raises `TruncatedError`."""
        self._require_layers("decode_state")
        st = None
        at = 0
        mv = memoryview(data)
        while at < len(mv):
            _kind, hlen, plen, _ = bs.read_fixed(mv, at)
            end = at + bs.FIXED_SIZE + hlen + plen
            if end > len(mv):
                raise bs.TruncatedError(f"level object at byte {at} truncated: needs {end - at} bytes, "
                                        f"{len(mv) - at} present")
            piece = bytes(mv[at:end])
            st = self.start_state(piece, ident, tables) if st is None else st.upgrade(piece)
            at = end
        if st is None:
            raise bs.TruncatedError("empty object")
        return st

    def upgrade(self, state: "LayerState", piece: bytes) -> "LayerState":
        """Apply the next rung's object to a decoded state (in place; returns it). A piece that does
        not refine this state raises `IdentityError`."""
        self._require_layers("upgrade")
        return state.upgrade(piece)

    def start_state(self, piece: bytes, ident: ShardId, tables: CodecTables | None) -> "LayerState":
        """Decode a ladder's base object (layered codecs implement this)."""
        raise NotImplementedError(f"codec {self.name!r} has no layers")

    def _require_layers(self, op: str) -> None:
        if not self.supports_layers:
            raise NotImplementedError(f"codec {self.name!r} is not layered (supports_layers is False): no {op}")

    def encode_many(self, shards: Sequence[ShardKV], idents: Sequence[ShardId],
                    tables: CodecTables | None = None) -> list[bytes]:
        return [self.encode(s, i, tables) for s, i in zip(shards, idents, strict=True)]

    def decode_many(self, datas: Sequence[bytes], idents: Sequence[ShardId],
                    tables: CodecTables | None = None) -> list[LayerKV]:
        return [self.decode(d, i, tables) for d, i in zip(datas, idents, strict=True)]

    def describe(self, shard: ShardKV, data: bytes, ident: ShardId, tables: CodecTables | None = None,
                 queries: torch.Tensor | None = None, decoded: DecodedShard | None = None) -> RenditionReport:
        """Measure a rendition: size, bits per value, and distortion against `shard`.

        Args:
            queries: optional (n_queries, heads, head_dim) queries (e.g. the model's photo/target
                queries at this layer) for the attention-output relative error.
            decoded: `decode(data, ident, tables)` when the caller has it already (the build
                decodes each rendition once, for this and for its image probe).
        """
        dec = decoded if decoded is not None else self.decode(data, ident, tables)
        keep = dec.keep
        attn = None
        if queries is not None:
            attn = attention_rel_error(queries, shard.key, shard.value, dec.key, dec.value, keep)
        w = weighted_rel_error(shard.key, shard.value, shard.importance, dec)
        return RenditionReport(
            codec=self.name, params=dict(self.params), nbytes=len(data), num_values=shard.num_values,
            bits_per_value=8.0 * len(data) / shard.num_values,
            key_rel_err=rel_error(shard.key, dec.key, keep), value_rel_err=rel_error(shard.value, dec.value, keep),
            weighted_rel_err=w, keep_fraction=float(keep.float().mean()), attn_rel_err=attn,
            expected_distortion=attn if attn is not None else w)

    # -- helpers for subclasses -----------------------------------------------------------------
    def _header(self, shard: ShardKV, ident: ShardId, tables: CodecTables | None, **extra: Any) -> dict[str, Any]:
        h = {"codec": self.name, "params": self.params, "id": ident.to_json(),
             "dtype": DTYPE_NAMES[shard.key.dtype], "shape": list(shard.shape), "layer": shard.layer,
             "num_layers": shard.num_layers, "tables": tables.fingerprint if tables is not None else None}
        h.update(extra)
        return h

    def _open(self, data: bytes, ident: ShardId, tables: CodecTables | None, kind: int = bs.KIND_SHARD,
              whole: bool = True, parsed: bs.Object | None = None) -> tuple[bs.Object, torch.dtype, tuple[int, int, int]]:
        """Parse + verify an object: checksum, identity, codec name, tables; return (obj, dtype, shape).
        `parsed`: `bitstream.parse(data, whole=False)` when the caller has it (header parsed and
        checksum verified once per shard on the phone), not parsed again."""
        if parsed is None:
            obj = bs.parse(data, whole=whole)
        elif whole and parsed.nbytes != len(data):
            raise bs.CorruptError(f"{len(data) - parsed.nbytes} unexpected trailing bytes after the object")
        else:
            obj = parsed
        bs.check_identity(obj, ident, codec=self.name, kind=kind)
        h = obj.header
        want_tables = h.get("tables")
        if want_tables is not None:
            if tables is None:
                raise bs.IdentityError(f"this {self.name} object needs its template's codec tables "
                                       f"(fingerprint {want_tables[:12]}…); none were given")
            if tables.fingerprint != want_tables:
                raise bs.IdentityError(f"codec tables mismatch: object wants {want_tables[:12]}…, "
                                       f"got {tables.fingerprint[:12]}…")
        try:
            dtype = DTYPES[h["dtype"]]
            shape = tuple(int(s) for s in h["shape"])
        except (KeyError, TypeError, ValueError):
            raise bs.CorruptError(f"header has a bad dtype/shape: {h.get('dtype')!r} {h.get('shape')!r}") from None
        if len(shape) != 3 or min(shape) <= 0:
            raise bs.CorruptError(f"header shape {shape} is not (tokens, heads, head_dim)")
        if shape[0] * shape[1] * shape[2] > MAX_VALUES:
            raise bs.CorruptError(f"header shape {shape} exceeds the {MAX_VALUES} values one shard may hold")
        return obj, dtype, shape  # type: ignore[return-value]


# ----------------------------------------------------------------------------------------------
# registry

_REGISTRY: dict[str, type[Codec]] = {}
MAX_VALUES = 1 << 28  # per K or V tensor of one shard (Klein-4B at 1024x1024: 4096 x 3072 = 2^23.6)


def register(cls: type[Codec]) -> type[Codec]:
    """Class decorator: register a codec under `cls.name` (duplicate names raise)."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"codec name {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def available_codecs() -> list[str]:
    return sorted(_REGISTRY)


def get_codec(name: str, **params: Any) -> Codec:
    """Instantiate the codec registered as `name`; unknown names raise `UnknownCodecError`."""
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise UnknownCodecError(f"unknown codec {name!r}; available: {', '.join(available_codecs())}") from None
    return cls(**params)


def codec_from_spec(spec: str) -> Codec:
    """Parse `name` or `name:k=v,k=v` (values as JSON, else strings), e.g. `uniform:bits=4`."""
    name, params = parse_spec(spec)
    return get_codec(name, **params)


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """`name:k=v,...` -> (name, the parameters as written, without defaults)."""
    name, _, rest = spec.partition(":")
    params: dict[str, Any] = {}
    if rest:
        for part in _split_top(rest):
            k, eq, v = part.partition("=")
            if not eq or not k:
                raise ValueError(f"bad codec parameter {part!r} in {spec!r} (expected k=v)")
            try:
                params[k.strip()] = json.loads(v)
            except json.JSONDecodeError:
                params[k.strip()] = v
    return name.strip(), params


def _split_top(s: str) -> list[str]:
    """Split on commas that are not inside [...] (so `budgets=[1,2]` stays one part)."""
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        out.append(cur)
    return out


def decode_any(data: bytes, ident: ShardId, tables: CodecTables | None = None,
               pool: Executor | None = None, parsed: bs.Object | None = None) -> LayerKV:
    """Decode an object with whichever registered codec wrote it (named in its header). `pool`:
    threads that may share this one shard, for codecs whose `decode` takes one (the native
    progressive and CacheGen decoders; bit-equal to the serial decode); ignored by the others.
    `parsed`: the first object of `data` as `bitstream.parse(data, whole=False)` returned it (the
    phone parses and checks a shard's header once, before decoding): not parsed or checksummed
    again by the codecs whose `decode` takes it (progressive, CacheGen, lossless, uniform)."""
    obj = parsed if parsed is not None else bs.parse(data, whole=False)
    codec = obj.header.get("codec")
    if not isinstance(codec, str):
        raise bs.CorruptError("object header names no codec")
    params = obj.header.get("params", {})
    if not isinstance(params, dict):
        raise bs.CorruptError("object header has malformed codec parameters")
    try:
        codec_obj = get_codec(codec, **params)
    except UnknownCodecError:
        raise
    except (ValueError, TypeError) as e:
        raise bs.CorruptError(f"object header has invalid {codec} parameters: {e}") from None
    takes = _decode_keywords(type(codec_obj))
    extra = {k: v for k, v in (("pool", pool), ("parsed", obj)) if v is not None and k in takes}
    return codec_obj.decode(data, ident, tables, **extra)


_DECODE_KEYWORDS: dict[type, frozenset[str]] = {}


def _decode_keywords(cls: type) -> frozenset[str]:
    """The parameters of a codec class's `decode` (looked up once per class)."""
    if cls not in _DECODE_KEYWORDS:
        _DECODE_KEYWORDS[cls] = frozenset(inspect.signature(cls.decode).parameters)
    return _DECODE_KEYWORDS[cls]


# ----------------------------------------------------------------------------------------------
# tensor helpers

def as_f32_2d(t: torch.Tensor) -> np.ndarray:
    """(tokens, heads, head_dim) tensor -> (tokens, heads*head_dim) float32 numpy array."""
    return t.detach().to(torch.float32).reshape(t.shape[0], -1).contiguous().numpy()


def from_f32_2d(a: np.ndarray, shape: tuple[int, int, int], dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).reshape(shape).to(dtype)


def finite(out: "LayerKV", codec: str) -> "LayerKV":
    """`out` unchanged if its KV is finite, else `CorruptError`: a decoder never returns inf/NaN
    (damaged scales behind a recomputed checksum would otherwise reach attention)."""
    for t in (out.key, out.value):
        if not bool(torch.isfinite(t).all()):
            raise bs.CorruptError(f"{codec}: object decodes to non-finite values (corrupt scales or payload)")
    return out


def _param_type(default: Any) -> Any:
    """The strict type a parameter takes, from its default: a bool, an int, a number, a string,
    or (a list default, e.g. budgets) one number or a list of numbers."""
    if isinstance(default, bool):
        return StrictBool
    if isinstance(default, int):
        return StrictInt
    if isinstance(default, float):
        return float  # strict: an int is a number too, a bool or a string is not
    if isinstance(default, str):
        return StrictStr
    if isinstance(default, (list, tuple)):
        return float | list[float]
    return Any


@functools.lru_cache(maxsize=None)
def _params_model(codec: str, fields: tuple[tuple[str, str], ...]) -> type[BaseModel]:
    defaults = dict(_PARAM_DEFAULTS[(codec, fields)])
    return create_model(f"{codec}_params", __config__=ConfigDict(strict=True, extra="forbid", allow_inf_nan=False),
                        **{k: (_param_type(v), v) for k, v in defaults.items()})


_PARAM_DEFAULTS: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, Any]] = {}


def check_params(params: dict[str, Any], allowed: dict[str, Any], codec: str) -> dict[str, Any]:
    """Fill defaults and validate `params` against the schema `allowed` (name -> default) implies,
    through a strict pydantic model (`_param_type`): unknown names, a bool for a number, a string
    for an int, NaN or inf are errors (ValueError, one line); each codec then checks its ranges.
    Returns the parameters as given, over the defaults."""
    unknown = set(params) - set(allowed)
    if unknown:
        raise ValueError(f"codec {codec!r}: unknown parameter(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    key = (codec, tuple(sorted((k, type(v).__name__) for k, v in allowed.items())))
    _PARAM_DEFAULTS.setdefault(key, dict(allowed))
    try:
        _params_model(*key).model_validate(params)
    except ValidationError as e:
        err = e.errors()[0]
        name = ".".join(str(x) for x in err["loc"][:1])
        raise ValueError(f"codec {codec!r}: parameter {name}={params.get(name)!r}: {err['msg'].lower()}") from None
    out = dict(allowed)
    out.update(params)
    return out

