"""Phone-side runtime: estimators, the pure pipeline model and planner, the shared edit driver,
and its two executors (live: sockets, threads, the real model; sim: a virtual clock and link)."""

from .driver import EditDriver, LayerAction, ShardRecord
from .estimator import BandwidthEstimator, RttEstimator
from .policies import CacheGenPolicy, FixedPolicy, MeetInMiddlePolicy, SakuraPolicy
from .plan import (LOCAL, ConstantLink, PipelineState, PlanResult, Route, ShardSpec, TraceLink, evaluate,
                   offline_plan, plan_split, psnr_db)

__all__ = ["BandwidthEstimator", "CacheGenPolicy", "ConstantLink", "EditDriver", "FixedPolicy", "LOCAL", "LayerAction",
           "MeetInMiddlePolicy", "PipelineState", "PlanResult", "Route", "RttEstimator", "SakuraPolicy", "ShardRecord",
           "ShardSpec", "TraceLink", "evaluate", "offline_plan", "plan_split", "psnr_db"]
