"""Save and load sakura-mini weights as safetensors with the config in the metadata."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from sakura.fsutil import atomic_write

from .mini import MiniConfig, MiniDiT


def save_mini_weights(model: MiniDiT, path: str | os.PathLike, extra_meta: dict[str, str] | None = None) -> Path:
    """Atomic write (temp + rename) of the weights and config."""
    from safetensors.torch import save

    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    blob = save(state, metadata={"format": "sakura-mini", "config": json.dumps(asdict(model.cfg)), **(extra_meta or {})})
    return atomic_write(path, blob)


def load_mini_weights(path: str | os.PathLike) -> MiniDiT:
    """Build the model from the config in the file and load its weights strictly (names and shapes)."""
    from safetensors import safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            state = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:
        raise ValueError(f"{path}: corrupt or truncated sakura-mini weights ({e})") from e
    if meta.get("format") != "sakura-mini":
        raise ValueError(f"{path}: not a sakura-mini weights file")
    cfg = MiniConfig(**json.loads(meta["config"]))
    model = MiniDiT(cfg)
    model.load_state_dict(state, strict=True)
    return model.eval()
