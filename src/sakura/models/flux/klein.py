"""FLUX.2 Klein through diffusers: template KV captured (extract) or injected (cached).

diffusers' `Flux2KleinKVPipeline` runs step 0 in "extract" mode on [text | reference | image]
tokens — reference tokens modulated at a fixed timestep and attending only to reference tokens —
and later steps in "cached" mode with the stored reference K/V (after QK-norm and RoPE). This
adapter works at the level of packed latents and prompt embeddings, so it runs with any
`Flux2Transformer2DModel` (tests use tiny random configs built in code); `from_pretrained` adds
the VAE and text encoder of a local Klein folder for pixel/prompt inputs.

Two things beyond diffusers' processors, in `SakuraKleinAttnProcessor` / `...SingleAttnProcessor`:
  * `keep` masks: a lossy codec may drop template tokens; they are masked out of attention;
  * template isolation: with a template reference *and* the user's photo as a second reference,
    diffusers lets every reference token attend to every other, so the template's K/V depend on
    the user's photo. With `isolate_template=True` (default) template tokens attend only to
    template tokens, which makes the template KV cacheable; the user's reference still attends to
    the template. `measure_template_dependence` quantifies the difference.

The adapter installs its processors on the transformer it is given and owns it from then on
(diffusers' pipeline does the same silently; we say so). With no keep mask and a single
reference, the processors compute exactly what diffusers' own KV processors compute.

Layer order of a Klein template KV: the double-stream blocks, then the single-stream blocks.
Reference RoPE ids tie the keys to a reference slot (T coordinate 10 for the first reference);
they are stored in `TemplateKV.positions` and checked on injection.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from diffusers.models.transformers.transformer_flux2 import (
    Flux2Transformer2DModel,
    _blend_double_block_mods,
    _blend_single_block_mods,
    _get_qkv_projections,
    apply_rotary_emb,
    dispatch_attention_fn,
)
from diffusers.pipelines.flux2.pipeline_flux2_klein_kv import compute_empirical_mu, retrieve_timesteps
from diffusers.schedulers import FlowMatchEulerDiscreteScheduler
from diffusers import Flux2KleinKVPipeline

from ..adapter import LazyTemplateLayers
from ..base import KVMode, check_source_fits, check_steps, resolve_kv_mode
from .attention import _attend, _attend_probed, _ref_mask, joint_qkv
from ..kv import LayerKV, TemplateKV, TemplateKVError, TemplateKVSource, fingerprint_model, fingerprint_tensors
from sakura.util.device import resolve

REF_SLOT_SCALE = 10  # diffusers' _prepare_image_ids: reference i gets T coordinate 10 + 10*i


def latent_ids(height: int, width: int, t: int = 0) -> torch.Tensor:
    """RoPE ids (height*width, 4) = (T, H, W, L) for a packed latent grid, as diffusers builds them."""
    return torch.cartesian_prod(torch.tensor([t]), torch.arange(height), torch.arange(width), torch.arange(1))


def text_ids(length: int) -> torch.Tensor:
    """RoPE ids (length, 4) for prompt tokens, as diffusers builds them."""
    return torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(length))


@dataclass
class KleinReference:
    """A reference image as the transformer consumes it.

    latents: (1, tokens, in_channels) packed latent tokens; ids: (tokens, 4) RoPE ids (slot in T).
    """

    latents: torch.Tensor
    ids: torch.Tensor

    @classmethod
    def from_grid(cls, latents: torch.Tensor, height: int, width: int, slot: int) -> "KleinReference":
        """Packed latents of a (height x width) grid placed in reference slot `slot` (0 = first)."""
        if latents.ndim != 3 or latents.shape[0] != 1 or latents.shape[1] != height * width:
            raise ValueError(f"latents must be (1, {height * width}, C) for a {height}x{width} grid, "
                             f"got {tuple(latents.shape)}")
        return cls(latents, latent_ids(height, width, t=REF_SLOT_SCALE + REF_SLOT_SCALE * slot))


@dataclass
class KleinEditOutput:
    """Result of `KleinAdapter.edit`: packed latents, not pixels (`KleinAdapter.decode` or the
    image-level `KleinImageModel` turn them into an image)."""

    latents: torch.Tensor                       # (1, image_tokens, in_channels) final packed latents
    template_kv: TemplateKV | None = None
    timings_s: dict[str, float] = field(default_factory=dict)


class _LazyCacheLayer:
    """Stands in for diffusers' per-layer cache in "cached" mode; `get()` pulls the layer lazily."""

    def __init__(self, lazy: LazyTemplateLayers, index: int):
        self._lazy, self._index = lazy, index

    def get(self):
        return self._lazy.kv(self._index)


