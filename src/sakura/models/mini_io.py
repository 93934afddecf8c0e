"""Save and load sakura-mini weights as safetensors with the config in the metadata."""

from __future__ import annotations

import os
from pathlib import Path

from .mini import MiniConfig, MiniDiT
from .weights import load_weights, save_weights


def save_mini_weights(model: MiniDiT, path: str | os.PathLike, extra_meta: dict[str, str] | None = None) -> Path:
    """Atomic write (temp + rename) of the weights and config."""
    return save_weights(model, path, "sakura-mini", extra_meta)


def load_mini_weights(path: str | os.PathLike) -> MiniDiT:
    """Build the model from the config in the file and load its weights strictly (names and shapes)."""
    return load_weights(path, "sakura-mini", lambda cfg: MiniDiT(MiniConfig(**cfg)))
