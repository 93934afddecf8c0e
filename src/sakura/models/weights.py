"""The bundled models' weight files: safetensors with `format` and the config (JSON) in the
metadata, written atomically, read back strictly. One reader and one writer for sakura-mini and
flux2-mini (their files differ only in the format name and the config class)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, TypeVar

import torch.nn as nn
from safetensors import safe_open
from safetensors.torch import save

from sakura.util.fsutil import atomic_write

M = TypeVar("M", bound=nn.Module)


def save_weights(model: nn.Module, path: str | os.PathLike, fmt: str, extra_meta: dict[str, str] | None = None) -> Path:
    """Atomic write (temp + rename) of `model.state_dict()` with `{"format": fmt, "config":
    asdict(model.cfg)}` and `extra_meta` in the metadata."""
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    blob = save(state, metadata={"format": fmt, "config": json.dumps(asdict(model.cfg)), **(extra_meta or {})})
    return atomic_write(path, blob)


def load_weights(path: str | os.PathLike, fmt: str, build: Callable[[dict[str, Any]], M]) -> M:
    """`build(config dict)` from the file's metadata, its weights loaded strictly (names and
    shapes; values in fp32), in eval mode. Raises ValueError for a corrupt, truncated or
    other-format file."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            state = {k: f.get_tensor(k).float() for k in f.keys()}
    except Exception as e:
        raise ValueError(f"{path}: corrupt or truncated {fmt} weights ({e})") from e
    if meta.get("format") != fmt:
        raise ValueError(f"{path}: not a {fmt} weights file")
    model = build(json.loads(meta["config"]))
    model.load_state_dict(state, strict=True)
    return model.eval()
