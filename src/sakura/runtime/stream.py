"""The phone-side streaming runtime: fetch, decode and compute as concurrent stages.

    fetch thread (asyncio)  ──bounded queue──►  decode thread  ──►  StreamedTemplateKV  ◄── model.edit
    plans each shard with a Policy, fetches it        decodes into         layer(i) blocks until
    with the TemplateClient, feeds the estimator      LayerKV slots        shard i is ready

The model pulls layer i's KV exactly when its forward pass reaches layer i (`TemplateKVSource`),
so a shard that arrives before it is needed costs nothing, and one that arrives late shows up as
a stall. Local compute is a prefix: shards 0..k-1 marked local are computed by the compute stage
itself, block by block, from the template image the phone already shows in its gallery.

Only public template objects are requested: `TemplateClient` has no method that can carry the
photo or the prompt, and this module never hands it either.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from sakura.models.kv import LayerKV, TemplateKVError
from sakura.models.mini import MiniDiT

from .estimator import BandwidthEstimator
from .scheduler import LOCAL, Option, PipelineState, ShardSpec, plan_next


# ---------------------------------------------------------------------------------------------
# policies: which option for the next shard


class Policy(Protocol):
    name: str

    def choose(self, specs: list[ShardSpec], state: PipelineState, bytes_per_s: float, now_s: float) -> Option:
        """specs[0] is the next shard; state/now on the runtime's clock (seconds since start)."""


@dataclass
class MPCPolicy:
    """sakura: MPC lookahead over the ladder with local fallback, re-planned after every shard.

    allowed: rendition names this policy may fetch (None: every rendition in the manifest).
    """

    horizon: int = 3
    max_distortion: float = float("inf")
    distortion_weight_s: float = 0.0
    rtt_s: float = 0.0
    allowed: tuple[str, ...] | None = None
    name: str = "sakura"

    def choose(self, specs, state, bytes_per_s, now_s):
        if self.allowed is not None:
            specs = [ShardSpec(tuple(o for o in s.options if o.name in self.allowed), s.compute_s, s.local)
                     for s in specs]
        return plan_next(specs, state, bytes_per_s, rtt_s=self.rtt_s, horizon=self.horizon,
                         max_distortion=self.max_distortion, distortion_weight_s=self.distortion_weight_s)


@dataclass
class FixedPolicy:
    """Always the named rendition (raw-stream: "lossless")."""

    rendition: str
    name: str = "fixed"

    def choose(self, specs, state, bytes_per_s, now_s):
        for o in specs[0].options:
            if o.name == self.rendition:
                return o
        raise KeyError(f"shard has no rendition {self.rendition!r}; has {[o.name for o in specs[0].options]}")


@dataclass
class CacheGenPolicy:
    """CacheGen's streaming adaptation, adapted to DiT template KV.

    Per chunk, the remaining latency target is split evenly over the remaining chunks; the
    highest quality level whose predicted transfer time (bytes / measured bandwidth) fits that
    share is fetched; if none fits, the chunk is recomputed — which for template KV is only
    possible while every earlier chunk was computed too (a prefix) — else the lowest level.

    levels: rendition names from best to worst quality (CacheGen's levels 3..1).
    """

    levels: tuple[str, ...]
    target_s: float
    name: str = "cachegen"

    def choose(self, specs, state, bytes_per_s, now_s):
        spec = specs[0]
        by_name = {o.name: o for o in spec.options}
        missing = [n for n in self.levels if n not in by_name]
        if missing:
            raise KeyError(f"shard lacks CacheGen levels {missing}")
        share = max(self.target_s - now_s, 0.0) / len(specs)
        for n in self.levels:
            if by_name[n].nbytes / bytes_per_s <= share:
                return by_name[n]
        if spec.local is not None and state.all_local_so_far:
            return spec.local
        return by_name[self.levels[-1]]


# ---------------------------------------------------------------------------------------------
# the KV source the model pulls from


