"""The live executor: the `EditDriver` on real sockets, threads, decoders and the model.

    fetch stage (asyncio thread)      decode pool (threads)        compute (caller's thread)
    driver.next_requests() ──► GET    decode_any() ──► KV slot ◄── model.edit(...) calls
    overlapped, several in flight     one shard per worker          source.layer(i): driver.at_layer
    chunk timing ──► estimators                                     USE / LOCAL / WAIT(deadline)

Stages share one lock and condition; the driver holds every decision. The model pulls layer i
exactly when its forward pass reaches layer i, through `LiveKVSource` (a `TemplateKVSource`).
A layer computed locally runs the template generator (`model.template_layers`) forward from
wherever it stands, so fetched and local layers mix in any order and a failed, corrupt or late
shard is always replaced by local compute: an edit never fails because the network did.

Only public template objects are requested: `TemplateClient` has no method that can carry the
photo or the prompt, and this module never hands it either.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from sakura.models.kv import KVSourceDefaults, LayerKV

# DeviceProfile, profile_model and shard_specs live in .device; imported here for callers of this module
from .device import DeviceProfile, default_decode_workers, profile_model, shard_specs  # noqa: F401
from .driver import ADVANCE, FAILED, PENDING, REQUESTED, USE, WAIT, EditDriver, Policy, ShardRecord
from .estimator import BandwidthEstimator, RttEstimator
from .plan import LOCAL, Route, ShardSpec, psnr_db
from sakura.phone.limits import LimitError, check_shard_header, fetch_deadline_s, shard_shapes
from sakura.util.text import clean
from sakura.codec import CodecTables, ShardId, bitstream as bs, decode_any, warm_up_decoders
from sakura.wire.client import ClientThread, TemplateClient


@dataclass(frozen=True)
class Emulation:
    """The hooks a caller passes to run the live executor as another device (the time-dilated
    bench, the link and fault benches); a phone app passes none. The phone side declares them here
    and implements none: what they do lives with the caller (``sakura.emulation``).

    specs: planner inputs to use instead of the ones derived from the manifest and the profile
        (the emulated phone's per-layer times and decode rates).
    renditions: rendition names the policy may fetch (None: every one in the manifest).
    after_decode: called in the decode worker after each shard's real decode, as
        ``after_decode(rendition_name, t_start, shared, pool)``: ``t_start`` the decode's
        ``time.monotonic()`` start, ``shared`` whether the pool split the shard over idle workers,
        ``pool`` the `DecodePool` (whose ``pad`` holds a worker the way the simulator's decode
        model says). It may block: ``sakura.emulation.device.decode_padding`` pads each decode to a
        slower, phone-class decoder's time.
    tables: codec tables the emulated phone already holds (table name -> the object's bytes, as
        the store has them), so they are not fetched. The planner counts shard bytes only; on
        the time-dilated bench a table's bytes stand for 1/beta as many phone bytes (the mini
        model's 7.5 kB progressive table for 144 MB on the LTE trace, 4.6x the shard it came
        with), where a Klein-sized table is a few percent of one shard. Held tables are decoded
        before the edit's clock starts, as a phone decodes what it holds when it gets it (inside
        the clock, the six tables of a demo store cost 14-22 ms, 0.6-0.9 phone s at D = 40).
    clock_start: called with the ``time.monotonic()`` at which the edit's clock starts (photo in),
        before any request: a bench starts its emulated link's trace time there, so the live link
        and the simulated one (trace time 0 = edit start) are the same stretch of the trace.
    """

    specs: Sequence[ShardSpec] | None = None
    renditions: Sequence[str] | None = None
    after_decode: Callable[[str, float, bool, "DecodePool"], None] | None = None
    tables: Mapping[str, bytes] | None = None
    clock_start: Callable[[float], None] | None = None


#: How often the fetch stage asks the driver again while requests are in flight (seconds): bytes
#: arriving refine when the link will drain, so the next request goes out on time.
POLL_S = 0.005

#: Shortest link-level throughput sample (seconds); a shorter window is merged into the next one.
MIN_SAMPLE_S = 0.01

#: Pass as `manifest=` when the phone has none (server down and not cached): the edit runs on the device.
NO_MANIFEST = object()


# ---------------------------------------------------------------------------------------------
# the KV source the model pulls from


class LiveKVSource(KVSourceDefaults):
    """A `TemplateKVSource` whose `layer(i)` asks the driver and then uses the fetched KV,
    computes the layer (catching the local generator up), or waits until a deadline."""

    def __init__(self, driver: EditDriver, cond: threading.Condition, clock: Callable[[], float],
                 local_layers: Callable[[], Iterator[LayerKV]], model_fingerprint: str, template_fingerprint: str,
                 instruction: int | None = None):
        self.driver = driver
        self.cond = cond
        self.clock = clock
        self._local_layers = local_layers
        self._gen: Iterator[LayerKV] | None = None
        self.decoded: dict[int, LayerKV] = {}
        self.used: dict[int, LayerKV] = {}   # what the forward pass got, per layer (for reports)
        self.model_fingerprint = model_fingerprint
        self.template_fingerprint = template_fingerprint
        self.instruction = instruction  # flux2-mini takes the template's instruction as prompt tokens
        self.on_layer: Callable[[], None] = lambda: None  # wakes the fetch stage (compute moved)

    @property
    def num_layers(self) -> int:
        return self.driver.L

    def _settle(self, i: int, action: Any) -> Any:
        """Wait (holding the condition) until the driver's answer for layer i is not WAIT."""
        d = self.driver
        now = self.clock()
        while action.kind == WAIT:
            changed = d.recheck(i, now)
            if changed is not None:
                return changed
            if now >= action.deadline:
                action = d.on_wait_expired(i, now)  # may WAIT again: the shard's bytes came meanwhile
                continue
            self.cond.wait(timeout=min(action.deadline - now, 0.5))
            now = self.clock()
        return action

    def _step_generator(self, n: int) -> LayerKV | None:
        if self._gen is None:
            self._gen = self._local_layers()
        kv = None
        with torch.no_grad():
            for _ in range(n):
                kv = next(self._gen)
        return kv

    def layer(self, i: int) -> LayerKV:
        d = self.driver
        spent = 0.0  # on-device compute at this layer (ADVANCE steps and the catch-up), measured
        with self.cond:
            action = self._settle(i, d.at_layer(i, self.clock()))
            kv = self.decoded.get(i) if action.kind == USE else None
        self.on_layer()
        while action.kind == ADVANCE:  # one template layer while the shard may still come
            t = time.perf_counter()
            self._step_generator(1)
            spent += time.perf_counter() - t
            with self.cond:
                action = self._settle(i, d.on_advanced(i, self.clock()))
                kv = self.decoded.get(i) if action.kind == USE else None
            self.on_layer()
        if action.kind == USE:
            assert kv is not None
            if spent:
                with self.cond:
                    d.records[i].local_s = spent
            self.used[i] = kv
            return kv
        t = time.perf_counter()
        kv = self._step_generator(action.catch_up)
        spent += time.perf_counter() - t
        with self.cond:
            rec = d.records[i]
            rec.local_s = spent
            rec.delivered = self.clock()
        self.used[i] = kv  # type: ignore[assignment]
        return kv  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# the result


