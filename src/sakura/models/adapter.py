"""The public contract of a model adapter: everything a plugin needs, under stable names.

A plugin (docs/your-own-model.md) imports from here and from nowhere else in sakura; these names
are listed in docs/api.md as stable: they keep their meaning within a major version, and one that
has to change or go is first kept working for one minor release with a DeprecationWarning that
names its replacement (docs/api.md, "Stability"). Flux-family plugins may also use the block loop
of `sakura.models.flux` (the [flux] extra), under the same promise.

| name | what |
|---|---|
| `ImageTemplateEditModel` | the Protocol an adapter implements (sakura.models.base) |
| `EditOutput`, `KVMode` | what `edit` returns; extract / nocache / injected |
| `LayerKV`, `TemplateKV`, `TemplateKVSource`, `TemplateKVError`, `KVSourceDefaults` | template K/V per layer, a whole template's, a (streaming) source of layers |
| `check_images`, `check_steps`, `check_prompt`, `check_source_fits`, `resolve_kv_mode` | argument checks with one-line errors |
| `patchify`, `unpatchify` | pixels <-> patch tokens |
| `fingerprint_model`, `fingerprint_tensors` | the identities stamped on every KV |
| `LazyTemplateLayers` | layer i pulled from a source when the forward pass reaches it, kept for later steps |
| `ReadOnceSource` | a source whose layers are each read once (a streamed `layer(i)` is one request) |
| `resolve_device` | ``device=`` / ``dtype=`` as the registry passes them -> (torch.device, torch.dtype) |
| `DeviceError` | a device or dtype that does not exist here (one line) |
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from sakura.util.device import DeviceError, resolve as _resolve

from .base import (EditOutput, ImageTemplateEditModel, KVMode, check_images, check_prompt, check_source_fits,
                   check_steps, patchify, resolve_kv_mode, unpatchify)
from .kv import (KVSourceDefaults, LayerKV, TemplateKV, TemplateKVError, TemplateKVSource, fingerprint_model,
                 fingerprint_tensors)

__all__ = ["DeviceError", "EditOutput", "ImageTemplateEditModel", "KVMode", "KVSourceDefaults", "LayerKV",
           "LazyTemplateLayers", "ReadOnceSource", "TemplateKV", "TemplateKVError", "TemplateKVSource",
           "check_images", "check_prompt", "check_source_fits", "check_steps", "fingerprint_model", "fingerprint_tensors",
           "patchify", "resolve_device", "resolve_kv_mode", "unpatchify"]


def resolve_device(device: Any = "auto", dtype: Any = "auto") -> tuple[torch.device, torch.dtype]:
    """The ``device=`` and ``dtype=`` a factory receives (from ``--device`` / ``--dtype`` or the
    Python API) as torch objects: "auto" = cuda, then mps, then cpu; dtype "auto" = bf16 on cuda,
    fp16 on mps, fp32 on cpu; names "cpu", "cuda:1", "fp16", "bfloat16", ... Raises `DeviceError`
    (a ValueError, one line naming the argument) for one that does not exist here."""
    return _resolve(device, dtype)


class LazyTemplateLayers:
    """A template's per-layer K/V pulled from a `TemplateKVSource` only when the forward pass
    reaches that layer (the first `kv(i)` call), then kept for later denoising steps.

    fetch(i) -> (key, value, keep): key/value (Tt, H, D) or (1, Tt, H, D), keep (Tt,) bool or None.
    batch: the sequence batch size the K/V are expanded to. device / dtype: where and in what
    precision the model computes; a layer arrives in the wire's dtype (fp16) and is cast on arrival.
    """

    def __init__(self, fetch, num_layers: int, batch: int = 1, *, device=None, dtype=torch.float32):
        self._fetch = fetch
        self._batch = batch
        self._device, self._dtype = device, dtype
        self._resident: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None] = [None] * num_layers

    @classmethod
    def from_source(cls, source: TemplateKVSource, *, tokens: int | None, heads: int, head_dim: int,
                    batch: int = 1, tokens_from: str = "the model", device=None,
                    dtype=torch.float32) -> "LazyTemplateLayers":
        def fetch(i: int):
            layer = source.layer(i)  # may block until a streamed shard has arrived
            layer.check(f"template KV layer {i} (token count from {tokens_from})", tokens=tokens, heads=heads,
                        head_dim=head_dim)
            return layer.key, layer.value, layer.keep
        return cls(fetch, source.num_layers, batch, device=device, dtype=dtype)

    @classmethod
    def from_pairs(cls, pairs, batch: int = 1, *, device=None, dtype=torch.float32) -> "LazyTemplateLayers":
        """Already-resident (key, value) pairs (1, Tt, H, D), e.g. captured at an extract step."""
        return cls(lambda i: (pairs[i][0], pairs[i][1], None), len(pairs), batch, device=device, dtype=dtype)

    def _load(self, i: int):
        if self._resident[i] is None:
            k, v, keep = self._fetch(i)
            k = (k if k.ndim == 4 else k[None]).to(self._device, self._dtype)
            v = (v if v.ndim == 4 else v[None]).to(self._device, self._dtype)
            keep = None if keep is None else keep.to(k.device)
            self._resident[i] = (k.expand(self._batch, -1, -1, -1), v.expand(self._batch, -1, -1, -1), keep)
        return self._resident[i]

    def kv(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        k, v, _ = self._load(i)
        return k, v

    def keep(self, i: int) -> torch.Tensor | None:
        return self._load(i)[2]


class ReadOnceSource(KVSourceDefaults):
    """A `TemplateKVSource` whose layers are each read from ``source`` once: a streamed source's
    ``layer(i)`` is a one-shot request to the runtime, and an edit of several photos (or several
    denoising steps) reads every layer more than once.

    ``positions_from_first_layer``: for a source without RoPE ``positions`` (the runtime's live
    source), how to make them from layer 0 (read at once: the forward pass needs it first anyway);
    None leaves ``positions`` as the source has them."""

    def __init__(self, source: TemplateKVSource,
                 positions_from_first_layer: Callable[[LayerKV], torch.Tensor] | None = None):
        self._source = source
        self._layers: dict[int, LayerKV] = {}
        self.model_fingerprint = source.model_fingerprint
        self.template_fingerprint = source.template_fingerprint
        self.layout = source.layout
        self.instruction = source.instruction
        positions = source.positions
        if positions is None and positions_from_first_layer is not None:
            positions = positions_from_first_layer(self.layer(0))
        self.positions = positions

    @property
    def num_layers(self) -> int:
        return self._source.num_layers

    def layer(self, index: int) -> LayerKV:
        if index not in self._layers:
            self._layers[index] = self._source.layer(index)
        return self._layers[index]
