"""The edit's decision logic, shared by the live runtime and the simulator. No clock, no I/O.

An executor (``sakura.phone.live`` with sockets, threads and the real model; or
``sakura.phone.sim`` with a virtual clock, link and compute) reports events to an
`EditDriver` and carries out what it answers:

    executor                                  EditDriver (this module)
    --------                                  ------------------------
    next_requests(now)                  ->    [(layer, route)] to request now, and when to ask again
    on_first_byte / on_fetched / ...    ->    estimators, re-plan after every shard
    at_layer(j, now)                    ->    USE the fetched KV | LOCAL (compute it, catching the
                                              local generator up) | WAIT until a deadline
    on_wait_expired(j, now)             ->    LOCAL: the link is late; finish on the device

So both executors take the same decisions from the same inputs (tested on a constant-rate link),
and the policies (`sakura.phone.policies`) are the only place methods differ.

Requests are issued *ahead*: while requests are in flight, the next one is sent about one round
trip before the link would drain, so the link does not sit idle for an RTT between shards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import ClassVar, Protocol, Sequence

from .estimator import BandwidthEstimator, RttEstimator
from .plan import (LOCAL, ConstantLink, PipelineState, PlanResult, Route, ShardSpec, image_budget, plan_split,
                   psnr_db)


class ActionKind(str, Enum):
    """What the forward pass does at a layer (`LayerAction.kind`)."""

    USE = "use"            # use the fetched KV
    LOCAL = "local"        # compute the layer's template KV on the device, catching the generator up
    WAIT = "wait"          # wait for the shard until a deadline
    ADVANCE = "advance"    # run the local generator one template layer, then ask again (a hedge)


class ShardStatus(str, Enum):
    """Where a shard stands (`ShardRecord.status`)."""

    PENDING = "pending"
    REQUESTED = "requested"
    FETCHED = "fetched"       # its bytes are on the phone, decoding
    READY = "ready"           # decoded
    FAILED = "failed"
    CANCELLED = "cancelled"   # its layer was computed locally


class QualityFloor(str, Enum):
    """`SakuraPolicy.floor`: hold the image's summed MSE, or every shard, to CacheGen level 3."""

    IMAGE = "image"
    SHARD = "shard"


class PlanEstimate(str, Enum):
    """`SakuraPolicy.estimate`: plan on the RobustMPC-discounted estimate or the plain prediction."""

    ROBUST = "robust"
    PREDICT = "predict"


USE, WAIT, ADVANCE = ActionKind.USE, ActionKind.WAIT, ActionKind.ADVANCE
PENDING, REQUESTED, FETCHED, READY, FAILED, CANCELLED = ShardStatus
#: sakura's default loss bound e: never more than e slower than on-device (its whole latency), by
#: construction (`EditDriver.slack_s`, docs/runtime.md). Just inside the never-slower check's 2 %
#: tolerance: at e = 2 % exactly, runs that spend their whole slack ended at 1.0200000000000002 x
#: on-device (float rounding) and counted as losing runs.
LOSS_BOUND = 0.0199
#: what sakura's planner plans with by default ("robust" or "predict", see `SakuraPolicy`)
PLAN_ESTIMATE = PlanEstimate.ROBUST
#: the share of the loss bound's slack a plan may spend on predicted stalls (the rest absorbs
#: what the estimates miss)
PLAN_STALL_SHARE = 1.0
#: plans must also be within tolerance of the fastest on a link at this share of the estimate
#: (`plan_split(robust_link=...)`; None: off)
ROBUST_SHARE: float | None = 0.5
#: plans are played with the driver's hedge: a wait while the local generator is behind computes
#: template layers and spends no slack (`evaluate(hedged=True)`)
PLAN_HEDGE = True
#: with a robust link (`ROBUST_SHARE`), plans up to 1 % + this x the largest recent over-estimate of the
#: link (`BandwidthEstimator.max_error`) slower than the fastest at the estimate, at most `PLAN_TOL_MAX`,
#: are candidates for the robust choice: the more the link has fallen short of its prediction, the more
#: the planner gives at the estimate for a plan that holds at half of it (None: 1 %, as before)
PLAN_TOL_GAIN: float | None = 0.5
PLAN_TOL_MAX = 0.10
#: plan on at most the rate the transfers in flight allow (`EditDriver.inflight_bound_bps`)
BOUND_BY_INFLIGHT = True
#: re-plan before the next request when the rate the planner would use has fallen below this share
#: of the rate the current plan was made with (no transfer has completed to trigger it)
REPLAN_BELOW = 0.8
#: requests kept out until a transfer has measured the link (the estimate may be stale)
UNMEASURED_REQUESTS = 2
#: after a missed deadline, layers whose local compute catches up over at most this many template
#: layers go local at once; beyond it the layer waits (within its deadline and the loss bound)
SUSPECT_CATCH_UP = 1
#: a layer about to be computed with a catch-up whose shard was never requested is requested then
#: (the *rescue*) when the plan with it finishes sooner, at the plain prediction, than the plan with
#: the catch-up; the catch-up then runs one template layer at a time (ADVANCE) and the shard is used
#: if it comes first (`RescueJudge.pays`; policies opt in with `Policy.rescue`)
RESCUE = True
#: ... by at least this share of the time left
RESCUE_GAIN = 0.01
#: lower shards first: when a shard is requested while shards of higher layers are requested but
#: have not started to arrive (queued on the link behind the transfer under way), those are given
#: back (`EditDriver.to_cancel`: the executor aborts them) and requested again after it, so a lower
#: layer's shard never waits behind higher ones (issue 34; before, the link was first in, first
#: out, and a re-plan that moved the split down queued the layers it now streamed behind the ones
#: it had requested above them). The planner plans with the same order (`PipelineState.queued`).
#: Policies opt in with `Policy.lower_first`; False: first in, first out, as before (A/B)
LOWER_FIRST = True


