"""The progressive ladder fitted to a template: its lowest rung's budget, searched to reach the
image target (`BASE_RUNG_PSNR_DB` in the pipeline) on the calibration edits, and the floor rungs.

Two searches: `fit_ladder_by_model` (default) predicts each candidate budget's PSNR with the
sensitivity model (no edit) and confirms with at most `ACCEPTANCE_EDITS` measured edits;
`fit_ladder_by_probes` (``allocation="probes"``) measures every trial (an image-probe allocation
of ~100 edits plus one edit). Both pick by `search_budget`.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from sakura.util.psnr import psnr_db
from sakura.codec import ShardId, get_codec
from sakura.codec.base import parse_spec
from sakura.codec.progressive.ladder import model_image_mse, proxy_image_mse
from sakura.models.kv import LayerKV

#: Floor rungs: single-rung progressive renditions at about CacheGen level 3's quality, below the
#: calibrated ladder's 38 dB. The runtime holds sakura to the *image* floor (CacheGen-L3 on every
#: shard), not to 38 dB; on a hard template (sticker-00) the calibrated ladder is one rung at 2.25
#: bits/value (~51 dB a shard; since session 8's image allocation one rung at budget 1.4, 1.50 bits/value), and with nothing cheaper inside the floor link-bound runs lost to
#: CacheGen's levels 2 and 1. Budget 1.2 gives 1.46 bits/value at a mean shard image MSE of 4.0e-5
#: (under CacheGen-L3's 5.8e-5), budget 1.0 1.26 bits/value at 1.0e-4 (session 8, image allocation,
#: offsets and compact headers: 1.28 / 3.1e-5 and 1.09 / 4.6e-5, both under the floor; budget 0.8
#: 0.90 / 6.9e-5, docs/codec.md "Session 8"). Since session 8 the floor rungs are budgets 0.8 and 1.0:
#: [1.2] is no longer needed to get under the floor, and [0.8] sits just over it, so the planner can
#: mix the two shard by shard to land on the floor with fewer bytes; the planner takes them
#: only where the link makes them faster and the image floor allows (docs/notes/runtime-history.md: 81 -> 47
#: losing profile runs). Made only where the calibrated ladder has no rung as cheap
#: (`skipped_floor_rungs`): an easy template's ladder already reaches down to 0.15-1.0 bits/value,
#: and there they would add ~2.2x the ladder's storage for renditions the planner never picks.
#: Since issue 34 they are made as the lowest rungs of the calibrated ladder's one object
#: (`_with_floor_rungs`: byte prefixes, one table) instead of separate objects and tables:
#: sticker-00 0.393 -> 0.148 of one fp16 copy whole (docs/storage.md).
FLOOR_RUNG_LADDER = ("progressive:budgets=[0.8]", "progressive:budgets=[1.0]")
#: Candidate lowest-rung budgets (entropy-coded bits per value), tried cheapest first.
BASE_RUNG_BUDGETS = (0.15, 0.2, 0.3, 0.4, 0.5, 0.65, 0.8, 1.0)
#: Single-rung budgets tried when even the top budget misses the target (hard templates: sticker).
#: 1.7 between 1.4 and 2.0: sticker-00 under the model's allocation measures 37.1-37.9 dB at 1.4 on
#: some probe draws (the target is 38) and jumped to 2.0, +37 % bytes on its rung; at 1.7 it
#: stops there (held-out bytes +9.3 / +7.2 / +5.9 % -> +5.6 / +3.6 / +1.5 % on those draws,
#: docs/notes/build-41.md)
MAX_SINGLE_RUNG_BUDGETS = (1.4, 1.7, 2.0)

def skipped_floor_rungs(ladder: Sequence[str], calibrated_lowest_budget: float | None) -> set[str]:
    """The floor rungs (`FLOOR_RUNG_LADDER` entries of `ladder`) a build leaves out: those whose
    budget is at or above the lowest budget of the ladder's plain ``progressive`` entry (as
    calibrated for the template: `calibrated_lowest_budget`; None: no such entry, every floor rung
    is made)."""
    if calibrated_lowest_budget is None:
        return set()
    return {s.strip() for s in ladder if s.strip() in FLOOR_RUNG_LADDER
            and min(parse_spec(s.strip())[1]["budgets"]) >= calibrated_lowest_budget}


def fit_ladder_by_probes(codec, shards, edit, base_psnr_db: float, log, ref=None):
    """A progressive ladder whose lowest rung reaches `base_psnr_db` on the calibration edits:
    -> (codec with budgets, manifest params). The candidates are `BASE_RUNG_BUDGETS` below the
    codec's top budget, then the top, then `MAX_SINGLE_RUNG_BUDGETS` (one rung); the answer is the
    cheapest candidate that reaches the target, found by `search_budget` (the image PSNR grows with
    the budget, so a pass above a miss brackets it: 3-4 trials where trying them cheapest first took
    up to 10). `ref`: the all-lossless calibration edit when the caller has it (the distortion
    probe's reference)."""

    top = float(codec.params["budgets"][-1])
    rungs = len(codec.params["budgets"])
    ref = (ref if ref is not None else edit([LayerKV(s.key, s.value) for s in shards])).double()
    ident = lambda i: ShardId("calibration", "ladder", i)  # noqa: E731
    # a template the top budget cannot serve at the target gets a single rung above it (up to
    # MAX_SINGLE_RUNG_BUDGETS[-1]: storage stays under 1/4 of fp16, docs/codec.md)
    cands = [x for x in BASE_RUNG_BUDGETS if x < top] + [top] + [x for x in MAX_SINGLE_RUNG_BUDGETS if x > top]

    def trial(b: float) -> float:  # the calibration edits' PSNR vs lossless with one rung at budget b
        t = get_codec(codec.name, **{**codec.params, "budgets": [b]})
        tables = t.fit_tables(shards)
        decs = [t.decode(t.encode(s, ident(i), tables), ident(i), tables) for i, s in enumerate(shards)]
        return psnr_db(float((edit([d.for_attention() for d in decs]).double() - ref).pow(2).mean()))

    def proxy(b: float) -> float:  # the sensitivity allocation's own PSNR estimate: no edit, no probe
        p = codec.params
        return psnr_db(proxy_image_mse(shards, b, p["transform"], p.get("weighting", "none"), float(p.get("gamma", 1.0))))

    # an image-allocation trial costs ~100 image probes cold: steered by the proxy's estimate the
    # first trial is usually the answer (7 -> 5 trials on the default templates)
    image = codec.params.get("allocate") == "image" and all(s.sensitivity is not None for s in shards)
    base, got = search_budget(cands, trial, base_psnr_db, prior_at=proxy if image else None)
    budgets = _geometric(base, top, rungs)
    log(f"  ladder budgets {budgets} (lowest rung: {got:.1f} dB vs lossless "
        f"on the calibration photos at budget {base}, target {base_psnr_db} dB)")
    return get_codec(codec.name, **{**codec.params, "budgets": budgets}), {"budgets": budgets}


#: where `search_budget` starts (a typical template's answer: docs/scale.md), and the PSNR slope it
#: assumes until it has measured two budgets (dB per bit per value; ~6 at high rate, steeper here)
SEARCH_START_BUDGET = 0.3
SEARCH_SLOPE_DB_PER_BIT = 10.0
#: with a prior (the sensitivity allocation's PSNR estimate, `progressive.proxy_image_mse`), what
#: the image allocation's measured PSNR is assumed to differ from it by until a trial has measured
#: it (the default templates: -5 dB at the lowest budgets to +2 dB at 2 bits per value, docs/scale.md)
SEARCH_PRIOR_GAP_DB = -2.0


def search_budget(candidates: Sequence[float], psnr_at: Callable[[float], float],
                  target_db: float, prior_at: Callable[[float], float] | None = None, *,
                  prior_gap_db: float = SEARCH_PRIOR_GAP_DB, max_trials: int | None = None) -> tuple[float, float]:
    """The cheapest of `candidates` (ascending budgets, bits per value) whose `psnr_at(budget)` (dB)
    reaches `target_db`, else the last: -> (budget, its PSNR). A pure function of `psnr_at` and
    `prior_at`.

    PSNR grows with the budget, so the answer is the candidate that passes while the one below it
    misses. Each trial is predicted and kept strictly between the highest miss and the lowest pass,
    so it ends after at most as many trials as candidates (a linear scan's worst case), usually
    2-4, on the same answer whatever the predictions. Were the PSNR not monotone in the budget,
    the answer is still a pass whose cheaper neighbour misses, not always the cheapest pass.

    The prediction: without `prior_at`, linear in the budget between the PSNRs measured so far,
    the secant slope beyond them, `SEARCH_SLOPE_DB_PER_BIT` with one point. With `prior_at` (a
    cheap estimate of the PSNR at any budget, e.g. the proxy allocation's own; memoised), the
    cheapest candidate whose prior plus the difference measured at the nearest trial
    (`SEARCH_PRIOR_GAP_DB` before any) reaches the target: a good prior makes the first trial the
    answer, and the second its cheaper neighbour's miss. `prior_gap_db`: that assumed difference.

    `max_trials`: stop after that many calls of `psnr_at` (the model's acceptance edits): then the
    cheapest measured pass, else the cheapest untried candidate above every miss that the prior
    (plus the measured difference) expects to pass, else the dearest untried one, with that
    expected PSNR."""
    cands = [float(c) for c in candidates]
    if not cands:
        raise ValueError("search_budget: no candidate budgets")
    seen: dict[int, float] = {}
    priors: dict[int, float] = {}
    miss, ok = -1, len(cands)  # highest index known to miss, lowest known to pass

    def prior(i: int) -> float:
        if i not in priors:
            priors[i] = float(prior_at(cands[i]))
        return priors[i]

    def expected(i: int) -> float:  # the prior plus the difference measured nearest (in log budget)
        if not seen:
            return prior(i) + prior_gap_db
        j = min(seen, key=lambda j: (abs(np.log(cands[j] / cands[i])), j))
        return prior(i) + (seen[j] - prior(j))

    def predict_with_prior() -> int:
        a, b = miss + 1, ok  # the cheapest in [a, b) expected to pass (bisection: it grows with the budget)
        while a < b:
            m = (a + b) // 2
            if expected(m) >= target_db:
                b = m
            else:
                a = m + 1
        return min(a, ok - 1)  # none expected to pass: the dearest untried

    def predict() -> int:
        lo, hi = miss + 1, ok - 1
        if prior_at is not None:
            return predict_with_prior()
        if not seen:
            return min(range(lo, hi + 1), key=lambda i: abs(cands[i] - SEARCH_START_BUDGET))
        pts = sorted((cands[i], p) for i, p in seen.items())
        if len(pts) == 1:
            (b0, p0), slope = pts[0], SEARCH_SLOPE_DB_PER_BIT
            need = b0 + (target_db - p0) / slope
        else:
            xs, ys = np.array([b for b, _ in pts]), np.array([p for _, p in pts])
            if target_db <= ys[0]:    # below every measured point: the first secant
                slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
                need = xs[0] + (target_db - ys[0]) / slope if slope > 0 else xs[0]
            elif target_db >= ys[-1]:  # above every measured point: the last secant
                slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
                need = xs[-1] + (target_db - ys[-1]) / (slope if slope > 0 else SEARCH_SLOPE_DB_PER_BIT)
            else:                      # between two: interpolate (in PSNR order: it need not be monotone)
                order = np.argsort(ys, kind="stable")
                need = float(np.interp(target_db, ys[order], xs[order]))
        # the candidate nearest the predicted budget (in log: the candidates are roughly geometric)
        return min(range(lo, hi + 1), key=lambda k: abs(np.log(cands[k] / max(need, 1e-6))))

    while ok - miss > 1:
        if max_trials is not None and len(seen) >= max_trials:
            if ok < len(cands):
                return cands[ok], seen[ok]
            i = predict_with_prior() if prior_at is not None else ok - 1
            return cands[i], expected(i) if prior_at is not None else float("nan")
        i = predict()
        seen[i] = float(psnr_at(cands[i]))
        if seen[i] >= target_db:
            ok = i
        else:
            miss = i
    if ok < len(cands):
        return cands[ok], seen[ok]
    last = len(cands) - 1  # nothing reaches the target: the largest budget (measured: it was the last miss)
    return cands[last], seen[last]


def with_floor_rungs(codec, params: dict, ladder: Sequence[str], log):
    """The calibrated progressive ladder with the ladder's floor rungs (`FLOOR_RUNG_LADDER` entries
    whose budget is below its lowest rung) as its lowest rungs: one object per shard whose byte
    prefixes are the floor rungs, instead of a separate object and table per floor rung. On a hard
    template (sticker-00: one calibrated rung at budget 1.4, floor rungs 0.8 and 1.0) the separate
    objects stored the same shard three times, ~2.2x the bytes of the ladder alone, and three
    tables (docs/storage.md); as rungs they cost the refinement's overhead only, and an upgrade
    fetches only the missing bytes. The floor entries are then not made (`skipped_floor_rungs`)."""
    budgets = [float(b) for b in codec.params["budgets"]]
    floor = sorted({float(b) for s in ladder if s.strip() in FLOOR_RUNG_LADDER
                    for b in parse_spec(s.strip())[1]["budgets"] if float(b) < budgets[0]})
    if not floor:
        return codec, params
    merged = floor + budgets
    log(f"  floor rungs {floor} made as the lowest rungs of this ladder: budgets {merged}")
    return get_codec(codec.name, **{**codec.params, "budgets": merged}), {**params, "budgets": merged}




#: measured edits the model's ladder search may spend confirming its prediction (`search_budget`'s
#: trials). One: the predicted budget measured; where it misses, the cheapest candidate that the
#: prediction plus the measured difference expects to pass (unmeasured). With per-photo probes the
#: one edit chose the budgets three did on every template and probe draw measured (9 of 9), and
#: keeps the build at 12 calibration edits a template (docs/notes/build-41.md)
ACCEPTANCE_EDITS = 1
#: what the sensitivity model's PSNR is assumed to differ from the measured one until an acceptance
#: edit measures it (dB; the model is unbiased, so a small margin: a first trial that passes
#: is the usual answer, docs/notes/build-41.md)
MODEL_PRIOR_GAP_DB = -0.5


def fit_ladder_by_model(codec, shards, edit, base_psnr_db: float, log, ref, max_edits: int | None = None):
    """`fit_ladder_by_probes` with the candidates' PSNR predicted by the shards' sensitivity model
    (`progressive.model_image_mse`: the parts' predictions summed, at the model's own allocation
    at each budget: no edit) and at most `max_edits` measured one-rung edits (`edit(layers) ->
    images`, against `ref`) confirming it: -> (codec with budgets, manifest params, [(budget,
    predicted dB, measured dB)])."""
    max_edits = ACCEPTANCE_EDITS if max_edits is None else max_edits
    top = float(codec.params["budgets"][-1])
    rungs = len(codec.params["budgets"])
    ref = ref.double()
    ident = lambda i: ShardId("calibration", "ladder", i)  # noqa: E731
    cands = [x for x in BASE_RUNG_BUDGETS if x < top] + [top] + [x for x in MAX_SINGLE_RUNG_BUDGETS if x > top]
    p = codec.params
    predicted: dict[float, float] = {}
    trials: list[tuple[float, float, float]] = []

    def prior(b: float) -> float:
        if b not in predicted:
            predicted[b] = psnr_db(model_image_mse(shards, b, p["transform"], p.get("weighting", "none"),
                                                   float(p.get("gamma", 1.0))))
        return predicted[b]

    def measured(b: float) -> float:
        t = get_codec(codec.name, **{**p, "budgets": [b]})
        tables = t.fit_tables(shards)
        decs = [t.decode(t.encode(s, ident(i), tables), ident(i), tables) for i, s in enumerate(shards)]
        img = edit([d.for_attention() for d in decs]).double()
        got = psnr_db(float((img - ref).pow(2).mean()))
        trials.append((b, prior(b), got))
        return got

    base, got = search_budget(cands, measured, base_psnr_db, prior_at=prior, prior_gap_db=MODEL_PRIOR_GAP_DB,
                              max_trials=max_edits)
    budgets = _geometric(base, top, rungs)
    checked = ", ".join(f"{b}: {pr:.1f} predicted, {m:.1f} measured" for b, pr, m in trials)
    log(f"  ladder budgets {budgets} (lowest rung: {got:.1f} dB vs lossless on the calibration photos at budget "
        f"{base}, target {base_psnr_db} dB; sensitivity model, acceptance edits {checked})")
    return get_codec(codec.name, **{**p, "budgets": budgets}), {"budgets": budgets}, trials


def _geometric(base: float, top: float, rungs: int) -> list[float]:
    """The ladder's budgets from its lowest rung `base` to `top` (`rungs` of them when base <= top / 2)."""
    n = rungs if base <= top / 2 else (2 if base < top else 1)
    return [float(f"{x:.3g}") for x in np.geomspace(base, top, n)] if n > 1 else [base]
