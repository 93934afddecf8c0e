"""sakura-mini: a small single-stream joint-attention DiT for template-defined image edits.

Readable top to bottom. The sequence is

    [ template tokens | photo tokens | noisy target tokens ]

with the attention structure of FLUX.2 Klein KV:
  * template tokens are modulated at a fixed timestep (`MiniConfig.template_timestep`) and attend
    only to template tokens, so their per-layer K/V are a pure function of (weights, template):
    independent of the photo, the step and the seed. That is the *template KV*;
  * photo and target tokens are modulated at the current timestep and attend to everything.

To make "template computed in the sequence" and "template KV injected" give bit-identical
results, the template tokens run as their own stream (`tmpl`) beside the photo+target stream
(`main`) — every matmul on the main stream sees exactly the same operands in both cases. The
blocks are written once and run in three modes:

  NOCACHE   template stream recomputed at every denoising step (fully on-device, no reuse)
  EXTRACT   template stream run at the first step only, its K/V kept for later steps (Klein-style)
  INJECTED  template stream never run: K/V come from a `TemplateKVSource` (cloud cache, codec)

Images are float tensors in [0, 1] of shape (B, 3, H, W). Rectified flow: x_t = (1 - t) x_0 + t ε,
the network predicts v = ε - x_0, the Euler sampler integrates t from 1 to 0.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import (  # noqa: F401  (EditOutput, patchify, unpatchify, resolve_kv_mode: re-exported)
    BundledImageModel,
    EditOutput,
    KVMode,
    PatchGridConfig,
    check_steps,
    patchify,
    resolve_kv_mode,
    unpatchify,
)
from .kv import TemplateKV, TemplateKVSource


@dataclass(frozen=True)
class MiniConfig(PatchGridConfig):
    # Defaults = the bundled model (see docs/model-card.md for the CPU-throughput trade-off).
    image_size: int = 64          # pixels per side of template, photo and output
    patch_size: int = 8           # pixels per token side -> (image_size / patch_size)^2 tokens per image
    channels: int = 3
    dim: int = 128                # hidden width
    depth: int = 6                # transformer blocks = attention layers holding template KV
    heads: int = 4
    mlp_ratio: float = 4.0
    template_timestep: float = 0.0  # fixed modulation timestep of template tokens (Klein uses 0)
    instructions: int = 4         # fixed per-template instructions (0 = none), added to template tokens
    rope_theta: float = 100.0
    # What the network's output head predicts. "x": the clean edit x_0, turned into the velocity
    # v = (x_t - x_0) / max(t, t_min) (as in JiT, "Back to Basics", 2025). With 8x8 pixel patches
    # (192 values per token) a v-head would have to carry the full-rank noise through a narrower
    # residual stream; an image-valued head does not. "v": predict v directly.
    prediction: str = "x"
    t_min: float = 0.05
    # x-prediction only: the head predicts the edit as a residual over the user photo,
    # x_0 = photo + head(...), so an untrained model starts at the identity edit and learns the change.
    photo_skip: bool = True

    def __post_init__(self) -> None:
        self._check_shapes()  # head_dim divisible by 4: 2-D RoPE (rows, columns)


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------

def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of t in [0, 1]: (B,) -> (B, dim)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10_000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = (t.float() * 1000.0)[:, None] * freqs[None]   # (B, half)
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def rope_2d(grid: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (grid*grid, head_dim/2): half the pairs rotate with the row, half with the column."""
    quarter = head_dim // 4
    freqs = 1.0 / theta ** (torch.arange(quarter, dtype=torch.float32) / quarter)   # (D/4,)
    ys, xs = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
    ang = torch.cat([ys.reshape(-1, 1) * freqs, xs.reshape(-1, 1) * freqs], dim=-1)  # (T, D/2)
    return torch.cos(ang), torch.sin(ang)


