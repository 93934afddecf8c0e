"""FLUX.1 Kontext through diffusers: template KV captured in the sequence (extract) or injected (cached).

Stock Kontext (`FluxKontextPipeline`) runs one `FluxTransformer2DModel` on [text | target | image]
tokens, the image being the picture it edits (RoPE T coordinate 1), every token modulated with the
current timestep and attending to every other. A sakura template adds its reference image(s) to
that sequence, and for the template's K/V to be a pure function of the template (cacheable,
streamable) two things change for the template tokens only:

  * isolation: template queries attend to template keys only (text, target and photo queries
    still attend to everything, the template included), as the SPEC's Klein caveat requires;
  * a fixed timestep: template tokens are modulated at `ref_timestep` (default 0.0: a clean
    image, as FLUX.2 Klein KV does) instead of the current one, so their K/V do not change
    from one denoising step to the next.

With no template the forward here is stock Kontext's, operation for operation (tested bit-exact
against `FluxTransformer2DModel.forward`). A real Kontext checkpoint was trained without these two
changes: a template reference is conditioning it has not seen in this form, so edit quality with
real weights is to be measured, not assumed (the tiny random model here proves the protocol only).

Token layout of one forward (sequence order of keys):

    [text | target (T=0) | user photo (T=1) | template reference r (T = 2 + r), r = 0..R-1]

The photo takes the slot stock Kontext gives the image it edits, so the template sits beside it.

How the template K/V move: `KontextKVProcessor` (the swappable attention object) is handed the
template stream separately from the main one in every block. A `KVSlot` says, per forward, what to
do with it: capture the in-sequence template K/V per layer (extract), or fetch them lazily from a
`TemplateKVSource` when the forward pass reaches that layer (injected; the streaming runtime's
source blocks there until the layer has arrived). The transformer is never modified: no processor
is installed on it, so other code sharing it (a stock pipeline) is unaffected. The block loop
(`_double_block`, `_single_block`) is diffusers' `FluxTransformerBlock.forward` /
`FluxSingleTransformerBlock.forward` with the template tokens run as their own stream beside the
main one; every per-token operation on the template stream has the same shapes whether the main
stream is there or not, so the K/V of `template_layers` (template alone) and of the extract pass
(template in the edit's sequence) are bit-identical, and so are extract and injected edits.

Layer order of a Kontext template KV: the double-stream blocks, then the single-stream blocks;
K/V per layer (1, R*tokens, heads, head_dim), after QK-norm and RoPE. The RoPE ids of the template
slots are stored in `TemplateKV.positions` and checked on injection.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.transformers.transformer_flux import FluxTransformer2DModel, _get_qkv_projections
from diffusers.pipelines.flux.pipeline_flux_kontext import calculate_shift, retrieve_timesteps
from diffusers.schedulers import FlowMatchEulerDiscreteScheduler
from diffusers import FluxKontextPipeline

from ..base import (EditOutput, KVMode, check_images, check_prompt, check_source_fits, check_steps, grad_through,
                    resolve_kv_mode)
from .attention import _attend, _attend_probed, joint_qkv  # shared with Klein: masked attention, joint QKV
from .config import FluxShape
from ..adapter import LazyTemplateLayers, ReadOnceSource
from ..spec_checks import check_kontext_arg
from ..kv import LayerKV, TemplateKV, TemplateKVError, TemplateKVSource, fingerprint_model, fingerprint_tensors
from sakura.util.device import DeviceError, resolve

DEFAULT_IMAGE_SIZE = 512
PHOTO_SLOT_T = 1        # stock Kontext's T coordinate for the image it edits
TEMPLATE_SLOT_T = 2     # template reference r sits at T = 2 + r
MODEL_KIND = "flux1-kontext"

#: Receives, per layer, the attention probabilities the main queries (text, target, photo) give
#: the template keys: (B, heads, queries, template_tokens). Used to score token importance.
AttentionProbe = Callable[[int, torch.Tensor], None]


# -- shapes ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KontextConfig(FluxShape):
    """The shapes of a Kontext transformer run at one resolution (`ImageModelConfig`; fields and
    derived sizes in `FluxShape`). pixels_per_token: VAE factor x 2 (the pipeline's 2x2 latent
    packing); text_tokens: the padded T5 prompt length."""


def image_ids(grid: int, t: int) -> torch.Tensor:
    """RoPE ids (grid*grid, 3) = (T, H, W) of a packed latent grid in slot `t`, as
    `FluxKontextPipeline._prepare_latent_image_ids` builds them (then `ids[..., 0] = t`)."""
    ids = torch.zeros(grid, grid, 3)
    ids[..., 0] = t
    ids[..., 1] = ids[..., 1] + torch.arange(grid)[:, None]
    ids[..., 2] = ids[..., 2] + torch.arange(grid)[None, :]
    return ids.reshape(grid * grid, 3)


def template_ids(grid: int, references: int) -> torch.Tensor:
    """RoPE ids (references*grid*grid, 3) of template references 0..R-1 (T = 2 + r)."""
    return torch.cat([image_ids(grid, TEMPLATE_SLOT_T + r) for r in range(references)])


# -- the swappable attention object ----------------------------------------------------------------
class KVSlot:
    """Per-forward state the processor reads: which layer is next, and where the template K/V of
    that layer come from when the template is not in the sequence (`inject`)."""

    def __init__(self, inject: LazyTemplateLayers | None = None, probe: AttentionProbe | None = None):
        self.layer = 0
        self.inject = inject
        self.probe = probe
        self.captured: list[tuple[torch.Tensor, torch.Tensor]] = []

    def template_kv(self, k_t: torch.Tensor | None, v_t: torch.Tensor | None):
        """-> (key, value, keep) of the template at the next layer: the in-sequence K/V (captured
        here), the injected ones (pulled now: lazily), or (None, None, None) with no template."""
        layer = self.layer
        self.layer += 1
        if k_t is not None:
            self.captured.append((k_t, v_t))
            return k_t, v_t, None
        if self.inject is not None:
            k, v = self.inject.kv(layer)
            return k, v, self.inject.keep(layer)
        return None, None, None


def _heads(attn, x, to_q, to_k, to_v, norm_q, norm_k):
    q = norm_q(to_q(x).unflatten(-1, (-1, attn.head_dim)))
    k = norm_k(to_k(x).unflatten(-1, (-1, attn.head_dim)))
    return q, k, to_v(x).unflatten(-1, (-1, attn.head_dim))


class KontextKVProcessor:
    """Attention of one Flux block with the template as its own stream.

    main queries (text + target + photo) attend to [main keys | template keys]; template queries
    attend to template keys only. The template K/V come from the template stream when it is in
    the sequence (captured into the `KVSlot`) or from the slot's injected source. With no template
    it computes what diffusers' `FluxAttnProcessor` computes, in the same order.
    """

    def _main_with_template(self, q, k, v, slot: KVSlot, k_t, v_t, keep):
        if k_t is None:
            return _attend(q, k, v, None)
        k_all, v_all = torch.cat([k, k_t], 1), torch.cat([v, v_t], 1)
        mask = None
        if keep is not None and not bool(keep.all()):
            mask = torch.cat([torch.ones(k.shape[1], dtype=torch.bool, device=q.device), keep.to(q.device)]).view(1, 1, 1, -1)
        if slot.probe is not None:
            layer = slot.layer - 1
            return _attend_probed(q, k_all, v_all, mask, k.shape[1], k_all.shape[1], lambda p: slot.probe(layer, p))
        return _attend(q, k_all, v_all, mask)

    def _template(self, q_t, k_t, v_t, keep):
        mask = None if keep is None or bool(keep.all()) else keep.view(1, 1, 1, -1).to(q_t.device)
        return _attend(q_t, k_t, v_t, mask)

    @staticmethod
    def _template_qkv(attn, t, rope_t, slot: KVSlot):
        """The template stream's query (None when it is not in the sequence) and the template K/V
        of this layer with their keep mask: computed here and captured, or read from the source."""
        q_t = k_t = v_t = None
        if t is not None:
            q_t, k_t, v_t = _heads(attn, t, attn.to_q, attn.to_k, attn.to_v, attn.norm_q, attn.norm_k)
            q_t = apply_rotary_emb(q_t, rope_t, sequence_dim=1)
            k_t = apply_rotary_emb(k_t, rope_t, sequence_dim=1)
        k_t, v_t, keep = slot.template_kv(k_t, v_t)
        return q_t, k_t, v_t, keep

    def double(self, attn, x, enc, t, rope, rope_t, slot: KVSlot):
        """Double-stream attention. x: (B, Nm, D) normed main image stream or None; enc: (B, Nt, D)
        normed text or None (both None or both given); t: (B, Nr, D) normed template stream or
        None. rope: (cos, sin) over [text | main]; rope_t over the template.
        -> (x_out, enc_out, t_out), each None where its input was."""
        # Adapted from diffusers.models.transformers.transformer_flux.FluxAttnProcessor.__call__
        # (projections, QK-norm, RoPE, the output projections), split into main and template streams.
        q_t, k_t, v_t, keep = self._template_qkv(attn, t, rope_t, slot)
        x_out = enc_out = t_out = None
        if x is not None:
            query, key, value = joint_qkv(attn, x, enc, rope, _get_qkv_projections, apply_rotary_emb)  # shared with Klein
            out = self._main_with_template(query, key, value, slot, k_t, v_t, keep)
            out = out.flatten(2, 3).to(query.dtype)
            enc_out, x_out = out.split_with_sizes([enc.shape[1], out.shape[1] - enc.shape[1]], dim=1)
            x_out = attn.to_out[1](attn.to_out[0](x_out.contiguous()))
            enc_out = attn.to_add_out(enc_out.contiguous())
        if q_t is not None:
            out_t = self._template(q_t, k_t, v_t, keep).flatten(2, 3).to(q_t.dtype)
            t_out = attn.to_out[1](attn.to_out[0](out_t.contiguous()))
        return x_out, enc_out, t_out

    def single(self, attn, x, t, rope, rope_t, slot: KVSlot):
        """Single-stream attention (no output projection: the block applies proj_out). x: (B, Nt+Nm, D)
        normed [text | main] or None; t: (B, Nr, D) normed template or None. -> (x_out, t_out)."""
        # Adapted from diffusers.models.transformers.transformer_flux.FluxAttnProcessor.__call__
        # (the encoder_hidden_states=None path), split into main and template streams.
        q_t, k_t, v_t, keep = self._template_qkv(attn, t, rope_t, slot)
        x_out = t_out = None
        if x is not None:
            query, key, value, _, _, _ = _get_qkv_projections(attn, x, None)
            query = attn.norm_q(query.unflatten(-1, (-1, attn.head_dim)))
            key = attn.norm_k(key.unflatten(-1, (-1, attn.head_dim)))
            value = value.unflatten(-1, (-1, attn.head_dim))
            query = apply_rotary_emb(query, rope, sequence_dim=1)
            key = apply_rotary_emb(key, rope, sequence_dim=1)
            x_out = self._main_with_template(query, key, value, slot, k_t, v_t, keep).flatten(2, 3).to(query.dtype)
        if q_t is not None:
            t_out = self._template(q_t, k_t, v_t, keep).flatten(2, 3).to(q_t.dtype)
        return x_out, t_out


# -- the block loop ---------------------------------------------------------------------------------
def _fp16_clip(h: torch.Tensor) -> torch.Tensor:
    """diffusers' guard after each Flux block: fp16 activations clipped to its finite range."""
    return h.clip(-65504, 65504) if h.dtype == torch.float16 else h