class _LazyKVCache:
    """Duck-types `Flux2KVCache` for diffusers' forward (get_double / get_single / num_ref_tokens)."""

    def __init__(self, lazy: LazyTemplateLayers, num_double: int, num_single: int, num_ref_tokens: int = 0):
        self._lazy, self._num_double = lazy, num_double
        self.num_ref_tokens = num_ref_tokens

    def get_double(self, i: int) -> _LazyCacheLayer:
        return _LazyCacheLayer(self._lazy, i)

    def get_single(self, i: int) -> _LazyCacheLayer:
        return _LazyCacheLayer(self._lazy, self._num_double + i)


# A probe receives, per layer, the attention probabilities that non-template queries (text, photo,
# target) give the template keys: (B, heads, queries, template_tokens). Used to score importance.
AttentionProbe = Callable[[int, torch.Tensor], None]


class ForwardSlot:
    """Per-forward state shared with the processors: which layer is next, what to inject."""

    def __init__(self, num_template_tokens: int = 0, isolate: bool = True,
                 inject: LazyTemplateLayers | None = None, probe: AttentionProbe | None = None):
        self.layer = 0
        self.num_template_tokens = num_template_tokens  # template tokens at the start of the ref segment
        self.isolate = isolate
        self.inject = inject      # template K/V NOT in the sequence (extract) or of the cache (cached)
        self.probe = probe
        self.captured: list[tuple[torch.Tensor, torch.Tensor]] = []

    def next_layer(self) -> int:
        i = self.layer
        self.layer += 1
        return i

    def keep_for(self, layer: int) -> torch.Tensor | None:
        return self.inject.keep(layer) if self.inject is not None else None


