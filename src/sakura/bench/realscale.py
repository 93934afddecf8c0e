"""`sakura bench realscale`: FLUX.2 Klein at the published shapes (random weights), as a user runs it.

1. A random-weight Klein KV pipeline at a preset's shapes (`sakura.models.flux.klein_random`: klein-4b,
   klein-9b, or the CPU test preset `tiny`) written with `save_pretrained` in bf16 (fp32 on the CPU);
2. loaded through ``klein:/folder@SIZE`` on the chosen device and dtype, exactly as a download
   (the second size reuses the loaded pipeline: same weights, a new `KleinImageModel`);
3. per size: one template (an image + a prompt, from a templates TOML) built with `build_store`
   (per-stage wall seconds), served on 127.0.0.1, and edited with the KV streamed (lossless
   rendition, the live runtime) and on the device;
4. reported per size: build seconds per stage; peak host RSS and peak device memory (build, edit);
   bytes per rendition; the decode rate of every rendition on the real shard sizes; whether the
   lossless streamed edit equals the edit with the same fp16 KV injected locally, and the edit
   with the template in the sequence, bit for bit; the edit's seconds against (the extract pass
   of the photo + steps-1 cached passes) timed in the same run.

Every figure says the device, dtype and torch build it was measured with. Targets (issue 33) are
printed beside the figures, never asserted.

    sakura bench realscale --preset klein-4b --size 1024 --device cuda --dtype bf16 --out out/realscale.json
    sakura bench realscale --preset tiny --size 32 --size 64     # the CPU check (a test runs it)
"""

from __future__ import annotations

import json
import logging
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence
import shutil
from PIL import Image, ImageDraw
import torch
from sakura.cloud.builder.pipeline import DEFAULT_LADDER, build_store
from sakura.cloud.builder.template_files import load_library_file
from sakura.cloud.capture import calibration_photos
from sakura.codec import CodecTables, ShardId
from sakura.codec.base import decode_any
from sakura.models import load_model
from sakura.models.flux.klein_random import PRESETS, weight_bytes, write_random_klein_folder
from sakura.models.kv import TemplateKV
from sakura.phone import BandwidthEstimator, FixedPolicy, RttEstimator
from sakura.phone.live import DeviceProfile, streamed_edit
from sakura.util.device import peak_memory, reset_peak_memory, resolve, synchronize
from sakura.util.fsutil import atomic_write
from sakura.wire.server import serve_in_thread
from sakura.wire.store.store import Store
from sakura.wire.store.template_ref import decode_template_ref, split_template_images
from sakura.bench.harness import get_logger

_LOG = get_logger(__name__)

log_ = logging.getLogger(__name__)

TEMPLATES_TOML = '[[template]]\nid = "sun"\nimages = ["sun.png"]\nprompt = "add a warm sun to the sky"\n'
#: the build's ladder here: the default one plus the lossless rendition the bit-exact check streams
DEFAULT_BENCH_LADDER = ("lossless",)


def _sync(dev) -> None:
    synchronize(dev)


def _timed(fn: Callable[[], Any], dev, reps: int) -> tuple[float, Any]:
    """Median wall seconds of `reps` calls of `fn` (device synchronised), and the last result."""
    times, out = [], None
    for _ in range(reps):
        _sync(dev)
        t0 = time.perf_counter()
        out = fn()
        _sync(dev)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def pass_times(model: Any, photo, kv, prompt: str, steps: int, reps: int = 3) -> dict[str, float]:
    """The transformer passes an injected edit is made of, timed alone (median of `reps`):
    ``extract_pass_s``: step 0, the user's photo in the sequence as a reference, the template
    injected (what an edit runs first); ``cached_pass_s``: a later step, both references cached."""
    from sakura.models.flux.klein import ForwardSlot, LazyTemplateLayers, latent_ids, text_ids  # lazy: diffusers ([flux] extra)

    ad = model.adapter
    dev, dt = ad.device, ad.dtype
    g = model.cfg.grid
    n_refs = int(kv.positions[:, 0].max()) // 10
    user = ad.encode_image(photo[:1], slot=n_refs)
    emb = model._prompt_embeds(prompt).to(dev, dt)
    ids, txt = latent_ids(g, g), text_ids(emb.shape[1])
    latents = torch.randn(1, g * g, ad.transformer.config.in_channels, generator=torch.Generator().manual_seed(0)).to(dev, dt)
    t = torch.full((1,), 0.5, device=dev, dtype=dt)
    state: dict[str, Any] = {}

    def extract():
        lazy = LazyTemplateLayers.from_source(kv, tokens=kv.num_tokens, heads=ad.heads, head_dim=ad.head_dim,
                                              device=dev, dtype=dt)
        slot = ForwardSlot(inject=lazy, isolate=ad.isolate_template)
        with torch.no_grad():
            _, state["cache"] = ad._forward(torch.cat([user.latents.to(dev, dt), latents], 1),
                                            torch.cat([user.ids, ids]), emb, txt, t, mode="extract",
                                            num_ref=user.latents.shape[1], slot=slot)
        state["lazy"] = lazy

    def cached():
        slot = ForwardSlot(num_template_tokens=kv.num_tokens, inject=state["lazy"])
        with torch.no_grad():
            ad._forward(latents, ids, emb, txt, t, mode="cached", cache=state["cache"], slot=slot)

    _timed(extract, dev, 1)  # warm-up (kernels, allocator)
    ex, _ = _timed(extract, dev, reps)
    ca, _ = _timed(cached, dev, reps)
    state.clear()
    return {"extract_pass_s": ex, "cached_pass_s": ca, "extract_plus_cached_s": ex + (steps - 1) * ca}