def _double_tail(h, attn_out, gate_msa, shift_mlp, scale_mlp, gate_mlp, norm2, ff):
    # Adapted from diffusers.models.transformers.transformer_flux.FluxTransformerBlock.forward (after attention)
    h = h + gate_msa.unsqueeze(1) * attn_out
    n = norm2(h)
    n = n * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
    return _fp16_clip(h + gate_mlp.unsqueeze(1) * ff(n))


def _double_block(block, proc: KontextKVProcessor, x, enc, t, temb, temb_t, rope, rope_t, slot: KVSlot):
    """`FluxTransformerBlock.forward` with a template stream `t` modulated by `temb_t`."""
    nx = ne = nt = None
    if x is not None:
        nx, gate_msa, shift_mlp, scale_mlp, gate_mlp = block.norm1(x, emb=temb)
        ne, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = block.norm1_context(enc, emb=temb)
    if t is not None:
        nt, t_gate_msa, t_shift_mlp, t_scale_mlp, t_gate_mlp = block.norm1(t, emb=temb_t)
    a_x, a_e, a_t = proc.double(block.attn, nx, ne, nt, rope, rope_t, slot)
    if x is not None:
        x = _double_tail(x, a_x, gate_msa, shift_mlp, scale_mlp, gate_mlp, block.norm2, block.ff)
        # the context stream's tail is the same sequence of operations with its own norm and MLP
        enc = _double_tail(enc, a_e, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp, block.norm2_context,
                           block.ff_context)
    if t is not None:
        t = _double_tail(t, a_t, t_gate_msa, t_shift_mlp, t_scale_mlp, t_gate_mlp, block.norm2, block.ff)
    return x, enc, t


