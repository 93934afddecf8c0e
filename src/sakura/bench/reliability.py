"""`sakura bench faults`' reliability probes (issues 35 and 43), each for real on 127.0.0.1.

Every probe is one function from a shared `Bench` (a temp folder, a store of two templates, a
photo, the commands as child processes) to table rows: the probe, the issue item, the one-line
outcome, the time to it, peak RSS, and whether it held (ok / FAIL). `run_reliability` runs the
ones asked for, top to bottom; a probe that breaks is a FAIL row, not the end of the run.

    sakura bench faults --no-faults --no-hostile --out docs/faults     # -> reliability.md/.json
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import signal
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable
import subprocess

import numpy as np
from PIL import Image

from sakura.bench.children import build_signalled, run_child
from sakura.bench.faults import run_fd_pressure
from sakura.bench.harness import get_logger, markdown_table, publish, write_json
from sakura.util.text import clean
from sakura.wire.server import serve_in_thread
from sakura.wire.store.layout import TMP_DIR, manifest_relpath
from sakura.wire.store.store import (RenditionInput, Store, StoreWriter, _locked, _write_index, atomic_write, put_object,
                                     stale_temp_files)
import sakura
import torch
from sakura.bench.load import FP, RssSampler, level, start_server
from sakura.cloud.builder.pipeline import build_store
from sakura.cloud.tasks import get_template, heldout_photos
from sakura.cloud.tasks.quality import psnr_per_image
from sakura.emulation.faults import hostile_in_thread
from sakura.models import load_model
from sakura.phone import BandwidthEstimator, FixedPolicy, RttEstimator
from sakura.phone.live import Emulation, profile_model, streamed_edit
from sakura.wire.server.app import VerifiedObjects, _sha256_fd
from sakura.wire.store.synthetic import make_synthetic_store

log = get_logger(__name__)

ISSUE35_PROBES = ("edit, 3 other listed manifests drip", "gc racing a rebuild", "fd pressure", "FIFO in the store",
                  "escapes in a manifest", "template swapped under a pinned id", "gallery manifest/reference mismatch",
                  "manifest for another model", "disk full", "large template image", "library of 10,000 entries",
                  "smaller")
ISSUE43_PROBES = ("verify on a non-store", "foreign file under objects/", "SIGKILL mid-build, then a rebuild",
                  "SIGINT mid-build", "raw-stream on the default store", "floor estimate on held-out photos",
                  "64 concurrent edits, hash check off/on")
RELIABILITY_PROBES = ISSUE35_PROBES + ISSUE43_PROBES
#: The probes that need the two-template store `Bench.store` builds (the others make their own).
_OWN_STORE = {"gc racing a rebuild", "fd pressure", "large template image", "library of 10,000 entries",
              "verify on a non-store", "SIGKILL mid-build, then a rebuild", "SIGINT mid-build",
              "raw-stream on the default store", "floor estimate on held-out photos",
              "64 concurrent edits, hash check off/on"}
#: Stages after which a build is "mid-build" (its templates captured, nothing written yet).
_MID_BUILD = ("ladder search", "fit tables", "encode", "rendition probes")
#: `sakura build` arguments of the interrupted builds: two templates in two processes, small settings.
_QUICK_BUILD = ["--template", "look-00", "--template", "sticker-00", "--calibration", "1", "--steps", "1",
                "--workers", "2"]
#: What an interrupted `sakura build` says (sakura.cli.build.INTERRUPTED; the bench may not import the
#: CLI, tests/sakura/emulation/test_reliability_probes.py checks they agree)
INTERRUPTED = "interrupted; the store is consistent; rerun to finish"


def _row(probe: str, item: str, outcome: str, time_s: float | None, peak: float | None, ok: bool) -> dict:
    return {"probe": probe, "item": item, "outcome": clean(outcome, 220), "time_s": time_s, "peak_rss_mib": peak,
            "ok": bool(ok)}


def _said(r: dict) -> str:
    keep = [ln for ln in r["lines"] if ln.startswith(("error:", "edited in", "warning:", "skipped")) or "gallery" in ln]
    return (keep or r["lines"][-1:] or ["(no output)"])[0]


def _http(url: str, headers: dict | None = None) -> tuple[int | str, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError as e:
        return type(e).__name__, b""


@dataclasses.dataclass
class Bench:
    """What the probes share. ``store()`` builds (once) a store of sticker-00 and look-00 with a
    lossless and a progressive ladder; ``default_store()`` one with `sakura build`'s defaults."""

    base: Path
    out_dir: Path | None
    timeout_s: float
    fd_duration_s: float
    library_entries: int
    root: Path = Path()
    photo: Path = Path()
    fp: str = ""
    m_st: object = None
    m_look: object = None
    _default: Path | None = None

    def store(self) -> None:

        t = time.perf_counter()
        self.root = self.base / "store"
        build_store(self.root, templates=["sticker-00", "look-00"], ladder=["lossless", "progressive"],
                    calibration=1, steps=1, log=lambda s: None)
        self.fp = load_model("sakura-mini").fingerprint()
        st = Store(self.root)
        self.m_st, self.m_look = st.get_manifest(self.fp, "sticker-00"), st.get_manifest(self.fp, "look-00")
        self.write_photo()
        log.info("  setup (store of 2 templates): %.0f s", time.perf_counter() - t)

    def write_photo(self) -> None:
        self.photo = self.base / "photo.png"
        Image.fromarray((np.random.default_rng(0).random((70, 70, 3)) * 255).astype("uint8")).save(self.photo)

    def default_store(self) -> Path:
        """sticker-00 and look-00 with `sakura build`'s default ladder, calibration and steps."""
        if self._default is None:
            self._default = self.base / "default"
            build_store(self._default, templates=["sticker-00", "look-00"], log=lambda s: None)
        return self._default

    def variant(self, name: str) -> Path:
        d = self.base / name
        shutil.copytree(self.root, d)
        return d

    def put(self, d: Path, m, *, as_fp: str | None = None) -> None:
        atomic_write(d, manifest_relpath(as_fp or m.model_fingerprint, m.template_id), m.to_bytes())
        with _locked(d):
            _write_index(d)

    def edit(self, url: str, gallery: Path, *extra: str, template: str = "sticker-00") -> dict:
        if not self.photo.is_file():
            self.write_photo()
        return run_child(["edit", str(self.photo), "--server", url, "--template", template, "--out",
                          str(self.base / "o.png"), "--steps", "1", "--gallery", str(gallery), *extra], self.timeout_s)


