"""`sakura store ...` (stats, verify) and the body of `sakura serve`; wired into sakura.cli.main (`sakura build`: sakura.cli.build)."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path

import typer

from sakura.util.text import fit_to_terminal as fit, terminal_columns

# sakura.wire.store (pydantic, the manifest schema) is imported inside each command: importing it here
# cost every `sakura` invocation, `--help` and a bad argument included, ~0.2 CPU-s (issue 45)

store_app = typer.Typer(help="Inspect a cache store: storage accounting and integrity.", no_args_is_help=True,
                        rich_markup_mode=None)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


@store_app.command("stats")
def stats_cmd(
    store: Path = typer.Argument(..., help="Store directory."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Bytes per template: everything it costs (ladder, tables, template ref, manifest) vs one fp16 copy."""
    from sakura.wire.store.store import Store, StoreError  # lazy: pydantic; off --help and argument errors

    try:
        s = Store(store).stats()
    except StoreError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    if as_json:
        d = asdict(s)
        for t, ts in zip(d["templates"], s.templates):
            t["ratio_vs_fp16"] = ts.ratio_vs_fp16
            t["whole_bytes"] = ts.whole_bytes
            t["whole_ratio_vs_fp16"] = ts.whole_ratio_vs_fp16
        typer.echo(json.dumps(d, indent=1))
        return

    # on a terminal: the fingerprint's first 12 hex (rows were 166 columns wide), then cut to fit
    fp = (lambda f: f[:12]) if terminal_columns() is not None else (lambda f: f)
    w = max([len("model/template")] + [len(fp(t.model_fingerprint)) + 1 + len(t.template_id) for t in s.templates])
    typer.echo(fit(f"{'model/template':{w}s} {'shards':>6s} {'rends':>6s} {'ladder':>11s} {'tables':>10s} "
               f"{'template':>10s} {'manifest':>10s} {'whole':>11s} {'fp16 copy':>11s} {'whole/fp16':>10s}"))
    for t in s.templates:
        typer.echo(fit(f"{fp(t.model_fingerprint) + '/' + t.template_id:{w}s} {t.shards:6d} {t.renditions:6d} "
                   f"{_human(t.ladder_bytes):>11s} {_human(t.table_bytes):>10s} {_human(t.template_ref_bytes):>10s} "
                   f"{_human(t.manifest_bytes):>10s} {_human(t.whole_bytes):>11s} "
                   f"{_human(t.fp16_bytes):>11s} {t.whole_ratio_vs_fp16:10.3f}"))
    typer.echo("whole = ladder + tables + template reference + manifest (everything a template costs), "
               "each object once")
    typer.echo(f"objects on disk: {s.object_count} ({_human(s.object_bytes)}, each stored once); "
               f"orphans: {s.orphan_count} ({_human(s.orphan_bytes)})")


@store_app.command("verify")
def verify_cmd(store: Path = typer.Argument(..., help="Store directory.")) -> None:
    """Re-hash every object and check every manifest; exit 1 if anything is wrong."""
    from sakura.wire.store.layout import STORE_MARKER  # lazy: pydantic; off --help and argument errors
    from sakura.wire.store.store import Store, StoreError  # lazy: pydantic; off --help and argument errors

    try:
        rep = Store(store).verify()
    except StoreError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    for p in rep.problems:
        typer.echo(f"PROBLEM {p}")
    if rep.format_version == 0:
        typer.echo(f"note: a store built before the format marker ({STORE_MARKER}); the next build or "
                   f"`sakura store gc` writes it")
    if rep.orphans:
        typer.echo(f"note: {len(rep.orphans)} unreferenced object(s) (e.g. from an interrupted build)")
    if rep.stale_temps is None:
        typer.echo("note: a build is writing to this store now (its temp files are in use)")
    elif rep.stale_temps:
        typer.echo(f"note: {len(rep.stale_temps)} temp file(s) left by an interrupted build "
                   f"(the next build or `sakura store gc` removes them): {', '.join(rep.stale_temps[:5])}"
                   + (" ..." if len(rep.stale_temps) > 5 else ""))
    typer.echo(f"{'OK' if rep.ok else 'FAILED'}: {rep.checked_objects} objects, {rep.checked_manifests} manifests, "
               f"{len(rep.problems)} problem(s)")
    if not rep.ok:
        raise typer.Exit(1)


