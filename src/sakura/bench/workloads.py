"""Named editing workloads and phone compute levels: where streaming template KV can pay.

Every figure is a plain number with its public source beside it (`Workload.sources`,
`PhoneLevel.source`); docs/workloads.md renders them as tables with the ceilings and the
break-even bandwidth. Everything here is pure arithmetic on frozen dataclasses, so the phone
profile simulation (`sakura.bench.profile`), the dilated live runs (`sakura.bench.dilated`) and
the docs read the same numbers.

Cost model (one phone, compute-bound, FLOPs / effective FLOP/s; SPEC "Where streaming can pay"):

* linear FLOPs of n tokens through one layer: 2 x P x n, with P = weights one token touches per
  layer (FLUX-style double blocks have separate text/image weights, so a token touches half);
* attention FLOPs of n queries over m keys in one layer: 4 x n x m x d (QK^T and AV);
* the template's tokens attend only to template tokens (Klein KV extract mode); the user's photo
  is a reference too (private: always computed on the phone, once, then cached, attending to the
  references); target + text tokens ("live") attend to everything, once per denoising pass;
* `on-device-nocache` (the plain FLUX.2 Klein / FLUX.1 Kontext / Qwen-Image-Edit pipelines) runs
  the full sequence [text, references, target] through every layer in every pass;
* fixed costs every method pays: the text encoder (the prompt padded to 512 tokens, as the
  diffusers pipeline does), the VAE encoder on the user's photo and the VAE decoder on the output.
  Template latents are public and ship with the template, so nobody VAE-encodes the template.

Units: seconds, FLOPs, FLOP/s, bytes, bits/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from sakura.bench.harness import get_logger, markdown_table
from sakura.models.flux.klein_config import KLEIN_4B, KLEIN_9B

log = get_logger(__name__)

# ---------------------------------------------------------------------------------------------
# sources (cited by key from the dataclasses below)

SOURCES = {
    "klein-configs": "InvokeAI invokeai/backend/flux2 parameter presets (Klein4B: hidden 3072 = 24 heads x 128, "
                     "5 double + 20 single blocks, mlp_ratio 3; Klein9B: hidden 4096 = 32 x 128, 8 double + 24 "
                     "single blocks); diffusers-format Flux2Transformer2DModel configs for Klein-9B in other public repositories "
                     "give the same 8 + 24 blocks x 32 heads (8.7e9 weights in the blocks, consistent with '9B')",
    "klein-card": "black-forest-labs/FLUX.2-klein-4B model card and filipstrand/mflux src/mflux/models/flux2/README.md: "
                  "distilled Klein: 4 steps, no CFG; base Klein: 50 steps, guidance > 1; text encoder Qwen3-4B "
                  "(4B) / Qwen3-8B (9B)",
    "diffusers-klein": "diffusers 0.42 pipelines/flux2/pipeline_flux2_klein.py: prompt padded to max_sequence_length=512; "
                       "reference latents concatenated to the sequence at every step; non-distilled default 50 steps, "
                       "guidance_scale 4.0, CFG = a second full transformer pass with the references per step",
    "diffusers-klein-kv": "diffusers 0.42 pipelines/flux2/pipeline_flux2_klein_kv.py: references computed once "
                          "(extract, fixed timestep 0, attending to references only), then cached",
    "qwen3-4b": "Qwen3-4B config (hidden 2560, intermediate 9728, 36 layers, 32 q / 8 kv heads x 128), e.g. "
                "huggingface.co/Tonera/FLUX.2-klein-4B-fp8-diffusers text_encoder/config.json: 3.63e9 "
                "non-embedding weights (model card: 3.6B)",
    "qwen3-8b": "Qwen3-8B config (hidden 4096, intermediate 12288, 36 layers, 32 q / 8 kv heads x 128), "
                "huggingface.co/keras/qwen3_8b_en: 6.95e9 non-embedding weights",
    "flux2-vae": "diffusers 0.42 AutoencoderKLFlux2 default config (blocks 128/256/512/512, 32 latent channels), FLOPs "
                 "counted with torch.utils.flop_counter on the meta device: encoder 1.119e12 at 512^2 and 4.887e12 "
                 "at 1024^2, decoder 2.516e12 / 1.047e13 (the SD1.x VAE decoder is 1,240 GMACs = 2.48e12 at 512^2 "
                 "by BK-SDM's thop count, github.com/Nota-NetsPresso/BK-SDM/issues/53: they agree within 2 %)",
    "tokens": "FLUX.2 latents: VAE /8 then 2x2 patches -> one token per 16x16 pixels: 512^2 -> 1,024 tokens, "
              "1024^2 -> 4,096 tokens",
}

#: FLOPs of the FLUX.2 VAE, counted at two sizes (see SOURCES["flux2-vae"]); other sizes scale by pixels.
_VAE_ENCODE_FLOPS = {512: 1.119e12, 1024: 4.887e12}
_VAE_DECODE_FLOPS = {512: 2.516e12, 1024: 1.0475e13}


def vae_flops(side_px: int, *, decode: bool) -> float:
    """FLUX.2 VAE FLOPs for a side_px x side_px image (counted at 512/1024, else scaled by pixels)."""
    table = _VAE_DECODE_FLOPS if decode else _VAE_ENCODE_FLOPS
    if side_px in table:
        return table[side_px]
    return table[512] * (side_px / 512) ** 2


def tokens_for(side_px: int) -> int:
    """Latent tokens of one side_px x side_px image in FLUX.2 (16 x 16 pixels per token)."""
    return KLEIN_4B.tokens_for(side_px)


def qwen3_weights(hidden: int, intermediate: int, layers: int, q_heads: int = 32, kv_heads: int = 8,
                  head_dim: int = 128) -> float:
    """Non-embedding weights of a Qwen3 decoder (attention q/k/v/o + SwiGLU MLP per layer)."""
    attn = hidden * head_dim * (q_heads + 2 * kv_heads) + q_heads * head_dim * hidden
    return layers * (attn + 3 * hidden * intermediate)


def flux2_weights_per_token_layer(hidden: int, mlp_ratio: float = 3.0) -> float:
    """Weights one token touches in one FLUX.2 block: QKV + out (4 d^2) + SwiGLU MLP (3 x mlp_ratio x d^2).

    A double block holds two such sets (image and text streams), a single block one fused set of the
    same size; modulation is shared across blocks in FLUX.2, so it is per image, not per token.
    """
    return (4 + 3 * mlp_ratio) * hidden * hidden


# ---------------------------------------------------------------------------------------------
# data


@dataclass(frozen=True)
class PhoneLevel:
    """A phone's effective FLOP/s for diffusion, derived from one published on-device figure."""

    name: str
    effective_flops: float      # FLOP/s
    source: str


