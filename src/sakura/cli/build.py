"""The body of `sakura build` (wired into sakura.cli.main): one-line errors, then the local or Ray build."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from pathlib import Path
from typing import Iterator

import typer


def build_cmd(store: Path, model: str, templates: list[str] | None, ladder: list[str] | None, calibration: int,
              steps: int, *, executor: str = "local", address: str | None = None, workers: int | None = None,
              force: bool = False, library: Path | None = None, task: str | None = None,
              prompt: str | None = None, device: str = "auto", dtype: str = "auto", probe_batch: int | None = None,
              probe_workers: int | None = None, allocation_photos: int | None = None, quiet: bool = False) -> None:
    """Body of `sakura build`: clear one-line errors for bad names/specs instead of tracebacks.

    ``executor="local"`` (default) builds in this process as before; ``"ray"`` spreads templates
    over a Ray cluster (``sakura.cloud.builder.distributed``), skipping templates already current; exit 1
    if any template failed (the others are committed)."""
    from sakura.cloud.builder.pipeline import DEFAULT_LADDER, build_store

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if executor not in ("local", "ray"):
        typer.echo(f"error: --executor must be local or ray, got {executor!r}", err=True)
        raise typer.Exit(2)
    if executor == "local" and (address or force):
        typer.echo("error: --address/--force apply to --executor ray", err=True)
        raise typer.Exit(2)
    from sakura.cloud.builder.template_files import TemplateSpecError, template_args
    try:
        templates = template_args(templates, library=library, task=task, prompt=prompt)
        if executor == "ray" and templates and not all(isinstance(t, str) for t in templates):
            raise TemplateSpecError(["--executor ray builds library templates only; build --library / "
                                     "--template ID=IMAGE with --executor local"])
    except TemplateSpecError as e:
        for line in e.problems:
            typer.echo(f"error: {line}", err=True)
        raise typer.Exit(2)
    try:
        if executor == "local":
            with _interrupt_in_one_line():
                build_store(store, model_name=model, templates=templates or None, ladder=ladder or DEFAULT_LADDER,
                            calibration=calibration, steps=steps, log=_echo_above_bar, device=device, dtype=dtype,
                            probe_batch=probe_batch, probe_workers=probe_workers, template_workers=workers,
                            allocation_photos=allocation_photos, progress=not quiet)
            return
        from sakura.cloud.builder.distributed import build_templates

        rep = build_templates(store, templates=templates or None, model_name=model, ladder=ladder or DEFAULT_LADDER,
                              calibration=calibration, steps=steps, executor="ray", address=address, workers=workers,
                              force=force, log=typer.echo, progress=not quiet, device=device, dtype=dtype,
                              probe_batch=probe_batch, allocation_photos=allocation_photos)
    except TemplateSpecError as e:
        for line in e.problems:
            typer.echo(f"error: {line}", err=True)
        raise typer.Exit(2)
    except ValueError as e:  # --workers > 1 where templates cannot fork (an accelerator, macOS)
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    except OSError as e:  # a full disk, a read-only store: one line naming the path and the cause
        from sakura.util.fsutil import os_error_line

        typer.echo(f"error: {os_error_line(e)}", err=True)
        raise typer.Exit(2)
    except (ValueError, KeyError, NotImplementedError, RuntimeError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    if not rep.ok:
        raise typer.Exit(1)


#: What a build says when Ctrl-C (SIGINT) ends it; its exit status is 130 (128 + SIGINT), as a shell's.
INTERRUPTED = "interrupted; the store is consistent; rerun to finish"


@contextlib.contextmanager
def _interrupt_in_one_line() -> Iterator[None]:
    """SIGINT ends the build with `INTERRUPTED` and rc 130 instead of a traceback per process.

    Ctrl-C reaches every process of the foreground group: the template processes forked by the
    build (`build_store`'s template_workers) inherit this handler and leave at once, silently (each
    printed ``Process ForkPoolWorker-1:`` and a traceback); the parent unwinds (an uncommitted
    template writes no manifest: objects land before manifests, so the store stays consistent) and
    says so once. Temp files a killed process leaves are removed by the next build (the store's
    `begin_writing`)."""
    parent = os.getpid()

    def on_sigint(signum, frame):
        if os.getpid() != parent:
            os._exit(130)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    except KeyboardInterrupt:
        typer.echo(INTERRUPTED, err=True)
        raise SystemExit(130) from None  # not typer.Exit: click's Exit is a RuntimeError, caught below as "error:"
    finally:
        signal.signal(signal.SIGINT, previous)


def _echo_above_bar(line: str) -> None:
    """A summary line printed above the progress bar (tqdm.write), not through it."""
    from tqdm import tqdm

    tqdm.write(line)
