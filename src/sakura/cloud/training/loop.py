"""`sakura train`: rectified-flow training of sakura-mini or flux2-mini on the three template-defined tasks.

One recipe serves both models (`Recipe.model`): the same data, tasks, split, objective, optimizer,
schedule and seeding; only the network differs.

Seeded and resumable: every random draw (init, data, noise, t) comes from generators whose
states are checkpointed with the model and optimizer, so a run interrupted and resumed gives the
same weights as an uninterrupted one (bit-exact on the same machine and thread count).

Rectified flow as in `MiniDiT`: x_t = (1 - t) x_0 + t ε with x_0 the ground-truth edit,
t ~ U(0, 1); the model predicts v = ε - x_0 given (template, instruction, photo, x_t, t).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm
from safetensors import safe_open

from sakura.util.fsutil import atomic_write
from sakura.models.mini import MiniConfig, MiniDiT
from sakura.cloud.tasks.library import TASK_NAMES, sample_batch
from sakura.util.fsutil import write_json
from sakura.models.mini_io import load_mini_weights, save_mini_weights

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.pt"
WEIGHTS = "sakura-mini.safetensors"
MODELS = ("sakura-mini", "flux2-mini")


def weights_name(model: str) -> str:
    """File name of a run's final weights (and of the bundled asset): "<model>.safetensors"."""
    return f"{model}.safetensors"


