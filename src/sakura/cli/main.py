"""The `sakura` command line. Each command is a thin shell over one component; heavy imports
(torch, diffusers, aiohttp) happen inside the command so `sakura --help` stays fast."""

from __future__ import annotations

import json as _json
import os
import sys
import time as _time
from pathlib import Path
from typing import Optional

import typer

from sakura.cli import precheck
from sakura.cli.build import build_cmd
from sakura.cli.edit import edit_command
from sakura.cli.precheck import UsageError
from sakura.cli.store import serve_cmd
from sakura.util.extras import DISTRIBUTION
from sakura.util.fsutil import os_error_line
from sakura.util.text import clean, connection_error_line, fit_to_terminal

app = typer.Typer(
    help="sakura: private on-device image editing with streamed, compressed template KV.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,  # plain help: rich's import alone cost ~1.2 s of every `--help` and argument error
)


def _print_version(value: bool) -> None:
    if value:
        from sakura import __version__  # lazy: the package facade, on --version only

        typer.echo(f"{DISTRIBUTION} {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the version (of the sakura-kv distribution) and exit."),
) -> None:
    """sakura: private on-device image editing with streamed, compressed template KV."""


def _precheck(*checks) -> None:
    """Run `sakura.cli.precheck` checks before any heavy import: the first bad argument is one
    line on stderr and exit status 2, in a fraction of a second."""
    try:
        for check in checks:
            check()
    except UsageError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None


def _warm_codec() -> float:
    """Compile (first run on a machine) or load from numba's disk cache the native codec decoders,
    at process start, so that no edit pays the JIT inside its latency (docs/codec.md, warm-up)."""
    from sakura.codec import warm_up  # lazy: torch, numba; off --help and argument errors

    return warm_up()


@app.command()
def warm() -> None:
    """Compile the codec's native decoders into numba's disk cache (once per machine and install;
    ./dev runs it during setup): otherwise the first edit after an install waits ~1 min for the JIT."""
    typer.echo(f"native decoders ready in {_warm_codec():.1f} s")


@app.command()
def info(
    model: str = typer.Option("sakura-mini", help="Model spec NAME[:ARG]: sakura-mini, flux2-mini, klein:/folder[@SIZE], kontext:/folder[@SIZE], "
                        "or an installed plugin's name (sakura.available_models())."),
) -> None:
    """Print the model's config, parameter count, template-KV size and fingerprint."""
    _precheck(lambda: precheck.model_spec(model))
    from sakura.models import load_model  # lazy: importlib.metadata; off --help and argument errors

    m = load_model(model)
    for k, v in m.describe().items():
        typer.echo(f"{k:>24}: {v}")


@app.command()
def demo(
    out: Path = typer.Option(Path("out/demo"), help="Folder for the demo's images and report."),
    seed: int = typer.Option(0, help="Random seed for the photo noise and sampler."),
    model: str = typer.Option("sakura-mini", help="On-device model: sakura-mini or flux2-mini."),
) -> None:
    """End to end on the bundled defaults: build a store, serve it behind a real 5G trace, and edit a
    photo with on-device, CacheGen and sakura, live and time-dilated to a workload where streaming can
    pay (a three-image style template on a ~3.6 TFLOP/s phone), with the simulator beside each."""
    from sakura.bench.demo import run_demo  # lazy: torch, numba; off --help and argument errors

    from sakura.emulation.traces import traces_root  # lazy: numpy, asyncio; off --help and argument errors

    if traces_root() is None:  # before minutes of building: only a SAKURA_TRACES that is no folder gets here
        typer.echo(f"error: SAKURA_TRACES={os.environ.get('SAKURA_TRACES')!r} is not a folder (unset it to use "
                   "the traces bundled with sakura)", err=True)
        raise typer.Exit(2)
    typer.echo(f"codec decoders ready ({_warm_codec():.2f} s: numba JIT, disk-cached after the first run)")
    try:
        run_demo(out_dir=out, seed=seed, model_name=model)
    except (ValueError, FileNotFoundError) as e:  # a trace or store that cannot be read: one line, no traceback
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None


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
    model: Optional[str] = typer.Option(None, help="Network: sakura-mini (default) or flux2-mini (diffusers' FLUX.2 transformer)."),
    double_layers: Optional[int] = typer.Option(None, min=0, help="flux2-mini: double-stream blocks among --depth."),
    stock_references: Optional[bool] = typer.Option(None, "--stock-references", help="flux2-mini: the photo as a second reference with stock (non-isolated) multi-reference attention, as FLUX.2 Klein."),
    isolate_template: Optional[bool] = typer.Option(None, "--isolate-template", help="With --stock-references: train with sakura's template isolation (e.g. a short fine-tune with --init-from)."),
    init_from: Optional[str] = typer.Option(None, help="Start from these weights (.safetensors or a run folder's checkpoint) instead of the seeded init."),
    resume: bool = typer.Option(True, "--resume/--fresh", help="Continue from out/checkpoint.pt when present."),
    install: bool = typer.Option(False, help="Copy the weights into the package assets and write the model card into --docs."),
    docs: Path = typer.Option(Path("docs"), help="Docs folder for --install."),
    eval_steps: int = typer.Option(8, min=1, help="Sampler steps in the quality evaluation."),
    eval_photos: int = typer.Option(4, min=1, help="Crops per held-out photo source in the card's quality evaluation."),
    threads: int = typer.Option(1, min=1, help="torch threads (1 is fastest on a shared 2-core machine)."),
) -> None:
    """Train a bundled model from scratch (reproduces the shipped weights); resumable."""
    from sakura.cloud.training.command import train_command  # lazy: torch; off --help and argument errors

    train_command(out, overrides=dict(steps=steps, batch_size=batch_size, lr=lr, seed=seed, image_size=image_size,
                                      patch_size=patch_size, dim=dim, depth=depth, heads=heads,
                                      checkpoint_every=checkpoint_every, model=model, double_layers=double_layers,
                                      stock_references=stock_references, isolate_template=isolate_template,
                                      init_from=init_from),
                  resume=resume, install=install, docs=docs, eval_steps=eval_steps, eval_photos=eval_photos,
                  threads=threads)


