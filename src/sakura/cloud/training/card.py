"""The model card `sakura train` writes: data, tasks, architecture, recipe, steps, loss curve, quality."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import torch

from sakura.cloud.tasks import HELDOUT_PHOTOS, TASK_NAMES, TRAIN_PHOTOS
from sakura.cloud.tasks.edits import HELDOUT_PATTERNS, TRAIN_PATTERNS
from sakura.cloud.tasks.library import HELD_OUT_PER_TASK, PER_TASK
from sakura.cloud.tasks.photos import HELDOUT_TEXTURES, TRAIN_TEXTURES
from sakura.cloud.tasks.quality import evaluate_quality, quality_grid

from sakura.util.fsutil import write_json, write_text
from sakura.util.report import markdown_table

from .loop import CHECKPOINT, Recipe, load_weights
from .card_flux2 import flux2_card

#: Where each model's card and figures go, relative to the docs folder.
CARD_PATHS = {"sakura-mini": ("model-card.md", "model"), "flux2-mini": ("model-card-flux2.md", "model-flux2")}


def card_paths(model: str, docs_dir: str | Path) -> tuple[Path, Path]:
    """(card file, figure folder) of `model` under docs_dir."""
    card, figs = CARD_PATHS[model]
    return Path(docs_dir) / card, Path(docs_dir) / figs


def loss_trend(losses: list[list[float]], frac: float = 0.1) -> tuple[float, float]:
    """Mean training loss over the second-to-last and the last `frac` of the steps."""
    vals = [r[1] for r in losses]
    n = max(1, int(len(vals) * frac))
    last, prev = vals[-n:], vals[-2 * n:-n] or vals[-n:]
    return sum(prev) / len(prev), sum(last) / len(last)


def conclusions(report, sweep: dict, losses: list[list[float]], eval_steps: int) -> dict[str, str]:
    """The card's sentences that state a finding, computed from the measured numbers (never fixed text)."""
    out = {}
    out["verdict"] = "meets" if report.passes(6.0) else "does NOT meet"
    failing = [t.task for t in report.tasks if t.gain_db < 6.0]
    failing += [f"{t.task} (in region)" for t in report.tasks if t.gain_region_db is not None and t.gain_region_db < 6.0]
    out["failing"] = f" (short of +6 dB: {', '.join(failing)})" if failing else ""
    swapped_lower = [t.task for t in report.tasks if t.psnr["swapped"] < t.psnr["model"]]
    out["swapped"] = ("the swapped template scores lower than the intended one on every task, so the edits follow the template"
                      if len(swapped_lower) == len(report.tasks) else
                      f"the swapped template scores lower only on {', '.join(swapped_lower) or 'no task'}: "
                      "elsewhere the output does not follow the template")
    mean = {s: sum(t.psnr["model"] for t in r.tasks) / len(r.tasks) for s, r in sweep.items()}
    best = max(mean, key=mean.get)
    top = max(mean)
    d_more = mean[top] - mean[eval_steps] if top in mean and eval_steps in mean else float("nan")
    out["steps"] = (f"mean model PSNR over the tasks is highest at {best} steps ({mean[best]:.2f} dB); "
                    f"going from {eval_steps} to {top} steps changes it by {d_more:+.2f} dB")
    weakest = min(report.tasks, key=lambda t: t.gain_db)
    out["weakest"] = f"{weakest.task} gains the least over identity ({weakest.gain_db:+.2f} dB)"
    prev, last = loss_trend(losses)
    change = (last - prev) / prev if prev > 0 else 0.0
    out["loss"] = (f"the training loss was still falling at the end ({prev:.4f} -> {last:.4f} over the last two "
                   f"tenths of the run, {100 * change:+.1f}%), so a longer recipe would likely improve it"
                   if change < -0.02 else
                   f"the training loss had flattened by the end ({prev:.4f} -> {last:.4f} over the last two tenths "
                   f"of the run, {100 * change:+.1f}%)")
    return out


