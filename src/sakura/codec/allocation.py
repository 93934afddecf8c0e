"""Rate allocation: who gets the bits (per token, per (layer, K/V) part, per ladder rung).

All solvers minimise  sum_parts sensitivity_p x distortion_p  subject to a bit budget with a
Lagrange multiplier found by bisection on log2(lambda); each part independently takes the option
minimising  sens x distortion + lambda x bits  (ties: fewer bits).

- `plan_bits`: per-token widths from importance (the nested `sakura` quantiser).
- `allocate_offsets`: per-part width offsets for the nested quantiser.
- `allocate_steps`: per-part ECSQ / transform steps.
- `allocate_planes`: per-part refinement planes of a progressive ladder rung, never fewer than
  the previous rung's (so rungs stay nested).
"""

from __future__ import annotations

import numpy as np

ALLOWED_BITS = np.array([0, 2, 3, 4, 5, 6, 7, 8], dtype=np.int32)


def plan_bits(importance: np.ndarray | None, T: int, budget: float, *, prev: np.ndarray | None = None,
              alpha: float = 1.0, drop_cost: float = 1.0, allow_drop: bool = True,
              max_bits: int = 8) -> np.ndarray:
    """Per-token bit widths (T,) int32 with mean <= budget (when feasible), >= prev token-wise.

    Minimises sum_t w_t e(b_t), w_t = (importance_t / mean)^alpha, e(b) = 3 4^-b (relative MSE of a
    b-bit uniform quantiser), e(0) = drop_cost (the token is dropped and masked)."""
    allowed = ALLOWED_BITS[(ALLOWED_BITS <= max_bits) & ((ALLOWED_BITS > 0) | allow_drop)]
    e = np.where(allowed == 0, drop_cost, 3.0 * np.power(4.0, -allowed.astype(np.float64)))  # (J,)
    if importance is None:
        w = np.ones(T)
    else:
        imp = np.asarray(importance, dtype=np.float64)
        m = imp.mean()
        w = (imp / m) ** alpha if m > 0 else np.ones(T)
    # deterministic tie-break so equal weights split at a budget between two widths
    w = w * (1.0 + 1e-9 * np.arange(T)[::-1] / max(T, 1)) + 1e-30
    lo_bits = prev if prev is not None else np.zeros(T, np.int32)
    invalid = allowed[None, :] < lo_bits[:, None]  # (T, J)

    def assign(lam: float) -> np.ndarray:
        cost = w[:, None] * e[None, :] + lam * allowed[None, :]
        cost[invalid] = np.inf
        return allowed[np.argmin(cost, axis=1)]

    lo, hi = -40.0, 40.0  # log2 lambda; small lambda -> most bits
    best = assign(2.0 ** hi)
    if best.mean() > budget:
        return best  # even the cheapest feasible plan exceeds the budget (e.g. no drops allowed)
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        b = assign(2.0 ** mid)
        if b.mean() <= budget:
            best, hi = b, mid
        else:
            lo = mid
    return best.astype(np.int32)


def allocate_offsets(points: dict, sens: dict, base: dict) -> dict:
    """Per part width offsets minimising sum sens x relMSE subject to the entropy-coded bits of the
    default offsets `base`. points[part] = [(offset, relMSE, bits)]."""
    keys = sorted(points)
    budget = sum(dict((o, b) for o, _e, b in points[c])[base[c]] for c in keys)

    def pick(lam: float) -> dict:
        return {c: min(points[c], key=lambda t: (sens[c] * t[1] + lam * t[2], t[2])) for c in keys}

    lo, hi = -60.0, 20.0  # log2 lambda
    best = {c: base[c] for c in keys}
    if sum(t[2] for t in pick(2.0 ** hi).values()) > budget:
        return best
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        res = pick(2.0 ** mid)
        if sum(t[2] for t in res.values()) <= budget:
            best, hi = {c: t[0] for c, t in res.items()}, mid
        else:
            lo = mid
    return best


def _bisect(points: dict, sens: dict, budget_bits: float, lo: float = -80.0, hi: float = 40.0) -> dict:
    keys = sorted(points)

    def pick(lam: float) -> dict:
        return {c: min(points[c], key=lambda t: (sens[c] * t[1] + lam * t[2], t[2])) for c in keys}

    best = pick(2.0 ** hi)  # the cheapest plan (if even it is over budget, it is the answer)
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        res = pick(2.0 ** mid)
        if sum(t[2] for t in res.values()) <= budget_bits:
            best, hi = res, mid
        else:
            lo = mid
    return {c: t[0] for c, t in best.items()}


def allocate_steps(points: dict, sens: dict, budget_bits: float) -> dict:
    """Per part the step minimising sum sens x relMSE subject to total bits <= budget_bits.
    points[part] = [(step, relMSE, bits)]."""
    return _bisect(points, sens, budget_bits)


def allocate_planes(points: dict, sens: dict, budget_bits: float, prev: dict) -> dict:
    """Per part the number of refinement planes k >= prev[part] minimising sum sens x relMSE subject
    to total bits <= budget_bits. points[part] = [(k, relMSE, bits)]."""
    return _bisect({c: [t for t in pts if t[0] >= prev[c]] for c, pts in points.items()}, sens, budget_bits)