def rope_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`rope_2d`'s (T, D/2) cos, sin as the (T, D) tables `apply_rope` takes: each pair's cos twice,
    its sin as (-sin, +sin)."""
    return cos.repeat_interleave(2, dim=-1), torch.stack([-sin, sin], dim=-1).flatten(-2)


def apply_rope(x: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive pairs (x1, x2) of the last dim to (x1 c - x2 s, x2 c + x1 s).
    x: (B, T, H, D); cos2/sin2: (T, D) from `rope_tables`.

    As x * cos2 + swap(x) * sin2 (swap exchanges each pair): two products and one sum per output,
    as the pairwise form, so bit for bit the same, in three kernels and a copy instead of six and
    a stack (half the time on sakura-mini's shapes: RoPE was a tenth of a build's probe)."""
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return x * cos2[None, :, None, :] + swapped * sin2[None, :, None, :]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN: x (B, T, C), shift/scale (B, 1, C)."""
    return x * (1 + scale) + shift


# A probe receives, per layer, the attention probabilities that main-stream queries give the
# template keys: (B, heads, main_tokens, template_tokens). Used to score token importance.
AttentionProbe = Callable[[int, torch.Tensor], None]


class Block(nn.Module):
    """Pre-norm transformer block with adaLN-Zero modulation and QK-normed, 2-D-RoPE attention."""

    def __init__(self, cfg: MiniConfig):
        super().__init__()
        self.heads, self.head_dim = cfg.heads, cfg.head_dim
        self.norm1 = nn.LayerNorm(cfg.dim, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.q_norm = RMSNorm(cfg.head_dim)
        self.k_norm = RMSNorm(cfg.head_dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.norm2 = nn.LayerNorm(cfg.dim, elementwise_affine=False, eps=1e-6)
        hidden = int(cfg.dim * cfg.mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(cfg.dim, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, cfg.dim))
        self.ada = nn.Linear(cfg.dim, 6 * cfg.dim)       # shift1, scale1, gate1, shift2, scale2, gate2
        nn.init.zeros_(self.ada.weight)
        nn.init.zeros_(self.ada.bias)

    def _qkv(self, x: torch.Tensor, mod: list[torch.Tensor], rope: tuple[torch.Tensor, torch.Tensor]):
        b, t, _ = x.shape
        h = modulate(self.norm1(x), mod[0], mod[1])
        q, k, v = self.qkv(h).reshape(b, t, 3, self.heads, self.head_dim).unbind(2)   # (B, T, H, D) each
        q, k = apply_rope(self.q_norm(q), *rope), apply_rope(self.k_norm(k), *rope)
        return q, k, v

    def _finish(self, x: torch.Tensor, attn: torch.Tensor, mod: list[torch.Tensor]) -> torch.Tensor:
        b, t = x.shape[:2]
        x = x + mod[2] * self.proj(attn.reshape(b, t, -1))
        return x + mod[5] * self.mlp(modulate(self.norm2(x), mod[3], mod[4]))

    def template_forward(self, x_t: torch.Tensor, temb_t: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Template stream: template tokens attend to template tokens only.

        x_t: (B, Tt, C). Returns the new x_t and this layer's template key, value (B, Tt, H, D).
        """
        mod = self.modulation(temb_t)
        q, k, v = self._qkv(x_t, mod, rope)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self._finish(x_t, attn.transpose(1, 2), mod), k, v

    def modulation(self, temb: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """adaLN's six (B, 1, C) shift/scale/gate vectors from the timestep embedding (B, C)."""
        return self.ada(temb)[:, None].chunk(6, dim=-1)

    def main_forward(self, x_m: torch.Tensor, temb: torch.Tensor | tuple, rope, k_t: torch.Tensor, v_t: torch.Tensor,
                     keep: torch.Tensor | None, probe: Callable[[torch.Tensor], None] | None,
                     rows_from: int = 0) -> torch.Tensor:
        """Photo + target stream: attends to [template K/V | own K/V].

        x_m: (B, Tm, C); temb: (B, C), or this block's `modulation(temb)` when the caller has it;
        k_t, v_t: (B, Tt, H, D); keep: (Tt,) bool or None (False = masked out).
        rows_from: return only rows rows_from.. (B, Tm - rows_from, C): every token's K/V is still
        attended to, but only those rows' queries, projection and MLP run (the last block, whose
        photo rows nothing reads). Each row computes exactly as in the whole block.
        """
        mod = self.modulation(temb) if torch.is_tensor(temb) else temb
        q, k, v = self._qkv(x_m, mod, rope)
        tt = k_t.shape[1]
        if rows_from:
            q, x_m = q[:, rows_from:], x_m[:, rows_from:]
        q = q.transpose(1, 2)                                            # (B, H, Tm, D)
        k = torch.cat([k_t, k], dim=1).transpose(1, 2)                   # (B, H, Tt+Tm, D)
        v = torch.cat([v_t, v], dim=1).transpose(1, 2)
        mask = None
        if keep is not None:
            mask = torch.cat([keep, keep.new_ones(k.shape[2] - tt)]).view(1, 1, 1, -1)  # (1, 1, 1, Tt+Tm) bool
        if probe is None:
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            logits = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)   # (B, H, Tm, Tt+Tm)
            if mask is not None:
                logits = logits.masked_fill(~mask, float("-inf"))
            p = logits.softmax(-1)
            probe(p[..., :tt])
            attn = p @ v
        return self._finish(x_m, attn.transpose(1, 2), mod)


