"""The simulated executor: the same `EditDriver` as the live runtime, on a virtual clock, link,
decode pool and compute unit (discrete events). Used by the phone-profile benchmark.

The link is first in, first out with one round trip before the first byte of a request to an
idle link (`sakura.phone.plan`). A request the driver cancels (`EditDriver.to_cancel`: its layer
was computed on the device) is aborted as the live runtime aborts it: the fetch stage cancels the
fetch's task (`runtime.live.FetchStage`, `for j in driver.to_cancel(): t.cancel()`) and the client
then closes its connection at once (`client.TemplateClient`: "Cancel a fetch by cancelling its
task: the connection is closed at once"). So the transfer leaves the link when it is cancelled (a
transfer not yet started never takes it) and the transfers queued behind it move up. A request the
driver gives back for a lower shard (`driver.LOWER_FIRST`: it had not started) is aborted the same way
and, requested again, queues behind that shard, so the link carries one transfer at a time, the lowest
layer first among those not started, as the planner assumes (`plan.PipelineState.queued`). Compute is serial: layer j's
forward compute starts when the compute unit is free and the driver has answered USE or LOCAL.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Sequence

from .driver import ADVANCE, READY, REQUESTED, USE, WAIT, EditDriver, LayerAction, Policy, ShardRecord
from .estimator import BandwidthEstimator, RttEstimator
from .plan import LinkModel, ShardSpec

#: abort a cancelled transfer as the live runtime does (False: the previous, conservative model that
#: kept it on the link to its end; for A/B and the regression test only)
ABORT_CANCELLED = True
#: a throughput sample runs from when the link delivers the transfer's first byte (the live link meter's
#: window starts at the first chunk's arrival, `runtime.live._LinkMeter`), not from when the transfer
#: could start: a transfer that starts on a dead link measures the link once it carries bytes
#: (False: from the start, the previous model: a 14 MB shard requested 10 s before a dead link came
#: back read ~9 Mbit/s on a link then at ~100)
SAMPLE_FROM_FIRST_BYTE = True

# event kinds, in the order they are handled when simultaneous (data before decisions)
_FETCHED, _DECODED, _DEADLINE, _WAKE, _COMPUTE, _ADVANCED = range(6)


@dataclass
class SimulatedEdit:
    """The first denoising step of one simulated edit (seconds since it started)."""

    first_step_s: float
    records: list[ShardRecord]
    events: list[str] = field(default_factory=list)
    decisions: list[tuple[int, str]] = field(default_factory=list)   # (layer, source) in order
    requests: list[tuple[int, str]] = field(default_factory=list)    # (layer, route) in issue order
    link_busy_s: float = 0.0
    image_mse: float = 0.0

    # Alike in shape only to sakura.phone.live.StreamedEdit's totals (see there).
    @property
    def bytes(self) -> int:
        return sum(r.nbytes for r in self.records)

    @property
    def stall_s(self) -> float:
        return sum(r.stall_s for r in self.records)

    @property
    def local_layers(self) -> int:
        return sum(r.source == "local" for r in self.records)


def simulate_edit(specs: Sequence[ShardSpec], policy: Policy, *, link: LinkModel, rtt_s: float,
                  bandwidth: BandwidthEstimator, rtt: RttEstimator | None = None, decode_workers: int = 1,
                  max_inflight: int = 8, compute_start_s: float = 0.0, post_s: float = 0.0,
                  decode_split: float = 1.0) -> SimulatedEdit:
    """Play one edit's first step. `link` and `rtt_s` are the truth; the driver only sees what
    its estimators learn from the transfers. compute_start_s: when the forward pass reaches
    layer 0 (work before the transformer, e.g. the text encoder, overlaps with fetching).
    post_s: the edit's work after the first step (later passes, VAE decode), not simulated but
    part of the loss bound's reference (`EditDriver` other_s). decode_split: the live decode
    pool's intra-shard split (`runtime.live.DecodePool`: a shard whose decode starts while another
    worker idles shares it with the idle workers), as the measured speedup of one shard on 2
    threads (`sakura.bench.decode_rates.load_split`; 1.0: no split modelled). Such a decode runs
    decode_split x faster and holds the idle workers until it ends or the next shard arrives (a
    live helper leaves after its current range; then the decode goes on alone); more idle workers
    than one are assumed to gain no more than the 2 threads measured."""
    d = EditDriver(specs, policy, bandwidth=bandwidth, rtt=rtt or RttEstimator(prior_s=rtt_s),
                   decode_workers=decode_workers, max_inflight=max_inflight, compute_start_s=compute_start_s,
                   other_s=compute_start_s + post_s)
    return _Simulation(d, specs, link, rtt_s, decode_workers, decode_split).run(compute_start_s)


class _Simulation:
    """One `simulate_edit`: the event queue, the link's transfers (first in, first out) and the
    decode workers around one `EditDriver`. `run` pops events in time order and hands each to the
    driver; `issue` puts the driver's requests on the link, `abort` takes cancelled ones off it,
    `decode` places a fetched shard on a worker, `act` carries out the driver's decision at a layer."""

    def __init__(self, d: EditDriver, specs: Sequence[ShardSpec], link: LinkModel, rtt_s: float,
                 decode_workers: int, decode_split: float):
        self.d, self.specs, self.link, self.rtt_s = d, specs, link, rtt_s
        self.decode_workers, self.decode_split = decode_workers, decode_split
        self.heap: list = []
        self.seq = itertools.count()
        self.link_free = 0.0
        self.busy = 0.0
        self.workers = [0.0] * decode_workers
        self.requests: list[tuple[int, str]] = []
        self.decisions: list[tuple[int, str]] = []
        self.waiting: tuple[int, float] | None = None  # (layer, deadline) the compute is blocked on
        self.finish: float | None = None
        # wake-up times already queued: every event asks the driver again and it mostly answers the same
        # wake-up, so a second one at the same time would only repeat the same (idempotent) call
        self.wakes: set[float] = set()
        # transfers on the link, in issue (FIFO) order: j -> [nbytes, t_request, start, end, generation]
        self.onlink: dict[int, list] = {}
        self.gen = itertools.count()

    def push(self, t: float, kind: int, data=None) -> None:
        heapq.heappush(self.heap, (t, kind, next(self.seq), data))

    def run(self, compute_start_s: float) -> SimulatedEdit:
        d = self.d
        d.start(0.0)
        self.issue(0.0)
        self.push(compute_start_s, _COMPUTE, 0)
        while self.heap and self.finish is None:
            now, kind, _, data = heapq.heappop(self.heap)
            if kind == _FETCHED:
                self.fetched(data, now)
            elif kind == _DECODED:
                d.on_decoded(data, now)
                if self.waiting is not None and self.waiting[0] == data and d.records[data].status == READY:
                    self.act(data, d.on_ready_while_waiting(data, now), now)
            elif kind == _DEADLINE:
                if self.waiting is not None and self.waiting[0] == data and now >= self.waiting[1]:
                    self.act(data, d.on_wait_expired(data, now), now)
            elif kind == _COMPUTE:
                self.act(data, d.at_layer(data, now), now)
            elif kind == _ADVANCED:
                self.act(data, d.on_advanced(data, now), now)
            elif kind == _WAKE:
                self.wakes.discard(now)
            self.issue(now)
            if self.waiting is not None and self.finish is None:
                changed = d.recheck(self.waiting[0], now)  # e.g. CacheGen chose to compute the chunk meanwhile
                if changed is not None:
                    self.act(self.waiting[0], changed, now)
                    self.abort(now)
        if self.finish is None:
            raise RuntimeError("simulation ended before the forward pass finished (a shard never arrived)")
        return SimulatedEdit(first_step_s=self.finish, records=d.records, events=d.events, decisions=self.decisions,
                             requests=self.requests, link_busy_s=self.busy, image_mse=d.image_mse())

    def issue(self, now: float) -> None:
        self.abort(now)
        reqs, wake = self.d.next_requests(now)
        self.abort(now, also=[j for j, _ in reqs])  # given back for a lower shard (and perhaps sent again now)
        for j, route in reqs:
            start = max(self.link_free, now + self.rtt_s)
            end = self.link.deliver(start, route.nbytes)
            self.busy += end - start
            self.link_free = end
            self.requests.append((j, route.name))
            self.d.on_first_byte(j, now, start)
            g = next(self.gen)
            self.onlink[j] = [route.nbytes, now, start, end, g]
            self.push(end, _FETCHED, (j, route.nbytes, start, g))
        if wake is not None and max(wake, now) not in self.wakes:
            self.wakes.add(max(wake, now))
            self.push(max(wake, now), _WAKE)

    def abort(self, now: float, also: Sequence[int] = ()) -> None:
        """Take the cancelled transfers (and `also`: layers requested again) off the link (see the
        module doc) and move the ones queued behind them up."""
        d, onlink = self.d, self.onlink
        gone = [j for j in also if j in onlink]
        gone += [j for j in (d.to_cancel() if ABORT_CANCELLED else sorted(d.requeued)) if j in onlink and j not in gone]
        if not gone:
            return
        for j in gone:
            nbytes, t_req, start, end, _ = onlink.pop(j)
            self.busy -= max(0.0, end - now) if start < now else end - start  # cut now, or never started
        # replay the rest first in, first out: one still transmitting keeps its end; the ones not
        # started start when the link is free again (not before now: until now the link was the
        # cancelled transfer's)
        self.link_free = now
        for j, x in onlink.items():  # dict order = issue order = FIFO order
            nbytes, t_req, start, end, _ = x
            if start < now:
                self.link_free = end
                continue
            new_start = max(self.link_free, t_req + self.rtt_s, now)
            if new_start != start:
                new_end = self.link.deliver(new_start, nbytes)
                self.busy += (new_end - new_start) - (end - start)
                x[2], x[3], x[4] = new_start, new_end, next(self.gen)
                d.records[j].t_first_byte = new_start
                self.push(new_end, _FETCHED, (j, nbytes, new_start, x[4]))
            self.link_free = x[3]

    def fetched(self, data: tuple, now: float) -> None:
        """A transfer's last byte arrived: the driver learns the rate, and the shard goes to a decoder."""
        j, nbytes, start, g = data
        if j not in self.onlink or self.onlink[j][4] != g:
            return  # aborted, or moved up (its new end is queued)
        del self.onlink[j]
        if self.d.records[j].status == REQUESTED:
            t0 = self.link.deliver(start, 1) if SAMPLE_FROM_FIRST_BYTE else start
            self.d.on_fetched(j, nbytes, now, sample_bytes=nbytes, sample_s=now - min(max(t0, start), now))
            self.push(self.decode(j, now), _DECODED, j)

    def decode(self, j: int, now: float) -> float:
        """Place shard j's decode on the first free worker; returns when it ends."""
        workers = self.workers
        w = min(range(self.decode_workers), key=lambda i: workers[i])
        start = max(now, workers[w])
        idle = [i for i in range(self.decode_workers) if i != w and workers[i] <= start]
        dec = self.d.routes[j].decode_s
        if idle and self.decode_split > 1.0:
            # split over the idle workers until the next shard arrives (a live helper then
            # leaves after its current range), the rest on this worker alone
            t_next = max(start, min((x[3] for x in self.onlink.values()), default=float("inf")))
            end = start + dec / self.decode_split
            if end > t_next:
                end = t_next + dec - (t_next - start) * self.decode_split
            for i in idle:
                workers[i] = min(end, t_next)
        else:
            end = start + dec
        workers[w] = end
        return end

    def act(self, j: int, a: LayerAction, now: float) -> None:
        if a.kind == WAIT:
            self.waiting = (j, a.deadline)
            if a.deadline < float("inf"):
                self.push(a.deadline, _DEADLINE, j)
            return
        self.waiting = None
        spec = self.specs[j]
        if a.kind == ADVANCE:  # the generator computes one template layer; the shard may come meanwhile
            self.push(now + self.specs[self.d.generator_at - 1].local_s, _ADVANCED, j)
            return
        self.decisions.append((j, self.d.records[j].source))
        t = now + (a.catch_up * spec.local_s if a.kind != USE else 0.0) + spec.compute_s
        if a.kind != USE:  # the driver recorded the local time (exact here)
            self.d.records[j].delivered = now + a.catch_up * spec.local_s
        if j + 1 < len(self.specs):
            self.push(t, _COMPUTE, j + 1)
        else:
            self.finish = t