def _kv_attention(query, key, value, num_txt: int, num_ref: int, mode: str | None, cache_layer, slot: ForwardSlot | None):
    """Attention for one layer. query/key/value: (B, S, H, D), after QK-norm and RoPE.

    extract: S = [txt | ref | img]; ref = [template? | user ref?]. Stores ref K/V (with an injected
             template prepended) in `cache_layer`.
    cached:  S = [txt | img]; cached ref K/V are spliced between txt and img.
    """
    if mode is None:
        return dispatch_attention_fn(query, key, value)
    if slot is None:
        slot = ForwardSlot()
    layer = slot.next_layer()

    if mode == "cached":
        k_ref, v_ref = cache_layer.get()  # a lazy cache pulls the template layer here, not earlier
        keep = slot.keep_for(layer)
        n_extra = k_ref.shape[1] - (keep.shape[0] if keep is not None else 0)
        k_all = torch.cat([key[:, :num_txt], k_ref, key[:, num_txt:]], dim=1)
        v_all = torch.cat([value[:, :num_txt], v_ref, value[:, num_txt:]], dim=1)
        mask = _ref_mask(keep, num_txt, n_extra + key.shape[1] - num_txt, query.device)
        if slot.probe is not None:
            # the cached references may be [template | user photo]: report the template's keys only
            n_t = keep.shape[0] if keep is not None else (slot.num_template_tokens or k_ref.shape[1])
            return _attend_probed(query, k_all, v_all, mask, num_txt, num_txt + n_t,
                                  lambda p: slot.probe(layer, p))
        return _attend(query, k_all, v_all, mask)

    # extract
    r0, r1 = num_txt, num_txt + num_ref
    q_ref, k_ref, v_ref = query[:, r0:r1], key[:, r0:r1], value[:, r0:r1]
    nt = slot.num_template_tokens
    keep = None
    if slot.inject is not None:  # template not in the sequence: its K/V come from the cache source
        k_t, v_t = slot.inject.kv(layer)
        keep = slot.keep_for(layer)
        k_ref, v_ref = torch.cat([k_t, k_ref], dim=1), torch.cat([v_t, v_ref], dim=1)
        nt = k_t.shape[1]
    if cache_layer is not None:
        cache_layer.store(k_ref.clone(), v_ref.clone())
    slot.captured.append((k_ref[:, :nt], v_ref[:, :nt]))

    k_all = torch.cat([key[:, :r0], k_ref, key[:, r1:]], dim=1)
    v_all = torch.cat([value[:, :r0], v_ref, value[:, r1:]], dim=1)
    q_txt_img = torch.cat([query[:, :r0], query[:, r1:]], dim=1)
    n_user = k_ref.shape[1] - nt
    out_txt_img = _attend(q_txt_img, k_all, v_all, _ref_mask(keep, r0, n_user + key.shape[1] - r1, query.device))

    # reference queries: template tokens see the template only (isolation) — or all refs (diffusers)
    ref_mask = _ref_mask(keep, 0, n_user, query.device)
    n_q_tmpl = num_ref - n_user  # template queries present in the sequence (0 when injected)
    if slot.isolate and n_q_tmpl > 0 and n_user > 0:
        out_t = _attend(q_ref[:, :n_q_tmpl], k_ref[:, :nt], v_ref[:, :nt], _ref_mask(keep, 0, 0, query.device))
        out_u = _attend(q_ref[:, n_q_tmpl:], k_ref, v_ref, ref_mask)
        out_ref = torch.cat([out_t, out_u], dim=1)
    else:
        out_ref = _attend(q_ref, k_ref, v_ref, ref_mask)
    return torch.cat([out_txt_img[:, :r0], out_ref, out_txt_img[:, r0:]], dim=1)


def reference_layers(transformer: Flux2Transformer2DModel, hidden: torch.Tensor, ids: torch.Tensor,
                     prompt_embeds: torch.Tensor, txt_ids: torch.Tensor, timestep: torch.Tensor, num_ref: int,
                     ref_fixed_timestep: float = 0.0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Lazily run diffusers' "extract" forward block by block: yields layer i's reference K/V
    (B, num_ref, H, D) after computing blocks 0..i only.

    The same operations, in the same order and on the same shapes, as
    `Flux2Transformer2DModel.forward(..., kv_cache_mode="extract")` up to each block, so the K/V are
    bit-identical to the ones that forward captures (tested). Needs the Sakura processors installed.
    hidden: (B, num_ref + image tokens, in_channels) = [reference | image]; ids: matching RoPE ids.
    """
    # Adapted from diffusers.models.transformers.transformer_flux2.Flux2Transformer2DModel.forward
    # (the embedding, modulation and block loop, split at each block); keep in sync with it.
    tr = transformer
    slot = ForwardSlot(num_template_tokens=num_ref)
    num_txt = prompt_embeds.shape[1]
    ids, txt_ids = ids.to(hidden.device), txt_ids.to(hidden.device)  # RoPE ids are built on the CPU
    timestep = timestep.to(hidden.dtype) * 1000
    temb = tr.time_guidance_embed(timestep, None)
    mod_img = tr.double_stream_modulation_img(temb)
    mod_txt = tr.double_stream_modulation_txt(temb)
    mod_single = tr.single_stream_modulation(temb)
    ref_temb = tr.time_guidance_embed(torch.full_like(timestep, ref_fixed_timestep * 1000), None)
    mod_img = _blend_double_block_mods(mod_img, tr.double_stream_modulation_img(ref_temb), num_ref, hidden.shape[1])
    ref_single = tr.single_stream_modulation(ref_temb)
    x = tr.x_embedder(hidden)
    enc = tr.context_embedder(prompt_embeds)
    rope_img, rope_txt = tr.pos_embed(ids), tr.pos_embed(txt_ids)
    rope = (torch.cat([rope_txt[0], rope_img[0]], dim=0), torch.cat([rope_txt[1], rope_img[1]], dim=0))
    kw = {"sakura": slot, "kv_cache": None, "kv_cache_mode": "extract", "num_ref_tokens": num_ref}
    for block in tr.transformer_blocks:
        enc, x = block(hidden_states=x, encoder_hidden_states=enc, temb_mod_img=mod_img, temb_mod_txt=mod_txt,
                       image_rotary_emb=rope, joint_attention_kwargs=kw)
        yield slot.captured[-1]
    x = torch.cat([enc, x], dim=1)
    mod_single = _blend_single_block_mods(mod_single, ref_single, num_txt, num_ref, x.shape[1])
    kw_single = {**kw, "num_txt_tokens": num_txt}
    for block in tr.single_transformer_blocks:
        x = block(hidden_states=x, encoder_hidden_states=None, temb_mod=mod_single, image_rotary_emb=rope,
                  joint_attention_kwargs=kw_single)
        yield slot.captured[-1]


class SakuraKleinAttnProcessor:
    """Double-stream block processor: diffusers' KV processor plus keep masks and isolation."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None,
                 kv_cache=None, kv_cache_mode: str | None = None, num_ref_tokens: int = 0,
                 sakura: ForwardSlot | None = None):
        query, key, value = joint_qkv(attn, hidden_states, encoder_hidden_states, image_rotary_emb,
                                      _get_qkv_projections, apply_rotary_emb)
        num_txt = encoder_hidden_states.shape[1]
        out = _kv_attention(query, key, value, num_txt, num_ref_tokens, kv_cache_mode, kv_cache, sakura)
        out = out.flatten(2, 3).to(query.dtype)
        enc_out, out = out.split_with_sizes([num_txt, out.shape[1] - num_txt], dim=1)
        return attn.to_out[1](attn.to_out[0](out)), attn.to_add_out(enc_out)


