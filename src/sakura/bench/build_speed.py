"""`sakura bench build-speed`: the bundled build, stage by stage, against a baseline, same run.

Each variant builds the same templates into a fresh store in its own process (imports and model
load included, as `sakura build` pays them), in alternating rounds so a change in this shared
machine's load hits every variant alike. Per variant: wall seconds, CPU seconds (the child's
user + system: what the build costs, whatever else runs here), the per-stage CPU seconds
(`build_store(profile=...)`), and the store's digest; stores of every variant are compared file by
file.

Variants: ``current`` (this checkout's defaults: templates in one process per core, image probes
in one thread per core), ``current-1-thread`` (one process, ``probe_workers=1``: the CPU work
alone), ``batched`` (``--probe-batch N``)
and, with ``--baseline-src DIR``, ``baseline`` (another checkout's ``src``, e.g. ``git worktree
add /tmp/base <commit>`` then ``/tmp/base/src``), whose ``build_store`` is called with its own
defaults. Stores differ between versions whose allocation differs: each variant's store size
(objects + manifests, bytes) is reported beside its time.

    sakura bench build-speed [--templates look-00 ...] [--rounds 1] [--baseline-src /tmp/base/src] [--out out/build_speed.json]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence
import hashlib
from tqdm import tqdm
from sakura.bench.harness import get_logger
from sakura.util.fsutil import atomic_write

_CHILD = r"""
import json, sys, time, resource, multiprocessing
t0 = time.perf_counter()
from sakura.cloud.builder.pipeline import build_store
import inspect
args = json.loads(sys.argv[1])
kw = dict(templates=args["templates"], log=lambda s: None)
params = inspect.signature(build_store).parameters
prof = {}
if "profile" in params:
    kw["profile"] = prof
facts = {}
if "facts" in params:
    kw["facts"] = facts
if args.get("allocation") and "allocation" in params:
    kw["allocation"] = args["allocation"]
# every checkout's edits counted the same way, at the model: photos edited / calibration photos (2),
# a first-step prefix 1/steps, a backward pass 2 x its graph's photos / 2 (autograd.grad calls); shared memory, so that
# forked template processes count too
from sakura.models.mini import MiniDiT
import torch
edits = multiprocessing.Value("d", 0.0)
def _count(x):
    with edits.get_lock():
        edits.value += x
def _wrap(name, photos_of, frac=1.0):
    f = getattr(MiniDiT, name, None)
    if f is None:
        return
    def g(self, *a, **k):
        _count(photos_of(a, k) / 2.0 * (frac if name != "first_step_prefix" else 1.0 / k.get("steps", 8)))
        return f(self, *a, **k)
    setattr(MiniDiT, name, g)
_wrap("edit", lambda a, k: (a[0] if a else k["photo"]).shape[0])
# `edit` is `differentiable_edit` under no_grad: the latter counts only when it keeps a graph
# a backward pass costs 2 forwards of the graph it runs through: of the photos of the last graph made
graph_photos = [2.0]
def _graph(a, k):
    if not torch.is_grad_enabled():
        return 0
    graph_photos[0] = (a[0] if a else k["photo"]).shape[0]
    return graph_photos[0]
_wrap("differentiable_edit", _graph)
_wrap("edit_replacing", lambda a, k: a[0].photo.shape[0])
_wrap("edit_many", lambda a, k: (a[0] if a else k["photo"]).shape[0] * len(a[1] if len(a) > 1 else k["template_kvs"]))
_wrap("first_step_prefix", lambda a, k: (a[0] if a else k["photo"]).shape[0])
_grad = torch.autograd.grad
def _counted_grad(*a, **k):
    _count(2.0 * graph_photos[0] / 2.0)
    return _grad(*a, **k)
torch.autograd.grad = _counted_grad
if args.get("probe_batch") and "probe_batch" in params:
    kw["probe_batch"] = args["probe_batch"]
if args.get("probe_workers") and "probe_workers" in params:
    kw["probe_workers"] = args["probe_workers"]
if args.get("template_workers") and "template_workers" in params:
    kw["template_workers"] = args["template_workers"]
if "device" in params:
    kw["device"] = args.get("device", "cpu")
build_store(args["store"], **kw)
ru, rc = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall_s": time.perf_counter() - t0,
                  "cpu_s": ru.ru_utime + ru.ru_stime + rc.ru_utime + rc.ru_stime,  # template processes too
                  "peak_rss_bytes": max(ru.ru_maxrss, rc.ru_maxrss) * 1024, "stages": prof,
                  "calibration_edits_counted": edits.value,
                  "calibration_edits_reported": {t: f.get("calibration_edits") for t, f in facts.items()}}))
