"""A complete sakura model plugin: an adapter for a stock diffusers `FluxTransformer2DModel`
(docs/your-own-model.md walks through it; tests/sakura/models/test_own_model_plugin.py runs it).

The model is a Flux transformer working on pixels directly (2x2 patches, no VAE) with a toy prompt
encoder, small enough to train or test on a laptop; what makes it a sakura model is the ~10 calls
of `sakura.models.ImageTemplateEditModel`. The template stream and the per-layer K/V capture and
injection come from sakura's Flux-family block loop (`sakura.models.flux.kontext_blocks`), which
runs any `FluxTransformer2DModel` without modifying it. Every sakura name it uses is public and
stable: `sakura.models.adapter` and `sakura.models.flux` (docs/api.md).

Use it in-process:

    import sakura.models
    sakura.models.register_model("pixel-flux", load)
    model = sakura.models.load_model("pixel-flux:/path/to/transformer-folder@32")

or ship it as a package whose pyproject.toml declares the factory in sakura's entry-point group,
and every sakura command (`sakura build --model pixel-flux:/folder`, `sakura edit ...`) finds it:

    [project.entry-points."sakura.models"]
    pixel-flux = "my_sakura_plugin:load"
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from diffusers import FluxTransformer2DModel

# sakura's public adapter contract (docs/api.md, "Stability"): nothing else of sakura is imported
from sakura.models.adapter import (EditOutput, KVMode, LayerKV, LazyTemplateLayers, TemplateKV, TemplateKVSource,
                                   check_images, check_prompt, check_source_fits, check_steps, fingerprint_model,
                                   fingerprint_tensors, patchify, resolve_device, resolve_kv_mode, unpatchify)
from sakura.models.flux import KVSlot, image_ids, kontext_blocks, kontext_forward

PATCH = 2          # pixels per token side: a token is a 2x2x3 pixel patch (in_channels = 12)
TEXT_TOKENS = 4    # the toy prompt encoder's tokens


@dataclass(frozen=True)
class PixelFluxConfig:
    """What sakura reads off `model.cfg` (`ImageModelConfig`): sizes and shapes of the template KV."""

    image_size: int
    heads: int
    head_dim: int
    depth: int

    @property
    def grid(self) -> int:
        return self.image_size // PATCH

    @property
    def tokens_per_image(self) -> int:
        return self.grid * self.grid


class PixelFlux:
    """`ImageTemplateEditModel` over a stock `FluxTransformer2DModel` (in_channels = 12).

    Sequence of one forward: [prompt | target (T=0) | photo (T=1) | template (T=2)]; the template
    tokens attend only to themselves and are modulated at timestep 0, so their K/V per layer are a
    function of the template alone (sakura stores and streams them).
    """

    template_conditioning = "prompt"   # a template = image + prompt (the bundled models: image + task id)
    max_template_images = 1

    def __init__(self, transformer: FluxTransformer2DModel, image_size: int = 32, *, device="auto", dtype="auto"):
        c = transformer.config
        if c.in_channels != 3 * PATCH * PATCH or image_size % PATCH:
            raise ValueError(f"PixelFlux needs in_channels = 12 and an even image size, got {c.in_channels}, {image_size}")
        self.device, self.dtype = resolve_device(device, dtype)  # "auto" -> cuda/mps/cpu, bf16/fp16/fp32
        self.cfg = PixelFluxConfig(image_size, c.num_attention_heads, c.attention_head_dim,
                                   c.num_layers + c.num_single_layers)
        # the identity of the weights as saved, before any cast: a store built in fp32 on one machine
        # serves an edit in bf16 on another
        self._fingerprint = fingerprint_model(transformer, {"kind": "pixel-flux", **asdict(self.cfg)})
        self.transformer = transformer.eval().to(self.device, self.dtype)

    # 1. identity: what a stored KV is checked against -----------------------------------------
    @property
    def num_layers(self) -> int:
        return self.cfg.depth

    def fingerprint(self) -> str:
        """sha256 of config + weights, stamped on every template KV (a KV of other weights is refused)."""
        return self._fingerprint

    def template_fingerprint(self, template: torch.Tensor, instruction: Any = "") -> str:
        """sha256 of everything the template KV depends on besides the model: pixels and prompt."""
        return fingerprint_tensors({"template": self._image(template, "template").contiguous()},
                                   {"kind": "pixel-flux", "prompt": self._prompt_text(instruction)})

    # 2. encode: pixels and prompts as the transformer consumes them ----------------------------
    def _image(self, img: Any, name: str) -> torch.Tensor:
        return check_images(img, name, size=self.cfg.image_size, max_n=None if name == "photo" else 1)

    @staticmethod
    def _prompt_text(instruction: Any) -> str:
        return check_prompt(instruction, "pixel-flux")   # "" for no instruction; a ValueError for a non-string

    def _prompt(self, prompt: str):
        """A toy prompt encoder (a real plugin runs its text encoder here): embeddings seeded by the
        prompt's hash -> (embeds (1, 4, joint_dim), pooled (1, pooled_dim), text ids (4, 3))."""
        c = self.transformer.config
        g = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:8], "little"))
        on = dict(device=self.device, dtype=self.dtype)  # drawn on the CPU (the same on every device), then moved
        return (torch.randn(1, TEXT_TOKENS, c.joint_attention_dim, generator=g).to(**on),
                torch.randn(1, c.pooled_projection_dim, generator=g).to(**on), torch.zeros(TEXT_TOKENS, 3, device=self.device))

    def _tokens(self, img: torch.Tensor) -> torch.Tensor:
        return patchify(img.to(self.device, self.dtype) * 2 - 1, PATCH)  # (1, grid^2, 12) in [-1, 1]

    # 3. capture: the template's K/V per layer, lazily -------------------------------------------
    @torch.no_grad()
    def template_layers(self, template: torch.Tensor, instruction: Any = "") -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yields layer i's (key, value), each (1, tokens, heads, head_dim), after running blocks
        0..i only: the phone computes a prefix of layers itself when the link is slow."""
        template = self._image(template, "template")
        _, pooled, _ = self._prompt(self._prompt_text(instruction))
        slot = KVSlot()                                    # captures the template stream's K/V
        blocks = kontext_blocks(self.transformer, main=None, main_ids=None, prompt_embeds=None, txt_ids=None,
                                template=self._tokens(template), tmpl_ids=image_ids(self.cfg.grid, 2).to(self.device),
                                pooled=pooled, timestep=torch.zeros(1, device=self.device), guidance=None,
                                ref_timestep=0.0, slot=slot)
        for i in range(self.num_layers):
            next(blocks)
            yield slot.captured[i]

    def template_stream(self, template: torch.Tensor, instruction: Any = "") -> list[tuple[torch.Tensor, torch.Tensor]]:
        return list(self.template_layers(template, instruction))

    def _wrap(self, template, prompt, pairs) -> TemplateKV:
        return TemplateKV([LayerKV(k[0].contiguous().cpu(), v[0].contiguous().cpu()) for k, v in pairs], self.fingerprint(),
                          self.template_fingerprint(template, prompt),
                          layout={"kind": "pixel-flux", "grid": [self.cfg.grid] * 2, "instruction": prompt},
                          positions=image_ids(self.cfg.grid, 2))

    @torch.no_grad()
    def extract_template_kv(self, template: torch.Tensor, instruction: Any = "") -> TemplateKV:
        """What the build stores: every layer's K/V, the fingerprints and the prompt."""
        prompt = self._prompt_text(instruction)
        return self._wrap(template, prompt, self.template_stream(template, prompt))

    def check_template_kv(self, source: TemplateKVSource) -> None:
        check_source_fits(source, self.fingerprint(), self.num_layers)

    # 4. inject: the edit, with the template in the sequence or its K/V from a source -------------
    @torch.no_grad()
    def edit(self, photo: torch.Tensor, *, template: torch.Tensor | None = None, instruction: Any = None,
             template_kv: TemplateKVSource | None = None, mode: KVMode | str | None = None, steps: int = 4,
             seed: int = 0, probe: Any = None) -> EditOutput:
        """Rectified-flow Euler sampling of the edited photo (B, 3, S, S) in [0, 1]. With
        `template_kv`, layer i is read from the source when the forward pass reaches layer i (a
        streaming source blocks there until that layer has arrived)."""
        photo = self._image(photo, "photo")
        mode = resolve_kv_mode(mode, template, template_kv)
        check_steps(steps)
        if mode is KVMode.INJECTED:
            self.check_template_kv(template_kv)
            prompt = self._prompt_text(template_kv.instruction if instruction is None else instruction)
            # each layer read once (a streamed source's layer(i) is a one-shot request), kept for later steps
            injected = LazyTemplateLayers.from_source(template_kv, tokens=self.cfg.tokens_per_image,
                                                      heads=self.cfg.heads, head_dim=self.cfg.head_dim,
                                                      device=self.device, dtype=self.dtype)  # cast on arrival
        else:
            template, prompt = self._image(template, "template"), self._prompt_text(instruction)
        emb, pooled, txt_ids = self._prompt(prompt)
        g, n = self.cfg.grid, self.cfg.tokens_per_image
        main_ids = torch.cat([image_ids(g, 0), image_ids(g, 1)]).to(self.device)
        out, captured, t_start = [], None, time.perf_counter()
        for j in range(photo.shape[0]):
            x = torch.randn(1, n, 3 * PATCH * PATCH, generator=torch.Generator().manual_seed(seed)).to(self.device, self.dtype)
            inject = injected if mode is KVMode.INJECTED else None
            ts = torch.linspace(1.0, 0.0, steps + 1, device=self.device)
            for i in range(steps):
                in_seq = mode is KVMode.NOCACHE or (mode is KVMode.EXTRACT and inject is None)
                slot = KVSlot(inject=None if in_seq else inject, probe=None if in_seq else probe)
                v = kontext_forward(self.transformer, main=torch.cat([x, self._tokens(photo[j:j + 1])], 1),
                                    main_ids=main_ids, prompt_embeds=emb, txt_ids=txt_ids,
                                    template=self._tokens(template) if in_seq else None,
                                    tmpl_ids=image_ids(g, 2).to(self.device) if in_seq else None, pooled=pooled,
                                    timestep=ts[i:i + 1], guidance=None, ref_timestep=0.0, slot=slot)[:, :n]
                if in_seq and mode is KVMode.EXTRACT:      # step 0 captured the K/V: reuse them after
                    inject = LazyTemplateLayers.from_pairs(slot.captured, device=self.device, dtype=self.dtype)
                    captured = captured or self._wrap(template, prompt, slot.captured)
                x = x + (ts[i + 1] - ts[i]) * v                # Euler step of dx/dt = v (noise at t = 1)
            out.append(((unpatchify(x.float().cpu(), PATCH, 3, self.cfg.image_size) + 1) / 2).clamp(0, 1))
        return EditOutput(torch.cat(out), captured, {"denoise": time.perf_counter() - t_start})

    # 5. describe: for `sakura info`, manifests and the benchmarks ------------------------------
    def describe(self) -> dict[str, object]:
        c = self.cfg
        return {"model": "pixel-flux", "image_size": c.image_size, "layers": c.depth, "heads": c.heads,
                "head_dim": c.head_dim, "template_tokens": c.tokens_per_image,
                "template_kv_bytes_fp16": 4 * c.tokens_per_image * c.heads * c.head_dim * c.depth,
                "parameters": sum(p.numel() for p in self.transformer.parameters()),
                "fingerprint": self.fingerprint()[:16]}