@dataclass(frozen=True)
class LayerAction:
    """What the forward pass does at a layer: USE the fetched KV, compute it LOCAL (running the
    local generator over `catch_up` template layers), WAIT for the shard until `deadline`, or
    ADVANCE (run the local generator one template layer, then call `EditDriver.on_advanced`)."""

    kind: ActionKind
    deadline: float = math.inf
    catch_up: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", ActionKind(self.kind))


@dataclass
class ShardRecord:
    """What happened to one shard (seconds on the executor's clock, since the edit started)."""

    index: int
    route: str = ""                 # rendition requested ("" if never requested)
    source: str = ""                # how the forward pass got it: a rendition name or "local"
    nbytes: int = 0                 # bytes received for it (wasted if source is local)
    image_mse: float = 0.0          # expected image MSE contribution of the KV used
    status: ShardStatus = PENDING
    t_request: float = math.nan
    t_first_byte: float = math.nan
    fetch_end: float = math.nan
    decode_end: float = math.nan
    needed: float = math.nan        # when the forward pass reached this layer
    delivered: float = math.nan     # when it got the KV (after local compute, if local)
    local_s: float = 0.0            # on-device compute spent at this layer (incl. catch-up)
    exp_end: float = math.nan       # expected last byte (while in flight)
    exp_start: float = math.nan     # expected first byte (while in flight; `EditDriver.link_free`)
    remaining: int = 0              # bytes still to come (while in flight)
    first_chunk_bytes: int = 0      # bytes in the first chunk that arrived (they carry no duration)
    t_progress: float = math.nan    # when bytes last arrived
    note: str = ""

    def __post_init__(self) -> None:
        self.status = ShardStatus(self.status)

    @property
    def stall_s(self) -> float:
        if self.delivered != self.delivered or self.needed != self.needed:
            return 0.0
        return max(0.0, self.delivered - self.needed - self.local_s)


class Policy(Protocol):
    """Which shard to request next with which rendition, and which layers to compute locally.
    Everything the driver and the executors read off a policy is declared here (`PolicyDefaults`
    gives the defaults a policy need not set)."""

    name: str
    adaptive: bool                 # give up on a late shard and compute it (sakura); baselines wait
    loss_bound: float | None       # e of the loss bound (`EditDriver.slack_s`); None: no bound
    max_inflight: int | None       # most requests outstanding (None: the executor's limit)
    estimate: PlanEstimate         # what `EditDriver.bytes_per_s` plans with
    quality_scale: float           # the image floor's MSE budget x this
    robust_share: float | None     # plans must also be near-fastest on a link at this share of the estimate
    bound_by_inflight: bool        # plan on at most the rate that the transfers still in flight allow
    rescue: bool                   # request a dropped layer's shard when its catch-up starts (`RESCUE`)
    image_floor: bool              # the quality floor is the image's summed MSE (else every shard's own)
    lower_first: bool              # a lower shard's request goes ahead of queued higher ones (`LOWER_FIRST`)

    def replan(self, d: "EditDriver", now: float) -> None: ...

    def next_fetch(self, d: "EditDriver", now: float) -> tuple[int, Route] | None: ...

    def prefers_local(self, d: "EditDriver", j: int) -> bool: ...

    def planned_route(self, j: int) -> Route | None:
        """The rendition the policy would fetch for layer j if it were requested now (None: none)."""

    def fetches_nothing(self, d: "EditDriver") -> bool:
        """The current plan computes every layer on the device (the executor may then run the plain
        on-device edit)."""


class PolicyDefaults:
    """Defaults of the `Policy` contract (policies inherit them)."""

    loss_bound: ClassVar[float | None] = None
    max_inflight: ClassVar[int | None] = None
    estimate: ClassVar[PlanEstimate] = PlanEstimate.ROBUST
    quality_scale: ClassVar[float] = 1.0
    robust_share: ClassVar[float | None] = None
    bound_by_inflight: ClassVar[bool] = False
    rescue: ClassVar[bool] = False
    image_floor: ClassVar[bool] = False
    lower_first: ClassVar[bool] = False

    def planned_route(self, j: int) -> Route | None:
        return None

    def fetches_nothing(self, d: "EditDriver") -> bool:
        return False


