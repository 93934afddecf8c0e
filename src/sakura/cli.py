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
    """End to end on the bundled defaults: build a store, serve it behind an emulated LTE link, and
    edit a photo with every method (oracle, on-device, raw-stream, cachegen, sakura)."""
    from sakura.demo import run_demo

    run_demo(out_dir=out, seed=seed)


@app.command()
def train(
    out: Path = typer.Option(Path("runs/train"), help="Run folder: checkpoint.pt (resumable), weights, model card."),
    steps: Optional[int] = typer.Option(None, min=1, help="Optimizer steps (default: the bundled recipe's)."),
    batch_size: Optional[int] = typer.Option(None, min=1, help="Examples per step."),
    lr: Optional[float] = typer.Option(None, help="Peak learning rate."),
    seed: Optional[int] = typer.Option(None, help="Seed of init, data and noise."),
    image_size: Optional[int] = typer.Option(None, help="Pixels per side."),
    patch_size: Optional[int] = typer.Option(None, help="Pixels per token side."),
    dim: Optional[int] = typer.Option(None, help="Hidden width."),
    depth: Optional[int] = typer.Option(None, help="Transformer blocks."),
    heads: Optional[int] = typer.Option(None, help="Attention heads."),
    checkpoint_every: Optional[int] = typer.Option(None, min=1, help="Steps between checkpoints."),
    resume: bool = typer.Option(True, "--resume/--fresh", help="Continue from out/checkpoint.pt when present."),
    install: bool = typer.Option(False, help="Copy the weights into the package assets and write docs/model-card.md."),
    docs: Path = typer.Option(Path("docs"), help="Docs folder for --install."),
    eval_steps: int = typer.Option(8, min=1, help="Sampler steps in the quality evaluation."),
    threads: int = typer.Option(1, min=1, help="torch threads (1 is fastest on a shared 2-core machine)."),
) -> None:
    """Train the bundled mini model from scratch (reproduces the shipped weights); resumable."""
    from sakura.training.command import train_command

    train_command(out, overrides=dict(steps=steps, batch_size=batch_size, lr=lr, seed=seed, image_size=image_size,
                                      patch_size=patch_size, dim=dim, depth=depth, heads=heads,
                                      checkpoint_every=checkpoint_every),
                  resume=resume, install=install, docs=docs, eval_steps=eval_steps, threads=threads, log=typer.echo)


@app.command()
def build(
    store: Path = typer.Argument(..., help="Store directory to write (created if missing; rebuilds are idempotent)."),
    model: str = typer.Option("sakura-mini", help="sakura-mini or sakura-mini:/path/weights.safetensors."),
    template: Optional[list[str]] = typer.Option(None, help="Library template name (repeatable); default one per task."),
    ladder: Optional[list[str]] = typer.Option(None, help="Codec spec per rendition (repeatable), e.g. uniform:bits=8."),
    calibration: int = typer.Option(2, min=1, help="Public calibration photos for token importance."),
    steps: int = typer.Option(4, min=1, help="Sampler steps of the calibration runs."),
) -> None:
    """Cloud side: capture template KV, score importance, encode the rendition ladder, write the store."""
    from sakura.store.cli import build_cmd

    build_cmd(store, model, template, ladder, calibration, steps)


@app.command()
def serve(
    store: Path = typer.Argument(..., help="Store directory (written by `sakura build`)."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8080, help="TCP port (0 picks a free one)."),
    chunk_kib: int = typer.Option(256, min=1, help="Bytes per streamed read/write step, KiB."),
    quiet: bool = typer.Option(False, help="No access log (warnings only)."),
    trace: Optional[str] = typer.Option(None, help="Emulate one phone's downlink: trace under ../shared/traces, "
                                                   "e.g. mahimahi_cellular/ATT-LTE-driving.down."),
    trace_offset: float = typer.Option(0.0, min=0.0, help="Start this many seconds into the trace."),
    rtt_ms: float = typer.Option(0.0, min=0.0, help="Emulated round-trip time, ms."),
) -> None:
    """Serve a store over HTTP (manifests and shards, Range requests, ETags)."""
    from sakura.store.cli import serve_cmd

    serve_cmd(store, host, port, chunk_kib, quiet, trace=trace, trace_offset=trace_offset, rtt_ms=rtt_ms)


from sakura.store.cli import store_app  # noqa: E402  (light: stdlib + typer only)

app.add_typer(store_app, name="store")


@app.command()
def edit(
    photo: Path = typer.Argument(..., help="Your photo (PNG/JPEG); it never leaves this machine."),
    server: str = typer.Option(..., help="Cache server base URL, e.g. http://127.0.0.1:8080"),
    template: str = typer.Option(..., help="Template id as listed by the server, e.g. sticker-00."),
    out: Path = typer.Option(Path("out/edit.png"), help="Where to write the edited image."),
    policy: str = typer.Option("sakura", help="sakura (MPC + local fallback) or raw-stream (lossless only)."),
    steps: int = typer.Option(8, min=1, help="Sampler steps."),
    seed: int = typer.Option(0, help="Sampler seed."),
    prior_mbps: float = typer.Option(10.0, min=0.001, help="Bandwidth estimate before the first transfer (Mbit/s)."),
) -> None:
    """Phone side: edit a local photo with a template whose KV streams from a cache server."""
    from sakura.runtime.cli import edit_command

    edit_command(photo=photo, server=server, template=template, out=out, policy=policy, steps=steps, seed=seed,
                 prior_mbps=prior_mbps, echo=typer.echo)