# ---------------------------------------------------------------------------- issue 35's probes
def probe_drip(b: Bench) -> list[dict]:

    with serve_in_thread(b.root) as url:  # the baseline: same command, honest server
        r = b.edit(url, b.base / "g-base")
    rows = [_row("edit, honest server (baseline for the row below)", "1", f"rc {r['rc']}: {_said(r)}", r["wall_s"],
                 r["peak_rss_mib"], r["rc"] == 0)]
    d = b.variant("drip3")
    for i in range(3):
        b.put(d, dataclasses.replace(b.m_look, template_id=f"other-{i}"))
    honest = {"/index.json", "/" + manifest_relpath(b.fp, "sticker-00"), "/" + manifest_relpath(b.fp, "look-00")}
    honest |= {"/" + o.path for o in b.m_st.objects()}
    with serve_in_thread(d) as up, hostile_in_thread(up, "drip", drip_s=1.0, honest_paths=honest) as (url, _):
        r = b.edit(url, b.base / "g-drip")
    return rows + [_row("edit, 3 other listed manifests drip", "1", f"rc {r['rc']}: {_said(r)}", r["wall_s"],
                        r["peak_rss_mib"], r["rc"] == 0)]


def probe_gc_race(b: Bench) -> list[dict]:
    d = b.base / "gc"
    t = time.perf_counter()
    ref = put_object(d, b"object left by a SIGKILLed build")
    old = time.time() - 7200
    os.utime(d / ref.path, (old, old))
    w = StoreWriter(d, model_fingerprint="fp", template_id="t")
    w.set_template_ref(b"object left by a SIGKILLed build", media_type="application/x-test")
    w.add_shard(layer=0, tokens=(0, 1), fp16_bytes=4, renditions=[RenditionInput("raw", "raw", b"kv")])
    removed = Store(d).gc(min_age_s=3600)
    w.commit()
    rep = Store(d).verify()
    return [_row("gc racing a rebuild", "2", f"gc removed {len(removed)}; store verify: "
                 f"{'OK' if rep.ok else rep.problems[0]}", time.perf_counter() - t, None, rep.ok and not removed)]


def probe_fd_pressure(b: Bench) -> list[dict]:
    rows = []
    for lim in (64, 1024):
        r = run_fd_pressure(lim, 1.5, b.fd_duration_s)
        rows.append(_row(f"fd pressure: ulimit -n {lim}, {r['idle_sockets']} idle sockets, {b.fd_duration_s:.0f} s "
                         f"(time: worst normal request)", "3",
                         f"normal requests {r['ok']} ok, {r['failed']} failed, worst {1000 * r['worst_s']:.0f} ms; "
                         f"server {r['server_cpu_s']:.1f} CPU-s, {r['server_log_lines']} log lines",
                         r["worst_s"], r["server_peak_rss_mib"], r["failed"] == 0 and r["server_alive"]))
    return rows


