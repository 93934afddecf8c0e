"""The edit's decision logic, shared by the live runtime and the simulator. No clock, no I/O.

An executor (``sakura.runtime.live`` with sockets, threads and the real model; or
``sakura.runtime.sim`` with a virtual clock, link and compute) reports events to an
`EditDriver` and carries out what it answers:

    executor                                  EditDriver (this module)
    --------                                  ------------------------
    next_requests(now)                  ->    [(layer, route)] to request now, and when to ask again
    on_first_byte / on_fetched / ...    ->    estimators, re-plan after every shard
    at_layer(j, now)                    ->    USE the fetched KV | LOCAL (compute it, catching the
                                              local generator up) | WAIT until a deadline
    on_wait_expired(j, now)             ->    LOCAL: the link is late; finish on the device

So both executors take the same decisions from the same inputs (tested on a constant-rate link),
and the policies below are the only place methods differ.

Requests are issued *ahead*: while requests are in flight, the next one is sent about one round
trip before the link would drain, so the link does not sit idle for an RTT between shards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol, Sequence

from .estimator import BandwidthEstimator, RttEstimator
from .plan import (LOCAL, ConstantLink, PipelineState, PlanResult, Route, ShardSpec, image_budget, plan_split,
                   psnr_from_mse)

USE, WAIT = "use", "wait"


@dataclass(frozen=True)
class LayerAction:
    """What the forward pass does at a layer: USE the fetched KV, compute it LOCAL (running the
    local generator over `catch_up` template layers), or WAIT for the shard until `deadline`."""

    kind: str
    deadline: float = math.inf
    catch_up: int = 0


@dataclass
class ShardRecord:
    """What happened to one shard (seconds on the executor's clock, since the edit started)."""

    index: int
    route: str = ""                 # rendition requested ("" if never requested)
    source: str = ""                # how the forward pass got it: a rendition name or "local"
    nbytes: int = 0                 # bytes received for it (wasted if source is local)
    image_mse: float = 0.0          # expected image MSE contribution of the KV used
    status: str = "pending"         # pending | requested | fetched | ready | failed | cancelled
    t_request: float = math.nan
    t_first_byte: float = math.nan
    fetch_end: float = math.nan
    decode_end: float = math.nan
    needed: float = math.nan        # when the forward pass reached this layer
    delivered: float = math.nan     # when it got the KV (after local compute, if local)
    local_s: float = 0.0            # on-device compute spent at this layer (incl. catch-up)
    exp_end: float = math.nan       # expected last byte (while in flight)
    note: str = ""

    @property
    def stall_s(self) -> float:
        if self.delivered != self.delivered or self.needed != self.needed:
            return 0.0
        return max(0.0, self.delivered - self.needed - self.local_s)


class Policy(Protocol):
    """Which shard to request next with which rendition, and which layers to compute locally."""

    name: str
    adaptive: bool  # give up on a late shard and compute it (sakura); baselines wait

    def replan(self, d: "EditDriver", now: float) -> None: ...

    def next_fetch(self, d: "EditDriver", now: float) -> tuple[int, Route] | None: ...

    def prefers_local(self, d: "EditDriver", j: int) -> bool: ...


class EditDriver:
    """Decisions for one edit's first denoising step. See the module docstring.

    Args:
        specs: one `ShardSpec` per layer, in consumption order.
        policy: a `Policy` (`SakuraPolicy`, `MeetInMiddlePolicy`, `CacheGenPolicy`, `FixedPolicy`).
        bandwidth, rtt: the phone's estimators (kept across edits by a real app).
        decode_workers: decode pool size (the plan knows it).
        max_inflight: most requests outstanding at once.
    """

    def __init__(self, specs: Sequence[ShardSpec], policy: Policy, *, bandwidth: BandwidthEstimator,
                 rtt: RttEstimator, decode_workers: int = 1, max_inflight: int = 8):
        if decode_workers < 1 or max_inflight < 1:
            raise ValueError("decode_workers and max_inflight must be >= 1")
        self.specs = list(specs)
        self.L = len(self.specs)
        self.policy = policy
        self.bw = bandwidth
        self.rtt = rtt
        self.workers = decode_workers
        self.max_inflight = max_inflight
        self.records = [ShardRecord(j) for j in range(self.L)]
        self.events: list[str] = []
        self.routes: dict[int, Route] = {}
        self.generator_at = 0
        self.compute_at = 0
        self.compute_free = 0.0
        self.decode_free = [0.0] * decode_workers
        self.link_suspect = False    # a deadline passed with no bytes since: assume the link is gone
        self.switched = False        # some layer used fetched KV
        self.started = False

    # ----------------------------------------------------------------------------- estimates
    def bytes_per_s(self) -> float:
        """The rate the planner plans with: the robust (discounted) estimate."""
        return self.bw.robust_bps() or 1e5

    def timing_bytes_per_s(self) -> float:
        """The rate used to time requests issued ahead: the undiscounted prediction. Erring fast
        only sends a request a little early; erring slow leaves the link idle."""
        return self.bw.predict_bps() or 1e5

    def rtt_s(self) -> float:
        return self.rtt.rtt_s()

    def inflight(self) -> list[ShardRecord]:
        return [r for r in self.records if r.status == "requested"]

    def link_free(self, now: float) -> float:
        return max([now] + [r.exp_end for r in self.inflight()])

    def expected_ready(self, j: int, now: float) -> float:
        r = self.records[j]
        route = self.routes.get(j)
        dec = route.decode_s if route else 0.0
        if r.status == "ready":
            return r.decode_end
        if r.status == "fetched":
            return max(now, min(self.decode_free)) + dec
        if r.status == "requested":
            return max(now, r.exp_end) + dec
        return math.inf

    def state(self, now: float) -> PipelineState:
        """The pipeline as the planner sees it now."""
        ready = {r.index: self.expected_ready(r.index, now) for r in self.records
                 if r.status in ("requested", "fetched", "ready") and r.index >= self.compute_at}
        return PipelineState(now=now, link_free=self.link_free(now),
                             decode_free=tuple(max(now, t) for t in self.decode_free),
                             compute_at=self.compute_at, compute_free=max(now, self.compute_free),
                             generator_at=self.generator_at, ready=ready)

    def plan(self, now: float, allow_local: bool = True, image_floor: bool = False) -> PlanResult:
        """The plan from now with the current estimates. image_floor: hold the summed image MSE of
        the streamed shards within the summed per-shard floors (what is already requested
        counts), instead of holding every shard to its own floor."""
        budget = None
        if image_floor and (total := image_budget(self.specs)) is not None:
            spent = sum(self.routes[r.index].image_mse for r in self.records
                        if r.index in self.routes and r.status in ("requested", "fetched", "ready")
                        and r.source in ("", self.routes[r.index].name))
            budget = max(0.0, total - spent)
        return plan_split(self.specs, self.state(now), ConstantLink(self.bytes_per_s()), self.rtt_s(),
                          allow_local=allow_local, mse_budget=budget)

    # ---------------------------------------------------------------------------- requesting
    def start(self, now: float) -> None:
        self.started = True
        self.policy.replan(self, now)

    def next_requests(self, now: float) -> tuple[list[tuple[int, Route]], float | None]:
        """Requests to issue now, and when to call again (None: at the next event)."""
        if not self.started:
            self.start(now)
        out: list[tuple[int, Route]] = []
        rtt = self.rtt_s()
        while len(self.inflight()) < self.max_inflight:
            lf = self.link_free(now)
            ahead = 1.5 * rtt + 1e-6  # issue the next one an RTT and a half before the link drains
            if self.inflight() and lf - now > ahead:
                return out, lf - ahead + 1e-9
            nxt = self.policy.next_fetch(self, now)
            if nxt is None:
                break
            j, route = nxt
            r = self.records[j]
            if r.status != "pending":
                raise RuntimeError(f"policy {self.policy.name} asked for shard {j} twice")
            start = max(lf, now + rtt)
            r.status, r.route, r.t_request = "requested", route.name, now
            r.exp_end = start + route.nbytes / self.timing_bytes_per_s()
            self.routes[j] = route
            out.append((j, route))
        return out, None

    # ---------------------------------------------------------------------------- link events
    def on_first_byte(self, j: int, t_request: float, t_first_byte: float) -> None:
        self.records[j].t_first_byte = t_first_byte
        self.rtt.observe(t_request, t_first_byte)

    def on_progress(self, j: int, remaining_bytes: int, now: float) -> None:
        """Bytes are arriving for shard j: refine when it will end; the link is alive."""
        r = self.records[j]
        if r.status == "requested":
            r.exp_end = now + remaining_bytes / self.timing_bytes_per_s()
        self.link_suspect = False

    def on_fetched(self, j: int, nbytes: int, now: float, *, sample_bytes: int, sample_s: float) -> float:
        """Shard j's last byte arrived at `now`. sample_*: the link-level throughput sample
        (bytes carried over first-byte-to-last-byte time). Returns the expected decode end."""
        r = self.records[j]
        r.status, r.fetch_end, r.nbytes = "fetched", now, nbytes
        self.link_suspect = False
        self.bw.observe(sample_bytes, sample_s)
        w = min(range(self.workers), key=lambda i: self.decode_free[i])
        self.decode_free[w] = max(now, self.decode_free[w]) + self.routes[j].decode_s
        self.policy.replan(self, now)
        return self.decode_free[w]

    def on_fetch_failed(self, j: int, error: str, now: float) -> None:
        r = self.records[j]
        if r.status in ("requested", "fetched"):
            r.status = "failed"
            r.note = error
            self.events.append(f"{now * 1000:.0f} ms: shard {j} fetch failed: {error}")

    def on_decoded(self, j: int, now: float) -> None:
        r = self.records[j]
        if r.status == "fetched":
            r.status, r.decode_end = "ready", now

    def on_decode_failed(self, j: int, error: str, now: float) -> None:
        r = self.records[j]
        r.status, r.note = "failed", error
        self.events.append(f"{now * 1000:.0f} ms: shard {j} decode failed: {error}")

    def to_cancel(self) -> list[int]:
        """Requests the executor should abort (their layer was computed locally)."""
        return [r.index for r in self.records if r.status == "cancelled" and r.t_request == r.t_request
                and r.fetch_end != r.fetch_end]

    # ---------------------------------------------------------------------------- the compute
    def at_layer(self, j: int, now: float) -> LayerAction:
        """The forward pass reached layer j at `now`."""
        r = self.records[j]
        r.needed = now
        self.compute_at = j
        if r.status == "ready":
            return self._use(j, now)
        if self.policy.prefers_local(self, j) or r.status in ("failed", "cancelled"):
            return self._local(j, now, "" if r.status == "pending" else r.status)
        e = self.expected_ready(j, now)
        local_cost = (j - self.generator_at + 1) * self.specs[j].local_s
        if r.status == "pending":
            # not requested yet (in-flight limit): when it would arrive if requested now
            route = self.policy_route(j)
            e = (max(self.link_free(now), now + self.rtt_s()) + route.nbytes / self.bytes_per_s() + route.decode_s
                 if route else math.inf)
        if self.policy.adaptive and (self.link_suspect or e - now >= local_cost):
            return self._local(j, now, "late" if r.status != "pending" else "")
        if not self.policy.adaptive:
            return LayerAction(WAIT)
        # Expected sooner than computing it: wait for about what the estimate says (twice it, or
        # it plus two RTTs), never longer than computing it would take. After a deadline passes
        # with no bytes since, the link is suspect and later layers go local at once, so a link
        # that dies costs one deadline, not one per layer.
        wait = max(2 * (e - now), (e - now) + 2 * self.rtt_s())
        return LayerAction(WAIT, deadline=now + min(local_cost, wait))

    def policy_route(self, j: int) -> Route | None:
        return self.routes.get(j) or getattr(self.policy, "routes", {}).get(j)

    def on_wait_expired(self, j: int, now: float) -> LayerAction:
        """The deadline passed and shard j is still not ready: compute it on the device."""
        self.link_suspect = True
        self.events.append(f"{now * 1000:.0f} ms: shard {j} late past its deadline; computing it locally")
        return self._local(j, now, "deadline")

    def on_ready_while_waiting(self, j: int, now: float) -> LayerAction:
        return self._use(j, now)

    def recheck(self, j: int, now: float) -> LayerAction | None:
        """The forward pass is waiting at layer j: has anything changed? USE if the shard is
        ready, LOCAL if it failed or the policy has since decided to compute it (CacheGen decides
        per chunk when the request is due, which can be after the forward pass got there), else
        None (keep waiting)."""
        r = self.records[j]
        if r.status == "ready":
            return self._use(j, now)
        if r.status in ("failed", "cancelled") or (r.status == "pending" and self.policy.prefers_local(self, j)):
            return self._local(j, now, r.status if r.status != "pending" else "")
        return None

    def _use(self, j: int, now: float) -> LayerAction:
        r = self.records[j]
        route = self.routes[j]
        r.source, r.image_mse, r.delivered = route.name, route.image_mse, max(now, r.decode_end)
        self.switched = True
        self.compute_free = r.delivered + self.specs[j].compute_s
        return LayerAction(USE)

    def _local(self, j: int, now: float, why: str) -> LayerAction:
        r = self.records[j]
        if r.status in ("requested", "fetched"):
            r.status = "cancelled"
        catch_up = j - self.generator_at + 1
        if catch_up > 1:
            self.events.append(f"{now * 1000:.0f} ms: layer {j} computed on the device "
                               f"(catching up {catch_up} template layers{', ' + why if why else ''})")
        self.generator_at = j + 1
        r.source, r.image_mse = LOCAL, 0.0
        r.local_s = catch_up * self.specs[j].local_s  # planned; executors overwrite with measured
        self.compute_free = now + r.local_s + self.specs[j].compute_s
        if why:
            r.note = r.note or why
        return LayerAction(LOCAL, catch_up=catch_up)

    # ---------------------------------------------------------------------------- report
    def image_mse(self) -> float:
        return sum(r.image_mse for r in self.records if r.source not in ("", LOCAL))

    def image_psnr_db(self) -> float:
        return psnr_from_mse(self.image_mse())


# ================================================================================ policies


@dataclass
class SakuraPolicy:
    """sakura: the plan that finishes soonest within the quality floor (`plan_split`),
    re-planned after every shard; layers below the split are computed on the way up while the
    rest stream in consumption order; a late shard is computed instead (adaptive).

    floor: "image" (default): the image's summed MSE may not exceed what CacheGen level 3 on
    every shard would give (the sum of the per-shard floors); "shard": every shard on its own.
    The image floor lets the ladder spend bits where the image needs them (its rate allocation)
    and lets locally computed layers (exact) leave room for the others.
    """

    name: str = "sakura"
    adaptive: bool = True
    floor: str = "image"
    k: int = 0
    routes: dict[int, Route] = field(default_factory=dict)
    last_plan: PlanResult | None = None

    def replan(self, d: EditDriver, now: float) -> None:
        if self.floor not in ("image", "shard"):
            raise ValueError(f"floor must be 'image' or 'shard', got {self.floor!r}")
        res = d.plan(now, image_floor=self.floor == "image")
        self.k, self.routes, self.last_plan = res.k, dict(res.routes), res

    def next_fetch(self, d: EditDriver, now: float) -> tuple[int, Route] | None:
        for j in range(max(self.k, d.compute_at), d.L):
            if d.records[j].status == "pending" and d.records[j].source == "" and j in self.routes:
                return j, self.routes[j]
        return None

    def prefers_local(self, d: EditDriver, j: int) -> bool:
        return j < self.k


@dataclass
class MeetInMiddlePolicy:
    """Compute from the first layer up while streaming from the last layer down; they meet
    wherever the real link lets them, with no bandwidth prediction needed for the split. Each
    shard takes the best admissible rendition that the link can deliver faster than the phone
    computes the layer (else the smallest). Once a fetched layer is used, every layer above it
    was requested earlier, so the rest streams."""

    name: str = "sakura-meet"
    adaptive: bool = True
    routes: dict[int, Route] = field(default_factory=dict)

    def replan(self, d: EditDriver, now: float) -> None:
        pass

    def next_fetch(self, d: EditDriver, now: float) -> tuple[int, Route] | None:
        for j in range(d.L - 1, d.compute_at - 1, -1):
            if d.records[j].status == "pending" and d.records[j].source == "":
                adm = d.specs[j].admissible()
                if not adm:
                    return None
                bw = d.bytes_per_s()
                fits = [r for r in adm if r.nbytes / bw + r.decode_s / d.workers <= d.specs[j].local_s]
                route = fits[0] if fits else min(adm, key=lambda r: r.nbytes)
                self.routes[j] = route
                return j, route
        return None

    def prefers_local(self, d: EditDriver, j: int) -> bool:
        return not d.switched


@dataclass
class FixedPolicy:
    """Every shard as the named rendition, in consumption order (raw-stream: "lossless")."""

    rendition: str
    name: str = "raw-stream"
    adaptive: bool = False

    def replan(self, d, now):
        pass

    def next_fetch(self, d, now):
        for j in range(d.L):
            if d.records[j].status == "pending":
                for r in d.specs[j].routes:
                    if r.name == self.rendition:
                        return j, r
                raise KeyError(f"shard {j} has no rendition {self.rendition!r}; has {[r.name for r in d.specs[j].routes]}")
        return None

    def prefers_local(self, d, j):
        return False


@dataclass
class CacheGenPolicy:
    """CacheGen's streaming adaptation, adapted to DiT template KV, with the same overlapped
    fetching and decode workers as sakura.

    Per chunk (a layer), in order, when its request is due: the remaining latency target is split
    evenly over the remaining chunks, and the highest quality level whose predicted time fits the
    share is fetched (transfer at the estimated rate + decode on one worker, + an RTT if the link
    is idle). If none fits, the chunk is recomputed — for template KV only while every earlier
    chunk was recomputed too (a prefix) — else the lowest level is fetched.

    levels: rendition names from best to worst quality (CacheGen's levels 3..1).
    target_s: the latency target (default in the harness: computing the template on the phone).
    """

    levels: tuple[str, ...]
    target_s: float
    name: str = "cachegen"
    adaptive: bool = False
    local: set = field(default_factory=set)
    t0: float | None = None

    def replan(self, d, now):
        if self.t0 is None:
            self.t0 = now

    def next_fetch(self, d, now):
        t0 = self.t0 if self.t0 is not None else now
        for j in range(d.L):
            rec = d.records[j]
            if rec.status != "pending" or j in self.local:
                continue
            by_name = {r.name: r for r in d.specs[j].routes}
            missing = [n for n in self.levels if n not in by_name]
            if missing:
                raise KeyError(f"shard {j} lacks CacheGen levels {missing}")
            remaining = d.L - j
            share = max(self.target_s - (now - t0), 0.0) / remaining
            bw = d.bytes_per_s()
            idle = 0.0 if d.inflight() else d.rtt_s()
            for n in self.levels:
                r = by_name[n]
                if r.nbytes / bw + r.decode_s + idle <= share:
                    return j, r
            if all(i in self.local for i in range(j)):
                self.local.add(j)
                continue
            return j, by_name[self.levels[-1]]
        return None

    def prefers_local(self, d, j):
        return j in self.local