class EditDriver:
    """Decisions for one edit's first denoising step. See the module docstring.

    Args:
        specs: one `ShardSpec` per layer, in consumption order.
        policy: a `Policy` (`policies.SakuraPolicy`, `MeetInMiddlePolicy`, `CacheGenPolicy`, `FixedPolicy`).
        bandwidth, rtt: the phone's estimators (kept across edits by a real app).
        decode_workers: decode pool size (the plan knows it).
        max_inflight: most requests outstanding at once.
        compute_start_s: when the forward pass is expected to reach layer 0 (work before the
            transformer, e.g. the text encoder, overlaps with fetching; the first plan knows it).
        other_s: the work of the edit outside the first step's transformer pass, which every method
            pays alike (text encoder and VAE encode before it, the later passes and the VAE decode
            after it): the loss bound's reference is on-device's whole latency (`slack_s`).
    """

    def __init__(self, specs: Sequence[ShardSpec], policy: Policy, *, bandwidth: BandwidthEstimator,
                 rtt: RttEstimator, decode_workers: int = 1, max_inflight: int = 8, compute_start_s: float = 0.0,
                 other_s: float = 0.0):
        if decode_workers < 1 or max_inflight < 1:
            raise ValueError("decode_workers and max_inflight must be >= 1")
        self.specs = list(specs)
        self.L = len(self.specs)
        self.policy = policy
        self.bw = bandwidth
        self.rtt = rtt
        self.workers = decode_workers
        self.other_s = other_s
        # a policy may fetch one chunk at a time (CacheGen as published)
        self.max_inflight = min(max_inflight, policy.max_inflight or max_inflight)
        self.records = [ShardRecord(j) for j in range(self.L)]
        self.events: list[str] = []
        self.routes: dict[int, Route] = {}
        self.generator_at = 0
        self.compute_at = 0
        self.compute_free = compute_start_s
        self.decode_free = [0.0] * decode_workers
        self.link_suspect = False    # a deadline passed with no bytes since: assume the link is gone
        self.switched = False        # some layer used fetched KV
        self.started = False
        # The loss bound (see `slack_s`): set when the forward pass reaches its first layer.
        self.t_bound: float | None = None
        self.waited_s = 0.0          # total time the forward pass waited on the link
        self.rescues: dict[int, Route] = {}  # layers whose catch-up asked for their shard (`RescueJudge.pays`)
        self.requeued: set[int] = set()  # queued requests given back for a lower one (`LOWER_FIRST`), not yet re-sent
        # the arithmetic beside the decisions, each a small object over the records above
        self.bound = LossBound(self)
        self.timeline = LinkTimeline(self)
        self.rescue_judge = RescueJudge(self)
        self.requests = RequestQueue(self)

    # ----------------------------------------------------------------------------- estimates
    def bytes_per_s(self) -> float:
        """The rate the planner plans with: the robust (discounted) estimate, or the plain
        prediction when the policy plans on it (`SakuraPolicy.estimate`)."""
        if self.policy.estimate == PlanEstimate.PREDICT:
            return self.bw.predict_bps() or 1e5
        return self.bw.robust_bps() or 1e5

    def slack_s(self, j: int, now: float) -> float:
        """How much longer than the fallback the forward pass may still take from layer j without
        breaking the loss bound (inf when the policy sets none): `LossBound.slack_s`."""
        return self.bound.slack_s(j, now)

    def inflight_bound_bps(self, now: float) -> float | None:
        """An upper bound on the link's rate from the transfers under way: `LinkTimeline.inflight_bound_bps`."""
        return self.timeline.inflight_bound_bps(now)

    def plan_bytes_per_s(self, now: float) -> float:
        """The rate the planner plans with at `now`: `bytes_per_s`, capped by what the transfers
        in flight prove (`inflight_bound_bps`) when the policy asks for it."""
        rate = self.bytes_per_s()
        if self.policy.bound_by_inflight:
            cap = self.timeline.inflight_bound_bps(now)
            if cap is not None:
                rate = min(rate, cap)
        return rate

    def timing_bytes_per_s(self) -> float:
        """The rate used to time requests issued ahead: the undiscounted prediction. Erring fast
        only sends a request a little early; erring slow leaves the link idle."""
        return self.bw.predict_bps() or 1e5

    def rtt_s(self) -> float:
        return self.rtt.rtt_s()

    def inflight(self) -> list[ShardRecord]:
        return [r for r in self.records if r.status == REQUESTED]

    def state(self, now: float) -> PipelineState:
        """The pipeline as the planner sees it now. With `Policy.lower_first`, requests that have
        not started are `queued` (the plan orders them by layer with its new requests) and
        `link_free` is when the transfers under way end."""
        nxt = self.next_layer()
        link_free = self.timeline.link_free(now)  # also refreshes the in-flight transfers' expected ends
        queued = ({r.index: (self.routes[r.index], r.t_request) for r in self.inflight() if self.timeline.queued(r, now)}
                  if self.policy.lower_first else {})
        ready = {r.index: self.timeline.expected_ready(r.index, now) for r in self.records
                 if r.status in (FETCHED, READY) and r.index >= nxt}
        # shards in flight queue for the decode workers behind the fetched ones, in arrival order
        workers = sorted(max(now, t) for t in self.decode_free)
        for r in sorted(self.inflight(), key=lambda r: r.exp_end):
            if r.index in queued:
                continue
            done = max(workers[0], now, r.exp_end) + self.routes[r.index].decode_s
            workers[0] = done
            workers.sort()
            if r.index >= nxt:
                ready[r.index] = done
        if queued:
            link_free = max([now] + [r.exp_end for r in self.inflight() if r.index not in queued])
        return PipelineState(now=now, link_free=link_free, decode_free=tuple(workers),
                             compute_at=nxt, compute_free=max(now, self.compute_free),
                             generator_at=self.generator_at, ready=ready, queued=queued)

    def next_layer(self) -> int:
        """The next layer whose KV source is not decided yet (the forward pass reaches it at
        compute_free): the layer it stands at if it is still waiting there, else the one after."""
        return self.compute_at + (self.records[self.compute_at].source != "")

    def plan(self, now: float, allow_local: bool = True, image_floor: bool = False) -> PlanResult:
        """The plan from now with the current estimates. image_floor: hold the summed image MSE of
        the streamed shards within the summed per-shard floors (what is already requested
        counts), instead of holding every shard to its own floor."""
        budget = self.image_budget_left() if image_floor else None
        stall_budget = None
        if self.t_bound is not None:
            # the slack at the next layer the forward pass will reach, when it reaches it
            nxt = self.next_layer()
            if nxt < self.L:
                at = max(now, self.compute_free)
                finish, decode_wait, _ = self.bound.fallback_finish(nxt, at)
                stall_budget = max(0.0, self.t_bound - finish) + decode_wait
            else:
                stall_budget = 0.0
        elif self.policy.loss_bound is not None:
            w0 = self.bound.worst_remaining_s(self.next_layer())
            stall_budget = self.policy.loss_bound * (w0 + self.other_s)
        if stall_budget is not None:
            stall_budget = None if PLAN_STALL_SHARE is None else stall_budget * PLAN_STALL_SHARE
        rate = self.plan_bytes_per_s(now)
        share = self.policy.robust_share
        return plan_split(self.specs, self.state(now), ConstantLink(rate), self.rtt_s(),
                          allow_local=allow_local, mse_budget=budget, stall_budget=stall_budget,
                          robust_link=ConstantLink(rate * share) if share else None, hedged=PLAN_HEDGE,
                          estimate_tol=self.estimate_tol())

    def estimate_tol(self) -> float | None:
        """How much slower at the estimate than the fastest a plan may be and still be the robust
        choice (`plan_split(estimate_tol=)`): 1 % plus `PLAN_TOL_GAIN` x the largest recent relative
        over-estimate of the link, capped at `PLAN_TOL_MAX` (None: the planner's 1 %). A link that
        keeps its predictions (errors ~0) is planned as before; one that has fallen short of them is
        planned more for the half rate (docs/notes/runtime-history.md, evaluation7)."""
        if PLAN_TOL_GAIN is None:
            return None
        return min(PLAN_TOL_MAX, 0.01 + PLAN_TOL_GAIN * self.bw.max_error())

    def image_budget_left(self) -> float | None:
        """The image floor's MSE budget (x the policy's quality_scale) less what the shards
        requested so far spend (None: no floor known)."""
        if (total := image_budget(self.specs)) is None:
            return None
        spent = sum(self.routes[r.index].image_mse for r in self.records
                    if r.index in self.routes and r.status in (REQUESTED, FETCHED, READY)
                    and r.source in ("", self.routes[r.index].name))
        return max(0.0, total - spent) * self.policy.quality_scale

    # ---------------------------------------------------------------------------- requesting
    def start(self, now: float) -> None:
        self.started = True
        self.policy.replan(self, now)

    def next_requests(self, now: float) -> tuple[list[tuple[int, Route]], float | None]:
        """Requests to issue now, and when to call again (None: at the next event): `RequestQueue.next`."""
        return self.requests.next(now)

    def to_cancel(self) -> list[int]:
        """Requests the executor should abort: `RequestQueue.to_cancel`."""
        return self.requests.to_cancel()

    # ---------------------------------------------------------------------------- link events
    def on_first_byte(self, j: int, t_request: float, t_first_byte: float) -> None:
        self.records[j].t_first_byte = t_first_byte
        self.rtt.observe(t_request, t_first_byte)

    def on_progress(self, j: int, remaining_bytes: int, now: float) -> None:
        """Bytes are arriving for shard j: refine when it will end; the link is alive."""
        r = self.records[j]
        if r.status == REQUESTED:
            r.remaining, r.t_progress = remaining_bytes, now
            if r.t_first_byte != r.t_first_byte:
                r.t_first_byte = now
            if not r.first_chunk_bytes:
                r.first_chunk_bytes = self.routes[j].nbytes - remaining_bytes
        self.link_suspect = False

    def on_fetched(self, j: int, nbytes: int, now: float, *, sample_bytes: int, sample_s: float) -> float:
        """Shard j's last byte arrived at `now`. sample_*: the link-level throughput sample
        (bytes carried over first-byte-to-last-byte time). Returns the expected decode end."""
        r = self.records[j]
        r.status, r.fetch_end, r.nbytes = FETCHED, now, nbytes
        self.link_suspect = False
        self.bw.observe(sample_bytes, sample_s)
        w = min(range(self.workers), key=lambda i: self.decode_free[i])
        self.decode_free[w] = max(now, self.decode_free[w]) + self.routes[j].decode_s
        r.decode_end = self.decode_free[w]  # expected; on_decoded records the real end
        self.policy.replan(self, now)
        return self.decode_free[w]

    def on_fetch_failed(self, j: int, error: str, now: float) -> None:
        r = self.records[j]
        if r.status in (REQUESTED, FETCHED):
            r.status = FAILED
            r.note = error
            self.events.append(f"{now * 1000:.0f} ms: shard {j} fetch failed: {error}")

    def on_decoded(self, j: int, now: float) -> None:
        r = self.records[j]
        if r.status == FETCHED:
            r.status, r.decode_end = READY, now

    def on_decode_failed(self, j: int, error: str, now: float) -> None:
        r = self.records[j]
        r.status, r.note = FAILED, error
        self.events.append(f"{now * 1000:.0f} ms: shard {j} decode failed: {error}")

    # ---------------------------------------------------------------------------- the compute
    def at_layer(self, j: int, now: float) -> LayerAction:
        """The forward pass reached layer j at `now`."""
        r = self.records[j]
        r.needed = now
        self.compute_at = j
        bound = self.policy.loss_bound
        if self.t_bound is None and bound is not None and self.policy.adaptive:
            w0 = self.bound.worst_remaining_s(j)
            self.t_bound = now + w0 + bound * (w0 + self.other_s)
        return self._decide(j, now)

    def on_advanced(self, j: int, now: float) -> LayerAction:
        """The local generator finished the template layer an ADVANCE asked for; the forward pass
        is still at layer j: decide again."""
        return self._decide(j, now)

    def _decide(self, j: int, now: float) -> LayerAction:
        r = self.records[j]
        if r.status == READY:
            return self._use(j, now)
        certain = r.status == FETCHED  # its bytes are on the phone: the fallback waits for its decode
        if r.status in (FAILED, CANCELLED):
            return self._local(j, now, ShardStatus(r.status).value)
        # a shard being decoded is computed instead only if that is sooner than its decode and
        # keeps the loss bound
        if self.policy.prefers_local(self, j) and (
                not certain or ((j - self.generator_at + 1) * self.specs[j].local_s < r.decode_end - now
                                and self.bound.keeps_local(j, now))):
            return self._go_local(j, now, "" if r.status == PENDING else ShardStatus(r.status).value)
        self.timeline.link_free(now)  # refresh the in-flight transfers' expected ends
        e = self.timeline.expected_ready(j, now)
        local_cost = (j - self.generator_at + 1) * self.specs[j].local_s
        if r.status == PENDING:
            # not requested yet (in-flight limit): when it would arrive if requested now
            route = self.policy_route(j)
            e = (max(self.timeline.link_free(now), now + self.rtt_s()) + route.nbytes / self.plan_bytes_per_s(now) + route.decode_s
                 if route else math.inf)
        slack = self.bound.slack_s(j, now)
        # waiting on a shard being decoded costs no slack when the fallback itself waits for it
        certain = certain and (self.t_bound is None or self.bound.fallback_finish(j, now)[2])
        # A suspect link sends a layer local at once only when that is cheap (no catch-up): after
        # streamed layers, computing costs the whole catch-up, and the loss bound already caps
        # what waiting on a dead link can cost.
        suspect = self.link_suspect and (j - self.generator_at + 1 <= SUSPECT_CATCH_UP) and not certain
        if self.policy.adaptive and ((suspect or e - now >= local_cost) and self.bound.keeps_local(j, now)
                                     or (slack <= 0 and not certain)):
            return self._go_local(j, now, ("late" if r.status != PENDING else "") if slack > 0 or certain
                                  else "loss bound")
        if not self.policy.adaptive:
            return LayerAction(WAIT)
        # The hedge: the shard is not expected before the local generator (behind the forward
        # pass) could compute its next template layer, so compute that layer meanwhile instead of
        # waiting idle. It spends no slack (the fallback would compute it), and a late shard then
        # costs a shorter catch-up.
        if r.status == REQUESTED and self.generator_at < j and e - now >= self.specs[self.generator_at].local_s \
                and self.bound.keeps_advance(j, now):
            return self._advance(j, now, "hedge")
        # Expected sooner than computing it: wait for about what the estimate says (twice it, or
        # it plus two RTTs), never longer than computing it would take. After a deadline passes
        # with no bytes since, the link is suspect and later layers go local at once, so a link
        # that dies costs one deadline, not one per layer.
        # The loss bound caps every wait at the slack left (see `slack_s`).
        wait = max(2 * (e - now), (e - now) + 2 * self.rtt_s())
        cap = (e - now) + max(0.0, slack) if certain else slack
        return LayerAction(WAIT, deadline=now + min(local_cost, wait, cap))

    def _go_local(self, j: int, now: float, why: str) -> LayerAction:
        """Layer j is to be computed on the device. If its shard may still come (requested or
        decoding) and the generator is behind, catch up one template layer at a time (ADVANCE)
        and use the shard if it is ready by then: never later than LOCAL, and within the bound."""
        if self.records[j].status in (REQUESTED, FETCHED) and self.generator_at < j \
                and self.bound.keeps_advance(j, now):
            return self._advance(j, now, why)
        if self.records[j].status == PENDING and self.generator_at < j and self.bound.keeps_advance(j, now) \
                and (j in self.rescues or self.rescue_judge.pays(j, now)):
            return self._advance(j, now, "rescue" + (", " + why if why else ""))
        return self._local(j, now, why)

    def _advance(self, j: int, now: float, why: str) -> LayerAction:
        r = self.records[j]
        g = self.generator_at
        self.generator_at = g + 1
        dt = self.specs[g].local_s
        r.local_s += dt  # planned; executors overwrite with measured
        self.compute_free = now + dt
        self.events.append(f"{now * 1000:.0f} ms: layer {j} waits on its shard; the local generator computes "
                           f"template layer {g} meanwhile{' (' + why + ')' if why else ''}")
        return LayerAction(ADVANCE, catch_up=1)

    def _observe_unfinished(self, r: ShardRecord, now: float) -> None:
        """Shard r is given up while its transfer is under way: what it had not delivered by now is
        a sample too (an upper bound on the rate: `BandwidthEstimator.observe_bound`), else a link
        that collapsed mid-transfer would leave the estimate where it was."""
        if r.t_first_byte == r.t_first_byte and r.t_first_byte < now:
            self.bw.observe_bound(self.timeline.received_bytes(r), now - r.t_first_byte)

    def policy_route(self, j: int) -> Route | None:
        return self.routes.get(j) or self.policy.planned_route(j)

    def on_wait_expired(self, j: int, now: float) -> LayerAction:
        """The deadline passed and shard j is still not ready: compute it on the device, unless
        its bytes have arrived meanwhile and the loss bound's fallback now waits for its decode
        (then WAIT again, until the decode ends plus the slack)."""
        r = self.records[j]
        if r.status == READY:
            return self._use(j, now)
        if r.status == FETCHED and self.t_bound is not None:
            fin, _, uses = self.bound.fallback_finish(j, now)
            if uses and fin <= self.t_bound:
                return LayerAction(WAIT, deadline=max(now, r.decode_end) + (self.t_bound - fin) + 1e-9)
        self.link_suspect = True
        self.events.append(f"{now * 1000:.0f} ms: shard {j} late past its deadline; computing it locally")
        return self._go_local(j, now, "deadline")

    def on_ready_while_waiting(self, j: int, now: float) -> LayerAction:
        return self._use(j, now)

    def recheck(self, j: int, now: float) -> LayerAction | None:
        """The forward pass is waiting at layer j: has anything changed? USE if the shard is
        ready, LOCAL if it failed or the policy has since decided to compute it (CacheGen decides
        per chunk when the request is due, which can be after the forward pass got there), else
        None (keep waiting)."""
        r = self.records[j]
        if r.status == READY:
            return self._use(j, now)
        if r.status in (FAILED, CANCELLED) or (r.status == PENDING and self.policy.prefers_local(self, j)):
            return self._local(j, now, ShardStatus(r.status).value if r.status != PENDING else "")
        return None

    def _use(self, j: int, now: float) -> LayerAction:
        r = self.records[j]
        route = self.routes[j]
        r.source, r.image_mse, r.delivered = route.name, route.image_mse, max(now, r.decode_end)
        if r.needed == r.needed:
            self.waited_s += max(0.0, r.delivered - r.needed)
        self.switched = True
        self.compute_free = r.delivered + self.specs[j].compute_s
        return LayerAction(USE)

    def _local(self, j: int, now: float, why: str) -> LayerAction:
        r = self.records[j]
        if r.needed == r.needed:
            self.waited_s += max(0.0, now - r.needed)
        if r.status == REQUESTED and self.policy.bound_by_inflight:
            self._observe_unfinished(r, now)
        if r.status in (REQUESTED, FETCHED):
            r.status = CANCELLED
        catch_up = j - self.generator_at + 1
        if catch_up > 1:
            self.events.append(f"{now * 1000:.0f} ms: layer {j} computed on the device "
                               f"(catching up {catch_up} template layers{', ' + why if why else ''})")
        self.generator_at = j + 1
        r.source, r.image_mse = LOCAL, 0.0
        r.local_s += catch_up * self.specs[j].local_s  # planned; executors overwrite with measured
        self.compute_free = now + catch_up * self.specs[j].local_s + self.specs[j].compute_s
        if why:
            r.note = r.note or why
        return LayerAction(LOCAL, catch_up=catch_up)

    # ---------------------------------------------------------------------------- report
    def image_mse(self) -> float:
        return sum(r.image_mse for r in self.records if r.source not in ("", LOCAL))

    def image_psnr_db(self) -> float:
        return psnr_db(self.image_mse())



