"""Loading the bundled models: their shipped weights (or a seeded random init), moved to a device
and dtype. `load_mini` / `load_mini_spec` live here, flux2-mini's in `flux2mini` (diffusers); the
package `sakura.models` names them all on first use, so importing it loads no torch."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from sakura.models import MINI_WEIGHTS
from sakura.util.device import resolve

from .mini import MiniConfig, MiniDiT
from .mini_io import load_mini_weights
from .spec_checks import check_mini_arg

log = logging.getLogger("sakura.models")


def load_bundled(name: str, default: Path, weights: str | Path | None, allow_random: bool, read, build,
                 device="auto", dtype="auto"):
    """`read(path)` of `weights` (default: the shipped file); with no file there and
    `allow_random`, `build()` under seed 0 with a warning (the untrained model still exercises
    every KV path exactly; its edits are noise). Then moved to `device` in `dtype`
    (`sakura.util.device.resolve`: auto = cuda, mps, cpu; bf16 / fp16 / fp32), fingerprinted
    first: the shipped fp32 weights name the model on every device and in every precision."""
    dev, dt = resolve(device, dtype)  # a bad --device fails before the weights are read
    path = Path(weights) if weights is not None else default
    if path.is_file():
        model = read(path)
    elif weights is not None or not allow_random:
        raise FileNotFoundError(f"{name} weights not found at {path}")
    else:
        log.warning("no bundled %s weights at %s; using a seeded random init", name, path)
        torch.manual_seed(0)
        model = build().eval()
    if (dev.type, dt) != ("cpu", next(model.parameters()).dtype):
        model.fingerprint()  # cached: computed on the weights as shipped, before the cast
        model.to(dev, dt)
    return model


def load_mini(weights: str | Path | None = None, *, allow_random: bool = True, device="auto",
              dtype="auto") -> MiniDiT:
    """The bundled sakura-mini with its shipped weights (or `weights`), in eval mode, on `device`
    in `dtype` (auto: cuda/mps/cpu, bf16/fp16/fp32); a seeded random init (and a warning) when no
    file is there and `allow_random`."""
    return load_bundled("sakura-mini", MINI_WEIGHTS, weights, allow_random, load_mini_weights,
                        lambda: MiniDiT(MiniConfig()), device, dtype)


def load_mini_spec(arg: str = "", **options) -> MiniDiT:
    """Model-registry factory of ``sakura-mini[:/path/weights.safetensors]``."""
    check_mini_arg(arg)
    return load_mini(arg or None, **options)
