"""Bandwidth traces as pure functions of time: parsers for every format in ../shared/traces (a small
subset ships in the package, `BUNDLED_TRACES`: the demo and the default tests need nothing beside the repo).

Every format becomes one ``Trace``: a piecewise-constant downlink capacity that loops (mahimahi
and Pensieve both wrap at the end). Capacity is a *cumulative* function ``C(t)`` (bytes deliverable
in trace time ``[0, t]``), which makes "bytes deliverable in ``[t0, t1]``" and its inverse ("when
has the link carried ``b`` bytes") exact and clock-free, so they test without sockets.

Format rules (see ../shared/traces/README.md):
- **mahimahi** (``*.down``/``*.up``): one integer per line, a delivery opportunity for one
  1500-byte packet at that millisecond. Period = last timestamp (mm-link's loop); a timestamp ``k``
  fills the 1-ms bin ``[k, k+1)`` ms, with ``k = period`` folded onto bin 0 exactly as mm-link's
  loop makes it coincide with the next loop's 0.
- **Pensieve "cooked"** (``norway_hsdpa_3g``, ``fcc_broadband``): ``time_s  Mbit/s`` per line; line
  ``i``'s rate holds on ``(t[i-1], t[i]]`` (Pensieve's simulator), so line 0 only sets the origin.
- **5Gophers CSV**: header row, one row per second, Mbit/s. Row ``seq`` holds on ``[seq, next
  seq)``: a missing second (the driving files skip six) keeps the last measured rate, rather
  than inventing an outage. Selectors: driving files need a carrier (``#Sprint``, ``#TMobile``,
  ``#Verizon``); ``01-Throughput/data.csv`` needs ``#CARRIER/CONNS/SERVER/RUN`` (e.g.
  ``#SPRINT/1/US-West/3``); the walking trace needs none.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAHIMAHI_PACKET_BYTES = 1500


class TraceError(ValueError):
    """A trace file or selector is unusable; the message names the file and the problem."""


@dataclass(frozen=True, eq=False)
class Trace:
    """Piecewise-constant link capacity, looping with period ``edges[-1]`` seconds.

    Attributes:
        name: where it came from (file and selector).
        edges: shape ``(n+1,)``, seconds, ``edges[0] == 0``, strictly increasing.
        rate: shape ``(n,)``, bytes/s on ``[edges[i], edges[i+1])``, >= 0.
    """

    name: str
    edges: np.ndarray
    rate: np.ndarray

    def __post_init__(self) -> None:
        e, r = np.asarray(self.edges, dtype=np.float64), np.asarray(self.rate, dtype=np.float64)
        if e.ndim != 1 or r.ndim != 1 or e.shape[0] != r.shape[0] + 1 or r.shape[0] == 0:
            raise TraceError(f"{self.name}: edges must have shape (n+1,) and rate (n,), got {e.shape} and {r.shape}")
        if e[0] != 0 or np.any(np.diff(e) <= 0):
            raise TraceError(f"{self.name}: segment edges must start at 0 and strictly increase")
        if np.any(r < 0) or not np.all(np.isfinite(r)):
            raise TraceError(f"{self.name}: rates must be finite and >= 0")
        cum = np.concatenate([[0.0], np.cumsum(r * np.diff(e))])
        if cum[-1] <= 0:
            raise TraceError(f"{self.name}: the trace carries no bytes at all")
        object.__setattr__(self, "edges", e)
        object.__setattr__(self, "rate", r)
        object.__setattr__(self, "_cum", cum)

    @property
    def period_s(self) -> float:
        """Loop period (seconds)."""
        return float(self.edges[-1])

    @property
    def bytes_per_period(self) -> float:
        return float(self._cum[-1])

    @property
    def mean_mbps(self) -> float:
        """Mean capacity over one period, Mbit/s (10^6 bit/s)."""
        return self.bytes_per_period * 8 / 1e6 / self.period_s

    def cumulative(self, t: float | np.ndarray) -> float | np.ndarray:
        """Bytes deliverable in trace time ``[0, t]`` (``t`` >= 0 seconds; loops past the period)."""
        t = np.asarray(t, dtype=np.float64)
        if np.any(t < 0):
            raise ValueError("trace time must be >= 0")
        k, x = np.divmod(t, self.period_s)
        i = np.clip(np.searchsorted(self.edges, x, side="right") - 1, 0, len(self.rate) - 1)
        out = k * self._cum[-1] + self._cum[i] + self.rate[i] * (x - self.edges[i])
        return float(out) if out.ndim == 0 else out

    def bytes_between(self, t0: float, t1: float) -> float:
        """Bytes the link can deliver in trace time ``[t0, t1]`` (seconds, ``0 <= t0 <= t1``)."""
        if t1 < t0:
            raise ValueError(f"t1 ({t1}) < t0 ({t0})")
        return self.cumulative(t1) - self.cumulative(t0)

    def time_at(self, nbytes: float) -> float:
        """Earliest trace time ``t`` with ``cumulative(t) >= nbytes`` (inverse of ``cumulative``)."""
        if nbytes <= 0:
            return 0.0
        k, r = divmod(float(nbytes), self._cum[-1])
        if r == 0:  # exactly k whole periods: the earliest time is where period k's bytes end
            k, r = k - 1, self._cum[-1]
        j = int(np.searchsorted(self._cum, r, side="left"))  # first edge with cum >= r, j >= 1
        seg = j - 1
        # rate[seg] > 0 here: cum strictly rises on segment seg because cum[j-1] < r <= cum[j]
        return k * self.period_s + self.edges[seg] + (r - self._cum[seg]) / self.rate[seg]

    def rate_at(self, t: float) -> float:
        """Capacity (bytes/s) at trace time ``t``."""
        x = float(t) % self.period_s
        i = min(int(np.searchsorted(self.edges, x, side="right")) - 1, len(self.rate) - 1)
        return float(self.rate[i])

    def mbps_bins(self, bin_s: float = 1.0) -> np.ndarray:
        """Mean Mbit/s per ``bin_s`` bin over one period (complete bins only)."""
        n = int(self.period_s // bin_s)
        c = self.cumulative(np.arange(n + 1) * bin_s)
        return np.diff(c) * 8 / 1e6 / bin_s


def constant_trace(mbps: float, seconds: float = 3600.0) -> Trace:
    """A flat link of `mbps` Mbit/s (for constant-rate sweeps and tests)."""
    if not mbps > 0:
        raise TraceError(f"mbps must be > 0, got {mbps}")
    return Trace(name=f"constant-{mbps:g}Mbps", edges=np.array([0.0, float(seconds)]), rate=np.array([mbps * 1e6 / 8]))


def transfer_fn(trace: Trace, *, offset_s: float = 0.0, rtt_s: float = 0.0):
    """A pure ``transfer(t_start_s, nbytes) -> t_end_s`` for schedulers/simulators, matching the
    ``PacingProxy`` model on a reused connection over an otherwise idle link: the request takes
    ``rtt/2`` to reach the server, the response's bytes are carried at the trace's capacity from
    then on (trace time ``offset_s + t``), and the last byte lands ``rtt/2`` later. Times are
    seconds since the emulation started."""
    if rtt_s < 0 or offset_s < 0:
        raise ValueError("rtt_s and offset_s must be >= 0")
    half = rtt_s / 2

    def transfer(t_start_s: float, nbytes: int) -> float:
        t_link = offset_s + max(0.0, t_start_s) + half
        done = trace.time_at(trace.cumulative(t_link) + nbytes) if nbytes > 0 else t_link
        return done - offset_s + half

    return transfer


# ---------------------------------------------------------------------------------- parsers
def load_mahimahi(path: str | os.PathLike[str]) -> Trace:
    """Mahimahi packet-delivery trace (ms timestamps, one 1500-byte packet each)."""
    p = Path(path)
    try:
        ts = np.array([int(line) for line in p.read_text().split()], dtype=np.int64)
    except ValueError as e:
        raise TraceError(f"{p}: not a mahimahi trace (one integer millisecond per line): {e}") from None
    if ts.size == 0:
        raise TraceError(f"{p}: empty trace")
    if np.any(np.diff(ts) < 0) or ts[0] < 0:
        raise TraceError(f"{p}: timestamps must be non-negative and non-decreasing")
    period_ms = int(ts[-1])
    if period_ms <= 0:
        raise TraceError(f"{p}: last timestamp is 0 ms: no loop period")
    counts = np.bincount(ts % period_ms, minlength=period_ms)  # ts == period folds onto bin 0
    return Trace(name=p.name, edges=np.arange(period_ms + 1) / 1000.0,
                 rate=counts * MAHIMAHI_PACKET_BYTES * 1000.0)


def load_cooked(path: str | os.PathLike[str]) -> Trace:
    """Pensieve 'cooked' trace: ``time_s  Mbit/s`` per line; line i holds on (t[i-1], t[i]]."""
    p = Path(path)
    t, bw = [], []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        try:
            t.append(float(parts[0]))
            bw.append(float(parts[1]))
        except (ValueError, IndexError):
            raise TraceError(f"{p}:{n}: expected 'time_s Mbps', got {line[:60]!r}") from None
    ta, ba = np.array(t), np.array(bw)
    if ta.size < 2:
        raise TraceError(f"{p}: needs at least two samples")
    if np.any(np.diff(ta) < 0):
        raise TraceError(f"{p}: time column decreases")
    keep = np.diff(ta) > 0  # a repeated timestamp spans no time
    edges = np.concatenate([[0.0], (ta[1:] - ta[0])[keep]])
    return Trace(name=p.name, edges=edges, rate=ba[1:][keep] * 1e6 / 8)


def _per_second(name: str, seq: list[int], mbps: list[float]) -> Trace:
    order = np.argsort(seq, kind="stable")
    s = np.asarray(seq, dtype=np.float64)[order]
    r = np.asarray(mbps, dtype=np.float64)[order]
    if np.any(np.diff(s) <= 0):
        raise TraceError(f"{name}: duplicate seq_num values")
    edges = np.concatenate([s - s[0], [s[-1] - s[0] + 1.0]])  # last row holds for one second
    return Trace(name=name, edges=edges, rate=r * 1e6 / 8)


def load_5gophers(path: str | os.PathLike[str], selector: str | None = None) -> Trace:
    """5Gophers CSV (driving, walking or the 01-Throughput runs file); see module docstring."""
    p = Path(path)
    with open(p, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise TraceError(f"{p}: no rows")
    cols = set(rows[0])
    try:
        if {"carrier", "run_num", "server_location"} <= cols:
            if not selector or selector.count("/") != 3:
                raise TraceError(f"{p}: needs a selector #CARRIER/CONNS/SERVER/RUN, e.g. #SPRINT/1/US-West/3")
            carrier, conns, server, run = selector.split("/")
            sel = [r for r in rows if (r["carrier"], r["num_tcp_conn"], r["server_location"], r["run_num"])
                   == (carrier, conns, server, run)]
            if not sel:
                groups: dict[str, set[int]] = {}
                for r in rows:
                    groups.setdefault(f"{r['carrier']}/{r['num_tcp_conn']}/{r['server_location']}", set()).add(int(r["run_num"]))
                avail = ", ".join(f"{g}/{min(v)}..{max(v)}" for g, v in sorted(groups.items()))
                raise TraceError(f"{p}: no rows for {selector!r}; available: {avail}")
            return _per_second(f"{p.name}#{selector}", [int(r["seq_num"]) for r in sel],
                               [float(r["throughput_mbps"]) for r in sel])
        carrier_cols = sorted(c for c in cols if c.endswith("_throughput_mbps"))
        if carrier_cols:
            col = f"{selector}_throughput_mbps"
            if selector is None or col not in cols:
                names = [c[: -len("_throughput_mbps")] for c in carrier_cols]
                raise TraceError(f"{p}: needs a carrier selector, one of {['#' + n for n in names]}")
            return _per_second(f"{p.name}#{selector}", [int(r["seq_num"]) for r in rows], [float(r[col]) for r in rows])
        if {"seq_num", "throughput_mbps"} <= cols:
            return _per_second(p.name, [int(r["seq_num"]) for r in rows], [float(r["throughput_mbps"]) for r in rows])
    except (KeyError, ValueError) as e:
        if isinstance(e, TraceError):
            raise
        raise TraceError(f"{p}: bad row ({e})") from None
    raise TraceError(f"{p}: unrecognised 5Gophers CSV header {sorted(cols)}")


# ------------------------------------------------------------------------------ discovery
#: The small subset shipped inside the package (provenance and licences in its README.md), so the
#: demo and the default tests run on a plain clone or a wheel install with nothing beside them.
BUNDLED_TRACES = Path(__file__).resolve().parents[1] / "assets" / "traces"


def traces_root() -> Path | None:
    """The folder relative trace specs are read from first: ``$SAKURA_TRACES`` when set (None if it
    is not a folder: an explicit setting that is wrong is an error, not a silent fallback), else
    ``<repo>/../shared/traces`` when it exists, else the bundled subset (`BUNDLED_TRACES`)."""
    env = os.environ.get("SAKURA_TRACES")
    if env:
        return Path(env) if Path(env).is_dir() else None
    repo = Path(__file__).resolve().parents[3]
    cand = repo.parent / "shared" / "traces"
    if cand.is_dir():
        return cand
    return BUNDLED_TRACES if BUNDLED_TRACES.is_dir() else None


def resolve_trace_path(rel: str) -> Path:
    """Where the relative trace file ``rel`` (no ``#selector``) is read from: `traces_root()`, else
    the bundled subset (a file the full collection has and the bundle lacks, or the reverse, still
    resolves). Raises `TraceError` naming the folders looked in."""
    root = traces_root()
    if root is None:
        raise TraceError(f"trace {rel!r} is relative but SAKURA_TRACES={os.environ.get('SAKURA_TRACES')!r} "
                         "is not a folder")
    looked = [root] + ([BUNDLED_TRACES] if BUNDLED_TRACES.is_dir() and BUNDLED_TRACES != root else [])
    for base in looked:
        if (base / rel).is_file():
            return base / rel
    raise TraceError(f"trace file {rel} is in none of {', '.join(map(str, looked))} (the bundled set is a small "
                     "subset: set SAKURA_TRACES to the full collection)")


def load_trace(spec: str, root: str | os.PathLike[str] | None = None) -> Trace:
    """Load ``path[#selector]``; relative paths are under ``root``, or by default where
    `resolve_trace_path` finds them (``$SAKURA_TRACES`` or ``../shared/traces``, then the bundled set).

    Format by name: ``.down``/``.up`` mahimahi, ``.csv`` 5Gophers, anything else Pensieve cooked.
    """
    path_s, _, selector = spec.partition("#")
    p = Path(path_s)
    if not p.is_absolute():
        p = Path(root) / p if root is not None else resolve_trace_path(path_s)
    if not p.is_file():
        raise TraceError(f"trace file {p} does not exist")
    if p.suffix in (".down", ".up"):
        tr = load_mahimahi(p)
    elif p.suffix == ".csv":
        tr = load_5gophers(p, selector or None)
    else:
        tr = load_cooked(p)
    return Trace(name=spec, edges=tr.edges, rate=tr.rate)


def list_traces(root: str | os.PathLike[str] | None = None) -> list[str]:
    """Every loadable trace spec under ``root``, sorted (5Gophers expanded per carrier/run)."""
    base = Path(root) if root is not None else traces_root()
    if base is None:
        return []
    out = []
    for p in sorted(base.rglob("*")):
        if not p.is_file() or p.name.startswith("UPSTREAM") or p.suffix == ".md":
            continue
        rel = p.relative_to(base).as_posix()
        if p.suffix == ".csv":
            with open(p, newline="") as f:
                rows = list(csv.DictReader(f))
            cols = set(rows[0]) if rows else set()
            if "run_num" in cols:
                keys = sorted({(r["carrier"], r["num_tcp_conn"], r["server_location"], int(r["run_num"])) for r in rows})
                out += [f"{rel}#{c}/{n}/{s}/{k}" for c, n, s, k in keys]
            elif any(c.endswith("_throughput_mbps") for c in cols):
                out += [f"{rel}#{c[: -len('_throughput_mbps')]}" for c in sorted(cols) if c.endswith("_throughput_mbps")]
            else:
                out.append(rel)
        else:
            out.append(rel)
    return out


_MAHIMAHI_WORDS = {"ATT": "AT&T", "TMobile": "T-Mobile", "Verizon": "Verizon"}


def describe_trace(spec: str) -> str:
    """A trace spec in words, for titles and table rows: what link, where from (no file needed).

    ``umn_5gophers/All-Carriers/01-Throughput/data.csv#VERIZON/8/US-East/102`` ->
    ``5G Verizon, 8 TCP connections to US-East, run 102 (5Gophers 2019)``."""
    path, _, sel = spec.partition("#")
    name = Path(path).name
    family = path.split("/")[0]
    if family == "umn_5gophers":
        if name == "data.csv" and sel.count("/") == 3:
            carrier, conns, server, run = sel.split("/")
            carrier = {"TMOBILE": "T-Mobile", "VERIZON": "Verizon", "SPRINT": "Sprint"}.get(carrier, carrier)
            return (f"5G {carrier}, {conns} TCP connection{'s' if conns != '1' else ''} to {server}, run {run} "
                    "(5Gophers 2019)")
        if name.startswith("car-driving-trace-"):
            n = name.removeprefix("car-driving-trace-").removesuffix(".csv")
            return f"5G {sel.replace('TMobile', 'T-Mobile') or '?'}, driving (trace {n}; 5Gophers 2019)"
        if name.startswith("walking-trace"):
            return "4G/5G walking (5Gophers 2019)"
    if family == "mahimahi_cellular":
        parts = name.removesuffix(".down").removesuffix(".up").split("-")
        carrier = _MAHIMAHI_WORDS.get(parts[0], parts[0])
        rest = " ".join(p for p in parts[1:] if p)
        return f"{carrier} {rest} (mahimahi cellular)"
    if family == "norway_hsdpa_3g":
        trip = name.split("-report")[0]
        mode, _, route = trip.partition(".")
        return f"3G HSDPA, {mode} {route} (Norway)"
    if family == "fcc_broadband":
        return f"fixed broadband, FCC unit {name.split('_')[1] if '_' in name else name} (FCC 2016)"
    if spec.startswith("constant"):
        return spec
    return spec
