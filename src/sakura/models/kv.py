"""Template KV as a first-class object.

A template's KV is, for every attention layer the forward pass runs, the keys and values of the
template's tokens. It is a pure function of (model weights + config, template): the fingerprints
of both travel with it so it can never be applied to the wrong model or template.

Layout of one layer (`LayerKV`):
    key   : (tokens, heads, head_dim)  as the model stores it (after QK-norm and RoPE)
    value : (tokens, heads, head_dim)
    keep  : (tokens,) bool or None     False = token dropped by a lossy codec; the model masks it
                                       out of attention so the softmax renormalises over the rest.

Layers are in the order the forward pass consumes them (for Klein: double-stream blocks, then
single-stream blocks). On disk a `TemplateKV` is one safetensors file whose metadata carries the
format version, both fingerprints, the token layout and a sha256 of all tensor bytes (safetensors
itself does not checksum data).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Protocol, runtime_checkable

import torch
from safetensors import safe_open
from safetensors.torch import save

from sakura.util.fsutil import atomic_write

FORMAT = "sakura.template_kv"
#: 2: ``content_sha256`` covers the metadata too (v1 covered tensors only, so ``num_layers: "1"``
#: silently loaded 1 of 6 layers); v1 files are refused with a line saying to re-extract.
FORMAT_VERSION = 2
#: The metadata keys a file has, exactly (all strings, as safetensors stores them).
META_KEYS = frozenset({"format", "format_version", "model_fingerprint", "template_fingerprint", "num_layers",
                       "layout", "content_sha256"})
_MAX_LAYERS = 4096
_MAX_LAYOUT_CHARS = 1 << 16


class TemplateKVError(ValueError):
    """A template KV is malformed, corrupt, or does not belong to this model/template."""


@dataclass(frozen=True)
class LayerKV:
    """One layer's template keys and values: the one K/V type of the project (what a model captures
    and injects, what a codec decodes to, what the phone streams).

    key, value: (tokens, heads, head_dim), same shape and dtype. keep: (tokens,) bool, the tokens
    attention may use (a codec that drops tokens says which), or None for all of them; a decoder
    always gives the tensor, `for_attention` the form a model takes.
    """

    key: torch.Tensor
    value: torch.Tensor
    keep: torch.Tensor | None = None

    @property
    def keep_mask(self) -> torch.Tensor | None:
        """`keep`, or None when every token is kept (attention then takes its unmasked path)."""
        return None if self.keep is None or bool(self.keep.all()) else self.keep

    def for_attention(self) -> "LayerKV":
        """This layer with ``keep`` None when every token is kept: an all-True mask would send
        attention down its masked kernel, which is not bit-equal to the unmasked one."""
        mask = self.keep_mask
        return self if mask is self.keep else LayerKV(self.key, self.value, mask)

    @property
    def num_tokens(self) -> int:
        return int(self.key.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes of key + value as stored (the keep mask is not counted)."""
        return self.key.numel() * self.key.element_size() + self.value.numel() * self.value.element_size()

    def check(self, where: str = "layer", *, tokens: int | None = None, heads: int | None = None,
              head_dim: int | None = None, check_finite: bool = True) -> None:
        """Raise `TemplateKVError` naming the problem if this layer is malformed or does not fit."""
        for name, t in (("key", self.key), ("value", self.value)):
            if not isinstance(t, torch.Tensor):
                raise TemplateKVError(f"{where}.{name} is {type(t).__name__}, expected a torch.Tensor")
            if t.ndim != 3:
                raise TemplateKVError(
                    f"{where}.{name} has shape {tuple(t.shape)}; expected (tokens, heads, head_dim)")
            if not t.is_floating_point():
                raise TemplateKVError(f"{where}.{name} has dtype {t.dtype}; expected a floating dtype")
            if check_finite and not bool(torch.isfinite(t).all()):
                bad = int((~torch.isfinite(t)).sum())
                raise TemplateKVError(f"{where}.{name} holds {bad} NaN/inf values")
        if self.key.shape != self.value.shape:
            raise TemplateKVError(
                f"{where}: key shape {tuple(self.key.shape)} != value shape {tuple(self.value.shape)}")
        t_, h_, d_ = self.key.shape
        for label, want, got in (("tokens", tokens, t_), ("heads", heads, h_), ("head_dim", head_dim, d_)):
            if want is not None and want != got:
                raise TemplateKVError(f"{where}: {label} = {got}, the model expects {want}")
        if self.keep is not None:
            if self.keep.dtype != torch.bool or tuple(self.keep.shape) != (t_,):
                raise TemplateKVError(
                    f"{where}.keep must be a bool tensor of shape ({t_},), got {self.keep.dtype} "
                    f"{tuple(self.keep.shape)}")
            if not bool(self.keep.any()):
                raise TemplateKVError(f"{where}.keep drops every token; at least one must be kept")


