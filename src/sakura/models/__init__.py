"""Model adapters: DiTs whose template KV can be captured (extract) or injected (cached).

`load_model(spec)` resolves a spec through the registry (`sakura.models.registry`: entry points of
the ``sakura.models`` group, plus `register_model`). Bundled: "sakura-mini" (the bundled model; its
shipped weights when present), "flux2-mini" (the bundled FLUX.2-architecture model: diffusers'
`Flux2Transformer2DModel` trained here, same image-level API as sakura-mini),
"klein:/path/to/local/folder[@S]" (FLUX.2 Klein through diffusers at S px per side, weights from
disk; the same image-level API) and "kontext:/path/to/local/folder[@S]" (FLUX.1 Kontext, likewise;
docs/your-own-model.md walks through it).
"""

from __future__ import annotations

import logging
from pathlib import Path

from .base import EditOutput, ImageTemplateEditModel, KVMode, TemplateEditModel
from .kv import KVSourceDefaults, LayerKV, TemplateKV, TemplateKVError, TemplateKVSource
from .mini import MiniConfig, MiniDiT
from .registry import ModelSpecError, available_models, load_model, register_model, unregister_model

log = logging.getLogger(__name__)

ASSETS = Path(__file__).resolve().parent.parent / "assets"
MINI_WEIGHTS = ASSETS / "sakura-mini.safetensors"
FLUX2_MINI_WEIGHTS = ASSETS / "flux2-mini.safetensors"
MODEL_NAMES = ("sakura-mini", "flux2-mini")

__all__ = ["EditOutput", "ImageTemplateEditModel", "KVMode", "KVSourceDefaults", "LayerKV", "MiniConfig", "MiniDiT", "TemplateEditModel", "TemplateKV",
           "TemplateKVError", "TemplateKVSource", "ModelSpecError", "available_models", "load_flux2_mini", "load_mini",
           "load_model", "register_model", "unregister_model"]


def _load_bundled(name: str, default: Path, weights: str | Path | None, allow_random: bool, read, build,
                  device="auto", dtype="auto"):
    """`read(path)` of `weights` (default: the shipped file); with no file there and
    `allow_random`, `build()` under seed 0 with a warning (the untrained model still exercises
    every KV path exactly; its edits are noise). Then moved to `device` in `dtype`
    (`sakura.util.device.resolve`: auto = cuda, mps, cpu; bf16 / fp16 / fp32), fingerprinted
    first: the shipped fp32 weights name the model on every device and in every precision."""
    from sakura.util.device import resolve

    dev, dt = resolve(device, dtype)  # a bad --device fails before the weights are read
    path = Path(weights) if weights is not None else default
    if path.is_file():
        model = read(path)
    elif weights is not None or not allow_random:
        raise FileNotFoundError(f"{name} weights not found at {path}")
    else:
        log.warning("no bundled %s weights at %s; using a seeded random init", name, path)
        import torch

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
    from .mini_io import load_mini_weights

    return _load_bundled("sakura-mini", MINI_WEIGHTS, weights, allow_random, load_mini_weights,
                         lambda: MiniDiT(MiniConfig()), device, dtype)


def load_flux2_mini(weights: str | Path | None = None, *, allow_random: bool = True, device="auto", dtype="auto"):
    """The bundled flux2-mini (a `Flux2MiniDiT`) with its shipped weights (or `weights`), in eval
    mode, on `device` in `dtype`; a seeded random init (and a warning) when no file is there and
    `allow_random`."""
    from .flux2mini import Flux2MiniConfig, Flux2MiniDiT, load_flux2_mini_weights

    return _load_bundled("flux2-mini", FLUX2_MINI_WEIGHTS, weights, allow_random, load_flux2_mini_weights,
                         lambda: Flux2MiniDiT(Flux2MiniConfig()), device, dtype)


def load_mini_spec(arg: str = "", **options) -> MiniDiT:
    """Model-registry factory of ``sakura-mini[:/path/weights.safetensors]``."""
    return load_mini(arg or None, **options)


def load_flux2_mini_spec(arg: str = "", **options):
    """Model-registry factory of ``flux2-mini[:/path/weights.safetensors]``."""
    return load_flux2_mini(arg or None, **options)


def load_klein_spec(arg: str = "", **options):
    """Model-registry factory of ``klein:/path/to/local/folder[@SIZE]`` (FLUX.2 Klein at SIZE px per
    side, default 512: a `KleinImageModel`, whose ``.adapter`` is the packed-latent `KleinAdapter`)."""
    if not arg:
        raise ModelSpecError("klein needs a local folder: klein:/path/to/FLUX.2-klein[@SIZE]")
    from .klein_image import KleinImageModel

    return KleinImageModel.from_pretrained(arg, **options)


def load_kontext_spec(arg: str = "", **options):
    """Model-registry factory of ``kontext:/path/to/local/folder[@SIZE]`` (FLUX.1 Kontext at SIZE px
    per side, default 512: a `KontextImageModel`; options: guidance, ref_timestep, max_sequence_length)."""
    if not arg:
        raise ModelSpecError("kontext needs a local folder: kontext:/path/to/FLUX.1-Kontext[@SIZE]")
    from .kontext import KontextImageModel

    return KontextImageModel.from_pretrained(arg, **options)