@app.command()
def build(
    store: Path = typer.Argument(..., help="Store directory to write (created if missing; rebuilds are idempotent)."),
    model: str = typer.Option("sakura-mini", help="Model spec NAME[:ARG]: sakura-mini, flux2-mini (optionally "
                              ":/path/weights.safetensors), klein:/folder[@SIZE] or kontext:/folder[@SIZE] (a local "
                              "FLUX.2 Klein / FLUX.1 Kontext download, SIZE px per side, default 512), or an installed "
                              "plugin's name (docs/your-own-model.md)."),
    template: Optional[list[str]] = typer.Option(None, help="Library template name, or ID=IMAGE[,IMAGE...] for your own "
                                                 "image(s) (repeatable); default one library template per task."),
    library: Optional[Path] = typer.Option(None, help="A templates TOML file: [[template]] entries with id, images "
                                           "(relative to the file) and task or prompt."),
    task: Optional[str] = typer.Option(None, help="Task of --template ID=IMAGE (bundled models): look, texture, sticker."),
    prompt: Optional[str] = typer.Option(None, help="Prompt of --template ID=IMAGE (Klein)."),
    ladder: Optional[list[str]] = typer.Option(None, help="Codec spec per rendition (repeatable), e.g. uniform:bits=8."),
    calibration: int = typer.Option(2, min=1, help="Public calibration photos for token importance."),
    steps: int = typer.Option(4, min=1, help="Sampler steps of the calibration runs."),
    executor: str = typer.Option("local", help="local (this process) or ray (templates spread over a Ray "
                                 "cluster; resumable: skips templates whose manifest verifies)."),
    address: Optional[str] = typer.Option(None, help="Existing Ray cluster (ray://host:10001 or host:6379); "
                                          "default: a local one (--executor ray)."),
    workers: Optional[int] = typer.Option(None, min=1, help="Templates built at once: --executor local, in "
                                          "processes forked after the model loads (default: one per core up to "
                                          "the template count, on the CPU under Linux; else 1); ray, tasks on a "
                                          "local Ray cluster (default: all cores). The store does not depend on it."),
    force: bool = typer.Option(False, help="Rebuild templates even if current (unchanged image, settings and "
                               "model, manifest verified), which are otherwise skipped."),
    allocation: str = typer.Option("model", help="model (bits, ladder and figures by the template's sensitivity "
                                   "model: 12 calibration edits a template) or probes (every choice and figure "
                                   "measured by image probes: ~200 edits; the build before issue 41)."),
    sketch_probes: Optional[int] = typer.Option(None, min=1, help="Backward passes of --allocation model's "
                                                "sensitivity sketch (default 8: 12 calibration edits a template; "
                                                "more: closer to the probes' quality, one edit each with 2 photos)."),
    json_out: bool = typer.Option(False, "--json", help="Print the BuildReport as JSON on stdout "
                                  "({\"templates\": [{\"id\": ..., \"calibration_edits\": ..., ...}], ...})."),
    device: str = typer.Option("auto", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps."),
    dtype: str = typer.Option("auto", help="auto (bf16 on cuda, fp16 on mps, fp32 on cpu), fp32, fp16 or bf16; "
                              "the store holds fp16 KV whatever the compute dtype."),
    probe_batch: Optional[int] = typer.Option(None, min=1, help="Image-distortion probes per batched forward "
                                              "(default 1 on cpu: bit-identical stores; 16 on an accelerator)."),
    probe_workers: Optional[int] = typer.Option(None, min=1, help="Image-distortion probes measured at once in "
                                                "threads (default: one per core up to 4 on cpu, 1 on an "
                                                "accelerator; the store does not depend on it)."),
    allocation_photos: Optional[int] = typer.Option(None, min=1, help="Calibration photos the rate allocation's "
                                                    "probes edit (default: all; 1 is ~0.7x the CPU, -2 dB on some "
                                                    "top rungs on held-out photos)."),
    quiet: bool = typer.Option(False, help="No progress bar (the per-template summary lines stay)."),
) -> None:
    """Cloud side: capture template KV, score importance, encode the rendition ladder, write the store."""
    _precheck(lambda: precheck.store_to_write(store), lambda: precheck.model_spec(model),
              lambda: precheck.build_templates(template),
              lambda: precheck.extra("skimage", "sakura build (its public calibration photos)"),
              lambda: precheck.extra("sklearn", "sakura build (its public calibration photos)"))
    for line in precheck.sticker_image_warnings(template, task):  # builds anyway: the user may mean it
        typer.echo(f"warning: {line}", err=True)

    build_cmd(store, model, template, ladder, calibration, steps, executor=executor, address=address,
              workers=workers, force=force, library=library, task=task, prompt=prompt, device=device, dtype=dtype,
              probe_batch=probe_batch, probe_workers=probe_workers, allocation_photos=allocation_photos,
              quiet=quiet, allocation=allocation, json_out=json_out, sketch_probes=sketch_probes)


@app.command()
def serve(
    store: Path = typer.Argument(..., help="Store directory (written by `sakura build`)."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8080, help="TCP port (0 picks a free one)."),
    chunk_kib: int = typer.Option(256, min=1, help="Bytes per streamed read/write step, KiB."),
    quiet: bool = typer.Option(False, help="No access log (warnings only)."),
    trace: Optional[str] = typer.Option(None, help="Emulate one phone's downlink: a trace file, or a name "
                                                   "under $SAKURA_TRACES, ../shared/traces or the bundled set, "
                                                   "e.g. mahimahi_cellular/ATT-LTE-driving-2016.down (bundled)."),
    trace_offset: float = typer.Option(0.0, min=0.0, help="Start this many seconds into the trace."),
    rtt_ms: float = typer.Option(0.0, min=0.0, help="Emulated round-trip time, ms."),
    max_connections: int = typer.Option(0, min=0, help="Open connections held at most (0: from the fd limit, "
                                        "RLIMIT_NOFILE less the fds in use and --fd-reserve); at the cap the oldest "
                                        "idle connection is closed and accepting pauses."),
    fd_reserve: int = typer.Option(0, min=0, help="fds kept free below the limit for files being served (0: "
                                   "max(16, limit / 8))."),
    header_timeout_s: float = typer.Option(10.0, min=0.1, help="Seconds a new connection has to send its request head."),
    idle_timeout_s: float = typer.Option(15.0, min=0.1, help="Seconds an idle keep-alive connection is kept."),
) -> None:
    """Serve a store over HTTP (manifests and shards, Range requests, ETags)."""
    serve_cmd(store, host, port, chunk_kib, quiet, trace=trace, trace_offset=trace_offset, rtt_ms=rtt_ms,
              max_connections=max_connections, fd_reserve=fd_reserve, header_timeout_s=header_timeout_s,
              idle_timeout_s=idle_timeout_s)


from sakura.cli.store import store_app  # noqa: E402  (light: stdlib + typer only)

app.add_typer(store_app, name="store")


@app.command()
def edit(
    photo: Path = typer.Argument(..., help="Your photo (PNG/JPEG); it never leaves this machine."),
    server: str = typer.Option(..., help="Cache server base URL, e.g. http://127.0.0.1:8080"),
    template: Optional[str] = typer.Option(None, help="Template id as listed by the server (`sakura templates`), "
                                           "e.g. sticker-00; missing or unknown: prints the list."),
    out: Path = typer.Option(Path("out/edit.png"), help="Where to write the edited image."),
    policy: str = typer.Option("sakura", help="sakura (plan + local fallback), sakura-meet (compute up, stream "
                                              "down) or raw-stream (lossless only)."),
    steps: int = typer.Option(8, min=1, help="Sampler steps."),
    seed: int = typer.Option(0, help="Sampler seed."),
    prior_mbps: float = typer.Option(10.0, min=0.001, help="Bandwidth estimate before the first transfer (Mbit/s)."),
    model: str = typer.Option("sakura-mini", help="On-device model, the spec given to `sakura build` (sakura-mini, "
                              "flux2-mini[:weights], klein:/folder[@SIZE], kontext:/folder[@SIZE], a plugin's name)."),
    gallery: Path = typer.Option(None, help="The phone's template gallery cache (default $SAKURA_GALLERY or "
                                            "~/.cache/sakura/gallery)."),
    decode_workers: int = typer.Option(0, min=0, help="Decode workers (0: one per core)."),
    sketch_probes: Optional[int] = typer.Option(None, min=1, help="Backward passes of --allocation model's "
                                                "sensitivity sketch (default 8: 12 calibration edits a template; "
                                                "more: closer to the probes' quality, one edit each with 2 photos)."),
    json_out: bool = typer.Option(False, "--json", help="Print the edit's record as JSON (per layer: fetched or "
                                  "computed here, rendition, bytes, timings; the PSNR floor held)."),
    device: str = typer.Option("auto", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps."),
    dtype: str = typer.Option("auto", help="auto (bf16 on cuda, fp16 on mps, fp32 on cpu), fp32, fp16 or bf16; "
                              "streamed KV (fp16 on the wire) is cast to it on arrival."),
    accept_new_template: bool = typer.Option(False, "--accept-new-template", help="Use the server's template even "
                                             "if it differs from the one the gallery saw first under this id."),
) -> None:
    """Phone side: edit a local photo with a template whose KV streams from a cache server.

    Once the template is known (from the server, or the gallery's copy with the server down) the edit
    completes: what the link cannot deliver in time is computed on the device. With the server down
    and the template not in the gallery it fails with one line."""
    _precheck(lambda: precheck.photo(photo), lambda: precheck.model_spec(model))

    try:  # the codec's JIT is warmed inside the edit, before its clock starts (streamed_edit)
        edit_command(photo=photo, server=server, template=template, out=out, policy=policy, steps=steps, seed=seed,
                     prior_mbps=prior_mbps, model_name=model, gallery_dir=gallery, decode_workers=decode_workers or None,
                     as_json=json_out, device=device, dtype=dtype,
                     accept_new_template=accept_new_template)
    except (ValueError, FileNotFoundError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    except OSError as e:  # e.g. a full disk writing --out: the path and the cause, one line

        typer.echo(f"error: {os_error_line(e)}", err=True)
        raise typer.Exit(2) from None


@app.command()
def templates(
    server: str = typer.Option(..., help="Cache server base URL, e.g. http://127.0.0.1:8080"),
    model: Optional[str] = typer.Option(None, help="Only the templates of this model (as for `sakura edit --model`)."),
) -> None:
    """List the templates a server offers: id, model, rungs, bytes, thumbnail URL."""
    from sakura.phone.discovery import format_templates, list_templates  # lazy: asyncio; off --help and argument errors

    fp = None
    if model is not None:
        _precheck(lambda: precheck.model_spec(model))
    try:
        if model is not None:
            from sakura.models import load_model  # lazy: importlib.metadata; off --help and argument errors

            fp = load_model(model).fingerprint()
        items = list_templates(server, fp)
    except Exception as e:  # unreachable server, malformed index, bad model name: one line

        why = connection_error_line(e) or clean(' '.join(str(e).split()) or type(e).__name__)
        typer.echo(f"error: cannot list the templates of {clean(server)}: {why}", err=True)
        raise typer.Exit(2) from None

    typer.echo(fit_to_terminal(format_templates(items)))  # one row per line, cut to the terminal's width


#: Where `sakura bench` writes by default: out/bench/... ; with `sakura bench --publish ...`, the
#: repository's docs/... (the published figures; run from the repository root).
_BENCH_ROOT = {"root": Path("out/bench")}


def _bench_out(sub: str = ""):
    """default_factory of a bench command's --out: its folder under out/bench (or docs with --publish)."""
    def default() -> Path:
        return _BENCH_ROOT["root"] / sub if sub else _BENCH_ROOT["root"]
    return default


def _regenerate_results(*_args, **_kwargs) -> None:
    """After `sakura bench --publish ...` (run from the repository root): regenerate docs/results.md
    from the JSON, so the results page follows every published rerun (sakura.bench.results)."""
    if _BENCH_ROOT["root"] != Path("docs"):
        return
    page = Path("docs/results.md")
    if not page.is_file():
        return
    stamp = page.stat().st_mtime
    if not any(p.stat().st_mtime > stamp for p in Path("docs").rglob("*.json")):
        return  # this run wrote nothing under docs/ (e.g. --out elsewhere)
    from sakura.bench.results import write  # lazy: numpy, asyncio; off --help and argument errors

    changed, problems = write(Path("docs"), page)
    if changed:
        typer.echo(f"regenerated {page}" + (f" (not readable: {', '.join(problems)})" if problems else ""))


bench_app = typer.Typer(help="Benchmarks: every method on the same model, task, photo and trace, in one run.",
                        no_args_is_help=True, result_callback=_regenerate_results, rich_markup_mode=None)
app.add_typer(bench_app, name="bench")


@bench_app.callback()
def _bench_options(
    publish: bool = typer.Option(False, "--publish", help="Write into ./docs (the published figures, from the "
                                 "repository root) instead of ./out/bench, and regenerate docs/results.md."),
) -> None:
    """Benchmarks: every method on the same model, task, photo and trace, in one run."""
    _BENCH_ROOT["root"] = Path("docs") if publish else Path("out/bench")


@bench_app.command("results")
def bench_results(
    docs: Path = typer.Option(Path("docs"), help="Folder the benchmarks wrote their JSON into."),
    out: Optional[Path] = typer.Option(None, help="The page to write (default DOCS/results.md)."),
    check: bool = typer.Option(False, help="Write nothing; exit 1 if the page differs from what the JSON gives."),
) -> None:
    """Regenerate docs/results.md from the JSON every benchmark writes: each table with the command that reproduces it."""
    from sakura.bench.results import render, write  # lazy: numpy, asyncio; off --help and argument errors

    page = out or docs / "results.md"
    if check:
        text, problems = render(docs)
        if not page.is_file() or page.read_text() != text:
            typer.echo(f"{page} is stale: run `./dev sakura bench results`", err=True)
            raise typer.Exit(1)
        typer.echo(f"{page} is up to date" + (f"; not readable: {', '.join(problems)}" if problems else ""))
        return
    changed, problems = write(docs, page)
    typer.echo(f"{'wrote' if changed else 'unchanged:'} {page}")
    for p in problems:
        typer.echo(f"warning: section '{p}': its JSON is missing or unreadable (see the page)", err=True)


@bench_app.command("codec")
def bench_codec(
    out: Path = typer.Option(default_factory=_bench_out("codec"), help="Folder for results.json, table.md and the RD plots."),
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
    from sakura.bench.codec import ladder_check as check  # lazy: torch, numba; off --help and argument errors
    from sakura.bench.codec import run  # lazy: torch, numba; off --help and argument errors

    if ladder_check:
        check(out, model_name=model, templates_per_task=templates, photos=photos, steps=steps)
        return
    run(out, model_name=model, tasks=tasks, templates_per_task=templates, photos=photos, steps=steps, quick=quick,
        klein=klein, storage=storage, throughput_tokens=throughput_tokens)


@bench_app.command("quality")
def bench_quality(
    model: str = typer.Option("sakura-mini", help="sakura-mini or flux2-mini (optionally :/path/weights.safetensors)."),
    steps: int = typer.Option(8, min=1, help="Sampler steps of each edit."),
    photos_per_source: int = typer.Option(4, min=1, help="Crops per held-out photo source."),
    out: Optional[Path] = typer.Option(None, help="Also write quality.json and grid.png to this folder."),
) -> None:
    """A model vs exact ground truth on held-out photos and templates: model, identity, swapped template."""
    from sakura.bench.quality import run_quality_bench  # lazy: torch, PIL; off --help and argument errors

    run_quality_bench(model, steps=steps, photos_per_source=photos_per_source, out=out)


@bench_app.command("isolation")
def bench_isolation(
    run: Path = typer.Option(Path("runs/flux2-stock"), help="A `sakura train --model flux2-mini --stock-references` "
                             "run folder (its latest checkpoint) or weights file."),
    steps: int = typer.Option(8, min=1, help="Sampler steps of each edit."),
    photos_per_source: int = typer.Option(4, min=1, help="Crops per held-out photo source."),
    out: Optional[Path] = typer.Option(None, help="Also write isolation.json here."),
    threads: int = typer.Option(1, min=1, help="torch threads."),
) -> None:
    """What template isolation costs on a stock-attention checkpoint: per task, PSNR of the model's own
    (non-isolated) edit and of the cached isolated-KV edit vs ground truth, and cached vs stock."""
    import torch  # lazy: torch; off --help and argument errors

    from sakura.cloud.training.isolation import isolation_json, isolation_markdown, load_run_model, measure_isolation  # lazy: torch, PIL

    torch.set_num_threads(threads)
    try:
        model, done = load_run_model(run)
        t = _time.perf_counter()
        rows = measure_isolation(model, steps=steps, photos_per_source=photos_per_source)
    except (ValueError, FileNotFoundError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    total = None
    if run.is_dir() and (run / "recipe.json").is_file():
        total = int(_json.loads((run / "recipe.json").read_text())["steps"])
    typer.echo(isolation_markdown(rows, done, total))
    typer.echo(f"({_time.perf_counter() - t:.0f} s)")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(isolation_json(rows, done, total, sampler_steps=steps, photos_per_source=photos_per_source,
                                      run=str(run)))
        typer.echo(f"wrote {out}")


# The bench commands' typer option lists are alike in shape only (bench_load ~ bench_scale_model):
# each option is its own command's knob, with its own default and help.
@bench_app.command("load")
def bench_load(
    clients: str = typer.Option("1,8,32", help="Concurrency levels, comma-separated."),
    server: str = typer.Option("sakura", help="sakura (`sakura serve`) or nginx (stock nginx, the same store)."),
    templates: int = typer.Option(32, min=1, help="Distinct templates in the synthetic store."),
    layers: int = typer.Option(8, min=1, help="Shards per template."),
    tokens: int = typer.Option(512, min=1, help="Tokens per shard (an fp16 shard is 4 x tokens x width bytes)."),
    width: int = typer.Option(256, min=1, help="Channels per token."),
    rounds: int = typer.Option(1000, min=1, help="Passes over its template per phone."),
    max_seconds: float = typer.Option(8.0, min=0.1, help="Time bound per concurrency level."),
    trace: Optional[str] = typer.Option(None, help="Every phone behind its own emulated link replaying this trace "
                                        "(seeded start offsets), e.g. mahimahi_cellular/TMobile-LTE-driving.down."),
    rtt_ms: float = typer.Option(0.0, min=0.0, help="Emulated RTT with --trace, ms."),
    store: Optional[Path] = typer.Option(None, help="Build (or reuse) the store here (default: a temporary folder)."),
    out: Optional[Path] = typer.Option(None, help="Write the results JSON here (docs/net_load_*.json)."),
) -> None:
    """Server load: N concurrent phones fetching different templates from `sakura serve` or nginx on 127.0.0.1: throughput, shard latency p50/p99, server CPU and RSS."""
    from sakura.bench.load import run as run_load  # lazy: aiohttp, numpy; off --help and argument errors

    if server not in ("sakura", "nginx"):
        typer.echo(f"error: --server must be sakura or nginx, got {server!r}", err=True)
        raise typer.Exit(2)
    try:
        levels = [int(x) for x in clients.split(",")]
    except ValueError:
        typer.echo(f"error: --clients must be comma-separated integers, got {clients!r}", err=True)
        raise typer.Exit(2) from None
    res = run_load(clients=levels, server=server, templates=templates, layers=layers, tokens=tokens, width=width,
                   rounds=rounds, max_seconds=max_seconds, trace=trace, rtt_ms=rtt_ms, store=store, out=out)
    if any(r["errors"] for r in res["results"]):
        raise typer.Exit(1)


@bench_app.command("decode")
def bench_decode(
    out: Path = typer.Option(Path("out/decode"), help="Folder for decode_rates.json and decode_rates.md."),
    spec: Optional[list[str]] = typer.Option(None, help="Codec spec (repeatable); default: every codec family "
                                                        "and the store's ladder, layered specs per rung."),
    tokens: Optional[list[int]] = typer.Option(None, help="Layer sizes in tokens (repeatable; default 1024 and 4096)."),
    rounds: int = typer.Option(3, min=1, help="Rounds per measurement (the best is reported)."),
    target: Optional[list[str]] = typer.Option(None, help="Decode target (repeatable): host (this CPU's kernels) and "
                                                          "phone (phone-class proxy: x86-64-v2 code, 128-bit kernels); "
                                                          "default both, side by side."),
    publish: bool = typer.Option(False, help="Also replace the shipped calibration (sakura/assets/decode_rates.json) "
                                             "and docs/decode_rates.md."),
) -> None:
    """Decode rates (fp16 KV bytes/s per core) of every codec on Klein-sized layers, on this host and on a
    phone-class proxy side by side, 1 and 2 worker threads, and whether each codec releases the GIL."""
    from sakura.bench.decode_rates import TARGETS, TOKENS, run  # lazy: torch, numpy; off --help and argument errors

    bad = [t for t in target or () if t not in TARGETS]
    if bad:
        typer.echo(f"error: --target {bad[0]!r}: expected one of {', '.join(TARGETS)}", err=True)
        raise typer.Exit(2)
    run(out, specs=spec or None, tokens=tokens or TOKENS, rounds=rounds, targets=target or TARGETS, publish=publish,
        log=typer.echo)


@bench_app.command("fuzz")
def bench_fuzz(
    runs: int = typer.Option(100_000, min=1, help="Executions of the fuzz target (libFuzzer -runs)."),
    out: Path = typer.Option(Path("out/fuzz"), help="Folder for fuzz.json, fuzz.log and findings/."),
    save: bool = typer.Option(False, help="Merge the inputs that found new coverage into native/fuzz/corpus."),
    seed: int = typer.Option(1, help="libFuzzer's random seed."),
) -> None:
    """Fuzz the native decoder (libsakura_decode) under AddressSanitizer + UndefinedBehaviorSanitizer
    for a stated number of executions; reports executions, findings and corpus size (needs clang)."""
    from sakura.bench.native_fuzz import run as run_fuzz   # lazy: ~20 ms of imports (-X importtime) on --help

    try:
        rep = run_fuzz(runs, out, save=save, seed=seed, log=typer.echo)
    except RuntimeError as e:   # no clang / make, or the target does not build
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    if rep["findings"] or rep["exit_code"] != 0:
        raise typer.Exit(1)


@bench_app.command("workloads")
def bench_workloads(
    out: Path = typer.Option(default_factory=_bench_out(""), help="Folder for workloads.md and the two plots."),
    plots: bool = typer.Option(True, "--plots/--no-plots", help="Also draw the ceilings and regime plots (~5 s)."),
) -> None:
    """The named workloads and phone levels with their sources, the ceilings (speedup with free,
    instant KV), the break-even bandwidth W* and the most streaming can gain per link rate (a bound);
    pure arithmetic on cited figures, writes workloads.md and two plots."""
    from sakura.bench.workloads import write_report  # lazy: numpy, importlib.metadata; off --help and argument errors

    write_report(out, plots=plots)


@bench_app.command("e2e")
def bench_e2e(
    out: Path = typer.Option(default_factory=_bench_out("e2e"), help="Folder for e2e_live.json/.md and the timeline plot."),
    template: str = typer.Option("sticker-00", help="Library template."),
    photo_index: int = typer.Option(0, min=0, help="Held-out photo index."),
    trace: str = typer.Option("mahimahi_cellular/TMobile-LTE-short.down", help="Trace under ../shared/traces."),
    offset_s: float = typer.Option(10.0, min=0.0, help="Start offset into the trace (s)."),
    rtt_ms: float = typer.Option(40.0, min=0.0, help="Round-trip time added by the link (ms)."),
    steps: int = typer.Option(8, min=1, help="Sampler steps."),
    model: str = typer.Option("sakura-mini", help="On-device model: sakura-mini or flux2-mini."),
) -> None:
    """Live mode: every method (oracle, on-device, on-device-nocache, raw-stream, cachegen, sakura) on
    the same template, photo and trace segment, real execution on this machine."""
    from sakura.bench.e2e import run_live  # lazy: torch, numba; off --help and argument errors

    run_live(out, template=template, photo_index=photo_index, trace=trace, offset_s=offset_s, rtt_ms=rtt_ms,
             steps=steps, model_name=model)


@bench_app.command("faults")
def bench_faults(
    out: Path = typer.Option(default_factory=_bench_out("faults"), help="Folder for faults.json/.md (and hostile.json/.md)."),
    steps: int = typer.Option(4, min=1, help="Sampler steps of each edit."),
    faults: bool = typer.Option(True, help="The network faults (in-process streamed edits)."),
    hostile: bool = typer.Option(True, help="The hostile servers against real `sakura edit` subprocesses "
                                            "(time to outcome, peak RSS), slow-header clients, parser fuzz."),
    slow_headers: int = typer.Option(200, min=0, help="Slow-header connections to open (0: skip)."),
    fuzz: int = typer.Option(2000, min=0, help="Parser fuzz cases per parser (0: skip)."),
    reliability: bool = typer.Option(True, help="Issues 35 and 43's probes (gc racing a rebuild, fd pressure, a FIFO "
                                                "in the store, verify on a non-store, a foreign object, interrupted "
                                                "builds, the floor's held-out error, 64 edits with the hash check, ...) "
                                                "-> reliability.md."),
    fd_duration_s: float = typer.Option(20.0, min=1.0, help="Seconds of each fd-pressure run."),
) -> None:
    """Live, loopback: inject each network fault (unreachable, 404/500, resets, corrupt object, stalled
    link) and show the edit completing with the right image, latency beside on-device's; then each
    hostile server (drip, stall after headers, huge sizes, redirect elsewhere, wrong object)."""
    from sakura.bench.faults import run_faults, run_hostile  # lazy: torch, numba; off --help and argument errors
    from sakura.bench.reliability import run_reliability  # lazy: torch, numba; off --help and argument errors

    if faults:
        run_faults(out, steps=steps)
    if hostile:
        run_hostile(out, steps=steps, slow_headers=slow_headers, fuzz_cases=fuzz)
    if reliability:
        run_reliability(out, fd_duration_s=fd_duration_s)


@bench_app.command("link")
def bench_link(
    out: Path = typer.Option(default_factory=_bench_out("e2e"), help="Folder for link.json/.md."),
    rtt_ms: float = typer.Option(40.0, min=0.0, help="Round-trip time (ms)."),
) -> None:
    """Live: the runtime's fetch stage through the pacer at 10, 100 and 1,000 Mbit/s: link idle time
    between shards and the throughput estimate after three shards vs the true rate."""
    from sakura.bench.linkcheck import link_markdown, run_link_check  # lazy: torch, numba

    typer.echo(link_markdown(run_link_check(rtt_ms=rtt_ms, out_dir=out)))


@bench_app.command("dilated")
def bench_dilated(
    out: Path = typer.Option(default_factory=_bench_out("e2e"), help="Folder for dilated.json/.md."),
    workload: str = typer.Option("style3x1024-out512", help="Named workload (docs/workloads.md)."),
    phone: str = typer.Option("3", help="Phone level by name or TFLOP/s."),
    dilation: float = typer.Option(40.0, min=1.0, help="D: the live run is D times faster than the phone."),
    model: str = typer.Option("sakura-mini", help="Model whose real KV and forward pass run: sakura-mini or flux2-mini."),
) -> None:
    """Live, time-dilated: the real runtime at a phone workload's times / D on three real traces, beside
    the simulator on the same inputs (the simulator's validation)."""
    from sakura.bench.dilated import dilated_markdown, run_dilated  # lazy: torch, numba; off --help and argument errors

    typer.echo(f"codec decoders ready ({_warm_codec():.2f} s)")
    r = run_dilated(workload, phone, D=dilation, out_dir=out, model_name=model)
    typer.echo(dilated_markdown(r))


@bench_app.command("profile")
def bench_profile(
    out: Path = typer.Option(default_factory=_bench_out("e2e"), help="Folder for e2e_profile.json/.md and the plots."),
    workloads: Optional[list[str]] = typer.Option(None, help="Named workloads (default: all; see docs/workloads.md)."),
    phones: Optional[list[str]] = typer.Option(None, help="Phone levels by name or TFLOP/s (default: all three)."),
    families: Optional[list[str]] = typer.Option(None, help="Trace families (default: all; with --replay: only "
                                                           "the runs of these families)."),
    offsets_per_trace: int = typer.Option(1, min=1, help="Seeded start offsets per trace."),
    traces_per_family: int = typer.Option(0, min=0, help="Sample this many traces per family (0: every trace)."),
    rtt_ms: float = typer.Option(40.0, min=0.0, help="Round-trip time (ms)."),
    decode_workers: int = typer.Option(0, min=0, help="Decode workers the phone gives every streaming method "
                                                     "(0: the pool measured by `sakura bench decode`)."),
    decode_target: str = typer.Option("phone", help="Whose decode rates: phone (phone-class proxy, 128-bit SIMD) or "
                                                    "host (this server's AVX-512 kernels, for comparison)."),
    model: str = typer.Option("sakura-mini", help="Model whose real template KV measures the renditions."),
    seed: int = typer.Option(0, help="Seed of the start offsets."),
    replay: Optional[Path] = typer.Option(None, help="Only re-simulate sakura on this e2e_profile.json's losing "
                                                     "runs (same ladder, seed and links; writes nothing)."),
    all_runs: bool = typer.Option(False, help="With --replay: every run, not only the losing ones (new losers show)."),
    jobs: int = typer.Option(1, min=1, help="Processes over the independent runs (workload x phone x link; "
                                           "also with --replay); the same result as 1."),
    rerun_baselines: bool = typer.Option(False, help="With --replay: re-simulate the CacheGen baselines too instead "
                                                     "of reading them from the file (for a simulator change)."),
) -> None:
    """Phone profile (EXTRAPOLATED): every method on named workloads x phone levels x every trace family
    and constant links, through the runtime's own driver; ceilings beside every ratio."""
    from sakura.bench.profile import replay_runs, run_profile  # lazy: torch, PIL; off --help and argument errors

    if decode_target not in ("phone", "host"):
        typer.echo(f"error: --decode-target {decode_target!r}: expected phone or host", err=True)
        raise typer.Exit(2)
    if replay is not None:
        try:
            if not replay.is_file():
                raise ValueError(f"--replay {replay}: no such file")
            replay_runs(replay, losers_only=not all_runs, families=families, jobs=jobs, baselines=rerun_baselines)
        except (ValueError, KeyError) as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from None
        return
    run_profile(out, workloads=workloads, phones=phones, families=families, offsets_per_trace=offsets_per_trace,
                traces_per_family=traces_per_family or None, rtt_ms=rtt_ms, decode_workers=decode_workers or None,
                model_name=model, seed=seed, jobs=jobs, decode_target=decode_target)


@bench_app.command("templates")
def bench_templates(
    out: Path = typer.Option(default_factory=_bench_out("e2e"), help="Folder for templates.json/.md/.png."),
    templates: Optional[list[str]] = typer.Option(None, "--template", help="Templates whose real KV measures the "
                                                 "renditions (default: look-00, texture-00, sticker-00)."),
    families: Optional[list[str]] = typer.Option(None, help="Trace families (default: umn_5gophers)."),
    workloads: Optional[list[str]] = typer.Option(None, help="Named workloads (default: all)."),
    phones: Optional[list[str]] = typer.Option(None, help="Phone levels by name or TFLOP/s (default: all three)."),
    traces_per_family: int = typer.Option(0, min=0, help="Sample this many traces per family (0: every trace)."),
    model: str = typer.Option("sakura-mini", help="Model whose real template KV measures the renditions."),
    jobs: int = typer.Option(1, min=1, help="Processes over the independent runs of each template's profile."),
) -> None:
    """Phone profile (EXTRAPOLATED) once per template: the equal-quality ratio vs CacheGen-L3 and the
    bytes at the image floor, per template, beside the ceiling."""
    from sakura.bench.templates import DEFAULT_FAMILIES, DEFAULT_TEMPLATES, run_templates  # lazy: torch, PIL
    from sakura.cloud.tasks.library import template_library  # lazy: torch, PIL; off --help and argument errors

    known = {t.name for t in template_library(64)}
    bad = [t for t in (templates or []) if t not in known]
    if bad:
        typer.echo(f"error: unknown template(s) {', '.join(bad)}; known: {', '.join(sorted(known))}", err=True)
        raise typer.Exit(2)
    run_templates(out, templates=templates or DEFAULT_TEMPLATES, families=families or DEFAULT_FAMILIES,
                  workloads=workloads, phones=phones, traces_per_family=traces_per_family, jobs=jobs,
                  model_name=model)


@bench_app.command("both-models")
def bench_both_models(
    out: Path = typer.Option(default_factory=_bench_out("codec"), help="Folder for both_models.json and both_models.md."),
    model: Optional[list[str]] = typer.Option(None, help="Model (repeatable; default sakura-mini and flux2-mini)."),
    template: Optional[list[str]] = typer.Option(None, help="Library template (repeatable; default look-00, "
                                                 "texture-00, sticker-00)."),
) -> None:
    """Per-shard renditions on both bundled models: bits/value, the image PSNR with one shard replaced, and the decode rate."""
    from sakura.bench.both_models import MODELS, TEMPLATES, run  # lazy: torch, PIL; off --help and argument errors

    run(out, models=model or MODELS, templates=template or TEMPLATES)


@bench_app.command("importance")
def bench_importance(
    out: Optional[Path] = typer.Option(default_factory=_bench_out("codec/importance_nested.txt"), help="Text file for the rows."),
    task: Optional[list[str]] = typer.Option(None, help="Task (repeatable; default all three)."),
    photos: int = typer.Option(6, min=1, help="Held-out test photos."),
    steps: int = typer.Option(8, min=1, help="Sampler steps of each edit."),
) -> None:
    """Importance on vs off (none, attention mass, gradient sensitivity) on the nested ladder and the plain ECSQ rendition: bytes and image PSNR per rung."""
    from sakura.bench.importance import run  # lazy: torch, numba; off --help and argument errors
    from sakura.cloud.tasks import TASK_NAMES  # lazy: torch, PIL; off --help and argument errors

    bad = [t for t in task or () if t not in TASK_NAMES]
    if bad:
        typer.echo(f"error: unknown task {bad[0]!r} (one of {', '.join(TASK_NAMES)})", err=True)
        raise typer.Exit(2)
    run(out, tasks=task or TASK_NAMES, photos=photos, steps=steps)


@bench_app.command("speed")
def bench_speed(
    model: Optional[list[str]] = typer.Option(None, help="Model (repeatable; default sakura-mini and flux2-mini)."),
    template: str = typer.Option("sticker-h0", help="Library template."),
    rounds: int = typer.Option(3, min=1, help="Rounds, models interleaved (the median is reported)."),
    steps: int = typer.Option(8, min=1, help="Sampler steps of each edit."),
    out: Optional[Path] = typer.Option(None, help="Also write the figures as JSON here."),
) -> None:
    """On-device CPU timings of the bundled models side by side: template compute, edits with KV injected, EXTRACT and NOCACHE, and the runtime's per-layer profile."""
    from sakura.bench.speed import MODELS, run  # lazy: torch, numba; off --help and argument errors

    run(models=model or MODELS, template=template, rounds=rounds, steps=steps, out=out)


@bench_app.command("klein-e2e")
def bench_klein_e2e(
    out: Optional[Path] = typer.Option(default_factory=_bench_out("model-flux2/klein_e2e.json"), help="JSON file for the figures."),
    size: int = typer.Option(32, min=16, help="Pixels per side."),
    steps: int = typer.Option(4, min=1, help="Sampler steps."),
) -> None:
    """A tiny random FLUX.2 Klein pipeline end to end: own templates from a TOML file, build, serve, and a streamed edit at every rendition against the on-device edit."""
    from sakura.bench.klein_e2e import run  # lazy: torch, numba; off --help and argument errors

    run(out, size=size, steps=steps)


@bench_app.command("build-speed")
def bench_build_speed(
    template: Optional[list[str]] = typer.Option(None, help="Library templates (repeatable; default the three `sakura build` builds)."),
    rounds: int = typer.Option(1, min=1, help="Alternating rounds per variant (the median is reported)."),
    baseline_src: Optional[Path] = typer.Option(None, help="Another checkout's src folder to compare with "
                                                "(e.g. `git archive COMMIT src | tar -x -C /tmp/base`)."),
    probe_batch: int = typer.Option(1, min=1, help="Also build with this many probes per batched forward (1: skip)."),
    device: str = typer.Option("cpu", help="Device of the builds (auto, cpu, cuda, mps)."),
    probes_variant: bool = typer.Option(False, help="Also build with --allocation probes (this checkout)."),
    out: Path = typer.Option(Path("out/build_speed.json"), help="JSON file for the figures."),
) -> None:
    """`sakura build` of the bundled templates, stage by stage, against a baseline checkout, alternating in one run: wall and CPU seconds, calibration edits, peak memory, same bytes?"""
    from sakura.bench.build_speed import run  # lazy: torch; off --help and argument errors

    run(template or ("look-00", "texture-00", "sticker-00"), rounds=rounds, baseline_src=baseline_src,
        probe_batch=probe_batch, device=device, out=out, probes_variant=probes_variant)


@bench_app.command("build-quality")
def bench_build_quality(
    baseline_src: Path = typer.Option(..., help="Another checkout's src folder to compare with "
                                      "(e.g. `git archive 44df547 src | tar -x -C /tmp/base`)."),
    photos: Optional[Path] = typer.Option(None, help="A folder of photos (.png/.jpg) no calibration used; default "
                                          "the held-out crops (sources the calibration never uses)."),
    template: Optional[list[str]] = typer.Option(None, help="Library templates (repeatable; default the three `sakura build` builds)."),
    steps: int = typer.Option(4, min=1, help="Sampler steps of the edits."),
    out: Path = typer.Option(Path("out/build_quality"), help="Folder for build_quality.json."),
) -> None:
    """This checkout's build vs another's on photos the build never saw: per template and rung, PSNR against the lossless-KV edit and bytes, new vs old."""
    from sakura.bench.build_quality import DEFAULT_TEMPLATES, run  # lazy: torch; off --help and argument errors

    try:
        run(baseline_src=baseline_src, photos_dir=photos, out=out, templates=template or DEFAULT_TEMPLATES,
            steps=steps, log=typer.echo)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)


@bench_app.command("realscale")
def bench_realscale(
    preset: str = typer.Option("tiny", help="klein-4b, klein-9b (the published shapes, random weights) or tiny (CPU check)."),
    size: Optional[list[int]] = typer.Option(None, min=16, help="Pixels per side (repeatable; default 512 and 1024, tiny: 32 and 64)."),
    device: str = typer.Option("auto", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps."),
    dtype: str = typer.Option("auto", help="auto (bf16 on cuda, fp32 on cpu), fp32, fp16 or bf16."),
    ladder: Optional[list[str]] = typer.Option(None, help="Codec spec per rendition (repeatable; default lossless + `sakura build`'s ladder)."),
    calibration: int = typer.Option(2, min=1, help="Calibration photos of the build."),
    steps: int = typer.Option(4, min=1, help="Sampler steps (build and edit)."),
    reps: int = typer.Option(3, min=1, help="Timed repetitions of each edit and pass (median)."),
    deadline_s: Optional[float] = typer.Option(None, min=0.0, help="Skip the remaining sizes after this many seconds."),
    quiet: bool = typer.Option(False, help="No progress bar."),
    out: Path = typer.Option(Path("out/realscale.json"), help="JSON file for the figures (rewritten after every size)."),
) -> None:
    """FLUX.2 Klein at real shapes (random weights) as a user runs it: write the folder, load klein:/folder@SIZE, build one template, serve it, stream-edit it; per-stage build seconds, peak memory, bytes, decode rates, bit-exactness, edit vs passes."""
    from sakura.bench.realscale import run  # lazy: torch; off --help and argument errors

    sizes = size or ((32, 64) if preset == "tiny" else (512, 1024))
    try:
        run(preset, sizes, device=device, dtype=dtype, ladder=ladder, calibration=calibration, steps=steps, reps=reps,
            deadline_s=deadline_s, progress=not quiet, out=out, log=typer.echo)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None


@bench_app.command("build-scale")
def bench_build_scale(
    workers: Optional[list[int]] = typer.Option(None, min=1, help="Ray worker count (repeatable; default 1 and 2)."),
    rounds: int = typer.Option(2, min=1, help="Alternating rounds per worker count."),
    templates: int = typer.Option(12, min=1, help="Library templates per build, tasks interleaved."),
    ladder: Optional[list[str]] = typer.Option(None, help="Codec spec (repeatable; default: `sakura build`'s)."),
    calibration: int = typer.Option(2, min=1, help="Calibration photos."),
    steps: int = typer.Option(4, min=1, help="Sampler steps of the calibration runs."),
    out: Optional[Path] = typer.Option(None, help="Write the results JSON here (docs/scale_build.json)."),
) -> None:
    """`sakura build --executor ray` with 1 vs 2 (or more) Ray workers: build time, CPU obtained, and the same bytes in every store."""
    from sakura.bench.build_scale import run  # lazy: torch; off --help and argument errors

    res = run(workers=workers or (1, 2), rounds=rounds, templates=templates, ladder=ladder, calibration=calibration,
              steps=steps, out=out)
    if not res["same_bytes_in_every_store"]:
        raise typer.Exit(1)


@bench_app.command("startup")
def bench_startup(
    baseline_src: Optional[Path] = typer.Option(None, help="Another checkout's src folder to compare with "
                                                "(e.g. `git archive 44df547 src | tar -x -C /tmp/base`)."),
    rounds: int = typer.Option(3, min=1, help="Rounds, baseline and this checkout alternating (medians)."),
    out: Optional[Path] = typer.Option(None, help="Also write startup.json and startup.md here."),
) -> None:
    """How fast a bad argument is answered (bad template, unknown model, missing folder, file as store, bad photo): each command's own CPU and wall seconds, beside a baseline checkout."""
    from sakura.bench.startup import run  # lazy: PIL; off --help and argument errors

    run(out, baseline_src=baseline_src, rounds=rounds)


# Alike in shape only to bench_load's options (see there).
@bench_app.command("scale-model")
def bench_scale_model(
    out: Optional[Path] = typer.Option(None, help="Write the results JSON here (docs/scale_model.json)."),
    plots: Optional[str] = typer.Option(None, help="Path prefix for the two PNGs, e.g. docs/scale."),
    build_json: Path = typer.Option(Path("docs/scale_build.json"), help="`sakura bench build-scale` output."),
    edge_seconds: float = typer.Option(6.0, min=0.1, help="Hot phase of the edge CPU measurement, s."),
    edge_clients: int = typer.Option(16, min=1, help="Concurrent clients against the edge."),
    edge_objects: int = typer.Option(256, min=1, help="1 MiB objects in the edge CPU measurement."),
    crowd_phones: int = typer.Option(32, min=1, help="Concurrent phones through one edge."),
    encode_tokens: int = typer.Option(1024, min=16, help="Tokens of the synthetic Klein-width layer."),
    replot: Optional[Path] = typer.Option(None, help="Recompute the model and plots from this saved JSON "
                                          "(no measuring)."),
) -> None:
    """Capacity model of a template library behind caching edges: encode cost, edge CPU per GB (stock nginx), a crowd through one edge, then the arithmetic and two plots."""
    from sakura.bench.scale_model import run  # lazy: torch, numba; off --help and argument errors

    run(out=out, plots_prefix=plots, build_json=build_json, edge_seconds=edge_seconds, edge_clients=edge_clients,
        edge_objects=edge_objects, crowd_phones=crowd_phones, encode_tokens=encode_tokens, replot=replot)


from sakura.util.clihelp import reflow_help  # noqa: E402  (after the last command: it rewrites their help)

reflow_help(app)


def main(argv: Optional[list[str]] = None) -> None:
    """The `sakura` console entry: the app, with an optional dependency that is not installed
    reported as one line naming the extra to install (rc 2) wherever in a command it was imported."""
    try:
        app(argv)
    except ModuleNotFoundError as e:
        from sakura.util.extras import missing_extra_line  # lazy: optional dependency, tried

        words = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")][:2]
        command = words[:2] if words[:1] in (["bench"], ["store"]) else words[:1]  # e.g. "sakura bench codec"
        line = missing_extra_line(e, " ".join(["sakura", *command]))
        if line is None:  # a core module missing is a broken install: the traceback is the report
            raise
        typer.echo(f"error: {line}", err=True)
        sys.exit(2)