@dataclass
class StreamedEdit:
    """Result of `streamed_edit`. Times in seconds since the edit started (photo in)."""

    image: torch.Tensor
    latency_s: float
    records: list[ShardRecord]
    policy: str
    events: list[str] = field(default_factory=list)
    tables_bytes: int = 0
    manifest_s: float = 0.0
    path: str = "streamed"           # "streamed" | "on-device" (the plan needed no fetch)
    image_mse: float = 0.0           # expected, from the build-time distortions of the KV used
    quality_known: bool = True
    timings_s: dict[str, float] = field(default_factory=dict)
    link_idle_s: float = math.nan    # time with nothing in flight between the first request and the last byte
    used_kv: dict[int, LayerKV] = field(default_factory=dict)  # the KV each layer used (streamed path)

    # Alike in shape only to sakura.phone.sim.SimulatedEdit (the two executors' results each
    # total their own ShardRecords); the fields differ, so each result type keeps its own.
    @property
    def bytes_fetched(self) -> int:
        return sum(r.nbytes for r in self.records)

    @property
    def stall_s(self) -> float:
        return sum(r.stall_s for r in self.records)

    @property
    def implied_psnr_db(self) -> float:
        """Image PSNR vs the lossless-KV output that the chosen renditions imply."""
        return psnr_db(self.image_mse)

    def breakdown(self) -> dict[str, float]:
        fetched = [r for r in self.records if r.fetch_end == r.fetch_end]
        local = sum(r.local_s for r in self.records)
        return {
            "latency_s": self.latency_s,
            "manifest_s": self.manifest_s,
            "fetch_s": sum(r.fetch_end - r.t_request for r in fetched),
            "local_compute_s": local,
            "stall_s": self.stall_s,
            "compute_s": self.timings_s.get("denoise", 0.0) - self.stall_s - local,
            "bytes": float(self.bytes_fetched + self.tables_bytes),
            "local_shards": float(sum(r.source == LOCAL for r in self.records)),
        }

    def choices(self) -> list[str]:
        return [r.source or "?" for r in self.records]