def _single_stream(block, h, attn_out, norm_h, gate):
    # Adapted from diffusers.models.transformers.transformer_flux.FluxSingleTransformerBlock.forward
    mlp = block.act_mlp(block.proj_mlp(norm_h))
    out = torch.cat([attn_out, mlp], dim=2)
    return _fp16_clip(h + gate.unsqueeze(1) * block.proj_out(out))


def _single_block(block, proc: KontextKVProcessor, x, enc, t, temb, temb_t, rope, rope_t, slot: KVSlot):
    """`FluxSingleTransformerBlock.forward` with a template stream `t` modulated by `temb_t`."""
    h = nh = nt = None
    if x is not None:
        n_txt = enc.shape[1]
        h = torch.cat([enc, x], dim=1)
        nh, gate = block.norm(h, emb=temb)
    if t is not None:
        nt, t_gate = block.norm(t, emb=temb_t)
    a_h, a_t = proc.single(block.attn, nh, nt, rope, rope_t, slot)
    if x is not None:
        h = _single_stream(block, h, a_h, nh, gate)
        enc, x = h[:, :n_txt], h[:, n_txt:]
    if t is not None:
        t = _single_stream(block, t, a_t, nt, t_gate)
    return x, enc, t


def _temb(tr: FluxTransformer2DModel, timestep: torch.Tensor, guidance: torch.Tensor | None, pooled: torch.Tensor):
    # Adapted from diffusers.models.transformers.transformer_flux.FluxTransformer2DModel.forward (timestep embedding)
    timestep = timestep.to(pooled.dtype) * 1000
    if guidance is None:
        return tr.time_text_embed(timestep, pooled)
    return tr.time_text_embed(timestep, guidance.to(pooled.dtype) * 1000, pooled)