@dataclass(frozen=True)
class Recipe:
    """Everything that determines the trained weights. The defaults are the bundled model's recipe.

    Model: 64x64 images, 8x8 patches (64 tokens per image, 192 in the sequence), width 128,
    6 blocks, 4 heads; see docs/model-card.md for the measured throughput behind this choice.
    """

    image_size: int = 64
    patch_size: int = 8
    dim: int = 128
    depth: int = 6
    heads: int = 4
    steps: int = 2800
    batch_size: int = 32
    lr: float = 6e-4              # peak AdamW learning rate
    warmup_steps: int = 100       # linear warmup, then cosine decay to min_lr_frac * lr
    min_lr_frac: float = 0.05
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    library_frac: float = 0.25    # share of examples using a library (training) template
    seed: int = 0
    checkpoint_every: int = 100
    # Which network: "sakura-mini" (MiniDiT) or "flux2-mini" (diffusers' Flux2Transformer2DModel;
    # `depth` = double_layers + single_layers blocks, `double_layers` of them double-stream).
    model: str = "sakura-mini"
    double_layers: int = 2
    # flux2-mini only: train with stock multi-reference attention (the photo is a second
    # reference and reference tokens attend to each other, as stock FLUX.2 Klein), to measure
    # what sakura's template isolation costs on a checkpoint not trained with it.
    stock_references: bool = False
    # With stock_references: train with sakura's template isolation instead (template queries
    # attend to template keys only), e.g. as a short fine-tune of a stock checkpoint (init_from).
    isolate_template: bool = False
    # Start from these weights (a .safetensors file or a run folder's checkpoint.pt) instead of
    # the seeded init; the optimizer and schedule start fresh.
    init_from: str = ""

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if self.stock_references and self.model != "flux2-mini":
            raise ValueError("stock_references applies to flux2-mini only")
        if self.isolate_template and not self.stock_references:
            raise ValueError("isolate_template applies with stock_references (without it the template is isolated "
                             "by construction)")

    def model_config(self):
        if self.model == "flux2-mini":
            from sakura.models.flux2mini import Flux2MiniConfig  # lazy: diffusers ([flux] extra)

            if not 0 <= self.double_layers <= self.depth:
                raise ValueError(f"double_layers {self.double_layers} must be in [0, depth={self.depth}]")
            return Flux2MiniConfig(image_size=self.image_size, patch_size=self.patch_size, dim=self.dim,
                                   heads=self.heads, double_layers=self.double_layers,
                                   single_layers=self.depth - self.double_layers,
                                   photo_reference=self.stock_references,
                                   isolate_template=self.isolate_template or not self.stock_references)
        return MiniConfig(image_size=self.image_size, patch_size=self.patch_size, dim=self.dim,
                          depth=self.depth, heads=self.heads)

    def build_model(self) -> torch.nn.Module:
        if self.model == "flux2-mini":
            from sakura.models.flux2mini import Flux2MiniDiT  # lazy: diffusers ([flux] extra)

            return Flux2MiniDiT(self.model_config())
        return MiniDiT(self.model_config())

    @property
    def weights_name(self) -> str:
        return weights_name(self.model)

    def lr_at(self, step: int) -> float:
        """Learning rate for optimizer step `step` (0-based)."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        span = max(1, self.steps - self.warmup_steps)
        frac = min(1.0, (step - self.warmup_steps) / span)
        return self.lr * (self.min_lr_frac + (1 - self.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))

    @classmethod
    def from_dict(cls, d: dict) -> "Recipe":
        d = {"stock_references": False, "isolate_template": False, "init_from": "", **d}  # older checkpoints
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown recipe keys {sorted(unknown)}")
        return cls(**d)


@dataclass
class TrainState:
    """What a checkpoint holds besides the recipe. losses: per step [step, loss, loss per task...]
    (a task absent from a batch logs NaN)."""

    model: torch.nn.Module        # MiniDiT or Flux2MiniDiT
    optimizer: torch.optim.Optimizer
    data_gen: torch.Generator
    noise_gen: torch.Generator
    step: int = 0
    losses: list[list[float]] | None = None
    elapsed_s: float = 0.0


def _atomic_torch_save(obj: object, path: Path) -> None:
    atomic_write(path, lambda f: torch.save(obj, f))


def new_state(recipe: Recipe) -> TrainState:
    torch.manual_seed(recipe.seed)
    model = recipe.build_model()
    if recipe.init_from:
        model.load_state_dict(_init_state(Path(recipe.init_from)), strict=True)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.99), weight_decay=recipe.weight_decay)
    data_gen = torch.Generator().manual_seed(recipe.seed * 1_000_003 + 1)
    noise_gen = torch.Generator().manual_seed(recipe.seed * 1_000_003 + 2)
    return TrainState(model, opt, data_gen, noise_gen, 0, [], 0.0)


def _init_state(path: Path) -> dict:
    """Weights to start from: a weights file, or a run folder / checkpoint.pt (its model state)."""
    if path.is_dir():
        path = path / CHECKPOINT
    if not path.is_file():
        raise FileNotFoundError(f"init_from: {path} not found")
    if path.suffix == ".safetensors":
        return load_weights(path).state_dict()
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def save_checkpoint(recipe: Recipe, state: TrainState, run_dir: Path) -> Path:
    """Atomic (temp + rename) write of everything needed to resume."""
    path = run_dir / CHECKPOINT
    _atomic_torch_save({
        "format": "sakura-mini-train/1",
        "recipe": json.dumps(asdict(recipe), sort_keys=True),
        "step": state.step,
        "model": state.model.state_dict(),
        "optimizer": state.optimizer.state_dict(),
        "data_gen": state.data_gen.get_state(),
        "noise_gen": state.noise_gen.get_state(),
        "losses": torch.tensor(state.losses, dtype=torch.float64) if state.losses else torch.zeros(0, 2 + len(TASK_NAMES), dtype=torch.float64),
        "elapsed_s": state.elapsed_s,
    }, path)
    return path


def load_checkpoint(recipe: Recipe, run_dir: Path) -> TrainState:
    """Resume state from run_dir/checkpoint.pt; refuses a checkpoint made with another recipe."""
    path = run_dir / CHECKPOINT
    ck = torch.load(path, map_location="cpu", weights_only=True)
    if ck.get("format") != "sakura-mini-train/1":
        raise ValueError(f"{path}: not a sakura-mini training checkpoint")
    saved = Recipe.from_dict(json.loads(ck["recipe"]))
    if saved != recipe:
        diff = {k: (v, getattr(recipe, k)) for k, v in asdict(saved).items() if getattr(recipe, k) != v}
        raise ValueError(f"{path} was made with a different recipe (saved, asked): {diff}; "
                         f"use another --out folder or the same options")
    state = new_state(recipe)
    state.model.load_state_dict(ck["model"], strict=True)
    state.optimizer.load_state_dict(ck["optimizer"])
    state.data_gen.set_state(ck["data_gen"])
    state.noise_gen.set_state(ck["noise_gen"])
    state.step = int(ck["step"])
    state.losses = ck["losses"].tolist()
    state.elapsed_s = float(ck["elapsed_s"])
    return state


def train_step(recipe: Recipe, state: TrainState) -> list[float]:
    """One optimizer step. Returns [step, loss, per-task loss...] for the loss log."""
    model, opt = state.model, state.optimizer
    model.train()
    b = sample_batch(recipe.batch_size, recipe.image_size, state.data_gen, library_frac=recipe.library_frac)
    eps = torch.randn(b.target.shape, generator=state.noise_gen)
    t = torch.rand(b.target.shape[0], generator=state.noise_gen)
    tt = t.view(-1, 1, 1, 1)
    x_t = (1 - tt) * b.target + tt * eps                                       # (B, 3, S, S)
    v = model.training_velocity(b.template, b.instruction, b.photo, x_t, t)  # (B, 3, S, S)
    if model.cfg.prediction == "x":
        # x-prediction, loss on x_0 (= the v-loss weighted by t^2): the edits are deterministic,
        # so this is the per-pixel MSE of the model's estimate of the edited image at every t.
        x0_hat = x_t - t.clamp(min=model.cfg.t_min).view(-1, 1, 1, 1) * v
        per = (x0_hat - b.target).pow(2).mean(dim=(1, 2, 3))                   # (B,)
    else:
        per = (v - (eps - b.target)).pow(2).mean(dim=(1, 2, 3))                # (B,)
    loss = per.mean()
    for g in opt.param_groups:
        g["lr"] = recipe.lr_at(state.step)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
    opt.step()
    row = [float(state.step), float(loss.detach())]
    for k in range(len(TASK_NAMES)):
        m = b.task_index == k
        row.append(float(per[m].detach().mean()) if bool(m.any()) else float("nan"))
    return row


def save_weights(model: torch.nn.Module, path: Path, extra_meta: dict[str, str]) -> Path:
    from sakura.models.flux2mini import Flux2MiniDiT, save_flux2_mini_weights  # lazy: diffusers ([flux] extra)

    if isinstance(model, Flux2MiniDiT):
        return save_flux2_mini_weights(model, path, extra_meta)
    return save_mini_weights(model, path, extra_meta)


def load_weights(path: str | os.PathLike) -> torch.nn.Module:
    """Load a run's (or the bundled) weights of either model, by the format in the file."""
    from sakura.models.flux2mini import load_flux2_mini_weights  # lazy: diffusers ([flux] extra)

    with safe_open(str(path), framework="pt") as f:
        fmt = (f.metadata() or {}).get("format")
    return load_flux2_mini_weights(path) if fmt == "flux2-mini" else load_mini_weights(path)