# ---------------------------------------------------------------------------------------------
# the runtime


class _LinkMeter:
    """Link-level throughput across overlapped transfers: bytes that arrived between the last
    completed fetch (or the first byte after an idle gap) and this one's last byte."""

    def __init__(self) -> None:
        self.chunks: list[tuple[float, int]] = []   # (arrival time, bytes)
        self.active_first: dict[int, float] = {}     # shard -> its first byte time
        self.last_done = -math.inf
        self.idle_s = 0.0
        self._idle_since: float | None = None
        self._inflight = 0

    def request(self, now: float) -> None:
        if self._inflight == 0 and self._idle_since is not None:
            self.idle_s += max(0.0, now - self._idle_since)
            self._idle_since = None
        self._inflight += 1

    def done(self, now: float) -> None:
        self._inflight -= 1
        if self._inflight == 0:
            self._idle_since = now

    def sample(self, j: int, t_last: float) -> tuple[int, float]:
        first = self.active_first.pop(j, t_last)
        a = max(self.last_done, min([first] + list(self.active_first.values())))
        if t_last - a < MIN_SAMPLE_S:
            # overlapped transfers ending a few ms apart: a window that short measures timer
            # noise or a link mostly idle (the other transfer's tail: 110 Mbit/s read on a
            # 1,000 Mbit/s link, which put the estimate after three shards 73 % low); the next
            # completion's sample covers this one (its window starts at the last sample's end)
            return 0, 0.0
        self.last_done = t_last
        n = sum(b for t, b in self.chunks if a < t <= t_last)
        self.chunks = [(t, b) for t, b in self.chunks if t > t_last]
        return n, max(0.0, t_last - a)


#: Most shard requests in flight at once (and the connection pool an `Editor` keeps for them).
DEFAULT_MAX_INFLIGHT = 8


