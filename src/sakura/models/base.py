"""The one interface every model adapter implements.

A `TemplateEditModel` runs an edit with the template's KV either computed in the sequence
(`KVMode.NOCACHE` / `KVMode.EXTRACT`) or injected from a `TemplateKVSource` (`KVMode.INJECTED`).
It knows nothing about networks, codecs or stores: a streaming runtime hands it a KV source whose
`layer(i)` may block until layer i's shard has arrived.
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol, runtime_checkable

import torch

from .kv import TemplateKV, TemplateKVSource


@runtime_checkable
class TemplateEditModel(Protocol):
    @property
    def num_layers(self) -> int:
        """Attention layers that hold template KV, in consumption order."""

    def fingerprint(self) -> str:
        """Hex sha256 of config + weights; stamped on every template KV the model makes."""

    def template_fingerprint(self, template: Any) -> str:
        """Hex sha256 of a template's content as this model consumes it."""

    def extract_template_kv(self, template: Any) -> TemplateKV:
        """Compute a template's KV (cloud side, or on device)."""

    def check_template_kv(self, source: TemplateKVSource) -> None:
        """Raise `TemplateKVError` if `source` belongs to another model or does not fit."""

    def edit(self, photo: torch.Tensor, *, template: Any = None, template_kv: TemplateKVSource | None = None,
             mode: Any = None, steps: int = ..., seed: int = 0, **conditioning: Any) -> Any:
        """Run the edit; returns an output object with `.image` and `.timings_s`."""

    def describe(self) -> dict[str, object]:
        """Config, parameter count, template-KV size and fingerprint, for `sakura info`."""


@runtime_checkable
class ImageTemplateEditModel(TemplateEditModel, Protocol):
    """A `TemplateEditModel` that works on images and instruction ids, as the store, the streaming
    runtime, capture and the benchmarks drive it. Implemented by `MiniDiT` (sakura-mini) and
    `Flux2MiniDiT` (flux2-mini); check with `isinstance(model, ImageTemplateEditModel)` rather than
    against one class.

    Images are (B, 3, S, S) float in [0, 1] with S = `cfg.image_size`; a template is an image plus
    its fixed instruction id; template K/V per layer are (B, tokens, heads, head_dim).
    """

    cfg: Any  # has .image_size (pixels per side), .heads, .head_dim, .tokens_per_image

    def template_fingerprint(self, template: torch.Tensor, instruction: int = 0) -> str: ...

    def extract_template_kv(self, template: torch.Tensor, instruction: int = 0) -> TemplateKV: ...

    def template_layers(self, template: torch.Tensor, instruction: Any = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Lazily compute the template's layers: yields layer i's (key, value) after computing
        blocks 0..i only, so a runtime can compute a prefix on the device and fetch the rest."""

    def template_stream(self, template: torch.Tensor, instruction: Any = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """All layers' (key, value), in consumption order."""

    def velocity(self, photo: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor, kv_for_layer: Any,
                 probe: Any = None) -> torch.Tensor:
        """One denoiser evaluation with the template K/V from kv_for_layer(i) -> (key, value, keep),
        called when the forward pass reaches layer i (the runtime's per-layer compute profile)."""
