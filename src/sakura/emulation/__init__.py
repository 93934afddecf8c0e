"""Trace-driven link emulation: trace parsers (pure) and a user-space pacing TCP proxy."""

from sakura.emulation.pacer import Link, PacingProxy, ProxyStats, paced
from sakura.emulation.traces import (
    BUNDLED_TRACES,
    Trace,
    TraceError,
    list_traces,
    load_5gophers,
    load_cooked,
    load_mahimahi,
    load_trace,
    resolve_trace_path,
    traces_root,
    transfer_fn,
)

__all__ = ["BUNDLED_TRACES", "Link", "PacingProxy", "ProxyStats", "paced", "Trace", "TraceError", "list_traces", "load_5gophers",
           "load_cooked", "load_mahimahi", "load_trace", "resolve_trace_path", "traces_root", "transfer_fn"]
