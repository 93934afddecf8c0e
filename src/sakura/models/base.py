"""The interface every model adapter implements, and the types the adapters share.

A `TemplateEditModel` runs an edit with the template's KV either computed in the sequence
(`KVMode.NOCACHE` / `KVMode.EXTRACT`) or injected from a `TemplateKVSource` (`KVMode.INJECTED`).
It knows nothing about networks, codecs or stores: a streaming runtime hands it a KV source whose
`layer(i)` may block until layer i's shard has arrived.

Shared by the adapters (sakura-mini, flux2-mini, Klein), so none imports another's internals:
`KVMode` and `resolve_kv_mode`, `EditOutput`, `patchify` / `unpatchify`, the input checks
(`check_images`, `check_source_fits`), `PatchGridConfig` (the shapes both bundled configs derive
from their fields) and `BundledImageModel` (what sakura-mini and flux2-mini do the same way:
identity, the template KV object, the x-prediction head, `edit` = `differentiable_edit` under
no_grad).
"""

from __future__ import annotations

import contextlib
import types
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, ClassVar, Iterator, Protocol, runtime_checkable

import torch

from .kv import LayerKV, TemplateKV, TemplateKVError, TemplateKVSource, fingerprint_model, fingerprint_tensors


class KVMode(str, Enum):
    NOCACHE = "nocache"    # template in the sequence at every denoising step
    EXTRACT = "extract"    # template in the sequence at step 0, its K/V reused afterwards
    INJECTED = "injected"  # template never in the sequence: K/V from a TemplateKVSource


def resolve_kv_mode(mode, template, template_kv, *, what: str = "template image") -> KVMode:
    """The edit's `KVMode`, checked against what the call gives: `mode` (a KVMode or its value;
    None = INJECTED when `template_kv` is given, else EXTRACT); INJECTED takes `template_kv` and no
    template, the others the template (`what` names it in the error). Raises ValueError."""
    if mode is None:
        mode = KVMode.INJECTED if template_kv is not None else KVMode.EXTRACT
    try:
        mode = KVMode(mode)
    except ValueError:
        raise ValueError(f"mode must be one of {[m.value for m in KVMode]}, got {mode!r}") from None
    if mode is KVMode.INJECTED:
        if template_kv is None:
            raise ValueError("mode 'injected' needs template_kv")
        if template is not None:
            raise ValueError("give template or template_kv, not both")
    elif template is None:
        raise ValueError(f"mode {mode.value!r} needs the {what}")
    return mode


@dataclass
class EditOutput:
    """Result of an image-level `edit`.

    image: (B, 3, H, W) in [0, 1]. template_kv: the KV captured in EXTRACT mode (else None).
    timings_s: seconds per phase ("template" = template compute, "denoise" = the rest).
    """

    image: torch.Tensor
    template_kv: TemplateKV | None = None
    timings_s: dict[str, float] = field(default_factory=dict)


@contextlib.contextmanager
def grad_through(obj: Any, names: tuple[str, ...]) -> Iterator[None]:
    """Autograd on, and `obj`'s methods `names` run undecorated (their ``@torch.no_grad()``
    lifted: the wrapped function, bound to `obj` for the call): how an adapter whose `edit` is
    no-grad gets a `differentiable_edit` giving the same images (Klein, Kontext)."""
    obj.__dict__.update({n: types.MethodType(getattr(type(obj), n).__wrapped__, obj) for n in names})
    try:
        with torch.enable_grad():
            yield
    finally:
        for n in names:
            obj.__dict__.pop(n, None)


