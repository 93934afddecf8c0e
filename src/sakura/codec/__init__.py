"""Template-KV codecs: shards of (tokens, heads, head_dim) keys/values in, self-describing bytes out.

Public API (see docs/codec.md):
    get_codec(name, **params) / codec_from_spec("uniform:bits=4") -> Codec
    Codec.fit_tables(shards) -> CodecTables | None       (cloud, once per template)
    Codec.encode(shard, ident, tables) -> bytes
    Codec.decode(data, ident, tables) -> sakura.models.LayerKV   (key, value, keep: always a tensor)
    Codec.describe(shard, data, ident, tables=None, queries=None) -> RenditionReport
    decode_any(data, ident, tables)                     (dispatch on the codec named in the header)
    layered codecs (`supports_layers`): level_ends(data), decode_state / upgrade (rung by rung)
    warm_up()                                           (compile every decode kernel before the clock starts)
Parameters are validated strictly (`base.check_params`: unknown names and wrong types raise).

Layout (floors inside the codec; docs/structure.md): the shared base at this level (`base`: the
Codec interface, registry, `LadderState`; `bitstream`, `entropy`, `rans`, `kernels`, `quant`,
`ecsq`, `allocation`, `metrics`, `target`), then one subpackage per family:

    progressive/  progressive  the progressive transform ladder, `sakura build`'s default (ladder.py)
    baselines/    cachegen     CacheGen's KV codec (SIGCOMM'24, as in LMCache), the baseline and quality floor
                  uniform      fixed-width int quantisation (`bits` 1..8, KIVI-style groups), no entropy coding
                  lossless     the stored bit patterns (fp32/fp16/bf16), optionally zstd; bit-exact
    nested/       sakura       one importance-aware rendition at a bit budget (sakura.py)
                  layered      a nested-quantiser ladder, rungs as byte prefixes of one object (layered.py);
                               with quantiser="ecsq" the progressive family's ladder
"""

import time

from . import target as _target

_target.configure()   # before anything loads numba: SAKURA_DECODE_TARGET=phone picks the JIT's CPU

from .base import (Codec, CodecTables, RenditionReport, ShardKV, UnknownCodecError, available_codecs,
                   codec_from_spec, decode_any, get_codec, register)
from .bitstream import CodecError, CorruptError, IdentityError, ShardId, TruncatedError, VersionError
from .baselines import lossless as _lossless  # noqa: F401  (registers)
from .baselines import uniform as _uniform  # noqa: F401
from .nested import sakura as _sakura  # noqa: F401
from .nested import layered as _layered  # noqa: F401
from .baselines import cachegen as _cachegen  # noqa: F401
from .progressive import ladder as _progressive  # noqa: F401
from . import native, rans
from .progressive import fastdct, fitkernels

__all__ = ["Codec", "CodecTables", "RenditionReport", "ShardKV", "ShardId", "UnknownCodecError",
           "CodecError", "CorruptError", "IdentityError", "TruncatedError", "VersionError",
           "available_codecs", "codec_from_spec", "decode_any", "get_codec", "register", "warm_up",
           "warm_up_decoders"]


def warm_up() -> float:
    """Compile (or load from numba's disk cache) every kernel of the codec's decoders and of the
    build's table fit; returns seconds spent. Called by `sakura warm` (./dev set-up) and the
    benches, so that no measurement pays the JIT; a phone's edit calls `warm_up_decoders`."""
    t0 = time.perf_counter()
    rans.warm_up()   # the rANS coder and the shared decode kernels
    fastdct.warm_up()
    fitkernels.warm_up()  # the build's table fit (cloud side): cheap to compile with the rest
    return time.perf_counter() - t0


def warm_up_decoders() -> float:
    """What a phone's edit compiles before its clock starts; returns seconds spent. Nothing where
    the native decoder is loaded: it decodes every rendition of the ladder and CacheGen, and a rare
    numba fallback (f32/bf16 output, a non-power-of-two block) compiles on first use. Otherwise
    the numba decoders (rANS, the shared kernels, the IDCT), not the build's table fit. (Warming
    everything cost a freshly installed phone ~50 CPU-s before its first edit, native or not.)"""
    t0 = time.perf_counter()
    if not native.available():
        rans.warm_up()
        fastdct.warm_up()
    return time.perf_counter() - t0