class SakuraKleinSingleAttnProcessor:
    """Single-stream block processor: diffusers' KV processor plus keep masks and isolation."""

    def __call__(self, attn, hidden_states, attention_mask=None, image_rotary_emb=None, kv_cache=None,
                 kv_cache_mode: str | None = None, num_txt_tokens: int = 0, num_ref_tokens: int = 0,
                 sakura: ForwardSlot | None = None):
        proj = attn.to_qkv_mlp_proj(hidden_states)
        qkv_dim = 3 * attn.inner_dim
        mlp_dim = attn.mlp_hidden_dim * attn.mlp_mult_factor
        local_qkv = proj.shape[-1] * qkv_dim // (qkv_dim + mlp_dim)
        qkv, mlp = torch.split(proj, [local_qkv, proj.shape[-1] - local_qkv], dim=-1)
        query, key, value = (t.unflatten(-1, (-1, attn.head_dim)) for t in qkv.chunk(3, dim=-1))
        query, key = attn.norm_q(query), attn.norm_k(key)
        query = apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)
        key = apply_rotary_emb(key, image_rotary_emb, sequence_dim=1)
        out = _kv_attention(query, key, value, num_txt_tokens, num_ref_tokens, kv_cache_mode, kv_cache, sakura)
        out = out.flatten(2, 3).to(query.dtype)
        return attn.to_out(torch.cat([out, attn.mlp_act_fn(mlp)], dim=-1))


def install_processors(transformer: Flux2Transformer2DModel) -> None:
    """Put the Sakura KV processors on every attention layer of `transformer` (in place)."""
    procs = {name: (SakuraKleinSingleAttnProcessor() if name.startswith("single_transformer_blocks")
                    else SakuraKleinAttnProcessor()) for name in transformer.attn_processors}
    transformer.set_attn_processor(procs)  # note: diffusers empties the dict passed here


