"""`layered`: a ladder of importance-aware rungs stored once, rung l = a byte prefix
(`supports_layers`): nested quantiser (`nested`) or, with quantiser="ecsq", the progressive
transform ladder's coder (`progressive`). Parameters: `sakura`'s, with `budgets` instead of
`budget`, plus `weighting` and `gamma` (ecsq only). Decoding dispatches on the base object's
header (`prog` present: the progressive coder), never on the instance's parameters."""

from __future__ import annotations

from typing import Any, Sequence

from .. import bitstream as bs
from . import ladder as N
from ..progressive import ladder as PG
from ..base import CodecTables, LayerKV, ShardKV, ShardId, register
from .sakura import _COMMON, _SakuraBase


@register
class LayeredCodec(_SakuraBase):
    """A ladder of importance-aware rungs at `budgets`, stored once as base + refinement layers."""

    name = "layered"
    supports_layers = True
    _ladder = True
    # nested quantiser: rungs share one set of per-layer offsets; fitted at the base budget they inflate
    # the upper rungs (measured: whole 4-rung ladder 0.35-0.41 of fp16 instead of 0.32-0.38), so nested
    # ladders keep uniform widths. quantiser="ecsq": the progressive transform ladder (`progressive`).
    _defaults = {"budgets": [1.0, 2.0, 3.0, 4.0], **_COMMON, "allocate": "none", "weighting": "none", "gamma": 1.0}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        p = self.params
        if p["weighting"] not in ("none", "importance"):
            raise ValueError(f"{self.name}: weighting must be 'none' or 'importance'")
        if p["weighting"] != "none" and p["quantiser"] != "ecsq":
            raise ValueError(f"{self.name}: weighting needs quantiser='ecsq' (the nested ladder uses importance itself)")
        if not isinstance(p["gamma"], (int, float)) or isinstance(p["gamma"], bool) or not 0 <= p["gamma"] <= 2:
            raise ValueError(f"{self.name}: gamma must be a number in [0, 2]")

    @staticmethod
    def _budgets(p: dict[str, Any]) -> list[float]:
        b = p["budgets"]
        return list(b) if isinstance(b, (list, tuple)) else [b]

    @property
    def progressive(self) -> bool:
        return self.params["quantiser"] == "ecsq"

    def fit_tables(self, shards: Sequence[ShardKV]) -> CodecTables:
        if self.progressive:
            return PG.fit_tables(self.name, self.params, shards)
        return N.fit_tables(self, shards)

    def fit_library_tables(self, templates: Sequence[Sequence[ShardKV]]) -> CodecTables:
        """One table set for a whole template library (per model), progressive ladders only."""
        if not self.progressive:
            raise ValueError(f"{self.name}: per-model tables need quantiser='ecsq'")
        return PG.fit_library_tables(self.name, self.params, templates)

    def encode_levels(self, shard: ShardKV, ident: ShardId, tables: CodecTables | None = None) -> list[bytes]:
        """One object per rung: [base, refinement 1, ...]."""
        if self.progressive:
            return PG.encode_levels(self, shard, ident, tables)
        return N.encode_levels(self, shard, ident, tables)

    def encode(self, shard: ShardKV, ident: ShardId, tables: CodecTables | None = None) -> bytes:
        return b"".join(self.encode_levels(shard, ident, tables))

    def decode(self, data: bytes, ident: ShardId, tables: CodecTables | None = None) -> LayerKV:
        return self.decode_state(data, ident, tables).result()

    def start_state(self, piece: bytes, ident: ShardId, tables: CodecTables | None):
        """The base object of a nested ladder (`nested.ladder.NestedState`) or of a progressive one
        (`progressive.ladder.ProgressiveState`, header `prog`)."""
        obj, dtype, shape = self._open(piece, ident, tables, kind=bs.KIND_SHARD)
        if obj.header.get("level") != 0:
            raise bs.CorruptError(f"base object has level {obj.header.get('level')!r}")
        ladder = PG if obj.header.get("prog") is not None else N
        return ladder.start_state(self, obj, piece, ident, tables, dtype, shape)
