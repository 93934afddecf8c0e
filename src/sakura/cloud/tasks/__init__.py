"""sakura-mini's data and editing tasks: photos from installed packages, three template-defined
edits with exact ground truth, the template library, and the training-batch sampler."""

from .edits import TASKS, Task, get_task, key_mask, look_transfer, sticker_composite, texture_blend
from .library import (TASK_NAMES, Batch, LibraryTemplate, get_template, library_templates, sample_batch,
                      template_library)
from .photos import HELDOUT_PHOTOS, TRAIN_PHOTOS, heldout_photos

__all__ = ["HELDOUT_PHOTOS", "TASKS", "TASK_NAMES", "TRAIN_PHOTOS", "Batch", "LibraryTemplate", "Task", "get_task",
           "get_template", "heldout_photos", "key_mask", "library_templates", "look_transfer", "sample_batch",
           "sticker_composite", "template_library", "texture_blend"]
