"""Bandwidth estimation from the phone's own transfers (no probing traffic).

RobustMPC-style: the prediction is the harmonic mean of the last `window` throughput samples
(harmonic, because one fast burst must not hide slow periods), and the robust estimate divides it
by (1 + the largest relative prediction error seen over the last `window` samples), so the
scheduler plans conservatively after the link has surprised it.
"""

from __future__ import annotations

from collections import deque


class BandwidthEstimator:
    """Throughput estimate in bytes/s.

    Args:
        window: how many recent samples (and prediction errors) to keep.
        prior_bps: estimate (bytes/s) to use before any sample arrives, or None.
        min_sample_bytes: samples smaller than this are merged into the next one (tiny transfers
            measure latency, not throughput).
    """

    def __init__(self, window: int = 5, prior_bps: float | None = None, min_sample_bytes: int = 16_384):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if prior_bps is not None and not prior_bps > 0:
            raise ValueError(f"prior_bps must be > 0, got {prior_bps}")
        self.window = window
        self.prior_bps = prior_bps
        self.min_sample_bytes = min_sample_bytes
        self._samples: deque[float] = deque(maxlen=window)   # bytes/s
        self._errors: deque[float] = deque(maxlen=window)    # |pred - actual| / actual
        self._pending_bytes = 0
        self._pending_s = 0.0

    def observe(self, nbytes: int, seconds: float) -> None:
        """Record that `nbytes` arrived over `seconds` of transfer time."""
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
            self._errors.append(abs(predicted - actual) / actual)
        self._samples.append(actual)

    def predict_bps(self) -> float | None:
        """Harmonic mean of recent samples (bytes/s), or the prior, or None."""
        if not self._samples:
            return self.prior_bps
        return len(self._samples) / sum(1.0 / s for s in self._samples)

    def robust_bps(self) -> float | None:
        """The prediction discounted by the worst recent relative error (bytes/s), or None."""
        p = self.predict_bps()
        if p is None:
            return None
        return p / (1.0 + (max(self._errors) if self._errors else 0.0))