#: SD1.x UNet at 512^2 (64x64 latent): 338.7 GMACs = 677.5 GFLOP per evaluation (BK-SDM thop count,
#: github.com/Nota-NetsPresso/BK-SDM/issues/53, SD-v1.4; v1.5 is the same network).
SD15_UNET_FLOPS = 2 * 338.7e9

PHONES: tuple[PhoneLevel, ...] = (
    PhoneLevel("~1 TFLOP/s (Snapdragon 8 Gen 2, 2023)", 20 * SD15_UNET_FLOPS / 14.4,
               "Qualcomm's SD1.5 demo on Snapdragon 8 Gen 2: a 512x512 image in 20 steps in 14.4 s "
               "(qualcomm.com OnQ blog 2023-02 and hothardware.com 2023-02-24); counted as 20 UNet "
               "evaluations of 677.5 GFLOP with text encoder and VAE inside the 14.4 s, so a lower bound: "
               "0.94 TFLOP/s"),
    PhoneLevel("~3.6 TFLOP/s (iPhone 14 Pro Max, A16)", 2.69 * 2 * SD15_UNET_FLOPS,
               "apple/ml-stable-diffusion README: stable-diffusion-2-1-base 512x512 on iPhone 14 Pro Max "
               "(CPU_AND_NE, SPLIT_EINSUM_V2) 2.69 iter/s with classifier-free guidance (UNet batch 2); "
               "SD2.1-base UNet counted as SD1.x's 677.5 GFLOP (same channel layout, 865M weights): "
               "3.64 TFLOP/s"),
    PhoneLevel("~11 TFLOP/s (Snapdragon 8 Elite, Galaxy S25)", SD15_UNET_FLOPS / 0.062141,
               "Qualcomm AI Hub, quic/ai-hub-models qai_hub_models/models/stable_diffusion_v1_5/perf.yaml: "
               "UNet w8a16, Samsung Galaxy S25 (Snapdragon 8 Elite), qnn_context_binary 62.141 ms per "
               "evaluation: 10.9 TFLOP/s"),
)