class LossBound:
    """The loss bound's arithmetic for one `EditDriver` (see `slack_s`): what the first step costs
    from a layer if the device computes the rest (`worst_remaining_s`), when it ends if no more
    bytes arrive (`fallback_finish`), and whether computing a layer (LOCAL) or one more template
    layer of the generator (ADVANCE) keeps the bound. Reads the driver's records; changes nothing."""

    def __init__(self, driver: "EditDriver"):
        self.d = driver
        # local_s summed over specs[:k]: fallback_finish's catch-ups read it in O(1) (the profile
        # calls fallback_finish at every decision while it waits, O(L^2) each)
        self.local_before = [0.0]
        for sp in driver.specs:
            self.local_before.append(self.local_before[-1] + sp.local_s)

    def worst_remaining_s(self, j: int) -> float:
        """What finishing the first step from layer j costs if every layer from j on is computed
        on the device: each layer's forward compute, and every template layer the local
        generator has not produced yet (it catches up over fetched layers)."""
        d = self.d
        return (sum(s.compute_s for s in d.specs[j:])
                + sum(s.local_s for s in d.specs[d.generator_at:]))

    def fallback_finish(self, j: int, now: float, *, local_first: bool = False) -> tuple[float, float, bool]:
        """The first step's end if no more bytes arrive, from the forward pass at layer j at `now`:
        the best over m (the last layer computed on the device, or none) of: layers <= m use a
        shard already decoded by then, else are computed locally (catching the generator up);
        layers > m use the shards on the phone (fetched or decoded) when their decode ends, so m
        must cover every layer whose bytes are not here. More bytes, or earlier decodes, can only
        make it sooner. Returns (finish, its wait on decodes, whether it uses layer j's shard).
        local_first: layer j is computed locally whatever its shard."""
        d = self.d
        here = {i: (r.decode_end if r.decode_end == r.decode_end else now) for i, r in enumerate(d.records)
                if i >= j and r.status in (FETCHED, READY) and not (local_first and i == j)}
        must = max([i for i in range(j, d.L) if i not in here] + [j - 1])
        best = (math.inf, 0.0, False)
        for m in range(must, d.L):
            t, g, waited, uses = now, d.generator_at, 0.0, False
            for i in range(j, d.L):
                if i > m or (i in here and here[i] <= t):
                    waited += max(0.0, here[i] - t)
                    t = max(t, here[i]) + d.specs[i].compute_s
                    uses = uses or i == j
                else:
                    t += (self.local_before[i + 1] - self.local_before[g]) + d.specs[i].compute_s
                    g = i + 1
            if t < best[0]:
                best = (t, waited, uses)
        return best

    def slack_s(self, j: int, now: float) -> float:
        """How much longer than the fallback the forward pass may still take from layer j without
        breaking the loss bound (inf when the policy sets none): t_bound - `fallback_finish`.

        The bound: the first step ends by t_bound = t0 + W0 + e x (W0 + other_s), W0 = the on-device
        first step (`worst_remaining_s(0)`), t0 = when the forward pass reached layer 0, e = the
        policy's `loss_bound`, other_s = the rest of the edit (every method pays it alike), so the
        edit ends within e x on-device's whole latency of on-device's. Invariant:
        the fallback from where the pass stands (use what is on the phone, compute the rest)
        ends by t_bound. It holds at layer 0 (the fallback is at most on-device); bytes that arrive
        only make the fallback sooner; a wait on a shard that is not on the phone ends by a
        deadline at most the slack; a wait on one being decoded is the fallback's own; LOCAL and
        ADVANCE are taken only where the fallback from after them still ends in time (ADVANCE, one
        template layer of the generator, is the first step of a fallback that computes layer j,
        so it spends no slack). So the edit is never more than e slower than on-device
        (docs/runtime.md)."""
        d = self.d
        if d.t_bound is None:
            return math.inf
        return d.t_bound - self.fallback_finish(j, now)[0]

    def keeps_local(self, j: int, now: float) -> bool:
        d = self.d
        return d.t_bound is None or self.fallback_finish(j, now, local_first=True)[0] <= d.t_bound + 1e-9

    def keeps_advance(self, j: int, now: float) -> bool:
        """Does the fallback from after one more template layer of the generator still end by t_bound?"""
        d = self.d
        if d.t_bound is None:
            return True
        g = d.generator_at
        d.generator_at = g + 1
        try:
            fin = self.fallback_finish(j, now + d.specs[g].local_s)[0]
        finally:
            d.generator_at = g
        return fin <= d.t_bound + 1e-9


