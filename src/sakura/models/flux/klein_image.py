"""FLUX.2 Klein at the image level: the same API as sakura-mini and flux2-mini, pixels in, pixels out.

`KleinAdapter` (sakura.models.flux.klein) works on packed latents and prompt embeddings. This wrapper
adds the pipeline's VAE and text encoder around it so that the store, the streaming runtime and
`sakura edit` drive Klein exactly as they drive the bundled models (`ImageTemplateEditModel`'s
image-level calls: `extract_template_kv(image, instruction)`, `template_layers`, `edit(photos,
template_kv=...)`); none of them asks which model it holds.

A template is one or more reference images plus a prompt:
  * the reference images are (R, 3, S, S) pixels, encoded by the VAE into reference slots 0..R-1;
    their K/V (all R references, concatenated in slot order) are the template KV;
  * the prompt is the template's "instruction" (the bundled models' instruction is a task id; a
    Klein template's is its prompt text). The template KV does not depend on it (reference tokens
    never attend to text), but the edit does, so it is part of the template's fingerprint and is
    carried in the KV's `layout["instruction"]` and the manifest's `kv_layout`;
  * the user's photo is the next reference slot (R), as stock Klein passes a user image, with
    sakura's template isolation (`KleinAdapter.isolate_template`).

Resolution: `S = cfg.image_size` pixels per side for templates, photo and output (square; a
model name `klein:/folder@S` picks it, default 512). Shapes come from `KleinConfig`, which the
phone-profile workloads (`sakura.bench.workloads`) use too.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict
from typing import Any, Iterator

import torch

from ..adapter import ReadOnceSource
from .klein import REF_SLOT_SCALE, KleinAdapter, KleinReference, latent_ids
from .klein_config import DEFAULT_IMAGE_SIZE, KLEIN_4B, KLEIN_9B, KleinConfig  # noqa: F401  (re-exported)
from ..spec_checks import check_klein_arg
from ..base import EditOutput, KVMode, check_images, check_prompt, check_steps, grad_through, resolve_kv_mode
from ..kv import LayerKV, TemplateKV, TemplateKVSource, fingerprint_tensors

#: diffusers' Flux2 VAE downsamples 8x (2 ** (len(block_out_channels) - 1) in general) and the
#: pipeline 2x2-patchifies the latents: one token per (vae factor * 2) pixels per side.
PATCHIFY = 2


def parse_klein_name(arg: str) -> tuple[str, int]:
    """"/folder" or "/folder@S" -> (folder, image size)."""
    m = re.fullmatch(r"(.*)@(\d+)", arg)
    if m is None:
        return arg, DEFAULT_IMAGE_SIZE
    return m.group(1), int(m.group(2))


def prompt_fingerprint(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()


class KleinImageModel:
    """FLUX.2 Klein with the bundled models' image-level API (see the module docstring).

    adapter: a `KleinAdapter` loaded with its pipeline (VAE + text encoder); image_size: pixels
    per side, a multiple of the VAE factor x 2.
    """

    #: what defines a template's edit besides its images: a prompt (the bundled models: a task)
    template_conditioning = "prompt"
    #: reference images a template may have (the bundled models: 1). Each adds its tokens to the
    #: template KV and to every forward pass; the phone workloads model up to 3 (style3x1024).
    max_template_images = 4

    def __init__(self, adapter: KleinAdapter, image_size: int = DEFAULT_IMAGE_SIZE):
        pipe = adapter._need_pipeline("the image-level Klein model")
        ppt = int(pipe.vae_scale_factor) * PATCHIFY
        if image_size < ppt or image_size % ppt:
            raise ValueError(f"image size {image_size} must be a positive multiple of {ppt} px for this pipeline "
                             f"(VAE factor {pipe.vae_scale_factor} x 2x2 patchify)")
        self.adapter = adapter
        self.cfg = KleinConfig.from_transformer(adapter.transformer.config, image_size=image_size,
                                                pixels_per_token=ppt, text_tokens=adapter.max_sequence_length)
        self._prompts: dict[str, torch.Tensor] = {}

    @classmethod
    def from_pretrained(cls, arg: str, *, device: Any = "auto", dtype: Any = "auto") -> "KleinImageModel":
        """`arg` = "/folder" or "/folder@S" (a local diffusers Klein KV pipeline folder); `device`
        (auto: cuda, mps, cpu) and `dtype` (auto: bf16 on cuda, fp16 on mps, fp32 on cpu) as in
        `sakura.util.device.resolve`."""
        folder, size = parse_klein_name(arg)
        return cls(KleinAdapter.from_pretrained(folder, device=device, dtype=dtype), size)

    @property
    def device(self) -> torch.device:
        return self.adapter.device

    @property
    def dtype(self) -> torch.dtype:
        return self.adapter.dtype

    # -- identity -------------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return self.adapter.num_layers

    def fingerprint(self) -> str:
        """The transformer's config + weights (the VAE's are in every template fingerprint: the
        template KV is a function of the encoded latents)."""
        return self.adapter.fingerprint()

    def _vae_fingerprint(self) -> str:
        if not hasattr(self, "_vae_fp"):
            vae = self.adapter.pipeline.vae  # its BatchNorm step counter is a 0-d int: weights and statistics only
            state = {k: v.detach().float().cpu().contiguous() for k, v in vae.state_dict().items() if v.is_floating_point()}
            self._vae_fp = fingerprint_tensors(state, {"config": {k: str(v) for k, v in dict(vae.config).items()}})
        return self._vae_fp

    def _check_images(self, img: torch.Tensor, name: str, max_n: int | None = None) -> torch.Tensor:
        return check_images(img, name, size=self.cfg.image_size, max_n=max_n)

    @staticmethod
    def _check_prompt(instruction: Any) -> str:
        return check_prompt(instruction, "Klein")

    def template_fingerprint(self, template: torch.Tensor, instruction: Any = "") -> str:
        """Pixels of the reference image(s), the prompt, the resolution and the VAE."""
        template = self._check_images(template, "template", self.max_template_images)
        prompt = self._check_prompt(instruction)
        return fingerprint_tensors({"template": template.contiguous()},
                                   {"kind": "klein", "image_size": self.cfg.image_size,
                                    "prompt_sha256": prompt_fingerprint(prompt), "vae": self._vae_fingerprint()})

    # -- encoders -------------------------------------------------------------------------------
    def _prompt_embeds(self, prompt: str) -> torch.Tensor:
        if prompt not in self._prompts:
            self._prompts[prompt] = self.adapter.encode_prompt(prompt)
        return self._prompts[prompt]

    def _references(self, template: torch.Tensor) -> KleinReference:
        """(R, 3, S, S) pixels -> one KleinReference over slots 0..R-1 (latents and ids concatenated)."""
        refs = [self.adapter.encode_image(template[r:r + 1], slot=r) for r in range(template.shape[0])]
        return KleinReference(torch.cat([r.latents for r in refs], 1), torch.cat([r.ids for r in refs]))

    # -- the template KV ------------------------------------------------------------------------
    def template_layers(self, template: torch.Tensor, instruction: Any = "") -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Layer i's (key, value) (1, R*tokens, H, D) after running blocks 0..i only."""
        template = self._check_images(template, "template", self.max_template_images)
        yield from self.adapter.template_layers(self._references(template))

    def template_stream(self, template: torch.Tensor, instruction: Any = "") -> list[tuple[torch.Tensor, torch.Tensor]]:
        return list(self.template_layers(template, instruction))

    def _wrap_kv(self, template: torch.Tensor, prompt: str, pairs, ref: KleinReference) -> TemplateKV:
        # each layer leaves the device as it is wrapped (host: the wire's side)
        layers = [LayerKV(k[0].contiguous().cpu(), v[0].contiguous().cpu()) for k, v in pairs]
        return TemplateKV(layers, self.fingerprint(), self.template_fingerprint(template, prompt),
                          layout={"kind": "klein", "grid": [self.cfg.grid, self.cfg.grid],
                                  "references": int(template.shape[0]), "image_size": self.cfg.image_size,
                                  "instruction": prompt, "prompt_sha256": prompt_fingerprint(prompt),
                                  "slot_ids": "positions"},
                          positions=ref.ids.clone())

    @torch.no_grad()
    def extract_template_kv(self, template: torch.Tensor, instruction: Any = "") -> TemplateKV:
        """template: (R, 3, S, S) reference image(s) in [0, 1]; instruction: the prompt."""
        template = self._check_images(template, "template", self.max_template_images)
        prompt = self._check_prompt(instruction)
        ref = self._references(template)
        return self._wrap_kv(template, prompt, self.adapter.template_stream(ref), ref)

    def check_template_kv(self, source: TemplateKVSource) -> None:
        self.adapter.check_template_kv(source)

    # -- sampling -------------------------------------------------------------------------------
    @torch.no_grad()
    def edit(self, photo: torch.Tensor, *, template: torch.Tensor | None = None, instruction: Any = None,
             template_kv: TemplateKVSource | None = None, mode: KVMode | str | None = None, steps: int = 4,
             seed: int = 0, probe: Any = None) -> EditOutput:
        """Edit `photo` (B, 3, S, S) in [0, 1]: the pipeline's VAE encodes it as the reference after
        the template's, the transformer denoises (diffusers' flow-matching Euler schedule), the VAE
        decodes. One photo at a time (as flux2-mini: bit-identical modes); same seed per photo."""
        photo = self._check_images(photo, "photo")
        mode = resolve_kv_mode(mode, template, template_kv, what="template image(s)")
        check_steps(steps)
        ref = None
        if mode is KVMode.INJECTED:
            self.check_template_kv(template_kv)
            prompt = self._check_prompt(template_kv.instruction if instruction is None else instruction)
            grid = self.cfg.grid  # a source without positions: its layer-0 tokens give the reference count

            def positions(first: LayerKV) -> torch.Tensor:
                refs = max(1, first.num_tokens // (grid * grid))
                return torch.cat([latent_ids(grid, grid, t=REF_SLOT_SCALE + REF_SLOT_SCALE * r) for r in range(refs)])

            template_kv = ReadOnceSource(template_kv, positions)
            n_refs = int(template_kv.positions[:, 0].max()) // REF_SLOT_SCALE
        else:
            template = self._check_images(template, "template", self.max_template_images)
            prompt = self._check_prompt(instruction)
            ref = self._references(template)
            n_refs = template.shape[0]
        emb = self._prompt_embeds(prompt)
        g = self.cfg.grid
        images, captured = [], None
        timings = {"template": 0.0, "denoise": 0.0}
        for j in range(photo.shape[0]):
            user = self.adapter.encode_image(photo[j:j + 1], slot=n_refs)
            out = self.adapter.edit(user, template=ref, template_kv=template_kv, mode=mode, steps=steps, seed=seed,
                                    prompt_embeds=emb, grid=(g, g), probe=probe)
            if captured is None and out.template_kv is not None:
                captured = self._wrap_kv(template, prompt, [(l.key[None], l.value[None]) for l in out.template_kv.layers],
                                         ref)
            for k, v in out.timings_s.items():
                timings[k] = timings.get(k, 0.0) + v
            images.append(self.adapter.decode(out.latents, (g, g)))
        return EditOutput(image=torch.cat(images), template_kv=captured, timings_s=timings)

    def differentiable_edit(self, photo: torch.Tensor, **kwargs: Any) -> EditOutput:
        """`edit` (same arguments, the same images) with autograd through the denoising and the VAE
        decode: the build's sensitivity sketch back-propagates into the template KV (issue 41).
        The adapter's `edit` / `decode` run undecorated for the call (their ``no_grad`` lifted)."""
        with grad_through(self.adapter, ("edit", "decode")):
            return type(self).edit.__wrapped__(self, photo, **kwargs)

    def describe(self) -> dict[str, object]:
        d = self.adapter.describe()
        cfg = self.cfg
        return {**d, "image_size": cfg.image_size, "template_tokens": cfg.tokens_per_image,
                "template_kv_values": 2 * cfg.tokens_per_image * cfg.hidden * cfg.depth,
                "template_kv_bytes_fp16": 4 * cfg.tokens_per_image * cfg.hidden * cfg.depth,
                "config": asdict(cfg)}


def load_klein_spec(arg: str = "", **options) -> KleinImageModel:
    """Model-registry factory of ``klein:/path/to/local/folder[@SIZE]`` (FLUX.2 Klein at SIZE px per
    side, default 512: a `KleinImageModel`, whose ``.adapter`` is the packed-latent `KleinAdapter`)."""
    check_klein_arg(arg)
    return KleinImageModel.from_pretrained(arg, **options)
