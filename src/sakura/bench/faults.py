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
import torch

from sakura.bench.children import run_child, vm_hwm_kib
from sakura.bench.harness import get_logger, markdown_table, publish
import aiohttp
import asyncio
import os
import random
import re
import resource
import socket
import subprocess
import sys
from sakura.cloud.builder.pipeline import build_store
from sakura.cloud.tasks import get_template, heldout_photos
from sakura.cloud.tasks.quality import psnr_per_image
from sakura.emulation.faults import fault_proxy_in_thread, hostile_in_thread
from sakura.models import load_model
from sakura.models.kv import LayerKV, TemplateKV, TemplateKVError
from sakura.phone import BandwidthEstimator, RttEstimator, SakuraPolicy
from sakura.phone.live import Emulation, profile_model, streamed_edit
from sakura.wire.server import serve_in_thread
from sakura.wire.server.app import ConnectionLimits, connection_counts, start_server
from sakura.wire.store.layout import manifest_relpath
from sakura.wire.store.manifest import Manifest, ManifestError, manifest_tree
from sakura.wire.store.store import Store
from sakura.wire.store.synthetic import make_synthetic_store

log = get_logger(__name__)

FAULT_CASES = ("none", "server unreachable", "manifest 404", "manifest 500", "shards 500", "reset once mid-shard",
               "reset every connection", "corrupt object", "stalled link")


def run_faults(out_dir: str | Path | None = None, *, template: str = "sticker-00", steps: int = 4, seed: int = 0,
               cases=FAULT_CASES) -> dict:

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
                             emulate=Emulation(renditions=("lossless",)), allow_fast_path=False)

    rows = []
    with serve_in_thread(root) as url, serve_in_thread(corrupt_root) as bad_url:
        # Alike in shape only to run_hostile's case loop below: each bench has its own cases and
        # its own fault server (FaultProxy here, HostileServer there), so they are not one table.
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
            log.info(f"  {case:24s} {1000 * res.latency_s:7.1f} ms vs on-device {1000 * on_device_s:6.1f} ms; "
                f"local {row['local_layers']}/{row['layers']}; PSNR vs on-device {psnr:.1f} dB; "
                f"{(res.events or ['no events'])[0][:90]}")
    tmp.cleanup()
    result = {"mode": "live (real execution on this machine, CPU, loopback with injected faults)",
              "template": template, "steps": steps, "profile": {"compute_s": profile.compute_s, "local_s": profile.local_s},
              "rows": rows}
    return _publish(result, "faults", faults_table, out_dir)


def faults_table(result: dict) -> str:
    rows = [[r["fault"], f"{1000 * r['latency_s']:.1f}", f"{1000 * r['on_device_s']:.1f}", f"{1000 * r['extra_s']:+.1f}",
             f"{1000 * r['detection_bound_s']:.1f}", f"{r['local_layers']}/{r['layers']}",
             "inf (bit-exact)" if r["bit_exact_on_device"] else f"{r['psnr_vs_on_device_db']:.1f}",
             "; ".join(r["events"])[:140] or "-"] for r in result["rows"]]
    return (f"Faults, {result['mode']}; template `{result['template']}`, {result['steps']} steps; sakura streams the "
            f"lossless rendition, so the right image is on-device's up to fp16 rounding.\n\n"
            + markdown_table(["fault", "sakura (ms)", "on-device (ms)", "extra (ms)", "bound (ms)", "layers local",
                              "PSNR vs on-device (dB)", "what the runtime reported"], rows, align="lrrrrrrl") + "\n")


# ---------------------------------------------------------------------------------------------
# hostile servers: the real `sakura edit` (a subprocess each, for its own time and peak RSS)

HOSTILE_CASES = ("honest server", "server down, gallery (on-device)", "drip manifest", "drip manifest, gallery",
                 "stall after headers", "huge template ref", "redirect elsewhere", "wrong object",
                 "raw-stream: shards stall after headers", "raw-stream: shards drip")