def probe_fifo(b: Bench) -> list[dict]:
    d = b.variant("fifo")
    sha = "ff" * 32
    (d / "objects" / "ff").mkdir(exist_ok=True)
    os.mkfifo(d / "objects" / "ff" / sha)
    t = time.perf_counter()
    with serve_in_thread(d) as url:
        codes = [_http(f"{url}/{path}")[0] for path in (f"objects/ff/{sha}", "index.json")]
    took = time.perf_counter() - t
    v = run_child(["store", "verify", str(d)], b.timeout_s)
    said = next((ln for ln in v["lines"] if "regular" in ln), _said(v))
    return [_row("FIFO in the store", "4", f"GET FIFO -> {codes[0]}, then index.json -> {codes[1]}; verify rc "
                 f"{v['rc']}: {said}", took, v["peak_rss_mib"], codes == [404, 200] and v["rc"] == 1)]


def probe_escapes(b: Bench) -> list[dict]:
    d = b.variant("esc")
    evil = "\x1b[2J\x1b]0;pwned\x07mini\nerror: your photo was uploaded"
    b.put(d, dataclasses.replace(b.m_st, kv_layout={**b.m_st.kv_layout, "model": evil}))
    with serve_in_thread(d) as url:
        r = run_child(["templates", "--server", url], b.timeout_s)
    ctl = sum(c < 0x20 and c != 0x0a for c in r["raw"]) + r["raw"].count(b"\n" b"error: your")
    return [_row("escapes in a manifest", "5", f"rc {r['rc']}; control bytes reaching the terminal: {ctl}",
                 r["wall_s"], r["peak_rss_mib"], ctl == 0 and r["rc"] == 0)]


def probe_swapped(b: Bench) -> list[dict]:
    g = b.base / "g-pin"
    with serve_in_thread(b.root) as url:
        b.edit(url, g)
    d = b.variant("swap")
    b.put(d, dataclasses.replace(b.m_look, template_id="sticker-00"))
    with serve_in_thread(d) as url:
        r = b.edit(url, g)
    return [_row("template swapped under a pinned id", "6", f"rc {r['rc']}: {_said(r)}", r["wall_s"],
                 r["peak_rss_mib"], r["rc"] == 2)]


def probe_gallery_mismatch(b: Bench) -> list[dict]:
    g = b.base / "g-mix"
    with serve_in_thread(b.root) as url:
        b.edit(url, g)
        b.edit(url, g, template="look-00")
    (g / b.fp / "sticker-00.ref").write_bytes((g / b.fp / "look-00.ref").read_bytes())
    r = b.edit(url, g)  # server gone
    return [_row("gallery manifest/reference mismatch", "6", f"rc {r['rc']}: {_said(r)}", r["wall_s"],
                 r["peak_rss_mib"], r["rc"] == 2)]


def probe_other_model(b: Bench) -> list[dict]:
    d = b.variant("other")
    b.put(d, dataclasses.replace(b.m_st, model_fingerprint="0" * 64), as_fp=b.fp)
    with serve_in_thread(d) as url:
        r = b.edit(url, b.base / "g-other")
    return [_row("manifest for another model", "6", f"rc {r['rc']}: {_said(r)}", r["wall_s"], r["peak_rss_mib"],
                 r["rc"] == 2 and "another model" in _said(r))]


def probe_disk_full(b: Bench) -> list[dict]:
    mnt = b.base / "tmpfs"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(mnt)], capture_output=True).returncode:
        return [_row("disk full", "7", "skipped: mounting a 200 KiB tmpfs needs root (the test injects ENOSPC at "
                     "fsync instead)", None, None, True)]
    store = mnt / "store"
    try:
        r = run_child(["build", str(store), "--template", "look-00", "--calibration", "1", "--steps", "1",
                       "--ladder", "lossless"], b.timeout_s)
        v = Store(store).verify() if (store / "sakura-store.json").is_file() else None
        idx = (store / "index.json").is_file()
        mans = list((store / "manifests").rglob("*.json")) if store.is_dir() else []
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
    err = [ln for ln in r["lines"] if ln.startswith("error:")]
    return [_row("disk full", "7", f"rc {r['rc']}, {len(r['lines'])} line(s): {err[0] if err else _said(r)}; "
                 f"manifests {len(mans)}, index {'present' if idx else 'absent'}", r["wall_s"], r["peak_rss_mib"],
                 r["rc"] == 2 and len(err) == 1 and (idx or not mans)
                 and "Traceback" not in r["raw"].decode(errors="replace") and (v is None or v.ok))]


