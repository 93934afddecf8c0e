"""Which rendition of each shard to fetch: a pure function of estimates, sizes and deadlines.

The edit's first denoising step consumes template KV layer by layer. Three resources work in
parallel, each serially: the link (fetches shards in consumption order), the decoder (rebuilds
K/V from a rendition) and the compute unit (runs the forward pass; it also computes template
layers locally when the plan says so). Layer i's forward compute starts when both the compute
unit is free and shard i's KV is ready; waiting is a *stall*.

Computing a shard locally ("local") is always possible but only as a prefix: a template layer can
only be computed from the template's hidden state entering it, i.e. after computing every earlier
template layer on the device. So local shards are 0..k-1 and the rest are fetched — which is
also the natural pipeline: compute the head while the tail streams in.

`simulate` plays a plan against a link (constant rate or a measured trace); `plan_next` is the
MPC step the runtime calls after every shard: enumerate the next `horizon` shards' options,
simulate each combination with the current bandwidth estimate — followed by a cheap tail policy
for the shards beyond the horizon, so a myopic choice that starves later layers is seen — and
take the first choice of the best combination (lowest finish time of the whole step +
distortion_weight_s x distortion, within the quality budget). Nothing here reads a clock, so
every decision is testable.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Sequence

LOCAL = "local"

# transfer(t_start_s, nbytes) -> t_end_s: when the last byte of a fetch that starts at t_start_s arrives.
Transfer = Callable[[float, int], float]


def constant_rate(bytes_per_s: float, rtt_s: float = 0.0) -> Transfer:
    """A link of fixed rate (bytes/s) with a per-request round trip (seconds)."""
    if not bytes_per_s > 0:
        raise ValueError(f"bytes_per_s must be > 0, got {bytes_per_s}")
    return lambda t, n: t + rtt_s + n / bytes_per_s


@dataclass(frozen=True)
class Option:
    """One way to obtain a shard's KV.

    name: rendition name ("lossless", "sakura-q2", ...) or LOCAL.
    nbytes: bytes on the wire (0 for local). decode_s: seconds to decode on the phone.
    distortion: expected distortion of the rendition (0 = exact). local_s: seconds of on-device
    compute to produce this shard's KV (local only).
    """

    name: str
    nbytes: int = 0
    decode_s: float = 0.0
    distortion: float = 0.0
    local_s: float = 0.0

    @property
    def is_local(self) -> bool:
        return self.name == LOCAL


@dataclass(frozen=True)
class ShardSpec:
    """A shard in consumption order: its fetchable renditions, its local option, and the forward
    compute (seconds) that layer needs once its KV is available."""

    options: tuple[Option, ...]
    compute_s: float
    local: Option | None = None

    def choices(self) -> tuple[Option, ...]:
        return self.options + ((self.local,) if self.local is not None else ())


@dataclass
class PipelineState:
    """When each resource is next free (seconds on the plan's clock)."""

    link_free: float = 0.0
    decode_free: float = 0.0
    compute_free: float = 0.0
    all_local_so_far: bool = True


@dataclass
class ShardTiming:
    option: str
    nbytes: int
    fetch_start: float
    fetch_end: float
    ready: float
    compute_start: float
    compute_end: float
    stall_s: float


@dataclass
class Timeline:
    shards: list[ShardTiming] = field(default_factory=list)

    @property
    def finish_s(self) -> float:
        return self.shards[-1].compute_end if self.shards else 0.0

    @property
    def stall_s(self) -> float:
        return sum(s.stall_s for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.nbytes for s in self.shards)


def step(state: PipelineState, spec: ShardSpec, choice: Option, transfer: Transfer) -> tuple[PipelineState, ShardTiming]:
    """Advance the pipeline by one shard. Pure: returns a new state and that shard's timing."""
    if choice.is_local:
        if not state.all_local_so_far:
            raise ValueError("local compute is only possible for a prefix of the shards")
        start = state.compute_free
        end = start + choice.local_s + spec.compute_s
        return (PipelineState(state.link_free, state.decode_free, end, True),
                ShardTiming(LOCAL, 0, start, start, start + choice.local_s, start + choice.local_s, end, 0.0))
    f0 = state.link_free
    f1 = transfer(f0, choice.nbytes)
    d0 = max(f1, state.decode_free)
    ready = d0 + choice.decode_s
    c0 = max(state.compute_free, ready)
    stall = max(0.0, ready - state.compute_free)
    c1 = c0 + spec.compute_s
    return (PipelineState(f1, ready, c1, False),
            ShardTiming(choice.name, choice.nbytes, f0, f1, ready, c0, c1, stall))


def simulate(specs: Sequence[ShardSpec], choices: Sequence[Option], transfer: Transfer,
             start: PipelineState | None = None) -> Timeline:
    """Play `choices` (one per shard, in order) through the pipeline."""
    if len(specs) != len(choices):
        raise ValueError(f"{len(specs)} shards but {len(choices)} choices")
    state = start or PipelineState()
    tl = Timeline()
    for spec, choice in zip(specs, choices):
        state, timing = step(state, spec, choice, transfer)
        tl.shards.append(timing)
    return tl


def plan_next(specs: Sequence[ShardSpec], state: PipelineState, bytes_per_s: float, *, rtt_s: float = 0.0,
              horizon: int = 3, max_distortion: float = float("inf"), distortion_weight_s: float = 0.0) -> Option:
    """Choose the next shard's option (specs[0] is the next shard; later ones are lookahead).

    Args:
        specs: the remaining shards in consumption order.
        state: when link, decoder and compute are next free (seconds, same clock as the plan).
        bytes_per_s: the bandwidth estimate to plan with (use the robust estimate).
        rtt_s: per-request round trip (seconds).
        horizon: how many shards to look ahead (exhaustive over their options).
        max_distortion: quality budget; renditions above it are never chosen (local always allowed).
        distortion_weight_s: seconds of latency one unit of distortion is worth (0: latency only,
            ties broken towards lower distortion).

    Returns:
        The chosen `Option` for specs[0].
    """
    if not specs:
        raise ValueError("no shards left to plan")
    transfer = constant_rate(bytes_per_s, rtt_s)
    window = list(specs[:max(1, horizon)])
    allowed = []
    for spec in window:
        opts = [o for o in spec.options if o.distortion <= max_distortion]
        if spec.local is not None:
            opts.append(spec.local)
        if not opts:
            raise ValueError("no rendition within the quality budget and no local option for a shard")
        allowed.append(opts)
    best, best_key = None, None
    for combo in itertools.product(*allowed):
        # prefix rule: once a shard is fetched, no later shard can be local
        if any(b.is_local and not all(c.is_local for c in combo[:i]) for i, b in enumerate(combo)):
            continue
        if combo[0].is_local and not state.all_local_so_far:
            continue
        s = state
        try:
            for spec, choice in zip(window, combo):
                s, _ = step(s, spec, choice, transfer)
        except ValueError:
            continue
        finish = _tail_finish(s, specs[len(window):], transfer, max_distortion)
        dist = sum(c.distortion for c in combo)
        key = (finish + distortion_weight_s * dist, dist, sum(c.nbytes for c in combo))
        if best_key is None or key < best_key:
            best, best_key = combo, key
    if best is None:
        raise ValueError("no feasible plan (a fetched shard cannot be followed by a local one)")
    return best[0]


def _tail_finish(state: PipelineState, tail: Sequence[ShardSpec], transfer: Transfer, max_distortion: float) -> float:
    """Finish time of the shards beyond the horizon under a simple policy: every shard fetched
    with the rendition that is ready soonest within the budget — or, while everything so far was
    local, the better of that and computing the whole tail locally."""
    if not tail:
        return state.compute_free

    def fetch_all(s: PipelineState) -> float:
        for spec in tail:
            opts = [o for o in spec.options if o.distortion <= max_distortion]
            if not opts:
                if spec.local is None or not s.all_local_so_far:
                    return float("inf")
                s, _ = step(s, spec, spec.local, transfer)
                continue
            best = min(opts, key=lambda o: step(s, spec, o, transfer)[1].ready)
            s, _ = step(s, spec, best, transfer)
        return s.compute_free

    finish = fetch_all(state)
    if state.all_local_so_far and all(spec.local is not None for spec in tail):
        s = state
        for spec in tail:
            s, _ = step(s, spec, spec.local, transfer)
        finish = min(finish, s.compute_free)
    return finish
