"""`sakura bench faults`: the edit must complete, with the right image, whatever the network does.

Each fault is injected for real on loopback (a closed port, a fault proxy that resets, stalls or
answers 500, an object corrupted in the store); the same photo is edited by sakura (lossless
rendition only, so the right image is the on-device one up to fp16 rounding of the stored KV)
and on-device, in the same run. Printed per fault: latency vs on-device, the extra, the
detection bound the runtime derived from its estimates, what the runtime reported, and the
image PSNR against on-device.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

FAULT_CASES = ("none", "server unreachable", "manifest 404", "manifest 500", "shards 500", "reset once mid-shard",
               "reset every connection", "corrupt object", "stalled link")


def run_faults(out_dir: str | Path | None = None, *, template: str = "sticker-00", steps: int = 4, seed: int = 0,
               cases=FAULT_CASES, log: Callable[[str], None] = print) -> dict:
    from sakura.link.faults import fault_proxy_in_thread
    from sakura.models import load_model
    from sakura.runtime import BandwidthEstimator, RttEstimator, SakuraPolicy
    from sakura.runtime.live import profile_model, streamed_edit
    from sakura.server import serve_in_thread
    from sakura.store.build import build_store
    from sakura.store.store import Store
    from sakura.tasks import get_template, heldout_photos
    from sakura.tasks.quality import psnr_per_image

    unknown = [c for c in cases if c not in FAULT_CASES]
    if unknown:
        raise ValueError(f"unknown fault cases {unknown}; expected some of {list(FAULT_CASES)}")
    torch.set_num_threads(1)
    model = load_model("sakura-mini")
    size = model.cfg.image_size
    tpl = get_template(template, size)
    photo = heldout_photos(size)[:1]
    timg = tpl.image[None]
    tmp = tempfile.TemporaryDirectory(prefix="sakura-faults-")
    root = Path(tmp.name) / "store"
    build_store(root, templates=[template], ladder=["lossless"], calibration=1, steps=1, log=lambda s: None)
    corrupt_root = Path(tmp.name) / "corrupt"
    shutil.copytree(root, corrupt_root)
    st = Store(root)
    (fp, tid), = [k for k in st.manifest_keys() if k[1] == template]
    manifest = st.get_manifest(fp, tid)
    victim = manifest.shards[len(manifest.shards) // 2].renditions[0].object
    vpath = Store(corrupt_root).object_path(victim)
    data = bytearray(vpath.read_bytes())
    data[len(data) // 2] ^= 0xFF
    vpath.chmod(0o644)
    vpath.write_bytes(bytes(data))
    profile = profile_model(model, repeats=3)
    shard_bytes = manifest.shards[0].renditions[0].nbytes

    def sakura(url: str, with_manifest: bool, template_id: str = template):
        return streamed_edit(model, photo, base_url=url, template_id=template_id, template_image=timg,
                             instruction=tpl.instruction, policy=SakuraPolicy(), profile=profile,
                             bandwidth=BandwidthEstimator(prior_bps=1e9), rtt=RttEstimator(prior_s=0.001),
                             steps=steps, seed=seed, manifest=manifest if with_manifest else None,
                             renditions=("lossless",), allow_fast_path=False)

    rows = []
    with serve_in_thread(root) as url, serve_in_thread(corrupt_root) as bad_url:
        for case in cases:
            t = time.perf_counter()
            ref = model.edit(photo, template=timg, instruction=tpl.instruction, steps=steps, seed=seed)
            on_device_s = time.perf_counter() - t
            if case == "none":
                res = sakura(url, True)
            elif case == "server unreachable":
                res = sakura("http://127.0.0.1:9", False)
            elif case == "manifest 404":
                res = sakura(url, False, template_id="look-99")
            elif case == "manifest 500":
                with fault_proxy_in_thread(url, "http500") as (purl, _):
                    res = sakura(purl, False)
            elif case == "shards 500":
                with fault_proxy_in_thread(url, "http500") as (purl, _):
                    res = sakura(purl, True)
            elif case == "reset once mid-shard":
                with fault_proxy_in_thread(url, "reset", after_bytes=shard_bytes // 2) as (purl, _):
                    res = sakura(purl, True)
            elif case == "reset every connection":
                with fault_proxy_in_thread(url, "reset-always", after_bytes=2048) as (purl, _):
                    res = sakura(purl, True)
            elif case == "corrupt object":
                res = sakura(bad_url, True)
            else:  # stalled link
                with fault_proxy_in_thread(url, "stall", after_bytes=int(shard_bytes * 2.5)) as (purl, _):
                    res = sakura(purl, True)
            want = ref.image if case in ("server unreachable", "manifest 404", "manifest 500") or res.path == "on-device" \
                else None
            psnr = float(psnr_per_image(res.image, ref.image).mean())
            row = {"fault": case, "latency_s": res.latency_s, "on_device_s": on_device_s,
                   "extra_s": res.latency_s - on_device_s, "path": res.path,
                   "local_layers": sum(r.source == "local" for r in res.records), "layers": len(res.records),
                   "psnr_vs_on_device_db": psnr, "bit_exact_on_device": bool(want is not None and torch.equal(res.image, want)),
                   "detection_bound_s": sum(s.local_s for s in [profile] * len(res.records)),
                   "events": res.events}
            rows.append(row)
            log(f"  {case:24s} {1000 * res.latency_s:7.1f} ms vs on-device {1000 * on_device_s:6.1f} ms; "
                f"local {row['local_layers']}/{row['layers']}; PSNR vs on-device {psnr:.1f} dB; "
                f"{(res.events or ['no events'])[0][:90]}")
    tmp.cleanup()
    result = {"mode": "live (real execution on this machine, CPU, loopback with injected faults)",
              "template": template, "steps": steps, "profile": {"compute_s": profile.compute_s, "local_s": profile.local_s},
              "rows": rows}
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "faults.json").write_text(json.dumps(result, indent=2, default=float))
        (out / "faults.md").write_text(faults_table(result))
    log(faults_table(result))
    return result


def faults_table(result: dict) -> str:
    lines = [f"Faults, {result['mode']}; template `{result['template']}`, {result['steps']} steps; "
             f"sakura streams the lossless rendition, so the right image is on-device's up to fp16 rounding.", "",
             "| fault | sakura (ms) | on-device (ms) | extra (ms) | bound (ms) | layers local | PSNR vs on-device (dB) | what the runtime reported |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in result["rows"]:
        ev = "; ".join(r["events"])[:140].replace("|", "/") or "-"
        ps = "inf (bit-exact)" if r["bit_exact_on_device"] else f"{r['psnr_vs_on_device_db']:.1f}"
        lines.append(f"| {r['fault']} | {1000 * r['latency_s']:.1f} | {1000 * r['on_device_s']:.1f} | "
                     f"{1000 * r['extra_s']:+.1f} | {1000 * r['detection_bound_s']:.1f} | {r['local_layers']}/{r['layers']} | "
                     f"{ps} | {ev} |")
    return "\n".join(lines) + "\n"
