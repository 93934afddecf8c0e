"""The `sakura` command line. Each command is a thin shell over one component; heavy imports
(torch, diffusers, aiohttp) happen inside the command so `sakura --help` stays fast."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(
    help="sakura: private on-device image editing with streamed, compressed template KV.",
    no_args_is_help=True,
    add_completion=False,
)


def _not_yet(what: str) -> None:
    typer.echo(f"`sakura {what}` is not built yet (see the README's status table).", err=True)
    raise typer.Exit(code=3)


@app.command()
def info(
    model: str = typer.Option("sakura-mini", help="Model adapter: sakura-mini, or klein:/path/to/local/folder."),
) -> None:
    """Print the model's config, parameter count, template-KV size and fingerprint."""
    from sakura.models import load_model

    m = load_model(model)
    for k, v in m.describe().items():
        typer.echo(f"{k:>24}: {v}")


@app.command()
def demo(
    out: Path = typer.Option(Path("out/demo"), help="Folder for the demo's images and report."),
    seed: int = typer.Option(0, help="Random seed for the photo noise and sampler."),
) -> None:
    """End to end on the bundled defaults: capture a template's KV, inject it, edit a photo."""
    from sakura.demo import run_demo

    run_demo(out_dir=out, seed=seed)


@app.command()
def train() -> None:
    """Train the bundled mini model from scratch (reproduces the shipped weights)."""
    _not_yet("train")


@app.command()
def build() -> None:
    """Cloud side: capture template KV, score importance, encode the rendition ladder, write the store."""
    _not_yet("build")


@app.command()
def serve() -> None:
    """Serve a store over HTTP (manifests and shards, Range requests, ETags)."""
    _not_yet("serve")


@app.command()
def edit() -> None:
    """Phone side: edit a local photo with a template streamed from a cache server."""
    _not_yet("edit")


@app.command()
def bench() -> None:
    """Benchmarks: every method on the same model, task, photo and trace, in one run."""
    _not_yet("bench")


def main(argv: Optional[list[str]] = None) -> None:  # pragma: no cover - console entry
    app(argv)
