"""Bounds the phone puts on what a server sends, from the model's config and its own estimates.

A hostile or broken server must not set the phone's memory or hold an edit for ever. Every
number here is checked before anything is allocated or waited on:

* the template reference: at most ``max_template_ref_bytes(S)`` bytes (the largest honest
  encoding of an S x S RGB image, the legacy float32 safetensors, plus headroom), decoded only
  if its header says S x S;
* the manifest's shards: one per model layer, each shard's K/V shape (tokens, heads, head_dim)
  consistent with its ``fp16_bytes`` and, where the model's config names them, its heads and
  head_dim; each fetched codec object's header must declare exactly that shape before it is
  decoded (a 33 KB object declaring 4096 x 64 x 1024 decoded to 1 GiB);
* the gallery refresh (manifest, then template reference): each step has an overall deadline
  derived from the bandwidth estimate, ``step_deadline_s``, so a server that drips one byte per
  read timeout cannot hold `sakura edit` (it falls back to the gallery / local compute).
"""

from __future__ import annotations

from typing import Any

#: Seconds every refresh step may take on top of its transfer time (connect, a few round trips).
REFRESH_BASE_S = 3.0
#: A refresh step is allowed this many times its transfer time at the estimated rate.
REFRESH_SLACK = 4.0
#: No refresh step waits longer than this (s): past it the gallery's copy (or local compute) is used.
REFRESH_MAX_S = 20.0
#: Bytes assumed for a manifest when sizing its deadline (real ones are 2-64 KB).
MANIFEST_DEADLINE_BYTES = 256 * 1024


class LimitError(ValueError):
    """Something a server sent is larger or shaped otherwise than this model allows."""


def step_deadline_s(nbytes: int, rate_bps: float) -> float:
    """Overall seconds for one refresh step moving ``nbytes`` at an estimated ``rate_bps`` bytes/s:
    ``min(REFRESH_MAX_S, REFRESH_BASE_S + REFRESH_SLACK * nbytes / rate_bps)``."""
    return min(REFRESH_MAX_S, REFRESH_BASE_S + REFRESH_SLACK * max(0, nbytes) / max(rate_bps, 1.0))


#: Most reference images one template may hold (stored side by side: a (3, S, R*S) PNG). The
#: models take at most 4 (Klein's reference slots); 8 leaves room without trusting the server.
MAX_TEMPLATE_REFERENCES = 8


def max_template_ref_bytes(image_size: int) -> int:
    """Largest template reference accepted for ``image_size``-pixel square reference images:
    the raw float32 RGB pixels (an 8-bit PNG is always smaller) of MAX_TEMPLATE_REFERENCES
    images side by side, plus 64 KiB of headers."""
    return MAX_TEMPLATE_REFERENCES * 3 * image_size * image_size * 4 + 64 * 1024


def check_template_ref(manifest: Any, image_size: int) -> None:
    """Raise `LimitError` if the manifest's template reference is too large to be honest."""
    n, cap = manifest.template_ref.object.bytes, max_template_ref_bytes(image_size)
    if n > cap:
        raise LimitError(f"manifest declares a {n}-byte template reference; a {image_size} x {image_size} "
                         f"template needs at most {cap}")


def shard_shapes(model: Any, manifest: Any) -> list[tuple[int, int, int]]:
    """Each shard's K/V shape (tokens, heads, head_dim), checked against the manifest's own
    ``fp16_bytes`` and the model's config; raises `LimitError` naming the first mismatch."""
    lay = manifest.kv_layout
    heads, head_dim = lay.get("heads"), lay.get("head_dim")
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 1 << 16 for v in (heads, head_dim)):
        raise LimitError(f"manifest kv_layout has no valid heads/head_dim ({heads!r}, {head_dim!r})")
    m_heads, m_dim = model.cfg.heads, model.cfg.head_dim  # ImageModelConfig (models/base.py)
    if heads != m_heads or head_dim != m_dim:
        raise LimitError(f"manifest KV has {heads} heads x {head_dim}, the model {m_heads} x {m_dim}")
    out = []
    for s in manifest.shards:
        t = s.tokens[1] - s.tokens[0]
        if not 0 < t <= 1 << 20:
            raise LimitError(f"shard {s.index}: token range {s.tokens} is empty or too long")
        if s.fp16_bytes != 2 * 2 * t * heads * head_dim:
            raise LimitError(f"shard {s.index}: fp16_bytes {s.fp16_bytes} is not K+V of {t} x {heads} x {head_dim}")
        out.append((t, heads, head_dim))
    return out


def check_shard_header(header: dict, shape: tuple[int, int, int], where: str) -> None:
    """Raise `LimitError` unless a codec object's header (`bitstream.parse(data).header`, parsed
    once on the phone and handed on to the decoder) declares exactly ``shape``: checked on the
    header only, before the decoder allocates anything."""
    got = header.get("shape") if isinstance(header, dict) else None
    if not isinstance(got, list) or [v if isinstance(v, int) else None for v in got] != list(shape):
        raise LimitError(f"{where}: object header declares shape {got!r}, the manifest and model say {list(shape)}")


#: Seconds every shard fetch may take on top of its transfer time.
FETCH_BASE_S = 3.0
#: No shard fetch lives longer than this (s); the driver's own per-layer deadlines (adaptive
#: policies) are usually far shorter, this bounds the non-adaptive ones (raw-stream waits for
#: every shard by design, so a stalled server used to hold it for as long as the client's retries).
FETCH_MAX_S = 120.0


def fetch_deadline_s(nbytes: int, rate_bps: float, inflight: int) -> float:
    """Overall seconds for one shard fetch issued at an estimated link rate ``rate_bps`` with up to
    ``inflight`` transfers sharing it: ``min(FETCH_MAX_S, FETCH_BASE_S + 2 * inflight * nbytes /
    rate_bps)``, i.e. twice the time if every in-flight transfer took its full share."""
    return min(FETCH_MAX_S, FETCH_BASE_S + 2.0 * max(1, inflight) * max(0, nbytes) / max(rate_bps, 1.0))
