"""The flux2-mini model card text (the numbers come from `card.write_model_card`)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from sakura.cloud.tasks import HELDOUT_PHOTOS, TRAIN_PHOTOS
from sakura.cloud.tasks.library import HELD_OUT_PER_TASK, PER_TASK
from sakura.util.report import markdown_table


def _mini_comparison(report, docs_dir: Path = Path("docs")) -> str:
    """sakura-mini's committed quality figures beside this model's, when they exist."""
    path = docs_dir / "model" / "quality.json"
    if not path.is_file():
        return "(sakura-mini's `docs/model/quality.json` is not present, so no side-by-side table.)"
    mini = {t["task"]: t for t in json.loads(path.read_text())["tasks"]}
    rows = []
    for t in report.tasks:
        m = mini.get(t.task)
        if m is None:
            continue
        rows.append([t.task, f"{t.psnr['model']:.2f}", f"{m['psnr']['model']:.2f}", f"{t.psnr['identity']:.2f}",
                     f"{t.gain_db:+.2f} dB", f"{m['gain_db']:+.2f} dB"])
        if t.psnr_region is not None and m.get("psnr_region"):
            rows.append([f"{t.task} (in region)", f"{t.psnr_region['model']:.2f}", f"{m['psnr_region']['model']:.2f}",
                         f"{t.psnr_region['identity']:.2f}", f"{t.gain_region_db:+.2f} dB", f"{m['gain_region_db']:+.2f} dB"])
    return markdown_table(["task", "flux2-mini PSNR", "sakura-mini PSNR", "identity PSNR", "flux2-mini - identity",
                           "sakura-mini - identity"], rows, align="llllll")


def flux2_card(*, model, desc, recipe, report, sweep_table, said, steps_done, elapsed, final_loss, eval_steps,
               command, note, fig) -> str:
    cfg = model.cfg
    tr = model.transformer
    n_tr = sum(p.numel() for p in tr.parameters())
    arch_table = markdown_table(["", ""], [
        ['transformer', f'`Flux2Transformer2DModel`: {cfg.double_layers} double-stream + {cfg.single_layers} single-stream blocks, {cfg.heads} heads x {cfg.head_dim}, SwiGLU MLP ratio {cfg.mlp_ratio}, 4-axis RoPE (T, H, W, L) with {cfg.head_dim // 4} dims per axis, theta {cfg.rope_theta}, shared adaLN modulation, no guidance embedding'],
        ['"latents"', f'packed pixel patches: {cfg.image_size}x{cfg.image_size} RGB, patch {cfg.patch_size} -> {cfg.tokens_per_image} tokens of {cfg.patch_dim} values per image (no VAE)'],
        ['"text"', f"{cfg.text_tokens} learned prompt tokens (width {cfg.text_dim}) per instruction id, through the transformer's own `context_embedder`"],
        ['sequence', f'[text {cfg.text_tokens} | template {cfg.tokens_per_image} (reference slot 0, RoPE T=10) | photo {cfg.tokens_per_image} (T=20) | noisy target {cfg.tokens_per_image} (T=0)]'],
        ['template tokens', f"diffusers' KV reference: modulated at the fixed timestep {cfg.template_timestep}, attend only to reference tokens; their per-layer K/V (after QK-norm and RoPE) are the template KV"],
        ['parameters', f"{desc['parameters']:,} ({n_tr:,} in the transformer)"],
        ['template KV', f"{cfg.depth} layers (double-stream first) x {cfg.tokens_per_image} tokens x {cfg.heads} x {cfg.head_dim}: {desc['template_kv_values']:,} values = {desc['template_kv_bytes_fp16'] / 1024:.0f} KiB in fp16 per template (same size as sakura-mini's)"],
        ['objective', f'as sakura-mini: rectified flow, the output is the edit as a residual over the photo, v = (x_t - x0)/max(t, {cfg.t_min}); loss = MSE on x0; Euler sampler, {eval_steps} steps in the benchmark']], align="ll")
    return f"""# flux2-mini model card

The second bundled editing model (`src/sakura/assets/flux2-mini.safetensors`): the FLUX.2
architecture — diffusers' own `Flux2Transformer2DModel`, unmodified — trained by this project
from scratch on CPU on the same three template-defined tasks, data split and image size as
sakura-mini (`docs/model-card.md`). It exists so that every template-KV experiment can be run on
a second, differently built diffusion transformer with the attention structure of FLUX.2 Klein
KV. Written by `{command}`{(' - ' + note) if note else ''}.

## Architecture
`sakura.models.flux2mini.Flux2MiniDiT` = diffusers' `Flux2Transformer2DModel` + learned
instruction prompts + sakura-mini's image-level API (`load_model("flux2-mini")`).