@store_app.command("gc")
def gc_cmd(
    store: Path = typer.Argument(..., help="Store directory."),
    min_age_s: float = typer.Option(3600.0, min=0.0, help="Only delete orphans older than this (seconds)."),
    dry_run: bool = typer.Option(False, help="List what would be deleted."),
) -> None:
    """Delete unreferenced objects (e.g. from an interrupted build) older than --min-age-s."""
    from sakura.wire.store.store import Store, StoreError  # lazy: pydantic; off --help and argument errors

    try:
        removed = Store(store).gc(min_age_s=min_age_s, dry_run=dry_run)
    except StoreError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    for name in removed:
        typer.echo(("would delete " if dry_run else "deleted ") + name)
    typer.echo(f"{len(removed)} file(s) {'to delete' if dry_run else 'deleted'}")


@store_app.command("edge-config")
def edge_config_cmd(
    origin: str = typer.Argument(..., help="Origin base URL, http://host:port (sakura serve or an origin nginx)."),
    port: int = typer.Option(8081, help="Port the edge listens on."),
    host: str = typer.Option("127.0.0.1", help="Address the edge listens on."),
    prefix: Path = typer.Option(Path("edge"), help="Folder for the edge's cache, logs and pid."),
    slice_kib: int = typer.Option(1024, min=4, help="Cache / origin-fetch slice size, KiB (multiple of 4)."),
    cache_gib: float = typer.Option(10.0, min=0.01, help="Disk cache cap, GiB (LRU beyond it)."),
    manifest_ttl_s: int = typer.Option(2, min=0, help="Seconds a manifest/index answer is reused (0: not cached)."),
    workers: int = typer.Option(0, min=0, help="nginx worker processes (0: one per core)."),
) -> None:
    """Print an nginx.conf for a caching edge (proxy_cache + slice + cache lock) in front of ORIGIN.
    Run it with: nginx -p PREFIX -c PREFIX/nginx.conf (docs/scale.md)."""
    from sakura.wire.server import edge_config  # lazy: aiohttp: only the commands that serve

    try:
        typer.echo(edge_config(origin, port=port, prefix=prefix, host=host, slice_bytes=slice_kib * 1024,
                               cache_max_bytes=int(cache_gib * (1 << 30)), manifest_ttl_s=manifest_ttl_s,
                               workers=workers), nl=False)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)


def serve_cmd(store: Path, host: str, port: int, chunk_kib: int, quiet: bool, trace: str | None = None,
              trace_offset: float = 0.0, rtt_ms: float = 0.0, max_connections: int = 0, fd_reserve: int = 0,
              header_timeout_s: float = 10.0, idle_timeout_s: float = 15.0) -> None:
    """Body of `sakura serve` (kept here so sakura/cli/main.py stays a thin shell)."""
    from sakura.wire.server import serve_forever  # lazy: aiohttp: only the commands that serve
    from sakura.wire.server.app import ConnectionLimits  # lazy: aiohttp: only the commands that serve

    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from sakura.wire.store.store import StoreError, store_format  # lazy: pydantic; off --help and argument errors

    try:
        store_format(store)  # a folder that is not a store is refused before anything binds
    except StoreError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    front = None
    if trace is not None or rtt_ms > 0:
        from sakura.emulation import TraceError  # lazy: only with --trace / --rtt-ms
        from sakura.emulation.serve import pacing_front  # lazy: only with --trace / --rtt-ms

        try:  # the trace is parsed before anything binds
            front = pacing_front(trace, trace_offset_s=trace_offset, rtt_s=rtt_ms / 1e3, host=host, port=port)
        except TraceError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2)
    limits = ConnectionLimits(header_timeout_s=header_timeout_s, idle_timeout_s=idle_timeout_s,
                              max_connections=max_connections, fd_reserve=fd_reserve)
    serve_forever(store, host=host, port=port, chunk_bytes=chunk_kib * 1024, front=front, limits=limits)