class KleinAdapter:
    """A `TemplateEditModel` over a diffusers `Flux2Transformer2DModel` (packed-latent level).

    Args:
        transformer: the Klein transformer; the adapter installs its own processors on it.
        isolate_template: template tokens attend only to template tokens when a user reference
            is also present (default True: required for a cacheable template KV).
        pipeline: optional `Flux2KleinKVPipeline` (from `from_pretrained`) for VAE/text encoding.
    """

    def __init__(self, transformer: Flux2Transformer2DModel, *, isolate_template: bool = True, pipeline: Any = None):
        self.transformer = transformer.eval()
        self.isolate_template = isolate_template
        self.pipeline = pipeline
        install_processors(transformer)
        self._fingerprint: str | None = None
        cfg = transformer.config
        self.heads, self.head_dim = cfg.num_attention_heads, cfg.attention_head_dim
        self.text_encoder_out_layers: tuple[int, ...] = (9, 18, 27)
        self.max_sequence_length = 512

    @classmethod
    def from_pretrained(cls, folder: str, *, text_encoder_out_layers: tuple[int, ...] | None = None,
                        max_sequence_length: int = 512, device: Any = "auto", dtype: Any = "auto",
                        **kw) -> "KleinAdapter":
        """Load a Klein KV pipeline from a local folder (the user's own download; never a hub).

        text_encoder_out_layers: hidden-state indices of the text encoder stacked into the prompt
        embedding; default diffusers' (9, 18, 27) for an encoder with at least 27 layers, else
        three evenly spaced ones ending at the last (so tiny test pipelines load too).
        """
        if not Path(folder).is_dir():
            raise FileNotFoundError(f"{folder}: not a local folder with a FLUX.2 Klein pipeline")

        dev, dt = resolve(device, dtype)
        # loaded straight in the compute dtype (a 9B model is never held in fp32 on the host); the
        # fingerprint upcasts half-precision weights, so a bf16 checkpoint is one model in bf16 or fp32
        pipe = Flux2KleinKVPipeline.from_pretrained(folder, local_files_only=True, dtype=dt)
        pipe.to(dev)
        adapter = cls(pipe.transformer, pipeline=pipe, **kw)
        if text_encoder_out_layers is None and pipe.text_encoder is not None:
            n = pipe.text_encoder.config.num_hidden_layers
            text_encoder_out_layers = (9, 18, 27) if n >= 27 else (max(1, n // 3), max(1, 2 * n // 3), n)
        adapter.text_encoder_out_layers = tuple(text_encoder_out_layers or (9, 18, 27))
        adapter.max_sequence_length = max_sequence_length
        return adapter

    # -- pixels and prompts (needs the pipeline's VAE / text encoder) -----------------------------
    def _need_pipeline(self, what: str):
        if self.pipeline is None:
            raise ValueError(f"{what} needs the VAE and text encoder: load the adapter with KleinAdapter.from_pretrained")
        return self.pipeline

    @torch.no_grad()
    def encode_prompt(self, prompt: str) -> torch.Tensor:
        """The prompt as the transformer consumes it: (1, max_sequence_length, joint_attention_dim)."""
        pipe = self._need_pipeline("encode_prompt")
        embeds, _ = pipe.encode_prompt(prompt, device=self.device, max_sequence_length=self.max_sequence_length,
                                       text_encoder_out_layers=self.text_encoder_out_layers)
        return embeds.to(self.dtype)

    @torch.no_grad()
    def encode_image(self, image: torch.Tensor, slot: int) -> KleinReference:
        """An image (1, 3, H, W) in [0, 1] as a reference in `slot` (0 = template, 1 = user photo):
        VAE latents, 2x2-patchified, batch-norm normalised and packed, as diffusers' pipeline does."""
        pipe = self._need_pipeline("encode_image")
        if image.ndim != 4 or image.shape[:2] != (1, 3):
            raise ValueError(f"image must be (1, 3, H, W) in [0, 1], got {tuple(image.shape)}")
        image = image.to(pipe.vae.device, pipe.vae.dtype)
        lat = pipe._encode_vae_image(image * 2 - 1, generator=None)              # (1, 4*C, h, w)
        _, _, h, w = lat.shape
        return KleinReference.from_grid(pipe._pack_latents(lat).to(self.device, self.dtype), h, w, slot=slot)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """Packed latents (1, h*w, C) of a (h, w) grid -> image (1, 3, H, W) in [0, 1]."""
        pipe = self._need_pipeline("decode")
        h, w = grid
        lat = latents.to(pipe.vae.device, pipe.vae.dtype).reshape(1, h, w, -1).permute(0, 3, 1, 2)  # (1, C, h, w)
        bn = pipe.vae.bn
        lat = lat * torch.sqrt(bn.running_var.view(1, -1, 1, 1) + pipe.vae.config.batch_norm_eps) \
            + bn.running_mean.view(1, -1, 1, 1)
        image = pipe.vae.decode(pipe._unpatchify_latents(lat), return_dict=False)[0]
        return (image / 2 + 0.5).clamp(0, 1).float().cpu()  # (1, 3, H, W) float32 on the CPU, whatever the device

    # -- identity -------------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.transformer.transformer_blocks) + len(self.transformer.single_transformer_blocks)

    @property
    def device(self) -> torch.device:
        """Where the transformer's weights are: every tensor an edit makes is made there."""
        return next(self.transformer.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.transformer.parameters()).dtype

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = fingerprint_model(self.transformer, dict(self.transformer.config))
        return self._fingerprint

    def template_fingerprint(self, template: KleinReference) -> str:
        return fingerprint_tensors({"latents": template.latents.float().cpu().contiguous(),
                                    "ids": template.ids.cpu().contiguous()},
                                   {"kind": "klein"})

    def check_template_kv(self, source: TemplateKVSource) -> None:
        check_source_fits(source, self.fingerprint(), self.num_layers)

    def describe(self) -> dict[str, object]:
        cfg = self.transformer.config
        return {"model": "flux2-klein", "double_layers": cfg.num_layers, "single_layers": cfg.num_single_layers,
                "heads": self.heads, "head_dim": self.head_dim,
                "parameters": sum(p.numel() for p in self.transformer.parameters()),
                "template_kv_values_per_token": 2 * self.num_layers * self.heads * self.head_dim,
                "fingerprint": self.fingerprint()[:16]}

    # -- forward helpers ------------------------------------------------------------------------
    def _forward(self, latents, ids, prompt_embeds, txt_ids, t, *, mode, num_ref=0, cache=None, slot=None):
        dev = latents.device
        out = self.transformer(hidden_states=latents, timestep=t, guidance=None, encoder_hidden_states=prompt_embeds,
                               txt_ids=txt_ids.to(dev), img_ids=ids.to(dev), joint_attention_kwargs={"sakura": slot},
                               return_dict=False, kv_cache=cache, kv_cache_mode=mode, num_ref_tokens=num_ref)
        return out

    def _check_ref(self, ref: KleinReference, name: str) -> None:
        c = self.transformer.config.in_channels
        if not isinstance(ref, KleinReference):
            raise TypeError(f"{name} must be a KleinReference, got {type(ref).__name__}")
        if ref.latents.ndim != 3 or ref.latents.shape[0] != 1 or ref.latents.shape[2] != c:
            raise ValueError(f"{name}.latents has shape {tuple(ref.latents.shape)}; expected (1, tokens, {c})")
        if tuple(ref.ids.shape) != (ref.latents.shape[1], 4):
            raise ValueError(f"{name}.ids has shape {tuple(ref.ids.shape)}; expected ({ref.latents.shape[1]}, 4)")
        if not bool(torch.isfinite(ref.latents).all()):
            raise ValueError(f"{name}.latents contain NaN or inf")

    def _wrap(self, template: KleinReference, captured) -> TemplateKV:
        layers = [LayerKV(k[0].contiguous().cpu(), v[0].contiguous().cpu()) for k, v in captured]
        return TemplateKV(layers, self.fingerprint(), self.template_fingerprint(template),
                          layout={"kind": "klein", "tokens": int(template.latents.shape[1]), "slot_ids": "positions"},
                          positions=template.ids.clone())

    def template_layers(self, template: KleinReference) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Lazily compute the template reference's K/V: yields layer i's (key, value) (1, Tt, H, D)
        after running blocks 0..i only (one 1-token stand-in each for text and image: reference
        tokens never attend to them). A runtime computing a prefix of layers locally stops early."""
        self._check_ref(template, "template")
        c = self.transformer.config
        dev, dt = self.device, self.dtype
        img = torch.zeros(1, 1, c.in_channels, device=dev, dtype=dt)
        yield from reference_layers(self.transformer, torch.cat([template.latents.to(dev, dt), img], 1),
                                    torch.cat([template.ids, latent_ids(1, 1)]),
                                    torch.zeros(1, 1, c.joint_attention_dim, device=dev, dtype=dt),
                                    text_ids(1), torch.zeros(1, device=dev), num_ref=template.latents.shape[1])

    def template_stream(self, template: KleinReference) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return list(self.template_layers(template))

    @torch.no_grad()
    def extract_template_kv(self, template: KleinReference) -> TemplateKV:
        """The template reference's K/V in every layer (`template_layers`, all of them)."""
        return self._wrap(template, self.template_stream(template))

    @torch.no_grad()
    def edit(self, photo: KleinReference | None = None, *, template: KleinReference | None = None,
             template_kv: TemplateKVSource | None = None, mode: KVMode | str | None = None, steps: int = 4,
             seed: int = 0, prompt_embeds: torch.Tensor | None = None, grid: tuple[int, int] | None = None,
             probe: AttentionProbe | None = None) -> KleinEditOutput:
        """Generate latents for a (grid) image guided by the prompt, the template and the user's photo.

        photo: the user's reference (slot 1) or None; template: the template reference (slot 0) for
        NOCACHE/EXTRACT; template_kv: for INJECTED. prompt_embeds: (1, text_tokens, joint_attention_dim).
        grid: latent (height, width) of the output; default: the template's grid when square.
        probe: receives the attention the image queries give the template keys in every cached step.
        """
        cfg = self.transformer.config
        mode = resolve_kv_mode(mode, template, template_kv, what="template reference")
        check_steps(steps)
        if prompt_embeds is None or prompt_embeds.ndim != 3 or prompt_embeds.shape[2] != cfg.joint_attention_dim:
            raise ValueError(f"prompt_embeds must be (1, text_tokens, {cfg.joint_attention_dim})")
        if mode is KVMode.INJECTED:
            self.check_template_kv(template_kv)
            # The token count comes from the positions the KV carries, so no layer is read before
            # the forward pass reaches it; a source without positions gives its layer 0 early.
            positions = template_kv.positions
            n_tmpl = int(positions.shape[0]) if positions is not None else template_kv.layer(0).num_tokens
            if positions is not None and (positions.ndim != 2 or positions.shape[1] != 4):
                raise TemplateKVError(f"template KV positions have shape {tuple(positions.shape)}, expected (tokens, 4)")
        else:
            self._check_ref(template, "template")
            n_tmpl = template.latents.shape[1]
        if photo is not None:
            self._check_ref(photo, "photo")
        if grid is None:
            side = int(round(n_tmpl ** 0.5))
            if side * side != n_tmpl:
                raise ValueError("grid is required when the template is not square")
            grid = (side, side)
        h, w = grid
        ids = latent_ids(h, w)
        txt_ids = text_ids(prompt_embeds.shape[1])
        dev, dt = self.device, self.dtype
        # noise drawn on the CPU whatever the device: one seed, one edit, on every machine
        gen = torch.Generator().manual_seed(seed)
        latents = torch.randn(1, h * w, cfg.in_channels, generator=gen).to(dev, dt)
        prompt_embeds = prompt_embeds.to(dev, dt)
        scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, shift_terminal=None)
        sigmas = np.linspace(1.0, 1 / steps, steps)
        timesteps, _ = retrieve_timesteps(scheduler, steps, dev, sigmas=sigmas,
                                          mu=compute_empirical_mu(image_seq_len=h * w, num_steps=steps))
        scheduler.set_begin_index(0)
        timings = {"template": 0.0, "denoise": 0.0}
        user = photo.latents.to(dev, dt) if photo is not None else latents[:, :0]
        user_ids = photo.ids if photo is not None else ids[:0]
        inject = None
        if mode is KVMode.INJECTED:
            # layer i is pulled from the source when the forward pass reaches layer i (lazy), so a
            # streaming runtime overlaps fetching later layers with computing earlier ones
            inject = LazyTemplateLayers.from_source(
                template_kv, tokens=n_tmpl, heads=self.heads, head_dim=self.head_dim,
                tokens_from="its positions" if positions is not None else "its layer 0", device=dev, dtype=dt)
            if positions is not None and photo is not None and torch.equal(positions, photo.ids[:n_tmpl]):
                raise TemplateKVError("the photo reference uses the template's reference slot")

        n_double = len(self.transformer.transformer_blocks)
        n_single = len(self.transformer.single_transformer_blocks)
        cache = None
        captured = None
        for i, t in enumerate(timesteps):
            timestep = (t.expand(1) / 1000).to(latents.dtype)
            t0 = time.perf_counter()
            full = mode is KVMode.NOCACHE or (mode is KVMode.EXTRACT and i == 0)
            if full:  # template (and the user's reference) in the sequence
                slot = ForwardSlot(num_template_tokens=n_tmpl, isolate=self.isolate_template)
                seq = torch.cat([template.latents.to(dev, dt), user, latents], 1)
                seq_ids = torch.cat([template.ids, user_ids, ids])
                noise_pred, cache = self._forward(seq, seq_ids, prompt_embeds, txt_ids, timestep, mode="extract",
                                                  num_ref=n_tmpl + user.shape[1], slot=slot)
                if captured is None:
                    captured = self._wrap(template, slot.captured)
            elif cache is None and mode is KVMode.INJECTED and photo is not None:
                # step 0 with an injected template: the user's reference runs in the sequence once
                slot = ForwardSlot(inject=inject, isolate=self.isolate_template)
                noise_pred, cache = self._forward(torch.cat([user, latents], 1), torch.cat([user_ids, ids]),
                                                  prompt_embeds, txt_ids, timestep, mode="extract",
                                                  num_ref=user.shape[1], slot=slot)
            else:
                if cache is None:  # injected, no user reference: the template KV is the whole cache
                    cache = _LazyKVCache(inject, n_double, n_single, num_ref_tokens=n_tmpl)
                slot = ForwardSlot(num_template_tokens=n_tmpl, inject=inject if mode is KVMode.INJECTED else None,
                             probe=probe)
                noise_pred = self._forward(latents, ids, prompt_embeds, txt_ids, timestep, mode="cached",
                                           cache=cache, slot=slot)[0]
            latents = scheduler.step(noise_pred, t, latents, return_dict=False)[0]
            timings["denoise"] += time.perf_counter() - t0
        return KleinEditOutput(latents=latents, template_kv=captured if mode is KVMode.EXTRACT else None,
                               timings_s=timings)


def measure_template_dependence(transformer: Flux2Transformer2DModel, template: KleinReference,
                                photos: list[KleinReference]) -> dict[str, float]:
    """How much a template's KV changes with the user's reference photo, per attention mask.

    Runs the extract pass with [template | photo] references for each photo, with diffusers' mask
    (all references attend to each other) and with isolation. Returns the max over layers and
    photo pairs of ||K_a - K_b|| / ||K_a|| for each mask (isolation must give 0.0).
    """
    out = {}
    for isolate in (False, True):
        adapter = KleinAdapter(transformer, isolate_template=isolate)
        c = transformer.config
        kvs = []
        for photo in photos:
            slot = ForwardSlot(num_template_tokens=template.latents.shape[1], isolate=isolate)
            seq = torch.cat([template.latents, photo.latents, torch.zeros(1, 1, c.in_channels)], 1)
            ids = torch.cat([template.ids, photo.ids, latent_ids(1, 1)])
            with torch.no_grad():
                adapter._forward(seq, ids, torch.zeros(1, 1, c.joint_attention_dim), text_ids(1), torch.zeros(1),
                                 mode="extract", num_ref=seq.shape[1] - 1, slot=slot)
            kvs.append(slot.captured)
        worst = 0.0
        for a in kvs:
            for b in kvs:
                for (ka, va), (kb, vb) in zip(a, b):
                    worst = max(worst, float((ka - kb).norm() / ka.norm()), float((va - vb).norm() / va.norm()))
        out["diffusers_mask" if not isolate else "isolated"] = worst
    return out