@dataclass(frozen=True)
class Workload:
    """One editing workload: model shape, token counts, steps, and what every method pays.

    Token counts are per image batch of one. `live_tokens` = target + text tokens computed in every
    denoising pass; `passes` = steps x cfg_passes.
    """

    # Alike in shape only to sakura.models.flux.klein_config.KleinConfig (both are field lists of
    # int shapes): a Workload is what a method pays per edit, KleinConfig a transformer's shapes.
    name: str
    model: str
    layers: int                       # transformer blocks that carry template KV
    hidden: int                       # d: K (and V) values per token per layer
    weights_per_token_layer: float    # P: weights one token touches in one layer
    template_tokens: int              # N_t: the template's reference tokens (public, cacheable)
    photo_tokens: int                 # the user's photo as a reference (private: computed on the phone)
    target_tokens: int                # the output latent's tokens
    text_tokens: int                  # prompt tokens in the transformer sequence (padded)
    steps: int
    cfg_passes: int                   # 1 (distilled / guidance-embedded) or 2 (true CFG)
    text_encoder_weights: float       # non-embedding weights of the text encoder
    photo_side_px: int                # for the VAE encoder
    output_side_px: int               # for the VAE decoder
    note: str = ""
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def live_tokens(self) -> int:
        """Target + text tokens: what every denoising pass computes."""
        return self.target_tokens + self.text_tokens

    @property
    def passes(self) -> int:
        return self.steps * self.cfg_passes

    @property
    def kv_fp16_bytes_per_layer(self) -> int:
        """The template's K and V of one layer in fp16: 2 x N_t x d x 2 bytes."""
        return 2 * self.template_tokens * self.hidden * 2

    @property
    def kv_values_per_layer(self) -> int:
        return 2 * self.template_tokens * self.hidden


# Shapes from the Klein adapter's config classes (sakura.models.flux.klein_config), the one table of them.
_KLEIN4B = dict(model="FLUX.2-klein-4B", layers=KLEIN_4B.depth, hidden=KLEIN_4B.hidden,
                weights_per_token_layer=flux2_weights_per_token_layer(KLEIN_4B.hidden),
                text_tokens=KLEIN_4B.text_tokens, text_encoder_weights=qwen3_weights(2560, 9728, 36))
_KLEIN9B = dict(model="FLUX.2-klein-9B", layers=KLEIN_9B.depth, hidden=KLEIN_9B.hidden,
                weights_per_token_layer=flux2_weights_per_token_layer(KLEIN_9B.hidden),
                text_tokens=KLEIN_9B.text_tokens, text_encoder_weights=qwen3_weights(4096, 12288, 36))
_KLEIN_SOURCES = {k: SOURCES[k] for k in ("klein-configs", "klein-card", "diffusers-klein", "diffusers-klein-kv",
                                          "flux2-vae", "tokens")}


def _klein(name: str, arch: dict, *, template_px: tuple[int, ...], photo_px: int, output_px: int, steps: int = 4,
           cfg_passes: int = 1, note: str = "") -> Workload:
    enc = "qwen3-4b" if arch is _KLEIN4B else "qwen3-8b"
    return Workload(name=name, **arch, template_tokens=sum(tokens_for(p) for p in template_px),
                    photo_tokens=tokens_for(photo_px), target_tokens=tokens_for(output_px), steps=steps,
                    cfg_passes=cfg_passes, photo_side_px=photo_px, output_side_px=output_px, note=note,
                    sources={**_KLEIN_SOURCES, enc: SOURCES[enc]})


WORKLOADS: tuple[Workload, ...] = (
    _klein("klein4b-512", _KLEIN4B, template_px=(512,), photo_px=512, output_px=512,
           note="step-distilled, 4 steps; the workload `sakura bench profile` modelled so far"),
    _klein("klein4b-1024", _KLEIN4B, template_px=(1024,), photo_px=1024, output_px=1024,
           note="step-distilled, 4 steps, everything at 1024^2"),
    _klein("klein9b-1024", _KLEIN9B, template_px=(1024,), photo_px=1024, output_px=1024,
           note="step-distilled, 4 steps, the larger model"),
    _klein("klein4b-base-1024", _KLEIN4B, template_px=(1024,), photo_px=1024, output_px=1024, steps=50,
           cfg_passes=2, note="base (non-distilled) Klein: 50 steps with true CFG (2 passes a step), as the "
                              "diffusers pipeline defaults; FLUX.1 Kontext (28 steps, guidance-distilled: 1 pass "
                              "a step) and Qwen-Image-Edit (50 steps, true CFG 4.0) also recompute the reference "
                              "every pass (diffusers 0.42 defaults)"),
    _klein("template1024-out512", _KLEIN4B, template_px=(1024,), photo_px=512, output_px=512,
           note="template-heavy: a 1024^2 template (frame/sticker sheet) applied to a 512^2 edit, 4 steps"),
    _klein("style3x1024-out512", _KLEIN4B, template_px=(1024, 1024, 1024), photo_px=512, output_px=512,
           note="template-heavy: a three-image 1024^2 style template applied to a 512^2 edit, 4 steps"),
)