def patchify(img: torch.Tensor, p: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, (H/p)*(W/p), C*p*p), row-major over the token grid."""
    b, c, h, w = img.shape
    x = img.reshape(b, c, h // p, p, w // p, p)          # (B, C, gh, p, gw, p)
    x = x.permute(0, 2, 4, 1, 3, 5)                      # (B, gh, gw, C, p, p)
    return x.reshape(b, (h // p) * (w // p), c * p * p)


def unpatchify(x: torch.Tensor, p: int, c: int, size: int) -> torch.Tensor:
    """(B, T, C*p*p) -> (B, C, size, size); inverse of `patchify`."""
    b = x.shape[0]
    g = size // p
    x = x.reshape(b, g, g, c, p, p)                      # (B, gh, gw, C, p, p)
    x = x.permute(0, 3, 1, 4, 2, 5)                      # (B, C, gh, p, gw, p)
    return x.reshape(b, c, size, size)


def check_images(img: Any, name: str, *, size: int, channels: int = 3, max_n: int | None = None) -> torch.Tensor:
    """`img` as a float (B, channels, size, size) batch (a single (C, S, S) image gains B = 1);
    raises TypeError / ValueError naming `name` when it is not a finite tensor of that shape or
    holds more than `max_n` images."""
    if not isinstance(img, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (B, {channels}, {size}, {size}), "
                        f"got {type(img).__name__}")
    if img.ndim == 3:
        img = img[None]
    if img.ndim != 4 or tuple(img.shape[1:]) != (channels, size, size):
        raise ValueError(f"{name} has shape {tuple(img.shape)}; expected (B, {channels}, {size}, {size})")
    if max_n is not None and img.shape[0] > max_n:
        raise ValueError(f"{name}: at most {max_n} reference images, got {img.shape[0]}")
    if not bool(torch.isfinite(img).all()):
        raise ValueError(f"{name} contains NaN or inf")
    return img.float()


def check_source_fits(source: TemplateKVSource, fingerprint: str, num_layers: int) -> None:
    """Raise `TemplateKVError` if `source` was made by another model (`fingerprint`) or has another
    layer count than the model's `num_layers`."""
    if source.model_fingerprint != fingerprint:
        raise TemplateKVError(f"template KV was made by model {source.model_fingerprint[:16]}…, this model is "
                              f"{fingerprint[:16]}…; refusing to inject it")
    if source.num_layers != num_layers:
        raise TemplateKVError(f"template KV has {source.num_layers} layers, the model has {num_layers}")


def check_steps(steps: Any) -> int:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    return steps


def check_prompt(instruction: Any, family: str) -> str:
    """The prompt text of a prompt-conditioned template (Klein, Kontext, a plugin): ``instruction``
    itself; None or the bundled models' "no instruction" (0, e.g. from a device profile run) is "".
    Anything else is a ValueError naming the ``family`` ("a Klein template's instruction ...")."""
    if instruction is None or (isinstance(instruction, int) and not isinstance(instruction, bool) and instruction == 0):
        return ""
    if not isinstance(instruction, str):
        raise ValueError(f"a {family} template's instruction is its prompt text, got {instruction!r}")
    return instruction


@runtime_checkable
class ImageModelConfig(Protocol):
    """What the store, the runtime and the benchmarks read off an image-level model's `cfg`
    (`MiniConfig`, `Flux2MiniConfig`, `KleinConfig`)."""

    @property
    def image_size(self) -> int:
        """Pixels per side of template, photo and output."""

    @property
    def heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def depth(self) -> int:
        """Attention layers holding template KV."""

    @property
    def grid(self) -> int:
        """Tokens per image side."""

    @property
    def tokens_per_image(self) -> int: ...


