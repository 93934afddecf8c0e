"""The `sakura` codec family (registrations and parameters; the coders live one per file):

- `sakura`: one rendition. quantiser="nested" (default): token-importance-aware widths, nested
  min/max quantiser (`nested`); quantiser="ecsq"[, transform="dct"]: entropy-coded scalar
  quantisation, optionally over the token-grid DCT (`ecsq_coder`, maths in `ecsq`).
(`layered`, a ladder of these rungs stored once, is its own codec class in `layered`.)
(`progressive`, what `sakura build` stores by default, is its own codec class in `progressive`.)
Rate allocation for all of them: `allocation`.
"""

from __future__ import annotations

from typing import Any, Sequence

from .. import bitstream as bs
from . import ecsq_coder as EQC
from . import ladder as N
from ..base import CodecTables, Codec, LayerKV, ShardKV, ShardId, check_params, register


class _SakuraBase(Codec):
    """Parameters shared by `sakura`, `layered` and `progressive` (validated here)."""

    uses_tables = True
    _defaults: dict[str, Any] = {}
    _ladder = False  # True: several budgets (rungs) per rendition

    def __init__(self, **params: Any) -> None:
        p = check_params(params, self._defaults, self.name)
        budgets = self._budgets(p)
        if not budgets or any(not isinstance(b, (int, float)) or not 0.0 <= b <= 8.0 for b in budgets) \
                or any(b2 <= b1 for b1, b2 in zip(budgets, budgets[1:])):
            raise ValueError(f"{self.name}: budgets must be increasing numbers in [0, 8], got {budgets!r}")
        if not isinstance(p["alpha"], (int, float)) or p["alpha"] < 0:
            raise ValueError(f"{self.name}: alpha must be >= 0")
        if not isinstance(p["drop_cost"], (int, float)) or p["drop_cost"] <= 0:
            raise ValueError(f"{self.name}: drop_cost must be > 0")
        if not isinstance(p["key_group"], int) or p["key_group"] < 0:
            raise ValueError(f"{self.name}: key_group must be an int >= 0 (0 = all tokens)")
        if p["key_scale"] not in ("channel", "token"):
            raise ValueError(f"{self.name}: key_scale must be 'channel' or 'token'")
        if p["centroids"] not in ("channel", "pooled", "none"):
            raise ValueError(f"{self.name}: centroids must be 'channel', 'pooled' or 'none'")
        if not isinstance(p["early_bonus"], (int, float)) or not 0 <= p["early_bonus"] <= 4:
            raise ValueError(f"{self.name}: early_bonus must be a number in [0, 4]")
        if not isinstance(p["key_offset"], int) or not -6 <= p["key_offset"] <= 6:
            raise ValueError(f"{self.name}: key_offset must be an int in [-6, 6]")
        if p["quantiser"] not in ("nested", "ecsq"):
            raise ValueError(f"{self.name}: quantiser must be 'nested' or 'ecsq'")
        if p["quantiser"] == "ecsq" and len(budgets) != 1 and not self._ladder:
            raise ValueError(f"{self.name}: one budget per rendition (ladders: the layered codec)")
        if p["transform"] not in ("none", "dct") or (p["transform"] == "dct" and p["quantiser"] != "ecsq"):
            raise ValueError(f"{self.name}: transform must be 'none' or 'dct' (dct needs quantiser='ecsq')")
        if p["allocate"] not in ("sensitivity", "none"):
            raise ValueError(f"{self.name}: allocate must be 'sensitivity' or 'none'")
        if p["value_group"] != "head" and (not isinstance(p["value_group"], int) or p["value_group"] < 0):
            raise ValueError(f"{self.name}: value_group must be 'head' or an int >= 0 (0 = all channels)")
        super().__init__(**p)

    @staticmethod


    @staticmethod
    def _budgets(p: dict[str, Any]) -> list[float]:
        raise NotImplementedError


_COMMON = {"alpha": 1.0, "drop_cost": 1.0, "allow_drop": True, "use_importance": True,
           "key_group": 0, "value_group": 0, "key_offset": -1, "early_bonus": 0.0, "centroids": "channel",
           "key_scale": "token", "allocate": "sensitivity",
           "quantiser": "nested",
           "transform": "none"}


@register
class SakuraCodec(_SakuraBase):
    """Importance-aware single rendition at `budget` mean bits per value (before entropy coding)."""

    name = "sakura"
    _defaults = {"budget": 2.0, **_COMMON}

    @staticmethod
    def _budgets(p: dict[str, Any]) -> list[float]:
        return [p["budget"]]

    def fit_tables(self, shards: Sequence[ShardKV]) -> CodecTables:
        if self.params["quantiser"] == "ecsq":
            return EQC.ecsq_tables(self, shards, [N.analyse(self, shard) for shard in shards])
        return N.fit_tables(self, shards)

    def encode(self, shard: ShardKV, ident: ShardId, tables: CodecTables | None = None) -> bytes:
        if self.params["quantiser"] == "ecsq":
            return EQC.encode(self, shard, N.analyse(self, shard), ident, tables)
        return b"".join(N.encode_levels(self, shard, ident, tables))  # one rung: a single object

    def decode(self, data: bytes, ident: ShardId, tables: CodecTables | None = None) -> LayerKV:
        obj, dtype, shape = self._open(data, ident, tables, kind=bs.KIND_SHARD)
        if obj.header.get("ecsq") is not None:
            return EQC.decode(self, obj, dtype, shape, tables)
        if obj.header.get("levels", 1) != 1:
            raise bs.CorruptError(f"sakura object claims {obj.header.get('levels')!r} levels; a sakura rendition has one")
        return N.start_state(self, obj, data, ident, tables, dtype, shape).result()
