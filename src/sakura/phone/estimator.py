"""Link estimation from the phone's own transfers (no probing traffic). Pure: no clock is read.

Two quantities, measured separately because they mix badly:

* **throughput** (bytes/s), from a fetch's *first byte to last byte*: the request's round trip
  is not in it, so a fast link is not mistaken for a slow one (a 64 kB shard at 1 Gbit/s takes
  0.5 ms to carry but 40 ms to request; a sample over request-to-last-byte reads ~13 Mbit/s);
* **round trip** (seconds), from request to first byte, kept as the minimum of recent samples:
  a request queued behind another transfer can only look slower than the path, never faster.

The planner then charges one RTT to an idle link's first request and none to requests issued
ahead (see `sakura.phone.plan`), instead of adding the RTT to every shard twice.

RobustMPC-style discount: the prediction is the harmonic mean of the last `window` throughput
samples (harmonic, because one fast burst must not hide slow periods); each new sample is scored
against the prediction the planner actually used before it arrived (the prior, for the first
sample) and the robust estimate divides the prediction by (1 + the largest recent relative
error), so the scheduler plans conservatively after the link has disappointed it. Only
over-estimates count as errors: a link faster than predicted costs no stall, and discounting for
it made the planner compute layers locally on a link that had just proved fast (phone profile,
5G: the first sample at 580 Mbit/s against a 317 Mbit/s prior planned at 400).
"""

from __future__ import annotations

from collections import deque


class BandwidthEstimator:
    """Throughput estimate in bytes/s.

    Args:
        window: how many recent samples (and prediction errors) to keep.
        prior_bps: estimate (bytes/s) before any sample (e.g. what the phone measured last time).
        min_sample_bytes: samples carrying fewer bytes are merged into the next one (a handful of
            bytes measures scheduling noise, not the link).
    """

    def __init__(self, window: int = 5, prior_bps: float | None = None, min_sample_bytes: int = 8_192):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if prior_bps is not None and not prior_bps > 0:
            raise ValueError(f"prior_bps must be > 0, got {prior_bps}")
        self.window = window
        self.prior_bps = prior_bps
        self.min_sample_bytes = min_sample_bytes
        self._samples: deque[float] = deque(maxlen=window)   # bytes/s
        self._errors: deque[float] = deque(maxlen=window)    # max(0, pred - actual) / actual
        self._pending_bytes = 0
        self._pending_s = 0.0

    @property
    def samples(self) -> int:
        return len(self._samples)

    def observe(self, nbytes: int, seconds: float) -> None:
        """Record that `nbytes` were carried in `seconds` of first-byte-to-last-byte time."""
        if nbytes < 0 or seconds < 0:
            raise ValueError(f"observe needs nbytes >= 0 and seconds >= 0, got {nbytes}, {seconds}")
        self._pending_bytes += nbytes
        self._pending_s += seconds
        if self._pending_bytes < self.min_sample_bytes or self._pending_s <= 0:
            return
        actual = self._pending_bytes / self._pending_s
        self._pending_bytes, self._pending_s = 0, 0.0
        predicted = self.predict_bps()
        if predicted is not None:
            self._errors.append(max(0.0, predicted - actual) / actual)
        self._samples.append(actual)

    def observe_bound(self, nbytes: int, seconds: float) -> None:
        """A transfer ran `seconds` since its first byte without delivering more than `nbytes`
        (it was given up): the link's rate was at most nbytes / seconds. Recorded as a sample (and
        scored as an error) only when that is below the prediction; else it says nothing new."""
        if seconds <= 0 or nbytes < self.min_sample_bytes:
            return
        p = self.predict_bps()
        if p is None or nbytes / seconds < p:
            self.observe(nbytes, seconds)

    def observe_fetch(self, nbytes: int, first_chunk_bytes: int, t_first_byte: float, t_last_byte: float) -> None:
        """A completed fetch: the bytes after the first chunk over first-to-last-byte time.

        The first chunk's bytes arrived *at* t_first_byte, so they carry no duration; counting
        them would over-estimate short transfers."""
        if t_last_byte < t_first_byte:
            raise ValueError("t_last_byte must be >= t_first_byte")
        self.observe(max(0, nbytes - first_chunk_bytes), t_last_byte - t_first_byte)

    def predict_bps(self) -> float | None:
        """Harmonic mean of recent samples (bytes/s), or the prior, or None."""
        if not self._samples:
            return self.prior_bps
        return len(self._samples) / sum(1.0 / s for s in self._samples)

    def max_error(self) -> float:
        """The largest recent relative over-estimate (0 before any): how far the link has fallen short
        of what was predicted lately."""
        return max(self._errors) if self._errors else 0.0

    def robust_bps(self) -> float | None:
        """The prediction discounted by the worst recent relative over-estimate (bytes/s), or None."""
        p = self.predict_bps()
        if p is None:
            return None
        return p / (1.0 + (max(self._errors) if self._errors else 0.0))


class RttEstimator:
    """Round trip (seconds): the minimum of the last `window` request-to-first-byte samples.

    Args:
        prior_s: estimate before any sample (seconds).
    """

    def __init__(self, window: int = 8, prior_s: float = 0.05):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if prior_s < 0:
            raise ValueError(f"prior_s must be >= 0, got {prior_s}")
        self.prior_s = prior_s
        self._samples: deque[float] = deque(maxlen=window)

    def observe(self, t_request: float, t_first_byte: float) -> None:
        if t_first_byte < t_request:
            raise ValueError("t_first_byte must be >= t_request")
        self._samples.append(t_first_byte - t_request)

    def rtt_s(self) -> float:
        return min(self._samples) if self._samples else self.prior_s
