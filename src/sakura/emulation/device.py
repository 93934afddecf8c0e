"""A time-dilated phone: the bundled model run at a phone workload's per-layer times / D.

The live executor (sakura.phone.live) runs unchanged against it; what makes it "another device"
is here, on the emulation side: `DilatedDevice` wraps a model and pads each layer's compute to the
phone's time, `dilate_trace` scales a measured trace, and `decode_padding` is the `after_decode`
hook (`sakura.phone.live.Emulation`) that pads each decode to a phone's decoder rate. The phone
side only declares the hooks; it never imports this module.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from sakura.models.kv import KVSourceDefaults
from sakura.emulation.traces import Trace
from sakura.models.kv import LayerKV


def decode_padding(pad_s: Mapping[str, float], split: float = 1.0) -> Callable[..., None]:
    """An ``after_decode`` hook (`sakura.phone.live.Emulation`): a decode of rendition ``name``
    holds its worker until ``pad_s[name]`` seconds after it started (a slower, phone-class
    decoder); renditions not in ``pad_s`` are left as they are. ``split``: the simulator's
    intra-shard split (`sim.simulate_edit(decode_split=)`): a shard the pool shared with idle
    workers is padded to pad / split until the next shard arrives, at the one-worker rate after,
    as the simulator has it (`DecodePool.pad`)."""
    pad = dict(pad_s)

    def after_decode(name: str, t_start: float, shared: bool, pool) -> None:
        if name in pad:
            pool.pad(t_start, pad[name], split if shared else 1.0)

    return after_decode


def _pad(t0: float, target_s: float) -> None:
    left = target_s - (time.monotonic() - t0)
    if left > 0:
        time.sleep(left)


@dataclass(frozen=True)
class Dilation:
    """A workload's times for the mini model, divided by D (seconds)."""

    workload: str
    phone: str
    D: float
    layers_per_mini_layer: float
    beta: float            # live bytes per workload byte
    local_s: float         # one mini template layer
    compute_s: float       # one mini layer of the first pass (photo KV + live tokens)
    pre_s: float           # text encoder + VAE encode
    post_s: float          # the other passes + VAE decode
    rtt_s: float
    oracle_s: float        # the whole edit with the KV resident
    on_device_s: float

    def decode_s(self, fp16_bytes_per_cpu_s: float) -> float:
        """Emulated decode of one mini shard on one worker: the workload's layer decode time at
        this per-core rate, x layers per mini layer, / D (seconds)."""
        if not fp16_bytes_per_cpu_s or fp16_bytes_per_cpu_s != fp16_bytes_per_cpu_s:
            return 0.0
        return self._klein_layer_bytes / fp16_bytes_per_cpu_s * self.layers_per_mini_layer / self.D

    _klein_layer_bytes: int = 0


def dilate_trace(trace, dil: Dilation):
    """The trace with time / D and rate x D x beta (bytes/s)."""

    return Trace(name=f"{trace.name} (dilated /{dil.D:g})", edges=trace.edges / dil.D, rate=trace.rate * dil.D * dil.beta)


class _PaddedSource(KVSourceDefaults):
    """Pads the forward compute of each layer (time between layer requests) to `compute_s`, and the
    work before layer 0 to end at monotonic `first_at` (the workload's text encoder and VAE encode):
    the mini model's own work before its first layer runs inside that time, not after it (on top,
    it was 20-40 ms real, ~1-2 phone seconds at D = 40, in every method's live latency and in
    none of the simulator's)."""

    def __init__(self, inner, compute_s: float, first_at: float | None = None, origin: float | None = None):
        self.inner, self.compute_s, self.first_at = inner, compute_s, first_at
        self.origin = time.monotonic() if origin is None else origin
        #: per layer, seconds since `origin`: when the forward pass asked for it and when it got it
        self.times: list[tuple[int, float, float]] = []
        self.model_fingerprint, self.template_fingerprint = inner.model_fingerprint, inner.template_fingerprint
        self.num_layers = inner.num_layers
        self.instruction, self.layout, self.positions = inner.instruction, inner.layout, inner.positions
        self._t: float | None = None

    def layer(self, i: int):
        if self._t is not None:
            _pad(self._t, self.compute_s)
        elif self.first_at is not None:
            _pad(self.first_at, 0.0)
        asked = time.monotonic()
        kv = self.inner.layer(i)
        self._t = time.monotonic()
        self.times.append((i, asked - self.origin, self._t - self.origin))
        return kv

    def finish(self) -> None:
        if self._t is not None:
            _pad(self._t, self.compute_s)


class _LocalSource(KVSourceDefaults):
    """On-device (Klein KV extract mode, first step): each template layer computed when reached."""

    def __init__(self, device: "DilatedDevice", template: torch.Tensor, instruction: int):

        m = device.m
        self.model_fingerprint = m.fingerprint()
        self.template_fingerprint = m.template_fingerprint(template, instruction)
        self.num_layers = m.num_layers
        self.instruction = instruction
        self._gen = ((LayerKV(k[0], v[0])) for k, v in device.template_layers(template, instruction))
        self.used: dict[int, Any] = {}

    def layer(self, i: int):
        kv = next(self._gen)
        self.used[i] = kv
        return kv


class DilatedDevice:
    """sakura-mini at a phone workload's per-layer times / D (see the module doc). Exposes the
    image-level model API the runtime uses; `edit` runs the first denoising step for real and
    stands in for the rest with a sleep."""

    def __init__(self, model: Any, dil: Dilation):
        self.m, self.dil = model, dil
        self.num_layers, self.cfg = model.num_layers, model.cfg
        self.last_used: dict[int, Any] = {}
        self.last_timeline: list[dict] = []   # the last on-device edit's layers (`_timeline`'s form)

    # A documented plugin boundary: a bench-side stand-in that is the wrapped model plus a phone's
    # timings. What it does not override (fingerprint, check_template_kv, ...) is the model's own,
    # so it satisfies the same ImageTemplateEditModel Protocol as the model it wraps.
    def __getattr__(self, name: str) -> Any:
        return getattr(self.m, name)

    def template_layers(self, template, instruction=0):
        it = self.m.template_layers(template, instruction)
        while True:
            t = time.monotonic()
            try:
                kv = next(it)
            except StopIteration:
                return
            _pad(t, self.dil.local_s)
            yield kv

    def edit(self, photo, *, template=None, instruction=0, template_kv=None, mode=None, steps=1, seed=0):
        origin = time.monotonic()
        first_at = origin + self.dil.pre_s  # text encoder + VAE encode; fetching already runs
        local = None
        if template_kv is None:
            local = template_kv = _LocalSource(self, template, instruction)
        src = _PaddedSource(template_kv, self.dil.compute_s, first_at=first_at, origin=origin)
        out = self.m.edit(photo, template_kv=src, steps=1, seed=seed)
        src.finish()
        time.sleep(self.dil.post_s)  # the other passes + VAE decode
        if local is not None:
            self.last_used = local.used
            nan = float("nan")  # on-device: every template layer computed here, when the forward pass asks
            self.last_timeline = [{"index": i, "source": "local", "t_request": nan, "fetch_end": nan, "decode_end": nan,
                                   "needed": a, "delivered": b, "local_s": b - a, "compute_s": self.dil.compute_s}
                                  for i, a, b in src.times]
        return out