"""

log = get_logger(__name__)


def _digest(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.name.startswith("."):
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _run_variant(src: Path, store: Path, templates: Sequence[str], probe_batch: int | None, device: str,
                 probe_workers: int | None = None, allocation: str | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    # probe_workers=1 is the CPU work alone: one thread in one process (no template processes either)
    args = json.dumps({"store": str(store), "templates": list(templates), "probe_batch": probe_batch,
                       "probe_workers": probe_workers, "template_workers": probe_workers, "device": device,
                       "allocation": allocation})
    p = subprocess.run([sys.executable, "-c", _CHILD, args], env=env, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(f"build in {src} failed: {p.stderr.strip().splitlines()[-1:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def run(templates: Sequence[str] = ("look-00", "texture-00", "sticker-00"), *, rounds: int = 1,
        baseline_src: Path | None = None, probe_batch: int = 1, device: str = "cpu", out: Path | None = None,
        probes_variant: bool = False) -> dict:
    """Build `templates` with every variant, `rounds` alternating rounds; returns (and writes to
    `out`) per variant the runs' figures and whether its stores equal the first variant's."""
    here = Path(__file__).resolve().parents[2]  # this checkout's src
    variants: dict[str, tuple[Path, int | None, int | None, str | None]] = {}
    if baseline_src is not None:
        variants["baseline"] = (Path(baseline_src).resolve(), None, None, None)
    variants["current"] = (here, None, None, None)
    variants["current-1-thread"] = (here, None, 1, None)
    if probes_variant:  # this checkout's build with the probe allocation (the build before issue 41)
        variants["current-probes"] = (here, None, None, "probes")
    if probe_batch > 1:
        variants[f"batched{probe_batch}"] = (here, probe_batch, None, "probes")
    res: dict = {"templates": list(templates), "rounds": rounds, "device": device, "cpu_count": os.cpu_count(),
                 "load_avg_1min_start": os.getloadavg()[0], "variants": {v: [] for v in variants}}
    digests: dict[str, dict[str, str]] = {}

    with tempfile.TemporaryDirectory(prefix="build-speed-") as tmp, \
            tqdm(total=rounds * len(variants), desc="builds", unit="build", disable=None) as bar:
        for r in range(rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for v in order:
                src, pb, pw, alloc = variants[v]
                store = Path(tmp) / f"{v}-{r}"
                bar.set_description_str(f"round {r} {v}")
                fig = _run_variant(src, store, templates, pb, device, pw, alloc)
                bar.update()
                fig["store_bytes"] = sum(f.stat().st_size for f in store.rglob("*") if f.is_file())
                fig["load_avg_1min"] = os.getloadavg()[0]
                res["variants"][v].append(fig)
                d = _digest(store)
                digests.setdefault(v, d)
                fig["store_same_as_round0"] = d == digests[v]
                log.info("%s", f"round {r} {v}: {fig['wall_s']:.1f} s wall, {fig['cpu_s']:.1f} CPU-s, "
                             f"{fig['calibration_edits_counted'] / len(templates):.1f} calibration edits a template, peak RSS "
                             f"{fig['peak_rss_bytes'] / 2**20:.0f} MiB (load {fig['load_avg_1min']:.1f})")
    first = next(iter(variants))
    res["summary"] = {}
    for v, runs in res["variants"].items():
        cpu = sorted(x["cpu_s"] for x in runs)[len(runs) // 2]
        wall = sorted(x["wall_s"] for x in runs)[len(runs) // 2]
        stages: dict[str, float] = {}
        for t in runs[0]["stages"].values():
            for k, s in t.items():
                if k.endswith(" cpu"):
                    stages[k[:-4]] = stages.get(k[:-4], 0.0) + s
        res["summary"][v] = {"median_cpu_s": cpu, "median_wall_s": wall, "stage_cpu_s": stages,
                             "store_bytes": runs[0]["store_bytes"],
                             "calibration_edits_per_template": runs[0]["calibration_edits_counted"] / len(templates),
                             "calibration_edits_reported": runs[0]["calibration_edits_reported"],
                             "peak_rss_mib": max(x["peak_rss_bytes"] for x in runs) / 2**20,
                             "store_bytes_identical_to_" + first: digests[v] == digests[first]}
    base = res["summary"][first]["median_cpu_s"]
    base_wall = res["summary"][first]["median_wall_s"]
    for v, s in res["summary"].items():
        s["cpu_speedup_vs_" + first] = base / s["median_cpu_s"] if s["median_cpu_s"] else float("nan")
        s["wall_speedup_vs_" + first] = base_wall / s["median_wall_s"] if s["median_wall_s"] else float("nan")
    res["load_avg_1min_end"] = os.getloadavg()[0]
    log.info("%s", json.dumps(res["summary"], indent=1))
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, (json.dumps(res, indent=1) + "\n").encode())
    return res
