"""What the planner assumes about this device: per-layer compute, template compute, decode rates
(`DeviceProfile`), measured on this machine (`profile_model`) or scaled to a phone; and the
planner's inputs derived from a manifest with it (`shard_specs`)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from .plan import Route, ShardSpec


@dataclass
class DeviceProfile:
    """Per-layer times the planner assumes (seconds), measured by `profile_model` or scaled to a
    phone. decode_bytes_per_s: fp16-KV bytes one decode worker produces per second, per codec
    name (the codec's name before ':'), else `default_decode_bytes_per_s`."""

    compute_s: float
    local_s: float
    decode_bytes_per_s: dict[str, float] = field(default_factory=dict)
    default_decode_bytes_per_s: float = 80e6
    decode_workers: int = 1
    pre_s: float = 0.0    # work before the transformer's first layer (text encoder, VAE encode)
    post_s: float = 0.0   # work after the first step (later denoising passes, VAE decode)

    def decode_s(self, codec: str, fp16_bytes: int) -> float:
        rate = self.decode_bytes_per_s.get(codec.split(":")[0], self.default_decode_bytes_per_s)
        return fp16_bytes / rate


def default_decode_workers() -> int:
    """What the device has: one decode worker per core the process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def profile_model(model: Any, repeats: int = 3) -> DeviceProfile:
    """Measure this machine's per-layer forward compute (photo+target stream, one step) and
    per-layer template compute, median of `repeats` runs."""
    size = model.cfg.image_size
    g = torch.Generator().manual_seed(0)
    tmpl, photo = torch.rand(1, 3, size, size, generator=g), torch.rand(1, 3, size, size, generator=g)
    comp, loc = [], []
    with torch.no_grad():
        for _ in range(repeats):
            t = time.perf_counter()
            kv = model.extract_template_kv(tmpl)
            loc.append((time.perf_counter() - t) / model.num_layers)
            t = time.perf_counter()
            model.edit(photo, template_kv=kv, steps=1)
            comp.append((time.perf_counter() - t) / model.num_layers)
    return DeviceProfile(compute_s=sorted(comp)[len(comp) // 2], local_s=sorted(loc)[len(loc) // 2],
                         decode_workers=default_decode_workers())


def shard_specs(manifest: Any, profile: DeviceProfile) -> list[ShardSpec]:
    """Planner inputs from a manifest: every rendition with its size, decode time and measured
    image distortion (``image_mse``, recorded at build time), and each shard's quality floor
    (``quality_floor.image_mse``: CacheGen level 3 on that shard). A manifest without image
    distortions gives routes of unknown quality (treated as exact) and no floor."""
    specs = []
    for shard in manifest.shards:
        routes = tuple(Route(r.name, r.nbytes, profile.decode_s(r.codec, shard.fp16_bytes),
                             float(r.distortion.get("image_mse", 0.0))) for r in shard.renditions)
        floor = shard.quality_floor or {}
        specs.append(ShardSpec(routes, profile.compute_s, profile.local_s,
                               float(floor["image_mse"]) if "image_mse" in floor else None))
    return specs