class KVSourceDefaults:
    """Base for a `TemplateKVSource` that carries no positions, layout or instruction."""

    positions: torch.Tensor | None = None
    layout: Mapping[str, Any] = MappingProxyType({})
    instruction: Any = None


@runtime_checkable
class TemplateKVSource(Protocol):
    """Anything that hands out a layer's template KV when the forward pass reaches that layer.

    `TemplateKV` is one (everything resident). The streaming runtime provides another whose
    `layer(i)` blocks until shard i has arrived and been decoded; the model does not know which.
    A source that does not carry `positions`, `layout` or `instruction` says so with None / {} /
    None (inherit `KVSourceDefaults`); the models read these and nothing else off a source.
    """

    model_fingerprint: str
    template_fingerprint: str
    #: (tokens, n_axes) position ids the keys were rotated with (flux2-mini, Klein), or None; a
    #: model checks them against its template slot and learns the token count without a layer
    positions: torch.Tensor | None
    #: the template token layout the KV depends on (`TemplateKV.layout`), or {} when not carried
    layout: Mapping[str, Any]
    #: the template's fixed instruction (a task id; Klein: the prompt text), or None when not
    #: carried (flux2-mini and Klein need it for the edit: the caller then passes it)
    instruction: Any

    @property
    def num_layers(self) -> int: ...

    def layer(self, index: int) -> LayerKV: ...