@dataclass
class ShardRecord:
    """What happened to one shard (seconds since the edit started)."""

    index: int
    choice: str
    nbytes: int = 0
    fetch_start: float = float("nan")
    fetch_end: float = float("nan")
    decode_end: float = float("nan")
    needed: float = float("nan")      # when the forward pass asked for it
    delivered: float = float("nan")   # when layer(i) returned it
    local_s: float = 0.0              # on-device compute spent producing it (local shards)

    @property
    def stall_s(self) -> float:
        return max(0.0, self.delivered - self.needed - self.local_s)


class StreamedTemplateKV:
    """A `TemplateKVSource` whose `layer(i)` blocks until shard i is ready (or computes it, for a
    local prefix). Thread-safe: the decode stage calls `put`, the fetch stage `mark_local`."""

    def __init__(self, model: MiniDiT, template_image: torch.Tensor, instruction: int, t0: float,
                 timeout_s: float = 120.0):
        self.model = model
        self.model_fingerprint = model.fingerprint()
        self.template_fingerprint = model.template_fingerprint(template_image, instruction)
        self._n = model.num_layers
        self._image, self._instruction = template_image, instruction
        self.instruction = instruction  # models whose prompt is not part of the KV (flux2-mini) read it
        self._t0 = t0
        self._timeout_s = timeout_s
        self._ready = [threading.Event() for _ in range(self._n)]
        self._slots: list[LayerKV | str | None] = [None] * self._n
        self._is_local = [False] * self._n
        self._error: BaseException | None = None
        self._local_iter = None
        self.records = [ShardRecord(i, "?") for i in range(self._n)]

    @property
    def num_layers(self) -> int:
        return self._n

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def put(self, i: int, layer: LayerKV) -> None:
        self._slots[i] = layer
        self.records[i].decode_end = self.now()
        self._ready[i].set()

    def mark_local(self, i: int) -> None:
        if not all(self._is_local[:i]):
            raise ValueError(f"shard {i} cannot be local: an earlier shard was fetched")
        self._is_local[i] = True
        self._slots[i] = LOCAL
        self._ready[i].set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        for e in self._ready:
            e.set()

    def layer(self, i: int) -> LayerKV:
        rec = self.records[i]
        if rec.needed != rec.needed:  # first request (NaN)
            rec.needed = self.now()
        if not self._ready[i].wait(self._timeout_s):
            raise TimeoutError(f"shard {i} not ready after {self._timeout_s} s")
        if self._error is not None and self._slots[i] is None:
            raise RuntimeError(f"streaming failed before shard {i} arrived: {self._error}") from self._error
        slot = self._slots[i]
        if slot == LOCAL:
            t = time.perf_counter()
            if self._local_iter is None:
                self._local_iter = self.model.template_layers(self._image, self._instruction)
            with torch.no_grad():
                k, v = next(self._local_iter)
            slot = LayerKV(k[0], v[0])
            self._slots[i] = slot
            rec.local_s = time.perf_counter() - t
        if rec.delivered != rec.delivered:
            rec.delivered = self.now()
        return slot  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# the runtime


@dataclass
class DeviceProfile:
    """Per-layer times the planner assumes (seconds), measured on this machine by `profile_model`
    or scaled to a phone. decode_bytes_per_s: decode throughput per codec name."""

    compute_s: float
    local_s: float
    decode_bytes_per_s: dict[str, float] = field(default_factory=dict)
    default_decode_bytes_per_s: float = 50e6

    def decode_s(self, codec: str, nbytes: int) -> float:
        return nbytes / self.decode_bytes_per_s.get(codec, self.default_decode_bytes_per_s)