def kontext_blocks(tr: FluxTransformer2DModel, *, main: torch.Tensor | None, main_ids: torch.Tensor | None,
                   prompt_embeds: torch.Tensor | None, txt_ids: torch.Tensor | None, template: torch.Tensor | None,
                   tmpl_ids: torch.Tensor | None, pooled: torch.Tensor, timestep: torch.Tensor,
                   guidance: torch.Tensor | None, ref_timestep: float, slot: KVSlot,
                   proc: KontextKVProcessor | None = None) -> Iterator[torch.Tensor | None]:
    """Run `tr` block by block; yields None after each block (layer i's template K/V are then in
    `slot.captured[i]` when the template is in the sequence) and finally the main stream's
    prediction (B, main tokens, out_channels) (None without a main stream).

    main: (B, Nm, in_channels) packed [target | photo] latents with ids (Nm, 3); template: (B, Nr,
    in_channels) packed template latents with ids (Nr, 3), or None (its K/V then come from
    `slot.inject`, or there is no template). The main stream is modulated at `timestep`, the
    template stream at `ref_timestep`.
    """
    # Adapted from diffusers.models.transformers.transformer_flux.FluxTransformer2DModel.forward
    # (embeddings, block loop, output head), with the template stream beside the main one.
    proc = proc or KontextKVProcessor()
    x = enc = t = rope = rope_t = temb = temb_t = None
    if main is not None:
        x = tr.x_embedder(main)
        temb = _temb(tr, timestep, guidance, pooled)
        enc = tr.context_embedder(prompt_embeds)
        rope = tr.pos_embed(torch.cat((txt_ids, main_ids), dim=0))
    if template is not None:
        t = tr.x_embedder(template)
        temb_t = _temb(tr, torch.full_like(timestep, ref_timestep), guidance, pooled)
        rope_t = tr.pos_embed(tmpl_ids)
    for block in tr.transformer_blocks:
        x, enc, t = _double_block(block, proc, x, enc, t, temb, temb_t, rope, rope_t, slot)
        yield None
    for block in tr.single_transformer_blocks:
        x, enc, t = _single_block(block, proc, x, enc, t, temb, temb_t, rope, rope_t, slot)
        yield None
    if x is None:
        yield None
        return
    yield tr.proj_out(tr.norm_out(x, temb))


def kontext_forward(tr: FluxTransformer2DModel, **kw) -> torch.Tensor | None:
    """All of `kontext_blocks`: the main stream's prediction."""
    out = None
    for out in kontext_blocks(tr, **kw):
        pass
    return out


# -- the adapter ------------------------------------------------------------------------------------
def parse_kontext_arg(arg: str) -> tuple[str, int]:
    """"/folder" or "/folder@S" -> (folder, image size in px per side)."""
    m = re.fullmatch(r"(.*)@(\d+)", arg)
    return (arg, DEFAULT_IMAGE_SIZE) if m is None else (m.group(1), int(m.group(2)))