def probe_large_image(b: Bench) -> list[dict]:
    big = b.base / "big.png"
    Image.new("RGB", (7999, 7999), (200, 30, 30)).save(big)
    r = run_child([str(big)], b.timeout_s, code=(
        "import sys, pathlib\nfrom sakura.cloud.builder.template_files import load_template_image\n"
        "x = load_template_image(pathlib.Path(sys.argv[1]), 64)\nprint('loaded', tuple(x.shape))\n"))
    return [_row(f"large template image (7999 x 7999 PNG, {big.stat().st_size // 1024} KB)", "8",
                 f"rc {r['rc']}: {r['lines'][-1] if r['lines'] else ''}", r["wall_s"], r["peak_rss_mib"], r["rc"] == 0)]


def probe_library(b: Bench) -> list[dict]:
    lib = b.base / "lib"
    lib.mkdir()
    Image.fromarray((np.random.default_rng(1).random((512, 512, 3)) * 255).astype("uint8")).save(lib / "a.png")
    (lib / "lib.toml").write_text("".join(f'[[template]]\nid = "t{i}"\nimages = ["a.png"]\ntask = "look"\n\n'
                                          for i in range(b.library_entries)))
    r = run_child([str(lib / "lib.toml")], b.timeout_s, code=(
        "import sys, pathlib\nfrom sakura.cloud.builder.template_files import load_library_file\n"
        "from sakura.cloud.builder.pipeline import resolve_templates\nfrom sakura.models import load_model\n"
        "t = resolve_templates(load_model('sakura-mini'), load_library_file(pathlib.Path(sys.argv[1])))\n"
        "print('resolved', len(t), 'entries')\n"))
    return [_row(f"library of {b.library_entries:,} entries (512 px PNGs): checked and resolved", "8",
                 f"rc {r['rc']}: {r['lines'][-1] if r['lines'] else ''}", r["wall_s"], r["peak_rss_mib"], r["rc"] == 0)]


def probe_smaller(b: Bench) -> list[dict]:
    rows = []
    deep = b.base / "deep.toml"
    deep.write_text("x = " + "[" * 500 + "]" * 500 + "\n")
    fifo = b.base / "lib.fifo"
    os.mkfifo(fifo)
    for name, libp in (("TOML nested 500 deep", deep), ("--library FIFO", fifo), ("--library /dev/zero", Path("/dev/zero"))):
        r = run_child(["build", str(b.base / "none"), "--library", str(libp)], b.timeout_s)
        rows.append(_row(name, "10", f"rc {r['rc']}: {_said(r)}", r["wall_s"], r["peak_rss_mib"],
                         r["rc"] == 2 and len(r["lines"]) == 1))
    d = b.variant("stale")
    b.put(d, dataclasses.replace(b.m_look, template_id="stale"))
    (d / manifest_relpath(b.fp, "stale")).unlink()  # still in the index
    with serve_in_thread(d) as url:
        r = run_child(["templates", "--server", url], b.timeout_s)
    said = next((ln for ln in r["lines"] if ln.startswith("skipped")), _said(r))
    rows.append(_row("one stale manifest in the index", "10", f"rc {r['rc']}, {len(r['lines']) - 2} listed; {said}",
                     r["wall_s"], r["peak_rss_mib"], r["rc"] == 0 and said.startswith("skipped")))
    obj = b.m_st.template_ref.object
    with serve_in_thread(b.root) as url:
        for digits in (30, 4000, 5000):  # one answer whatever the length (4,000 gave 206, 5,000 gave 400)
            t = time.perf_counter()
            status, body = _http(f"{url}/{obj.path}", {"Range": "bytes=0-" + "9" * digits})
            rows.append(_row(f"Range: bytes=0-<{digits} digits>", "10 / 43.5", f"HTTP {status}, {len(body)} of "
                             f"{obj.bytes} bytes", time.perf_counter() - t, None, status == 206 and len(body) == obj.bytes))
    return rows