class LiveEdit:
    """One streamed edit on the live executor, read top to bottom in `run`:

        1. warm the decoders' JIT              (before the clock: a phone app does it at launch)
        2. what the gallery knows              (fingerprints, the codec tables the phone holds)
        3. the clock starts                    (photo in)
        4. the manifest                        (given, or fetched within `manifest_timeout_s`)
        5. is it for this model and template?  (else: the whole edit on the device)
        6. the first plan                      (the `EditDriver`; a plan that fetches nothing: on the device)
        7. fetch, decode and compute, pipelined (`FetchStage` -> `DecodePool` -> `LiveKVSource`)

    Every request goes through one HTTP session (`link`, a `ClientThread`): an `Editor` passes its
    own, kept for its life; without one the edit opens one for itself and closes it at the end.
    Arguments: `streamed_edit`'s. Never raises because of the network: every failure ends in local
    compute, listed in the result's `events`.
    """

    def __init__(self, model: Any, photo: torch.Tensor, *, base_url: str, template_id: str,
                 template_image: torch.Tensor, instruction: int, policy: Policy, profile: DeviceProfile,
                 bandwidth: BandwidthEstimator | None = None, rtt: RttEstimator | None = None,
                 decode_workers: int | None = None, max_inflight: int = DEFAULT_MAX_INFLIGHT, steps: int = 8,
                 seed: int = 0, manifest: Any = None, manifest_timeout_s: float = 2.0, allow_fast_path: bool = True,
                 emulate: Emulation | None = None, link: Any = None) -> None:
        self.model, self.photo, self.base_url, self.template_id = model, photo, base_url, template_id
        self.template_image, self.instruction, self.policy, self.profile = template_image, instruction, policy, profile
        self.bandwidth = bandwidth or BandwidthEstimator(prior_bps=1e6)
        self.rtt = rtt or RttEstimator()
        self.workers = decode_workers or profile.decode_workers
        self.max_inflight, self.steps, self.seed = max_inflight, steps, seed
        self.manifest, self.manifest_timeout_s, self.allow_fast_path = manifest, manifest_timeout_s, allow_fast_path
        self.emulate = emulate or Emulation()
        self.link = link
        self._own_link: Any = None     # the ClientThread this edit opened (no `link` given), closed at the end
        self.events: list[str] = []
        self.t0 = math.nan

    def clock(self) -> float:
        """Seconds since the edit started (photo in)."""
        return time.monotonic() - self.t0

    # ------------------------------------------------------------------------------ the edit
    def run(self) -> StreamedEdit:
        warm_up_decoders()  # 1. the numba decoders' JIT where no native one loads, before the clock
        try:
            self._know_template()                                        # 2.
            self.t0 = time.monotonic()                                   # 3.
            if self.emulate.clock_start is not None:
                self.emulate.clock_start(self.t0)
            manifest, why = self._manifest()                             # 4.
            if manifest is None:
                return self._on_device(why)
            manifest_s = self.clock()
            why = self._mismatch(manifest)                               # 5.
            if why:
                return self._on_device(why)
            driver = self._first_plan(manifest)                          # 6.
            if self.allow_fast_path and self.policy.fetches_nothing(driver):
                res = self._on_device("", driver.records)
                res.manifest_s = manifest_s
                return res
            return self._stream(manifest, driver, manifest_s)           # 7.
        finally:
            if self._own_link is not None:
                self._own_link.close()

    def _know_template(self) -> None:
        """The fingerprints and the tables the phone holds: what a gallery knows before a photo comes in."""
        self.model_fp = self.model.fingerprint()
        self.template_fp = self.model.template_fingerprint(self.template_image, self.instruction)
        self.held_tables: dict[str, Any] = {}
        if self.emulate.tables:
            try:
                self.held_tables = {name: CodecTables.from_bytes(blob, ShardId(self.model_fp, self.template_fp, -1))
                                    for name, blob in self.emulate.tables.items()}
            except Exception:  # tables of another template or model: fetched (and checked) in the edit instead
                self.held_tables = {}

    def _session(self) -> Any:
        """The edit's HTTP session: the caller's `link`, or one opened for this edit."""
        if self.link is None:
            self._own_link = self.link = ClientThread(self.base_url, name="sakura-edit", max_connections=self.max_inflight)
        return self.link

    def _manifest(self) -> tuple[Any, str]:
        """(the manifest, "") or (None, why not). Fetched inside the timed edit when none was given:
        fail fast (no retries, `manifest_timeout_s`), the device can compute."""
        if self.manifest is NO_MANIFEST:
            return None, "no manifest for this template (server down, not in the gallery)"
        if self.manifest is not None:
            return self.manifest, ""
        t = self.manifest_timeout_s
        try:
            return self._session().run(lambda c: asyncio.wait_for(
                c.sharing(connect_timeout=t, read_timeout=t, max_retries=0).get_manifest(self.model_fp, self.template_id),
                2 * t)), ""
        except Exception as e:  # any network or server failure: the device can still compute
            return None, f"manifest unavailable ({_short(e)})"

    def _mismatch(self, manifest: Any) -> str:
        """Why this manifest cannot serve this edit ("" if it can); sets the shard shapes it declares."""
        if manifest.template_id != self.template_id or manifest.model_fingerprint != self.model_fp:
            return f"manifest is for {manifest.model_fingerprint[:16]}…/{manifest.template_id}"
        if manifest.kv_layout.get("template_fingerprint") != self.template_fp:
            return "manifest's template fingerprint differs from the gallery image's"
        if len(manifest.shards) != self.model.num_layers:
            return f"manifest has {len(manifest.shards)} shards, the model has {self.model.num_layers} layers"
        try:  # sizes and shapes from the manifest and the model's config, before any allocation
            self.shapes = shard_shapes(self.model, manifest)
        except LimitError as e:
            return str(e)
        return ""

    def _first_plan(self, manifest: Any) -> EditDriver:
        specs = list(self.emulate.specs) if self.emulate.specs is not None else shard_specs(manifest, self.profile)
        if self.emulate.renditions is not None:
            specs = [replace(s, routes=tuple(r for r in s.routes if r.name in self.emulate.renditions)) for s in specs]
        driver = EditDriver(specs, self.policy, bandwidth=self.bandwidth, rtt=self.rtt, decode_workers=self.workers,
                            max_inflight=self.max_inflight, compute_start_s=self.clock() + self.profile.pre_s,
                            other_s=self.profile.pre_s + self.profile.post_s)
        driver.start(self.clock())
        return driver

    def _on_device(self, why: str, records: list[ShardRecord] | None = None) -> StreamedEdit:
        """The whole edit on the device (no manifest, a mismatched one, or a plan that fetches nothing)."""
        if why:
            self.events.append(f"{self.clock() * 1000:.0f} ms: {why}; computing the template on the device")
        out = self.model.edit(self.photo, template=self.template_image, instruction=self.instruction, mode="extract",
                              steps=self.steps, seed=self.seed)
        recs = records or [ShardRecord(j, source=LOCAL) for j in range(self.model.num_layers)]
        for r in recs:
            r.source = LOCAL
        return StreamedEdit(image=out.image, latency_s=self.clock(), records=recs, policy=self.policy.name,
                            events=self.events, path="on-device", timings_s=out.timings_s)

    def _stream(self, manifest: Any, driver: EditDriver, manifest_s: float) -> StreamedEdit:
        """Fetch (`FetchStage`, on the session's loop), decode (`DecodePool`) and compute (the model
        pulling `LiveKVSource.layer(i)`), pipelined; the driver decides every step."""
        try:
            link = self._session()
        except Exception as e:  # a URL no session can be opened for: the device computes
            res = self._on_device(f"no HTTP session for {self.base_url!r} ({_short(e)})", driver.records)
            res.manifest_s = manifest_s
            return res
        self.driver, self.cond = driver, threading.Condition()
        self.quality_known = all("image_mse" in r.distortion for s in manifest.shards for r in s.renditions)
        self.source = LiveKVSource(driver, self.cond, self.clock, self._local_layers, self.model_fp, self.template_fp,
                                   self.instruction)
        self.pool = DecodePool(self.workers)
        self.stage = FetchStage(self.base_url, manifest, driver, self.cond, self.clock, self.t0,
                                max_inflight=self.max_inflight, on_fetched=self._fetched,
                                decode_table=lambda blob: CodecTables.from_bytes(
                                    blob, ShardId(self.model_fp, self.template_fp, -1)),
                                held_tables=self.held_tables, link=link)
        self.source.on_layer = self.stage.kick
        self.stage.start()
        try:
            out = self.model.edit(self.photo, template_kv=self.source, steps=self.steps, seed=self.seed)
        finally:
            self.stage.stop()
            self.pool.shutdown()
        latency = self.clock()
        self.events.extend(driver.events)
        requested = [r for r in driver.records if r.t_request == r.t_request]
        return StreamedEdit(image=out.image, latency_s=latency, records=driver.records, policy=self.policy.name,
                            events=self.events, tables_bytes=self.stage.tables_bytes, manifest_s=manifest_s,
                            image_mse=driver.image_mse(), quality_known=self.quality_known, timings_s=out.timings_s,
                            link_idle_s=self.stage.meter.idle_s if requested else math.nan, used_kv=self.source.used)

    # ------------------------------------------------------------------- the stages' callbacks
    def _local_layers(self) -> Iterator[LayerKV]:
        """The template generator: the template's KV computed here, layer by layer."""
        return (LayerKV(k[0], v[0]) for k, v in self.model.template_layers(self.template_image, self.instruction))

    def _fetched(self, j: int, data: bytes, rendition: Any) -> None:
        """A shard's bytes arrived (the fetch stage's thread): decode them on a pool worker."""
        self.pool.submit(self._decode, j, data, rendition)

    def _decode(self, j: int, data: bytes, rendition: Any) -> None:
        """Decode shard j (a pool worker) and hand its KV to the forward pass. The object's header is
        parsed and checksummed once: its declared shape is checked against the manifest and the
        model before the decoder allocates anything, and the decoder takes the parsed header on."""
        try:
            t = time.monotonic()
            tables = self.stage.tables.get(rendition.tables[0]) if rendition.tables else None
            parsed = bs.parse(data, whole=False)
            check_shard_header(parsed.header, self.shapes[j], f"shard {j}")
            shared: list[bool] = []
            kv = self.pool.decode(data, ShardId(self.model_fp, self.template_fp, j), tables, shared=shared,
                                  parsed=parsed).for_attention()
            if self.emulate.after_decode is not None:
                self.emulate.after_decode(rendition.name, t, bool(shared and shared[0]), self.pool)
            with self.cond:
                self.source.decoded[j] = kv
                self.driver.on_decoded(j, self.clock())
                self.cond.notify_all()
        except Exception as e:
            with self.cond:
                self.driver.on_decode_failed(j, _short(e), self.clock())
                self.cond.notify_all()