def _said(lines: list[str]) -> str:
    """What `sakura edit` said that matters, in a table cell: the error or the gallery fallback,
    how many layers were computed on the device, the first runtime event."""

    parts = [next((ln for ln in lines if ln.startswith("error:") or "gallery" in ln or "server" in ln), "")[:110]]
    done = next((ln for ln in lines if ln.startswith("edited in")), "")
    m = re.search(r"(\d+ of \d+ layers computed on the device)", done)
    if m:
        parts.append(m.group(1))
    ev = next((ln for ln in lines if ln.startswith("event:")), "")
    if ev:
        parts.append(ev[len("event: "):][:110])
    return "; ".join(p for p in parts if p)


def run_hostile(out_dir: str | Path | None = None, *, template: str = "sticker-00", steps: int = 4,
                cases=HOSTILE_CASES, timeout_s: float = 120.0, slow_headers: int = 200, fuzz_cases: int = 2000) -> dict:
    """Each hostile server of `sakura.emulation.faults.HOSTILE` against the real `sakura edit` in a
    subprocess: time to outcome (exit), exit code, what it said, peak RSS, beside an on-device
    edit. A case that runs into ``timeout_s`` is reported as a hang."""


    unknown = [c for c in cases if c not in HOSTILE_CASES]
    if unknown:
        raise ValueError(f"unknown hostile cases {unknown}; expected some of {list(HOSTILE_CASES)}")
    tmp = tempfile.TemporaryDirectory(prefix="sakura-hostile-")
    base = Path(tmp.name)
    root = base / "store"
    build_store(root, templates=[template], ladder=["lossless", "progressive"], calibration=1, steps=1,
                log=lambda s: None)
    model = load_model("sakura-mini")
    fp = model.fingerprint()
    manifest = Store(root).get_manifest(fp, template)
    photo = base / "photo.png"
    from skimage import io as skio  # lazy: slow to import; one photo written

    skio.imsave(str(photo), (heldout_photos(model.cfg.image_size)[0].permute(1, 2, 0).numpy() * 255).astype("uint8"),
                check_contrast=False)
    mpath = "/" + manifest_relpath(fp, template)
    refpath = "/" + manifest.template_ref.object.path
    other = "/" + manifest.shards[0].renditions[0].object.path
    rows = []

    def edit(url: str, gallery: Path, policy: str = "sakura") -> dict:
        return run_child(["edit", str(photo), "--server", url, "--template", template, "--out",
                                 str(base / "out" / "edit.png"), "--steps", str(steps), "--gallery", str(gallery),
                                 "--policy", policy], timeout_s)

    warm = base / "gallery-warm"
    with serve_in_thread(root) as url, serve_in_thread(root) as elsewhere_url:
        if any("gallery" in c for c in cases):
            edit(url, warm)  # fills the warm gallery (and the page cache); not reported
        # Alike in shape only to run_faults' case loop above (other cases, other servers).
        for case in cases:
            gal = warm if "gallery" in case else base / f"gallery-{len(rows)}"
            extra: dict = {}
            if case == "honest server":
                r = edit(url, gal)
            elif case.startswith("server down"):
                r = edit("http://127.0.0.1:9", gal)
            elif case.startswith("drip manifest"):
                with hostile_in_thread(url, "drip", drip_s=2.0) as (h, _):
                    r = edit(h, gal)
            elif case == "stall after headers":
                with hostile_in_thread(url, "stall-body") as (h, _):
                    r = edit(h, gal)
            elif case == "huge template ref":
                with hostile_in_thread(url, "huge") as (h, _):
                    r = edit(h, gal)
            elif case == "redirect elsewhere":
                with hostile_in_thread(elsewhere_url, "record") as (far, rec), \
                        hostile_in_thread(url, "redirect", redirect_to=far) as (h, _):
                    r = edit(h, gal)
                    extra["requests_elsewhere"] = len(rec.requests)
            elif case == "wrong object":
                with hostile_in_thread(url, "wrong-object", wrong_path=other) as (h, _):
                    r = edit(h, gal)
            else:  # raw-stream: the refresh is honest, the shard objects misbehave
                mode = "stall-body" if "stall" in case else "drip"
                with hostile_in_thread(url, mode, drip_s=2.0, honest_paths={mpath, refpath}) as (h, _):
                    r = edit(h, gal, policy="raw-stream")
            row = {"case": case, **r, **extra, "outcome": "hang (killed)" if r["timed_out"] else
                   ("edited" if r["rc"] == 0 else f"failed (exit {r['rc']})"), "said": _said(r["lines"])}
            rows.append(row)
            log.info(f"  {case:40s} {row['outcome']:16s} {r['wall_s']:6.1f} s  peak RSS {r['peak_rss_mib'] or 0:6.0f} MiB"
                f"  {row['said'][:90]}")
    tmp.cleanup()
    slow = []
    if slow_headers:
        log.info("slow-header clients:")
        slow.append(run_slow_headers(slow_headers, header_timeout_s=10.0))
        slow.append(run_slow_headers(slow_headers, header_timeout_s=10.0, max_connections=slow_headers // 2))
    fuzz = run_parser_fuzz(fuzz_cases) if fuzz_cases else {}
    result = {"mode": "live: real `sakura edit` subprocesses on this machine (CPU), hostile servers on 127.0.0.1",
              "template": template, "steps": steps, "timeout_s": timeout_s, "loadavg": list(os.getloadavg()),
              "rows": rows, "cpu_count": os.cpu_count(), "slow_headers": slow, "fuzz": fuzz,
              "parent_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    return _publish(result, "hostile", hostile_table, out_dir)


# Alike in shape only to sakura.bench.e2e.live_table (a caption, a header row, one row per case):
# the columns differ, so each table is written where its result is made.
def hostile_table(result: dict) -> str:
    base = next((r for r in result["rows"] if r["case"].startswith("server down")), None)
    rows = []
    for r in result["rows"]:
        said = r["said"] + (f" (requests that reached the other origin: {r['requests_elsewhere']})"
                            if "requests_elsewhere" in r else "")
        rows.append([r["case"], r["outcome"], f"{r['wall_s']:.1f}",
                     f"{r['wall_s'] - base['wall_s']:+.1f}" if base is not None else "-",
                     f"{r['peak_rss_mib'] or 0:.0f}", said])
    parts = [f"Hostile servers, {result['mode']}; template `{result['template']}`, {result['steps']} steps; a case "
             f"still running at {result['timeout_s']:.0f} s is killed and reported as a hang. Load average at the end "
             f"{result['loadavg'][0]:.2f} on {result['cpu_count']} cores.",
             markdown_table(["hostile server", "outcome", "time to outcome (s)", "vs on-device (s)", "peak RSS (MiB)",
                             "what `sakura edit` said"], rows, align="llrrrl")]
    if result.get("slow_headers"):
        parts += ["Slow-header clients against `sakura serve` (each connection sends part of a request head and then "
                  "nothing; a normal client fetches index.json meanwhile):",
                  markdown_table(["slow connections", "connection cap", "held at start", "held after the header timeout",
                                  "normal client", "its latency (ms)"],
                                 [[s["slow_connections"], s["max_connections"], s["held_at_start"],
                                   f"{s['held_after_timeout']} (after {s['header_timeout_s']:.0f} s)", s["normal_client"],
                                   f"{1000 * s['normal_client_s']:.0f}"] for s in result["slow_headers"]],
                                 align="rrrrlr")]
    if result.get("fuzz"):
        parts += ["Parser fuzz (random mutations; an escape is any exception but the parser's typed error):",
                  markdown_table(["parser", "cases", "typed error", "valid", "escapes"],
                                 [[k, f["cases"], f["typed_error"], f["valid"], f"{f['escapes']} {f['escape_types'] or ''}"]
                                  for k, f in result["fuzz"].items()])]
    return "\n\n".join(parts) + "\n"


# ---------------------------------------------------------------------------------------------
# slow-header clients against the server, and parser fuzz counts

def run_slow_headers(n: int = 200, *, header_timeout_s: float = 10.0, max_connections: int = 0) -> dict:
    """Open ``n`` connections that never finish their request head against `sakura serve`
    (default limits unless given); a normal client fetches index.json meanwhile. Reports how
    many the server still holds after its header timeout (target 0) and whether the normal
    client was served."""



    tmp = tempfile.TemporaryDirectory(prefix="sakura-slowhdr-")
    make_synthetic_store(tmp.name, templates=1, layers=1, tokens=16, width=16)

    async def go() -> dict:
        limits = ConnectionLimits(header_timeout_s=header_timeout_s, max_connections=max_connections)
        runner, url = await start_server(tmp.name, limits=limits)
        port = int(url.rsplit(":", 1)[1])
        conns = []
        try:
            for _ in range(n):
                r, w = await asyncio.open_connection("127.0.0.1", port)
                w.write(b"GET /index.json HTTP/1.1\r\nHost: x\r\nX-Slow: a")
                conns.append((r, w))
            await asyncio.sleep(0.5)
            held_before = connection_counts(runner)["open"]
            t = time.perf_counter()
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
                try:
                    async with s.get(f"{url}/index.json") as resp:
                        await resp.read()
                        normal = resp.status
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    normal = f"failed ({type(e).__name__})"
            normal_s = time.perf_counter() - t
            await asyncio.sleep(header_timeout_s + 2.0)
            counts = connection_counts(runner)
            closed = 0
            for r, _ in conns:
                try:
                    closed += await asyncio.wait_for(r.read(), 0.05) == b""
                except (asyncio.TimeoutError, ConnectionError):
                    pass
            return {"slow_connections": n, "header_timeout_s": header_timeout_s,
                    "max_connections": limits.max_connections or "default", "held_at_start": held_before,
                    "held_after_timeout": counts["open"], "closed_seen_by_clients": closed,
                    "header_timeouts": counts["header_timeouts"], "evicted": counts["evicted"],
                    "normal_client": normal, "normal_client_s": normal_s}
        finally:
            for _, w in conns:
                w.close()
            await runner.cleanup()

    try:
        res = asyncio.run(go())
    finally:
        tmp.cleanup()
    log.info(f"  {n} slow-header connections (cap {res['max_connections']}): held {res['held_at_start']} at start, "
        f"{res['held_after_timeout']} after the {header_timeout_s:.0f} s header timeout; normal client: "
        f"{res['normal_client']} in {1000 * res['normal_client_s']:.0f} ms")
    return res


def run_parser_fuzz(cases: int = 2000, *, seed: int = 0) -> dict:
    """Random mutations of a real manifest and a real TemplateKV file through their parsers:
    how many raised something other than the typed error (escapes, target 0). Mutations: byte
    flips/deletions/insertions/duplications, and (manifests) adversarial JSON values (deep
    nesting, 5,000-digit integers, NaN) placed at a random node."""
    rnd = random.Random(seed)
    tmp = tempfile.TemporaryDirectory(prefix="sakura-fuzz-")
    root = Path(tmp.name)
    make_synthetic_store(root / "s", templates=1, layers=2, tokens=16, width=16)
    st = Store(root / "s")
    (fp, tid), = st.manifest_keys()
    mbytes = st.manifest_path(fp, tid).read_bytes()
    g = torch.Generator().manual_seed(0)
    kv = TemplateKV([LayerKV(torch.randn(4, 2, 8, generator=g), torch.randn(4, 2, 8, generator=g)) for _ in range(3)],
                    model_fingerprint="a" * 64, template_fingerprint="b" * 64)
    kbytes = kv.save(root / "t.safetensors").read_bytes()

    def mutate(b: bytes, header_only: bool = False) -> bytes:
        b = bytearray(b)
        for _ in range(rnd.randint(1, 6)):
            hi = min(len(b), 200) if header_only else len(b)
            i = rnd.randrange(max(1, hi))
            op = rnd.choice(("flip", "del", "ins", "dup"))
            if op == "flip" and b:
                b[i] ^= rnd.randint(1, 255)
            elif op == "del":
                del b[i:i + rnd.randint(1, 8)]
            elif op == "ins":
                b[i:i] = bytes(rnd.randint(0, 255) for _ in range(rnd.randint(1, 8)))
            else:
                b[i:i] = b[i:i + 64] * rnd.randint(2, 50)
        return bytes(b)

    hostile = ["[" * 20000 + "]" * 20000, "9" * 5000, "-" + "1" * 6000, "NaN", "1e400", '{"a":' * 3000 + "1" + "}" * 3000]

    def hostile_value() -> bytes:

        d = manifest_tree(mbytes)
        path: list = []
        node = d
        while isinstance(node, (dict, list)) and node and rnd.random() < 0.7:
            k = rnd.choice(list(node)) if isinstance(node, dict) else rnd.randrange(len(node))
            path.append((node, k))
            node = node[k]
        if not path:
            return rnd.choice(hostile).encode()
        parent, k = path[-1]
        parent[k] = "\u0000MARK\u0000"
        return json.dumps(d).replace(json.dumps("\u0000MARK\u0000"), rnd.choice(hostile)).encode()

    out = {}
    escapes: dict[str, dict[str, int]] = {"manifest": {}, "template_kv": {}}
    typed = {"manifest": 0, "template_kv": 0}
    valid = {"manifest": 0, "template_kv": 0}
    for i in range(cases):
        data = hostile_value() if i % 2 else mutate(mbytes)
        try:
            Manifest.from_bytes(data, source="fuzz")
            valid["manifest"] += 1
        except ManifestError:
            typed["manifest"] += 1
        except Exception as e:  # noqa: BLE001 - counting what escapes is the point
            escapes["manifest"][type(e).__name__] = escapes["manifest"].get(type(e).__name__, 0) + 1
        p = root / "m.safetensors"
        p.write_bytes(mutate(kbytes, header_only=i % 2 == 1))
        try:
            TemplateKV.load(p)
            valid["template_kv"] += 1
        except TemplateKVError:
            typed["template_kv"] += 1
        except Exception as e:  # noqa: BLE001
            escapes["template_kv"][type(e).__name__] = escapes["template_kv"].get(type(e).__name__, 0) + 1
    tmp.cleanup()
    for k in ("manifest", "template_kv"):
        out[k] = {"cases": cases, "typed_error": typed[k], "valid": valid[k], "escapes": sum(escapes[k].values()),
                  "escape_types": escapes[k]}
        log.info(f"  fuzz {k:12s}: {cases} cases, {typed[k]} typed errors, {valid[k]} valid, "
            f"{out[k]['escapes']} escapes {escapes[k] or ''}")
    return out


def _publish(result: dict, name: str, table, out_dir) -> dict:
    """Write `<name>.json` and `<name>.md` (the table) under `out_dir` if given (atomically), log the table."""
    text = table(result)
    log.info("%s", text)
    return publish(out_dir, name, json.loads(json.dumps(result, default=float)), text)


# ------------------------------------------------------------------ issue 35: fd pressure
def _proc_cpu_s(pid: int) -> float | None:
    """utime + stime of process ``pid`` (s), from /proc."""

    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def run_fd_pressure(fd_limit: int = 64, idle_factor: float = 1.5, duration_s: float = 20.0, *,
                    request_every_s: float = 0.1, request_timeout_s: float = 5.0) -> dict:
    """A sustained run of `sakura serve` under fd pressure, 127.0.0.1 only: the server runs in a
    child with ``ulimit -n fd_limit``; ``idle_factor * fd_limit`` idle sockets (connect, never
    send) are held open for ``duration_s``, each reopened as soon as the server closes it, while a
    normal client fetches index.json and an object on a fresh connection every ``request_every_s``.
    Reports normal requests served / failed, their worst latency, the server's CPU seconds and
    peak RSS. Bounded: at most ``idle_factor * fd_limit`` sockets, ``duration_s`` seconds."""
    tmp = tempfile.TemporaryDirectory(prefix="sakura-fdp-")
    make_synthetic_store(tmp.name, templates=1, layers=2, tokens=64, width=64)
    m = Store(tmp.name).get_manifest("synthetic-model", "tpl-000")
    obj_path = "/" + m.shards[0].renditions[0].object.path
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def limit() -> None:  # in the child, before exec
        resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

    proc = subprocess.Popen([sys.executable, "-c", "from sakura.cli.main import app; app()", "serve", tmp.name,
                             "--host", "127.0.0.1", "--port", str(port), "--quiet"], preexec_fn=limit,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    n_idle = int(idle_factor * fd_limit)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n_idle + 256:  # this (client) process holds the idle sockets itself
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n_idle + 256) if hard != resource.RLIM_INFINITY
                                                    else n_idle + 256, hard))

    async def go() -> dict:
        t0 = time.monotonic()
        while True:  # wait for the server (it imports aiohttp, a few seconds on a busy machine)
            try:
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() - t0 > 60:
                    raise RuntimeError("sakura serve did not start") from None
                await asyncio.sleep(0.1)
        cpu0 = _proc_cpu_s(proc.pid) or 0.0
        stop = time.monotonic() + duration_s
        reopened = [0]

        async def idle_socket() -> None:
            while time.monotonic() < stop:
                try:
                    r, w = await asyncio.open_connection("127.0.0.1", port)
                except OSError:
                    await asyncio.sleep(0.05)
                    continue
                try:
                    await asyncio.wait_for(r.read(1), max(0.01, stop - time.monotonic()))  # b"": closed by the server
                except (asyncio.TimeoutError, OSError):
                    pass
                finally:
                    w.close()
                reopened[0] += 1

        async def get(path: str) -> tuple[bool, float]:
            t = time.monotonic()
            try:
                r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), request_timeout_s)
                try:
                    w.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                    body = await asyncio.wait_for(r.read(-1), request_timeout_s)
                finally:
                    w.close()
                return body.startswith(b"HTTP/1.1 200"), time.monotonic() - t
            except (asyncio.TimeoutError, OSError):
                return False, time.monotonic() - t

        idle = [asyncio.ensure_future(idle_socket()) for _ in range(n_idle)]
        await asyncio.sleep(min(1.0, duration_s / 4))  # the pressure is on before the first request
        ok = failed = 0
        worst = 0.0
        while time.monotonic() < stop:
            for path in ("/index.json", obj_path):
                good, took = await get(path)
                ok, failed, worst = ok + good, failed + (not good), max(worst, took)
            await asyncio.sleep(request_every_s)
        await asyncio.gather(*idle, return_exceptions=True)
        return {"ok": ok, "failed": failed, "worst_s": worst, "idle_reopened": reopened[0],
                "server_cpu_s": (_proc_cpu_s(proc.pid) or 0.0) - cpu0}

    try:
        res = asyncio.run(go())
        res["server_peak_rss_mib"] = (vm_hwm_kib(proc.pid) or 0) / 1024
        res["server_alive"] = proc.poll() is None
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        tmp.cleanup()
    res.update(fd_limit=fd_limit, idle_sockets=n_idle, duration_s=duration_s,
               server_log_lines=len(err.decode(errors="replace").splitlines()))
    log.info(f"  fd pressure: ulimit -n {fd_limit}, {n_idle} idle sockets for {duration_s:.0f} s "
        f"(reopened {res['idle_reopened']} times): normal requests {res['ok']} ok, {res['failed']} failed, "
        f"worst {1000 * res['worst_s']:.0f} ms; server {res['server_cpu_s']:.1f} CPU-s, "
        f"{res['server_peak_rss_mib']:.0f} MiB peak, {res['server_log_lines']} log lines")
    return res