# ---------------------------------------------------------------------------- issue 43's probes
def probe_verify_non_store(b: Bench) -> list[dict]:
    empty = b.base / "empty"
    empty.mkdir()
    a_file = b.base / "a-file.txt"
    a_file.write_text("not a store\n")
    rows = []
    for what, path in (("/", "/"), ("an empty folder", str(empty)), ("a regular file", str(a_file))):
        for cmd in (["store", "verify"], ["store", "stats"]):
            r = run_child([*cmd, path], b.timeout_s)
            rows.append(_row(f"`sakura {' '.join(cmd)}` on {what}", "43.1", f"rc {r['rc']}, {len(r['lines'])} "
                             f"line(s): {r['lines'][0] if r['lines'] else ''}", r["wall_s"], r["peak_rss_mib"],
                             r["rc"] == 2 and len(r["lines"]) == 1))
    return rows


def probe_foreign_object(b: Bench) -> list[dict]:
    """A hard link to a file outside the store, under objects/ with a valid-looking name."""
    d = b.variant("foreign")
    outside = b.base / "outside.bin"
    outside.write_bytes(os.urandom(300_000))
    sha = "ab" + "0" * 62
    (d / "objects" / "ab").mkdir(exist_ok=True)
    os.link(outside, d / "objects" / "ab" / sha)
    t = time.perf_counter()
    with serve_in_thread(d) as url:
        status, body = _http(f"{url}/objects/ab/{sha}")
        again, _ = _http(f"{url}/objects/ab/{sha}", {"Range": "bytes=0-99"})
    took = time.perf_counter() - t
    v = run_child(["store", "verify", str(d)], b.timeout_s)
    said = next((ln for ln in v["lines"] if sha in ln), _said(v))
    return [_row("foreign file under objects/ (a hard link from outside)", "43.2",
                 f"GET -> {status} ({body.decode(errors='replace').strip()[:60]}), Range GET -> {again}; "
                 f"verify rc {v['rc']}: {said}", took, v["peak_rss_mib"],
                 status in (404, 500) and again in (404, 500) and v["rc"] == 1 and sha in said)]


def probe_sigkill_rebuild(b: Bench) -> list[dict]:
    store = b.base / "killed"
    first = run_child(["build", str(store), *_QUICK_BUILD[:2], *_QUICK_BUILD[4:], "--quiet"], b.timeout_s)
    if first["rc"] != 0:
        raise RuntimeError(f"the first build failed: {_said(first)}")
    k = build_signalled(store, _QUICK_BUILD, signal.SIGKILL, stop_at=_MID_BUILD, timeout_s=b.timeout_s)
    tdir = store / TMP_DIR
    left = stale_temp_files(store) or []
    # what a writer killed inside a write leaves (whether this kill hit one is luck): one more such file
    tdir.mkdir(parents=True, exist_ok=True)
    (tdir / "object.killed-mid-write.tmp").write_bytes(b"partial")
    v1 = run_child(["store", "verify", str(store)], b.timeout_s)
    listed = any("temp file(s) left by an interrupted build" in ln for ln in v1["lines"])
    r = run_child(["build", str(store), *_QUICK_BUILD, "--quiet"], b.timeout_s)
    after = stale_temp_files(store)
    v2 = Store(store).verify()
    return [_row("SIGKILL mid-build (a store of look-00 built first), then a rebuild", "43.3",
                 f"killed: {len(left)} temp file(s) left (+1 planted); verify lists them: {'yes' if listed else 'NO'}; "
                 f"rebuild rc {r['rc']}: {len(after or [])} left, verify {'OK' if v2.ok else v2.problems[0]}, "
                 f"{len(Store(store).manifest_keys())} manifests", k["wall_s"] + r["wall_s"], r["peak_rss_mib"],
                 k["signalled"] and listed and r["rc"] == 0 and after == [] and v2.ok)]


def probe_sigint(b: Bench) -> list[dict]:
    store = b.base / "interrupted"
    k = build_signalled(store, _QUICK_BUILD, signal.SIGINT, stop_at=_MID_BUILD, timeout_s=b.timeout_s)
    consistent = not (store / "manifests").exists() or Store(store).verify().ok
    return [_row("SIGINT mid-build (to the process group, as Ctrl-C)", "43.3",
                 f"rc {k['rc']}, {len(k['lines'])} line(s): {' / '.join(k['lines'])[:120]}; store "
                 f"{'consistent' if consistent else 'INCONSISTENT'}", k["wall_s"], None,
                 k["signalled"] and k["rc"] == 130 and k["lines"][-1:] == [INTERRUPTED] and consistent
                 and not any("Traceback" in ln or "Process " in ln for ln in k["lines"]))]