{arch_table}

Decisions, and why:
- **Pixel space with packed patches, no VAE.** No pretrained FLUX.2 VAE can be downloaded here,
  and training one as well would spend most of the 1-hour CPU budget on the autoencoder. The
  transformer does not care what its input channels mean: a packed 8x8x3 patch is a 192-channel
  "latent" token, exactly as a 2x2-patchified VAE latent is a 128-channel one in FLUX.2. It also
  keeps the ground truth exact in pixels (no VAE reconstruction error in the quality figures).
- **The photo is an image token, not a second reference.** Klein passes the user's image as a
  reference; here the photo sits beside the noisy target at the current timestep (as in
  sakura-mini), so the template is the only reference and diffusers' own extract/cached loop
  (stock `Flux2KVAttnProcessor`s) runs this model unchanged — and gives the same image as our
  processors (`tests/sakura/models/test_flux2mini.py`). The Klein adapter's isolation mask is
  therefore not needed for this model.
- **The instruction is text.** In FLUX.2 the prompt is not part of the reference KV, so here the
  instruction id selects learned prompt tokens and is *not* in the template KV (unlike sakura-mini,
  which adds it to the template tokens). An injected template's instruction comes from
  `TemplateKV.layout["instruction"]` (or a streamed source's `.instruction`, or `instruction=`).
- **Same size class as sakura-mini** (width {cfg.dim}, {cfg.depth} attention layers, 64 tokens per
  image) so that both train in about an hour on the shared 2-core CPU and their template KVs have
  the same shape; only the block design differs.

Exactness (tests): NOCACHE, EXTRACT and INJECTED lossless KV give bit-identical images (max abs
difference 0.0), equal to diffusers' stock extract/cached loop; the injected path pulls layer i's
K/V from the source only when the forward pass reaches block i. `edit` runs one photo at a time:
in diffusers' extract forward the template shares its matmuls with the photo and target rows, and
a batch changes the matmul shapes, which changes rounding in the last bit.

## Data and tasks
Identical to sakura-mini (`docs/model-card.md`): photos from PyPI packages split by source image
(training: {', '.join(TRAIN_PHOTOS)}; held out: {', '.join(HELDOUT_PHOTOS)}), tasks look / texture /
sticker with exact classical ground truth, {PER_TASK} library templates per task of which the last
{HELD_OUT_PER_TASK} are held out, fresh random training templates plus a library training template
{recipe.library_frac:.0%} of the time.

## Training
Recipe (`sakura.cloud.training.Recipe`, the same loop and seeding as sakura-mini; `--model flux2-mini`):

```
{json.dumps(asdict(recipe), indent=1)}
```

- steps run: **{steps_done} of {recipe.steps}** ({steps_done * recipe.batch_size:,} examples), wall time {elapsed / 3600:.2f} h
  on the shared 2-core CPU (1 torch thread, nice 5, beside other engineers' jobs);
- final training loss (mean of the last 100 steps): {final_loss:.4f}; {said['loss']};
- loss curve: `docs/{fig}/loss.png`.

![loss]({fig}/loss.png)

## Quality (held-out photos x held-out templates)
{report.photos} held-out photo crops x {HELD_OUT_PER_TASK} held-out templates per task; PSNR in dB
(mean over images) and SSIM against the exact ground truth. *model*: lossless template KV
(extracted, then injected); *identity*: output = photo; *swapped*: the model given another
held-out template of the same task, scored against the intended template's ground truth.

{report.markdown()}

Target (model beats identity by >= 6 dB PSNR on every task, in-region too): this model
**{said['verdict']}** it{said['failing']}; {said['swapped']}. Figures: `docs/{fig}/quality.json`.
Reproduce: `sakura bench quality --model flux2-mini`.

![grid]({fig}/grid.png)

Beside sakura-mini (its committed `docs/model/quality.json`; same photos, templates, steps and seed):

{_mini_comparison(report)}

Sampler steps (Euler) vs model PSNR (dB); {said['steps']}:

{sweep_table}

## Reproduce
`sakura train --model flux2-mini --out runs/flux2 --batch-size {recipe.batch_size} --steps {recipe.steps} --lr {recipe.lr}`
(resumable: run it again after an interruption), then the same command with `--install` copies
the weights into `src/sakura/assets/` and writes this card. Seeded as sakura-mini: bit-identical
on the same machine and thread count.

## Limits
A tiny model trained for {elapsed / 3600:.2f} h on CPU; {said['weakest']}. It is the FLUX.2
*architecture*, not FLUX.2 weights: nothing here says how a real Klein checkpoint's template KV
compresses (that path is `load_model("klein:/folder")`, tested on a tiny saved pipeline only).
"""