bench_app = typer.Typer(help="Benchmarks: every method on the same model, task, photo and trace, in one run.",
                        no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.command("codec")
def bench_codec(
    out: Path = typer.Option(Path("docs/codec"), help="Folder for results.json, table.md and the RD plots."),
    model: str = typer.Option("sakura-mini", help="sakura-mini or sakura-mini:/path/weights.safetensors."),
    tasks: int = typer.Option(3, min=1, max=3, help="How many tasks to run."),
    templates: int = typer.Option(4, min=1, max=4, help="Held-out templates per task."),
    photos: int = typer.Option(6, min=1, help="Held-out test photos."),
    steps: int = typer.Option(8, min=1, help="Sampling steps of each edit."),
    quick: bool = typer.Option(False, help="A few settings only (smoke test)."),
    klein: bool = typer.Option(True, help="Also run a tiny random FLUX.2 for shape coverage."),
    storage: bool = typer.Option(True, help="Also build a store of the templates and report what each costs whole."),
    throughput_tokens: int = typer.Option(1024, min=16, help="Tokens of the Klein-sized throughput layer."),
    ladder_check: bool = typer.Option(False, help="Only build the templates with `sakura build`'s defaults and "
                                                  "check every rung read back from the store (ladder_check.md)."),
) -> None:
    """Codec rate-distortion on held-out templates and photos: bytes (tables included), image PSNR/SSIM
    vs CacheGen (both variants), whole-template storage, decode MB/s and worker scaling."""
    from sakura.bench.codec import ladder_check as check
    from sakura.bench.codec import run

    if ladder_check:
        check(out, model_name=model, templates_per_task=templates, photos=photos, steps=steps, log=typer.echo)
        return
    run(out, model_name=model, tasks=tasks, templates_per_task=templates, photos=photos, steps=steps, quick=quick,
        klein=klein, storage=storage, throughput_tokens=throughput_tokens, log=typer.echo)


@bench_app.command("quality")
def bench_quality(
    model: str = typer.Option("sakura-mini", help="sakura-mini or sakura-mini:/path/weights.safetensors."),
    steps: int = typer.Option(8, min=1, help="Sampler steps of each edit."),
    photos_per_source: int = typer.Option(4, min=1, help="Crops per held-out photo source."),
    out: Optional[Path] = typer.Option(None, help="Also write quality.json and grid.png to this folder."),
) -> None:
    """sakura-mini vs exact ground truth on held-out photos and templates: model, identity, swapped template."""
    from sakura.tasks.quality import run_quality_bench

    run_quality_bench(model, steps=steps, photos_per_source=photos_per_source, out=out, log=typer.echo)


@bench_app.command("e2e")
def bench_e2e(
    out: Path = typer.Option(Path("docs/e2e"), help="Folder for e2e_live.json/.md and the timeline plot."),
    template: str = typer.Option("sticker-00", help="Library template."),
    photo_index: int = typer.Option(0, min=0, help="Held-out photo index."),
    trace: str = typer.Option("mahimahi_cellular/TMobile-LTE-short.down", help="Trace under ../shared/traces."),
    offset_s: float = typer.Option(10.0, min=0.0, help="Start offset into the trace (s)."),
    rtt_ms: float = typer.Option(40.0, min=0.0, help="Round-trip time added by the link (ms)."),
    steps: int = typer.Option(8, min=1, help="Sampler steps."),
) -> None:
    """Live mode: every method (oracle, on-device, on-device-nocache, raw-stream, cachegen, sakura) on
    the same template, photo and trace segment, real execution on this machine."""
    from sakura.bench.e2e import run_live

    run_live(out, template=template, photo_index=photo_index, trace=trace, offset_s=offset_s, rtt_ms=rtt_ms,
             steps=steps, log=typer.echo)


@bench_app.command("profile")
def bench_profile(
    out: Path = typer.Option(Path("docs/e2e"), help="Folder for e2e_profile.json/.md and the plot."),
    offsets_per_trace: int = typer.Option(3, min=1, help="Seeded start offsets per trace."),
    families: Optional[list[str]] = typer.Option(None, help="Trace families (default: all)."),
    rtt_ms: float = typer.Option(40.0, min=0.0, help="Round-trip time (ms)."),
    seed: int = typer.Option(0, help="Seed of the start offsets."),
) -> None:
    """Phone-profile mode (EXTRAPOLATED): trace-driven simulation of every method with Klein-4B-sized
    KV and phone compute, on every trace family; codec figures measured on the mini model."""
    from sakura.bench.e2e import run_profile

    run_profile(out, offsets_per_trace=offsets_per_trace, families=families, rtt_ms=rtt_ms, seed=seed, log=typer.echo)


def main(argv: Optional[list[str]] = None) -> None:  # pragma: no cover - console entry
    app(argv)