class LinkTimeline:
    """When the link will have carried what is requested, and when each shard is expected to be
    ready, for one `EditDriver`: the transfers in flight replayed first in, first out with the
    current estimates (`link_free`, which refreshes each record's ``exp_start``/``exp_end``), and
    the most the link can be carrying given what they have received (`inflight_bound_bps`)."""

    def __init__(self, driver: "EditDriver"):
        self.d = driver

    def inflight_bound_bps(self, now: float) -> float | None:
        """An upper bound on the link's rate (bytes/s) from the transfers under way, or None.

        From the first byte of the oldest transfer still in flight (t_a) to now the link was never
        idle (that transfer had bytes to send) and carried only bytes of the transfers in flight
        (at most what each has received: all of it unless progress says less) and of those that
        ended since t_a. So rate <= those bytes / (now - t_a). No sample says this: the estimator
        learns from completed transfers, and a link that collapses mid-transfer completes none, so
        the plan kept requesting at the rate of before (phone profile: a 131 Mbit/s prior on a
        25 Mbit/s link, every shard late). Sound on a first-in-first-out link (the planner's and the
        simulator's model). Live, transfers share the link: one given up (aborted) during the window
        carried bytes that are not counted, so after a cancellation the bound can read low (more
        cautious plans; the loss bound does not depend on the rate, so it still holds)."""
        d = self.d
        started = [r for r in d.inflight() if r.t_first_byte == r.t_first_byte and r.t_first_byte < now]
        if not started:
            return None
        t_a = min(r.t_first_byte for r in started)
        if now - t_a < max(d.rtt_s(), 1e-3):
            return None
        carried = sum(self.received_bytes(r) for r in started)
        carried += sum(r.nbytes for r in d.records if r.fetch_end == r.fetch_end and r.fetch_end > t_a)
        return max(carried, 1) / (now - t_a)

    def link_free(self, now: float) -> float:
        """When the link will have carried everything requested (seconds). The requests in flight
        are replayed first in, first out with the current estimate, or with the rate the transfers
        under way are measuring (all of them together: they share the link) if that is faster, so
        a stale estimate does not hold the next request back; a request that has not started yet
        starts one RTT after it went out at the earliest. Refreshes every `exp_end`."""
        d = self.d
        rate, rtt = d.timing_bytes_per_s(), d.rtt_s()
        infl = sorted(d.inflight(), key=lambda r: r.t_request)
        recv = [r for r in infl if r.t_progress == r.t_progress and r.t_progress <= now]
        if recv:
            got = sum(d.routes[r.index].nbytes - r.remaining for r in recv)
            el = max(r.t_progress for r in recv) - min(r.t_first_byte for r in recv)
            if el > 2e-3 and got > 0:
                rate = max(rate, got / el)
        t = -math.inf
        for r in infl:
            nbytes = d.routes[r.index].nbytes
            if r in recv:
                r.exp_start = r.t_first_byte
                end = max(t, r.t_progress) + r.remaining / rate
            elif r.t_first_byte == r.t_first_byte and r.t_first_byte <= now:  # started (no progress reports)
                r.exp_start = r.t_first_byte
                end = max(t, r.t_first_byte) + nbytes / rate
            else:
                r.exp_start = max(t, r.t_request + rtt)
                end = r.exp_start + nbytes / rate
            r.exp_end = max(now, end)
            t = r.exp_end
        return max(now, t)

    def expected_ready(self, j: int, now: float) -> float:
        d = self.d
        r = d.records[j]
        route = d.routes.get(j)
        dec = route.decode_s if route else 0.0
        if r.status == READY:
            return r.decode_end
        if r.status == FETCHED:
            return max(now, r.decode_end)  # the decode end expected when it was queued
        if r.status == REQUESTED:
            return max(now, r.exp_end) + dec
        return math.inf

    def queued(self, r: ShardRecord, now: float) -> bool:
        """A request waiting behind the transfers under way, that a request sent now could go
        ahead of: no byte of it has reached the phone by `now` (live: no chunk yet; the simulator
        knows when its transfer starts) and it is not expected to start within a round trip (a
        request sent now could not start sooner: giving it back would only idle the link).
        Fresh after `link_free`, which sets `exp_start`."""
        d = self.d
        if r.status != REQUESTED or r.t_first_byte <= now:
            return False
        start = r.t_first_byte if r.t_first_byte == r.t_first_byte else r.exp_start
        return not start <= now + d.rtt_s()

    def received_bytes(self, r: ShardRecord) -> int:
        """Bytes of shard r's transfer received so far: all of it unless progress says less."""
        d = self.d
        nbytes = d.routes[r.index].nbytes
        return nbytes - r.remaining if r.t_progress == r.t_progress else nbytes