def get_workload(name: str) -> Workload:
    for w in WORKLOADS:
        if w.name == name:
            return w
    raise KeyError(f"unknown workload {name!r}; known: {', '.join(w.name for w in WORKLOADS)}")


def get_phone(name_or_tflops: str | float) -> PhoneLevel:
    """A phone level by (a prefix of) its name, e.g. '~11', or the nearest to a TFLOP/s figure
    (a number, or a string that is one, e.g. '3')."""
    if isinstance(name_or_tflops, str):
        try:
            name_or_tflops = float(name_or_tflops)
        except ValueError:
            pass
    if isinstance(name_or_tflops, (int, float)):
        return min(PHONES, key=lambda p: abs(math.log(p.effective_flops / (float(name_or_tflops) * 1e12))))
    for p in PHONES:
        if p.name.startswith(name_or_tflops):
            return p
    raise KeyError(f"unknown phone level {name_or_tflops!r}; known: {', '.join(p.name for p in PHONES)}")


# ---------------------------------------------------------------------------------------------
# costs


@dataclass(frozen=True)
class WorkloadCosts:
    """Seconds on one phone for the pieces of one edit (see the module doc for the cost model)."""

    workload: str
    phone: str
    layers: int
    passes: int
    template_layer_s: float     # one layer of the template's KV (N_t tokens, template-only attention)
    photo_layer_s: float        # one layer of the user's photo KV, once (attends to template + photo)
    live_layer_s: float         # one layer of one pass for the live tokens, template + photo KV resident
    nocache_layer_s: float      # one layer of one pass with every token in the sequence
    text_encoder_s: float
    vae_encode_s: float         # the user's photo
    vae_decode_s: float         # the output
    kv_fp16_bytes_per_layer: int

    @property
    def fixed_s(self) -> float:
        """Text encoder + VAE encode + VAE decode: every method pays these."""
        return self.text_encoder_s + self.vae_encode_s + self.vae_decode_s

    @property
    def oracle_s(self) -> float:
        """Template KV already in memory: fixed costs, the photo's KV once, every pass."""
        return self.fixed_s + self.layers * (self.photo_layer_s + self.passes * self.live_layer_s)

    @property
    def on_device_s(self) -> float:
        """Template KV computed on the phone once, then cached (Klein KV)."""
        return self.oracle_s + self.layers * self.template_layer_s

    @property
    def on_device_nocache_s(self) -> float:
        """Every token through every layer in every pass (plain Klein / Kontext / Qwen-Image-Edit)."""
        return self.fixed_s + self.layers * self.passes * self.nocache_layer_s

    @property
    def template_s(self) -> float:
        return self.layers * self.template_layer_s


def _attn_flops(n_query: int, n_key: int, d: int) -> float:
    return 4.0 * n_query * n_key * d


def workload_costs(w: Workload, phone: PhoneLevel, *, attention: bool = True, fixed: bool = True) -> WorkloadCosts:
    """Per-piece seconds of `w` on `phone`. attention=False drops attention FLOPs and fixed=False
    the text encoder and VAE (to reproduce SPEC's closed-form ceilings; not for results)."""
    F, d, P = phone.effective_flops, w.hidden, w.weights_per_token_layer
    a = (lambda nq, nk: _attn_flops(nq, nk, d)) if attention else (lambda nq, nk: 0.0)
    Nt, Np, Nl = w.template_tokens, w.photo_tokens, w.live_tokens
    N = Nt + Np + Nl
    text_s = 2 * w.text_encoder_weights * w.text_tokens / F if fixed else 0.0
    enc_s = vae_flops(w.photo_side_px, decode=False) / F if fixed else 0.0
    dec_s = vae_flops(w.output_side_px, decode=True) / F if fixed else 0.0
    return WorkloadCosts(
        workload=w.name, phone=phone.name, layers=w.layers, passes=w.passes,
        template_layer_s=(2 * P * Nt + a(Nt, Nt)) / F,
        photo_layer_s=(2 * P * Np + a(Np, Nt + Np)) / F,
        live_layer_s=(2 * P * Nl + a(Nl, N)) / F,
        nocache_layer_s=(2 * P * N + a(N, N)) / F,
        text_encoder_s=text_s, vae_encode_s=enc_s, vae_decode_s=dec_s,
        kv_fp16_bytes_per_layer=w.kv_fp16_bytes_per_layer)