def streamed_edit(model: Any, photo: torch.Tensor, *, base_url: str, template_id: str,
                  template_image: torch.Tensor, instruction: int, policy: Policy, profile: DeviceProfile,
                  bandwidth: BandwidthEstimator | None = None, rtt: RttEstimator | None = None,
                  decode_workers: int | None = None, max_inflight: int = DEFAULT_MAX_INFLIGHT, steps: int = 8,
                  seed: int = 0, manifest: Any = None, manifest_timeout_s: float = 2.0, allow_fast_path: bool = True,
                  emulate: Emulation | None = None, link: Any = None) -> StreamedEdit:
    """Edit `photo` with the template's KV streamed from `base_url`, pipelined with compute
    (`LiveEdit(...).run()`).

    Args:
        model: the on-device model (sakura-mini or flux2-mini; its fingerprint selects the manifest).
        photo: (1, 3, H, W) in [0, 1]. Never leaves this function.
        template_image, instruction: the template as the gallery holds it (for local compute).
        policy: `SakuraPolicy` (default), `MeetInMiddlePolicy`, `CacheGenPolicy`, `FixedPolicy`.
        profile: per-layer compute and decode rates the planner assumes.
        bandwidth, rtt: the phone's estimators (kept across edits by a real app).
        decode_workers: decode pool size (default: `profile.decode_workers`).
        manifest: an already fetched `Manifest` (apps fetch manifests with the gallery); None
            fetches it inside the timed edit, and a manifest that cannot be had means on-device.
        allow_fast_path: when the first plan fetches nothing, run the plain on-device edit (no
            threads, so no overhead over on-device).
        emulate: a benchmark's overrides (`Emulation`: planner inputs, allowed renditions, decode
            padding); None on a phone.
        link: the HTTP session to fetch through (`sakura.wire.client.ClientThread` for `base_url`:
            an `Editor`'s, kept across edits); None opens one for this edit.

    Never raises because of the network: every failure ends in local compute, listed in `events`.
    """
    return LiveEdit(model, photo, base_url=base_url, template_id=template_id, template_image=template_image,
                    instruction=instruction, policy=policy, profile=profile, bandwidth=bandwidth, rtt=rtt,
                    decode_workers=decode_workers, max_inflight=max_inflight, steps=steps, seed=seed,
                    manifest=manifest, manifest_timeout_s=manifest_timeout_s, allow_fast_path=allow_fast_path,
                    emulate=emulate, link=link).run()


