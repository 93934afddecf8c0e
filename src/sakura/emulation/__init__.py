"""Trace-driven link emulation: trace parsers (pure) and a user-space pacing TCP proxy."""

from sakura.emulation.pacer import Link, PacingProxy, ProxyStats, paced
from sakura.emulation.traces import (
    Trace,
    TraceError,
    list_traces,
    load_5gophers,
    load_cooked,
    load_mahimahi,
    load_trace,
    traces_root,
    transfer_fn,
)

__all__ = ["Link", "PacingProxy", "ProxyStats", "paced", "Trace", "TraceError", "list_traces", "load_5gophers",
           "load_cooked", "load_mahimahi", "load_trace", "traces_root", "transfer_fn"]