def ceilings(c: WorkloadCosts) -> dict[str, float]:
    """The most any streaming method can gain: latency ratios with free, instant template KV
    (= oracle), fixed costs included on both sides."""
    return {"vs on-device": c.on_device_s / c.oracle_s, "vs on-device-nocache": c.on_device_nocache_s / c.oracle_s}


def break_even_bps(w: Workload, phone: PhoneLevel, bits_per_value: float, *, attention: bool = True) -> float:
    """W*: the link rate (bits/s) above which fetching one layer's template KV at `bits_per_value`
    takes less time than computing it on the phone. Token counts cancel except through attention:
    W* = d x b x F / (P x (1 + a)), a = attention FLOPs / linear FLOPs of the template."""
    c = workload_costs(w, phone, attention=attention, fixed=False)
    return w.kv_values_per_layer * bits_per_value / c.template_layer_s


def break_even_closed_form(hidden: int, bits_per_value: float, flops: float, weights_per_layer: float,
                           attention_overhead: float) -> float:
    """SPEC's W* = d x b x F / (P_l x (1 + a)) in bits/s (for checking `break_even_bps`)."""
    return hidden * bits_per_value * flops / (weights_per_layer * (1 + attention_overhead))


def streaming_bound_s(c: WorkloadCosts, link_bps: float, bits_per_value: float, *,
                      decode_fp16_bytes_per_s: float = math.inf, rtt_s: float = 0.0) -> float:
    """A lower bound on the latency of any method that fetches a fraction f of the template's layers
    at `bits_per_value` over a constant-rate link and computes the rest on the phone.

    The phone's work is the oracle's plus (1 - f) of the template: latency >= oracle + (1 - f) T.
    The last fetched layer arrives after RTT + f x L x max(bytes / W, fp16 bytes / decode rate)
    (fetch and decode pipelined) and at best it is the last layer of the first pass, after which
    the other passes and the VAE decoder remain. Minimised over a continuous f (real methods fetch
    whole layers and meet per-layer deadlines, so they can only be slower). At an infinite rate it
    is the oracle; with no link it is on-device.
    """
    T = c.template_s
    per_layer_s = max(c.kv_fp16_bytes_per_layer * bits_per_value / 16 * 8 / link_bps,
                      c.kv_fp16_bytes_per_layer / decode_fp16_bytes_per_s)
    X = c.layers * per_layer_s                                   # fetching every layer
    after_first_pass = (c.passes - 1) * c.layers * c.live_layer_s + c.vae_decode_s
    on_device = c.on_device_s
    f = min(1.0, max(0.0, (on_device - rtt_s - after_first_pass) / (T + X)))
    return max(on_device - f * T, rtt_s + f * X + after_first_pass, c.oracle_s)


# ---------------------------------------------------------------------------------------------
# report: docs/workloads.md and the ceilings plot

REPORT_BITS = (1.0, 2.0, 4.0, 8.0, 16.0)