def probe_raw_stream(b: Bench) -> list[dict]:
    store = b.default_store()
    with serve_in_thread(store) as url:
        r = b.edit(url, b.base / "g-raw", "--policy", "raw-stream")
    said = next((ln for ln in r["lines"] if "lossless" in ln), "(nothing said about the missing rung)")
    return [_row("raw-stream on the default store (no lossless rung)", "43.4", f"rc {r['rc']}: {said}", r["wall_s"],
                 r["peak_rss_mib"], r["rc"] == 0 and "ladder lacks" in said)]


def probe_floor_estimate(b: Bench, photos: int = 8, steps: int = 4) -> list[dict]:
    """Every rung of the default store, fetched for every layer, on held-out photos: the floor the
    edit reports (`EditResult.floor_psnr_db`, estimated at build time on calibration photos) against
    the PSNR it reached vs the all-local edit."""
    store = b.default_store()
    t = time.perf_counter()
    summary = floor_error_summary(floor_heldout_shortfalls(store, photos=photos, steps=steps), photos=photos,
                                  steps=steps)
    summary["wall_s"] = time.perf_counter() - t
    if b.out_dir is not None:
        write_json(Path(b.out_dir) / "floor_heldout.json", summary, indent=1)
        if Path(b.out_dir).resolve().parts[-2:] == ("docs", "faults"):  # --publish: what EditResult quotes
            write_json(floor_asset_path(), summary, indent=1)
    below = summary["below_floor"]
    return [_row("floor estimate on held-out photos (PSNR vs the all-local edit)", "43.6",
                 f"{summary['edits']} edits: {below} below their reported floor, by up to "
                 f"{summary['max_shortfall_db']:.2f} dB (p95 {summary['p95_shortfall_db']:.2f} dB); median margin "
                 f"{summary['median_margin_db']:+.2f} dB", summary["wall_s"], None, summary["edits"] > 0)]


def floor_asset_path() -> Path:

    return Path(sakura.__file__).resolve().parent / "assets" / "floor_heldout.json"


def floor_heldout_shortfalls(store: Path, *, photos: int, steps: int, seed: int = 0) -> list[dict]:
    """One streamed edit per (template, held-out photo, rung): ``floor_db`` (what the edit reports)
    and ``actual_db`` (its PSNR against the all-local edit of the same photo)."""


    torch.set_num_threads(1)
    model = load_model("sakura-mini")
    size, fp = model.cfg.image_size, model.fingerprint()
    profile = profile_model(model, repeats=2)
    held = heldout_photos(size)[:photos]
    out = []
    with serve_in_thread(store) as url:
        for template in Store(store).manifest_keys():
            m = Store(store).get_manifest(*template)
            tpl = get_template(template[1], size)
            timg = tpl.image[None]
            for i in range(len(held)):
                photo = held[i:i + 1]
                local = model.edit(photo, template=timg, instruction=tpl.instruction, steps=steps, seed=seed).image
                for rung in [r.name for r in m.shards[0].renditions]:
                    res = streamed_edit(model, photo, base_url=url, template_id=template[1], template_image=timg,
                                        instruction=tpl.instruction, policy=FixedPolicy(rung, name=rung),
                                        profile=profile, bandwidth=BandwidthEstimator(prior_bps=1e9),
                                        rtt=RttEstimator(prior_s=0.001), steps=steps, seed=seed, manifest=m,
                                        emulate=Emulation(renditions=(rung,)), allow_fast_path=False)
                    if not res.quality_known or any(r.source != rung for r in res.records):
                        continue  # a layer computed here: not the rung's floor
                    out.append({"template": template[1], "photo": i, "rung": rung, "floor_db": res.implied_psnr_db,
                                "actual_db": float(psnr_per_image(res.image, local).mean())})
    return out


def floor_error_summary(rows: list[dict], *, photos: int, steps: int) -> dict:
    """How far held-out edits land below their reported floor: ``shortfall = floor - actual`` (dB,
    positive = below the floor), over the edits whose floor is finite."""
    finite = [r for r in rows if np.isfinite(r["floor_db"]) and np.isfinite(r["actual_db"])]
    short = np.array([r["floor_db"] - r["actual_db"] for r in finite]) if finite else np.array([np.nan])
    return {"what": "EditResult.floor_psnr_db is estimated at build time on calibration photos; held-out photos "
                    "(never seen by the build) edited with every layer at one rung, PSNR against the all-local edit",
            "command": "sakura bench faults --no-faults --no-hostile", "photos": photos, "steps": steps,
            "edits": len(finite), "below_floor": int((short > 0).sum()) if finite else 0,
            "below_floor_fraction": float((short > 0).mean()) if finite else float("nan"),
            "max_shortfall_db": float(max(0.0, np.nanmax(short))) if finite else float("nan"),
            "p95_shortfall_db": float(max(0.0, np.nanpercentile(short, 95))) if finite else float("nan"),
            "median_margin_db": float(-np.nanmedian(short)) if finite else float("nan"),
            "wall_s": 0.0, "rows": finite}


