"""Template-KV codecs: shards of (tokens, heads, head_dim) keys/values in, self-describing bytes out.

Public API (see docs/codec.md):
    get_codec(name, **params) / codec_from_spec("uniform:bits=4") -> Codec
    Codec.fit_tables(shards) -> CodecTables | None       (cloud, once per template)
    Codec.encode(shard, ident, tables) -> bytes
    Codec.decode(data, ident, tables) -> sakura.models.LayerKV   (key, value, keep: always a tensor)
    Codec.describe(shard, data, ident, tables=None, queries=None) -> RenditionReport
    decode_any(data, ident, tables)                     (dispatch on the codec named in the header)
    layered codecs (`supports_layers`): level_ends(data), decode_state / upgrade (rung by rung)
Parameters are validated strictly (`base.check_params`: unknown names and wrong types raise).

Codecs (registry names):
    progressive  the progressive transform ladder, `sakura build`'s default (progressive.py)
    layered      a nested-quantiser ladder, rungs as byte prefixes of one object (layered.py)
    sakura       one importance-aware rendition at a bit budget (sakura.py)
    cachegen     CacheGen's KV codec (SIGCOMM'24, as in LMCache), the baseline and quality floor
    uniform      fixed-width int quantisation (`bits` 1..8, KIVI-style groups), no entropy coding
    lossless     the stored bit patterns (fp32/fp16/bf16), optionally zstd; bit-exact
"""

from . import target as _target

_target.configure()   # before anything loads numba: SAKURA_DECODE_TARGET=phone picks the JIT's CPU

from .base import (Codec, CodecTables, RenditionReport, ShardKV, UnknownCodecError, available_codecs,
                   codec_from_spec, decode_any, get_codec, register)
from .bitstream import CodecError, CorruptError, IdentityError, ShardId, TruncatedError, VersionError
from . import lossless as _lossless  # noqa: F401  (registers)
from . import uniform as _uniform  # noqa: F401
from . import sakura as _sakura  # noqa: F401
from . import layered as _layered  # noqa: F401
from . import cachegen as _cachegen  # noqa: F401
from . import progressive as _progressive  # noqa: F401

__all__ = ["Codec", "CodecTables", "RenditionReport", "ShardKV", "ShardId", "UnknownCodecError",
           "CodecError", "CorruptError", "IdentityError", "TruncatedError", "VersionError",
           "available_codecs", "codec_from_spec", "decode_any", "get_codec", "register"]
