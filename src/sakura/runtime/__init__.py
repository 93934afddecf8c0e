"""Phone-side runtime pieces: bandwidth estimation and per-shard rendition scheduling (pure)."""

from .estimator import BandwidthEstimator
from .scheduler import LOCAL, Option, PipelineState, ShardSpec, Timeline, constant_rate, plan_next, simulate, step

__all__ = ["BandwidthEstimator", "LOCAL", "Option", "PipelineState", "ShardSpec", "Timeline", "constant_rate",
           "plan_next", "simulate", "step"]
