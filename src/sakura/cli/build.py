"""The body of `sakura build` (wired into sakura.cli.main): one-line errors, then the local or Ray build."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Iterator
import json

import typer

from sakura.util.fsutil import os_error_line


def build_cmd(store: Path, model: str, templates: list[str] | None, ladder: list[str] | None, calibration: int,
              steps: int, *, executor: str = "local", address: str | None = None, workers: int | None = None,
              force: bool = False, library: Path | None = None, task: str | None = None,
              prompt: str | None = None, device: str = "auto", dtype: str = "auto", probe_batch: int | None = None,
              probe_workers: int | None = None, allocation_photos: int | None = None, quiet: bool = False,
              allocation: str = "model", json_out: bool = False, sketch_probes: int | None = None) -> None:
    """Body of `sakura build`: clear one-line errors for bad names/specs instead of tracebacks.

    ``executor="local"`` (default) builds in this process as before; ``"ray"`` spreads templates
    over a Ray cluster (``sakura.cloud.builder.distributed``); both skip templates already current
    unless ``force``; exit 1 if any template failed (the others are committed). ``json_out``: the
    `BuildReport` as JSON on stdout (the per-template lines then go to stderr)."""
    from sakura.cloud.builder.api import build  # lazy: the builder (numpy, pydantic); off --help and argument errors
    from sakura.cloud.builder.pipeline import DEFAULT_LADDER  # lazy: the builder (numpy, pydantic); off --help and argument errors

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if executor not in ("local", "ray"):
        typer.echo(f"error: --executor must be local or ray, got {executor!r}", err=True)
        raise typer.Exit(2)
    if executor == "local" and address:
        typer.echo("error: --address applies to --executor ray", err=True)
        raise typer.Exit(2)
    if allocation not in ("model", "probes"):
        typer.echo(f"error: --allocation must be model or probes, got {allocation!r}", err=True)
        raise typer.Exit(2)
    from sakura.cloud.builder.template_files import TemplateSpecError, template_args  # lazy: the builder (numpy, pydantic)
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
                rep = build(store, templates or None, model=model, ladder=ladder or DEFAULT_LADDER,
                            calibration=calibration, steps=steps, device=device, dtype=dtype, workers=workers,
                            force=force, progress=not quiet, probe_workers=probe_workers,
                            allocation_photos=allocation_photos, allocation=allocation, probe_batch=probe_batch,
                            sketch_probes=sketch_probes, log=_echo_above_bar if not json_out else _echo_stderr)
        else:
            from sakura.cloud.builder.distributed import build_templates  # lazy: the builder (numpy, pydantic)

            rep = build_templates(store, templates=templates or None, model_name=model,
                                  ladder=ladder or DEFAULT_LADDER, calibration=calibration, steps=steps,
                                  executor="ray", address=address, workers=workers, force=force,
                                  log=typer.echo if not json_out else _echo_stderr, progress=not quiet, device=device,
                                  dtype=dtype, probe_batch=probe_batch, allocation_photos=allocation_photos,
                                  allocation=allocation)
    except TemplateSpecError as e:
        for line in e.problems:
            typer.echo(f"error: {line}", err=True)
        raise typer.Exit(2)
    except ValueError as e:  # --workers > 1 where templates cannot fork (an accelerator, macOS)
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    except OSError as e:  # a full disk, a read-only store: one line naming the path and the cause

        typer.echo(f"error: {os_error_line(e)}", err=True)
        raise typer.Exit(2)
    except (ValueError, KeyError, NotImplementedError, RuntimeError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    if json_out:
        sys.stdout.write(json.dumps(rep.to_json(), indent=1) + "\n")
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
    from tqdm import tqdm  # lazy: tqdm; off --help and argument errors

    tqdm.write(line)


def _echo_stderr(line: str) -> None:
    """A summary line on stderr (above the bar): stdout holds only the JSON report."""
    from tqdm import tqdm  # lazy: tqdm; off --help and argument errors

    tqdm.write(line, file=sys.stderr)
