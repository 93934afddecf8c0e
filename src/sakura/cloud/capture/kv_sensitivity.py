"""A sensitivity model of the template KV: the calibration edits' image MSE predicted from a KV error.

For a small error e in the template KV the calibration edits' images move by J e (J: the Jacobian
of the edited images w.r.t. the KV), so their per-pixel MSE is ||J e||^2 / n (n pixels): a
quadratic form e^T H e with H = J^T J / n, the Gauss-Newton matrix (the Fisher information of a
Gaussian pixel likelihood). `measure_kv_sensitivity` sketches it with P random image-space probes
r_k (Hutchinson): one differentiable edit of the calibration photos, then P backward passes
g_k = J^T r_k, and

    predicted image MSE(e) = (1 / (P n)) sum_k (g_k . e)^2          (unbiased for e^T H e)

for any error e: one (layer, K/V) part, one layer, or the whole template at once (cross terms
included). The diagonal of the same sketch (sum_k g_k^2, diagonal Fisher / squared-gradient
weighting as KVQuant does for LLM KV caches) misses the correlations of a quantiser's error (a
dead zone zeroes whole bands coherently): measured on sakura-mini it was 11-12 dB off at the 90th
percentile where the sketch with 8 probes was 4 dB (docs/notes/build-41.md).

The sketch's spread is Hutchinson's: a prediction's relative spread is sqrt(2 / P) whatever the
error. A probe over all photos at once also carries the cross term (r_1 . J_1 e)(r_2 . J_2 e)
between photos, pure noise; a probe per photo drops it, and its backward costs one photo's
compute: at the same compute, variance (a^2 + b^2) / (a + b)^2 of the joint one's (a, b: each
photo's share of the MSE), half when they weigh alike. The allocation predicts each part by heads
(`HEAD_BLOCKS`: sum_k sum_h (g_k[h] . e[h])^2, the cross-head terms, zero in expectation for
independent errors, left out: less noise, ~24 heads to average over at Klein size) and blends that
with its own diagonal (`DIAGONAL_BLEND`), whose spread is small but which misses correlations; the
manifest's figures use the full sketch. What the few probes' noise still costs: the allocation
selects on it (it starves the parts whose prediction came out low), docs/notes/build-41.md section 6.

Cost: one forward with autograd per calibration photo, P backward passes each through one photo's
graph (`PER_PHOTO_PROBES`: a backward counts as 2 edits of the photos it runs through, so 2 / N of
an edit with N photos) and one no-grad edit of all photos for the reference image:
2 + P edits with two photos (`KVSensitivity.calibration_edits`). Memory: P fp32 copies of the KV,
one photo's graph at a time.
The sketch's rows also give the per-part "sensitivity" the proxy allocation uses (image MSE per unit
relative MSE of white noise in that part) and a per-token importance (the diagonal summed over heads
and channels).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sakura.models.kv import LayerKV, TemplateKV

#: random image-space probes of the sketch (backward passes; per photo, `PER_PHOTO_PROBES`, each
#: over one calibration photo: 1 edit each with 2 photos). 8 per-photo probes have the spread of
#: 8-16 joint ones for the cost of 4: with the 2 forward edits, 1 acceptance edit and 1 figure check,
#: 12 calibration edits a template (joint 4 probes at that cost lost up to 4 dB on a held-out rung,
#: per photo 8 about 2; docs/notes/build-41.md)
SKETCH_PROBES = 8
#: the allocation's part predictions (`coefficient_mse`) are the geometric blend full^(1-b) diag^b
#: of the sketch (by heads, `HEAD_BLOCKS`) and its diagonal: the diagonal's spread is small (a sum
#: over every coefficient) but it misses the quantiser's correlated errors (on look-00 its error
#: spread is 5.5 dB). With the full sketch b = 1/2 measured best; by heads the sketch's own spread
#: is smaller and b = 1/4 gave the lowest per-part error and tail (2.0 dB sd, 5th percentile -3.6
#: dB vs 2.3 / -4.5 for the full sketch at 1/2; held-out over 8 probe draws median -0.04 / worst
#: -2.00 dB vs -0.18 / -2.24; docs/notes/build-41.md section 6)
DIAGONAL_BLEND = 0.25
#: the allocation's part predictions keep only the sketch of each attention head's block of H
#: (K or V of one head, every token and channel), dropping the cross-head terms: heads attend
#: independently and their quantisation errors are independent, so those terms are zero in
#: expectation, but each adds the sketch's noise. Measured on sakura-mini's one-part edits (4 heads):
#: bias -0.3 dB like the full sketch with 64 probes, spread at 8 probes ~2.1 dB where the full
#: sketch's is ~2.7 (docs/notes/build-41.md); a Klein layer has 24 heads to average over
HEAD_BLOCKS = True
#: each probe on one calibration photo's own graph: a joint probe's cross term between photos
#: (r_1 . J_1 e)(r_2 . J_2 e) is pure noise, and its backward costs all photos' compute; per photo
#: the same backward compute gives N times the probes (variance halved at N = 2 when the photos
#: weigh alike), for one more edit (the reference image: the calibration edits draw their noise per batch)
PER_PHOTO_PROBES = True


@dataclass
class KVSensitivity:
    """The sketch of H = J^T J / n: per layer, keys' and values' rows (P, T, H, D) float32, scaled
    so that ``sum_k (row_k . e)^2`` is the predicted image MSE of error e (pixels in [0, 1]).

    `calibration_edits`: what measuring it cost, in calibration edits (forward 1, each backward 2)."""

    rows: list[tuple[torch.Tensor, torch.Tensor]]
    calibration_edits: float = 0.0
    #: the part of `calibration_edits` spent in backward passes (the rest: the model's edit calls)
    backward_edits: float = 0.0
    #: the all-lossless calibration edit (N, 3, S, S) float64, the sketch's forward pass's image
    reference_image: torch.Tensor | None = None
    _coeff: dict = field(default_factory=dict, repr=False)

    @property
    def probes(self) -> int:
        return int(self.rows[0][0].shape[0])

    @property
    def num_layers(self) -> int:
        return len(self.rows)

    def _part(self, layer: int, kv: str) -> torch.Tensor:
        return self.rows[layer][0 if kv == "k" else 1]

    def projections(self, layer: int, kv: str, error: torch.Tensor) -> np.ndarray:
        """(P,) float64: each sketch row's dot product with `error` (T, H, D) of one part."""
        rows = self._part(layer, kv)
        e = error.detach().to(torch.float32).reshape(1, -1)
        return (rows.reshape(rows.shape[0], -1) @ e.T).double().numpy()[:, 0]

    def part_mse(self, layer: int, kv: str, error: torch.Tensor) -> float:
        """Predicted image MSE with only this part's KV off by `error` (T, H, D)."""
        return float(np.sum(self.projections(layer, kv, error) ** 2))

    def layer_mse(self, layer: int, key_error: torch.Tensor, value_error: torch.Tensor) -> float:
        """Predicted image MSE with this layer's keys and values off by the errors (jointly)."""
        return float(np.sum((self.projections(layer, "k", key_error) + self.projections(layer, "v", value_error)) ** 2))

    def template_mse(self, errors: list[tuple[torch.Tensor | None, torch.Tensor | None]]) -> float:
        """Predicted image MSE with every layer's keys and values off by `errors` at once (None: exact)."""
        acc = np.zeros(self.probes)
        for i, (ke, ve) in enumerate(errors):
            if ke is not None:
                acc += self.projections(i, "k", ke)
            if ve is not None:
                acc += self.projections(i, "v", ve)
        return float(np.sum(acc ** 2))

    def coefficient_rows(self, layer: int, kv: str, transform) -> np.ndarray:
        """(P, T*C) float64 rows in a codec's coefficient domain: ``transform(row (T, C)) -> (T, C)``
        an orthonormal transform over the tokens (the progressive codec's DCT), applied once per
        part and cached, so that (row . e) is computed from the coefficient error without an inverse
        transform. Cached per (layer, kv, transform)."""
        key = (layer, kv, getattr(transform, "cache_key", id(transform)))
        if key not in self._coeff:
            rows = self._part(layer, kv)
            P, T = rows.shape[0], rows.shape[1]
            self._coeff[key] = np.stack([np.asarray(transform(rows[k].reshape(T, -1).double().numpy()),
                                                    dtype=np.float64).reshape(-1) for k in range(P)])
        return self._coeff[key]

    def coefficient_mse(self, layer: int, kv: str, transform, coefficient_error: np.ndarray) -> float:
        """`part_mse` of the error whose coefficients (``transform``'s domain) are `coefficient_error`
        (T, C), by heads (`HEAD_BLOCKS`: the sketch of each head's block, summed), blended
        (`DIAGONAL_BLEND`) with the sketch's diagonal in that domain."""
        rows = self.coefficient_rows(layer, kv, transform)
        e = np.asarray(coefficient_error, np.float64).reshape(-1)
        full = self._head_block_mse(layer, kv, rows, e) if HEAD_BLOCKS else float(np.sum((rows @ e) ** 2))
        if DIAGONAL_BLEND <= 0:
            return full
        diag = float(self._coefficient_diagonal(layer, kv, transform) @ (e * e))
        if full <= 0 or diag <= 0:
            return full
        return float(np.exp((1 - DIAGONAL_BLEND) * np.log(full) + DIAGONAL_BLEND * np.log(diag)))

    def _head_block_mse(self, layer: int, kv: str, rows: np.ndarray, e: np.ndarray) -> float:
        """sum over heads h and probes k of (row_k[h] . e[h])^2: the sketch of the block-diagonal
        part of H by heads. (P, T*C) rows and (T*C,) error in the (token, head, channel) order."""
        _p, _t, heads, dim = self._part(layer, kv).shape
        if heads <= 1:
            return float(np.sum((rows @ e) ** 2))
        proj = np.einsum("pthd,thd->ph", rows.reshape(rows.shape[0], -1, heads, dim), e.reshape(-1, heads, dim))
        return float(np.sum(proj ** 2))

    def _coefficient_diagonal(self, layer: int, kv: str, transform) -> np.ndarray:
        key = ("diag", layer, kv, getattr(transform, "cache_key", id(transform)))
        if key not in self._coeff:
            self._coeff[key] = np.sum(self.coefficient_rows(layer, kv, transform) ** 2, axis=0)
        return self._coeff[key]

    def relative_sensitivity(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[float, float]:
        """(keys, values): predicted image MSE per unit relative MSE of white noise in the part
        (``layer_sensitivity``'s quantity: E||J e||^2 = trace(H_p) ||x||^2 / n_p for e ~ N(0, eps^2 ||x||^2 / n_p))."""
        out = []
        for kv, x in (("k", key), ("v", value)):
            rows = self._part(layer, kv)
            xf = x.detach().double()
            out.append(float(rows.double().pow(2).sum()) * float(xf.pow(2).mean()))
        return out[0], out[1]

    def token_importance(self) -> torch.Tensor:
        """(L, 2, T) float32: the sketch's diagonal summed per token (keys' row 0, values' row 1)."""
        return torch.stack([torch.stack([r.pow(2).sum(dim=(0, 2, 3)) for r in pair]) for pair in self.rows])


def measure_kv_sensitivity(model: Any, template_kv: TemplateKV, photos: torch.Tensor, *, steps: int = 4,
                           seed: int = 0, probes: int = SKETCH_PROBES, probe_seed: int = 0,
                           per_photo: bool | None = None) -> KVSensitivity:
    """Sketch the calibration edits' Gauss-Newton matrix w.r.t. `template_kv` (see the module).

    Args:
        model: a model with ``differentiable_edit`` (`sakura.models.base.DifferentiableEditModel`).
        template_kv: the template's lossless KV (as stored: fp16); differentiated in fp32.
        photos: (N, 3, S, S) public calibration photos in [0, 1].
        steps, seed: the calibration edits' sampler settings.
        probes: random image-space probes P (backward passes).
        per_photo: each probe on one photo's own graph (`PER_PHOTO_PROBES`; N > 1): photo i gets
            P/N of the probes, each backward costs 2/N edits, and the reference image is one
            no-grad edit of all photos (the calibration edits' noise). Else every probe spans all
            photos (one graph, a backward costs 2).
    Returns the sketch, rows on the host in fp32 (P x the KV's values)."""
    if not hasattr(model, "differentiable_edit"):
        raise TypeError(f"{type(model).__name__} has no differentiable_edit: use allocation='probes'")
    if probes < 1:
        raise ValueError(f"probes must be >= 1, got {probes}")
    n_photos = int(photos.shape[0])
    per_photo = PER_PHOTO_PROBES if per_photo is None else per_photo
    groups = ([photos[i:i + 1] for i in range(n_photos)] if per_photo and n_photos > 1 and probes >= n_photos
              else [photos])
    counts = [probes // len(groups) + (1 if i < probes % len(groups) else 0) for i in range(len(groups))]
    dev = getattr(model, "device", torch.device("cpu"))
    leaves = [(l.key.to(dev, torch.float32).clone().requires_grad_(True),
               l.value.to(dev, torch.float32).clone().requires_grad_(True)) for l in template_kv.layers]
    kv = TemplateKV([LayerKV(k, v) for k, v in leaves], template_kv.model_fingerprint,
                    template_kv.template_fingerprint, template_kv.layout, template_kv.positions)
    flat = [t for pair in leaves for t in pair]
    g = torch.Generator().manual_seed(probe_seed)
    sums: list[list[torch.Tensor]] = [[] for _ in flat]
    n = None  # pixels of every photo's edit (N x 3 x S x S)
    edits = backward = 0.0
    for group, m in zip(groups, counts):
        with torch.enable_grad():  # one graph at a time: its activations freed before the next photo's
            img = model.differentiable_edit(group, template_kv=kv, steps=steps, seed=seed).image
            edits += group.shape[0] / n_photos
            n = n or img.numel() * n_photos // group.shape[0]
            for p in range(m):
                r = torch.randn(img.shape, generator=g)
                grads = torch.autograd.grad((img * r).sum(), flat, retain_graph=p < m - 1, allow_unused=True)
                backward += 2.0 * group.shape[0] / n_photos
                # this photo's rows scaled so that summing (row . e)^2 over every row is the MSE
                # over all photos' pixels: E (g . e)^2 = ||J_i e||^2, each photo's probes averaged
                w = 1.0 / float(np.sqrt(m * n))
                for j, gr in enumerate(grads):
                    sums[j].append(torch.zeros_like(flat[j]) if gr is None else gr.detach().float().cpu() * w)
        reference = img.detach().double() if len(groups) == 1 else None
        del img
    if reference is None:  # the calibration edits' own noise (drawn per batch): one edit of all photos
        reference = model.edit(photos, template_kv=template_kv, steps=steps, seed=seed).image.double()
        edits += 1.0
    rows = [(torch.stack(sums[2 * i]), torch.stack(sums[2 * i + 1])) for i in range(len(leaves))]
    return KVSensitivity(rows, calibration_edits=edits + backward, backward_edits=backward, reference_image=reference)


class PredictedDistortion:
    """A shard's ``ShardKV.distortion`` by the sensitivity model: ``(kv, decoded) -> image MSE``
    predicted for layer `layer` with its keys (kv = "k") or values replaced by `decoded`, every
    other part lossless; no edit. The progressive codec's allocation calls the coefficient-domain
    methods (no inverse transform) and `progressive.model_image_mse` the projections (parts summed
    before squaring)."""

    def __init__(self, sensitivity: KVSensitivity, layer: int, key: torch.Tensor, value: torch.Tensor) -> None:
        self.sensitivity, self.layer = sensitivity, layer
        self._lossless = {"k": key, "v": value}

    def projections(self, kv: str, error: torch.Tensor) -> np.ndarray:
        return self.sensitivity.projections(self.layer, kv, error)

    def __call__(self, kv: str, decoded: torch.Tensor) -> float:
        return self.sensitivity.part_mse(self.layer, kv, decoded.float() - self._lossless[kv].float())

    def coefficient_projections(self, kv: str, error: np.ndarray, transform) -> np.ndarray:
        return self.sensitivity.coefficient_rows(self.layer, kv, transform) @ np.asarray(error, np.float64).reshape(-1)

    def coefficient_mse(self, kv: str, error: np.ndarray, transform) -> float:
        return self.sensitivity.coefficient_mse(self.layer, kv, transform, error)