def decode_rates(store_dir: Path, model_fp: str, template_id: str) -> dict[str, dict[str, float]]:
    """Per rendition: decoded fp16 MB per second over every shard (this thread, the stored bytes,
    the codec the object's header names: what the phone's decode pool runs)."""
    st = Store(store_dir)
    m = st.get_manifest(model_fp, template_id)
    tfp = m.kv_layout["template_fingerprint"]
    tables = {t.name: CodecTables.from_bytes(st.get_object(t.object), ShardId(model_fp, tfp, -1)) for t in m.tables}
    out: dict[str, dict[str, float]] = {}
    for r0 in m.shards[0].renditions:
        secs, fp16 = 0.0, 0
        for j, sh in enumerate(m.shards):
            r = sh.rendition(r0.name)
            data = st.get_rendition(r)
            t0 = time.perf_counter()
            decode_any(data, ShardId(model_fp, tfp, j), tables[r.tables[0]] if r.tables else None)
            secs += time.perf_counter() - t0
            fp16 += sh.fp16_bytes
        out[r0.name] = {"fp16_mb_per_s": fp16 / 1e6 / secs if secs else float("inf"), "seconds_all_shards": secs,
                        "stored_bytes": sum(sh.rendition(r0.name).nbytes for sh in m.shards)}
    return out