class RescueJudge:
    """Whether a layer about to be computed with a catch-up should have its never-requested shard
    fetched meanwhile (`pays`, the *rescue*), and which rendition (`route`)."""

    def __init__(self, driver: "EditDriver"):
        self.d = driver

    def pays(self, j: int, now: float) -> bool:
        """Layer j is to be computed with a catch-up (the generator is behind it) and its shard was
        never requested (a re-plan dropped it, or the in-flight limit held it back). The *rescue*:
        request it now and run the catch-up one template layer at a time (ADVANCE: the work LOCAL
        would do, in the same order, so no slack is spent), using the shard if it comes first.
        The generator computes every template layer up to the last layer computed on the device, so
        sparing layer j's catch-up pays only if the layers above it stream too, and the rescue's
        bytes delay the shards requested after it. So the planner judges it: the plan from the
        rescue (shard j behind the transfers in flight, the generator where it is, every layer from
        j streamed, played with the hedge) must finish sooner than the plan from LOCAL (layer j
        computed with its catch-up, any split above), both at the plain prediction (an optimistic
        bet: what it risks is link time, not compute or slack). Records the rescue (issued by the
        next `next_requests`); False if it does not pay."""
        d = self.d
        if not (RESCUE and d.policy.rescue and d.policy.adaptive) or d.records[j].source != "" \
                or d.link_suspect:  # a deadline passed with no bytes since: no bet on the link
            return False
        route = self.route(j)
        if route is None:
            return False
        base = d.state(now)
        if base.compute_at != j:
            return False
        # at the plain prediction: at the planner's own (robust) rate the rescue never pays, since that
        # rate is what dropped the layer (measured on the profile's losers: no rescue taken)
        g, rtt, rate = d.generator_at, d.rtt_s(), d.timing_bytes_per_s()
        budget = d.image_budget_left() if d.policy.image_floor else None
        done_local = base.now + (d.bound.local_before[j + 1] - d.bound.local_before[g]) + d.specs[j].compute_s
        st_local = PipelineState(now=now, link_free=base.link_free, decode_free=base.decode_free, compute_at=j + 1,
                                 compute_free=done_local, generator_at=j + 1,
                                 ready={i: t for i, t in base.ready.items() if i > j})
        end = max(base.link_free, now + rtt) + route.nbytes / rate
        workers = sorted(base.decode_free)
        workers[0] = max(end, workers[0]) + route.decode_s
        st_rescue = PipelineState(now=now, link_free=end, decode_free=tuple(sorted(workers)), compute_at=j,
                                  compute_free=base.compute_free, generator_at=g,
                                  ready={**base.ready, j: workers[0]})
        kw = dict(hedged=True)
        fin_local = plan_split(d.specs, st_local, ConstantLink(rate), rtt, mse_budget=budget, **kw).finish_s \
            if j + 1 < d.L else done_local
        try:
            fin_rescue = plan_split(d.specs, st_rescue, ConstantLink(rate), rtt, allow_local=False,
                                    mse_budget=None if budget is None else max(0.0, budget - route.image_mse),
                                    **kw).finish_s
        except ValueError:  # a layer above has no rendition within its floor: it must be computed
            return False
        if not fin_rescue < fin_local - RESCUE_GAIN * max(fin_local - now, 0.0):
            return False
        d.rescues[j] = route
        d.events.append(f"{now * 1000:.0f} ms: layer {j} needs a {j - g + 1}-layer catch-up; requesting its "
                           f"shard meanwhile (the rescue: planned finish {fin_rescue * 1000:.0f} ms, "
                           f"{fin_local * 1000:.0f} ms with the catch-up)")
        return True

    def route(self, j: int) -> Route | None:
        """The route a rescue fetches for layer j: the policy's own if it has one, else the fewest
        bytes within the floor (what is left of the image floor, as the probe)."""
        d = self.d
        route = d.policy.planned_route(j)
        if route is not None and not route.is_local:
            return route
        if not d.policy.image_floor:
            routes = list(d.specs[j].admissible())
        else:
            left = d.image_budget_left()
            routes = [x for x in d.specs[j].routes if left is None or x.image_mse <= left * (1 + 1e-9)]
        return min(routes, key=lambda x: x.nbytes) if routes else None