def split_decode_end(t_start: float, decode_s: float, split: float, t_next: float | None) -> float:
    """When a decode of `decode_s` (one worker) that began at `t_start` ends, if it shares the idle
    workers at `split` x until the next shard arrives at `t_next` (None: none comes) and runs alone
    after: the simulator's model (`sim.simulate_edit`, decode_split), so the emulated live decode
    (`DecodePool.pad`) takes what the simulated one does."""
    end = t_start + decode_s / max(1.0, split)
    if split > 1.0 and t_next is not None and t_next < end:
        end = max(t_next, t_start) + decode_s - (max(t_next, t_start) - t_start) * split
    return end


class DecodePool:
    """The decode pool: `workers` threads, one shard per job (`submit`). A job whose decode starts
    while other workers are idle and no other job waits shares its one shard with them
    (`decode(..., pool=)`: rANS pieces, channel blocks; bit-equal to the serial decode), so one
    large layer (shard 0 at the start of an edit, the last shard) does not serialise on one core.
    Helpers are plain tasks on the same executor: a job that arrives meanwhile queues behind at
    most the helpers' remaining ranges of that shard, and helpers that never started are
    cancelled (`rans.run_split`), so a busy pool loses nothing."""

    def __init__(self, workers: int) -> None:
        self.workers = max(1, int(workers))
        self.executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="sakura-decode")
        self._lock = threading.Lock()
        self._running = 0      # jobs in a worker now
        self._waiting = 0      # jobs submitted, not started
        self.split_jobs = 0    # jobs that shared their shard (for tests and logs)
        self._submitted: list[float] = []   # time.monotonic() of every submit (for `pad`)

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        with self._lock:
            self._waiting += 1
            self._submitted.append(time.monotonic())
        return self.executor.submit(self._job, fn, args)

    def _job(self, fn: Callable[..., Any], args: tuple) -> Any:
        with self._lock:
            self._waiting -= 1
            self._running += 1
        try:
            return fn(*args)
        finally:
            with self._lock:
                self._running -= 1

    def share(self) -> concurrent.futures.Executor | None:
        """The executor the calling job may split its shard over, or None (no idle worker, or a
        job waiting for one)."""
        with self._lock:
            if self.workers > 1 and self._running < self.workers and self._waiting == 0:
                self.split_jobs += 1
                return self.executor
        return None

    def decode(self, data: bytes, ident: Any, tables: Any, shared: list[bool] | None = None,
               parsed: Any = None) -> Any:
        """`decode_any` of one shard, split over the idle workers where the codec can (`share`);
        appends to `shared` whether it was offered the idle workers. `parsed`: the object's
        header as the caller parsed and checked it (`bitstream.parse`), not parsed again."""
        pool = self.share()
        if shared is not None:
            shared.append(pool is not None)
        return decode_any(data, ident, tables, pool=pool, parsed=parsed)

    def pad(self, t_start: float, pad_s: float, split: float = 1.0, poll_s: float = 0.002) -> None:
        """Emulation (a slower decoder): hold this worker until a decode that began at monotonic
        `t_start` has taken what the simulator gives it (`split_decode_end`), the next shard being
        the first one submitted after `t_start` (looked at again every `poll_s` while it may come)."""
        while True:
            t_next = None
            if split > 1.0:
                with self._lock:
                    t_next = next((x for x in self._submitted if x > t_start), None)
            end = split_decode_end(t_start, pad_s, split, t_next)
            now = time.monotonic()
            if now >= end:
                return
            # with a split and no next shard yet, look again soon: one arriving makes the rest slower
            time.sleep(min(end - now, poll_s) if split > 1.0 and t_next is None else end - now)

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