def train(recipe: Recipe, run_dir: str | os.PathLike, *, resume: bool = True, stop_after: int | None = None,
          progress: bool = True, on_step: Callable[[TrainState], None] | None = None) -> TrainState:
    """Train (or resume) in `run_dir`; writes checkpoint.pt every `checkpoint_every` steps and at
    the end, and the final weights to run_dir/<model>.safetensors.

    stop_after: stop once this many steps are done (checkpointing first), as an interruption
    would; a later call resumes. Ctrl-C also checkpoints the last finished step before exiting.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json((run_dir / "recipe.json"), asdict(recipe), indent=2, sort_keys=True)
    if resume and (run_dir / CHECKPOINT).is_file():
        state = load_checkpoint(recipe, run_dir)
        log.info("resuming %s at step %d", run_dir, state.step)
    else:
        state = new_state(recipe)
    end = recipe.steps if stop_after is None else min(recipe.steps, stop_after)
    start_step = state.step
    bar = tqdm(total=recipe.steps, initial=state.step, desc=f"sakura train {recipe.model}", unit="step", disable=not progress,
               dynamic_ncols=True, mininterval=2.0)
    t_mark = time.perf_counter()
    try:
        while state.step < end:
            row = train_step(recipe, state)
            state.losses.append(row)
            state.step += 1
            now = time.perf_counter()
            state.elapsed_s += now - t_mark
            t_mark = now
            bar.update(1)
            if state.step % 10 == 0:
                recent = [r[1] for r in state.losses[-50:]]
                bar.set_postfix(loss=f"{sum(recent) / len(recent):.4f}", lr=f"{recipe.lr_at(state.step - 1):.2e}")
            if state.step % recipe.checkpoint_every == 0 or state.step == end:
                save_checkpoint(recipe, state, run_dir)
            if on_step is not None:
                on_step(state)
    except KeyboardInterrupt:
        save_checkpoint(recipe, state, run_dir)
        bar.close()
        log.warning("interrupted at step %d; checkpoint saved, run the same command to resume", state.step)
        raise
    bar.close()
    ran = state.step > start_step
    if state.step >= recipe.steps and (ran or not (run_dir / recipe.weights_name).is_file()):  # don't rewrite a finished run's file
        state.model.eval()
        state.model.invalidate_fingerprint()
        save_weights(state.model, run_dir / recipe.weights_name, extra_meta={
            "recipe": json.dumps(asdict(recipe), sort_keys=True), "steps": str(state.step),
            "train_seconds": f"{state.elapsed_s:.0f}"})
    return state
