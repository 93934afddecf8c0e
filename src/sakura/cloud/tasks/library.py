"""The template library and the training-batch sampler.

`template_library(size)` is a fixed, named set of templates: 12 per task, of which 4 are held out
(`held_out=True`: drawn from held-out sources and never shown in training). Library templates are
deterministic functions of (task, index, size), so every machine builds the same library.

`sample_batch` draws training (or evaluation) examples: a task, a template (a fresh random draw
from the split's template family, or with probability `library_frac` one of the library's
training templates), an augmented photo crop, and the exact ground truth.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass

import torch

from .edits import TASKS, get_task
from .photos import PhotoSampler, heldout_photos

PER_TASK = 12
HELD_OUT_PER_TASK = 4


@dataclass(frozen=True)
class LibraryTemplate:
    """A named template. image: (3, S, S) in [0, 1]; instruction: its fixed instruction id."""

    name: str
    task: str
    image: torch.Tensor
    instruction: int
    held_out: bool


def _seed(*parts: object) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode())


@functools.lru_cache(maxsize=8)
def template_library(size: int) -> tuple[LibraryTemplate, ...]:
    """All library templates at `size` pixels: for each task, `PER_TASK` of which the last
    `HELD_OUT_PER_TASK` are held out. Names: "<task>-NN" (train) and "<task>-hN" (held out)."""
    out = []
    for name, task in TASKS.items():
        for i in range(PER_TASK):
            held = i >= PER_TASK - HELD_OUT_PER_TASK
            gen = torch.Generator().manual_seed(_seed("sakura-library", name, i))
            # 8-bit, like every published template image: the store keeps it as a lossless PNG, and
            # the KV the cloud captures from it is exactly what a phone computes from that PNG
            img = (task.make_template("heldout" if held else "train", size, gen) * 255.0).round() / 255.0
            label = f"{name}-h{i - (PER_TASK - HELD_OUT_PER_TASK)}" if held else f"{name}-{i:02d}"
            out.append(LibraryTemplate(label, name, img, task.instruction, held))
    return tuple(out)


def library_templates(size: int, *, task: str | None = None, held_out: bool | None = None
                      ) -> list[LibraryTemplate]:
    """Filter the library by task and/or held-out flag."""
    if task is not None:
        get_task(task)
    return [t for t in template_library(size)
            if (task is None or t.task == task) and (held_out is None or t.held_out == held_out)]


def get_template(name: str, size: int) -> LibraryTemplate:
    for t in template_library(size):
        if t.name == name:
            return t
    raise ValueError(f"no template named {name!r} in the library")


@dataclass
class Batch:
    """template, photo, target: (B, 3, S, S); instruction, task_index: (B,) long."""

    template: torch.Tensor
    instruction: torch.Tensor
    photo: torch.Tensor
    target: torch.Tensor
    task_index: torch.Tensor


TASK_NAMES = tuple(TASKS)


def sample_batch(batch_size: int, size: int, gen: torch.Generator, *, split: str = "train",
                 tasks: tuple[str, ...] = TASK_NAMES, library_frac: float = 0.25) -> Batch:
    """Draw one batch; every random choice comes from `gen`, so a saved generator state
    reproduces the rest of a run exactly."""
    photos = PhotoSampler(split, size, augment=(split == "train"))
    lib = {name: library_templates(size, task=name, held_out=(split != "train")) for name in tasks}
    tmpl, ins, ph, tgt, idx = [], [], [], [], []
    for _ in range(batch_size):
        k = int(torch.randint(len(tasks), (1,), generator=gen))
        task = get_task(tasks[k])
        if float(torch.rand((), generator=gen)) < library_frac:
            t = lib[task.name][int(torch.randint(len(lib[task.name]), (1,), generator=gen))].image
        else:
            t = task.make_template(split, size, gen)
        p = photos.sample(gen)
        tmpl.append(t)
        ph.append(p)
        tgt.append(task.ground_truth(p[None], t[None])[0])
        ins.append(task.instruction)
        idx.append(TASK_NAMES.index(task.name))
    return Batch(torch.stack(tmpl), torch.tensor(ins), torch.stack(ph), torch.stack(tgt), torch.tensor(idx))


__all__ = ["Batch", "LibraryTemplate", "get_template", "heldout_photos", "library_templates", "sample_batch",
           "template_library"]
