"""`sakura build --executor ray`: spread templates over a Ray cluster; idempotent and resumable.

Unit of work: one template (``build_store(store, templates=[name], ...)`` in a Ray task). Each
task writes its content-addressed objects and then commits that template's manifest, atomically,
last; nothing is sent back but the manifest path. So:

- a rerun skips every template whose manifest is current (its `incremental` keys: the same
  model, template image and settings; every referenced object present with the right size,
  sha256 and rung prefix digests: ``Store.verify_manifest``, checked by the task itself, so
  re-hashing a large library is spread over the workers too); when every template is current
  the driver decides so itself, before any model loads; ``force=True`` rebuilds anyway;
- a killed worker loses no committed work: templates it finished are committed on disk; the one
  it was building has at most orphan objects, and Ray reruns the task (``max_retries``), which
  finds its earlier objects intact and does not rewrite them;
- two workers writing the same object (shared codec tables) is safe: each writes a private temp
  file and renames it over the same content-addressed name.

The store directory must be visible to every worker at the same path (one machine, or a shared
filesystem on a multi-node cluster), and ``sakura`` must be importable on every node (a local
cluster inherits the driver's environment). Ray is optional: ``pip install .[cluster]``.

``executor="local"`` runs the same per-template loop in this process (the 1-worker baseline and
the fallback without Ray); plain ``sakura build`` keeps calling ``build_store`` directly.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence
import socket

from sakura.cloud import tasks  # a lazy facade: its names load torch on first use, the skip path none
from sakura.cloud.builder import incremental
from sakura.cloud.builder.defaults import BASE_RUNG_PSNR_DB, DEFAULT_LADDER, default_templates
from sakura.cloud.builder.incremental import expected_rendition_bases, manifest_is_current  # noqa: F401 (their old home)
from sakura.cloud.builder.pipeline import build_store
from sakura.util.device import resolve_device
from sakura.util.report import report_logger

EXECUTORS = ("local", "ray")

#: the build's lines (one per template: built, skipped, failed), plain on stdout
REPORT = report_logger(__name__, root="sakura.cloud.builder")


@dataclass(frozen=True)
class TemplateBuild:
    """Outcome for one template: ``status`` is ``built``, ``skipped`` (manifest already current)
    or ``failed`` (``error`` says why); ``seconds`` / ``cpu_seconds`` are the task's own wall and
    CPU time; ``worker`` the host:pid that ran it."""

    template: str
    status: str
    manifest: str | None = None
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # CPU time of the process that built it (all its threads)
    worker: str = ""
    error: str | None = None
    #: whole edits of the calibration photos this template's build ran (a backward pass counts 2;
    #: 0 when skipped)
    calibration_edits: float = 0.0
    #: "model" or "probes" (`build_store(allocation=)`); None when skipped or failed
    allocation: str | None = None
    #: the model allocation's measured checks of predicted figures: [{shard, rendition,
    #: predicted_image_mse, measured_image_mse}]
    figure_checks: list[dict] = field(default_factory=list)
    #: the ladder search's measured trials: [{budget, predicted_psnr_db, measured_psnr_db}]
    ladder_trials: list[dict] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.template

    def to_json(self) -> dict[str, Any]:
        d = {"id": self.template, **{k: v for k, v in asdict(self).items() if k != "template"}}
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in d.items()}


@dataclass
class BuildReport:
    """What a build did: per template (`builds`) built / skipped / failed with its wall and CPU
    seconds and calibration edits; `processes` and `threads` it used (template processes, image
    probe threads per process; Ray: the cluster's CPUs as workers); `seconds` the whole build's wall."""

    executor: str
    workers: int
    seconds: float = 0.0   # wall time of the whole build, including skipped-template checks
    builds: list[TemplateBuild] = field(default_factory=list)
    processes: int = 1
    threads: int = 1
    cpu_seconds: float = 0.0  # CPU time of the whole build (this process and its template processes)

    def by_status(self, status: str) -> list[str]:
        return [b.template for b in self.builds if b.status == status]

    @property
    def ok(self) -> bool:
        return not self.by_status("failed")

    def to_json(self) -> dict[str, Any]:
        """What `sakura build --json` prints: ``{"templates": [{"id": ..., "calibration_edits": ..., ...}], ...}``."""
        return {"templates": [b.to_json() for b in self.builds], "executor": self.executor, "workers": self.workers,
                "processes": self.processes, "threads": self.threads, "seconds": round(self.seconds, 4),
                "cpu_seconds": round(self.cpu_seconds, 4), "ok": self.ok,
                "calibration_edits": round(sum(b.calibration_edits for b in self.builds), 3)}


def _build_one(store: str, template: str, opts: dict[str, Any], model_fingerprint: str, force: bool) -> TemplateBuild:
    """One template, in whatever process runs it (a Ray worker or this one): `build_store` skips
    it when current (its source key, checked before the model loads, or its build key after;
    objects re-hashed here, so a rerun of a large library re-hashes in parallel on the workers,
    not serially in the driver), else builds and commits it."""
    t0, c0 = time.perf_counter(), time.process_time()
    worker = f"{socket.gethostname()}:{os.getpid()}"
    facts: dict[str, dict] = {}
    paths = build_store(store, templates=[template], log=lambda _s: None, force=force, facts=facts, **opts)
    f = facts.get(template, {})
    return TemplateBuild(template, f.get("status", "built"), str(paths[0]), time.perf_counter() - t0,
                         time.process_time() - c0, worker=worker, calibration_edits=f.get("calibration_edits", 0.0),
                         allocation=f.get("allocation"), figure_checks=f.get("figure_checks", []),
                         ladder_trials=f.get("ladder_trials", []))


def build_templates(store: str | os.PathLike[str], *, templates: Sequence[str] | None = None,
                    model_name: str = "sakura-mini", ladder: Sequence[str] | None = None, calibration: int = 2,
                    steps: int = 4, seed: int = 0, executor: str = "ray", address: str | None = None,
                    workers: int | None = None, force: bool = False, max_retries: int = 3, progress: bool = True,
                    log: Callable[[str], None] | None = None, device: str = "auto", dtype: str = "auto",
                    probe_batch: int | None = None, allocation_photos: int | None = None,
                    allocation: str = "model") -> BuildReport:
    """Build one manifest per template on ``executor``, skipping templates already current.

    Args:
        store: store directory (created if missing); absolute path seen by every worker.
        templates: library template names; default one per task (as ``sakura build``).
        executor: ``"ray"`` (a Ray cluster) or ``"local"`` (this process, one template at a time).
        address: an existing Ray cluster (``ray://...`` or ``host:port``); default: start a local
            one with ``workers`` CPUs (default: all cores) and shut it down afterwards. If Ray is
            already initialised in this process, that cluster is used as is.
        workers: concurrent templates on a local cluster (each task takes one CPU).
        force: rebuild templates even if their manifest is current.
        allocation: `build_store`'s ("model" or "probes").
        max_retries: Ray retries of a task whose worker died (a task that raises is not retried).
        progress: a tqdm bar over templates (stderr).
        log: where the per-template lines go; default the ``sakura.cloud.builder`` logger (plain lines on
            stdout: `sakura.util.report`). A sink is for a caller that routes them itself: the CLI
            above its progress bar, a template process back over its pipe.
    Returns:
        a ``BuildReport``; templates that failed are listed with the error, the others are committed.
    """
    from tqdm import tqdm  # lazy: tqdm; off --help and argument errors

    log = log or REPORT.info
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    ladder = list(ladder or DEFAULT_LADDER)
    names = list(templates) if templates else default_templates()
    if len(set(names)) != len(names):
        raise ValueError(f"templates listed twice: {sorted({n for n in names if names.count(n) > 1})}")
    root = Path(store).resolve()
    root.mkdir(parents=True, exist_ok=True)
    opts = dict(model_name=model_name, ladder=ladder, calibration=calibration, steps=steps, seed=seed, device=device,
                dtype=dtype, probe_batch=probe_batch, allocation_photos=allocation_photos, allocation=allocation)
    if executor == "ray":
        opts["probe_workers"] = 1  # one CPU per Ray task: its probes run one at a time
    t_start = time.perf_counter()
    report = BuildReport(executor=executor, workers=1)
    if not force and _all_current(root, names, opts, report, log):  # decided before any model loads
        report.seconds = time.perf_counter() - t_start
        return report
    model_fp, on_gpu = _check_inputs(model_name, names, ladder, device)  # bad names/specs fail here, not in every task
    bar = tqdm(total=len(names), unit="template", disable=not progress, desc=f"build ({executor})")
    try:
        if executor == "local":
            for n in names:
                report.builds.append(_run_local(str(root), n, opts, model_fp, force))
                bar.update(1)
        else:
            report.workers = _run_ray(str(root), names, opts, model_fp, force, report, bar, address=address,
                                      workers=workers, max_retries=max_retries, gpus=1 if on_gpu else 0)
    finally:
        bar.close()
    report.seconds = time.perf_counter() - t_start
    order = {n: i for i, n in enumerate(names)}
    report.builds.sort(key=lambda b: order[b.template])
    for b in report.builds:
        if b.status == "failed":
            log(f"FAILED {b.template}: {b.error}")
    skipped = report.by_status("skipped")
    if skipped:
        log(f"skipped {len(skipped)} template(s) whose manifest is current: "
            f"{', '.join(skipped[:8])}{' ...' if len(skipped) > 8 else ''}")
    log(f"{len(report.by_status('built'))} built, {len(skipped)} skipped, "
        f"{len(report.by_status('failed'))} failed in {report.seconds:.1f} s ({executor}, {report.workers} worker(s))")
    return report


def _all_current(root: Path, names: Sequence[str], opts: dict[str, Any], report: BuildReport,
                 log: Callable[[str], None]) -> bool:
    """True (every template in `report` as skipped) when every template finds a verified manifest
    with its source key (`incremental`): a rerun of an unchanged library loads no model anywhere."""
    settings = incremental.request_settings(
        ladder=opts["ladder"], calibration=opts["calibration"], steps=opts["steps"], seed=opts["seed"],
        base_psnr_db=BASE_RUNG_PSNR_DB, allocation=opts["allocation"], sketch_probes=None,
        allocation_photos=opts["allocation_photos"])
    found = incremental.skip_before_load(root, incremental.source_keys(opts["model_name"], names, settings), names, log)
    if found is None:
        return False
    report.builds += [TemplateBuild(n, "skipped", str(p), w, c) for n, (p, w, c) in found.items()]
    log(f"0 built, {len(found)} skipped, 0 failed (every template current; no model loaded)")
    return True


def _check_inputs(model_name: str, names: Sequence[str], ladder: Sequence[str], device: str = "auto"
                  ) -> tuple[str, bool]:
    """Validate template names and codec specs; returns (the model fingerprint, whether the
    builds run on CUDA: each Ray task then asks for one GPU). The driver loads the model on the
    CPU (its fingerprint is the same on every device)."""
    from sakura.codec import codec_from_spec  # lazy: torch, numba; an unchanged store's skip loads none
    from sakura.models import load_model  # lazy: torch, numba; an unchanged store's skip loads none

    for spec in ladder:
        codec_from_spec(spec)
    on_gpu = resolve_device(device).type == "cuda"
    model = load_model(model_name, device="cpu", dtype="float32")
    for n in names:  # every model load_model gives is an ImageTemplateEditModel: it has cfg.image_size
        tasks.get_template(n, model.cfg.image_size)
    return model.fingerprint(), on_gpu


def _run_local(root: str, name: str, opts: dict[str, Any], model_fp: str, force: bool) -> TemplateBuild:
    try:
        return _build_one(root, name, opts, model_fp, force)
    except Exception as e:  # noqa: BLE001 - one template's failure is reported, the rest still build
        return TemplateBuild(name, "failed", error=f"{type(e).__name__}: {e}")


def _run_ray(root: str, todo: list[str], opts: dict[str, Any], model_fp: str, force: bool, report: BuildReport,
             bar: Any, *, address: str | None, workers: int | None, max_retries: int, gpus: int = 0) -> int:
    """Submit one task per template, collect as they finish; returns the cluster's CPU count.
    `gpus`: GPUs each task asks Ray for (1 when the model runs on CUDA: one build per GPU)."""
    try:
        import ray  # lazy: ray, the [cluster] extra
    except ImportError:
        raise RuntimeError("--executor ray needs Ray: pip install '.[cluster]' (or use --executor local)") from None
    started = False
    if not ray.is_initialized():
        kw: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
        if address:
            try:
                ray.init(address=address, **kw)
            except ConnectionError as e:
                raise ConnectionError(f"{e} (a cluster with token authentication needs RAY_AUTH_MODE=token and its "
                                      f"token in RAY_AUTH_TOKEN or ~/.ray/auth_token on this machine)") from None
        else:  # "local": always a new cluster of our own, never one another user left running here
            ray.init(address="local", num_cpus=workers or os.cpu_count() or 1, **kw)
        started = True
    try:
        cpus = int(ray.cluster_resources().get("CPU", 1))
        task = ray.remote(num_cpus=1, num_gpus=gpus, max_retries=max_retries, retry_exceptions=False)(_build_one)
        pending = {task.remote(root, n, opts, model_fp, force): n for n in todo}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                name = pending.pop(ref)
                try:
                    report.builds.append(ray.get(ref))
                except Exception as e:  # noqa: BLE001 - RayTaskError (raised) or worker death after retries
                    cause = getattr(e, "cause", None) or e
                    report.builds.append(TemplateBuild(name, "failed", error=f"{type(cause).__name__}: "
                                                       f"{str(cause).strip().splitlines()[-1][:300]}"))
                bar.update(1)
        return cpus
    finally:
        if started:
            ray.shutdown()