@dataclass(frozen=True)
class FirstStepPrefix:
    """`MiniDiT.first_step_prefix`: one edit's setting (photo, noise, timesteps, the template KV
    as attention reads it, each step's modulation) and the first step's main stream entering each
    block."""

    photo: torch.Tensor                                                     # (B, 3, S, S), model device/dtype
    noise: torch.Tensor                                                     # (B, 3, S, S): x at t = 1
    timesteps: torch.Tensor                                                 # (steps + 1,)
    resident: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]  # per layer (K, V, keep)
    streams: list[torch.Tensor]                                             # per layer (B, 2T, C)
    conditioning: list[tuple]                                               # per step `MiniDiT.conditioning`


class MiniDiT(BundledImageModel, nn.Module):
    """sakura-mini (see the module docstring); the image-level API is `BundledImageModel`'s."""

    kind = "sakura-mini"

    def __init__(self, cfg: MiniConfig = MiniConfig()):
        super().__init__()
        self.cfg = cfg
        c = cfg.dim
        self.embed = nn.Linear(cfg.patch_dim, c)
        # Which image a token comes from: 0 template, 1 photo, 2 target.
        self.segment = nn.Parameter(torch.zeros(3, c))
        nn.init.normal_(self.segment, std=0.02)
        # A template may carry a fixed instruction (which edit it defines); part of the template.
        self.instruction = nn.Parameter(torch.zeros(cfg.instructions, c))
        nn.init.normal_(self.instruction, std=0.02)
        self.time_mlp = nn.Sequential(nn.Linear(c, c), nn.SiLU(), nn.Linear(c, c))
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.depth)])
        self.norm_out = nn.LayerNorm(c, elementwise_affine=False, eps=1e-6)
        self.ada_out = nn.Linear(c, 2 * c)
        self.out = nn.Linear(c, cfg.patch_dim)
        nn.init.zeros_(self.ada_out.weight)
        nn.init.zeros_(self.ada_out.bias)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)
        cos, sin = rope_tables(*rope_2d(cfg.grid, cfg.head_dim, cfg.rope_theta))  # (T, D) each
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self._fingerprint: str | None = None

    # -- streams --------------------------------------------------------------------------------
    def _temb(self, t: torch.Tensor) -> torch.Tensor:
        return self.time_mlp(timestep_embedding(t, self.cfg.dim).to(self.embed.weight.dtype))

    def conditioning(self, t: torch.Tensor) -> tuple:
        """What the main stream's modulation takes from the timestep t (B,): (temb (B, C), each
        block's `modulation`, the output head's (shift, scale))."""
        temb = self._temb(t)
        return temb, [b.modulation(temb) for b in self.blocks], tuple(self.ada_out(temb)[:, None].chunk(2, dim=-1))

    def _rope(self):
        return self.rope_cos, self.rope_sin

    def template_layers(self, template: torch.Tensor, instruction: torch.Tensor | int = 0
                        ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Lazily run the template tokens block by block: yields layer i's (key, value), each
        (B, Tt, H, D), after computing block i only. A runtime that computes a prefix of the
        layers on the device and fetches the rest stops iterating early.

        template: (B, 3, H, W); instruction: int or (B,) long, the template's fixed instruction id.
        """
        cfg = self.cfg
        dev, dt = self.device, self.dtype
        instr = torch.as_tensor(instruction, dtype=torch.long).to(dev).expand(template.shape[0])
        x = self.embed(patchify(template.to(dev, dt), cfg.patch_size)) + self.segment[0] + self.instruction[instr][:, None]
        temb = self._temb(torch.full((template.shape[0],), cfg.template_timestep, device=dev))
        for block in self.blocks:
            x, k, v = block.template_forward(x, temb, self._rope())
            yield k, v

    def velocity(self, photo: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor,
                 kv_for_layer: Callable[[int], tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]],
                 probe: AttentionProbe | None = None, *, first_layer: int = 0,
                 stream: torch.Tensor | None = None, record: list[torch.Tensor] | None = None,
                 conditioning: tuple | None = None) -> torch.Tensor:
        """Predict v = ε - x_0 for the target. photo, x_t: (B, 3, H, W); t: (B,) in [0, 1].

        kv_for_layer(i) returns layer i's template (key, value) of shape (B, Tt, H, D) and an
        optional keep mask (Tt,). It is called exactly when the forward pass reaches layer i,
        which is what lets a streaming runtime overlap fetching with compute.

        record: appended with the main stream entering each block, (B, 2T, C) per layer.
        first_layer, stream: start at block `first_layer` from `stream` (what `record` gave
        there for the same photo, x_t, t and template KV below that layer): blocks below it are
        not run (`FirstStepPrefix`). The result is bit for bit that of the whole pass.
        conditioning: `conditioning(t)` when the caller has it (it depends on t only: the build's
        probes reuse one per step).
        """
        cfg = self.cfg
        n = cfg.tokens_per_image
        if stream is None:
            tp = patchify(photo, cfg.patch_size)
            tx = patchify(x_t, cfg.patch_size)
            stream = torch.cat([self.embed(tp) + self.segment[1], self.embed(tx) + self.segment[2]], dim=1)  # (B, 2T, C)
        x = stream
        temb, mods, out_mod = conditioning if conditioning is not None else self.conditioning(t)
        cos, sin = self._rope()
        rope = (torch.cat([cos, cos]), torch.cat([sin, sin]))  # photo and target share the grid positions
        last = len(self.blocks) - 1
        for i in range(first_layer, last + 1):
            if record is not None:
                record.append(x)
            k_t, v_t, keep = kv_for_layer(i)
            layer_probe = (lambda p, i=i: probe(i, p)) if probe is not None else None
            # the head reads the target rows only: the last block computes no photo rows past
            # attention (~7 % of a pass; bit for bit the same). An attention probe sees every row.
            rows_from = n if i == last and probe is None else 0
            x = self.blocks[i].main_forward(x, mods[i], rope, k_t, v_t, keep, layer_probe, rows_from)
        shift, scale = out_mod
        x = self.out(modulate(self.norm_out(x if x.shape[1] == n else x[:, n:]), shift, scale))  # (B, T, patch_dim)
        return self._to_velocity(x, photo, x_t, t)

    # -- sampling -------------------------------------------------------------------------------
    def differentiable_edit(self, photo: torch.Tensor, *, template: torch.Tensor | None = None,
                            instruction: int | None = None, template_kv: TemplateKVSource | None = None,
                            mode: KVMode | str | None = None, steps: int = 8, seed: int = 0,
                            probe: AttentionProbe | None = None) -> EditOutput:
        """Edit `photo` (B, 3, H, W) in [0, 1] with a template given either as pixels (+ its
        instruction id, default 0) or as KV (whose instruction is in its layer K/V already).
        `edit` is this call under no_grad; this one keeps the graph (capture's sensitivity).

        mode: NOCACHE or EXTRACT need `template`; INJECTED needs `template_kv`. Default: INJECTED
        when `template_kv` is given, else EXTRACT. All three give bit-identical images for the same
        template, photo, steps and seed.
        """
        dev, dt = self.device, self.dtype
        photo = self._check_image(photo, "photo").to(dev, dt)
        b = photo.shape[0]
        mode = resolve_kv_mode(mode, template, template_kv)
        if mode is KVMode.INJECTED:
            self.check_template_kv(template_kv)
        else:
            template = self._check_image(template, "template")[:1]
            instruction = self._check_instruction(0 if instruction is None else instruction)
        check_steps(steps)

        timings = {"template": 0.0, "denoise": 0.0}
        resident: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None] = [None] * self.num_layers
        captured: TemplateKV | None = None

        def run_template_stream() -> None:
            t0 = time.perf_counter()
            kvs = self.template_stream(template, instruction)
            for i, (k, v) in enumerate(kvs):
                resident[i] = (k.expand(b, -1, -1, -1), v.expand(b, -1, -1, -1), None)
            timings["template"] += time.perf_counter() - t0
            nonlocal captured
            captured = self._wrap_kv(template, instruction, kvs)

        def kv_for_layer(i: int):
            if resident[i] is None:  # INJECTED: first touch of layer i; may block on a stream
                resident[i] = self._resident_layer(template_kv.layer(i), i, b)
            return resident[i]

        # noise drawn on the CPU whatever the device: one seed, one edit, on every machine
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(photo.shape, generator=gen).to(dev, dt)
        ts = torch.linspace(1.0, 0.0, steps + 1).to(dev, dt)
        for s in range(steps):
            if mode is KVMode.NOCACHE or (mode is KVMode.EXTRACT and s == 0):
                run_template_stream()
            t0 = time.perf_counter()
            v = self.velocity(photo, x, ts[s].expand(b), kv_for_layer, probe)
            x = x + (ts[s + 1] - ts[s]) * v
            timings["denoise"] += time.perf_counter() - t0
        image = x.clamp(0.0, 1.0).float().cpu()  # (B, 3, S, S) float32 on the CPU, whatever the device
        return EditOutput(image=image, template_kv=captured if mode is KVMode.EXTRACT else None, timings_s=timings)

    def _resident_layer(self, layer, i: int, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Template KV layer `i` as the main stream attends to it: checked, the wire's dtype (fp16)
        cast to the model's on arrival, on its device, expanded over the `b` photos (no copy)."""
        cfg = self.cfg
        layer.check(f"template KV layer {i}", tokens=cfg.tokens_per_image, heads=cfg.heads, head_dim=cfg.head_dim)
        dev, dt = self.device, self.dtype
        keep = None if layer.keep is None else layer.keep.to(dev)
        return (layer.key.to(dev, dt)[None].expand(b, -1, -1, -1),
                layer.value.to(dev, dt)[None].expand(b, -1, -1, -1), keep)

    @torch.no_grad()
    def first_step_prefix(self, photo: torch.Tensor, template_kv: TemplateKVSource, *, steps: int = 8,
                          seed: int = 0) -> FirstStepPrefix:
        """What every edit of `photo` (steps, seed) shares with ``edit(photo, template_kv=...)``
        when its template KV differs from `template_kv` in one layer l only: the noise, the
        template KV cast for attention, and the first step's main stream up to block l.
        `edit_replacing(prefix, l, layer)` runs such an edit from there. The build's image probes
        each replace one layer, so they skip (L-1)/2L of their first step on average (~10 % of a
        4-step probe), with images bit for bit those of `edit`.

        photo: (B, 3, S, S) in [0, 1]. Holds L streams of (B, 2T, C) and the cast KV."""
        dev, dt = self.device, self.dtype
        photo = self._check_image(photo, "photo").to(dev, dt)
        check_steps(steps)
        self.check_template_kv(template_kv)
        b = photo.shape[0]
        resident = [self._resident_layer(template_kv.layer(i), i, b) for i in range(self.num_layers)]
        gen = torch.Generator().manual_seed(seed)  # the noise `edit` draws
        noise = torch.randn(photo.shape, generator=gen).to(dev, dt)
        ts = torch.linspace(1.0, 0.0, steps + 1).to(dev, dt)
        streams: list[torch.Tensor] = []
        conds = [self.conditioning(ts[s].expand(b)) for s in range(steps)]  # per step: t only
        self.velocity(photo, noise, ts[0].expand(b), lambda i: resident[i], record=streams, conditioning=conds[0])
        return FirstStepPrefix(photo, noise, ts, resident, streams, conds)

    @torch.no_grad()
    def edit_replacing(self, prefix: FirstStepPrefix, layer: int, replacement) -> torch.Tensor:
        """``edit(photo, template_kv=KV, steps, seed).image`` where KV is the prefix's template KV
        with layer `layer` replaced by `replacement` (a `LayerKV`, any dtype; a keep mask is
        allowed), run from the prefix: the first step starts at block `layer`. (B, 3, S, S) float32
        on the CPU."""
        if not 0 <= layer < self.num_layers:
            raise IndexError(f"layer {layer} out of range ({self.num_layers} layers)")
        b = prefix.photo.shape[0]
        swapped = self._resident_layer(replacement, layer, b)
        kv_for_layer = lambda i: swapped if i == layer else prefix.resident[i]  # noqa: E731
        x, ts = prefix.noise, prefix.timesteps
        for s in range(len(ts) - 1):
            resume = {"first_layer": layer, "stream": prefix.streams[layer]} if s == 0 else {}
            v = self.velocity(prefix.photo, x, ts[s].expand(b), kv_for_layer, conditioning=prefix.conditioning[s],
                              **resume)
            x = x + (ts[s + 1] - ts[s]) * v
        return x.clamp(0.0, 1.0).float().cpu()

    @torch.no_grad()
    def edit_many(self, photo: torch.Tensor, template_kvs: list[TemplateKVSource], *, steps: int = 8,
                  seed: int = 0) -> list[torch.Tensor]:
        """``[edit(photo, template_kv=kv, steps=steps, seed=seed).image for kv in template_kvs]``
        as one batched forward per step (K sources x B photos): the build's image-distortion
        probes, which differ from the lossless template in one layer each. A layer object the
        sources share is cast to the device once. Sources with keep masks are not batched here
        (ValueError): a mask would change which attention kernel runs.

        photo: (B, 3, S, S) in [0, 1]. Returns K images (B, 3, S, S), float32 on the CPU."""
        dev, dt = self.device, self.dtype
        photo = self._check_image(photo, "photo").to(dev, dt)
        check_steps(steps)
        if not template_kvs:
            return []
        for kv in template_kvs:
            self.check_template_kv(kv)
        n, k = photo.shape[0], len(template_kvs)
        tokens, heads, head_dim = self.cfg.tokens_per_image, self.cfg.heads, self.cfg.head_dim
        resident: list[tuple[torch.Tensor, torch.Tensor, None] | None] = [None] * self.num_layers

        def kv_for_layer(i: int):
            if resident[i] is None:
                layers = [kv.layer(i) for kv in template_kvs]
                for layer in layers:
                    layer.check(f"template KV layer {i}", tokens=tokens, heads=heads, head_dim=head_dim)
                    if layer.keep is not None:
                        raise ValueError("edit_many: a source with a keep mask; edit it on its own")
                if all(layer is layers[0] for layer in layers):  # shared: cast once, expand (no copy)
                    kt, vt = (t.to(dev, dt)[None].expand(k * n, -1, -1, -1) for t in (layers[0].key, layers[0].value))
                else:  # (K, Tt, H, D) -> (K*B, Tt, H, D), source j's K/V for photos j*B .. j*B+B-1
                    kt = torch.stack([l.key.to(dev, dt) for l in layers]).repeat_interleave(n, dim=0)
                    vt = torch.stack([l.value.to(dev, dt) for l in layers]).repeat_interleave(n, dim=0)
                resident[i] = (kt, vt, None)
            return resident[i]

        gen = torch.Generator().manual_seed(seed)  # the same noise as each single edit
        x = torch.randn(photo.shape, generator=gen).to(dev, dt).repeat(k, 1, 1, 1)
        photos = photo.repeat(k, 1, 1, 1)                                   # (K*B, 3, S, S)
        ts = torch.linspace(1.0, 0.0, steps + 1).to(dev, dt)
        for s in range(steps):
            v = self.velocity(photos, x, ts[s].expand(k * n), kv_for_layer, None)
            x = x + (ts[s + 1] - ts[s]) * v
        return list(x.clamp(0.0, 1.0).float().cpu().reshape(k, n, *photo.shape[1:]).unbind(0))

    # -- training -------------------------------------------------------------------------------
    def training_velocity(self, template: torch.Tensor, instruction: torch.Tensor, photo: torch.Tensor,
                          x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Differentiable forward for training, one template per sample.

        template, photo, x_t: (B, 3, H, W); instruction: (B,) long; t: (B,) in [0, 1].
        """
        kvs = self.template_stream(template, instruction)
        return self.velocity(photo, x_t, t, lambda i: (kvs[i][0], kvs[i][1], None))
