"""The one method-name -> policy registry: every command and benchmark that names a streaming
method ("sakura", "cachegen-L3", ...) builds its policy here, so a name means one thing everywhere.

Policies hold per-edit state: `make_policy` returns a fresh object each call.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from .driver import CacheGenPolicy, FixedPolicy, MeetInMiddlePolicy, Policy, SakuraPolicy

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