def _template_png(path: Path, size: int) -> None:
    im = Image.new("RGB", (size, size), (20, 60, 160))
    d = ImageDraw.Draw(im)
    d.ellipse((size // 4, size // 6, 3 * size // 4, 2 * size // 3), fill=(255, 200, 0))
    d.rectangle((0, 3 * size // 4, size, size), fill=(30, 120, 40))
    im.save(path)


def run_size(model: Any, work: Path, size: int, *, ladder: Sequence[str], calibration: int, steps: int,
             reps: int, progress: bool, res: dict[str, Any] | None = None,
             checkpoint: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Build, serve and edit one template at `size` px with `model` (a `KleinImageModel`); fills
    and returns `res`, calling `checkpoint()` after the build (so a run cut short keeps it)."""
    dev = model.device
    d = work / f"s{size}"
    d.mkdir(parents=True, exist_ok=True)
    _template_png(d / "sun.png", size)
    (d / "templates.toml").write_text(TEMPLATES_TOML)
    store = d / "store"
    res = {} if res is None else res
    res.update({"image_size": size, "tokens_per_image": model.cfg.tokens_per_image})
    reset_peak_memory(dev)
    prof: dict[str, dict[str, float]] = {}
    calls = {"edit": 0}
    facts: dict[str, dict] = {}
    edit = model.edit

    def counted(*a: Any, **k: Any) -> Any:  # the build's whole calibration edits: what its cost scales with
        calls["edit"] += 1
        return edit(*a, **k)

    model.edit = counted
    t0 = time.perf_counter()
    try:
        build_store(store, model=model, templates=load_library_file(d / "templates.toml"), ladder=ladder,
                    calibration=calibration, steps=steps, profile=prof, progress=progress, log=log_.info,
                    facts=facts)
    finally:
        del model.edit  # the class's method again
    res["build_s"] = time.perf_counter() - t0
    res["build_edit_calls"] = calls["edit"]  # each edits `calibration` photos, `steps` steps
    edit_stages = ("importance", "sensitivity", "probe reference", "ladder search", "fit tables", "rendition probes",
                   "quality floor")
    res["seconds_per_build_edit"] = sum(prof["sun"].get(k, 0.0) for k in edit_stages) / max(1, calls["edit"])
    res["build_stage_s"] = {k: round(v, 3) for k, v in prof["sun"].items() if not k.endswith(" cpu")}
    # issue 41: the build's own count (a backward pass 2 edits) and allocation ("probes" where the
    # model has no differentiable edit), the table fit's seconds per layer
    res["calibration_edits"] = facts.get("sun", {}).get("calibration_edits")
    res["allocation"] = facts.get("sun", {}).get("allocation")
    res["fit_tables_s_per_layer"] = prof["sun"].get("fit tables", 0.0) / max(1, model.num_layers)
    res["build_peak"] = peak_memory(dev)
    checkpoint()
    st = Store(store)
    fp, tid = st.manifest_keys()[0]
    m = st.get_manifest(fp, tid)
    res["fp16_kv_bytes"] = sum(s.fp16_bytes for s in m.shards)
    res["shard_fp16_bytes"] = m.shards[0].fp16_bytes
    res["rendition_bytes"] = {r.name: sum(s.rendition(r.name).nbytes for s in m.shards) for r in m.shards[0].renditions}

    images = split_template_images(decode_template_ref(st.get_object(m.template_ref.object)))
    prompt = m.kv_layout["instruction"]
    photo = calibration_photos(size, 1, seed=7)
    local = model.extract_template_kv(images, prompt)
    for i, l in enumerate(local.layers):  # the wire's fp16, layer by layer (never two whole copies)
        local.layers[i] = type(l)(l.key.to(torch.float16), l.value.to(torch.float16), l.keep)
    res.update(pass_times(model, photo, local, prompt, steps, reps))
    reset_peak_memory(dev)
    inj_s, injected = _timed(lambda: model.edit(photo, template_kv=local, steps=steps).image, dev, reps)
    seq_s, in_seq = _timed(lambda: model.edit(photo, template=images, instruction=prompt, mode="extract",
                                              steps=steps).image, dev, 1)
    kw = dict(base_url=None, template_id=tid, template_image=images, instruction=prompt,
              policy=FixedPolicy("lossless"), profile=DeviceProfile(compute_s=0.002, local_s=0.05),
              steps=steps, manifest=m, allow_fast_path=False)
    with serve_in_thread(store) as url:
        kw["base_url"] = url
        runs = []
        for _ in range(reps + 1):  # the first warms the client, the decode pool and the server's cache
            _sync(dev)
            t0 = time.perf_counter()
            got = streamed_edit(model, photo, bandwidth=BandwidthEstimator(prior_bps=1e10),
                                rtt=RttEstimator(prior_s=0.0005), **kw)
            _sync(dev)
            runs.append(time.perf_counter() - t0)
            streamed = got.image
            res["streamed_path"] = got.path
            res["streamed_bytes"] = got.bytes_fetched
            del got
    res["edit_peak"] = peak_memory(dev)
    res["injected_edit_s"] = inj_s
    res["in_sequence_edit_s"] = seq_s
    res["streamed_edit_s"] = statistics.median(runs[1:])
    res["streamed_over_passes"] = res["streamed_edit_s"] / res["extract_plus_cached_s"]
    res["injected_over_passes"] = inj_s / res["extract_plus_cached_s"]
    # the build's wall time as a multiple of one edit of one photo on this machine (issue 41: <= 20x)
    res["build_over_one_edit"] = res["build_s"] / inj_s
    res["lossless_streamed_equals_injected"] = bool(torch.equal(streamed, injected))
    res["lossless_streamed_equals_in_sequence"] = bool(torch.equal(streamed, in_seq))
    res["streamed_vs_in_sequence_max_abs"] = float((streamed - in_seq).abs().max())
    del local
    checkpoint()
    res["decode"] = decode_rates(store, fp, tid)  # last: CPU-only, and the device figures come first
    return res


def run(preset: str = "tiny", sizes: Sequence[int] = (32, 64), *, device: str = "auto", dtype: str = "auto",
        ladder: Sequence[str] | None = None, calibration: int = 2, steps: int = 4, reps: int = 3,
        deadline_s: float | None = None, work_dir: Path | None = None, progress: bool = True,
        out: Path | None = None, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The whole bench for one preset (see the module docstring); returns (and writes to `out`,
    after every size, so a run cut short keeps what it measured) the figures. `deadline_s`: skip
    the remaining sizes once this many seconds have passed (a device budget)."""
    log = log or _LOG.info  # the module's logger unless the caller gives a sink
    from sakura.models.flux.klein_image import KleinImageModel  # lazy: diffusers ([flux] extra)

    if preset not in PRESETS:
        raise ValueError(f"--preset must be one of {sorted(PRESETS)}, got {preset!r}")
    dev, dt = resolve(device, dtype)
    if preset != "tiny" and dev.type == "cpu":
        # a real-shape transformer is initialised in fp32 before the cast: 16 GB (4B) / 36 GB (9B)
        raise ValueError(f"--preset {preset} runs on an accelerator (its random init alone needs tens of GB of "
                         f"host memory here); on the CPU use --preset tiny")
    ladder = list(ladder) if ladder else list(DEFAULT_BENCH_LADDER) + list(DEFAULT_LADDER)
    t_start = time.perf_counter()
    res: dict[str, Any] = {
        "preset": preset, "device": str(dev), "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else
        platform.processor() or platform.machine(), "dtype": str(dt).replace("torch.", ""), "torch": torch.__version__,
        "ladder": ladder, "calibration": calibration, "steps": steps, "cpu_count": os.cpu_count(),
        "load_avg_1min": os.getloadavg()[0], "sizes": {}, "skipped_sizes": []}

    def save() -> None:
        if out is not None:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            atomic_write(out, (json.dumps(res, indent=1) + "\n").encode())

    work = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="realscale-"))
    try:
        t0 = time.perf_counter()
        # saved in bf16 as the published checkpoints are (fp32 for a CPU run: no bf16 matmuls there)
        folder = write_random_klein_folder(work / "klein", preset, dtype=torch.float32 if dt == torch.float32
                                           else torch.bfloat16, device=dev)
        res["write_folder_s"] = time.perf_counter() - t0
        res["weights_bytes_on_disk"] = weight_bytes(folder)
        log(f"{preset}: wrote {res['weights_bytes_on_disk'] / 1e9:.2f} GB of random weights in {res['write_folder_s']:.1f} s")
        save()
        model = None
        for size in sizes:
            if deadline_s is not None and time.perf_counter() - t_start > deadline_s:
                res["skipped_sizes"].append(size)
                log(f"{preset} @{size}: skipped (deadline {deadline_s:.0f} s reached)")
                continue
            t0 = time.perf_counter()
            if model is None:
                model = load_model(f"klein:{folder}@{size}", device=device, dtype=dtype)
                res["load_s"] = time.perf_counter() - t0
                res["load_peak"] = peak_memory(dev)
                ad = model.adapter
                res["weights_bytes_loaded"] = sum(p.numel() * p.element_size() for mod in
                                                  (ad.transformer, ad.pipeline.vae, ad.pipeline.text_encoder)
                                                  for p in mod.parameters())
                res["transformer"] = ad.describe()
            else:
                model = KleinImageModel(model.adapter, size)
            r = res["sizes"].setdefault(str(size), {})
            run_size(model, work, size, ladder=ladder, calibration=calibration, steps=steps, reps=reps,
                     progress=progress, res=r, checkpoint=save)
            budget = res["weights_bytes_loaded"] + 3 * r["fp16_kv_bytes"]
            r["targets"] = {
                "edit_within_1.15x_of_passes": r["streamed_over_passes"] <= 1.15,
                "lossless_bit_exact_vs_injected": r["lossless_streamed_equals_injected"],
                "peak_device_bytes_budget": budget,
                "peak_device_within_weights_plus_3kv": (max(r["build_peak"]["device_peak_bytes"],
                                                            r["edit_peak"]["device_peak_bytes"]) <= budget
                                                        if dev.type == "cuda" else None),
                "build_s_target": {"klein-4b": 60.0, "klein-9b": 120.0}.get(preset) if size == 1024 else None}
            save()
            log(f"{preset} @{size}: build {r['build_s']:.1f} s, edit streamed {r['streamed_edit_s']:.3f} s vs "
                f"extract + {steps - 1} cached passes {r['extract_plus_cached_s']:.3f} s "
                f"({r['streamed_over_passes']:.2f}x), lossless bit-exact {r['lossless_streamed_equals_injected']}")
    finally:
        if work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    res["total_s"] = time.perf_counter() - t_start
    save()
    return res
