"""Training sakura-mini: the recipe, the resumable loop, and the model card it writes."""

from .loop import CHECKPOINT, WEIGHTS, Recipe, TrainState, load_checkpoint, save_checkpoint, train

__all__ = ["CHECKPOINT", "WEIGHTS", "Recipe", "TrainState", "load_checkpoint", "save_checkpoint", "train"]