def report_markdown() -> str:
    """docs/workloads.md: tables of every figure with its source, ceilings and break-even rates."""
    L: list[str] = []
    add = L.append
    add("# Workloads: where streaming template KV can pay\n")
    add("Generated by `sakura bench workloads` from `src/sakura/bench/workloads.py` (pure arithmetic on the cited "
        "figures below; the one figure measured on this machine is the decode rate of the regime section). "
        "The phone-profile simulator is meant to take its compute times from the same `workload_costs`.\n")
    add("## Cost model\n")
    add("Per layer, a token costs 2 x P FLOPs of matrix products (P = weights one token touches in one block) and "
        "attention costs 4 x queries x keys x d. Seconds = FLOPs / the phone's effective FLOP/s. The template's "
        "tokens attend only to template tokens (Klein KV extract mode). The user's photo is a reference too: it is "
        "private, so every method computes its KV on the phone, once (its layer l attends to the template's layer "
        "l, so it runs with the first pass). Target + text tokens (\"live\") run in every pass and attend to "
        "everything. `on-device` computes the template once then caches it; `on-device-nocache` (the plain FLUX.2 "
        "Klein, FLUX.1 Kontext and Qwen-Image-Edit pipelines) runs the whole sequence in every pass; `oracle` has "
        "the template KV in memory. Every method pays the fixed costs: the text encoder on the prompt padded to "
        "512 tokens (as diffusers does), the VAE encoder on the photo and the VAE decoder on the output.\n")
    add("Decisions where the sources are silent, and why:\n")
    add("- The photo is a reference image (FLUX.2 / Kontext / Qwen-Image-Edit editing), not an img2img start "
        "latent: that is how these models edit. It makes the 512^2 ceilings differ from SPEC's 1.17x / 1.67x, "
        "which count no photo and no fixed costs; `test_workloads.py` reproduces SPEC's figures with those "
        "removed.")
    add("- Template latents are public and ship with the template (32 x 64 x 64 x 2 B = 262 kB at 1024^2), so "
        "no method VAE-encodes the template.")
    add("- P is counted from the architecture (13 d^2 per token per FLUX.2 block: a double block has separate "
        "image and text weights and a token uses one set). SPEC's 17.5 x b Mbit/s per TFLOP/s divides all 4e9 "
        "weights by 25 layers and assumes 10 % attention; from the config it is ~24 x b at 1,024 template tokens.")
    w512, fast = get_workload("klein4b-512"), PHONES[-1]
    short = replace(w512, text_tokens=64)
    add("- The prompt is padded to 512 tokens in the text encoder and the transformer, as the diffusers pipeline "
        "does; an app that kept only ~64 prompt tokens would change the klein4b-512 ceilings from "
        f"{ceilings(workload_costs(w512, fast))['vs on-device']:.2f}x / "
        f"{ceilings(workload_costs(w512, fast))['vs on-device-nocache']:.2f}x to "
        f"{ceilings(workload_costs(short, fast))['vs on-device']:.2f}x / "
        f"{ceilings(workload_costs(short, fast))['vs on-device-nocache']:.2f}x.")
    add("- CFG's negative prompt is encoded once (or cached per app); it adds no text-encoder cost here.")
    add("- Effective FLOP/s come from SD1.x UNet timings (a conv-heavy network, int8/w8a16 on NPUs); a DiT may "
        "run at a different fraction of peak. That is why three levels are given, not one.\n")
    add("Because every piece is FLOPs / F, the **ceilings do not depend on the phone level**; the phone moves the "
        "break-even bandwidth W* (linear in F).\n")

    add("## Phone compute levels\n")
    add(markdown_table(["level", "effective TFLOP/s", "source"],
                       [[p.name, f"{p.effective_flops / 1e12:.2f}", p.source] for p in PHONES], "lrl"))
    add(f"\nSD1.x UNet at 512^2: {SD15_UNET_FLOPS / 1e9:.1f} GFLOP per evaluation (338.7 GMACs, BK-SDM's thop "
        "count, github.com/Nota-NetsPresso/BK-SDM/issues/53).\n")

    add("## Workloads\n")
    add(markdown_table(
        ["workload", "model", "layers", "d", "P (weights/token/layer)", "template tokens", "photo tokens",
         "live tokens (target + text)", "steps x CFG passes", "template KV fp16", "note"],
        [[w.name, w.model, w.layers, w.hidden, f"{w.weights_per_token_layer:.3g}", f"{w.template_tokens:,}",
          f"{w.photo_tokens:,}", f"{w.live_tokens:,} ({w.target_tokens:,} + {w.text_tokens})",
          f"{w.steps} x {w.cfg_passes}", f"{w.kv_fp16_bytes_per_layer * w.layers / 1e9:.2f} GB", w.note]
         for w in WORKLOADS], "llrrrrrrrrl"))
    add("\nText encoders: Klein-4B uses Qwen3-4B "
        f"({qwen3_weights(2560, 9728, 36) / 1e9:.2f}e9 non-embedding weights), Klein-9B Qwen3-8B "
        f"({qwen3_weights(4096, 12288, 36) / 1e9:.2f}e9). VAE FLOPs (FLUX.2 VAE): encode "
        f"{vae_flops(512, decode=False) / 1e12:.2f} / {vae_flops(1024, decode=False) / 1e12:.2f} TFLOP, decode "
        f"{vae_flops(512, decode=True) / 1e12:.2f} / {vae_flops(1024, decode=True) / 1e12:.2f} TFLOP at 512^2 / 1024^2.\n")
    add("### Sources\n")
    for k, v in SOURCES.items():
        add(f"- **{k}**: {v}")
    add("")

    add("## Latency of each method with free KV, and the ceilings\n")
    add("Seconds on the phone. `oracle` = template KV free and instant: the floor for every streaming method. "
        "Ceiling = method / oracle: the most any streaming method can gain over it. Print these beside every "
        "measured ratio.\n")
    rows = []
    for w in WORKLOADS:
        for p in PHONES:
            c = workload_costs(w, p)
            ce = ceilings(c)
            rows.append([w.name, p.name.split(" (")[0], f"{c.fixed_s:.2f}", f"{c.template_s:.2f}",
                         f"{c.layers * c.photo_layer_s:.2f}", f"{c.oracle_s:.1f}", f"{c.on_device_s:.1f}",
                         f"{c.on_device_nocache_s:.1f}", f"**{ce['vs on-device']:.2f}x**",
                         f"**{ce['vs on-device-nocache']:.2f}x**"])
    add(markdown_table(["workload", "phone", "fixed (text enc + VAE)", "template KV compute", "photo KV", "oracle",
                        "on-device", "on-device-nocache", "ceiling vs on-device", "ceiling vs nocache"], rows,
                       "ll" + "r" * 8))
    add("")
    add("## Break-even bandwidth W* (Mbit/s)\n")
    add("Fetching a layer's template KV at b bits/value beats computing it on the phone above W* = d b F / (P (1 + a)) "
        "(a = the template's attention FLOPs / its matrix FLOPs = 2 N_t d / P). Below W* the best a streaming "
        "method can do is to fetch some layers while computing others; above it, fetching wins per layer. "
        "16 bits = raw fp16 streaming.\n")
    add(markdown_table(["workload", "phone"] + [f"b={b:g}" for b in REPORT_BITS],
                       [[w.name, p.name.split(" (")[0]] + [f"{break_even_bps(w, p, b) / 1e6:.0f}" for b in REPORT_BITS]
                        for w in WORKLOADS for p in PHONES], "ll" + "r" * len(REPORT_BITS)))
    add("\n## Where streaming can pay at a given link rate\n")
    add("`streaming_bound_s`: a lower bound on the latency of any method that fetches some layers' KV at "
        f"{REGIME_BITS:g} bits/value over a constant-rate link and computes the others, with fetch, decode "
        f"({REGIME_DECODE_FP16_BPS / 1e6:.0f} MB/s of fp16 KV, one core: docs/decode_rates.md) and compute "
        f"perfectly overlapped and an RTT of {REGIME_RTT_S * 1e3:.0f} ms (see its docstring). The speedups below "
        "are on-device (or nocache) latency / that bound: what the best possible streaming method could reach; "
        "a measured sakura ratio should be read against them. A link of W Mbit/s at "
        f"{REGIME_BITS:g} bits/value carries {16 / REGIME_BITS:g} x W / 8 MB/s of fp16 KV, so above "
        f"{REGIME_DECODE_FP16_BPS / 1e6 * 8 / (16 / REGIME_BITS):.0f} Mbit/s one decode core, not the link, is the "
        "bottleneck (the flat right half of the map): faster decoding (more cores in processes, since the "
        "entropy decoders hold the GIL, or a GPU decoder) moves that edge right.\n")
    rows = []
    for w in WORKLOADS:
        for p in PHONES:
            cells = []
            for r in REGIME_RATES_MBPS:
                g = regime_speedups(w, p, r)
                cells.append(f"{g['vs on-device']:.2f}x / {g['vs on-device-nocache']:.2f}x")
            ce = ceilings(workload_costs(w, p))
            rows.append([w.name, p.name.split(" (")[0], *cells,
                         f"{ce['vs on-device']:.2f}x / {ce['vs on-device-nocache']:.2f}x"])
    add(markdown_table(["workload", "phone"] + [f"{r} Mbit/s vs on-device / vs nocache" for r in REGIME_RATES_MBPS]
                       + ["ceilings"], rows, "ll" + "r" * (len(REGIME_RATES_MBPS) + 1)))
    add("\n![regimes](workloads_regimes.png)\n")
    add("\n![ceilings](workloads_ceilings.png)\n")
    return "\n".join(L) + "\n"


