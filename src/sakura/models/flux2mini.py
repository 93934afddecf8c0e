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

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.nn as nn
from diffusers.models.transformers.transformer_flux2 import Flux2Transformer2DModel

from .klein import (
    REF_SLOT_SCALE,
    AttentionProbe,
    LazyTemplateLayers,
    SakuraKleinAttnProcessor,
    SakuraKleinSingleAttnProcessor,
    _Slot,
    latent_ids,
    text_ids,
)
from .kv import LayerKV, TemplateKV, TemplateKVError, TemplateKVSource, fingerprint_model, fingerprint_tensors
from .mini import EditOutput, KVMode, patchify, resolve_kv_mode, unpatchify

PHOTO_T = REF_SLOT_SCALE + REF_SLOT_SCALE * 1   # RoPE T coordinate of the photo tokens (20)
TEMPLATE_T = REF_SLOT_SCALE                     # the template is reference slot 0 (T = 10)


@dataclass(frozen=True)
class Flux2MiniConfig:
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

    def __post_init__(self) -> None:
        if self.prediction not in ("x", "v"):
            raise ValueError(f"prediction must be 'x' or 'v', got {self.prediction!r}")
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
        if self.dim % self.heads or (self.dim // self.heads) % 8:
            raise ValueError(f"dim {self.dim} / heads {self.heads} must give a head_dim divisible by 8 (4 RoPE axes)")

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

    @property
    def depth(self) -> int:
        return self.double_layers + self.single_layers

    def transformer_config(self) -> dict:
        return dict(patch_size=1, in_channels=self.patch_dim, out_channels=self.patch_dim,
                    num_layers=self.double_layers, num_single_layers=self.single_layers,
                    attention_head_dim=self.head_dim, num_attention_heads=self.heads,
                    joint_attention_dim=self.text_dim, timestep_guidance_channels=64, mlp_ratio=self.mlp_ratio,
                    axes_dims_rope=(self.head_dim // 4,) * 4, rope_theta=self.rope_theta, guidance_embeds=False)


def install_processors(transformer: Flux2Transformer2DModel) -> None:
    """Put the Klein adapter's KV processors on every attention layer of `transformer`."""
    procs = {name: (SakuraKleinSingleAttnProcessor() if name.startswith("single_transformer_blocks")
                    else SakuraKleinAttnProcessor()) for name in transformer.attn_processors}
    transformer.set_attn_processor(procs)


class Flux2MiniDiT(nn.Module):
    """diffusers' `Flux2Transformer2DModel` + learned instruction prompts, with sakura-mini's API."""

    #: what defines a template's edit besides its image: a task (its instruction id); Klein: a prompt
    template_conditioning = "task"
    #: reference images a template may have
    max_template_images = 1

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
    @property
    def num_layers(self) -> int:
        return self.cfg.depth

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            meta = asdict(self.cfg)
            if not self.cfg.photo_reference:  # fields added later: keep the fingerprints made before
                meta.pop("photo_reference")
                meta.pop("isolate_template")
            self._fingerprint = fingerprint_model(self, {"model": "flux2-mini", **meta})
        return self._fingerprint

    def invalidate_fingerprint(self) -> None:
        self._fingerprint = None

    def template_fingerprint(self, template: torch.Tensor, instruction: int = 0) -> str:
        return fingerprint_tensors({"template": self._check_image(template, "template")[:1].contiguous()},
                                   {"kind": "flux2-mini", "image_size": self.cfg.image_size,
                                    "instruction": int(instruction)})

    def _check_instruction(self, instruction: int) -> int:
        if isinstance(instruction, bool) or not isinstance(instruction, int) or not 0 <= instruction < self.cfg.instructions:
            raise ValueError(f"instruction must be an int in [0, {self.cfg.instructions}), got {instruction!r}")
        return instruction

    def _check_image(self, img: torch.Tensor, name: str) -> torch.Tensor:
        s, c = self.cfg.image_size, self.cfg.channels
        if not isinstance(img, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of shape (B, {c}, {s}, {s}), got {type(img).__name__}")
        if img.ndim == 3:
            img = img[None]
        if img.ndim != 4 or tuple(img.shape[1:]) != (c, s, s):
            raise ValueError(f"{name} has shape {tuple(img.shape)}; expected (B, {c}, {s}, {s})")
        if not bool(torch.isfinite(img).all()):
            raise ValueError(f"{name} contains NaN or inf")
        return img.float()

    # -- forward passes -------------------------------------------------------------------------
    def _prompt(self, instruction: torch.Tensor | int, batch: int) -> torch.Tensor:
        instr = torch.as_tensor(instruction, dtype=torch.long).expand(batch)
        return self.prompts[instr]                                               # (B, text_tokens, text_dim)

    def _run(self, hidden: torch.Tensor, ids: torch.Tensor, prompt: torch.Tensor, t: torch.Tensor, *,
             mode: str, num_ref: int = 0, cache=None, slot: _Slot | None = None) -> torch.Tensor:
        """diffusers' forward; returns the output of the last 64 (target) tokens (B, T, patch_dim)."""
        out = self.transformer(hidden_states=hidden, encoder_hidden_states=prompt, timestep=t, img_ids=ids,
                               txt_ids=self.ids_text, guidance=None, joint_attention_kwargs={"sakura": slot},
                               return_dict=False, kv_cache=cache, kv_cache_mode=mode, num_ref_tokens=num_ref,
                               ref_fixed_timestep=self.cfg.template_timestep)[0]
        return out[:, -self.cfg.tokens_per_image:]

    def _to_velocity(self, out: torch.Tensor, photo: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        out = unpatchify(out, cfg.patch_size, cfg.channels, cfg.image_size)       # (B, 3, S, S)
        if cfg.prediction == "x":
            if cfg.photo_skip:
                out = out + photo
            return (x_t - out) / t.clamp(min=cfg.t_min).view(-1, 1, 1, 1)
        return out

    def _main_tokens(self, photo: torch.Tensor, x_t: torch.Tensor) -> torch.Tensor:
        p = self.cfg.patch_size
        return torch.cat([patchify(photo, p), patchify(x_t, p)], dim=1)          # (B, 2T, patch_dim)

    def velocity_in_sequence(self, template: torch.Tensor, instruction: torch.Tensor | int, photo: torch.Tensor,
                             x_t: torch.Tensor, t: torch.Tensor, slot: _Slot | None = None) -> torch.Tensor:
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
        slot = slot if slot is not None else _Slot(num_template_tokens=n)
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
            slot = _Slot(inject=template, probe=probe)
            out = self._run(self._main_tokens(photo, x_t), self.ids_main, prompt, t, mode="extract",
                            num_ref=cfg.tokens_per_image, slot=slot)
            return self._to_velocity(out, photo, x_t, t)
        cache = template.cache(cfg.double_layers, cfg.single_layers)
        slot = _Slot(inject=template, probe=probe)
        out = self._run(self._main_tokens(photo, x_t), self.ids_main, prompt, t,
                        mode="cached", cache=cache, slot=slot)
        return self._to_velocity(out, photo, x_t, t)

    def velocity(self, photo: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor,
                 kv_for_layer: Callable[[int], tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]],
                 probe: AttentionProbe | None = None, instruction: int = 0) -> torch.Tensor:
        """sakura-mini's signature: kv_for_layer(i) -> (key, value (B, Tt, H, D), keep or None),
        called when the forward pass reaches layer i."""
        lazy = LazyTemplateLayers(kv_for_layer, self.num_layers, batch=photo.shape[0])
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
        tr, cfg = self.transformer, self.cfg
        template = template.float()
        b = template.shape[0]
        hidden = tr.x_embedder(patchify(template, cfg.patch_size))
        prompt = tr.context_embedder(self._prompt(instruction, b))
        t_ref = torch.full((b,), cfg.template_timestep * 1000, dtype=hidden.dtype)
        temb = tr.time_guidance_embed(t_ref, None)
        mod_img = tr.double_stream_modulation_img(temb)
        mod_txt = tr.double_stream_modulation_txt(temb)
        mod_single = tr.single_stream_modulation(temb)
        rope_img, rope_txt = tr.pos_embed(self.ids_template), tr.pos_embed(self.ids_text)
        rope = (torch.cat([rope_txt[0], rope_img[0]]), torch.cat([rope_txt[1], rope_img[1]]))
        n = cfg.tokens_per_image
        slot = _Slot(num_template_tokens=n)
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

    def template_stream(self, template: torch.Tensor, instruction: torch.Tensor | int = 0
                        ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return list(self.template_layers(template, instruction))

    @torch.no_grad()
    def extract_template_kv(self, template: torch.Tensor, instruction: int = 0) -> TemplateKV:
        """A template's KV: template (1, 3, S, S) in [0, 1] plus its fixed instruction id."""
        template = self._check_image(template, "template")[:1]
        instruction = self._check_instruction(instruction)
        return self._wrap_kv(template, instruction, self.template_stream(template, instruction))

    def _wrap_kv(self, template: torch.Tensor, instruction: int, kvs) -> TemplateKV:
        layers = [LayerKV(k[0].contiguous(), v[0].contiguous()) for k, v in kvs]
        return TemplateKV(layers=layers, model_fingerprint=self.fingerprint(),
                          template_fingerprint=self.template_fingerprint(template, instruction),
                          layout={"kind": "flux2-mini", "grid": [self.cfg.grid, self.cfg.grid],
                                  "instruction": instruction, "slot_ids": "positions"},
                          positions=self.ids_template.clone())

    def check_template_kv(self, source: TemplateKVSource) -> None:
        if source.model_fingerprint != self.fingerprint():
            raise TemplateKVError(
                f"template KV was made by model {source.model_fingerprint[:16]}…, this model is "
                f"{self.fingerprint()[:16]}…; refusing to inject it")
        if source.num_layers != self.num_layers:
            raise TemplateKVError(f"template KV has {source.num_layers} layers, the model has {self.num_layers}")
        positions = getattr(source, "positions", None)
        if positions is not None and not torch.equal(positions, self.ids_template):
            raise TemplateKVError("template KV was rotated with other RoPE positions than this model's template slot")

    def _source_instruction(self, source: TemplateKVSource, instruction: int | None) -> int:
        """The instruction (prompt) of an injected template: given, else carried by the source
        (`layout["instruction"]` of a TemplateKV, `.instruction` of a streamed source)."""
        if instruction is None:
            instruction = (getattr(source, "layout", None) or {}).get("instruction")
        if instruction is None:
            instruction = getattr(source, "instruction", None)
        if instruction is None:
            raise ValueError("flux2-mini needs the template's instruction id: pass instruction= or use a KV "
                             "source that carries it (TemplateKV.layout['instruction'] or .instruction)")
        return self._check_instruction(int(instruction))

    # -- sampling -------------------------------------------------------------------------------
    @torch.no_grad()
    def edit(self, photo: torch.Tensor, *, template: torch.Tensor | None = None, instruction: int | None = None,
             template_kv: TemplateKVSource | None = None, mode: KVMode | str | None = None,
             steps: int = 8, seed: int = 0, probe: AttentionProbe | None = None) -> EditOutput:
        """Edit `photo` (B, 3, S, S) in [0, 1]; same contract as `MiniDiT.edit`.

        The template is given as pixels (+ instruction id; NOCACHE / EXTRACT) or as KV (INJECTED;
        the instruction then comes from the source unless given). All modes give bit-identical images.
        """
        photo = self._check_image(photo, "photo")
        b = photo.shape[0]
        mode = resolve_kv_mode(mode, template, template_kv)
        cfg = self.cfg
        if mode is KVMode.INJECTED:
            self.check_template_kv(template_kv)
            instruction = self._source_instruction(template_kv, instruction)
        else:
            template = self._check_image(template, "template")[:1]
            instruction = self._check_instruction(0 if instruction is None else instruction)
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be a positive int, got {steps!r}")

        timings = {"template": 0.0, "denoise": 0.0}
        lazy = None
        if mode is KVMode.INJECTED:
            lazy = LazyTemplateLayers.from_source(template_kv, tokens=cfg.tokens_per_image, heads=cfg.heads,
                                                  head_dim=cfg.head_dim)
        gen = torch.Generator().manual_seed(seed)
        noise = torch.randn(photo.shape, generator=gen)
        ts = torch.linspace(1.0, 0.0, steps + 1)
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
                    slot = _Slot(num_template_tokens=cfg.tokens_per_image)
                    v = self.velocity_in_sequence(template, instruction, photo[j:j + 1], x, t, slot=slot)
                    if captured is None:
                        captured = self._wrap_kv(template, instruction, slot.captured)
                    if mode is KVMode.EXTRACT:
                        lazy = LazyTemplateLayers.from_pairs(slot.captured)
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
        return EditOutput(image=torch.cat(images).clamp(0.0, 1.0),
                          template_kv=captured if mode is KVMode.EXTRACT else None, timings_s=timings)

    def describe(self) -> dict[str, object]:
        cfg = self.cfg
        per_layer = 2 * cfg.tokens_per_image * cfg.dim
        return {
            "model": "flux2-mini",
            **asdict(cfg),
            "architecture": "diffusers Flux2Transformer2DModel",
            "parameters": sum(p.numel() for p in self.parameters()),
            "template_tokens": cfg.tokens_per_image,
            "template_kv_values": per_layer * cfg.depth,
            "template_kv_bytes_fp16": per_layer * cfg.depth * 2,
            "fingerprint": self.fingerprint()[:16],
        }


# ---------------------------------------------------------------------------------------------
# weights on disk

def save_flux2_mini_weights(model: Flux2MiniDiT, path: str | os.PathLike,
                            extra_meta: dict[str, str] | None = None) -> Path:
    """Atomic write of the weights (safetensors) with the config in the metadata."""
    from safetensors.torch import save

    from sakura.fsutil import atomic_write

    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    blob = save(state, metadata={"format": "flux2-mini", "config": json.dumps(asdict(model.cfg)), **(extra_meta or {})})
    return atomic_write(path, blob)


def load_flux2_mini_weights(path: str | os.PathLike) -> Flux2MiniDiT:
    """Build the model from the config in the file and load its weights strictly (in fp32)."""
    from safetensors import safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            state = {k: f.get_tensor(k).float() for k in f.keys()}
    except Exception as e:
        raise ValueError(f"{path}: corrupt or truncated flux2-mini weights ({e})") from e
    if meta.get("format") != "flux2-mini":
        raise ValueError(f"{path}: not a flux2-mini weights file")
    model = Flux2MiniDiT(Flux2MiniConfig(**json.loads(meta["config"])))
    model.load_state_dict(state, strict=True)
    return model.eval()
