"""Paired statistics: is method X better than method Y *on the same items*?

Separate confidence intervals per method (what the previous evaluation compared) have far less
power than a paired test when the items (source features, prompts) vary a lot in difficulty:
both methods move together with the item, and only the difference matters.  Here every figure
that compares two methods is the mean of per-item differences ``x_i - y_i`` with a percentile
bootstrap interval that resamples *items* (the pairs stay together).

Verdict (higher = better for every score this package compares): ``win`` when the whole
interval is above 0, ``loss`` when it is below 0, ``tie`` otherwise (the data cannot tell).
"""

from __future__ import annotations

import numpy as np

VERDICTS = ("win", "tie", "loss")


def paired_bootstrap(x, y, *, n_boot: int = 4000, seed: int = 0, level: float = 0.95) -> dict:
    """Mean of ``x - y`` over items with a paired percentile bootstrap interval and a verdict.

    Parameters
    ----------
    x, y : (n,) array-like
        Scores of two methods on the same n items (item i is the same source / prompt in both).
        Items where either is NaN are dropped (both scores are needed for a difference).
    n_boot, seed, level
        Bootstrap resamples, RNG seed, interval level.

    Returns
    -------
    dict
        ``mean`` (of x - y), ``lo``, ``hi``, ``n`` (items used), ``verdict`` (win / tie / loss for
        x against y), ``p_le_0`` (bootstrap share of resampled means <= 0: small = x better).

    Examples
    --------
    >>> r = paired_bootstrap([1.0, 2.0, 3.0, 4.0], [0.5, 1.5, 2.5, 3.5])
    >>> r["mean"], r["verdict"]
    (0.5, 'win')
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"paired scores need equal 1-D shapes, got {x.shape} and {y.shape}")
    ok = np.isfinite(x) & np.isfinite(y)
    d = x[ok] - y[ok]
    if len(d) == 0:
        return {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0, "verdict": "tie",
                "p_le_0": float("nan")}
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), (n_boot, len(d)))].mean(1)
    a = (1 - level) / 2
    lo, hi = float(np.quantile(means, a)), float(np.quantile(means, 1 - a))
    return {"mean": float(d.mean()), "lo": lo, "hi": hi, "n": int(len(d)), "verdict": verdict(lo, hi),
            "p_le_0": float((means <= 0).mean())}


def verdict(lo: float, hi: float) -> str:
    """win if the interval [lo, hi] of (x - y) is above 0, loss if below, tie otherwise."""
    if lo > 0:
        return "win"
    if hi < 0:
        return "loss"
    return "tie"


def fmt_paired(r: dict | None, digits: int = 3) -> str:
    """``+0.021 [+0.004, +0.040] win`` (or n/a)."""
    if not r or r.get("n", 0) == 0:
        return "n/a"
    f = f"{{:+.{digits}f}}"
    return f"{f.format(r['mean'])} [{f.format(r['lo'])}, {f.format(r['hi'])}] {r['verdict']}"
