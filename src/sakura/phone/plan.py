"""How a template's KV reaches the forward pass: the pipeline model and the planners. Pure.

The edit's first denoising step consumes template KV layer by layer (later steps reuse it). Each
layer's KV comes by one *route*: a fetched rendition (link -> decode worker -> forward pass) or
local compute. Resources, each modelled as the runtime runs them:

* **link**: requests are issued ahead (several in flight), so bytes flow back to back; only a
  request issued to an *idle* link waits a round trip before its first byte:
  ``start = max(link_free, t_request + rtt)``, ``end = link.deliver(start, nbytes)``. One transfer
  at a time, lowest layer first among the requests not yet started (`PipelineState.queued`): a
  lower shard is not queued behind higher ones (the driver gives those back and requests them
  again after it, `driver.LOWER_FIRST`); a transfer under way is not interrupted.
* **decode pool**: ``workers`` identical workers; a shard goes to the first free one.
* **compute**: serial. Layer j's forward compute (``compute_s``) starts when the compute unit is
  free and layer j's KV is ready; waiting is a *stall*.
* **local generator**: computes template layers in order from the template image (a template
  layer needs the hidden state entering it). It sits at layer ``g``; producing layer j locally
  costs ``(j - g + 1) * local_s`` (catching up over skipped layers) and leaves it at j + 1. So a
  local prefix costs ``local_s`` per layer, and a late fallback after streamed layers costs the
  catch-up — always possible, since the template image is on the phone.

A *plan* is a split ``k`` (layers < k local, on the way up) and a route for each layer >= k
that is not already in flight. `plan_split` searches plans with the current estimates;
`evaluate` plays one through the model. Nothing here reads a clock: every decision is testable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

from sakura.util.psnr import psnr_db  # noqa: F401  (re-exported: sakura.phone.psnr_db)

LOCAL = "local"
#: Seconds of score per second of predicted stall (0: latency only). Tried at 0.5 and 1 on the phone
#: profile's LTE/3G/broadband traces, hoping plans with slack would ride out a varying link: no
#: fewer losing runs and no more gain than 0 (what bounds the loss is the wait deadline), so 0.
STALL_WEIGHT = 0.0


@dataclass(frozen=True)
class Route:
    """One way to obtain a shard's KV.

    name: rendition name (``layered:...#2``, ``cachegen:level=3``) or ``LOCAL``.
    nbytes: bytes on the wire (0 for local).
    decode_s: seconds on one decode worker.
    image_mse: expected contribution to the output image's MSE vs the lossless-KV output
        (pixels in [0, 1]; measured at build time with only this shard degraded). 0 = exact.
    """

    name: str
    nbytes: int = 0
    decode_s: float = 0.0
    image_mse: float = 0.0

    @property
    def is_local(self) -> bool:
        return self.name == LOCAL


@dataclass(frozen=True)
class ShardSpec:
    """One layer's shard in consumption order.

    routes: fetchable renditions. compute_s: the layer's forward compute in the first step
    (live tokens; seconds). local_s: computing this template layer on the phone (seconds).
    floor_mse: quality floor, the largest image_mse a route may have (None: no floor known).
    """

    routes: tuple[Route, ...]
    compute_s: float
    local_s: float
    floor_mse: float | None = None

    def admissible(self) -> tuple[Route, ...]:
        """Routes within the quality floor, best quality first (then fewest bytes)."""
        ok = [r for r in self.routes if self.floor_mse is None or r.image_mse <= self.floor_mse * (1 + 1e-9)]
        return tuple(sorted(ok, key=lambda r: (r.image_mse, r.nbytes)))


class LinkModel(Protocol):
    def deliver(self, t_start: float, nbytes: int) -> float:
        """When the last of `nbytes` has arrived if they start flowing at `t_start` (seconds)."""


@dataclass(frozen=True)
class ConstantLink:
    """A link of fixed rate (bytes/s)."""

    bytes_per_s: float

    def __post_init__(self) -> None:
        if not self.bytes_per_s > 0:
            raise ValueError(f"bytes_per_s must be > 0, got {self.bytes_per_s}")

    def deliver(self, t_start: float, nbytes: int) -> float:
        return t_start + nbytes / self.bytes_per_s


@dataclass(frozen=True)
class TraceLink:
    """A measured trace (`sakura.emulation.Trace`) replayed from `offset_s`: the link's capacity at
    plan time t is the trace's at offset_s + t."""

    trace: object
    offset_s: float = 0.0

    def deliver(self, t_start: float, nbytes: int) -> float:
        if nbytes <= 0:
            return t_start
        t = self.offset_s + max(0.0, t_start)
        return self.trace.time_at(self.trace.cumulative(t) + nbytes) - self.offset_s  # type: ignore[attr-defined]


@dataclass(frozen=True)
class PipelineState:
    """Where the pipeline stands (seconds on the plan's clock).

    now: the decision time. link_free: when the link has carried everything requested so far.
    decode_free: when each decode worker is next free. compute_at: the next layer the forward
    pass will process, at compute_free. generator_at: next layer the local generator computes.
    ready: expected KV-ready time of shards already requested (layer -> seconds).
    queued: requests not started yet (layer -> (route, t_request)): the plan orders them by layer
        with its new requests after ``link_free`` (the end of the transfers under way); one placed
        behind a new request is requested again then (its start: now + rtt at the earliest).
    """

    now: float = 0.0
    link_free: float = 0.0
    decode_free: tuple[float, ...] = (0.0,)
    compute_at: int = 0
    compute_free: float = 0.0
    generator_at: int = 0
    ready: Mapping[int, float] = field(default_factory=dict)
    queued: Mapping[int, tuple["Route", float]] = field(default_factory=dict)


@dataclass
class PlanResult:
    """A plan played through the pipeline model."""

    k: int
    routes: dict[int, Route]
    finish_s: float            # when the first step's forward pass leaves the last layer
    stall_s: float
    image_mse: float           # sum over streamed shards (errors of different layers add, to first order)
    nbytes: int
    ready: dict[int, float]    # expected ready time per streamed shard
    local_layers: int

    @property
    def image_psnr_db(self) -> float:
        return psnr_db(self.image_mse)



def evaluate(specs: Sequence[ShardSpec], state: PipelineState, k: int, routes: Mapping[int, Route],
             link: LinkModel, rtt_s: float, *, hedged: bool = False) -> PlanResult:
    """Play a plan: layers in [compute_at, k) local, the rest streamed. Shards already in
    `state.ready` keep their times; every other streamed layer needs a route in `routes`
    (requested now, in layer order). Returns finish time, stall, bytes and quality.

    hedged: while the forward pass waits for a shard and the local generator is behind it, the
    generator computes template layers (the driver's ADVANCE) while the shard is at least one
    template layer away; the rest is waited. `stall_s` then counts only waits with the generator
    caught up (what spends the loss bound's slack: a wait with the generator behind can always be
    one more template layer instead). Each hedge step lowers later catch-ups by its cost."""
    L = len(specs)
    ready = dict(state.ready)
    link_free = state.link_free
    workers = sorted(state.decode_free)
    nbytes, mse = 0, 0.0
    behind = False  # a new request went ahead of the queued ones: they are requested again
    for j in range(min(max(k, state.compute_at), min(state.queued, default=L)), L):
        if j in ready:
            continue
        if j in state.queued:  # on the link in layer order, whether or not the plan uses it
            r, t_req = state.queued[j]
            start = max(link_free, (state.now if behind else t_req) + rtt_s)
        else:
            if j < k:
                continue
            r = routes.get(j)
            if r is None or r.is_local:
                raise ValueError(f"layer {j} is to be streamed but has no fetch route")
            start = max(link_free, state.now + rtt_s)
            behind = True
            nbytes += r.nbytes
        end = link.deliver(start, r.nbytes)
        link_free = end
        w = workers[0]
        done = max(end, w) + r.decode_s
        workers[0] = done
        workers.sort()
        ready[j] = done
    t, stall, g, n_local = state.compute_free, 0.0, state.generator_at, 0
    for j in range(state.compute_at, L):
        spec = specs[j]
        if j < k:
            t += (j - g + 1) * spec.local_s + spec.compute_s
            g = j + 1
            n_local += 1
            continue
        r_t = ready[j]
        while hedged and g < j and r_t - t >= specs[g].local_s:
            t += specs[g].local_s
            g += 1
        if r_t > t:
            if not (hedged and g < j):  # a shorter wait with the generator behind could be one more
                stall += r_t - t        # template layer instead, so it need not spend slack
            t = r_t
        t += spec.compute_s
        if j in routes:
            mse += routes[j].image_mse
    return PlanResult(k, {j: r for j, r in routes.items() if j >= k}, t, stall, mse, nbytes,
                      {j: v for j, v in ready.items() if j >= k}, n_local)


def plan_split(specs: Sequence[ShardSpec], state: PipelineState, link: LinkModel, rtt_s: float, *,
               allow_local: bool = True, rel_tol: float = 0.01, mse_budget: float | None = None,
               stall_weight: float = STALL_WEIGHT, stall_budget: float | None = None,
               robust_link: LinkModel | None = None, hedged: bool = False,
               estimate_tol: float | None = None) -> PlanResult:
    """The plan that finishes soonest within the quality floor; among plans within `rel_tol` of
    that finish time, the best quality (lowest summed image MSE).

    Quality floor, two kinds: per shard (`ShardSpec.floor_mse`, when `mse_budget` is None), or
    for the image (`mse_budget`: the summed image MSE of the shards still to be requested may
    not exceed it; per-shard floors are then ignored, so bits go where the image needs them and
    layers computed locally leave their share to the others).

    Search: every split k (local below, streamed from k up) x every uniform quality rung for the
    streamed shards (rung i = each shard's i-th best route), made feasible under an image budget
    by greedy upgrades (largest MSE drop per extra byte first), then a pass that upgrades single
    shards, latest first (they have the most slack), while the finish time stays within
    tolerance. Shards without an admissible route can only be local.

    stall_budget: plans whose predicted stall exceeds it (seconds) are not taken (the runtime
    passes the slack its loss bound leaves, so it does not plan on waits it could not afford);
    computing everything left is always allowed.

    robust_link: a pessimistic link (e.g. the estimate x a share). Among the plans within
    `rel_tol` of the fastest on `link`, only those within `rel_tol` of the fastest *on this one*
    are kept, and an upgrade is taken only if it costs nothing on either: bytes that are free at
    the estimated rate still lengthen the window in which a falling link can make a shard late.
    hedged: plans are played with the driver's hedge (`evaluate(hedged=True)`).
    estimate_tol: with a robust link, how far (a share of the time left) behind the fastest at `link`
    a plan may be and still be a candidate for the robust choice (default `rel_tol`); the runtime
    widens it with the link's measured over-estimates (`EditDriver.estimate_tol`). Upgrades are then
    taken within it at `link` and within `rel_tol` at the robust link.
    """
    L = len(specs)
    lo = state.compute_at
    pending = [j for j in range(lo, L) if j not in state.ready and j not in state.queued]
    if mse_budget is None:
        adm = {j: specs[j].admissible() for j in pending}
    else:
        adm = {j: tuple(sorted(specs[j].routes, key=lambda r: (r.image_mse, r.nbytes))) for j in pending}
    # the split can't be above a shard that has no admissible route... only below it if local
    must_local_upto = max([j + 1 for j in pending if not adm[j]], default=lo)
    if must_local_upto > lo and not allow_local:
        raise ValueError("a shard has no rendition within its quality floor and local compute is not allowed")
    ks = range(max(lo, must_local_upto), L + 1) if allow_local else [lo]
    n_rungs = max((len(a) for a in adm.values()), default=1)
    candidates: list[PlanResult] = []
    for k in ks:
        for rung in range(max(1, n_rungs)):
            # rung 0 = best quality; higher rungs are cheaper (lists are best-first)
            routes = {j: adm[j][max(0, len(adm[j]) - 1 - rung)] for j in pending if j >= k}
            if mse_budget is not None and not _fit_budget(routes, adm, mse_budget):
                continue
            c = evaluate(specs, state, k, routes, link, rtt_s, hedged=hedged)
            if stall_budget is None or c.stall_s <= stall_budget * (1 + 1e-9) or k == L:
                candidates.append(c)
            if all(j < k for j in pending):
                break  # nothing to stream: rungs are all the same plan
    if not candidates:  # nothing streamed fits the image budget: compute what is left
        return evaluate(specs, state, L, {}, link, rtt_s, hedged=hedged)
    score = lambda c: c.finish_s + stall_weight * c.stall_s  # noqa: E731
    best_score = min(score(c) for c in candidates)
    budget_left = math.inf if mse_budget is None else mse_budget
    tol = rel_tol if robust_link is None or estimate_tol is None else estimate_tol
    limit = best_score + tol * max(best_score - state.now, 1e-9)
    near = [c for c in candidates if score(c) <= limit]
    robust = lambda c: evaluate(specs, state, c.k, c.routes, robust_link, rtt_s, hedged=hedged).finish_s  # noqa: E731
    limit_r = math.inf
    if robust_link is not None:
        fin_r = {id(c): robust(c) for c in near}
        best_r = min(fin_r.values())
        limit_r = best_r + rel_tol * max(best_r - state.now, 1e-9)
        near = [c for c in near if fin_r[id(c)] <= limit_r]
    best = min(near, key=lambda c: (c.image_mse, score(c), c.nbytes))
    # per-shard upgrades, latest layer first
    routes = dict(best.routes)
    for j in sorted(routes, reverse=True):
        for r in adm[j]:
            if r.image_mse >= routes[j].image_mse:
                break
            trial = dict(routes)
            trial[j] = r
            if sum(x.image_mse for x in trial.values()) > budget_left * (1 + 1e-9):
                continue
            res = evaluate(specs, state, best.k, trial, link, rtt_s, hedged=hedged)
            if score(res) <= limit and (stall_budget is None or res.stall_s <= max(stall_budget, best.stall_s)) \
                    and (robust_link is None or robust(res) <= limit_r):
                routes, best = trial, res
                break
    return best


def _fit_budget(routes: dict[int, Route], adm: Mapping[int, Sequence[Route]], budget: float) -> bool:
    """Upgrade routes in place (largest image-MSE drop per extra byte first) until their summed
    MSE is within `budget`; False if even the best routes do not fit."""
    total = sum(r.image_mse for r in routes.values())
    while total > budget * (1 + 1e-9):
        best_j, best_r, best_gain = None, None, -1.0
        for j, r in routes.items():
            better = [x for x in adm[j] if x.image_mse < r.image_mse]
            for x in better:
                gain = (r.image_mse - x.image_mse) / max(1, x.nbytes - r.nbytes)
                if gain > best_gain:
                    best_j, best_r, best_gain = j, x, gain
        if best_j is None:
            return False
        total += best_r.image_mse - routes[best_j].image_mse
        routes[best_j] = best_r
    return True


def offline_plan(specs: Sequence[ShardSpec], link: LinkModel, rtt_s: float, decode_workers: int = 1,
                 start: PipelineState | None = None, mse_budget: float | None = None) -> PlanResult:
    """The planner with perfect knowledge of the link (the real trace, not an estimate), run
    once before the edit: the reference that the online scheduler is measured against."""
    st = start or PipelineState(decode_free=(0.0,) * decode_workers)
    return plan_split(specs, st, link, rtt_s, mse_budget=mse_budget)


def image_budget(specs: Sequence[ShardSpec]) -> float | None:
    """The image-level quality floor: the summed per-shard floors (None if any is unknown)."""
    if any(s.floor_mse is None for s in specs):
        return None
    return sum(s.floor_mse for s in specs)  # type: ignore[misc]


def all_local_s(specs: Sequence[ShardSpec], state: PipelineState | None = None) -> float:
    """Finish time of the first step with every remaining layer computed locally."""
    st = state or PipelineState()
    return evaluate(specs, st, len(specs), {}, ConstantLink(1.0), 0.0).finish_s

