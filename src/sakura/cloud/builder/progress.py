"""The build's progress: stages per template, their wall and CPU seconds, calibration edits, the bar."""

from __future__ import annotations

import threading
import time
from typing import Callable
import contextlib
from tqdm import tqdm

#: The build's stages, in order, as the progress bar and `build_store(profile=...)` name them.
STAGES = ("capture", "importance", "sensitivity", "probe reference", "ladder search", "fit tables", "encode",
          "rendition probes", "quality floor", "write")
#: the stages a template's build with the sensitivity model runs (its reference edit is the
#: sensitivity's forward pass; "rendition probes" are its figure checks)
MODEL_STAGES = tuple(s for s in STAGES if s != "probe reference")


class Stages:
    """Wall and CPU seconds per build stage of the current template, and the progress bar over
    (template, stage) units: the bar names the template and stage and appears before the model loads."""

    def __init__(self, n_templates: int, progress: bool):
        if progress:
            self.bar = tqdm(total=n_templates * len(STAGES), unit="stage", mininterval=0.5,
                            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} stages "
                                       "[{elapsed}<{remaining}]")
        else:  # no tqdm at all: a template process forked from a parent whose bar holds tqdm's locks
            self.bar = _NullBar(total=n_templates * len(STAGES))
        self.template = ""
        self.seconds: dict[str, dict[str, float]] = {}
        #: per template what the build reports besides seconds (calibration edits, figure checks, ...)
        self.facts: dict[str, dict] = {}
        #: called with (template, stage, stage units done) as stages start (0) and end: a forked
        #: template process reports its stages to the parent's bar through it
        self.notify: Callable[[str, str, int], None] | None = None

    def start(self, template: str) -> None:
        self.template = template
        self.seconds[template] = {}
        self.facts[template] = {}
        self.done = 0

    def start_skipped(self, template: str) -> None:
        """`template` was skipped (current): its stages count as done on the bar."""
        self.template = template
        self.bar.set_description_str(f"{template}: skipped", refresh=True)
        self.bar.update(len(STAGES))
        if self.notify is not None:
            self.notify(template, "skipped", len(STAGES))

    def stage(self, name: str):
        @contextlib.contextmanager
        def run():
            self.bar.set_description_str(f"{self.template}: {name}" if self.template else name, refresh=True)
            if self.notify is not None:
                self.notify(self.template, name, 0)
            t0, c0 = time.perf_counter(), time.process_time()
            yield
            d = self.seconds.setdefault(self.template, {})
            d[name] = d.get(name, 0.0) + time.perf_counter() - t0
            d[name + " cpu"] = d.get(name + " cpu", 0.0) + time.process_time() - c0
            self.advance(name)
        return run()

    def advance(self, name: str) -> None:
        """Mark `name` done for this template (once: encode and the probes repeat per rendition)."""
        idx = STAGES.index(name) + 1
        if idx > self.done:
            self.bar.update(idx - self.done)
            if self.notify is not None:
                self.notify(self.template, name, idx - self.done)
            self.done = idx

    def finish_template(self) -> None:
        self.advance(STAGES[-1])

    def close(self) -> None:
        self.bar.close()


class _NullBar:
    """What `_Stages` calls on a bar, doing nothing."""

    def __init__(self, total: int) -> None:
        self.total, self.n = total, 0

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_description_str(self, desc: str, refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass




class CountingModel:
    """`model` with its calibration edits counted in `edits`: one unit is one edit of the
    `n_photos` calibration photos (a call on fewer photos counts that fraction; a probe resumed at
    its layer (`edit_replacing`) counts whole; a first-step prefix 1/steps; a batched call its
    edits). Backward passes are added by the caller (2 x their photos / `n_photos` each: `KVSensitivity.backward_edits`).
    Every other attribute is the model's; thread-safe (probes run in threads)."""

    _COUNTED = ("edit", "differentiable_edit", "edit_many", "edit_replacing", "first_step_prefix")

    def __init__(self, model, n_photos: int) -> None:
        self._model, self._n = model, max(1, int(n_photos))
        self._lock = threading.Lock()
        self.edits = 0.0

    def add(self, edits: float) -> None:
        with self._lock:
            self.edits += edits

    def __getattr__(self, name: str):
        attr = getattr(self._model, name)  # AttributeError when the model lacks it (hasattr stays true to it)
        if name not in CountingModel._COUNTED:
            return attr

        def counted(*args, **kwargs):
            if name == "edit_replacing":
                photos = args[0].photo.shape[0]
            else:
                photos = (args[0] if args else kwargs["photo"]).shape[0]
            if name == "edit_many":
                photos *= len(args[1] if len(args) > 1 else kwargs["template_kvs"])
            self.add(photos / self._n / (int(kwargs.get("steps", 8)) if name == "first_step_prefix" else 1))
            return attr(*args, **kwargs)
        return counted