def load(arg: str = "", *, device="auto", dtype="auto") -> PixelFlux:
    """The plugin's factory: ``pixel-flux:/folder[@S]`` (a `FluxTransformer2DModel.save_pretrained`
    folder, S px per side, default 32). sakura passes ``device=`` / ``dtype=`` from ``--device`` /
    ``--dtype`` (or the Python API); a name that does not exist here is a one-line `DeviceError`.
    Errors are one line: a ValueError or FileNotFoundError."""
    m = re.fullmatch(r"(.*?)(?:@(\d+))?", arg)
    folder, size = m.group(1), int(m.group(2) or 32)
    if not folder or not Path(folder).is_dir():
        raise FileNotFoundError(f"pixel-flux needs a transformer folder: pixel-flux:/folder[@S], got {arg!r}")
    return PixelFlux(FluxTransformer2DModel.from_pretrained(folder, local_files_only=True), size, device=device,
                     dtype=dtype)


def write_tiny_transformer(folder: str | Path) -> Path:
    """A tiny random pixel-space Flux transformer (1 double + 1 single block), for trying the plugin."""
    torch.manual_seed(0)
    tr = FluxTransformer2DModel(in_channels=12, num_layers=1, num_single_layers=1, attention_head_dim=16,
                                num_attention_heads=2, joint_attention_dim=16, pooled_projection_dim=16,
                                axes_dims_rope=(4, 6, 6))
    with torch.no_grad():  # zero-initialised gates make a fresh Flux block the identity: make every path matter
        for p in tr.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    tr.save_pretrained(folder)
    return Path(folder)