class RequestQueue:
    """What one `EditDriver` asks the link for: the requests to send now and when to ask again
    (`next`: rescues first, then the policy's choices within the in-flight limit, each an RTT and a
    half before the link drains), a lower shard put ahead of queued ones (`issue`, `give_back`), and
    the transfers the executor should abort (`to_cancel`)."""

    def __init__(self, driver: "EditDriver"):
        self.d = driver

    def next(self, now: float) -> tuple[list[tuple[int, Route]], float | None]:
        """Requests to issue now, and when to call again (None: at the next event)."""
        d = self.d
        if not d.started:
            d.start(now)
        out: list[tuple[int, Route]] = []
        rtt = d.rtt_s()
        for j, route in d.rescues.items():  # at once, whatever the in-flight limit: its catch-up has begun
            if d.records[j].status == PENDING and d.records[j].source == "":
                out.append((j, self.issue(j, route, now)))
        while len(d.inflight()) < d.max_inflight:
            lf = d.timeline.link_free(now)
            ahead = 1.5 * rtt + 1e-6  # issue the next one an RTT and a half before the link drains
            # until a transfer has measured the link, keep two requests out: the estimate may be
            # stale (another network), and a second request costs nothing if it is right
            unmeasured = d.bw.samples == 0 and len(d.inflight()) < UNMEASURED_REQUESTS
            gated = bool(d.inflight()) and lf - now > ahead and not unmeasured
            # requests given back for a lower shard are sent again at once, behind it: they were
            # already queued, and waiting for the issue-ahead time would leave the link to the
            # estimate's errors (a link slower than predicted idles between them)
            owed = max((i for i in d.requeued if d.records[i].status == PENDING), default=-1)
            if gated and owed < 0:
                return out, lf - ahead + 1e-9
            nxt = d.policy.next_fetch(d, now)
            if nxt is None:
                break
            j, route = nxt
            if gated and j > owed:
                return out, lf - ahead + 1e-9
            if d.records[j].status != PENDING:
                raise RuntimeError(f"policy {d.policy.name} asked for shard {j} twice")
            out.append((j, self.issue(j, route, now)))
        return out, None

    def issue(self, j: int, route: Route, now: float) -> Route:
        d = self.d
        if d.policy.lower_first and any(q.status == REQUESTED for q in d.records[j + 1:]):
            d.timeline.link_free(now)  # fresh expected starts
            for q in d.records[j + 1:]:
                if d.timeline.queued(q, now):
                    self.give_back(q, now)
        d.requeued.discard(j)
        r = d.records[j]
        start = max(d.timeline.link_free(now), now + d.rtt_s())
        r.status, r.route, r.t_request = REQUESTED, route.name, now
        r.exp_start, r.exp_end = start, start + route.nbytes / d.timing_bytes_per_s()
        r.remaining = route.nbytes
        d.routes[j] = route
        return route

    def give_back(self, r: ShardRecord, now: float) -> None:
        """Give back a request that has not started (a lower shard goes ahead of it): pending
        again, its transfer aborted by the executor (`to_cancel`), requested again by the policy."""
        d = self.d
        d.events.append(f"{now * 1000:.0f} ms: shard {r.index} given back, behind a lower one")
        r.status, r.route = PENDING, ""
        r.t_request = r.t_first_byte = r.exp_end = r.t_progress = math.nan
        r.remaining = r.first_chunk_bytes = 0
        d.routes.pop(r.index, None)
        d.requeued.add(r.index)

    def to_cancel(self) -> list[int]:
        """Requests the executor should abort: their layer was computed locally, or they were
        given back for a lower shard (`LOWER_FIRST`; a request sent again later is a new one)."""
        d = self.d
        return [r.index for r in d.records if (r.status == CANCELLED and r.t_request == r.t_request
                                                   and r.fetch_end != r.fetch_end)
                or (r.index in d.requeued and r.status == PENDING)]