def probe_hash_check_load(b: Bench, clients: int = 64, seconds: float = 5.0, rounds: int = 2) -> list[dict]:
    """`clients` concurrent phones (each: manifest, then every shard, as an edit fetches) against
    `sakura serve` with the object hash check off and on, alternating `rounds` times. Held: no
    errors, and the warm p99 with the check within 10 % of the p99 without it."""
    res = hash_check_load(b.base / "load", clients=clients, seconds=seconds, rounds=rounds)
    off, on = res["off"], res["on"]
    ok = on["warm"]["errors"] == 0 and on["warm"]["p99_ms"] <= 1.10 * off["warm"]["p99_ms"]

    def said(r: dict) -> str:
        return f"{r['requests']} requests, p50 {r['p50_ms']:.0f} ms, p99 {r['p99_ms']:.0f} ms, {r['errors']} errors"

    rows = [_row(f"{clients} concurrent edits, hash check {k}", "43.2 load",
                 f"first pass (every object's first serve): {said(r['cold'])}; then {rounds} x {seconds:.0f} s: "
                 f"{said(r['warm'])}; server RSS peak {r['rss_peak_mib']:.0f} MiB", r["wall_s"], r["rss_peak_mib"],
                 r["warm"]["errors"] == 0) for k, r in (("off", off), ("on", on))]
    rows.append(_row("hash check: cost", "43.2 load", f"warm p99 on/off {on['warm']['p99_ms'] / off['warm']['p99_ms']:.2f}, "
                     f"first pass p99 on/off {on['cold']['p99_ms'] / off['cold']['p99_ms']:.2f}; a remembered object "
                     f"{res['per_request_us']:.1f} us/request, a first serve hashes at {res['hash_MBps']:.0f} MB/s "
                     f"({res['hashed_object_bytes'] // 1024} KiB object)", None, None, ok))
    return rows


def hash_check_load(workdir: Path, *, clients: int, seconds: float, rounds: int) -> dict:
    """Per mode (check off / on): a fresh server's first pass over every object (``cold``: each
    object's first serve, where the check hashes it), then timed rounds (``warm``), alternating the
    modes `rounds` times; shard-latency percentiles, requests and server peak RSS. Plus the check's
    own cost: a remembered object's lookup (us) and the hash rate of a first serve (MB/s)."""
    workdir.mkdir(parents=True, exist_ok=True)
    store = workdir / "store"
    names = make_synthetic_store(store, templates=32, layers=8, tokens=512, width=256, model_fingerprint=FP)
    renditions = len(Store(store).get_manifest(FP, names[0]).shards[0].renditions)
    pooled = {k: {"cold": [], "warm": [], "cold_req": 0, "warm_req": 0, "cold_err": 0, "warm_err": 0, "rss": 0,
                  "wall_s": 0.0} for k in ("off", "on")}
    for _ in range(rounds):
        for mode in ("off", "on"):
            proc, url = start_server("sakura", store, workdir, verify_objects=mode == "on")
            p = pooled[mode]
            try:
                with RssSampler(proc.pid) as rss:
                    for phase, n_rounds, max_s in (("cold", renditions, 120.0), ("warm", 1000, seconds)):
                        r = asyncio.run(level(url, names, clients, n_rounds, max_s))
                        p[phase] += r["latencies_s"]
                        p[f"{phase}_req"] += r["shards"] + r["manifests"]
                        p[f"{phase}_err"] += r["errors"]
                        p["wall_s"] += r["wall_s"]
            finally:
                proc.terminate()
                proc.wait(10)
            p["rss"] = max(p["rss"], rss.peak)

    def stats(p: dict, phase: str) -> dict:
        lat = np.array(p[phase] or [np.nan])
        return {"p50_ms": float(np.percentile(lat, 50) * 1e3), "p99_ms": float(np.percentile(lat, 99) * 1e3),
                "requests": p[f"{phase}_req"], "errors": p[f"{phase}_err"]}

    out: dict = {k: {"cold": stats(p, "cold"), "warm": stats(p, "warm"), "rss_peak_mib": p["rss"] / 1024,
                     "wall_s": p["wall_s"]} for k, p in pooled.items()}
    out.update(check_cost(store), clients=clients, seconds_per_round=seconds, rounds=rounds)
    return out


