"""Build throughput of `sakura build --executor ray` with 1 vs 2 (or more) Ray workers, same bytes out.

For each worker count, in alternating rounds (so a change in the machine's background load hits
both alike): start a local Ray cluster with that many CPUs, warm every worker (imports + model
load: a long-lived cluster pays this once, not per build), build the same templates into a fresh
store, time it, shut the cluster down. Stores of every run are compared file by file (bytes).
The machine's load average and this build's CPU use are recorded beside every figure.

    sakura bench build-scale [--workers 1 --workers 2] [--rounds 2] [--templates 12] [--out docs/scale_build.json]
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Sequence
from sakura.bench.harness import get_logger
from sakura.util.fsutil import write_json
from sakura.cloud.builder.distributed import build_templates
from sakura.cloud.builder.pipeline import DEFAULT_LADDER
from sakura.cloud.tasks import TASK_NAMES
from sakura.models import load_model
import sakura.cloud.builder.pipeline

log = get_logger(__name__)


def _warm(seconds: float) -> int:
    """Runs on a worker: import the build path and load the model, then hold the CPU slot a
    moment so that every worker (not one worker n times) gets a warm-up task."""
    load_model("sakura-mini")
    time.sleep(seconds)
    return os.getpid()


def _tree_digest(root: Path) -> dict[str, str]:
    out = {}
    for d, dirs, fs in os.walk(root):
        dirs[:] = [x for x in dirs if not x.startswith(".")]
        for f in fs:
            if not f.startswith("."):
                p = Path(d) / f
                out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _cpu_s() -> float:
    """CPU seconds of every process on the machine (from /proc/stat): busy = total - idle - iowait."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(vals) - vals[3] - vals[4]) / tick


def run_one(workers: int, names: list[str], store: Path, ladder: list[str], calibration: int, steps: int) -> dict:
    import ray  # lazy: ray ([cluster] extra)

    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=workers, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        t_init = time.perf_counter() - t0
        warm = ray.remote(num_cpus=1)(_warm)
        pids = ray.get([warm.remote(1.0) for _ in range(workers)])
        t_warm = time.perf_counter() - t0 - t_init
        load0, cpu0, t1 = os.getloadavg()[0], _cpu_s(), time.perf_counter()
        rep = build_templates(store, templates=names, executor="ray", ladder=ladder, calibration=calibration,
                              steps=steps, progress=False, log=lambda s: None)
        wall = time.perf_counter() - t1
        cpu = _cpu_s() - cpu0
        load1 = os.getloadavg()[0]
    finally:
        ray.shutdown()
    assert rep.ok and len(rep.by_status("built")) == len(names), rep.builds
    task_s = [b.seconds for b in rep.builds]
    task_cpu = sum(b.cpu_seconds for b in rep.builds)
    return {"workers": workers, "templates": len(names), "build_s": wall, "templates_per_s": len(names) / wall,
            # CPU the build's tasks actually got: under a per-session CPU share (Linux autogroup) on a
            # busy machine this, not the worker count, bounds the speedup
            "task_cpu_s_per_template": task_cpu / len(names), "cores_obtained_by_tasks": task_cpu / wall,
            "ray_init_s": t_init, "warmup_s": t_warm, "distinct_warm_workers": len(set(pids)),
            "distinct_build_workers": len({b.worker for b in rep.builds}),
            "task_s_mean": statistics.mean(task_s), "task_s_max": max(task_s),
            "machine_busy_cores_during_build": cpu / wall, "loadavg_1min_before": load0, "loadavg_1min_after": load1}


def run(workers: Sequence[int] = (1, 2), rounds: int = 2, templates: int = 12, ladder: Sequence[str] | None = None,
        calibration: int = 2, steps: int = 4, out: Path | None = None) -> dict:
    """Build `templates` library templates (tasks interleaved) with each worker count in `workers`,
    `rounds` alternating rounds; write the JSON to `out` if given; returns it."""
    per_task = -(-templates // len(TASK_NAMES))
    names = [f"{t}-{i:02d}" for i in range(per_task) for t in TASK_NAMES][:templates]
    ladder = list(ladder or DEFAULT_LADDER)
    counts = list(workers)
    work = Path(tempfile.mkdtemp(prefix="sakura-build-scale-"))
    runs, digests = [], {}
    for r in range(rounds):
        for w in counts:
            store = work / f"w{w}-r{r}"
            res = run_one(w, names, store, ladder, calibration, steps)
            res["round"] = r
            digests[store.name] = _tree_digest(store)
            runs.append(res)
            log.info("%s", f"round {r} workers {w}: {res['build_s']:.1f} s for {len(names)} templates "
                           f"({res['templates_per_s']:.2f}/s; task mean {res['task_s_mean']:.2f} s, "
                           f"{res['task_cpu_s_per_template']:.2f} CPU-s; tasks got {res['cores_obtained_by_tasks']:.2f} cores; machine busy "
                           f"{res['machine_busy_cores_during_build']:.2f} of {os.cpu_count()} cores; load "
                           f"{res['loadavg_1min_before']:.1f}->{res['loadavg_1min_after']:.1f}; ray init "
                           f"{res['ray_init_s']:.1f} s, warm-up {res['warmup_s']:.1f} s)")
    ref = next(iter(digests.values()))
    same = all(d == ref for d in digests.values())
    med = {w: statistics.median(x["build_s"] for x in runs if x["workers"] == w) for w in counts}
    speedup = {w: med[counts[0]] / med[w] for w in counts}
    result = {"templates": names, "ladder": ladder, "calibration": calibration, "steps": steps,
           "cpu_count": os.cpu_count(), "runs": runs, "median_build_s": med, "speedup_vs_first": speedup,
           "same_bytes_in_every_store": same, "files_per_store": len(ref),
           "bytes_per_store": sum((work / f"w{counts[0]}-r0" / k).stat().st_size for k in ref)}
    log.info("%s", f"median build s: {med}; speedup vs {counts[0]} worker(s): "
                   + ", ".join(f"{w}: {s:.2f}x" for w, s in speedup.items())
                   + f"; same bytes in all {len(digests)} stores: {same}")
    shutil.rmtree(work, ignore_errors=True)
    if out is not None:
        write_json(Path(out), result, indent=1)
    return result
