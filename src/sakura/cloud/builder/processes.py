"""Templates built at once in processes forked after the model loads (`build_store(template_workers=)`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
import multiprocessing as mp
import sys
import threading

from sakura.cloud.builder.probes import cpu_count as _cpu_count
from sakura.cloud.builder.progress import Stages
from sakura.cloud.builder.template import build_template

def _template_processes(requested: int | None, device: Any, templates: int) -> int:
    """How many template processes `build_store` forks (see its `template_workers`)."""
    can_fork = sys.platform == "linux" and "fork" in mp.get_all_start_methods() and device.type == "cpu"
    if requested is None:
        return min(_cpu_count(), templates) if can_fork else 1
    if requested < 1:
        raise ValueError(f"template_workers must be >= 1, got {requested}")
    if requested > 1 and not can_fork:
        raise ValueError("template_workers > 1 builds templates in processes forked after the model loads: on "
                         f"the CPU under Linux only (here: {device.type} on {sys.platform}); an accelerator "
                         "builds one template at a time (--executor ray spreads templates over machines)")
    return min(requested, templates)


#: what a forked template process reads: set by `_build_in_processes` just before it forks
_FORK_JOB: dict[str, Any] = {}


def _build_in_processes(processes: int, tpls, job: dict, stages: "Stages", log) -> list[Path]:
    """`build_template` of every template in `processes` forked processes (they inherit the
    model and `job`; only an index goes over and (path, stage seconds, log lines) come back). Each
    process reports its stages through a queue to the parent's bar; a template's log lines print
    when it is done."""
    ctx = mp.get_context("fork")
    events = ctx.Queue()
    _FORK_JOB.update(job, tpls=tpls, events=events)

    def show() -> None:  # the parent's bar, moved by the processes' stage events
        for template, stage, done in iter(events.get, None):
            stages.bar.set_description_str(f"{template}: {stage}", refresh=False)
            stages.bar.update(done)

    shower = threading.Thread(target=show, name="build-progress", daemon=True)
    shower.start()
    out: list[Path | None] = [None] * len(tpls)
    pool = ctx.Pool(processes)
    try:
        for i, path, seconds, facts, lines in pool.imap_unordered(_forked_template, range(len(tpls))):
            for line in lines:
                log(line)
            out[i] = Path(path)
            stages.seconds.update(seconds)
            stages.facts.update(facts)
        pool.close()
    finally:
        pool.terminate()
        pool.join()
        events.put(None)
        shower.join()
        _FORK_JOB.clear()
    return [p for p in out if p is not None]


def _forked_template(i: int) -> tuple[int, str, dict, dict, list[str]]:
    job = dict(_FORK_JOB)
    name, images, instruction = job.pop("tpls")[i]
    events = job.pop("events")
    lines: list[str] = []
    stages = Stages(1, progress=False)
    stages.notify = lambda template, stage, done: events.put((template, stage, done))
    stages.start(name)
    path = build_template(name=name, images=images, instruction=instruction, stages=stages, log=lines.append,
                           **job)
    stages.finish_template()
    return i, str(path), stages.seconds, stages.facts, lines