#: For the regime tables and map: 2 bits/value (the importance-aware ladder's middle rungs and
#: CacheGen's levels sit at 1-2.5), one decode core at 70 MB of fp16 KV per second (docs/decode_rates.md:
#: the importance-aware codecs -- layered, progressive, sakura -- decode at 46-122 MB per CPU-second on this
#: x86 machine, medians 63-74; they hold the GIL, so a second decode thread adds nothing) and a 40 ms RTT.
REGIME_BITS, REGIME_DECODE_FP16_BPS, REGIME_RTT_S = 2.0, 70e6, 0.040
REGIME_RATES_MBPS = (10, 50, 200, 1000)


def regime_speedups(w: Workload, phone: PhoneLevel, link_mbps: float, *, bits: float = REGIME_BITS,
                    decode_fp16_bps: float = REGIME_DECODE_FP16_BPS, rtt_s: float = REGIME_RTT_S) -> dict[str, float]:
    """The most a streaming method can gain at a constant link rate: on-device and on-device-nocache
    latency / `streaming_bound_s` (a streaming method also has local compute, so never below 1 vs
    on-device)."""
    c = workload_costs(w, phone)
    best = streaming_bound_s(c, link_mbps * 1e6, bits, decode_fp16_bytes_per_s=decode_fp16_bps, rtt_s=rtt_s)
    return {"vs on-device": c.on_device_s / best, "vs on-device-nocache": c.on_device_nocache_s / best}


