"""The one interface every model adapter implements.

A `TemplateEditModel` runs an edit with the template's KV either computed in the sequence
(`KVMode.NOCACHE` / `KVMode.EXTRACT`) or injected from a `TemplateKVSource` (`KVMode.INJECTED`).
It knows nothing about networks, codecs or stores: a streaming runtime hands it a KV source whose
`layer(i)` may block until layer i's shard has arrived.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

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