def loss_plot(losses: list[list[float]], path: Path, window: int = 50) -> None:
    """Training loss per step (light) and its moving average, overall and per task (log scale)."""
    import matplotlib  # lazy: matplotlib ([bench] extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib ([bench] extra)

    arr = torch.tensor(losses, dtype=torch.float64)                            # (steps, 2 + tasks)
    fig, ax = plt.subplots(figsize=(7, 4))

    def smooth(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ok = ~torch.isnan(y)
        x, y = arr[ok, 0], y[ok]
        k = min(window, len(y))
        if k < 2:
            return x, y
        ys = torch.nn.functional.avg_pool1d(y[None, None], k, stride=1)[0, 0]
        return x[k - 1:], ys

    ax.plot(arr[:, 0], arr[:, 1], color="0.8", lw=0.5, label="loss (per step)")
    ax.plot(*smooth(arr[:, 1]), color="k", lw=1.5, label=f"loss ({window}-step mean)")
    for i, name in enumerate(TASK_NAMES):
        ax.plot(*smooth(arr[:, 2 + i]), lw=1.0, label=name)
    ax.set_yscale("log")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (MSE)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_model_card(run_dir: str | Path, docs_dir: str | Path = "docs", *, eval_steps: int = 8,
                     command: str = "sakura train", note: str = "", weights: str | Path | None = None,
                     photos_per_source: int = 4) -> Path:
    """Evaluate the run's weights and write the model's card plus its figures (loss.png, grid.png,
    quality.json): docs_dir/model-card.md + docs_dir/model/ for sakura-mini,
    docs_dir/model-card-flux2.md + docs_dir/model-flux2/ for flux2-mini. Returns the card's path.

    weights: evaluate this file instead of the run's final weights (e.g. a run cut short).
    """
    run_dir, docs_dir = Path(run_dir), Path(docs_dir)
    ck = torch.load(run_dir / CHECKPOINT, map_location="cpu", weights_only=True)
    recipe = Recipe.from_dict(json.loads(ck["recipe"]))
    card_path, fig_dir = card_paths(recipe.model, docs_dir)
    fig_dir.mkdir(parents=True, exist_ok=True)
    losses = ck["losses"].tolist()
    steps_done, elapsed = int(ck["step"]), float(ck["elapsed_s"])
    model = load_weights(weights if weights is not None else run_dir / recipe.weights_name)
    desc = model.describe()

    loss_plot(losses, fig_dir / "loss.png")
    report = evaluate_quality(model, steps=eval_steps, photos_per_source=photos_per_source)
    quality_grid(model, fig_dir / "grid.png", steps=eval_steps)
    write_json(fig_dir / "quality.json", {**report.to_dict(), "passes_6db": report.passes(6.0), "recipe": asdict(recipe),
                                          "steps_done": steps_done, "train_seconds": elapsed}, indent=2)

    sweep = {s: evaluate_quality(model, steps=s, with_ssim=False, photos_per_source=photos_per_source)
             for s in (1, 2, 4, 8, 16)}
    sweep_table = markdown_table(
        ["steps", *(t.task for t in report.tasks), "sticker (in region)"],
        [[s, *(f"{t.psnr['model']:.2f}" for t in r.tasks),
          *(f"{t.psnr_region['model']:.2f}" for t in r.tasks if t.psnr_region is not None)] for s, r in sweep.items()],
        align="l" * (len(report.tasks) + 2))
    tail = [r[1] for r in losses[-100:]]
    final_loss = sum(tail) / len(tail) if tail else math.nan
    cfg = model.cfg
    said = conclusions(report, sweep, losses, eval_steps)
    if recipe.model == "flux2-mini":
        card = flux2_card(model=model, desc=desc, recipe=recipe, report=report, sweep_table=sweep_table, said=said,
                          steps_done=steps_done, elapsed=elapsed, final_loss=final_loss, eval_steps=eval_steps,
                          command=command, note=note, fig=fig_dir.name)
        write_text(card_path, card)
        return card_path
    verdict = said["verdict"]
    arch_table = markdown_table(["", ""], [
        ["image", f"{cfg.image_size}x{cfg.image_size} RGB, patch {cfg.patch_size} -> {cfg.tokens_per_image} tokens per image, "
                  f"{3 * cfg.tokens_per_image} in the sequence"],
        ["width / depth / heads", f"{cfg.dim} / {cfg.depth} / {cfg.heads} (head dim {cfg.head_dim})"],
        ["parameters", f"{desc['parameters']:,}"],
        ["template KV", f"{desc['template_kv_values']:,} values = {desc['template_kv_bytes_fp16'] / 1024:.0f} KiB in fp16 per template"],
        ["objective", f'rectified flow, x_t = (1-t) x0 + t eps, t ~ U(0,1); the head predicts x0 (`prediction="{cfg.prediction}"`'
                      f"{', as a residual over the photo' if cfg.photo_skip else ''}), the sampler uses v = (x_t - x0)/max(t, {cfg.t_min}); "
                      f"training loss = MSE on x0; Euler sampler, {eval_steps} steps in the benchmark"]], align="ll")
    tasks_table = markdown_table(["task", "instruction", "template", "ground truth"], [
        ["look", 1, "a colour-graded reference photo",
         "per-channel RGB mean/std of the photo matched to the reference's, clipped to [0,1]"],
        ["texture", 2, f"a tileable pattern: procedural ({', '.join(TRAIN_PATTERNS)}) or a tinted crop of {', '.join(TRAIN_TEXTURES)}",
         "0.5 photo + 0.5 pattern"],
        ["sticker", 3, "stickers/frames (shapes filled with colours, gradients, stripes or photo crops, optional outline) on a "
                       "pure-green key", "template pixels where not key, photo elsewhere (copies template detail)"]], align="llll")
    card = f"""# sakura-mini model card

The bundled editing model (`src/sakura/assets/sakura-mini.safetensors`), trained by this project
from scratch on CPU. It edits a photo according to a *template* (a reference image plus a fixed
instruction id) and exists so that every template-KV experiment can be scored against exact
ground truth. Written by `{command}`{(' - ' + note) if note else ''}.

## Architecture
Single-stream joint-attention DiT (`sakura.models.mini.MiniDiT`): sequence [template | photo |
noisy target] tokens, adaLN-Zero, QK-norm, 2-D RoPE shared by the three images. Template tokens
are modulated at the fixed timestep {cfg.template_timestep} and attend only to template tokens
(so their per-layer K/V depend only on the template: the reusable *template KV*); photo and target
tokens attend to everything. The template carries its task's instruction embedding.

{arch_table}

Why this size: `docs/model/tradeoff.md` (measured CPU throughput per configuration).

## Data (nothing downloaded)
Crops of photos shipped inside PyPI packages, split by **source image**:
- training photos: {', '.join(TRAIN_PHOTOS)} (`skimage.data`; `sklearn:` = scikit-learn sample image);
- held-out photos: {', '.join(HELDOUT_PHOTOS)} (`cat` is the same photograph as `chelsea`, so it is not used).
Augmentation: random square crops (30-100% of the shorter side) resized to {cfg.image_size}px
(antialiased), horizontal flips, +-15% brightness/contrast.

## Tasks (each defined entirely by its template; exact classical ground truth)
{tasks_table}

Template library: {PER_TASK} named templates per task, the last {HELD_OUT_PER_TASK} held out (never
trained on). Held-out templates come from held-out sources where the family has one: look
references are crops of held-out photos (with unseen random grades); texture patterns are tinted
crops of {', '.join(HELDOUT_TEXTURES)} or the pattern families {', '.join(HELDOUT_PATTERNS)}, which training
never draws; sticker fills that are photo crops come from held-out photos (shapes, colours,
gradients and stripes are unseen draws from the training families).
Training draws fresh random templates from the training families, and a library training
template {recipe.library_frac:.0%} of the time. Template tokens = photo tokens = {cfg.tokens_per_image}
(template-heavy: template tokens >= photo tokens).

## Training
Recipe (`sakura.cloud.training.Recipe`, defaults = this model):

```
{json.dumps(asdict(recipe), indent=1)}
```

- steps run: **{steps_done} of {recipe.steps}** ({steps_done * recipe.batch_size:,} examples), wall time {elapsed / 3600:.2f} h
  on a shared 2-core CPU (1 torch thread);
- final training loss (mean of the last 100 steps): {final_loss:.4f};
- loss curve: `docs/model/loss.png`.

![loss](model/loss.png)

## Quality (held-out photos x held-out templates)
{report.photos} held-out photo crops x {HELD_OUT_PER_TASK} held-out templates per task; PSNR in dB
(mean over images) and SSIM against the exact ground truth. *model*: lossless template KV
(extracted, then injected); *identity*: output = photo; *swapped*: the model given another
held-out template of the same task, scored against the intended template's ground truth.
For the sticker task the PSNR inside the edited (non-key) region is also given.

{report.markdown()}

Target (model beats identity by >= 6 dB PSNR on every task, in-region too): this model
**{verdict}** it{said['failing']}; {said['swapped']}. Figures: `docs/model/quality.json`.
Reproduce: `sakura bench quality`.

![grid](model/grid.png)

Sampler steps (Euler) vs model PSNR (dB) on the same data; {said['steps']}:

{sweep_table}

## Reproduce
`sakura train --out runs/train` (resumable: run it again after an interruption; Ctrl-C
checkpoints the last finished step), then `sakura train --out runs/train --install` copies the
weights into `src/sakura/assets/` and rewrites this card. Every random draw (init, data, noise,
t) comes from seeded generators saved in the checkpoint, so an interrupted and resumed run equals
an uninterrupted one bit for bit on the same machine and thread count (tested); on another CPU,
floating-point differences may change the weights slightly (not tested across CPUs).

## Limits
A tiny model trained for {elapsed / 3600:.2f} h on CPU: its edits are blurrier than the ground truth at
sharp edges (8x8 patches, rank-{cfg.dim} output head); {said['weakest']}; {said['loss']}.
It knows only these three tasks and template families.
"""
    write_text(card_path, card)
    return card_path