@dataclass
class TemplateKV:
    """All layers' template KV plus what it depends on.

    Args:
        layers: one `LayerKV` per attention layer, in consumption order.
        model_fingerprint: hex sha256 of the model's config and weights (`fingerprint_model`).
        template_fingerprint: hex sha256 of the template's content (`fingerprint_tensors`).
        layout: JSON-serialisable description of the template token layout the KV depends on
            (e.g. {"kind": "sakura-mini", "grid": [16, 16]}; Klein adds the reference slot).
        positions: optional (tokens, n_axes) position ids the keys were rotated with (Klein: RoPE
            ids of the reference slot). Kept so a consumer can check it matches its own layout.
    """

    layers: list[LayerKV]
    model_fingerprint: str
    template_fingerprint: str
    layout: dict[str, Any] = field(default_factory=dict)
    positions: torch.Tensor | None = None

    # -- the TemplateKVSource protocol -------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def layer(self, index: int) -> LayerKV:
        if not 0 <= index < len(self.layers):
            raise IndexError(f"layer {index} out of range (template KV has {len(self.layers)} layers)")
        return self.layers[index]

    @property
    def instruction(self) -> Any:
        """The template's instruction as recorded in `layout["instruction"]` (None if absent)."""
        return self.layout.get("instruction")

    # -- facts --------------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return self.layers[0].num_tokens

    @property
    def heads(self) -> int:
        return int(self.layers[0].key.shape[1])

    @property
    def head_dim(self) -> int:
        return int(self.layers[0].key.shape[2])

    @property
    def dtype(self) -> torch.dtype:
        return self.layers[0].key.dtype

    @property
    def nbytes(self) -> int:
        """Bytes of all keys and values as stored."""
        return sum(layer.nbytes for layer in self.layers)

    def validate(self, *, num_layers: int | None = None, tokens: int | None = None,
                 heads: int | None = None, head_dim: int | None = None,
                 model_fingerprint: str | None = None, template_fingerprint: str | None = None) -> None:
        """Raise `TemplateKVError` naming the first problem found; return None if all is well."""
        if model_fingerprint is not None and model_fingerprint != self.model_fingerprint:
            raise TemplateKVError(
                f"template KV was made by model {self.model_fingerprint[:16]}…, not this model "
                f"({model_fingerprint[:16]}…); refusing to inject it")
        if template_fingerprint is not None and template_fingerprint != self.template_fingerprint:
            raise TemplateKVError(
                f"template KV belongs to template {self.template_fingerprint[:16]}…, not "
                f"{template_fingerprint[:16]}…")
        if not self.layers:
            raise TemplateKVError("template KV has no layers")
        if num_layers is not None and len(self.layers) != num_layers:
            raise TemplateKVError(f"template KV has {len(self.layers)} layers, the model has {num_layers}")
        self.layers[0].check("layer 0", tokens=tokens, heads=heads, head_dim=head_dim)
        first = self.layers[0].key.shape
        for i, layer in enumerate(self.layers):
            layer.check(f"layer {i}", tokens=tokens if tokens is not None else int(first[0]),
                        heads=heads if heads is not None else int(first[1]),
                        head_dim=head_dim if head_dim is not None else int(first[2]))

    def to(self, dtype: torch.dtype) -> "TemplateKV":
        """A copy with keys/values cast to `dtype` (e.g. torch.float16 for a raw stream)."""
        return TemplateKV(
            layers=[LayerKV(l.key.to(dtype), l.value.to(dtype), l.keep) for l in self.layers],
            model_fingerprint=self.model_fingerprint, template_fingerprint=self.template_fingerprint,
            layout=dict(self.layout), positions=self.positions)

    # -- persistence --------------------------------------------------------------------------
    def _tensors(self) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            out[f"layer.{i}.key"] = layer.key.contiguous()
            out[f"layer.{i}.value"] = layer.value.contiguous()
            if layer.keep is not None:
                out[f"layer.{i}.keep"] = layer.keep.contiguous()
        if self.positions is not None:
            out["positions"] = self.positions.contiguous()
        return out

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically (temp file + rename) as safetensors; returns the path."""
        self.validate()
        tensors = self._tensors()
        meta = {
            "format": FORMAT,
            "format_version": str(FORMAT_VERSION),
            "model_fingerprint": self.model_fingerprint,
            "template_fingerprint": self.template_fingerprint,
            "num_layers": str(len(self.layers)),
            "layout": json.dumps(self.layout, sort_keys=True),
        }
        meta["content_sha256"] = _content_digest(tensors, meta)
        return atomic_write(path, save(tensors, metadata=meta))

    @classmethod
    def load(cls, path: str | os.PathLike, *, model_fingerprint: str | None = None,
             template_fingerprint: str | None = None) -> "TemplateKV":
        """Read and validate a file written by `save`.

        Raises `TemplateKVError` if the file is truncated or corrupt, is not a template KV, is of a
        newer format version, fails its content checksum, or (when given) belongs to another
        model or template.
        """
        path = Path(path)
        if not path.is_file():
            raise TemplateKVError(f"{path}: no such template KV file")
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as e:  # safetensors raises its own error types for bad headers/sizes
            raise TemplateKVError(f"{path}: corrupt or truncated template KV file ({_first_line(e)})") from None
        try:
            return cls._from_parts(path, meta, tensors, model_fingerprint, template_fingerprint)
        except TemplateKVError:
            raise
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError, OverflowError,
                RuntimeError) as e:  # a case the checks below missed still comes out typed
            raise TemplateKVError(f"{path}: malformed template KV ({type(e).__name__}: {_first_line(e)})") from None

    @classmethod
    def _from_parts(cls, path: Path, meta: dict, tensors: dict[str, torch.Tensor], model_fingerprint: str | None,
                    template_fingerprint: str | None) -> "TemplateKV":
        if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
            raise TemplateKVError(f"{path}: metadata must map strings to strings")
        if meta.get("format") != FORMAT:
            raise TemplateKVError(f"{path}: not a sakura template KV file (format={meta.get('format')!r})")
        ver = meta.get("format_version", "")
        if not ver.isdigit() or len(ver) > 6:  # "-1", "1.0", " 1", "" are not versions
            raise TemplateKVError(f"{path}: unreadable format_version {ver!r}")
        version = int(ver)
        if version > FORMAT_VERSION:
            raise TemplateKVError(
                f"{path}: format version {version} is newer than this sakura reads ({FORMAT_VERSION})")
        if version < FORMAT_VERSION:
            raise TemplateKVError(f"{path}: format version {version} predates checksummed metadata; "
                                  f"re-extract it with this sakura (format {FORMAT_VERSION})")
        if set(meta) != META_KEYS:
            raise TemplateKVError(f"{path}: metadata keys {sorted(meta)} are not exactly {sorted(META_KEYS)}")
        if _content_digest(tensors, meta) != meta["content_sha256"]:
            raise TemplateKVError(f"{path}: content checksum mismatch (file corrupted)")
        # The checksum holds; still check types, since a writer other than `save` made it.
        n_txt = meta["num_layers"]
        if not n_txt.isdigit() or not 1 <= int(n_txt[:6]) <= _MAX_LAYERS:
            raise TemplateKVError(f"{path}: num_layers {n_txt!r} is not an integer in [1, {_MAX_LAYERS}]")
        n = int(n_txt)
        for key in ("model_fingerprint", "template_fingerprint"):
            if not 1 <= len(meta[key]) <= 128 or not meta[key].isascii():
                raise TemplateKVError(f"{path}: {key} must be 1-128 ASCII characters")
        if len(meta["layout"]) > _MAX_LAYOUT_CHARS:
            raise TemplateKVError(f"{path}: layout is over {_MAX_LAYOUT_CHARS} characters")
        try:
            layout = json.loads(meta["layout"])
        except (ValueError, RecursionError) as e:
            raise TemplateKVError(f"{path}: layout is not JSON ({_first_line(e)})") from None
        if not isinstance(layout, dict):
            raise TemplateKVError(f"{path}: layout must be a JSON object, got {type(layout).__name__}")
        expected = {f"layer.{i}.{part}" for i in range(n) for part in ("key", "value")}
        allowed = expected | {f"layer.{i}.keep" for i in range(n)} | {"positions"}
        missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - allowed)
        if missing:
            raise TemplateKVError(f"{path}: missing tensor {missing[0]} (num_layers = {n})")
        if extra:
            raise TemplateKVError(f"{path}: unexpected tensor {extra[0]} (num_layers = {n})")
        layers = [LayerKV(tensors[f"layer.{i}.key"], tensors[f"layer.{i}.value"], tensors.get(f"layer.{i}.keep"))
                  for i in range(n)]
        kv = cls(layers=layers, model_fingerprint=meta["model_fingerprint"],
                 template_fingerprint=meta["template_fingerprint"], layout=layout, positions=tensors.get("positions"))
        kv.validate(model_fingerprint=model_fingerprint, template_fingerprint=template_fingerprint)
        return kv


def _first_line(e: BaseException, limit: int = 160) -> str:
    msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return msg[:limit]


def _content_digest(tensors: dict[str, torch.Tensor], meta: dict[str, str] | None = None) -> str:
    """sha256 over every tensor (name, dtype, shape, bytes) and, for a file, every metadata entry
    but the digest itself (so no metadata field can be altered without failing the check)."""
    h = hashlib.sha256()
    if meta is not None:
        h.update(json.dumps({k: v for k, v in meta.items() if k != "content_sha256"}, sort_keys=True).encode())
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(repr(tuple(t.shape)).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def fingerprint_tensors(tensors: dict[str, torch.Tensor], extra: dict[str, Any] | None = None) -> str:
    """Hex sha256 over named tensors (names, dtypes, shapes, bytes) and optional JSON metadata."""
    h = hashlib.sha256()
    h.update(json.dumps(extra or {}, sort_keys=True, default=str).encode())
    h.update(_content_digest(tensors).encode())
    return h.hexdigest()


def fingerprint_model(module: torch.nn.Module, config: dict[str, Any]) -> str:
    """Hex sha256 of a model's config and every parameter/buffer (the cache key side of 'model')."""
    # One tensor at a time (a 9B model is never copied to the host whole), each as the digest of
    # `_content_digest` would see it; half-precision tensors upcast to float32 (exact), so a bf16
    # checkpoint loaded in bf16 on a GPU and the same checkpoint loaded in fp32 on a CPU are one
    # model. Loaders that cast fp32 weights down fingerprint before casting (`_cast_after_fingerprint`).
    inner = hashlib.sha256()
    state = module.state_dict()
    for name in sorted(state):
        t = state[name].detach()
        if t.dtype in (torch.float16, torch.bfloat16):
            t = t.float()
        t = t.cpu().contiguous()
        inner.update(name.encode())
        inner.update(str(t.dtype).encode())
        inner.update(repr(tuple(t.shape)).encode())
        if t.numel():
            inner.update(memoryview(t.view(torch.uint8).numpy()))
    h = hashlib.sha256()
    h.update(json.dumps({"config": config}, sort_keys=True, default=str).encode())
    h.update(inner.hexdigest().encode())
    return h.hexdigest()