def plot_regimes(path) -> None:
    """Per workload: the bound on the speedup vs on-device over link rate x phone FLOP/s."""
    import matplotlib  # lazy: plots only: not imported by a run that draws nothing

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: plots only: not imported by a run that draws nothing

    rates = np.geomspace(5, 1000, 48)
    flops = np.geomspace(0.5e12, 20e12, 40)
    fig, axes = plt.subplots(2, 3, figsize=(12, 6.4), sharex=True, sharey=True)
    for ax, w in zip(axes.flat, WORKLOADS):
        z = np.array([[regime_speedups(w, PhoneLevel("", f, ""), r)["vs on-device"] for r in rates] for f in flops])
        cap = ceilings(workload_costs(w, PHONES[0]))["vs on-device"]
        im = ax.pcolormesh(rates, flops / 1e12, z, shading="auto", vmin=1.0, vmax=max(1.05, cap), cmap="viridis")
        cs = ax.contour(rates, flops / 1e12, z, levels=[x for x in (1.05, 1.1, 1.25, 1.5, 2.0) if x < cap],
                        colors="w", linewidths=0.6)
        ax.clabel(cs, fontsize=6, fmt="%.2fx")
        for p in PHONES:
            ax.axhline(p.effective_flops / 1e12, color="r", lw=0.5, ls="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{w.name} (ceiling {cap:.2f}x)", fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.046)
    for ax in axes[-1]:
        ax.set_xlabel("constant link rate (Mbit/s)", fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel("phone effective TFLOP/s", fontsize=8)
    fig.suptitle(f"Most any streaming method can gain vs on-device (bound; {REGIME_BITS:g} bits/value, decode "
                 f"{REGIME_DECODE_FP16_BPS / 1e6:.0f} MB/s fp16, RTT {REGIME_RTT_S * 1e3:.0f} ms); dashed: the three "
                 "phone levels", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_ceilings(path) -> None:
    """Bars: ceiling vs on-device and vs on-device-nocache per workload; beside them W* at 2 bits/value."""
    import matplotlib  # lazy: plots only: not imported by a run that draws nothing

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: plots only: not imported by a run that draws nothing

    names = [w.name for w in WORKLOADS]
    cs = [ceilings(workload_costs(w, PHONES[-1])) for w in WORKLOADS]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.8))
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], [c["vs on-device"] for c in cs], width=0.4, label="vs on-device")
    ax.bar([i + 0.2 for i in x], [c["vs on-device-nocache"] for c in cs], width=0.4, label="vs on-device-nocache")
    ax.axhline(1.0, color="k", lw=0.6)
    ax.set_xticks(list(x), names, rotation=25, ha="right", fontsize=7)
    ax.set_ylabel("max speedup with free, instant KV")
    ax.set_title("ceilings (fixed costs included; same at every phone level)", fontsize=9)
    ax.legend(fontsize=7)
    for j, p in enumerate(PHONES):
        bx.bar([i + (j - 1) * 0.27 for i in x], [break_even_bps(w, p, 2.0) / 1e6 for w in WORKLOADS], width=0.27,
               label=p.name)
    bx.set_yscale("log")
    bx.set_xticks(list(x), names, rotation=25, ha="right", fontsize=7)
    bx.set_ylabel("W* at 2 bits/value (Mbit/s)")
    bx.set_title("break-even link rate: fetching beats computing above it", fontsize=9)
    bx.legend(fontsize=6, loc="lower right", framealpha=0.9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(out_dir="docs", *, plots: bool = True) -> None:
    """workloads.md, and with `plots` workloads_ceilings.png and workloads_regimes.png, in `out_dir`."""

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "workloads.md").write_text(report_markdown())
    if plots:
        plot_ceilings(out / "workloads_ceilings.png")
        plot_regimes(out / "workloads_regimes.png")
    log.info(f"wrote {out / 'workloads.md'}" + (" and the plots workloads_ceilings.png, workloads_regimes.png" if plots else ""))
