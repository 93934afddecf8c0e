"""What `sakura train` does (train or resume, evaluate, write the model card, install): the
command's body, beside the training loop it drives; `sakura.cli.main` stays a thin shell."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import torch

from sakura.cloud.training.loop import Recipe, train
from sakura.cloud.training.card import card_paths, write_model_card
from sakura.models import ASSETS
from sakura.util.report import report_logger

#: the command's lines (and the training loop's, `sakura.cloud.training.loop`) on stdout, plain
log = report_logger(__name__, root="sakura.cloud.training")


def train_command(out: Path, *, overrides: dict, resume: bool = True, install: bool = False,
                  docs: Path = Path("docs"), eval_steps: int = 8, eval_photos: int = 4, threads: int = 1) -> None:
    """Train (or resume) in `out`, then evaluate and write out/model-card.md (+ out/model/*.png).

    overrides: Recipe fields to change (None values ignored). With `install`, the finished weights
    are copied to the bundled asset path and the card is written to `docs` as well.
    """
    torch.set_num_threads(threads)
    recipe = replace(Recipe(), **{k: v for k, v in overrides.items() if v is not None})
    out = Path(out)
    log.info("%s", f"recipe: {recipe}")
    log.info("%s", f"model: {recipe.model_config()}")
    state = train(recipe, out, resume=resume)
    if state.step < recipe.steps:
        log.info("%s", f"stopped at step {state.step} of {recipe.steps}; run the same command to resume")
        return
    weights = out / recipe.weights_name
    log.info("%s", f"trained {state.step} steps in {state.elapsed_s / 3600:.2f} h; weights: {weights}")

    cmd = "sakura train" + "".join(f" --{k.replace('_', '-')} {v}" for k, v in overrides.items() if v is not None)
    card = write_model_card(out, out, eval_steps=eval_steps, command=cmd, photos_per_source=eval_photos)
    log.info("%s", f"model card: {card}")
    if install:
        asset = ASSETS / recipe.weights_name
        asset.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(weights, asset)
        # the card just written for `out` is the docs card: copy it and its figures, don't re-evaluate
        src_card, src_figs = card_paths(recipe.model, out)
        dst_card, dst_figs = card_paths(recipe.model, docs)
        dst_figs.mkdir(parents=True, exist_ok=True)
        for f in src_figs.iterdir():
            shutil.copyfile(f, dst_figs / f.name)
        shutil.copyfile(src_card, dst_card)
        log.info("%s", f"installed weights at {asset}; model card: {dst_card}")
    log.info("%s", (card_paths(recipe.model, out)[1] / "quality.json").read_text())