def check_cost(store: Path, calls: int = 20_000) -> dict:
    """What `VerifiedObjects.matches` costs: per warm call (us) and the first hash of an object (MB/s)."""

    obj = max((p for p in (store / "objects").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    fd = os.open(obj, os.O_RDONLY)
    try:
        st = os.fstat(fd)

        t = time.perf_counter()
        assert _sha256_fd(fd, st.st_size) == obj.name
        first = time.perf_counter() - t

        async def go() -> float:
            v = VerifiedObjects()
            assert await v.matches(obj.name, fd, st)  # hashed (in a worker thread for a large object)
            t = time.perf_counter()
            for _ in range(calls):
                await v.matches(obj.name, fd, st)
            return (time.perf_counter() - t) / calls

        warm = asyncio.run(go())
    finally:
        os.close(fd)
    return {"per_request_us": warm * 1e6, "hash_MBps": st.st_size / first / 1e6, "hashed_object_bytes": st.st_size}


# ------------------------------------------------------------------------------------ the run
PROBES: dict[str, Callable[[Bench], list[dict]]] = {
    "edit, 3 other listed manifests drip": probe_drip, "gc racing a rebuild": probe_gc_race,
    "fd pressure": probe_fd_pressure, "FIFO in the store": probe_fifo, "escapes in a manifest": probe_escapes,
    "template swapped under a pinned id": probe_swapped, "gallery manifest/reference mismatch": probe_gallery_mismatch,
    "manifest for another model": probe_other_model, "disk full": probe_disk_full,
    "large template image": probe_large_image, "library of 10,000 entries": probe_library, "smaller": probe_smaller,
    "verify on a non-store": probe_verify_non_store, "foreign file under objects/": probe_foreign_object,
    "SIGKILL mid-build, then a rebuild": probe_sigkill_rebuild, "SIGINT mid-build": probe_sigint,
    "raw-stream on the default store": probe_raw_stream, "floor estimate on held-out photos": probe_floor_estimate,
    "64 concurrent edits, hash check off/on": probe_hash_check_load,
}


def run_reliability(out_dir: str | Path | None = None, *, probes=RELIABILITY_PROBES, fd_duration_s: float = 20.0,
                    library_entries: int = 10_000, timeout_s: float = 180.0) -> dict:
    """The probes asked for, top to bottom (see the module docstring); writes reliability.json/.md."""
    unknown = [p for p in probes if p not in PROBES]
    if unknown:
        raise ValueError(f"unknown probes {unknown}; expected some of {list(RELIABILITY_PROBES)}")
    with tempfile.TemporaryDirectory(prefix="sakura-rel-") as tmp:
        b = Bench(Path(tmp), None if out_dir is None else Path(out_dir), timeout_s, fd_duration_s, library_entries)
        if set(probes) - _OWN_STORE:
            b.store()
        rows: list[dict] = []
        for probe in probes:
            try:
                new = PROBES[probe](b)
            except Exception as e:  # a probe that breaks is a row, not the end of the run
                new = [_row(probe, "-", f"probe error: {type(e).__name__}: {e}", None, None, False)]
            for row in new:
                log.info("  %s %s: %s (%s)", "ok  " if row["ok"] else "FAIL", row["probe"], row["outcome"],
                         "-" if row["time_s"] is None else f"{row['time_s']:.2f} s")
            rows += new
    result = {"rows": rows, "load_avg": os.getloadavg(), "cores": os.cpu_count(), "fd_duration_s": fd_duration_s}
    return publish(out_dir, "reliability", result, reliability_table(result))


def reliability_table(result: dict) -> str:
    """Markdown: probe, issue item, outcome, time to outcome, peak RSS, ok / FAIL."""
    rows = [[r["probe"], r["item"], r["outcome"], "-" if r["time_s"] is None else f"{r['time_s']:.2f}",
             "-" if r["peak_rss_mib"] is None else f"{r['peak_rss_mib']:.0f}", "ok" if r["ok"] else "FAIL"]
            for r in result["rows"]]
    la = result.get("load_avg") or (float("nan"),) * 3
    return (markdown_table(["probe", "item", "outcome (one line)", "time to outcome (s)", "peak RSS (MiB)", "held"],
                           rows, align="lllrrl")
            + f"\n\nload average {la[0]:.1f} / {la[1]:.1f} / {la[2]:.1f} on {result.get('cores')} cores "
              f"(shared machine: times are indicative)\n")