class PatchGridConfig:
    """Shapes derived from the fields of a bundled model's frozen config dataclass (image_size,
    patch_size, channels, dim, heads): a token is one packed patch_size^2 x channels pixel patch."""

    image_size: int
    patch_size: int
    channels: int
    dim: int
    heads: int
    prediction: str
    #: RoPE axes a head splits into (each a pair of dims per axis and frequency): head_dim must be
    #: a multiple of 2 x this
    rope_axes: ClassVar[int] = 2

    def _check_shapes(self) -> None:
        if self.prediction not in ("x", "v"):
            raise ValueError(f"prediction must be 'x' or 'v', got {self.prediction!r}")
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
        m = 2 * self.rope_axes
        if self.dim % self.heads or (self.dim // self.heads) % m:
            raise ValueError(f"dim {self.dim} / heads {self.heads} must give a head_dim divisible by {m} "
                             f"({self.rope_axes}-axis RoPE)")

    # Alike in shape only to sakura.models.flux.klein_config.KleinConfig's properties: see there why
    # they are kept separate.
    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def tokens_per_image(self) -> int:
        return self.grid * self.grid

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def patch_dim(self) -> int:
        return self.channels * self.patch_size * self.patch_size


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
        """Run the edit; returns an output object with `.timings_s` and `.image` (an image-level
        model) or `.latents` (the packed-latent `KleinAdapter`)."""

    def describe(self) -> dict[str, object]:
        """Config, parameter count, template-KV size and fingerprint, for `sakura info`."""


@runtime_checkable
class ImageTemplateEditModel(TemplateEditModel, Protocol):
    """A `TemplateEditModel` that works on images and instruction ids, as the store, the streaming
    runtime, capture and the benchmarks drive it. Implemented by `MiniDiT` (sakura-mini),
    `Flux2MiniDiT` (flux2-mini) and `KleinImageModel`; check with
    `isinstance(model, ImageTemplateEditModel)` rather than against one class.

    Images are (B, 3, S, S) float in [0, 1] with S = `cfg.image_size`; a template is an image plus
    its fixed instruction (a task id; Klein: prompt text); template K/V per layer are
    (B, tokens, heads, head_dim).
    """

    cfg: ImageModelConfig
    #: what defines a template's edit besides its image(s): "task" (an instruction id) or "prompt"
    template_conditioning: str
    #: reference images a template may have
    max_template_images: int

    def template_fingerprint(self, template: torch.Tensor, instruction: Any = 0) -> str: ...

    def extract_template_kv(self, template: torch.Tensor, instruction: Any = 0) -> TemplateKV: ...

    def edit(self, photo: torch.Tensor, *, template: torch.Tensor | None = None, instruction: Any = None,
             template_kv: TemplateKVSource | None = None, mode: KVMode | str | None = None, steps: int = ...,
             seed: int = 0, probe: Any = None) -> EditOutput: ...

    def template_layers(self, template: torch.Tensor, instruction: Any = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Lazily compute the template's layers: yields layer i's (key, value) after computing
        blocks 0..i only, so a runtime can compute a prefix on the device and fetch the rest."""

    def template_stream(self, template: torch.Tensor, instruction: Any = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """All layers' (key, value), in consumption order."""


@runtime_checkable
class DifferentiableEditModel(ImageTemplateEditModel, Protocol):
    """An image-level model whose edit can run with autograd (capture's token sensitivity
    back-propagates image-space probes into the template KV). The bundled models implement it;
    `edit` is this call under `torch.no_grad()`."""

    def differentiable_edit(self, photo: torch.Tensor, *, template: torch.Tensor | None = None,
                            instruction: Any = None, template_kv: TemplateKVSource | None = None,
                            mode: KVMode | str | None = None, steps: int = ..., seed: int = 0,
                            probe: Any = None) -> EditOutput: ...

    def velocity(self, photo: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor, kv_for_layer: Any,
                 probe: Any = None) -> torch.Tensor:
        """One denoiser evaluation with the template K/V from kv_for_layer(i) -> (key, value, keep),
        called when the forward pass reaches layer i (the runtime's per-layer compute profile)."""


class BundledImageModel:
    """What sakura-mini (`MiniDiT`) and flux2-mini (`Flux2MiniDiT`) do the same way; mixed into
    their `nn.Module`. A subclass sets `kind`, has `cfg` (a `PatchGridConfig` dataclass with
    `depth`, `instructions`, `prediction`, `photo_skip`, `t_min`) and implements `template_layers`
    and `differentiable_edit`."""

    #: the model's name in fingerprints, layouts and `describe()`
    kind: ClassVar[str]
    #: what defines a template's edit besides its image: a task (its instruction id); Klein: a prompt
    template_conditioning: ClassVar[str] = "task"
    #: reference images a template may have
    max_template_images: ClassVar[int] = 1
    _fingerprint: str | None = None

    # -- identity -------------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return self.cfg.depth

    @property
    def device(self) -> torch.device:
        """Where the weights are (`.to(device)` moves them): every tensor an edit makes is made there."""
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype (the weights'); KV and images arrive in any dtype and are cast to it."""
        return next(self.parameters()).dtype

    def _fingerprint_meta(self) -> dict[str, Any]:
        """The config as hashed into `fingerprint()` (a model may keep older fingerprints stable)."""
        return asdict(self.cfg)

    def fingerprint(self) -> str:
        """sha256 of config + weights. Cached: call `invalidate_fingerprint()` after changing weights."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint_model(self, self._fingerprint_meta())
        return self._fingerprint

    def invalidate_fingerprint(self) -> None:
        self._fingerprint = None

    def template_fingerprint(self, template: torch.Tensor, instruction: int = 0) -> str:
        """sha256 of the template pixels (as the model sees them: fp32, its resolution) and instruction."""
        return fingerprint_tensors({"template": self._check_image(template, "template")[:1].contiguous()},
                                   {"kind": self.kind, "image_size": self.cfg.image_size,
                                    "instruction": int(instruction)})

    def _check_instruction(self, instruction: Any) -> int:
        n = self.cfg.instructions
        if isinstance(instruction, bool) or not isinstance(instruction, int) or not 0 <= instruction < n:
            raise ValueError(f"instruction must be an int in [0, {n}), got {instruction!r}")
        return instruction

    def _check_image(self, img: Any, name: str) -> torch.Tensor:
        return check_images(img, name, size=self.cfg.image_size, channels=self.cfg.channels)

    # -- the template KV object -----------------------------------------------------------------
    def template_stream(self, template: torch.Tensor, instruction: torch.Tensor | int = 0
                        ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's (key, value), each (B, Tt, H, D), in consumption order."""
        return list(self.template_layers(template, instruction))

    @torch.no_grad()
    def extract_template_kv(self, template: torch.Tensor, instruction: int = 0) -> TemplateKV:
        """Compute a template's KV (cloud side, or on device as the `on-device` method does).

        template: (1, 3, S, S) in [0, 1]; instruction: the template's fixed instruction id.
        """
        template = self._check_image(template, "template")[:1]
        instruction = self._check_instruction(instruction)
        return self._wrap_kv(template, instruction, self.template_stream(template, instruction))

    def _kv_positions(self) -> torch.Tensor | None:
        """RoPE ids (Tt, axes) the template keys are rotated with, when they carry positions."""
        return None

    def _wrap_kv(self, template: torch.Tensor, instruction: int, kvs) -> TemplateKV:
        layers = [LayerKV(k[0].contiguous().cpu(), v[0].contiguous().cpu()) for k, v in kvs]  # host: the wire's side
        positions = self._kv_positions()
        layout: dict[str, Any] = {"kind": self.kind, "grid": [self.cfg.grid, self.cfg.grid], "instruction": instruction}
        if positions is not None:
            layout["slot_ids"] = "positions"
        return TemplateKV(layers=layers, model_fingerprint=self.fingerprint(),
                          template_fingerprint=self.template_fingerprint(template, instruction),
                          layout=layout, positions=None if positions is None else positions.cpu().clone())

    def check_template_kv(self, source: TemplateKVSource) -> None:
        """Reject a KV source that belongs to another model, has the wrong layer count or (when it
        carries positions) was rotated with other RoPE positions than this model's template."""
        check_source_fits(source, self.fingerprint(), self.num_layers)
        mine = self._kv_positions()
        if mine is not None and source.positions is not None and not torch.equal(source.positions.cpu(), mine.cpu()):
            raise TemplateKVError("template KV was rotated with other RoPE positions than this model's template slot")

    # -- sampling -------------------------------------------------------------------------------
    def _to_velocity(self, out: torch.Tensor, photo: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The output head's tokens (B, T, patch_dim) as a velocity (B, 3, S, S): with x-prediction
        `out` is x_0 (or x_0 - photo) and v = (x_t - x_0) / t, t floored at t_min."""
        cfg = self.cfg
        out = unpatchify(out, cfg.patch_size, cfg.channels, cfg.image_size)
        if cfg.prediction == "x":
            if cfg.photo_skip:
                out = out + photo
            return (x_t - out) / t.clamp(min=cfg.t_min).view(-1, 1, 1, 1)
        return out

    def edit(self, photo: torch.Tensor, **kwargs: Any) -> EditOutput:
        """`differentiable_edit` (same arguments) without autograd: what inference runs."""
        with torch.no_grad():
            return self.differentiable_edit(photo, **kwargs)

    def describe(self) -> dict[str, object]:
        cfg = self.cfg
        per_layer = 2 * cfg.tokens_per_image * cfg.dim
        return {
            "model": self.kind,
            **asdict(cfg),
            "parameters": sum(p.numel() for p in self.parameters()),
            "template_tokens": cfg.tokens_per_image,
            "template_kv_values": per_layer * cfg.depth,
            "template_kv_bytes_fp16": per_layer * cfg.depth * 2,
            "fingerprint": self.fingerprint()[:16],
        }