def profile_model(model: MiniDiT, repeats: int = 3) -> DeviceProfile:
    """Measure this machine's per-layer forward compute (photo+target stream, one step) and
    per-layer template compute, median of `repeats` runs."""
    size = model.cfg.image_size
    g = torch.Generator().manual_seed(0)
    tmpl, photo = torch.rand(1, 3, size, size, generator=g), torch.rand(1, 3, size, size, generator=g)
    comp, loc = [], []
    with torch.no_grad():
        for _ in range(repeats):
            t = time.perf_counter()
            kvs = model.template_stream(tmpl)
            loc.append((time.perf_counter() - t) / model.num_layers)
            t = time.perf_counter()
            model.velocity(photo, photo, torch.ones(1), lambda i: (kvs[i][0], kvs[i][1], None))
            comp.append((time.perf_counter() - t) / model.num_layers)
    return DeviceProfile(compute_s=sorted(comp)[len(comp) // 2], local_s=sorted(loc)[len(loc) // 2])


@dataclass
class StreamedEdit:
    """Result of `streamed_edit`. Times in seconds since the edit started (photo in)."""

    image: torch.Tensor
    latency_s: float
    records: list[ShardRecord]
    bytes_fetched: int
    policy: str
    tables_bytes: int = 0
    manifest_s: float = 0.0
    timings_s: dict[str, float] = field(default_factory=dict)

    @property
    def stall_s(self) -> float:
        return sum(r.stall_s for r in self.records)

    def breakdown(self) -> dict[str, float]:
        fetched = [r for r in self.records if r.choice != LOCAL]
        return {
            "latency_s": self.latency_s,
            "manifest_s": self.manifest_s,
            "fetch_s": sum(r.fetch_end - r.fetch_start for r in fetched),
            "local_compute_s": sum(r.local_s for r in self.records),
            "stall_s": self.stall_s,
            "compute_s": self.timings_s.get("denoise", 0.0) - self.stall_s - sum(r.local_s for r in self.records),
            "bytes": float(self.bytes_fetched + self.tables_bytes),
            "local_shards": float(sum(r.choice == LOCAL for r in self.records)),
        }


def shard_specs(manifest, profile: DeviceProfile, allow_local: bool = True) -> list[ShardSpec]:
    """Planner inputs from a manifest: every rendition with its size, decode time and expected
    distortion, plus the local option."""
    specs = []
    for shard in manifest.shards:
        opts = tuple(Option(r.name, r.nbytes, profile.decode_s(r.codec, r.nbytes),
                            float(r.distortion.get("expected", 0.0))) for r in shard.renditions)
        specs.append(ShardSpec(opts, profile.compute_s, Option(LOCAL, local_s=profile.local_s) if allow_local else None))
    return specs


def streamed_edit(model: MiniDiT, photo: torch.Tensor, *, base_url: str, template_id: str,
                  template_image: torch.Tensor, instruction: int, policy: Policy, profile: DeviceProfile,
                  estimator: BandwidthEstimator | None = None, steps: int = 8, seed: int = 0,
                  queue_depth: int = 2, timeout_s: float = 120.0, manifest=None) -> StreamedEdit:
    """Edit `photo` with the template's KV streamed from `base_url`, pipelined with compute.

    Args:
        model: the on-device model (its fingerprint selects the manifest).
        photo: (1, 3, H, W) in [0, 1]. Never leaves this function.
        template_image: (1, 3, H, W) template thumbnail from the phone's gallery (for local compute).
        policy: `MPCPolicy` (sakura), `FixedPolicy("lossless")` (raw-stream), `CacheGenPolicy`.
        profile: per-layer compute/decode times the planner assumes.
        estimator: bandwidth estimator (kept across edits by a real app).
        queue_depth: fetched-but-not-decoded shards allowed in flight (bounded memory).
        manifest: an already fetched `Manifest` (an app fetches manifests with the template
            gallery); None fetches it first, inside the timed edit.
    """
    from sakura.client import TemplateClient
    from sakura.codec import CodecTables, ShardId, decode_any

    est = estimator or BandwidthEstimator(prior_bps=1e6)
    t0 = time.perf_counter()
    source = StreamedTemplateKV(model, template_image, instruction, t0, timeout_s=timeout_s)
    decode_q: queue.Queue = queue.Queue(maxsize=queue_depth)
    info: dict[str, Any] = {"bytes": 0, "tables_bytes": 0, "manifest_s": 0.0}
    decode_busy_until = [0.0]

    def decoder() -> None:
        tables: dict[str, Any] = {}
        while True:
            item = decode_q.get()
            if item is None:
                return
            i, data, rendition, table_blobs, tfp = item
            try:
                tbl = None
                if rendition.tables:
                    name = rendition.tables[0]
                    if name not in tables:
                        tables[name] = CodecTables.from_bytes(table_blobs[name], ShardId(model.fingerprint(), tfp, -1))
                    tbl = tables[name]
                dec = decode_any(data, ShardId(model.fingerprint(), tfp, i), tbl)
                source.put(i, dec.as_layer_kv())
            except BaseException as e:  # surfaced to the compute stage, never swallowed
                source.fail(e)
                return

    async def fetcher() -> None:
        async with TemplateClient(base_url) as client:
            m = manifest if manifest is not None else await client.fetch_manifest(model.fingerprint(), template_id)
            if m.template_id != template_id or m.model_fingerprint != model.fingerprint():
                raise TemplateKVError(f"manifest is for {m.model_fingerprint[:16]}…/{m.template_id}, not this "
                                      f"model's {template_id}")
            info["manifest_s"] = source.now()
            tfp = m.kv_layout.get("template_fingerprint")
            if tfp != source.template_fingerprint:
                raise TemplateKVError(f"manifest {template_id} is for template {str(tfp)[:16]}…, the gallery "
                                      f"image is {source.template_fingerprint[:16]}…")
            if len(m.shards) != model.num_layers:
                raise TemplateKVError(f"manifest has {len(m.shards)} shards, the model has {model.num_layers} layers")
            specs = shard_specs(m, profile)
            table_blobs: dict[str, bytes] = {}
            all_local = True
            for i, shard in enumerate(m.shards):
                now = source.now()
                # where will compute be when it reaches shard i? (last request + per-layer compute)
                asked = [r.needed for r in source.records if r.needed == r.needed]
                compute_free = max(now, (max(asked) if asked else now) + (i - len(asked) + 1) * profile.compute_s)
                state = PipelineState(now, max(now, decode_busy_until[0]), compute_free, all_local)
                bw = est.robust_bps() or est.prior_bps or 1e6
                choice = policy.choose(specs[i:], state, bw, now)
                rec = source.records[i]
                rec.choice = choice.name
                if choice.is_local:
                    source.mark_local(i)
                    continue
                all_local = False
                rendition = shard.rendition(choice.name)
                for tname in rendition.tables:
                    if tname not in table_blobs:
                        res = await client.fetch_object(m.table(tname).object)
                        table_blobs[tname] = res.data
                        info["tables_bytes"] += len(res.data)
                        est.observe(len(res.data), res.t_done - res.t_request)
                rec.fetch_start = source.now()
                res = await client.fetch_rendition(rendition)
                rec.fetch_end = source.now()
                rec.nbytes = len(res.data)
                info["bytes"] += len(res.data)
                est.observe(len(res.data), res.t_done - res.t_request)
                decode_busy_until[0] = max(rec.fetch_end, decode_busy_until[0]) + choice.decode_s
                await asyncio.get_running_loop().run_in_executor(None, decode_q.put,
                                                                 (i, res.data, rendition, table_blobs, tfp))

    def fetch_thread() -> None:
        try:
            asyncio.run(fetcher())
        except BaseException as e:
            source.fail(e)
        finally:
            decode_q.put(None)

    threads = [threading.Thread(target=fetch_thread, name="sakura-fetch", daemon=True),
               threading.Thread(target=decoder, name="sakura-decode", daemon=True)]
    for t in threads:
        t.start()
    try:
        out = model.edit(photo, template_kv=source, steps=steps, seed=seed)
    finally:
        for t in threads:
            t.join(timeout=timeout_s)
    latency = time.perf_counter() - t0
    return StreamedEdit(image=out.image, latency_s=latency, records=source.records, bytes_fetched=info["bytes"],
                        policy=policy.name, tables_bytes=info["tables_bytes"], manifest_s=info["manifest_s"],
                        timings_s=out.timings_s)
