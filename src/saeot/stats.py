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


def sign_flip_p(d, *, n_perm: int = 20000, seed: int = 0) -> float:
    """Two-sided p-value of mean(d) = 0 by random sign flips of the paired differences ``d`` (items
    exchangeable under the null of a symmetric difference); Monte Carlo with ``n_perm`` flips, the
    observed statistic counted once, so p >= 1 / (n_perm + 1).

    >>> sign_flip_p([1.0] * 12) < 0.001, sign_flip_p([1.0, -1.0] * 6) == 1.0
    (True, True)
    """
    d = np.asarray(d, dtype=np.float64)
    d = d[np.isfinite(d)]
    if len(d) == 0:
        return float("nan")
    obs = abs(d.mean())
    rng = np.random.default_rng(seed)
    hits = 0
    for s in range(0, n_perm, 2000):  # blocks: (2000, n) signs at a time
        signs = rng.integers(0, 2, (min(2000, n_perm - s), len(d))) * 2 - 1
        hits += int((np.abs((signs * d).mean(1)) >= obs - 1e-12).sum())
    return float((hits + 1) / (n_perm + 1))


def holm(pvalues) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values of one family (same order as given; NaN stays NaN).

    >>> holm([0.01, 0.04, 0.03]).round(3).tolist()
    [0.03, 0.06, 0.06]
    """
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    m = len(ok)
    if m == 0:
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    running = 0.0
    for r, i in enumerate(order):
        running = max(running, min(1.0, (m - r) * p[i]))
        out[i] = running
    return out


def family_verdicts(cells: dict, *, alpha: float = 0.05, n_boot: int = 4000, seed: int = 0) -> dict:
    """One statistical family: every cell's paired differences ``cells[name] = d`` (OT - baseline per
    item) get a bootstrap interval and a sign-flip p; the p-values are Holm-adjusted across the
    family, and a cell is a *win* / *loss* only when its adjusted p < ``alpha`` (sign of the mean),
    else a *tie*.  Returns {name: {mean, lo, hi, n, p, p_holm, verdict}}."""
    out = {}
    for name, d in cells.items():
        d = np.asarray(d, dtype=np.float64)
        d = d[np.isfinite(d)]
        r = paired_bootstrap(d, np.zeros_like(d), n_boot=n_boot, seed=seed)
        r["p"] = sign_flip_p(d, seed=seed)
        out[name] = r
    names = list(out)
    adj = holm([out[n]["p"] for n in names])
    for n, q in zip(names, adj):
        out[n]["p_holm"] = float(q)
        sig = np.isfinite(q) and q < alpha
        out[n]["verdict"] = ("win" if out[n]["mean"] > 0 else "loss") if sig else "tie"
    return out