def _module_fingerprint(module) -> str:
    """Weights (floating point) and config of a pipeline component (diffusers or transformers)."""
    state = {k: v.detach().float().contiguous() for k, v in module.state_dict().items() if v.is_floating_point()}
    cfg = getattr(module, "config", {})
    cfg = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)  # a transformers config is no Mapping
    return fingerprint_tensors(state, {"config": {k: str(v) for k, v in cfg.items()}})


class KontextImageModel:
    """FLUX.1 Kontext with sakura's image-level model API (`ImageTemplateEditModel`).

    A template is one or more reference images plus a prompt (its "instruction"); the template KV
    depends on the images, the VAE, the prompt's pooled CLIP embedding (it modulates every token),
    the guidance and `ref_timestep`, all of which are in the template fingerprint or the model's.

    Args:
        pipeline: a `FluxKontextPipeline` (VAE, CLIP + T5 text encoders, transformer). Its
            transformer is put in eval mode and otherwise left as it is (no processor installed),
            so the stock pipeline still runs stock Kontext.
        image_size: pixels per side of template, photo and output (a multiple of VAE factor x 2).
        guidance: the distilled guidance scale (Kontext-dev's default 2.5) for transformers with
            guidance embeddings.
        ref_timestep: the timestep template tokens are modulated at (0.0 = a clean image).
        max_sequence_length: T5 prompt tokens; default the pipeline's T5 tokenizer's own maximum,
            at most 512 (FLUX.1 Kontext [dev]: 512; the tiny test pipeline: 32).
    """

    template_conditioning = "prompt"
    max_template_images = 4

    def __init__(self, pipeline: Any, image_size: int = DEFAULT_IMAGE_SIZE, *, guidance: float = 2.5,
                 ref_timestep: float = 0.0, max_sequence_length: int | None = None):
        self.pipeline = pipeline
        self.transformer: FluxTransformer2DModel = pipeline.transformer.eval()
        ppt = int(pipeline.vae_scale_factor) * 2
        if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < ppt or image_size % ppt:
            raise ValueError(f"image size {image_size!r} must be a positive multiple of {ppt} px for this pipeline "
                             f"(VAE factor {pipeline.vae_scale_factor} x 2x2 packing)")
        if max_sequence_length is None:
            tok = getattr(pipeline, "tokenizer_2", None)
            max_sequence_length = min(512, int(getattr(tok, "model_max_length", 512) or 512))
        c = self.transformer.config
        self.cfg = KontextConfig(double_layers=c.num_layers, single_layers=c.num_single_layers,
                                 heads=c.num_attention_heads, head_dim=c.attention_head_dim, in_channels=c.in_channels,
                                 joint_attention_dim=c.joint_attention_dim, image_size=image_size,
                                 pixels_per_token=ppt, text_tokens=max_sequence_length)
        self.guidance = float(guidance)
        self.ref_timestep = float(ref_timestep)
        self.max_sequence_length = max_sequence_length
        self.processor = KontextKVProcessor()
        self._fingerprint: str | None = None
        self._components_fp: str | None = None
        self._prompts: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def from_pretrained(cls, arg: str, **options) -> "KontextImageModel":
        """`arg` = "/folder" or "/folder@S": a local `FluxKontextPipeline` folder (the user's own
        download or `write_tiny_kontext_folder`; never a hub)."""
        device, dtype = options.pop("device", "auto"), options.pop("dtype", "auto")
        dev, dt = resolve(device, dtype)
        if (device, dtype) != ("auto", "auto") and (dev.type, dt) != ("cpu", torch.float32):
            # not yet device-aware (its prompt encoders and sampler run on the CPU): say so, never ignore it
            raise DeviceError(f"kontext runs on the CPU in float32 only for now; got device={device!r}, dtype={dtype!r}")
        folder, size = parse_kontext_arg(arg)
        if not folder or not Path(folder).is_dir():
            raise FileNotFoundError(f"{folder or '(empty)'}: not a local folder with a FLUX.1 Kontext pipeline")
        pipe = FluxKontextPipeline.from_pretrained(folder, local_files_only=True, dtype=torch.float32)
        return cls(pipe, size, **options)

    # -- identity -------------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return self.cfg.depth

    def fingerprint(self) -> str:
        """The transformer's config + weights and the sakura settings the KV depends on."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint_model(self.transformer, {
                **{k: str(v) for k, v in dict(self.transformer.config).items()},
                "sakura": {"kind": MODEL_KIND, "guidance": self.guidance, "ref_timestep": self.ref_timestep}})
        return self._fingerprint

    def _components_fingerprint(self) -> str:
        """The VAE (template latents) and the CLIP text encoder (the pooled embedding that modulates
        the template tokens): the template KV is a function of both."""
        if self._components_fp is None:
            self._components_fp = hashlib.sha256(
                (_module_fingerprint(self.pipeline.vae) + _module_fingerprint(self.pipeline.text_encoder)).encode()
            ).hexdigest()
        return self._components_fp

    @staticmethod
    def _check_prompt(instruction: Any) -> str:
        return check_prompt(instruction, "Kontext")

    def _check_images(self, img: Any, name: str, max_n: int | None = None) -> torch.Tensor:
        return check_images(img, name, size=self.cfg.image_size, max_n=max_n)

    def template_fingerprint(self, template: torch.Tensor, instruction: Any = "") -> str:
        """Pixels of the reference image(s), the prompt, the resolution, the VAE and text encoder."""
        template = self._check_images(template, "template", self.max_template_images)
        prompt = self._check_prompt(instruction)
        return fingerprint_tensors({"template": template.contiguous()},
                                   {"kind": MODEL_KIND, "image_size": self.cfg.image_size,
                                    "prompt_sha256": hashlib.sha256(prompt.encode()).hexdigest(),
                                    "components": self._components_fingerprint()})

    # -- pixels and prompts ---------------------------------------------------------------------
    @torch.no_grad()
    def encode_prompt(self, prompt: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> (T5 embeddings (1, L, joint_attention_dim), pooled CLIP (1, P), text ids (L, 3)), cached."""
        if prompt not in self._prompts:
            emb, pooled, ids = self.pipeline.encode_prompt(prompt=prompt, prompt_2=None, device=torch.device("cpu"),
                                                           max_sequence_length=self.max_sequence_length)
            self._prompts[prompt] = (emb.float(), pooled.float(), ids.float())
        return self._prompts[prompt]

    @torch.no_grad()
    def encode_image(self, image: torch.Tensor) -> torch.Tensor:
        """(1, 3, S, S) in [0, 1] -> packed latents (1, grid*grid, in_channels), as
        `FluxKontextPipeline.prepare_latents` encodes its image (VAE mode, shift and scale, 2x2 packing)."""
        pipe = self.pipeline
        lat = pipe._encode_vae_image(image.float() * 2 - 1, generator=None)        # (1, C, 2g, 2g)
        _, c, h, w = lat.shape
        return pipe._pack_latents(lat, 1, c, h, w)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Packed latents (1, grid*grid, in_channels) -> image (1, 3, S, S) in [0, 1]."""
        pipe = self.pipeline
        s = self.cfg.image_size
        lat = pipe._unpack_latents(latents, s, s, pipe.vae_scale_factor)
        lat = lat / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor
        return (pipe.vae.decode(lat, return_dict=False)[0] / 2 + 0.5).clamp(0, 1)

    def _template_latents(self, template: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lat = torch.cat([self.encode_image(template[r:r + 1]) for r in range(template.shape[0])], 1)
        return lat, template_ids(self.cfg.grid, template.shape[0])

    def _guidance(self) -> torch.Tensor | None:
        return torch.full([1], self.guidance) if self.transformer.config.guidance_embeds else None

    # -- the template KV ------------------------------------------------------------------------
    @torch.no_grad()  # torch sets and restores grad mode around each resume of a generator
    def template_layers(self, template: torch.Tensor, instruction: Any = "") -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Layer i's template (key, value), each (1, R*tokens, H, D), after running blocks 0..i only
        (the template stream alone: it never attends to anything else)."""
        template = self._check_images(template, "template", self.max_template_images)
        _, pooled, _ = self.encode_prompt(self._check_prompt(instruction))
        lat, ids = self._template_latents(template)
        slot = KVSlot()
        blocks = kontext_blocks(self.transformer, main=None, main_ids=None, prompt_embeds=None, txt_ids=None,
                                template=lat, tmpl_ids=ids, pooled=pooled, timestep=torch.zeros(1),
                                guidance=self._guidance(), ref_timestep=self.ref_timestep, slot=slot,
                                proc=self.processor)
        for i in range(self.num_layers):
            next(blocks)
            yield slot.captured[i]

    def template_stream(self, template: torch.Tensor, instruction: Any = "") -> list[tuple[torch.Tensor, torch.Tensor]]:
        return list(self.template_layers(template, instruction))

    def _wrap_kv(self, template: torch.Tensor, prompt: str, pairs) -> TemplateKV:
        layers = [LayerKV(k[0].contiguous(), v[0].contiguous()) for k, v in pairs]
        return TemplateKV(layers, self.fingerprint(), self.template_fingerprint(template, prompt),
                          layout={"kind": MODEL_KIND, "grid": [self.cfg.grid, self.cfg.grid],
                                  "references": int(template.shape[0]), "image_size": self.cfg.image_size,
                                  "instruction": prompt, "prompt_sha256": hashlib.sha256(prompt.encode()).hexdigest(),
                                  "slot_ids": "positions"},
                          positions=template_ids(self.cfg.grid, template.shape[0]))

    @torch.no_grad()
    def extract_template_kv(self, template: torch.Tensor, instruction: Any = "") -> TemplateKV:
        """template: (R, 3, S, S) reference image(s) in [0, 1]; instruction: the prompt."""
        template = self._check_images(template, "template", self.max_template_images)
        prompt = self._check_prompt(instruction)
        return self._wrap_kv(template, prompt, self.template_stream(template, prompt))

    def check_template_kv(self, source: TemplateKVSource) -> None:
        check_source_fits(source, self.fingerprint(), self.num_layers)
        pos = source.positions
        if pos is not None:
            if pos.ndim != 2 or pos.shape[1] != 3 or pos.shape[0] % self.cfg.tokens_per_image:
                raise TemplateKVError(f"template KV positions have shape {tuple(pos.shape)}; expected "
                                      f"(R x {self.cfg.tokens_per_image}, 3) for this resolution")
            if bool((pos[:, 0] < TEMPLATE_SLOT_T).any()):
                raise TemplateKVError("template KV positions use the target's or the photo's RoPE slot")

    # -- sampling -------------------------------------------------------------------------------
    @torch.no_grad()
    def edit(self, photo: torch.Tensor, *, template: torch.Tensor | None = None, instruction: Any = None,
             template_kv: TemplateKVSource | None = None, mode: KVMode | str | None = None, steps: int = 4,
             seed: int = 0, probe: AttentionProbe | None = None) -> EditOutput:
        """Edit `photo` (B, 3, S, S) in [0, 1] with the template: the photo is Kontext's image (slot
        T=1), the template reference(s) sit beside it, the prompt guides; diffusers' flow-matching
        Euler schedule as `FluxKontextPipeline` sets it. One photo at a time, same seed per photo.

        mode: EXTRACT (template in the sequence at step 0, its K/V reused after), NOCACHE (in the
        sequence every step) or INJECTED (`template_kv`, each layer pulled when the forward pass
        reaches it). probe: receives the attention the main queries give the template keys in every
        step where the template is not in the sequence."""
        photo = self._check_images(photo, "photo")
        mode = resolve_kv_mode(mode, template, template_kv, what="template image(s)")
        check_steps(steps)
        if mode is KVMode.INJECTED:
            self.check_template_kv(template_kv)
            prompt = self._check_prompt(template_kv.instruction if instruction is None else instruction)
            source = ReadOnceSource(template_kv)
            pos = template_kv.positions
        else:
            template = self._check_images(template, "template", self.max_template_images)
            prompt = self._check_prompt(instruction)
            t_lat, t_ids = self._template_latents(template)
        prompt_parts = self.encode_prompt(prompt)
        images, captured = [], None
        t0 = time.perf_counter()
        for j in range(photo.shape[0]):
            user = self.encode_image(photo[j:j + 1])
            if mode is KVMode.INJECTED:
                tokens = int(pos.shape[0]) if pos is not None else None
                inject = LazyTemplateLayers.from_source(source, tokens=tokens, heads=self.cfg.heads,
                                                        head_dim=self.cfg.head_dim,
                                                        tokens_from="its positions" if pos is not None else "its layer 0")
                latents, _ = self._sample(user, prompt_parts, steps=steps, seed=seed, inject=inject, probe=probe)
            else:
                latents, pairs = self._sample(user, prompt_parts, steps=steps, seed=seed, template=(t_lat, t_ids),
                                              reuse=mode is KVMode.EXTRACT, probe=probe)
                if captured is None and mode is KVMode.EXTRACT:
                    captured = self._wrap_kv(template, prompt, pairs)
            images.append(self.decode(latents))
        return EditOutput(image=torch.cat(images), template_kv=captured,
                          timings_s={"template": 0.0, "denoise": time.perf_counter() - t0})

    def differentiable_edit(self, photo: torch.Tensor, **kwargs: Any) -> EditOutput:
        """`edit` (same arguments, the same images) with autograd through the denoising and the VAE
        decode, so the build's sensitivity sketch back-propagates into the template KV (its
        `allocation="model"`: a dozen calibration edits where the probes take ~90). `edit` and
        `decode` run undecorated for the call (their ``no_grad`` lifted); the photo's and the
        prompt's encoders keep theirs (nothing upstream of the template KV needs a gradient)."""
        with grad_through(self, ("decode",)):
            return type(self).edit.__wrapped__(self, photo, **kwargs)

    def _sample(self, user: torch.Tensor, prompt_parts, *, steps: int, seed: int,
                template: tuple[torch.Tensor, torch.Tensor] | None = None, reuse: bool = True,
                inject: LazyTemplateLayers | None = None, probe: AttentionProbe | None = None):
        """Denoise one photo: -> (final packed latents (1, grid^2, in_channels), the template K/V
        pairs captured at step 0 or None).

        user: the photo's packed latents (1, grid^2, in_channels); prompt_parts: `encode_prompt`'s.
        template: (latents, ids) run in the sequence, every step or (`reuse`) at step 0 only with
        its captured K/V injected after; inject: the template K/V from a source; neither: stock
        Kontext with no template (`FluxKontextPipeline`'s loop, tested bit-exact against it).
        """
        cfg, g = self.cfg, self.cfg.grid
        n = g * g
        emb, pooled, txt_ids = prompt_parts
        main_ids = torch.cat([image_ids(g, 0), image_ids(g, PHOTO_SLOT_T)])
        # as FluxKontextPipeline.prepare_latents: noise (1, C/4, 2g, 2g), then 2x2-packed
        noise = torch.randn(1, cfg.in_channels // 4, 2 * g, 2 * g, generator=torch.Generator().manual_seed(seed))
        latents = self.pipeline._pack_latents(noise, 1, cfg.in_channels // 4, 2 * g, 2 * g)
        sched = FlowMatchEulerDiscreteScheduler.from_config(self.pipeline.scheduler.config)
        sc = sched.config
        mu = calculate_shift(n, sc.get("base_image_seq_len", 256), sc.get("max_image_seq_len", 4096),
                             sc.get("base_shift", 0.5), sc.get("max_shift", 1.15))
        timesteps, _ = retrieve_timesteps(sched, steps, "cpu", sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
        sched.set_begin_index(0)
        pairs = None
        for t in timesteps:
            timestep = (t.expand(1) / 1000).to(latents.dtype)
            in_seq = template is not None and (pairs is None or not reuse)
            slot = KVSlot(inject=None if in_seq else inject, probe=None if in_seq else probe)
            pred = kontext_forward(self.transformer, main=torch.cat([latents, user], 1), main_ids=main_ids,
                                   prompt_embeds=emb, txt_ids=txt_ids, template=template[0] if in_seq else None,
                                   tmpl_ids=template[1] if in_seq else None, pooled=pooled, timestep=timestep,
                                   guidance=self._guidance(), ref_timestep=self.ref_timestep, slot=slot,
                                   proc=self.processor)
            if in_seq and pairs is None:
                pairs = slot.captured
                if reuse:  # later steps inject what step 0 captured
                    inject = LazyTemplateLayers.from_pairs(pairs)
            latents = sched.step(pred[:, :n], t, latents, return_dict=False)[0]
        return latents, pairs

    def describe(self) -> dict[str, object]:
        cfg = self.cfg
        return {"model": MODEL_KIND, "double_layers": cfg.double_layers, "single_layers": cfg.single_layers,
                "heads": cfg.heads, "head_dim": cfg.head_dim,
                "parameters": sum(p.numel() for p in self.transformer.parameters()),
                "template_kv_values_per_token": 2 * cfg.depth * cfg.hidden, "fingerprint": self.fingerprint()[:16],
                "image_size": cfg.image_size, "template_tokens": cfg.tokens_per_image,
                "template_kv_values": 2 * cfg.tokens_per_image * cfg.hidden * cfg.depth,
                "template_kv_bytes_fp16": 4 * cfg.tokens_per_image * cfg.hidden * cfg.depth,
                "guidance": self.guidance, "ref_timestep": self.ref_timestep, "config": asdict(cfg)}


def load_kontext_spec(arg: str = "", **options) -> KontextImageModel:
    """Model-registry factory of ``kontext:/path/to/local/folder[@SIZE]`` (FLUX.1 Kontext at SIZE px
    per side, default 512: a `KontextImageModel`; options: guidance, ref_timestep, max_sequence_length)."""
    check_kontext_arg(arg)
    return KontextImageModel.from_pretrained(arg, **options)
