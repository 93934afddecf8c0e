"""flux2-mini: a small trained FLUX.2-architecture editor built on diffusers' own `Flux2Transformer2DModel`.

The transformer is diffusers' class unchanged (double-stream then single-stream blocks, its 4-axis
RoPE, its fixed-timestep reference modulation and its "extract"/"cached" KV forward); the
attention processors are the Klein adapter's (`klein.SakuraKleinAttnProcessor` / `...Single...`),
which compute exactly what diffusers' KV processors compute for one reference, plus keep masks,
lazy injection and an attention probe. This module only adds the image-level wrapper that
sakura-mini has, so the store, the runtime and the benchmarks drive both models the same way.

Sequence, as diffusers' KV pipeline lays it out:

    [ text (instruction prompt) | template (reference, slot 0) | photo | noisy target ]

  * "latents" are packed pixel patches: 8x8x3 = 192 values per token, no VAE (see
    docs/model-card-flux2.md: no pretrained VAE exists here, and a 64 px image packed this way is
    already 64 tokens per image, which is what a 2-core CPU can train in an hour);
  * text = `text_tokens` learned prompt embeddings per instruction id (the task), fed through the
    transformer's own `context_embedder` like a text encoder's output;
  * template = the only *reference*: modulated at the fixed timestep `template_timestep` and, in
    diffusers' extract mode, attending only to reference tokens — so its per-layer K/V (after
    QK-norm and RoPE) are a pure function of (weights, template image): the template KV;
  * photo and target are ordinary image tokens at the current timestep (the photo at RoPE T
    coordinate 20 — the slot a second reference would take — the target at T = 0). Keeping the
    photo out of the reference segment keeps the template the only cached reference, so
    diffusers' own extract/cached loop applies unchanged (and is tested to give the same image).

Sampling and the output head follow sakura-mini: rectified flow x_t = (1 - t) x_0 + t eps, the
transformer's output is the edit as a residual over the photo (x_0 = photo + out), turned into
v = (x_t - x_0) / max(t, t_min); Euler from t = 1 to 0.

Modes (all bit-identical for the same template, photo, steps and seed; tested):
  NOCACHE   template in the sequence at every step (diffusers "extract" forward)
  EXTRACT   template in the sequence at step 0, its K/V reused ("cached" forward) afterwards
  INJECTED  template never in the sequence: layer i's K/V are pulled from a `TemplateKVSource`
            when the forward pass reaches layer i
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.nn as nn
from diffusers.models.transformers.transformer_flux2 import Flux2Transformer2DModel

from sakura.models import FLUX2_MINI_WEIGHTS

from .base import BundledImageModel, EditOutput, KVMode, PatchGridConfig, check_steps, patchify, resolve_kv_mode
from .adapter import LazyTemplateLayers
from .flux.klein import (
    REF_SLOT_SCALE,
    AttentionProbe,
    ForwardSlot,
    _LazyKVCache,
    install_processors,
    latent_ids,
    text_ids,
)
from .kv import TemplateKVSource
from .loading import load_bundled
from .spec_checks import check_flux2_mini_arg
from .weights import load_weights, save_weights

PHOTO_T = REF_SLOT_SCALE + REF_SLOT_SCALE * 1   # RoPE T coordinate of the photo tokens (20)
TEMPLATE_T = REF_SLOT_SCALE                     # the template is reference slot 0 (T = 10)


@dataclass(frozen=True)
class Flux2MiniConfig(PatchGridConfig):
    image_size: int = 64          # pixels per side of template, photo and output
    patch_size: int = 8           # pixels per token side; a token is a packed 8x8x3 patch (192 values)
    channels: int = 3
    dim: int = 128                # heads * head_dim (diffusers' inner_dim)
    heads: int = 4
    double_layers: int = 2        # diffusers' num_layers (double-stream blocks)
    single_layers: int = 4        # diffusers' num_single_layers
    mlp_ratio: float = 3.0        # diffusers' default (SwiGLU)
    text_tokens: int = 4          # learned prompt tokens per instruction id
    text_dim: int = 64            # diffusers' joint_attention_dim (width of the "text encoder" output)
    instructions: int = 4         # instruction ids (0 = none; tasks use 1..3)
    template_timestep: float = 0.0
    rope_theta: int = 100
    prediction: str = "x"         # as sakura-mini: the head predicts the edit, not v
    t_min: float = 0.05
    photo_skip: bool = True
    # Stock multi-reference attention (FLUX.2 Klein's own layout): the photo is reference slot 1,
    # modulated at the fixed reference timestep like the template, and reference tokens attend to
    # every reference. The default (False) keeps the photo an ordinary image token, so the
    # template is the only reference and its KV is cacheable by construction.
    photo_reference: bool = False
    # With photo_reference: template queries attend to template keys only (sakura's isolation,
    # which makes the template KV cacheable). False = stock: the template's K/V then depend on the
    # photo. Only the attention mask changes, so a model trained stock can be run isolated
    # (`Flux2MiniDiT.isolate_template`) to measure what isolation costs.
    isolate_template: bool = True

    rope_axes = 4  # diffusers' 4-axis RoPE (T, H, W, L): head_dim divisible by 8

    def __post_init__(self) -> None:
        self._check_shapes()

    @property
    def depth(self) -> int:
        return self.double_layers + self.single_layers

    def transformer_config(self) -> dict:
        return dict(patch_size=1, in_channels=self.patch_dim, out_channels=self.patch_dim,
                    num_layers=self.double_layers, num_single_layers=self.single_layers,
                    attention_head_dim=self.head_dim, num_attention_heads=self.heads,
                    joint_attention_dim=self.text_dim, timestep_guidance_channels=64, mlp_ratio=self.mlp_ratio,
                    axes_dims_rope=(self.head_dim // 4,) * 4, rope_theta=self.rope_theta, guidance_embeds=False)


class Flux2MiniDiT(BundledImageModel, nn.Module):
    """diffusers' `Flux2Transformer2DModel` + learned instruction prompts, with sakura-mini's API
    (`BundledImageModel`)."""

    kind = "flux2-mini"

    def __init__(self, cfg: Flux2MiniConfig = Flux2MiniConfig()):
        super().__init__()
        self.cfg = cfg
        self.transformer = Flux2Transformer2DModel(**cfg.transformer_config())
        install_processors(self.transformer)
        # The "text encoder": per instruction id, `text_tokens` learned embeddings of width text_dim.
        self.prompts = nn.Parameter(torch.randn(cfg.instructions, cfg.text_tokens, cfg.text_dim))
        # Start at the identity edit (x_0 = photo): zero output projection, as sakura-mini does.
        nn.init.zeros_(self.transformer.proj_out.weight)
        g = cfg.grid
        self.register_buffer("ids_template", latent_ids(g, g, t=TEMPLATE_T), persistent=False)
        self.register_buffer("ids_main", torch.cat([latent_ids(g, g, t=PHOTO_T), latent_ids(g, g, t=0)]),
                             persistent=False)
        self.register_buffer("ids_text", text_ids(cfg.text_tokens), persistent=False)
        self._fingerprint: str | None = None
        # The mask the in-sequence forward uses (cfg.isolate_template: what it was trained with);
        # settable to evaluate a stock-trained model with isolation. Cached/injected edits are
        # always isolated: a cached template KV cannot depend on the photo.
        self.isolate_template = cfg.isolate_template

    # -- identity -------------------------------------------------------------------------------
    def _fingerprint_meta(self) -> dict:
        meta = asdict(self.cfg)
        if not self.cfg.photo_reference:  # fields added later: keep the fingerprints made before
            meta.pop("photo_reference")
            meta.pop("isolate_template")
        return {"model": "flux2-mini", **meta}

    def _kv_positions(self) -> torch.Tensor:
        return self.ids_template

    # -- forward passes -------------------------------------------------------------------------
    def _prompt(self, instruction: torch.Tensor | int, batch: int) -> torch.Tensor:
        instr = torch.as_tensor(instruction, dtype=torch.long).to(self.prompts.device).expand(batch)
        return self.prompts[instr]                                               # (B, text_tokens, text_dim)

    def _run(self, hidden: torch.Tensor, ids: torch.Tensor, prompt: torch.Tensor, t: torch.Tensor, *,
             mode: str, num_ref: int = 0, cache=None, slot: ForwardSlot | None = None) -> torch.Tensor:
        """diffusers' forward; returns the output of the last 64 (target) tokens (B, T, patch_dim)."""
        out = self.transformer(hidden_states=hidden, encoder_hidden_states=prompt, timestep=t, img_ids=ids,
                               txt_ids=self.ids_text, guidance=None, joint_attention_kwargs={"sakura": slot},
                               return_dict=False, kv_cache=cache, kv_cache_mode=mode, num_ref_tokens=num_ref,
                               ref_fixed_timestep=self.cfg.template_timestep)[0]
        return out[:, -self.cfg.tokens_per_image:]

    def _main_tokens(self, photo: torch.Tensor, x_t: torch.Tensor) -> torch.Tensor:
        p = self.cfg.patch_size
        return torch.cat([patchify(photo, p), patchify(x_t, p)], dim=1)          # (B, 2T, patch_dim)

    def velocity_in_sequence(self, template: torch.Tensor, instruction: torch.Tensor | int, photo: torch.Tensor,
                             x_t: torch.Tensor, t: torch.Tensor, slot: ForwardSlot | None = None) -> torch.Tensor:
        """v for the target with the template in the sequence (diffusers' "extract" forward).

        template, photo, x_t: (B, 3, S, S); instruction: int or (B,) long; t: (B,) in [0, 1].
        Differentiable (used for training). `slot.captured` receives every layer's template K/V.
        """
        cfg = self.cfg
        b = photo.shape[0]
        tmpl = patchify(template, cfg.patch_size).expand(b, -1, -1)
        hidden = torch.cat([tmpl, self._main_tokens(photo, x_t)], dim=1)
        ids = torch.cat([self.ids_template, self.ids_main])
        n = cfg.tokens_per_image
        slot = slot if slot is not None else ForwardSlot(num_template_tokens=n)
        slot.isolate = self.isolate_template
        # photo_reference: [template | photo] are both references (the photo sits at T=20, slot 1)
        out = self._run(hidden, ids, self._prompt(instruction, b), t, mode="extract",
                        num_ref=2 * n if cfg.photo_reference else n, slot=slot)
        return self._to_velocity(out, photo, x_t, t)

    def velocity_cached(self, photo: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor, instruction: torch.Tensor | int,
                        template: LazyTemplateLayers, probe: AttentionProbe | None = None) -> torch.Tensor:
        """v for the target with the template's K/V from `template` (diffusers' "cached" forward);
        layer i's K/V are requested when the forward pass reaches layer i."""
        cfg = self.cfg
        prompt = self._prompt(instruction, photo.shape[0])
        if cfg.photo_reference:
            # the photo is a reference: "extract" forward on [photo | target] with the template's
            # K/V injected ahead of the photo's; the photo attends to template and photo (isolated
            # template, since the injected K/V were computed without the photo)
            slot = ForwardSlot(inject=template, probe=probe)
            out = self._run(self._main_tokens(photo, x_t), self.ids_main, prompt, t, mode="extract",
                            num_ref=cfg.tokens_per_image, slot=slot)
            return self._to_velocity(out, photo, x_t, t)
        cache = _LazyKVCache(template, cfg.double_layers, cfg.single_layers)
        slot = ForwardSlot(inject=template, probe=probe)
        out = self._run(self._main_tokens(photo, x_t), self.ids_main, prompt, t,
                        mode="cached", cache=cache, slot=slot)
        return self._to_velocity(out, photo, x_t, t)

    def velocity(self, photo: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor,
                 kv_for_layer: Callable[[int], tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]],
                 probe: AttentionProbe | None = None, instruction: int = 0) -> torch.Tensor:
        """sakura-mini's signature: kv_for_layer(i) -> (key, value (B, Tt, H, D), keep or None),
        called when the forward pass reaches layer i."""
        lazy = LazyTemplateLayers(kv_for_layer, self.num_layers, batch=photo.shape[0], device=photo.device,
                                  dtype=photo.dtype)
        return self.velocity_cached(photo, x_t, t, instruction, lazy, probe)

    def training_velocity(self, template: torch.Tensor, instruction: torch.Tensor, photo: torch.Tensor,
                          x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Differentiable forward for training, one template per sample (same signature as MiniDiT)."""
        return self.velocity_in_sequence(template, instruction, photo, x_t, t)

    # -- the template KV ------------------------------------------------------------------------
    def template_layers(self, template: torch.Tensor, instruction: torch.Tensor | int = 0
                        ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Lazily run the template block by block: yields layer i's (key, value), each (B, Tt, H, D),
        after computing blocks 0..i only (a runtime computing a prefix locally stops early).

        Runs the transformer's own blocks and modulation in the same order diffusers' extract
        forward does, with the template as the only tokens besides the text (which the template
        never attends to), so the K/V equal the ones captured inside an edit. `instruction` is
        accepted for API parity; the template KV does not depend on it (the prompt is text).
        """
        # Adapted from sakura.models.flux.klein.reference_layers with the template as the only image
        # tokens (no blended modulation, no image segment); keep in sync with it.
        tr, cfg = self.transformer, self.cfg
        template = template.to(self.device, self.dtype)
        b = template.shape[0]
        hidden = tr.x_embedder(patchify(template, cfg.patch_size))
        prompt = tr.context_embedder(self._prompt(instruction, b))
        t_ref = torch.full((b,), cfg.template_timestep * 1000, dtype=hidden.dtype, device=hidden.device)
        temb = tr.time_guidance_embed(t_ref, None)
        mod_img = tr.double_stream_modulation_img(temb)
        mod_txt = tr.double_stream_modulation_txt(temb)
        mod_single = tr.single_stream_modulation(temb)
        rope_img, rope_txt = tr.pos_embed(self.ids_template), tr.pos_embed(self.ids_text)
        rope = (torch.cat([rope_txt[0], rope_img[0]]), torch.cat([rope_txt[1], rope_img[1]]))
        n = cfg.tokens_per_image
        slot = ForwardSlot(num_template_tokens=n)
        kw = {"kv_cache": None, "kv_cache_mode": "extract", "num_ref_tokens": n, "sakura": slot}
        for block in tr.transformer_blocks:
            prompt, hidden = block(hidden_states=hidden, encoder_hidden_states=prompt, temb_mod_img=mod_img,
                                   temb_mod_txt=mod_txt, image_rotary_emb=rope, joint_attention_kwargs=kw)
            yield slot.captured[-1]
        hidden = torch.cat([prompt, hidden], dim=1)
        kw_single = {**kw, "num_txt_tokens": prompt.shape[1]}
        for block in tr.single_transformer_blocks:
            hidden = block(hidden_states=hidden, encoder_hidden_states=None, temb_mod=mod_single,
                           image_rotary_emb=rope, joint_attention_kwargs=kw_single)
            yield slot.captured[-1]

    def _source_instruction(self, source: TemplateKVSource, instruction: int | None) -> int:
        """The instruction (prompt) of an injected template: given, else carried by the source."""
        if instruction is None:
            instruction = source.instruction
        if instruction is None:
            raise ValueError("flux2-mini needs the template's instruction id: pass instruction= or use a KV "
                             "source that carries it (TemplateKV.layout['instruction'] or .instruction)")
        return self._check_instruction(int(instruction))

    # -- sampling -------------------------------------------------------------------------------
    def differentiable_edit(self, photo: torch.Tensor, *, template: torch.Tensor | None = None,
                            instruction: int | None = None, template_kv: TemplateKVSource | None = None,
                            mode: KVMode | str | None = None, steps: int = 8, seed: int = 0,
                            probe: AttentionProbe | None = None) -> EditOutput:
        """Edit `photo` (B, 3, S, S) in [0, 1]; same contract as `MiniDiT.differentiable_edit`
        (`edit` is this call under no_grad).

        The template is given as pixels (+ instruction id; NOCACHE / EXTRACT) or as KV (INJECTED;
        the instruction then comes from the source unless given). All modes give bit-identical images.
        """
        dev, dt = self.device, self.dtype
        photo = self._check_image(photo, "photo").to(dev, dt)
        b = photo.shape[0]
        mode = resolve_kv_mode(mode, template, template_kv)
        cfg = self.cfg
        if mode is KVMode.INJECTED:
            self.check_template_kv(template_kv)
            instruction = self._source_instruction(template_kv, instruction)
        else:
            template = self._check_image(template, "template")[:1]
            instruction = self._check_instruction(0 if instruction is None else instruction)
        check_steps(steps)

        timings = {"template": 0.0, "denoise": 0.0}
        lazy = None
        if mode is KVMode.INJECTED:
            lazy = LazyTemplateLayers.from_source(template_kv, tokens=cfg.tokens_per_image, heads=cfg.heads,
                                                  head_dim=cfg.head_dim, device=dev, dtype=dt)
        # noise drawn on the CPU whatever the device: one seed, one edit, on every machine
        gen = torch.Generator().manual_seed(seed)
        noise = torch.randn(photo.shape, generator=gen).to(dev, dt)
        ts = torch.linspace(1.0, 0.0, steps + 1).to(dev, dt)
        # One photo at a time: diffusers' extract forward runs the template through the same
        # matmuls as the photo and target tokens, and a matmul's rounding can depend on how many
        # rows it has, so a batch of B would make "template in the sequence" differ from
        # "template injected" in the last bit. Per-sample runs keep every mode bit-identical.
        images, captured = [], None
        in_seq_s, cached_s = [], []  # per-step wall times, to attribute the template's share
        for j in range(b):
            x = noise[j:j + 1]
            for s in range(steps):
                t0 = time.perf_counter()
                t = ts[s].expand(1)
                in_sequence = mode is KVMode.NOCACHE or (mode is KVMode.EXTRACT and s == 0)
                if in_sequence:
                    slot = ForwardSlot(num_template_tokens=cfg.tokens_per_image)
                    v = self.velocity_in_sequence(template, instruction, photo[j:j + 1], x, t, slot=slot)
                    if captured is None:
                        captured = self._wrap_kv(template, instruction, slot.captured)
                    if mode is KVMode.EXTRACT:
                        lazy = LazyTemplateLayers.from_pairs(slot.captured, device=dev, dtype=dt)
                else:
                    v = self.velocity_cached(photo[j:j + 1], x, t, instruction, lazy, probe)
                x = x + (ts[s + 1] - ts[s]) * v
                (in_seq_s if in_sequence else cached_s).append(time.perf_counter() - t0)
            images.append(x)
        # The template runs inside the in-sequence forward passes, so its compute is estimated as
        # their excess over a cached step (EXTRACT with steps > 1); NOCACHE has no cached step to
        # compare with and reports 0.0 template seconds (all time is under "denoise").
        if in_seq_s and cached_s:
            per_cached = sorted(cached_s)[len(cached_s) // 2]
            timings["template"] = max(0.0, sum(in_seq_s) - per_cached * len(in_seq_s))
        timings["denoise"] = sum(in_seq_s) + sum(cached_s) - timings["template"]
        return EditOutput(image=torch.cat(images).clamp(0.0, 1.0).float().cpu(),
                          template_kv=captured if mode is KVMode.EXTRACT else None, timings_s=timings)

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "architecture": "diffusers Flux2Transformer2DModel"}


# ---------------------------------------------------------------------------------------------
# weights on disk

def save_flux2_mini_weights(model: Flux2MiniDiT, path: str | os.PathLike,
                            extra_meta: dict[str, str] | None = None) -> Path:
    """Atomic write of the weights (safetensors) with the config in the metadata."""
    return save_weights(model, path, "flux2-mini", extra_meta)


def load_flux2_mini_weights(path: str | os.PathLike) -> Flux2MiniDiT:
    """Build the model from the config in the file and load its weights strictly (in fp32)."""
    return load_weights(path, "flux2-mini", lambda cfg: Flux2MiniDiT(Flux2MiniConfig(**cfg)))


def load_flux2_mini(weights: str | os.PathLike | None = None, *, allow_random: bool = True, device="auto",
                    dtype="auto") -> Flux2MiniDiT:
    """The bundled flux2-mini (a `Flux2MiniDiT`) with its shipped weights (or `weights`), in eval
    mode, on `device` in `dtype`; a seeded random init (and a warning) when no file is there and
    `allow_random`."""
    return load_bundled("flux2-mini", FLUX2_MINI_WEIGHTS, weights, allow_random, load_flux2_mini_weights,
                        lambda: Flux2MiniDiT(Flux2MiniConfig()), device, dtype)


def load_flux2_mini_spec(arg: str = "", **options) -> Flux2MiniDiT:
    """Model-registry factory of ``flux2-mini[:/path/weights.safetensors]``."""
    check_flux2_mini_arg(arg)
    return load_flux2_mini(arg or None, **options)
