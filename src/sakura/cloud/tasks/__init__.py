"""sakura-mini's data and editing tasks: photos from installed packages, three template-defined
edits with exact ground truth, the template library, and the training-batch sampler."""

from sakura.util.lazy import lazy_names

#: public name -> the submodule it lives in, imported on first use (the edits and the library load
#: torch): the builder imports this package at module top, and the skip of an unchanged store must
#: load no torch
_LAZY = {**{n: ".edits" for n in ("TASKS", "Task", "get_task", "key_mask", "look_transfer", "sticker_composite",
                                  "texture_blend")},
         **{n: ".library" for n in ("TASK_NAMES", "Batch", "LibraryTemplate", "get_template", "library_templates",
                                    "sample_batch", "template_library")},
         **{n: ".photos" for n in ("HELDOUT_PHOTOS", "TRAIN_PHOTOS", "heldout_photos")}}
__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())

__all__ = ["HELDOUT_PHOTOS", "TASKS", "TASK_NAMES", "TRAIN_PHOTOS", "Batch", "LibraryTemplate", "Task", "get_task",
           "get_template", "heldout_photos", "key_mask", "library_templates", "look_transfer", "sample_batch",
           "sticker_composite", "template_library", "texture_blend"]
