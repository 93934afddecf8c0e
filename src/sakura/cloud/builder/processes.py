"""Templates built at once in processes forked after the model loads (`build_store(template_workers=)`).

Each template process talks to the parent over its own pipe only: the parent hands it a
template index, it sends back stage events and then the result. Nothing is shared that a process
could die holding: with `multiprocessing.Pool` a worker that Ctrl-C ended while it waited for work
kept the pool's queue lock, and the parent's `terminate()` then waited for that lock forever (a
build hung after Ctrl-C, seen in CI). A pipe whose writer died reads as EOF instead.
"""

from __future__ import annotations

from multiprocessing.connection import wait as _wait_any
from pathlib import Path
from typing import Any
import multiprocessing as mp
import sys
import threading
import traceback

from sakura.cloud.builder.probes import cpu_count as _cpu_count
from sakura.cloud.builder.progress import Stages
from sakura.cloud.builder.template import build_template

#: how long a template process that was told to stop may take to exit before it is terminated (s)
_EXIT_GRACE_S = 10.0


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


class TemplateProcessError(RuntimeError):
    """A template process ended without a result (killed, or crashed below Python)."""


class _RemoteTraceback(Exception):
    """The traceback of an exception raised in a template process (its ``__cause__`` in the parent)."""

    def __str__(self) -> str:
        return self.args[0]


def _build_in_processes(processes: int, tpls, job: dict, stages: "Stages", log) -> list[Path]:
    """`build_template` of every template in `processes` forked processes (they inherit the
    model and `job`; only an index goes over and (path, stage seconds, log lines) come back). The
    processes report their stages to the parent's bar as they go; a template's log lines print
    when it is done. An exception in a process is raised here (its traceback as the cause)."""
    ctx = mp.get_context("fork")
    _FORK_JOB.update(job, tpls=tpls)
    out: list[Path | None] = [None] * len(tpls)
    children: list[tuple[Any, Any]] = []  # (process, the parent's end of its pipe)
    finished = False
    try:
        for _ in range(processes):
            here, there = ctx.Pipe(duplex=True)
            proc = ctx.Process(target=_template_process, args=(there,), daemon=True)
            proc.start()
            there.close()  # only the child holds its end: the child's death reads as EOF here
            children.append((proc, here))
        todo = iter(range(len(tpls)))
        busy = {}
        for proc, conn in children:
            if (i := next(todo, None)) is not None:
                conn.send(i)
                busy[conn] = proc
            else:
                conn.send(None)
        while busy:
            for conn in _wait_any(list(busy)):
                try:
                    msg = conn.recv()
                except (EOFError, ConnectionResetError):  # a socket pair: a peer that died unread resets
                    proc = busy.pop(conn)
                    proc.join(_EXIT_GRACE_S)
                    raise TemplateProcessError(f"a template process ended without a result (exit code "
                                               f"{proc.exitcode}); rerun the build to finish") from None
                if msg[0] == "stage":
                    _kind, template, stage, done = msg
                    stages.bar.set_description_str(f"{template}: {stage}", refresh=False)
                    stages.bar.update(done)
                elif msg[0] == "done":
                    _kind, i, path, seconds, facts, lines = msg
                    for line in lines:
                        log(line)
                    out[i] = Path(path)
                    stages.seconds.update(seconds)
                    stages.facts.update(facts)
                    nxt = next(todo, None)
                    try:
                        conn.send(nxt)
                    except (BrokenPipeError, ConnectionResetError):
                        pass  # it died after its result: the next recv reads EOF and says so
                    if nxt is None:
                        busy.pop(conn)
                else:  # "error"
                    _kind, exc, remote_tb = msg
                    raise (exc if exc is not None else RuntimeError("a template process failed")) \
                        from _RemoteTraceback(remote_tb)
        finished = True
    finally:
        for proc, conn in children:
            if not finished and proc.is_alive():
                proc.terminate()  # an error or Ctrl-C here: the other templates' work is not wanted
            conn.close()
        for proc, _conn in children:
            proc.join(_EXIT_GRACE_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
        _FORK_JOB.clear()
    return [p for p in out if p is not None]


def _template_process(conn) -> None:
    """A forked template process: builds the templates the parent names until it sends None (or
    goes away: EOF)."""
    job = dict(_FORK_JOB)
    tpls = job.pop("tpls")
    sending = threading.Lock()  # stage events and the result may come from different threads

    def send(msg) -> None:
        with sending:
            conn.send(msg)

    try:
        while (i := conn.recv()) is not None:
            name, images, instruction = tpls[i]
            lines: list[str] = []
            stages = Stages(1, progress=False)
            stages.notify = lambda template, stage, done: send(("stage", template, stage, done))
            stages.start(name)
            try:
                path = build_template(name=name, images=images, instruction=instruction, stages=stages,
                                      log=lines.append, **job)
                stages.finish_template()
            except Exception as e:  # noqa: BLE001 -- sent to the parent, which raises it
                tb = traceback.format_exc()
                try:
                    send(("error", e, tb))
                except Exception:  # noqa: BLE001 -- the exception does not pickle: its text goes
                    send(("error", None, tb))
                return
            send(("done", i, str(path), stages.seconds, stages.facts, lines))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the parent is gone or stopped the build