class TableUnusable(RuntimeError):
    """A codec table already failed to fetch or decode in this edit: every shard needing it fails
    at once (it is computed on the device) instead of fetching the table again."""


class FetchStage:
    """The fetch stage on an HTTP session's event loop (`link`, a `ClientThread`: the edit's, an
    `Editor`'s; None: one of its own for its life): issues the driver's requests (ahead, several in
    flight on one connection pool), feeds chunk timing to the driver's estimators and hands each
    completed shard to `on_fetched(layer, bytes, rendition)` (from the loop's thread).

    It needs no model: a link check runs it alone. Thread-safe entry points: `kick` (something
    changed: ask the driver again), `stop`. `held_tables` (name -> decoded tables, as
    `decode_table` returns them): tables already on the phone, never fetched.
    """

    def __init__(self, base_url: str, manifest: Any, driver: EditDriver, cond: threading.Condition,
                 clock: Callable[[], float], t0: float, *, max_inflight: int = DEFAULT_MAX_INFLIGHT,
                 on_fetched: Callable[[int, bytes, Any], None], decode_table: Callable[[bytes], Any] = lambda b: b,
                 held_tables: Mapping[str, Any] | None = None, link: Any = None):
        self.base_url, self.manifest, self.driver, self.cond, self.clock, self.t0 = base_url, manifest, driver, cond, clock, t0
        self.link = link
        self._own_link: Any = None
        self.max_inflight = max_inflight
        self.warm_connections = min(2, max_inflight - 1)
        self.on_fetched, self.decode_table = on_fetched, decode_table
        self.meter = _LinkMeter()
        self.tables: dict[str, Any] = dict(held_tables or {})
        self.tables_bytes = 0   # fetched (held tables do not count)
        self._stop = threading.Event()
        self._kick: Callable[[], None] | None = None
        self._done: concurrent.futures.Future | None = None

    def start(self) -> None:
        if self.link is None:
            self._own_link = self.link = ClientThread(self.base_url, name="sakura-fetch", max_connections=self.max_inflight)
        self._done = self.link.submit(self._serve(self.link.client))

    def kick(self) -> None:
        if self._kick is not None:
            try:
                self._kick()
            except RuntimeError:
                pass  # loop already closed

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self.kick()
        if self._done is not None:
            concurrent.futures.wait([self._done], timeout=timeout_s)
        if self._own_link is not None:
            self._own_link.close()

    async def _serve(self, client: Any) -> None:
        try:
            await self._run(client)
        except BaseException as e:  # the client itself failed: every pending shard goes local
            with self.cond:
                for r in self.driver.records:
                    if r.status in (PENDING, REQUESTED):
                        self.driver.on_fetch_failed(r.index, f"fetch stage: {_short(e)}", self.clock())
                        r.status = FAILED
                self.cond.notify_all()

    async def _run(self, client: Any) -> None:
        cond, driver, clock = self.cond, self.driver, self.clock
        kick = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._kick = lambda: loop.call_soon_threadsafe(kick.set)
        table_locks: dict[str, asyncio.Lock] = {}
        tasks: dict[int, asyncio.Task] = {}

        table_failed: dict[str, str] = {}

        async def ensure_tables(client: TemplateClient, rendition: Any) -> None:
            for name in rendition.tables:
                lock = table_locks.setdefault(name, asyncio.Lock())
                async with lock:
                    if name in table_failed:
                        # one failure per table, not one per shard and retry: a bad table was
                        # fetched and decoded six times for every shard (7.7 s before going local)
                        raise TableUnusable(f"table {name!r}: {table_failed[name]}")
                    if name not in self.tables:
                        try:
                            res = await client.fetch_object(self.manifest.table(name).object)
                            self.tables[name] = self.decode_table(res.data)
                        except asyncio.CancelledError:
                            raise
                        except Exception as e:
                            table_failed[name] = _short(e, 120)
                            raise
                        self.tables_bytes += len(res.data)

        async def fetch_one(client: TemplateClient, j: int, route: Route) -> None:
            rendition = self.manifest.shards[j].rendition(route.name)
            first = {"seen": False}
            got = [0]
            t_req = clock()
            me = asyncio.current_task()
            # a request given back for a lower shard (`driver.LOWER_FIRST`) and sent again is a new
            # task: whatever the old one still reports is not about the request the driver knows
            current = lambda: tasks.get(j) is me  # noqa: E731

            def on_chunk(c: Any) -> None:
                t_end = c.t_end - self.t0
                with cond:
                    if not current():
                        return
                    self.meter.chunks.append((t_end, c.nbytes))
                    if not first["seen"]:
                        first["seen"] = True
                        self.meter.active_first[j] = t_end
                        driver.on_first_byte(j, t_req, t_end)
                    got[0] += c.nbytes
                    driver.on_progress(j, rendition.nbytes - got[0], t_end)

            try:
                await ensure_tables(client, rendition)
                with cond:
                    t_req = clock()
                    self.meter.request(t_req)
                    # an overall deadline from the estimates: a dripping server cannot hold raw-stream
                    deadline_s = fetch_deadline_s(rendition.nbytes, driver.bytes_per_s(), self.max_inflight)
                try:
                    res = await client.fetch_rendition(rendition, on_chunk=on_chunk, deadline_s=deadline_s)
                finally:
                    with cond:
                        self.meter.done(clock())
                with cond:
                    if not current():
                        return
                    t_last = res.t_done - self.t0
                    n, s = self.meter.sample(j, t_last)
                    if driver.records[j].status == REQUESTED:
                        driver.on_fetched(j, len(res.data), t_last, sample_bytes=n, sample_s=s)
                        self.on_fetched(j, res.data, rendition)
                    cond.notify_all()
            except asyncio.CancelledError:
                with cond:
                    if tasks.get(j) in (me, None):
                        self.meter.active_first.pop(j, None)
                raise
            except Exception as e:  # FetchError, IntegrityError, table decode errors...
                with cond:
                    if current():
                        self.meter.active_first.pop(j, None)
                        driver.on_fetch_failed(j, _short(e), clock())
                    cond.notify_all()
            finally:
                kick.set()

        # Open a second and third connection now, alongside the first request: a request
        # issued ahead while another transfer runs needs a free connection, and a new one
        # costs a handshake round trip (as a phone keeps its CDN connections warm). Handshakes
        # only: warming with a request (it was the index) put its answer on the downlink ahead
        # of the first shard, which the planner does not count (on the dilated LTE trace two
        # 559-byte index answers stood for 2 x 10.7 MB of phone traffic and made shard 5 late).
        async def warm_up() -> None:  # the coroutine is made when the task runs (none left un-awaited if cancelled first)
            await _swallow(client.open_connections(self.warm_connections))

        warm = [asyncio.create_task(warm_up())]
        try:
            while not self._stop.is_set():
                with cond:
                    reqs, wake = driver.next_requests(clock())
                    cancel = driver.to_cancel()
                    busy = bool(driver.inflight())
                for j in cancel:
                    t = tasks.pop(j, None)
                    if t is not None and not t.done():
                        t.cancel()
                for j, route in reqs:
                    old = tasks.pop(j, None)  # given back for a lower shard and sent again at once
                    if old is not None and not old.done():
                        old.cancel()
                        with cond:
                            self.meter.active_first.pop(j, None)
                    tasks[j] = asyncio.create_task(fetch_one(client, j, route))
                kick.clear()
                timeout = 0.25 if wake is None else max(0.0, min(0.25, wake - clock()))
                if busy:  # ask again soon: the transfer under way refines when the link drains
                    timeout = min(timeout, POLL_S)
                try:
                    await asyncio.wait_for(kick.wait(), timeout)
                except asyncio.TimeoutError:
                    pass
        finally:  # also when the loop raised (a policy with no such rendition): no task outlives the client
            # (a warm-up task left running re-opened the session after close: "Unclosed client session")
            for t in list(tasks.values()) + warm:
                t.cancel()
            await asyncio.gather(*tasks.values(), *warm, return_exceptions=True)


async def _swallow(coro) -> None:
    try:
        await coro
    except Exception:  # a warm-up request that fails costs nothing: the shard requests report errors
        pass


def _short(e: BaseException, limit: int = 160) -> str:
    """One line naming an error: its type and the start of its message."""
    # sanitised: a server's message (or a file's contents) must not reach the terminal raw
    return f"{type(e).__name__}: {clean(' '.join(str(e).split()), limit)}"

