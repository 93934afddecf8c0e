"""The streaming policies and their one registry: which shard to request next with which
rendition, and which layers to compute on the device (the `Policy` contract the `EditDriver` reads,
`driver.Policy`). Every command and benchmark that names a streaming method ("sakura",
"cachegen-L3", ...) builds its policy here (`make_policy`), so a name means one thing everywhere.

    SakuraPolicy        sakura: the plan that finishes soonest within the quality floor, re-planned
    MeetInMiddlePolicy  sakura-meet: compute up from layer 0 while streaming down from the top
    FixedPolicy         raw-stream: every shard as one rendition ("lossless")
    CacheGenPolicy      cachegen / cachegen-fair: CacheGen's per-chunk level choice

Policies hold per-edit state: `make_policy` returns a fresh object each call. Their defaults read
the driver's module constants when a policy is made (`driver.LOSS_BOUND`, ...), so a test or a
sweep that sets one there reaches every policy made after.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from . import driver as D
from .driver import PENDING, EditDriver, PlanEstimate, Policy, PolicyDefaults, QualityFloor
from .plan import PlanResult, Route

@dataclass
class SakuraPolicy(PolicyDefaults):
    """sakura: the plan that finishes soonest within the quality floor (`plan_split`),
    re-planned after every shard; layers below the split are computed on the way up while the
    rest stream in consumption order; a late shard is computed instead (adaptive).

    floor: "image" (default): the image's summed MSE may not exceed what CacheGen level 3 on
    every shard would give (the sum of the per-shard floors); "shard": every shard on its own.
    The image floor lets the ladder spend bits where the image needs them (its rate allocation)
    and lets locally computed layers (exact) leave room for the others.

    quality_scale: the image floor's MSE budget x this (1: CacheGen-L3 on every shard; the
    benchmarks sweep it for the latency-quality frontier).
    loss_bound: e, the most the edit may be slower than on-device: every wait on the link is
    capped by the slack this leaves, and plans that predict more stall than the slack are not
    taken (`EditDriver.slack_s`; None: no bound, waits capped only by the catch-up cost).
    estimate: what the planner plans with: "robust" (the RobustMPC-discounted estimate) or
    "predict" (the undiscounted prediction; the loss bound then limits what a miss can cost).
    """

    name: str = "sakura"
    adaptive: bool = True
    floor: QualityFloor = QualityFloor.IMAGE
    quality_scale: float = 1.0
    loss_bound: float | None = field(default_factory=lambda: D.LOSS_BOUND)
    estimate: PlanEstimate = field(default_factory=lambda: D.PLAN_ESTIMATE)
    probe_idle_link: bool = True
    rescue: bool = True
    robust_share: float | None = field(default_factory=lambda: D.ROBUST_SHARE)
    bound_by_inflight: bool = field(default_factory=lambda: D.BOUND_BY_INFLIGHT)
    lower_first: bool = field(default_factory=lambda: D.LOWER_FIRST)
    k: int = 0
    routes: dict[int, Route] = field(default_factory=dict)
    last_plan: PlanResult | None = None
    planned_bps: float | None = None   # the rate the current plan was made with

    def __post_init__(self) -> None:
        try:
            self.floor = QualityFloor(self.floor)
            self.estimate = PlanEstimate(self.estimate)
        except ValueError as e:
            raise ValueError(f"SakuraPolicy: {e} (floor: 'image' or 'shard'; estimate: 'robust' or 'predict')") from None
        if self.loss_bound is not None and not self.loss_bound >= 0:
            raise ValueError(f"SakuraPolicy: loss_bound must be >= 0 or None, got {self.loss_bound!r}")
        if not self.quality_scale > 0:
            raise ValueError(f"SakuraPolicy: quality_scale must be > 0, got {self.quality_scale!r}")

    @property
    def image_floor(self) -> bool:  # type: ignore[override]
        return self.floor == QualityFloor.IMAGE

    def replan(self, d: EditDriver, now: float) -> None:
        res = d.plan(now, image_floor=self.image_floor)
        self.k, self.routes, self.last_plan = res.k, dict(res.routes), res
        self.planned_bps = d.plan_bytes_per_s(now)

    def planned_route(self, j: int) -> Route | None:
        return self.routes.get(j)

    def fetches_nothing(self, d: EditDriver) -> bool:
        return self.k >= d.L

    def next_fetch(self, d: EditDriver, now: float) -> tuple[int, Route] | None:
        if self.bound_by_inflight and self.planned_bps is not None \
                and d.plan_bytes_per_s(now) < D.REPLAN_BELOW * self.planned_bps:
            self.replan(d, now)  # the transfers under way prove the link slower than the plan assumed
        for j in range(max(self.k, d.compute_at), d.L):
            if d.records[j].status == PENDING and d.records[j].source == "" and j in self.routes:
                return j, self.routes[j]
        return self.probe(d) if self.probe_idle_link else None

    def probe(self, d: EditDriver) -> tuple[int, Route] | None:
        """With nothing in flight and a plan that fetches nothing more, fetch one shard anyway:
        the latest layer not yet requested (the most time to arrive), at its fewest bytes within
        the floor. A plan that computes everything locally measures nothing, so an estimate that
        a slow start (or a dead first seconds) pushed down never recovers; the probe is used if it
        is ready in time (`EditDriver.at_layer` uses any ready shard) and costs only an idle link."""
        if d.inflight():
            return None
        left = d.image_budget_left() if self.floor == QualityFloor.IMAGE else None
        for j in range(d.L - 1, d.next_layer(), -1):
            r = d.records[j]
            if r.status != PENDING or r.source != "":
                continue
            routes = (d.specs[j].admissible() if self.floor == QualityFloor.SHARD
                      else [x for x in d.specs[j].routes if left is None or x.image_mse <= left * (1 + 1e-9)])
            return (j, min(routes, key=lambda x: x.nbytes)) if routes else None
        return None

    def prefers_local(self, d: EditDriver, j: int) -> bool:
        return j < self.k  # a probe below the split is still used if it is ready in time


@dataclass
class MeetInMiddlePolicy(PolicyDefaults):
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
            if d.records[j].status == PENDING and d.records[j].source == "":
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

    def planned_route(self, j: int) -> Route | None:
        return self.routes.get(j)


@dataclass
class FixedPolicy(PolicyDefaults):
    """Every shard as the named rendition, in consumption order (raw-stream: "lossless")."""

    rendition: str
    name: str = "raw-stream"
    adaptive: bool = False

    def replan(self, d, now):
        pass

    def next_fetch(self, d, now):
        for j in range(d.L):
            if d.records[j].status == PENDING:
                for r in d.specs[j].routes:
                    if r.name == self.rendition:
                        return j, r
                raise KeyError(f"shard {j} has no rendition {self.rendition!r}; has {[r.name for r in d.specs[j].routes]}")
        return None

    def prefers_local(self, d, j):
        return False


@dataclass
class CacheGenPolicy(PolicyDefaults):
    """CacheGen's streaming adaptation (Liu et al., SIGCOMM 2024, section 5.3), adapted to DiT
    template KV (a chunk = one layer's KV).

    Per chunk, in order, when its request is due: the latency target left is split evenly over
    the chunks left, and the first level (best quality first) whose transfer fits that share is
    fetched; if none fits, the chunk is recomputed on the device (the local generator catches
    up over fetched layers, so any chunk can be). Two variants:

    * ``published=True`` (name ``cachegen``): the rule as published: the fit test is bytes x 8 /
      bandwidth against the share, and chunks are fetched one at a time (the next request goes
      out when the previous chunk has arrived).
    * ``published=False`` (name ``cachegen-fair``, ours): the same overlapped fetching as sakura
      (several requests in flight), and a fit test that also counts decoding on one worker and
      an RTT when the link is idle; a chunk is recomputed only while every earlier chunk was
      (a prefix), else the lowest level is fetched.

    Both get the same decode workers as sakura. Both wait for a chunk they fetch (no fallback).

    levels: rendition names from best to worst quality (CacheGen's levels 3..1); the benchmarks
    cap the levels (e.g. level 3 only: CacheGen held to its level-3 quality, else recompute).
    target_s: the latency target (default in the harness: computing the template on the phone).
    """

    levels: tuple[str, ...]
    target_s: float
    published: bool = False
    name: str = ""
    adaptive: bool = False
    local: set = field(default_factory=set)
    t0: float | None = None

    def __post_init__(self) -> None:
        if not self.levels:
            raise ValueError("CacheGenPolicy needs at least one level")
        if not self.name:
            self.name = "cachegen" if self.published else "cachegen-fair"

    @property
    def max_inflight(self) -> int | None:
        return 1 if self.published else None

    def replan(self, d, now):
        if self.t0 is None:
            self.t0 = now

    def next_fetch(self, d, now):
        t0 = self.t0 if self.t0 is not None else now
        for j in range(d.L):
            rec = d.records[j]
            if rec.status != PENDING or j in self.local:
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
                cost = r.nbytes / bw if self.published else r.nbytes / bw + r.decode_s + idle
                if cost <= share:
                    return j, r
            if self.published or all(i in self.local for i in range(j)):
                self.local.add(j)
                continue
            return j, by_name[self.levels[-1]]
        return None

    def prefers_local(self, d, j):
        return j in self.local


# ================================================================================ the registry

#: CacheGen's quality levels as renditions, best first (the build's default ladder has them).
CACHEGEN_LEVELS = ("cachegen:level=3", "cachegen:level=2", "cachegen:level=1")
#: The same levels with delta coding across tokens (CacheGen's own variant), where a ladder has them.
CACHEGEN_DELTA_LEVELS = tuple(f"{lv},delta=true" for lv in CACHEGEN_LEVELS)


def _cachegen(method: str) -> Callable[..., Policy]:
    def make(*, target_s: float | None = None, cachegen_levels: Sequence[str] = CACHEGEN_LEVELS, **kw: Any) -> Policy:
        if target_s is None:
            raise ValueError(f"policy {method!r} needs target_s (CacheGen's latency target, seconds: the time to "
                             f"compute the template on the device)")
        levels = tuple(cachegen_levels)[:1] if method.endswith("-L3") else tuple(cachegen_levels)
        return CacheGenPolicy(levels, target_s=target_s, published="fair" not in method, name=method, **kw)
    return make


def _no_target(cls: Callable[..., Policy]) -> Callable[..., Policy]:
    def make(*, target_s: float | None = None, cachegen_levels: Sequence[str] = CACHEGEN_LEVELS, **kw: Any) -> Policy:
        return cls(**kw)
    return make


#: method name -> factory(target_s=, cachegen_levels=, **policy options)
POLICIES: dict[str, Callable[..., Policy]] = {
    "sakura": _no_target(SakuraPolicy),
    "sakura-meet": _no_target(MeetInMiddlePolicy),
    "raw-stream": _no_target(lambda **kw: FixedPolicy("lossless", name="raw-stream", **kw)),
    "cachegen": _cachegen("cachegen"),          # CacheGen as published: per-chunk choice vs an even split
    "cachegen-fair": _cachegen("cachegen-fair"),  # our fairer variant (docs/runtime.md)
    "cachegen-L3": _cachegen("cachegen-L3"),      # held to level 3, its best quality
    "cachegen-fair-L3": _cachegen("cachegen-fair-L3"),
}

#: Methods a phone app offers (`sakura edit --policy`): the others are benchmark baselines.
EDIT_POLICIES = ("sakura", "sakura-meet", "raw-stream")


def make_policy(method: str, *, target_s: float | None = None, cachegen_levels: Sequence[str] = CACHEGEN_LEVELS,
                **options: Any) -> Policy:
    """A fresh policy for ``method`` (one of `POLICIES`).

    target_s: CacheGen's latency target in seconds (required by the cachegen methods, ignored by
        the others). cachegen_levels: the CacheGen renditions to choose among, best first.
    options: the policy class's own parameters (e.g. ``SakuraPolicy(quality_scale=...)``).
    Raises ValueError naming the known methods for an unknown one."""
    if method not in POLICIES:
        raise ValueError(f"unknown policy {method!r}; one of {', '.join(POLICIES)}")
    return POLICIES[method](target_s=target_s, cachegen_levels=cachegen_levels, **options)
